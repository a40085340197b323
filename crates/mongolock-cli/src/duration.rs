//! Durations on the command line (`500ms`, `30s`, `2m`, `1h 30m`) and for people in output
//! (`12.3s`, `2m 5s`).

use std::time::Duration;

/// How long `exec --wait` may wait for the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Until acquired (the default).
    Forever,
    /// At most this long; zero means a single attempt.
    For(Duration),
}

impl Wait {
    /// As the library's timeout.
    pub fn timeout(self) -> mongolock::Timeout {
        match self {
            Wait::Forever => mongolock::Timeout::Forever,
            Wait::For(d) => mongolock::Timeout::from(d),
        }
    }
}

fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
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

/// A lease duration (`--ttl`): at least 1 ms, at most the library's maximum (one year).
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    let d = parse_positive(s)?;
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

/// The lease duration of `exec` and `elect` (`--ttl`): [`parse_ttl`], and at least
/// [`MIN_COMMAND_TTL`].
pub fn parse_command_ttl(s: &str) -> Result<Duration, String> {
    let d = parse_ttl(s)?;
    if d < MIN_COMMAND_TTL {
        return Err(format!(
            "the lease duration {s:?} is too short to be renewed reliably: the minimum is {} \
             (the lease is renewed every third of it, and a renewal must land within the next \
             third); choose 1s or more, for example 30s",
            display(MIN_COMMAND_TTL)
        ));
    }
    Ok(d)
}

/// `--wait`: a duration (`0` = one attempt) or `forever`.
pub fn parse_wait(s: &str) -> Result<Wait, String> {
    match s.trim() {
        "forever" | "inf" | "infinite" => Ok(Wait::Forever),
        other => parse(other).map(Wait::For),
    }
}

/// Formats a duration for people: `450ms`, `12.3s`, `2m 5s`, `1h 2m`, `3d 4h`.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    if secs < 60 {
        // One decimal, truncated so that "expires in 10.0s" never shows more than is left.
        let tenths = ms / 100;
        return format!("{}.{}s", tenths / 10, tenths % 10);
    }
    let (d_, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d_ > 0 {
        format!("{d_}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else {
        format!("{m}m {s}s")
    }
}

/// Formats a duration given on the command line back for messages (`30s`, `2m`, `500ms`).
pub fn display(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    humantime::format_duration(d).to_string().replace(' ', "")
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
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(human(Duration::from_millis(450)), "450ms");
        assert_eq!(human(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(human(Duration::from_millis(9_999)), "9.9s");
        assert_eq!(human(Duration::from_secs(125)), "2m 5s");
        assert_eq!(human(Duration::from_secs(3720)), "1h 2m");
        assert_eq!(human(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d 4h");
        assert_eq!(display(Duration::from_secs(30)), "30s");
        assert_eq!(display(Duration::from_millis(1500)), "1s500ms");
        assert_eq!(display(Duration::ZERO), "0s");
    }
}
