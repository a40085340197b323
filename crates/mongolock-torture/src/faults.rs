//! Random faults, each counted: `failCommand` fail points aimed at the workers' `appName`
//! (MongoDB; bounded with `times`, their firings read back from `configureFailPoint`'s
//! `count`), `pg_terminate_backend` of a worker's listening or pooled connection (PostgreSQL),
//! SIGKILL of workers (restarted by the supervisor) and SIGSTOP/SIGCONT pauses longer than the
//! lease. [`FaultKind::of_backend`] lists the kinds that apply to a backend.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::Database;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::config::WORKER_APP_NAME;
use crate::options::Backend;
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
    /// A worker's listening connection is ended with `pg_terminate_backend` (PostgreSQL).
    TerminateListener,
    /// One of a worker's pooled connections is ended with `pg_terminate_backend` (PostgreSQL).
    TerminateConnection,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::TransientError,
        FaultKind::DuplicateKey,
        FaultKind::WriteConflict,
        FaultKind::Shutdown,
        FaultKind::CloseConnection,
        FaultKind::BlockConnection,
        FaultKind::Sigkill,
        FaultKind::Sigstop,
        FaultKind::TerminateListener,
        FaultKind::TerminateConnection,
    ];

    /// The kinds that apply to `backend` (MongoDB: fail points and signals; PostgreSQL:
    /// signals and terminated connections; memory: none, its only fault is dropped futures).
    pub fn of_backend(backend: Backend) -> &'static [FaultKind] {
        match backend {
            Backend::Mongo => &FaultKind::ALL[..8],
            Backend::Postgres => &[
                FaultKind::Sigkill,
                FaultKind::Sigstop,
                FaultKind::TerminateListener,
                FaultKind::TerminateConnection,
            ],
            Backend::Memory => &[],
        }
    }

    /// The kinds selected by a `--faults` value for `backend`: `all` (every kind of the
    /// backend), `none`, or a comma-separated list; a kind that does not apply to the backend
    /// is an error naming the kinds that do.
    pub fn parse_list(spec: &str, backend: Backend) -> Result<Vec<FaultKind>, String> {
        let applicable = FaultKind::of_backend(backend);
        match spec.trim() {
            "all" => Ok(applicable.to_vec()),
            "none" | "" => Ok(Vec::new()),
            list => list
                .split(',')
                .map(|s| {
                    let s = s.trim();
                    let kind = FaultKind::parse(s).ok_or_else(|| {
                        format!(
                            "unknown fault kind {s:?} (known: {})",
                            labels(&FaultKind::ALL)
                        )
                    })?;
                    if applicable.contains(&kind) {
                        Ok(kind)
                    } else {
                        Err(format!(
                            "fault kind {s:?} does not apply to the {} backend (it has: {})",
                            backend.label(),
                            if applicable.is_empty() {
                                "none; use --faults none".to_owned()
                            } else {
                                labels(applicable)
                            }
                        ))
                    }
                })
                .collect(),
        }
    }

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
            FaultKind::TerminateListener => "terminate_listener",
            FaultKind::TerminateConnection => "terminate_connection",
        }
    }

    /// Parses a label.
    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.label() == s)
    }

    /// Whether the kind is a MongoDB fail point.
    pub fn is_fail_point(self) -> bool {
        FaultKind::ALL[..6].contains(&self)
    }
}

fn labels(kinds: &[FaultKind]) -> String {
    kinds
        .iter()
        .map(|k| k.label())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where faults other than signals are injected.
pub enum FaultTarget {
    /// The `admin` database of the MongoDB deployment (fail points).
    Mongo(Database),
    /// A control connection to the PostgreSQL server (`pg_terminate_backend`).
    Postgres(tokio_postgres::Client),
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

/// The fail point's state across configurations: `count` is cumulative, so each
/// configuration fired the difference to the previous reading.
struct FailPoints {
    admin: Database,
    last_count: u64,
    previous: Option<FaultKind>,
}

impl FailPoints {
    /// Records what the previous configuration fired, given the fail point's `count` now.
    fn account(&mut self, count: u64, counts: &Mutex<FaultCounts>) {
        if let Some(p) = self.previous {
            *lock(counts).fired.entry(p).or_default() += count.saturating_sub(self.last_count);
        }
        self.last_count = count;
    }

    /// Configures `failCommand` for a fail-point `kind`.
    async fn configure(
        &mut self,
        kind: FaultKind,
        plan: &FaultPlan,
        rng: &mut StdRng,
        counts: &Mutex<FaultCounts>,
    ) {
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
            _ => return,
        }
        match configure(&self.admin, doc! { "times": times }.into(), data).await {
            Ok(count) => {
                self.account(count, counts);
                *lock(counts).injected.entry(kind).or_default() += 1;
                self.previous = Some(kind);
            }
            Err(e) => eprintln!("torture: configureFailPoint failed: {e}"),
        }
    }
}

/// Counts one fault that took effect at once (a signal sent, a connection terminated).
fn count_fired(counts: &Mutex<FaultCounts>, kind: FaultKind) {
    let mut c = lock(counts);
    *c.injected.entry(kind).or_default() += 1;
    *c.fired.entry(kind).or_default() += 1;
}

/// Injects faults until `stop` becomes true; waits for running pauses to end (every paused
/// worker is continued) and turns the fail point off (MongoDB) before returning.
pub async fn inject(
    plan: FaultPlan,
    target: FaultTarget,
    supervisor: Arc<Supervisor>,
    counts: Arc<Mutex<FaultCounts>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut pauses = Vec::new();
    let (mut fail_points, pg) = match target {
        FaultTarget::Mongo(admin) => {
            let last_count = fail_point_off(&admin).await;
            let fp = FailPoints {
                admin,
                last_count,
                previous: None,
            };
            (Some(fp), None)
        }
        FaultTarget::Postgres(client) => (None, Some(client)),
    };
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
        match kind {
            FaultKind::TerminateListener | FaultKind::TerminateConnection => {
                let Some(client) = pg.as_ref() else { continue };
                let listener = kind == FaultKind::TerminateListener;
                match crate::postgres::terminate(client, listener, &mut rng).await {
                    Ok(true) => count_fired(&counts, kind),
                    Ok(false) => {}
                    Err(e) => eprintln!("torture: pg_terminate_backend failed: {e}"),
                }
            }
            FaultKind::Sigkill | FaultKind::Sigstop => {
                let pids = supervisor.pids();
                if pids.is_empty() {
                    continue;
                }
                let pid = pids[rng.random_range(0..pids.len())] as i32;
                if kind == FaultKind::Sigkill {
                    // SAFETY: kill(2) on a pid of a child we started; no memory is involved.
                    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                        count_fired(&counts, kind);
                    }
                    continue;
                }
                let pause = plan.lease.mul_f64(rng.random_range(1.2..2.2));
                // SAFETY: as above.
                if unsafe { libc::kill(pid, libc::SIGSTOP) } == 0 {
                    count_fired(&counts, kind);
                    pauses.push(tokio::spawn(async move {
                        tokio::time::sleep(pause).await;
                        // SAFETY: as above (a dead pid is harmless: ESRCH).
                        unsafe { libc::kill(pid, libc::SIGCONT) };
                    }));
                }
            }
            _ => {
                if let Some(fp) = fail_points.as_mut() {
                    fp.configure(kind, &plan, &mut rng, &counts).await;
                }
            }
        }
    }
    for p in pauses {
        let _ = p.await;
    }
    if let Some(mut fp) = fail_points {
        let count = fail_point_off(&fp.admin).await;
        fp.account(count, &counts);
    }
}
