//! The orchestrator: starts the server and the recorder ([`crate::store`]), the workers, the
//! fault injector and the CLI check; stops when enough acquisitions were recorded or the time
//! is up; drains the workers, checks that nothing is held once every lease expired, and runs
//! the checker over everything. The memory backend runs its workers as tasks of this process.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongolock::{LockProvider, MemoryBackend};
use rand::Rng;
use tokio::sync::watch;

use crate::checker::Checker;
use crate::cli_check::{self, CliPlan};
use crate::config::WorkerConfig;
use crate::faults::{self, FaultCounts, FaultKind, FaultPlan};
use crate::liveness::{self, Bounds, ProcessLog};
use crate::netns::{self, Net};
use crate::options::{Backend, RunArgs};
use crate::resource::MemoryResource;
use crate::store::Store;
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
    // Logs of an earlier run in a reused directory would be read as this run's (the logs are
    // appended to): remove the files the harness writes there.
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if (name.starts_with("worker-") && (name.ends_with(".jsonl") || name.ends_with(".stderr")))
            || name.starts_with("cli-overlaps.log")
            || name.starts_with("waiting-")
            || name.starts_with("cli-live.")
            || name == "timeline.jsonl"
            || name.starts_with("cli-mutex")
        {
            let _ = std::fs::remove_file(entry.path())
                .or_else(|_| std::fs::remove_dir_all(entry.path()));
        }
    }
    Ok(dir)
}

/// Reads every worker log in `dir` into the checker; returns the totals and, for the liveness
/// check, each worker incarnation's waits.
fn read_logs(
    dir: &std::path::Path,
    checker: &mut Checker,
) -> Result<(LogTotals, Vec<ProcessLog>), AnyError> {
    let mut totals = LogTotals::default();
    let mut processes = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    paths.sort();
    for p in paths {
        let log = read_log(&p)?;
        let worker = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        checker.worker_log(&worker, log.events);
        totals.add(&log.totals);
        processes.push(log.process);
    }
    checker.check_writes_logged();
    Ok((totals, processes))
}

/// Writes the injector's timeline (signals and cuts, with their times) to `timeline.jsonl` in
/// the run directory, beside the workers' logs, for diagnosing a liveness figure.
fn write_timeline(dir: &std::path::Path, timeline: &[liveness::Disruption]) {
    let mut text = String::new();
    for d in timeline {
        let line = serde_json::json!({
            "hit": format!("{:?}", d.hit),
            "pid": d.pid,
            "slot": d.slot,
            "start_us": d.start_us,
            "end_us": d.end_us,
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    if let Err(e) = std::fs::write(dir.join("timeline.jsonl"), text) {
        eprintln!("torture: cannot write the fault timeline: {e}");
    }
}

/// Prints the summary and the first violations; returns the exit status.
fn report(summary: &Summary, args: &RunArgs, dir: &std::path::Path) -> Result<i32, AnyError> {
    println!("{}", summary.line());
    if let Some(l) = &summary.liveness {
        for (ms, e) in &l.slowest {
            eprintln!("torture: liveness: one of the slowest stretches ({ms:.1} ms): {e}");
        }
    }
    for v in summary.first_violations.iter().take(args.show) {
        println!("  violation {v}");
    }
    if let Some(p) = &args.summary_json {
        std::fs::write(p, serde_json::to_string_pretty(summary)?)?;
    }
    eprintln!("torture: logs in {}", dir.display());
    Ok(if summary.violations_total > 0 { 1 } else { 0 })
}

/// Kinds selected but not injected, with the reason.
type Skipped = std::collections::BTreeMap<FaultKind, String>;

/// Starts the network of `partition` / `netem` ([`crate::netns`]) when they are selected and
/// can run; otherwise records why not. Deletes the namespaces on Ctrl-C and on a panic.
fn start_net(
    args: &RunArgs,
    kinds: &[FaultKind],
    dir: &std::path::Path,
    skipped: &mut Skipped,
) -> Option<Arc<Net>> {
    if !kinds.iter().any(|k| k.is_network()) {
        return None;
    }
    let why = if args.uri.as_deref().is_some_and(|u| !u.is_empty()) {
        Err("the server is given with --uri (partitions need the run's own server)".to_owned())
    } else if let Some(why) = netns::unavailable() {
        Err(why)
    } else {
        netns::find_testserver(args.testserver_bin.clone()).and_then(|bin| {
            let secs = args.ttl_monitor.as_secs().max(1);
            Net::setup(args.workers, &bin, secs, dir)
        })
    };
    match why {
        Ok(net) => {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                netns::cleanup_all();
                previous(info);
            }));
            tokio::spawn(async {
                if tokio::signal::ctrl_c().await.is_ok() {
                    netns::cleanup_all();
                    eprintln!("torture: interrupted; network namespaces deleted");
                    std::process::exit(130);
                }
            });
            Some(Arc::new(net))
        }
        Err(why) => {
            eprintln!("torture: partition and netem skipped: {why}");
            for k in kinds.iter().filter(|k| k.is_network()) {
                skipped.insert(*k, why.clone());
            }
            netns::cleanup_all();
            None
        }
    }
}

