//! Decimal128 values computed as IEEE 754-2008 decimal128, as MongoDB computes them.
//!
//! The arithmetic comes from the `dec` crate: the maintained Rust binding of IBM's decNumber
//! library, whose `decQuad` is the reference implementation of IEEE 754-2008 decimal128 (34
//! significant digits, exponents -6176..=6111, round-half-even, signed zeros, subnormals, NaN
//! and infinities). MongoDB itself computes with Intel's implementation of the same standard,
//! so sums, products, quotients and their rounding agree digit for digit. BSON stores decimals
//! in the binary-integer (BID) encoding and decNumber in the densely-packed (DPD) one: values
//! cross between them through the standard's scientific string form, which is exact.
//!
//! Mixed-type rules, as MongoDB applies them:
//! - arithmetic converts a double operand to decimal rounded to 15 significant digits
//!   (`$add: [0.1, Decimal128("0")]` is `0.100000000000000`), an integer exactly;
//! - comparisons convert a double to decimal rounded to 34 digits, so the double `0.1` is not
//!   equal to `Decimal128("0.1")`, while `1.0`, `1.00` and the integer `1` are all equal.

use std::cmp::Ordering;

use dec::{Context, Decimal128 as Dec};

/// A decimal128 value.
pub type Decimal = Dec;

fn context() -> Context<Dec> {
    Context::<Dec>::default()
}

fn parse(s: &str) -> Dec {
    let mut cx = context();
    cx.parse(s).unwrap_or(Dec::NAN)
}

/// A BSON decimal as a computable value.
pub fn from_bson(d: &bson::Decimal128) -> Dec {
    parse(&d.to_string())
}

/// A computed decimal as a BSON value.
pub fn to_bson(d: Dec) -> bson::Decimal128 {
    let s = if d.is_nan() {
        "NaN".to_string()
    } else {
        d.to_string()
    };
    s.parse().unwrap_or_else(|_| {
        // Every finite decimal128 and the specials have a BSON form; NaN as a last resort.
        "NaN"
            .parse()
            .unwrap_or(bson::Decimal128::from_bytes([0; 16]))
    })
}

/// An integer, exactly.
pub fn from_i64(i: i64) -> Dec {
    Dec::from(i)
}

fn from_f64_digits(f: f64, digits: usize) -> Dec {
    if f.is_nan() {
        Dec::NAN
    } else if f.is_infinite() {
        parse(if f > 0.0 { "Infinity" } else { "-Infinity" })
    } else if f == 0.0 {
        // Keep the sign of zero.
        if f.is_sign_negative() {
            parse("-0")
        } else {
            Dec::ZERO
        }
    } else {
        parse(&format!("{f:.prec$e}", prec = digits - 1))
    }
}

/// A double as arithmetic and `$toDecimal` convert it: rounded to 15 significant digits.
pub fn from_f64(f: f64) -> Dec {
    from_f64_digits(f, 15)
}

/// A double as comparisons convert it: rounded to 34 significant digits.
pub fn from_f64_for_compare(f: f64) -> Dec {
    from_f64_digits(f, 34)
}

/// The nearest double.
pub fn to_f64(d: Dec) -> f64 {
    if d.is_nan() {
        return f64::NAN;
    }
    if d.is_infinite() {
        return if d.is_negative() {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
    }
    d.to_string().parse::<f64>().unwrap_or(f64::NAN)
}

/// `a + b`.
pub fn add(a: Dec, b: Dec) -> Dec {
    context().add(a, b)
}

/// `a - b`.
pub fn sub(a: Dec, b: Dec) -> Dec {
    context().sub(a, b)
}

/// `a * b`.
pub fn mul(a: Dec, b: Dec) -> Dec {
    context().mul(a, b)
}

/// `a / b`.
pub fn div(a: Dec, b: Dec) -> Dec {
    context().div(a, b)
}

/// The remainder of truncating division (`$mod`).
pub fn rem(a: Dec, b: Dec) -> Dec {
    context().rem(a, b)
}

/// `$abs`, `$floor`, `$ceil` and `$trunc` (to an integer).
pub fn unary(op: &str, d: Dec) -> Dec {
    let mut cx = context();
    match op {
        "$abs" => cx.abs(d),
        _ => {
            let rounding = match op {
                "$floor" => dec::Rounding::Floor,
                "$ceil" => dec::Rounding::Ceiling,
                _ => dec::Rounding::Down,
            };
            cx.set_rounding(rounding);
            cx.round(d)
        }
    }
}

/// Working precision for `$sqrt` and `$pow`: decNumber's arbitrary-precision numbers (12 units
/// of 3 digits), set to decimal128's 34 digits, so each result is rounded once.
type Wide = dec::Decimal<12>;

fn wide_context() -> Context<Wide> {
    let mut cx = Context::<Wide>::default();
    // 34 is within the 36 digits a Wide holds; decNumber computes powers and roots only in a
    // context whose exponents stay within ±999999 (else the result is NaN), and decimal128's
    // range (emax 6144) is within it.
    let _ = cx.set_precision(34);
    let _ = cx.set_max_exponent(6144);
    let _ = cx.set_min_exponent(-6143);
    cx
}

/// `$sqrt` of a decimal, correctly rounded to 34 digits.
pub fn sqrt(d: Dec) -> Dec {
    let mut cx = wide_context();
    let mut w = Wide::from(d);
    cx.sqrt(&mut w);
    w.to_decimal128()
}

/// `$pow` with a decimal operand: `a` raised to `b`, to 34 digits.
pub fn pow(a: Dec, b: Dec) -> Dec {
    let mut cx = wide_context();
    let mut x = Wide::from(a);
    cx.pow(&mut x, &Wide::from(b));
    x.to_decimal128()
}

/// MongoDB's order of two decimals: NaN equals NaN and sorts below every number; `-0 == 0`.
pub fn cmp(a: Dec, b: Dec) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => context().partial_cmp(a, b).unwrap_or(Ordering::Equal),
    }
}

