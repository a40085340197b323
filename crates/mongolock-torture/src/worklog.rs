//! The workers' append-only JSON-lines logs: one file per worker incarnation, one line per event,
//! each line written with a single `write` call (no user-space buffer), so that a line written
//! before a SIGKILL is in the file.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::checker::WorkerEvent;
use crate::liveness::{LoggedWait, ProcessLog, WaitEnd};

/// How a critical section ended.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EndHow {
    /// `release().await` returned Ok.
    Released,
    /// `release()` returned an error (e.g. the lease was lost).
    ReleaseFailed,
    /// The release future was dropped (a `select!` against a short sleep won).
    ReleaseDropped,
    /// The guard was dropped (background release).
    Dropped,
    /// The lease was left to run out (no automatic extension), then the guard dropped.
    RanOut,
    /// Leadership ended (resigned, lost or shut down) in the election run loop.
    TermEnded,
}

/// One log line.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum LogLine {
    /// The worker incarnation started.
    Start { worker: String, pid: u32, t: i64 },
    /// A lease was granted to this worker.
    Grant {
        name: String,
        token: u64,
        lease: String,
        via: String,
        t: i64,
    },
    /// Before `is_lost()` said false and the fenced write is sent.
    Intent {
        name: String,
        token: u64,
        lease: String,
        wid: String,
        t: i64,
        /// Local wall-clock time (µs) taken right *before* `is_lost()` was called: the lease
        /// was trusted at that instant.
        #[serde(default)]
        checked: Option<i64>,
    },
    /// A shortened extension (`short_extension`): `extend(ttl_ms)` under a timeout while the
    /// server was slowed; `dropped`: the future was dropped before the reply.
    ShortExtension {
        name: String,
        token: u64,
        ttl_ms: u64,
        dropped: bool,
        /// Whether this worker slowed the server itself (PostgreSQL: the row held
        /// `FOR UPDATE`); on MongoDB the injector's fail point may or may not have been on.
        slowed: bool,
        t: i64,
    },
    /// The fenced write's outcome: `ok` = accepted, `Some(false)` = refused, `None` = error.
    Result {
        wid: String,
        ok: Option<bool>,
        t: i64,
    },
    /// `is_lost()` said true before a fenced write; no write was sent.
    Lost {
        name: String,
        token: u64,
        lease: String,
        t: i64,
    },
    /// The critical section ended.
    End {
        name: String,
        token: u64,
        how: EndHow,
        t: i64,
    },
    /// A future was dropped on purpose before it completed (`acquire` or `release`).
    Dropped { what: String, t: i64 },
    /// An operation failed.
    Error { op: String, msg: String, t: i64 },
    /// Right before an acquire call of a liveness name (`crate::liveness`): the wait `id` (per
    /// worker incarnation) begins.
    Wait {
        name: String,
        id: u64,
        via: String,
        t: i64,
    },
    /// Right after the wait `id` ended, and how.
    WaitEnd { id: u64, how: WaitEnd, t: i64 },
    /// The worker exits on request (`waiter_exit`), after withdrawing its waits from the
    /// queues (`flushed`: the waits were ended and `LockProvider::flush` called) or at once;
    /// waits without an end line end here.
    Exit { flushed: bool, t: i64 },
}

/// Local wall-clock time in µs: for humans reading the logs, for rule (9) (a lease trusted after
/// its server expiry) and for the liveness check's waits, which compare it with server times
/// (same host, same clock: see `crate::liveness`).
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// An append-only log file.
pub struct WorkLog {
    file: Mutex<File>,
}

impl WorkLog {
    /// Creates (or appends to) the log at `path`.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(WorkLog {
            file: Mutex::new(file),
        })
    }

    /// Appends one line. Errors are reported on stderr once per line (the log is evidence; a
    /// full disk must not go unnoticed).
    pub fn write(&self, line: &LogLine) {
        let mut text = match serde_json::to_string(line) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("torture: cannot encode a log line: {e}");
                return;
            }
        };
        text.push('\n');
        let mut file = match self.file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Err(e) = file.write_all(text.as_bytes()) {
            eprintln!("torture: cannot write the worker log: {e}");
        }
    }
}

/// Totals read from a log besides the checker's events.
#[derive(Default, Debug, Clone)]
pub struct LogTotals {
    /// Grants the workers received.
    pub grants: u64,
    /// Fenced writes accepted / refused / failed, as the workers saw them.
    pub accepted: u64,
    /// Refused fenced writes.
    pub refused: u64,
    /// Fenced writes that failed with an error.
    pub write_errors: u64,
    /// Times a worker saw `lost` before a write.
    pub lost_seen: u64,
    /// Acquire futures dropped on purpose.
    pub dropped_acquires: u64,
    /// Release futures dropped on purpose.
    pub dropped_releases: u64,
    /// Errors by operation.
    pub errors: u64,
    /// Leases left to run out.
    pub ran_out: u64,
    /// Lines that could not be parsed (a line cut by SIGKILL).
    pub bad_lines: u64,
    /// Shortened extensions sent under a timeout (`short_extension`).
    pub short_ext_sent: u64,
    /// Of those, sent while this worker slowed the server itself (PostgreSQL).
    pub short_ext_slowed: u64,
    /// Of those, the ones whose future was dropped before the reply.
    pub short_ext_dropped: u64,
}

