//! The limits MongoDB enforces on documents it stores and returns, checked without recursion.
//!
//! - A command may nest documents and arrays up to `maxBSONDepth` (200) levels; deeper messages
//!   are answered with `Overflow` (15), and the connection stays open.
//! - A stored document may nest up to 180 levels (`maxBSONDepth` minus 20 levels MongoDB keeps
//!   for itself); empty documents and arrays do not count as a level. Deeper inserts and updates
//!   fail with `Overflow` (15).
//! - Field names never contain a NUL byte (BSON cannot encode one): a document that would carry
//!   one is refused with code 31032 ("Key field cannot contain an embedded null byte") before it
//!   is stored or returned. (`$setField`/`$unsetField`/`$getField` refuse a NUL in `field` up
//!   front, with MongoDB's 9534700, and field paths with one with 16411.)
//! - An `_id` that is a document may not hold `$`-prefixed fields (`DollarPrefixedFieldName`,
//!   52); elsewhere `$`-prefixed names may be stored (MongoDB 5.0 and later).
//! - A document returned by a query, an aggregation or a change stream is at most 16 MiB plus
//!   16 KiB (`BSONObjMaxInternalSize`); larger ones fail with `BSONObjectTooLarge` (10334).
//!
//! These checks run before a document is stored, and before a result is put in a reply, so
//! that no reply the server builds can fail to encode: a client never sees a dropped connection
//! in place of an error, and a change stream never advances past an event it could not send.

use bson::{Bson, Document};

use crate::error::{CommandError, CommandResult};
use crate::keys::doc_size;
use crate::wire::MAX_INTERNAL_BSON_SIZE;

/// `maxBSONDepth`: the deepest nesting MongoDB accepts in a command or returns in a result.
pub const MAX_BSON_DEPTH: usize = 200;
/// The deepest nesting of a stored document (`maxBSONDepth` - 20).
pub const MAX_USER_STORAGE_DEPTH: usize = MAX_BSON_DEPTH - 20;

/// What one walk over a document found.
#[derive(Debug, Default, PartialEq)]
pub struct Shape {
    /// Nesting depth: the document itself is level 1; empty documents and arrays add no level.
    /// The walk stops counting once `limit` is passed, so this is at most `limit + 1`.
    pub depth: usize,
    /// The first field name found that contains a NUL byte.
    pub nul_name: Option<String>,
    /// Whether a regular expression's pattern or options contain a NUL byte.
    pub nul_regex: bool,
}

