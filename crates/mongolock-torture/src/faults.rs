//! Random faults, each counted: `failCommand` fail points aimed at the workers' `appName`
//! (MongoDB; bounded with `times`, their firings read back from `configureFailPoint`'s
//! `count`), `pg_terminate_backend` of a worker's listening or pooled connection (PostgreSQL),
//! SIGKILL of workers (restarted by the supervisor), SIGSTOP/SIGCONT pauses longer than the
//! lease, the operator's 0-second TTL index (MongoDB) and cut or degraded links
//! ([`crate::netns`]), and SIGUSR1, which makes a worker exit with its waits in progress
//! (`waiter_exit`). The workers drive the short extensions (MongoDB: the injector's fail
//! point slows them) and the CLI check the `exec_*` kinds. [`FaultKind::of_backend`] lists the
//! kinds that apply to a backend. Every signal and cut is also recorded with its times in
//! [`FaultCounts::timeline`], for the liveness check ([`crate::liveness`]): a waiter is not
//! live while its process is stopped or cut off, and its wait ends when it is killed.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::Database;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::config::{EXT_APP_NAME, LOCK_COLLECTION, WORKER_APP_NAME};
use crate::liveness::{Disruption, Hit};
use crate::netns::{Cut, Net};
use crate::options::Backend;
use crate::recorder::Progress;
use crate::supervisor::Supervisor;
use crate::worklog::now_us;

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
    /// An extension with a TTL shorter than what is left, whose future is dropped while the
    /// server is slowed (MongoDB: a `blockConnection` fail point for the extending client's
    /// `appName`; PostgreSQL: the lock row held `FOR UPDATE` by another connection), then the
    /// guard is used as usual (`is_lost()` before the fenced write). Driven by the workers
    /// (`worker.rs`); MongoDB's fail point is configured by the injector.
    ShortExtension,
    /// An operator replaces the library's TTL index on the lock collection with
    /// `{expiresAt: 1}`, `expireAfterSeconds: 0`, and later restores it (MongoDB).
    TtlIndexZero,
    /// Job control stops the whole process group of `mongolock exec` (mongolock, its
    /// supervisor and, if it shares the group, the command) for longer than the lease, then
    /// continues it (`--cli-faults`).
    ExecGroupStop,
    /// The command under `mongolock exec` starts a descendant that calls `setsid` and keeps
    /// working on the shared directory, possibly past its parent (`--cli-faults`).
    ExecSetsid,
    /// A worker's network link to the server is cut (`ip link set down`) for longer than the
    /// lease, then restored (the server in a network namespace of its own; as root).
    Partition,
    /// A worker's link is degraded with `tc netem` (100% loss, or a delay beyond the lease) for
    /// longer than the lease, then restored (as `partition`).
    Netem,
    /// A worker exits on request (SIGUSR1) with its waits for the liveness names in progress,
    /// half the time at once, half the time after ending them and flushing their withdrawals
    /// (`worker.rs`, `exit_on_request`); it is restarted. Taken effect: the worker had a wait
    /// in progress.
    WaiterExit,
    /// `mongolock exec` is sent SIGINT (Ctrl-C) while it waits for the liveness name of the
    /// CLI check (`--cli-faults`). Taken effect: it reported the wait interrupted.
    ExecSigint,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 18] = [
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
        FaultKind::ShortExtension,
        FaultKind::TtlIndexZero,
        FaultKind::ExecGroupStop,
        FaultKind::ExecSetsid,
        FaultKind::Partition,
        FaultKind::Netem,
        FaultKind::WaiterExit,
        FaultKind::ExecSigint,
    ];

    /// The kinds that apply to `backend` (MongoDB: fail points and signals; PostgreSQL:
    /// signals and terminated connections; memory: none, its only fault is dropped futures).
    pub fn of_backend(backend: Backend) -> &'static [FaultKind] {
        match backend {
            Backend::Mongo => &[
                FaultKind::TransientError,
                FaultKind::DuplicateKey,
                FaultKind::WriteConflict,
                FaultKind::Shutdown,
                FaultKind::CloseConnection,
                FaultKind::BlockConnection,
                FaultKind::Sigkill,
                FaultKind::Sigstop,
                FaultKind::ShortExtension,
                FaultKind::TtlIndexZero,
                FaultKind::ExecGroupStop,
                FaultKind::ExecSetsid,
                FaultKind::Partition,
                FaultKind::Netem,
                FaultKind::WaiterExit,
                FaultKind::ExecSigint,
            ],
            // No partitions: the PostgreSQL server comes from
            // `mongolock::testing::postgres_server`, which listens on the loopback interface of
            // the root network namespace only (see README, Reliability).
            Backend::Postgres => &[
                FaultKind::Sigkill,
                FaultKind::Sigstop,
                FaultKind::TerminateListener,
                FaultKind::TerminateConnection,
                FaultKind::ShortExtension,
                FaultKind::ExecGroupStop,
                FaultKind::ExecSetsid,
                FaultKind::WaiterExit,
                FaultKind::ExecSigint,
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
            FaultKind::ShortExtension => "short_extension",
            FaultKind::TtlIndexZero => "ttl_index_zero",
            FaultKind::ExecGroupStop => "exec_group_stop",
            FaultKind::ExecSetsid => "exec_setsid",
            FaultKind::Partition => "partition",
            FaultKind::Netem => "netem",
            FaultKind::WaiterExit => "waiter_exit",
            FaultKind::ExecSigint => "exec_sigint",
        }
    }

    /// Parses a label.
    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.label() == s)
    }

    /// Whether the kind needs MongoDB fail points on `backend` (the embedded server, or
    /// `--failpoints`).
    pub fn needs_fail_points(self, backend: Backend) -> bool {
        FaultKind::ALL[..6].contains(&self)
            || (self == FaultKind::ShortExtension && backend == Backend::Mongo)
    }

    /// Whether the kind is injected by the CLI check (`mongolock exec`, `--cli-faults`).
    pub fn is_cli(self) -> bool {
        matches!(
            self,
            FaultKind::ExecGroupStop | FaultKind::ExecSetsid | FaultKind::ExecSigint
        )
    }

    /// Whether the kind needs the network namespaces ([`crate::netns`]).
    pub fn is_network(self) -> bool {
        matches!(self, FaultKind::Partition | FaultKind::Netem)
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
    /// MongoDB: the `admin` database (fail points), the run's database (its lock collection's
    /// TTL index) and the recorder's progress (TTL deletions seen).
    Mongo {
        admin: Database,
        db: Database,
        progress: Arc<Progress>,
    },
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
    /// Every signal sent to a worker and every cut, with its times (local wall clock).
    pub timeline: Vec<Disruption>,
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
    /// The library's TTL delay (`ttl_index_zero` restores an index with it).
    pub cleanup_after_secs: u64,
    /// The period of the liveness rounds (`--live-round`).
    pub live_round: Duration,
    /// The run directory, where workers mark themselves while they wait for a liveness name
    /// (`worker::waiting_mark`).
    pub dir: std::path::PathBuf,
    /// Seed.
    pub seed: u64,
}

