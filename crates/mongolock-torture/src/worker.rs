//! A worker: loops over the public API only (`acquire`, `try_acquire`, `acquire_timeout`,
//! document `lock` / `claim` (MongoDB), election `campaign` / `run_until`), makes fenced writes
//! inside the critical sections, and logs what it did. Runs as a process of its own
//! (`mongolock-torture worker`, MongoDB and PostgreSQL) or as tasks of the orchestrator (memory
//! backend).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mongodb::bson::{doc, Document};
use mongodb::Collection;
use mongolock::documents::DocumentLocks;
use mongolock::election::Election;
use mongolock::{Lock, LockBackend, LockGuard, LockProvider, MemoryBackend, PostgresBackend};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;

use crate::checker::Grant;
use crate::config::{
    pick_cold, pick_hot, pick_sem, WorkerConfig, ELECTION_ROLE, EXT_APP_NAME, JOBS_COLLECTION,
    JOBS_LOCK_FIELD, LIVE_APP_NAME, LIVE_LOOPS, LOCK_COLLECTION, SEM_LIMIT, WORKER_APP_NAME,
    WORKER_CONFIG_ENV,
};
use crate::liveness::WaitEnd;
use crate::options::Backend;
use crate::postgres::PgResource;
use crate::resource::{fenced_write, FencedWrite, MemoryResource, RESOURCE_COLLECTION};
use crate::worklog::{now_us, EndHow, LogLine, WorkLog};

/// Where fenced writes go.
#[derive(Clone)]
pub enum Sink {
    /// The resource collection.
    Mongo(Collection<Document>),
    /// The resource table.
    Postgres(Arc<PgResource>),
    /// The in-memory resource; closed grants are collected for the checker (the memory backend
    /// has no change stream to record them independently), timed with the backend's clock.
    Memory {
        resource: Arc<MemoryResource>,
        backend: MemoryBackend,
        grants: Arc<Mutex<Vec<Grant>>>,
    },
}

/// Everything a worker's loops share.
pub struct Env {
    /// The configuration.
    pub cfg: WorkerConfig,
    /// Locks extended automatically.
    pub auto: LockProvider,
    /// Locks not extended (left to run out).
    pub manual: LockProvider,
    /// Document locks on the jobs collection (MongoDB only).
    pub docs: Option<DocumentLocks<Document>>,
    /// The election.
    pub election: Election,
    /// Fenced writes.
    pub sink: Sink,
    /// The log.
    pub log: WorkLog,
    /// Write ids.
    seq: AtomicU64,
    /// Becomes true when the worker must stop.
    pub stop: watch::Receiver<bool>,
    /// The short extensions' means (`short_extension`), if this worker makes them.
    pub ext: Option<Ext>,
    /// The liveness names' providers, if this worker waits for them.
    pub live: Option<Live>,
    /// Ids of the waits of liveness names.
    waits: AtomicU64,
    /// Set when the worker shuts down on request (`waiter_exit`): waits the stop ends have
    /// [`WaitEnd::Shutdown`].
    exiting: AtomicBool,
    /// Waits of liveness names in progress; while there are any, the file
    /// [`waiting_mark`] of this process exists (the injector aims signals at such workers).
    waiting: AtomicUsize,
}

/// The file that marks a worker process `pid` as waiting for a liveness name, in the run
/// directory `dir` (the fault injector aims some of its signals at such processes).
pub fn waiting_mark(dir: &std::path::Path, pid: u32) -> std::path::PathBuf {
    dir.join(format!("waiting-{pid}"))
}

/// The providers of the liveness names (`live-*`, [`crate::liveness`]): leased for
/// `live_lease_ms`, extended automatically or not; on MongoDB over a client of their own
/// ([`LIVE_APP_NAME`]) that no fail point is aimed at. Their backend follows the change
/// stream (listens, on PostgreSQL) in every worker, the polling ones included: a polling
/// waiter retries every 10–800 ms whatever the queue holds, so it needs no check, and it would
/// take a free name before a stalled waiter showed (the check measures the time to the next
/// grant, to anyone).
pub struct Live {
    auto: LockProvider,
    manual: LockProvider,
    lease: Duration,
}

/// How a worker makes short extensions while the server is slowed (`short_extension`).
pub enum Ext {
    /// MongoDB: a provider (not extended automatically) whose client's `appName` is
    /// [`EXT_APP_NAME`]: the injector's `blockConnection` fail point slows its commands.
    Mongo(LockProvider),
    /// PostgreSQL: the worker's provider that is not extended automatically; a connection of
    /// its own (`config`) holds the lock row of `table` `FOR UPDATE` while the extension is
    /// sent, so that the extension waits for the row and its reply comes late.
    Postgres {
        config: Box<tokio_postgres::Config>,
        table: String,
    },
}

fn lease_of(cfg: &WorkerConfig) -> Duration {
    Duration::from_millis(cfg.lease_ms)
}

