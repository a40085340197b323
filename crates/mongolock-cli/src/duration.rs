//! Durations on the command line (`500ms`, `30s`, `2m`, `1h 30m`, `1.5s`) and for people in
//! output (`12.3s`, `2m5s`): every duration the CLI prints goes through [`human`] or
//! [`display`], never `Debug` or `humantime::format_duration` (`3s333ms333us333ns`).

use std::time::Duration;

/// How long `exec --wait` may wait for the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Until acquired (the default).
    Forever,
    /// At most this long; zero means a single attempt.
    For(Duration),
}

fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if let Some(d) = parse_decimal(s) {
        return Ok(d);
    }
    humantime::parse_duration(s).map_err(|e| {
        let hint = if s.chars().all(|c| c.is_ascii_digit()) {
            format!(" (add a unit: {s}s, {s}ms, {s}m)")
        } else {
            " (examples: 500ms, 30s, 2m, 1h 30m)".to_owned()
        };
        format!("invalid duration {s:?}: {e}{hint}")
    })
}

/// A number with a fraction and one unit (`1.5s`, `0.5m`, `2.25h`), the form [`display`] prints
/// for durations that are not whole seconds, so that a duration a message suggests can be typed
/// back. `None` for anything else (left to `humantime`). Exact: integer arithmetic, no floats.
fn parse_decimal(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (number, unit) = s.split_at(split);
    let (int, frac) = number.split_once('.')?;
    if (int.is_empty() && frac.is_empty()) || frac.len() > 9 {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let unit_ns: u128 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" | "secs" => 1_000_000_000,
        "m" | "min" | "mins" => 60_000_000_000,
        "h" | "hr" | "hrs" => 3_600_000_000_000,
        "d" | "day" | "days" => 86_400_000_000_000,
        _ => return None,
    };
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let scale = 10u128.pow(u32::try_from(frac.len()).ok()?);
    let nanos = int.checked_mul(unit_ns)? + frac_value * unit_ns / scale;
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    // The remainder is below 10^9 and fits.
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// A duration that may be zero (`--wait 0`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    parse(s)
}

/// A positive duration of at least 1 ms (`--ttl`, `--grace`).
pub fn parse_positive(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d < Duration::from_millis(1) {
        return Err(format!(
            "the duration {s:?} is below 1 ms; choose a positive duration such as 30s"
        ));
    }
    Ok(d)
}

/// A lease duration (`demo --ttl`): at least the library's minimum
/// ([`mongolock::MIN_EXPIRY`], 100 ms), at most its maximum (one year).
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d < mongolock::MIN_EXPIRY {
        return Err(format!(
            "the lease duration {s:?} is below the minimum of {}: a shorter lease would be lost \
             as soon as it is granted; choose {} or more, for example 30s",
            display(mongolock::MIN_EXPIRY),
            display(mongolock::MIN_EXPIRY)
        ));
    }
    if d > mongolock::MAX_EXPIRY {
        return Err(format!(
            "the lease duration {s:?} is above the maximum of one year; choose a shorter lease \
             (it is renewed while the command runs)"
        ));
    }
    Ok(d)
}

/// The shortest `--ttl` of `exec` and `elect`. A lease is renewed every third of it, and with the
/// default `--grace` (a third) a renewal has the next third, less the drift margin (1 % + 5 ms),
/// to land before the command gets SIGTERM; the supervisor checks its boot-clock deadlines every
/// 100 ms. Below one second that window is under a third of a second: a single slow round trip
/// or a scheduling delay on a loaded machine would stop the command, so every command would be
/// killed sooner or later without any other holder.
pub const MIN_COMMAND_TTL: Duration = Duration::from_secs(1);

/// The lease duration of `exec` and `elect` (`--ttl`): at least [`MIN_COMMAND_TTL`] (also for
/// `0`: the message states that minimum), and [`parse_ttl`]'s maximum.
pub fn parse_command_ttl(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d < MIN_COMMAND_TTL {
        return Err(format!(
            "the lease duration {s:?} is too short to be renewed reliably: the minimum is {} \
             (the lease is renewed every third of it, and a renewal must land within the next \
             third); choose 1s or more, for example 30s",
            display(MIN_COMMAND_TTL)
        ));
    }
    parse_ttl(s)
}

/// `--wait`: a duration (`0` = one attempt) or `forever`.
pub fn parse_wait(s: &str) -> Result<Wait, String> {
    match s.trim() {
        "forever" | "inf" | "infinite" => Ok(Wait::Forever),
        other => parse(other).map(Wait::For),
    }
}

