//! The supervisor: a small process between `mongolock exec`/`elect` and the command, which keeps
//! the command from outliving its lease even when mongolock itself cannot act.
//!
//! mongolock re-executes its own binary as `mongolock __supervise --control-fd N -- CMD...`; the
//! supervisor spawns CMD, is its parent, and talks to mongolock over a Unix socket pair on fd N
//! (stdin, stdout and stderr pass through to CMD untouched).
//!
//! # Why a separate process, and why it is enough
//! * **mongolock is SIGKILLed** (OOM killer, `kill -9`): the kernel closes its end of the socket,
//!   the supervisor reads end-of-file, SIGKILLs CMD (its whole process group when it has one),
//!   reaps it and exits. Nothing in mongolock has to run for this.
//! * **mongolock is SIGSTOPped, or its async runtime starves**: mongolock hands the supervisor
//!   absolute deadlines on `CLOCK_MONOTONIC` (system-wide, and it keeps running while mongolock
//!   is stopped): *SIGTERM at* and *SIGKILL at*, sent again after every successful renewal. The
//!   supervisor enforces them itself with `poll()` timeouts, so a mongolock that stops
//!   renewing — for whatever reason — simply stops moving the deadlines and CMD is killed in time.
//! * **The supervisor itself is SIGKILLed** (for instance together with mongolock's process group):
//!   on Linux CMD has the parent-death signal SIGKILL (`prctl(PR_SET_PDEATHSIG)`). The
//!   parent-death signal fires when the *thread* that forked the child exits; the supervisor is
//!   single-threaded (plain std + libc, no async runtime), so that thread is the whole process.
//!   The setting is made in the child between fork and exec; if the supervisor died before it
//!   took effect, `getppid()` no longer returns the supervisor's pid and the child exits at once
//!   instead of running CMD, so there is no window. Elsewhere there is no parent-death signal:
//!   CMD outlives a SIGKILLed supervisor (but not a SIGKILLed mongolock, see the first point).
//!   CMD's own children are not covered by the parent-death signal; only the supervisor's
//!   process-group kill reaches them.
//! * **Terminal signals** (Ctrl-C reaches the whole foreground group, which the supervisor shares
//!   with mongolock) must not kill the supervisor: it ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT,
//!   and mongolock passes these on as messages. CMD gets the default dispositions back before exec.
//!
//! # File descriptors
//! The supervisor's socket end is inherited on purpose (mongolock clears its close-on-exec flag
//! only in the forked child); the supervisor sets close-on-exec on it again before doing anything
//! else, so CMD never sees it. mongolock's own end is close-on-exec from the start.
//!
//! # Protocol
//! One ASCII line per message. mongolock → supervisor: `deadlines TERM_NS KILL_NS` (absolute
//! `CLOCK_MONOTONIC` nanoseconds; the first message, before CMD is started) and `signal N` (pass
//! signal N on). Supervisor → mongolock: `started PID`, `spawn-failed ERRNO`, `sigterm` and
//! `sigkill` (sent because a deadline passed), `exited RAW_WAIT_STATUS`. Once SIGTERM was sent,
//! later deadlines may only bring SIGKILL earlier.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command};
use std::time::Duration;

use crate::cli::SuperviseArgs;

/// The hidden subcommand that runs the supervisor.
pub const SUBCOMMAND: &str = "__supervise";

/// Without a pidfd (non-Linux, or kernels before 5.3) the supervisor checks for CMD's exit at
/// least this often.
const EXIT_CHECK_TICK: Duration = Duration::from_millis(50);

/// The signals the supervisor ignores (mongolock passes them on as messages) and CMD gets back
/// with their default dispositions.
const PASSED_ON: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Now on `CLOCK_MONOTONIC`, in nanoseconds. The same clock in mongolock and the supervisor.
pub fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on the
    // platforms we build for, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// A message from mongolock.
#[derive(Debug, PartialEq, Eq)]
pub enum ToSupervisor {
    /// SIGTERM at, SIGKILL at (`CLOCK_MONOTONIC` ns).
    Deadlines { term_ns: u64, kill_ns: u64 },
    /// Pass this signal on to CMD.
    Signal(i32),
}

/// A message from the supervisor.
#[derive(Debug, PartialEq, Eq)]
pub enum FromSupervisor {
    Started(i32),
    SpawnFailed(i32),
    SentSigterm,
    SentSigkill,
    /// The raw wait status of CMD.
    Exited(i32),
}

impl ToSupervisor {
    pub fn encode(&self) -> String {
        match self {
            ToSupervisor::Deadlines { term_ns, kill_ns } => {
                format!("deadlines {term_ns} {kill_ns}\n")
            }
            ToSupervisor::Signal(n) => format!("signal {n}\n"),
        }
    }

    fn decode(line: &str) -> Option<Self> {
        let mut words = line.split_ascii_whitespace();
        let msg = match words.next()? {
            "deadlines" => ToSupervisor::Deadlines {
                term_ns: words.next()?.parse().ok()?,
                kill_ns: words.next()?.parse().ok()?,
            },
            "signal" => ToSupervisor::Signal(words.next()?.parse().ok()?),
            _ => return None,
        };
        Some(msg)
    }
}

