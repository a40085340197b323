//! `mongolock exec`: run a command while holding a lock. Also the child supervision shared with
//! `elect`: starting CMD under a supervisor process (see `supervisor.rs`) with the lock in its
//! environment, passing signals on, handing the supervisor the lease's deadlines after every
//! renewal, and stopping CMD when the lock is lost.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use mongolock::rwlock::READERS_LIMIT;
use mongolock::{Lock, LockGuard, LockProvider, RwLock, Semaphore};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::cli::{self, ExecArgs, ExecMode, GlobalArgs};
use crate::connect::{connect, Connection};
use crate::duration::{display, human, Wait};
use crate::events::{Event, Lease};
use crate::exit::{self, CliError};
use crate::held::Held;
use crate::signals::{self, Signals};
use crate::status_line;
use crate::supervisor::{
    boot_now_ns, monotonic_now_ns, Deadline, FromSupervisor, ToSupervisor, BOOT_CHECK_TICK,
    SUBCOMMAND,
};

/// Environment variable holding the lock name in CMD's environment.
pub const ENV_NAME: &str = "MONGOLOCK_NAME";
/// Environment variable holding the fencing token in CMD's environment.
pub const ENV_FENCING_TOKEN: &str = "MONGOLOCK_FENCING_TOKEN";

/// `mongolock exec`: connect, acquire (or give up), run CMD under its supervisor, release.
pub async fn run(global: &GlobalArgs, args: ExecArgs) -> Result<i32, CliError> {
    let mut signals = Signals::install()?;
    let (conn, provider) = match connect_supervisor(
        global,
        &mut signals,
        "exec",
        args.ttl,
        args.app_name.clone(),
        &args.child.command,
    )
    .await?
    {
        Ok(connected) => connected,
        Err(status) => return Ok(status),
    };
    let names = args.names();
    if names.len() > 1 {
        return run_set(args, names, signals, conn, provider).await;
    }
    let mode = args.mode();
    let what = mode_what(mode);
    let lock = Acquirer::new(&provider, &args.name, mode)
        .map_err(|e| conn.error("cannot use this lock name", &e))?;

    tracing::info!(lock = %args.name, mode = mode.as_str(), wait = %wait_display(args.wait), "waiting for the lock");
    with_mode(Event::new("waiting").name(&args.name), mode)
        .field("wait", wait_display(args.wait))
        .emit();
    let started = Instant::now();
    // The status line while waiting (none for a single attempt).
    let waiting = (args.wait != Wait::For(Duration::ZERO)).then(|| {
        status_line::start(
            &provider,
            status_line::Subject {
                name: args.name.clone(),
                doing: format!("waiting for {what} {:?}", args.name),
                holder_is: "held by",
            },
        )
    });
    let acquired = tokio::select! {
        r = lock.acquire(args.wait) => {
            r.map_err(|e| acquire_error(&conn, &args.name, mode, &e))?
        }
        sig = signals.recv() => {
            Event::new("interrupted")
                .name(&args.name)
                .field("signal", signals::name(sig))
                .message(format!(
                    "mongolock: {} received while waiting for lock {:?}; command not run",
                    signals::name(sig),
                    args.name
                ))
                .emit();
            return Ok(exit::for_signal(sig));
        }
    };
    drop(waiting);
    let Some(guard) = acquired else {
        let waited = match args.wait {
            Wait::For(d) if d.is_zero() => "after one attempt".to_owned(),
            _ => format!("after waiting {}", human(started.elapsed())),
        };
        let (held_by, holder) = match busy_holder(&provider, &args.name).await {
            Some((text, holder)) => (text, holder),
            None => ("another holder".to_owned(), serde_json::Value::Null),
        };
        let code = i32::from(args.conflict_exit_code);
        with_mode(Event::new("busy").name(&args.name), mode)
            .field("holder", holder)
            .field("held_by", held_by.as_str())
            .field("exit_code", code)
            .message(format!(
                "mongolock: {}; gave up {waited} (--wait {}); command not run",
                busy_text(mode, &args.name, &held_by),
                wait_display(args.wait)
            ))
            .info()
            .emit();
        return Ok(code);
    };
    let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::info!(
        lock = %args.name,
        token = guard.fencing_token(),
        waited_ms,
        "lock acquired; starting the command"
    );
    with_mode(Event::new("acquired").lease(&guard), mode)
        .field("waited_ms", waited_ms)
        .emit();

    let policy = StopPolicy::new(args.ttl, cli::grace(args.grace, args.ttl));
    let child = match spawn(&args.child.command, &guard, policy).await {
        Ok(child) => child,
        Err(e) => {
            release_quietly(guard, &conn).await;
            return Err(e);
        }
    };
    let outcome = supervise(&guard, child, &mut signals, policy, what).await?;
    finish(guard, outcome, &conn, what, args.min_hold).await
}

