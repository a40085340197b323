//! What `exec` and `elect` report while they run: a message for people on stderr, and with
//! `--json` / `--json-fd FD` the same as one JSON object per line.
//!
//! # Where the lines go
//! * default: messages on stderr (`mongolock: ...`), no JSON;
//! * `--json`: JSON lines on stderr *instead of* the messages (each event carries its message
//!   as `"message"`, so nothing is lost); diagnostics (`tracing`) are then off unless `-v` or
//!   `MONGOLOCK_LOG` asks for them. CMD shares stderr, so its own output may be mixed in;
//! * `--json-fd FD`: JSON lines on FD, messages on stderr as by default. FD is made
//!   close-on-exec (3 and above), so CMD and the processes it starts never write to it, and a
//!   reader sees end-of-file when mongolock exits.
//!
//! Every line is written with a single `write`, so lines are never interleaved with each other
//! or with CMD's output.
//!
//! # The events
//! Every object has `"event"` (its kind), `"schema_version"` ([`SCHEMA_VERSION`]) and `"time"`
//! (this host's clock, RFC 3339 UTC, for ordering logs only). Events about a lease also have `"name"`, `"fencing_token"`,
//! `"lease_id"`, `"acquired_at"` and `"expires_at"` — the last two the *server's* times as
//! reported by the database, RFC 3339 UTC with milliseconds — the field names of
//! `list --json`. `exec`'s `mode` is `exclusive`, `slot` (`--limit`, with `limit`), `shared` or
//! `write`. With several names (`exec a b -- CMD`), events carry `names` and `fencing_tokens`
//! (in the order the names are taken), `leases` (each lease's fields) and the earliest
//! `expires_at` instead (see `held.rs`). Kinds:
//!
//! | event          | when                                                             | extra fields |
//! |----------------|------------------------------------------------------------------|--------------|
//! | `waiting`      | `exec` starts waiting for the lock                               | `wait`, `mode`, `limit` (`--limit`) |
//! | `busy`         | `exec --wait` ran out; CMD not run                               | `holder`, `held_by`, `exit_code`, `mode`, `limit` |
//! | `campaigning`  | `elect` starts campaigning                                       | `leader` |
//! | `leader`       | `elect`: another process became leader, or the role became free | `leader` (`null`: none) |
//! | `acquired`     | the lock was acquired (`elect`: this process became leader)      | `waited_ms`, `mode` and `limit` (exec), `term` (elect) |
//! | `started`      | CMD was started                                                  | `pid` |
//! | `renewed`      | a renewal moved the lease's expiry                               | |
//! | `lost`         | the lease was lost while CMD ran; CMD is being stopped           | `reason`, `action` |
//! | `sigkill`      | CMD had not exited after SIGTERM; SIGKILL sent                   | |
//! | `signal`       | a signal to mongolock was passed on to CMD                       | `signal` |
//! | `exited`       | CMD exited                                                       | `status`, `exit_code` or `signal` |
//! | `stopped`      | the run ends because the lease was lost (`elect`: campaigns again) | `exit_code` (`exec`) |
//! | `released`     | the lock was released (`elect`: resigned)                        | `min_hold`, `held_until` (server time; `exec --min-hold`) |
//! | `release-failed` | the release failed; the lease expires by itself                | |
//! | `interrupted`  | a signal ended the wait or the campaign                          | `signal` |
//! | `unreachable`  | waiting: the database has not answered for a while (every 30 s)  | `unreachable_ms`, `error` |
//! | `reachable`    | waiting: the database answers again after `unreachable`          | `unreachable_ms` |
//! | `error`        | mongolock failed                                                 | `exit_code` |
//! | `exit`         | mongolock exits (always the last line)                           | `exit_code` |
//!
//! `busy`'s `holder` is the current (for `--limit`/`--shared`: the latest) holder as an object,
//! `null` when it could not be read: `host`, `pid`, `app` (`null` when none), `fencing_token`,
//! `lease_id`, `acquired_at`, `expires_at` (server times) and `expires_in_ms` (from the server's
//! time of the read). `held_by` is the same as one string for people (kept from version 1).
//!
//! # Versions
//! `schema_version` is 2. Version 1 (mongolock before it; no `schema_version` field) had the
//! same events without `holder` in `busy`, `unreachable` and `reachable`. Versions only grow:
//! a new version may add events and fields, and one that removes, renames or changes the meaning
//! of a field gets a new number, so a consumer that checks `schema_version <= 2` reads every
//! event it knows correctly.
//!
//! # --quiet
//! `-q` (`MONGOLOCK_QUIET`) leaves out the messages of the informational events (`busy`,
//! `campaigning`, `leader`, elect's `acquired` and `released`): JSON lines are written as
//! always, and problems (`lost`, `error`, `unreachable`, ...) keep their messages.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use mongolock::election::LeaderInfo;
use mongolock::LockGuard;
use serde_json::{json, Map, Value};

