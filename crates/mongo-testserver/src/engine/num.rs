//! Numeric values and arithmetic with MongoDB's type promotion.
//!
//! int32 op int32 gives int32 unless it overflows (then int64); int64 overflowing gives double in
//! aggregation (update operators report an error instead, see [`checked_add`]); any double makes
//! a double; any decimal makes a decimal, computed as IEEE 754-2008 decimal128 (see
//! [`super::decimal`]).

use bson::{Bson, Decimal128};

use super::decimal::{self, Decimal};

/// A number of one of BSON's numeric types.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// int32
    I32(i32),
    /// int64
    I64(i64),
    /// double
    F64(f64),
    /// decimal128
    Dec(Decimal),
}

impl Num {
    /// The number held by a BSON value, if it is numeric.
    pub fn from_bson(v: &Bson) -> Option<Num> {
        match v {
            Bson::Int32(i) => Some(Num::I32(*i)),
            Bson::Int64(i) => Some(Num::I64(*i)),
            Bson::Double(f) => Some(Num::F64(*f)),
            Bson::Decimal128(d) => Some(Num::Dec(decimal::from_bson(d))),
            _ => None,
        }
    }

    /// As a BSON value of the corresponding type.
    pub fn to_bson(self) -> Bson {
        match self {
            Num::I32(i) => Bson::Int32(i),
            Num::I64(i) => Bson::Int64(i),
            Num::F64(f) => Bson::Double(f),
            Num::Dec(d) => Bson::Decimal128(decimal::to_bson(d)),
        }
    }

    /// As an `f64` (possibly rounded).
    pub fn as_f64(self) -> f64 {
        match self {
            Num::I32(i) => f64::from(i),
            Num::I64(i) => i as f64,
            Num::F64(f) => f,
            Num::Dec(d) => decimal::to_f64(d),
        }
    }

    /// As a decimal: integers exactly, doubles rounded to 15 digits (as MongoDB converts an
    /// operand of mixed arithmetic).
    pub fn as_dec(self) -> Decimal {
        match self {
            Num::I32(i) => decimal::from_i64(i64::from(i)),
            Num::I64(i) => decimal::from_i64(i),
            Num::F64(f) => decimal::from_f64(f),
            Num::Dec(d) => d,
        }
    }

    /// A double converted to decimal as MongoDB converts it (15 significant digits).
    pub fn dec_from_f64(f: f64) -> Num {
        Num::Dec(decimal::from_f64(f))
    }

    /// The exact integer value, if the number is integral and fits an `i64`.
    pub fn as_i64_exact(self) -> Option<i64> {
        match self {
            Num::I32(i) => Some(i64::from(i)),
            Num::I64(i) => Some(i),
            Num::F64(f) => f64_to_i64_exact(f),
            Num::Dec(d) => decimal::to_i64_exact(d),
        }
    }

    /// True if the value is zero.
    pub fn is_zero(self) -> bool {
        match self {
            Num::Dec(d) => d.is_zero(),
            other => other.as_f64() == 0.0,
        }
    }

    fn rank(self) -> u8 {
        match self {
            Num::I32(_) => 0,
            Num::I64(_) => 1,
            Num::F64(_) => 2,
            Num::Dec(_) => 3,
        }
    }
}

/// `f` as an `i64` if it is integral and in range.
pub fn f64_to_i64_exact(f: f64) -> Option<i64> {
    if f.is_finite()
        && f.trunc() == f
        && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f)
    {
        Some(f as i64)
    } else {
        None
    }
}

/// An `f64` as a decimal128 value, rounded to 15 significant digits as MongoDB converts it.
pub fn f64_to_decimal(f: f64) -> Decimal128 {
    decimal::to_bson(decimal::from_f64(f))
}

#[derive(Clone, Copy)]
enum Op {
    Add,
    Sub,
    Mul,
}

fn int_op(op: Op, a: i64, b: i64) -> Option<i64> {
    match op {
        Op::Add => a.checked_add(b),
        Op::Sub => a.checked_sub(b),
        Op::Mul => a.checked_mul(b),
    }
}

fn float_op(op: Op, a: f64, b: f64) -> f64 {
    match op {
        Op::Add => a + b,
        Op::Sub => a - b,
        Op::Mul => a * b,
    }
}

