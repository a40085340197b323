//! The matching rules of the unified test format ("Evaluating Matches").
//!
//! `match_value` implements the spec's `match(expected, actual)` algorithm: documents may
//! carry extra fields only at the root level, arrays must have the same length, numbers compare
//! flexibly (int, long and double are equal when numerically equal), and the special `$$`
//! operators (`$$exists`, `$$type`, `$$unsetOrMatches`, `$$matchesEntity`, `$$matchesHexBytes`,
//! `$$sessionLsid`, `$$lte`, `$$matchAsDocument`, `$$matchAsRoot`) are honoured.
//!
//! `exact_match` implements the comparison used for `outcome`: the documents must be identical
//! (types included), only the order of keys may differ.

use mongodb::bson::{Bson, Document};

/// Values the matcher may need from the test's entity map.
pub trait EntityLookup {
    /// A BSON entity saved with `saveResultAsEntity`.
    fn bson_entity(&self, name: &str) -> Option<Bson>;
    /// The logical session id of a session entity.
    fn session_lsid(&self, name: &str) -> Option<Document>;
}

/// A lookup with no entities (for contexts that cannot reference any).
pub struct NoEntities;

impl EntityLookup for NoEntities {
    fn bson_entity(&self, _: &str) -> Option<Bson> {
        None
    }
    fn session_lsid(&self, _: &str) -> Option<Document> {
        None
    }
}

