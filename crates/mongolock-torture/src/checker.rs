//! The independent checker: it sees only what the recorder read from the database (grants of
//! the lock collections, accepted writes of the resource collection), what the workers wrote in
//! their logs, the final state of the lock collections and what the CLI's commands observed.
//! It never asks the library anything.
//!
//! Semaphore slots ([`SlotEvent`], MongoDB and PostgreSQL) are checked too: at most `limit` live at any grant,
//! slot tokens growing per name. A released slot ends at its release *in write order* (the
//! release is not timed), like an exclusive release; one pruned after expiry ends at its last
//! `exp`.
//!
//! Every input arrives in the order it happened *per name* (the change stream of a collection
//! delivers the writes of one document in write order), so each check needs only the previous
//! record of the same name.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use crate::liveness::{Bounds, Liveness, LivenessReport, Waiter};

/// One grant of a lock name, closed (its end is known): from the first grant write of a lease
/// to its release, or its last known expiry when it was taken over, deleted or never released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Lock name (document locks: `"<collection>:<_id>"`).
    pub name: String,
    /// The lease id stored in the lock document.
    pub lease: String,
    /// Fencing tokens this lease was given, in write order (a retried grant of the same lease
    /// increments the token; a fresh document's first grant has none until it is stamped).
    pub tokens: Vec<u64>,
    /// Server time (µs since the epoch) of the grant (`acquiredAt`).
    pub start_us: i64,
    /// Server time (µs) at which the lease ended: `expiresAt` as set by its release, or the last
    /// `expiresAt` written while it was held.
    pub end_us: i64,
    /// Whether the lease was ended by a release (otherwise it ran out or was taken over).
    pub released: bool,
    /// Who held it (the lock document's `holder.app`: the worker id), if known.
    pub holder: String,
}

/// A fenced write the resource accepted, in acceptance order per name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptedWrite {
    /// Resource name (the lock name).
    pub name: String,
    /// Fencing token presented with the write.
    pub token: u64,
    /// Unique id of the write (chosen by the worker, logged before the write was sent).
    pub write_id: String,
    /// Worker that sent it.
    pub worker: String,
    /// Server time (µs) of acceptance (`$$NOW`).
    pub at_us: i64,
}

/// What the recorder saw happen to one slot of a semaphore name (`crate::history::SlotHistory`),
/// in write order per name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotEvent {
    /// A slot appeared in the name's `slots` (or was replaced by a retry of its holder).
    Granted {
        name: String,
        /// The slot's lease id.
        id: String,
        /// Its token (`None`: not stamped yet).
        token: Option<u64>,
        /// Server time (µs) of the grant (`at`).
        at_us: i64,
        /// Its expiry (`exp`).
        exp_us: i64,
        /// The document's `limit` as the grant left it.
        limit: u64,
        /// The holder's application name.
        holder: String,
    },
    /// An open slot got a (new) token (stamped).
    Token {
        name: String,
        id: String,
        token: u64,
    },
    /// An open slot's `exp` moved (extension).
    Extended {
        name: String,
        id: String,
        exp_us: i64,
    },
    /// A slot disappeared: released by its holder (it ends at that write, in write order), or
    /// pruned after it expired or deleted with the document (it ends at its last `exp`,
    /// `end_us`).
    Ended {
        name: String,
        id: String,
        released: bool,
        end_us: i64,
    },
}

/// A slot the checker counts: open, or ended without a release (until its end is past).
#[derive(Clone, Debug)]
struct SlotSpan {
    id: String,
    at_us: i64,
    end_us: i64,
    holder: String,
}

/// Per semaphore name: the open slots, the ones that ended without a release, the largest token.
#[derive(Default)]
struct SemState {
    open: HashMap<String, SlotSpan>,
    ran_out: Vec<SlotSpan>,
    max_token: Option<u64>,
}

/// Slot counts for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SlotCounts {
    /// Slots granted (each grant and each retry that replaced its own slot).
    pub granted: u64,
    /// Slots ended by their holder's release.
    pub released: u64,
    /// Slots that ended without a release (pruned after expiry, or deleted).
    pub expired: u64,
    /// The most slots of one name seen live at one grant (including that grant).
    pub max_live: u64,
}

/// A line of a worker's log that the checker uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerEvent {
    /// The worker checked `is_lost()` before a fenced write and saw `true`.
    Lost { name: String, token: u64 },
    /// The worker is about to send a fenced write (logged before sending).
    Intent {
        name: String,
        token: u64,
        write_id: String,
        /// Local wall-clock time (µs) right before the worker called `is_lost()` and got
        /// `false` (`None` in logs of older versions).
        checked_us: Option<i64>,
    },
    /// The worker's `release()` of the lease with this token returned `Ok`.
    Released { name: String, token: u64 },
}

