//! Argument parsing shared by the commands: field lists, typed getters, generic fields
//! (`readConcern`, `writeConcern`, sessions).

use bson::{doc, Bson, Document};

use super::Ctx;
use crate::engine::compare::type_name;
use crate::error::{CommandError, CommandResult};

/// Fields every command accepts (drivers add them).
pub const GENERIC_FIELDS: &[&str] = &[
    "$db",
    "lsid",
    "txnNumber",
    "$clusterTime",
    "$readPreference",
    "readConcern",
    "writeConcern",
    "maxTimeMS",
    "comment",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
    "autocommit",
    "startTransaction",
    "stmtId",
    "stmtIds",
    "$audit",
    "$client",
    "$configServerState",
    "$queryOptions",
    "mayBypassWriteBlocking",
    "$traceCtx",
    "clientOperationKey",
];

/// Fails naming the first field of `cmd` that is neither generic nor in `allowed`.
pub fn check_fields(cmd: &Document, command: &str, allowed: &[&str]) -> CommandResult<()> {
    for (i, key) in cmd.keys().enumerate() {
        if i == 0 || GENERIC_FIELDS.contains(&key.as_str()) || allowed.contains(&key.as_str()) {
            continue;
        }
        return Err(unknown_field(command, key));
    }
    Ok(())
}

/// mongod's error for an unknown field.
pub fn unknown_field(command: &str, field: &str) -> CommandError {
    CommandError::new(
        40415,
        "Location40415",
        format!("BSON field '{command}.{field}' is an unknown field."),
    )
}

/// An integer value of any numeric type (doubles must be integral).
pub fn as_i64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.fract() == 0.0 && f.is_finite() => Some(*f as i64),
        Bson::Decimal128(d) => d.to_string().parse().ok(),
        _ => None,
    }
}

fn wrong_type(command: &str, field: &str, v: &Bson, expected: &str) -> CommandError {
    CommandError::type_mismatch(format!(
        "BSON field '{command}.{field}' is the wrong type '{}', expected type '{expected}'",
        type_name(v)
    ))
}

/// mongod's `safeNumberLong`: any number as an i64, doubles truncated toward zero, decimals
/// rounded half to even, NaN as 0 and out-of-range values clamped.
pub fn safe_i64(v: &Bson) -> Option<i64> {
    fn clamp(f: f64) -> i64 {
        if f.is_nan() {
            0
        } else {
            // `as` saturates at the i64 range.
            f as i64
        }
    }
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) => Some(clamp(f.trunc())),
        Bson::Decimal128(d) => {
            let d = crate::engine::decimal::from_bson(d);
            Some(match crate::engine::decimal::to_i64_exact(d) {
                Some(i) => i,
                None => clamp(crate::engine::decimal::to_f64(d).round_ties_even()),
            })
        }
        _ => None,
    }
}

/// An optional integer field of IDL type `safeInt64`: any number (see [`safe_i64`]); null is
/// an omitted field; other types are a TypeMismatch.
pub fn get_i64(cmd: &Document, command: &str, field: &str) -> CommandResult<Option<i64>> {
    match cmd.get(field) {
        // mongod treats null (and undefined) as an omitted optional field.
        None | Some(Bson::Null | Bson::Undefined) => Ok(None),
        Some(v) => safe_i64(v)
            .map(Some)
            .ok_or_else(|| wrong_types(command, field, v, "[long, int, decimal, double]")),
    }
}

/// An optional `safeInt64` field with mongod's `{gte: 0}` validator (51024 when negative).
pub fn get_non_negative(cmd: &Document, command: &str, field: &str) -> CommandResult<Option<i64>> {
    match get_i64(cmd, command, field)? {
        Some(v) if v < 0 => Err(CommandError::new(
            51024,
            "Location51024",
            format!("BSON field '{field}' value must be >= 0, actual value '{v}'"),
        )),
        other => Ok(other),
    }
}

fn wrong_types(command: &str, field: &str, v: &Bson, expected: &str) -> CommandError {
    CommandError::type_mismatch(format!(
        "BSON field '{command}.{field}' is the wrong type '{}', expected types '{expected}'",
        type_name(v)
    ))
}

