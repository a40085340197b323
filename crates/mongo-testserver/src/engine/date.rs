//! Calendar arithmetic on BSON dates (milliseconds since the Unix epoch, proleptic Gregorian
//! calendar), for `$dateAdd`, `$toString` of dates and date parts. Time zones: UTC and fixed
//! offsets (`"+02:00"`, `"-0530"`, `"+03"`); Olson names other than UTC/GMT are refused.

use crate::error::{CommandError, CommandResult};

const MS_PER_DAY: i64 = 86_400_000;

/// Days since 1970-01-01 of a civil date.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Civil date (year, month 1-12, day 1-31) of a day number since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Number of days in a month.
pub fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ => {
            if is_leap(y) {
                29
            } else {
                28
            }
        }
    }
}

/// The broken-down parts of a date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    /// Year.
    pub year: i64,
    /// Month, 1-12.
    pub month: u32,
    /// Day of month, 1-31.
    pub day: u32,
    /// Hour 0-23.
    pub hour: u32,
    /// Minute 0-59.
    pub minute: u32,
    /// Second 0-59.
    pub second: u32,
    /// Millisecond 0-999.
    pub millis: u32,
}

/// Splits milliseconds since the epoch into date parts.
pub fn to_parts(ms: i64) -> Parts {
    let days = ms.div_euclid(MS_PER_DAY);
    let rem = ms.rem_euclid(MS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    Parts {
        year,
        month,
        day,
        hour: (rem / 3_600_000) as u32,
        minute: (rem / 60_000 % 60) as u32,
        second: (rem / 1000 % 60) as u32,
        millis: (rem % 1000) as u32,
    }
}

/// Milliseconds since the epoch of date parts.
pub fn from_parts(p: &Parts) -> i64 {
    days_from_civil(p.year, p.month, p.day) * MS_PER_DAY
        + i64::from(p.hour) * 3_600_000
        + i64::from(p.minute) * 60_000
        + i64::from(p.second) * 1000
        + i64::from(p.millis)
}

/// Formats a date as MongoDB prints it: `2024-01-31T12:00:00.000Z`.
pub fn format_iso(ms: i64) -> String {
    let p = to_parts(ms);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        p.year, p.month, p.day, p.hour, p.minute, p.second, p.millis
    )
}

/// Parses a time zone argument into an offset in milliseconds.
pub fn parse_timezone(tz: &str) -> CommandResult<i64> {
    match tz {
        "UTC" | "GMT" | "Z" | "Etc/UTC" | "Etc/GMT" => return Ok(0),
        _ => {}
    }
    let bad = || {
        CommandError::new(
            40485,
            "Location40485",
            format!("unrecognized time zone identifier: \"{tz}\" (mongo-testserver supports UTC and fixed offsets only)"),
        )
    };
    let (sign, rest) = match tz.as_bytes().first() {
        Some(b'+') => (1, &tz[1..]),
        Some(b'-') => (-1, &tz[1..]),
        _ => return Err(bad()),
    };
    let digits: String = rest.chars().filter(|c| *c != ':').collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let (h, m) = match digits.len() {
        2 => (digits.parse::<i64>().map_err(|_| bad())?, 0),
        4 => (
            digits[..2].parse::<i64>().map_err(|_| bad())?,
            digits[2..].parse::<i64>().map_err(|_| bad())?,
        ),
        _ => return Err(bad()),
    };
    Ok(sign * (h * 3_600_000 + m * 60_000))
}