/// What kind of rule was broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    /// Two distinct grants of one name overlap in server time.
    Overlap,
    /// A fencing token was not larger than every earlier token of its name.
    TokenNotIncreasing,
    /// The resource accepted a token smaller than one it had accepted before.
    StaleWriteAccepted,
    /// A worker sent a fenced write under a lease after it had seen that lease lost.
    WriteAfterLost,
    /// A worker's guard said a lease was held (`is_lost()` false) after the server time at
    /// which the lease ended without a release (its last recorded `expiresAt`): the worker
    /// trusted a lease the server no longer gave it.
    WriteAfterExpiry,
    /// The resource accepted a write that no worker logged (the log is written before sending).
    UnloggedWrite,
    /// A lease was still held after the run ended and every lease had had time to expire.
    HeldAfterEnd,
    /// Two `mongolock exec` commands on one lock ran at the same time.
    CliOverlap,
    /// More slots of a semaphore name than its limit were live at one instant of server time.
    SlotOverLimit,
    /// A slot token was not larger than every token granted before for its name.
    SlotTokenNotIncreasing,
    /// A worker's `release()` returned `Ok` for a lease that ended without a release (taken
    /// over after expiry, or its document deleted): the library told its holder that nothing
    /// overlapped when someone else had the lock.
    FalseRelease,
    /// A liveness name stayed free, while a live waiter waited for it, for longer than the
    /// bound (contract item 13; [`crate::liveness`]).
    Liveness,
}

impl ViolationKind {
    /// Every kind, in report order.
    pub const ALL: [ViolationKind; 12] = [
        ViolationKind::Overlap,
        ViolationKind::TokenNotIncreasing,
        ViolationKind::StaleWriteAccepted,
        ViolationKind::WriteAfterLost,
        ViolationKind::WriteAfterExpiry,
        ViolationKind::UnloggedWrite,
        ViolationKind::HeldAfterEnd,
        ViolationKind::CliOverlap,
        ViolationKind::SlotOverLimit,
        ViolationKind::SlotTokenNotIncreasing,
        ViolationKind::FalseRelease,
        ViolationKind::Liveness,
    ];

    /// Short name used in the summary.
    pub fn label(self) -> &'static str {
        match self {
            ViolationKind::Overlap => "overlap",
            ViolationKind::TokenNotIncreasing => "token_not_increasing",
            ViolationKind::StaleWriteAccepted => "stale_write_accepted",
            ViolationKind::WriteAfterLost => "write_after_lost",
            ViolationKind::WriteAfterExpiry => "write_after_expiry",
            ViolationKind::UnloggedWrite => "unlogged_write",
            ViolationKind::HeldAfterEnd => "held_after_end",
            ViolationKind::CliOverlap => "cli_overlap",
            ViolationKind::SlotOverLimit => "slot_over_limit",
            ViolationKind::SlotTokenNotIncreasing => "slot_token_not_increasing",
            ViolationKind::FalseRelease => "false_release",
            ViolationKind::Liveness => "liveness",
        }
    }
}

/// One broken rule with its evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which rule.
    pub kind: ViolationKind,
    /// Names, tokens, lease ids, server times, worker ids.
    pub evidence: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.label(), self.evidence)
    }
}

/// Formats server time in µs as RFC 3339 with microseconds.
pub fn fmt_time(us: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_micros(us.max(0) as u64);
    humantime::format_rfc3339_micros(t).to_string()
}

/// How many violations are kept with their evidence (all are counted).
const KEEP: usize = 50;

/// The checker's state: the last grant and the largest token per name, the largest accepted
/// token per resource, the writes accepted, the violations.
#[derive(Default)]
pub struct Checker {
    last_grant: HashMap<String, Grant>,
    last_token: HashMap<String, u64>,
    max_accepted: HashMap<String, (u64, AcceptedWrite)>,
    accepted_ids: HashMap<String, (String, u64)>,
    logged_ids: HashSet<String>,
    counts: BTreeMap<ViolationKind, u64>,
    kept: Vec<Violation>,
    grants: u64,
    accepted: u64,
    inversions: u64,
    max_inversion_us: i64,
    strict_release_order: bool,
    sems: HashMap<String, SemState>,
    slot_counts: SlotCounts,
    /// Per (name, token) of a grant that ended without a release: its end (µs) and lease.
    unreleased_end: HashMap<(String, u64), (i64, String)>,
    /// The (name, token) of grants that someone else ended (taken over or deleted; not those
    /// still open when the recording ended), with their lease: rule (11).
    ended_by_others: HashMap<(String, u64), String>,
    /// How far (µs) a worker's clock may be ahead of the server's for rule (9); `None`: the
    /// rule is off (a server on another host, whose clock is not the workers').
    expiry_tolerance_us: Option<i64>,
    /// The grants of the liveness names, for the liveness check ([`Checker::check_liveness`]).
    liveness: Liveness,
}