/// An optional field of IDL type `safeBool`: booleans and numbers (non-zero is true); null is an
/// omitted field.
pub fn get_bool(cmd: &Document, command: &str, field: &str) -> CommandResult<Option<bool>> {
    match cmd.get(field) {
        None | Some(Bson::Null | Bson::Undefined) => Ok(None),
        Some(Bson::Boolean(b)) => Ok(Some(*b)),
        Some(Bson::Int32(i)) => Ok(Some(*i != 0)),
        Some(Bson::Int64(i)) => Ok(Some(*i != 0)),
        // NaN is true, as in mongod's trueValue.
        Some(Bson::Double(f)) => Ok(Some(*f != 0.0)),
        Some(Bson::Decimal128(d)) => Ok(Some(!crate::engine::decimal::from_bson(d).is_zero())),
        Some(v) => Err(wrong_types(
            command,
            field,
            v,
            "[bool, long, int, decimal, double]",
        )),
    }
}

/// An optional field of IDL type `bool`: only a boolean; null is an omitted field.
pub fn get_strict_bool(cmd: &Document, command: &str, field: &str) -> CommandResult<Option<bool>> {
    match cmd.get(field) {
        None | Some(Bson::Null | Bson::Undefined) => Ok(None),
        Some(Bson::Boolean(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong_type(command, field, v, "bool")),
    }
}

/// An optional field of IDL type `optionalBool`: only a boolean, not even null.
pub fn get_optional_bool(cmd: &Document, field: &str) -> CommandResult<Option<bool>> {
    match cmd.get(field) {
        None => Ok(None),
        Some(Bson::Boolean(b)) => Ok(Some(*b)),
        Some(v) => Err(CommandError::type_mismatch(format!(
            "Field '{field}' should be a boolean value, but found: {}",
            type_name(v)
        ))),
    }
}

/// An optional array of documents (`arrayFilters`): null is an omitted field.
pub fn check_doc_array(cmd: &Document, command: &str, field: &str) -> CommandResult<()> {
    match cmd.get(field) {
        None | Some(Bson::Null | Bson::Undefined) => Ok(()),
        Some(Bson::Array(a)) => {
            for v in a {
                if !matches!(v, Bson::Document(_)) {
                    return Err(wrong_type(command, field, v, "object"));
                }
            }
            Ok(())
        }
        Some(v) => Err(wrong_type(command, field, v, "array")),
    }
}

/// mongod's checks of the generic `maxTimeMS` (`parseMaxTimeMS`): a number, integral when a
/// double, in `[0, 2^31)`; `aggregate` parses it as a non-negative `safeInt64` first, `getMore`
/// as a `safeInt64`.
pub fn check_max_time_ms(name: &str, cmd: &Document) -> CommandResult<()> {
    let Some(v) = cmd.get("maxTimeMS") else {
        return Ok(());
    };
    match name {
        "aggregate" => {
            get_non_negative(cmd, name, "maxTimeMS")?;
        }
        "getMore" => {
            get_i64(cmd, name, "maxTimeMS")?;
        }
        _ => {}
    }
    let Some(ms) = safe_i64(v) else {
        return Err(CommandError::bad_value("maxTimeMS must be a number"));
    };
    if !(0..=i64::from(i32::MAX)).contains(&ms) {
        return Err(CommandError::bad_value(format!(
            "{ms} value for maxTimeMS is out of range [0, 2147483647]"
        )));
    }
    if let Bson::Double(f) = v {
        if f.fract() != 0.0 {
            return Err(CommandError::bad_value("maxTimeMS has non-integral value"));
        }
    }
    Ok(())
}

/// `hint` is an index name or a key pattern (mongod: FailedToParse otherwise).
pub fn check_hint_type(cmd: &Document) -> CommandResult<()> {
    match cmd.get("hint") {
        None | Some(Bson::String(_) | Bson::Document(_)) => Ok(()),
        Some(_) => Err(CommandError::failed_to_parse(
            "Hint must be a string or an object",
        )),
    }
}

/// An optional document field.
pub fn get_doc<'a>(
    cmd: &'a Document,
    command: &str,
    field: &str,
) -> CommandResult<Option<&'a Document>> {
    match cmd.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(d)),
        Some(v) => Err(wrong_type(command, field, v, "object")),
    }
}

