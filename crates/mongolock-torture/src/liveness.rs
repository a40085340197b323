//! The liveness checker (contract item 13, "a free name reaches a live waiter fast"), beside
//! the safety rules of [`crate::checker`] and as independent of the library: it reads only the
//! recorded grant history of the names it checks (each grant's server times and whether a
//! release ended it), the waits the workers and the CLI check logged, and the harness's own
//! record of the faults it injected.
//!
//! # What is measured
//! A name is **free** from the end of a grant to the start of the next one (server time): from
//! its release (the release's `expiresAt`, which a release sets to `min(expiresAt, now)`), or
//! from its last recorded `expiresAt` when it ended without a release (its holder died, was
//! stopped, or let it run out; a takeover or a TTL deletion changes nothing about when it
//! became free). That is a **stretch** `[F, G)`; `G` is the next grant's `acquiredAt` (none
//! after the last grant). Its **cause** is `release`, `expiry` or `unheld` (the name had not
//! been granted yet).
//!
//! A **wait** is one acquire call of a checked name, from just before the call to just after it
//! returned (the workers log both, [`crate::worklog::LogLine::Wait`] /
//! [`crate::worklog::LogLine::WaitEnd`]), or until the harness killed the process, the process
//! exited on request, or its log ends. A wait is **live** except while its process is stopped
//! (SIGSTOP, from the injector's stop to its SIGCONT) or cut off from the server (a `partition`
//! or `netem` of its worker slot, from the cut until as long again after the heal plus 1 s: TCP
//! retransmits with exponential backoff, so a connection can stay silent about as long as the
//! cut lasted after the link is back).
//!
//! For every stretch and every wait that overlaps it, the checker takes the longest piece of
//! `[max(F, start), min(G, end))` in which the wait was live: how long the name was free while
//! that waiter waited and could act, without a grant. The stretch's **latency** is the longest
//! such piece over its waiters; stretches no live wait overlapped are not counted. A piece that
//! ends at `G` is the time to the next grant (to any process: once granted, the name is no
//! longer free); one that ends earlier ends because the waiter gave up, was stopped or killed,
//! while the name was still free — which counts just the same.
//!
//! # Bounds
//! * `release` and `unheld`: the library's handoff fallback (`HANDOFF_FALLBACK`, 500 ms in
//!   `backends/notify/hub.rs`) plus a slack (1 s by default, `--liveness-slack`): the
//!   designated process and its backup get the first 500 ms; a MongoDB process further back
//!   probes the lock every second (0.75–1.25 s) and tries once the name has been free for the
//!   fallback delay; a polling process retries within 800 ms.
//! * `expiry`: the acquire loop's `EXPIRY_MARGIN` (5 ms, `acquire_loop.rs`) plus the slack:
//!   every waiter sleeps until the holder's reported expiry plus that margin.
//! * Both plus the clock tolerance ([`CLOCK_TOLERANCE_US`]).
//!
//! A latency above its bound is a violation (`liveness`), reported with the waiter, the
//! grants around the stretch and the departed waiters that may have been queued ahead.
//!
//! # Clocks
//! The waits are timed with the workers' wall clock (`SystemTime`, `CLOCK_REALTIME`), the
//! stretches with the server's (`$$NOW` on MongoDB, `clock_timestamp()` on PostgreSQL). The
//! harness's servers run on the same host (the embedded `mongo-testserver`, in a network
//! namespace or not, and the PostgreSQL cluster the run starts), so both read the same clock:
//! the only difference is MongoDB's millisecond resolution (a server time is up to 1 ms
//! earlier than the instant it was read), which [`CLOCK_TOLERANCE_US`] covers. Against a server
//! on another host (`--uri`, `--postgres-url`) the offset between the clocks is unknown: the
//! figures are still computed (and would be off by that offset) but not enforced. The waits'
//! logged times err on the side of *longer* waits at the start (logged before the call,
//! which makes its first attempt after) and are exact enough at the end (logged right after the
//! call returned; the harness's kill and stop times are taken before the signal is sent and
//! the continue time after `SIGCONT`, so a process counts as stopped for at least as long as it
//! was). A wait that started earlier than it really did could only make a stretch look slower
//! by the time to the first attempt (one round trip).
//!
//! # Departed waiters ahead
//! The queue itself is the library's (lock documents' `waiters`), so the checker does not read
//! it; it can only tell when departed waiters *may* have stood ahead of the live one, and the
//! summary reports release stretches in three classes (the bound is the same for all):
//!
//! * `release after dead`: a waiter of the name whose process died while it waited (SIGKILL,
//!   an exit without withdrawing, a log that just ends) within the queue's registration window
//!   before `F` (the lease plus 2.5 s: entries live until the holder's expiry plus 2 s, and a
//!   waiter re-registers at every busy attempt), or one that gave up and whose process then
//!   died or was stopped within [`WITHDRAWAL_US`] (before its withdrawal could be sent); or a
//!   waiter of the name that was stopped or cut off at `F`.
//! * `release after gave up`: otherwise, a waiter of the name gave up (timed out, dropped,
//!   failed, interrupted, ended by its process's orderly exit) within [`WITHDRAWAL_US`] before
//!   `F`: its withdrawal (sent in the background after a 50 ms grace) may not have landed.
//! * `release`: neither.
//!
//! An expiry wakes every waiter by its own timer, whatever the queue holds, so expiry
//! stretches are not split.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::checker::{fmt_time, Grant};
use crate::config::LIVE_PREFIX;

