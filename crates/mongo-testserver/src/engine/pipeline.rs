//! Aggregation stages over in-memory documents, sorting, and pipeline-style updates.
//!
//! Stages: `$match $sort $skip $limit $project $count $addFields $set $unset $replaceWith
//! $replaceRoot $group $unwind`. `$changeStream` is handled by the server, never here; every
//! other stage is refused with code 40324 naming it.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use bson::{Bson, Document};

use super::compare::{compare, type_name, values_equal, OrdBson};
use super::expr::{self, Vars};
use super::matcher::Filter;
use super::num::{self, Num};
use super::path::{expr_path_doc, query_leaves, set_agg_path};
use super::projection::Projection;
use super::update::move_id_first;
use crate::error::{CommandError, CommandResult};

fn loc(code: i32, msg: impl Into<String>) -> CommandError {
    CommandError::new(code, format!("Location{code}"), msg)
}

/// A parsed stage.
#[derive(Debug, Clone)]
enum Stage {
    Match(Filter),
    Sort(Vec<(String, bool)>),
    Skip(u64),
    Limit(u64),
    Project(Projection),
    Count(String),
    AddFields(Vec<(Vec<String>, Bson)>),
    ReplaceRoot(Bson, &'static str),
    Group(Group),
    Unwind(Unwind),
}

#[derive(Debug, Clone)]
struct Group {
    id: Bson,
    fields: Vec<(String, String, Bson)>,
}

#[derive(Debug, Clone)]
struct Unwind {
    path: String,
    index_field: Option<String>,
    preserve: bool,
}

/// Stages that exist in MongoDB but are not implemented here (refused by name).
const KNOWN_UNSUPPORTED: &[&str] = &[
    "$lookup",
    "$facet",
    "$bucket",
    "$bucketAuto",
    "$sortByCount",
    "$sample",
    "$out",
    "$merge",
    "$graphLookup",
    "$geoNear",
    "$indexStats",
    "$collStats",
    "$redact",
    "$densify",
    "$fill",
    "$setWindowFields",
    "$unionWith",
    "$search",
    "$searchMeta",
    "$listSessions",
    "$currentOp",
    "$planCacheStats",
    "$documents",
    "$changeStreamSplitLargeEvent",
];

const UPDATE_STAGES: &[&str] = &[
    "$addFields",
    "$set",
    "$project",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
];

fn stage_name(stage: &Document) -> CommandResult<(&str, &Bson)> {
    if stage.len() != 1 {
        return Err(loc(
            40323,
            "A pipeline stage specification object must contain exactly one field.",
        ));
    }
    stage
        .iter()
        .next()
        .map(|(k, v)| (k.as_str(), v))
        .ok_or_else(|| {
            loc(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            )
        })
}

fn non_negative_int(v: &Bson) -> Option<i64> {
    Num::from_bson(v).and_then(Num::as_i64_exact)
}

/// Parses a sort specification (`{a: 1, b: -1}`) into (path, ascending) pairs.
pub fn parse_sort_spec(spec: &Document) -> CommandResult<Vec<(String, bool)>> {
    if spec.is_empty() {
        return Err(loc(15976, "$sort stage must have at least one sort key"));
    }
    let mut keys = Vec::with_capacity(spec.len());
    for (k, v) in spec {
        if k.is_empty() || k.split('.').any(str::is_empty) {
            return Err(loc(
                40352,
                format!("FieldPath cannot be constructed with empty string: '{k}'"),
            ));
        }
        if let Bson::Document(d) = v {
            if d.contains_key("$meta") {
                return Err(CommandError::bad_value(format!(
                    "$meta sort ({k}) is not supported by mongo-testserver"
                )));
            }
        }
        let asc = match non_negative_int(v) {
            Some(1) => true,
            Some(-1) => false,
            _ => {
                return Err(loc(
                    15975,
                    "$sort key ordering must be 1 (for ascending) or -1 (for descending)",
                ))
            }
        };
        keys.push((k.clone(), asc));
    }
    Ok(keys)
}

/// The value a document sorts by for one key: missing sorts as null; an array sorts by its
/// smallest element ascending and its largest descending (an empty array sorts before null).
fn sort_key(doc: &Document, path: &str, asc: bool) -> Bson {
    let mut best: Option<Bson> = None;
    let consider = |v: Bson, best: &mut Option<Bson>| {
        let better = match best {
            None => true,
            Some(b) => {
                let o = compare(&v, b);
                if asc {
                    o == Ordering::Less
                } else {
                    o == Ordering::Greater
                }
            }
        };
        if better {
            *best = Some(v);
        }
    };
    for leaf in query_leaves(doc, path) {
        match leaf {
            None => consider(Bson::Null, &mut best),
            Some(Bson::Array(a)) if a.is_empty() => consider(Bson::Undefined, &mut best),
            Some(Bson::Array(a)) => {
                for el in a {
                    consider(el.clone(), &mut best);
                }
            }
            Some(v) => consider(v.clone(), &mut best),
        }
    }
    best.unwrap_or(Bson::Null)
}

fn compare_keys(a: &[Bson], b: &[Bson], keys: &[(String, bool)]) -> Ordering {
    for (i, (_, asc)) in keys.iter().enumerate() {
        let o = compare(&a[i], &b[i]);
        let o = if *asc { o } else { o.reverse() };
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

/// Compares two values (array elements, for `$push` with `$sort`) by a parsed sort spec;
/// non-document values sort as if every field were null.
pub fn compare_values_by_spec(a: &Bson, b: &Bson, keys: &[(String, bool)]) -> Ordering {
    let empty = Document::new();
    let da = a.as_document().unwrap_or(&empty);
    let db = b.as_document().unwrap_or(&empty);
    let ka: Vec<Bson> = keys.iter().map(|(p, asc)| sort_key(da, p, *asc)).collect();
    let kb: Vec<Bson> = keys.iter().map(|(p, asc)| sort_key(db, p, *asc)).collect();
    compare_keys(&ka, &kb, keys)
}

fn sort_parsed(docs: &mut [Document], keys: &[(String, bool)]) {
    let mut decorated: Vec<(Vec<Bson>, usize)> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            (
                keys.iter().map(|(p, asc)| sort_key(d, p, *asc)).collect(),
                i,
            )
        })
        .collect();
    decorated.sort_by(|(ka, _), (kb, _)| compare_keys(ka, kb, keys));
    let order: Vec<usize> = decorated.into_iter().map(|(_, i)| i).collect();
    let mut taken: Vec<Option<Document>> =
        docs.iter_mut().map(|d| Some(std::mem::take(d))).collect();
    for (slot, i) in docs.iter_mut().zip(order) {
        if let Some(d) = taken[i].take() {
            *slot = d;
        }
    }
}

/// Sorts documents by a sort spec `{a: 1, b: -1}` in BSON order (stable; missing sorts as null;
/// arrays by their min element ascending / max element descending, as mongod).
pub fn sort_documents(docs: &mut [Document], spec: &Document) -> CommandResult<()> {
    let keys = parse_sort_spec(spec)?;
    sort_parsed(docs, &keys);
    Ok(())
}

/// The fields of a `$set`/`$addFields` specification as `(path, expression)` pairs, nested
/// documents without operators flattened into dotted paths. Takes the specification by value:
/// its expressions are moved into the result, not cloned (a borrowed specification is cloned
/// once by the caller).
fn flatten_add_fields(
    spec: Document,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Bson)>,
) -> CommandResult<()> {
    for (k, v) in spec {
        if k.is_empty() || k.split('.').any(str::is_empty) {
            return Err(loc(
                40352,
                format!("FieldPath cannot be constructed with empty string: '{k}'"),
            ));
        }
        if k.starts_with('$') {
            return Err(loc(
                16410,
                format!("FieldPath field names may not start with '$'. Consider using $getField or $setField. ({k})"),
            ));
        }
        let mut parts = prefix.to_vec();
        parts.extend(k.split('.').map(str::to_string));
        match v {
            Bson::Document(d)
                if !d.is_empty() && !d.keys().next().is_some_and(|x| x.starts_with('$')) =>
            {
                flatten_add_fields(d, &parts, out)?;
            }
            other => {
                expr::validate(&other)?;
                out.push((parts, other));
            }
        }
    }
    Ok(())
}

