//! Updates: operator documents (`{$set: ...}`), replacement documents and pipelines, validated
//! up front and applied atomically to one document; plus the seed document of an upsert.

use std::cmp::Ordering;

use bson::{Bson, Document, Timestamp};

use super::compare::{compare, type_name, values_equal};
use super::expr::Vars;
use super::matcher::{equality_fields, ElementCondition};
use super::num::{self, Num};
use super::path::array_index;
use super::pipeline;
use crate::error::{CommandError, CommandResult};

/// A parsed, validated update.
#[derive(Debug, Clone)]
pub enum Update {
    /// `{$set: {...}, $inc: {...}, ...}`
    Operators(OperatorUpdate),
    /// A replacement document (`{a: 1}`; `{}` replaces with an empty document).
    Replacement(Document),
    /// An aggregation pipeline (`[{$set: ...}, ...]`), parsed once.
    Pipeline(pipeline::Parsed),
}

/// The operators of an operator-style update, in application order.
#[derive(Debug, Clone)]
pub struct OperatorUpdate {
    ops: Vec<Op>,
    positional: positional::Positional,
}

/// What an update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateOutcome {
    /// False when the result equals the original document (a no-op: `nModified` 0).
    pub modified: bool,
}

#[derive(Debug, Clone)]
struct Op {
    path: String,
    parts: Vec<String>,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Set(Bson),
    SetOnInsert(Bson),
    Unset,
    Inc(Num, Bson),
    Mul(Num, Bson),
    Min(Bson),
    Max(Bson),
    Rename(Vec<String>, String),
    CurrentDate(bool),
    Push(PushSpec),
    AddToSet(Vec<Bson>),
    Pop(bool),
    Pull(ElementCondition),
    PullAll(Vec<Bson>),
}

#[derive(Debug, Clone)]
struct PushSpec {
    each: Vec<Bson>,
    position: Option<i64>,
    slice: Option<i64>,
    sort: Option<ElemSort>,
}

#[derive(Debug, Clone)]
enum ElemSort {
    Whole(bool),
    Fields(Document),
}

fn code(code: i32, name: &str, msg: impl Into<String>) -> CommandError {
    CommandError::new(code, name, msg)
}

fn conflicting(path: &str, at: &str) -> CommandError {
    code(
        40,
        "ConflictingUpdateOperators",
        format!("Updating the path '{path}' would create a conflict at '{at}'"),
    )
}

fn immutable_id() -> CommandError {
    code(
        66,
        "ImmutableField",
        "Performing an update on the path '_id' would modify the immutable field '_id'",
    )
}

fn path_not_viable(field: &str, parent: &str, value: &Bson) -> CommandError {
    code(
        28,
        "PathNotViable",
        format!("Cannot create field '{field}' in element {{{parent}: {value}}}"),
    )
}

fn id_desc(doc: &Document) -> String {
    match doc.get("_id") {
        Some(id) => format!("{{_id: {id}}}"),
        None => "{}".to_string(),
    }
}

/// Splits and validates an update path.
fn parse_update_path(path: &str) -> CommandResult<Vec<String>> {
    if path.is_empty() {
        return Err(code(
            56,
            "EmptyFieldName",
            "An empty update path is not valid.",
        ));
    }
    let parts: Vec<String> = path.split('.').map(str::to_string).collect();
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() {
            return Err(code(
                56,
                "EmptyFieldName",
                format!(
                    "The update path '{path}' contains an empty field name, which is not allowed."
                ),
            ));
        }
        if positional::is_positional(p) {
            positional::check_element(p, i, path)?;
            continue;
        }
        // Since MongoDB 5.0 only a top-level field may not start with '$' (it would be taken
        // for an operator); `a.$b` is a valid update path.
        if i == 0 && p.starts_with('$') {
            return Err(code(
                52,
                "DollarPrefixedFieldName",
                format!(
                    "The dollar ($) prefixed field '{p}' in '{path}' is not valid for storage."
                ),
            ));
        }
    }
    if parts.iter().filter(|p| p.as_str() == "$").count() > 1 {
        return Err(CommandError::bad_value(format!(
            "Too many positional (i.e. '$') elements found in path '{path}'"
        )));
    }
    Ok(parts)
}

