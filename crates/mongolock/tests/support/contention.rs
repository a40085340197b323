//! One process-contention harness for every backend (`mongo/processes.rs` for MongoDB,
//! `postgres/processes.rs` for PostgreSQL): several OS processes contending for one lock, and a
//! holder killed with SIGKILL.
//!
//! The helper processes are the test binary itself: its `processes::child_entry` is an ordinary
//! test that calls [`child_entry`] here, which does nothing unless `MONGOLOCK_TEST_CHILD` is
//! set; the parent tests run the binary again with `processes::child_entry --exact` and that
//! variable. This needs
//! no extra build targets, so it works in a plain `cargo test` on a fresh clone. A test binary
//! says where its backend is with [`Setup::env`] (passed to every helper) and builds the
//! helpers' backend from those variables.
#![allow(dead_code)]

use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use mongolock::{LockBackend, LockProvider, WaitStrategy};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const CHILD_ENV: &str = "MONGOLOCK_TEST_CHILD";

/// Where the helper processes find the backend.
pub struct Setup {
    /// Environment variables for every helper (server address, collection or table).
    pub env: Vec<(&'static str, String)>,
    /// What the processes share, for failure messages ("table locks_1a2b").
    pub label: String,
}

/// A variable the parent passed to a helper.
pub fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("child process needs {key}"))
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// Entry point of the helper processes (call it from a `#[test] fn child_entry` in the binary's
/// `processes` module); a no-op in a normal test run. `backend` builds the helper's backend
/// from the [`Setup::env`] variables.
pub fn child_entry<F, Fut>(backend: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Arc<dyn LockBackend>>,
{
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    // `RUST_LOG=mongolock=debug` shows what the helpers do (on stderr).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let provider = child_provider(backend().await);
        match mode.as_str() {
            "contend" => contend(provider).await,
            "hold" => hold(provider).await,
            other => panic!("unknown child mode {other}"),
        }
    });
}

/// A helper's provider on `backend`, with the expiry the parent passed.
fn child_provider(backend: Arc<dyn LockBackend>) -> LockProvider {
    let expiry_ms: u64 = env("MONGOLOCK_EXPIRY_MS").parse().unwrap();
    LockProvider::builder_shared(backend)
        .expiry(Duration::from_millis(expiry_ms))
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_millis(1),
            Duration::from_millis(20),
        ))
        .app_name(format!("child-{}", std::process::id()))
        .build()
        .unwrap()
}