/// `exec NAME NAME... -- CMD`: the names held together as a [`LockSet`](mongolock::LockSet)
/// (exclusive locks, taken in the order of their names), then CMD supervised as for one lock,
/// stopped when any lease is lost or by the earliest lease's deadline.
async fn run_set(
    args: ExecArgs,
    names: Vec<String>,
    mut signals: Signals,
    conn: Connection,
    provider: LockProvider,
) -> Result<i32, CliError> {
    let what = "one of the locks";
    let shown = names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let set = provider
        .lock_set(names.iter().cloned())
        .map_err(|e| conn.error("cannot use these lock names", &e))?;
    tracing::info!(locks = %shown, wait = %wait_display(args.wait), "waiting for the locks");
    Event::new("waiting")
        .field("names", names.clone())
        .field("mode", ExecMode::Exclusive.as_str())
        .field("wait", wait_display(args.wait))
        .emit();
    let started = Instant::now();
    let acquired = tokio::select! {
        r = async {
            match args.wait {
                Wait::Forever => set.acquire().await.map(Some),
                Wait::For(d) => set.acquire_timeout(d).await,
            }
        } => {
            r.map_err(|e| conn.error(&format!("cannot acquire the locks {shown}"), &e))?
        }
        sig = signals.recv() => {
            Event::new("interrupted")
                .field("names", names.clone())
                .field("signal", signals::name(sig))
                .message(format!(
                    "mongolock: {} received while waiting for the locks {shown}; command not run",
                    signals::name(sig),
                ))
                .emit();
            return Ok(exit::for_signal(sig));
        }
    };
    let Some(guard) = acquired else {
        let waited = match args.wait {
            Wait::For(d) if d.is_zero() => "after one attempt per name".to_owned(),
            _ => format!("after waiting {}", human(started.elapsed())),
        };
        let mut busy = Vec::new();
        for name in &names {
            if let Some(holder) = describe_holder(&provider, name).await {
                busy.push(format!("lock {name:?} is held by {holder}"));
            }
        }
        let held_by = if busy.is_empty() {
            "a lock is held by another holder".to_owned()
        } else {
            busy.join("; ")
        };
        let code = i32::from(args.conflict_exit_code);
        Event::new("busy")
            .field("names", names.clone())
            .field("mode", ExecMode::Exclusive.as_str())
            .field("held_by", held_by.as_str())
            .field("exit_code", code)
            .message(format!(
                "mongolock: {held_by}; gave up {waited} (--wait {}) holding none of {shown}; \
                 command not run",
                wait_display(args.wait)
            ))
            .emit();
        return Ok(code);
    };
    let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::info!(locks = %shown, waited_ms, "locks acquired; starting the command");
    Event::new("acquired")
        .held(&guard)
        .field("mode", ExecMode::Exclusive.as_str())
        .field("waited_ms", waited_ms)
        .emit();
    let policy = StopPolicy::new(args.ttl, cli::grace(args.grace, args.ttl));
    let child = match spawn(&args.child.command, &guard, policy).await {
        Ok(child) => child,
        Err(e) => {
            release_quietly(guard, &conn).await;
            return Err(e);
        }
    };
    let outcome = supervise(&guard, child, &mut signals, policy, what).await?;
    finish(guard, outcome, &conn, what, args.min_hold).await
}

/// What `exec` acquires for its mode: the one acquisition step of every mode (the wait, the
/// guard and everything after it are the same).
enum Acquirer {
    Lock(Lock),
    Semaphore(Semaphore),
    Read(RwLock),
    Write(RwLock),
}

impl Acquirer {
    fn new(provider: &LockProvider, name: &str, mode: ExecMode) -> mongolock::Result<Self> {
        Ok(match mode {
            ExecMode::Exclusive => Acquirer::Lock(provider.lock(name)?),
            ExecMode::Slots(limit) => Acquirer::Semaphore(provider.semaphore(name, limit)?),
            ExecMode::Shared => Acquirer::Read(provider.rw_lock(name)?),
            ExecMode::Write => Acquirer::Write(provider.rw_lock(name)?),
        })
    }

    /// Acquires within `wait` (`--wait 0`: one attempt); `None` when it ran out. Cancel-safe
    /// (as the library's).
    async fn acquire(&self, wait: Wait) -> mongolock::Result<Option<LockGuard>> {
        match (self, wait) {
            (Acquirer::Lock(lock), Wait::Forever) => lock.acquire().await.map(Some),
            (Acquirer::Lock(lock), Wait::For(d)) => lock.acquire_timeout(d).await,
            (Acquirer::Semaphore(sem), Wait::Forever) => sem.acquire().await.map(Some),
            (Acquirer::Semaphore(sem), Wait::For(d)) => sem.acquire_timeout(d).await,
            (Acquirer::Read(rw), Wait::Forever) => rw.read().await.map(Some),
            (Acquirer::Read(rw), Wait::For(d)) => rw.read_timeout(d).await,
            (Acquirer::Write(rw), Wait::Forever) => rw.write().await.map(Some),
            (Acquirer::Write(rw), Wait::For(d)) => rw.write_timeout(d).await,
        }
    }
}

/// How messages name what `exec` holds in `mode` ("lost the read lock \"x\"").
fn mode_what(mode: ExecMode) -> &'static str {
    match mode {
        ExecMode::Exclusive => "the lock",
        ExecMode::Write => "the write lock",
        ExecMode::Shared => "the read lock",
        ExecMode::Slots(_) => "the slot of semaphore",
    }
}

/// Adds `mode` (and `limit` for slots) to an event.
fn with_mode(event: Event, mode: ExecMode) -> Event {
    let event = event.field("mode", mode.as_str());
    match mode {
        ExecMode::Slots(limit) => event.field("limit", limit),
        _ => event,
    }
}

/// Why the acquisition did not succeed in time, for the `busy` message.
fn busy_text(mode: ExecMode, name: &str, held_by: &str) -> String {
    match mode {
        ExecMode::Exclusive => format!("lock {name:?} is held by {held_by}"),
        ExecMode::Write => {
            format!(
                "lock {name:?} is held by {held_by} (a writer, readers or another waiting writer)"
            )
        }
        ExecMode::Shared => format!(
            "lock {name:?} is held for writing, or a writer is waiting for it (latest holder: \
             {held_by})"
        ),
        ExecMode::Slots(limit) => format!(
            "all {limit} slots of semaphore {name:?} are taken, or it is held as a lock \
             (latest holder: {held_by})"
        ),
    }
}

