//! The one-line summary (and its JSON form for tests and scripts).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::checker::{Checker, SlotCounts, ViolationKind};
use crate::faults::{FaultCounts, FaultKind};
use crate::liveness::{LivenessReport, WaiterHits};
use crate::options::Backend;
use crate::worklog::LogTotals;

/// Everything a run reports.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Backend.
    pub backend: String,
    /// Seed.
    pub seed: u64,
    /// Worker processes (or task groups).
    pub workers: usize,
    /// Acquisitions recorded by the independent recorder (MongoDB: change streams;
    /// PostgreSQL: the history trigger) or the workers (memory).
    pub acquisitions: u64,
    /// Acquisitions the workers logged.
    pub worker_grants: u64,
    /// Fenced writes accepted / refused / failed, as the workers saw them.
    pub writes_accepted: u64,
    /// Refused fenced writes.
    pub writes_refused: u64,
    /// Fenced writes that failed.
    pub write_errors: u64,
    /// Accepted writes in the resource's history.
    pub resource_accepted: u64,
    /// Times a worker saw `lost` before a write.
    pub lost_seen: u64,
    /// Leases left to run out.
    pub ran_out: u64,
    /// TTL deletions of lock documents seen (PostgreSQL: rows deleted by cleanup).
    pub ttl_deletes: u64,
    /// Worker restarts.
    pub restarts: u64,
    /// Faults injected by kind (fail points configured, signals sent, connections terminated,
    /// futures dropped); the kinds of the backend only.
    pub faults: BTreeMap<String, u64>,
    /// Faults that took effect, by kind: commands hit by fail points, signals delivered,
    /// extension futures dropped before the reply, deletions under a 0-second TTL index,
    /// stopped `exec` groups whose command was running, `setsid` descendants started,
    /// partitions during which the worker retransmitted.
    pub faults_fired: BTreeMap<String, u64>,
    /// Kinds selected but not injected in this run, with the reason (not root, no `ip`,
    /// no `--cli-faults`, ...).
    pub faults_skipped: BTreeMap<String, String>,
    /// Semaphore slots recorded (MongoDB: from the lock collection's change stream;
    /// PostgreSQL: from the lock table's history trigger; zero on the memory backend, which
    /// runs no semaphore operations).
    pub slots: SlotCounts,
    /// The liveness check (`None`: the memory backend, which runs no liveness names).
    pub liveness: Option<LivenessReport>,
    /// Violations by kind.
    pub violations: BTreeMap<String, u64>,
    /// Total violations.
    pub violations_total: u64,
    /// The first violations with their evidence.
    pub first_violations: Vec<String>,
    /// Grants whose `acquiredAt` is earlier than the preceding release's time (not violations:
    /// see `Checker::release_stamp_inversions`), and the largest difference in µs.
    pub release_stamp_inversions: (u64, i64),
    /// Change streams reopened by the recorder, and reopenings that failed (a non-zero value
    /// means the history may be incomplete; the run then fails).
    pub recorder_resumes: (u64, u64),
    /// CLI check: commands run, mongolock processes killed / stopped; or why it was skipped.
    pub cli: String,
    /// Duration in seconds.
    pub duration_secs: f64,
    /// Acquisitions per second.
    pub rate: f64,
}