/// Applies `op` with promotion; `None` when an int64 result overflows.
fn checked(op: Op, a: Num, b: Num) -> Option<Num> {
    let rank = a.rank().max(b.rank());
    match rank {
        0 | 1 => {
            let (x, y) = (a.as_i64_exact()?, b.as_i64_exact()?);
            let r = int_op(op, x, y)?;
            if rank == 0 {
                Some(i32::try_from(r).map(Num::I32).unwrap_or(Num::I64(r)))
            } else {
                Some(Num::I64(r))
            }
        }
        2 => Some(Num::F64(float_op(op, a.as_f64(), b.as_f64()))),
        _ => {
            let (x, y) = (a.as_dec(), b.as_dec());
            Some(Num::Dec(match op {
                Op::Add => decimal::add(x, y),
                Op::Sub => decimal::sub(x, y),
                Op::Mul => decimal::mul(x, y),
            }))
        }
    }
}

fn promoting(op: Op, a: Num, b: Num) -> Num {
    checked(op, a, b).unwrap_or_else(|| Num::F64(float_op(op, a.as_f64(), b.as_f64())))
}

/// `a + b` as aggregation's `$add` computes it (int64 overflow gives a double).
pub fn add(a: Num, b: Num) -> Num {
    promoting(Op::Add, a, b)
}

/// `a - b` as `$subtract` computes it.
pub fn sub(a: Num, b: Num) -> Num {
    promoting(Op::Sub, a, b)
}

/// `a * b` as `$multiply` computes it.
pub fn mul(a: Num, b: Num) -> Num {
    promoting(Op::Mul, a, b)
}

/// `a + b` as the `$inc` update operator computes it: `None` when an int64 overflows.
pub fn checked_add(a: Num, b: Num) -> Option<Num> {
    checked(Op::Add, a, b)
}

/// `a * b` as the `$mul` update operator computes it: `None` when an int64 overflows.
pub fn checked_mul(a: Num, b: Num) -> Option<Num> {
    checked(Op::Mul, a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion() {
        assert_eq!(add(Num::I32(1), Num::I32(2)), Num::I32(3));
        assert_eq!(
            add(Num::I32(i32::MAX), Num::I32(1)),
            Num::I64(i64::from(i32::MAX) + 1)
        );
        assert_eq!(add(Num::I64(1), Num::I32(2)), Num::I64(3));
        assert_eq!(
            add(Num::I64(i64::MAX), Num::I64(1)),
            Num::F64(i64::MAX as f64 + 1.0)
        );
        assert_eq!(add(Num::I32(1), Num::F64(0.5)), Num::F64(1.5));
        let dec = |s: &str| Num::from_bson(&Bson::Decimal128(s.parse().unwrap())).unwrap();
        assert_eq!(
            add(dec("1.0"), Num::F64(0.5)).to_bson(),
            dec("1.500000000000000").to_bson()
        );
        assert_eq!(add(dec("10"), Num::I32(5)).to_bson(), dec("15").to_bson());
        assert_eq!(mul(Num::I32(1 << 20), Num::I32(1 << 20)), Num::I64(1 << 40));
        assert_eq!(sub(Num::I32(1), Num::I32(3)), Num::I32(-2));
        assert_eq!(checked_add(Num::I64(i64::MAX), Num::I32(1)), None);
    }

    #[test]
    fn decimals_round_trip() {
        for s in ["2.5", "-0", "Infinity", "1E-6176", "1.00"] {
            let b = Bson::Decimal128(s.parse().unwrap());
            assert_eq!(Num::from_bson(&b).unwrap().to_bson(), b);
        }
        let b = Bson::Decimal128("1E+2".parse().unwrap());
        assert_eq!(Num::from_bson(&b).unwrap().as_i64_exact(), Some(100));
        for (s, want) in [
            ("-1E+2", Some(-100)),
            ("-5.0", Some(-5)),
            ("0.5", None),
            ("1E+30", None),
        ] {
            let b = Bson::Decimal128(s.parse().unwrap());
            assert_eq!(Num::from_bson(&b).unwrap().as_i64_exact(), want, "{s}");
        }
    }
}