use crate::cli::EventArgs;
use crate::exit::CliError;
use crate::list::timestamp;

/// Where JSON lines go.
enum Sink {
    Stderr,
    File(File),
}

/// The process-wide reporter, set once by [`init`] (before that, and for commands other than
/// `exec`/`elect`: messages only).
struct Reporter {
    json: Option<Mutex<Sink>>,
    /// Whether messages go to stderr.
    messages: bool,
}

static REPORTER: OnceLock<Reporter> = OnceLock::new();

/// The version of the JSON events' schema (`"schema_version"`); see the module docs.
pub const SCHEMA_VERSION: u32 = 2;

/// `--quiet`: messages of informational events are not printed.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Leaves out the messages of informational events from now on (`--quiet`).
pub fn set_quiet() {
    QUIET.store(true, Ordering::Relaxed);
}

/// Whether `--quiet` is on.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Whether messages for people go to stderr (not replaced by `--json` there).
pub fn messages_on_stderr() -> bool {
    reporter().messages
}

fn reporter() -> &'static Reporter {
    REPORTER.get_or_init(|| Reporter {
        json: None,
        messages: true,
    })
}

/// Sets up the reporting that `args` asks for. Fails when `--json-fd` is not an open
/// descriptor.
pub fn init(args: &EventArgs) -> Result<(), CliError> {
    let reporter = match args.json_fd {
        Some(fd) => Reporter {
            json: Some(Mutex::new(Sink::File(open_fd(fd)?))),
            messages: true,
        },
        None if args.json => Reporter {
            json: Some(Mutex::new(Sink::Stderr)),
            messages: false,
        },
        None => return Ok(()),
    };
    // A second call (there is none) would keep the first setting.
    let _ = REPORTER.set(reporter);
    Ok(())
}

/// Whether JSON lines go to stderr (diagnostics are then off by default).
pub fn json_on_stderr(args: &EventArgs) -> bool {
    args.json && args.json_fd.is_none()
}

/// Whether JSON events are being written.
pub fn enabled() -> bool {
    reporter().json.is_some()
}

/// Our own close-on-exec copy of `fd`; the original is made close-on-exec too when it is not
/// one of the standard descriptors, so that CMD does not inherit it.
fn open_fd(fd: i32) -> Result<File, CliError> {
    let bad = |e: std::io::Error| {
        CliError::with_code(
            crate::exit::USAGE,
            format!(
                "--json-fd {fd}: {e}; open it for the command, for example `mongolock exec \
                 --json-fd 3 ... 3>events.jsonl`"
            ),
        )
    };
    // SAFETY: fcntl with F_DUPFD_CLOEXEC on any number is harmless: it fails with EBADF when
    // `fd` is not open.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(bad(std::io::Error::last_os_error()));
    }
    // SAFETY: `copy` is a new descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(copy) };
    if fd > 2 {
        // SAFETY: as above; `fd` is open (it was just duplicated).
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(file)
}

/// One event; build it, then [`emit`](Event::emit) it.
#[must_use = "an event does nothing until emitted"]
pub struct Event {
    fields: Map<String, Value>,
    message: Option<String>,
    /// The message is only informational: `--quiet` leaves it out.
    informational: bool,
}

impl Event {
    /// An event of kind `kind`, timestamped now (this host's clock).
    pub fn new(kind: &str) -> Self {
        let mut fields = Map::new();
        fields.insert("event".into(), kind.into());
        fields.insert("schema_version".into(), SCHEMA_VERSION.into());
        fields.insert("time".into(), timestamp(SystemTime::now()).into());
        Event {
            fields,
            message: None,
            informational: false,
        }
    }