impl Env {
    /// Builds the shared state over `auto`/`manual` providers.
    pub fn new(
        cfg: WorkerConfig,
        auto: LockProvider,
        manual: LockProvider,
        docs: Option<DocumentLocks<Document>>,
        sink: Sink,
        stop: watch::Receiver<bool>,
    ) -> Result<Self, String> {
        let log = WorkLog::create(&cfg.log).map_err(|e| format!("log {:?}: {e}", cfg.log))?;
        let election = auto
            .election(ELECTION_ROLE)
            .and_then(|e| e.with_expiry(lease_of(&cfg)))
            .map_err(|e| e.to_string())?;
        log.write(&LogLine::Start {
            worker: cfg.worker.clone(),
            pid: std::process::id(),
            t: now_us(),
        });
        Ok(Env {
            cfg,
            auto,
            manual,
            docs,
            election,
            sink,
            log,
            seq: AtomicU64::new(0),
            stop,
            ext: None,
            live: None,
            waits: AtomicU64::new(0),
            exiting: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
        })
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    fn error(&self, op: &str, msg: impl ToString) {
        self.log.write(&LogLine::Error {
            op: op.to_owned(),
            msg: msg.to_string(),
            t: now_us(),
        });
    }

    /// Server time (µs) for the memory backend's grant records.
    fn memory_now(&self) -> Option<i64> {
        match &self.sink {
            Sink::Memory { backend, .. } => Some(system_us(backend.now())),
            Sink::Mongo(_) | Sink::Postgres(_) => None,
        }
    }

    /// Memory backend: records a closed grant, ending no later than `end_us` (a time at which
    /// the lease had not yet been ended by us) or its last known expiry.
    fn record_grant(&self, guard: &LockGuard, end_us: Option<i64>) {
        if let Sink::Memory { grants, .. } = &self.sink {
            let expires = system_us(guard.expires_at());
            let end = end_us.map_or(expires, |e| e.min(expires));
            let grant = Grant {
                name: guard.name().to_owned(),
                lease: guard.lease_id().as_str().to_owned(),
                tokens: vec![guard.fencing_token()],
                start_us: system_us(guard.acquired_at()),
                end_us: end,
                // `end` is a lower bound of the true end (taken before release was called),
                // so the checker must compare it strictly, as for a lease that ran out.
                released: false,
                holder: self.cfg.worker.clone(),
            };
            match grants.lock() {
                Ok(mut g) => g.push(grant),
                Err(p) => p.into_inner().push(grant),
            }
        }
    }

    /// Checks `is_lost`, then makes one fenced write; returns false when the lease was lost.
    async fn fenced(
        &self,
        name: &str,
        token: u64,
        lease: &str,
        is_lost: impl Fn() -> bool,
    ) -> bool {
        // Taken before the check: if `is_lost()` says false, the lease was trusted at this
        // instant (the checker compares it with the lease's end at the server).
        let checked = now_us();
        if is_lost() {
            self.log.write(&LogLine::Lost {
                name: name.to_owned(),
                token,
                lease: lease.to_owned(),
                t: now_us(),
            });
            return false;
        }
        let wid = format!(
            "{}-{}",
            self.cfg.worker,
            self.seq.fetch_add(1, Ordering::Relaxed)
        );
        self.log.write(&LogLine::Intent {
            name: name.to_owned(),
            token,
            lease: lease.to_owned(),
            wid: wid.clone(),
            t: now_us(),
            checked: Some(checked),
        });
        let write = FencedWrite {
            name: name.to_owned(),
            token,
            write_id: wid.clone(),
            worker: self.cfg.worker.clone(),
        };
        let ok = match &self.sink {
            Sink::Mongo(coll) => match fenced_write(coll, &write).await {
                Ok(ok) => Some(ok),
                Err(e) => {
                    self.error("fenced_write", e.kind.to_string());
                    None
                }
            },
            Sink::Postgres(resource) => match resource.write(&write).await {
                Ok(ok) => Some(ok),
                Err(e) => {
                    self.error("fenced_write", e);
                    None
                }
            },
            Sink::Memory {
                resource, backend, ..
            } => Some(resource.write(&write, system_us(backend.now()))),
        };
        self.log.write(&LogLine::Result {
            wid,
            ok,
            t: now_us(),
        });
        true
    }
}

/// µs since the epoch.
pub fn system_us(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// A short or occasionally long hold.
fn hold_time(rng: &mut StdRng, lease: Duration) -> Duration {
    if rng.random_bool(0.005) {
        lease.mul_f64(rng.random_range(0.5..2.0))
    } else {
        Duration::from_micros(rng.random_range(0..3000))
    }
}

/// The critical section of a guard: fenced writes with holds between them, then the end.
async fn hold_and_end(env: &Env, rng: &mut StdRng, guard: LockGuard, via: &str, can_run_out: bool) {
    hold_and_end_leased(env, rng, guard, via, can_run_out, lease_of(&env.cfg)).await;
}

/// [`hold_and_end`] of a guard leased for `lease_len`.
async fn hold_and_end_leased(
    env: &Env,
    rng: &mut StdRng,
    guard: LockGuard,
    via: &str,
    can_run_out: bool,
    lease_len: Duration,
) {
    let name = guard.name().to_owned();
    let token = guard.fencing_token();
    let lease = guard.lease_id().as_str().to_owned();
    env.log.write(&LogLine::Grant {
        name: name.clone(),
        token,
        lease: lease.clone(),
        via: via.to_owned(),
        t: now_us(),
    });
    let writes = rng.random_range(1..=2);
    for i in 0..writes {
        if i > 0 {
            tokio::time::sleep(hold_time(rng, lease_len)).await;
        }
        if !env.fenced(&name, token, &lease, || guard.is_lost()).await {
            break;
        }
    }
    if can_run_out {
        // Hold past the lease (no extension), then try once more: the guard must say lost.
        tokio::time::sleep(lease_len.mul_f64(rng.random_range(1.05..1.5))).await;
        env.fenced(&name, token, &lease, || guard.is_lost()).await;
        env.record_grant(&guard, None);
        drop(guard);
        end(env, &name, token, EndHow::RanOut);
        return;
    }
    let roll: f64 = rng.random();
    let before = env.memory_now();
    if roll < 0.6 {
        env.record_grant(&guard, before);
        match guard.release().await {
            Ok(()) => end(env, &name, token, EndHow::Released),
            Err(e) => {
                env.error("release", e);
                end(env, &name, token, EndHow::ReleaseFailed);
            }
        }
    } else if roll < 0.8 && env.cfg.drop_futures {
        env.record_grant(&guard, before);
        let wait = Duration::from_micros(rng.random_range(0..2000));
        tokio::select! {
            r = guard.release() => match r {
                Ok(()) => end(env, &name, token, EndHow::Released),
                Err(e) => {
                    env.error("release", e);
                    end(env, &name, token, EndHow::ReleaseFailed);
                }
            },
            () = tokio::time::sleep(wait) => {
                env.log.write(&LogLine::Dropped { what: "release".into(), t: now_us() });
                end(env, &name, token, EndHow::ReleaseDropped);
            }
        }
    } else {
        env.record_grant(&guard, before);
        drop(guard);
        end(env, &name, token, EndHow::Dropped);
    }
}

fn end(env: &Env, name: &str, token: u64, how: EndHow) {
    env.log.write(&LogLine::End {
        name: name.to_owned(),
        token,
        how,
        t: now_us(),
    });
}

/// Waits for `fut` unless stopping, and sometimes drops it after a random short time.
async fn bounded<T>(
    env: &Env,
    rng: &mut StdRng,
    fut: impl std::future::Future<Output = mongolock::Result<Option<T>>>,
) -> Option<T> {
    let mut stop = env.stop.clone();
    let limit = if env.cfg.drop_futures && rng.random_bool(0.1) {
        Duration::from_micros(rng.random_range(0..20_000))
    } else {
        lease_of(&env.cfg) * 10
    };
    tokio::select! {
        r = tokio::time::timeout(limit, fut) => match r {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                env.error("acquire", e);
                None
            }
            Err(_) => {
                env.log.write(&LogLine::Dropped { what: "acquire".into(), t: now_us() });
                None
            }
        },
        _ = stop.wait_for(|s| *s) => None,
    }
}

/// A semaphore slot's hold: no fenced writes (fencing is per lock, not per slot); a short or
/// occasionally long hold checking `is_lost`, then released, released with the future
/// dropped, dropped, or (`can_run_out`) left to run out.
async fn hold_slot(env: &Env, rng: &mut StdRng, guard: LockGuard, via: &str, can_run_out: bool) {
    let name = guard.name().to_owned();
    let token = guard.fencing_token();
    let lease = guard.lease_id().as_str().to_owned();
    env.log.write(&LogLine::Grant {
        name: name.clone(),
        token,
        lease: lease.clone(),
        via: via.to_owned(),
        t: now_us(),
    });
    let lease_len = lease_of(&env.cfg);
    tokio::time::sleep(hold_time(rng, lease_len)).await;
    if can_run_out {
        tokio::time::sleep(lease_len.mul_f64(rng.random_range(1.05..1.5))).await;
        if !guard.is_lost() {
            env.error(
                "semaphore",
                format!("slot {lease} of {name} not lost after its lease"),
            );
        }
        drop(guard);
        end(env, &name, token, EndHow::RanOut);
        return;
    }
    let roll: f64 = rng.random();
    if roll < 0.6 {
        match guard.release().await {
            Ok(()) => end(env, &name, token, EndHow::Released),
            Err(e) => {
                env.error("release", e);
                end(env, &name, token, EndHow::ReleaseFailed);
            }
        }
    } else if roll < 0.8 && env.cfg.drop_futures {
        let wait = Duration::from_micros(rng.random_range(0..2000));
        tokio::select! {
            r = guard.release() => match r {
                Ok(()) => end(env, &name, token, EndHow::Released),
                Err(e) => {
                    env.error("release", e);
                    end(env, &name, token, EndHow::ReleaseFailed);
                }
            },
            () = tokio::time::sleep(wait) => {
                env.log.write(&LogLine::Dropped { what: "release".into(), t: now_us() });
                end(env, &name, token, EndHow::ReleaseDropped);
            }
        }
    } else {
        drop(guard);
        end(env, &name, token, EndHow::Dropped);
    }
}

/// A semaphore operation (MongoDB, PostgreSQL): one slot of `sem-0..` (limit [`SEM_LIMIT`]) through
/// `acquire`, `try_acquire` or `acquire_timeout` (long or short), sometimes not extended.
async fn sem_op(env: &Env, rng: &mut StdRng) {
    let name = pick_sem(rng);
    let run_out = rng.random_bool(0.02);
    let provider = if run_out { &env.manual } else { &env.auto };
    let Ok(sem) = provider.semaphore(name, SEM_LIMIT) else {
        return;
    };
    let roll: f64 = rng.random();
    let (got, via) = if run_out || roll < 0.25 {
        (
            bounded(env, rng, sem.try_acquire()).await,
            "semaphore.try_acquire",
        )
    } else if roll < 0.5 {
        (
            bounded(env, rng, async { sem.acquire().await.map(Some) }).await,
            "semaphore.acquire",
        )
    } else if roll < 0.8 {
        let wait = Duration::from_millis(rng.random_range(0..300));
        (
            bounded(env, rng, sem.acquire_timeout(wait)).await,
            "semaphore.acquire_timeout",
        )
    } else {
        let wait = Duration::from_millis(rng.random_range(0..100));
        (
            bounded(env, rng, sem.acquire_timeout(wait)).await,
            "semaphore.acquire_timeout(short)",
        )
    };
    if let Some(g) = got {
        hold_slot(env, rng, g, via, run_out).await;
    }
}

/// One operation of the mix.
async fn one_op(env: &Env, rng: &mut StdRng) {
    // MongoDB and PostgreSQL: some operations are on semaphores (the recorder reads their
    // slots from the change stream, or from the history trigger's rows). Not on the memory
    // backend, which has no independent history of slots.
    if matches!(env.sink, Sink::Mongo(_) | Sink::Postgres(_)) && rng.random_bool(0.12) {
        return sem_op(env, rng).await;
    }
    let roll: f64 = rng.random();
    let lease = lease_of(&env.cfg);
    if roll < 0.30 {
        let name = pick_hot(rng, &env.cfg);
        let Ok(lock) = env.auto.lock(name) else {
            return;
        };
        let got = bounded(env, rng, async { lock.acquire().await.map(Some) }).await;
        if let Some(g) = got {
            hold_and_end(env, rng, g, "acquire", false).await;
        }
    } else if roll < 0.45 {
        let name = pick_hot(rng, &env.cfg);
        let Ok(lock) = env.auto.lock(name).and_then(|l| l.with_expiry(lease)) else {
            return;
        };
        let got = bounded(env, rng, lock.try_acquire()).await;
        if let Some(g) = got {
            hold_and_end(env, rng, g, "try_acquire", false).await;
        }
    } else if roll < 0.55 {
        let name = pick_hot(rng, &env.cfg);
        let Ok(lock) = env.auto.lock(name) else {
            return;
        };
        let wait = Duration::from_millis(rng.random_range(0..300));
        if let Some(g) = bounded(env, rng, lock.acquire_timeout(wait)).await {
            hold_and_end(env, rng, g, "acquire_timeout", false).await;
        }
    } else if roll < 0.75 {
        let name = pick_cold(rng, &env.cfg);
        let Ok(lock) = env.auto.lock(name) else {
            return;
        };
        let wait = Duration::from_millis(rng.random_range(0..100));
        if let Some(g) = bounded(env, rng, lock.acquire_timeout(wait)).await {
            hold_and_end(env, rng, g, "acquire_timeout", false).await;
        }
    } else if roll < 0.755 {
        let name = pick_cold(rng, &env.cfg);
        let Ok(lock) = env.manual.lock(name) else {
            return;
        };
        if let Some(g) = bounded(env, rng, lock.try_acquire()).await {
            hold_and_end(env, rng, g, "try_acquire(run out)", true).await;
        }
    } else if roll < 0.95 {
        let Some(docs) = &env.docs else {
            return Box::pin(one_op(env, rng)).await;
        };
        if rng.random_bool(0.5) {
            let id = rng.random_range(0..env.cfg.jobs.max(1)) as i64;
            let wait = Duration::from_millis(rng.random_range(0..300));
            if let Some(d) = bounded(env, rng, docs.lock_timeout(id, wait)).await {
                hold_and_end(env, rng, d.guard, "documents.lock", false).await;
            }
        } else if let Some(d) = bounded(env, rng, docs.try_claim(doc! { "job": true }, None)).await
        {
            hold_and_end(env, rng, d.guard, "documents.claim", false).await;
        }
    } else {
        let wait = Duration::from_millis(rng.random_range(0..300));
        if let Some(l) = bounded(env, rng, env.election.campaign_timeout(wait)).await {
            let guard = l.guard();
            let (name, token) = (guard.name().to_owned(), guard.fencing_token());
            let lease_id = guard.lease_id().as_str().to_owned();
            env.log.write(&LogLine::Grant {
                name: name.clone(),
                token,
                lease: lease_id.clone(),
                via: "campaign".into(),
                t: now_us(),
            });
            env.fenced(&name, token, &lease_id, || l.is_lost()).await;
            let before = env.memory_now();
            env.record_grant(l.guard(), before);
            if rng.random_bool(0.5) {
                match l.resign().await {
                    Ok(()) => end(env, &name, token, EndHow::Released),
                    Err(e) => {
                        env.error("resign", e);
                        end(env, &name, token, EndHow::ReleaseFailed);
                    }
                }
            } else {
                drop(l);
                end(env, &name, token, EndHow::Dropped);
            }
        }
    }
}

/// The election run loop: while leader, fenced writes with the term as token; steps down
/// after a few.
async fn lead(env: Arc<Env>, seed: u64) {
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
    // `run_until` returns on a permanent error (e.g. an injected WriteConflict): log it and run
    // it again, until the worker stops.
    while !env.stopped() {
        lead_once(&env, &rng).await;
    }
}

/// One `run_until` until it returns.
async fn lead_once(env: &Arc<Env>, rng: &Arc<Mutex<StdRng>>) {
    let mut stop = env.stop.clone();
    let result = env
        .election
        .run_until(
            |ctx| {
                let env = env.clone();
                let rng = rng.clone();
                async move {
                    let term = ctx.term();
                    let lease = format!("term-{term}");
                    env.log.write(&LogLine::Grant {
                        name: ELECTION_ROLE.into(),
                        token: term,
                        lease: lease.clone(),
                        via: "run_until".into(),
                        t: now_us(),
                    });
                    let writes = lock_rng(&rng).random_range(1..5);
                    for _ in 0..writes {
                        if !env
                            .fenced(ELECTION_ROLE, term, &lease, || ctx.is_lost())
                            .await
                        {
                            std::future::pending::<()>().await;
                        }
                        let pause = Duration::from_millis(lock_rng(&rng).random_range(1..30));
                        tokio::time::sleep(pause).await;
                    }
                    end(&env, ELECTION_ROLE, term, EndHow::TermEnded);
                }
            },
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        )
        .await;
    if let Err(e) = result {
        env.error("run_until", e);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn lock_rng(rng: &Mutex<StdRng>) -> std::sync::MutexGuard<'_, StdRng> {
    match rng.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// How a wait of a liveness name ends, unless it gets the name first.
#[derive(Clone, Copy)]
enum LiveWait {
    /// `acquire`, until it returns (or the run stops).
    Forever,
    /// `acquire_timeout(d)`: gives up after `d`.
    Timeout(Duration),
    /// `acquire`, its future dropped after `d`.
    DropAfter(Duration),
}

/// Waits for `lock` as `how` says, logging the wait ([`LogLine::Wait`] before the call,
/// [`LogLine::WaitEnd`] after it); returns the guard if the call got the lock.
async fn live_wait(env: &Env, lock: &Lock, how: LiveWait) -> Option<LockGuard> {
    let id = env.waits.fetch_add(1, Ordering::Relaxed);
    let via = match how {
        LiveWait::Forever => "acquire".to_owned(),
        LiveWait::Timeout(d) => format!("acquire_timeout({}ms)", d.as_millis()),
        LiveWait::DropAfter(d) => format!("acquire dropped after {}ms", d.as_millis()),
    };
    env.log.write(&LogLine::Wait {
        name: lock.name().to_owned(),
        id,
        via,
        t: now_us(),
    });
    let mark = env
        .cfg
        .log
        .parent()
        .map(|dir| waiting_mark(dir, std::process::id()));
    if env.waiting.fetch_add(1, Ordering::Relaxed) == 0 {
        if let Some(m) = &mark {
            let _ = std::fs::write(m, b"");
        }
    }
    let mut stop = env.stop.clone();
    let outcome = |r: mongolock::Result<Option<LockGuard>>| match r {
        Ok(Some(g)) => (Some(g), WaitEnd::Got),
        Ok(None) => (None, WaitEnd::TimedOut),
        Err(e) => {
            env.error("acquire", e);
            (None, WaitEnd::Failed)
        }
    };
    let limit = match how {
        LiveWait::DropAfter(d) => d,
        // Far beyond any wait of the run: only the stop ends it.
        LiveWait::Forever | LiveWait::Timeout(_) => Duration::from_secs(24 * 3600),
    };
    let (got, end) = tokio::select! {
        r = async {
            match how {
                LiveWait::Timeout(d) => lock.acquire_timeout(d).await,
                LiveWait::Forever | LiveWait::DropAfter(_) => lock.acquire().await.map(Some),
            }
        } => outcome(r),
        () = tokio::time::sleep(limit) => (None, WaitEnd::Dropped),
        _ = stop.wait_for(|s| *s) => {
            let end = if env.exiting.load(Ordering::Relaxed) {
                WaitEnd::Shutdown
            } else {
                WaitEnd::Stopped
            };
            (None, end)
        }
    };
    env.log.write(&LogLine::WaitEnd {
        id,
        how: end,
        t: now_us(),
    });
    if env.waiting.fetch_sub(1, Ordering::Relaxed) == 1 {
        if let Some(m) = &mark {
            let _ = std::fs::remove_file(m);
        }
    }
    got
}

/// What one operation on a liveness name does.
#[derive(Clone, Copy)]
enum LiveOp {
    /// A single attempt (`try_acquire`).
    Try,
    /// A wait (see [`LiveWait`]).
    Wait(LiveWait),
}

impl LiveOp {
    /// 30 % wait until granted, 25 % `acquire_timeout` of 20–800 ms, 35 % `acquire` dropped
    /// after as long (a timeout without dropped futures), 10 % a single attempt.
    fn pick(rng: &mut StdRng, drop_futures: bool) -> LiveOp {
        let roll: f64 = rng.random();
        let short = Duration::from_millis(rng.random_range(20..800));
        if roll < 0.1 {
            LiveOp::Try
        } else if roll < 0.4 {
            LiveOp::Wait(LiveWait::Forever)
        } else if roll < 0.65 || !drop_futures {
            LiveOp::Wait(LiveWait::Timeout(short))
        } else {
            LiveOp::Wait(LiveWait::DropAfter(short))
        }
    }
}

/// One operation on a liveness name (see [`LiveOp::pick`]); a hold that is short, or (40 %)
/// 0.1–1 s, long enough that waits run out in the queue; then the usual end (release, dropped
/// release, dropped guard, or 1 % left to run out).
async fn live_op(env: &Env, live: &Live, rng: &mut StdRng, name: String, op: LiveOp) {
    let run_out = rng.random_bool(0.01);
    let provider = if run_out { &live.manual } else { &live.auto };
    let Ok(lock) = provider.lock(name) else {
        return;
    };
    let (got, via) = match op {
        LiveOp::Try => {
            let mut stop = env.stop.clone();
            let got = tokio::select! {
                r = lock.try_acquire() => r.unwrap_or_else(|e| {
                    env.error("acquire", e);
                    None
                }),
                _ = stop.wait_for(|s| *s) => None,
            };
            (got, "live try_acquire")
        }
        LiveOp::Wait(how) => {
            let via = match how {
                LiveWait::Forever => "live acquire",
                LiveWait::Timeout(_) => "live acquire_timeout",
                LiveWait::DropAfter(_) => "live acquire (dropped)",
            };
            (live_wait(env, &lock, how).await, via)
        }
    };
    let Some(guard) = got else { return };
    if !run_out && rng.random_bool(0.4) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..1000))).await;
    }
    hold_and_end_leased(env, rng, guard, via, run_out, live.lease).await;
}

