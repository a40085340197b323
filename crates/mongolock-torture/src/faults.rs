//! Random faults, each counted: `failCommand` fail points aimed at the workers' `appName`
//! (bounded with `times`, their firings read back from `configureFailPoint`'s `count`), SIGKILL
//! of workers (restarted by the supervisor) and SIGSTOP/SIGCONT pauses longer than the lease.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::Database;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::config::WORKER_APP_NAME;
use crate::supervisor::Supervisor;

/// A kind of injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// A transient error code (6, 89, 189, 10107, 11600).
    TransientError,
    /// Duplicate key (11000).
    DuplicateKey,
    /// Write conflict (112).
    WriteConflict,
    /// Shutdown in progress (91).
    Shutdown,
    /// The connection is closed without a reply.
    CloseConnection,
    /// The command is held for longer than the lease.
    BlockConnection,
    /// A worker process is killed with SIGKILL (and restarted).
    Sigkill,
    /// A worker process is paused with SIGSTOP for longer than the lease, then continued.
    Sigstop,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::TransientError,
        FaultKind::DuplicateKey,
        FaultKind::WriteConflict,
        FaultKind::Shutdown,
        FaultKind::CloseConnection,
        FaultKind::BlockConnection,
        FaultKind::Sigkill,
        FaultKind::Sigstop,
    ];

    /// Short name used in options and the summary.
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::TransientError => "transient_error",
            FaultKind::DuplicateKey => "duplicate_key",
            FaultKind::WriteConflict => "write_conflict",
            FaultKind::Shutdown => "shutdown",
            FaultKind::CloseConnection => "close_connection",
            FaultKind::BlockConnection => "block_connection",
            FaultKind::Sigkill => "sigkill",
            FaultKind::Sigstop => "sigstop",
        }
    }

    /// Parses a label.
    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.label() == s)
    }

    fn is_fail_point(self) -> bool {
        !matches!(self, FaultKind::Sigkill | FaultKind::Sigstop)
    }
}

/// Faults by kind: how many were injected, and (fail points) how many commands they failed.
#[derive(Clone, Debug, Default)]
pub struct FaultCounts {
    /// Faults injected (fail points configured, signals sent).
    pub injected: BTreeMap<FaultKind, u64>,
    /// Commands a fail point actually hit; for signals, the same as `injected`.
    pub fired: BTreeMap<FaultKind, u64>,
}

/// Configuration of the injector.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Kinds to inject (chosen uniformly).
    pub kinds: Vec<FaultKind>,
    /// Mean time between faults.
    pub interval: Duration,
    /// Lease duration (pauses and blocks last longer).
    pub lease: Duration,
    /// Seed.
    pub seed: u64,
}

/// Runs `configureFailPoint`; returns the fail point's `count` (how often it fired since the
/// server started, across configurations).
async fn configure(admin: &Database, mode: Bson, data: Document) -> mongodb::error::Result<u64> {
    let reply = admin
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": mode, "data": data })
        .await?;
    Ok(crate::history::uint(reply.get("count")).unwrap_or(0))
}

/// Turns the fail point off; returns its `count`.
pub async fn fail_point_off(admin: &Database) -> u64 {
    configure(admin, Bson::String("off".into()), Document::new())
        .await
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Injects faults until `stop` becomes true; waits for running pauses to end (every paused
/// worker is continued) and turns the fail point off before returning.
pub async fn inject(
    plan: FaultPlan,
    admin: Database,
    supervisor: Arc<Supervisor>,
    counts: Arc<Mutex<FaultCounts>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut pauses = Vec::new();
    let mut previous: Option<FaultKind> = None;
    // `count` is cumulative: each configuration fired the difference to the previous reading.
    let mut last_count = fail_point_off(&admin).await;
    if plan.kinds.is_empty() {
        return;
    }
    loop {
        let wait = plan.interval.mul_f64(rng.random_range(0.2..1.8));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let kind = plan.kinds[rng.random_range(0..plan.kinds.len())];
        if kind.is_fail_point() {
            let commands = ["findAndModify", "update", "getMore"];
            let mut chosen: Vec<&str> = commands
                .iter()
                .copied()
                .filter(|_| rng.random_bool(0.5))
                .collect();
            if chosen.is_empty() {
                chosen.push(commands[rng.random_range(0..commands.len())]);
            }
            let mut data = doc! { "failCommands": chosen, "appName": WORKER_APP_NAME };
            let times = rng.random_range(1..=3_i64);
            match kind {
                FaultKind::TransientError => {
                    let codes = [6, 89, 189, 10107, 11600];
                    data.insert("errorCode", codes[rng.random_range(0..codes.len())]);
                }
                FaultKind::DuplicateKey => {
                    data.insert("errorCode", 11000);
                }
                FaultKind::WriteConflict => {
                    data.insert("errorCode", 112);
                }
                FaultKind::Shutdown => {
                    data.insert("errorCode", 91);
                }
                FaultKind::CloseConnection => {
                    data.insert("closeConnection", true);
                }
                FaultKind::BlockConnection => {
                    data.insert("blockConnection", true);
                    let ms = plan.lease.mul_f64(rng.random_range(1.2..2.0)).as_millis() as i64;
                    data.insert("blockTimeMS", ms);
                }
                FaultKind::Sigkill | FaultKind::Sigstop => {}
            }
            match configure(&admin, doc! { "times": times }.into(), data).await {
                Ok(count) => {
                    let mut c = lock(&counts);
                    if let Some(p) = previous {
                        *c.fired.entry(p).or_default() += count.saturating_sub(last_count);
                    }
                    last_count = count;
                    *c.injected.entry(kind).or_default() += 1;
                    previous = Some(kind);
                }
                Err(e) => eprintln!("torture: configureFailPoint failed: {e}"),
            }
            continue;
        }
        let pids = supervisor.pids();
        if pids.is_empty() {
            continue;
        }
        let pid = pids[rng.random_range(0..pids.len())] as i32;
        match kind {
            FaultKind::Sigkill => {
                // SAFETY: kill(2) on a pid of a child we started; no memory is involved.
                if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                    let mut c = lock(&counts);
                    *c.injected.entry(kind).or_default() += 1;
                    *c.fired.entry(kind).or_default() += 1;
                }
            }
            _ => {
                let pause = plan.lease.mul_f64(rng.random_range(1.2..2.2));
                // SAFETY: as above.
                if unsafe { libc::kill(pid, libc::SIGSTOP) } == 0 {
                    {
                        let mut c = lock(&counts);
                        *c.injected.entry(kind).or_default() += 1;
                        *c.fired.entry(kind).or_default() += 1;
                    }
                    pauses.push(tokio::spawn(async move {
                        tokio::time::sleep(pause).await;
                        // SAFETY: as above (a dead pid is harmless: ESRCH).
                        unsafe { libc::kill(pid, libc::SIGCONT) };
                    }));
                }
            }
        }
    }
    for p in pauses {
        let _ = p.await;
    }
    let count = fail_point_off(&admin).await;
    if let Some(p) = previous {
        *lock(&counts).fired.entry(p).or_default() += count.saturating_sub(last_count);
    }
}
