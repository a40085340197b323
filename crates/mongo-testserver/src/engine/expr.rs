//! Aggregation expressions (`$expr`, pipeline updates, `$project`, `$addFields`, ...).
//!
//! Expressions are interpreted straight from their BSON form. A value is `Option<Bson>`: `None`
//! is "missing" (a field that does not exist, `$$REMOVE`), which differs from `null`: most
//! operators turn a missing argument into a `null` result, comparisons sort missing before null,
//! object literals and `$addFields` drop a field whose value is missing.

use std::cmp::Ordering;

use bson::{Bson, DateTime, Document, Timestamp};

use super::compare::{compare, compare_opt, type_name, values_equal};
use super::convert;
use super::date;
use super::num::{self, Num};
use super::path::expr_path;
use crate::error::{CommandError, CommandResult};

/// The evaluation context of one operation.
#[derive(Debug, Clone)]
pub struct Vars {
    /// `$$NOW`: one value for the whole operation (every document it touches sees the same).
    pub now: DateTime,
    /// `$$CLUSTER_TIME`, when the server runs as a replica set; `None` makes it an error to use.
    pub cluster_time: Option<Timestamp>,
    /// User variables from a command's `let` option (`$$name`).
    pub user: Document,
}

impl Vars {
    /// A context with `$$NOW` = `now`, no cluster time and no user variables.
    pub fn new(now: DateTime) -> Vars {
        Vars {
            now,
            cluster_time: None,
            user: Document::new(),
        }
    }

    /// Adds user variables (a command's `let` document, already evaluated to constants).
    pub fn with_let(mut self, vars: Document) -> Vars {
        self.user = vars;
        self
    }

    /// Sets `$$CLUSTER_TIME`.
    pub fn with_cluster_time(mut self, ts: Timestamp) -> Vars {
        self.cluster_time = Some(ts);
        self
    }
}

/// Evaluates an aggregation expression against `root` (`$$ROOT` and `$$CURRENT`).
/// `Ok(None)` means "missing".
pub fn evaluate(expr: &Bson, root: &Document, vars: &Vars) -> CommandResult<Option<Bson>> {
    let mut cx = Ctx {
        root,
        vars,
        locals: Vec::new(),
    };
    cx.eval(expr)
}

/// Evaluates an expression and reports whether the result is "true" as `$expr`, `$cond` and
/// `$and` see it: everything except `false`, `null`, missing, undefined and numeric zero.
pub fn evaluate_truthy(expr: &Bson, root: &Document, vars: &Vars) -> CommandResult<bool> {
    Ok(truthy(evaluate(expr, root, vars)?.as_ref()))
}

/// Truthiness of an expression value.
pub fn truthy(v: Option<&Bson>) -> bool {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) | Some(Bson::Boolean(false)) => false,
        Some(other) => match Num::from_bson(other) {
            Some(n) => !n.is_zero(),
            None => true,
        },
    }
}

fn is_nullish(v: Option<&Bson>) -> bool {
    matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined))
}

fn loc(code: i32, message: impl Into<String>) -> CommandError {
    CommandError::new(code, format!("Location{code}"), message)
}

fn value_desc(v: Option<&Bson>) -> &'static str {
    v.map(type_name).unwrap_or("missing")
}

/// Every expression operator this engine evaluates.
pub const OPERATORS: &[&str] = &[
    "$abs",
    "$add",
    "$allElementsTrue",
    "$and",
    "$anyElementTrue",
    "$arrayElemAt",
    "$arrayToObject",
    "$avg",
    "$ceil",
    "$cmp",
    "$concat",
    "$concatArrays",
    "$cond",
    "$convert",
    "$dateAdd",
    "$dateDiff",
    "$dateSubtract",
    "$dateToString",
    "$dayOfMonth",
    "$dayOfWeek",
    "$dayOfYear",
    "$divide",
    "$eq",
    "$filter",
    "$first",
    "$floor",
    "$getField",
    "$gt",
    "$gte",
    "$hour",
    "$ifNull",
    "$in",
    "$indexOfArray",
    "$isArray",
    "$isNumber",
    "$last",
    "$let",
    "$literal",
    "$lt",
    "$lte",
    "$map",
    "$max",
    "$mergeObjects",
    "$millisecond",
    "$min",
    "$minute",
    "$mod",
    "$month",
    "$multiply",
    "$ne",
    "$not",
    "$objectToArray",
    "$or",
    "$pow",
    "$range",
    "$reduce",
    "$reverseArray",
    "$second",
    "$setField",
    "$size",
    "$slice",
    "$sqrt",
    "$strLenBytes",
    "$strLenCP",
    "$subtract",
    "$sum",
    "$switch",
    "$toBool",
    "$toDate",
    "$toDecimal",
    "$toDouble",
    "$toInt",
    "$toLong",
    "$toLower",
    "$toObjectId",
    "$toString",
    "$toUpper",
    "$trunc",
    "$type",
    "$unsetField",
    "$year",
];

/// Checks an expression up front: every `$operator` is known and operator objects have exactly
/// one field. (Argument errors are reported when the expression is evaluated.)
pub fn validate(expr: &Bson) -> CommandResult<()> {
    match expr {
        Bson::Document(d) => {
            let first_is_op = d.keys().next().is_some_and(|k| k.starts_with('$'));
            if first_is_op {
                if d.len() != 1 {
                    return Err(loc(
                        15983,
                        format!(
                            "an expression specification must contain exactly one field, the name of the expression. Found {} fields in {}",
                            d.len(),
                            d
                        ),
                    ));
                }
                for (k, v) in d {
                    if !OPERATORS.contains(&k.as_str()) {
                        return Err(CommandError::unknown_expression(k));
                    }
                    if k == "$literal" {
                        return Ok(());
                    }
                    validate(v)?;
                }
            } else {
                for (k, v) in d {
                    check_field_name(k)?;
                    validate(v)?;
                }
            }
            Ok(())
        }
        Bson::Array(a) => a.iter().try_for_each(validate),
        Bson::String(s) if s.starts_with('$') => {
            if s == "$" || s == "$$" {
                return Err(loc(16872, format!("'{s}' is not a valid field path")));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_field_name(k: &str) -> CommandResult<()> {
    if k.starts_with('$') {
        return Err(loc(
            16410,
            format!("FieldPath field names may not start with '$'. Consider using $getField or $setField. ({k})"),
        ));
    }
    if k.contains('.') {
        return Err(loc(
            16412,
            format!("FieldPath field names may not contain '.'. ({k})"),
        ));
    }
    Ok(())
}

struct Ctx<'a> {
    root: &'a Document,
    vars: &'a Vars,
    locals: Vec<(String, Option<Bson>)>,
}

type R = CommandResult<Option<Bson>>;

fn arg_list(arg: &Bson) -> Vec<&Bson> {
    match arg {
        Bson::Array(a) => a.iter().collect(),
        other => vec![other],
    }
}

fn nargs_error(op: &str, want: &str, got: usize) -> CommandError {
    loc(
        16020,
        format!("Expression {op} takes exactly {want} arguments. {got} were passed in."),
    )
}

fn exact_args<'b>(op: &str, arg: &'b Bson, n: usize) -> CommandResult<Vec<&'b Bson>> {
    let a = arg_list(arg);
    if a.len() != n {
        return Err(nargs_error(op, &n.to_string(), a.len()));
    }
    Ok(a)
}

fn object_arg<'b>(op: &str, arg: &'b Bson, allowed: &[&str]) -> CommandResult<&'b Document> {
    let d = arg.as_document().ok_or_else(|| {
        CommandError::failed_to_parse(format!("{op} only supports an object as its argument"))
    })?;
    for k in d.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(CommandError::failed_to_parse(format!(
                "Unrecognized parameter to {op}: {k}"
            )));
        }
    }
    Ok(d)
}

