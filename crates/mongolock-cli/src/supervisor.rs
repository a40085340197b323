//! The supervisor: a small process between `mongolock exec`/`elect` and the command, which keeps
//! the command — and everything it started — from outliving its lease even when mongolock itself
//! cannot act.
//!
//! mongolock re-executes its own binary as `mongolock __supervise --control-fd N -- CMD...`; the
//! supervisor spawns CMD, is its parent, and talks to mongolock over a Unix socket pair on fd N
//! (stdin, stdout and stderr pass through to CMD untouched).
//!
//! # Why a separate process, and why it is enough
//! * **mongolock is SIGKILLed** (OOM killer, `kill -9`): the kernel closes its end of the socket,
//!   the supervisor reads end-of-file, SIGKILLs CMD and all its descendants (see *The process
//!   tree*), reaps them and exits. Nothing in mongolock has to run for this.
//! * **mongolock is stopped, or its async runtime starves**: mongolock hands the supervisor
//!   absolute deadlines — *SIGTERM at* and *SIGKILL at* — on two clocks, `CLOCK_MONOTONIC` and
//!   `CLOCK_BOOTTIME` (see *Suspend*), sent again after every successful renewal. The supervisor
//!   enforces them itself, so a mongolock that stops renewing — for whatever reason — simply
//!   stops moving the deadlines and CMD is killed in time.
//! * **The supervisor itself is SIGKILLed** (for instance together with mongolock's process group):
//!   on Linux CMD has the parent-death signal SIGKILL (`prctl(PR_SET_PDEATHSIG)`). The
//!   parent-death signal fires when the *thread* that forked the child exits; the supervisor is
//!   single-threaded (plain std + libc, no async runtime), so that thread is the whole process.
//!   The setting is made in the child between fork and exec; if the supervisor died before it
//!   took effect, `getppid()` no longer returns the supervisor's pid and the child exits at once
//!   instead of running CMD, so there is no window. Elsewhere there is no parent-death signal:
//!   CMD outlives a SIGKILLed supervisor (but not a SIGKILLed mongolock, see the first point).
//!   CMD's own descendants are not covered by the parent-death signal; while mongolock lives,
//!   they are killed by mongolock itself (see *The process tree*).
//! * **The supervisor alone is stopped or starved**: mongolock keeps the SIGKILL deadline it
//!   last gave the supervisor (on both clocks; a loss noticed later can only bring it earlier)
//!   and enforces it too: unless the supervisor has reported its SIGKILL by then, mongolock
//!   SIGKILLs CMD and every descendant itself ([`kill_command_tree`]), with the same kill margin
//!   before the lease's local deadline as the supervisor. The supervisor is left alive for a
//!   kill margin more, to report CMD's exit if it was merely late; then mongolock kills it too.
//! * **Terminal signals** (Ctrl-C reaches the whole foreground group, which the supervisor shares
//!   with mongolock) must not kill the supervisor: it ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT,
//!   and mongolock passes these on as messages. CMD gets the default dispositions back before exec.
//!
//! # Job control: a stopped job never runs its command past the lease
//! Invariant: **the supervisor and CMD are always in the same process group**, and the supervisor
//! ignores the job-control stop signals SIGTSTP, SIGTTIN and SIGTTOU (CMD gets their default
//! dispositions back). In a terminal's foreground, that group is mongolock's (CMD must be in the
//! terminal's foreground group to use the terminal and to get Ctrl-C itself); otherwise the
//! supervisor leads a new group (`--own-group`), which mongolock's own job control never reaches.
//! Every way to stop the job then keeps the lease's bound:
//! * **Ctrl-Z, or SIGTSTP/SIGTTIN/SIGTTOU to any group.** The supervisor is never stopped by these:
//!   it keeps enforcing the deadlines. mongolock (stopped) renews nothing, so CMD — stopped by the
//!   same signal, or still running because it ignores it, or in another group — is SIGKILLed at
//!   the SIGKILL deadline, before the lease can expire. A job continued before that deadline
//!   simply goes on.
//! * **SIGSTOP to mongolock's group** when the supervisor leads its own: only mongolock stops; the
//!   supervisor enforces the deadlines as above.
//! * **SIGSTOP to the group the supervisor shares with CMD** (mongolock's in a terminal's
//!   foreground, or the supervisor's own): SIGSTOP cannot be caught, so the supervisor stops —
//!   and with it CMD and every descendant still in the group: they run nothing while stopped. On
//!   SIGCONT every process of the group resumes at once; the supervisor's `poll()` has an
//!   absolute expiry that has passed, so it returns at once, finds the deadline passed and
//!   SIGKILLs the whole tree instead of letting it work on. CMD can run for the few
//!   milliseconds the scheduler gives it before the supervisor; only fencing tokens cover
//!   those. When mongolock is not in the stopped group (the supervisor leads its own), mongolock
//!   SIGKILLs the stopped CMD and its descendants at the SIGKILL deadline itself, as for a
//!   supervisor stopped alone.
//! * **SIGSTOP to the supervisor alone**: mongolock kills CMD's tree by the SIGKILL deadline,
//!   then the supervisor, as above.
//!
//! A descendant of CMD that left the process group (`setsid`, `setpgid`) is not stopped by a
//! group stop: while the supervisor is SIGSTOPped it can run on, until the SIGKILL deadline when
//! mongolock is not stopped too (mongolock kills the whole tree then), else until the
//! supervisor is continued.
//!
//! # Suspend
//! `CLOCK_MONOTONIC` stops while the machine is suspended; the server's clock does not. Each
//! deadline is therefore sent on `CLOCK_BOOTTIME` as well (it counts the suspend), and a deadline
//! has passed when it has on either clock. `poll()` timeouts run on the monotonic clock, so they
//! are capped at [`BOOT_CHECK_TICK`]: after a resume the boot-time deadline is noticed within
//! that long, and CMD is SIGKILLed — not SIGTERMed with a grace — when the SIGKILL deadline has
//! passed. The boot-time deadline mongolock sends is its monotonic remaining time added to the
//! boot-time clock read when it sends it, capped by the guard's own boot-time deadline (so a
//! suspend between a renewal and the message cannot make it late). For tests,
//! `MONGOLOCK_TEST_BOOT_OFFSET_FILE` names a file whose number of milliseconds is added to every
//! boot-time reading.
//!
//! # The process tree
//! On Linux the supervisor is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a descendant of CMD
//! whose parent dies is re-parented to the supervisor, not to init, so every descendant of CMD —
//! also one that called `setsid` or `setpgid` — stays a descendant of the supervisor. When CMD
//! exits, when a SIGKILL deadline passes and when mongolock goes away, the supervisor SIGKILLs
//! every descendant it finds by walking `/proc/*/stat` parent links, reaps, and repeats until
//! none is left; only then does it report CMD's exit, so mongolock releases the lease after the
//! tree is gone. When the SIGTERM deadline passes, every descendant gets SIGTERM as well (found
//! by the same walk; those in the process group that was signalled with CMD get it once), so a
//! descendant in a session of its own can clean up before the SIGKILL deadline too. A process
//! is signalled through a pidfd opened and then checked against the start time seen in the
//! walk, so a recycled pid is never hit.
//!
//! mongolock is a subreaper too. At the SIGKILL deadline, unless the supervisor has reported
//! its own SIGKILL, mongolock SIGKILLs CMD and every other descendant except the supervisor by
//! the same walk (see above), without relying on the supervisor or on the parent-death signal.
//! When the supervisor dies without reporting CMD's exit — mongolock killed it for being late
//! (stopped, starved, or still walking the tree a kill margin after that deadline), or
//! something else killed it — CMD dies by its parent-death signal and CMD's other descendants
//! are re-parented to mongolock, which SIGKILLs and reaps every descendant it has left in the
//! same way before it releases the lease. Not covered: a descendant that escapes the
//! tree (a double fork through a daemon, or another subreaper, e.g. a nested supervisor or a
//! container runtime), and descendants when mongolock and the supervisor are both SIGKILLed.
//! Elsewhere than Linux, SIGKILL reaches CMD's process group only.
//!
//! # File descriptors
//! The supervisor's socket end is inherited on purpose (mongolock clears its close-on-exec flag
//! only in the forked child); the supervisor sets close-on-exec on it again before doing anything
//! else, so CMD never sees it. mongolock's own end is close-on-exec from the start.
//!
//! # Protocol
//! One ASCII line per message. mongolock → supervisor: `deadlines TERM KILL TERM_BOOT KILL_BOOT`
//! (absolute nanoseconds on `CLOCK_MONOTONIC` and on `CLOCK_BOOTTIME`; the first message, before
//! CMD is started) and `signal N` (pass signal N on). Supervisor → mongolock: `started PID`,
//! `spawn-failed ERRNO`, `expired` (a deadline had passed when the first message arrived: CMD
//! was not started), `sigterm AT` and `sigkill AT` (sent because a deadline passed, at AT
//! nanoseconds on `CLOCK_MONOTONIC`: mongolock may read them much later), `exited
//! RAW_WAIT_STATUS`. Once SIGTERM was sent, later deadlines may only bring SIGKILL earlier.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

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

