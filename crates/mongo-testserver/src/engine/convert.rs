//! Type conversions of aggregation expressions (`$toLong`, `$toInt`, `$toDouble`, `$toDecimal`,
//! `$toDate`, `$toString`, `$toBool`, `$toObjectId`, `$convert`).

use bson::{oid::ObjectId, Bson, DateTime};

use super::compare::type_name;
use super::date::{format_iso, parse_iso};
use super::num::{f64_to_decimal, f64_to_i64_exact, Num};
use crate::error::{CommandError, CommandResult};

/// Code 241, ConversionFailure.
pub fn conversion_failure(message: impl Into<String>) -> CommandError {
    CommandError::new(241, "ConversionFailure", message)
}

fn unsupported(v: &Bson, to: &str) -> CommandError {
    conversion_failure(format!(
        "Unsupported conversion from {} to {to} in $convert with no onError value",
        type_name(v)
    ))
}

/// The target type names `$convert` accepts (also given as BSON type numbers).
pub fn target_name(to: &Bson) -> CommandResult<&'static str> {
    let name = match to {
        Bson::String(s) => match s.as_str() {
            "double" => "double",
            "string" => "string",
            "objectId" => "objectId",
            "bool" => "bool",
            "date" => "date",
            "int" => "int",
            "long" => "long",
            "decimal" => "decimal",
            other => {
                return Err(CommandError::bad_value(format!(
                    "Unknown type name: {other}"
                )))
            }
        },
        other => match Num::from_bson(other).and_then(Num::as_i64_exact) {
            Some(1) => "double",
            Some(2) => "string",
            Some(7) => "objectId",
            Some(8) => "bool",
            Some(9) => "date",
            Some(16) => "int",
            Some(18) => "long",
            Some(19) => "decimal",
            _ => {
                return Err(CommandError::bad_value(format!(
                    "$convert's 'to' argument must be a string or number, but is {other}"
                )))
            }
        },
    };
    Ok(name)
}

fn parse_number_string(s: &str, v: &Bson, to: &str) -> CommandResult<f64> {
    let t = s.trim();
    if t.is_empty() || t != s {
        return Err(conversion_failure(format!(
            "Failed to parse number '{s}' in $convert with no onError value"
        )));
    }
    t.parse::<f64>().map_err(|_| {
        let _ = (v, to);
        conversion_failure(format!(
            "Failed to parse number '{s}' in $convert with no onError value"
        ))
    })
}