/// Name of the library's TTL index on `expiresAt` (`mongolock`'s `TTL_INDEX_NAME`), which
/// `ttl_index_zero` restores.
pub const LIBRARY_TTL_INDEX: &str = "mongolock_expiresAt_ttl";

/// Name of the operator's 0-second TTL index that `ttl_index_zero` puts in its place.
pub const OPERATOR_TTL_INDEX: &str = "operator_expiresAt_0";

/// Replaces every index on `{expiresAt: 1}` of the lock collection with an operator's
/// 0-second TTL index (`zero`) or with the library's own (`cleanup_after_secs`).
pub async fn set_ttl_index(
    db: &Database,
    zero: bool,
    cleanup_after_secs: u64,
) -> mongodb::error::Result<()> {
    use futures_util::TryStreamExt;
    use mongodb::options::IndexOptions;
    use mongodb::IndexModel;
    let coll = db.collection::<Document>(LOCK_COLLECTION);
    let indexes: Vec<IndexModel> = coll.list_indexes().await?.try_collect().await?;
    for ix in indexes {
        if ix.keys == doc! { "expiresAt": 1 } || ix.keys == doc! { "expiresAt": 1_i64 } {
            if let Some(name) = ix.options.and_then(|o| o.name) {
                coll.drop_index(name).await?;
            }
        }
    }
    let (name, secs) = if zero {
        (OPERATOR_TTL_INDEX, 0)
    } else {
        (LIBRARY_TTL_INDEX, cleanup_after_secs)
    };
    let model = IndexModel::builder()
        .keys(doc! { "expiresAt": 1 })
        .options(
            IndexOptions::builder()
                .name(name.to_owned())
                .expire_after(Duration::from_secs(secs))
                .build(),
        )
        .build();
    coll.create_index(model).await.map(|_| ())
}

