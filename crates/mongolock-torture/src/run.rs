//! The orchestrator: starts the server (or uses `--uri`), the recorder, the workers, the fault
//! injector and the CLI check; stops when enough acquisitions were recorded or the time is up;
//! drains the workers, checks that nothing is held once every lease expired, and runs the
//! checker over everything.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use mongolock::{LockProvider, MemoryBackend};
use rand::Rng;
use tokio::sync::watch;

use crate::checker::Checker;
use crate::cli_check::{self, CliPlan};
use crate::config::{WorkerConfig, JOBS_COLLECTION, JOBS_LOCK_FIELD, LOCK_COLLECTION};
use crate::faults::{self, FaultCounts, FaultKind, FaultPlan};
use crate::history::{micros, LockHistory, ResourceHistory};
use crate::options::{Backend, RunArgs};
use crate::recorder::{self, Followed, Progress};
use crate::resource::{MemoryResource, RESOURCE_COLLECTION};
use crate::summary::Summary;
use crate::supervisor::Supervisor;
use crate::worker::{self, Env, Sink};
use crate::worklog::{read_log, LogTotals};

type AnyError = Box<dyn std::error::Error + Send + Sync>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The fault kinds selected by `--faults`.
fn fault_kinds(spec: &str) -> Result<Vec<FaultKind>, AnyError> {
    match spec.trim() {
        "all" => Ok(FaultKind::ALL.to_vec()),
        "none" | "" => Ok(Vec::new()),
        list => list
            .split(',')
            .map(|s| {
                FaultKind::parse(s.trim()).ok_or_else(|| format!("unknown fault kind {s:?}").into())
            })
            .collect(),
    }
}

/// When to stop.
struct Goal {
    acquisitions: Option<u64>,
    deadline: Instant,
}

impl Goal {
    fn from(args: &RunArgs) -> Self {
        let duration = match (args.acquisitions, args.duration) {
            (_, Some(d)) => d,
            (Some(_), None) => Duration::from_secs(365 * 24 * 3600),
            (None, None) => Duration::from_secs(60),
        };
        Goal {
            acquisitions: args.acquisitions,
            deadline: Instant::now() + duration,
        }
    }

    fn reached(&self, acquisitions: u64) -> bool {
        Instant::now() >= self.deadline || self.acquisitions.is_some_and(|a| acquisitions >= a)
    }
}