/// A loop waiting for the liveness names until the worker stops, in rounds, the scenario of
/// issue 32: at the start of each round of the wall clock (`live_round_ms`, 4 s by default)
/// every free loop of every
/// worker takes, with a probability of 70 %, one operation ([`LiveOp`]) on its name of the
/// round (`live-<(round + loop) % live_names>`). Single attempts and waits that give up come
/// first (0–150 ms into the round), waits until granted after them (150–400 ms), so that those
/// that will give up stand at the front of the queue. Then the queue gets no newcomers: a name
/// freed later in the round reaches a waiter only through the handoff (designation, backup,
/// probe, expiry), not because somebody new happens to try. (A loop still waiting at the next
/// round carries on; the new round's newcomers of its worker go to the other name.)
async fn live_loop(env: Arc<Env>, seed: u64, index: usize) {
    let Some(live) = &env.live else { return };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut stop = env.stop.clone();
    let round_us = (env.cfg.live_round_ms.max(100) * 1000) as i64;
    while !env.stopped() {
        let op = LiveOp::pick(&mut rng, env.cfg.drop_futures);
        let offset = match op {
            LiveOp::Wait(LiveWait::Forever) => rng.random_range(150..400),
            LiveOp::Try | LiveOp::Wait(_) => rng.random_range(0..150),
        };
        let round = now_us() / round_us + 1;
        let start = Duration::from_micros((round * round_us - now_us()).max(0) as u64)
            + Duration::from_millis(offset);
        tokio::select! {
            () = tokio::time::sleep(start) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        // Not every loop joins every round; the loops of one worker take different names, so
        // that a process's only waiter of a name is often gone when the name is released (a
        // second one of the same process, woken by its own process's release, would hide the
        // rest of the queue).
        if !rng.random_bool(0.7) {
            continue;
        }
        let name = crate::config::live_name((round as usize + index) % env.cfg.live_names.max(1));
        live_op(&env, live, &mut rng, name, op).await;
    }
}

/// Runs the loops of one worker until the stop signal; returns when all have ended.
pub async fn run_loops(env: Arc<Env>) {
    let mut tasks = Vec::new();
    for t in 0..env.cfg.tasks {
        let env = env.clone();
        let seed = env.cfg.seed.wrapping_add(t as u64);
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            while !env.stopped() {
                one_op(&env, &mut rng).await;
            }
        }));
    }
    let leader_seed = env.cfg.seed.wrapping_add(1_000_000);
    tasks.push(tokio::spawn(lead(env.clone(), leader_seed)));
    if env.ext.is_some() {
        let seed = env.cfg.seed.wrapping_add(2_000_000);
        tasks.push(tokio::spawn(short_extensions(env.clone(), seed)));
    }
    if env.live.is_some() {
        for i in 0..LIVE_LOOPS {
            let seed = env.cfg.seed.wrapping_add(3_000_000 + i as u64);
            tasks.push(tokio::spawn(live_loop(env.clone(), seed, i)));
        }
    }
    for t in tasks {
        if let Err(e) = t.await {
            env.error("task", e);
        }
    }
}