/// The library's handoff fallback (`HANDOFF_FALLBACK` in `backends/notify/hub.rs`), in µs.
pub const HANDOFF_FALLBACK_US: i64 = 500_000;

/// The acquire loop's margin after a holder's expiry (`EXPIRY_MARGIN` in `acquire_loop.rs`).
pub const EXPIRY_MARGIN_US: i64 = 5_000;

/// The default slack added to both bounds.
pub const DEFAULT_SLACK_US: i64 = 1_000_000;

/// How far the server's times may be from the workers' on one host: MongoDB dates have
/// millisecond resolution, plus 1 ms.
pub const CLOCK_TOLERANCE_US: i64 = 2_000;

/// How long a queue entry may outlive the holder's expiry (`REGISTRATION` in
/// `backends/notify/handoff.rs`), plus a margin.
const REGISTRATION_US: i64 = 2_500_000;

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitEnd {
    /// The call returned the lock.
    Got,
    /// `acquire_timeout`'s (or `exec --wait`'s) time ran out.
    TimedOut,
    /// The acquire future was dropped while waiting.
    Dropped,
    /// The call returned an error.
    Failed,
    /// A SIGINT ended `mongolock exec`'s wait (`exec_sigint`).
    Interrupted,
    /// The run's stop ended the wait (the worker's loops drain).
    Stopped,
    /// The process shut down on request (`waiter_exit`): it ended its waits and flushed
    /// their withdrawals, then exited.
    Shutdown,
    /// The process exited on request at once while waiting (`waiter_exit`): nothing withdrawn.
    Exited,
    /// The process was SIGKILLed while waiting.
    Killed,
    /// The log ends without saying (the process died otherwise): ended at its last line.
    Vanished,
}

impl WaitEnd {
    /// Short name in reports.
    pub fn label(self) -> &'static str {
        match self {
            WaitEnd::Got => "got it",
            WaitEnd::TimedOut => "timed out",
            WaitEnd::Dropped => "dropped",
            WaitEnd::Failed => "failed",
            WaitEnd::Interrupted => "interrupted",
            WaitEnd::Stopped => "stopped by the run's end",
            WaitEnd::Shutdown => "its process shut down",
            WaitEnd::Exited => "its process exited",
            WaitEnd::Killed => "its process was killed",
            WaitEnd::Vanished => "its log ended",
        }
    }

    /// Whether the waiter left without the lock while the run went on (it may have left an
    /// entry in the queue).
    pub fn departed(self) -> bool {
        !matches!(self, WaitEnd::Got | WaitEnd::Stopped)
    }

    /// Whether the waiter gave up by itself (a timeout, a dropped future, an error, a SIGINT).
    pub fn gave_up(self) -> bool {
        matches!(
            self,
            WaitEnd::TimedOut | WaitEnd::Dropped | WaitEnd::Failed | WaitEnd::Interrupted
        )
    }

    /// Whether its process died while it waited, leaving its queue entry behind.
    pub fn died(self) -> bool {
        matches!(self, WaitEnd::Killed | WaitEnd::Exited | WaitEnd::Vanished)
    }
}

/// One wait of one checked name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// The name.
    pub name: String,
    /// Who waited: the worker incarnation (`w3.1`) or `exec <pid>`.
    pub who: String,
    /// How (`acquire`, `acquire_timeout`, `exec --wait 2s`).
    pub via: String,
    /// Local wall-clock time (µs) before the call.
    pub start_us: i64,
    /// Local wall-clock time (µs) at which the wait ended.
    pub end_us: i64,
    /// How it ended.
    pub end: WaitEnd,
    /// Windows (µs, sorted, possibly overlapping) in which the waiter's process could not act:
    /// stopped, or cut off from the server (with the recovery after the heal).
    pub paused: Vec<(i64, i64)>,
    /// Whether its queue entry may have outlived the wait for long: its process died while it
    /// waited, or died or was stopped within [`WITHDRAWAL_US`] after it gave up.
    pub abandoned: bool,
}

