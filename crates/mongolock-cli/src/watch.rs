//! `mongolock watch`: a live view of the locks that a person can leave open in a terminal.
//!
//! Each refresh reads every lock (`list`) and shows it. The next refresh comes at the first of:
//! * a change notification for a lock on screen
//!   ([`mongolock::LockBackendExt::wait_for_change`]: the MongoDB
//!   change stream, PostgreSQL's LISTEN/NOTIFY; without notifications it only sleeps);
//! * the moment a lease on screen would expire, so that expiry shows without a write;
//! * `--interval` (default 2 s), which also picks up lock names that were not on screen (change
//!   notifications are per name) and refreshes the "expires in" countdowns.
//!
//! In a terminal each refresh clears the screen and redraws; otherwise each refresh is a plain
//! text block (a header line, the table, a blank line) or, with `--json`, one JSON line.
//!
//! A failed read is shown in place of the table and tried again at the next refresh (a
//! PostgreSQL lock table that does not exist yet, status 66, shows up once the first `exec`
//! creates it; reads never create it). A collection or table that is not mongolock's (status
//! 77) ends `watch` at once, as it ends `list`. With `--once`, or when the last of `--count N`
//! refreshes failed, `watch` exits with that failure's status.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mongolock::{LockBackend, LockBackendExt, LockInfo};
use serde_json::json;

use crate::cli::{GlobalArgs, WatchArgs};
use crate::connect::connect;
use crate::exit::{self, CliError};
use crate::list::{table, timestamp, to_json};

/// Above this many locks on screen, refreshes come every `--interval` only: one change
/// registration per name would cost more than it saves.
const MAX_WATCHED_NAMES: usize = 1000;

/// A refresh scheduled for a lease's expiry comes this long after it (the server decides
/// expiry; a read right at the instant could still see the lease).
const AFTER_EXPIRY: Duration = Duration::from_millis(50);

/// The shortest pause between refreshes, so that a lease the server still reports right at its
/// expiry cannot cause a burst of reads.
const MIN_PAUSE: Duration = Duration::from_millis(100);

/// ANSI: cursor home, clear the screen.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// `mongolock watch`.
pub async fn run(global: &GlobalArgs, args: WatchArgs) -> Result<i32, CliError> {
    let conn = connect(global).await?;
    let provider = conn.provider(None, None)?;
    let backend = provider.backend().clone();
    // Starts the backend's change feed (where it has one), so that it is live by the second
    // refresh.
    let _ = backend.live_notifications();
    let namespace = conn.namespace();
    let terminal = !args.json && std::io::stdout().is_terminal();
    let limit = if args.once { Some(1) } else { args.count };
    let mut shown = 0u64;
    loop {
        // The locks, or why this refresh failed (the exit status if it is the last).
        let (locks, failed) = match provider.list_matching(&args.filter.filter()).await {
            Ok(locks) => (Some(locks), None),
            Err(e) => {
                let err = conn.error(&format!("cannot list locks in {namespace}"), &e);
                // A store that is not mongolock's stays so: no refresh would show locks. (A
                // missing PostgreSQL table is shown and read again: the first `exec` creates
                // it.)
                if args.once || matches!(e, mongolock::Error::ForeignCollection { .. }) {
                    return Err(err);
                }
                // Shown in place of the table; the next refresh tries again.
                let text = if args.json {
                    format!(
                        "{}\n",
                        json!({ "namespace": namespace, "error": err.message })
                    )
                } else {
                    format!(
                        "{}mongolock watch: {}; trying again in {}\n\n",
                        if terminal { CLEAR } else { "" },
                        err.message,
                        crate::duration::display(args.interval)
                    )
                };
                if !write(&text)? {
                    return Ok(exit::SUCCESS);
                }
                (None, Some(err))
            }
        };
        if let Some(locks) = &locks {
            let live = backend.live_notifications();
            let text = render(&namespace, locks, &args, terminal, live);
            if !write(&text)? {
                // Whoever read our output is gone (`mongolock watch | head`).
                return Ok(exit::SUCCESS);
            }
        }
        shown += 1;
        if limit.is_some_and(|n| shown >= n) {
            return match failed {
                Some(err) => Err(err),
                None => Ok(exit::SUCCESS),
            };
        }
        next_refresh(&backend, locks.as_deref().unwrap_or(&[]), args.interval).await;
    }
}

