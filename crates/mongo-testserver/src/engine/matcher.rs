//! Query filters (`find`, `update`, `delete`, `$match`, ...), parsed once and matched many times.
//!
//! Semantics follow MongoDB 7.0: dotted paths traverse arrays; a predicate on a path matches if
//! any value reached matches, and an array value also matches when one of its elements does
//! (except for `$size`, `$elemMatch`, `$exists` which look at the array itself); `$ne`, `$nin`,
//! `$not`, `$nor` and `$exists: false` are negations of the whole path predicate; comparisons
//! are type-bracketed (`{$gt: 5}` never matches a string) except against MinKey/MaxKey; equality
//! with `null` also matches a missing field.
//!
//! `$regex` and regular-expression values are supported by a small backtracking matcher
//! ([`super::regex`]) covering the common syntax; unsupported constructs are refused at parse
//! time with an error that names them.

use std::cmp::Ordering;

use bson::{Bson, Document};

use super::compare::{compare, is_number, type_name, type_number, type_rank, values_equal};
use super::expr::{self, Vars};
use super::num::Num;
use super::path::query_leaves;
use super::regex::Regex;
use crate::error::{CommandError, CommandResult};

/// A parsed, validated query filter.
#[derive(Debug, Clone)]
pub struct Filter {
    root: Node,
}

#[derive(Debug, Clone)]
enum Node {
    And(Vec<Node>),
    Or(Vec<Node>),
    Nor(Vec<Node>),
    Expr(Bson),
    Const(bool),
    Path { path: String, preds: Vec<Pred> },
}

#[derive(Debug, Clone)]
enum TypeSel {
    Number,
    Code(i32),
}

#[derive(Debug, Clone)]
enum Pred {
    Eq(Bson),
    Ne(Bson),
    Cmp(Ordering, bool, Bson),
    In(Vec<InItem>),
    Nin(Vec<InItem>),
    Exists(bool),
    Type(Vec<TypeSel>),
    Size(i64),
    ElemMatchValue(Vec<Pred>),
    ElemMatchDoc(Box<Node>),
    Regex(Box<Regex>),
    Not(Vec<Pred>),
    All(Vec<Pred>),
    Mod(i64, i64),
}

/// The index keys that can satisfy one predicate (see [`Filter::index_scans`]): a key equal to
/// the value (null: also undefined and missing), or the keys of the value's type below or
/// above it (inclusive when the flag is set), the type bracketing MongoDB applies to ranges.
#[derive(Debug, Clone)]
pub enum Probe {
    /// Keys equal to the value.
    Point(Bson),
    /// Keys of the value's type below it.
    Below(Bson, bool),
    /// Keys of the value's type above it.
    Above(Bson, bool),
}

/// Probes of the index on `path`.
#[derive(Debug, Clone)]
pub struct Scan {
    /// The indexed path.
    pub path: String,
    /// Their union holds every matching key.
    pub probes: Vec<Probe>,
}