/// How long after a waiter gave up its withdrawal from the queue may take to land (the
/// library's 50 ms grace, a round trip, scheduling).
pub const WITHDRAWAL_US: i64 = 250_000;

/// What the harness did to a process (from the injector's timeline), in local wall-clock µs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hit {
    /// SIGKILL at `start_us`.
    Kill,
    /// SIGSTOP at `start_us`, SIGCONT before `end_us`.
    Stop,
    /// The worker slot's link was cut or degraded from `start_us` until `end_us`.
    Cut,
    /// Asked to exit (SIGUSR1) at `start_us`.
    Exit,
}

/// One injected disruption of a worker process (`pid`) or slot (`slot`: every incarnation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disruption {
    /// What.
    pub hit: Hit,
    /// The process, for signals.
    pub pid: Option<u32>,
    /// The worker slot, for cuts.
    pub slot: Option<usize>,
    /// When it began (µs).
    pub start_us: i64,
    /// When it ended (µs; the start for instant ones).
    pub end_us: i64,
}

/// One wait as a worker logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedWait {
    /// The name.
    pub name: String,
    /// The worker's id of the wait.
    pub id: u64,
    /// How.
    pub via: String,
    /// Before the call (µs).
    pub start_us: i64,
    /// After it (µs) and how it ended; `None`: no end line (killed, exited, died).
    pub end: Option<(i64, WaitEnd)>,
}

/// What the checker needs from one worker incarnation's log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessLog {
    /// The incarnation (`w3.1`).
    pub who: String,
    /// Its worker slot.
    pub slot: Option<usize>,
    /// Its pid (from its start line).
    pub pid: Option<u32>,
    /// Its start line's time (µs).
    pub start_us: i64,
    /// Its last line's time (µs).
    pub last_us: i64,
    /// When it logged that it exits on request (µs).
    pub exit_us: Option<i64>,
    /// Its waits of checked names, in log order.
    pub waits: Vec<LoggedWait>,
}

/// How many disruptions hit a process while it waited for a checked name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WaiterHits {
    /// SIGKILLs of a process with a wait in progress.
    pub killed: u64,
    /// SIGSTOPs of a process with a wait in progress.
    pub stopped: u64,
    /// Exits on request of a process with a wait in progress.
    pub exited: u64,
    /// Exits on request in all (the requests the worker received).
    pub exits: u64,
}

/// The recovery after a cut healed: as long as the cut, plus 1 s.
fn cut_recovery(d: &Disruption) -> i64 {
    (d.end_us - d.start_us).max(0) + 1_000_000
}

/// The waits of every log, resolved against the injector's timeline: a wait without an end
/// ends at its process's SIGKILL, its exit on request, or its log's last line; each gets the
/// windows in which its process was stopped or cut off. Also counts the disruptions that hit a
/// process while it waited.
pub fn waiters_of(logs: &[ProcessLog], timeline: &[Disruption]) -> (Vec<Waiter>, WaiterHits) {
    let mut hits = WaiterHits::default();
    let mut out = Vec::new();
    for log in logs {
        // This incarnation's SIGKILL: the first one of its pid after it started.
        let killed_at = timeline
            .iter()
            .filter(|d| d.hit == Hit::Kill && d.pid.is_some() && d.pid == log.pid)
            .filter(|d| d.start_us >= log.start_us)
            .map(|d| d.start_us)
            .min();
        let death = killed_at
            .or(log.exit_us)
            .unwrap_or(log.last_us.max(log.start_us));
        let mine = |d: &&Disruption| {
            let ours = match d.hit {
                Hit::Stop | Hit::Kill | Hit::Exit => d.pid.is_some() && d.pid == log.pid,
                Hit::Cut => d.slot.is_some() && d.slot == log.slot,
            };
            ours && d.end_us >= log.start_us && d.start_us <= death
        };
        let mut paused: Vec<(i64, i64)> = timeline
            .iter()
            .filter(mine)
            .filter_map(|d| match d.hit {
                Hit::Stop => Some((d.start_us, d.end_us)),
                Hit::Cut => Some((d.start_us, d.end_us + cut_recovery(d))),
                Hit::Kill | Hit::Exit => None,
            })
            .collect();
        paused.sort_unstable();
        let waits: Vec<Waiter> = log
            .waits
            .iter()
            .map(|w| {
                let (end_us, end) = match w.end {
                    Some((t, how)) => (t, how),
                    None => match (killed_at, log.exit_us) {
                        (Some(k), _) => (k, WaitEnd::Killed),
                        (None, Some(x)) => (x, WaitEnd::Exited),
                        (None, None) => (log.last_us, WaitEnd::Vanished),
                    },
                };
                // Gave up, then died or was stopped before the withdrawal could be sent.
                let soon = |t: i64| t >= end_us && t <= end_us + WITHDRAWAL_US;
                let abandoned = end.died()
                    || (end.gave_up()
                        && (killed_at.is_some_and(soon)
                            || log.exit_us.is_some_and(soon)
                            || paused.iter().any(|&(p, _)| soon(p))));
                Waiter {
                    name: w.name.clone(),
                    who: log.who.clone(),
                    via: w.via.clone(),
                    start_us: w.start_us,
                    end_us: end_us.max(w.start_us),
                    end,
                    paused: paused
                        .iter()
                        .copied()
                        .filter(|&(a, b)| b > w.start_us && a < end_us)
                        .collect(),
                    abandoned,
                }
            })
            .collect();
        let waiting_at = |t: i64| waits.iter().any(|w| w.start_us <= t && t < w.end_us);
        let waiting_until = |t: i64| waits.iter().any(|w| w.start_us <= t && t <= w.end_us);
        for d in timeline.iter().filter(mine) {
            match d.hit {
                Hit::Kill if Some(d.start_us) == killed_at => {
                    hits.killed += u64::from(waiting_until(d.start_us));
                }
                Hit::Stop => hits.stopped += u64::from(waiting_at(d.start_us)),
                Hit::Kill | Hit::Cut | Hit::Exit => {}
            }
        }
        if let Some(x) = log.exit_us {
            hits.exits += 1;
            hits.exited += u64::from(waiting_until(x));
        }
        out.extend(waits);
    }
    (out, hits)
}