/// Formats a duration for people: `450ms`, `12.3s`, `2m5s`, `1h2m`, `3d4h` (truncated, so that
/// "expires in 10.0s" never shows more than is left).
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    if secs < 60 {
        let tenths = ms / 100;
        return format!("{}.{}s", tenths / 10, tenths % 10);
    }
    let (d_, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d_ > 0 {
        units(&[(d_, "d"), (h, "h")])
    } else if h > 0 {
        units(&[(h, "h"), (m, "m")])
    } else {
        units(&[(m, "m"), (s, "s")])
    }
}

/// `2m5s`, `2m` (zero parts after the first are left out).
fn units(parts: &[(u64, &str)]) -> String {
    let mut out = String::new();
    for (i, (n, unit)) in parts.iter().enumerate() {
        if i == 0 || *n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

/// Formats a duration given on the command line (or derived from one) back for messages:
/// exact when it is a whole number of milliseconds below a second or of seconds (`500ms`,
/// `30s`, `2m`, `1h30m`), otherwise rounded down like [`human`] (`3.3s` for a third of 10s;
/// `1m40s`). Everything it prints parses back (`3.3s` is accepted on the command line).
pub fn display(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    if d < Duration::from_millis(1) {
        return format!("{}us", d.as_micros());
    }
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    if d.subsec_nanos() != 0 && d < Duration::from_secs(60) {
        let tenths = d.as_millis() / 100;
        let (whole, tenth) = (tenths / 10, tenths % 10);
        return if tenth == 0 {
            format!("{whole}s")
        } else {
            format!("{whole}.{tenth}s")
        };
    }
    let secs = d.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_wait("0"), Ok(Wait::For(Duration::ZERO)));
        assert_eq!(parse_wait("forever"), Ok(Wait::Forever));
    }

    #[test]
    fn refuses_bad_forms_with_a_hint() {
        let e = parse_duration("30").unwrap_err();
        assert!(e.contains("30s"), "{e}");
        assert!(parse_duration("soon").is_err());
        assert!(parse_positive("0").is_err());
        assert!(parse_positive("0s").is_err());
        assert_eq!(parse_positive("1ms"), Ok(Duration::from_millis(1)));
        assert!(parse_ttl("400days").is_err());
        assert_eq!(parse_ttl("30s"), Ok(Duration::from_secs(30)));
        // The library's minimum lease, stated in the message (`0` included).
        for short in ["0", "1ms", "99ms"] {
            let e = parse_ttl(short).unwrap_err();
            assert!(e.contains("the minimum of 100ms"), "{short}: {e}");
        }
        assert_eq!(parse_ttl("100ms"), Ok(mongolock::MIN_EXPIRY));
        // exec/elect: 1 s, whatever is below it.
        for short in ["0", "0s", "1ms", "999ms"] {
            let e = parse_command_ttl(short).unwrap_err();
            assert!(e.contains("the minimum is 1s"), "{short}: {e}");
        }
        assert!(parse_command_ttl("400days").is_err());
        assert_eq!(parse_command_ttl("1s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(human(Duration::from_millis(450)), "450ms");
        assert_eq!(human(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(human(Duration::from_millis(9_999)), "9.9s");
        assert_eq!(human(Duration::from_secs(125)), "2m5s");
        assert_eq!(human(Duration::from_secs(120)), "2m");
        assert_eq!(human(Duration::from_secs(3720)), "1h2m");
        assert_eq!(human(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d4h");
        assert_eq!(display(Duration::from_secs(30)), "30s");
        assert_eq!(display(Duration::from_millis(1500)), "1.5s");
        assert_eq!(display(Duration::from_millis(150)), "150ms");
        assert_eq!(display(Duration::from_secs(10) / 3), "3.3s");
        assert_eq!(display(Duration::from_secs(90)), "1m30s");
        assert_eq!(display(Duration::from_secs(3600)), "1h");
        assert_eq!(display(Duration::from_millis(100_500)), "1m40s");
        assert_eq!(display(Duration::ZERO), "0s");
    }

    #[test]
    fn what_display_prints_parses_back() {
        assert_eq!(parse_duration("3.3s"), Ok(Duration::from_millis(3300)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.5m"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration(".5s"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("1.2.3s").is_err());
        assert!(parse_duration("1.5").is_err());
        assert!(parse_duration("1.5x").is_err());
        for d in [
            Duration::from_secs(10) / 3,
            Duration::from_millis(1500),
            Duration::from_secs(5400),
            Duration::from_millis(250),
            Duration::from_secs(86_400 + 61),
        ] {
            let shown = display(d);
            assert!(parse_duration(&shown).is_ok(), "{shown}");
        }
    }
}