/// Runs the torture test; returns the process exit status.
pub async fn run(args: RunArgs) -> Result<i32, AnyError> {
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    let kinds = FaultKind::parse_list(&args.faults, args.backend)?;
    match args.backend {
        Backend::Mongo | Backend::Postgres => {
            let dir = run_dir(&args, seed)?;
            let mut skipped = Skipped::new();
            let net = start_net(&args, &kinds, &dir, &mut skipped);
            let store = Store::start(&args, seed, net.as_ref().map(|n| n.control_uri())).await?;
            // Fail points need the embedded server or --failpoints; signals always work.
            let backend = store.backend();
            let kinds = kinds
                .into_iter()
                .filter(|k| {
                    let ok = store.fail_points() || !k.needs_fail_points(backend);
                    if !ok {
                        skipped.insert(
                            *k,
                            "fail points need the embedded server or --failpoints".into(),
                        );
                    }
                    ok && !skipped.contains_key(k)
                })
                .collect();
            let status = run_processes(args, seed, kinds, skipped, store, net.clone(), dir).await;
            drop(net);
            netns::cleanup_all();
            status
        }
        Backend::Memory => run_memory(args, seed).await,
    }
}

/// A run with worker processes over `store` (MongoDB or PostgreSQL).
async fn run_processes(
    args: RunArgs,
    seed: u64,
    kinds: Vec<FaultKind>,
    mut skipped: Skipped,
    mut store: Store,
    net: Option<Arc<Net>>,
    dir: PathBuf,
) -> Result<i32, AnyError> {
    let backend = store.backend();
    let cli_bin = if args.no_cli {
        Err("disabled with --no-cli".to_owned())
    } else {
        cli_check::find_binary(args.mongolock_bin.clone())
    };
    for k in kinds.iter().filter(|k| k.is_cli()) {
        match &cli_bin {
            Err(why) => {
                skipped.insert(*k, format!("CLI check skipped: {why}"));
            }
            Ok(_) if !args.cli_faults => {
                skipped.insert(*k, "needs --cli-faults".into());
            }
            Ok(_) => {}
        }
    }
    let has = |k: FaultKind| kinds.contains(&k) && !skipped.contains_key(&k);
    // The injector's kinds: not the CLI's, and on PostgreSQL not the short extensions (the
    // workers slow the server themselves).
    let injected: Vec<FaultKind> = kinds
        .iter()
        .copied()
        .filter(|k| !k.is_cli() && !skipped.contains_key(k))
        .filter(|k| !(*k == FaultKind::ShortExtension && backend == Backend::Postgres))
        .collect();
    let started = Instant::now();
    let exe = std::env::current_exe()?;
    let base = WorkerConfig {
        backend,
        uri: store.uri().to_owned(),
        db: store.db().to_owned(),
        worker: String::new(),
        seed,
        tasks: args.tasks,
        lease_ms: args.lease.as_millis() as u64,
        hot_names: args.hot_names,
        cold_names: args.cold_names,
        jobs: args.jobs,
        cleanup_after_secs: args.cleanup_after_secs,
        cleanup_every_ms: None,
        polling: false,
        drop_futures: !args.no_dropped_futures,
        short_extensions: has(FaultKind::ShortExtension),
        live_names: args.live_names,
        live_lease_ms: args.live_lease.as_millis() as u64,
        live_round_ms: args.live_round.as_millis() as u64,
        log: PathBuf::new(),
    };
    let cleanup_every = (args.ttl_monitor.as_millis() as u64).max(1);
    let netns: Vec<String> = net
        .as_ref()
        .map(|n| {
            (0..args.workers)
                .filter_map(|i| n.worker_ns(i).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let worker_uris: Vec<String> = net
        .as_ref()
        .map(|n| (0..args.workers).map(|i| n.worker_uri(i)).collect())
        .unwrap_or_default();
    let supervisor = Arc::new(Supervisor::start(
        exe,
        &dir,
        args.workers,
        netns,
        Arc::new(move |id, inc, log| WorkerConfig {
            uri: worker_uris
                .get(id)
                .cloned()
                .unwrap_or_else(|| base.uri.clone()),
            worker: format!("w{id}.{inc}"),
            seed: base.seed ^ ((id as u64) << 32) ^ (inc << 48) ^ 0x9e37_79b9,
            polling: id % 2 == 1,
            // PostgreSQL: two workers run the idle-row cleanup (the TTL monitor's part).
            cleanup_every_ms: (id < 2).then_some(cleanup_every),
            log,
            ..base.clone()
        }),
    ));

    let (stop_tx, stop_rx) = watch::channel(false);
    let counts = Arc::new(Mutex::new(FaultCounts::default()));
    let injector = tokio::spawn(faults::inject(
        FaultPlan {
            kinds: injected,
            interval: args.fault_interval,
            lease: args.lease,
            cleanup_after_secs: args.cleanup_after_secs,
            live_round: args.live_round,
            dir: dir.clone(),
            seed: seed ^ 0xfa17,
        },
        store.fault_target().await?,
        supervisor.clone(),
        net.clone(),
        counts.clone(),
        stop_rx.clone(),
    ));
    let cli = {
        cli_bin.map(|bin| {
            tokio::spawn(cli_check::run(
                CliPlan {
                    bin,
                    uri: store.uri().to_owned(),
                    db: store.db().to_owned(),
                    collection: store.cli_collection(),
                    loops: args.cli_loops,
                    faults: args.cli_faults,
                    group_stops: has(FaultKind::ExecGroupStop),
                    setsid: has(FaultKind::ExecSetsid),
                    dir: dir.clone(),
                    seed: seed ^ 0xc11,
                    live: (args.live_names > 0).then(|| (store.live_collection(), args.live_lease)),
                    sigint: has(FaultKind::ExecSigint),
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
    // PostgreSQL counts with a query: not too often.
    let poll = if backend == Backend::Postgres {
        Duration::from_millis(500)
    } else {
        Duration::from_millis(100)
    };
    let acquisitions_at_stop = loop {
        tokio::time::sleep(poll).await;
        let n = store.acquisitions().await;
        if goal.reached(n) {
            break n;
        }
        if last_print.elapsed() >= Duration::from_secs(10) {
            last_print = Instant::now();
            eprintln!(
                "torture: {:.0}s: {n} acquisitions ({:.0}/s), {} restarts",
                started.elapsed().as_secs_f64(),
                n as f64 / started.elapsed().as_secs_f64(),
                supervisor.restarts()
            );
        }
    };
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
    // lease has had time to expire, then nothing may be held. The liveness names' leases are
    // longer (a worker killed or exited while holding one leaves it until its expiry): while
    // something is held, wait for them too.
    let settle = args.lease * 2 + Duration::from_secs(1);
    let longest = if args.live_names > 0 {
        settle.max(args.live_lease * 2 + Duration::from_secs(1))
    } else {
        settle
    };
    tokio::time::sleep(settle).await;
    let mut held = store.still_held().await?;
    let mut waited = settle;
    while !held.is_empty() && waited < longest {
        tokio::time::sleep(Duration::from_millis(500)).await;
        waited += Duration::from_millis(500);
        held = store.still_held().await?;
    }
    supervisor.exit().await;

    let recorded = store.finish().await?;
    let mut c = recorded.checker;
    if args
        .uri
        .as_deref()
        .is_some_and(|u| !u.is_empty() && net.is_none())
        || args.postgres_url.as_deref().is_some_and(|u| !u.is_empty())
    {
        // Another host's clock: rule (9) compares the workers' clock with the server's (and
        // the liveness check, below, is not enforced).
        c.expiry_tolerance(None);
    }
    let remote = args
        .uri
        .as_deref()
        .is_some_and(|u| !u.is_empty() && net.is_none())
        || args.postgres_url.as_deref().is_some_and(|u| !u.is_empty());
    for (name, lease, expires) in &held {
        c.held_after_end(name, lease, *expires);
    }
    let (totals, processes) = read_logs(&dir, &mut c)?;
    let mut faults = lock(&counts).clone();
    write_timeline(&dir, &faults.timeline);
    // The liveness check: the workers' waits, resolved against the injector's timeline, and
    // the CLI check's.
    let (mut waiters, hits) = liveness::waiters_of(&processes, &faults.timeline);
    if let Some(r) = &cli_report {
        waiters.extend(r.live_waits.iter().cloned());
    }
    let mut bounds = Bounds::new(
        args.live_lease.as_micros() as i64,
        args.liveness_slack.as_micros() as i64,
    );
    if remote {
        // Another host's clock: the waits' times cannot be compared with the server's.
        bounds.tolerance_us = None;
    }
    let live_report = c.check_liveness(&waiters, &bounds);
    let cli_text = match (&cli_report, &cli_skipped) {
        (Some(r), _) => {
            for o in &r.overlaps {
                c.cli_overlap(o.clone());
            }
            format!(
                "runs={},killed={},stopped={},overlaps={},overlap_episodes={:?},stale_dirs={},\
                 live_runs={},live_waiters_killed={}",
                r.runs,
                r.killed,
                r.stopped,
                r.overlaps.len(),
                r.episodes,
                r.stale,
                r.live_runs,
                r.live_killed
            )
        }
        (None, Some(why)) => format!("skipped: {why}"),
        (None, None) => "skipped".into(),
    };
    faults.fired.insert(FaultKind::WaiterExit, hits.exited);
    if let Some(r) = &cli_report {
        faults
            .injected
            .insert(FaultKind::ExecSigint, r.sigint_sent.0);
        faults.fired.insert(FaultKind::ExecSigint, r.sigint_sent.1);
        faults
            .injected
            .insert(FaultKind::ExecGroupStop, r.group_stops.0);
        faults
            .fired
            .insert(FaultKind::ExecGroupStop, r.group_stops.1);
        faults.injected.insert(FaultKind::ExecSetsid, r.setsid.0);
        faults.fired.insert(FaultKind::ExecSetsid, r.setsid.1);
    }
    if has(FaultKind::ShortExtension) {
        if backend == Backend::Postgres {
            faults
                .injected
                .insert(FaultKind::ShortExtension, totals.short_ext_slowed);
        }
        faults
            .fired
            .insert(FaultKind::ShortExtension, totals.short_ext_dropped);
    }
    let mut summary = Summary::new(
        backend,
        seed,
        args.workers,
        recorded.acquisitions.unwrap_or(acquisitions_at_stop),
        &totals,
        &faults,
        &c,
        duration,
    );
    summary.add_liveness(live_report, &hits, &faults);
    summary.ttl_deletes = recorded.deletes;
    summary.restarts = supervisor.restarts();
    summary.recorder_resumes = recorded.resumes;
    summary.cli = cli_text;
    summary.faults_skipped = skipped
        .into_iter()
        .map(|(k, why)| (k.label().to_owned(), why))
        .collect();
    let mut status = report(&summary, &args, &dir)?;
    if summary.recorder_resumes.1 > 0 {
        eprintln!("torture: the recorder's history is incomplete; the run proves nothing");
        status = status.max(3);
    }
    store.close(summary.violations_total > 0, &dir).await;
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
            backend: Backend::Memory,
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
            cleanup_every_ms: None,
            polling: false,
            drop_futures: !args.no_dropped_futures,
            short_extensions: false,
            live_names: 0,
            live_lease_ms: 0,
            live_round_ms: 0,
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
        // How each ended is not recorded (`Worker::record_grant`).
        checker.grant_ended_unknown(g);
    }
    let mut writes = resource.take_log();
    writes.sort_by(|a, b| a.name.cmp(&b.name)); // stable: keeps acceptance order per name
    for w in writes {
        checker.accepted_write(w);
    }
    let (totals, _) = read_logs(&dir, &mut checker)?;
    let mut summary = Summary::new(
        Backend::Memory,
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
