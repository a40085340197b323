//! Lock benchmarks against the embedded mongo-testserver (or `MONGODB_URI`).
//!
//! ```text
//! cargo bench -p mongolock --bench lock_bench
//! BENCH_ITERS=200 BENCH_HANDOFFS=30 cargo bench -p mongolock --bench lock_bench   # quicker
//! ```
//!
//! * uncontended acquire + release latency (p50, p99) and commands sent per acquisition,
//!   counted with the driver's command monitoring;
//! * handoff latency with 8 waiters (release → next waiter holds): with change-stream wake-ups
//!   (the default) versus polling only (`MongoBackend::builder(..).notifications(false)`), for
//!   each wait strategy.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_testserver::TestServer;
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongolock::{
    LockBackend, LockBackendExt, LockProvider, MemoryBackend, MongoBackend, WaitStrategy,
};
use tokio::time::Instant;

type Counts = Arc<Mutex<BTreeMap<String, u64>>>;

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "p50 {:>8.3} ms   p99 {:>8.3} ms   max {:>8.3} ms   (n={})",
        percentile(&v, 0.50).as_secs_f64() * 1e3,
        percentile(&v, 0.99).as_secs_f64() * 1e3,
        v.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        v.len()
    )
}

async fn uncontended(
    label: &str,
    backend: Arc<dyn LockBackend>,
    iters: usize,
    counts: Option<&Counts>,
) {
    let provider = LockProvider::builder_shared(backend).build().unwrap();
    let lock = provider.lock(format!("bench-uncontended-{label}")).unwrap();
    for _ in 0..20 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    if let Some(c) = counts {
        c.lock().unwrap().clear();
    }
    let mut total = Vec::with_capacity(iters);
    let mut acquire = Vec::with_capacity(iters);
    let mut release = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        let g = lock.acquire().await.unwrap();
        let t1 = Instant::now();
        g.release().await.unwrap();
        let t2 = Instant::now();
        acquire.push(t1 - t0);
        release.push(t2 - t1);
        total.push(t2 - t0);
    }
    println!("uncontended acquire+release [{label}]");
    println!("  acquire+release  {}", summary(total));
    println!("  acquire          {}", summary(acquire));
    println!("  release          {}", summary(release));
    if let Some(c) = counts {
        let c = c.lock().unwrap();
        let per: Vec<String> = c
            .iter()
            .map(|(name, n)| format!("{name} {:.2}", *n as f64 / iters as f64))
            .collect();
        let all: u64 = c.values().sum();
        println!(
            "  commands per acquisition: {:.2} total ({})",
            all as f64 / iters as f64,
            per.join(", ")
        );
    }
}

async fn handoff(
    label: &str,
    backend: Arc<dyn LockBackend>,
    strategy: WaitStrategy,
    handoffs: usize,
) {
    // Let the change stream open first (a no-op for polling backends).
    for _ in 0..200 {
        if backend.live_notifications() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    const WAITERS: usize = 8;
    let provider = LockProvider::builder_shared(backend)
        .wait_strategy(strategy)
        .build()
        .unwrap();
    let name = format!("bench-handoff-{label}-{:x}", rand_u32());
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    // Bumped by every acquisition: a releaser sits out until someone else holds the lock, so
    // every release is a handoff to one of the 8 waiters.
    let (generation, _) = tokio::sync::watch::channel(0_u64);
    let generation = Arc::new(generation);
    let mut tasks = Vec::new();
    for _ in 0..=WAITERS {
        let lock = provider.lock(name.clone()).unwrap();
        let (released_at, samples, generation) =
            (released_at.clone(), samples.clone(), generation.clone());
        tasks.push(tokio::spawn(async move {
            let mut rx = generation.subscribe();
            loop {
                let g = lock.acquire().await.unwrap();
                generation.send_modify(|g| *g += 1);
                let mine = *generation.borrow();
                if let Some(r) = released_at.lock().unwrap().take() {
                    samples.lock().unwrap().push(r.elapsed());
                }
                let done = samples.lock().unwrap().len() >= handoffs;
                tokio::time::sleep(Duration::from_millis(5)).await;
                if !done {
                    *released_at.lock().unwrap() = Some(Instant::now());
                }
                g.release().await.unwrap();
                if done {
                    return;
                }
                let _ = rx.wait_for(|g| *g > mine).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let v = samples.lock().unwrap().clone();
    println!("  handoff [{label}]  {}", summary(v));
}

fn rand_u32() -> u32 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let iters = env_usize("BENCH_ITERS", 1000);
    let handoffs = env_usize("BENCH_HANDOFFS", 60);
    let (_server, uri) = match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => (None, uri),
        _ => {
            let server = TestServer::start().await.expect("start mongo-testserver");
            let uri = server.uri();
            (Some(server), uri)
        }
    };
    println!("server: {uri}\n");
    let counts: Counts = Arc::new(Mutex::new(BTreeMap::new()));
    let mut options = ClientOptions::parse(&uri).await.unwrap();
    let sink = counts.clone();
    options.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        if let CommandEvent::Started(s) = ev {
            // Monitoring, session housekeeping and the backend's one change stream are not
            // lock commands.
            let change_stream = s.command_name == "aggregate"
                && s.command
                    .get_array("pipeline")
                    .ok()
                    .and_then(|p| p.first())
                    .and_then(|st| st.as_document())
                    .is_some_and(|st| st.contains_key("$changeStream"));
            if !change_stream
                && !matches!(
                    s.command_name.as_str(),
                    "hello" | "isMaster" | "ping" | "endSessions" | "getMore" | "killCursors"
                )
            {
                *sink.lock().unwrap().entry(s.command_name).or_default() += 1;
            }
        }
    }));
    let client = mongodb::Client::with_options(options).unwrap();
    let db = client.database(&format!("mongolock_bench_{:x}", rand_u32()));
    let mongo: Arc<dyn LockBackend> = Arc::new(
        MongoBackend::builder(&db)
            .collection("distributed.locks")
            .build()
            .unwrap(),
    );
    let polling: Arc<dyn LockBackend> = Arc::new(
        MongoBackend::builder(&db)
            .collection("distributed.locks")
            .notifications(false)
            .build()
            .unwrap(),
    );
    let memory: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());

    uncontended("mongodb", mongo.clone(), iters, Some(&counts)).await;
    uncontended("memory", memory.clone(), iters, None).await;

    println!("\nhandoff latency, 8 waiters (release -> next waiter holds)");
    handoff(
        "mongodb, change streams (fallback random 10-800 ms)",
        mongo.clone(),
        WaitStrategy::default(),
        handoffs,
    )
    .await;
    handoff(
        "mongodb, change streams (fallback exponential 100 ms-5 s)",
        mongo.clone(),
        WaitStrategy::exponential(),
        handoffs,
    )
    .await;
    handoff(
        "mongodb, polling only, random 10-800 ms",
        polling.clone(),
        WaitStrategy::default(),
        handoffs,
    )
    .await;
    handoff(
        "mongodb, polling only, exponential 100 ms-5 s",
        polling.clone(),
        WaitStrategy::exponential(),
        handoffs,
    )
    .await;
    handoff(
        "memory (live notifications)",
        memory.clone(),
        WaitStrategy::default(),
        handoffs,
    )
    .await;
    db.drop().await.ok();
}
