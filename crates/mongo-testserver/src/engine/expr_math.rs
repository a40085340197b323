//! Arithmetic and numeric expression operators (`$add`, `$subtract`, `$multiply`, `$divide`,
//! `$mod`, `$abs`, `$pow`, `$min`/`$max`, `$sum`/`$avg`, ...).

use bson::{Bson, DateTime};

use super::*;

impl Ctx<'_> {
    pub(super) fn add(&mut self, arg: &Bson) -> R {
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
                    Num::F64(_) | Num::Dec(_) => {
                        let f = acc.as_f64();
                        num::f64_to_i64_exact(f.round())
                            .ok_or_else(|| loc(16612, format!("$add: date overflow adding {f}")))?
                    }
                };
                let r = ms
                    .checked_add(delta)
                    .ok_or_else(|| loc(16612, "$add: date overflow"))?;
                Ok(Some(Bson::DateTime(DateTime::from_millis(r))))
            }
            None => Ok(Some(acc.to_bson())),
        }
    }

    pub(super) fn subtract(&mut self, arg: &Bson) -> R {
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

    pub(super) fn multiply(&mut self, arg: &Bson) -> R {
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

    pub(super) fn two_numbers(
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

    pub(super) fn divide(&mut self, arg: &Bson) -> R {
        let Some((a, b)) = self.two_numbers("$divide", arg, 16609)? else {
            return Ok(Some(Bson::Null));
        };
        if b.is_zero() {
            return Err(CommandError::bad_value("can't $divide by zero"));
        }
        Ok(Some(
            if matches!(a, Num::Dec(_)) || matches!(b, Num::Dec(_)) {
                Num::Dec(crate::engine::decimal::div(a.as_dec(), b.as_dec())).to_bson()
            } else {
                Bson::Double(a.as_f64() / b.as_f64())
            },
        ))
    }

    pub(super) fn modulo(&mut self, arg: &Bson) -> R {
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
            (Num::Dec(_), _) | (_, Num::Dec(_)) => {
                Num::Dec(crate::engine::decimal::rem(a.as_dec(), b.as_dec()))
            }
            _ => Num::F64(a.as_f64() % b.as_f64()),
        };
        Ok(Some(r.to_bson()))
    }

    pub(super) fn unary_math(&mut self, op: &str, arg: &Bson) -> R {
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
                Num::Dec(d) => Num::Dec(crate::engine::decimal::sqrt(d)).to_bson(),
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
            Num::Dec(x) => Num::Dec(crate::engine::decimal::unary(op, x)),
        };
        Ok(Some(r.to_bson()))
    }

    pub(super) fn pow(&mut self, arg: &Bson) -> R {
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
        if matches!(a, Num::Dec(_)) || matches!(b, Num::Dec(_)) {
            // In decimal: a double operand converts as in arithmetic (15 digits).
            let r = crate::engine::decimal::pow(a.as_dec(), b.as_dec());
            return Ok(Some(Num::Dec(r).to_bson()));
        }
        Ok(Some(Bson::Double(a.as_f64().powf(b.as_f64()))))
    }

    /// The values `$min`, `$max`, `$sum` and `$avg` work on in an expression: each operand's
    /// value when there are several, the elements of the single operand's array otherwise
    /// (missing values are left out).
    fn accumulator_operands(&mut self, arg: &Bson) -> CommandResult<Vec<Bson>> {
        Ok(match arg {
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
        })
    }

    pub(super) fn min_max(&mut self, op: &str, arg: &Bson) -> R {
        let values = self.accumulator_operands(arg)?;
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

    pub(super) fn sum_avg(&mut self, op: &str, arg: &Bson) -> R {
        let values = self.accumulator_operands(arg)?;
        let nums: Vec<Num> = values.iter().filter_map(Num::from_bson).collect();
        if op == "$sum" {
            let s = nums.into_iter().fold(Num::I32(0), num::add);
            return Ok(Some(s.to_bson()));
        }
        if nums.is_empty() {
            return Ok(Some(Bson::Null));
        }
        let dec = nums.iter().any(|n| matches!(n, Num::Dec(_)));
        let count = nums.len();
        Ok(Some(if dec {
            let total = nums.into_iter().fold(Num::I32(0), num::add);
            let n = crate::engine::decimal::from_i64(count as i64);
            Num::Dec(crate::engine::decimal::div(total.as_dec(), n)).to_bson()
        } else {
            let total: f64 = nums.iter().map(|n| n.as_f64()).sum();
            Bson::Double(total / count as f64)
        }))
    }
}
