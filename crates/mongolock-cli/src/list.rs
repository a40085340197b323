//! `mongolock list`, and the rendering of [`LockInfo`] shared with `inspect`.
//!
//! Relative times ("expires in 12.3s", "4.2s ago") are computed from the server-reported times
//! in [`LockInfo`] against `observed_at`, the server's time of the read, so the client's clock
//! plays no part.

use std::io::Write;
use std::time::{Duration, SystemTime};

use mongolock::backend::LeaseHolder;
use mongolock::LockInfo;
use serde_json::{json, Value};

use crate::cli::{GlobalArgs, ListArgs};
use crate::connect::connect;
use crate::duration::human;
use crate::exit::{self, CliError};

/// `mongolock list`.
pub async fn run(global: &GlobalArgs, args: ListArgs) -> Result<i32, CliError> {
    let conn = connect(global).await?;
    let provider = conn.provider(None, None)?;
    let locks = provider
        .list_matching(&args.filter.filter())
        .await
        .map_err(|e| conn.error(&format!("cannot list locks in {}", conn.namespace()), &e))?;
    let mut holders = Vec::with_capacity(locks.len());
    for info in &locks {
        holders.push(if info.held {
            provider.holders(&info.name).await.map_err(|e| {
                conn.error(&format!("cannot read the holders of {:?}", info.name), &e)
            })?
        } else {
            Vec::new()
        });
    }
    if args.json {
        let array = Value::Array(
            locks
                .iter()
                .zip(&holders)
                .map(|(info, h)| with_holders(info, h))
                .collect(),
        );
        write_stdout(&format!("{}\n", pretty(&array)))?;
    } else if locks.is_empty() {
        write_stdout(&format!(
            "no locks{} in {}\n",
            args.filter.describe(),
            conn.namespace()
        ))?;
    } else {
        write_stdout(&table_with_holders(&locks, &holders))?;
    }
    Ok(exit::SUCCESS)
}

/// [`to_json`] with `"holders"`: every current holder (a semaphore's slots, a read-write
/// lock's readers), as [`holder_json`] objects in grant order.
pub fn with_holders(info: &LockInfo, holders: &[LeaseHolder]) -> Value {
    let mut v = to_json(info);
    if let Value::Object(map) = &mut v {
        map.insert(
            "holders".to_owned(),
            Value::Array(holders.iter().map(|h| holder_json(info, h)).collect()),
        );
    }
    v
}

/// One holder as JSON: the library's serialization of [`LeaseHolder`] (`lease_id`,
/// `fencing_token`, `holder`, `acquired_at`, `expires_at`) and `expires_in_ms` (from the lock's
/// `observed_at`).
pub fn holder_json(info: &LockInfo, h: &LeaseHolder) -> Value {
    extended(
        serde_json::to_value(h),
        [("expires_in_ms", json!(ms_from_observed(info, h.expires_at)))],
    )
}