/// The `short_extension` loop: takes a hot name, makes a fenced write, then sends an
/// extension to a TTL shorter than what is left while the server is slowed and drops its
/// future after a short time (MongoDB, where the injector's fail point is on only now and
/// then: up to 20 extensions in a row until one is dropped); waits until after the shortened expiry (but before the
/// original one) and makes another fenced write, checking `is_lost()` first as every holder
/// does. A guard that did not lower its deadline before sending the extension trusts a lease
/// the server has already ended: the checker's rule (9) reports the write (and, if another
/// worker took the name meanwhile, fencing refuses it).
async fn short_extensions(env: Arc<Env>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let lease = lease_of(&env.cfg);
    let mut pg: Option<tokio_postgres::Client> = None;
    while !env.stopped() {
        tokio::time::sleep(lease.mul_f64(rng.random_range(0.1..0.5))).await;
        if env.stopped() {
            break;
        }
        let provider = match &env.ext {
            Some(Ext::Mongo(p)) => p,
            Some(Ext::Postgres { .. }) => &env.manual,
            None => return,
        };
        let Ok(lock) = provider.lock(pick_hot(&mut rng, &env.cfg)) else {
            continue;
        };
        let wait = Duration::from_millis(rng.random_range(0..300));
        let Some(guard) = bounded(&env, &mut rng, lock.acquire_timeout(wait)).await else {
            continue;
        };
        let (name, token) = (guard.name().to_owned(), guard.fencing_token());
        let lease_id = guard.lease_id().as_str().to_owned();
        env.log.write(&LogLine::Grant {
            name: name.clone(),
            token,
            lease: lease_id.clone(),
            via: "short_extension".into(),
            t: now_us(),
        });
        if !env
            .fenced(&name, token, &lease_id, || guard.is_lost())
            .await
        {
            drop(guard);
            end(&env, &name, token, EndHow::Dropped);
            continue;
        }
        // PostgreSQL: hold the row so that the extension waits for it.
        let mut row_tx = false;
        if let Some(Ext::Postgres { config, table }) = &env.ext {
            if pg.is_none() {
                pg = crate::postgres::connect(config).await.ok();
            }
            if let Some(client) = &pg {
                let sql = format!("SELECT 1 FROM {table} WHERE name = $1 FOR UPDATE");
                row_tx = client.batch_execute("BEGIN").await.is_ok()
                    && client.query(&sql, &[&name]).await.is_ok();
                if !row_tx {
                    pg = None;
                }
            }
        }
        let short = lease.mul_f64(0.3);
        let give_up = lease.mul_f64(0.03).max(Duration::from_millis(2));
        // MongoDB: the fail point is on now and then; try for a while (each extension that
        // answers in time moves the lease to now + `short`, and the guard knows it).
        let tries = if row_tx { 1 } else { 20 };
        let mut sent = tokio::time::Instant::now();
        let mut dropped = false;
        for i in 0..tries {
            if i > 0 {
                tokio::time::sleep(give_up).await;
            }
            sent = tokio::time::Instant::now();
            dropped = tokio::time::timeout(give_up, guard.extend(short))
                .await
                .is_err();
            if dropped || guard.is_lost() {
                break;
            }
        }
        env.log.write(&LogLine::ShortExtension {
            name: name.clone(),
            token,
            ttl_ms: short.as_millis() as u64,
            dropped,
            slowed: row_tx,
            t: now_us(),
        });
        if row_tx {
            tokio::time::sleep(lease.mul_f64(rng.random_range(0.1..0.25))).await;
            if let Some(client) = &pg {
                if client.batch_execute("COMMIT").await.is_err() {
                    pg = None;
                }
            }
        }
        // After the shortened expiry (sent + block + 0.3 lease), before the original one.
        tokio::time::sleep_until(sent + lease.mul_f64(rng.random_range(0.6..0.8))).await;
        env.fenced(&name, token, &lease_id, || guard.is_lost())
            .await;
        match guard.release().await {
            Ok(()) => end(&env, &name, token, EndHow::Released),
            Err(_) => end(&env, &name, token, EndHow::ReleaseFailed),
        }
    }
}