/// Acquires the lock `rounds` times; inside, a non-atomic read-modify-write of a shared file
/// and an "inside" marker that must not exist already.
async fn contend(provider: LockProvider) {
    let lock = provider.lock(env("MONGOLOCK_NAME")).unwrap();
    let dir = PathBuf::from(env("MONGOLOCK_DIR"));
    let rounds: u32 = env("MONGOLOCK_ROUNDS").parse().unwrap();
    for _ in 0..rounds {
        let guard = lock.acquire().await.unwrap();
        let marker = dir.join("inside");
        if std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
            .is_err()
        {
            println!("OVERLAP");
            std::process::exit(3);
        }
        let counter: u64 = std::fs::read_to_string(dir.join("counter"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
        std::fs::write(dir.join("counter"), (counter + 1).to_string()).unwrap();
        let mut tokens = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.join("tokens"))
            .unwrap();
        writeln!(tokens, "{}", guard.fencing_token()).unwrap();
        drop(tokens);
        std::fs::remove_file(&marker).unwrap();
        assert!(!guard.is_lost(), "lease lost inside the critical section");
        guard.release().await.unwrap();
    }
    println!("DONE");
}

/// Acquires the lock, reports it, and holds it (with automatic extension) until killed.
async fn hold(provider: LockProvider) {
    let guard = provider
        .lock(env("MONGOLOCK_NAME"))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    println!("HELD {} {}", guard.fencing_token(), guard.lease_id());
    std::io::stdout().flush().unwrap();
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

fn spawn_child(mode: &str, setup: &Setup, name: &str, extra: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        "processes::child_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, mode)
    .env("MONGOLOCK_NAME", name)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .kill_on_drop(true);
    for (k, v) in setup.env.iter().chain(extra) {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn helper process")
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("mongolock-processes"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read_tokens(dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(dir.join("tokens"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

/// Four processes take one lock 15 times each: never two inside at once, no lost update,
/// tokens strictly growing in critical-section order.
pub async fn four_processes_contend_without_overlap(setup: &Setup) {
    const PROCESSES: usize = 4;
    const ROUNDS: usize = 15;
    let name = unique("shared");
    let dir = scratch_dir();
    std::fs::write(dir.join("counter"), "0").unwrap();
    let extra = [
        ("MONGOLOCK_DIR", dir.display().to_string()),
        ("MONGOLOCK_ROUNDS", ROUNDS.to_string()),
        ("MONGOLOCK_EXPIRY_MS", "10000".to_string()),
    ];
    let children: Vec<Child> = (0..PROCESSES)
        .map(|_| spawn_child("contend", setup, &name, &extra))
        .collect();
    for child in children {
        let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
            .await
            .expect("helper process finished")
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !stdout.contains("OVERLAP"),
            "two processes were inside at once ({}, lock {name}): {stdout}",
            setup.label
        );
        assert!(
            out.status.success() && stdout.contains("DONE"),
            "helper failed: {stdout}"
        );
    }
    let counter: usize = std::fs::read_to_string(dir.join("counter"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        counter,
        PROCESSES * ROUNDS,
        "lost updates: the lock did not exclude"
    );
    let tokens = read_tokens(&dir);
    assert_eq!(tokens.len(), PROCESSES * ROUNDS);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly grow in critical-section order: {tokens:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A helper holds the lock and is killed with SIGKILL; `backend` (where the helpers' is) takes
/// the lock over only after the killed holder's lease expired, with a larger token.
pub async fn a_killed_holder_is_replaced_only_after_its_lease_expires(
    setup: &Setup,
    backend: Arc<dyn LockBackend>,
) {
    const EXPIRY: Duration = Duration::from_secs(2);
    let name = unique("crashy");
    let mut child = spawn_child(
        "hold",
        setup,
        &name,
        &[("MONGOLOCK_EXPIRY_MS", EXPIRY.as_millis().to_string())],
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let held = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // libtest prints "test processes::child_entry ... " without a newline first.
            if let Some((_, rest)) = line.split_once("HELD ") {
                return rest.to_owned();
            }
        }
        panic!("helper exited without holding the lock");
    })
    .await
    .expect("helper acquired the lock");
    let mut parts = held.split_whitespace();
    let child_token: u64 = parts.next().unwrap().parse().unwrap();
    let child_lease = parts.next().unwrap().to_owned();

    let provider = LockProvider::builder_shared(backend)
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_millis(5),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap();
    // Keep the holder alive for longer than its expiry: automatic extension keeps others out.
    let lock = provider.lock(name.clone()).unwrap();
    assert!(lock
        .acquire_timeout(EXPIRY + EXPIRY / 2)
        .await
        .unwrap()
        .is_none());

    child.kill().await.unwrap(); // SIGKILL on Unix: no release, no further extensions
    let killed_at = Instant::now();
    let info = provider.inspect(&name).await.unwrap().unwrap();
    assert_eq!(
        info.lease_id.as_ref().map(|l| l.as_str()),
        Some(child_lease.as_str())
    );
    let last_expiry = info.expires_at.unwrap();

    let guard = lock
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the lock is free once the killed holder's lease expired");
    assert!(
        guard.acquired_at() >= last_expiry,
        "taken over at {:?}, before the killed holder's lease expired at {last_expiry:?}",
        guard.acquired_at()
    );
    assert!(
        guard.fencing_token() > child_token,
        "token {} after the killed holder's {child_token}",
        guard.fencing_token()
    );
    assert!(
        killed_at.elapsed() < EXPIRY + Duration::from_secs(10),
        "failover took {:?}",
        killed_at.elapsed()
    );
    guard.release().await.unwrap();
}