impl Summary {
    /// Builds the summary.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: Backend,
        seed: u64,
        workers: usize,
        acquisitions: u64,
        totals: &LogTotals,
        faults: &FaultCounts,
        checker: &Checker,
        duration: Duration,
    ) -> Self {
        let kinds = FaultKind::of_backend(backend);
        let mut fault_map: BTreeMap<String, u64> = kinds
            .iter()
            .map(|k| (k.label().to_owned(), *faults.injected.get(k).unwrap_or(&0)))
            .collect();
        fault_map.insert("dropped_acquire".into(), totals.dropped_acquires);
        fault_map.insert("dropped_release".into(), totals.dropped_releases);
        let fired = kinds
            .iter()
            .map(|k| (k.label().to_owned(), *faults.fired.get(k).unwrap_or(&0)))
            .collect();
        let violations = ViolationKind::ALL
            .iter()
            .map(|k| (k.label().to_owned(), *checker.counts().get(k).unwrap_or(&0)))
            .collect();
        let secs = duration.as_secs_f64();
        Summary {
            backend: backend.label().to_owned(),
            seed,
            workers,
            acquisitions,
            worker_grants: totals.grants,
            writes_accepted: totals.accepted,
            writes_refused: totals.refused,
            write_errors: totals.write_errors,
            resource_accepted: checker.writes_checked(),
            lost_seen: totals.lost_seen,
            ran_out: totals.ran_out,
            ttl_deletes: 0,
            restarts: 0,
            faults: fault_map,
            faults_fired: fired,
            faults_skipped: BTreeMap::new(),
            slots: checker.slot_counts(),
            liveness: None,
            violations,
            violations_total: checker.total(),
            first_violations: checker.first().iter().map(|v| v.to_string()).collect(),
            release_stamp_inversions: checker.release_stamp_inversions(),
            recorder_resumes: (0, 0),
            cli: "skipped".into(),
            duration_secs: secs,
            rate: if secs > 0.0 {
                acquisitions as f64 / secs
            } else {
                0.0
            },
        }
    }

    /// Adds the liveness check's report, and its nemeses to `faults` / `faults_fired`: waits
    /// that timed out or were dropped (taken effect: while the name was held, so they left a
    /// queue), SIGKILLs and SIGSTOPs (taken effect: of a process that was waiting).
    pub fn add_liveness(&mut self, report: LivenessReport, hits: &WaiterHits, f: &FaultCounts) {
        let gave_up = |how: &str| report.gave_up.get(how).copied().unwrap_or_default();
        let kinds = [
            ("waiter_timeout", gave_up("timed out")),
            ("waiter_dropped", gave_up("dropped")),
            (
                "waiter_sigkill",
                (
                    *f.injected.get(&FaultKind::Sigkill).unwrap_or(&0),
                    hits.killed,
                ),
            ),
            (
                "waiter_sigstop",
                (
                    *f.injected.get(&FaultKind::Sigstop).unwrap_or(&0),
                    hits.stopped,
                ),
            ),
        ];
        for (kind, (injected, fired)) in kinds {
            self.faults.insert(kind.to_owned(), injected);
            self.faults_fired.insert(kind.to_owned(), fired);
        }
        self.liveness = Some(report);
    }

    /// The liveness part of the summary line.
    fn liveness_text(&self) -> String {
        let Some(r) = &self.liveness else {
            return "liveness[none]".into();
        };
        let classes = r
            .stretches
            .iter()
            .map(|(k, s)| {
                format!(
                    "{k}: n={} p50={:.1}ms p99={:.1}ms max={:.1}ms",
                    s.count, s.p50_ms, s.p99_ms, s.max_ms
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        format!(
            "liveness[waits={} bound release={:.0}ms expiry={:.0}ms{} slow={}; {classes}]",
            r.waits,
            r.release_bound_ms,
            r.expiry_bound_ms,
            if r.enforced { "" } else { " (not enforced)" },
            r.slow
        )
    }

    /// The one summary line.
    pub fn line(&self) -> String {
        let join = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "torture: backend={} seed={} workers={} acquisitions={} (workers logged {}) \
             writes accepted={} refused={} failed={} lost_seen={} ran_out={} ttl_deletes={} \
             restarts={} slots granted={} released={} expired={} max_live={} {} stamp_inversions={}(max {}µs) recorder_resumes={}(failed {}) faults[{}] fired[{}] skipped[{}] cli[{}] violations={} [{}] duration={:.1}s \
             rate={:.0}/s",
            self.backend,
            self.seed,
            self.workers,
            self.acquisitions,
            self.worker_grants,
            self.writes_accepted,
            self.writes_refused,
            self.write_errors,
            self.lost_seen,
            self.ran_out,
            self.ttl_deletes,
            self.restarts,
            self.slots.granted,
            self.slots.released,
            self.slots.expired,
            self.slots.max_live,
            self.liveness_text(),
            self.release_stamp_inversions.0,
            self.release_stamp_inversions.1,
            self.recorder_resumes.0,
            self.recorder_resumes.1,
            join(&self.faults),
            join(&self.faults_fired),
            self.faults_skipped
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join("; "),
            self.cli,
            self.violations_total,
            join(&self.violations),
            self.duration_secs,
            self.rate
        )
    }
}