/// [`parse_stage`] of a stage the caller gives up: the expressions of `$set`/`$addFields`
/// and `$replaceWith` are moved into the parsed stage, not cloned (the costly part of parsing
/// an update pipeline). Every other stage, and every error, is [`parse_stage`]'s.
fn parse_stage_owned(stage: Document, update_only: bool) -> CommandResult<Stage> {
    match stage_name(&stage) {
        Ok(("$replaceWith", arg)) => {
            expr::validate(arg)?;
            match stage.into_iter().next() {
                Some((_, arg)) => Ok(Stage::ReplaceRoot(arg, "'replacement document'")),
                // `stage_name` found exactly one field.
                None => Err(loc(
                    40323,
                    "A pipeline stage specification object must contain exactly one field.",
                )),
            }
        }
        Ok(("$addFields" | "$set", Bson::Document(_))) => match stage.into_iter().next() {
            Some((_, Bson::Document(spec))) => {
                let mut fields = Vec::new();
                flatten_add_fields(spec, &[], &mut fields)?;
                Ok(Stage::AddFields(fields))
            }
            // `stage_name` found exactly this one field, a document.
            _ => Err(loc(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            )),
        },
        _ => parse_stage(&stage, update_only),
    }
}

fn parse_stage(stage: &Document, update_only: bool) -> CommandResult<Stage> {
    let (name, arg) = stage_name(stage)?;
    if update_only && !UPDATE_STAGES.contains(&name) {
        let known = matches!(
            name,
            "$match"
                | "$sort"
                | "$skip"
                | "$limit"
                | "$count"
                | "$group"
                | "$unwind"
                | "$changeStream"
        ) || KNOWN_UNSUPPORTED.contains(&name);
        if known {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                format!("{name} is not allowed to be used within an update"),
            ));
        }
        return Err(CommandError::unknown_stage(name));
    }
    Ok(match name {
        "$match" => {
            let d = arg
                .as_document()
                .ok_or_else(|| loc(15959, "the match filter must be an expression in an object"))?;
            Stage::Match(Filter::parse(d)?)
        }
        "$sort" => {
            let d = arg
                .as_document()
                .ok_or_else(|| loc(15973, "the $sort key specification must be an object"))?;
            Stage::Sort(parse_sort_spec(d)?)
        }
        "$skip" => match non_negative_int(arg) {
            Some(n) if n >= 0 => Stage::Skip(n as u64),
            Some(_) => return Err(loc(5107200, format!("invalid argument to $skip stage: Cannot skip a negative number of documents: {arg}"))),
            None => return Err(loc(5107200, format!("invalid argument to $skip stage: Expected an integer: $skip: {arg}"))),
        },
        "$limit" => match non_negative_int(arg) {
            Some(n) if n > 0 => Stage::Limit(n as u64),
            Some(_) => return Err(loc(15958, "the limit must be positive")),
            None => return Err(loc(5107201, format!("invalid argument to $limit stage: Expected an integer: $limit: {arg}"))),
        },
        "$project" => {
            let d = arg
                .as_document()
                .ok_or_else(|| loc(15969, "$project specification must be an object"))?;
            Stage::Project(Projection::parse_aggregate(d)?)
        }
        "$unset" => {
            let paths: Vec<String> = match arg {
                Bson::String(s) => vec![s.clone()],
                Bson::Array(a) if !a.is_empty() => a
                    .iter()
                    .map(|x| match x {
                        Bson::String(s) => Ok(s.clone()),
                        _ => Err(loc(31120, "$unset specification must be a string or an array containing only string values")),
                    })
                    .collect::<CommandResult<_>>()?,
                Bson::Array(_) => return Err(loc(31119, "$unset specification must be a string or an array with at least one field")),
                _ => return Err(loc(31002, "$unset specification must be a string or an array")),
            };
            Stage::Project(Projection::exclusion_of(&paths)?)
        }
        "$count" => match arg {
            Bson::String(s) if s.is_empty() => return Err(loc(40156, "the count field must be a non-empty string")),
            Bson::String(s) if s.starts_with('$') => return Err(loc(40158, "the count field cannot be a $-prefixed path")),
            Bson::String(s) if s.contains('.') => return Err(loc(40160, "the count field cannot contain '.'")),
            Bson::String(s) => Stage::Count(s.clone()),
            _ => return Err(loc(40156, "the count field must be a non-empty string")),
        },
        "$addFields" | "$set" => {
            let d = arg.as_document().ok_or_else(|| {
                loc(40272, format!("{name} specification stage must be an object, got {}", type_name(arg)))
            })?;
            let mut fields = Vec::new();
            flatten_add_fields(d.clone(), &[], &mut fields)?;
            Stage::AddFields(fields)
        }
        "$replaceRoot" => {
            let d = arg
                .as_document()
                .ok_or_else(|| loc(40229, "expected an object as specification for $replaceRoot stage"))?;
            for k in d.keys() {
                if k != "newRoot" {
                    return Err(loc(40415, format!("BSON field '$replaceRoot.{k}' is an unknown field.")));
                }
            }
            let e = d
                .get("newRoot")
                .ok_or_else(|| loc(40231, "no newRoot specified for the $replaceRoot stage"))?;
            expr::validate(e)?;
            Stage::ReplaceRoot(e.clone(), "'newRoot'")
        }
        "$replaceWith" => {
            expr::validate(arg)?;
            Stage::ReplaceRoot(arg.clone(), "'replacement document'")
        }
        "$group" => Stage::Group(parse_group(arg)?),
        "$unwind" => Stage::Unwind(parse_unwind(arg)?),
        "$changeStream" => {
            return Err(loc(
                40602,
                "$changeStream is only valid as the first stage in a pipeline.",
            ))
        }
        other => {
            let mut e = CommandError::unknown_stage(other);
            if KNOWN_UNSUPPORTED.contains(&other) {
                e.message = format!("{} (the stage exists in MongoDB but is not supported by mongo-testserver)", e.message);
            }
            return Err(e);
        }
    })
}

