//! Numeric values and arithmetic with MongoDB's type promotion.
//!
//! int32 op int32 gives int32 unless it overflows (then int64); int64 overflowing gives double in
//! aggregation (update operators report an error instead, see [`checked_add`]); any double makes
//! a double; any decimal makes a decimal (decimal arithmetic is carried out in `f64`).

use bson::{Bson, Decimal128};

use super::compare::decimal_to_f64;

/// A number of one of BSON's numeric types.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// int32
    I32(i32),
    /// int64
    I64(i64),
    /// double
    F64(f64),
    /// decimal128 (held as `f64`)
    Dec(f64),
}

impl Num {
    /// The number held by a BSON value, if it is numeric.
    pub fn from_bson(v: &Bson) -> Option<Num> {
        match v {
            Bson::Int32(i) => Some(Num::I32(*i)),
            Bson::Int64(i) => Some(Num::I64(*i)),
            Bson::Double(f) => Some(Num::F64(*f)),
            Bson::Decimal128(d) => Some(Num::Dec(decimal_to_f64(d))),
            _ => None,
        }
    }

    /// As a BSON value of the corresponding type.
    pub fn to_bson(self) -> Bson {
        match self {
            Num::I32(i) => Bson::Int32(i),
            Num::I64(i) => Bson::Int64(i),
            Num::F64(f) => Bson::Double(f),
            Num::Dec(f) => Bson::Decimal128(f64_to_decimal(f)),
        }
    }

    /// As an `f64` (possibly rounded).
    pub fn as_f64(self) -> f64 {
        match self {
            Num::I32(i) => f64::from(i),
            Num::I64(i) => i as f64,
            Num::F64(f) | Num::Dec(f) => f,
        }
    }

    /// The exact integer value, if the number is integral and fits an `i64`.
    pub fn as_i64_exact(self) -> Option<i64> {
        match self {
            Num::I32(i) => Some(i64::from(i)),
            Num::I64(i) => Some(i),
            Num::F64(f) | Num::Dec(f) => f64_to_i64_exact(f),
        }
    }

    /// True if the value is zero.
    pub fn is_zero(self) -> bool {
        self.as_f64() == 0.0
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

/// An `f64` as a decimal128 value.
pub fn f64_to_decimal(f: f64) -> Decimal128 {
    let s = if f.is_nan() {
        "NaN".to_string()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
    } else {
        format!("{f:?}")
    };
    s.parse()
        .unwrap_or_else(|_| Decimal128::from_bytes([0; 16]))
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
        _ => Some(Num::Dec(float_op(op, a.as_f64(), b.as_f64()))),
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
        assert_eq!(add(Num::Dec(1.0), Num::F64(0.5)), Num::Dec(1.5));
        assert_eq!(mul(Num::I32(1 << 20), Num::I32(1 << 20)), Num::I64(1 << 40));
        assert_eq!(sub(Num::I32(1), Num::I32(3)), Num::I32(-2));
        assert_eq!(checked_add(Num::I64(i64::MAX), Num::I32(1)), None);
    }

    #[test]
    fn decimals_round_trip() {
        let d = Num::Dec(2.5).to_bson();
        assert_eq!(Num::from_bson(&d), Some(Num::Dec(2.5)));
        assert_eq!(
            Num::from_bson(&Num::Dec(f64::INFINITY).to_bson()),
            Some(Num::Dec(f64::INFINITY))
        );
    }
}
