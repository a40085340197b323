//! Projections: find/findAndModify `projection`/`fields`, and the `$project`/`$unset` stages.
//!
//! Inclusion (`{a: 1}`), exclusion (`{a: 0}`), `_id` included unless excluded, dotted and nested
//! paths (through arrays), computed fields (aggregation expressions, 4.4+), and in find
//! projections `$slice` (`n` or `[skip, limit]`) and `$elemMatch` (which joins either kind of
//! projection, and alone includes). Mixing inclusion and exclusion is refused (codes
//! 31253/31254), as mongod. The positional projection `a.$` (find and findAndModify) keeps the
//! element at the position the query's match recorded (see
//! [`super::matcher::Filter::matched_array_position`]). `$meta` is refused.
//!
//! As mongod 4.4+ (`src/mongo/db/exec/projection_executor_builder.cpp`), `$slice` and `a.$`
//! are applied after the inclusion/exclusion/computed part, in the order they are written, to
//! its result: in an inclusion projection their paths are included, and `$slice` on `a.b`
//! walks every document of an array `a` but leaves other elements (nested arrays too) as they
//! are (`projection_executor_utils.cpp`).

use bson::{Bson, Document};

use super::expr::{self, Vars};
use super::matcher::{ElementCondition, Filter};
use super::path::set_agg_path;
use crate::error::{CommandError, CommandResult};

/// A parsed projection.
#[derive(Debug, Clone)]
pub struct Projection {
    inclusion: bool,
    include_id: bool,
    tree: Vec<(String, PNode)>,
    computed: Vec<(Vec<String>, Bson)>,
    finals: Vec<Final>,
}

/// A find-only projection applied to the result of the rest of the projection.
#[derive(Debug, Clone)]
enum Final {
    Slice(Vec<String>, Option<i64>, i64),
    Positional(Vec<String>),
}