/// Parses an ISO-8601 date string as `$toDate`/`$dateFromString` accept it:
/// `YYYY-MM-DD`, optionally `THH:MM[:SS[.fff]]` and a zone (`Z`, `+HH:MM`, `+HHMM`).
pub fn parse_iso(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = s.get(from..from + len)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let year = num(0, 4)?;
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return None;
    }
    let month = u32::try_from(num(5, 2)?).ok()?;
    let day = u32::try_from(num(8, 2)?).ok()?;
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let mut p = Parts {
        year,
        month,
        day,
        hour: 0,
        minute: 0,
        second: 0,
        millis: 0,
    };
    let mut i = 10;
    let mut offset = 0;
    if i < b.len() && (b[i] == b'T' || b[i] == b' ') {
        p.hour = u32::try_from(num(i + 1, 2)?).ok()?;
        if b.get(i + 3) != Some(&b':') {
            return None;
        }
        p.minute = u32::try_from(num(i + 4, 2)?).ok()?;
        i += 6;
        if b.get(i) == Some(&b':') {
            p.second = u32::try_from(num(i + 1, 2)?).ok()?;
            i += 3;
            if b.get(i) == Some(&b'.') {
                let start = i + 1;
                let mut end = start;
                while end < b.len() && b[end].is_ascii_digit() {
                    end += 1;
                }
                if end == start {
                    return None;
                }
                let frac = &s[start..end.min(start + 3)];
                let mut ms: u32 = frac.parse().ok()?;
                for _ in frac.len()..3 {
                    ms *= 10;
                }
                p.millis = ms;
                i = end;
            }
        }
        if p.hour > 23 || p.minute > 59 || p.second > 59 {
            return None;
        }
    }
    if i < b.len() {
        offset = parse_timezone(&s[i..]).ok()?;
    }
    Some(from_parts(&p) - offset)
}

/// Adds `amount` units to a date (in the given fixed offset, which matters for calendar units).
/// Month-based units clamp the day to the end of the resulting month, as MongoDB does.
pub fn add_units(ms: i64, unit: &str, amount: i64, offset: i64) -> CommandResult<i64> {
    let overflow = || CommandError::new(5166406, "Location5166406", "$dateAdd overflowed");
    let fixed = |per: i64| -> CommandResult<i64> {
        amount
            .checked_mul(per)
            .and_then(|d| ms.checked_add(d))
            .ok_or_else(overflow)
    };
    match unit {
        "millisecond" => fixed(1),
        "second" => fixed(1000),
        "minute" => fixed(60_000),
        "hour" => fixed(3_600_000),
        "day" => fixed(MS_PER_DAY),
        "week" => fixed(7 * MS_PER_DAY),
        "month" | "quarter" | "year" => {
            let months = match unit {
                "month" => amount,
                "quarter" => amount.checked_mul(3).ok_or_else(overflow)?,
                _ => amount.checked_mul(12).ok_or_else(overflow)?,
            };
            let local = ms.checked_add(offset).ok_or_else(overflow)?;
            let mut p = to_parts(local);
            let total = (p.year * 12 + i64::from(p.month) - 1)
                .checked_add(months)
                .ok_or_else(overflow)?;
            if total.abs() > 12 * 300_000 {
                return Err(overflow());
            }
            p.year = total.div_euclid(12);
            p.month = (total.rem_euclid(12) + 1) as u32;
            p.day = p.day.min(days_in_month(p.year, p.month));
            from_parts(&p).checked_sub(offset).ok_or_else(overflow)
        }
        other => Err(CommandError::bad_value(format!(
            "unknown time unit value: {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_round_trip() {
        for d in [-800_000i64, -1, 0, 1, 59, 365, 10_000, 20_000, 2_932_896] {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn iso() {
        assert_eq!(format_iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_iso(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(parse_iso("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(
            parse_iso("2024-02-29T12:30:00Z").map(format_iso),
            Some("2024-02-29T12:30:00.000Z".into())
        );
        assert_eq!(parse_iso("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_iso("1970-01-01"), Some(0));
        assert_eq!(parse_iso("2023-02-29"), None);
        assert_eq!(parse_iso("garbage"), None);
    }

    #[test]
    fn adding() {
        let jan31 = parse_iso("2021-01-31T00:00:00Z").unwrap_or_default();
        let r = add_units(jan31, "month", 1, 0).unwrap_or_default();
        assert_eq!(format_iso(r), "2021-02-28T00:00:00.000Z");
        let r = add_units(jan31, "year", -1, 0).unwrap_or_default();
        assert_eq!(format_iso(r), "2020-01-31T00:00:00.000Z");
        assert_eq!(add_units(0, "hour", 2, 0).ok(), Some(7_200_000));
        assert!(add_units(0, "fortnight", 2, 0).is_err());
        assert!(add_units(1, "millisecond", i64::MAX, 0).is_err());
        assert!(add_units(i64::MAX, "month", 1, 3_600_000).is_err());
        assert_eq!(parse_timezone("+05:30").ok(), Some(19_800_000));
        assert!(parse_timezone("Europe/Paris").is_err());
    }
}
