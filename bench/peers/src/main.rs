//! mongolock versus the other MongoDB lock crates on crates.io, side by side against one
//! release `mongo-testserver`, in one run:
//!
//! ```text
//! cargo run --release --manifest-path bench/peers/Cargo.toml
//! BENCH_PAIRS=500 BENCH_HANDOFFS=50 cargo run --release --manifest-path bench/peers/Cargo.toml
//! BENCH_LIBS=cs,mla cargo run --release --manifest-path bench/peers/Cargo.toml   # some libraries
//! cargo run --release --manifest-path bench/peers/Cargo.toml -- --scale [--quick]
//! cargo run --release --manifest-path bench/peers/Cargo.toml -- --ops
//! cargo run --release --manifest-path bench/peers/Cargo.toml -- --faults
//! cargo run --release --manifest-path bench/peers/Cargo.toml -- --pg-notify 32 100   # PostgreSQL notifications per acquisition
//! ```
//!
//! The server runs in a child process (this binary re-executed with `--serve`), so the client
//! CPU figures (`getrusage` of this process) do not include it; its CPU is read from
//! `/proc/<pid>/stat` (Linux). Set `MONGODB_URI` to measure against another server instead
//! (server CPU is then not reported). Each library runs in a spawned task (on the runtime's
//! worker threads, as application code does).
//!
//! Per library (`BENCH_LIBS`: `cs`, `poll`, `sem` (a one-slot semaphore), `dlm`, `mla`, `mdl`, `pg`;
//! default all):
//! * uncontended acquire + release per second (`BENCH_PAIRS` pairs on one name, after a
//!   warm-up of 100);
//! * server commands per acquisition, counted by the server (`serverStatus`
//!   `metrics.commands`, the drivers' `hello`s left out): every command the library sent
//!   during the phase, `getMore`s of change streams included. Counting at the server keeps the
//!   cost of counting out of the client's CPU figures;
//! * client and server CPU per acquisition (µs) over the same phase;
//! * handoff p50 / p99 with 8 tasks contending for one name (time from the holder starting
//!   its release to the next holder holding), `BENCH_HANDOFFS` handoffs.
//!
//! Then acquire attempts (`findAndModify`s at the server, less the release of each acquisition)
//! per handoff with
//! `BENCH_HANDOFF_PROCS` (default 32; 0: skip) mongolock *processes* contending for one name,
//! change streams on, for `BENCH_HANDOFF_SECS` (default 5); `BENCH_FAIR=1` turns fair handoff on
//! in those processes (and in `--scale`'s).
//!
//! `pg` is mongolock's `PostgresBackend` (LISTEN/NOTIFY on) against a PostgreSQL the benchmark
//! starts itself (`pg.rs`; `POSTGRES_URL` for an existing server), measured the same way, with
//! statements counted by `pg_stat_statements` in place of commands, and its own 32-process
//! handoff run (acquire statements per handoff). A different server: not a comparison of the
//! two databases. `BENCH_PG_STATEMENTS=1` also prints the server's planning and execution time per
//! statement of the uncontended pairs (`pg_stat_statements`, with `track_planning` on).
//!
//! `--scale` prints the scale table (processes × names, see `scale.rs`; `BENCH_SCALE_PROCS` and
//! `BENCH_SCALE_NAMES`, comma-separated, choose the rows and columns, `BENCH_SCALE_SECS` the
//! seconds per cell); `--ops` prices the
//! shapes of the acquire and release commands with the driver alone (`ops.rs`); `--faults` runs
//! every library through one workload under the same faults and checks what the server accepted
//! (`faults.rs`).
//!
//! Peers poll; they are given a 10 ms poll interval (the default of `distributed-lock-mongo`;
//! `mongo-lock-async` has no default and `mongodb-lock`'s is 500 ms).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distributed_lock_core::traits::{DistributedLock, LockHandle};
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use mongolock::{LockProvider, MongoBackend};

mod faults;
mod ops;
mod pg;
mod scale;
mod stats;

const POLL: Duration = Duration::from_millis(10);
const TTL: Duration = Duration::from_secs(30);
const WAITERS: usize = 8;
const WARMUP: usize = 100;