/// An update path whose top-level field may start with '$': MongoDB stores such a field when
/// an upsert inserts (`{$set: {"$hotel": 1}}`), and refuses it when updating a stored document
/// (checked when applied).
fn parse_insertable_path(path: &str) -> CommandResult<Vec<String>> {
    let (first, rest) = path.split_once('.').unwrap_or((path, ""));
    if !first.starts_with('$') || first == "$" || first.starts_with("$[") {
        return parse_update_path(path);
    }
    let probe = if rest.is_empty() {
        "x".to_string()
    } else {
        format!("x.{rest}")
    };
    let mut parts = parse_update_path(&probe)?;
    parts[0] = first.to_string();
    Ok(parts)
}

fn int_of(v: &Bson) -> Option<i64> {
    Num::from_bson(v).and_then(Num::as_i64_exact)
}

fn parse_elem_sort(v: &Bson) -> CommandResult<ElemSort> {
    let bad = || {
        CommandError::bad_value(
            "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields",
        )
    };
    match v {
        Bson::Document(d) => {
            if d.is_empty() {
                return Err(CommandError::bad_value(
                    "The $sort pattern is empty when it should be a set of fields.",
                ));
            }
            for (k, dir) in d {
                if k.is_empty() || k.split('.').any(str::is_empty) || k.starts_with('$') {
                    return Err(bad());
                }
                match int_of(dir) {
                    Some(1) | Some(-1) => {}
                    _ => return Err(bad()),
                }
            }
            Ok(ElemSort::Fields(d.clone()))
        }
        other => match int_of(other) {
            Some(1) => Ok(ElemSort::Whole(true)),
            Some(-1) => Ok(ElemSort::Whole(false)),
            _ => Err(bad()),
        },
    }
}

fn parse_push(v: &Bson) -> CommandResult<PushSpec> {
    let d = match v {
        Bson::Document(d) if d.contains_key("$each") => d,
        other => {
            return Ok(PushSpec {
                each: vec![other.clone()],
                position: None,
                slice: None,
                sort: None,
            })
        }
    };
    let mut spec = PushSpec {
        each: Vec::new(),
        position: None,
        slice: None,
        sort: None,
    };
    for (k, x) in d {
        match k.as_str() {
            "$each" => match x {
                Bson::Array(a) => spec.each = a.clone(),
                other => {
                    return Err(CommandError::bad_value(format!(
                        "The argument to $each in $push must be an array but it was of type: {}",
                        type_name(other)
                    )))
                }
            },
            "$slice" => {
                spec.slice = Some(int_of(x).ok_or_else(|| {
                    CommandError::bad_value(format!(
                        "The value for $slice must be an integer value but was given type: {}",
                        type_name(x)
                    ))
                })?)
            }
            "$position" => {
                spec.position = Some(int_of(x).ok_or_else(|| {
                    CommandError::bad_value(format!(
                        "The value for $position must be an integer value, not of type: {}",
                        type_name(x)
                    ))
                })?)
            }
            "$sort" => spec.sort = Some(parse_elem_sort(x)?),
            other => {
                return Err(CommandError::bad_value(format!(
                    "Unrecognized clause in $push: {other}"
                )))
            }
        }
    }
    Ok(spec)
}