#[derive(Debug, Clone)]
enum PNode {
    Include,
    Exclude,
    Sub(Vec<(String, PNode)>),
    Computed,
    /// A `$slice` path: included in an inclusion projection, sliced afterwards.
    Slice,
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
        let mut finals = Vec::new();
        let mut modes = Modes::default();
        let mut id_setting: Option<bool> = None;
        if kind == Kind::Find {
            check_positional(spec)?;
        }
        parse_level(
            spec,
            &[],
            kind,
            &mut Parsed {
                tree: &mut tree,
                computed: &mut computed,
                finals: &mut finals,
                modes: &mut modes,
                id_setting: &mut id_setting,
            },
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
            finals,
        })
    }

    /// Applies the projection to a document.
    pub fn apply(&self, doc: &Document, vars: &Vars) -> CommandResult<Document> {
        self.apply_matched(doc, None, vars)
    }

    /// Applies the projection to a document `filter` matched (the positional projection takes
    /// its position from that match; without a filter it finds none).
    pub fn apply_matched(
        &self,
        doc: &Document,
        filter: Option<&Filter>,
        vars: &Vars,
    ) -> CommandResult<Document> {
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
        for f in &self.finals {
            match f {
                Final::Slice(parts, skip, limit) => slice_path(&mut out, parts, *skip, *limit),
                Final::Positional(parts) => out = positional(doc, out, parts, filter, vars)?,
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

fn check_path(path: &str, kind: Kind) -> CommandResult<Vec<String>> {
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(loc(
            40352,
            format!("FieldPath cannot be constructed with empty string or a path containing empty components: '{path}'"),
        ));
    }
    let parts: Vec<String> = path.split('.').map(str::to_string).collect();
    for (i, p) in parts.iter().enumerate() {
        if p == "$" && kind == Kind::Find && i + 1 == parts.len() && i > 0 {
            // A positional projection, checked by `check_positional`.
            continue;
        }
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

/// What parsing collects.
struct Parsed<'a> {
    tree: &'a mut Vec<(String, PNode)>,
    computed: &'a mut Vec<(Vec<String>, Bson)>,
    finals: &'a mut Vec<Final>,
    modes: &'a mut Modes,
    id_setting: &'a mut Option<bool>,
}

fn parse_level(
    spec: &Document,
    prefix: &[String],
    kind: Kind,
    st: &mut Parsed<'_>,
) -> CommandResult<()> {
    for (k, v) in spec {
        let mut parts = prefix.to_vec();
        parts.extend(check_path(k, kind)?);
        if parts.last().is_some_and(|p| p == "$") {
            // `a.b.$`: includes `a.b`, then keeps the matched element (`check_positional`
            // refused every other form).
            parts.pop();
            if st.modes.elem_match {
                return Err(loc(
                    31256,
                    "Cannot specify positional operator and $elemMatch.",
                ));
            }
            let full = parts.join(".");
            st.modes.inclusion.get_or_insert(full.clone());
            if st.modes.exclusion.is_some() {
                return Err(loc(
                    31253,
                    format!("Cannot do inclusion on field {full} in exclusion projection"),
                ));
            }
            insert_node(st.tree, &parts, PNode::Include, &full)?;
            st.finals.push(Final::Positional(parts));
            continue;
        }
        let full = parts.join(".");
        let is_id = full == "_id";
        let (tree, computed, modes, id_setting) = (
            &mut *st.tree,
            &mut *st.computed,
            &mut *st.modes,
            &mut *st.id_setting,
        );
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
                        insert_node(tree, &parts, PNode::Slice, &full)?;
                        st.finals.push(Final::Slice(parts, skip, limit));
                        continue;
                    }
                }
                if kind == Kind::Find && op == "$elemMatch" && d.len() == 1 {
                    // The checks and their order of `projection_parser.cpp`.
                    let cond = match d.get("$elemMatch") {
                        Some(Bson::Document(c)) => c,
                        other => {
                            return Err(loc(
                                31274,
                                format!(
                                    "elemMatch: Invalid argument, object required, but got {}",
                                    other.map(super::compare::type_name).unwrap_or("missing")
                                ),
                            ))
                        }
                    };
                    if st.finals.iter().any(|f| matches!(f, Final::Positional(_))) {
                        return Err(loc(31255, "Cannot specify positional operator and $elemMatch."));
                    }
                    if parts.len() > 1 {
                        return Err(loc(31275, "Cannot use $elemMatch projection on a nested field."));
                    }
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
                parse_level(d, &parts, kind, st)?;
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
            PNode::Slice => {
                out.insert(k.clone(), v.clone());
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
/// `{"a.$": 1}` keeps the element at the position the match recorded (see
/// [`Filter::matched_array_position`]).
pub fn project_matched(
    doc: &Document,
    projection: &Document,
    query: &Document,
    vars: &Vars,
) -> CommandResult<Document> {
    if projection.is_empty() {
        return Ok(doc.clone());
    }
    let parsed = Projection::parse_find(projection)?;
    if !parsed
        .finals
        .iter()
        .any(|f| matches!(f, Final::Positional(_)))
    {
        return parsed.apply(doc, vars);
    }
    let filter = Filter::parse(query)?;
    parsed.apply_matched(doc, Some(&filter), vars)
}

/// Checks a find projection's positional fields (`"a.b.$"`) as mongod checks them
/// (`src/mongo/db/query/projection/projection_parser.cpp`).
fn check_positional(projection: &Document) -> CommandResult<()> {
    check_positional_level(projection, &mut false)
}

/// [`check_positional`] of one level of a projection (sub-projections are checked as well).
fn check_positional_level(projection: &Document, found: &mut bool) -> CommandResult<()> {
    for (k, v) in projection {
        let parts: Vec<&str> = k.split('.').collect();
        let Some(at) = parts.iter().position(|p| *p == "$") else {
            if let Bson::Document(sub) = v {
                if !sub.keys().next().is_some_and(|f| f.starts_with('$')) {
                    check_positional_level(sub, found)?;
                }
            }
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
        if *found {
            return Err(loc(
                31276,
                "Cannot specify more than one positional projection per query.",
            ));
        }
        // `parseElement`: a sub-object 31271, an exclusion 31395, any other literal 31308.
        match v {
            Bson::Document(_) => {
                return Err(loc(
                    31271,
                    "positional projection cannot be used with an expression or sub object",
                ))
            }
            Bson::Boolean(_)
            | Bson::Int32(_)
            | Bson::Int64(_)
            | Bson::Double(_)
            | Bson::Decimal128(_) => {
                if !expr::truthy(Some(v)) {
                    return Err(loc(
                        31395,
                        "positional projection cannot be used with exclusion",
                    ));
                }
            }
            _ => {
                return Err(loc(
                    31308,
                    "positional projection cannot be used with a literal",
                ))
            }
        }
        *found = true;
    }
    Ok(())
}

/// The positional projection of `path` on `projected` (the result of the rest of the
/// projection of `pre_image`), as mongod's `applyFindPositionalProjection`
/// (`src/mongo/db/exec/projection_executor_utils.cpp`): the first array along the path is
/// replaced by its element at the position the filter's match recorded on the pre-image;
/// without a recorded position that is error 51246, a position past its end 51247; a path
/// reaching no array leaves the document as it is.
fn positional(
    pre_image: &Document,
    mut projected: Document,
    path: &[String],
    filter: Option<&Filter>,
    vars: &Vars,
) -> CommandResult<Document> {
    let mut at: Option<(usize, Bson)> = None;
    {
        let mut sub = &projected;
        for (i, part) in path.iter().enumerate() {
            match sub.get(part) {
                Some(Bson::Array(arr)) => {
                    let key = match filter {
                        Some(f) => f.matched_array_position(pre_image, vars)?,
                        None => None,
                    };
                    let key = key.ok_or_else(|| {
                        loc(
                            51246,
                            "Executor error during find command :: caused by :: positional operator '.$' couldn't find a matching element in the array",
                        )
                    })?;
                    let el = arr.get(key).cloned().ok_or_else(|| {
                        loc(
                            51247,
                            "Executor error during find command :: caused by :: positional operator '.$' element mismatch",
                        )
                    })?;
                    at = Some((i, el));
                    break;
                }
                Some(Bson::Document(d)) => sub = d,
                // As mongod: anything else leaves the current document for the next part.
                _ => {}
            }
        }
    }
    if let Some((i, el)) = at {
        let refs: Vec<&str> = path[..=i].iter().map(String::as_str).collect();
        set_agg_path(&mut projected, &refs, Bson::Array(vec![el]));
    }
    Ok(projected)
}

/// `$slice` of the arrays at `path` in a projected document, as mongod's
/// `applyFindSliceProjection` (`src/mongo/db/exec/projection_executor_utils.cpp`): arrays on
/// the way have their documents walked and other elements kept; the array at the end is
/// sliced; anything else is left as it is.
fn slice_path(doc: &mut Document, path: &[String], skip: Option<i64>, limit: i64) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let Some(v) = doc.get_mut(first) else {
        return;
    };
    match v {
        Bson::Array(_) if rest.is_empty() => *v = slice_value(v, skip, limit),
        Bson::Array(a) => {
            for el in a.iter_mut() {
                if let Bson::Document(d) = el {
                    slice_path(d, rest, skip, limit);
                }
            }
        }
        Bson::Document(d) if !rest.is_empty() => slice_path(d, rest, skip, limit),
        _ => {}
    }
}

#[cfg(test)]
#[path = "projection_tests.rs"]
mod tests;
