//! `mongolock inspect NAME [--json]`: the lock, every holder of a semaphore or read-write
//! lock with its limit, and the processes waiting for it (the handoff queue).

use mongolock::backend::LeaseHolder;
use mongolock::rwlock::READERS_LIMIT;
use mongolock::{LockInfo, QueuedWaiter};
use serde_json::{json, Value};

use crate::cli::{GlobalArgs, InspectArgs};
use crate::connect::connect;
use crate::exit::{self, CliError};
use crate::list::{
    ago_text, expires_text, holder_line, holder_text, pretty, state, timestamp, with_holders,
    write_stdout,
};

/// `mongolock inspect`.
pub async fn run(global: &GlobalArgs, args: InspectArgs) -> Result<i32, CliError> {
    let conn = connect(global).await?;
    let provider = conn.provider(None, None)?;
    let info = provider
        .inspect(&args.name)
        .await
        .map_err(|e| conn.error(&format!("cannot inspect lock {:?}", args.name), &e))?;
    let Some(info) = info else {
        return Err(CliError::with_code(
            exit::NOT_FOUND,
            format!("no lock named {:?} in {}", args.name, conn.namespace()),
        ));
    };
    let holders = if info.held {
        provider
            .holders(&args.name)
            .await
            .map_err(|e| conn.error(&format!("cannot read the holders of {:?}", args.name), &e))?
    } else {
        Vec::new()
    };
    let limit = provider.slot_limit(&args.name).await.map_err(|e| {
        conn.error(
            &format!("cannot read the slot limit of {:?}", args.name),
            &e,
        )
    })?;
    let waiters = provider.waiters(&args.name).await.map_err(|e| {
        conn.error(
            &format!("cannot read the wait queue of {:?}", args.name),
            &e,
        )
    })?;
    let view = View {
        info: &info,
        holders: &holders,
        limit,
        waiters: &waiters,
    };
    if args.json {
        write_stdout(&format!("{}\n", pretty(&view.json())))?;
    } else {
        write_stdout(&view.text())?;
    }
    Ok(exit::SUCCESS)
}

/// What `inspect` shows of one name.
struct View<'a> {
    info: &'a LockInfo,
    holders: &'a [LeaseHolder],
    /// The slot limit while a semaphore or read-write lock's readers hold the name.
    limit: Option<u32>,
    waiters: &'a [QueuedWaiter],
}

impl View<'_> {
    /// The JSON form: the lock as in `list --json` (with `holders`), plus `limit` (`null`
    /// unless slots hold the name), `kind` (`lock`, `semaphore` or `rw_lock_readers`) and
    /// `waiters` (queue order: `id`, `holder`, `until`, `until_in_ms`).
    fn json(&self) -> Value {
        let mut v = with_holders(self.info, self.holders);
        if let Value::Object(map) = &mut v {
            map.insert("kind".to_owned(), json!(self.kind()));
            map.insert("limit".to_owned(), json!(self.limit));
            map.insert(
                "waiters".to_owned(),
                Value::Array(
                    self.waiters
                        .iter()
                        .map(|w| waiter_json(self.info, w))
                        .collect(),
                ),
            );
        }
        v
    }

    fn kind(&self) -> &'static str {
        match self.limit {
            None => "lock",
            Some(READERS_LIMIT) => "rw_lock_readers",
            Some(_) => "semaphore",
        }
    }

    fn text(&self) -> String {
        let mut out = text(self.info, self.holders, self.limit.is_some());
        let width = "fencing token".len() + 1;
        if let Some(limit) = self.limit {
            let what = if limit == READERS_LIMIT {
                "readers of a read-write lock (no limit)".to_owned()
            } else {
                format!("{limit} slots, {} held", self.holders.len())
            };
            out.push_str(&format!("{:<width$} {what}\n", "limit:"));
        }
        if !self.waiters.is_empty() {
            out.push_str(&format!("{:<width$} {}\n", "waiting:", self.waiters.len()));
            for w in self.waiters {
                out.push_str(&format!("  {}\n", waiter_line(self.info, w)));
            }
        }
        out
    }
}

