//! Projections: find/findAndModify `projection`/`fields`, and the `$project`/`$unset` stages.
//!
//! Inclusion (`{a: 1}`), exclusion (`{a: 0}`), `_id` included unless excluded, dotted and nested
//! paths (through arrays), computed fields (aggregation expressions, 4.4+), and in find
//! projections `$slice` (`n` or `[skip, limit]`) and `$elemMatch` (which joins either kind of
//! projection, and alone includes). Mixing inclusion and exclusion is refused (codes
//! 31253/31254), as mongod. The positional projection `a.$` (find and findAndModify) keeps the
//! element the query's conditions on `a` select. `$meta` is refused.

use bson::{Bson, Document};

use super::expr::{self, Vars};
use super::matcher::ElementCondition;
use super::path::set_agg_path;
use crate::error::{CommandError, CommandResult};

/// A parsed projection.
#[derive(Debug, Clone)]
pub struct Projection {
    inclusion: bool,
    include_id: bool,
    tree: Vec<(String, PNode)>,
    computed: Vec<(Vec<String>, Bson)>,
}

#[derive(Debug, Clone)]
enum PNode {
    Include,
    Exclude,
    Sub(Vec<(String, PNode)>),
    Computed,
    Slice(Option<i64>, i64),
    ElemMatch(Box<ElementCondition>),
}

fn loc(code: i32, msg: impl Into<String>) -> CommandError {
    CommandError::new(code, format!("Location{code}"), msg)
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Find,
    Aggregate,
}

#[derive(Default)]
struct Modes {
    inclusion: Option<String>,
    exclusion: Option<String>,
    elem_match: bool,
}

impl Projection {
    /// Parses a find/findAndModify projection.
    pub fn parse_find(spec: &Document) -> CommandResult<Projection> {
        Self::parse(spec, Kind::Find)
    }

    /// Parses a `$project` stage specification (must not be empty; find-only `$slice` and
    /// `$elemMatch` forms are expressions here).
    pub fn parse_aggregate(spec: &Document) -> CommandResult<Projection> {
        if spec.is_empty() {
            return Err(loc(
                51272,
                "Invalid $project :: caused by :: projection specification must have at least one field",
            ));
        }
        Self::parse(spec, Kind::Aggregate)
    }

    /// An exclusion projection of the given paths (the `$unset` stage).
    pub fn exclusion_of(paths: &[String]) -> CommandResult<Projection> {
        let mut spec = Document::new();
        for p in paths {
            spec.insert(p.clone(), 0);
        }
        Self::parse(&spec, Kind::Aggregate)
    }

    fn parse(spec: &Document, kind: Kind) -> CommandResult<Projection> {
        let mut tree: Vec<(String, PNode)> = Vec::new();
        let mut computed = Vec::new();
        let mut modes = Modes::default();
        let mut id_setting: Option<bool> = None;
        parse_level(
            spec,
            &[],
            kind,
            &mut tree,
            &mut computed,
            &mut modes,
            &mut id_setting,
        )?;
        if let (Some(inc), Some(exc)) = (&modes.inclusion, &modes.exclusion) {
            let _ = inc;
            return Err(loc(
                31254,
                format!("Cannot do exclusion on field {exc} in inclusion projection"),
            ));
        }
        let inclusion = if modes.inclusion.is_some() {
            true
        } else if modes.exclusion.is_some() {
            false
        } else if modes.elem_match {
            true
        } else {
            // Only `_id` and/or `$slice`: `{_id: 1}` is an inclusion, anything else excludes.
            id_setting == Some(true) && tree.iter().all(|(k, _)| k == "_id")
        };
        Ok(Projection {
            inclusion,
            include_id: id_setting != Some(false),
            tree,
            computed,
        })
    }

    /// Applies the projection to a document.
    pub fn apply(&self, doc: &Document, vars: &Vars) -> CommandResult<Document> {
        let mut out = if self.inclusion {
            let mut out = include(doc, &self.tree, vars)?;
            if self.include_id {
                if let Some(id) = doc.get("_id") {
                    if !out.contains_key("_id") {
                        let mut with_id = Document::new();
                        with_id.insert("_id", id.clone());
                        with_id.extend(out);
                        out = with_id;
                    }
                }
            }
            out
        } else {
            exclude(doc, &self.tree, vars)?
        };
        if !self.include_id {
            out.remove("_id");
        }
        for (parts, e) in &self.computed {
            let v = expr::evaluate(e, doc, vars)?;
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            match v {
                Some(v) => set_agg_path(&mut out, &refs, v),
                None => super::path::remove_agg_path(&mut out, &refs),
            }
        }
        Ok(out)
    }

