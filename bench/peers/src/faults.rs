//! `--faults`: every library through the same workload under the same faults, judged by a
//! checker that reads what the server accepted.
//!
//! ```text
//! cargo run --release --manifest-path bench/peers/Cargo.toml -- --faults
//! BENCH_FAULTS=100 BENCH_FAULT_WORKERS=6 BENCH_LIBS=ml,mla cargo run --release \
//!     --manifest-path bench/peers/Cargo.toml -- --faults
//! ```
//!
//! **Workload.** For each library, `BENCH_FAULT_WORKERS` (default 4) worker *processes* (this
//! binary re-executed with `--fault-worker`) contend for one name with a 2 s lease (peers poll
//! every 10 ms). A holder does its work as four writes to a shared *resource* document, 40 ms
//! apart, then writes a release marker and releases. Each accepted write appends
//! `{acquisition, token, kind, at: $$NOW}` to the resource's log in the same atomic update, so
//! the log is the server's own order of what it accepted.
//! * `ml`: mongolock, the way its docs say to use it: the holder checks `is_lost()` before each
//!   write, and the resource accepts a write only if its fencing token is at least the largest
//!   it has seen (`{token: {$lte: mine}}` in the update's filter).
//! * `mlu`: mongolock without fencing: `is_lost()` checks only, the resource accepts every write.
//! * `dlm` (`distributed-lock-mongo` 0.2): the holder checks the handle's `lost_token` before each
//!   write; no token to fence with.
//! * `mla` (`mongo-lock-async` 0.4) and `mdl` (`mongodb-lock` 0.3): no loss signal, no token.
//!
//! **Faults** (one schedule for every library, from `BENCH_FAULT_SEED`; one every ~0.6 s): a
//! random worker is stopped (`SIGSTOP`) for 1.5 leases then continued; killed (`SIGKILL`, and a new worker
//! started); its next command is slowed by 1.25 leases (`blockConnection`); or its next
//! command's connection is closed before the reply (`closeConnection`: a lost reply, the driver
//! retries).
//!
//! **The checker** reads the resource's log (the server's order) and the workers' own logs:
//! * *wrote while another held*: acquisitions with a work write accepted after a work write of
//!   an acquisition that first wrote later: two holders acting on the resource at once, in
//!   server order (release markers do not order acquisitions: one lost before its first write
//!   still writes its marker);
//! * *stale writes refused*: writes the resource's fencing check refused (`ml` only);
//! * *late releases* (a release marker after another acquisition's write), and of those the
//!   ones the library reports as having deleted a lock (`mla` reports it; the others filter
//!   their release by their own lease id, so theirs cannot);
//! * *token repeats / inversions* (libraries with tokens): two acquisitions with one token, or an
//!   acquisition that started after another had returned and got a token no larger;
//! * *held by nobody*: the longest stretch (server time) in which the resource accepted no write
//!   although workers were waiting (fault combinations make a few leases normal: a stopped
//!   holder's lease running out, then a slowed acquire), and whether the name can be taken
//!   again within three leases after every worker was killed at the end.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mongodb::bson::{doc, Bson, Document};
use mongodb::Client;
use mongolock::{LockProvider, MongoBackend};

use crate::{client, selected, Held, Server, POLL};

const TTL: Duration = Duration::from_secs(2);
const NAME: &str = "faults";
const DB: &str = "bench_faults";
const WORK_WRITES: u32 = 4;
const WORK_GAP: Duration = Duration::from_millis(40);

/// The libraries of this mode: key, table label.
const LIBS: [(&str, &str); 5] = [
    ("ml", "mongolock (fenced writes)"),
    ("mlu", "mongolock (is_lost only)"),
    ("dlm", "distributed-lock-mongo 0.2"),
    ("mla", "mongo-lock-async 0.4"),
    ("mdl", "mongodb-lock 0.3"),
];

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A small xorshift generator (the schedule only needs to be varied, not secure).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Reporting what happened to a held lock, for the workers' logs ([`Held`] is the main
/// benchmark's).
impl Held {
    fn token(&self) -> Option<u64> {
        match self {
            Held::Mongolock(g) => Some(g.fencing_token()),
            _ => None,
        }
    }

    /// The library's own loss signal, where it has one.
    fn is_lost(&self) -> bool {
        use distributed_lock_core::traits::LockHandle;
        match self {
            Held::Mongolock(g) => g.is_lost(),
            Held::Dlm(h) => *h.lost_token().borrow(),
            Held::Mla(_) | Held::Mdl(_) => false,
        }
    }