/// `value` (a serialized library type: always an object) with `extra` fields added.
fn extended<const N: usize>(value: serde_json::Result<Value>, extra: [(&str, Value); N]) -> Value {
    // Serializing these plain structs cannot fail (string keys, no maps); an empty object
    // stands in regardless.
    let mut map = match value {
        Ok(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    for (k, v) in extra {
        map.insert(k.to_owned(), v);
    }
    Value::Object(map)
}

/// One holder on one line for people: `token 12  host (pid 42) app "x"  expires in 9.8s  lease
/// ab12`.
pub fn holder_line(info: &LockInfo, h: &LeaseHolder) -> String {
    let who = h
        .holder
        .as_ref()
        .map_or_else(|| "-".to_owned(), |h| h.to_string());
    let left = h
        .expires_at
        .duration_since(info.observed_at)
        .unwrap_or(Duration::ZERO);
    format!(
        "token {}  {who}  expires in {}  lease {}",
        h.fencing_token,
        human(left),
        h.lease_id
    )
}

/// The lock's state: `held`, `expired` (the lease ran out; nobody took the name since) or
/// `released`.
pub fn state(info: &LockInfo) -> &'static str {
    if info.held {
        "held"
    } else if info.lease_id.is_some() {
        "expired"
    } else {
        "released"
    }
}

/// Signed time from `observed_at` to `at` in milliseconds (negative: in the past).
pub(crate) fn ms_from_observed(info: &LockInfo, at: SystemTime) -> i64 {
    match at.duration_since(info.observed_at) {
        Ok(ahead) => i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX),
        Err(behind) => -i64::try_from(behind.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// "in 12.3s", "expired" or "released".
pub fn expires_text(info: &LockInfo) -> String {
    match (state(info), info.expires_at) {
        ("held", Some(at)) => {
            let left = at
                .duration_since(info.observed_at)
                .unwrap_or(Duration::ZERO);
            format!("in {}", human(left))
        }
        ("held", None) => "held".to_owned(),
        (state, _) => state.to_owned(),
    }
}

/// "4.2s ago" relative to the read.
pub fn ago_text(info: &LockInfo, at: SystemTime) -> String {
    let ms = ms_from_observed(info, at);
    if ms <= 0 {
        format!("{} ago", human(Duration::from_millis(ms.unsigned_abs())))
    } else {
        format!("in {}", human(Duration::from_millis(ms.unsigned_abs())))
    }
}

/// RFC 3339 UTC with milliseconds.
pub fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// Holder as `host (pid N) app "x"`, or `-`.
/// A lock name as shown in text for people: unchanged when it is plain, otherwise quoted and
/// escaped the way holder application names are (`"evil\u{1b}[31mRED"`), so that a name cannot
/// move the cursor, colour or retitle the operator's terminal.
pub fn shown_name(name: &str) -> String {
    let escaped = format!("{name:?}");
    if escaped.len() == name.len() + 2 && &escaped[1..escaped.len() - 1] == name {
        name.to_owned()
    } else {
        escaped
    }
}

pub fn holder_text(info: &LockInfo) -> String {
    info.holder
        .as_ref()
        .map_or_else(|| "-".to_owned(), |h| h.to_string())
}

/// The JSON form of one lock (stable field names, for scripts): the library's serialization of
/// [`LockInfo`] (`name`, `held`, `lease_id`, `fencing_token`, `holder`, `acquired_at`,
/// `expires_at`, `observed_at`), with `state` and `expires_in_ms`.
pub fn to_json(info: &LockInfo) -> Value {
    extended(
        serde_json::to_value(info),
        [
            ("state", json!(state(info))),
            (
                "expires_in_ms",
                json!(info.expires_at.map(|at| ms_from_observed(info, at))),
            ),
        ],
    )
}

/// Pretty JSON. Serialising a `Value` cannot fail; fall back to the compact form regardless.
pub fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// The table for people.
pub fn table(locks: &[LockInfo]) -> String {
    table_with_holders(locks, &[])
}

/// The table for people; `holders[i]` (when given) are the holders of `locks[i]`: a name with
/// several shows its latest holder and `+N more`.
pub fn table_with_holders(locks: &[LockInfo], holders: &[Vec<LeaseHolder>]) -> String {
    let header = ["NAME", "HOLDER", "TOKEN", "ACQUIRED", "EXPIRES"].map(str::to_owned);
    let mut rows = vec![header];
    for (i, info) in locks.iter().enumerate() {
        let mut holder = holder_text(info);
        if let Some(more) = holders.get(i).map(Vec::len).filter(|n| *n > 1) {
            holder.push_str(&format!(" +{} more", more - 1));
        }
        rows.push([
            shown_name(&info.name),
            holder,
            crate::inspect::token_text(info.fencing_token),
            info.acquired_at.map_or_else(
                || "-".to_owned(),
                |at| humantime::format_rfc3339_seconds(at).to_string(),
            ),
            expires_text(info),
        ]);
    }
    let mut widths = [0usize; 5];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            if i + 1 < row.len() {
                line.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Writes to stdout; a closed pipe (`mongolock list | head -1`) is not an error.
pub fn write_stdout(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::failure(format!("cannot write to stdout: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongolock::{HolderInfo, LeaseId};
    use std::time::UNIX_EPOCH;

    #[test]
    fn names_with_control_characters_are_escaped() {
        assert_eq!(shown_name("reports:daily"), "reports:daily");
        assert_eq!(shown_name("évé 🦀"), "évé 🦀");
        assert_eq!(shown_name("evil\x1b[31mRED"), "\"evil\\u{1b}[31mRED\"");
        assert_eq!(shown_name("two\nlines"), "\"two\\nlines\"");
    }

    fn info(held: bool, lease: bool) -> LockInfo {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        LockInfo {
            name: "reports:daily".into(),
            held,
            lease_id: lease.then(|| LeaseId::from_string("abc")),
            fencing_token: Some(7),
            holder: Some(HolderInfo::new(
                "build-7",
                4242,
                Some("mongolock exec ./report.sh".into()),
            )),
            acquired_at: Some(now - Duration::from_millis(4200)),
            expires_at: Some(if held {
                now + Duration::from_millis(12_345)
            } else {
                now - Duration::from_secs(3)
            }),
            observed_at: now,
        }
    }

    #[test]
    fn states_and_expiry_texts() {
        assert_eq!(expires_text(&info(true, true)), "in 12.3s");
        assert_eq!(expires_text(&info(false, true)), "expired");
        assert_eq!(expires_text(&info(false, false)), "released");
        let i = info(true, true);
        assert_eq!(ago_text(&i, i.acquired_at.unwrap()), "4.2s ago");
    }

    #[test]
    fn json_has_stable_fields() {
        let v = to_json(&info(true, true));
        assert_eq!(v["name"], "reports:daily");
        assert_eq!(v["state"], "held");
        assert_eq!(v["fencing_token"], 7);
        assert_eq!(v["holder"]["pid"], 4242);
        assert_eq!(v["expires_in_ms"], 12_345);
        assert_eq!(v["acquired_at"], "2023-11-14T22:13:15.800Z");
        let v = to_json(&info(false, false));
        assert_eq!(v["lease_id"], Value::Null);
        assert_eq!(v["expires_in_ms"], -3000);
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(&[info(true, true), info(false, false)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        let col = lines[0].find("TOKEN").unwrap();
        assert_eq!(&lines[1][col..col + 1], "7");
        assert!(lines[1].ends_with("in 12.3s"), "{t}");
        assert!(lines[2].ends_with("released"), "{t}");
    }
}