/// The exact integer value of a finite integral decimal that fits an `i64` (`1E+2` is 100).
pub fn to_i64_exact(d: Dec) -> Option<i64> {
    if !d.is_finite() {
        return None;
    }
    let r = context().reduce(d);
    let (mut c, e) = (r.coefficient(), r.exponent());
    if e < 0 {
        return None;
    }
    for _ in 0..e {
        c = c.checked_mul(10)?;
    }
    i64::try_from(c).ok()
}

/// The canonical form of a finite, non-integral-or-huge decimal for keys: the reduced
/// coefficient and exponent (`1.0` and `1.00` give the same string).
pub fn canonical(d: Dec) -> String {
    context().reduce(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Dec {
        parse(s)
    }

    fn b(s: &str) -> bson::Decimal128 {
        s.parse().unwrap()
    }

    #[test]
    fn arithmetic_is_decimal() {
        assert_eq!(to_bson(add(d("0.1"), d("0.2"))).to_string(), "0.3");
        assert_eq!(to_bson(add(d("10"), from_i64(5))).to_string(), "15");
        assert_eq!(to_bson(add(d("1.0"), from_i64(1))).to_string(), "2.0");
        assert_eq!(to_bson(from_f64(0.1)).to_string(), "0.100000000000000");
        assert_eq!(to_bson(from_f64(2.5)).to_string(), "2.50000000000000");
        assert_eq!(
            to_bson(div(d("1"), d("3"))).to_string(),
            "0.3333333333333333333333333333333333"
        );
        assert_eq!(to_bson(unary("$floor", d("-1.5"))).to_string(), "-2");
        assert_eq!(to_bson(unary("$trunc", d("-1.5"))).to_string(), "-1");
    }

    #[test]
    fn extremes_survive_the_round_trip() {
        for s in [
            "9.999999999999999999999999999999999E+6144",
            "1E-6176",
            "-0",
            "-0.00",
            "Infinity",
            "-Infinity",
            "NaN",
            "1.00",
        ] {
            assert_eq!(
                to_bson(from_bson(&b(s))).to_string(),
                b(s).to_string(),
                "{s}"
            );
        }
        let largest = from_bson(&b("9.999999999999999999999999999999999E+6144"));
        assert!(largest.is_finite());
        assert!(from_bson(&b("-0")).is_signed());
    }

    #[test]
    fn comparisons() {
        assert_eq!(cmp(d("1.0"), d("1.00")), Ordering::Equal);
        assert_eq!(cmp(d("1E-6176"), d("0")), Ordering::Greater);
        assert_eq!(cmp(d("-0"), d("0")), Ordering::Equal);
        assert_ne!(cmp(from_f64_for_compare(0.1), d("0.1")), Ordering::Equal);
        assert_eq!(cmp(from_f64_for_compare(0.5), d("0.5")), Ordering::Equal);
        assert_eq!(cmp(d("NaN"), d("-Infinity")), Ordering::Less);
        assert_eq!(canonical(d("1.00")), canonical(d("1")));
        assert_eq!(canonical(d("0.50")), canonical(d("0.5")));
    }
}