    /// True for an inclusion projection.
    pub fn is_inclusion(&self) -> bool {
        self.inclusion
    }
}

fn insert_node(
    tree: &mut Vec<(String, PNode)>,
    parts: &[String],
    node: PNode,
    full: &str,
) -> CommandResult<()> {
    let collision = || loc(31250, format!("Path collision at {full}"));
    let (first, rest) = parts.split_first().ok_or_else(collision)?;
    let pos = tree.iter().position(|(k, _)| k == first);
    if rest.is_empty() {
        if pos.is_some() {
            return Err(collision());
        }
        tree.push((first.clone(), node));
        return Ok(());
    }
    match pos {
        None => {
            let mut sub = Vec::new();
            insert_node(&mut sub, rest, node, full)?;
            tree.push((first.clone(), PNode::Sub(sub)));
            Ok(())
        }
        Some(i) => match &mut tree[i].1 {
            PNode::Sub(sub) => insert_node(sub, rest, node, full),
            _ => Err(loc(
                31249,
                format!(
                    "Path collision at {full} remaining portion {}",
                    rest.join(".")
                ),
            )),
        },
    }
}

fn check_path(path: &str) -> CommandResult<Vec<String>> {
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(loc(
            40352,
            format!("FieldPath cannot be constructed with empty string or a path containing empty components: '{path}'"),
        ));
    }
    let parts: Vec<String> = path.split('.').map(str::to_string).collect();
    for p in &parts {
        if p == "$" {
            // Find projections handle it (`project_matched`); elsewhere it is no field name.
            return Err(loc(
                31324,
                format!("Cannot use positional projection in aggregation projection ({path})"),
            ));
        }
        if p.starts_with('$') {
            return Err(loc(
                16410,
                format!("FieldPath field names may not start with '$'. Consider using $getField or $setField. ({path})"),
            ));
        }
    }
    Ok(parts)
}

fn slice_arg(v: &Bson) -> Option<CommandResult<(Option<i64>, i64)>> {
    let int = |x: &Bson| {
        super::num::Num::from_bson(x).map(|n| n.as_i64_exact().unwrap_or(n.as_f64() as i64))
    };
    match v {
        Bson::Array(a) if a.len() == 2 => {
            let (s, l) = (int(&a[0])?, int(&a[1])?);
            if l <= 0 {
                return Some(Err(loc(
                    28724,
                    format!("$slice limit must be positive, got: {l}"),
                )));
            }
            Some(Ok((Some(s), l)))
        }
        other => int(other).map(|n| Ok((None, n))),
    }
}

#[allow(clippy::too_many_arguments)]
fn parse_level(
    spec: &Document,
    prefix: &[String],
    kind: Kind,
    tree: &mut Vec<(String, PNode)>,
    computed: &mut Vec<(Vec<String>, Bson)>,
    modes: &mut Modes,
    id_setting: &mut Option<bool>,
) -> CommandResult<()> {
    for (k, v) in spec {
        let mut parts = prefix.to_vec();
        parts.extend(check_path(k)?);
        let full = parts.join(".");
        let is_id = full == "_id";
        let node = match v {
            Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                let on = expr::truthy(Some(v));
                if is_id {
                    *id_setting = Some(on);
                    if on {
                        continue;
                    }
                    PNode::Exclude
                } else if on {
                    modes.inclusion.get_or_insert(full.clone());
                    if modes.exclusion.is_some() {
                        return Err(loc(31253, format!("Cannot do inclusion on field {full} in exclusion projection")));
                    }
                    PNode::Include
                } else {
                    modes.exclusion.get_or_insert(full.clone());
                    if modes.inclusion.is_some() {
                        return Err(loc(31254, format!("Cannot do exclusion on field {full} in inclusion projection")));
                    }
                    PNode::Exclude
                }
            }
            Bson::Document(d) if d.is_empty() => {
                return Err(loc(
                    51270,
                    format!("An empty sub-projection is not a valid value. Found empty object at path {full}"),
                ))
            }
            Bson::Document(d) if d.keys().next().is_some_and(|x| x.starts_with('$')) => {
                let op = d.keys().next().map(String::as_str).unwrap_or("");
                if op == "$meta" {
                    return Err(CommandError::bad_value(format!(
                        "$meta projection ({full}) is not supported by mongo-testserver"
                    )));
                }
                if kind == Kind::Find && op == "$slice" && d.len() == 1 {
                    if let Some(r) = d.get("$slice").and_then(slice_arg) {
                        let (skip, limit) = r?;
                        insert_node(tree, &parts, PNode::Slice(skip, limit), &full)?;
                        continue;
                    }
                }
                if kind == Kind::Find && op == "$elemMatch" && d.len() == 1 {
                    if parts.len() > 1 {
                        return Err(loc(31275, "Cannot use $elemMatch projection on a nested field."));
                    }
                    let cond = match d.get("$elemMatch") {
                        Some(Bson::Document(c)) => c,
                        _ => return Err(CommandError::bad_value("$elemMatch needs an Object")),
                    };
                    // Neither inclusion nor exclusion: alone it includes, with exclusions it
                    // is part of an exclusion projection (as in mongod).
                    modes.elem_match = true;
                    // As the query operator: `{$elemMatch: {$gte: 5}}` tests the elements themselves.
                    let cond = ElementCondition::parse(&Bson::Document(cond.clone()))?;
                    insert_node(tree, &parts, PNode::ElemMatch(Box::new(cond)), &full)?;
                    continue;
                }
                expr::validate(v)?;
                computed_node(&full, modes)?;
                computed.push((parts.clone(), v.clone()));
                PNode::Computed
            }
            Bson::Document(d) => {
                parse_level(d, &parts, kind, tree, computed, modes, id_setting)?;
                continue;
            }
            other => {
                expr::validate(other)?;
                computed_node(&full, modes)?;
                computed.push((parts.clone(), other.clone()));
                PNode::Computed
            }
        };
        insert_node(tree, &parts, node, &full)?;
    }
    Ok(())
}