/// Default of [`Checker::expiry_tolerance`]: MongoDB dates have millisecond precision (an
/// `expiresAt` is up to 1 ms earlier than the instant it was computed from), plus 1 ms.
pub const EXPIRY_TOLERANCE_US: i64 = 2_000;

impl Checker {
    /// An empty checker.
    pub fn new() -> Self {
        Checker {
            expiry_tolerance_us: Some(EXPIRY_TOLERANCE_US),
            ..Self::default()
        }
    }

    /// Sets how far (µs) the workers' clock may be ahead of the server's for rule (9) (a
    /// write trusted after its lease's server expiry); `None` turns the rule off (a server on
    /// another host).
    pub fn expiry_tolerance(&mut self, tolerance_us: Option<i64>) {
        self.expiry_tolerance_us = tolerance_us;
    }

    /// An empty checker for a backend whose release and grant times are taken after the row
    /// is locked (PostgreSQL's `clock_timestamp()`): a grant stamped before the preceding
    /// release of its name is then an overlap, not a stamp inversion.
    pub fn strict_release_order() -> Self {
        Checker {
            strict_release_order: true,
            ..Self::new()
        }
    }

    fn violate(&mut self, kind: ViolationKind, evidence: String) {
        *self.counts.entry(kind).or_default() += 1;
        if self.kept.len() < KEEP {
            self.kept.push(Violation { kind, evidence });
        }
    }

    /// A closed grant, in grant order per name. Checks (1) no overlap with the previous grant of
    /// the name and (2) every token larger than every earlier token of the name.
    pub fn grant(&mut self, grant: Grant) {
        self.grants += 1;
        self.liveness.grant(&grant);
        if let Some(prev) = self.last_grant.get(&grant.name) {
            if prev.released && !self.strict_release_order && grant.start_us < prev.end_us {
                // Not an overlap: the release came first in write order (the change stream
                // shows it before this grant), but `$$NOW` is fixed when a command *starts*, so
                // a grant that started before the release was applied carries an earlier time.
                self.inversions += 1;
                self.max_inversion_us = self.max_inversion_us.max(prev.end_us - grant.start_us);
            } else if grant.start_us < prev.end_us {
                let evidence = format!(
                    "name {:?}: lease {} (tokens {:?}, holder {:?}) held [{}, {}) ({}) \
                     but lease {} (tokens {:?}, holder {:?}) was granted at {}, {} µs before the \
                     earlier lease ended",
                    grant.name,
                    prev.lease,
                    prev.tokens,
                    prev.holder,
                    fmt_time(prev.start_us),
                    fmt_time(prev.end_us),
                    if prev.released {
                        "then released"
                    } else {
                        "never released"
                    },
                    grant.lease,
                    grant.tokens,
                    grant.holder,
                    fmt_time(grant.start_us),
                    prev.end_us - grant.start_us
                );
                self.violate(ViolationKind::Overlap, evidence);
            }
        }
        for &token in &grant.tokens {
            if let Some(&last) = self.last_token.get(&grant.name) {
                if token <= last {
                    let evidence = format!(
                        "name {:?}: lease {} (holder {:?}) granted at {} got token {token}, but \
                         token {last} had already been issued for this name",
                        grant.name,
                        grant.lease,
                        grant.holder,
                        fmt_time(grant.start_us)
                    );
                    self.violate(ViolationKind::TokenNotIncreasing, evidence);
                }
            }
            let entry = self.last_token.entry(grant.name.clone()).or_insert(token);
            *entry = (*entry).max(token);
            if !grant.released {
                self.unreleased_end.insert(
                    (grant.name.clone(), token),
                    (grant.end_us, grant.lease.clone()),
                );
                self.ended_by_others
                    .insert((grant.name.clone(), token), grant.lease.clone());
            }
        }
        self.last_grant.insert(grant.name.clone(), grant);
    }

    /// A grant whose way of ending is unknown: still open when the recording ended
    /// (`LockHistory::finish`), or recorded by its own worker (the memory backend, whose
    /// grants end at a lower bound taken before the release). Checked like any other, but it
    /// never counts as ended by someone else (rule `false_release`).
    pub fn grant_ended_unknown(&mut self, grant: Grant) {
        let keys: Vec<(String, u64)> = grant
            .tokens
            .iter()
            .map(|t| (grant.name.clone(), *t))
            .collect();
        self.grant(grant);
        for key in keys {
            self.ended_by_others.remove(&key);
        }
    }