/// The error for a failed acquisition; a slot-limit disagreement gets its own status
/// ([`exit::LIMIT_MISMATCH`]) and says which flags disagree.
fn acquire_error(conn: &Connection, name: &str, mode: ExecMode, e: &mongolock::Error) -> CliError {
    let mongolock::Error::LimitMismatch { held, .. } = e else {
        return conn.error(&format!("cannot acquire {} {name:?}", mode_what(mode)), e);
    };
    let held_as = if *held == READERS_LIMIT {
        "by --shared readers (a read-write lock)".to_owned()
    } else {
        format!("as a semaphore with --limit {held}")
    };
    let asked = match mode {
        ExecMode::Slots(limit) => format!("--limit {limit}"),
        _ => "--shared".to_owned(),
    };
    CliError::with_code(
        exit::LIMIT_MISMATCH,
        format!(
            "cannot acquire {name:?} with {asked}: it is held {held_as}; every process using \
             the name must use it the same way (the same --limit, or --shared/--write for all), \
             or use another name; command not run"
        ),
    )
}

/// The start `exec` and `elect` share: connects, and opens a provider whose leases last `ttl`
/// and name the holder `app_name` (by default `mongolock SUBCOMMAND CMD`). `Err` holds the exit
/// status when a signal arrives before the connection is made.
pub async fn connect_supervisor(
    global: &GlobalArgs,
    signals: &mut Signals,
    subcommand: &str,
    ttl: Duration,
    app_name: Option<String>,
    command: &[OsString],
) -> Result<Result<(Connection, LockProvider), i32>, CliError> {
    let conn = tokio::select! {
        c = connect(global) => c?,
        sig = signals.recv() => return Ok(Err(exit::for_signal(sig))),
    };
    let app = app_name.unwrap_or_else(|| default_app_name(subcommand, command));
    let provider = conn.provider(Some(ttl), Some(app))?;
    Ok(Ok((conn, provider)))
}

/// What became of a supervised command.
pub struct Outcome {
    /// How the command ended.
    pub status: ExitStatus,
    /// Whether the lock was lost while it ran (it was then stopped by us).
    pub lost: bool,
}

/// Releases the lock after the command ended and chooses the exit status: the command's own,
/// or [`exit::LOCK_LOST`] when the lease was lost before the command finished (noticed while it
/// ran, or only at release).
///
/// With `min_hold` (`--min-hold`), whatever the command's status, the lease ends no earlier
/// than `min_hold` after its grant by the database's clock
/// ([`LockGuard::release_after`]). A lease already lost has nothing left to hold: that is
/// reported as a loss, as without it. (`--limit` and `--shared` are refused with it by the
/// argument parser: only exclusive leases can be held on.)
pub async fn finish(
    guard: impl Held,
    outcome: Outcome,
    conn: &Connection,
    what: &str,
    min_hold: Option<Duration>,
) -> Result<i32, CliError> {
    let leases = guard.leases();
    let subject = guard.subject(what);
    let status = describe_status(outcome.status);
    if outcome.lost {
        guard.release_after_loss().await;
        Event::new("stopped")
            .leases(&leases)
            .field("exit_code", exit::LOCK_LOST)
            .message(format!(
                "mongolock: the command was stopped ({status}) because {subject} was lost; \
                 exiting with status {}",
                exit::LOCK_LOST
            ))
            .emit();
        return Ok(exit::LOCK_LOST);
    }
    if guard.is_lost() {
        // Lost after the command's last check but before it exited: no release to attempt.
        let reason = guard.lost_reason();
        guard.release_after_loss().await;
        lost_after_exit_of(&leases, &subject, &status, reason);
        return Ok(exit::LOCK_LOST);
    }
    // Each lease is kept until its own grant time plus the hold: the last one ends then.
    let held_until = min_hold.and_then(|d| leases.iter().map(|l| l.acquired_at + d).max());
    match guard.release_with(min_hold).await {
        Ok(()) => {
            let mut event = Event::new("released").leases(&leases);
            if let (Some(d), Some(until)) = (min_hold, held_until) {
                tracing::info!(
                    min_hold = %crate::duration::display(d),
                    "{subject} released with a minimum hold: the database keeps it held until its grant time plus the minimum hold"
                );
                event = event
                    .field("min_hold", display(d))
                    .field("held_until", crate::list::timestamp(until));
            }
            event.emit();
            Ok(exit::for_child(outcome.status))
        }
        Err(e @ mongolock::Error::LeaseLost { .. }) => {
            let reason = (leases.len() > 1).then(|| format!("found lost at release: {e}"));
            lost_after_exit_of(&leases, &subject, &status, reason);
            Ok(exit::LOCK_LOST)
        }
        Err(e) => {
            // The lease expires by itself within --ttl.
            Event::new("release-failed")
                .leases(&leases)
                .message(format!(
                    "mongolock: warning: {}; it expires by itself at the end of its lease",
                    conn.error(&format!("could not release {subject}"), &e)
                ))
                .emit();
            Ok(exit::for_child(outcome.status))
        }
    }
}

/// Reports a lease found lost only after the command exited (`status` describes its exit).
pub fn lost_after_exit(lease: &Lease, what: &str, status: &str, reason: Option<String>) {
    let subject = format!("{what} {:?}", lease.name);
    lost_after_exit_of(std::slice::from_ref(lease), &subject, status, reason);
}

/// Reports leases found lost only after the command exited; `subject` names them.
fn lost_after_exit_of(leases: &[Lease], subject: &str, status: &str, reason: Option<String>) {
    Event::new("lost")
        .leases(leases)
        .field(
            "reason",
            reason.unwrap_or_else(|| "found lost at release".to_owned()),
        )
        .field("action", "none (the command had exited)")
        .field("exit_code", exit::LOCK_LOST)
        .message(lost_before_finish(subject, status))
        .emit();
}

/// The message for a lease found lost only after the command exited; `subject` names it.
pub fn lost_before_finish(subject: &str, status: &str) -> String {
    format!(
        "mongolock: {subject} was lost before the command finished ({status}): the lease \
         expired and was taken over or was force-released, or could not be renewed, so the \
         command's work may have overlapped another holder's; exiting with status {}",
        exit::LOCK_LOST
    )
}