const ACCUMULATORS: &[&str] = &[
    "$sum",
    "$avg",
    "$min",
    "$max",
    "$first",
    "$last",
    "$push",
    "$addToSet",
    "$count",
    "$mergeObjects",
];

fn parse_group(arg: &Bson) -> CommandResult<Group> {
    let d = arg
        .as_document()
        .ok_or_else(|| loc(15947, "a group's fields must be specified in an object"))?;
    let id = d
        .get("_id")
        .ok_or_else(|| loc(15955, "a group specification must include an _id"))?;
    expr::validate(id)?;
    let mut fields = Vec::new();
    for (k, v) in d {
        if k == "_id" {
            continue;
        }
        if k.contains('.') {
            return Err(loc(
                40235,
                format!("The field name '{k}' cannot contain '.'"),
            ));
        }
        let acc = match v {
            Bson::Document(a) if a.len() == 1 => a,
            _ => {
                return Err(loc(
                    40234,
                    format!("The field '{k}' must be an accumulator object"),
                ))
            }
        };
        let (op, e) = acc.iter().next().ok_or_else(|| {
            loc(
                40238,
                format!("The field '{k}' must specify one accumulator"),
            )
        })?;
        if !ACCUMULATORS.contains(&op.as_str()) {
            return Err(loc(15952, format!("unknown group operator '{op}'")));
        }
        if op == "$count" && !matches!(e, Bson::Document(x) if x.is_empty()) {
            return Err(loc(5428000, "$count takes no arguments, i.e. $count:{}"));
        }
        expr::validate(e)?;
        fields.push((k.clone(), op.clone(), e.clone()));
    }
    Ok(Group {
        id: id.clone(),
        fields,
    })
}