/// The two providers of a worker over `backend`: extended automatically, and not.
fn providers(
    backend: impl LockBackend + Clone + 'static,
    cfg: &WorkerConfig,
) -> Result<(LockProvider, LockProvider), String> {
    leased_providers(backend, cfg, lease_of(cfg))
}

/// The liveness names' providers over `backend` (`None` when the run has no liveness names).
fn live_providers(
    backend: impl LockBackend + Clone + 'static,
    cfg: &WorkerConfig,
) -> Result<Option<Live>, String> {
    if cfg.live_names == 0 {
        return Ok(None);
    }
    let lease = Duration::from_millis(cfg.live_lease_ms.max(1000));
    let (auto, manual) = leased_providers(backend, cfg, lease)?;
    Ok(Some(Live {
        auto,
        manual,
        lease,
    }))
}

/// [`providers`] with leases of `lease`.
fn leased_providers(
    backend: impl LockBackend + Clone + 'static,
    cfg: &WorkerConfig,
    lease: Duration,
) -> Result<(LockProvider, LockProvider), String> {
    let app = format!("torture {}", cfg.worker);
    let auto = LockProvider::builder(backend.clone())
        .expiry(lease)
        .app_name(app.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let manual = LockProvider::builder(backend)
        .expiry(lease)
        .auto_extend(false)
        .app_name(app)
        .build()
        .map_err(|e| e.to_string())?;
    Ok((auto, manual))
}

/// What a worker process works with.
struct Parts {
    auto: LockProvider,
    manual: LockProvider,
    docs: Option<DocumentLocks<Document>>,
    sink: Sink,
    ext: Option<Ext>,
    live: Option<Live>,
}

/// A MongoDB worker's providers, document locks and resource.
async fn mongo_env(cfg: &WorkerConfig) -> Result<Parts, String> {
    let mut options = mongodb::options::ClientOptions::parse(&cfg.uri)
        .await
        .map_err(|e| e.to_string())?;
    options.app_name = Some(WORKER_APP_NAME.to_owned());
    options.server_selection_timeout = Some(Duration::from_secs(5));
    let client = mongodb::Client::with_options(options.clone()).map_err(|e| e.to_string())?;
    let db = client.database(&cfg.db);
    // Every other worker polls instead of following the change stream: both wake-up paths are
    // exercised, and the server has fewer streams to feed.
    let backend = mongolock::MongoBackend::builder(&db)
        .collection(LOCK_COLLECTION)
        .cleanup_after(Duration::from_secs(cfg.cleanup_after_secs))
        .notifications(!cfg.polling)
        .build()
        .map_err(|e| e.to_string())?;
    let (auto, manual) = providers(backend, cfg)?;
    // A client of their own for the extensions (the injector slows it) and for the liveness
    // names (no fail point reaches it).
    let backend_as = |app: &str, notifications: bool| {
        let mut options = options.clone();
        options.app_name = Some(app.to_owned());
        let client = mongodb::Client::with_options(options).map_err(|e| e.to_string())?;
        mongolock::MongoBackend::builder(&client.database(&cfg.db))
            .collection(LOCK_COLLECTION)
            .cleanup_after(Duration::from_secs(cfg.cleanup_after_secs))
            .notifications(notifications)
            .build()
            .map_err(|e| e.to_string())
    };
    let ext = if cfg.short_extensions {
        Some(Ext::Mongo(
            providers(backend_as(EXT_APP_NAME, false)?, cfg)?.1,
        ))
    } else {
        None
    };
    let live = if cfg.live_names > 0 {
        // Always with the change stream (see `Live`).
        live_providers(backend_as(LIVE_APP_NAME, true)?, cfg)?
    } else {
        None
    };
    // The automatic provider's options: the lease, and the worker as application name.
    let docs = auto
        .documents(&db.collection::<Document>(JOBS_COLLECTION))
        .field(JOBS_LOCK_FIELD)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Parts {
        auto,
        manual,
        docs: Some(docs),
        sink: Sink::Mongo(db.collection(RESOURCE_COLLECTION)),
        ext,
        live,
    })
}