/// Whether the library with key `key` (`cs`, `poll`, `dlm`, `mla`, `mdl`) is measured:
/// `BENCH_LIBS` is a comma-separated list of keys (default: all).
fn selected(key: &str) -> bool {
    match std::env::var("BENCH_LIBS") {
        Ok(list) if !list.trim().is_empty() => list.split(',').any(|k| k.trim() == key),
        _ => true,
    }
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// User + system CPU time of this process.
fn own_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU time of process `pid` (Linux `/proc`); `None` elsewhere.
fn proc_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_micros(ticks * 1_000_000 / hz))
}

/// The server, in a child process.
struct Server {
    uri: String,
    child: Option<Child>,
}

impl Server {
    fn start() -> Server {
        if let Ok(uri) = std::env::var("MONGODB_URI") {
            return Server { uri, child: None };
        }
        let mut child = Command::new(std::env::current_exe().expect("current exe"))
            .arg("--serve")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server process");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the server's uri");
        Server {
            uri: line.trim().to_owned(),
            child: Some(child),
        }
    }

    fn pid(&self) -> Option<u32> {
        Some(self.child.as_ref()?.id())
    }

    fn cpu(&self) -> Option<Duration> {
        proc_cpu(self.child.as_ref()?.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `--serve`: run a release mongo-testserver (replica-set mode, so change streams work) and
/// print its uri.
fn serve() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let server = mongo_testserver::TestServer::builder()
            .start()
            .await
            .expect("start mongo-testserver");
        println!("{}", server.uri());
        std::future::pending::<()>().await;
    });
}

/// A client for one library (its commands are counted by the server: see [`stats`]).
async fn client(uri: &str, app: &str) -> Client {
    let mut opts = ClientOptions::parse(uri).await.expect("uri");
    opts.app_name = Some(app.to_owned());
    Client::with_options(opts).expect("client")
}

/// One library under test: one acquire + release, and a contended loop for handoffs.
#[derive(Clone)]
enum Lib {
    Mongolock(LockProvider),
    /// A semaphore of this many slots.
    MongolockSemaphore(LockProvider, u32),
    DistributedLockMongo(Database),
    MongoLockAsync(Client),
    MongodbLock(&'static mongodb_lock::Mutex<String>),
}

impl Lib {
    /// Acquires `name`, waiting as long as needed; `release` is called on the returned value.
    async fn acquire(&self, name: &str) -> Held {
        match self {
            Lib::Mongolock(p) => Held::Mongolock(p.lock(name).unwrap().acquire().await.unwrap()),
            Lib::MongolockSemaphore(p, limit) => {
                Held::Mongolock(p.semaphore(name, *limit).unwrap().acquire().await.unwrap())
            }
            Lib::DistributedLockMongo(db) => {
                let lock = distributed_lock_mongo::MongoDistributedLock::new(
                    name.to_owned(),
                    db.clone(),
                    Some("dlm_locks".into()),
                    None,
                );
                Held::Dlm(lock.acquire(None).await.unwrap())
            }
            Lib::MongoLockAsync(c) => loop {
                if let Some(l) = mongo_lock_async::Lock::try_acquire(c, name, TTL)
                    .await
                    .unwrap()
                {
                    break Held::Mla(l);
                }
                tokio::time::sleep(POLL).await;
            },
            Lib::MongodbLock(m) => Held::Mdl(
                m.lock(Duration::from_secs(600), POLL, name.to_owned())
                    .await
                    .unwrap(),
            ),
        }
    }
}

enum Held {
    Mongolock(mongolock::LockGuard),
    Dlm(distributed_lock_mongo::handle::MongoLockHandle),
    Mla(mongo_lock_async::Lock),
    // The guard borrows the mutex; it is released (in the background) when dropped.
    Mdl(mongodb_lock::MutexGuard<'static, String>),
}

impl Held {
    async fn release(self) {
        match self {
            Held::Mongolock(g) => g.release().await.unwrap(),
            Held::Dlm(h) => h.release().await.unwrap(),
            Held::Mla(l) => {
                l.release().await.unwrap();
            }
            Held::Mdl(g) => drop(g),
        }
    }
}

/// Where a phase's server-side counts and CPU come from.
enum Meter<'a> {
    /// Commands counted by `serverStatus`; CPU of the mongo-testserver process.
    Mongo {
        admin: &'a Client,
        server: &'a Server,
    },
    /// Statements counted by `pg_stat_statements`; CPU of the postgres processes.
    Pg {
        stats: &'a pg::PgStats,
        server: &'a pg::PgServer,
    },
}

impl Meter<'_> {
    async fn commands(&self) -> u64 {
        match self {
            Meter::Mongo { admin, .. } => stats::server_stats(admin).await.commands,
            Meter::Pg { stats, .. } => stats.statements().await,
        }
    }