/// A required array of documents.
pub fn get_docs<'a>(
    cmd: &'a Document,
    command: &str,
    field: &str,
) -> CommandResult<Vec<&'a Document>> {
    match cmd.get(field) {
        None => Err(CommandError::new(
            40414,
            "Location40414",
            format!("BSON field '{command}.{field}' is missing but a required field"),
        )),
        Some(Bson::Array(a)) => a
            .iter()
            .map(|v| match v {
                Bson::Document(d) => Ok(d),
                other => Err(wrong_type(command, field, other, "object")),
            })
            .collect(),
        Some(v) => Err(wrong_type(command, field, v, "array")),
    }
}

/// The collection named by the command's first field.
pub fn coll_name<'a>(cmd: &'a Document, command: &str) -> CommandResult<&'a str> {
    match cmd.get(command) {
        Some(Bson::String(s)) if !s.is_empty() => Ok(s),
        Some(Bson::String(_)) => Err(CommandError::new(
            73,
            "InvalidNamespace",
            "Invalid namespace specified: collection name is empty",
        )),
        Some(v) => Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!("collection name has invalid type {}", type_name(v)),
        )),
        None => Err(CommandError::bad_value("missing collection name")),
    }
}

/// The error for transaction commands and fields.
pub fn no_transactions() -> CommandError {
    CommandError::new(
        20,
        "IllegalOperation",
        "Transactions are not supported by this server (mongo-testserver)",
    )
}

/// Commands that accept a `writeConcern`.
fn takes_write_concern(name: &str) -> bool {
    // mongod's aggregate accepts a writeConcern whether or not the pipeline writes (a read-only
    // pipeline does not wait for it).
    crate::failpoint::supports_write_concern(name)
        || matches!(
            name,
            "aggregate" | "setParameter" | "configureFailPoint" | "endSessions"
        )
}

/// Whether a command may read with `majority` although majority read concern is disabled:
/// MongoDB 4.4 then serves it "speculatively" only for change streams and for `find` with
/// `allowSpeculativeMajorityRead: true` (mongod's jstest
/// `replsets/speculative_majority_supported_commands.js`).
fn speculative_majority_allowed(name: &str, cmd: &Document) -> bool {
    match name {
        "aggregate" => cmd
            .get_array("pipeline")
            .ok()
            .and_then(|p| p.first())
            .and_then(Bson::as_document)
            .is_some_and(|stage| stage.contains_key("$changeStream")),
        "find" => cmd
            .get_bool("allowSpeculativeMajorityRead")
            .unwrap_or(false),
        _ => false,
    }
}

/// mongod 4.4's refusal of read concern `majority` with `enableMajorityReadConcern=false`: the
/// aggregation's message is `pipeline.cpp`'s; other commands get `read_concern_mongod.cpp`'s.
fn majority_read_concern_disabled(name: &str) -> CommandError {
    let message = if name == "aggregate" {
        "Only change stream aggregation queries support 'majority' read concern when enableMajorityReadConcern=false"
    } else {
        "Majority read concern requested, but server was not started with --enableMajorityReadConcern."
    };
    CommandError::new(148, "ReadConcernMajorityNotEnabled", message)
}