/// Waits until the next refresh is due (see the module docs).
async fn next_refresh(backend: &Arc<dyn LockBackend>, locks: &[LockInfo], interval: Duration) {
    let mut wait = interval;
    for info in locks.iter().filter(|i| i.held) {
        if let Some(left) = info
            .expires_at
            .and_then(|at| at.duration_since(info.observed_at).ok())
        {
            wait = wait.min((left + AFTER_EXPIRY).max(MIN_PAUSE));
        }
    }
    if locks.is_empty() || locks.len() > MAX_WATCHED_NAMES {
        tokio::time::sleep(wait).await;
        return;
    }
    // Each completes on a change of its name, or after `wait` (a plain sleep where the backend
    // has no notifications).
    let waits = locks
        .iter()
        .map(|info| backend.wait_for_change(&info.name, wait));
    futures_util::future::select_all(waits).await;
}

/// One refresh as text.
fn render(
    namespace: &str,
    locks: &[LockInfo],
    args: &WatchArgs,
    terminal: bool,
    live: bool,
) -> String {
    // The server's time of the read when there is a lock to tell it, else ours.
    let (at, clock) = match locks.first() {
        Some(info) => (info.observed_at, "server time"),
        None => (SystemTime::now(), "local time"),
    };
    if args.json {
        let refresh = json!({
            "namespace": namespace,
            "observed_at": timestamp(at),
            "locks": locks.iter().map(to_json).collect::<Vec<_>>(),
        });
        return format!("{refresh}\n");
    }
    let held = locks.iter().filter(|i| i.held).count();
    let refresh = if live {
        format!(
            "on change, at least every {}",
            crate::duration::display(args.interval)
        )
    } else {
        format!("every {}", crate::duration::display(args.interval))
    };
    let header = format!(
        "mongolock watch: {namespace}: {} lock{}{}, {held} held; {} ({clock}); refresh {refresh}",
        locks.len(),
        if locks.len() == 1 { "" } else { "s" },
        args.filter.describe(),
        humantime::format_rfc3339_seconds(at),
    );
    let body = if locks.is_empty() {
        "no locks\n".to_owned()
    } else {
        table(locks)
    };
    if terminal {
        format!("{CLEAR}{header}\n\n{body}")
    } else {
        format!("{header}\n{body}\n")
    }
}

/// Writes one refresh to stdout; `Ok(false)` when the reader has gone (a closed pipe).
fn write(text: &str) -> Result<bool, CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(CliError::failure(format!("cannot write to stdout: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongolock::{HolderInfo, LeaseId};
    use std::time::UNIX_EPOCH;

    fn args(json: bool) -> WatchArgs {
        WatchArgs {
            interval: Duration::from_secs(2),
            once: false,
            count: None,
            json,
            filter: crate::cli::FilterArgs {
                held: false,
                prefix: None,
            },
        }
    }

    fn held() -> LockInfo {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        LockInfo {
            name: "deploy".into(),
            held: true,
            lease_id: Some(LeaseId::from_string("ab12")),
            fencing_token: Some(17),
            holder: Some(HolderInfo::new("build-7", 4242, None)),
            acquired_at: Some(now - Duration::from_secs(4)),
            expires_at: Some(now + Duration::from_secs(26)),
            observed_at: now,
        }
    }

    #[test]
    fn a_terminal_gets_a_redrawn_screen_and_a_pipe_plain_blocks() {
        let locks = [held()];
        let screen = render("db.locks", &locks, &args(false), true, true);
        assert!(screen.starts_with(CLEAR), "{screen:?}");
        assert!(screen.contains("1 lock, 1 held"), "{screen}");
        assert!(
            screen.contains("refresh on change, at least every 2s"),
            "{screen}"
        );
        let block = render("db.locks", &locks, &args(false), false, false);
        assert!(!block.contains('\x1b'), "{block:?}");
        assert!(
            block.starts_with("mongolock watch: db.locks: 1 lock, 1 held;"),
            "{block}"
        );
        assert!(block.contains("refresh every 2s"), "{block}");
        assert!(block.ends_with("in 26.0s\n\n"), "{block:?}");
        let empty = render("db.locks", &[], &args(false), false, false);
        assert!(
            empty.contains("0 locks, 0 held") && empty.contains("no locks"),
            "{empty}"
        );
    }

    #[test]
    fn json_refreshes_are_one_line_each() {
        let line = render("db.locks", &[held()], &args(true), false, true);
        assert_eq!(line.lines().count(), 1, "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(v["namespace"], "db.locks");
        assert_eq!(v["locks"][0]["fencing_token"], 17);
        assert_eq!(v["observed_at"], "2023-11-14T22:13:20.000Z");
    }
}