fn scans(n: &Node, indexed: &dyn Fn(&str) -> bool) -> Vec<Vec<Scan>> {
    match n {
        Node::And(c) => c.iter().flat_map(|x| scans(x, indexed)).collect(),
        Node::Or(c) if !c.is_empty() => {
            let mut union = Vec::new();
            for x in c {
                match scans(x, indexed).into_iter().next() {
                    Some(way) => union.extend(way),
                    None => return Vec::new(),
                }
            }
            vec![union]
        }
        Node::Path { path, preds } if indexed(path) => preds
            .iter()
            .filter_map(probes)
            .map(|probes| {
                vec![Scan {
                    path: path.clone(),
                    probes,
                }]
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The probes covering every value `p` accepts; `None` when no probe can (arrays, regexes,
/// NaN, MinKey/MaxKey and every other operator).
fn probes(p: &Pred) -> Option<Vec<Probe>> {
    fn point(v: &Bson) -> Option<Probe> {
        let plain = !matches!(
            v,
            Bson::Array(_) | Bson::RegularExpression(_) | Bson::MinKey | Bson::MaxKey
        ) && !is_nan(v);
        plain.then(|| Probe::Point(v.clone()))
    }
    match p {
        Pred::Eq(v) => point(v).map(|p| vec![p]),
        Pred::In(items) => items
            .iter()
            .map(|i| match i {
                InItem::Value(v) => point(v),
                InItem::Regex(_) => None,
            })
            .collect(),
        Pred::Cmp(_, or_equal, Bson::Null) => Some(if *or_equal {
            vec![Probe::Point(Bson::Null)]
        } else {
            Vec::new()
        }),
        Pred::Cmp(dir, or_equal, v) => {
            point(v)?;
            Some(vec![match dir {
                Ordering::Less => Probe::Below(v.clone(), *or_equal),
                _ => Probe::Above(v.clone(), *or_equal),
            }])
        }
        _ => None,
    }
}

#[derive(Debug, Clone)]
enum InItem {
    Value(Bson),
    Regex(Box<Regex>),
}

fn bad(msg: impl Into<String>) -> CommandError {
    CommandError::bad_value(msg)
}

impl Filter {
    /// Parses and validates a query filter. Unknown `$` operators give code 2 BadValue
    /// `unknown operator: $foo` (top level: `unknown top level operator: $foo`), as mongod.
    pub fn parse(filter: &Document) -> CommandResult<Filter> {
        Ok(Filter {
            root: parse_doc(filter, true)?,
        })
    }

    /// A filter that matches every document.
    pub fn match_all() -> Filter {
        Filter {
            root: Node::And(Vec::new()),
        }
    }

    /// Does `doc` match? Errors only come from `$expr` evaluation.
    pub fn matches(&self, doc: &Document, vars: &Vars) -> CommandResult<bool> {
        match_node(&self.root, doc, vars)
    }

    /// The position mongod records while matching `doc` (its `MatchDetails` "elemMatchKey"),
    /// which the positional projection `a.$` uses: `doc` must match the filter. As mongod
    /// (`src/mongo/db/matcher/expression_path.h`, `path.cpp`, `expression_array.cpp`,
    /// `expression_tree.cpp`): the conjuncts are flattened and sorted as the query is
    /// normalized (by operator kind, then path: `matchExpressionComparator` in
    /// `src/mongo/db/matcher/expression.cpp`) and each one that matches a value reached through
    /// an array overwrites the position with the index in the outermost array traversed; an
    /// `$elemMatch` on an array records the index of its matching element; `$or`, `$nor`,
    /// negations and `$expr` record nothing. `None` when nothing recorded a position.
    pub fn matched_array_position(
        &self,
        doc: &Document,
        vars: &Vars,
    ) -> CommandResult<Option<usize>> {
        let mut key = None;
        if !record_position(&self.root, doc, vars, &mut key)? {
            return Ok(None);
        }
        Ok(key)
    }

    /// If the filter pins `_id` by plain equality (`{_id: v}`, `{_id: {$eq: v}}`, or inside a
    /// top-level `$and`), that value. The server may look the document up directly, but must
    /// still call [`Filter::matches`] on it (other conditions may apply). Numbers of different
    /// types are equal (`{_id: 1}` matches `_id: 1.0`): look up with [`super::compare::OrdBson`].
    pub fn id_equality(&self) -> Option<&Bson> {
        fn find(n: &Node) -> Option<&Bson> {
            match n {
                Node::Path { path, preds } if path == "_id" => preds.iter().find_map(|p| match p {
                    Pred::Eq(v) if !matches!(v, Bson::Array(_)) => Some(v),
                    _ => None,
                }),
                Node::And(children) => children.iter().find_map(find),
                _ => None,
            }
        }
        find(&self.root)
    }

    /// Ways to find, through probes of single-field indexes, a superset of the documents this
    /// filter matches: each entry is one way, a union of [`Scan`]s on paths for which
    /// `indexed` is true (one entry per indexable conjunct; an `$or` only when every branch is
    /// indexable). Empty when no index serves the filter. Every candidate must still be tested
    /// with [`Filter::matches`].
    pub fn index_scans(&self, indexed: &dyn Fn(&str) -> bool) -> Vec<Vec<Scan>> {
        scans(&self.root, indexed)
    }

    /// True if the filter uses `$expr` anywhere. mongod refuses `$expr` in the query of every
    /// upsert (code 224 QueryFeatureNotAllowed, checked when the command is parsed, even if a
    /// document matches); see [`Filter::check_upsert_allowed`]. Elsewhere `$expr` is allowed.
    pub fn uses_expr(&self) -> bool {
        self.uses_expr_inner()
    }

    /// The check mongod makes before an upsert (update or findAndModify with `upsert: true`,
    /// whether or not a document matches): a filter using `$expr` is refused with code 224
    /// QueryFeatureNotAllowed "$expr is not allowed in the query predicate for an upsert".
    pub fn check_upsert_allowed(&self) -> CommandResult<()> {
        if self.uses_expr() {
            return Err(CommandError::new(
                224,
                "QueryFeatureNotAllowed",
                "$expr is not allowed in the query predicate for an upsert",
            ));
        }
        Ok(())
    }

    fn uses_expr_inner(&self) -> bool {
        fn has(n: &Node) -> bool {
            match n {
                Node::Expr(_) => true,
                Node::And(c) | Node::Or(c) | Node::Nor(c) => c.iter().any(has),
                Node::Path { preds, .. } => preds.iter().any(pred_has),
                Node::Const(_) => false,
            }
        }
        fn pred_has(p: &Pred) -> bool {
            match p {
                Pred::ElemMatchDoc(n) => has(n),
                Pred::ElemMatchValue(ps) | Pred::Not(ps) | Pred::All(ps) => ps.iter().any(pred_has),
                _ => false,
            }
        }
        has(&self.root)
    }
}

fn parse_doc(filter: &Document, top: bool) -> CommandResult<Node> {
    let mut nodes = Vec::with_capacity(filter.len());
    for (k, v) in filter {
        if let Some(op) = k.strip_prefix('$') {
            nodes.push(parse_top_operator(op, k, v, top)?);
        } else {
            nodes.push(parse_path(k, v)?);
        }
    }
    Ok(if nodes.len() == 1 {
        nodes.pop().unwrap_or(Node::And(Vec::new()))
    } else {
        Node::And(nodes)
    })
}

fn parse_top_operator(op: &str, key: &str, v: &Bson, top: bool) -> CommandResult<Node> {
    match op {
        "and" | "or" | "nor" => {
            let arr = match v {
                Bson::Array(a) if !a.is_empty() => a,
                _ => return Err(bad(format!("{key} must be a nonempty array"))),
            };
            let mut children = Vec::with_capacity(arr.len());
            for el in arr {
                let d = el
                    .as_document()
                    .ok_or_else(|| bad(format!("{key} argument's entries must be objects")))?;
                children.push(parse_doc(d, false)?);
            }
            Ok(match op {
                "and" => Node::And(children),
                "or" => Node::Or(children),
                _ => Node::Nor(children),
            })
        }
        "expr" => {
            expr::validate(v)?;
            Ok(Node::Expr(v.clone()))
        }
        "comment" => Ok(Node::Const(true)),
        "alwaysTrue" | "alwaysFalse" => {
            if Num::from_bson(v).and_then(Num::as_i64_exact) != Some(1) {
                return Err(bad(format!("{key} must be an integer value of 1")));
            }
            Ok(Node::Const(op == "alwaysTrue"))
        }
        "where" | "text" | "jsonSchema" | "sampleRate" => {
            Err(bad(format!("{key} is not supported by mongo-testserver")))
        }
        _ => {
            let _ = top;
            Err(bad(format!("unknown top level operator: {key}. If you have a field name that starts with a '$' symbol, consider using $getField or $setField.")))
        }
    }
}

/// True if `d` is an operator document (`{$gt: 1}`) rather than a literal value.
fn is_operator_doc(d: &Document) -> bool {
    match d.keys().next() {
        Some(k) => k.starts_with('$') && !matches!(k.as_str(), "$ref" | "$id" | "$db"),
        None => false,
    }
}

fn parse_path(path: &str, v: &Bson) -> CommandResult<Node> {
    if path.is_empty() {
        return Err(bad("Empty field names in path are not allowed"));
    }
    let preds = parse_value_preds(v)?;
    Ok(Node::Path {
        path: path.to_string(),
        preds,
    })
}

fn parse_value_preds(v: &Bson) -> CommandResult<Vec<Pred>> {
    match v {
        Bson::Document(d) if is_operator_doc(d) => parse_operator_doc(d),
        Bson::RegularExpression(r) => Ok(vec![Pred::Regex(Box::new(Regex::from_bson(r)?))]),
        other => Ok(vec![Pred::Eq(other.clone())]),
    }
}

fn parse_in_list(op: &str, v: &Bson) -> CommandResult<Vec<InItem>> {
    let arr = v
        .as_array()
        .ok_or_else(|| bad(format!("{op} needs an array")))?;
    let mut out = Vec::with_capacity(arr.len());
    for el in arr {
        match el {
            Bson::RegularExpression(r) => out.push(InItem::Regex(Box::new(Regex::from_bson(r)?))),
            Bson::Document(d) if is_operator_doc(d) => {
                return Err(bad(format!("cannot nest $ under {op}")))
            }
            other => out.push(InItem::Value(other.clone())),
        }
    }
    Ok(out)
}

fn parse_operator_doc(d: &Document) -> CommandResult<Vec<Pred>> {
    let mut preds = Vec::with_capacity(d.len());
    let regex_opts = d.get("$options");
    let mut saw_regex = false;
    for (k, v) in d {
        let pred = match k.as_str() {
            "$eq" => Pred::Eq(v.clone()),
            "$ne" => Pred::Ne(v.clone()),
            "$gt" => Pred::Cmp(Ordering::Greater, false, v.clone()),
            "$gte" => Pred::Cmp(Ordering::Greater, true, v.clone()),
            "$lt" => Pred::Cmp(Ordering::Less, false, v.clone()),
            "$lte" => Pred::Cmp(Ordering::Less, true, v.clone()),
            "$in" => Pred::In(parse_in_list("$in", v)?),
            "$nin" => Pred::Nin(parse_in_list("$nin", v)?),
            "$exists" => Pred::Exists(expr::truthy(Some(v))),
            "$type" => Pred::Type(parse_types(v)?),
            "$size" => {
                let n = Num::from_bson(v).ok_or_else(|| bad("$size needs a number"))?;
                let i = n
                    .as_i64_exact()
                    .ok_or_else(|| bad("$size must be a whole number"))?;
                if i < 0 {
                    return Err(bad("$size may not be negative"));
                }
                Pred::Size(i)
            }
            "$elemMatch" => {
                let sub = v
                    .as_document()
                    .ok_or_else(|| bad("$elemMatch needs an Object"))?;
                let value_form = sub.keys().next().is_some_and(|k| {
                    k.starts_with('$')
                        && !matches!(
                            k.as_str(),
                            "$and" | "$or" | "$nor" | "$expr" | "$where" | "$comment"
                        )
                });
                if value_form {
                    Pred::ElemMatchValue(parse_operator_doc(sub)?)
                } else {
                    Pred::ElemMatchDoc(Box::new(parse_doc(sub, false)?))
                }
            }
            "$not" => match v {
                Bson::RegularExpression(r) => {
                    Pred::Not(vec![Pred::Regex(Box::new(Regex::from_bson(r)?))])
                }
                Bson::Document(sub) => {
                    if sub.is_empty() {
                        return Err(bad("$not cannot be empty"));
                    }
                    if !is_operator_doc(sub) {
                        return Err(bad(format!(
                            "unknown operator: {}",
                            sub.keys().next().map(String::as_str).unwrap_or("")
                        )));
                    }
                    Pred::Not(parse_operator_doc(sub)?)
                }
                _ => return Err(bad("$not needs a regex or a document")),
            },
            "$all" => {
                let arr = v.as_array().ok_or_else(|| bad("$all needs an array"))?;
                let mut items = Vec::with_capacity(arr.len());
                for el in arr {
                    match el {
                        Bson::Document(sd)
                            if sd.keys().next().is_some_and(|k| k == "$elemMatch") =>
                        {
                            items.extend(parse_operator_doc(sd)?);
                        }
                        Bson::Document(sd) if is_operator_doc(sd) => {
                            return Err(bad("no $ expressions in $all"))
                        }
                        Bson::RegularExpression(r) => {
                            items.push(Pred::Regex(Box::new(Regex::from_bson(r)?)))
                        }
                        other => items.push(Pred::Eq(other.clone())),
                    }
                }
                Pred::All(items)
            }
            "$mod" => {
                let arr = v
                    .as_array()
                    .ok_or_else(|| bad("malformed mod, needs to be an array"))?;
                if arr.len() != 2 {
                    return Err(bad(if arr.len() < 2 {
                        "malformed mod, not enough elements"
                    } else {
                        "malformed mod, too many elements"
                    }));
                }
                let get = |x: &Bson, what: &str| -> CommandResult<i64> {
                    let n = Num::from_bson(x)
                        .ok_or_else(|| bad(format!("malformed mod, {what} not a number")))?;
                    let f = n.as_f64();
                    if !f.is_finite() {
                        return Err(bad(format!(
                            "malformed mod, {what} value is invalid :: caused by :: {f}"
                        )));
                    }
                    Ok(n.as_i64_exact().unwrap_or(f.trunc() as i64))
                };
                let div = get(&arr[0], "divisor")?;
                let rem = get(&arr[1], "remainder")?;
                if div == 0 {
                    return Err(bad("divisor cannot be 0"));
                }
                Pred::Mod(div, rem)
            }
            "$regex" => {
                saw_regex = true;
                let opts = match regex_opts {
                    None => None,
                    Some(Bson::String(s)) => Some(s.as_str()),
                    Some(_) => return Err(bad("$options has to be a string")),
                };
                let re = match v {
                    Bson::String(p) => Regex::new(p, opts.unwrap_or(""))?,
                    Bson::RegularExpression(r) => {
                        if opts.is_some() && !r.options.is_empty() {
                            return Err(bad("options set in both $regex and $options"));
                        }
                        Regex::new(&r.pattern, opts.unwrap_or(&r.options))?
                    }
                    _ => return Err(bad("$regex has to be a string")),
                };
                Pred::Regex(Box::new(re))
            }
            "$options" => continue,
            "$bitsAllSet" | "$bitsAllClear" | "$bitsAnySet" | "$bitsAnyClear" | "$geoWithin"
            | "$geoIntersects" | "$near" | "$nearSphere" | "$within" | "$jsonSchema" => {
                return Err(bad(format!("{k} is not supported by mongo-testserver")))
            }
            other => return Err(bad(format!("unknown operator: {other}"))),
        };
        preds.push(pred);
    }
    if regex_opts.is_some() && !saw_regex {
        return Err(bad("$options needs a $regex"));
    }
    Ok(preds)
}

fn type_alias(name: &str) -> Option<TypeSel> {
    let code = match name {
        "number" => return Some(TypeSel::Number),
        "double" => 1,
        "string" => 2,
        "object" => 3,
        "array" => 4,
        "binData" => 5,
        "undefined" => 6,
        "objectId" => 7,
        "bool" => 8,
        "date" => 9,
        "null" => 10,
        "regex" => 11,
        "dbPointer" => 12,
        "javascript" => 13,
        "symbol" => 14,
        "javascriptWithScope" => 15,
        "int" => 16,
        "timestamp" => 17,
        "long" => 18,
        "decimal" => 19,
        "minKey" => -1,
        "maxKey" => 127,
        _ => return None,
    };
    Some(TypeSel::Code(code))
}

fn parse_type(v: &Bson) -> CommandResult<TypeSel> {
    match v {
        Bson::String(s) => {
            type_alias(s).ok_or_else(|| bad(format!("Unknown type name alias: {s}")))
        }
        other => {
            let n = Num::from_bson(other)
                .ok_or_else(|| bad("type must be represented as a number or a string"))?;
            let code = n
                .as_i64_exact()
                .and_then(|c| i32::try_from(c).ok())
                .ok_or_else(|| bad(format!("Invalid numerical type code: {}", n.as_f64())))?;
            if !((1..=19).contains(&code) || code == -1 || code == 127) {
                return Err(bad(format!("Invalid numerical type code: {code}")));
            }
            Ok(TypeSel::Code(code))
        }
    }
}

fn parse_types(v: &Bson) -> CommandResult<Vec<TypeSel>> {
    match v {
        Bson::Array(a) => a.iter().map(parse_type).collect(),
        other => Ok(vec![parse_type(other)?]),
    }
}

fn match_node(n: &Node, doc: &Document, vars: &Vars) -> CommandResult<bool> {
    match n {
        Node::And(c) => {
            for x in c {
                if !match_node(x, doc, vars)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Node::Or(c) => {
            for x in c {
                if match_node(x, doc, vars)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Node::Nor(c) => {
            for x in c {
                if match_node(x, doc, vars)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Node::Const(b) => Ok(*b),
        Node::Expr(e) => expr::evaluate_truthy(e, doc, vars),
        Node::Path { path, preds } => {
            let leaves = query_leaves(doc, path);
            for p in preds {
                if !path_pred(p, &leaves, vars)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

/// One conjunct of a normalized `$and`: a node, or one operator on a path.
enum Conjunct<'a> {
    Node(&'a Node),
    Pred(&'a str, &'a Pred),
}

/// Flattens `n` into the conjuncts of mongod's normalized `$and`: nested `$and`s, the
/// operators of one path (`{a: {$gt: 1, $lt: 5}}`), the items of `$all` and a one-clause `$or`
/// each become conjuncts.
fn flatten<'a>(n: &'a Node, out: &mut Vec<Conjunct<'a>>) {
    match n {
        Node::And(c) => c.iter().for_each(|x| flatten(x, out)),
        Node::Or(c) if c.len() == 1 => flatten(&c[0], out),
        Node::Path { path, preds } => {
            for p in preds {
                match p {
                    Pred::All(items) if !items.is_empty() => {
                        out.extend(items.iter().map(|q| Conjunct::Pred(path, q)))
                    }
                    other => out.push(Conjunct::Pred(path, other)),
                }
            }
        }
        other => out.push(Conjunct::Node(other)),
    }
}

/// The sort key of a conjunct: the rank of its mongod `MatchExpression::MatchType` (as
/// declared in `src/mongo/db/matcher/expression.h`, after the optimizations that turn a
/// one-value `$in` into `$eq` or a regex) and its path.
fn conjunct_rank<'a>(c: &Conjunct<'a>) -> (u8, &'a str) {
    match c {
        Conjunct::Node(n) => match n {
            Node::And(_) => (0, ""),
            Node::Or(_) => (1, ""),
            Node::Nor(_) => (20, ""),
            Node::Expr(_) => (24, ""),
            Node::Const(false) => (25, ""),
            Node::Const(true) => (26, ""),
            Node::Path { path, .. } => (5, path.as_str()),
        },
        Conjunct::Pred(path, p) => {
            let rank = match p {
                Pred::ElemMatchDoc(_) => 2,
                Pred::ElemMatchValue(_) => 3,
                Pred::Size(_) => 4,
                Pred::Eq(_) => 5,
                Pred::Cmp(Ordering::Less, true, _) => 6,
                Pred::Cmp(Ordering::Less, _, _) => 7,
                Pred::Cmp(_, false, _) => 8,
                Pred::Cmp(_, true, _) => 9,
                Pred::Regex(_) => 10,
                Pred::Mod(..) => 11,
                Pred::Exists(true) => 12,
                Pred::In(items) => match items.as_slice() {
                    [InItem::Value(_)] => 5,
                    [InItem::Regex(_)] => 10,
                    _ => 13,
                },
                Pred::Ne(_) | Pred::Nin(_) | Pred::Exists(false) | Pred::Not(_) => 19,
                Pred::Type(_) => 21,
                Pred::All(_) => 0,
            };
            (rank, path)
        }
    }
}

/// Matches `n` as mongod does with an elemMatchKey requested, updating `key` (see
/// [`Filter::matched_array_position`]).
fn record_position(
    n: &Node,
    doc: &Document,
    vars: &Vars,
    key: &mut Option<usize>,
) -> CommandResult<bool> {
    let mut conjuncts = Vec::new();
    flatten(n, &mut conjuncts);
    conjuncts.sort_by(|a, b| conjunct_rank(a).cmp(&conjunct_rank(b)));
    for c in &conjuncts {
        let matched = match c {
            // `$or`/`$nor`/`$expr` children are matched without details in mongod.
            Conjunct::Node(n) => match_node(n, doc, vars)?,
            Conjunct::Pred(path, p) => record_pred(path, p, doc, vars, key)?,
        };
        if !matched {
            // As `AndMatchExpression::matches`: a failed conjunct clears the details.
            *key = None;
            return Ok(false);
        }
    }
    Ok(true)
}

/// Matches one operator on `path`, recording the position as mongod's `PathMatchExpression`.
fn record_pred(
    path: &str,
    p: &Pred,
    doc: &Document,
    vars: &Vars,
    key: &mut Option<usize>,
) -> CommandResult<bool> {
    match p {
        // Negations (`NotMatchExpression`, `$nor`) match their child without details.
        Pred::Ne(_) | Pred::Nin(_) | Pred::Exists(false) | Pred::Not(_) | Pred::All(_) => {
            return path_pred(p, &query_leaves(doc, path), vars);
        }
        Pred::Size(_) | Pred::ElemMatchValue(_) | Pred::ElemMatchDoc(_) => {
            // Array operators look at the array itself (no leaf traversal).
            for (v, offset) in leaves_with_offsets(doc, path, false) {
                let Some(Bson::Array(arr)) = v else {
                    continue;
                };
                let inner = match p {
                    Pred::Size(n) => {
                        if arr.len() as i64 != *n {
                            continue;
                        }
                        None
                    }
                    _ => match elem_match_index(p, arr, vars)? {
                        Some(i) => Some(i),
                        None => continue,
                    },
                };
                // `matchesArray` records the element's index, then the path iterator's
                // outer array offset (when there is one) overwrites it.
                if let Some(o) = offset.or(inner) {
                    *key = Some(o);
                }
                return Ok(true);
            }
        }
        _ => {
            for (v, offset) in leaves_with_offsets(doc, path, true) {
                if single(p, v, vars)? {
                    if let Some(o) = offset {
                        *key = Some(o);
                    }
                    return Ok(true);
                }
            }
        }
    }
    // Where this walk and `query_leaves` differ (an empty array on the path), the plain
    // answer stands, recording nothing.
    path_pred(p, &query_leaves(doc, path), vars)
}

/// The values `path` reaches in `doc`, in the order of mongod's `BSONElementIterator`
/// (`src/mongo/db/matcher/path.cpp`), each with its array offset: the index in the outermost
/// array traversed implicitly (`None` when none was). With `expand_leaf`, the elements of an
/// array at the end of the path come before the array itself.
fn leaves_with_offsets<'a>(
    doc: &'a Document,
    path: &str,
    expand_leaf: bool,
) -> Vec<(Option<&'a Bson>, Option<usize>)> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = Vec::new();
    offsets_in_doc(doc, &parts, None, expand_leaf, &mut out);
    if out.is_empty() {
        out.push((None, None));
    }
    out
}

fn offsets_in_doc<'a>(
    doc: &'a Document,
    parts: &[&str],
    outer: Option<usize>,
    expand: bool,
    out: &mut Vec<(Option<&'a Bson>, Option<usize>)>,
) {
    match doc.get(parts[0]) {
        Some(v) => offsets_in_value(v, &parts[1..], outer, expand, out),
        None => out.push((None, outer)),
    }
}

fn offsets_in_value<'a>(
    v: &'a Bson,
    rest: &[&str],
    outer: Option<usize>,
    expand: bool,
    out: &mut Vec<(Option<&'a Bson>, Option<usize>)>,
) {
    if rest.is_empty() {
        if let (true, Bson::Array(a)) = (expand, v) {
            out.extend(
                a.iter()
                    .enumerate()
                    .map(|(i, el)| (Some(el), outer.or(Some(i)))),
            );
        }
        out.push((Some(v), outer));
        return;
    }
    match v {
        Bson::Document(d) => offsets_in_doc(d, rest, outer, expand, out),
        Bson::Array(a) => {
            let index = super::path::array_index(rest[0]);
            for (i, el) in a.iter().enumerate() {
                if let Bson::Document(d) = el {
                    offsets_in_doc(d, rest, outer.or(Some(i)), expand, out);
                }
                if index != Some(i) {
                    continue;
                }
                // An explicit index ("a.0") is no implicit traversal: no offset of its own.
                if rest.len() == 1 {
                    out.push((Some(el), outer));
                } else {
                    match el {
                        Bson::Document(d) => offsets_in_doc(d, &rest[1..], outer, expand, out),
                        Bson::Array(_) => offsets_in_value(el, &rest[1..], outer, expand, out),
                        _ => {}
                    }
                }
            }
        }
        _ => out.push((None, outer)),
    }
}

/// The index of the first element of `arr` an `$elemMatch` predicate accepts.
fn elem_match_index(p: &Pred, arr: &[Bson], vars: &Vars) -> CommandResult<Option<usize>> {
    for (i, el) in arr.iter().enumerate() {
        let hit = match p {
            Pred::ElemMatchValue(preds) => {
                let mut all = true;
                for q in preds {
                    if !elem_value(q, el, vars)? {
                        all = false;
                        break;
                    }
                }
                all
            }
            // As mongod: an element that is an array is matched as a document keyed by
            // position.
            Pred::ElemMatchDoc(node) => match el {
                Bson::Document(d) => match_node(node, d, vars)?,
                Bson::Array(a) => match_node(node, &array_as_document(a), vars)?,
                _ => false,
            },
            _ => false,
        };
        if hit {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// Evaluates a predicate over all values a path reaches.
fn path_pred(p: &Pred, leaves: &[Option<&Bson>], vars: &Vars) -> CommandResult<bool> {
    match p {
        Pred::Ne(v) => Ok(!path_pred(&Pred::Eq(v.clone()), leaves, vars)?),
        Pred::Nin(items) => Ok(!any_leaf(leaves, |x| in_single(items, x))?),
        Pred::Exists(false) => Ok(!leaves.iter().any(Option::is_some)),
        Pred::Not(inner) => {
            for q in inner {
                if !path_pred(q, leaves, vars)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Pred::All(items) => {
            if items.is_empty() {
                return Ok(false);
            }
            for q in items {
                if !path_pred(q, leaves, vars)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Pred::Exists(true) => Ok(leaves.iter().any(Option::is_some)),
        Pred::Size(_) | Pred::ElemMatchValue(_) | Pred::ElemMatchDoc(_) => {
            for leaf in leaves.iter().flatten() {
                if single(p, Some(leaf), vars)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        _ => {
            for leaf in leaves {
                if single(p, *leaf, vars)? {
                    return Ok(true);
                }
                if let Some(Bson::Array(arr)) = leaf {
                    for el in arr {
                        if single(p, Some(el), vars)? {
                            return Ok(true);
                        }
                    }
                }
            }
            Ok(false)
        }
    }
}

fn any_leaf(
    leaves: &[Option<&Bson>],
    f: impl Fn(Option<&Bson>) -> CommandResult<bool>,
) -> CommandResult<bool> {
    for leaf in leaves {
        if f(*leaf)? {
            return Ok(true);
        }
        if let Some(Bson::Array(arr)) = leaf {
            for el in arr {
                if f(Some(el))? {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

fn eq_single(v: &Bson, x: Option<&Bson>) -> bool {
    match x {
        None => matches!(v, Bson::Null),
        Some(x) => {
            if matches!(v, Bson::Null) {
                return matches!(x, Bson::Null | Bson::Undefined);
            }
            type_rank(x) == type_rank(v) && values_equal(x, v)
        }
    }
}

fn in_single(items: &[InItem], x: Option<&Bson>) -> CommandResult<bool> {
    for it in items {
        let hit = match it {
            InItem::Value(v) => eq_single(v, x),
            InItem::Regex(r) => match x {
                Some(x) => r.matches_value(x)?,
                None => false,
            },
        };
        if hit {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Evaluates a predicate against one value (`None` = missing), without array expansion.
/// A double or decimal NaN.
fn is_nan(v: &Bson) -> bool {
    match v {
        Bson::Double(f) => f.is_nan(),
        // Decimal128 NaN: the combination field's top five bits are 11111.
        Bson::Decimal128(d) => d.bytes()[15] & 0x7C == 0x7C,
        _ => false,
    }
}

fn single(p: &Pred, x: Option<&Bson>, vars: &Vars) -> CommandResult<bool> {
    Ok(match p {
        Pred::Eq(v) => eq_single(v, x),
        Pred::Ne(v) => !eq_single(v, x),
        Pred::Cmp(dir, or_equal, v) => match x {
            None => *or_equal && matches!(v, Bson::Null),
            Some(x) => {
                let bracket_ok = matches!(v, Bson::MinKey | Bson::MaxKey)
                    || type_rank(x) == type_rank(v)
                    || (matches!(v, Bson::Null) && matches!(x, Bson::Undefined));
                if !bracket_ok {
                    false
                } else if is_nan(x) || is_nan(v) {
                    // Range comparisons never match NaN (nor anything against NaN); only the
                    // equality part of $gte/$lte matches NaN with NaN.
                    *or_equal && is_nan(x) && is_nan(v)
                } else {
                    let o = compare(x, v);
                    o == *dir || (*or_equal && o == Ordering::Equal)
                }
            }
        },
        Pred::In(items) => in_single(items, x)?,
        Pred::Nin(items) => !in_single(items, x)?,
        Pred::Exists(b) => x.is_some() == *b,
        Pred::Type(sels) => match x {
            None => false,
            Some(x) => sels.iter().any(|s| match s {
                TypeSel::Number => is_number(x),
                TypeSel::Code(c) => type_number(x) == *c,
            }),
        },
        Pred::Size(n) => matches!(x, Some(Bson::Array(a)) if a.len() as i64 == *n),
        Pred::ElemMatchValue(_) | Pred::ElemMatchDoc(_) => match x {
            Some(Bson::Array(arr)) => elem_match_index(p, arr, vars)?.is_some(),
            _ => false,
        },
        Pred::Regex(r) => match x {
            Some(x) => r.matches_value(x)?,
            None => false,
        },
        Pred::Not(inner) => {
            let mut all = true;
            for q in inner {
                if !single(q, x, vars)? {
                    all = false;
                    break;
                }
            }
            !all
        }
        Pred::All(items) => {
            let mut all = !items.is_empty();
            for q in items {
                if !single(q, x, vars)? {
                    all = false;
                    break;
                }
            }
            all
        }
        Pred::Mod(div, rem) => match x.and_then(Num::from_bson) {
            Some(n) => {
                let f = n.as_f64();
                if !f.is_finite() {
                    false
                } else {
                    let i = n.as_i64_exact().unwrap_or(f.trunc() as i64);
                    i.wrapping_rem(*div) == *rem
                }
            }
            None => false,
        },
    })
}

/// A value-form `$elemMatch` (or `$pull`) predicate on one element: the element itself is
/// tested, without looking into it when it is an array (as mongod's single-element matching).
fn elem_value(q: &Pred, el: &Bson, vars: &Vars) -> CommandResult<bool> {
    single(q, Some(el), vars)
}

/// Matches a `$pull` condition against one array element: operator documents apply to the
/// element as a value, plain documents are queries on document elements, other values are
/// equality.
#[derive(Debug, Clone)]
pub struct ElementCondition {
    kind: ElemCond,
}

#[derive(Debug, Clone)]
enum ElemCond {
    Value(Vec<Pred>),
    Doc(Node),
    Equal(Bson),
}

impl ElementCondition {
    /// Parses a `$pull` argument.
    pub fn parse(cond: &Bson) -> CommandResult<ElementCondition> {
        let kind = match cond {
            Bson::Document(d) => {
                let first = d.keys().next();
                let value_form = first.is_some_and(|k| {
                    k.starts_with('$')
                        && !matches!(k.as_str(), "$and" | "$or" | "$nor" | "$expr" | "$comment")
                });
                if value_form {
                    ElemCond::Value(parse_operator_doc(d)?)
                } else {
                    ElemCond::Doc(parse_doc(d, false)?)
                }
            }
            Bson::RegularExpression(r) => {
                ElemCond::Value(vec![Pred::Regex(Box::new(Regex::from_bson(r)?))])
            }
            other => ElemCond::Equal(other.clone()),
        };
        Ok(ElementCondition { kind })
    }

    /// Does the element match as `$pull` tests it? Operator conditions apply to the element
    /// as a query applies them to a field, reaching into an element that is itself an array
    /// (`{$pull: {a: {$gte: 6}}}` removes `[5, 6]`).
    pub fn matches_as_field(&self, el: &Bson, vars: &Vars) -> CommandResult<bool> {
        match &self.kind {
            ElemCond::Value(preds) => {
                for q in preds {
                    if !path_pred(q, &[Some(el)], vars)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            _ => self.matches(el, vars),
        }
    }

    /// Does the element match as `$elemMatch` tests it? Object conditions also apply to an
    /// element that is an array, as a document keyed by position (so `{}` matches it).
    pub fn matches_as_elem_match(&self, el: &Bson, vars: &Vars) -> CommandResult<bool> {
        match (&self.kind, el) {
            (ElemCond::Doc(node), Bson::Array(a)) => match_node(node, &array_as_document(a), vars),
            _ => self.matches(el, vars),
        }
    }

    /// Does the element match?
    pub fn matches(&self, el: &Bson, vars: &Vars) -> CommandResult<bool> {
        match &self.kind {
            ElemCond::Equal(v) => Ok(values_equal(v, el)),
            ElemCond::Doc(node) => match el {
                Bson::Document(d) => match_node(node, d, vars),
                _ => Ok(false),
            },
            ElemCond::Value(preds) => {
                for q in preds {
                    if !elem_value(q, el, vars)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        }
    }
}

/// An array as the document mongod sees it as: its elements under the keys "0", "1", ...
fn array_as_document(a: &[Bson]) -> Document {
    a.iter()
        .enumerate()
        .map(|(i, v)| (i.to_string(), v.clone()))
        .collect()
}

/// The equality conditions of a filter (plain values and `$eq`, through top-level `$and`), as
/// `(path, value)` pairs in filter order. Used to seed upserts.
pub fn equality_fields(filter: &Document) -> CommandResult<Vec<(String, Bson)>> {
    let mut out = Vec::new();
    collect_equalities(filter, &mut out)?;
    Ok(out)
}

fn collect_equalities(filter: &Document, out: &mut Vec<(String, Bson)>) -> CommandResult<()> {
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(items) = v {
                for it in items {
                    if let Bson::Document(d) = it {
                        collect_equalities(d, out)?;
                    }
                }
            }
            continue;
        }
        if k == "$or" || k == "$nor" {
            // A one-clause $or is the clause itself, as mongod treats it.
            if k == "$or" {
                if let Bson::Array(items) = v {
                    if let [Bson::Document(d)] = items.as_slice() {
                        collect_equalities(d, out)?;
                    }
                }
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Bson::Document(d) if is_operator_doc(d) => {
                if let Some(eq) = d.get("$eq") {
                    out.push((k.clone(), eq.clone()));
                } else if let Some(Bson::Array(items)) = d.get("$in") {
                    if let [single] = items.as_slice() {
                        if !matches!(single, Bson::RegularExpression(_)) {
                            out.push((k.clone(), single.clone()));
                        }
                    }
                }
            }
            Bson::RegularExpression(_) => {}
            other => out.push((k.clone(), other.clone())),
        }
    }
    Ok(())
}

/// The type name used in error messages.
pub fn describe_type(v: &Bson) -> &'static str {
    type_name(v)
}

#[cfg(test)]
#[path = "matcher_tests.rs"]
mod tests;