fn parse_operators(update: &Document) -> CommandResult<OperatorUpdate> {
    let mut ops: Vec<Op> = Vec::new();
    let mut all_paths: Vec<String> = Vec::new();
    for (opname, arg) in update {
        let known = matches!(
            opname.as_str(),
            "$set"
                | "$unset"
                | "$inc"
                | "$mul"
                | "$min"
                | "$max"
                | "$rename"
                | "$setOnInsert"
                | "$currentDate"
                | "$push"
                | "$addToSet"
                | "$pop"
                | "$pull"
                | "$pullAll"
        );
        if !known {
            if opname == "$bit" || opname == "$pushAll" {
                return Err(CommandError::bad_value(format!(
                    "the update operator {opname} is not supported by mongo-testserver"
                )));
            }
            return Err(CommandError::failed_to_parse(format!(
                "Unknown modifier: {opname}. Expected a valid update modifier or pipeline-style update specified as an array"
            )));
        }
        let fields = arg.as_document().ok_or_else(|| {
            CommandError::failed_to_parse(format!(
                "Modifiers operate on fields but we found type {} instead. For example: {{$mod: {{<field>: ...}}}} not {{{opname}: {arg}}}",
                type_name(arg)
            ))
        })?;
        for (path, v) in fields {
            let parts = if matches!(opname.as_str(), "$set" | "$setOnInsert") {
                parse_insertable_path(path)?
            } else {
                parse_update_path(path)?
            };
            let kind = match opname.as_str() {
                "$set" => Kind::Set(v.clone()),
                "$setOnInsert" => Kind::SetOnInsert(v.clone()),
                "$unset" => Kind::Unset,
                "$inc" | "$mul" => {
                    let n = Num::from_bson(v).ok_or_else(|| {
                        CommandError::type_mismatch(format!(
                            "Cannot {} with non-numeric argument: {{{path}: {v}}}",
                            if opname == "$inc" {
                                "increment"
                            } else {
                                "multiply"
                            }
                        ))
                    })?;
                    if opname == "$inc" {
                        Kind::Inc(n, v.clone())
                    } else {
                        Kind::Mul(n, v.clone())
                    }
                }
                "$min" => Kind::Min(v.clone()),
                "$max" => Kind::Max(v.clone()),
                "$rename" => {
                    let to = match v {
                        Bson::String(s) => s.clone(),
                        other => {
                            return Err(CommandError::bad_value(format!(
                                "The 'to' field for $rename must be a string: {path}: {other}"
                            )))
                        }
                    };
                    if to.contains('\0') {
                        return Err(CommandError::bad_value(
                            "The 'to' field for $rename cannot contain an embedded null byte",
                        ));
                    }
                    if to == *path {
                        return Err(CommandError::bad_value(format!(
                            "The source and target field for $rename must differ: {path}: \"{to}\""
                        )));
                    }
                    if to.starts_with(&format!("{path}.")) || path.starts_with(&format!("{to}.")) {
                        return Err(CommandError::bad_value(format!(
                            "The source and target field for $rename must not be on the same path: {path}: \"{to}\""
                        )));
                    }
                    let to_parts = parse_update_path(&to)?;
                    if parts.iter().any(|p| positional::is_positional(p)) {
                        return Err(CommandError::bad_value(format!(
                            "The source field for $rename may not be dynamic: {path}"
                        )));
                    }
                    if to_parts.iter().any(|p| positional::is_positional(p)) {
                        return Err(CommandError::bad_value(format!(
                            "The destination field for $rename may not be dynamic: {to}"
                        )));
                    }
                    all_paths.push(to.clone());
                    Kind::Rename(to_parts, to)
                }
                "$currentDate" => {
                    let ts = match v {
                        Bson::Boolean(_) => false,
                        Bson::Document(d) => match (d.len(), d.get("$type")) {
                            (1, Some(Bson::String(t))) if t == "date" => false,
                            (1, Some(Bson::String(t))) if t == "timestamp" => true,
                            _ => {
                                return Err(CommandError::bad_value(format!(
                                    "The '$type' string field is required to be 'date' or 'timestamp': {{$currentDate: {{field : {{$type: 'date'}}}}}}, found: {v}"
                                )))
                            }
                        },
                        other => {
                            return Err(CommandError::bad_value(format!(
                                "{} is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({{$type: 'timestamp/date'}}).",
                                type_name(other)
                            )))
                        }
                    };
                    Kind::CurrentDate(ts)
                }
                "$push" => Kind::Push(parse_push(v)?),
                "$addToSet" => {
                    let items = match v {
                        Bson::Document(d) if d.contains_key("$each") => {
                            if d.len() != 1 {
                                return Err(CommandError::bad_value(format!(
                                    "Found unexpected fields after $each in $addToSet: {d}"
                                )));
                            }
                            match d.get("$each") {
                                Some(Bson::Array(a)) => a.clone(),
                                Some(other) => {
                                    return Err(CommandError::bad_value(format!(
                                        "The argument to $each in $addToSet must be an array but it was of type {}",
                                        type_name(other)
                                    )))
                                }
                                None => Vec::new(),
                            }
                        }
                        other => vec![other.clone()],
                    };
                    Kind::AddToSet(items)
                }
                "$pop" => {
                    let n = Num::from_bson(v).ok_or_else(|| {
                        CommandError::failed_to_parse(format!("Expected a number in: {path}: {v}"))
                    })?;
                    match n.as_i64_exact() {
                        Some(1) => Kind::Pop(false),
                        Some(-1) => Kind::Pop(true),
                        _ => {
                            return Err(CommandError::failed_to_parse(format!(
                                "$pop expects 1 or -1, found: {v}"
                            )))
                        }
                    }
                }
                "$pull" => Kind::Pull(ElementCondition::parse(v)?),
                _ => match v {
                    Bson::Array(a) => Kind::PullAll(a.clone()),
                    other => {
                        return Err(CommandError::bad_value(format!(
                            "$pullAll requires an array argument but was given a {}",
                            type_name(other)
                        )))
                    }
                },
            };
            all_paths.push(path.clone());
            ops.push(Op {
                path: path.clone(),
                parts,
                kind,
            });
        }
    }
    check_conflicts(&all_paths)?;
    ops.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(OperatorUpdate {
        ops,
        positional: positional::Positional::default(),
    })
}

