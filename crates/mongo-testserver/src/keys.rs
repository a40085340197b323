//! Canonical byte keys for BSON values (equal under MongoDB's comparison ⇔ equal bytes, for the
//! types that can appear as `_id` or index keys), plus mongod-style rendering of key values.

use bson::{Bson, Document};

/// A value's canonical key: numbers of any type with the same value give the same key.
pub type KeyBytes = Vec<u8>;

/// The canonical key of one value.
pub fn key_of(value: &Bson) -> KeyBytes {
    let mut out = Vec::with_capacity(32);
    push_key(value, &mut out);
    out
}

fn push_i64(out: &mut Vec<u8>, v: i64) {
    out.push(b'n');
    out.extend_from_slice(&v.to_be_bytes());
}

fn push_str(out: &mut Vec<u8>, tag: u8, s: &str) {
    out.push(tag);
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends the canonical key of `value` to `out`.
pub fn push_key(value: &Bson, out: &mut Vec<u8>) {
    match value {
        Bson::Int32(i) => push_i64(out, i64::from(*i)),
        Bson::Int64(i) => push_i64(out, *i),
        Bson::Double(f) => {
            // Integral doubles within i64 range share the key of the same integer.
            if f.fract() == 0.0 && *f >= -9.223_372_036_854_776e18 && *f < 9.223_372_036_854_776e18
            {
                push_i64(out, *f as i64);
            } else if f.is_nan() {
                out.push(b'N');
            } else {
                out.push(b'f');
                out.extend_from_slice(&f.to_bits().to_be_bytes());
            }
        }
        Bson::Decimal128(d) => {
            // Numerically equal numbers share a key: `1`, `1.0` and Decimal128("1.00"), the
            // double 0.5 and Decimal128("0.50"); other decimals key on their reduced form.
            use crate::engine::decimal;
            let x = decimal::from_bson(d);
            if x.is_nan() {
                out.push(b'N');
            } else if let Some(i) = crate::engine::num::Num::Dec(x).as_i64_exact() {
                push_i64(out, i);
            } else {
                let f = decimal::to_f64(x);
                if decimal::cmp(decimal::from_f64_for_compare(f), x).is_eq() {
                    push_key(&Bson::Double(f), out);
                } else {
                    push_str(out, b'd', &decimal::canonical(x));
                }
            }
        }
        Bson::String(s) => push_str(out, b's', s),
        Bson::Symbol(s) => push_str(out, b's', s),
        Bson::Null => out.push(b'0'),
        // An empty array is indexed as `undefined`, a key distinct from null: a unique index
        // holds one `{a: []}` and one `{a: null}`.
        Bson::Undefined => out.push(b'u'),
        Bson::Boolean(b) => {
            out.push(b'b');
            out.push(u8::from(*b));
        }
        Bson::ObjectId(oid) => {
            out.push(b'o');
            out.extend_from_slice(&oid.bytes());
        }
        Bson::DateTime(dt) => {
            out.push(b't');
            out.extend_from_slice(&dt.timestamp_millis().to_be_bytes());
        }
        Bson::Timestamp(ts) => {
            out.push(b'T');
            out.extend_from_slice(&ts.time.to_be_bytes());
            out.extend_from_slice(&ts.increment.to_be_bytes());
        }
        Bson::Binary(b) => {
            out.push(b'B');
            out.extend_from_slice(&(b.bytes.len() as u32).to_be_bytes());
            out.push(u8::from(b.subtype));
            out.extend_from_slice(&b.bytes);
        }
        Bson::Document(d) => {
            out.push(b'{');
            for (k, v) in d {
                push_str(out, b'k', k);
                push_key(v, out);
            }
            out.push(b'}');
        }
        Bson::Array(a) => {
            out.push(b'[');
            for v in a {
                push_key(v, out);
            }
            out.push(b']');
        }
        Bson::RegularExpression(r) => {
            push_str(out, b'r', &r.pattern);
            push_str(out, b'r', &r.options);
        }
        Bson::JavaScriptCode(c) => push_str(out, b'j', c),
        Bson::JavaScriptCodeWithScope(c) => {
            push_str(out, b'J', &c.code);
            push_key(&Bson::Document(c.scope.clone()), out);
        }
        Bson::MaxKey => out.push(b'+'),
        Bson::MinKey => out.push(b'-'),
        Bson::DbPointer(p) => {
            out.push(b'p');
            out.extend_from_slice(format!("{p:?}").as_bytes());
        }
    }
}

/// Renders a value as mongod does in duplicate-key messages (`"x"`, `1`, `ObjectId('…')`).
pub fn render(value: &Bson) -> String {
    let mut s = String::new();
    render_into(value, &mut s);
    s
}

fn render_into(value: &Bson, s: &mut String) {
    use std::fmt::Write;
    match value {
        Bson::String(v) => {
            let _ = write!(s, "{v:?}");
        }
        Bson::Int32(v) => {
            let _ = write!(s, "{v}");
        }
        Bson::Int64(v) => {
            let _ = write!(s, "{v}");
        }
        Bson::Double(v) => {
            if v.fract() == 0.0 && v.is_finite() {
                let _ = write!(s, "{v:.1}");
            } else {
                let _ = write!(s, "{v}");
            }
        }
        Bson::ObjectId(o) => {
            let _ = write!(s, "ObjectId('{o}')");
        }
        Bson::Null => s.push_str("null"),
        Bson::Boolean(b) => {
            let _ = write!(s, "{b}");
        }
        Bson::DateTime(d) => {
            let _ = write!(s, "new Date({})", d.timestamp_millis());
        }
        Bson::Document(d) => render_doc_into(d, s),
        Bson::Array(a) => {
            s.push('[');
            for (i, v) in a.iter().enumerate() {
                s.push_str(if i == 0 { " " } else { ", " });
                render_into(v, s);
            }
            s.push_str(if a.is_empty() { "]" } else { " ]" });
        }
        other => {
            let _ = write!(s, "{other}");
        }
    }
}

/// Renders a document as `{ a: 1, b: "x" }`.
pub fn render_doc(doc: &Document) -> String {
    let mut s = String::new();
    render_doc_into(doc, &mut s);
    s
}

fn render_doc_into(doc: &Document, s: &mut String) {
    if doc.is_empty() {
        s.push_str("{}");
        return;
    }
    s.push('{');
    for (i, (k, v)) in doc.iter().enumerate() {
        s.push_str(if i == 0 { " " } else { ", " });
        s.push_str(k);
        s.push_str(": ");
        render_into(v, s);
    }
    s.push_str(" }");
}

/// Whether a document nests documents/arrays deeper than `max` levels (the document itself is
/// level 1). Recursion stops at `max`, so this is safe on any input.
pub fn too_deep(doc: &Document, max: usize) -> bool {
    fn value(v: &Bson, level: usize, max: usize) -> bool {
        match v {
            Bson::Document(d) => doc_level(d, level + 1, max),
            Bson::Array(a) => level + 1 > max || a.iter().any(|v| value(v, level + 1, max)),
            _ => false,
        }
    }
    fn doc_level(d: &Document, level: usize, max: usize) -> bool {
        level > max || d.values().any(|v| value(v, level, max))
    }
    doc_level(doc, 1, max)
}

/// The serialized size of a document in bytes, computed without serializing it.
pub fn doc_size(doc: &Document) -> usize {
    4 + doc
        .iter()
        .map(|(k, v)| 1 + k.len() + 1 + value_size(v))
        .sum::<usize>()
        + 1
}

fn value_size(v: &Bson) -> usize {
    match v {
        Bson::Double(_) | Bson::Int64(_) | Bson::DateTime(_) | Bson::Timestamp(_) => 8,
        Bson::Int32(_) => 4,
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => 4 + s.len() + 1,
        Bson::Document(d) => doc_size(d),
        Bson::Array(a) => {
            4 + a
                .iter()
                .enumerate()
                .map(|(i, v)| 1 + decimal_len(i) + 1 + value_size(v))
                .sum::<usize>()
                + 1
        }
        Bson::Binary(b) => 4 + 1 + b.bytes.len() + if u8::from(b.subtype) == 2 { 4 } else { 0 },
        Bson::ObjectId(_) => 12,
        Bson::Boolean(_) => 1,
        Bson::Null | Bson::Undefined | Bson::MaxKey | Bson::MinKey => 0,
        Bson::RegularExpression(r) => r.pattern.len() + 1 + r.options.len() + 1,
        Bson::JavaScriptCodeWithScope(c) => 4 + 4 + c.code.len() + 1 + doc_size(&c.scope),
        Bson::Decimal128(_) => 16,
        Bson::DbPointer(_) => 12 + 5,
    }
}

fn decimal_len(mut i: usize) -> usize {
    let mut n = 1;
    while i >= 10 {
        i /= 10;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn numbers_share_keys() {
        assert_eq!(key_of(&Bson::Int32(1)), key_of(&Bson::Double(1.0)));
        assert_eq!(key_of(&Bson::Int64(1)), key_of(&Bson::Int32(1)));
        assert_ne!(key_of(&Bson::Int32(1)), key_of(&Bson::String("1".into())));
        assert_ne!(key_of(&Bson::Double(1.5)), key_of(&Bson::Int32(1)));
        let dec = |s: &str| Bson::Decimal128(s.parse().unwrap());
        assert_eq!(key_of(&dec("1.0")), key_of(&dec("1.00")));
        assert_eq!(key_of(&dec("1.00")), key_of(&Bson::Int32(1)));
        assert_eq!(key_of(&dec("0.50")), key_of(&Bson::Double(0.5)));
        assert_eq!(key_of(&dec("1.230")), key_of(&dec("1.23")));
        assert_ne!(key_of(&dec("0.1")), key_of(&Bson::Double(0.1)));
        assert_ne!(key_of(&dec("1E-6176")), key_of(&Bson::Int32(0)));
        assert_eq!(key_of(&dec("-0")), key_of(&Bson::Int32(0)));
    }

    #[test]
    fn size_matches_serialization() {
        let d = doc! {"a": 1, "b": "xyz", "c": [1, 2, {"d": 1.5}], "e": null, "f": bson::oid::ObjectId::new()};
        assert_eq!(doc_size(&d), bson::to_vec(&d).unwrap().len());
    }

    #[test]
    fn depth_limit() {
        let mut d = doc! {"x": 1};
        for _ in 0..10 {
            d = doc! {"a": d};
        }
        assert!(!too_deep(&d, 11));
        assert!(too_deep(&d, 10));
        assert!(too_deep(&doc! {"a": [[[1]]]}, 3));
        assert!(!too_deep(&doc! {"a": [[[1]]]}, 4));
    }

    #[test]
    fn renders_like_mongod() {
        assert_eq!(render_doc(&doc! {"_id": "x"}), "{ _id: \"x\" }");
        assert_eq!(render_doc(&doc! {"a": 1, "b": 2.0}), "{ a: 1, b: 2.0 }");
    }
}