fn parse_unwind(arg: &Bson) -> CommandResult<Unwind> {
    let (path, index_field, preserve) = match arg {
        Bson::String(s) => (s.clone(), None, false),
        Bson::Document(d) => {
            let mut path = None;
            let mut idx = None;
            let mut preserve = false;
            for (k, v) in d {
                match (k.as_str(), v) {
                    ("path", Bson::String(s)) => path = Some(s.clone()),
                    ("path", _) => return Err(loc(28808, "expected a string as the path for $unwind stage")),
                    ("includeArrayIndex", Bson::String(s)) if !s.is_empty() && !s.starts_with('$') => {
                        idx = Some(s.clone())
                    }
                    ("includeArrayIndex", _) => {
                        return Err(loc(28810, "expected a non-empty string for the includeArrayIndex option to $unwind stage"))
                    }
                    ("preserveNullAndEmptyArrays", Bson::Boolean(b)) => preserve = *b,
                    ("preserveNullAndEmptyArrays", _) => {
                        return Err(loc(28809, "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage"))
                    }
                    (other, _) => return Err(loc(28811, format!("unrecognized option to $unwind stage: {other}"))),
                }
            }
            (
                path.ok_or_else(|| loc(28812, "no path specified to $unwind stage"))?,
                idx,
                preserve,
            )
        }
        _ => {
            return Err(loc(
                15981,
                "expected either a string or an object as specification for $unwind stage",
            ))
        }
    };
    let Some(p) = path.strip_prefix('$') else {
        return Err(loc(
            28818,
            format!("path option to $unwind stage should be prefixed with a '$': {path}"),
        ));
    };
    if p.is_empty() || p.split('.').any(str::is_empty) {
        return Err(loc(
            40352,
            "FieldPath cannot be constructed with empty string",
        ));
    }
    Ok(Unwind {
        path: p.to_string(),
        index_field,
        preserve,
    })
}