/// Releases after a failure to start the command; problems are only logged.
pub async fn release_quietly(guard: impl Held, conn: &Connection) {
    let name = guard.subject("");
    if let Err(e) = guard.release_with(None).await {
        tracing::warn!(lock = %name.trim(), error = %conn.error("release", &e), "could not release the lock");
    }
}

/// The default holder application name: `mongolock exec ./backup.sh`.
pub fn default_app_name(subcommand: &str, command: &[OsString]) -> String {
    let program = command
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut app = format!("mongolock {subcommand} {program}");
    if app.len() > 200 {
        let mut cut = 200;
        while !app.is_char_boundary(cut) {
            cut -= 1;
        }
        app.truncate(cut);
    }
    app
}

fn wait_display(wait: Wait) -> String {
    match wait {
        Wait::Forever => "forever".into(),
        Wait::For(d) => display(d),
    }
}

/// `host (pid 12) app "x" (fencing token 7, lease expires in 12.3s)` for the current holder
/// of `name`; `None` when nobody holds it or it cannot be read.
pub async fn describe_holder(provider: &LockProvider, name: &str) -> Option<String> {
    busy_holder(provider, name).await.map(|(text, _)| text)
}

/// [`describe_holder`]'s text, and the holder as the JSON object of the `busy` event
/// ([`crate::events::holder_json`]).
async fn busy_holder(provider: &LockProvider, name: &str) -> Option<(String, serde_json::Value)> {
    let info = provider.inspect(name).await.ok()??;
    if !info.held {
        return None;
    }
    let holder = info
        .holder
        .as_ref()
        .map_or_else(|| "another holder".to_owned(), |h| h.to_string());
    let expires = info.expires_at.map_or_else(String::new, |at| {
        let left = at
            .duration_since(info.observed_at)
            .unwrap_or(Duration::ZERO);
        format!(", lease expires in {}", human(left))
    });
    let text = format!(
        "{holder} (fencing token {}{expires})",
        crate::inspect::token_text(info.fencing_token)
    );
    Some((text, crate::events::holder_json(&info)))
}

pub fn describe_status(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        format!("exit status {code}")
    } else if let Some(sig) = status.signal() {
        format!("killed by {}", signals::name(sig))
    } else {
        status.to_string()
    }
}

/// Whether mongolock runs in the foreground process group of its controlling terminal, where
/// the terminal itself delivers Ctrl-C (SIGINT/SIGQUIT) to every process of the group.
fn in_terminal_foreground() -> bool {
    let Ok(tty) = std::fs::File::open("/dev/tty") else {
        return false;
    };
    // SAFETY: tcgetpgrp and getpgrp only read process state; the descriptor is open for the
    // duration of the call.
    let (fg, me) = unsafe { (libc::tcgetpgrp(tty.as_raw_fd()), libc::getpgrp()) };
    fg >= 0 && fg == me
}

/// When the command is stopped, derived from `--ttl` and `--grace`.
#[derive(Clone, Copy, Debug)]
pub struct StopPolicy {
    /// While renewals fail, SIGTERM goes out when this much trusted lease time is left; after a
    /// reported loss, SIGKILL follows SIGTERM after this long (zero: SIGKILL only).
    grace: Duration,
    /// SIGKILL comes this long before the lease's local deadline (1 % of the TTL, at least
    /// [`MIN_KILL_MARGIN`]), so that the command is dead, not merely signalled, by then.
    margin: Duration,
    /// How often the guard's local deadline is checked for a successful renewal (the guard
    /// offers no notification). A twentieth of the TTL: renewals happen every third of it, so a
    /// new deadline reaches the supervisor long before the old one's SIGTERM.
    refresh: Duration,
}

/// The least time SIGKILL comes before the lease's local deadline, whatever the TTL. A killed
/// process is dead only once the scheduler has run its exit: on a 2-core machine at load
/// average 7–9 it was seen gone up to 96 ms after SIGKILL, about as long as when its session
/// (autogroup) got far less CPU than another (docs/reliability.md, "How long a SIGKILLed
/// process takes to die"). 1 % of a 1 s lease is 10 ms.
pub const MIN_KILL_MARGIN: Duration = Duration::from_millis(100);

impl StopPolicy {
    pub fn new(ttl: Duration, grace: Duration) -> Self {
        StopPolicy {
            grace,
            // A quarter of the lease at most, for leases shorter than the CLI accepts.
            margin: (ttl / 100).max(MIN_KILL_MARGIN).min(ttl / 4),
            refresh: (ttl / 20).clamp(Duration::from_millis(10), Duration::from_millis(500)),
        }
    }

    /// SIGKILL time for a lease trusted until `deadline`.
    fn kill_at(&self, deadline: Instant) -> Instant {
        deadline.checked_sub(self.margin).unwrap_or(deadline)
    }

    /// The deadlines for a lease still being renewed: SIGTERM when `grace` of trusted lease
    /// time is left, SIGKILL at [`kill_at`](Self::kill_at). With `grace` below the margin
    /// (e.g. 0) SIGTERM would come after SIGKILL, and the supervisor sends only SIGKILL.
    fn renewing(&self, deadline: Instant) -> (Instant, Instant) {
        let term = deadline.checked_sub(self.grace).unwrap_or(deadline);
        (term, self.kill_at(deadline))
    }
}