/// A PostgreSQL worker's providers (on the run's schema; connections named after
/// [`WORKER_APP_NAME`] so that the fault injector can find them) and resource. Every other
/// worker polls instead of listening; some run the idle-row cleanup. The liveness names use
/// the same backend (there are no fail points on PostgreSQL).
fn postgres_env(cfg: &WorkerConfig) -> Result<Parts, String> {
    let config = crate::postgres::config(&cfg.uri, &format!("{WORKER_APP_NAME} {}", cfg.worker))
        .map_err(|e| e.to_string())?;
    let backend = PostgresBackend::builder_with_config(config)
        .schema(cfg.db.clone())
        .table(LOCK_COLLECTION)
        .notifications(!cfg.polling)
        .cleanup_after(Duration::from_secs(cfg.cleanup_after_secs))
        .cleanup_every(cfg.cleanup_every_ms.map(Duration::from_millis))
        .build()
        .map_err(|e| e.to_string())?;
    // The liveness names always listen (see `Live`): a backend of their own where this
    // worker polls.
    let live = if cfg.polling && cfg.live_names > 0 {
        let config =
            crate::postgres::config(&cfg.uri, &format!("{WORKER_APP_NAME} {} live", cfg.worker))
                .map_err(|e| e.to_string())?;
        let listening = PostgresBackend::builder_with_config(config)
            .schema(cfg.db.clone())
            .table(LOCK_COLLECTION)
            .cleanup_after(Duration::from_secs(cfg.cleanup_after_secs))
            .cleanup_every(None)
            .build()
            .map_err(|e| e.to_string())?;
        live_providers(listening, cfg)?
    } else {
        live_providers(backend.clone(), cfg)?
    };
    let (auto, manual) = providers(backend, cfg)?;
    let resource_config =
        crate::postgres::config(&cfg.uri, &format!("torture-resource {}", cfg.worker))
            .map_err(|e| e.to_string())?;
    let sink = Sink::Postgres(Arc::new(PgResource::new(resource_config, &cfg.db)));
    let ext = if cfg.short_extensions {
        let config = crate::postgres::config(&cfg.uri, &format!("torture-extend {}", cfg.worker))
            .map_err(|e| e.to_string())?;
        let table = format!("\"{}\".\"{LOCK_COLLECTION}\"", cfg.db.replace('"', "\"\""));
        Some(Ext::Postgres {
            config: Box::new(config),
            table,
        })
    } else {
        None
    };
    Ok(Parts {
        auto,
        manual,
        docs: None,
        sink,
        ext,
        live,
    })
}

