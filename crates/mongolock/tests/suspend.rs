//! A suspend longer than the lease (the machine sleeps; the monotonic clock stops, the boot
//! clock and the server's clock go on): every wait that ends at the lease's deadline must end
//! soon after the process runs again, not at the monotonic deadline.
//!
//! A suspend is simulated with the test-only boot clock offset
//! (`mongolock::testing::advance_boot_clock`): process-wide and irreversible, so this binary
//! holds its own tests and runs them one at a time (`SERIAL`).

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mongolock::testing::{advance_boot_clock, ExtendsWithoutReply};
use mongolock::{LockBackend, LockProvider, MemoryBackend};
use tokio::time::Instant;

/// One test at a time: a jump of the boot clock ends every lease of the process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The lease: long, so that a wait on the monotonic clock alone would last a minute.
const LEASE: Duration = Duration::from_secs(60);
/// The simulated suspend: longer than the lease.
const SUSPEND: Duration = Duration::from_secs(120);
/// How soon after the "resume" the lease must be seen as lost: generous (the bound is 250 ms
/// plus scheduling), yet far below the lease.
const PROMPTLY: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_lost_signal_fires_promptly_after_a_suspend_past_the_lease() {
    let _serial = SERIAL.lock().await;
    let provider = LockProvider::builder(MemoryBackend::new())
        .expiry(LEASE)
        .build()
        .unwrap();
    let guard = provider.lock("suspended").unwrap().acquire().await.unwrap();
    let pending = tokio::spawn(guard.lost().into_future());
    // Let the watchdog and the lost signal start sleeping towards the deadline.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!guard.is_lost(), "{guard:?} lost before the suspend");

    advance_boot_clock(SUSPEND);
    let resumed = Instant::now();
    // Read first through the pending future: `is_lost` would mark the lease lost itself.
    match tokio::time::timeout(PROMPTLY, pending).await {
        Ok(Ok(())) => {}
        other => panic!(
            "the lost signal pending during a {SUSPEND:?} suspend did not fire within \
             {PROMPTLY:?} of resuming ({other:?}); lease {LEASE:?}, monotonic deadline in {:?}",
            guard
                .local_deadline()
                .saturating_duration_since(Instant::now())
        ),
    }
    eprintln!("lost signal fired {:?} after the resume", resumed.elapsed());
    assert!(guard.is_lost(), "{guard:?}");
    let reason = guard.lost_reason().expect("a loss reason");
    assert!(reason.to_string().contains("deadline"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_extension_gives_up_promptly_after_a_suspend_past_the_lease() {
    let _serial = SERIAL.lock().await;
    // Extensions are applied but never answered: the call waits for the deadline.
    let backend = Arc::new(ExtendsWithoutReply {
        inner: Arc::new(MemoryBackend::new()),
        silent: AtomicBool::new(true),
    });
    let provider = LockProvider::builder_shared(backend as Arc<dyn LockBackend>)
        .expiry(LEASE)
        .auto_extend(false)
        .build()
        .unwrap();
    let guard = Arc::new(provider.lock("extending").unwrap().acquire().await.unwrap());
    let extending = tokio::spawn({
        let guard = guard.clone();
        async move { guard.extend(LEASE).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !extending.is_finished(),
        "the unanswered extension returned"
    );

    advance_boot_clock(SUSPEND);
    let resumed = Instant::now();
    match tokio::time::timeout(PROMPTLY, extending).await {
        Ok(Ok(Ok(false))) => {}
        other => panic!(
            "an extension pending during a {SUSPEND:?} suspend did not give up within \
             {PROMPTLY:?} of resuming ({other:?}); lease {LEASE:?}"
        ),
    }
    eprintln!("extension gave up {:?} after the resume", resumed.elapsed());
    assert!(guard.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_cancels_the_leaders_work_promptly_after_a_suspend_past_the_lease() {
    let _serial = SERIAL.lock().await;
    let provider = LockProvider::builder(MemoryBackend::new())
        .expiry(LEASE)
        .build()
        .unwrap();
    let election = provider.election("suspended-leader").unwrap();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<u64>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    let cancelled = Arc::new(AtomicBool::new(false));

    /// Sets the flag when the leader's work is dropped.
    struct OnDrop(Arc<AtomicBool>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    let runner = tokio::spawn({
        let cancelled = cancelled.clone();
        async move {
            election
                .run(|ctx| {
                    let on_drop = OnDrop(cancelled.clone());
                    if let Some(tx) = started_tx.lock().unwrap().take() {
                        let _ = tx.send(ctx.term());
                    }
                    async move {
                        let _on_drop = on_drop;
                        std::future::pending::<()>().await;
                    }
                })
                .await
        }
    });
    let term = tokio::time::timeout(Duration::from_secs(30), started_rx)
        .await
        .expect("elected within 30 s")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !cancelled.load(Ordering::SeqCst),
        "work of term {term} cancelled before the suspend"
    );

    advance_boot_clock(SUSPEND);
    let resumed = Instant::now();
    let deadline = resumed + PROMPTLY;
    while !cancelled.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the leader's work (term {term}) still runs {:?} after resuming from a {SUSPEND:?} \
             suspend (lease {LEASE:?})",
            resumed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "the leader's work was cancelled {:?} after the resume",
        resumed.elapsed()
    );
    runner.abort();
}

/// Set in the helper process of `the_offset_file_moves_the_boot_clock_of_another_process`.
const CHILD_ENV: &str = "MONGOLOCK_SUSPEND_CHILD";

/// Entry point of the helper process; a no-op in a normal test run. Holds a lease with a
/// pending lost signal until the boot clock offset file (set by the parent) says a suspend
/// longer than the lease happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_entry() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let provider = LockProvider::builder(MemoryBackend::new())
        .expiry(LEASE)
        .build()
        .unwrap();
    let guard = provider.lock("child").unwrap().acquire().await.unwrap();
    let boot_before = mongolock::__boot_time_now();
    println!("HELD");
    let waited = Instant::now();
    let fired = tokio::time::timeout(Duration::from_secs(60), guard.lost().into_future()).await;
    println!(
        "LOST fired={} is_lost={} waited_ms={} boot_advanced_ms={}",
        fired.is_ok(),
        guard.is_lost(),
        waited.elapsed().as_millis(),
        (mongolock::__boot_time_now().saturating_sub(boot_before)).as_millis()
    );
}

/// `MONGOLOCK_TEST_BOOT_OFFSET_FILE`: another process's boot clock moves by the milliseconds
/// written in the file (what the CLI's tests use), so its pending lost signal fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offset_file_moves_the_boot_clock_of_another_process() {
    use tokio::io::AsyncBufReadExt;

    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "mongolock-suspend-{}-{:x}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("boot-offset-ms");
    // Missing at first: counts as 0.
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("MONGOLOCK_TEST_BOOT_OFFSET_FILE", &file)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let held = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let done = line.ends_with("HELD");
            seen.push(line);
            if done {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(held, Ok(true)),
        "the child never held its lock; output: {seen:?}"
    );
    // Let its lost signal start sleeping, then "suspend" it past its 60 s lease.
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&file, SUSPEND.as_millis().to_string()).unwrap();
    let written = Instant::now();
    let lost = tokio::time::timeout(PROMPTLY, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line.clone());
            if line.contains("LOST fired=") {
                return Some(line);
            }
        }
        None
    })
    .await;
    let _ = child.kill().await;
    std::fs::remove_dir_all(&dir).unwrap();
    let line = match lost {
        Ok(Some(line)) => line,
        other => panic!(
            "the child's lost signal did not fire within {PROMPTLY:?} of writing a {SUSPEND:?} \
             offset ({other:?}); output: {seen:?}"
        ),
    };
    assert!(
        line.contains("fired=true") && line.contains("is_lost=true"),
        "child: {line}"
    );
    eprintln!(
        "child reported {line:?} {:?} after the offset was written",
        written.elapsed()
    );
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