/// `at` as absolute times on the supervisor's two clocks, `CLOCK_MONOTONIC` and
/// `CLOCK_BOOTTIME`: each clock's reading plus the time left until `at` on the monotonic clock.
/// Reading the clocks before `Instant::now()` can only make the result early, never late.
///
/// That boot-time value would be late by a suspend between the guard's request and this call
/// (the monotonic clock stopped meanwhile), so it is capped by the guard's own boot-time
/// deadline less the same distance: `at` lies `d` before the guard's monotonic deadline, so it
/// lies `d` before its boot-time deadline too. Both are the guard's deadlines for the same
/// request; the cap can only make the result earlier.
fn deadline_at(at: Instant, guard: &impl Held) -> Deadline {
    let mono = monotonic_now_ns();
    let boot = boot_now_ns();
    let now = Instant::now();
    let shift = |clock: u64| {
        if at >= now {
            clock.saturating_add(u64::try_from((at - now).as_nanos()).unwrap_or(u64::MAX))
        } else {
            clock.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX))
        }
    };
    let before_guard_deadline = guard.local_deadline().saturating_duration_since(at);
    let guard_boot = u64::try_from(
        guard
            .local_deadline_boot()
            .saturating_sub(before_guard_deadline)
            .as_nanos(),
    )
    .unwrap_or(u64::MAX);
    Deadline {
        mono_ns: shift(mono),
        boot_ns: shift(boot).min(guard_boot),
    }
}

/// mongolock's end of the control channel to the supervisor.
struct Control {
    lines: Lines<BufReader<OwnedReadHalf>>,
    writer: OwnedWriteHalf,
    /// Messages read ahead by [`ready`](Self::ready) (`None`: end-of-file), oldest first.
    ahead: VecDeque<Option<FromSupervisor>>,
}

impl Control {
    /// Sends a message. A supervisor that is gone shows up as end-of-file on the reading side.
    async fn send(&mut self, msg: ToSupervisor) {
        if let Err(e) = self.writer.write_all(msg.encode().as_bytes()).await {
            tracing::debug!(error = %e, "cannot write to the supervisor");
        }
    }

    /// Sends the SIGTERM and SIGKILL deadlines; returns the SIGKILL deadline as sent (on both
    /// clocks), which mongolock's backup enforces too.
    async fn deadlines(&mut self, term: Instant, kill: Instant, guard: &impl Held) -> Deadline {
        let kill = deadline_at(kill, guard);
        self.send(ToSupervisor::Deadlines {
            term: deadline_at(term, guard),
            kill,
        })
        .await;
        kill
    }

    /// The messages that have already arrived, without waiting (they stay queued for
    /// [`next`](Self::next)).
    fn ready(&mut self) -> impl Iterator<Item = &FromSupervisor> {
        use futures_util::FutureExt as _;
        while !matches!(self.ahead.back(), Some(None)) {
            // `read` is cancel-safe: a message not complete yet stays buffered.
            match self.read().now_or_never() {
                Some(msg) => self.ahead.push_back(msg),
                None => break,
            }
        }
        self.ahead.iter().flatten()
    }

    /// Whether the supervisor has sent something not read yet (a report, or end-of-file), by the
    /// kernel's account: after mongolock was stopped or starved, the runtime may not have seen
    /// it yet when a timer or the lost signal fires. Then waits (briefly) until the runtime does,
    /// so that [`next`](Self::next) returns it: mongolock acts on its own only once it has read
    /// what the supervisor already did.
    async fn report_waiting(&mut self) -> bool {
        if !self.ahead.is_empty() || !self.lines.get_ref().buffer().is_empty() {
            return true;
        }
        let half = self.lines.get_ref().get_ref();
        let mut fd = libc::pollfd {
            fd: half.as_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for an open descriptor (owned by `half`); timeout 0.
        let n = unsafe { libc::poll(&mut fd, 1, 0) };
        if n <= 0 || fd.revents == 0 {
            return false;
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), half.readable()).await;
        true
    }

    /// The next message; `None` once the supervisor has closed its end (exited). Cancel-safe.
    async fn next(&mut self) -> Option<FromSupervisor> {
        match self.ahead.pop_front() {
            Some(msg) => msg,
            None => self.read().await,
        }
    }

    /// The next message from the channel itself. Cancel-safe.
    async fn read(&mut self) -> Option<FromSupervisor> {
        loop {
            match self.lines.next_line().await {
                Ok(Some(line)) => match FromSupervisor::decode(&line) {
                    Some(msg) => return Some(msg),
                    None => tracing::debug!(line, "unknown message from the supervisor"),
                },
                Ok(None) | Err(_) => return None,
            }
        }
    }
}

/// A command running under its supervisor process.
pub struct Spawned {
    supervisor: Child,
    control: Control,
    /// SIGINT/SIGQUIT come from the terminal and reach the command directly: do not pass them
    /// on a second time.
    terminal: bool,
    /// The guard deadline the supervisor's current deadlines were computed from.
    sent_deadline: Instant,
    /// The SIGKILL deadline the supervisor was given (on both clocks).
    sent_kill: Deadline,
    /// CMD's pid (the supervisor's child).
    command: i32,
}

/// The path to re-execute this binary as the supervisor. On Linux `/proc/self/exe` works even
/// when the installed binary was replaced or deleted since mongolock started.
fn self_exe() -> std::io::Result<std::path::PathBuf> {
    if cfg!(target_os = "linux") {
        Ok("/proc/self/exe".into())
    } else {
        std::env::current_exe()
    }
}