impl FromSupervisor {
    fn encode(&self) -> String {
        match self {
            FromSupervisor::Started(pid) => format!("started {pid}\n"),
            FromSupervisor::SpawnFailed(errno) => format!("spawn-failed {errno}\n"),
            FromSupervisor::SentSigterm => "sigterm\n".into(),
            FromSupervisor::SentSigkill => "sigkill\n".into(),
            FromSupervisor::Exited(raw) => format!("exited {raw}\n"),
        }
    }

    pub fn decode(line: &str) -> Option<Self> {
        let mut words = line.split_ascii_whitespace();
        let word = words.next()?;
        let mut number = || words.next()?.parse::<i32>().ok();
        let msg = match word {
            "started" => FromSupervisor::Started(number()?),
            "spawn-failed" => FromSupervisor::SpawnFailed(number()?),
            "sigterm" => FromSupervisor::SentSigterm,
            "sigkill" => FromSupervisor::SentSigkill,
            "exited" => FromSupervisor::Exited(number()?),
            _ => return None,
        };
        Some(msg)
    }
}

/// Runs the supervisor; returns its exit status (0 unless the control channel is unusable).
pub fn run(args: &SuperviseArgs) -> i32 {
    for sig in PASSED_ON {
        // SAFETY: setting a signal to SIG_IGN installs no handler code; the process is
        // single-threaded.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let fd: RawFd = args.control_fd;
    // SAFETY: F_SETFD on an arbitrary number is harmless; it fails with EBADF when the fd is not
    // open, and then we stop before taking ownership of it.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        say!("mongolock: internal error: supervisor started without its control channel");
        return 1;
    }
    // SAFETY: mongolock passed us this descriptor (checked open above) for our exclusive use.
    let control = unsafe { UnixStream::from_raw_fd(fd) };
    Supervisor::new(control, args).serve()
}

struct Supervisor<'a> {
    control: UnixStream,
    inbox: Vec<u8>,
    args: &'a SuperviseArgs,
    term_ns: u64,
    kill_ns: u64,
    sent_term: bool,
    sent_kill: bool,
}

/// What reading the control channel gave.
enum Inbox {
    Message(ToSupervisor),
    Nothing,
    Closed,
}

impl<'a> Supervisor<'a> {
    fn new(control: UnixStream, args: &'a SuperviseArgs) -> Self {
        Supervisor {
            control,
            inbox: Vec::new(),
            args,
            term_ns: 0,
            kill_ns: 0,
            sent_term: false,
            sent_kill: false,
        }
    }