fn computed_node(full: &str, modes: &mut Modes) -> CommandResult<()> {
    if let Some(exc) = &modes.exclusion {
        let _ = full;
        return Err(loc(
            31254,
            format!("Cannot do exclusion on field {exc} in inclusion projection"),
        ));
    }
    modes.inclusion.get_or_insert(full.to_string());
    Ok(())
}

fn slice_value(v: &Bson, skip: Option<i64>, limit: i64) -> Bson {
    let Bson::Array(a) = v else {
        return v.clone();
    };
    let len = a.len() as i64;
    let (start, n) = match skip {
        None => {
            if limit >= 0 {
                (0, limit)
            } else {
                ((len.saturating_add(limit)).max(0), limit.saturating_neg())
            }
        }
        Some(s) => {
            let start = if s >= 0 {
                s.min(len)
            } else {
                len.saturating_add(s).max(0)
            };
            (start, limit)
        }
    };
    let end = start.saturating_add(n).min(len);
    Bson::Array(a[start as usize..end.max(start) as usize].to_vec())
}

fn include(doc: &Document, tree: &[(String, PNode)], vars: &Vars) -> CommandResult<Document> {
    let mut out = Document::new();
    for (k, v) in doc {
        let Some((_, node)) = tree.iter().find(|(n, _)| n == k) else {
            continue;
        };
        match node {
            PNode::Include => {
                out.insert(k.clone(), v.clone());
            }
            PNode::Sub(children) => match v {
                Bson::Document(d) => {
                    out.insert(k.clone(), include(d, children, vars)?);
                }
                Bson::Array(a) => {
                    out.insert(k.clone(), include_array(a, children, vars)?);
                }
                _ => {}
            },
            PNode::Slice(skip, limit) => {
                out.insert(k.clone(), slice_value(v, *skip, *limit));
            }
            PNode::ElemMatch(f) => {
                if let Some(first) = first_elem_match(v, f, vars)? {
                    out.insert(k.clone(), first);
                }
            }
            PNode::Exclude | PNode::Computed => {}
        }
    }
    Ok(out)
}

/// An `$elemMatch` projection of `v`: an array of its first matching element, or nothing (no
/// match, or not an array).
fn first_elem_match(v: &Bson, f: &ElementCondition, vars: &Vars) -> CommandResult<Option<Bson>> {
    if let Bson::Array(a) = v {
        for el in a {
            if f.matches_as_elem_match(el, vars)? {
                return Ok(Some(Bson::Array(vec![el.clone()])));
            }
        }
    }
    Ok(None)
}

fn include_array(a: &[Bson], tree: &[(String, PNode)], vars: &Vars) -> CommandResult<Bson> {
    let mut out = Vec::new();
    for el in a {
        match el {
            Bson::Document(d) => out.push(Bson::Document(include(d, tree, vars)?)),
            Bson::Array(inner) => out.push(include_array(inner, tree, vars)?),
            _ => {}
        }
    }
    Ok(Bson::Array(out))
}