/// Starts CMD, with the lock in its environment, under a supervisor process (see
/// `supervisor.rs`) that enforces the lease's deadlines. Outside a terminal's foreground, the
/// supervisor leads a new process group which CMD shares, so that job control of mongolock's
/// group never stops the supervisor without CMD. Nothing is started when the lease is already
/// lost, or too nearly gone for a SIGTERM deadline in the future ([`exit::LOCK_LOST`]).
pub async fn spawn(
    command: &[OsString],
    guard: &impl Held,
    policy: StopPolicy,
) -> Result<Spawned, CliError> {
    let Some(program) = command.first() else {
        return Err(CliError::with_code(exit::FAILURE, "no command given"));
    };
    let (term, kill) = policy.renewing(guard.local_deadline());
    if guard.is_lost() || term.min(kill) <= Instant::now() {
        return Err(lost_before_start(guard));
    }
    let terminal = in_terminal_foreground();
    // Orphans of CMD's tree come to us should the supervisor die first (see `supervise`).
    crate::supervisor::become_subreaper();
    let cannot =
        |e: std::io::Error| CliError::failure(format!("cannot start the supervisor process: {e}"));
    // Both ends are close-on-exec; only the supervisor's end is made inheritable, in its child.
    let (ours, first) = std::os::unix::net::UnixStream::pair().map_err(cannot)?;
    // `try_clone` duplicates onto a descriptor ≥ 3, so that the supervisor's end can never be
    // taken for stdin, stdout or stderr (when mongolock was started with one of them closed).
    // Only one copy may stay open here: the supervisor's exit must show as end-of-file.
    let theirs = first.try_clone().map_err(cannot)?;
    drop(first);
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(self_exe().map_err(cannot)?);
    cmd.arg0("mongolock")
        .arg(SUBCOMMAND)
        .arg("--control-fd")
        .arg(fd.to_string());
    if !terminal {
        cmd.arg("--own-group");
    }
    let (vars, unset) = guard.env();
    for var in unset {
        cmd.env_remove(var);
    }
    cmd.arg("--").args(command).envs(vars).kill_on_drop(true);
    // SAFETY: runs in the forked child before exec; fcntl is async-signal-safe and `fd` is open
    // (`theirs` lives until after spawn returns).
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let supervisor = cmd.spawn().map_err(cannot)?;
    drop(theirs);
    ours.set_nonblocking(true).map_err(cannot)?;
    let (reader, writer) = tokio::net::UnixStream::from_std(ours)
        .map_err(cannot)?
        .into_split();
    let mut spawned = Spawned {
        supervisor,
        control: Control {
            lines: BufReader::new(reader).lines(),
            writer,
            ahead: VecDeque::new(),
        },
        terminal,
        sent_deadline: guard.local_deadline(),
        sent_kill: Deadline {
            mono_ns: 0,
            boot_ns: 0,
        },
        command: 0,
    };
    let (term, kill) = policy.renewing(spawned.sent_deadline);
    spawned.sent_kill = spawned.control.deadlines(term, kill, guard).await;
    match spawned.control.next().await {
        Some(FromSupervisor::Started(pid)) => {
            spawned.command = pid;
            tracing::debug!(pid, group = !terminal, "command started");
            Event::new("started").held(guard).field("pid", pid).emit();
            Ok(spawned)
        }
        Some(FromSupervisor::SpawnFailed(errno)) => {
            let _ = spawned.supervisor.wait().await;
            Err(spawn_error(program, errno))
        }
        Some(FromSupervisor::Expired) => {
            let _ = spawned.supervisor.wait().await;
            Err(lost_before_start(guard))
        }
        _ => Err(CliError::failure(
            "the supervisor process ended before starting the command",
        )),
    }
}

/// The error for a lease lost (or with less than `--grace` of trusted time left) before the
/// command could start.
fn lost_before_start(guard: &impl Held) -> CliError {
    let reason = guard
        .lost_reason()
        .unwrap_or_else(|| "its local deadline passed before the command could start".to_owned());
    CliError::with_code(
        exit::LOCK_LOST,
        format!(
            "{} was lost before the command started: {reason}; command not run",
            guard.subject("the lease on")
        ),
    )
}

/// The error for a command that could not be started (`errno` from exec).
fn spawn_error(program: &OsString, errno: i32) -> CliError {
    let shown = program.to_string_lossy();
    match errno {
        libc::ENOENT => CliError::with_code(
            exit::COMMAND_NOT_FOUND,
            format!("command not found: {shown}"),
        ),
        libc::EACCES => CliError::with_code(
            exit::CANNOT_EXECUTE,
            format!("cannot execute {shown}: permission denied"),
        ),
        _ => CliError::with_code(
            exit::CANNOT_EXECUTE,
            format!(
                "cannot execute {shown}: {}",
                std::io::Error::from_raw_os_error(errno)
            ),
        ),
    }
}

