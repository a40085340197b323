//! Costs as processes and names grow (`--scale`), and acquire attempts per handoff with many
//! waiting processes (run after the peer table).
//!
//! Every process is this binary re-executed as a worker (`--scale-worker`,
//! `--handoff-worker`) with its own `mongodb::Client` and `LockProvider` (change streams on),
//! driven over stdin/stdout lines so that all workers start and stop together. The server's
//! own counters (`serverStatus`) give commands, `findAndModify`s (acquire attempts) and open
//! change-stream cursors; `/proc/<pid>/status` gives memory.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use mongodb::Client;
use mongolock::{LockProvider, MongoBackend};

use crate::stats::{rss_bytes, server_stats};
use crate::Server;

/// A worker process and its line protocol.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(args: &[String]) -> Worker {
        let mut child = Command::new(std::env::current_exe().expect("current exe"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a worker process");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Worker {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, line: &str) {
        let _ = writeln!(self.stdin, "{line}");
        let _ = self.stdin.flush();
    }

    /// The next line, split into words (panics if the worker died).
    fn recv(&mut self) -> Vec<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("worker output");
        assert!(!line.is_empty(), "a worker process ended early");
        line.split_whitespace().map(str::to_owned).collect()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads one line from stdin (the parent's instruction).
fn wait_line() -> String {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    line.trim().to_owned()
}

async fn provider(uri: &str, db: &str) -> LockProvider {
    mongo_provider(uri, db).await.0
}

/// The provider, and its MongoDB backend (to read its change-stream counters) unless `uri` is
/// PostgreSQL's.
async fn mongo_provider(uri: &str, db: &str) -> (LockProvider, Option<MongoBackend>) {
    if uri.starts_with("postgres") {
        return (crate::pg::provider(uri, db), None);
    }
    let client = Client::with_uri_str(uri).await.expect("client");
    // `BENCH_FAIR=1`: fair handoff (a release reserves the lock for the designated process).
    let fair = std::env::var("BENCH_FAIR").is_ok_and(|v| v == "1");
    let backend = MongoBackend::builder(&client.database(db))
        .collection("locks")
        .notifications(true)
        .fair_handoff(fair)
        .build()
        .expect("backend");
    let provider = LockProvider::builder(backend.clone())
        .build()
        .expect("provider");
    (provider, Some(backend))
}

fn stream_events(backend: &Option<MongoBackend>) -> u64 {
    backend.as_ref().map_or(0, MongoBackend::stream_events)
}

fn own_rss() -> u64 {
    rss_bytes(std::process::id()).unwrap_or(0)
}

/// `--scale-worker URI NAMES SECS INDEX PROCS`: acquire + release random names of `NAMES` for
/// `SECS` (after "go"), report the count; then (after "hold") hold its share of `NAMES` other
/// names and report the RSS it grew by.
pub fn scale_worker(args: &[String]) {
    let uri = args[0].clone();
    let names: usize = args[1].parse().expect("names");
    let secs: f64 = args[2].parse().expect("secs");
    let index: usize = args[3].parse().expect("index");
    let procs: usize = args[4].parse().expect("procs");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (provider, backend) = rt.block_on(mongo_provider(&uri, "bench_scale"));
    // Warm up (opens the change stream and the connection pool).
    rt.block_on(async {
        let g = provider
            .lock(format!("warm-{index}"))
            .unwrap()
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
    });
    println!("ready");
    wait_line();
    let events_before = stream_events(&backend);
    let p = provider.clone();
    let (count, elapsed) = rt.block_on(async move {
        tokio::spawn(async move {
            let t0 = Instant::now();
            let mut count = 0_u64;
            let mut x = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            while t0.elapsed().as_secs_f64() < secs {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let name = format!("n{}", x % names as u64);
                let g = p.lock(&name).unwrap().acquire().await.unwrap();
                g.release().await.unwrap();
                count += 1;
            }
            (count, t0.elapsed().as_secs_f64())
        })
        .await
        .unwrap()
    });
    // Events still on their way to the stream arrive within a getMore period.
    std::thread::sleep(Duration::from_millis(1200));
    let events = stream_events(&backend) - events_before;
    println!("count {count} {elapsed} {events}");
    wait_line();
    let before = own_rss();
    let guards = rt.block_on(async {
        let mut guards = Vec::new();
        for j in (index..names).step_by(procs) {
            guards.push(
                provider
                    .lock(format!("h{j}"))
                    .unwrap()
                    .acquire()
                    .await
                    .unwrap(),
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        guards
    });
    let after = own_rss();
    println!("held {} {}", guards.len(), after as i64 - before as i64);
    wait_line();
    std::mem::forget(guards); // the server goes away with the cell
}

/// One cell of the scale table.
struct Cell {
    procs: usize,
    names: usize,
    acq_per_sec: f64,
    commands_per_sec: f64,
    attempts_per_acq: f64,
    events_per_acq: f64,
    streams: Option<u64>,
    held: u64,
    server_bytes_per_lock: Option<f64>,
    client_bytes_per_lock: f64,
    /// Server CPU per acquisition (µs), when the server is this benchmark's child.
    server_cpu_per_acq: Option<f64>,
}

fn cell(procs: usize, names: usize, secs: f64, rt: &tokio::runtime::Runtime) -> Cell {
    let server = Server::start();
    let admin = rt
        .block_on(Client::with_uri_str(&server.uri))
        .expect("admin client");
    let mut workers: Vec<Worker> = (0..procs)
        .map(|i| {
            Worker::spawn(&[
                "--scale-worker".into(),
                server.uri.clone(),
                names.to_string(),
                secs.to_string(),
                i.to_string(),
                procs.to_string(),
            ])
        })
        .collect();
    for w in &mut workers {
        assert_eq!(w.recv()[0], "ready");
    }
    let s0 = rt.block_on(server_stats(&admin));
    let cpu0 = server.cpu();
    let t0 = Instant::now();
    for w in &mut workers {
        w.send("go");
    }
    std::thread::sleep(Duration::from_secs_f64(secs / 2.0));
    let mid = rt.block_on(server_stats(&admin));
    let mut acq_per_sec = 0.0;
    let mut acquisitions = 0_u64;
    let mut events = 0_u64;
    for w in &mut workers {
        let r = w.recv();
        let (count, elapsed): (u64, f64) = (r[1].parse().unwrap(), r[2].parse().unwrap());
        events += r[3].parse::<u64>().unwrap();
        acquisitions += count;
        acq_per_sec += count as f64 / elapsed;
    }
    let s1 = rt.block_on(server_stats(&admin));
    let cpu1 = server.cpu();
    // The workers waited for late events after their runs: not part of the rate.
    let wall = (t0.elapsed().as_secs_f64() - 1.2).max(secs);
    // Hold every name once, spread over the processes.
    std::thread::sleep(Duration::from_millis(300));
    let srv0 = server.pid().and_then(rss_bytes);
    for w in &mut workers {
        w.send("hold");
    }
    let (mut held, mut client_bytes) = (0_u64, 0_i64);
    for w in &mut workers {
        let r = w.recv();
        held += r[1].parse::<u64>().unwrap();
        client_bytes += r[2].parse::<i64>().unwrap();
    }
    let srv1 = server.pid().and_then(rss_bytes);
    for w in &mut workers {
        w.send("exit");
    }
    drop(workers);
    Cell {
        procs,
        names,
        acq_per_sec,
        commands_per_sec: (s1.commands - s0.commands) as f64 / wall,
        attempts_per_acq: (s1.find_and_modify - s0.find_and_modify) as f64
            / acquisitions.max(1) as f64,
        events_per_acq: events as f64 / acquisitions.max(1) as f64,
        streams: mid.change_streams,
        held,
        server_bytes_per_lock: match (srv0, srv1) {
            (Some(a), Some(b)) => Some((b as f64 - a as f64) / held.max(1) as f64),
            _ => None,
        },
        client_bytes_per_lock: client_bytes as f64 / held.max(1) as f64,
        server_cpu_per_acq: match (cpu0, cpu1) {
            (Some(a), Some(b)) => Some((b - a).as_secs_f64() * 1e6 / acquisitions.max(1) as f64),
            _ => None,
        },
    }
}

/// `--scale [--quick]`: the table.
pub fn scale(quick: bool) {
    let procs: &[usize] = if quick { &[1, 10, 30] } else { &[1, 10, 100] };
    let names: &[usize] = if quick {
        &[1, 100, 1000]
    } else {
        &[1, 100, 10_000]
    };
    let secs = std::env::var("BENCH_SCALE_SECS").map_or(if quick { 1.0 } else { 3.0 }, |v| {
        v.parse().expect("BENCH_SCALE_SECS")
    });
    // `BENCH_SCALE_PROCS` / `BENCH_SCALE_NAMES` (comma-separated) replace the rows / columns,
    // `BENCH_SCALE_SECS` the seconds each cell runs.
    let list = |var: &str, default: &[usize]| -> Vec<usize> {
        std::env::var(var).map_or_else(
            |_| default.to_vec(),
            |v| v.split(',').map(|n| n.trim().parse().expect(var)).collect(),
        )
    };
    let (procs, names) = (
        list("BENCH_SCALE_PROCS", procs),
        list("BENCH_SCALE_NAMES", names),
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut cells = Vec::new();
    for &p in &procs {
        for &n in &names {
            eprintln!("scale: {p} processes × {n} names ...");
            cells.push(cell(p, n, secs, &rt));
        }
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "\nmongolock (change streams on) at scale: each process one task that acquires and \
         releases a random name of N for {secs} s; then every name held once (spread over the \
         processes) for memory; a fresh server per cell; {cores} cores\n"
    );
    println!("| processes | names | acquisitions/s | server commands/s | findAndModify / acquisition | server CPU µs / acquisition | change events delivered / acquisition | change-stream cursors | locks held | server memory / held lock | client memory / held lock |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in &cells {
        let kib = |b: f64| format!("{:.2} KiB", b / 1024.0);
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {} | {:.2} | {} | {} | {} | {} |",
            c.procs,
            c.names,
            c.acq_per_sec,
            c.commands_per_sec,
            c.attempts_per_acq,
            c.server_cpu_per_acq
                .map_or("n/a".into(), |u| format!("{u:.0}")),
            c.events_per_acq,
            c.streams.map_or("n/a".into(), |s| s.to_string()),
            c.held,
            if c.held >= 100 {
                c.server_bytes_per_lock.map_or("n/a".into(), kib)
            } else {
                "—".into()
            },
            if c.held >= 100 {
                kib(c.client_bytes_per_lock)
            } else {
                "—".into()
            },
        );
    }
    println!(
        "\nfindAndModify / acquisition counts every findAndModify per acquisition: the acquire \
         attempts, the release, and on a name's first acquisition the miss and the fencing epoch \
         (2.00 is one attempt and one release). Server CPU / acquisition: the server's CPU time \
         over the run (its getMores and change events included) per acquisition. Change events delivered / acquisition: events \
         all the processes' change streams delivered, per acquisition (other processes' grants \
         and releases of names a process waits on or holds). Memory per held lock is the RSS growth while \
         every name is acquired once and held (\"—\": under 100 locks, below what RSS \
         resolves); server memory includes the change event each grant logs."
    );
}

/// `--handoff-worker URI`: after "go", acquire the contended name, hold it 1 ms, release, sit
/// out 5 ms (so the next holder is another process), until "stop"; report the count and (on
/// PostgreSQL) the notifications its listening connection received meanwhile.
pub fn handoff_worker(args: &[String]) {
    loop_worker(&args[0], "bench_handoff", "contended".into(), 1);
}

/// `--names-worker URI INDEX`: as `--handoff-worker`, but two tasks of this process contend
/// for a name of its own (`own-INDEX`), so every process waits on (and listens for) one name
/// that no other process uses.
pub fn names_worker(args: &[String]) {
    loop_worker(&args[0], "bench_names", format!("own-{}", args[1]), 2);
}

/// `tasks` tasks acquire `name`, hold it 1 ms, release, sit out 5 ms, from "go" until "stop";
/// then prints `count <acquisitions> <notifications received>`.
fn loop_worker(uri: &str, table: &str, name: String, tasks: usize) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (provider, pg_backend) = if uri.starts_with("postgres") {
        let (p, b) = crate::pg::provider_and_backend(uri, table);
        (p, Some(b))
    } else {
        (rt.block_on(provider(uri, table)), None)
    };
    let received = || {
        pg_backend
            .as_ref()
            .map_or(0, mongolock::PostgresBackend::notifications_received)
    };
    rt.block_on(async {
        let g = provider.lock("warm").unwrap().acquire().await.unwrap();
        g.release().await.unwrap();
    });
    println!("ready");
    wait_line();
    let received_before = received();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..tasks)
        .map(|_| {
            let s = stop.clone();
            let p = provider.clone();
            let name = name.clone();
            rt.spawn(async move {
                let mut count = 0_u64;
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    let g = p.lock(&name).unwrap().acquire().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    g.release().await.unwrap();
                    count += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                count
            })
        })
        .collect();
    wait_line();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // A waiter may wait for a release that never comes once the others stopped: give up after
    // a while.
    let count: u64 = rt.block_on(async {
        let mut count = 0;
        for task in tasks {
            count += tokio::time::timeout(Duration::from_secs(3), task)
                .await
                .map(|r| r.unwrap())
                .unwrap_or(0);
        }
        count
    });
    // Notifications of the last writes are on their way.
    std::thread::sleep(Duration::from_millis(300));
    println!("count {count} {}", received() - received_before);
}

/// Acquire attempts per handoff with `procs` waiting processes (one name, change streams on).
pub struct HandoffProcs {
    pub procs: usize,
    pub acquisitions: u64,
    /// Notifications the processes' listening connections received (PostgreSQL; 0 on MongoDB).
    pub notifications: u64,
    pub attempts: u64,
    pub get_mores: u64,
    pub secs: f64,
}

pub fn handoff_procs(uri: &str, procs: usize, secs: f64) -> HandoffProcs {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let admin = rt
        .block_on(Client::with_uri_str(uri))
        .expect("admin client");
    let mut workers: Vec<Worker> = (0..procs)
        .map(|_| Worker::spawn(&["--handoff-worker".into(), uri.to_owned()]))
        .collect();
    for w in &mut workers {
        assert_eq!(w.recv()[0], "ready");
    }
    let s0 = rt.block_on(server_stats(&admin));
    for w in &mut workers {
        w.send("go");
    }
    std::thread::sleep(Duration::from_secs_f64(secs));
    for w in &mut workers {
        w.send("stop");
    }
    let mut acquisitions = 0;
    for w in &mut workers {
        acquisitions += w.recv()[1].parse::<u64>().unwrap();
    }
    let s1 = rt.block_on(server_stats(&admin));
    HandoffProcs {
        procs,
        acquisitions,
        notifications: 0,
        attempts: s1.find_and_modify - s0.find_and_modify,
        get_mores: s1.get_more - s0.get_more,
        secs,
    }
}

/// [`handoff_procs`] on PostgreSQL: `attempts` counts executions of the acquire statement and
/// `get_mores` (reused field) every statement, both from `pg_stat_statements`.
pub fn handoff_procs_pg(pg: &crate::pg::PgServer, procs: usize, secs: f64) -> HandoffProcs {
    procs_pg(pg, procs, secs, |_| {
        vec!["--handoff-worker".into(), pg.url().to_owned()]
    })
}

/// `procs` processes, each with two tasks contending for a name of its own
/// (`--names-worker`): what a write of one name costs the listeners of the others.
pub fn names_procs_pg(pg: &crate::pg::PgServer, procs: usize, secs: f64) -> HandoffProcs {
    procs_pg(pg, procs, secs, |i| {
        vec!["--names-worker".into(), pg.url().to_owned(), i.to_string()]
    })
}

fn procs_pg(
    pg: &crate::pg::PgServer,
    procs: usize,
    secs: f64,
    args: impl Fn(usize) -> Vec<String>,
) -> HandoffProcs {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let stats = rt.block_on(crate::pg::PgStats::connect(pg.url()));
    let mut workers: Vec<Worker> = (0..procs).map(|i| Worker::spawn(&args(i))).collect();
    for w in &mut workers {
        assert_eq!(w.recv()[0], "ready");
    }
    let (a0, s0) =
        rt.block_on(async { (stats.acquire_attempts().await, stats.statements().await) });
    for w in &mut workers {
        w.send("go");
    }
    std::thread::sleep(Duration::from_secs_f64(secs));
    for w in &mut workers {
        w.send("stop");
    }
    let (mut acquisitions, mut notifications) = (0, 0);
    for w in &mut workers {
        let r = w.recv();
        acquisitions += r[1].parse::<u64>().unwrap();
        notifications += r[2].parse::<u64>().unwrap();
    }
    let (a1, s1) =
        rt.block_on(async { (stats.acquire_attempts().await, stats.statements().await) });
    HandoffProcs {
        procs,
        acquisitions,
        notifications,
        attempts: a1 - a0,
        get_mores: s1 - s0,
        secs,
    }
}

/// `--pg-notify PROCS...`: on one PostgreSQL the benchmark starts (or `POSTGRES_URL`), for
/// each process count: the one-name handoff ([`handoff_procs_pg`]) and one name per process
/// ([`names_procs_pg`]), each for `BENCH_HANDOFF_SECS` (5) seconds; prints the notifications
/// the processes' listening connections received per acquisition.
pub fn pg_notify(args: &[String]) {
    let procs: Vec<usize> = if args.is_empty() {
        vec![32, 100]
    } else {
        args.iter()
            .map(|a| a.parse().expect("a process count"))
            .collect()
    };
    let secs = std::env::var("BENCH_HANDOFF_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(5.0);
    let pg = crate::pg::PgServer::start();
    let mut rows = Vec::new();
    for &p in &procs {
        eprintln!("pg-notify: {p} processes, one name ...");
        rows.push(("one name, all processes", handoff_procs_pg(&pg, p, secs)));
        eprintln!("pg-notify: {p} processes, a name each ...");
        rows.push((
            "a name per process (2 tasks each)",
            names_procs_pg(&pg, p, secs),
        ));
    }
    println!(
        "\nmongolock on PostgreSQL (LISTEN/NOTIFY), {secs} s per row; each acquisition holds \
         the name 1 ms, then its task sits out 5 ms:\n"
    );
    println!("| processes | names | acquisitions/s | acquire statements / acquisition | statements / acquisition | notifications received / acquisition (all processes) |");
    println!("|---:|---|---:|---:|---:|---:|");
    for (what, h) in &rows {
        let n = h.acquisitions.max(1) as f64;
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} |",
            h.procs,
            what,
            h.acquisitions as f64 / h.secs,
            h.attempts as f64 / n,
            h.get_mores as f64 / n,
            h.notifications as f64 / n,
        );
    }
    println!(
        "\nNotifications received counts every NOTIFY the processes' listening connections \
         received (PostgresBackend::notifications_received), their own releases' included."
    );
}
