//! `mongolock exec`: run a command while holding a lock. Also the child supervision shared with
//! `elect`: spawning CMD with the lock in its environment, passing signals on, and stopping it
//! (SIGTERM, then SIGKILL after the grace period) when the lock is lost.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::process::ExitStatus;
use std::time::Duration;

use mongolock::{LockGuard, LockProvider};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::cli::{ExecArgs, GlobalArgs};
use crate::connect::{connect, Connection};
use crate::duration::{display, human, Wait};
use crate::exit::{self, CliError};
use crate::signals::{self, Signals};

/// Environment variable holding the lock name in CMD's environment.
pub const ENV_NAME: &str = "MONGOLOCK_NAME";
/// Environment variable holding the fencing token in CMD's environment.
pub const ENV_FENCING_TOKEN: &str = "MONGOLOCK_FENCING_TOKEN";

/// `mongolock exec`.
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
    let lock = provider
        .lock(args.name.clone())
        .map_err(|e| conn.error("cannot use this lock name", &e))?;

    tracing::info!(lock = %args.name, wait = ?args.wait, "waiting for the lock");
    let started = Instant::now();
    let acquired = tokio::select! {
        r = lock.acquire_with(args.wait.timeout()) => {
            r.map_err(|e| conn.error(&format!("cannot acquire lock {:?}", args.name), &e))?
        }
        sig = signals.recv() => {
            eprintln!(
                "mongolock: {} received while waiting for lock {:?}; command not run",
                signals::name(sig),
                args.name
            );
            return Ok(exit::for_signal(sig));
        }
    };
    let Some(guard) = acquired else {
        let waited = match args.wait {
            Wait::For(d) if d.is_zero() => "after one attempt".to_owned(),
            _ => format!("after waiting {}", human(started.elapsed())),
        };
        let held_by = describe_holder(&provider, &args.name)
            .await
            .unwrap_or_else(|| "another holder".to_owned());
        eprintln!(
            "mongolock: lock {:?} is held by {held_by}; gave up {waited} (--wait {}); command \
             not run",
            args.name,
            wait_display(args.wait)
        );
        return Ok(exit::WAIT_TIMED_OUT);
    };
    tracing::info!(
        lock = %args.name,
        token = guard.fencing_token(),
        waited_ms = started.elapsed().as_millis() as u64,
        "lock acquired; starting the command"
    );

    let child = match spawn(&args.child.command, &guard) {
        Ok(child) => child,
        Err(e) => {
            release_quietly(guard, &conn).await;
            return Err(e);
        }
    };
    let outcome = supervise(&guard, child, &mut signals, args.grace, "the lock").await?;
    finish(guard, outcome, &conn, "the lock").await
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
pub async fn finish(
    guard: LockGuard,
    outcome: Outcome,
    conn: &Connection,
    what: &str,
) -> Result<i32, CliError> {
    let name = guard.name().to_owned();
    let status = describe_status(outcome.status);
    if outcome.lost {
        drop(guard);
        eprintln!(
            "mongolock: the command was stopped ({status}) because {what} {name:?} was lost; \
             exiting with status {}",
            exit::LOCK_LOST
        );
        return Ok(exit::LOCK_LOST);
    }
    if guard.is_lost() {
        // Lost after the command's last check but before it exited: no release to attempt.
        drop(guard);
        eprintln!("{}", lost_before_finish(what, &name, &status));
        return Ok(exit::LOCK_LOST);
    }
    match guard.release().await {
        Ok(()) => Ok(exit::for_child(outcome.status)),
        Err(mongolock::Error::LeaseLost { .. }) => {
            eprintln!("{}", lost_before_finish(what, &name, &status));
            Ok(exit::LOCK_LOST)
        }
        Err(e) => {
            // The lease expires by itself within --ttl.
            eprintln!(
                "mongolock: warning: {}; it expires by itself at the end of its lease",
                conn.error(&format!("could not release {what} {name:?}"), &e)
            );
            Ok(exit::for_child(outcome.status))
        }
    }
}

/// The message for a lease found lost only after the command exited.
pub fn lost_before_finish(what: &str, name: &str, status: &str) -> String {
    format!(
        "mongolock: {what} {name:?} was lost before the command finished ({status}): the lease \
         expired and was taken over or was force-released, or could not be renewed, so the \
         command's work may have overlapped another holder's; exiting with status {}",
        exit::LOCK_LOST
    )
}