/// Validates the generic fields: transactions refused, `readConcern` and `writeConcern`
/// understood.
pub fn check_generic(ctx: &Ctx<'_>, name: &str, cmd: &Document) -> CommandResult<()> {
    if cmd.contains_key("startTransaction") || cmd.contains_key("autocommit") {
        return Err(no_transactions());
    }
    check_max_time_ms(name, cmd)?;
    if let Some(v) = cmd.get("txnNumber") {
        if as_i64(v).is_none() {
            return Err(wrong_type(name, "txnNumber", v, "long"));
        }
        if ctx.shared.config.standalone {
            return Err(CommandError::new(
                20,
                "IllegalOperation",
                "Transaction numbers are only allowed on a replica set member or mongos",
            ));
        }
        if !cmd.contains_key("lsid") {
            return Err(CommandError::new(
                50768,
                "Location50768",
                "txnNumber may only be provided for multi-document transactions and retryable write commands. It requires a session.",
            ));
        }
        if !matches!(
            name,
            "insert" | "update" | "delete" | "findAndModify" | "findandmodify"
        ) {
            return Err(CommandError::new(
                50768,
                "Location50768",
                format!("txnNumber may only be provided for multi-document transactions and retryable write commands. {name} is neither"),
            ));
        }
    }
    if let Some(v) = cmd.get("lsid") {
        if !matches!(v, Bson::Document(_)) {
            return Err(wrong_type(name, "lsid", v, "object"));
        }
    }
    if let Some(rc) = cmd.get("readConcern") {
        let Bson::Document(rc) = rc else {
            return Err(wrong_type(name, "readConcern", rc, "object"));
        };
        for (k, v) in rc {
            match k.as_str() {
                "level" => match v.as_str() {
                    Some("majority") if !ctx.shared.config.majority_read_concern => {
                        if !speculative_majority_allowed(name, cmd) {
                            return Err(majority_read_concern_disabled(name));
                        }
                    }
                    Some("local" | "majority" | "linearizable" | "available" | "snapshot") => {}
                    _ => {
                        return Err(CommandError::failed_to_parse(format!(
                            "readConcern.level must be either 'local', 'majority', 'linearizable', 'available', or 'snapshot'; found {v}"
                        )))
                    }
                },
                "afterClusterTime" | "afterOpTime" | "provenance" => {}
                other => {
                    return Err(CommandError::bad_value(format!(
                        "readConcern option '{other}' is not supported by this server"
                    )))
                }
            }
        }
    }
    if let Some(wc) = cmd.get("writeConcern") {
        if !takes_write_concern(name) {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                "Command does not support writeConcern",
            ));
        }
        let Bson::Document(wc) = wc else {
            return Err(wrong_type(name, "writeConcern", wc, "object"));
        };
        for (k, v) in wc {
            match k.as_str() {
                "w" => match v {
                    Bson::String(_) => {}
                    other => match as_i64(other) {
                        Some(n) if n >= 0 => {
                            if n > 1 && ctx.shared.config.standalone {
                                return Err(CommandError::bad_value(
                                    "cannot use 'w' > 1 on a standalone",
                                ));
                            }
                        }
                        _ => {
                            return Err(CommandError::failed_to_parse(format!(
                                "w has to be a number or a string; found: {other}"
                            )))
                        }
                    },
                },
                "j" | "fsync" | "wtimeout" | "wtimeoutMS" | "provenance" => {}
                other => {
                    return Err(CommandError::failed_to_parse(format!(
                        "unrecognized write concern field: {other}"
                    )))
                }
            }
        }
    }
    Ok(())
}

/// `reply` with the `writeConcernError` of [`write_concern_error`] added when there is one.
pub fn with_write_concern_error(ctx: &Ctx<'_>, cmd: &Document, mut reply: Document) -> Document {
    if let Some(wce) = write_concern_error(ctx, cmd) {
        reply.insert("writeConcernError", wce);
    }
    reply
}

/// The `writeConcernError` a single-node replica set answers for a `w` it cannot satisfy.
pub fn write_concern_error(ctx: &Ctx<'_>, cmd: &Document) -> Option<Document> {
    let wc = cmd.get_document("writeConcern").ok()?;
    match wc.get("w")? {
        Bson::String(s) if s == "majority" => None,
        Bson::String(s) => {
            if ctx.shared.config.standalone {
                None
            } else {
                Some(doc! {
                    "code": 79,
                    "codeName": "UnknownReplWriteConcern",
                    "errmsg": format!("No write concern mode named '{s}' found in replica set configuration"),
                })
            }
        }
        v => match as_i64(v) {
            Some(n) if n > 1 => Some(doc! {
                "code": 100,
                "codeName": "UnsatisfiableWriteConcern",
                "errmsg": "Not enough data-bearing nodes",
            }),
            _ => None,
        },
    }
}

/// Refuses a collation other than the simple one.
pub fn check_collation(cmd: &Document) -> CommandResult<()> {
    match cmd.get("collation") {
        None => Ok(()),
        Some(Bson::Document(c)) if c.get_str("locale").ok() == Some("simple") => Ok(()),
        Some(_) => Err(CommandError::bad_value(
            "collation is not supported by this server (only {locale: \"simple\"})",
        )),
    }
}