/// The bounds of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Largest latency after a release (or on a name not held yet), µs.
    pub release_us: i64,
    /// Largest latency after an expiry, µs.
    pub expiry_us: i64,
    /// Clock tolerance (µs) added to both; `None`: the server's clock is not this host's, so
    /// nothing is enforced.
    pub tolerance_us: Option<i64>,
    /// How long before a stretch a waiter that died may still have been queued (µs).
    pub departed_window_us: i64,
}

impl Bounds {
    /// The bounds for names leased for `lease_us`, with `slack_us` added to the library's
    /// delays.
    pub fn new(lease_us: i64, slack_us: i64) -> Self {
        Bounds {
            release_us: HANDOFF_FALLBACK_US + slack_us,
            expiry_us: EXPIRY_MARGIN_US + slack_us,
            tolerance_us: Some(CLOCK_TOLERANCE_US),
            departed_window_us: lease_us + REGISTRATION_US,
        }
    }
}

/// Why a name became free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// Its holder released it.
    Release,
    /// Its last lease ran out (holder dead, stopped, or not extending).
    Expiry,
    /// Not granted yet in the recording.
    Unheld,
}

impl Cause {
    fn label(self) -> &'static str {
        match self {
            Cause::Release => "release",
            Cause::Expiry => "expiry",
            Cause::Unheld => "unheld",
        }
    }
}

/// One grant of a checked name, as the liveness checker keeps it.
#[derive(Clone, Debug)]
struct Span {
    start_us: i64,
    end_us: i64,
    released: bool,
    lease: String,
    holder: String,
}

/// Latency figures of one class of stretches, in ms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Stretches measured.
    pub count: u64,
    /// Median latency.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Stats {
    fn of(mut v: Vec<i64>) -> Stats {
        if v.is_empty() {
            return Stats::default();
        }
        v.sort_unstable();
        let at = |q: f64| {
            let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
            v[i] as f64 / 1000.0
        };
        Stats {
            count: v.len() as u64,
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: v[v.len() - 1] as f64 / 1000.0,
        }
    }
}

/// What the liveness check found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LivenessReport {
    /// Whether the bounds were enforced (the server's clock is this host's).
    pub enforced: bool,
    /// The bound after a release, ms.
    pub release_bound_ms: f64,
    /// The bound after an expiry, ms.
    pub expiry_bound_ms: f64,
    /// Waits of checked names read.
    pub waits: u64,
    /// Latency by class: `release`, `release after gave up`, `release after dead`, `expiry`,
    /// `unheld` (see the module docs).
    pub stretches: BTreeMap<String, Stats>,
    /// Waits that gave up, by how (`timed out`, `dropped`, ...): (all, those that gave up while
    /// the name was held by someone: they left a queue).
    pub gave_up: BTreeMap<String, (u64, u64)>,
    /// Stretches above their bound (the `liveness` violations).
    pub slow: u64,
    /// The slowest stretches with their evidence, slow or not (for the run's log).
    pub slowest: Vec<(f64, String)>,
    /// Evidence of the first slow stretches.
    pub evidence: Vec<String>,
}