/// Converts a non-null value to the named type as `$convert` does.
pub fn convert(v: &Bson, to: &str) -> CommandResult<Bson> {
    match to {
        "long" => to_long(v).map(Bson::Int64),
        "int" => {
            let l = match v {
                Bson::String(s) => {
                    let t = s.as_str();
                    t.parse::<i32>().map(i64::from).map_err(|_| {
                        conversion_failure(format!(
                            "Failed to parse number '{s}' in $convert with no onError value: Overflow or bad digits"
                        ))
                    })?
                }
                Bson::DateTime(_) => return Err(unsupported(v, "int")),
                other => to_long(other)?,
            };
            i32::try_from(l).map(Bson::Int32).map_err(|_| {
                conversion_failure(format!(
                    "Conversion would overflow target type in $convert with no onError value: {l}"
                ))
            })
        }
        "double" => match v {
            Bson::String(s) => parse_number_string(s, v, "double").map(Bson::Double),
            Bson::Boolean(b) => Ok(Bson::Double(if *b { 1.0 } else { 0.0 })),
            Bson::DateTime(d) => Ok(Bson::Double(d.timestamp_millis() as f64)),
            other => Num::from_bson(other)
                .map(|n| Bson::Double(n.as_f64()))
                .ok_or_else(|| unsupported(other, "double")),
        },
        "decimal" => match v {
            Bson::String(s) => s
                .parse::<bson::Decimal128>()
                .map(Bson::Decimal128)
                .map_err(|_| {
                    conversion_failure(format!(
                        "Failed to parse number '{s}' in $convert with no onError value"
                    ))
                }),
            Bson::Decimal128(_) => Ok(v.clone()),
            // Integers exactly; a double rounded to 15 significant digits (2.5 gives
            // Decimal128("2.50000000000000")), as MongoDB converts them.
            Bson::Boolean(b) => Ok(Bson::Decimal128(exact_decimal(i64::from(*b)))),
            Bson::DateTime(d) => Ok(Bson::Decimal128(exact_decimal(d.timestamp_millis()))),
            Bson::Int32(i) => Ok(Bson::Decimal128(exact_decimal(i64::from(*i)))),
            Bson::Int64(i) => Ok(Bson::Decimal128(exact_decimal(*i))),
            Bson::Double(f) => Ok(Bson::Decimal128(f64_to_decimal(*f))),
            other => Err(unsupported(other, "decimal")),
        },
        "bool" => match v {
            Bson::Boolean(_) => Ok(v.clone()),
            other => match Num::from_bson(other) {
                Some(n) => Ok(Bson::Boolean(!n.is_zero())),
                None => match other {
                    Bson::MinKey | Bson::MaxKey | Bson::Undefined => {
                        Err(unsupported(other, "bool"))
                    }
                    _ => Ok(Bson::Boolean(true)),
                },
            },
        },
        "date" => to_date(v).map(Bson::DateTime),
        "string" => to_string(v).map(Bson::String),
        "objectId" => match v {
            Bson::ObjectId(_) => Ok(v.clone()),
            Bson::String(s) => ObjectId::parse_str(s).map(Bson::ObjectId).map_err(|_| {
                conversion_failure(format!(
                    "Failed to parse objectId '{s}' in $convert with no onError value: Invalid string length for parsing to OID, expected 24 but found {}",
                    s.len()
                ))
            }),
            other => Err(unsupported(other, "objectId")),
        },
        other => Err(CommandError::bad_value(format!("Unknown type name: {other}"))),
    }
}

/// `$toLong` of a non-null value.
pub fn to_long(v: &Bson) -> CommandResult<i64> {
    match v {
        Bson::Int32(i) => Ok(i64::from(*i)),
        Bson::Int64(i) => Ok(*i),
        Bson::Boolean(b) => Ok(i64::from(*b)),
        Bson::DateTime(d) => Ok(d.timestamp_millis()),
        Bson::Double(_) | Bson::Decimal128(_) => {
            let f = Num::from_bson(v).map(Num::as_f64).unwrap_or(f64::NAN);
            if f.is_nan() {
                return Err(conversion_failure(
                    "Attempt to convert NaN value to integer type in $convert with no onError value",
                ));
            }
            f64_to_i64_exact(f.trunc()).ok_or_else(|| {
                conversion_failure(format!(
                    "Conversion would overflow target type in $convert with no onError value: {f}"
                ))
            })
        }
        Bson::String(s) => s.parse::<i64>().map_err(|_| {
            conversion_failure(format!(
                "Failed to parse number '{s}' in $convert with no onError value: Did not consume whole string."
            ))
        }),
        other => Err(unsupported(other, "long")),
    }
}

/// `$toDate` of a non-null value.
pub fn to_date(v: &Bson) -> CommandResult<DateTime> {
    match v {
        Bson::DateTime(d) => Ok(*d),
        Bson::Int64(i) => Ok(DateTime::from_millis(*i)),
        Bson::Double(_) | Bson::Decimal128(_) => {
            let f = Num::from_bson(v).map(Num::as_f64).unwrap_or(f64::NAN);
            f64_to_i64_exact(f.trunc())
                .map(DateTime::from_millis)
                .ok_or_else(|| {
                    conversion_failure(format!(
                        "Conversion would overflow target type in $convert with no onError value: {f}"
                    ))
                })
        }
        Bson::String(s) => parse_iso(s).map(DateTime::from_millis).ok_or_else(|| {
            conversion_failure(format!(
                "Error parsing date string '{s}'; in $convert with no onError value"
            ))
        }),
        Bson::ObjectId(o) => Ok(DateTime::from_millis(
            i64::from(u32::from_be_bytes({
                let b = o.bytes();
                [b[0], b[1], b[2], b[3]]
            })) * 1000,
        )),
        Bson::Timestamp(t) => Ok(DateTime::from_millis(i64::from(t.time) * 1000)),
        other => Err(unsupported(other, "date")),
    }
}

