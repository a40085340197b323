//! BSON comparison order and query equality, as MongoDB defines them.
//!
//! Values of different types compare by a canonical type rank (MinKey < undefined < null <
//! numbers < strings/symbols < objects < arrays < binData < ObjectId < bool < date < timestamp <
//! regex < dbPointer < javascript < javascriptWithScope < MaxKey). Numbers compare by value across
//! int32, int64, double and decimal128 (decimals are compared through `f64`, which is exact for
//! every value a test is likely to use). NaN sorts before every other number and equals itself.
//! Strings compare by their UTF-8 bytes (the simple binary collation).

use std::cmp::Ordering;

use bson::{Bson, Document};

/// Rank of a BSON type in MongoDB's cross-type comparison order.
pub fn type_rank(v: &Bson) -> u8 {
    match v {
        Bson::MinKey => 0,
        Bson::Undefined => 1,
        Bson::Null => 2,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 3,
        Bson::String(_) | Bson::Symbol(_) => 4,
        Bson::Document(_) => 5,
        Bson::Array(_) => 6,
        Bson::Binary(_) => 7,
        Bson::ObjectId(_) => 8,
        Bson::Boolean(_) => 9,
        Bson::DateTime(_) => 10,
        Bson::Timestamp(_) => 11,
        Bson::RegularExpression(_) => 12,
        Bson::DbPointer(_) => 13,
        Bson::JavaScriptCode(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::MaxKey => 16,
    }
}

/// A decimal128 as an `f64` (NaN when it cannot be read).
pub fn decimal_to_f64(d: &bson::Decimal128) -> f64 {
    super::decimal::to_f64(super::decimal::from_bson(d))
}

/// Compares an `i64` with an `f64` exactly (NaN is less than every integer).
fn cmp_i64_f64(i: i64, f: f64) -> Ordering {
    if f.is_nan() {
        return Ordering::Greater;
    }
    // 2^63 as f64; every f64 at or above it exceeds every i64.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f >= TWO_63 {
        return Ordering::Less;
    }
    if f < -TWO_63 {
        return Ordering::Greater;
    }
    let t = f.trunc();
    // In range: the truncation converts exactly.
    let ti = t as i64;
    match i.cmp(&ti) {
        Ordering::Equal => {
            let frac = f - t;
            if frac > 0.0 {
                Ordering::Less
            } else if frac < 0.0 {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        }
        o => o,
    }
}

fn cmp_f64(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        // Neither is NaN: partial_cmp is total here (and -0.0 == 0.0).
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Compares two numbers of any numeric BSON type by value. Non-numbers compare as equal.
pub fn compare_numbers(a: &Bson, b: &Bson) -> Ordering {
    use super::decimal;
    enum N {
        I(i64),
        F(f64),
        D(decimal::Decimal),
    }
    fn n(v: &Bson) -> N {
        match v {
            Bson::Int32(i) => N::I(i64::from(*i)),
            Bson::Int64(i) => N::I(*i),
            Bson::Double(f) => N::F(*f),
            Bson::Decimal128(d) => N::D(decimal::from_bson(d)),
            _ => N::F(0.0),
        }
    }
    // With a decimal on either side the comparison is decimal: integers convert exactly,
    // doubles rounded to 34 digits (so the double 0.1 is not Decimal128("0.1")).
    fn d(x: N) -> decimal::Decimal {
        match x {
            N::I(i) => decimal::from_i64(i),
            N::F(f) => decimal::from_f64_for_compare(f),
            N::D(d) => d,
        }
    }
    match (n(a), n(b)) {
        (N::I(x), N::I(y)) => x.cmp(&y),
        (N::I(x), N::F(y)) => cmp_i64_f64(x, y),
        (N::F(x), N::I(y)) => cmp_i64_f64(y, x).reverse(),
        (N::F(x), N::F(y)) => cmp_f64(x, y),
        (x, y) => decimal::cmp(d(x), d(y)),
    }
}

/// Compares two documents as MongoDB does: element by element, first by the canonical type of
/// the values, then by field name, then by value; a prefix sorts first.
pub fn compare_documents(a: &Document, b: &Document) -> Ordering {
    let mut ia = a.iter();
    let mut ib = b.iter();
    loop {
        match (ia.next(), ib.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((ka, va)), Some((kb, vb))) => {
                let o = type_rank(va)
                    .cmp(&type_rank(vb))
                    .then_with(|| ka.as_bytes().cmp(kb.as_bytes()))
                    .then_with(|| compare(va, vb));
                if o != Ordering::Equal {
                    return o;
                }
            }
        }
    }
}

fn compare_arrays(a: &[Bson], b: &[Bson]) -> Ordering {
    for (x, y) in a.iter().zip(b.iter()) {
        let o = compare(x, y);
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

/// BSON comparison/sort order across types, as MongoDB defines it. A total order.
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    let (ra, rb) = (type_rank(a), type_rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    match (a, b) {
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => {
            x.as_bytes().cmp(y.as_bytes())
        }
        (Bson::Document(x), Bson::Document(y)) => compare_documents(x, y),
        (Bson::Array(x), Bson::Array(y)) => compare_arrays(x, y),
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::RegularExpression(x), Bson::RegularExpression(y)) => x
            .pattern
            .cmp(&y.pattern)
            .then_with(|| x.options.cmp(&y.options)),
        (Bson::JavaScriptCode(x), Bson::JavaScriptCode(y)) => x.cmp(y),
        (Bson::JavaScriptCodeWithScope(x), Bson::JavaScriptCodeWithScope(y)) => x
            .code
            .cmp(&y.code)
            .then_with(|| compare_documents(&x.scope, &y.scope)),
        (Bson::DbPointer(x), Bson::DbPointer(y)) => format!("{x:?}").cmp(&format!("{y:?}")),
        _ if ra == 3 => compare_numbers(a, b),
        // MinKey, MaxKey, null, undefined: one value per type.
        _ => Ordering::Equal,
    }
}

/// Compares two possibly-missing values; missing sorts before every value (as in aggregation
/// expressions, where a missing field is not equal to null).
pub fn compare_opt(a: Option<&Bson>, b: Option<&Bson>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => compare(x, y),
    }
}

/// Query equality: numbers equal across types (1 == 1i64 == 1.0); documents are compared
/// field by field in order, as MongoDB does.
pub fn values_equal(a: &Bson, b: &Bson) -> bool {
    compare(a, b) == Ordering::Equal
}

/// True for int32, int64, double and decimal128.
pub fn is_number(v: &Bson) -> bool {
    type_rank(v) == 3
}

/// A BSON value ordered by [`compare`]: usable as a key of ordered maps and sets (e.g. an index
/// on `_id`, where `1`, `1i64` and `1.0` are the same key, as in MongoDB).
#[derive(Debug, Clone)]
pub struct OrdBson(pub Bson);

impl PartialEq for OrdBson {
    fn eq(&self, other: &Self) -> bool {
        compare(&self.0, &other.0) == Ordering::Equal
    }
}
impl Eq for OrdBson {}
impl PartialOrd for OrdBson {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdBson {
    fn cmp(&self, other: &Self) -> Ordering {
        compare(&self.0, &other.0)
    }
}

/// The name MongoDB's `$type` gives a value's type (`"double"`, `"string"`, `"object"`, ...).
pub fn type_name(v: &Bson) -> &'static str {
    match v {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Document(_) => "object",
        Bson::Array(_) => "array",
        Bson::Binary(_) => "binData",
        Bson::Undefined => "undefined",
        Bson::ObjectId(_) => "objectId",
        Bson::Boolean(_) => "bool",
        Bson::DateTime(_) => "date",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regex",
        Bson::DbPointer(_) => "dbPointer",
        Bson::JavaScriptCode(_) => "javascript",
        Bson::Symbol(_) => "symbol",
        Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
        Bson::Int32(_) => "int",
        Bson::Timestamp(_) => "timestamp",
        Bson::Int64(_) => "long",
        Bson::Decimal128(_) => "decimal",
        Bson::MinKey => "minKey",
        Bson::MaxKey => "maxKey",
    }
}

/// The BSON type number of a value (1 double, 2 string, ... -1 minKey, 127 maxKey).
pub fn type_number(v: &Bson) -> i32 {
    match v {
        Bson::MinKey => -1,
        Bson::MaxKey => 127,
        other => i32::from(other.element_type() as u8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId, Binary, DateTime, Regex, Timestamp};

    fn sample() -> Vec<Bson> {
        vec![
            Bson::MaxKey,
            Bson::MinKey,
            Bson::Null,
            Bson::Undefined,
            Bson::Int32(1),
            Bson::Int64(1),
            Bson::Double(1.0),
            Bson::Double(1.5),
            Bson::Double(f64::NAN),
            Bson::Double(f64::INFINITY),
            Bson::Double(f64::NEG_INFINITY),
            Bson::Int64(i64::MAX),
            Bson::Int64(i64::MIN),
            Bson::Double(9.223_372_036_854_776e18),
            Bson::Decimal128("2.5".parse().unwrap()),
            Bson::Int32(-3),
            Bson::String("a".into()),
            Bson::String("b".into()),
            Bson::String(String::new()),
            Bson::Symbol("a".into()),
            Bson::Document(doc! {}),
            Bson::Document(doc! {"a": 1}),
            Bson::Document(doc! {"a": "x"}),
            Bson::Document(doc! {"b": 1}),
            Bson::Document(doc! {"a": 1, "b": 2}),
            Bson::Array(vec![]),
            Bson::Array(vec![Bson::Int32(1)]),
            Bson::Array(vec![Bson::Int32(1), Bson::Int32(2)]),
            Bson::Array(vec![Bson::String("a".into())]),
            Bson::Binary(Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: vec![1, 2],
            }),
            Bson::Binary(Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: vec![3],
            }),
            Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bson::ObjectId(ObjectId::from_bytes([1; 12])),
            Bson::Boolean(false),
            Bson::Boolean(true),
            Bson::DateTime(DateTime::from_millis(-5)),
            Bson::DateTime(DateTime::from_millis(5)),
            Bson::Timestamp(Timestamp {
                time: 1,
                increment: 2,
            }),
            Bson::Timestamp(Timestamp {
                time: 2,
                increment: 1,
            }),
            Bson::RegularExpression(Regex {
                pattern: "a".into(),
                options: String::new(),
            }),
            Bson::JavaScriptCode("x".into()),
        ]
    }

    #[test]
    fn cross_type_order() {
        let ordered = [
            Bson::MinKey,
            Bson::Null,
            Bson::Int32(5),
            Bson::String("a".into()),
            Bson::Document(doc! {}),
            Bson::Array(vec![]),
            Bson::Binary(Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: vec![],
            }),
            Bson::ObjectId(ObjectId::new()),
            Bson::Boolean(false),
            Bson::DateTime(DateTime::from_millis(0)),
            Bson::Timestamp(Timestamp {
                time: 0,
                increment: 0,
            }),
            Bson::RegularExpression(Regex {
                pattern: String::new(),
                options: String::new(),
            }),
            Bson::MaxKey,
        ];
        for w in ordered.windows(2) {
            assert_eq!(
                compare(&w[0], &w[1]),
                Ordering::Less,
                "{:?} < {:?}",
                w[0],
                w[1]
            );
        }
    }

    #[test]
    fn numbers_across_types() {
        assert!(values_equal(&Bson::Int32(1), &Bson::Int64(1)));
        assert!(values_equal(&Bson::Int32(1), &Bson::Double(1.0)));
        assert!(values_equal(
            &Bson::Decimal128("1".parse().unwrap()),
            &Bson::Int32(1)
        ));
        assert_eq!(
            compare(
                &Bson::Int64(i64::MAX),
                &Bson::Double(9.223_372_036_854_776e18)
            ),
            Ordering::Less
        );
        assert_eq!(
            compare(&Bson::Int64(i64::MAX - 1), &Bson::Int64(i64::MAX)),
            Ordering::Less
        );
        assert_eq!(
            compare(&Bson::Int32(2), &Bson::Double(1.5)),
            Ordering::Greater
        );
        assert_eq!(
            compare(&Bson::Int32(-2), &Bson::Double(-1.5)),
            Ordering::Less
        );
        assert_eq!(
            compare(&Bson::Double(f64::NAN), &Bson::Int64(i64::MIN)),
            Ordering::Less
        );
        assert!(values_equal(
            &Bson::Double(f64::NAN),
            &Bson::Double(f64::NAN)
        ));
        assert!(values_equal(&Bson::Double(0.0), &Bson::Double(-0.0)));
    }

    #[test]
    fn documents_are_order_sensitive() {
        assert!(!values_equal(
            &Bson::Document(doc! {"a": 1, "b": 2}),
            &Bson::Document(doc! {"b": 2, "a": 1})
        ));
        assert!(values_equal(
            &Bson::Document(doc! {"a": 1, "b": 2}),
            &Bson::Document(doc! {"a": 1.0, "b": 2i64})
        ));
        assert_eq!(
            compare(
                &Bson::Document(doc! {"a": 1}),
                &Bson::Document(doc! {"a": 1, "b": 1})
            ),
            Ordering::Less
        );
    }

    #[test]
    fn strings_and_symbols() {
        assert!(values_equal(
            &Bson::String("x".into()),
            &Bson::Symbol("x".into())
        ));
        assert_eq!(
            compare(&Bson::String("B".into()), &Bson::String("a".into())),
            Ordering::Less
        );
    }

    #[test]
    fn total_order_property() {
        let s = sample();
        for a in &s {
            assert_eq!(compare(a, a), Ordering::Equal, "reflexive {a:?}");
            for b in &s {
                assert_eq!(
                    compare(a, b),
                    compare(b, a).reverse(),
                    "antisymmetric {a:?} {b:?}"
                );
                for c in &s {
                    if compare(a, b) != Ordering::Greater && compare(b, c) != Ordering::Greater {
                        assert_ne!(
                            compare(a, c),
                            Ordering::Greater,
                            "transitive {a:?} {b:?} {c:?}"
                        );
                    }
                }
            }
        }
        let mut sorted = s.clone();
        sorted.sort_by(compare);
        for w in sorted.windows(2) {
            assert_ne!(compare(&w[0], &w[1]), Ordering::Greater);
        }
    }

    #[test]
    fn ord_bson_keys() {
        let mut set = std::collections::BTreeSet::new();
        set.insert(OrdBson(Bson::Int32(1)));
        assert!(set.contains(&OrdBson(Bson::Double(1.0))));
        assert!(!set.contains(&OrdBson(Bson::String("1".into()))));
    }

    #[test]
    fn names() {
        assert_eq!(type_name(&Bson::Int64(1)), "long");
        assert_eq!(type_number(&Bson::MaxKey), 127);
        assert_eq!(type_number(&Bson::String("".into())), 2);
    }
}