/// A stretch being measured.
struct Stretch {
    from: i64,
    to: i64,
    cause: Cause,
    /// Index of the grant before (None: unheld) and after (None: none yet).
    before: Option<usize>,
    after: Option<usize>,
    /// The longest live piece: (length, waiter index, piece start, piece end).
    worst: Option<(i64, usize, i64, i64)>,
    /// Departed waiters that may have been queued ahead (waiter indexes): dead or stopped
    /// ones, and ones that gave up.
    dead: Vec<usize>,
    gave_up: Vec<usize>,
}

/// How many slow stretches are kept with their evidence.
const KEEP: usize = 20;

/// How many of the slowest stretches are kept with their evidence, slow or not.
const SLOWEST: usize = 3;

/// The grant history of the checked names ([`LIVE_PREFIX`]), fed by the checker with every
/// closed grant.
#[derive(Default)]
pub struct Liveness {
    spans: HashMap<String, Vec<Span>>,
}

impl Liveness {
    /// A closed grant, in grant order per name (other names are ignored).
    pub fn grant(&mut self, g: &Grant) {
        if !g.name.starts_with(LIVE_PREFIX) {
            return;
        }
        self.spans.entry(g.name.clone()).or_default().push(Span {
            start_us: g.start_us,
            end_us: g.end_us,
            released: g.released,
            lease: g.lease.clone(),
            holder: g.holder.clone(),
        });
    }

    /// Grants kept.
    pub fn grants(&self) -> usize {
        self.spans.values().map(Vec::len).sum()
    }

    /// Measures every stretch of every checked name against `waiters`; see the module docs.
    pub fn check(&self, waiters: &[Waiter], bounds: &Bounds) -> LivenessReport {
        let mut by_name: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, w) in waiters.iter().enumerate() {
            by_name.entry(w.name.as_str()).or_default().push(i);
        }
        let mut report = LivenessReport {
            enforced: bounds.tolerance_us.is_some(),
            release_bound_ms: bounds.release_us as f64 / 1000.0,
            expiry_bound_ms: bounds.expiry_us as f64 / 1000.0,
            waits: waiters.len() as u64,
            ..LivenessReport::default()
        };
        let mut latencies: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        let mut names: Vec<&str> = by_name.keys().copied().collect();
        names.sort_unstable();
        let empty = Vec::new();
        for name in names {
            let spans = self.spans.get(name).unwrap_or(&empty);
            let mine = &by_name[name];
            for &i in mine {
                let w = &waiters[i];
                if w.end.gave_up() {
                    let held = held_at(spans, w.end_us);
                    let e = report.gave_up.entry(w.end.label().to_owned()).or_default();
                    e.0 += 1;
                    e.1 += u64::from(held);
                }
            }
            let mut stretches = stretches_of(spans);
            for &i in mine {
                measure(&mut stretches, waiters, i, bounds);
            }
            for st in &stretches {
                let Some((len, wi, a, b)) = st.worst else {
                    continue;
                };
                let class = if !st.dead.is_empty() {
                    format!("{} after dead", st.cause.label())
                } else if !st.gave_up.is_empty() {
                    format!("{} after gave up", st.cause.label())
                } else {
                    st.cause.label().to_owned()
                };
                latencies.entry(class).or_default().push(len);
                let bound = match st.cause {
                    Cause::Expiry => bounds.expiry_us,
                    Cause::Release | Cause::Unheld => bounds.release_us,
                };
                let ms = len as f64 / 1000.0;
                if report.slowest.len() < SLOWEST
                    || report.slowest.last().is_some_and(|(l, _)| ms > *l)
                {
                    let e = evidence(name, st, spans, waiters, (len, wi, a, b), bound);
                    report.slowest.push((ms, e));
                    report.slowest.sort_by(|x, y| y.0.total_cmp(&x.0));
                    report.slowest.truncate(SLOWEST);
                }
                let Some(tolerance) = bounds.tolerance_us else {
                    continue;
                };
                if len > bound + tolerance {
                    report.slow += 1;
                    if report.evidence.len() < KEEP {
                        report.evidence.push(evidence(
                            name,
                            st,
                            spans,
                            waiters,
                            (len, wi, a, b),
                            bound,
                        ));
                    }
                }
            }
        }
        report.stretches = latencies
            .into_iter()
            .map(|(k, v)| (k, Stats::of(v)))
            .collect();
        report
    }
}

/// Whether a grant of `spans` was open at `t`.
fn held_at(spans: &[Span], t: i64) -> bool {
    // Grants are in grant order; their starts nearly sorted (stamp inversions by at most a
    // command's duration): look at the grants that started up to 60 s before.
    let i = spans.partition_point(|s| s.start_us <= t);
    spans[..i]
        .iter()
        .rev()
        .take_while(|s| s.start_us > t - 60_000_000)
        .any(|s| s.end_us > t)
}