/// One waiter as JSON: the library's serialization of [`QueuedWaiter`] (`id`, `holder`,
/// `until`) and `until_in_ms` (from the lock's `observed_at`).
fn waiter_json(info: &LockInfo, w: &QueuedWaiter) -> Value {
    let mut v = serde_json::to_value(w).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut v {
        map.insert(
            "until_in_ms".to_owned(),
            json!(crate::list::ms_from_observed(info, w.until)),
        );
    }
    v
}

/// One waiter for people: `host (pid 42) app "x"  registered until <time> (in 3.2s)`.
fn waiter_line(info: &LockInfo, w: &QueuedWaiter) -> String {
    let who = w.holder.as_ref().map_or_else(
        || format!("process {} (no metadata: an earlier version)", w.id),
        |h| h.to_string(),
    );
    format!(
        "{who}  registered until {} ({})",
        timestamp(w.until),
        ago_text(info, w.until)
    )
}

/// A lock's fencing token as shown: `-` when the lease has none yet (MongoDB: being issued).
pub(crate) fn token_text(token: Option<u64>) -> String {
    token.map_or_else(|| "-".to_owned(), |t| t.to_string())
}

/// The text form for people; several `holders` (a semaphore's slots, a read-write lock's
/// readers; every one when `slots`) are listed one per line after the lock's own fields.
fn text(info: &LockInfo, holders: &[LeaseHolder], slots: bool) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("name", crate::list::shown_name(&info.name)),
        ("state", state(info).to_owned()),
        (
            if info.held { "holder" } else { "last holder" },
            holder_text(info),
        ),
        ("fencing token", token_text(info.fencing_token)),
    ];
    if let Some(lease) = &info.lease_id {
        rows.push(("lease id", lease.to_string()));
    }
    if let Some(at) = info.acquired_at {
        rows.push((
            "acquired",
            format!("{} ({})", timestamp(at), ago_text(info, at)),
        ));
    }
    if let Some(at) = info.expires_at {
        let rel = if info.held {
            expires_text(info)
        } else {
            ago_text(info, at)
        };
        let label = if info.held { "expires" } else { "ended" };
        rows.push((label, format!("{} ({rel})", timestamp(at))));
    }
    rows.push((
        "observed",
        format!("{} (server time)", timestamp(info.observed_at)),
    ));
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for (key, value) in rows {
        out.push_str(&format!("{:<width$} {value}\n", format!("{key}:")));
    }
    if holders.len() > 1 || (slots && !holders.is_empty()) {
        out.push_str(&format!("{:<width$} {}\n", "holders:", holders.len()));
        for h in holders {
            out.push_str(&format!("  {}\n", holder_line(info, h)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongolock::{HolderInfo, LeaseId};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn text_shows_holder_token_and_expiry() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let info = LockInfo {
            name: "deploy".into(),
            held: true,
            lease_id: Some(LeaseId::from_string("ab12")),
            fencing_token: Some(17),
            holder: Some(HolderInfo::new("build-7", 4242, None)),
            acquired_at: Some(now - Duration::from_secs(4)),
            expires_at: Some(now + Duration::from_secs(26)),
            observed_at: now,
        };
        let t = text(&info, &[], false);
        assert!(t.contains("state:         held\n"), "{t}");
        assert!(t.contains("holder:        build-7 (pid 4242)\n"), "{t}");
        assert!(t.contains("fencing token: 17\n"), "{t}");
        assert!(t.contains("(in 26.0s)"), "{t}");
        assert!(t.contains("(4.0s ago)"), "{t}");
        assert!(!t.contains("holders:"), "{t}");

        let slot = |token: u64, pid: u32, left: u64| LeaseHolder {
            lease_id: LeaseId::from_string(format!("l{token}")),
            fencing_token: token,
            acquired_at: now - Duration::from_secs(1),
            expires_at: now + Duration::from_secs(left),
            holder: Some(HolderInfo::new("build-7", pid, None)),
        };
        let t = text(&info, &[slot(16, 1, 20), slot(17, 4242, 26)], false);
        assert!(t.contains("holders:       2\n"), "{t}");
        assert!(
            t.contains("  token 16  build-7 (pid 1)  expires in 20.0s  lease l16\n"),
            "{t}"
        );
        assert!(t.contains("  token 17  build-7 (pid 4242)"), "{t}");
    }
}