fn check_conflicts(paths: &[String]) -> CommandResult<()> {
    for (i, a) in paths.iter().enumerate() {
        for b in &paths[i + 1..] {
            if a == b {
                return Err(conflicting(b, a));
            }
            if b.starts_with(&format!("{a}.")) {
                return Err(conflicting(b, a));
            }
            if a.starts_with(&format!("{b}.")) {
                return Err(conflicting(b, a));
            }
        }
    }
    Ok(())
}

impl Update {
    /// Parses and validates an update: a document (operators or replacement) or an array
    /// (pipeline). Unknown operator: code 9 FailedToParse `Unknown modifier: $foo...`;
    /// conflicting paths: code 40 ConflictingUpdateOperators; unsupported pipeline stage:
    /// code 72 InvalidOptions; an empty pipeline is a no-op (as mongod).
    pub fn parse(update: &Bson) -> CommandResult<Update> {
        match update {
            // Operators are read in place; anything else is parsed from a copy.
            Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                Ok(Update::Operators(parse_operators(d)?))
            }
            other => Self::parse_owned(other.clone()),
        }
    }

    /// [`Update::parse`] of an update the caller gives up: a pipeline's expressions and a
    /// replacement document are moved into the result, not cloned. Same checks and errors.
    pub fn parse_owned(update: Bson) -> CommandResult<Update> {
        match update {
            Bson::Array(stages) => {
                let mut docs = Vec::with_capacity(stages.len());
                for s in stages {
                    match s {
                        Bson::Document(d) => docs.push(d),
                        other => {
                            return Err(CommandError::type_mismatch(format!(
                                "Each element of the 'pipeline' array must be an object, found {}",
                                type_name(&other)
                            )))
                        }
                    }
                }
                Ok(Update::Pipeline(pipeline::Parsed::parse_update_owned(
                    docs,
                )?))
            }
            Bson::Document(d) => {
                let first_is_op = d.keys().next().is_some_and(|k| k.starts_with('$'));
                if first_is_op {
                    return Ok(Update::Operators(parse_operators(&d)?));
                }
                if let Some(k) = d.keys().find(|k| k.starts_with('$')) {
                    return Err(replacement_dollar(k));
                }
                Ok(Update::Replacement(d))
            }
            other => Err(CommandError::failed_to_parse(format!(
                "Update argument must be either an object or an array, found {}",
                type_name(&other)
            ))),
        }
    }

    /// Attaches what positional paths resolve with: the statement's query (for `$`) and its
    /// `arrayFilters` (for `$[<identifier>]`), checking that every identifier has exactly one
    /// filter and every filter is used.
    pub fn with_positional(
        mut self,
        query: &Document,
        array_filters: Option<&Bson>,
    ) -> CommandResult<Update> {
        let given = matches!(array_filters, Some(Bson::Array(a)) if !a.is_empty());
        match &mut self {
            Update::Operators(ops) => {
                ops.positional = positional::Positional::new(&ops.ops, query, array_filters)?;
            }
            _ if given => {
                return Err(CommandError::failed_to_parse(
                    "arrayFilters may only be specified with an update made of update operators",
                ))
            }
            _ => {}
        }
        Ok(self)
    }

    /// True for a replacement document.
    pub fn is_replacement(&self) -> bool {
        matches!(self, Update::Replacement(_))
    }

    /// True for a pipeline update.
    pub fn is_pipeline(&self) -> bool {
        matches!(self, Update::Pipeline(_))
    }

    /// Applies the update to `doc` in place. `is_insert`: this is an upsert inserting (then
    /// `$setOnInsert` applies). Refuses to change `_id` (code 66 ImmutableField) and keeps
    /// `_id` first. Atomic: on error `doc` is unchanged. If `doc` has no `_id` afterwards
    /// (an upsert without one) the caller generates it.
    pub fn apply(
        &self,
        doc: &mut Document,
        is_insert: bool,
        vars: &Vars,
    ) -> CommandResult<UpdateOutcome> {
        match self.apply_to(doc, is_insert, vars)? {
            Some(new_doc) => {
                *doc = new_doc;
                Ok(UpdateOutcome { modified: true })
            }
            None => Ok(UpdateOutcome { modified: false }),
        }
    }

    /// [`apply`](Self::apply) without changing `doc`: the new document, or `None` when the
    /// update leaves it as it is. Saves a copy of `doc` when the caller keeps the original
    /// anyway (the stored version).
    pub fn apply_to(
        &self,
        doc: &Document,
        is_insert: bool,
        vars: &Vars,
    ) -> CommandResult<Option<Document>> {
        let original_id = doc.get("_id").cloned();
        let mut new_doc = match self {
            Update::Replacement(r) => {
                let mut out = Document::new();
                if let Some(id) = &original_id {
                    if let Some(rid) = r.get("_id") {
                        if !same_id(id, rid) {
                            return Err(code(
                                66,
                                "ImmutableField",
                                format!("After applying the update, the (immutable) field '_id' was found to have been altered to _id: {rid}"),
                            ));
                        }
                    }
                    out.insert("_id", id.clone());
                }
                for (k, v) in r {
                    if k != "_id" || original_id.is_none() {
                        out.insert(k.clone(), v.clone());
                    }
                }
                out
            }
            Update::Pipeline(stages) => pipeline::run_parsed_update_pipeline(stages, doc, vars)?,
            Update::Operators(ops) => {
                let mut work = doc.clone();
                // What `$` stands for: the position the query's match on `doc` recorded.
                let matched = ops.positional.matched_position(doc, is_insert, vars)?;
                for op in &ops.ops {
                    if op.parts.iter().any(|p| positional::is_positional(p)) {
                        let concrete = ops
                            .positional
                            .expand(&work, &op.parts, &op.path, matched, vars)?;
                        for parts in concrete {
                            let one = Op {
                                path: op.path.clone(),
                                parts,
                                kind: op.kind.clone(),
                            };
                            apply_op(&mut work, &one, is_insert, vars)?;
                        }
                    } else {
                        apply_op(&mut work, op, is_insert, vars)?;
                    }
                }
                work
            }
        };
        if let Some(id) = &original_id {
            match new_doc.get("_id") {
                Some(nid) if same_id(id, nid) => {}
                _ => return Err(immutable_id()),
            }
        }
        move_id_first(&mut new_doc);
        let modified = match self {
            // mongod counts a replacement as a no-op only when the replacement document is
            // byte for byte the stored one (its `_id` included): replacing `{_id: 1, a: 1}`
            // with `{a: 1}` is a modification (nModified 1, a replace event).
            Update::Replacement(r) => !binary_equal(doc, r),
            _ => new_doc != *doc,
        };
        Ok(modified.then_some(new_doc))
    }
}

