//! Date expression operators (`$dateAdd`, `$dateSubtract`, `$dateDiff`, `$dateToString`, date parts).

use bson::{Bson, DateTime, Document};

use super::*;

impl Ctx<'_> {
    pub(super) fn timezone(&mut self, d: &Document) -> CommandResult<Option<i64>> {
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

    pub(super) fn date_add(&mut self, op: &str, arg: &Bson) -> R {
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

    pub(super) fn date_diff(&mut self, arg: &Bson) -> R {
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

    pub(super) fn date_to_string(&mut self, arg: &Bson) -> R {
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

    pub(super) fn date_part(&mut self, op: &str, arg: &Bson) -> R {
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