/// The `$type` alias of a BSON value, as the `$$type` operator names it.
pub fn type_name(value: &Bson) -> &'static str {
    match value {
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

fn type_matches(alias: &str, value: &Bson) -> bool {
    let actual = type_name(value);
    actual == alias
        || (alias == "number" && matches!(actual, "double" | "int" | "long" | "decimal"))
}

/// A short rendering of a value for failure messages (relaxed extended JSON plus the type).
pub fn show(value: &Bson) -> String {
    let json = value.clone().into_relaxed_extjson().to_string();
    let json = if json.len() > 400 {
        format!(
            "{}…",
            &json[..json.char_indices().nth(400).map_or(json.len(), |c| c.0)]
        )
    } else {
        json
    };
    match value {
        Bson::Document(_) | Bson::Array(_) | Bson::String(_) => json,
        other => format!("{json} ({})", type_name(other)),
    }
}

fn show_opt(value: Option<&Bson>) -> String {
    value.map_or_else(|| "<absent>".to_string(), show)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn as_f64(value: &Bson) -> Option<f64> {
    match value {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(d) => Some(*d),
        _ => None,
    }
}

fn as_i64(value: &Bson) -> Option<i64> {
    match value {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        _ => None,
    }
}

/// Flexible numeric equality: int, long and double are equal when numerically equal.
fn numbers_equal(a: &Bson, b: &Bson) -> Option<bool> {
    if let (Some(x), Some(y)) = (as_i64(a), as_i64(b)) {
        return Some(x == y);
    }
    match (as_f64(a), as_f64(b)) {
        (Some(x), Some(y)) => Some(x == y),
        _ => None,
    }
}

/// When `value` is a document whose first and only key starts with `$$`, that operator.
fn special_operator(value: &Bson) -> Option<(&str, &Bson)> {
    match value {
        Bson::Document(d) if d.len() == 1 => {
            let (k, v) = d.iter().next()?;
            k.starts_with("$$").then_some((k.as_str(), v))
        }
        _ => None,
    }
}

/// Matches `expected` against `actual` (`None` = the field does not exist). `root` says whether
/// a document here is a root-level document (extra fields allowed). `path` names the position
/// for failure messages.
pub fn match_value(
    expected: &Bson,
    actual: Option<&Bson>,
    root: bool,
    path: &str,
    ctx: &dyn EntityLookup,
) -> Result<(), String> {
    if let Some((op, arg)) = special_operator(expected) {
        return match_operator(op, arg, actual, root, path, ctx);
    }
    let Some(actual) = actual else {
        return Err(format!(
            "{}: expected {}, but the field is absent",
            display_path(path),
            show(expected)
        ));
    };
    match expected {
        Bson::Document(exp) => {
            let Bson::Document(act) = actual else {
                return Err(format!(
                    "{}: expected a document {}, got {}",
                    display_path(path),
                    show(expected),
                    show(actual)
                ));
            };
            for (key, value) in exp {
                match_value(value, act.get(key), false, &join(path, key), ctx)?;
            }
            if !root {
                let extra: Vec<&str> = act
                    .keys()
                    .filter(|k| !exp.contains_key(k.as_str()))
                    .map(String::as_str)
                    .collect();
                if !extra.is_empty() {
                    return Err(format!(
                        "{}: unexpected extra field(s) {:?} in nested document {} (expected {})",
                        display_path(path),
                        extra,
                        show(actual),
                        show(expected)
                    ));
                }
            }
            Ok(())
        }
        Bson::Array(exp) => {
            let Bson::Array(act) = actual else {
                return Err(format!(
                    "{}: expected an array {}, got {}",
                    display_path(path),
                    show(expected),
                    show(actual)
                ));
            };
            if exp.len() != act.len() {
                return Err(format!(
                    "{}: expected an array of {} element(s) {}, got {} element(s) {}",
                    display_path(path),
                    exp.len(),
                    show(expected),
                    act.len(),
                    show(actual)
                ));
            }
            for (i, (e, a)) in exp.iter().zip(act).enumerate() {
                match_value(e, Some(a), false, &join(path, &i.to_string()), ctx)?;
            }
            Ok(())
        }
        _ => {
            let equal = match numbers_equal(expected, actual) {
                Some(eq) => eq,
                None => exact_match(expected, actual),
            };
            if equal {
                Ok(())
            } else {
                Err(format!(
                    "{}: expected {}, got {}",
                    display_path(path),
                    show(expected),
                    show(actual)
                ))
            }
        }
    }
}

/// Matches every element of an iterated result (find, aggregate, ...) as a root-level document,
/// after checking that the counts agree.
pub fn match_root_array(
    expected: &Bson,
    actual: &[Bson],
    ctx: &dyn EntityLookup,
) -> Result<(), String> {
    let Bson::Array(exp) = expected else {
        // A special operator (e.g. $$type) or a mistaken scalar: match the array as a value.
        return match_value(
            expected,
            Some(&Bson::Array(actual.to_vec())),
            false,
            "",
            ctx,
        );
    };
    if exp.len() != actual.len() {
        return Err(format!(
            "result: expected {} document(s) {}, got {} document(s) {}",
            exp.len(),
            show(expected),
            actual.len(),
            show(&Bson::Array(actual.to_vec()))
        ));
    }
    for (i, (e, a)) in exp.iter().zip(actual).enumerate() {
        match_value(e, Some(a), true, &format!("result.{i}"), ctx)?;
    }
    Ok(())
}

fn display_path(path: &str) -> &str {
    if path.is_empty() {
        "result"
    } else {
        path
    }
}

fn match_operator(
    op: &str,
    arg: &Bson,
    actual: Option<&Bson>,
    root: bool,
    path: &str,
    ctx: &dyn EntityLookup,
) -> Result<(), String> {
    let here = display_path(path);
    match op {
        "$$exists" => {
            let Bson::Boolean(want) = arg else {
                return Err(format!(
                    "{here}: $$exists needs a boolean, got {}",
                    show(arg)
                ));
            };
            match (want, actual) {
                (true, Some(_)) | (false, None) => Ok(()),
                (true, None) => Err(format!("{here}: expected the field to exist, it is absent")),
                (false, Some(a)) => Err(format!(
                    "{here}: expected the field to be absent, got {}",
                    show(a)
                )),
            }
        }
        "$$type" => {
            let aliases: Vec<&str> = match arg {
                Bson::String(s) => vec![s.as_str()],
                Bson::Array(a) => a.iter().filter_map(Bson::as_str).collect(),
                _ => return Err(format!("{here}: bad $$type argument {}", show(arg))),
            };
            match actual {
                Some(a) if aliases.iter().any(|t| type_matches(t, a)) => Ok(()),
                Some(a) => Err(format!(
                    "{here}: expected a value of type {:?}, got {}",
                    aliases,
                    show(a)
                )),
                None => Err(format!(
                    "{here}: expected a value of type {aliases:?}, the field is absent"
                )),
            }
        }
        "$$unsetOrMatches" => match actual {
            None => Ok(()),
            Some(a) => match_value(arg, Some(a), root, path, ctx),
        },
        "$$matchesEntity" => {
            let name = arg
                .as_str()
                .ok_or_else(|| format!("{here}: $$matchesEntity needs an entity name"))?;
            let entity = ctx
                .bson_entity(name)
                .ok_or_else(|| format!("{here}: $$matchesEntity: no BSON entity {name:?}"))?;
            match_value(&entity, actual, root, path, ctx)
        }
        "$$matchesHexBytes" => {
            let hex = arg
                .as_str()
                .ok_or_else(|| format!("{here}: $$matchesHexBytes needs a string"))?;
            let want = decode_hex(hex)
                .ok_or_else(|| format!("{here}: malformed $$matchesHexBytes {hex:?}"))?;
            match actual {
                Some(Bson::Binary(b)) if b.bytes == want => Ok(()),
                Some(Bson::String(s)) if s.as_bytes() == want.as_slice() => Ok(()),
                other => Err(format!(
                    "{here}: expected bytes {hex}, got {}",
                    show_opt(other)
                )),
            }
        }
        "$$sessionLsid" => {
            let name = arg
                .as_str()
                .ok_or_else(|| format!("{here}: $$sessionLsid needs a session entity name"))?;
            let lsid = ctx
                .session_lsid(name)
                .ok_or_else(|| format!("{here}: $$sessionLsid: no session entity {name:?}"))?;
            match actual {
                Some(a) if exact_match(&Bson::Document(lsid.clone()), a) => Ok(()),
                other => Err(format!(
                    "{here}: expected the lsid of {name} {}, got {}",
                    show(&Bson::Document(lsid)),
                    show_opt(other)
                )),
            }
        }
        "$$lte" => {
            let limit = as_f64(arg).ok_or_else(|| format!("{here}: $$lte needs a number"))?;
            match actual.and_then(as_f64) {
                Some(v) if v <= limit => Ok(()),
                _ => Err(format!(
                    "{here}: expected a number <= {}, got {}",
                    show(arg),
                    show_opt(actual)
                )),
            }
        }
        "$$matchAsDocument" => {
            let Some(Bson::String(s)) = actual else {
                return Err(format!(
                    "{here}: $$matchAsDocument needs an extended JSON string, got {}",
                    show_opt(actual)
                ));
            };
            let parsed: serde_json::Value =
                serde_json::from_str(s).map_err(|e| format!("{here}: not JSON ({e}): {s}"))?;
            let parsed = Bson::try_from(parsed)
                .map_err(|e| format!("{here}: not extended JSON ({e}): {s}"))?;
            match_value(arg, Some(&parsed), false, path, ctx)
        }
        "$$matchAsRoot" => match_value(arg, actual, true, path, ctx),
        other => Err(format!("{here}: unknown special operator {other}")),
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Exact equality, types included; only the order of document keys may differ.
pub fn exact_match(expected: &Bson, actual: &Bson) -> bool {
    match (expected, actual) {
        (Bson::Document(e), Bson::Document(a)) => exact_doc(e, a),
        (Bson::Array(e), Bson::Array(a)) => {
            e.len() == a.len() && e.iter().zip(a).all(|(x, y)| exact_match(x, y))
        }
        (Bson::Double(x), Bson::Double(y)) => x == y || (x.is_nan() && y.is_nan()),
        (Bson::JavaScriptCodeWithScope(x), Bson::JavaScriptCodeWithScope(y)) => {
            x.code == y.code && exact_doc(&x.scope, &y.scope)
        }
        _ => expected == actual,
    }
}

fn exact_doc(e: &Document, a: &Document) -> bool {
    e.len() == a.len()
        && e.iter()
            .all(|(k, v)| a.get(k).is_some_and(|av| exact_match(v, av)))
}

/// True when two documents that `exact_match` also have their keys in the same order at every
/// level (used only to report key-order differences as notes, never as failures).
pub fn same_key_order(expected: &Bson, actual: &Bson) -> bool {
    match (expected, actual) {
        (Bson::Document(e), Bson::Document(a)) => {
            e.keys().eq(a.keys())
                && e.iter()
                    .all(|(k, v)| a.get(k).is_some_and(|av| same_key_order(v, av)))
        }
        (Bson::Array(e), Bson::Array(a)) => e.iter().zip(a).all(|(x, y)| same_key_order(x, y)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{bson, doc};

    fn m(expected: Bson, actual: Bson, root: bool) -> Result<(), String> {
        match_value(&expected, Some(&actual), root, "", &NoEntities)
    }

    #[test]
    fn matching_rules() {
        // Extra fields: allowed at the root only.
        assert!(m(bson!({"x": 1}), bson!({"x": 1, "y": 1}), true).is_ok());
        assert!(m(bson!({"x": 1, "y": 1}), bson!({"x": 1}), true).is_err());
        assert!(m(bson!({"x": {"y": 1}}), bson!({"x": {"y": 1, "z": 1}}), true).is_err());
        // Key order does not matter.
        assert!(m(bson!({"x": 1, "y": 1}), bson!({"y": 1, "x": 1}), false).is_ok());
        // Flexible numerics.
        assert!(m(bson!(1), bson!(1.0), false).is_ok());
        assert!(m(bson!(1), bson!(1_i64), false).is_ok());
        assert!(m(bson!(1), bson!(1.5), false).is_err());
        assert!(m(bson!(1), bson!("1"), false).is_err());
        // Arrays: same length.
        assert!(m(bson!([1, 2, 3]), bson!([1, 2, 3, 4]), false).is_err());
        // Operators.
        assert!(m(bson!({"a": {"$$exists": false}}), bson!({}), true).is_ok());
        assert!(m(bson!({"a": {"$$exists": false}}), bson!({"a": null}), true).is_err());
        assert!(m(bson!({"a": {"$$exists": true}}), bson!({"a": null}), true).is_ok());
        assert!(m(bson!({"$$type": ["int", "long"]}), bson!(5_i64), false).is_ok());
        assert!(m(bson!({"$$type": "int"}), bson!(5.0), false).is_err());
        assert!(match_value(&bson!({"$$type": "int"}), None, false, "", &NoEntities).is_err());
        assert!(m(bson!({"a": {"$$unsetOrMatches": 2}}), bson!({}), true).is_ok());
        assert!(m(bson!({"a": {"$$unsetOrMatches": 2}}), bson!({"a": 3}), true).is_err());
        // $$unsetOrMatches does not make a nested document a root one.
        let nested = bson!({"r": {"$$unsetOrMatches": {"x": 1}}});
        assert!(m(nested.clone(), bson!({"r": {"x": 1, "y": 2}}), true).is_err());
        assert!(m(bson!({"$$lte": 5}), bson!(5.0), false).is_ok());
        assert!(m(bson!({"$$lte": 5}), bson!(6), false).is_err());
        // Outcome comparison is exact.
        assert!(exact_match(
            &bson!({"a": 1, "b": 2}),
            &bson!({"b": 2, "a": 1})
        ));
        assert!(!exact_match(&bson!({"a": 1}), &bson!({"a": 1.0})));
        assert!(!exact_match(&bson!({"a": 1}), &bson!({"a": 1, "b": 1})));
        assert!(!same_key_order(
            &bson!({"a": 1, "b": 2}),
            &bson!({"b": 2, "a": 1})
        ));
        let _ = doc! {};
    }
}