/// The longest `poll()` timeout: `poll()` sleeps on the monotonic clock, which stops during a
/// suspend, so boot-time deadlines (and the test clock offset) are checked at least this often.
pub const BOOT_CHECK_TICK: Duration = Duration::from_millis(100);

/// The signals the supervisor ignores (mongolock passes them on as messages) and CMD gets back
/// with their default dispositions.
const PASSED_ON: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The job-control stop signals: the supervisor ignores them so that it keeps enforcing the
/// deadlines while its job is stopped (see the module docs); CMD gets the defaults back.
const JOB_STOPS: [i32; 3] = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec. The clocks used exist on the platforms we
    // build for; should the call fail, the zeroed value reads as time 0 (deadlines never pass
    // on that clock, and the other clock still applies).
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec.max(0) as u64).saturating_mul(1_000_000_000) + ts.tv_nsec.max(0) as u64
}

/// Now on `CLOCK_MONOTONIC`, in nanoseconds. The same clock in mongolock and the supervisor.
pub fn monotonic_now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Now on `CLOCK_BOOTTIME` (Linux; elsewhere the monotonic clock), in nanoseconds, plus the
/// test offset: when `MONGOLOCK_TEST_BOOT_OFFSET_FILE` is set, the number of milliseconds
/// written in that file (read again on every call; missing, empty or unparseable is 0).
pub fn boot_now_ns() -> u64 {
    // The library's reading, so that mongolock, the supervisor and the guard's deadlines share
    // one boot clock (and one test offset).
    u64::try_from(mongolock::__boot_time_now().as_nanos()).unwrap_or(u64::MAX)
}