/// A replacement document may not hold a `$`-prefixed top-level field.
fn replacement_dollar(k: &str) -> CommandError {
    code(
        52,
        "DollarPrefixedFieldName",
        format!("The dollar ($) prefixed field '{k}' in '{k}' is not allowed in the context of an update's replacement document. Consider using an aggregation pipeline with $replaceWith."),
    )
}

/// Whether two documents encode to the same bytes (types, order, -0.0 and NaN included).
fn binary_equal(a: &Document, b: &Document) -> bool {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    match (a.to_writer(&mut x), b.to_writer(&mut y)) {
        (Ok(()), Ok(())) => x == y,
        _ => false,
    }
}

fn same_id(a: &Bson, b: &Bson) -> bool {
    a == b
}

/// Moves `_id` to the front of a document (as mongod stores documents).
pub fn move_id_first(doc: &mut Document) {
    if doc.keys().next().is_some_and(|k| k == "_id") {
        return;
    }
    if let Some(id) = doc.remove("_id") {
        let mut out = Document::new();
        out.insert("_id", id);
        for (k, v) in std::mem::take(doc) {
            out.insert(k, v);
        }
        *doc = out;
    }
}

/// The document an upsert starts from: the equality fields of the filter (plain values, `$eq`,
/// inside top-level `$and`; dotted paths create sub-documents), `_id` first. Two conditions on
/// one path, or on a path and its prefix, give code 54 NotSingleValueField; a dotted path
/// under `_id` gives code 111 NotExactValueField, as mongod.
pub fn upsert_seed(filter: &Document) -> CommandResult<Document> {
    let eqs = equality_fields(filter)?;
    for (i, (a, _)) in eqs.iter().enumerate() {
        if a.starts_with("_id.") {
            return Err(code(
                111,
                "NotExactValueField",
                format!("field at '_id' must be exactly specified, field at sub-path '{a}' found"),
            ));
        }
        for (b, _) in &eqs[i + 1..] {
            if a == b {
                return Err(code(
                    54,
                    "NotSingleValueField",
                    format!("cannot infer query fields to set, path '{a}' is matched twice"),
                ));
            }
            if a.starts_with(&format!("{b}.")) || b.starts_with(&format!("{a}.")) {
                return Err(code(
                    54,
                    "NotSingleValueField",
                    format!(
                        "cannot infer query fields to set, both paths '{b}' and '{a}' are matched"
                    ),
                ));
            }
        }
    }
    let mut doc = Document::new();
    for (path, value) in eqs {
        let parts = parse_update_path(&path)?;
        if let Some(mut s) = slot(&mut doc, &parts, true)? {
            s.set(value);
        }
    }
    move_id_first(&mut doc);
    Ok(doc)
}

#[path = "update_apply.rs"]
mod apply;
#[path = "update_positional.rs"]
mod positional;
use apply::{apply_op, slot};

#[cfg(test)]
#[path = "update_tests.rs"]
mod tests;