fn exclude(doc: &Document, tree: &[(String, PNode)], vars: &Vars) -> CommandResult<Document> {
    let mut out = Document::new();
    for (k, v) in doc {
        match tree.iter().find(|(n, _)| n == k).map(|(_, n)| n) {
            Some(PNode::Exclude) => {}
            Some(PNode::Sub(children)) => {
                let nv = match v {
                    Bson::Document(d) => Bson::Document(exclude(d, children, vars)?),
                    Bson::Array(a) => exclude_array(a, children, vars)?,
                    other => other.clone(),
                };
                out.insert(k.clone(), nv);
            }
            Some(PNode::Slice(skip, limit)) => {
                out.insert(k.clone(), slice_value(v, *skip, *limit));
            }
            Some(PNode::ElemMatch(f)) => {
                if let Some(first) = first_elem_match(v, f, vars)? {
                    out.insert(k.clone(), first);
                }
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(out)
}

fn exclude_array(a: &[Bson], tree: &[(String, PNode)], vars: &Vars) -> CommandResult<Bson> {
    let mut out = Vec::with_capacity(a.len());
    for el in a {
        out.push(match el {
            Bson::Document(d) => Bson::Document(exclude(d, tree, vars)?),
            Bson::Array(inner) => exclude_array(inner, tree, vars)?,
            other => other.clone(),
        });
    }
    Ok(Bson::Array(out))
}

/// Applies a find/findAndModify `projection`/`fields` document to `doc`.
pub fn project(doc: &Document, projection: &Document, vars: &Vars) -> CommandResult<Document> {
    project_matched(doc, projection, &Document::new(), vars)
}

/// Applies a find projection to a document `query` matched: the positional projection
/// `{"a.$": 1}` keeps the first element of the array `a` that satisfies `query`'s conditions on
/// `a` (see `update::query_matched_index`).
pub fn project_matched(
    doc: &Document,
    projection: &Document,
    query: &Document,
    vars: &Vars,
) -> CommandResult<Document> {
    if projection.is_empty() {
        return Ok(doc.clone());
    }
    let Some((array_path, spec)) = positional_spec(projection)? else {
        return Projection::parse_find(projection)?.apply(doc, vars);
    };
    let projection = Projection::parse_find(&spec)?;
    let parts: Vec<&str> = array_path.split('.').collect();
    let Some(Bson::Array(arr)) = value_through_documents(doc, &parts) else {
        // Not an array (or reached through one): projected as an inclusion of the path.
        return projection.apply(doc, vars);
    };
    let i = super::update::query_matched_index(query, &array_path, arr, vars)?
        .ok_or_else(|| {
            loc(
                51246,
                "Executor error during find command :: caused by :: positional operator '.$' couldn't find a matching element in the array",
            )
        })?;
    let mut doc = doc.clone();
    let element = arr.get(i).cloned().unwrap_or(Bson::Null);
    super::path::set_agg_path(&mut doc, &parts, Bson::Array(vec![element]));
    projection.apply(&doc, vars)
}

/// A projection's positional field (`"a.b.$"`), checked as mongod checks it, with the
/// projection that includes `a.b` instead; `None` when there is none.
fn positional_spec(projection: &Document) -> CommandResult<Option<(String, Document)>> {
    let mut found: Option<String> = None;
    let mut spec = Document::new();
    for (k, v) in projection {
        let parts: Vec<&str> = k.split('.').collect();
        let Some(at) = parts.iter().position(|p| *p == "$") else {
            spec.insert(k.clone(), v.clone());
            continue;
        };
        if at + 1 != parts.len() {
            return Err(loc(
                31394,
                "As of 4.4, it's illegal to specify positional operator in the middle of a path.Positional projection may only be used at the end, for example: a.b.$. If the query previously used a form like a.b.$.d, remove the parts following the '$' and the results will be equivalent.",
            ));
        }
        if at == 0 {
            return Err(loc(
                16410,
                format!("FieldPath field names may not start with '$'. ({k})"),
            ));
        }
        if found.is_some() {
            return Err(loc(
                31276,
                "Cannot specify more than one positional projection per query.",
            ));
        }
        let on = matches!(
            v,
            Bson::Boolean(_)
                | Bson::Int32(_)
                | Bson::Int64(_)
                | Bson::Double(_)
                | Bson::Decimal128(_)
        ) && expr::truthy(Some(v));
        if !on {
            return Err(loc(
                31395,
                format!("Cannot use a positional projection ({k}) other than as an inclusion"),
            ));
        }
        let path = parts[..at].join(".");
        spec.insert(path.clone(), 1);
        found = Some(path);
    }
    Ok(found.map(|path| (path, spec)))
}

/// The value at `parts`, reached through documents only.
fn value_through_documents<'a>(doc: &'a Document, parts: &[&str]) -> Option<&'a Bson> {
    let (first, rest) = parts.split_first()?;
    let mut cur = doc.get(*first)?;
    for p in rest {
        cur = match cur {
            Bson::Document(d) => d.get(*p)?,
            _ => return None,
        };
    }
    Some(cur)
}

#[cfg(test)]
#[path = "projection_tests.rs"]
mod tests;