    fn serve(mut self) -> i32 {
        // CMD starts only once we know its deadlines.
        loop {
            match self.receive(true) {
                Inbox::Message(ToSupervisor::Deadlines { term_ns, kill_ns }) => {
                    self.term_ns = term_ns;
                    self.kill_ns = kill_ns;
                    break;
                }
                Inbox::Message(ToSupervisor::Signal(_)) | Inbox::Nothing => {}
                Inbox::Closed => return 0,
            }
        }
        let mut child = match self.spawn() {
            Ok(child) => child,
            Err(e) => {
                self.report(FromSupervisor::SpawnFailed(e.raw_os_error().unwrap_or(0)));
                return 0;
            }
        };
        // A child that has not been waited for has a pid that fits in pid_t.
        let pid = child.id() as i32;
        self.report(FromSupervisor::Started(pid));
        let exited = PidFd::open(pid);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.report(FromSupervisor::Exited(status.into_raw()));
                    return 0;
                }
                Ok(None) => {}
                Err(_) => {
                    // Cannot happen for our own unreaped child; never leave it unsupervised.
                    self.signal(pid, libc::SIGKILL);
                    let _ = child.wait();
                    return 1;
                }
            }
            self.enforce(pid);
            let timeout = self.next_timeout(exited.is_some());
            let mut fds = vec![libc::pollfd {
                fd: self.control.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            if let Some(p) = &exited {
                fds.push(libc::pollfd {
                    fd: p.0,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if fds[0].revents != 0 {
                loop {
                    match self.receive(false) {
                        Inbox::Message(msg) => self.apply(msg, pid),
                        Inbox::Nothing => break,
                        Inbox::Closed => {
                            // mongolock is gone: nobody renews the lease any more.
                            self.signal(pid, libc::SIGKILL);
                            let _ = child.wait();
                            return 0;
                        }
                    }
                }
            }
        }
    }

    /// Sends the signals whose deadline has passed.
    fn enforce(&mut self, pid: i32) {
        let now = monotonic_now_ns();
        if !self.sent_kill && now >= self.kill_ns {
            self.signal(pid, libc::SIGKILL);
            self.sent_kill = true;
            self.sent_term = true; // no SIGTERM after SIGKILL
            self.report(FromSupervisor::SentSigkill);
        } else if !self.sent_term && now >= self.term_ns {
            self.signal(pid, libc::SIGTERM);
            self.sent_term = true;
            self.report(FromSupervisor::SentSigterm);
        }
    }

    /// The `poll()` timeout in milliseconds until the next deadline (rounded up: the deadlines
    /// mongolock sends already leave a margin before the lease's expiry), -1 for none.
    fn next_timeout(&self, have_pidfd: bool) -> i32 {
        let next = if !self.sent_term {
            Some(self.term_ns.min(self.kill_ns))
        } else if !self.sent_kill {
            Some(self.kill_ns)
        } else {
            None
        };
        let mut ms = next.map(|at| at.saturating_sub(monotonic_now_ns()).div_ceil(1_000_000));
        if !have_pidfd {
            let tick = EXIT_CHECK_TICK.as_millis() as u64;
            ms = Some(ms.map_or(tick, |ms| ms.min(tick)));
        }
        ms.map_or(-1, |ms| ms.min(i32::MAX as u64) as i32)
    }

    fn apply(&mut self, msg: ToSupervisor, pid: i32) {
        match msg {
            ToSupervisor::Deadlines { term_ns, kill_ns } => {
                if self.sent_term {
                    // Stopping is final: a late renewal cannot postpone SIGKILL.
                    self.kill_ns = self.kill_ns.min(kill_ns);
                } else {
                    self.term_ns = term_ns;
                    self.kill_ns = kill_ns;
                }
            }
            ToSupervisor::Signal(sig) => self.signal(pid, sig),
        }
    }

    /// Signals CMD (its process group when it leads one). CMD is our unreaped child whenever
    /// this is called, so neither its pid nor its group id can have been reused.
    fn signal(&self, pid: i32, sig: i32) {
        let target = if self.args.own_group { -pid } else { pid };
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(target, sig) };
    }

    fn spawn(&self) -> io::Result<Child> {
        let Some((program, args)) = self.args.child.command.split_first() else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        let mut cmd = Command::new(program);
        cmd.args(args);
        if self.args.own_group {
            cmd.process_group(0);
        }
        // SAFETY: getpid is always safe.
        let supervisor = unsafe { libc::getpid() };
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe calls (signal, prctl, getppid, _exit).
        unsafe {
            cmd.pre_exec(move || {
                for sig in PASSED_ON {
                    libc::signal(sig, libc::SIG_DFL);
                }
                #[cfg(target_os = "linux")]
                {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // The supervisor died before the setting took effect: do not run CMD.
                    if libc::getppid() != supervisor {
                        libc::_exit(128 + libc::SIGKILL);
                    }
                }
                #[cfg(not(target_os = "linux"))]
                let _ = supervisor;
                Ok(())
            });
        }
        cmd.spawn()
    }

    /// Reads what is available (blocking until something is when `block`).
    fn receive(&mut self, block: bool) -> Inbox {
        loop {
            if let Some(end) = self.inbox.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.inbox.drain(..=end).collect();
                match ToSupervisor::decode(&String::from_utf8_lossy(&line)) {
                    Some(msg) => return Inbox::Message(msg),
                    None => continue, // unknown messages are skipped
                }
            }
            let _ = self.control.set_nonblocking(!block);
            let mut buf = [0u8; 512];
            match self.control.read(&mut buf) {
                Ok(0) => return Inbox::Closed,
                Ok(n) => self.inbox.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Inbox::Nothing,
                Err(_) => return Inbox::Closed,
            }
        }
    }

    /// Tells mongolock; it may be gone or stopped (the socket buffer holds a few messages), so
    /// problems are ignored: end-of-file on the next read handles a vanished mongolock.
    fn report(&mut self, msg: FromSupervisor) {
        let _ = self.control.set_nonblocking(false);
        let _ = self.control.write_all(msg.encode().as_bytes());
    }
}

/// A pidfd (Linux ≥ 5.3): readable once the process has exited, so `poll()` wakes at CMD's exit.
struct PidFd(RawFd);

impl PidFd {
    #[cfg(target_os = "linux")]
    fn open(pid: i32) -> Option<PidFd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        (fd >= 0).then_some(PidFd(fd as RawFd))
    }

    #[cfg(not(target_os = "linux"))]
    fn open(_pid: i32) -> Option<PidFd> {
        None
    }
}

impl Drop for PidFd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for msg in [
            ToSupervisor::Deadlines {
                term_ns: 1,
                kill_ns: u64::MAX,
            },
            ToSupervisor::Signal(15),
        ] {
            assert_eq!(ToSupervisor::decode(&msg.encode()), Some(msg));
        }
        for msg in [
            FromSupervisor::Started(42),
            FromSupervisor::SpawnFailed(2),
            FromSupervisor::SentSigterm,
            FromSupervisor::SentSigkill,
            FromSupervisor::Exited(9),
        ] {
            assert_eq!(FromSupervisor::decode(&msg.encode()), Some(msg));
        }
        assert_eq!(FromSupervisor::decode("bogus 1\n"), None);
    }
}