fn parse_all(stages: &[Document], update_only: bool) -> CommandResult<Vec<Stage>> {
    stages.iter().map(|s| parse_stage(s, update_only)).collect()
}

/// Checks that a pipeline is a valid update pipeline: only `$addFields`/`$set`, `$project`,
/// `$unset`, `$replaceRoot`/`$replaceWith` (others: code 72 naming the stage).
pub fn validate_update_pipeline(stages: &[Document]) -> CommandResult<()> {
    parse_all(stages, true).map(|_| ())
}

/// A pipeline parsed once (stage arguments, filters, projections, field paths) and run many
/// times: an update pipeline applied to each matched document, or a change stream's stages
/// applied to each event.
#[derive(Debug, Clone)]
pub struct Parsed(Vec<Stage>);

impl Parsed {
    /// Parses and validates an aggregation pipeline (as [`validate`]).
    pub fn parse(stages: &[Document]) -> CommandResult<Parsed> {
        parse_all(stages, false).map(Parsed)
    }

    /// Parses and validates an update pipeline (as [`validate_update_pipeline`]).
    pub fn parse_update(stages: &[Document]) -> CommandResult<Parsed> {
        parse_all(stages, true).map(Parsed)
    }

    /// [`Parsed::parse_update`] of stages the caller gives up (their expressions are moved,
    /// not cloned).
    pub fn parse_update_owned(stages: Vec<Document>) -> CommandResult<Parsed> {
        stages
            .into_iter()
            .map(|s| parse_stage_owned(s, true))
            .collect::<CommandResult<_>>()
            .map(Parsed)
    }

    /// Whether the pipeline has no stages.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Runs the stages over `docs` (as [`run`]).
    pub fn run(&self, docs: Vec<Document>, vars: &Vars) -> CommandResult<Vec<Document>> {
        run_parsed(&self.0, docs, vars)
    }
}

/// Validates a whole aggregation pipeline without running it.
pub fn validate(stages: &[Document]) -> CommandResult<()> {
    parse_all(stages, false).map(|_| ())
}

/// Runs aggregation stages over `docs`.
pub fn run(stages: &[Document], docs: Vec<Document>, vars: &Vars) -> CommandResult<Vec<Document>> {
    let parsed = parse_all(stages, false)?;
    run_parsed(&parsed, docs, vars)
}