    fn server_cpu(&self) -> Option<Duration> {
        match self {
            Meter::Mongo { server, .. } => server.cpu(),
            Meter::Pg { server, .. } => server.cpu(),
        }
    }
}

struct Row {
    name: &'static str,
    per_sec: f64,
    commands: f64,
    client_us: f64,
    server_us: Option<f64>,
    handoff_p50_ms: f64,
    handoff_p99_ms: f64,
}

async fn measure(
    name: &'static str,
    lib: Lib,
    meter: &Meter<'_>,
    pairs: usize,
    handoffs: usize,
) -> Row {
    let key = format!("bench-{}", name.replace(' ', "-"));
    for _ in 0..WARMUP {
        lib.acquire(&key).await.release().await;
    }
    // Let background work of the warm-up (a lingering stream, background releases) settle.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // BENCH_PG_STATEMENTS=1: the server's time per statement of the uncontended pairs.
    let breakdown = match meter {
        Meter::Pg { stats, .. } if std::env::var("BENCH_PG_STATEMENTS").is_ok_and(|v| v == "1") => {
            stats.reset().await;
            Some(*stats)
        }
        _ => None,
    };
    let n0 = meter.commands().await;
    let (c0, s0) = (own_cpu(), meter.server_cpu());
    let t0 = Instant::now();
    for _ in 0..pairs {
        lib.acquire(&key).await.release().await;
    }
    let elapsed = t0.elapsed();
    let (c1, s1) = (own_cpu(), meter.server_cpu());
    let n1 = meter.commands().await;
    if let Some(stats) = breakdown {
        eprintln!("{name}: statements of the uncontended pairs (pg_stat_statements)");
        for line in stats.breakdown().await {
            eprintln!("  {line}");
        }
    }
    let n = pairs as f64;
    let server_us = match (s0, s1) {
        (Some(a), Some(b)) => Some((b - a).as_secs_f64() * 1e6 / n),
        _ => None,
    };

    // Handoffs: WAITERS tasks contend for one name, each holding it for 1 ms; a task that
    // released sits out until another one holds the name, so each sample is a handoff.
    let key = format!("{key}-handoff");
    let generation = Arc::new(tokio::sync::watch::channel(0_u64).0);
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (lib, key, last, samples, generation) = (
                lib.clone(),
                key.clone(),
                last_release.clone(),
                samples.clone(),
                generation.clone(),
            );
            tokio::spawn(async move {
                let mut rx = generation.subscribe();
                loop {
                    let held = lib.acquire(&key).await;
                    let now = Instant::now();
                    generation.send_modify(|g| *g += 1);
                    let mine = *generation.borrow();
                    if let Some(released) = last.lock().unwrap().take() {
                        samples.lock().unwrap().push(now - released);
                    }
                    let done = samples.lock().unwrap().len() >= handoffs;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    if !done {
                        *last.lock().unwrap() = Some(Instant::now());
                    }
                    held.release().await;
                    if done {
                        return;
                    }
                    let _ = rx.wait_for(|g| *g > mine).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let mut v = samples.lock().unwrap().clone();
    v.sort();
    let pct = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;
    Row {
        name,
        per_sec: n / elapsed.as_secs_f64(),
        commands: (n1 - n0) as f64 / n,
        client_us: (c1 - c0).as_secs_f64() * 1e6 / n,
        server_us,
        handoff_p50_ms: pct(0.5),
        handoff_p99_ms: pct(0.99),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--serve") => return serve(),
        Some("--scale-worker") => return scale::scale_worker(&args[1..]),
        Some("--handoff-worker") => return scale::handoff_worker(&args[1..]),
        Some("--names-worker") => return scale::names_worker(&args[1..]),
        Some("--pg-notify") => return scale::pg_notify(&args[1..]),
        Some("--scale") => return scale::scale(args.iter().any(|a| a == "--quick")),
        Some("--faults") => return faults::faults(),
        Some("--fault-worker") => return faults::fault_worker(&args[1..]),
        Some("--ops") => return ops::ops(env_usize("BENCH_PAIRS", 2000)),
        _ => {}
    }
    let handoff_procs = env_usize("BENCH_HANDOFF_PROCS", 32);
    let pairs = env_usize("BENCH_PAIRS", 2000);
    let handoffs = env_usize("BENCH_HANDOFFS", 200);
    let server = Arc::new(Server::start());
    let pg_server = selected("pg").then(|| Arc::new(pg::PgServer::start()));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let srv = server.clone();
    let pg_srv = pg_server.clone();
    // Everything runs in a spawned task, on the runtime's worker threads, as application code
    // does (not on the thread that called `block_on`).
    let rows = rt.block_on(async move {
        let server = srv;
        let pg_server = pg_srv;
        tokio::spawn(async move {
            let admin = client(&server.uri, "bench-admin").await;
            let meter = Meter::Mongo {
                admin: &admin,
                server: &server,
            };
            let mut rows = Vec::new();
            for (name, streams) in [
                ("mongolock (change streams)", true),
                ("mongolock (polling)", false),
            ] {
                if !selected(if streams { "cs" } else { "poll" }) {
                    continue;
                }
                let client = client(&server.uri, name).await;
                let backend = MongoBackend::builder(&client.database("bench_mongolock"))
                    .collection(if streams { "locks_cs" } else { "locks_poll" })
                    .notifications(streams)
                    .build()
                    .unwrap();
                let provider = LockProvider::builder(backend).build().unwrap();
                let lib = Lib::Mongolock(provider);
                rows.push(measure(name, lib, &meter, pairs, handoffs).await);
            }
            if selected("sem") {
                // One slot, so that the handoff phase hands one lease around as for the locks.
                let name = "mongolock semaphore, 1 slot (change streams)";
                let client = client(&server.uri, name).await;
                let backend = MongoBackend::builder(&client.database("bench_mongolock"))
                    .collection("locks_sem")
                    .build()
                    .unwrap();
                let provider = LockProvider::builder(backend).build().unwrap();
                let lib = Lib::MongolockSemaphore(provider, 1);
                rows.push(measure(name, lib, &meter, pairs, handoffs).await);
            }
            if selected("dlm") {
                let name = "distributed-lock-mongo 0.2";
                let client = client(&server.uri, name).await;
                let lib = Lib::DistributedLockMongo(client.database("bench_dlm"));
                rows.push(measure(name, lib, &meter, pairs, handoffs).await);
            }
            if selected("mla") {
                let name = "mongo-lock-async 0.4";
                let client = client(&server.uri, name).await;
                mongo_lock_async::prepare_database(&client).await.unwrap();
                let lib = Lib::MongoLockAsync(client);
                rows.push(measure(name, lib, &meter, pairs, handoffs).await);
            }
            if selected("mdl") {
                let name = "mongodb-lock 0.3";
                let client = client(&server.uri, name).await;
                let mutex = mongodb_lock::Mutex::new(&client.database("bench_mdl"), "locks")
                    .await
                    .unwrap();
                // The guards borrow the mutex for as long as the benchmark runs.
                let lib = Lib::MongodbLock(Box::leak(Box::new(mutex)));
                rows.push(measure(name, lib, &meter, pairs, handoffs).await);
            }
            // mongodb-lock releases in a background task: let the last one finish.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut pg_row = None;
            if let Some(pg) = &pg_server {
                let name = "mongolock on PostgreSQL (LISTEN/NOTIFY)";
                let stats = pg::PgStats::connect(pg.url()).await;
                let meter = Meter::Pg {
                    stats: &stats,
                    server: pg,
                };
                let lib = Lib::Mongolock(pg::provider(pg.url(), "bench_locks"));
                pg_row = Some(measure(name, lib, &meter, pairs, handoffs).await);
            }
            (rows, pg_row)
        })
        .await
        .expect("benchmark task")
    });
    let (rows, pg_row) = rows;
    if !rows.is_empty() {
        print_table(&rows, pairs, handoffs);
    }
    if let (Some(row), Some(pg)) = (&pg_row, &pg_server) {
        print_pg_row(row, pg, pairs, handoffs);
    }
    if handoff_procs > 0 && selected("cs") {
        let secs = env_usize("BENCH_HANDOFF_SECS", 5) as f64;
        let h = scale::handoff_procs(&server.uri, handoff_procs, secs);
        println!(
            "\nmongolock (change streams), {} processes contending for one name for {} s (each \
             holds it 1 ms, then sits out 5 ms):\n",
            h.procs, h.secs
        );
        println!(
            "| handoffs/s | acquire attempts per handoff (findAndModify less one release each) \
             | getMore per handoff |"
        );
        println!("|---:|---:|---:|");
        let n = h.acquisitions.max(1) as f64;
        // Every acquisition's release is a findAndModify too.
        println!(
            "| {:.0} | {:.2} | {:.2} |",
            h.acquisitions as f64 / h.secs,
            h.attempts.saturating_sub(h.acquisitions) as f64 / n,
            h.get_mores as f64 / n
        );
    }
    if let (Some(pg), true) = (&pg_server, handoff_procs > 0) {
        let secs = env_usize("BENCH_HANDOFF_SECS", 5) as f64;
        let h = scale::handoff_procs_pg(pg, handoff_procs, secs);
        println!(
            "\nmongolock on PostgreSQL (LISTEN/NOTIFY), {} processes contending for one name for \
             {} s (each holds it 1 ms, then sits out 5 ms):\n",
            h.procs, h.secs
        );
        println!(
            "| handoffs/s | acquire statements per handoff | statements per handoff | \
             notifications received per handoff (all processes) |"
        );
        println!("|---:|---:|---:|---:|");
        let n = h.acquisitions.max(1) as f64;
        println!(
            "| {:.0} | {:.2} | {:.2} | {:.2} |",
            h.acquisitions as f64 / h.secs,
            h.attempts as f64 / n,
            h.get_mores as f64 / n,
            h.notifications as f64 / n
        );
    }
}

/// The PostgreSQL row, in a table of its own: another server, statements instead of commands.
fn print_pg_row(r: &Row, pg: &pg::PgServer, pairs: usize, handoffs: usize) {
    let server = if pg.cpu().is_some() {
        "a PostgreSQL the benchmark started (fsync and synchronous_commit as configured)"
    } else {
        "POSTGRES_URL"
    };
    println!(
        "\nmongolock's PostgresBackend against {server}; {pairs} pairs, {handoffs} handoffs \
         among {WAITERS} tasks. A different server from the rows above: not a comparison of \
         the databases.\n"
    );
    println!(
        "| library | acquire+release/s | statements / acq. | client CPU µs / acq. | server CPU µs / acq. | handoff p50 ms | handoff p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {:.0} | {:.2} | {:.0} | {} | {:.2} | {:.2} |",
        r.name,
        r.per_sec,
        r.commands,
        r.client_us,
        r.server_us.map_or("n/a".into(), |s| format!("{s:.0}")),
        r.handoff_p50_ms,
        r.handoff_p99_ms
    );
}

fn print_table(rows: &[Row], pairs: usize, handoffs: usize) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "\n{pairs} uncontended acquire+release pairs per library (after {WARMUP} warm-up), \
         {handoffs} handoffs among {WAITERS} tasks; {cores} cores\n"
    );
    println!(
        "| library | acquire+release/s | server commands / acq. | client CPU µs / acq. | server CPU µs / acq. | handoff p50 ms | handoff p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {} | {:.2} | {:.2} |",
            r.name,
            r.per_sec,
            r.commands,
            r.client_us,
            r.server_us.map_or("n/a".into(), |s| format!("{s:.0}")),
            r.handoff_p50_ms,
            r.handoff_p99_ms
        );
    }
    let Some(ours) = rows.first() else { return };
    println!("\nRatios, {} / peer:\n", ours.name);
    println!("| peer | throughput | commands | client CPU | handoff p50 |");
    println!("|---|---:|---:|---:|---:|");
    for r in &rows[1..] {
        println!(
            "| {} | {:.2}× | {:.2}× | {:.2}× | {:.2}× |",
            r.name,
            ours.per_sec / r.per_sec,
            ours.commands / r.commands,
            ours.client_us / r.client_us,
            ours.handoff_p50_ms / r.handoff_p50_ms
        );
    }
}