impl LogTotals {
    /// Adds another log's totals.
    pub fn add(&mut self, o: &LogTotals) {
        self.grants += o.grants;
        self.accepted += o.accepted;
        self.refused += o.refused;
        self.write_errors += o.write_errors;
        self.lost_seen += o.lost_seen;
        self.dropped_acquires += o.dropped_acquires;
        self.dropped_releases += o.dropped_releases;
        self.errors += o.errors;
        self.ran_out += o.ran_out;
        self.bad_lines += o.bad_lines;
        self.short_ext_sent += o.short_ext_sent;
        self.short_ext_slowed += o.short_ext_slowed;
        self.short_ext_dropped += o.short_ext_dropped;
    }
}

/// What a log holds for the checkers.
#[derive(Default, Debug)]
pub struct WorkerLog {
    /// The safety checker's events, in order.
    pub events: Vec<WorkerEvent>,
    /// Totals.
    pub totals: LogTotals,
    /// The incarnation and its waits, for the liveness checker.
    pub process: ProcessLog,
}

/// The time of a line.
fn time_of(line: &LogLine) -> i64 {
    match line {
        LogLine::Start { t, .. }
        | LogLine::Grant { t, .. }
        | LogLine::Intent { t, .. }
        | LogLine::ShortExtension { t, .. }
        | LogLine::Result { t, .. }
        | LogLine::Lost { t, .. }
        | LogLine::End { t, .. }
        | LogLine::Dropped { t, .. }
        | LogLine::Error { t, .. }
        | LogLine::Wait { t, .. }
        | LogLine::WaitEnd { t, .. }
        | LogLine::Exit { t, .. } => *t,
    }
}

/// Reads a log: the checker's events in order, totals, and the waits of liveness names.
pub fn read_log(path: &Path) -> std::io::Result<WorkerLog> {
    let reader = BufReader::new(File::open(path)?);
    let mut events = Vec::new();
    let mut totals = LogTotals::default();
    let mut process = ProcessLog::default();
    let mut open: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for line in reader.lines() {
        let line = line?;
        let Ok(parsed) = serde_json::from_str::<LogLine>(&line) else {
            totals.bad_lines += 1;
            continue;
        };
        process.last_us = process.last_us.max(time_of(&parsed));
        match parsed {
            LogLine::Wait { name, id, via, t } => {
                open.insert(id, process.waits.len());
                process.waits.push(LoggedWait {
                    name,
                    id,
                    via,
                    start_us: t,
                    end: None,
                });
            }
            LogLine::WaitEnd { id, how, t } => {
                if let Some(i) = open.remove(&id) {
                    process.waits[i].end = Some((t, how));
                }
            }
            LogLine::Exit { t, .. } => process.exit_us = Some(t),
            LogLine::Grant { .. } => totals.grants += 1,
            LogLine::Intent {
                name,
                token,
                wid,
                checked,
                ..
            } => events.push(WorkerEvent::Intent {
                name,
                token,
                write_id: wid,
                checked_us: checked,
            }),
            LogLine::ShortExtension {
                dropped, slowed, ..
            } => {
                totals.short_ext_sent += 1;
                totals.short_ext_slowed += u64::from(slowed);
                totals.short_ext_dropped += u64::from(dropped);
            }
            LogLine::Result { ok, .. } => match ok {
                Some(true) => totals.accepted += 1,
                Some(false) => totals.refused += 1,
                None => totals.write_errors += 1,
            },
            LogLine::Lost { name, token, .. } => {
                totals.lost_seen += 1;
                events.push(WorkerEvent::Lost { name, token });
            }
            LogLine::End {
                how, name, token, ..
            } => match how {
                EndHow::RanOut => totals.ran_out += 1,
                EndHow::Released => events.push(WorkerEvent::Released { name, token }),
                _ => {}
            },
            LogLine::Dropped { what, .. } => {
                if what == "acquire" {
                    totals.dropped_acquires += 1;
                } else {
                    totals.dropped_releases += 1;
                }
            }
            LogLine::Error { .. } => totals.errors += 1,
            LogLine::Start { worker, pid, t } => {
                process.slot = worker
                    .strip_prefix('w')
                    .and_then(|w| w.split('.').next())
                    .and_then(|w| w.parse().ok());
                process.who = worker;
                process.pid = Some(pid);
                process.start_us = t;
            }
        }
    }
    Ok(WorkerLog {
        events,
        totals,
        process,
    })
}