/// Releases after a failure to start the command; problems are only logged.
pub async fn release_quietly(guard: LockGuard, conn: &Connection) {
    let name = guard.name().to_owned();
    if let Err(e) = guard.release().await {
        tracing::warn!(lock = %name, error = %conn.error("release", &e), "could not release the lock");
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
    Some(format!(
        "{holder} (fencing token {}{expires})",
        info.fencing_token
    ))
}

pub fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
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

/// How signals reach the command.
#[derive(Clone, Copy, Debug)]
struct Target {
    pid: i32,
    /// The command leads its own process group: signal the group (`kill(-pid)`).
    group: bool,
    /// SIGINT/SIGQUIT come from the terminal and reach the command directly: do not pass them
    /// on a second time.
    terminal: bool,
}

impl Target {
    fn send(self, signo: i32) {
        let pid = if self.group { -self.pid } else { self.pid };
        // SAFETY: kill has no memory-safety preconditions. The child has not been reaped yet
        // (we only signal before `wait` returned), so its pid (and group id) cannot have been
        // reused.
        let rc = unsafe { libc::kill(pid, signo) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            tracing::debug!(pid, signo, error = %e, "could not signal the command");
        }
    }
}

/// A spawned command and how to signal it.
pub struct Spawned {
    child: Child,
    target: Target,
}

/// Spawns CMD with the lock in its environment. Outside a terminal's foreground, CMD leads a
/// new process group so that stopping it reaches everything it started.
pub fn spawn(command: &[OsString], guard: &LockGuard) -> Result<Spawned, CliError> {
    let Some((program, args)) = command.split_first() else {
        return Err(CliError::with_code(exit::FAILURE, "no command given"));
    };
    let terminal = in_terminal_foreground();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env(ENV_NAME, guard.name())
        .env(ENV_FENCING_TOKEN, guard.fencing_token().to_string());
    if !terminal {
        cmd.process_group(0);
    }
    let child = cmd.spawn().map_err(|e| {
        let shown = program.to_string_lossy();
        match e.kind() {
            std::io::ErrorKind::NotFound => CliError::with_code(
                exit::COMMAND_NOT_FOUND,
                format!("command not found: {shown}"),
            ),
            std::io::ErrorKind::PermissionDenied => CliError::with_code(
                exit::CANNOT_EXECUTE,
                format!("cannot execute {shown}: permission denied"),
            ),
            _ => CliError::with_code(exit::CANNOT_EXECUTE, format!("cannot execute {shown}: {e}")),
        }
    })?;
    let Some(pid) = child.id() else {
        // A freshly spawned child has not been waited for, so it has an id; if not, there is
        // nothing to supervise.
        return Err(CliError::failure(
            "the command exited before it could be supervised",
        ));
    };
    let pid = i32::try_from(pid).map_err(|_| CliError::failure("process id out of range"))?;
    tracing::debug!(pid, group = !terminal, "command started");
    Ok(Spawned {
        child,
        target: Target {
            pid,
            group: !terminal,
            terminal,
        },
    })
}

/// Waits for the command to exit while watching the lock and the signals:
/// * a signal to mongolock is passed on to the command (except terminal-generated
///   SIGINT/SIGQUIT in a terminal's foreground: the command got those itself);
/// * when the lock is lost, the command gets SIGTERM, then SIGKILL after `grace`.
///
/// `what` names the lock in messages ("the lock", "leadership").
pub async fn supervise(
    guard: &LockGuard,
    spawned: Spawned,
    signals: &mut Signals,
    grace: Duration,
    what: &str,
) -> Result<Outcome, CliError> {
    let Spawned { mut child, target } = spawned;
    let lost = guard.lost();
    let mut lost_seen = false;
    let mut kill_at: Option<Instant> = None;
    loop {
        let kill_deadline = kill_at;
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| {
                    CliError::failure(format!("cannot wait for the command: {e}"))
                })?;
                return Ok(Outcome { status, lost: lost_seen });
            }
            () = lost.wait(), if !lost_seen => {
                lost_seen = true;
                // `lost` also completes on release, but the guard is held here: this is a loss.
                let reason = lost
                    .reason()
                    .unwrap_or_else(|| "the lease could not be renewed in time".to_string());
                eprintln!(
                    "mongolock: lost {what} {:?} (fencing token {}) while the command was \
                     running: {reason}; stopping the command (SIGTERM, then SIGKILL after {})",
                    guard.name(),
                    guard.fencing_token(),
                    display(grace)
                );
                target.send(libc::SIGTERM);
                kill_at = Some(Instant::now() + grace);
            }
            () = sleep_until_opt(kill_deadline), if kill_deadline.is_some() => {
                eprintln!(
                    "mongolock: the command did not exit within {} of SIGTERM; sending SIGKILL",
                    display(grace)
                );
                target.send(libc::SIGKILL);
                kill_at = None;
            }
            sig = signals.recv() => {
                let from_terminal = matches!(sig, libc::SIGINT | libc::SIGQUIT);
                if target.terminal && from_terminal {
                    tracing::info!(signal = %signals::name(sig), "terminal signal; the command received it directly");
                } else {
                    tracing::info!(signal = %signals::name(sig), "passing the signal on to the command");
                    target.send(sig);
                }
            }
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