enum Frame<'a> {
    Doc(bson::document::Iter<'a>),
    Arr(std::slice::Iter<'a, Bson>),
}

/// Walks `doc` iteratively; nesting deeper than `limit` is not descended into.
pub fn shape(doc: &Document, limit: usize) -> Shape {
    let mut out = Shape {
        depth: 1,
        ..Shape::default()
    };
    let mut stack = vec![Frame::Doc(doc.iter())];
    while let Some(top) = stack.last_mut() {
        let value = match top {
            Frame::Doc(it) => match it.next() {
                Some((k, v)) => {
                    if out.nul_name.is_none() && k.as_bytes().contains(&0) {
                        out.nul_name = Some(k.clone());
                    }
                    v
                }
                None => {
                    stack.pop();
                    continue;
                }
            },
            Frame::Arr(it) => match it.next() {
                Some(v) => v,
                None => {
                    stack.pop();
                    continue;
                }
            },
        };
        let child = match value {
            Bson::Document(d) if !d.is_empty() => Frame::Doc(d.iter()),
            Bson::Array(a) if !a.is_empty() => Frame::Arr(a.iter()),
            Bson::JavaScriptCodeWithScope(c) if !c.scope.is_empty() => Frame::Doc(c.scope.iter()),
            Bson::RegularExpression(r) => {
                if r.pattern.as_bytes().contains(&0) || r.options.as_bytes().contains(&0) {
                    out.nul_regex = true;
                }
                continue;
            }
            _ => continue,
        };
        let depth = stack.len() + 1;
        out.depth = out.depth.max(depth);
        if depth <= limit {
            stack.push(child);
        }
    }
    out
}

fn nul_name_error(name: &str) -> CommandError {
    CommandError::new(
        31032,
        "Location31032",
        format!(
            "Key field cannot contain an embedded null byte: '{}'",
            name.replace('\0', "\\0")
        ),
    )
}

fn nul_regex_error() -> CommandError {
    CommandError::bad_value("Regular expression cannot contain an embedded null byte")
}

/// Why a document may not be stored by an insert (`inserting`) or an update, if it may not.
pub fn check_storage(doc: &Document, inserting: bool) -> CommandResult<()> {
    let s = shape(doc, MAX_USER_STORAGE_DEPTH);
    if let Some(name) = &s.nul_name {
        return Err(nul_name_error(name));
    }
    if s.nul_regex {
        return Err(nul_regex_error());
    }
    if let Some(Bson::Document(id)) = doc.get("_id") {
        if let Some(name) = id.keys().find(|k| k.starts_with('$')) {
            return Err(CommandError::new(
                52,
                "DollarPrefixedFieldName",
                format!("_id fields may not contain '$'-prefixed fields: {name} is not valid for storage."),
            ));
        }
    }
    if s.depth > MAX_USER_STORAGE_DEPTH {
        let message = if inserting {
            format!("cannot insert document because it exceeds {MAX_USER_STORAGE_DEPTH} levels of nesting")
        } else {
            format!("Resulting document after update exceeds the maximum nesting depth of {MAX_USER_STORAGE_DEPTH}")
        };
        return Err(CommandError::new(15, "Overflow", message));
    }
    Ok(())
}

/// The encoded size of a document a command returns (a query result, an aggregation result, a
/// change event), or the error MongoDB answers when it cannot be returned.
pub fn check_result(doc: &Document) -> CommandResult<usize> {
    let s = shape(doc, MAX_BSON_DEPTH);
    if let Some(name) = &s.nul_name {
        return Err(nul_name_error(name));
    }
    if s.nul_regex {
        return Err(nul_regex_error());
    }
    if s.depth > MAX_BSON_DEPTH {
        return Err(CommandError::new(
            15,
            "Overflow",
            format!("cannot convert document to BSON because it exceeds the limit of {MAX_BSON_DEPTH} levels of nesting"),
        ));
    }
    let size = doc_size(doc);
    if size > MAX_INTERNAL_BSON_SIZE {
        return Err(too_large(size));
    }
    Ok(size)
}

/// `BSONObjectTooLarge` (10334) for a document of `size` bytes.
pub fn too_large(size: usize) -> CommandError {
    CommandError::new(
        10334,
        "BSONObjectTooLarge",
        format!(
            "BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and {MAX_INTERNAL_BSON_SIZE}(16MB)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn nested(levels: usize) -> Document {
        let mut d = doc! {"x": 1};
        for _ in 1..levels {
            d = doc! {"x": d};
        }
        d
    }

    #[test]
    fn depth_counts_levels_but_not_empty_containers() {
        assert_eq!(shape(&doc! {}, 10).depth, 1);
        assert_eq!(shape(&doc! {"a": {}, "b": []}, 10).depth, 1);
        assert_eq!(shape(&doc! {"a": [[1]]}, 10).depth, 3);
        assert_eq!(shape(&nested(180), 500).depth, 180);
        // Counting stops one past the limit.
        assert_eq!(shape(&nested(1000), 200).depth, 201);
    }

    #[test]
    fn storage_limits() {
        assert!(check_storage(&nested(180), true).is_ok());
        let e = check_storage(&nested(181), true).unwrap_err();
        assert_eq!(e.code, 15);
        let e = check_storage(&doc! {"a": {"b\0": 1}}, false).unwrap_err();
        assert_eq!(e.code, 31032);
        let re = bson::Regex {
            pattern: "a\0".into(),
            options: String::new(),
        };
        assert_eq!(check_storage(&doc! {"r": re}, true).unwrap_err().code, 2);
    }

    #[test]
    fn result_limits() {
        assert!(check_result(&nested(200)).is_ok());
        assert_eq!(check_result(&nested(201)).unwrap_err().code, 15);
        let big = doc! {"s": "x".repeat(MAX_INTERNAL_BSON_SIZE)};
        assert_eq!(check_result(&big).unwrap_err().code, 10334);
    }
}