/// Exit status of a worker that exits on request (`waiter_exit`).
pub const EXIT_ON_REQUEST: i32 = 40;

/// `waiter_exit`: on SIGUSR1 the worker exits (status [`EXIT_ON_REQUEST`]) with its waits in
/// progress, as a program whose `main` returns would: half the time at once (the waits' queue
/// entries stay behind), half the time after ending its waits (their futures dropped, so
/// their backends withdraw them) and flushing the withdrawals (`LockProvider::flush`). Holders
/// are not released either way: their leases run out.
async fn exit_on_request(env: Arc<Env>, stop: Arc<watch::Sender<bool>>) {
    let Ok(mut usr1) =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
    else {
        return;
    };
    if usr1.recv().await.is_none() {
        return;
    }
    let flush = rand::random::<bool>();
    env.log.write(&LogLine::Exit {
        flushed: flush,
        t: now_us(),
    });
    if flush {
        env.exiting.store(true, Ordering::Relaxed);
        let _ = stop.send(true);
        // Let the loops drop their waits, then send what they withdrew.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let wait = Duration::from_secs(1);
        if let Some(live) = &env.live {
            live.auto.flush(wait).await;
            live.manual.flush(wait).await;
        }
        env.auto.flush(wait).await;
    }
    std::process::exit(EXIT_ON_REQUEST);
}