/// Absolute deadlines on both clocks (nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// On `CLOCK_MONOTONIC` ([`monotonic_now_ns`]).
    pub mono_ns: u64,
    /// On `CLOCK_BOOTTIME` ([`boot_now_ns`]).
    pub boot_ns: u64,
}

impl Deadline {
    /// Whether it has passed on either clock.
    pub fn passed(&self) -> bool {
        monotonic_now_ns() >= self.mono_ns || boot_now_ns() >= self.boot_ns
    }

    /// The earlier of two deadlines, clock by clock.
    pub fn min(self, other: Deadline) -> Deadline {
        Deadline {
            mono_ns: self.mono_ns.min(other.mono_ns),
            boot_ns: self.boot_ns.min(other.boot_ns),
        }
    }

    /// Time left until it passes, by the clock that passes it first.
    fn left_ns(&self) -> u64 {
        self.mono_ns
            .saturating_sub(monotonic_now_ns())
            .min(self.boot_ns.saturating_sub(boot_now_ns()))
    }
}

/// A message from mongolock.
#[derive(Debug, PartialEq, Eq)]
pub enum ToSupervisor {
    /// SIGTERM at, SIGKILL at.
    Deadlines { term: Deadline, kill: Deadline },
    /// Pass this signal on to CMD.
    Signal(i32),
}

/// A message from the supervisor.
#[derive(Debug, PartialEq, Eq)]
pub enum FromSupervisor {
    Started(i32),
    SpawnFailed(i32),
    /// A deadline had passed before CMD could be started; it was not.
    Expired,
    /// SIGTERM was sent (its deadline passed) at this time on `CLOCK_MONOTONIC` (ns): mongolock
    /// may read the report much later (stopped by job control, starved).
    SentSigterm(u64),
    /// SIGKILL was sent (its deadline passed) at this time on `CLOCK_MONOTONIC` (ns).
    SentSigkill(u64),
    /// The raw wait status of CMD.
    Exited(i32),
}