    /// Releases; what the library said (for the log).
    async fn release_reporting(self) -> String {
        use distributed_lock_core::traits::LockHandle;
        match self {
            Held::Mongolock(g) => match g.release().await {
                Ok(()) => "ok".into(),
                Err(e) => format!("err:{}", e.to_string().replace(char::is_whitespace, "_")),
            },
            Held::Dlm(h) => match h.release().await {
                Ok(()) => "ok".into(),
                Err(_) => "err".into(),
            },
            Held::Mla(l) => match l.release().await {
                Ok(true) => "deleted".into(),
                Ok(false) => "none".into(),
                Err(_) => "err".into(),
            },
            // Released in the background when dropped; nothing to report.
            Held::Mdl(g) => {
                drop(g);
                "dropped".into()
            }
        }
    }
}

/// `--fault-worker LIB URI LOG`: acquire, work, release, forever; one line per event in LOG.
pub fn fault_worker(args: &[String]) {
    let (lib, uri, log) = (args[0].clone(), args[1].clone(), args[2].clone());
    let pid = std::process::id();
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .expect("open the worker log");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let client = client(&uri, &app_name(&lib, pid)).await;
        let db = client.database(DB);
        let resource = db.collection::<Document>("resource");
        let provider = mongolock_provider(&lib, &db);
        let mdl: &'static mongodb_lock::Mutex<String> = Box::leak(Box::new(
            mongodb_lock::Mutex::new_uninit(&db, "mdl_locks").await,
        ));
        let mut n = 0_u64;
        loop {
            n += 1;
            let acq = format!("{pid}.{n}");
            let t0 = wall_us();
            let held = match acquire(&lib, provider.as_ref(), &client, mdl).await {
                Ok(h) => h,
                Err(e) => {
                    let _ = writeln!(out, "error acquire {e}");
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            };
            let t1 = wall_us();
            let token = held.token();
            let _ = writeln!(
                out,
                "acq {acq} {t0} {t1} {}",
                token.map_or("-".into(), |t| t.to_string())
            );
            let fenced = lib == "ml";
            for k in 0..WORK_WRITES {
                if held.is_lost() {
                    let _ = writeln!(out, "lost {acq}");
                    break;
                }
                match write(&resource, &lib, &acq, token, fenced, &k.to_string()).await {
                    Ok(true) => {}
                    Ok(false) => {
                        let _ = writeln!(out, "refused {acq}");
                    }
                    Err(e) => {
                        let _ = writeln!(out, "error write {acq} {e}");
                    }
                }
                tokio::time::sleep(WORK_GAP).await;
            }
            if let Err(e) = write(&resource, &lib, &acq, token, false, "rel").await {
                let _ = writeln!(out, "error marker {acq} {e}");
            }
            let r0 = wall_us();
            let said = held.release_reporting().await;
            let _ = writeln!(out, "rel {acq} {r0} {} {said}", wall_us());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}

/// mongolock's provider for the `ml` and `mlu` rows (`None` for the peers).
fn mongolock_provider(lib: &str, db: &mongodb::Database) -> Option<LockProvider> {
    (lib == "ml" || lib == "mlu").then(|| {
        let backend = MongoBackend::builder(db)
            .collection("ml_locks")
            .build()
            .expect("backend");
        LockProvider::builder(backend)
            .expiry(TTL)
            .build()
            .expect("provider")
    })
}

fn app_name(lib: &str, pid: u32) -> String {
    format!("faults-{lib}-{pid}")
}

async fn acquire(
    lib: &str,
    provider: Option<&LockProvider>,
    client: &Client,
    mdl: &'static mongodb_lock::Mutex<String>,
) -> Result<Held, String> {
    use distributed_lock_core::traits::DistributedLock;
    match lib {
        "ml" | "mlu" => {
            let p = provider.ok_or("no provider")?;
            let lock = p.lock(NAME).map_err(|e| e.to_string())?;
            lock.acquire()
                .await
                .map(Held::Mongolock)
                .map_err(|e| e.to_string())
        }
        "dlm" => {
            let options = distributed_lock_mongo::options::MongoDistributedLockOptions {
                expiry: TTL,
                min_busy_wait_sleep_time: POLL,
                ..Default::default()
            };
            distributed_lock_mongo::MongoDistributedLock::new(
                NAME.to_owned(),
                client.database(DB),
                Some("dlm_locks".into()),
                Some(options),
            )
            .acquire(None)
            .await
            .map(Held::Dlm)
            .map_err(|e| e.to_string())
        }
        "mla" => loop {
            // Its collection is `locks` in the client's default database (`mongo-lock`).
            match mongo_lock_async::Lock::try_acquire(client, NAME, TTL).await {
                Ok(Some(l)) => return Ok(Held::Mla(l)),
                Ok(None) => tokio::time::sleep(POLL).await,
                Err(e) => return Err(format!("{e:?}")),
            }
        },
        "mdl" => mdl
            .lock(Duration::from_secs(3600), POLL, NAME.to_owned())
            .await
            .map(Held::Mdl)
            .map_err(|e| e.to_string()),
        other => Err(format!("unknown library {other}")),
    }
}

/// One write to the resource: appends an entry to its log, in server order, with server time.
/// `fenced`: only if `token` is at least the largest token the resource has accepted. Returns
/// whether the resource accepted it.
async fn write(
    resource: &mongodb::Collection<Document>,
    lib: &str,
    acq: &str,
    token: Option<u64>,
    fenced: bool,
    kind: &str,
) -> mongodb::error::Result<bool> {
    let t = token.map_or(Bson::Null, |t| Bson::Int64(t as i64));
    let mut filter = doc! { "_id": lib };
    let mut set = doc! {
        "log": { "$concatArrays": ["$log", [{ "a": acq, "t": t.clone(), "k": kind, "at": "$$NOW" }]] },
    };
    if fenced {
        filter.insert("token", doc! { "$lte": t.clone() });
        set.insert("token", t);
    }
    let r = resource
        .update_one(filter, vec![doc! { "$set": set }])
        .await?;
    Ok(r.matched_count == 1)
}

/// A worker process.
struct Worker {
    child: Child,
    app: String,
}

impl Worker {
    fn spawn(lib: &str, uri: &str, log: &str) -> Worker {
        let child = Command::new(std::env::current_exe().expect("current exe"))
            .args(["--fault-worker", lib, uri, log])
            .stdin(Stdio::null())
            .spawn()
            .expect("start a worker");
        let app = app_name(lib, child.id());
        Worker { child, app }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    fn kill(mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One row of the table.
struct Row {
    label: &'static str,
    faults: [u64; 4],
    acquisitions: usize,
    overlapped: usize,
    refused: usize,
    late_releases: usize,
    ended_other: usize,
    token_repeats: usize,
    token_inversions: usize,
    tokens: bool,
    longest_gap_s: f64,
    free_after_crash: bool,
    examples: Vec<String>,
}

pub fn faults() {
    // A run is a number of faults, not a time, so that every library gets the same sequence
    // even when a loaded machine stretches it.
    let count = crate::env_usize("BENCH_FAULTS", 60);
    let workers = crate::env_usize("BENCH_FAULT_WORKERS", 4).max(2);
    // One schedule for every library of a run (the outcomes still differ with timing).
    let seed = crate::env_usize("BENCH_FAULT_SEED", (wall_us() % 1_000_000) as usize) as u64;
    let server = Server::start();
    let dir = std::env::temp_dir().join(format!("mongolock-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("log directory");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut rows = Vec::new();
    for (key, label) in LIBS {
        if !selected(key) {
            continue;
        }
        eprintln!("faults: {label}: {workers} workers, {count} faults");
        let log_dir = dir.join(key);
        std::fs::create_dir_all(&log_dir).expect("log directory");
        rows.push(rt.block_on(run_lib(
            key,
            label,
            &server.uri,
            &log_dir,
            workers,
            count,
            seed,
        )));
    }
    println!(
        "\nThe same workload and faults for every library ({workers} worker processes, one name, \
         2 s leases, {count} faults each, BENCH_FAULT_SEED={seed}; faults: stop / kill / slowed \
         reply / lost reply):\n"
    );
    println!(
        "| library | faults s/k/b/c | acquisitions | wrote while another held | stale writes refused \
         | late releases (ended another's lease) | token repeats / inversions \
         | longest with no accepted write (s) | free 3 leases after all crashed |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|");
    for r in &rows {
        let f = r.faults;
        println!(
            "| {} | {}/{}/{}/{} | {} | {} | {} | {} ({}) | {} | {:.1} | {} |",
            r.label,
            f[0],
            f[1],
            f[2],
            f[3],
            r.acquisitions,
            r.overlapped,
            r.refused,
            r.late_releases,
            r.ended_other,
            if r.tokens {
                format!("{} / {}", r.token_repeats, r.token_inversions)
            } else {
                "no token".into()
            },
            r.longest_gap_s,
            if r.free_after_crash { "yes" } else { "**no**" },
        );
    }
    for r in &rows {
        for e in &r.examples {
            println!("  {}: {e}", r.label);
        }
    }
    println!("\nworker logs: {}", dir.display());
}

async fn run_lib(
    key: &'static str,
    label: &'static str,
    uri: &str,
    log_dir: &std::path::Path,
    workers: usize,
    count: usize,
    seed: u64,
) -> Row {
    let admin = client(uri, "faults-admin").await;
    let db = admin.database(DB);
    let resource = db.collection::<Document>("resource");
    resource
        .delete_one(doc! { "_id": key })
        .await
        .expect("reset the resource");
    resource
        .insert_one(doc! { "_id": key, "token": 0_i64, "log": [] })
        .await
        .expect("create the resource");
    if key == "mla" {
        mongo_lock_async::prepare_database(&admin)
            .await
            .expect("mongo-lock-async's index");
    }
    if key == "mdl" {
        mongodb_lock::Mutex::<String>::new(&db, "mdl_locks")
            .await
            .expect("mongodb-lock's index");
    }
    let log_of = |i: usize| log_dir.join(format!("{i}.log")).display().to_string();
    let mut spawned = 0;
    let mut pool: Vec<Worker> = Vec::new();
    for _ in 0..workers {
        pool.push(Worker::spawn(key, uri, &log_of(spawned)));
        spawned += 1;
    }
    let mut rng = Rng::new(seed);
    let mut faults = [0_u64; 4];
    let mut continues = tokio::task::JoinSet::new();
    for _ in 0..count {
        tokio::time::sleep(Duration::from_millis(400 + rng.below(400))).await;
        let i = rng.below(pool.len() as u64) as usize;
        match rng.below(4) {
            0 => {
                faults[0] += 1;
                let pid = pool[i].child.id() as i32;
                // SAFETY: kill(2) on a live child of ours.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                continues.spawn(async move {
                    tokio::time::sleep(TTL * 3 / 2).await;
                    // SAFETY: as above; a killed-and-reaped pid is not reused while we run
                    // (at worst SIGCONT reaches a new process, which ignores it).
                    unsafe { libc::kill(pid, libc::SIGCONT) };
                });
            }
            1 => {
                faults[1] += 1;
                let w = pool.swap_remove(i);
                w.kill();
                pool.push(Worker::spawn(key, uri, &log_of(spawned)));
                spawned += 1;
            }
            kind => {
                faults[kind as usize] += 1;
                let mut data = doc! {
                    "failCommands": ["update", "findAndModify", "delete", "insert"],
                    "appName": &pool[i].app,
                };
                if kind == 2 {
                    data.insert("blockConnection", true);
                    data.insert("blockTimeMS", (TTL.as_millis() * 5 / 4) as i64);
                } else {
                    data.insert("closeConnection", true);
                }
                let r = admin
                    .database("admin")
                    .run_command(doc! {
                        "configureFailPoint": "failCommand",
                        "mode": { "times": 1 },
                        "data": data,
                    })
                    .await;
                if let Err(e) = r {
                    eprintln!("faults: configureFailPoint failed: {e}");
                }
            }
        }
    }
    while continues.join_next().await.is_some() {}
    let _ = admin
        .database("admin")
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await;
    // Everyone crashes at once; then: can the name be taken again?
    let ended = wall_us();
    for w in pool {
        w.kill();
    }
    let free_after_crash = {
        let provider = mongolock_provider(key, &db);
        let mdl: &'static mongodb_lock::Mutex<String> = Box::leak(Box::new(
            mongodb_lock::Mutex::new_uninit(&db, "mdl_locks").await,
        ));
        let got = tokio::time::timeout(TTL * 3, acquire(key, provider.as_ref(), &admin, mdl)).await;
        match got {
            Ok(Ok(h)) => {
                h.release_reporting().await;
                true
            }
            _ => false,
        }
    };
    let log = resource
        .find_one(doc! { "_id": key })
        .await
        .expect("read the resource")
        .and_then(|d| d.get_array("log").ok().cloned())
        .unwrap_or_default();
    let worker_logs: Vec<String> = (0..spawned)
        .map(|i| std::fs::read_to_string(log_of(i)).unwrap_or_default())
        .collect();
    check(label, faults, &log, &worker_logs, ended, free_after_crash)
}

/// One accepted write, from the resource's log.
struct Entry {
    acq: String,
    kind: String,
    at_ms: i64,
}

fn entries(log: &[Bson]) -> Vec<Entry> {
    log.iter()
        .filter_map(|b| {
            let d = b.as_document()?;
            Some(Entry {
                acq: d.get_str("a").ok()?.to_owned(),
                kind: d.get_str("k").ok()?.to_owned(),
                at_ms: d.get_datetime("at").ok()?.timestamp_millis(),
            })
        })
        .collect()
}

fn check(
    label: &'static str,
    faults: [u64; 4],
    log: &[Bson],
    worker_logs: &[String],
    ended_us: u64,
    free_after_crash: bool,
) -> Row {
    let log = entries(log);
    let mut examples = Vec::new();
    // Order of first work write = the order in which acquisitions first acted on the resource.
    // (Release markers do not count: an acquisition that was lost before its first write still
    // writes one.)
    let mut first_pos: HashMap<&str, usize> = HashMap::new();
    for (i, e) in log.iter().enumerate() {
        if e.kind != "rel" {
            first_pos.entry(e.acq.as_str()).or_insert(i);
        }
    }
    // An entry of acquisition A is out of turn when an acquisition B whose first work write came
    // after A's has written before it. A release marker out of turn is a late release.
    let mut overlapped: HashSet<&str> = HashSet::new();
    let mut late: HashSet<&str> = HashSet::new();
    let mut latest_first = 0_usize; // largest first position among work entries so far
    for (i, e) in log.iter().enumerate() {
        let Some(&mine) = first_pos.get(e.acq.as_str()) else {
            continue;
        };
        if mine < latest_first {
            let other = &log[latest_first].acq;
            if e.kind == "rel" {
                late.insert(e.acq.as_str());
            } else if overlapped.insert(e.acq.as_str()) && examples.len() < 3 {
                examples.push(format!(
                    "acquisition {} wrote (kind {}, entry {i}, at {} ms) after acquisition {} had \
                     written (entry {latest_first})",
                    e.acq, e.kind, e.at_ms, other
                ));
            }
        }
        if e.kind != "rel" {
            latest_first = latest_first.max(mine);
        }
    }
    // Stretches with no accepted write (server time), and the tail up to the end of the run.
    let mut longest = 0_i64;
    let gaps = log
        .windows(2)
        .map(|w| w[1].at_ms - w[0].at_ms)
        .chain(log.last().map(|l| (ended_us / 1000) as i64 - l.at_ms));
    for g in gaps {
        longest = longest.max(g);
    }
    // Workers' logs: refusals, what late releases did, tokens.
    let mut refused = 0;
    let mut ended_other = 0;
    let mut granted = 0;
    let mut acqs: Vec<(u64, u64, u64, String)> = Vec::new(); // (start, returned, token, acq)
    for line in worker_logs.iter().flat_map(|l| l.lines()) {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["refused", ..] => refused += 1,
            ["rel", acq, _, _, "deleted"] if late.contains(acq) => {
                ended_other += 1;
                if examples.len() < 6 {
                    examples.push(format!(
                        "acquisition {acq} released after another acquisition had written, \
                         and its release deleted the lock document"
                    ));
                }
            }
            ["acq", acq, t0, t1, token] => {
                granted += 1;
                if let (Ok(t0), Ok(t1), Ok(token)) = (t0.parse(), t1.parse(), token.parse()) {
                    acqs.push((t0, t1, token, (*acq).to_owned()));
                }
            }
            _ => {}
        }
    }
    let tokens = !acqs.is_empty();
    let mut seen: HashMap<u64, &str> = HashMap::new();
    let mut token_repeats = 0;
    for (_, _, t, a) in &acqs {
        if let Some(other) = seen.insert(*t, a) {
            token_repeats += 1;
            examples.push(format!("token {t} given to {other} and {a}"));
        }
    }
    // An acquisition that began after another had returned must get a larger token.
    let mut by_return: Vec<&(u64, u64, u64, String)> = acqs.iter().collect();
    by_return.sort_by_key(|a| a.1);
    let mut prefix_max: Vec<(u64, u64, &str)> = Vec::new(); // (returned, max token so far, acq)
    for a in &by_return {
        let (m, who) = match prefix_max.last() {
            Some(&(_, m, who)) if m >= a.2 => (m, who),
            _ => (a.2, a.3.as_str()),
        };
        prefix_max.push((a.1, m, who));
    }
    let mut token_inversions = 0;
    for a in &acqs {
        let before = prefix_max.partition_point(|p| p.0 < a.0);
        if before > 0 {
            let (_, m, who) = prefix_max[before - 1];
            if m >= a.2 {
                token_inversions += 1;
                if examples.len() < 9 {
                    examples.push(format!(
                        "acquisition {} began after {who} returned token {m}, but got {}",
                        a.3, a.2
                    ));
                }
            }
        }
    }
    Row {
        label,
        faults,
        acquisitions: granted,
        overlapped: overlapped.len(),
        refused,
        late_releases: late.len(),
        ended_other,
        token_repeats,
        token_inversions,
        tokens,
        longest_gap_s: longest as f64 / 1000.0,
        free_after_crash,
        examples,
    }
}