/// Waits for the command to exit while watching the lock and the signals:
/// * after every successful renewal the supervisor gets the new deadlines: SIGTERM when only
///   `grace` of trusted lease time is left, SIGKILL a kill margin before the local deadline. It
///   enforces them itself, so they hold even when this process is stopped or starved;
/// * when the lock is reported lost: SIGTERM now, SIGKILL after `grace` but never later than the
///   SIGKILL deadline the supervisor already has (`grace` 0, or that deadline passed: SIGKILL
///   now);
/// * a signal to mongolock is passed on to the command (except terminal-generated
///   SIGINT/SIGQUIT in a terminal's foreground: the command got those itself);
/// * backup, for a supervisor that cannot act (stopped, starved): at the same SIGKILL deadline
///   as the supervisor's — the earliest one it was given, on both clocks, never one computed
///   from the time a loss is noticed — mongolock SIGKILLs the command and everything it started
///   itself (not through the supervisor, nor by the parent-death signal), unless the supervisor
///   has reported its own SIGKILL. If the supervisor has still not reported the command's exit a
///   kill margin later, it is SIGKILLed too, and whatever is left of the command's tree comes to
///   us (a subreaper) and is killed before this returns.
///
/// The supervisor's reports of the signals it sent carry the time it sent them: when mongolock
/// reads them late (it was stopped by job control, or starved), the messages say how long ago,
/// and a SIGTERM and a SIGKILL that are both waiting are reported in one message.
///
/// Once the command was told to stop, the run counts as lost even if a renewal succeeds later.
/// `what` names the lock in messages ("the lock", "leadership of").
pub async fn supervise(
    guard: &impl Held,
    spawned: Spawned,
    signals: &mut Signals,
    policy: StopPolicy,
    what: &str,
) -> Result<Outcome, CliError> {
    let Spawned {
        mut supervisor,
        mut control,
        terminal,
        mut sent_deadline,
        sent_kill,
        command,
    } = spawned;
    // Our child until it is reaped below (each reaping returns), so the pid stays its own.
    let supervisor_pid = supervisor.id().and_then(|pid| i32::try_from(pid).ok());
    let lost = guard.lost();
    let subject = guard.subject(what);
    // Whether the command was told to stop (the run then ends with LOCK_LOST).
    let mut stopping = false;
    // The SIGKILL deadline the supervisor has, as an instant and on both clocks (the backup's).
    let mut kill_at = policy.kill_at(sent_deadline);
    let mut backup = sent_kill;
    // Whether a SIGKILL was reported to the user (by a message that said it was sent).
    let mut sigkill_reported = false;
    // Whether the supervisor reported its SIGKILL (it is alive and killing the tree).
    let mut supervisor_killed_tree = false;
    // Set once the backup has run: when the supervisor is killed if it has not reported.
    let mut supervisor_deadline: Option<Instant> = None;
    let mut supervisor_kill_sent = false;
    loop {
        if !stopping {
            let deadline = guard.local_deadline();
            if deadline != sent_deadline {
                let (term, kill) = policy.renewing(deadline);
                backup = control.deadlines(term, kill, guard).await;
                sent_deadline = deadline;
                kill_at = kill;
                Event::new("renewed").held(guard).emit();
            }
        }
        // The backup wakes by its monotonic deadline, and at least every BOOT_CHECK_TICK for
        // the boot-time one (a suspend), like the supervisor.
        let backup_check = kill_at.min(Instant::now() + BOOT_CHECK_TICK);
        tokio::select! {
            biased;
            msg = control.next() => match msg {
                Some(FromSupervisor::Exited(raw)) => {
                    let _ = supervisor.wait().await;
                    let status = ExitStatus::from_raw(raw);
                    exited_event(guard, status, None);
                    return Ok(Outcome { status, lost: stopping });
                }
                Some(FromSupervisor::SentSigterm(at)) if !stopping => {
                    stopping = true;
                    // What already waits behind it (mongolock was stopped or starved past the
                    // deadlines): a SIGKILL is reported in the same message; after the command's
                    // exit, no SIGKILL is to come.
                    let (mut sigkill_at, mut exited) = (None, false);
                    for msg in control.ready() {
                        match msg {
                            FromSupervisor::SentSigkill(k) => sigkill_at = Some(*k),
                            FromSupervisor::Exited(_) => exited = true,
                            _ => {}
                        }
                    }
                    let sent = if let Some(k) = sigkill_at {
                        sigkill_reported = true;
                        supervisor_killed_tree = true;
                        format!(
                            "sent SIGTERM to the command{}, and SIGKILL{}",
                            sent_ago(at),
                            sent_ago(k)
                        )
                    } else if exited {
                        format!("sent SIGTERM to the command{}", sent_ago(at))
                    } else {
                        let left = kill_at.saturating_duration_since(Instant::now());
                        let kill = if left.is_zero() {
                            "SIGKILL due now".to_owned()
                        } else {
                            format!("SIGKILL in {} at the latest", display(left))
                        };
                        format!("sent SIGTERM to the command{} ({kill})", sent_ago(at))
                    };
                    Event::new("lost")
                        .held(guard)
                        .field("reason", "no renewal succeeded in time")
                        .field("action", "SIGTERM")
                        .message(format!(
                            "mongolock: lost {subject} while the command was running: no renewal \
                             succeeded and only {} of the lease could still be trusted; {sent}",
                            display(policy.grace),
                        ))
                        .emit();
                }
                Some(FromSupervisor::SentSigkill(at)) if !stopping => {
                    stopping = true;
                    sigkill_reported = true;
                    supervisor_killed_tree = true;
                    Event::new("lost")
                        .held(guard)
                        .field("reason", "no renewal succeeded before the lease's deadline")
                        .field("action", "SIGKILL")
                        .message(format!(
                            "mongolock: lost {subject} while the command was running: no \
                             renewal succeeded before the lease's deadline; sent SIGKILL to the \
                             command{}",
                            sent_ago(at)
                        ))
                        .emit();
                }
                Some(FromSupervisor::SentSigkill(at)) => {
                    supervisor_killed_tree = true;
                    let event = Event::new("sigkill").held(guard);
                    if sigkill_reported {
                        // Already said (with the SIGTERM, by a loss or by the backup).
                        event.emit();
                    } else {
                        sigkill_reported = true;
                        event
                            .message(format!(
                                "mongolock: the command had not exited; sent SIGKILL{}",
                                sent_ago(at)
                            ))
                            .emit();
                    }
                }
                Some(other) => tracing::debug!(?other, "supervisor report"),
                None => {
                    let status = supervisor.wait().await.map_err(|e| {
                        CliError::failure(format!("cannot wait for the supervisor process: {e}"))
                    })?;
                    // The supervisor died without reporting the command's exit (we killed it for
                    // being late, or something else did): what is left of CMD's tree was
                    // re-parented to us (a subreaper) and dies before the lease is released.
                    let _ = tokio::task::spawn_blocking(crate::supervisor::kill_orphaned_tree).await;
                    exited_event(
                        guard,
                        status,
                        Some(format!(
                            "mongolock: the supervisor process ended ({}) without reporting the \
                             command's exit; the command and everything it started were killed",
                            describe_status(status)
                        )),
                    );
                    return Ok(Outcome { status, lost: stopping });
                }
            },
            () = lost.wait(), if !stopping => {
                if control.report_waiting().await {
                    continue; // the supervisor's reports first
                }
                stopping = true;
                // `lost` also completes on release, but the guard is held here: this is a loss.
                let reason = lost
                    .reason()
                    .unwrap_or_else(|| "the lease could not be renewed in time".to_string());
                let now = Instant::now();
                // Never later than the SIGKILL deadline the supervisor (and the backup) already
                // have: a loss noticed at that deadline or after it means SIGKILL now.
                let kill = (now + policy.grace)
                    .min(policy.kill_at(guard.local_deadline()))
                    .min(kill_at);
                backup = backup.min(control.deadlines(now, kill, guard).await);
                kill_at = kill;
                let (action, how) = if kill <= now {
                    sigkill_reported = true;
                    ("SIGKILL", "SIGKILL now".to_owned())
                } else {
                    ("SIGTERM", format!("SIGTERM now, SIGKILL in {} at the latest", display(kill - now)))
                };
                Event::new("lost")
                    .held(guard)
                    .field("reason", reason.as_str())
                    .field("action", action)
                    .message(format!(
                        "mongolock: lost {subject} while the command \
                         was running: {reason}; stopping the command ({how})"
                    ))
                    .emit();
            }
            sig = signals.recv() => {
                let from_terminal = matches!(sig, libc::SIGINT | libc::SIGQUIT);
                if terminal && from_terminal {
                    tracing::info!(signal = %signals::name(sig), "terminal signal; the command received it directly");
                } else {
                    tracing::info!(signal = %signals::name(sig), "passing the signal on to the command");
                    control.send(ToSupervisor::Signal(sig)).await;
                    Event::new("signal").held(guard).field("signal", signals::name(sig)).emit();
                }
            }
            () = tokio::time::sleep(policy.refresh), if !stopping => {}
            () = tokio::time::sleep_until(backup_check), if supervisor_deadline.is_none() => {
                if !backup.passed() || control.report_waiting().await {
                    continue; // not yet; or the supervisor's reports first
                }
                supervisor_deadline = Some(Instant::now() + policy.margin);
                if supervisor_killed_tree {
                    continue;
                }
                let supervisor = supervisor_pid;
                let killed = tokio::task::spawn_blocking(move || {
                    crate::supervisor::kill_command_tree(supervisor, command)
                })
                .await
                .unwrap_or(false);
                tracing::info!(killed, "the SIGKILL deadline passed: mongolock killed the command's tree itself");
                if !killed {
                    // Nothing was running: its exit report is on the way.
                } else if !stopping {
                    stopping = true;
                    sigkill_reported = true;
                    Event::new("lost")
                        .held(guard)
                        .field("reason", "no renewal succeeded before the lease's deadline")
                        .field("action", "SIGKILL")
                        .message(format!(
                            "mongolock: lost {subject} while the command was running: no \
                             renewal succeeded before the lease's deadline; sent SIGKILL to the \
                             command and everything it started"
                        ))
                        .emit();
                } else if !sigkill_reported {
                    sigkill_reported = true;
                    Event::new("sigkill")
                        .held(guard)
                        .message("mongolock: the command had not exited; sent SIGKILL")
                        .emit();
                }
            }
            () = tokio::time::sleep_until(supervisor_deadline.unwrap_or(kill_at)),
                if supervisor_deadline.is_some() && !supervisor_kill_sent =>
            {
                supervisor_kill_sent = true;
                stopping = true;
                // Reported with the supervisor's end (end-of-file above).
                tracing::info!(
                    "the supervisor process has not reported the command's exit by the lease's \
                     deadline (it is stopped or starved); killing it"
                );
                let _ = supervisor.start_kill();
            }
        }
    }
}