impl ToSupervisor {
    pub fn encode(&self) -> String {
        match self {
            ToSupervisor::Deadlines { term, kill } => format!(
                "deadlines {} {} {} {}\n",
                term.mono_ns, kill.mono_ns, term.boot_ns, kill.boot_ns
            ),
            ToSupervisor::Signal(n) => format!("signal {n}\n"),
        }
    }

    pub fn decode(line: &str) -> Option<Self> {
        let mut words = line.split_ascii_whitespace();
        let msg = match words.next()? {
            "deadlines" => {
                let mut n = || words.next()?.parse::<u64>().ok();
                let (term_mono, kill_mono, term_boot, kill_boot) = (n()?, n()?, n()?, n()?);
                ToSupervisor::Deadlines {
                    term: Deadline {
                        mono_ns: term_mono,
                        boot_ns: term_boot,
                    },
                    kill: Deadline {
                        mono_ns: kill_mono,
                        boot_ns: kill_boot,
                    },
                }
            }
            "signal" => ToSupervisor::Signal(words.next()?.parse().ok()?),
            _ => return None,
        };
        Some(msg)
    }
}

impl FromSupervisor {
    pub fn encode(&self) -> String {
        match self {
            FromSupervisor::Started(pid) => format!("started {pid}\n"),
            FromSupervisor::SpawnFailed(errno) => format!("spawn-failed {errno}\n"),
            FromSupervisor::Expired => "expired\n".into(),
            FromSupervisor::SentSigterm(at) => format!("sigterm {at}\n"),
            FromSupervisor::SentSigkill(at) => format!("sigkill {at}\n"),
            FromSupervisor::Exited(raw) => format!("exited {raw}\n"),
        }
    }

    pub fn decode(line: &str) -> Option<Self> {
        let mut words = line.split_ascii_whitespace();
        let word = words.next()?;
        let next = words.next();
        let number = || next?.parse::<i32>().ok();
        let time = || next?.parse::<u64>().ok();
        let msg = match word {
            "started" => FromSupervisor::Started(number()?),
            "spawn-failed" => FromSupervisor::SpawnFailed(number()?),
            "expired" => FromSupervisor::Expired,
            "sigterm" => FromSupervisor::SentSigterm(time()?),
            "sigkill" => FromSupervisor::SentSigkill(time()?),
            "exited" => FromSupervisor::Exited(number()?),
            _ => return None,
        };
        Some(msg)
    }
}

