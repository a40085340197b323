//! Array expression operators (`$filter`, `$map`, `$reduce`, `$slice`, `$range`, ...).

use bson::{Bson, Document};

use super::*;

impl Ctx<'_> {
    pub(super) fn array_input(
        &mut self,
        op: &str,
        e: &Bson,
        code: i32,
    ) -> CommandResult<Option<Vec<Bson>>> {
        match self.eval(e)? {
            None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
            Some(Bson::Array(a)) => Ok(Some(a)),
            Some(other) => Err(loc(
                code,
                format!("input to {op} must be an array not {}", type_name(&other)),
            )),
        }
    }

    pub(super) fn filter(&mut self, arg: &Bson) -> R {
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

    pub(super) fn map(&mut self, arg: &Bson) -> R {
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

    pub(super) fn reduce(&mut self, arg: &Bson) -> R {
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

    pub(super) fn slice(&mut self, arg: &Bson) -> R {
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

    pub(super) fn range(&mut self, arg: &Bson) -> R {
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

    pub(super) fn index_of_array(&mut self, arg: &Bson) -> R {
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

    pub(super) fn array_to_object(&mut self, arg: &Bson) -> R {
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
            // mongod's codes for a NUL byte in a key: 4940400 ([k, v] pairs), 4940401 ({k, v}).
            let (k, v, nul_code) = match el {
                Bson::Array(mut pair) if pair.len() == 2 => {
                    let v = pair.pop().unwrap_or(Bson::Null);
                    let k = pair.pop().unwrap_or(Bson::Null);
                    (k, v, 4940400)
                }
                Bson::Document(mut d)
                    if d.len() == 2 && d.contains_key("k") && d.contains_key("v") =>
                {
                    (
                        d.remove("k").unwrap_or(Bson::Null),
                        d.remove("v").unwrap_or(Bson::Null),
                        4940401,
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
            if k.contains('\0') {
                return Err(loc(
                    nul_code,
                    "Key field cannot contain an embedded null byte",
                ));
            }
            out.insert(k, v);
        }
        Ok(Some(Bson::Document(out)))
    }
}