/// The free stretches between the grants of one name, in order.
fn stretches_of(spans: &[Span]) -> Vec<Stretch> {
    let mut out = Vec::new();
    let mut from = i64::MIN;
    let mut cause = Cause::Unheld;
    let mut before = None;
    for (i, s) in spans.iter().enumerate() {
        if s.start_us > from {
            out.push(Stretch {
                from,
                to: s.start_us,
                cause,
                before,
                after: Some(i),
                worst: None,
                dead: Vec::new(),
                gave_up: Vec::new(),
            });
        }
        // A grant stamped before the end of the previous one (a stamp inversion, or an
        // overlap the safety rules report) leaves no stretch; the later end counts.
        if s.end_us >= from {
            from = s.end_us;
            cause = if s.released {
                Cause::Release
            } else {
                Cause::Expiry
            };
        }
        before = Some(i);
    }
    out.push(Stretch {
        from,
        to: i64::MAX,
        cause,
        before,
        after: None,
        worst: None,
        dead: Vec::new(),
        gave_up: Vec::new(),
    });
    out
}

/// Records waiter `i` in the stretches it overlaps (its longest live piece in each), and as
/// departed ahead of the stretches that began soon after it left or while it was paused.
fn measure(stretches: &mut [Stretch], waiters: &[Waiter], i: usize, bounds: &Bounds) {
    let w = &waiters[i];
    let first = stretches.partition_point(|s| s.to <= w.start_us);
    for st in stretches[first..].iter_mut() {
        if st.from >= w.end_us {
            break;
        }
        let a = st.from.max(w.start_us);
        let b = st.to.min(w.end_us);
        if let Some((len, pa, pb)) = longest_live(a, b, &w.paused) {
            if st.worst.is_none_or(|(l, ..)| len > l) {
                st.worst = Some((len, i, pa, pb));
            }
        }
        // Stopped or cut off when its holder released the name: possibly designated.
        if st.cause == Cause::Release
            && w.start_us < st.from
            && w.paused.iter().any(|&(p, q)| p <= st.from && st.from < q)
        {
            st.dead.push(i);
        }
    }
    if w.end.departed() {
        // Left without the lock: possibly still queued when the name was released soon after.
        let window = if w.abandoned {
            bounds.departed_window_us
        } else {
            WITHDRAWAL_US
        };
        let from = stretches.partition_point(|s| s.from < w.end_us);
        for st in stretches[from..].iter_mut() {
            if st.from > w.end_us + window {
                break;
            }
            if st.cause == Cause::Release {
                if w.abandoned {
                    st.dead.push(i);
                } else {
                    st.gave_up.push(i);
                }
            }
        }
    }
}

/// The longest piece of `[a, b)` outside the `paused` windows: (length, start, end).
fn longest_live(a: i64, b: i64, paused: &[(i64, i64)]) -> Option<(i64, i64, i64)> {
    let mut best: Option<(i64, i64, i64)> = None;
    let mut at = a;
    let mut consider = |from: i64, to: i64| {
        if to > from && best.is_none_or(|(l, ..)| to - from > l) {
            best = Some((to - from, from, to));
        }
    };
    for &(p, q) in paused {
        if q <= at {
            continue;
        }
        if p >= b {
            break;
        }
        consider(at, p.min(b));
        at = at.max(q);
        if at >= b {
            break;
        }
    }
    consider(at, b);
    best
}