/// `ttl_index_zero`'s state: while the 0-second index is in place, the TTL deletions seen when
/// it was put there (it took effect if the recorder saw a deletion while it was).
struct TtlSwap {
    db: Database,
    progress: Arc<Progress>,
    zero_since: Option<u64>,
}

impl TtlSwap {
    async fn toggle(&mut self, plan: &FaultPlan, counts: &Mutex<FaultCounts>) {
        let zero = self.zero_since.is_none();
        match set_ttl_index(&self.db, zero, plan.cleanup_after_secs).await {
            Ok(()) if zero => {
                self.zero_since = Some(self.progress.deletes.load(Ordering::Relaxed));
                *lock(counts)
                    .injected
                    .entry(FaultKind::TtlIndexZero)
                    .or_default() += 1;
            }
            Ok(()) => self.account(counts),
            Err(e) => eprintln!("torture: cannot replace the TTL index: {e}"),
        }
    }

    /// Counts the 0-second index as effective if a deletion was seen while it was in place.
    fn account(&mut self, counts: &Mutex<FaultCounts>) {
        if let Some(since) = self.zero_since.take() {
            if self.progress.deletes.load(Ordering::Relaxed) > since {
                *lock(counts)
                    .fired
                    .entry(FaultKind::TtlIndexZero)
                    .or_default() += 1;
            }
        }
    }
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
        // The short extensions' block takes effect when a worker drops the extension's future
        // (counted from the workers' logs), not when the fail point fires.
        if let Some(p) = self.previous.filter(|p| *p != FaultKind::ShortExtension) {
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
            FaultKind::ShortExtension => {
                // Slow the extending clients' next findAndModify commands (their extensions,
                // sometimes their grants): long enough that the worker drops the extension's
                // future, short enough that the extension still shortens the lease.
                let ms = plan.lease.mul_f64(rng.random_range(0.1..0.25)).as_millis() as i64;
                data = doc! {
                    "failCommands": ["findAndModify"],
                    "appName": EXT_APP_NAME,
                    "blockConnection": true,
                    "blockTimeMS": ms.max(20),
                };
            }
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

/// A running worker (the `pick`-th of them) that marks itself as waiting for a liveness name
/// (`worker::waiting_mark`), as soon as there is one, for up to `patience`.
async fn waiting_worker(
    dir: &std::path::Path,
    supervisor: &Supervisor,
    pick: u64,
    patience: Duration,
) -> Option<u32> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let waiting: Vec<u32> = supervisor
            .pids()
            .into_iter()
            .filter(|&pid| crate::worker::waiting_mark(dir, pid).exists())
            .collect();
        if !waiting.is_empty() {
            return Some(waiting[(pick % waiting.len() as u64) as usize]);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `kind`'s signal to worker `pid`, or the `pick`-th of those running: SIGKILL,
/// SIGUSR1 (`waiter_exit`), or SIGSTOP and SIGCONT after `pause`; counts it and records it in
/// the timeline.
async fn signal(
    kind: FaultKind,
    supervisor: &Supervisor,
    counts: &Mutex<FaultCounts>,
    pid: Option<u32>,
    pick: u64,
    pause: Duration,
) {
    let pids = supervisor.pids();
    if pids.is_empty() {
        return;
    }
    let pid = pid.unwrap_or(pids[(pick % pids.len() as u64) as usize]) as i32;
    let at = move |hit, start_us, end_us| Disruption {
        hit,
        pid: Some(pid as u32),
        slot: None,
        start_us,
        end_us,
    };
    // Taken before the signal is sent (a process is stopped or dead no earlier).
    let start_us = now_us();
    match kind {
        FaultKind::Sigkill => {
            // SAFETY: kill(2) on a pid of a child we started; no memory is involved.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                count_fired(counts, kind);
                lock(counts)
                    .timeline
                    .push(at(Hit::Kill, start_us, start_us));
            }
        }
        FaultKind::WaiterExit => {
            // Taken effect when the worker had a wait in progress (from its log).
            // SAFETY: as above.
            if unsafe { libc::kill(pid, libc::SIGUSR1) } == 0 {
                let mut c = lock(counts);
                *c.injected.entry(kind).or_default() += 1;
                c.timeline.push(at(Hit::Exit, start_us, start_us));
            }
        }
        _ => {
            // SAFETY: as above.
            if unsafe { libc::kill(pid, libc::SIGSTOP) } == 0 {
                count_fired(counts, kind);
                tokio::time::sleep(pause).await;
                // SAFETY: as above (a dead pid is harmless: ESRCH).
                unsafe { libc::kill(pid, libc::SIGCONT) };
                // Taken after SIGCONT was sent: the process ran again no earlier.
                lock(counts)
                    .timeline
                    .push(at(Hit::Stop, start_us, now_us()));
            }
        }
    }
}

/// Injects faults until `stop` becomes true; waits for running pauses to end (every paused
/// worker is continued) and turns the fail point off (MongoDB) before returning.
pub async fn inject(
    plan: FaultPlan,
    target: FaultTarget,
    supervisor: Arc<Supervisor>,
    net: Option<Arc<Net>>,
    counts: Arc<Mutex<FaultCounts>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut pauses = Vec::new();
    let cut_slots: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let (mut fail_points, pg, mut ttl) = match target {
        FaultTarget::Mongo {
            admin,
            db,
            progress,
        } => {
            let last_count = fail_point_off(&admin).await;
            let fp = FailPoints {
                admin,
                last_count,
                previous: None,
            };
            let ttl = TtlSwap {
                db,
                progress,
                zero_since: None,
            };
            (Some(fp), None, Some(ttl))
        }
        FaultTarget::Postgres(client) => (None, Some(client), None),
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
            FaultKind::TtlIndexZero => {
                if let Some(t) = ttl.as_mut() {
                    t.toggle(&plan, &counts).await;
                }
            }
            FaultKind::Partition | FaultKind::Netem => {
                let Some(net) = net.clone() else { continue };
                let slot = rng.random_range(0..net.slots().max(1));
                if !lock(&cut_slots).insert(slot) {
                    continue;
                }
                let hold = plan.lease.mul_f64(rng.random_range(1.5..3.0));
                let how = match kind {
                    FaultKind::Partition => Cut::Down,
                    _ if rng.random_bool(0.5) => Cut::Loss,
                    _ => {
                        Cut::Delay(plan.lease.mul_f64(rng.random_range(1.5..3.0)).as_millis() as u64)
                    }
                };
                let (counts, cut_slots) = (counts.clone(), cut_slots.clone());
                pauses.push(tokio::spawn(async move {
                    let start_us = now_us();
                    match net.cut_for(slot, how, hold).await {
                        Ok(took) => {
                            let mut c = lock(&counts);
                            c.timeline.push(Disruption {
                                hit: Hit::Cut,
                                pid: None,
                                slot: Some(slot),
                                start_us,
                                end_us: now_us(),
                            });
                            *c.injected.entry(kind).or_default() += 1;
                            if took {
                                *c.fired.entry(kind).or_default() += 1;
                            }
                        }
                        Err(e) => {
                            eprintln!("torture: {} of worker {slot} failed: {e}", kind.label())
                        }
                    }
                    lock(&cut_slots).remove(&slot);
                }));
            }
            FaultKind::TerminateListener | FaultKind::TerminateConnection => {
                let Some(client) = pg.as_ref() else { continue };
                let listener = kind == FaultKind::TerminateListener;
                match crate::postgres::terminate(client, listener, &mut rng).await {
                    Ok(true) => count_fired(&counts, kind),
                    Ok(false) => {}
                    Err(e) => eprintln!("torture: pg_terminate_backend failed: {e}"),
                }
            }
            FaultKind::Sigkill | FaultKind::Sigstop | FaultKind::WaiterExit => {
                // Half of them (and every `waiter_exit`) at a worker that waits for a liveness
                // name (if one does within two rounds), the others at any worker.
                let at_waiter = kind == FaultKind::WaiterExit || rng.random_bool(0.5);
                let pause = plan.lease.mul_f64(rng.random_range(1.2..2.2));
                let pick = rng.random::<u64>();
                let (supervisor, counts) = (supervisor.clone(), counts.clone());
                let mut stop = stop.clone();
                let (dir, patience) = (plan.dir.clone(), plan.live_round * 2);
                pauses.push(tokio::spawn(async move {
                    let pid = if at_waiter {
                        tokio::select! {
                            pid = waiting_worker(&dir, &supervisor, pick, patience) => pid,
                            _ = stop.wait_for(|s| *s) => return,
                        }
                    } else {
                        None
                    };
                    signal(kind, &supervisor, &counts, pid, pick, pause).await;
                }));
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
    if let Some(mut t) = ttl {
        if t.zero_since.is_some() {
            t.toggle(&plan, &counts).await;
        }
    }
}