fn required<'b>(op: &str, d: &'b Document, key: &str) -> CommandResult<&'b Bson> {
    d.get(key)
        .ok_or_else(|| CommandError::failed_to_parse(format!("Missing '{key}' parameter to {op}")))
}

fn var_name(op: &str, v: Option<&Bson>, default: &str) -> CommandResult<String> {
    match v {
        None => Ok(default.to_string()),
        Some(Bson::String(s)) if !s.is_empty() && !s.starts_with('$') => Ok(s.clone()),
        Some(other) => Err(CommandError::failed_to_parse(format!(
            "{op}: invalid variable name {other}"
        ))),
    }
}

fn date_ms(v: &Bson) -> Option<i64> {
    match v {
        Bson::DateTime(d) => Some(d.timestamp_millis()),
        Bson::Timestamp(t) => Some(i64::from(t.time) * 1000),
        Bson::ObjectId(_) => convert::to_date(v).ok().map(|d| d.timestamp_millis()),
        _ => None,
    }
}

impl Ctx<'_> {
    fn eval(&mut self, e: &Bson) -> R {
        match e {
            Bson::String(s) if s.starts_with("$$") => self.variable(&s[2..]),
            Bson::String(s) if s.starts_with('$') => {
                if s.len() == 1 {
                    return Err(loc(16872, "'$' is not a valid field path"));
                }
                Ok(super::path::expr_path_doc(self.root, &s[1..]))
            }
            Bson::Document(d) => {
                let first_is_op = d.keys().next().is_some_and(|k| k.starts_with('$'));
                if first_is_op {
                    if d.len() != 1 {
                        return Err(loc(
                            15983,
                            format!(
                                "an expression specification must contain exactly one field, the name of the expression. Found {} fields in {}",
                                d.len(),
                                d
                            ),
                        ));
                    }
                    let (op, arg) = d.iter().next().ok_or_else(|| loc(15983, "empty"))?;
                    self.op(op, arg)
                } else {
                    let mut out = Document::new();
                    for (k, v) in d {
                        check_field_name(k)?;
                        if let Some(val) = self.eval(v)? {
                            out.insert(k.clone(), val);
                        }
                    }
                    Ok(Some(Bson::Document(out)))
                }
            }
            Bson::Array(a) => {
                let mut out = Vec::with_capacity(a.len());
                for el in a {
                    out.push(self.eval(el)?.unwrap_or(Bson::Null));
                }
                Ok(Some(Bson::Array(out)))
            }
            other => Ok(Some(other.clone())),
        }
    }

    fn variable(&mut self, spec: &str) -> R {
        let mut parts = spec.split('.');
        let name = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        let base: Option<Bson> = match name {
            "NOW" => Some(Bson::DateTime(self.vars.now)),
            "ROOT" | "CURRENT" => Some(Bson::Document(self.root.clone())),
            "REMOVE" => None,
            "CLUSTER_TIME" => match self.vars.cluster_time {
                Some(t) => Some(Bson::Timestamp(t)),
                None => {
                    return Err(loc(
                        10071200,
                        "$$CLUSTER_TIME is unavailable in this deployment (standalone server)",
                    ))
                }
            },
            _ => {
                if let Some((_, v)) = self.locals.iter().rev().find(|(n, _)| n == name) {
                    v.clone()
                } else if let Some(v) = self.vars.user.get(name) {
                    Some(v.clone())
                } else {
                    return Err(loc(17276, format!("Use of undefined variable: {name}")));
                }
            }
        };
        if rest.is_empty() {
            return Ok(base);
        }
        // `$$ROOT.a.b` and `$$CURRENT.a.b` avoid cloning the whole root.
        if name == "ROOT" || name == "CURRENT" {
            return Ok(super::path::expr_path_doc(self.root, &rest.join(".")));
        }
        Ok(base.and_then(|b| expr_path(&b, &rest)))
    }

    fn with_local<T>(
        &mut self,
        name: &str,
        value: Option<Bson>,
        f: impl FnOnce(&mut Self) -> CommandResult<T>,
    ) -> CommandResult<T> {
        self.locals.push((name.to_string(), value));
        let r = f(self);
        self.locals.pop();
        r
    }

    fn eval_all(&mut self, arg: &Bson) -> CommandResult<Vec<Option<Bson>>> {
        arg_list(arg).into_iter().map(|a| self.eval(a)).collect()
    }

    fn eval_exact(&mut self, op: &str, arg: &Bson, n: usize) -> CommandResult<Vec<Option<Bson>>> {
        exact_args(op, arg, n)?
            .into_iter()
            .map(|a| self.eval(a))
            .collect()
    }

    fn eval_one(&mut self, op: &str, arg: &Bson) -> R {
        let mut v = self.eval_exact(op, arg, 1)?;
        Ok(v.pop().flatten())
    }

    fn op(&mut self, op: &str, arg: &Bson) -> R {
        match op {
            "$literal" => Ok(Some(arg.clone())),
            "$add" => self.add(arg),
            "$subtract" => self.subtract(arg),
            "$multiply" => self.multiply(arg),
            "$divide" => self.divide(arg),
            "$mod" => self.modulo(arg),
            "$abs" | "$floor" | "$ceil" | "$sqrt" | "$trunc" => self.unary_math(op, arg),
            "$pow" => self.pow(arg),
            "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" | "$cmp" => {
                let v = self.eval_exact(op, arg, 2)?;
                let o = compare_opt(v[0].as_ref(), v[1].as_ref());
                let b = match op {
                    "$eq" => o == Ordering::Equal,
                    "$ne" => o != Ordering::Equal,
                    "$gt" => o == Ordering::Greater,
                    "$gte" => o != Ordering::Less,
                    "$lt" => o == Ordering::Less,
                    "$lte" => o != Ordering::Greater,
                    _ => {
                        return Ok(Some(Bson::Int32(match o {
                            Ordering::Less => -1,
                            Ordering::Equal => 0,
                            Ordering::Greater => 1,
                        })))
                    }
                };
                Ok(Some(Bson::Boolean(b)))
            }
            "$and" => {
                for a in arg_list(arg) {
                    if !truthy(self.eval(a)?.as_ref()) {
                        return Ok(Some(Bson::Boolean(false)));
                    }
                }
                Ok(Some(Bson::Boolean(true)))
            }
            "$or" => {
                for a in arg_list(arg) {
                    if truthy(self.eval(a)?.as_ref()) {
                        return Ok(Some(Bson::Boolean(true)));
                    }
                }
                Ok(Some(Bson::Boolean(false)))
            }
            "$not" => {
                let v = self.eval_one(op, arg)?;
                Ok(Some(Bson::Boolean(!truthy(v.as_ref()))))
            }
            "$cond" => self.cond(arg),
            "$ifNull" => {
                let a = arg_list(arg);
                if a.len() < 2 {
                    return Err(loc(
                        1257300,
                        format!("$ifNull needs at least two arguments, had: {}", a.len()),
                    ));
                }
                let last = a.len() - 1;
                for (i, e) in a.iter().enumerate() {
                    let v = self.eval(e)?;
                    if i == last || !is_nullish(v.as_ref()) {
                        return Ok(v);
                    }
                }
                Ok(None)
            }
            "$switch" => self.switch(arg),
            "$let" => self.let_(arg),
            "$max" | "$min" => self.min_max(op, arg),
            "$sum" | "$avg" => self.sum_avg(op, arg),
            "$type" => {
                let v = self.eval_one(op, arg)?;
                Ok(Some(Bson::String(value_desc(v.as_ref()).to_string())))
            }
            "$isNumber" => {
                let v = self.eval_one(op, arg)?;
                Ok(Some(Bson::Boolean(
                    v.as_ref().is_some_and(|x| Num::from_bson(x).is_some()),
                )))
            }
            "$toLong" | "$toInt" | "$toDouble" | "$toDecimal" | "$toDate" | "$toString"
            | "$toBool" | "$toObjectId" => {
                let v = self.eval_one(op, arg)?;
                let Some(v) = v.filter(|x| !is_nullish(Some(x))) else {
                    return Ok(Some(Bson::Null));
                };
                let to = match op {
                    "$toLong" => "long",
                    "$toInt" => "int",
                    "$toDouble" => "double",
                    "$toDecimal" => "decimal",
                    "$toDate" => "date",
                    "$toString" => "string",
                    "$toBool" => "bool",
                    _ => "objectId",
                };
                convert::convert(&v, to).map(Some)
            }
            "$convert" => self.convert(arg),
            "$size" => {
                let v = self.eval_one(op, arg)?;
                match v {
                    Some(Bson::Array(a)) => Ok(Some(len_bson(a.len()))),
                    other => Err(loc(
                        17124,
                        format!(
                            "The argument to $size must be an array. Type of argument is: {}",
                            value_desc(other.as_ref())
                        ),
                    )),
                }
            }
            "$isArray" => {
                let v = self.eval_one(op, arg)?;
                Ok(Some(Bson::Boolean(matches!(v, Some(Bson::Array(_))))))
            }
            "$filter" => self.filter(arg),
            "$map" => self.map(arg),
            "$reduce" => self.reduce(arg),
            "$concatArrays" => {
                let mut out = Vec::new();
                for v in self.eval_all(arg)? {
                    match v {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {
                            return Ok(Some(Bson::Null))
                        }
                        Some(Bson::Array(a)) => out.extend(a),
                        Some(other) => {
                            return Err(loc(
                                28664,
                                format!(
                                    "$concatArrays only supports arrays, not {}",
                                    type_name(&other)
                                ),
                            ))
                        }
                    }
                }
                Ok(Some(Bson::Array(out)))
            }
            "$in" => {
                let v = self.eval_exact(op, arg, 2)?;
                match &v[1] {
                    Some(Bson::Array(a)) => {
                        let needle = v[0].clone().unwrap_or(Bson::Null);
                        let found = match &v[0] {
                            None => false,
                            Some(_) => a.iter().any(|x| values_equal(x, &needle)),
                        };
                        Ok(Some(Bson::Boolean(found)))
                    }
                    other => Err(loc(
                        40081,
                        format!(
                            "$in requires an array as a second argument, found: {}",
                            value_desc(other.as_ref())
                        ),
                    )),
                }
            }
            "$arrayElemAt" => {
                let v = self.eval_exact(op, arg, 2)?;
                if is_nullish(v[0].as_ref()) || is_nullish(v[1].as_ref()) {
                    return Ok(Some(Bson::Null));
                }
                let Some(Bson::Array(a)) = &v[0] else {
                    return Err(loc(
                        28689,
                        format!(
                            "$arrayElemAt's first argument must be an array, but is {}",
                            value_desc(v[0].as_ref())
                        ),
                    ));
                };
                let idx = self.int_arg("$arrayElemAt's second argument", v[1].as_ref(), 28690)?;
                Ok(index_from(a, idx).cloned())
            }
            "$first" | "$last" => {
                let v = self.eval_one(op, arg)?;
                match v {
                    None => Ok(None),
                    Some(Bson::Null) | Some(Bson::Undefined) => Ok(Some(Bson::Null)),
                    Some(Bson::Array(a)) => Ok(if op == "$first" {
                        a.first().cloned()
                    } else {
                        a.last().cloned()
                    }),
                    Some(other) => Err(loc(
                        28689,
                        format!(
                            "{op}'s argument must be an array, but is {}",
                            type_name(&other)
                        ),
                    )),
                }
            }
            "$slice" => self.slice(arg),
            "$reverseArray" => {
                let v = self.eval_one(op, arg)?;
                match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(Some(Bson::Null)),
                    Some(Bson::Array(mut a)) => {
                        a.reverse();
                        Ok(Some(Bson::Array(a)))
                    }
                    Some(other) => Err(loc(
                        34435,
                        format!(
                            "The argument to $reverseArray must be an array, but was of type: {}",
                            type_name(&other)
                        ),
                    )),
                }
            }
            "$range" => self.range(arg),
            "$indexOfArray" => self.index_of_array(arg),
            "$allElementsTrue" | "$anyElementTrue" => {
                let v = self.eval_one(op, arg)?;
                let Some(Bson::Array(a)) = v else {
                    return Err(loc(
                        if op == "$allElementsTrue" {
                            17040
                        } else {
                            17041
                        },
                        format!(
                            "{op}'s argument must be an array, but is {}",
                            value_desc(v.as_ref())
                        ),
                    ));
                };
                let b = if op == "$allElementsTrue" {
                    a.iter().all(|x| truthy(Some(x)))
                } else {
                    a.iter().any(|x| truthy(Some(x)))
                };
                Ok(Some(Bson::Boolean(b)))
            }
            "$mergeObjects" => {
                let mut out = Document::new();
                for (i, v) in self.eval_all(arg)?.into_iter().enumerate() {
                    match v {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {}
                        Some(Bson::Document(d)) => {
                            for (k, x) in d {
                                out.insert(k, x);
                            }
                        }
                        Some(other) => {
                            return Err(loc(
                                40400,
                                format!(
                                "$mergeObjects requires object inputs, but input {} is of type {}",
                                i,
                                type_name(&other)
                            ),
                            ))
                        }
                    }
                }
                Ok(Some(Bson::Document(out)))
            }
            "$objectToArray" => {
                let v = self.eval_one(op, arg)?;
                match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(Some(Bson::Null)),
                    Some(Bson::Document(d)) => Ok(Some(Bson::Array(
                        d.into_iter()
                            .map(|(k, v)| {
                                let mut e = Document::new();
                                e.insert("k", k);
                                e.insert("v", v);
                                Bson::Document(e)
                            })
                            .collect(),
                    ))),
                    Some(other) => Err(loc(
                        40390,
                        format!(
                            "$objectToArray requires a document input, found: {}",
                            type_name(&other)
                        ),
                    )),
                }
            }
            "$arrayToObject" => self.array_to_object(arg),
            "$getField" | "$setField" | "$unsetField" => self.field_ops(op, arg),
            "$concat" => {
                let mut out = String::new();
                for v in self.eval_all(arg)? {
                    match v {
                        None | Some(Bson::Null) | Some(Bson::Undefined) => {
                            return Ok(Some(Bson::Null))
                        }
                        Some(Bson::String(s)) => out.push_str(&s),
                        Some(other) => {
                            return Err(loc(
                                16702,
                                format!("$concat only supports strings, not {}", type_name(&other)),
                            ))
                        }
                    }
                }
                Ok(Some(Bson::String(out)))
            }
            "$toLower" | "$toUpper" => {
                let v = self.eval_one(op, arg)?;
                let s = match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => String::new(),
                    Some(other) => convert::to_string(&other).map_err(|_| {
                        loc(
                            16007,
                            format!(
                                "can't convert from BSON type {} to String",
                                type_name(&other)
                            ),
                        )
                    })?,
                };
                Ok(Some(Bson::String(if op == "$toLower" {
                    s.to_ascii_lowercase()
                } else {
                    s.to_ascii_uppercase()
                })))
            }
            "$strLenBytes" | "$strLenCP" => {
                let v = self.eval_one(op, arg)?;
                match v {
                    Some(Bson::String(s)) => Ok(Some(len_bson(if op == "$strLenBytes" {
                        s.len()
                    } else {
                        s.chars().count()
                    }))),
                    other => Err(loc(
                        34471,
                        format!(
                            "{op} requires a string argument, found: {}",
                            value_desc(other.as_ref())
                        ),
                    )),
                }
            }
            "$dateAdd" | "$dateSubtract" => self.date_add(op, arg),
            "$dateDiff" => self.date_diff(arg),
            "$dateToString" => self.date_to_string(arg),
            "$year" | "$month" | "$dayOfMonth" | "$hour" | "$minute" | "$second"
            | "$millisecond" | "$dayOfWeek" | "$dayOfYear" => self.date_part(op, arg),
            other => Err(CommandError::unknown_expression(other)),
        }
    }

    fn int_arg(&self, what: &str, v: Option<&Bson>, code: i32) -> CommandResult<i64> {
        let n = v.and_then(Num::from_bson).ok_or_else(|| {
            loc(
                code,
                format!("{what} must be a numeric value, but is {}", value_desc(v)),
            )
        })?;
        n.as_i64_exact()
            .filter(|i| i32::try_from(*i).is_ok())
            .ok_or_else(|| {
                loc(
                    code + 1,
                    format!(
                        "{what} must be representable as a 32-bit integral value: {}",
                        n.as_f64()
                    ),
                )
            })
    }

    fn add(&mut self, arg: &Bson) -> R {
        let mut acc = Num::I32(0);
        let mut date: Option<i64> = None;
        let mut null = false;
        for v in self.eval_all(arg)? {
            match v {
                None | Some(Bson::Null) | Some(Bson::Undefined) => null = true,
                Some(Bson::DateTime(d)) => {
                    if date.is_some() {
                        return Err(loc(16612, "only one date allowed in an $add expression"));
                    }
                    date = Some(d.timestamp_millis());
                }
                Some(other) => match Num::from_bson(&other) {
                    Some(n) => acc = num::add(acc, n),
                    None => {
                        return Err(loc(
                            16554,
                            format!(
                                "$add only supports numeric or date types, not {}",
                                type_name(&other)
                            ),
                        ))
                    }
                },
            }
        }
        if null {
            return Ok(Some(Bson::Null));
        }
        match date {
            Some(ms) => {
                let delta = match acc {
                    Num::I32(i) => i64::from(i),
                    Num::I64(i) => i,
                    Num::F64(f) | Num::Dec(f) => num::f64_to_i64_exact(f.round())
                        .ok_or_else(|| loc(16612, format!("$add: date overflow adding {f}")))?,
                };
                let r = ms
                    .checked_add(delta)
                    .ok_or_else(|| loc(16612, "$add: date overflow"))?;
                Ok(Some(Bson::DateTime(DateTime::from_millis(r))))
            }
            None => Ok(Some(acc.to_bson())),
        }
    }

    fn subtract(&mut self, arg: &Bson) -> R {
        let v = self.eval_exact("$subtract", arg, 2)?;
        if is_nullish(v[0].as_ref()) || is_nullish(v[1].as_ref()) {
            return Ok(Some(Bson::Null));
        }
        let (a, b) = (v[0].as_ref(), v[1].as_ref());
        match (a, b) {
            (Some(Bson::DateTime(x)), Some(Bson::DateTime(y))) => Ok(Some(Bson::Int64(
                x.timestamp_millis().wrapping_sub(y.timestamp_millis()),
            ))),
            (Some(Bson::DateTime(x)), Some(other)) if Num::from_bson(other).is_some() => {
                let n = Num::from_bson(other)
                    .map(|n| n.as_f64().round())
                    .unwrap_or(0.0);
                let d = num::f64_to_i64_exact(n)
                    .and_then(|d| x.timestamp_millis().checked_sub(d))
                    .ok_or_else(|| loc(16613, "$subtract: date overflow"))?;
                Ok(Some(Bson::DateTime(DateTime::from_millis(d))))
            }
            (Some(x), Some(y)) => match (Num::from_bson(x), Num::from_bson(y)) {
                (Some(p), Some(q)) => Ok(Some(num::sub(p, q).to_bson())),
                _ => Err(loc(
                    16556,
                    format!("cant $subtract a {} from a {}", type_name(y), type_name(x)),
                )),
            },
            _ => Ok(Some(Bson::Null)),
        }
    }

    fn multiply(&mut self, arg: &Bson) -> R {
        let mut acc = Num::I32(1);
        let mut null = false;
        for v in self.eval_all(arg)? {
            match v {
                None | Some(Bson::Null) | Some(Bson::Undefined) => null = true,
                Some(other) => match Num::from_bson(&other) {
                    Some(n) => acc = num::mul(acc, n),
                    None => {
                        return Err(loc(
                            16555,
                            format!(
                                "$multiply only supports numeric types, not {}",
                                type_name(&other)
                            ),
                        ))
                    }
                },
            }
        }
        Ok(Some(if null { Bson::Null } else { acc.to_bson() }))
    }

    fn two_numbers(
        &mut self,
        op: &str,
        arg: &Bson,
        code: i32,
    ) -> CommandResult<Option<(Num, Num)>> {
        let v = self.eval_exact(op, arg, 2)?;
        if is_nullish(v[0].as_ref()) || is_nullish(v[1].as_ref()) {
            return Ok(None);
        }
        match (
            v[0].as_ref().and_then(Num::from_bson),
            v[1].as_ref().and_then(Num::from_bson),
        ) {
            (Some(a), Some(b)) => Ok(Some((a, b))),
            _ => Err(loc(
                code,
                format!(
                    "{op} only supports numeric types, not {} and {}",
                    value_desc(v[0].as_ref()),
                    value_desc(v[1].as_ref())
                ),
            )),
        }
    }

    fn divide(&mut self, arg: &Bson) -> R {
        let Some((a, b)) = self.two_numbers("$divide", arg, 16609)? else {
            return Ok(Some(Bson::Null));
        };
        if b.is_zero() {
            return Err(CommandError::bad_value("can't $divide by zero"));
        }
        let r = a.as_f64() / b.as_f64();
        Ok(Some(
            if matches!(a, Num::Dec(_)) || matches!(b, Num::Dec(_)) {
                Num::Dec(r).to_bson()
            } else {
                Bson::Double(r)
            },
        ))
    }

    fn modulo(&mut self, arg: &Bson) -> R {
        let Some((a, b)) = self.two_numbers("$mod", arg, 16611)? else {
            return Ok(Some(Bson::Null));
        };
        if b.is_zero() {
            return Err(loc(16610, "can't $mod by zero"));
        }
        let r = match (a, b) {
            (Num::I32(x), Num::I32(y)) => Num::I32(x.wrapping_rem(y)),
            (Num::I32(_) | Num::I64(_), Num::I32(_) | Num::I64(_)) => Num::I64(
                a.as_i64_exact()
                    .unwrap_or(0)
                    .wrapping_rem(b.as_i64_exact().unwrap_or(1)),
            ),
            (Num::Dec(_), _) | (_, Num::Dec(_)) => Num::Dec(a.as_f64() % b.as_f64()),
            _ => Num::F64(a.as_f64() % b.as_f64()),
        };
        Ok(Some(r.to_bson()))
    }

    fn unary_math(&mut self, op: &str, arg: &Bson) -> R {
        let v = self.eval_one(op, arg)?;
        if is_nullish(v.as_ref()) {
            return Ok(Some(Bson::Null));
        }
        let n = v.as_ref().and_then(Num::from_bson).ok_or_else(|| {
            loc(
                28765,
                format!(
                    "{op} only supports numeric types, not {}",
                    value_desc(v.as_ref())
                ),
            )
        })?;
        let f = |x: f64| -> f64 {
            match op {
                "$abs" => x.abs(),
                "$floor" => x.floor(),
                "$ceil" => x.ceil(),
                "$sqrt" => x.sqrt(),
                _ => x.trunc(),
            }
        };
        if op == "$sqrt" {
            if n.as_f64() < 0.0 {
                return Err(loc(
                    28714,
                    "$sqrt's argument must be greater than or equal to 0",
                ));
            }
            return Ok(Some(match n {
                Num::Dec(x) => Num::Dec(x.sqrt()).to_bson(),
                other => Bson::Double(other.as_f64().sqrt()),
            }));
        }
        let r = match n {
            Num::I32(i) if op == "$abs" => match i.checked_abs() {
                Some(a) => Num::I32(a),
                None => Num::I64(i64::from(i).abs()),
            },
            Num::I64(i) if op == "$abs" => match i.checked_abs() {
                Some(a) => Num::I64(a),
                None => return Err(loc(28680, "can't take $abs of long long min")),
            },
            Num::I32(_) | Num::I64(_) => n,
            Num::F64(x) => Num::F64(f(x)),
            Num::Dec(x) => Num::Dec(f(x)),
        };
        Ok(Some(r.to_bson()))
    }

    fn pow(&mut self, arg: &Bson) -> R {
        let Some((a, b)) = self.two_numbers("$pow", arg, 28762)? else {
            return Ok(Some(Bson::Null));
        };
        if a.is_zero() && b.as_f64() < 0.0 {
            return Err(loc(
                28764,
                "$pow cannot take a base of 0 and a negative exponent",
            ));
        }
        if let (Some(x), Some(y)) = (a.as_i64_exact(), b.as_i64_exact()) {
            if !matches!(a, Num::F64(_) | Num::Dec(_))
                && !matches!(b, Num::F64(_) | Num::Dec(_))
                && y >= 0
            {
                if let Some(r) = u32::try_from(y).ok().and_then(|e| x.checked_pow(e)) {
                    let both_int = matches!(a, Num::I32(_)) && matches!(b, Num::I32(_));
                    return Ok(Some(if both_int {
                        i32::try_from(r).map(Bson::Int32).unwrap_or(Bson::Int64(r))
                    } else {
                        Bson::Int64(r)
                    }));
                }
            }
        }
        let r = a.as_f64().powf(b.as_f64());
        Ok(Some(
            if matches!(a, Num::Dec(_)) || matches!(b, Num::Dec(_)) {
                Num::Dec(r).to_bson()
            } else {
                Bson::Double(r)
            },
        ))
    }

    fn cond(&mut self, arg: &Bson) -> R {
        let (i, t, e) = match arg {
            Bson::Array(a) => {
                if a.len() != 3 {
                    return Err(nargs_error("$cond", "3", a.len()));
                }
                (&a[0], &a[1], &a[2])
            }
            Bson::Document(d) => {
                for k in d.keys() {
                    if !matches!(k.as_str(), "if" | "then" | "else") {
                        return Err(loc(17083, format!("Unrecognized parameter to $cond: {k}")));
                    }
                }
                let get = |k: &str, code: i32| {
                    d.get(k)
                        .ok_or_else(|| loc(code, format!("Missing '{k}' parameter to $cond")))
                };
                (get("if", 17080)?, get("then", 17081)?, get("else", 17082)?)
            }
            _ => return Err(nargs_error("$cond", "3", 1)),
        };
        if truthy(self.eval(i)?.as_ref()) {
            self.eval(t)
        } else {
            self.eval(e)
        }
    }

    fn switch(&mut self, arg: &Bson) -> R {
        let d = object_arg("$switch", arg, &["branches", "default"])?;
        let branches = match d.get("branches") {
            Some(Bson::Array(b)) => b,
            _ => return Err(loc(40061, "$switch expected an array for 'branches'")),
        };
        for b in branches {
            let bd = b
                .as_document()
                .ok_or_else(|| loc(40061, "$switch expected each branch to be an object"))?;
            let case = bd.get("case").ok_or_else(|| {
                loc(
                    40064,
                    "$switch requires each branch have a 'case' expression",
                )
            })?;
            let then = bd.get("then").ok_or_else(|| {
                loc(
                    40065,
                    "$switch requires each branch have a 'then' expression",
                )
            })?;
            if truthy(self.eval(case)?.as_ref()) {
                return self.eval(then);
            }
        }
        match d.get("default") {
            Some(dflt) => self.eval(dflt),
            None => Err(loc(
                40066,
                "$switch could not find a matching branch for an input, and no default was specified.",
            )),
        }
    }

    fn let_(&mut self, arg: &Bson) -> R {
        let d = object_arg("$let", arg, &["vars", "in"])?;
        let vars = match d.get("vars") {
            Some(Bson::Document(v)) => v,
            _ => return Err(loc(16876, "Missing 'vars' parameter to $let")),
        };
        let body = d
            .get("in")
            .ok_or_else(|| loc(16877, "Missing 'in' parameter to $let"))?;
        let mut values = Vec::new();
        for (k, e) in vars {
            values.push((k.clone(), self.eval(e)?));
        }
        let n = values.len();
        self.locals.extend(values);
        let r = self.eval(body);
        self.locals.truncate(self.locals.len() - n);
        r
    }

    fn min_max(&mut self, op: &str, arg: &Bson) -> R {
        let values: Vec<Bson> = match arg {
            Bson::Array(a) if a.len() != 1 => {
                let mut out = Vec::new();
                for e in a {
                    if let Some(v) = self.eval(e)? {
                        out.push(v);
                    }
                }
                out
            }
            other => {
                let single = match other {
                    Bson::Array(a) => &a[0],
                    x => x,
                };
                match self.eval(single)? {
                    Some(Bson::Array(a)) => a,
                    Some(v) => vec![v],
                    None => vec![],
                }
            }
        };
        let mut best: Option<Bson> = None;
        for v in values {
            if matches!(v, Bson::Null | Bson::Undefined) {
                continue;
            }
            let replace = match &best {
                None => true,
                Some(b) => {
                    let o = compare(&v, b);
                    if op == "$max" {
                        o == Ordering::Greater
                    } else {
                        o == Ordering::Less
                    }
                }
            };
            if replace {
                best = Some(v);
            }
        }
        Ok(Some(best.unwrap_or(Bson::Null)))
    }

    fn sum_avg(&mut self, op: &str, arg: &Bson) -> R {
        let values: Vec<Bson> = match arg {
            Bson::Array(a) if a.len() != 1 => {
                let mut out = Vec::new();
                for e in a {
                    if let Some(v) = self.eval(e)? {
                        out.push(v);
                    }
                }
                out
            }
            other => {
                let single = match other {
                    Bson::Array(a) => &a[0],
                    x => x,
                };
                match self.eval(single)? {
                    Some(Bson::Array(a)) => a,
                    Some(v) => vec![v],
                    None => vec![],
                }
            }
        };
        let nums: Vec<Num> = values.iter().filter_map(Num::from_bson).collect();
        if op == "$sum" {
            let s = nums.into_iter().fold(Num::I32(0), num::add);
            return Ok(Some(s.to_bson()));
        }
        if nums.is_empty() {
            return Ok(Some(Bson::Null));
        }
        let dec = nums.iter().any(|n| matches!(n, Num::Dec(_)));
        let total: f64 = nums.iter().map(|n| n.as_f64()).sum();
        let avg = total / nums.len() as f64;
        Ok(Some(if dec {
            Num::Dec(avg).to_bson()
        } else {
            Bson::Double(avg)
        }))
    }

    fn convert(&mut self, arg: &Bson) -> R {
        let d = object_arg("$convert", arg, &["input", "to", "onError", "onNull"])?;
        let input = self.eval(required("$convert", d, "input")?)?;
        let to_v = self
            .eval(required("$convert", d, "to")?)?
            .unwrap_or(Bson::Null);
        if is_nullish(input.as_ref()) {
            return match d.get("onNull") {
                Some(e) => self.eval(e),
                None => Ok(Some(Bson::Null)),
            };
        }
        if is_nullish(Some(&to_v)) {
            return Ok(Some(Bson::Null));
        }
        let to = convert::target_name(&to_v)?;
        let input = input.unwrap_or(Bson::Null);
        match convert::convert(&input, to) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code == 241 => match d.get("onError") {
                Some(h) => self.eval(h),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    fn array_input(&mut self, op: &str, e: &Bson, code: i32) -> CommandResult<Option<Vec<Bson>>> {
        match self.eval(e)? {
            None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
            Some(Bson::Array(a)) => Ok(Some(a)),
            Some(other) => Err(loc(
                code,
                format!("input to {op} must be an array not {}", type_name(&other)),
            )),
        }
    }

    fn filter(&mut self, arg: &Bson) -> R {
        let d = object_arg("$filter", arg, &["input", "as", "cond", "limit"])?;
        let name = var_name("$filter", d.get("as"), "this")?;
        let cond = required("$filter", d, "cond")?;
        let limit = match d.get("limit") {
            None => None,
            Some(l) => match self.eval(l)? {
                None | Some(Bson::Null) => None,
                Some(v) => {
                    let n = Num::from_bson(&v)
                        .and_then(Num::as_i64_exact)
                        .filter(|n| *n > 0);
                    Some(n.ok_or_else(|| {
                        loc(
                            327392,
                            format!("$filter: limit must be a positive integer: {v}"),
                        )
                    })?)
                }
            },
        };
        let Some(input) = self.array_input("$filter", required("$filter", d, "input")?, 28651)?
        else {
            return Ok(Some(Bson::Null));
        };
        let mut out = Vec::new();
        for el in input {
            if limit.is_some_and(|l| out.len() as i64 >= l) {
                break;
            }
            let keep = self.with_local(&name, Some(el.clone()), |cx| {
                Ok(truthy(cx.eval(cond)?.as_ref()))
            })?;
            if keep {
                out.push(el);
            }
        }
        Ok(Some(Bson::Array(out)))
    }

    fn map(&mut self, arg: &Bson) -> R {
        let d = object_arg("$map", arg, &["input", "as", "in"])?;
        let name = var_name("$map", d.get("as"), "this")?;
        let body = required("$map", d, "in")?;
        let Some(input) = self.array_input("$map", required("$map", d, "input")?, 16883)? else {
            return Ok(Some(Bson::Null));
        };
        let mut out = Vec::with_capacity(input.len());
        for el in input {
            let v = self.with_local(&name, Some(el), |cx| cx.eval(body))?;
            out.push(v.unwrap_or(Bson::Null));
        }
        Ok(Some(Bson::Array(out)))
    }

    fn reduce(&mut self, arg: &Bson) -> R {
        let d = object_arg("$reduce", arg, &["input", "initialValue", "in"])?;
        let body = required("$reduce", d, "in")?;
        let init = required("$reduce", d, "initialValue")?;
        let Some(input) = self.array_input("$reduce", required("$reduce", d, "input")?, 40080)?
        else {
            return Ok(Some(Bson::Null));
        };
        let mut acc = self.eval(init)?;
        for el in input {
            self.locals.push(("value".into(), acc.clone()));
            self.locals.push(("this".into(), Some(el)));
            let r = self.eval(body);
            self.locals.pop();
            self.locals.pop();
            acc = r?;
        }
        Ok(acc)
    }

    fn slice(&mut self, arg: &Bson) -> R {
        let a = arg_list(arg);
        if a.len() != 2 && a.len() != 3 {
            return Err(loc(
                28667,
                format!("Expression $slice takes at least 2 arguments, and at most 3, but {} were passed in.", a.len()),
            ));
        }
        let mut v = Vec::new();
        for e in &a {
            v.push(self.eval(e)?);
        }
        if v.iter().any(|x| is_nullish(x.as_ref())) {
            return Ok(Some(Bson::Null));
        }
        let Some(Bson::Array(arr)) = &v[0] else {
            return Err(loc(
                28724,
                format!(
                    "First argument to $slice must be an array, but is of type: {}",
                    value_desc(v[0].as_ref())
                ),
            ));
        };
        let len = arr.len() as i64;
        let (start, n) = if v.len() == 2 {
            let n = self.int_arg("Second argument to $slice", v[1].as_ref(), 28725)?;
            if n >= 0 {
                (0, n)
            } else {
                ((len + n).max(0), -n)
            }
        } else {
            let p = self.int_arg("Second argument to $slice", v[1].as_ref(), 28725)?;
            let n = self.int_arg("Third argument to $slice", v[2].as_ref(), 28727)?;
            if n <= 0 {
                return Err(loc(
                    28729,
                    format!("Third argument to $slice must be positive: {n}"),
                ));
            }
            let start = if p >= 0 { p.min(len) } else { (len + p).max(0) };
            (start, n)
        };
        let end = (start + n).min(len);
        let out = arr[start as usize..end.max(start) as usize].to_vec();
        Ok(Some(Bson::Array(out)))
    }

    fn range(&mut self, arg: &Bson) -> R {
        let a = arg_list(arg);
        if a.len() != 2 && a.len() != 3 {
            return Err(nargs_error("$range", "2 or 3", a.len()));
        }
        let mut ints = Vec::new();
        for (i, e) in a.iter().enumerate() {
            let v = self.eval(e)?;
            let what = ["starting value", "ending value", "step value"][i];
            ints.push(self.int_arg(
                &format!("$range requires a {what} that"),
                v.as_ref(),
                34443,
            )?);
        }
        let step = ints.get(2).copied().unwrap_or(1);
        if step == 0 {
            return Err(loc(34449, "$range requires a non-zero step value"));
        }
        let mut out = Vec::new();
        let mut i = ints[0];
        while (step > 0 && i < ints[1]) || (step < 0 && i > ints[1]) {
            out.push(len_bson_i(i));
            if out.len() > 10_000_000 {
                return Err(loc(5734300, "$range would produce too many elements"));
            }
            i += step;
        }
        Ok(Some(Bson::Array(out)))
    }

    fn index_of_array(&mut self, arg: &Bson) -> R {
        let a = arg_list(arg);
        if !(2..=4).contains(&a.len()) {
            return Err(loc(
                28667,
                format!("Expression $indexOfArray takes at least 2 arguments, and at most 4, but {} were passed in.", a.len()),
            ));
        }
        let mut v = Vec::new();
        for e in &a {
            v.push(self.eval(e)?);
        }
        if is_nullish(v[0].as_ref()) {
            return Ok(Some(Bson::Null));
        }
        let Some(Bson::Array(arr)) = &v[0] else {
            return Err(loc(
                40090,
                format!(
                    "$indexOfArray requires an array as a first argument, found: {}",
                    value_desc(v[0].as_ref())
                ),
            ));
        };
        let start = match v.get(2) {
            Some(x) => self
                .int_arg("$indexOfArray starting index", x.as_ref(), 40096)?
                .max(0),
            None => 0,
        } as usize;
        let end = match v.get(3) {
            Some(x) => self
                .int_arg("$indexOfArray ending index", x.as_ref(), 40096)?
                .max(0) as usize,
            None => arr.len(),
        }
        .min(arr.len());
        let needle = v[1].clone().unwrap_or(Bson::Null);
        for (i, el) in arr.iter().enumerate().take(end).skip(start) {
            if values_equal(el, &needle) {
                return Ok(Some(len_bson(i)));
            }
        }
        Ok(Some(Bson::Int32(-1)))
    }

    fn array_to_object(&mut self, arg: &Bson) -> R {
        let v = self.eval_one("$arrayToObject", arg)?;
        let arr = match v {
            None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
            Some(Bson::Array(a)) => a,
            Some(other) => {
                return Err(loc(
                    40386,
                    format!(
                        "$arrayToObject requires an array input, found: {}",
                        type_name(&other)
                    ),
                ))
            }
        };
        let mut out = Document::new();
        for el in arr {
            let (k, v) = match el {
                Bson::Array(mut pair) if pair.len() == 2 => {
                    let v = pair.pop().unwrap_or(Bson::Null);
                    let k = pair.pop().unwrap_or(Bson::Null);
                    (k, v)
                }
                Bson::Document(mut d)
                    if d.len() == 2 && d.contains_key("k") && d.contains_key("v") =>
                {
                    (
                        d.remove("k").unwrap_or(Bson::Null),
                        d.remove("v").unwrap_or(Bson::Null),
                    )
                }
                other => {
                    return Err(loc(
                        40398,
                        format!("$arrayToObject: unrecognised input element {other}"),
                    ))
                }
            };
            let Bson::String(k) = k else {
                return Err(loc(
                    40395,
                    format!(
                        "$arrayToObject requires string keys, found: {}",
                        type_name(&k)
                    ),
                ));
            };
            out.insert(k, v);
        }
        Ok(Some(Bson::Document(out)))
    }

    fn field_ops(&mut self, op: &str, arg: &Bson) -> R {
        let (field_e, input_e, value_e): (&Bson, Option<&Bson>, Option<&Bson>) = match (op, arg) {
            ("$getField", Bson::String(_)) => (arg, None, None),
            ("$getField", _) => {
                let d = object_arg(op, arg, &["field", "input"])?;
                (required(op, d, "field")?, d.get("input"), None)
            }
            ("$setField", _) => {
                let d = object_arg(op, arg, &["field", "input", "value"])?;
                (
                    required(op, d, "field")?,
                    Some(required(op, d, "input")?),
                    Some(required(op, d, "value")?),
                )
            }
            _ => {
                let d = object_arg(op, arg, &["field", "input"])?;
                (
                    required(op, d, "field")?,
                    Some(required(op, d, "input")?),
                    None,
                )
            }
        };
        let field = match field_e {
            Bson::String(s) if !s.starts_with('$') => s.clone(),
            Bson::Document(d) if d.len() == 1 && d.contains_key("$literal") => {
                match d.get("$literal") {
                    Some(Bson::String(s)) => s.clone(),
                    _ => {
                        return Err(loc(
                            5654602,
                            format!("{op} requires 'field' to evaluate to a constant string"),
                        ))
                    }
                }
            }
            _ => {
                return Err(loc(
                    5654601,
                    format!("{op} requires 'field' to evaluate to a constant string"),
                ))
            }
        };
        let input = match input_e {
            None => Some(Bson::Document(self.root.clone())),
            Some(e) => self.eval(e)?,
        };
        let input_doc = match input {
            None | Some(Bson::Null) | Some(Bson::Undefined) => {
                return Ok(if op == "$getField" {
                    None
                } else {
                    Some(Bson::Null)
                })
            }
            Some(Bson::Document(d)) => d,
            Some(other) => {
                if op == "$getField" {
                    return Ok(None);
                }
                return Err(loc(
                    4161105,
                    format!(
                        "{op} requires 'input' to evaluate to type Object, found {}",
                        type_name(&other)
                    ),
                ));
            }
        };
        match op {
            "$getField" => Ok(input_doc.get(&field).cloned()),
            "$unsetField" => {
                let mut d = input_doc;
                d.remove(&field);
                Ok(Some(Bson::Document(d)))
            }
            _ => {
                let value = match value_e {
                    Some(e) => self.eval(e)?,
                    None => None,
                };
                let mut d = input_doc;
                match value {
                    Some(v) => {
                        d.insert(field, v);
                    }
                    None => {
                        d.remove(&field);
                    }
                }
                Ok(Some(Bson::Document(d)))
            }
        }
    }

    fn timezone(&mut self, d: &Document) -> CommandResult<Option<i64>> {
        match d.get("timezone") {
            None => Ok(Some(0)),
            Some(e) => match self.eval(e)? {
                None | Some(Bson::Null) => Ok(None),
                Some(Bson::String(s)) => date::parse_timezone(&s).map(Some),
                Some(other) => Err(loc(
                    40517,
                    format!(
                        "timezone must evaluate to a string, found {}",
                        type_name(&other)
                    ),
                )),
            },
        }
    }

    fn date_add(&mut self, op: &str, arg: &Bson) -> R {
        let d = object_arg(op, arg, &["startDate", "unit", "amount", "timezone"])?;
        let start = self.eval(required(op, d, "startDate")?)?;
        let unit = self.eval(required(op, d, "unit")?)?;
        let amount = self.eval(required(op, d, "amount")?)?;
        let Some(tz) = self.timezone(d)? else {
            return Ok(Some(Bson::Null));
        };
        if is_nullish(start.as_ref()) || is_nullish(unit.as_ref()) || is_nullish(amount.as_ref()) {
            return Ok(Some(Bson::Null));
        }
        let start_ms = start.as_ref().and_then(date_ms).ok_or_else(|| {
            loc(
                5166403,
                format!(
                    "{op} requires startDate to be convertible to a date, found {}",
                    value_desc(start.as_ref())
                ),
            )
        })?;
        let Some(Bson::String(unit)) = unit else {
            return Err(loc(
                5439013,
                format!(
                    "{op} requires 'unit' to be a string, found {}",
                    value_desc(unit.as_ref())
                ),
            ));
        };
        let amount = amount
            .as_ref()
            .and_then(Num::from_bson)
            .and_then(Num::as_i64_exact)
            .ok_or_else(|| {
                loc(
                    5166405,
                    format!(
                        "{op} expects integer amount of time units, found {}",
                        amount.as_ref().map(|a| a.to_string()).unwrap_or_default()
                    ),
                )
            })?;
        let amount = if op == "$dateSubtract" {
            amount
                .checked_neg()
                .ok_or_else(|| loc(5166406, format!("{op} overflowed")))?
        } else {
            amount
        };
        let ms = date::add_units(start_ms, &unit, amount, tz)?;
        Ok(Some(Bson::DateTime(DateTime::from_millis(ms))))
    }

    fn date_diff(&mut self, arg: &Bson) -> R {
        let op = "$dateDiff";
        let d = object_arg(
            op,
            arg,
            &["startDate", "endDate", "unit", "timezone", "startOfWeek"],
        )?;
        if d.contains_key("startOfWeek") {
            return Err(CommandError::bad_value(
                "$dateDiff: 'startOfWeek' is not supported by mongo-testserver",
            ));
        }
        let start = self.eval(required(op, d, "startDate")?)?;
        let end = self.eval(required(op, d, "endDate")?)?;
        let unit = self.eval(required(op, d, "unit")?)?;
        let Some(tz) = self.timezone(d)? else {
            return Ok(Some(Bson::Null));
        };
        if is_nullish(start.as_ref()) || is_nullish(end.as_ref()) || is_nullish(unit.as_ref()) {
            return Ok(Some(Bson::Null));
        }
        let (Some(s), Some(e)) = (
            start.as_ref().and_then(date_ms),
            end.as_ref().and_then(date_ms),
        ) else {
            return Err(loc(
                5166307,
                "$dateDiff requires startDate and endDate to be dates",
            ));
        };
        let Some(Bson::String(unit)) = unit else {
            return Err(loc(5439013, "$dateDiff requires 'unit' to be a string"));
        };
        let (s, e) = (s.saturating_add(tz), e.saturating_add(tz));
        let floor_div = |x: i64, m: i64| x.div_euclid(m);
        let r = match unit.as_str() {
            "millisecond" => e - s,
            "second" => floor_div(e, 1000) - floor_div(s, 1000),
            "minute" => floor_div(e, 60_000) - floor_div(s, 60_000),
            "hour" => floor_div(e, 3_600_000) - floor_div(s, 3_600_000),
            "day" => floor_div(e, 86_400_000) - floor_div(s, 86_400_000),
            "week" => {
                // Weeks start on Sunday; 1970-01-01 was a Thursday.
                let w = |x: i64| floor_div(floor_div(x, 86_400_000) + 4, 7);
                w(e) - w(s)
            }
            "month" | "quarter" | "year" => {
                let (ps, pe) = (date::to_parts(s), date::to_parts(e));
                let months =
                    (pe.year * 12 + i64::from(pe.month)) - (ps.year * 12 + i64::from(ps.month));
                match unit.as_str() {
                    "month" => months,
                    "year" => pe.year - ps.year,
                    _ => {
                        let q = |p: &date::Parts| p.year * 4 + i64::from((p.month - 1) / 3);
                        q(&pe) - q(&ps)
                    }
                }
            }
            other => {
                return Err(CommandError::bad_value(format!(
                    "unknown time unit value: {other}"
                )))
            }
        };
        Ok(Some(Bson::Int64(r)))
    }

    fn date_to_string(&mut self, arg: &Bson) -> R {
        let op = "$dateToString";
        let d = object_arg(op, arg, &["date", "format", "timezone", "onNull"])?;
        let date_v = self.eval(required(op, d, "date")?)?;
        let Some(tz) = self.timezone(d)? else {
            return Ok(Some(Bson::Null));
        };
        if is_nullish(date_v.as_ref()) {
            return match d.get("onNull") {
                Some(e) => self.eval(e),
                None => Ok(Some(Bson::Null)),
            };
        }
        let ms = date_v.as_ref().and_then(date_ms).ok_or_else(|| {
            loc(
                16006,
                format!(
                    "can't convert from BSON type {} to Date",
                    value_desc(date_v.as_ref())
                ),
            )
        })?;
        let format = match d.get("format") {
            None => return Ok(Some(Bson::String(date::format_iso(ms.saturating_add(tz))))),
            Some(f) => match self.eval(f)? {
                Some(Bson::String(s)) => s,
                None | Some(Bson::Null) => return Ok(Some(Bson::Null)),
                Some(other) => {
                    return Err(loc(
                        18533,
                        format!(
                            "$dateToString requires that 'format' be a string, found: {}",
                            type_name(&other)
                        ),
                    ))
                }
            },
        };
        let p = date::to_parts(ms.saturating_add(tz));
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('Y') => out.push_str(&format!("{:04}", p.year)),
                Some('m') => out.push_str(&format!("{:02}", p.month)),
                Some('d') => out.push_str(&format!("{:02}", p.day)),
                Some('H') => out.push_str(&format!("{:02}", p.hour)),
                Some('M') => out.push_str(&format!("{:02}", p.minute)),
                Some('S') => out.push_str(&format!("{:02}", p.second)),
                Some('L') => out.push_str(&format!("{:03}", p.millis)),
                Some('j') => {
                    let doy = date::days_from_civil(p.year, p.month, p.day) - date::days_from_civil(p.year, 1, 1) + 1;
                    out.push_str(&format!("{doy:03}"));
                }
                Some('z') => {
                    let sign = if tz < 0 { '-' } else { '+' };
                    let m = tz.abs() / 60_000;
                    out.push_str(&format!("{sign}{:02}{:02}", m / 60, m % 60));
                }
                Some('Z') => out.push_str(&(tz / 60_000).to_string()),
                Some('%') => out.push('%'),
                other => {
                    return Err(loc(
                        18536,
                        format!(
                            "Invalid format character '%{}' in format string (or not supported by mongo-testserver)",
                            other.map(String::from).unwrap_or_default()
                        ),
                    ))
                }
            }
        }
        Ok(Some(Bson::String(out)))
    }

    fn date_part(&mut self, op: &str, arg: &Bson) -> R {
        let (date_e, tz) = match arg {
            Bson::Document(d) if d.contains_key("date") => {
                let d = object_arg(op, arg, &["date", "timezone"])?;
                let Some(tz) = self.timezone(d)? else {
                    return Ok(Some(Bson::Null));
                };
                (required(op, d, "date")?, tz)
            }
            Bson::Array(a) if a.len() == 1 => (&a[0], 0),
            other => (other, 0),
        };
        let v = self.eval(date_e)?;
        if is_nullish(v.as_ref()) {
            return Ok(Some(Bson::Null));
        }
        let ms = v
            .as_ref()
            .and_then(date_ms)
            .ok_or_else(|| {
                loc(
                    16006,
                    format!(
                        "can't convert from BSON type {} to Date",
                        value_desc(v.as_ref())
                    ),
                )
            })?
            .saturating_add(tz);
        let p = date::to_parts(ms);
        let days = ms.div_euclid(86_400_000);
        let r: i64 = match op {
            "$year" => p.year,
            "$month" => i64::from(p.month),
            "$dayOfMonth" => i64::from(p.day),
            "$hour" => i64::from(p.hour),
            "$minute" => i64::from(p.minute),
            "$second" => i64::from(p.second),
            "$millisecond" => i64::from(p.millis),
            "$dayOfWeek" => (days + 4).rem_euclid(7) + 1,
            _ => days - date::days_from_civil(p.year, 1, 1) + 1,
        };
        Ok(Some(len_bson_i(r)))
    }
}

fn index_from(a: &[Bson], idx: i64) -> Option<&Bson> {
    let len = a.len() as i64;
    let i = if idx < 0 { len + idx } else { idx };
    if i < 0 || i >= len {
        None
    } else {
        a.get(i as usize)
    }
}

fn len_bson(n: usize) -> Bson {
    len_bson_i(n as i64)
}

fn len_bson_i(n: i64) -> Bson {
    i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n))
}

#[cfg(test)]
#[path = "expr_tests.rs"]
mod tests;