/// Runs the supervisor; returns its exit status (0 unless the control channel is unusable).
pub fn run(args: &SuperviseArgs) -> i32 {
    for sig in PASSED_ON.into_iter().chain(JOB_STOPS) {
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
    if args.own_group {
        // Lead a new group, which CMD joins (see the module docs). Fails only if we already lead
        // one, which is as good.
        // SAFETY: setpgid has no memory-safety preconditions.
        unsafe { libc::setpgid(0, 0) };
    }
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes a plain integer. Should it fail (kernels
    // before 3.4), orphaned descendants go to init and only the /proc walk of still-linked
    // descendants finds them.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
    }
    Supervisor::new(control, args).serve()
}

struct Supervisor<'a> {
    control: UnixStream,
    inbox: Vec<u8>,
    args: &'a SuperviseArgs,
    term: Deadline,
    kill: Deadline,
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
        let never = Deadline {
            mono_ns: u64::MAX,
            boot_ns: u64::MAX,
        };
        Supervisor {
            control,
            inbox: Vec::new(),
            args,
            term: never,
            kill: never,
            sent_term: false,
            sent_kill: false,
        }
    }

    fn serve(mut self) -> i32 {
        // CMD starts only once we know its deadlines, and only if none has passed: a lease that
        // is already (nearly) gone must not run anything.
        loop {
            match self.receive(true) {
                Inbox::Message(ToSupervisor::Deadlines { term, kill }) => {
                    self.term = term;
                    self.kill = kill;
                    break;
                }
                Inbox::Message(ToSupervisor::Signal(_)) | Inbox::Nothing => {}
                Inbox::Closed => return 0,
            }
        }
        if self.term.passed() || self.kill.passed() {
            self.report(FromSupervisor::Expired);
            return 0;
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
                    // What CMD started must not outlive it (nor run on after the release). CMD
                    // is reaped: its pid no longer needs excluding.
                    kill_tree(0);
                    self.report(FromSupervisor::Exited(status.into_raw()));
                    return 0;
                }
                Ok(None) => {}
                Err(_) => {
                    // Cannot happen for our own unreaped child; never leave it unsupervised.
                    self.kill_all(pid);
                    let _ = child.wait();
                    return 1;
                }
            }
            reap_orphans(pid);
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
                            self.kill_all(pid);
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
        if !self.sent_kill && self.kill.passed() {
            self.kill_all(pid);
            self.sent_kill = true;
            self.sent_term = true; // no SIGTERM after SIGKILL
            self.report(FromSupervisor::SentSigkill(monotonic_now_ns()));
        } else if !self.sent_term && self.term.passed() {
            self.signal(pid, libc::SIGTERM);
            // The whole tree gets the warning that SIGKILL will reach: also descendants that
            // left CMD's process group, and without `--own-group` (CMD alone was signalled) the
            // rest of it.
            term_tree(pid, self.signalled_group(libc::SIGTERM));
            self.sent_term = true;
            self.report(FromSupervisor::SentSigterm(monotonic_now_ns()));
        }
    }

    /// The `poll()` timeout in milliseconds until the next deadline (rounded up: the deadlines
    /// mongolock sends already leave a margin before the lease's expiry), capped at
    /// [`BOOT_CHECK_TICK`] (and [`EXIT_CHECK_TICK`] without a pidfd).
    fn next_timeout(&self, have_pidfd: bool) -> i32 {
        let next = if !self.sent_term {
            Some(self.term.min(self.kill))
        } else if !self.sent_kill {
            Some(self.kill)
        } else {
            None
        };
        let tick = if have_pidfd {
            BOOT_CHECK_TICK
        } else {
            EXIT_CHECK_TICK
        };
        let tick = tick.as_millis() as u64;
        let ms = next.map_or(tick, |at| at.left_ns().div_ceil(1_000_000).min(tick));
        ms as i32
    }

    fn apply(&mut self, msg: ToSupervisor, pid: i32) {
        match msg {
            ToSupervisor::Deadlines { term, kill } => {
                if self.sent_term {
                    // Stopping is final: a late renewal cannot postpone SIGKILL.
                    self.kill = self.kill.min(kill);
                } else {
                    self.term = term;
                    self.kill = kill;
                }
            }
            ToSupervisor::Signal(sig) => self.signal(pid, sig),
        }
    }

    /// Signals CMD: with `--own-group` the whole process group, which the supervisor leads and
    /// shares with CMD (only the signals the supervisor ignores are sent this way); otherwise the
    /// group is mongolock's, and only CMD is signalled. CMD is our unreaped child whenever this
    /// is called, so its pid cannot have been reused.
    fn signal(&self, pid: i32, sig: i32) {
        let target = if self.signalled_group(sig).is_some() {
            0
        } else {
            pid
        };
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(target, sig) };
    }

    /// The process group that [`signal`](Self::signal) sends `sig` to (the supervisor's own,
    /// which it leads), or `None` when it signals CMD alone.
    fn signalled_group(&self, sig: i32) -> Option<i32> {
        // SAFETY: getpgrp has no preconditions.
        (self.args.own_group && PASSED_ON.contains(&sig)).then(|| unsafe { libc::getpgrp() })
    }

    /// SIGKILLs CMD and every descendant (see the module docs).
    fn kill_all(&self, pid: i32) {
        // SAFETY: CMD is our unreaped child: its pid cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        kill_tree(pid);
    }

    fn spawn(&self) -> io::Result<Child> {
        let Some((program, args)) = self.args.child.command.split_first() else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        let mut cmd = Command::new(program);
        cmd.args(args);
        // SAFETY: getpid is always safe.
        let supervisor = unsafe { libc::getpid() };
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe calls (signal, prctl, getppid, _exit).
        unsafe {
            cmd.pre_exec(move || {
                for sig in PASSED_ON.into_iter().chain(JOB_STOPS) {
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

/// A process seen in `/proc`: its parent, process group, start time (clock ticks after boot;
/// with the pid it names one process for good) and whether it is a zombie.
#[cfg(target_os = "linux")]
#[derive(Clone, Copy)]
struct Proc {
    pid: i32,
    ppid: i32,
    /// The process group.
    pgrp: i32,
    start: u64,
    zombie: bool,
}

/// Reads `/proc/PID/stat`.
#[cfg(target_os = "linux")]
fn read_stat(pid: i32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is parenthesised and may hold anything: fields after it.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // fields[0] is field 3 (state), fields[1] field 4 (ppid), fields[2] field 5 (pgrp),
    // fields[19] field 22 (starttime).
    Some(Proc {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
        zombie: matches!(*fields.first()?, "Z" | "X"),
    })
}

/// Every descendant of this process, by the parent links in `/proc`.
#[cfg(target_os = "linux")]
fn descendants() -> Vec<Proc> {
    // SAFETY: getpid is always safe.
    let me = unsafe { libc::getpid() };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let all: Vec<Proc> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_stat)
        .collect();
    let mut found: Vec<Proc> = Vec::new();
    let mut frontier = vec![me];
    while let Some(parent) = frontier.pop() {
        for p in all.iter().filter(|p| p.ppid == parent && p.pid != me) {
            if !found.iter().any(|f| f.pid == p.pid) {
                found.push(*p);
                frontier.push(p.pid);
            }
        }
    }
    found
}

/// Sends `sig` to `p` if the pid still names the process seen (same start time): through a
/// pidfd opened before the check where available, so that the signal cannot reach a recycled
/// pid.
#[cfg(target_os = "linux")]
fn signal_checked(p: &Proc, sig: i32) {
    let same = || read_stat(p.pid).is_some_and(|now| now.start == p.start);
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, p.pid, 0) };
    if fd >= 0 {
        let fd = PidFd(fd as RawFd);
        if same() {
            // SAFETY: pidfd_send_signal takes our open pidfd, a signal, a null siginfo and
            // flags 0.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.0,
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    } else if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) && same() {
        // Kernels before 5.3: a descendant's pid is recycled only after it was reaped, which
        // for a child of ours is our own doing; for a grandchild the window between the check
        // and the kill is tiny.
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(p.pid, sig) };
    }
}

/// SIGTERMs, once, every live descendant that the caller's signal to CMD (`cmd`) did not reach:
/// all but CMD, or with `signalled_group` all outside that process group (a second SIGTERM
/// would tell many programs to stop at once instead of cleaning up). The warning before the
/// SIGKILL deadline, which [`kill_tree`] then enforces on whatever is left.
#[cfg(target_os = "linux")]
fn term_tree(cmd: i32, signalled_group: Option<i32>) {
    let reached = |p: &Proc| p.pid == cmd || Some(p.pgrp) == signalled_group;
    for p in descendants().iter().filter(|p| !p.zombie && !reached(p)) {
        signal_checked(p, libc::SIGTERM);
    }
}

/// Elsewhere: CMD's process group gets SIGTERM with CMD when it has one of its own
/// (`--own-group`); nothing more can be found.
#[cfg(not(target_os = "linux"))]
fn term_tree(_cmd: i32, _signalled_group: Option<i32>) {}

/// SIGKILLs every descendant except CMD (`cmd`, reaped by its `Child`; 0 once reaped) and
/// reaps them, until none is left. Descendants whose parent dies are re-parented to us (we are
/// a subreaper), so the walk finds them on the next round.
#[cfg(target_os = "linux")]
fn kill_tree(cmd: i32) {
    loop {
        reap_orphans(cmd);
        let live: Vec<Proc> = descendants()
            .into_iter()
            .filter(|p| !p.zombie && p.pid != cmd)
            .collect();
        if live.is_empty() {
            return;
        }
        for p in &live {
            signal_checked(p, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Makes this process (mongolock) a child subreaper on Linux, before it starts the supervisor:
/// should the supervisor die without having killed CMD's tree (mongolock kills it when it is
/// late, see *The process tree*), the orphaned descendants are re-parented to mongolock, which
/// [`kill_orphaned_tree`] then finds. Elsewhere nothing.
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes a plain integer. Should it fail (kernels
    // before 3.4), orphans go to init and only the /proc walk of still-linked ones finds them.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
    }
}

/// Called by mongolock once its supervisor has exited (and been reaped) without reporting
/// CMD's exit: SIGKILLs and reaps every remaining descendant of this process — what is left of
/// CMD's tree — until none is left (blocking; a few milliseconds). mongolock has no other
/// children then. Elsewhere than Linux nothing (there is no subreaper to collect orphans).
pub fn kill_orphaned_tree() {
    #[cfg(target_os = "linux")]
    kill_tree(0);
}

/// How long [`kill_command_tree`] keeps killing before it gives up on processes that do not
/// die (uninterruptible sleep); whatever is left is killed again once the supervisor is gone
/// ([`kill_orphaned_tree`]).
const TREE_KILL_LIMIT: Duration = Duration::from_secs(1);

/// mongolock's backup for a supervisor that has not acted by its SIGKILL deadline (stopped,
/// starved): SIGKILLs CMD (`command`) and every other descendant of this process except the
/// supervisor (`supervisor`, mongolock's unreaped child), repeating until none is left alive,
/// for at most [`TREE_KILL_LIMIT`] (blocking). Reaps nothing: CMD and the descendants it
/// left are the supervisor's children (a subreaper) while it lives, and mongolock reaps its own
/// child through its `Child`. Returns whether a live process was signalled. The supervisor
/// itself is left alive, so that one which was merely late still reports CMD's exit.
///
/// Linux: the whole tree, found by the parent links in `/proc` and signalled through pidfds
/// (see [`signal_checked`]), so also descendants in a session or process group of their own.
/// Elsewhere: CMD alone (no tree can be found; CMD is the supervisor's child, so its pid is
/// not reused before the supervisor reaps it and reports its exit).
pub fn kill_command_tree(supervisor: Option<i32>, command: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        let _ = command; // a descendant like the others
        let started = std::time::Instant::now();
        let mut signalled = false;
        loop {
            let live: Vec<Proc> = descendants()
                .into_iter()
                .filter(|p| !p.zombie && Some(p.pid) != supervisor)
                .collect();
            if live.is_empty() || started.elapsed() > TREE_KILL_LIMIT {
                return signalled;
            }
            for p in &live {
                signal_checked(p, libc::SIGKILL);
            }
            signalled = true;
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = supervisor;
        // SAFETY: kill has no memory-safety preconditions; see above for the pid.
        unsafe { libc::kill(command, libc::SIGKILL) == 0 }
    }
}

/// Elsewhere: CMD's process group, when it has one of its own.
#[cfg(not(target_os = "linux"))]
fn kill_tree(cmd: i32) {
    // SAFETY: kill has no memory-safety preconditions; CMD is our unreaped child.
    unsafe {
        if libc::getpgid(cmd) == cmd {
            libc::kill(-cmd, libc::SIGKILL);
        }
    }
}

/// Reaps exited children other than CMD: descendants re-parented to us (a subreaper) when
/// their parent died.
fn reap_orphans(cmd: i32) {
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value; waitid writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid and writable. WNOWAIT leaves the child reapable.
        let r = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: waitid filled `info` (si_pid 0 when no child has exited).
        let pid = unsafe { info.si_pid() };
        if r != 0 || pid == 0 || pid == cmd {
            // CMD's exit is collected by its `Child`; others wait for the next round.
            return;
        }
        // SAFETY: `pid` is our exited child; reaping it has no other effect.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
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
                term: Deadline {
                    mono_ns: 1,
                    boot_ns: 2,
                },
                kill: Deadline {
                    mono_ns: u64::MAX,
                    boot_ns: 3,
                },
            },
            ToSupervisor::Signal(15),
        ] {
            assert_eq!(ToSupervisor::decode(&msg.encode()), Some(msg));
        }
        for msg in [
            FromSupervisor::Started(42),
            FromSupervisor::SpawnFailed(2),
            FromSupervisor::Expired,
            FromSupervisor::SentSigterm(7),
            FromSupervisor::SentSigkill(u64::MAX),
            FromSupervisor::Exited(9),
        ] {
            assert_eq!(FromSupervisor::decode(&msg.encode()), Some(msg));
        }
        assert_eq!(FromSupervisor::decode("bogus 1\n"), None);
        assert_eq!(FromSupervisor::decode("sigkill\n"), None);
    }
}