fn run_parsed(
    stages: &[Stage],
    mut docs: Vec<Document>,
    vars: &Vars,
) -> CommandResult<Vec<Document>> {
    for stage in stages {
        docs = match stage {
            Stage::Match(f) => {
                let mut out = Vec::with_capacity(docs.len());
                for d in docs {
                    if f.matches(&d, vars)? {
                        out.push(d);
                    }
                }
                out
            }
            Stage::Sort(keys) => {
                sort_parsed(&mut docs, keys);
                docs
            }
            Stage::Skip(n) => docs
                .into_iter()
                .skip(usize::try_from(*n).unwrap_or(usize::MAX))
                .collect(),
            Stage::Limit(n) => docs
                .into_iter()
                .take(usize::try_from(*n).unwrap_or(usize::MAX))
                .collect(),
            Stage::Project(p) => docs
                .iter()
                .map(|d| p.apply(d, vars))
                .collect::<CommandResult<_>>()?,
            Stage::Count(field) => {
                if docs.is_empty() {
                    Vec::new()
                } else {
                    let mut d = Document::new();
                    let n = docs.len() as i64;
                    d.insert(
                        field.clone(),
                        i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n)),
                    );
                    vec![d]
                }
            }
            Stage::AddFields(fields) => {
                let mut out = Vec::with_capacity(docs.len());
                for d in docs {
                    out.push(add_fields(d, fields, vars)?);
                }
                out
            }
            Stage::ReplaceRoot(e, what) => {
                let mut out = Vec::with_capacity(docs.len());
                for d in docs {
                    match expr::evaluate(e, &d, vars)? {
                        Some(Bson::Document(nd)) => out.push(nd),
                        other => {
                            return Err(loc(
                                40228,
                                format!(
                                    "{what} must evaluate to an object, but resulting value was: {}. Type of resulting value: '{}'. Input document: {d}",
                                    other.as_ref().map(|v| v.to_string()).unwrap_or_else(|| "MISSING".into()),
                                    other.as_ref().map(type_name).unwrap_or("missing"),
                                ),
                            ))
                        }
                    }
                }
                out
            }
            Stage::Group(g) => group(g, docs, vars)?,
            Stage::Unwind(u) => unwind(u, docs),
        };
    }
    Ok(docs)
}

fn add_fields(
    mut d: Document,
    fields: &[(Vec<String>, Bson)],
    vars: &Vars,
) -> CommandResult<Document> {
    // Every expression sees the input document: evaluate them all first, then set the fields
    // in place (no copy of the document).
    let mut values = Vec::with_capacity(fields.len());
    for (_, e) in fields {
        values.push(expr::evaluate(e, &d, vars)?);
    }
    for ((parts, _), v) in fields.iter().zip(values) {
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        match v {
            Some(v) => set_agg_path(&mut d, &refs, v),
            None => super::path::remove_agg_path(&mut d, &refs),
        }
    }
    Ok(d)
}

#[path = "pipeline_group.rs"]
mod group_unwind;
use group_unwind::{group, unwind};

/// Runs a pipeline-style update on one document: only `$set`/`$addFields`, `$unset`,
/// `$project`, `$replaceWith`/`$replaceRoot` (others: code 72 naming the stage). The result
/// keeps `_id` first; if the pipeline dropped `_id` the original is restored (as mongod does);
/// a different `_id` is code 66 ImmutableField.
pub fn run_update_pipeline(
    stages: &[Document],
    doc: &Document,
    vars: &Vars,
) -> CommandResult<Document> {
    run_parsed_update_pipeline(&Parsed::parse_update(stages)?, doc, vars)
}

/// [`run_update_pipeline`] with a pipeline parsed by [`Parsed::parse_update`].
pub fn run_parsed_update_pipeline(
    parsed: &Parsed,
    doc: &Document,
    vars: &Vars,
) -> CommandResult<Document> {
    let mut out = run_parsed(&parsed.0, vec![doc.clone()], vars)?;
    let mut result = out.pop().unwrap_or_default();
    if let Some(id) = doc.get("_id") {
        match result.get("_id") {
            None => {
                let mut with_id = Document::new();
                with_id.insert("_id", id.clone());
                with_id.extend(result);
                result = with_id;
            }
            Some(nid) if nid == id => {}
            Some(_) => {
                return Err(CommandError::new(
                    66,
                    "ImmutableField",
                    "Performing an update on the path '_id' would modify the immutable field '_id'",
                ))
            }
        }
    }
    move_id_first(&mut result);
    Ok(result)
}

/// Evaluates a `$`-path of a document the way aggregation does (used by `$unwind`-like code).
pub fn field(doc: &Document, path: &str) -> Option<Bson> {
    expr_path_doc(doc, path)
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;
