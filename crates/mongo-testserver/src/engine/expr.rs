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
            if s.starts_with("$$") {
                return Ok(());
            }
            // A field path: every component non-empty, without NUL, not `$`-prefixed.
            for part in s[1..].split('.') {
                if part.is_empty() {
                    return Err(loc(
                        15998,
                        "FieldPath field names may not be empty strings.",
                    ));
                }
                if part.contains('\0') {
                    return Err(loc(16411, "FieldPath field names may not contain '\\0'."));
                }
                if part.starts_with('$') {
                    return Err(loc(
                        16410,
                        format!("FieldPath field names may not start with '$'. Consider using $getField or $setField. ({part})"),
                    ));
                }
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
        let (name, rest) = match spec.split_once('.') {
            Some((name, rest)) => (name, Some(rest)),
            None => (spec, None),
        };
        // A path below a variable is looked up in place: the variable's value (the whole root
        // document, say) is never cloned to read one field of it.
        let below = |base: &Bson, rest: &str| -> Option<Bson> {
            let parts: Vec<&str> = rest.split('.').collect();
            expr_path(base, &parts)
        };
        let owned = |base: Bson| -> Option<Bson> {
            match rest {
                None => Some(base),
                Some(rest) => below(&base, rest),
            }
        };
        match name {
            "NOW" => Ok(owned(Bson::DateTime(self.vars.now))),
            "ROOT" | "CURRENT" => Ok(match rest {
                None => Some(Bson::Document(self.root.clone())),
                Some(rest) => super::path::expr_path_doc(self.root, rest),
            }),
            "REMOVE" => Ok(None),
            "CLUSTER_TIME" => match self.vars.cluster_time {
                Some(t) => Ok(owned(Bson::Timestamp(t))),
                None => Err(loc(
                    10071200,
                    "$$CLUSTER_TIME is unavailable in this deployment (standalone server)",
                )),
            },
            _ => {
                let value = if let Some((_, v)) = self.locals.iter().rev().find(|(n, _)| n == name)
                {
                    v.as_ref()
                } else if let Some(v) = self.vars.user.get(name) {
                    Some(v)
                } else {
                    return Err(loc(17276, format!("Use of undefined variable: {name}")));
                };
                Ok(match rest {
                    None => value.cloned(),
                    Some(rest) => value.and_then(|v| below(v, rest)),
                })
            }
        }
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
                        // The first object is the result so far as it is (no re-insertion).
                        Some(Bson::Document(d)) if out.is_empty() => out = d,
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

#[path = "expr_arrays.rs"]
mod arrays;
#[path = "expr_dates.rs"]
mod dates;
#[path = "expr_math.rs"]
mod math;
#[path = "expr_objects.rs"]
mod objects;

#[cfg(test)]
#[path = "expr_tests.rs"]
mod tests;