/// Formats a double as MongoDB's `$toString` does.
pub fn double_to_string(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else if f == f.trunc() && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

/// `$toString` of a non-null value.
pub fn to_string(v: &Bson) -> CommandResult<String> {
    match v {
        Bson::String(s) | Bson::Symbol(s) => Ok(s.clone()),
        Bson::Int32(i) => Ok(i.to_string()),
        Bson::Int64(i) => Ok(i.to_string()),
        Bson::Double(f) => Ok(double_to_string(*f)),
        Bson::Decimal128(d) => Ok(d.to_string()),
        Bson::Boolean(b) => Ok(b.to_string()),
        Bson::ObjectId(o) => Ok(o.to_hex()),
        Bson::DateTime(d) => Ok(format_iso(d.timestamp_millis())),
        other => Err(unsupported(other, "string")),
    }
}

fn exact_decimal(i: i64) -> bson::Decimal128 {
    super::decimal::to_bson(super::decimal::from_i64(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs() {
        assert_eq!(to_long(&Bson::Double(2.9)).ok(), Some(2));
        assert_eq!(to_long(&Bson::Double(-2.9)).ok(), Some(-2));
        assert_eq!(to_long(&Bson::String("42".into())).ok(), Some(42));
        assert_eq!(to_long(&Bson::Boolean(true)).ok(), Some(1));
        assert_eq!(
            to_long(&Bson::String("4x".into())).map_err(|e| e.code),
            Err(241)
        );
        assert_eq!(to_long(&Bson::Double(1e300)).map_err(|e| e.code), Err(241));
        assert_eq!(
            to_long(&Bson::Document(bson::doc! {})).map_err(|e| e.code),
            Err(241)
        );
        assert_eq!(
            to_long(&Bson::DateTime(DateTime::from_millis(7))).ok(),
            Some(7)
        );
    }

    #[test]
    fn others() {
        assert_eq!(convert(&Bson::Int64(5), "int").ok(), Some(Bson::Int32(5)));
        assert!(convert(&Bson::Int64(1 << 40), "int").is_err());
        assert_eq!(
            convert(&Bson::Int32(0), "bool").ok(),
            Some(Bson::Boolean(false))
        );
        assert_eq!(
            convert(&Bson::String(String::new()), "bool").ok(),
            Some(Bson::Boolean(true))
        );
        assert_eq!(
            convert(&Bson::String("1.5".into()), "double").ok(),
            Some(Bson::Double(1.5))
        );
        assert_eq!(to_string(&Bson::Double(3.0)).ok(), Some("3".into()));
        assert_eq!(to_string(&Bson::Double(2.5)).ok(), Some("2.5".into()));
        assert_eq!(
            to_string(&Bson::DateTime(DateTime::from_millis(0))).ok(),
            Some("1970-01-01T00:00:00.000Z".into())
        );
        assert_eq!(
            to_date(&Bson::Int64(5)).ok(),
            Some(DateTime::from_millis(5))
        );
        assert!(to_date(&Bson::Int32(5)).is_err());
        assert_eq!(
            to_date(&Bson::String("1970-01-01T00:00:01Z".into())).ok(),
            Some(DateTime::from_millis(1000))
        );
        let oid = ObjectId::new();
        assert_eq!(
            convert(&Bson::String(oid.to_hex()), "objectId").ok(),
            Some(Bson::ObjectId(oid))
        );
        assert_eq!(target_name(&Bson::Int32(18)).ok(), Some("long"));
        assert!(target_name(&Bson::String("nope".into())).is_err());
    }
}