fn evidence(
    name: &str,
    st: &Stretch,
    spans: &[Span],
    waiters: &[Waiter],
    (len, wi, a, b): (i64, usize, i64, i64),
    bound: i64,
) -> String {
    let w = &waiters[wi];
    let grant = |i: Option<usize>| {
        i.and_then(|i| spans.get(i)).map(|s| {
            format!(
                "lease {} of {:?} [{}, {}){}",
                s.lease,
                s.holder,
                fmt_time(s.start_us),
                fmt_time(s.end_us),
                if s.released { " released" } else { "" }
            )
        })
    };
    let after = match grant(st.after) {
        Some(g) => format!("the next grant was {g}"),
        None => "no grant followed".to_owned(),
    };
    let ended = if b >= st.to {
        "then the name was granted".to_owned()
    } else if b >= w.end_us {
        format!("then the wait ended: {}", w.end.label())
    } else {
        "then its process was stopped or cut off".to_owned()
    };
    let mut departed: Vec<String> = st
        .dead
        .iter()
        .chain(&st.gave_up)
        .map(|&d| {
            let o = &waiters[d];
            let paused = o
                .paused
                .iter()
                .any(|&(p, q)| p <= st.from && st.from < q && o.start_us < st.from);
            if paused {
                format!(
                    "{} (waiting since {}, stopped or cut off)",
                    o.who,
                    fmt_time(o.start_us)
                )
            } else if o.abandoned && !o.end.died() {
                format!(
                    "{} ({} at {}, then its process died or was stopped)",
                    o.who,
                    o.end.label(),
                    fmt_time(o.end_us)
                )
            } else {
                format!("{} ({} at {})", o.who, o.end.label(), fmt_time(o.end_us))
            }
        })
        .collect();
    departed.dedup();
    if departed.len() > 6 {
        let more = departed.len() - 6;
        departed.truncate(6);
        departed.push(format!("and {more} more"));
    }
    format!(
        "name {name:?}: free from {} ({}, after {}) and {after}; waiter {} ({}, waiting {} to \
         {}, {}) waited {} µs while live and the name free, from {} ({ended}), bound {} µs; \
         departed waiters that may have been queued ahead: {}",
        if st.from == i64::MIN {
            "the start".to_owned()
        } else {
            fmt_time(st.from)
        },
        st.cause.label(),
        grant(st.before).unwrap_or_else(|| "no grant".into()),
        w.who,
        w.via,
        fmt_time(w.start_us),
        fmt_time(w.end_us),
        w.end.label(),
        len,
        fmt_time(a),
        bound,
        if departed.is_empty() {
            "none".to_owned()
        } else {
            departed.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000;
    const S: i64 = 1_000_000;

    fn g(start: i64, end: i64, released: bool, lease: &str) -> Grant {
        Grant {
            name: "live-0".into(),
            lease: lease.into(),
            tokens: vec![1],
            start_us: start,
            end_us: end,
            released,
            holder: "w0".into(),
        }
    }

    fn wait(who: &str, start: i64, end: i64, how: WaitEnd) -> Waiter {
        Waiter {
            name: "live-0".into(),
            who: who.into(),
            via: "acquire".into(),
            start_us: start,
            end_us: end,
            end: how,
            paused: Vec::new(),
            abandoned: how.died(),
        }
    }

    fn bounds() -> Bounds {
        Bounds::new(5 * S, DEFAULT_SLACK_US)
    }

    /// A clean history: each release reaches a waiter within milliseconds, an expiry within a
    /// second; a waiter that was stopped while the name was free does not count for that
    /// time; other names are not checked.
    #[test]
    fn a_history_whose_free_names_reach_live_waiters_in_time_passes() {
        let mut l = Liveness::default();
        l.grant(&g(0, 100 * MS, true, "a"));
        l.grant(&g(103 * MS, 200 * MS, true, "b"));
        // c dies holding; its lease runs out at 5.2 s; d takes over 0.9 s later.
        l.grant(&g(200 * MS, 5_200 * MS, false, "c"));
        l.grant(&g(6_100 * MS, 7_000 * MS, true, "d"));
        // e: d was released at 7 s; the only waiter was stopped from 6.9 s to 9 s and got the
        // name 20 ms after it was continued.
        l.grant(&g(9_020 * MS, 9_100 * MS, true, "e"));
        l.grant(&Grant {
            name: "hot-0".into(),
            ..g(0, 1, true, "x")
        });
        let mut stopped = wait("w2.0", 6_300 * MS, 9_030 * MS, WaitEnd::Got);
        stopped.paused = vec![(6_900 * MS, 9_000 * MS)];
        let waiters = vec![
            // Gave up 10 ms before a's release: its withdrawal may not have landed yet.
            wait("w0.0", 20 * MS, 90 * MS, WaitEnd::Dropped),
            wait("w1.0", 50 * MS, 104 * MS, WaitEnd::Got),
            wait("w2.0", 150 * MS, 6_101 * MS, WaitEnd::Got),
            // Gave up while b held the name: it left a queue, and may have stayed in it until
            // c's expiry plus 2 s.
            wait("w3.0", 110 * MS, 190 * MS, WaitEnd::TimedOut),
            stopped,
        ];
        // The stretch after e (9.1 s, no grant follows) has no waiter.
        let r = l.check(&waiters, &bounds());
        assert_eq!(r.slow, 0, "{:#?}", r.evidence);
        let figures = |class: &str| {
            let s = r.stretches[class];
            (s.count, s.max_ms)
        };
        assert_eq!(figures("release after gave up"), (1, 3.0), "{r:#?}");
        assert_eq!(figures("expiry"), (1, 900.0));
        // The stopped waiter was itself stopped when d was released.
        assert_eq!(figures("release after dead"), (1, 20.0));
        assert_eq!(r.stretches.len(), 3);
        assert_eq!(r.gave_up["timed out"], (1, 1));
        assert_eq!(r.gave_up["dropped"], (1, 1));
        assert_eq!(l.grants(), 5);
    }

    /// The stall of issue 32 item 1: two waiters gave up (and one process was killed) while
    /// the name was held; after the release a live waiter got it only at the old lease's
    /// expiry, 4 s later. And a waiter that timed out after 1.8 s of a free name.
    #[test]
    fn a_free_name_that_a_live_waiter_did_not_get_within_the_bound_fails() {
        let mut l = Liveness::default();
        l.grant(&g(0, 2 * S, true, "a"));
        l.grant(&g(6 * S, 6 * S + 100 * MS, true, "b"));
        l.grant(&g(10 * S, 10 * S + 100 * MS, true, "c"));
        let mut gave_up_then_stopped = wait("w2.0", S, 1_500 * MS, WaitEnd::Dropped);
        gave_up_then_stopped.abandoned = true;
        let waiters = vec![
            // Withdrawn long before the release.
            wait("w1.0", S, 1_300 * MS, WaitEnd::TimedOut),
            gave_up_then_stopped,
            wait("w3.0", 1_100 * MS, 1_800 * MS, WaitEnd::Killed),
            wait("w4.0", 1_200 * MS, 6 * S + 2 * MS, WaitEnd::Got),
            // Free from 6.1 s; this one gave up at 8 s without the name.
            wait("w5.0", 6_200 * MS, 8 * S, WaitEnd::TimedOut),
        ];
        let r = l.check(&waiters, &bounds());
        assert_eq!(r.slow, 2, "{r:#?}");
        let s = r.stretches["release after dead"];
        assert_eq!((s.count, s.p50_ms, s.max_ms), (2, 1_800.0, 4_000.0));
        let first = &r.evidence[0];
        assert!(
            first.contains("w4.0")
                && first.contains("4000000 µs")
                && first.contains("w2.0 (dropped")
                && first.contains("w3.0 (its process was killed")
                && !first.contains("w1.0"),
            "{first}"
        );
        assert!(
            r.evidence[1].contains("the wait ended: timed out"),
            "{}",
            r.evidence[1]
        );
        // A bound that is not enforced (another host's clock) reports the figures only.
        let mut off = bounds();
        off.tolerance_us = None;
        let r = l.check(&waiters, &off);
        assert_eq!((r.slow, r.enforced), (0, false));
        assert_eq!(r.stretches["release after dead"].max_ms, 4_000.0);
    }

    #[test]
    fn waits_are_resolved_against_the_timeline() {
        let log = ProcessLog {
            who: "w1.0".into(),
            slot: Some(1),
            pid: Some(42),
            start_us: 0,
            last_us: 5 * S,
            exit_us: None,
            waits: vec![
                LoggedWait {
                    name: "live-0".into(),
                    id: 1,
                    via: "acquire".into(),
                    start_us: S,
                    end: Some((2 * S, WaitEnd::Got)),
                },
                LoggedWait {
                    name: "live-1".into(),
                    id: 2,
                    via: "acquire".into(),
                    start_us: 3 * S,
                    end: None,
                },
            ],
        };
        let timeline = [
            Disruption {
                hit: Hit::Stop,
                pid: Some(42),
                slot: None,
                start_us: 1_500 * MS,
                end_us: 1_700 * MS,
            },
            Disruption {
                hit: Hit::Cut,
                pid: None,
                slot: Some(1),
                start_us: 3_100 * MS,
                end_us: 3_200 * MS,
            },
            // Another process's stop.
            Disruption {
                hit: Hit::Stop,
                pid: Some(43),
                slot: None,
                start_us: 1_500 * MS,
                end_us: 1_700 * MS,
            },
            Disruption {
                hit: Hit::Kill,
                pid: Some(42),
                slot: None,
                start_us: 4 * S,
                end_us: 4 * S,
            },
        ];
        let (w, hits) = waiters_of(&[log], &timeline);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].paused, vec![(1_500 * MS, 1_700 * MS)]);
        assert_eq!((w[1].end_us, w[1].end), (4 * S, WaitEnd::Killed));
        assert_eq!(w[1].paused, vec![(3_100 * MS, 4_300 * MS)]);
        assert_eq!(
            hits,
            WaiterHits {
                killed: 1,
                stopped: 1,
                exited: 0,
                exits: 0
            }
        );
    }

    #[test]
    fn the_longest_live_piece_skips_paused_windows() {
        assert_eq!(longest_live(0, 10, &[]), Some((10, 0, 10)));
        assert_eq!(longest_live(0, 10, &[(2, 3), (8, 20)]), Some((5, 3, 8)));
        assert_eq!(longest_live(0, 10, &[(-5, 20)]), None);
        assert_eq!(longest_live(5, 10, &[(0, 6), (1, 7)]), Some((3, 7, 10)));
    }
}