/// How long before now the supervisor took an action it reports (`at` on the monotonic clock),
/// as ` 4.1s ago` for a report read late (mongolock stopped or starved meanwhile), else empty.
fn sent_ago(at: u64) -> String {
    let ago = Duration::from_nanos(monotonic_now_ns().saturating_sub(at));
    if ago < LATE_REPORT {
        String::new()
    } else {
        format!(" {} ago", human(ago))
    }
}

/// A supervisor's report read this long after the action is reported with its age
/// ([`sent_ago`]); sooner, as happening now.
const LATE_REPORT: Duration = Duration::from_millis(250);

/// Reports CMD's exit (`message`: also a line for people).
fn exited_event(guard: &impl Held, status: ExitStatus, message: Option<String>) {
    let mut event = Event::new("exited")
        .held(guard)
        .field("status", describe_status(status));
    if let Some(code) = status.code() {
        event = event.field("exit_code", code);
    } else if let Some(sig) = status.signal() {
        event = event.field("signal", signals::name(sig));
    }
    if let Some(message) = message {
        event = event.message(message);
    }
    event.emit();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SIGKILLed command still has to be scheduled to exit: SIGKILL must leave it time for
    /// that before the local deadline, also at the shortest lease (1 % of 1 s, 10 ms, did not).
    #[test]
    fn sigkill_leaves_a_killed_command_time_to_exit_before_the_local_deadline() {
        let deadline = Instant::now() + Duration::from_secs(60);
        for (ttl, margin) in [
            (Duration::from_secs(1), MIN_KILL_MARGIN),
            (Duration::from_secs(10), MIN_KILL_MARGIN),
            (Duration::from_secs(30), Duration::from_millis(300)),
        ] {
            let policy = StopPolicy::new(ttl, crate::cli::grace(None, ttl));
            assert_eq!(deadline - policy.kill_at(deadline), margin, "--ttl {ttl:?}");
            let (term, kill) = policy.renewing(deadline);
            assert!(
                term < kill,
                "--ttl {ttl:?}: SIGTERM {term:?} before SIGKILL {kill:?}"
            );
        }
    }
}