/// `mongolock-torture worker`: one worker process. Reads its configuration from the
/// environment; on stdin, `stop` ends the loops (it then answers `drained` on stdout, keeping
/// its runtime alive so that a leaked lease would still be extended) and `exit` (or EOF) ends
/// the process; SIGUSR1 makes it exit at once (`exit_on_request`).
pub async fn worker_main() -> Result<(), String> {
    let raw =
        std::env::var(WORKER_CONFIG_ENV).map_err(|_| format!("{WORKER_CONFIG_ENV} is not set"))?;
    let cfg: WorkerConfig = serde_json::from_str(&raw).map_err(|e| e.to_string())?;
    let parts = match cfg.backend {
        Backend::Mongo => mongo_env(&cfg).await?,
        Backend::Postgres => postgres_env(&cfg)?,
        Backend::Memory => {
            return Err("the memory backend runs no worker process".into());
        }
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let mut env = Env::new(
        cfg,
        parts.auto,
        parts.manual,
        parts.docs,
        parts.sink,
        stop_rx,
    )?;
    env.ext = parts.ext;
    env.live = parts.live;
    let env = Arc::new(env);
    tokio::spawn(exit_on_request(env.clone(), stop_tx.clone()));
    let loops = tokio::spawn(run_loops(env.clone()));

    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    let mut loops = Some(loops);
    while let Ok(Some(line)) = lines.next_line().await {
        match line.trim() {
            "stop" => {
                let _ = stop_tx.send(true);
                if let Some(l) = loops.take() {
                    let _ = l.await;
                }
                let _ = stdout.write_all(b"drained\n").await;
                let _ = stdout.flush().await;
            }
            "exit" => break,
            _ => {}
        }
    }
    Ok(())
}