    /// Adds a field.
    pub fn field(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.into(), value.into());
        self
    }

    /// Adds the lock name only (before a lease exists).
    pub fn name(self, name: &str) -> Self {
        self.field("name", name)
    }

    /// Adds the lease's fields: name, fencing token, lease id, server times.
    pub fn lease(self, guard: &LockGuard) -> Self {
        self.field("name", guard.name())
            .field("fencing_token", guard.fencing_token())
            .field("lease_id", guard.lease_id().as_str())
            .field("acquired_at", timestamp(guard.acquired_at()))
            .field("expires_at", timestamp(guard.expires_at()))
    }

    /// Adds a [`Lease`] snapshot's fields.
    pub fn lease_snapshot(self, lease: &Lease) -> Self {
        self.field("name", lease.name.as_str())
            .field("fencing_token", lease.fencing_token)
            .field("lease_id", lease.lease_id.as_str())
            .field("acquired_at", timestamp(lease.acquired_at))
            .field("expires_at", timestamp(lease.expires_at))
    }

    /// The message for people (printed on stderr unless JSON replaces it there).
    pub fn message(mut self, text: impl Into<String>) -> Self {
        self.message = Some(text.into());
        self
    }

    /// Marks the message as informational (a normal run, a busy lock): `--quiet` leaves it out
    /// on stderr; the JSON line still carries it.
    pub fn info(mut self) -> Self {
        self.informational = true;
        self
    }

    /// Writes the event: the message on stderr (when messages go there) and the JSON line.
    pub fn emit(mut self) {
        let reporter = reporter();
        if let Some(message) = &self.message {
            if reporter.messages && !(self.informational && quiet()) {
                say!("{message}");
            }
            self.fields
                .insert("message".into(), message.as_str().into());
        }
        if let Some(sink) = &reporter.json {
            let mut line = Value::Object(self.fields).to_string();
            line.push('\n');
            // A poisoned lock only means another thread panicked mid-write; keep writing.
            let mut sink = sink.lock().unwrap_or_else(|e| e.into_inner());
            let written = match &mut *sink {
                Sink::Stderr => std::io::stderr().lock().write_all(line.as_bytes()),
                Sink::File(file) => file.write_all(line.as_bytes()),
            };
            if let Err(e) = written {
                tracing::debug!(error = %e, "cannot write a JSON event");
            }
        }
    }
}

/// The fields of a lease kept for events after its guard is gone (released).
#[derive(Clone, Debug)]
pub struct Lease {
    pub name: String,
    pub fencing_token: u64,
    pub lease_id: String,
    pub acquired_at: SystemTime,
    pub expires_at: SystemTime,
}

impl Lease {
    /// A snapshot of `guard`'s lease.
    pub fn of(guard: &LockGuard) -> Self {
        Lease {
            name: guard.name().to_owned(),
            fencing_token: guard.fencing_token(),
            lease_id: guard.lease_id().as_str().to_owned(),
            acquired_at: guard.acquired_at(),
            expires_at: guard.expires_at(),
        }
    }
}

/// A leader as JSON: the lease fields and the holder, or `null`.
pub fn leader_json(leader: Option<&LeaderInfo>) -> Value {
    let Some(l) = leader else {
        return Value::Null;
    };
    json!({
        "name": l.role,
        "fencing_token": l.term,
        "lease_id": l.lease_id.as_ref().map(|id| id.as_str()),
        "holder": l.holder.as_ref().map(|h| serde_json::to_value(h).unwrap_or(Value::Null)),
        "acquired_at": l.since.map(timestamp),
        "expires_at": l.expires_at.map(timestamp),
    })
}

/// A holder as the JSON object of `busy`'s `"holder"` (see the module docs).
pub fn holder_json(info: &mongolock::LockInfo) -> Value {
    let holder = info.holder.as_ref();
    let expires_in_ms = info
        .expires_at
        .map(|at| match at.duration_since(info.observed_at) {
            Ok(ahead) => i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX),
            Err(behind) => -i64::try_from(behind.duration().as_millis()).unwrap_or(i64::MAX),
        });
    json!({
        "host": holder.map(|h| h.host.as_str()),
        "pid": holder.map(|h| h.pid),
        "app": holder.and_then(|h| h.app_name.as_deref()),
        "fencing_token": info.fencing_token,
        "lease_id": info.lease_id.as_ref().map(|id| id.as_str()),
        "acquired_at": info.acquired_at.map(timestamp),
        "expires_at": info.expires_at.map(timestamp),
        "expires_in_ms": expires_in_ms,
    })
}

/// Reports mongolock's failure: the error event (its message on stderr as always).
pub fn error(e: &CliError) {
    Event::new("error")
        .field("exit_code", e.code)
        .message(format!("mongolock: {e}"))
        .emit();
}

/// The last event: mongolock exits with `code`.
pub fn exit(code: i32) {
    if enabled() {
        Event::new("exit").field("exit_code", code).emit();
    }
}