    /// One slot event of a semaphore name, in write order per name. Checks (7): at the grant
    /// time of every slot, fewer than `limit` other slots of the name are live (opened and not
    /// released before it in write order, and ending after its `at`: their last `exp`) — the
    /// most intervals overlap at some interval's start, so checking each start suffices; and
    /// (8): every slot token is larger than every token granted before for the name.
    pub fn slot(&mut self, event: SlotEvent) {
        match event {
            SlotEvent::Granted {
                name,
                id,
                token,
                at_us,
                exp_us,
                limit,
                holder,
            } => {
                self.slot_counts.granted += 1;
                let st = self.sems.entry(name.clone()).or_default();
                // A retry of the same holder replaces its own slot.
                st.open.remove(&id);
                // Slots that ended without a release stay counted until their end; keep them a
                // while past it (grants are stamped at their command's start).
                st.ran_out
                    .retain(|s| s.end_us > at_us.saturating_sub(10_000_000));
                let live: Vec<SlotSpan> = st
                    .open
                    .values()
                    .chain(st.ran_out.iter())
                    .filter(|s| s.end_us > at_us && s.at_us <= at_us)
                    .cloned()
                    .collect();
                let max_token = st.max_token;
                st.open.insert(
                    id.clone(),
                    SlotSpan {
                        id: id.clone(),
                        at_us,
                        end_us: exp_us,
                        holder: holder.clone(),
                    },
                );
                if let Some(t) = token {
                    st.max_token = Some(st.max_token.map_or(t, |m| m.max(t)));
                }
                self.slot_counts.max_live = self.slot_counts.max_live.max(live.len() as u64 + 1);
                if live.len() as u64 >= limit {
                    let others = live
                        .iter()
                        .map(|s| {
                            format!(
                                "{} (holder {:?}) [{}, {})",
                                s.id,
                                s.holder,
                                fmt_time(s.at_us),
                                fmt_time(s.end_us)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ");
                    self.violate(
                        ViolationKind::SlotOverLimit,
                        format!(
                            "semaphore {name:?} (limit {limit}): slot {id} (holder {holder:?}, \
                             token {token:?}) granted at {} while {} slots were live: {others}",
                            fmt_time(at_us),
                            live.len()
                        ),
                    );
                }
                if let Some(t) = token {
                    self.slot_token(&name, &id, t, max_token);
                }
            }
            SlotEvent::Token { name, id, token } => {
                let st = self.sems.entry(name.clone()).or_default();
                let max_token = st.max_token;
                st.max_token = Some(max_token.map_or(token, |m| m.max(token)));
                self.slot_token(&name, &id, token, max_token);
            }
            SlotEvent::Extended { name, id, exp_us } => {
                if let Some(s) = self.sems.get_mut(&name).and_then(|st| st.open.get_mut(&id)) {
                    s.end_us = exp_us;
                }
            }
            SlotEvent::Ended {
                name,
                id,
                released,
                end_us,
            } => {
                let st = self.sems.entry(name).or_default();
                let span = st.open.remove(&id);
                if released {
                    self.slot_counts.released += 1;
                } else {
                    self.slot_counts.expired += 1;
                    if let Some(mut span) = span {
                        span.end_us = end_us;
                        st.ran_out.push(span);
                    }
                }
            }
        }
    }

    fn slot_token(&mut self, name: &str, id: &str, token: u64, max_before: Option<u64>) {
        if let Some(max) = max_before {
            if token <= max {
                self.violate(
                    ViolationKind::SlotTokenNotIncreasing,
                    format!(
                        "semaphore {name:?}: slot {id} got token {token}, but token {max} had \
                         already been granted for this name"
                    ),
                );
            }
        }
    }

    /// Slot counts.
    pub fn slot_counts(&self) -> SlotCounts {
        self.slot_counts
    }

    /// A write the resource accepted, in acceptance order per name. Checks (3).
    pub fn accepted_write(&mut self, write: AcceptedWrite) {
        self.accepted += 1;
        self.accepted_ids
            .insert(write.write_id.clone(), (write.name.clone(), write.token));
        if let Some((max, earlier)) = self.max_accepted.get(&write.name) {
            if write.token < *max {
                let evidence = format!(
                    "resource {:?}: accepted write {} (token {}, worker {}) at {} after it had \
                     accepted write {} (token {max}, worker {}) at {}",
                    write.name,
                    write.write_id,
                    write.token,
                    write.worker,
                    fmt_time(write.at_us),
                    earlier.write_id,
                    earlier.worker,
                    fmt_time(earlier.at_us)
                );
                self.violate(ViolationKind::StaleWriteAccepted, evidence);
                return;
            }
        }
        self.max_accepted
            .insert(write.name.clone(), (write.token, write));
    }

    /// One worker's log, in the order it was written, after every grant was recorded. Checks
    /// (4): no fenced write intended under a lease after the worker saw that lease lost; and
    /// (9): no fenced write intended under a lease that ended without a release (ran out, was
    /// taken over or deleted) after its end in server time: the guard's local deadline is
    /// never later than the server's `expiresAt` (same host, same clock), so `is_lost()`
    /// checked after it must say true.
    pub fn worker_log(&mut self, worker: &str, events: impl IntoIterator<Item = WorkerEvent>) {
        let mut lost: HashSet<(String, u64)> = HashSet::new();
        for event in events {
            match event {
                WorkerEvent::Lost { name, token } => {
                    lost.insert((name, token));
                }
                WorkerEvent::Intent {
                    name,
                    token,
                    write_id,
                    checked_us,
                } => {
                    if let (Some(checked), Some(tolerance)) = (checked_us, self.expiry_tolerance_us)
                    {
                        if let Some((end, lease)) = self.unreleased_end.get(&(name.clone(), token))
                        {
                            if checked > end + tolerance {
                                let accepted = if self.accepted_ids.contains_key(&write_id) {
                                    "accepted by the resource"
                                } else {
                                    "not accepted"
                                };
                                let evidence = format!(
                                    "worker {worker}: fenced write {write_id} on {name:?} with \
                                     token {token} (lease {lease}): is_lost() said false at {}, \
                                     {} µs after the lease ended at the server ({}, not \
                                     released) ({accepted})",
                                    fmt_time(checked),
                                    checked - end,
                                    fmt_time(*end)
                                );
                                self.violate(ViolationKind::WriteAfterExpiry, evidence);
                            }
                        }
                    }
                    if lost.contains(&(name.clone(), token)) {
                        let accepted = if self.accepted_ids.contains_key(&write_id) {
                            "accepted by the resource"
                        } else {
                            "not accepted"
                        };
                        let evidence = format!(
                            "worker {worker}: fenced write {write_id} on {name:?} with token \
                             {token} sent after the worker had seen that lease lost ({accepted})"
                        );
                        self.violate(ViolationKind::WriteAfterLost, evidence);
                    }
                    self.logged_ids.insert(write_id);
                }
                WorkerEvent::Released { name, token } => {
                    if let Some(lease) = self.ended_by_others.get(&(name.clone(), token)) {
                        let evidence = format!(
                            "worker {worker}: release() of {name:?} (token {token}, lease \
                             {lease}) returned Ok, but the lease ended without a release (taken \
                             over after expiry, or its document deleted)"
                        );
                        self.violate(ViolationKind::FalseRelease, evidence);
                    }
                }
            }
        }
    }

    /// After every worker log was read: every accepted write must have been logged.
    pub fn check_writes_logged(&mut self) {
        let mut unlogged: Vec<(String, String, u64)> = self
            .accepted_ids
            .iter()
            .filter(|(id, _)| !self.logged_ids.contains(*id))
            .map(|(id, (name, token))| (id.clone(), name.clone(), *token))
            .collect();
        unlogged.sort();
        for (id, name, token) in unlogged {
            self.violate(
                ViolationKind::UnloggedWrite,
                format!(
                    "resource {name:?} accepted write {id} (token {token}) that no worker logged"
                ),
            );
        }
    }

    /// A lease still held when nothing may hold one (5).
    pub fn held_after_end(&mut self, name: &str, lease: &str, expires_us: i64) {
        self.violate(
            ViolationKind::HeldAfterEnd,
            format!(
                "name {name:?}: lease {lease} still held after the run ended (expires at {})",
                fmt_time(expires_us)
            ),
        );
    }

    /// The liveness check (contract item 13, [`crate::liveness`]) of every grant of the
    /// liveness names recorded so far against `waiters`; each stretch above its bound is a
    /// [`ViolationKind::Liveness`].
    pub fn check_liveness(&mut self, waiters: &[Waiter], bounds: &Bounds) -> LivenessReport {
        let report = self.liveness.check(waiters, bounds);
        if report.slow > 0 {
            *self.counts.entry(ViolationKind::Liveness).or_default() += report.slow;
        }
        for evidence in &report.evidence {
            if self.kept.len() < KEEP {
                self.kept.push(Violation {
                    kind: ViolationKind::Liveness,
                    evidence: evidence.clone(),
                });
            }
        }
        report
    }

    /// Two CLI commands ran at the same time (6).
    pub fn cli_overlap(&mut self, evidence: String) {
        self.violate(ViolationKind::CliOverlap, evidence);
    }

    /// Violations by kind.
    pub fn counts(&self) -> &BTreeMap<ViolationKind, u64> {
        &self.counts
    }

    /// Total violations.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// The first violations, with their evidence.
    pub fn first(&self) -> &[Violation] {
        &self.kept
    }

    /// Closed grants checked.
    pub fn grants_checked(&self) -> u64 {
        self.grants
    }

    /// Grants stamped (`acquiredAt`) earlier than the preceding release of their name, which
    /// the change stream shows *before* them; and the largest such difference in µs.
    pub fn release_stamp_inversions(&self) -> (u64, i64) {
        (self.inversions, self.max_inversion_us)
    }

    /// Accepted writes checked.
    pub fn writes_checked(&self) -> u64 {
        self.accepted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(name: &str, lease: &str, token: u64, start: i64, end: i64) -> Grant {
        Grant {
            name: name.into(),
            lease: lease.into(),
            tokens: vec![token],
            start_us: start,
            end_us: end,
            released: true,
            holder: "w0".into(),
        }
    }

    fn write(name: &str, token: u64, id: &str) -> AcceptedWrite {
        AcceptedWrite {
            name: name.into(),
            token,
            write_id: id.into(),
            worker: "w0".into(),
            at_us: 0,
        }
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let mut c = Checker::new();
        c.grant(grant("a", "l1", 1, 0, 10));
        c.grant(grant("a", "l2", 2, 10, 20));
        c.grant(grant("b", "l3", 1, 5, 15));
        c.accepted_write(write("a", 1, "x1"));
        c.accepted_write(write("a", 1, "x2"));
        c.accepted_write(write("a", 2, "x3"));
        c.worker_log(
            "w0",
            ["x1", "x2", "x3"].map(|id| WorkerEvent::Intent {
                name: "a".into(),
                token: 1,
                write_id: id.into(),
                checked_us: Some(5),
            }),
        );
        c.check_writes_logged();
        assert_eq!(c.total(), 0, "{:?}", c.first());
    }

    #[test]
    fn a_grant_stamped_before_the_preceding_release_is_not_an_overlap() {
        let mut c = Checker::new();
        c.grant(grant("a", "l1", 1, 0, 10));
        c.grant(grant("a", "l2", 2, 9, 20));
        assert_eq!(c.total(), 0);
        assert_eq!(c.release_stamp_inversions(), (1, 1));
    }

    #[test]
    fn strict_release_order_reports_a_grant_stamped_before_the_release() {
        let mut c = Checker::strict_release_order();
        c.grant(grant("a", "l1", 1, 0, 10));
        c.grant(grant("a", "l2", 2, 10, 20));
        assert_eq!(c.total(), 0);
        c.grant(grant("a", "l3", 3, 19, 30));
        assert_eq!(c.counts().get(&ViolationKind::Overlap), Some(&1));
        assert!(c.first()[0].evidence.contains("then released"));
    }

    #[test]
    fn detects_a_planted_overlap() {
        let mut c = Checker::new();
        // l1 was never released: l2 took over 1 µs before l1's lease ran out.
        c.grant(Grant {
            released: false,
            ..grant("a", "l1", 1, 0, 10)
        });
        c.grant(grant("a", "l2", 2, 9, 20));
        assert_eq!(c.counts().get(&ViolationKind::Overlap), Some(&1));
        assert!(c.first()[0].evidence.contains("l1"));
        assert!(c.first()[0].evidence.contains("l2"));
    }

    #[test]
    fn detects_a_planted_repeated_token_and_a_decrease() {
        let mut c = Checker::new();
        c.grant(grant("a", "l1", 5, 0, 10));
        c.grant(grant("a", "l2", 5, 10, 20));
        c.grant(grant("a", "l3", 3, 20, 30));
        assert_eq!(c.counts().get(&ViolationKind::TokenNotIncreasing), Some(&2));
    }

    #[test]
    fn detects_a_planted_stale_accepted_write() {
        let mut c = Checker::new();
        c.accepted_write(write("a", 7, "x1"));
        c.accepted_write(write("a", 6, "x2"));
        assert_eq!(c.counts().get(&ViolationKind::StaleWriteAccepted), Some(&1));
        assert!(c.first()[0].evidence.contains("x2"));
    }

    #[test]
    fn detects_a_planted_write_after_lost() {
        let mut c = Checker::new();
        c.accepted_write(write("a", 3, "x1"));
        c.worker_log(
            "w1",
            [
                WorkerEvent::Lost {
                    name: "a".into(),
                    token: 3,
                },
                WorkerEvent::Intent {
                    name: "a".into(),
                    token: 3,
                    write_id: "x1".into(),
                    checked_us: None,
                },
            ],
        );
        assert_eq!(c.counts().get(&ViolationKind::WriteAfterLost), Some(&1));
        assert!(c.first()[0].evidence.contains("accepted by the resource"));
    }

    fn intent(name: &str, token: u64, id: &str, checked_us: i64) -> WorkerEvent {
        WorkerEvent::Intent {
            name: name.into(),
            token,
            write_id: id.into(),
            checked_us: Some(checked_us),
        }
    }

    /// The shortened extension whose reply never arrived (issue 21, item 1): the server
    /// ended lease l1 at 1 s (its last `expiresAt`, not released) and another holder took the
    /// name; the first worker's guard still said held at 1.2 s.
    #[test]
    fn detects_a_write_trusted_after_the_lease_ended_at_the_server() {
        let mut c = Checker::new();
        let mut ran_out = grant("a", "l1", 1, 0, 1_000_000);
        ran_out.released = false;
        c.grant(ran_out);
        c.grant(grant("a", "l2", 2, 1_000_000, 1_500_000));
        c.worker_log(
            "w0",
            [
                intent("a", 1, "x1", 900_000),
                intent("a", 1, "x2", 1_200_000),
                // The later lease, and a write just within the tolerance: no violation.
                intent("a", 2, "x3", 1_400_000),
                intent("a", 1, "x4", 1_000_000 + EXPIRY_TOLERANCE_US),
            ],
        );
        assert_eq!(c.total(), 1, "{:?}", c.first());
        assert_eq!(c.counts().get(&ViolationKind::WriteAfterExpiry), Some(&1));
        let evidence = &c.first()[0].evidence;
        assert!(
            evidence.contains("x2") && evidence.contains("200000 µs after"),
            "{evidence}"
        );
    }

    /// A released lease ends at its release, which the worker orders after its writes; a
    /// grant stamped before that release (a stamp inversion) is no reason to blame them, and
    /// with the rule off (a server on another host) nothing is checked.
    #[test]
    fn writes_under_released_leases_or_with_the_rule_off_are_not_checked_against_expiry() {
        let mut c = Checker::new();
        c.grant(grant("a", "l1", 1, 0, 1_000));
        c.worker_log("w0", [intent("a", 1, "x1", 50_000)]);
        assert_eq!(c.total(), 0, "{:?}", c.first());
        let mut c = Checker::new();
        c.expiry_tolerance(None);
        let mut ran_out = grant("a", "l1", 1, 0, 1_000);
        ran_out.released = false;
        c.grant(ran_out);
        c.worker_log("w0", [intent("a", 1, "x1", 50_000)]);
        assert_eq!(c.total(), 0, "{:?}", c.first());
    }

    /// A liveness name released at 1 s and granted again at 5 s while a live waiter waited
    /// all along (the stall of issue 32): a `liveness` violation, with its evidence; the
    /// grants of other names are not measured.
    #[test]
    fn detects_a_planted_slow_handoff_of_a_liveness_name() {
        use crate::liveness::{Bounds, WaitEnd, Waiter};
        let mut c = Checker::new();
        c.grant(grant("live-0", "l1", 1, 0, 1_000_000));
        c.grant(grant("live-0", "l2", 2, 5_000_000, 5_100_000));
        c.grant(grant("hot-0", "l3", 1, 0, 10));
        let waiter = |start, end| Waiter {
            name: "live-0".into(),
            who: "w1.0".into(),
            via: "acquire".into(),
            start_us: start,
            end_us: end,
            end: WaitEnd::Got,
            paused: Vec::new(),
            abandoned: false,
        };
        let bounds = Bounds::new(5_000_000, 1_000_000);
        // Granted to the waiter 5 ms after the release: fine.
        let mut fast = Checker::new();
        fast.grant(grant("live-0", "l1", 1, 0, 1_000_000));
        fast.grant(grant("live-0", "l2", 2, 1_005_000, 1_100_000));
        let r = fast.check_liveness(&[waiter(500_000, 1_006_000)], &bounds);
        assert_eq!((fast.total(), r.stretches["release"].count), (0, 1));
        let r = c.check_liveness(&[waiter(500_000, 5_000_500)], &bounds);
        assert_eq!(r.slow, 1);
        assert_eq!(c.counts().get(&ViolationKind::Liveness), Some(&1));
        let text = c.first()[0].to_string();
        assert!(
            text.starts_with("liveness: name \"live-0\"") && text.contains("4000000 µs"),
            "{text}"
        );
    }

    #[test]
    fn detects_an_unlogged_write() {
        let mut c = Checker::new();
        c.accepted_write(write("a", 3, "ghost"));
        c.check_writes_logged();
        assert_eq!(c.counts().get(&ViolationKind::UnloggedWrite), Some(&1));
    }

    fn slot(name: &str, id: &str, token: u64, at: i64, exp: i64) -> SlotEvent {
        SlotEvent::Granted {
            name: name.into(),
            id: id.into(),
            token: Some(token),
            at_us: at,
            exp_us: exp,
            limit: 3,
            holder: "w0".into(),
        }
    }

    fn slot_end(name: &str, id: &str, released: bool, end: i64) -> SlotEvent {
        SlotEvent::Ended {
            name: name.into(),
            id: id.into(),
            released,
            end_us: end,
        }
    }

    #[test]
    fn a_release_reported_for_a_lease_someone_else_ended_is_a_violation() {
        let mut c = Checker::new();
        // a (token 1) released; b (token 2) taken over by c (token 3), which was released;
        // d (token 4) still open when the recording ended.
        c.grant(grant("n", "a", 1, 0, 100));
        let mut b = grant("n", "b", 2, 200, 300);
        b.released = false;
        c.grant(b);
        c.grant(grant("n", "c", 3, 300, 400));
        let mut d = grant("n", "d", 4, 500, 600);
        d.released = false;
        c.grant_ended_unknown(d);
        let released = |token| WorkerEvent::Released {
            name: "n".into(),
            token,
        };
        c.worker_log("w1", [released(1), released(4)]);
        assert_eq!(c.total(), 0, "{:?}", c.first());
        c.worker_log("w2", [released(2)]);
        assert_eq!(c.counts().get(&ViolationKind::FalseRelease), Some(&1));
        let evidence = &c.first()[0].evidence;
        assert!(
            evidence.contains("worker w2") && evidence.contains("token 2"),
            "{evidence}"
        );
    }

    #[test]
    fn a_clean_slot_history_has_no_violation() {
        let mut c = Checker::new();
        c.slot(slot("s", "a", 1, 0, 100));
        c.slot(slot("s", "b", 2, 10, 100));
        c.slot(slot("s", "c", 3, 20, 100));
        // a released; d takes its place (write order), although d's `at` is earlier than a's
        // `exp`.
        c.slot(slot_end("s", "a", true, 100));
        c.slot(slot("s", "d", 4, 30, 130));
        // b ran out at 100 (pruned later); e granted at 100.
        c.slot(SlotEvent::Extended {
            name: "s".into(),
            id: "c".into(),
            exp_us: 150,
        });
        c.slot(slot_end("s", "b", false, 100));
        c.slot(slot("s", "e", 5, 100, 200));
        // Another name has its own slots and tokens.
        c.slot(slot("t", "x", 1, 20, 100));
        assert_eq!(c.total(), 0, "{:?}", c.first());
        let n = c.slot_counts();
        assert_eq!((n.granted, n.released, n.expired, n.max_live), (6, 1, 1, 3));
    }

    #[test]
    fn detects_planted_slot_overlap_and_repeated_token() {
        let mut c = Checker::new();
        // Limit 3: a fourth slot granted while three are live.
        c.slot(slot("s", "a", 1, 0, 100));
        c.slot(slot("s", "b", 2, 10, 100));
        c.slot(slot("s", "c", 3, 20, 100));
        c.slot(slot("s", "d", 4, 30, 130));
        assert_eq!(c.counts().get(&ViolationKind::SlotOverLimit), Some(&1));
        assert!(c.first()[0].evidence.contains("slot d"));
        // A slot that ended without a release still counts until its last `exp`.
        c.slot(slot_end("s", "a", false, 100));
        c.slot(slot_end("s", "b", true, 100));
        c.slot(slot_end("s", "c", true, 100));
        c.slot(slot("s", "e", 5, 50, 150));
        c.slot(slot("s", "f", 6, 60, 160));
        assert_eq!(c.counts().get(&ViolationKind::SlotOverLimit), Some(&2));
        // A repeated token (across slots) and a smaller one, granted or stamped.
        c.slot(slot_end("s", "d", true, 130));
        c.slot(slot("s", "g", 6, 200, 300));
        c.slot(SlotEvent::Token {
            name: "s".into(),
            id: "g".into(),
            token: 2,
        });
        assert_eq!(
            c.counts().get(&ViolationKind::SlotTokenNotIncreasing),
            Some(&2)
        );
    }
}