fn run_dir(args: &RunArgs, seed: u64) -> Result<PathBuf, AnyError> {
    let dir = match &args.run_dir {
        Some(d) => d.clone(),
        None => {
            std::env::temp_dir().join(format!("mongolock-torture-{}-{seed}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Reads every worker log in `dir` into the checker.
fn read_logs(dir: &std::path::Path, checker: &mut Checker) -> Result<LogTotals, AnyError> {
    let mut totals = LogTotals::default();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    paths.sort();
    for p in paths {
        let (events, t) = read_log(&p)?;
        let worker = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        checker.worker_log(&worker, events);
        totals.add(&t);
    }
    checker.check_writes_logged();
    Ok(totals)
}

/// Prints the summary and the first violations; returns the exit status.
fn report(summary: &Summary, args: &RunArgs, dir: &std::path::Path) -> Result<i32, AnyError> {
    println!("{}", summary.line());
    for v in summary.first_violations.iter().take(args.show) {
        println!("  violation {v}");
    }
    if let Some(p) = &args.summary_json {
        std::fs::write(p, serde_json::to_string_pretty(summary)?)?;
    }
    eprintln!("torture: logs in {}", dir.display());
    Ok(if summary.violations_total > 0 { 1 } else { 0 })
}

/// Runs the torture test; returns the process exit status.
pub async fn run(args: RunArgs) -> Result<i32, AnyError> {
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    match args.backend {
        Backend::Mongo => run_mongo(args, seed).await,
        Backend::Memory => run_memory(args, seed).await,
    }
}

async fn client(uri: &str, app: &str) -> Result<Client, AnyError> {
    let mut options = ClientOptions::parse(uri).await?;
    options.app_name = Some(app.to_owned());
    options.server_selection_timeout = Some(Duration::from_secs(10));
    Ok(Client::with_options(options)?)
}

/// A lease found held after the end: name, lease id, expiry (µs).
type Held = (String, String, i64);

/// Finds leases still held (server time) in `coll` with lock fields under `prefix`.
async fn still_held(
    db: &Database,
    coll: &str,
    prefix: &str,
    name_of: fn(&Bson) -> Option<String>,
) -> Result<Vec<Held>, AnyError> {
    let mut held = Vec::new();
    let filter = doc! {
        format!("{prefix}leaseId"): { "$type": "string" },
        "$expr": { "$gt": [format!("${prefix}expiresAt"), "$$NOW"] },
    };
    let mut cursor = db.collection::<Document>(coll).find(filter).await?;
    while cursor.advance().await? {
        let d: Document = cursor.deserialize_current()?;
        let name = d.get("_id").and_then(name_of).unwrap_or_default();
        let at = |f: &str| crate::history::get_path(&d, &format!("{prefix}{f}")).cloned();
        let lease = match at("leaseId") {
            Some(Bson::String(s)) => s,
            _ => String::new(),
        };
        held.push((name, lease, micros(at("expiresAt").as_ref()).unwrap_or(0)));
    }
    Ok(held)
}

async fn run_mongo(args: RunArgs, seed: u64) -> Result<i32, AnyError> {
    let kinds = fault_kinds(&args.faults)?;
    let (server, uri) = match &args.uri {
        Some(u) if !u.is_empty() => (None, u.clone()),
        _ => {
            let server = mongo_testserver::TestServer::builder()
                .ttl_monitor_interval(args.ttl_monitor)
                .start_background()?;
            let uri = server.uri();
            (Some(server), uri)
        }
    };
    let fail_points_ok = server.is_some() || args.failpoints;
    let kinds: Vec<FaultKind> = kinds
        .into_iter()
        .filter(|k| fail_points_ok || matches!(k, FaultKind::Sigkill | FaultKind::Sigstop))
        .collect();
    let dir = run_dir(&args, seed)?;
    let control = client(&uri, "torture-control").await?;
    let db_name = format!("torture_{seed:x}");
    let db = control.database(&db_name);
    let recorder_client = client(&uri, "torture-recorder").await?;
    let rdb = recorder_client.database(&db_name);

    // The recorder starts before anything is written.
    let checker = Arc::new(Mutex::new(Checker::new()));
    let progress = Arc::new(Progress::default());
    let mut followers = Vec::new();
    for (coll, followed) in [
        (
            LOCK_COLLECTION,
            Followed::Locks {
                history: LockHistory::new(None),
                name: recorder::string_id,
            },
        ),
        (
            JOBS_COLLECTION,
            Followed::Locks {
                history: LockHistory::new(Some(JOBS_LOCK_FIELD)),
                name: recorder::job_id,
            },
        ),
        (
            RESOURCE_COLLECTION,
            Followed::Resource(ResourceHistory::new()),
        ),
    ] {
        // Create the collection first: a change stream on a missing collection works on
        // MongoDB, but an explicit collection makes the start point unambiguous.
        let _ = db.create_collection(coll).await;
        followers.push(
            recorder::follow(
                rdb.collection(coll),
                followed,
                checker.clone(),
                progress.clone(),
            )
            .await?,
        );
    }
    let jobs: Vec<Document> = (0..args.jobs as i64)
        .map(|i| doc! { "_id": i, "job": true })
        .collect();
    if !jobs.is_empty() {
        db.collection::<Document>(JOBS_COLLECTION)
            .insert_many(jobs)
            .await?;
    }

    let started = Instant::now();
    let exe = std::env::current_exe()?;
    let base = WorkerConfig {
        uri: uri.clone(),
        db: db_name.clone(),
        worker: String::new(),
        seed,
        tasks: args.tasks,
        lease_ms: args.lease.as_millis() as u64,
        hot_names: args.hot_names,
        cold_names: args.cold_names,
        jobs: args.jobs,
        cleanup_after_secs: args.cleanup_after_secs,
        polling: false,
        drop_futures: !args.no_dropped_futures,
        log: PathBuf::new(),
    };
    let supervisor = Arc::new(Supervisor::start(
        exe,
        &dir,
        args.workers,
        Arc::new(move |id, inc, log| WorkerConfig {
            worker: format!("w{id}.{inc}"),
            seed: base.seed ^ ((id as u64) << 32) ^ (inc << 48) ^ 0x9e37_79b9,
            polling: id % 2 == 1,
            log,
            ..base.clone()
        }),
    ));

    let (stop_tx, stop_rx) = watch::channel(false);
    let counts = Arc::new(Mutex::new(FaultCounts::default()));
    let injector = tokio::spawn(faults::inject(
        FaultPlan {
            kinds,
            interval: args.fault_interval,
            lease: args.lease,
            seed: seed ^ 0xfa17,
        },
        control.database("admin"),
        supervisor.clone(),
        counts.clone(),
        stop_rx.clone(),
    ));
    let cli = if args.no_cli {
        Err("disabled with --no-cli".to_owned())
    } else {
        cli_check::find_binary(args.mongolock_bin.clone()).map(|bin| {
            tokio::spawn(cli_check::run(
                CliPlan {
                    bin,
                    uri: uri.clone(),
                    db: db_name.clone(),
                    loops: args.cli_loops,
                    faults: args.cli_faults,
                    dir: dir.clone(),
                    seed: seed ^ 0xc11,
                },
                stop_rx.clone(),
            ))
        })
    };
    if let Err(why) = &cli {
        eprintln!("torture: CLI check skipped: {why}");
    }

    let goal = Goal::from(&args);
    let mut last_print = Instant::now();
    while !goal.reached(progress.grants.load(Ordering::Relaxed)) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if last_print.elapsed() >= Duration::from_secs(10) {
            last_print = Instant::now();
            let n = progress.grants.load(Ordering::Relaxed);
            eprintln!(
                "torture: {:.0}s: {n} acquisitions ({:.0}/s), {} restarts",
                started.elapsed().as_secs_f64(),
                n as f64 / started.elapsed().as_secs_f64(),
                supervisor.restarts()
            );
        }
    }
    let acquisitions_at_stop = progress.grants.load(Ordering::Relaxed);
    let duration = started.elapsed();

    // Stop faults (every pause ends, the fail point is turned off), then the workers' loops.
    let _ = stop_tx.send(true);
    let _ = injector.await;
    let (cli_report, cli_skipped) = match cli {
        Ok(handle) => (Some(handle.await?), None),
        Err(why) => (None, Some(why)),
    };
    supervisor.drain().await;
    // (5): with the workers alive (a leaked lease would still be extended), wait until every
    // lease has had time to expire, then nothing may be held.
    tokio::time::sleep(args.lease * 2 + Duration::from_secs(1)).await;
    let mut held = still_held(&db, LOCK_COLLECTION, "", recorder::string_id).await?;
    held.extend(
        still_held(
            &db,
            JOBS_COLLECTION,
            &format!("{JOBS_LOCK_FIELD}."),
            recorder::job_id,
        )
        .await?,
    );
    supervisor.exit().await;

    // End markers, then the recorder finishes.
    for coll in [LOCK_COLLECTION, JOBS_COLLECTION, RESOURCE_COLLECTION] {
        db.collection::<Document>(coll)
            .insert_one(recorder::end_marker())
            .await?;
    }
    for f in followers {
        if tokio::time::timeout(Duration::from_secs(120), f)
            .await
            .is_err()
        {
            eprintln!("torture: the recorder did not reach the end marker within 120 s");
        }
    }

    // The recorder is done (or gave up): the checker is ours now.
    let mut c = std::mem::take(&mut *lock(&checker));
    for (name, lease, expires) in &held {
        c.held_after_end(name, lease, *expires);
    }
    let totals = read_logs(&dir, &mut c)?;
    let cli_text = match (&cli_report, &cli_skipped) {
        (Some(r), _) => {
            for o in &r.overlaps {
                c.cli_overlap(o.clone());
            }
            format!(
                "runs={},killed={},stopped={},overlaps={},overlap_episodes={:?},stale_dirs={}",
                r.runs,
                r.killed,
                r.stopped,
                r.overlaps.len(),
                r.episodes,
                r.stale
            )
        }
        (None, Some(why)) => format!("skipped: {why}"),
        (None, None) => "skipped".into(),
    };
    let faults = lock(&counts).clone();
    let mut summary = Summary::new(
        "mongo",
        seed,
        args.workers,
        acquisitions_at_stop,
        &totals,
        &faults,
        &c,
        duration,
    );
    summary.ttl_deletes = progress.deletes.load(Ordering::Relaxed);
    summary.restarts = supervisor.restarts();
    summary.recorder_resumes = (
        progress.resumes.load(Ordering::Relaxed),
        progress.gaps.load(Ordering::Relaxed),
    );
    summary.cli = cli_text;
    let mut status = report(&summary, &args, &dir)?;
    if summary.recorder_resumes.1 > 0 {
        eprintln!("torture: the recorder's history is incomplete; the run proves nothing");
        status = status.max(3);
    }
    if let Some(s) = server {
        s.shutdown().await;
    }
    Ok(status)
}

/// `--backend memory`: the same loops as tasks of this process over one [`MemoryBackend`]; the
/// grants are recorded by the workers with the backend's clock (there is no change stream),
/// the resource is in memory. Faults: dropped futures only.
async fn run_memory(args: RunArgs, seed: u64) -> Result<i32, AnyError> {
    let dir = run_dir(&args, seed)?;
    let backend = MemoryBackend::new();
    let resource = Arc::new(MemoryResource::new());
    let grants = Arc::new(Mutex::new(Vec::new()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut envs = Vec::new();
    for id in 0..args.workers {
        let cfg = WorkerConfig {
            uri: String::new(),
            db: String::new(),
            worker: format!("m{id}"),
            seed: seed ^ ((id as u64) << 32),
            tasks: args.tasks,
            lease_ms: args.lease.as_millis() as u64,
            hot_names: args.hot_names,
            cold_names: args.cold_names,
            jobs: 0,
            cleanup_after_secs: 0,
            polling: false,
            drop_futures: !args.no_dropped_futures,
            log: dir.join(format!("worker-{id}-0.jsonl")),
        };
        let auto = LockProvider::builder(backend.clone())
            .expiry(args.lease)
            .build()?;
        let manual = LockProvider::builder(backend.clone())
            .expiry(args.lease)
            .auto_extend(false)
            .build()?;
        let sink = Sink::Memory {
            resource: resource.clone(),
            backend: backend.clone(),
            grants: grants.clone(),
        };
        envs.push(Arc::new(Env::new(
            cfg,
            auto,
            manual,
            None,
            sink,
            stop_rx.clone(),
        )?));
    }
    let started = Instant::now();
    let loops: Vec<_> = envs
        .iter()
        .map(|e| tokio::spawn(worker::run_loops(e.clone())))
        .collect();
    let goal = Goal::from(&args);
    let count = || lock(&grants).len() as u64;
    while !goal.reached(count()) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let acquisitions = count();
    let duration = started.elapsed();
    let _ = stop_tx.send(true);
    for l in loops {
        let _ = l.await;
    }
    tokio::time::sleep(args.lease * 2 + Duration::from_millis(200)).await;
    let provider = LockProvider::builder(backend.clone()).build()?;
    let mut checker = Checker::new();
    for info in provider.list().await? {
        if info.held {
            let expires = info.expires_at.map(worker::system_us).unwrap_or_default();
            checker.held_after_end(&info.name, "?", expires);
        }
    }
    // Grants in grant order per name: by start time (ties: token).
    let mut all = std::mem::take(&mut *lock(&grants));
    all.sort_by(|a, b| {
        (a.name.as_str(), a.start_us, a.tokens.first()).cmp(&(
            b.name.as_str(),
            b.start_us,
            b.tokens.first(),
        ))
    });
    for g in all {
        checker.grant(g);
    }
    let mut writes = resource.take_log();
    writes.sort_by(|a, b| a.name.cmp(&b.name)); // stable: keeps acceptance order per name
    for w in writes {
        checker.accepted_write(w);
    }
    let totals = read_logs(&dir, &mut checker)?;
    let mut summary = Summary::new(
        "memory",
        seed,
        args.workers,
        acquisitions,
        &totals,
        &FaultCounts::default(),
        &checker,
        duration,
    );
    summary.cli = "skipped: memory backend".into();
    report(&summary, &args, &dir)
}
