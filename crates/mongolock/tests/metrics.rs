//! The metrics (feature `metrics`) recorded on the memory backend, read back through
//! `metrics-util`'s debugging recorder: acquire, contention, release, loss, extension failures,
//! election, label mapping and cancellation.
//!
//! A binary of its own: it installs the process-wide metrics recorder, and it needs the
//! `metrics` feature (`cargo test -p mongolock --features metrics --test metrics`). The recorder
//! is global and taking a snapshot drains it, so every test merges its snapshot into one shared
//! tally ([`tally`]) and reads its own, uniquely named, series from there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use mongolock::backend::{AcquireRequest, Attempt, ChangeNotifications, LeaseId, LockInfo};
use mongolock::testing::eventually;
use mongolock::{Error, LockBackend, LockProvider, MemoryBackend, MetricsLabels};

/// One series: metric name and sorted labels.
type SeriesKey = (String, Vec<(String, String)>);

#[derive(Default)]
struct Tally {
    counters: HashMap<SeriesKey, u64>,
    gauges: HashMap<SeriesKey, f64>,
    histograms: HashMap<SeriesKey, Vec<f64>>,
}

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("no other recorder is installed");
        mongolock::describe_metrics();
        snapshotter
    })
}

/// Drains the recorder into the shared tally and returns it.
fn tally() -> std::sync::MutexGuard<'static, Tally> {
    static TALLY: OnceLock<Mutex<Tally>> = OnceLock::new();
    let mut tally = TALLY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    for (key, _unit, _description, value) in snapshotter().snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let series = (key.name().to_owned(), labels);
        match value {
            DebugValue::Counter(n) => *tally.counters.entry(series).or_default() += n,
            // The snapshot resets gauges too; the library only increments and decrements
            // its gauge, so the deltas add up.
            DebugValue::Gauge(v) => *tally.gauges.entry(series).or_default() += v.into_inner(),
            DebugValue::Histogram(vs) => tally
                .histograms
                .entry(series)
                .or_default()
                .extend(vs.into_iter().map(|v| v.into_inner())),
        }
    }
    tally
}

fn series(name: &str, labels: &[(&str, &str)]) -> SeriesKey {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    (name.to_owned(), labels)
}

fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    tally()
        .counters
        .get(&series(name, labels))
        .copied()
        .unwrap_or(0)
}

fn gauge(name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    tally().gauges.get(&series(name, labels)).copied()
}

fn histogram(name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    tally()
        .histograms
        .get(&series(name, labels))
        .cloned()
        .unwrap_or_default()
}

fn provider() -> LockProvider {
    snapshotter();
    LockProvider::memory()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_contend_and_release_are_recorded() {
    let provider = provider();
    let lock = provider.lock("metrics:acquire").unwrap();
    let l = [("lock", "metrics:acquire")];

    let held = lock.acquire().await.unwrap();
    // One attempt that finds it busy; then a finite wait that runs out.
    assert!(lock.try_acquire().await.unwrap().is_none());
    assert!(lock
        .acquire_timeout(Duration::from_millis(30))
        .await
        .unwrap()
        .is_none());
    // A waiter that gets it once the holder releases.
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    held.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    second.release().await.unwrap();

    assert_eq!(counter("mongolock_acquisitions_total", &l), 2);
    assert_eq!(counter("mongolock_contended_total", &l), 3);
    let acquired = histogram(
        "mongolock_acquire_wait_seconds",
        &[("lock", "metrics:acquire"), ("outcome", "acquired")],
    );
    assert_eq!(acquired.len(), 2, "{acquired:?}");
    // The waiter waited for the release, 50 ms after it started.
    assert!(acquired.iter().any(|&s| s >= 0.04), "{acquired:?}");
    let timeouts = histogram(
        "mongolock_acquire_wait_seconds",
        &[("lock", "metrics:acquire"), ("outcome", "timeout")],
    );
    assert_eq!(timeouts.len(), 2, "{timeouts:?}");
    assert!(timeouts.iter().any(|&s| s >= 0.025), "{timeouts:?}");
    let holds = histogram(
        "mongolock_hold_seconds",
        &[("lock", "metrics:acquire"), ("outcome", "released")],
    );
    assert_eq!(holds.len(), 2, "{holds:?}");
    assert!(holds.iter().any(|&s| s >= 0.04), "{holds:?}");
    assert_eq!(
        counter(
            "mongolock_lost_total",
            &[("lock", "metrics:acquire"), ("reason", "taken")]
        ),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_records_its_hold_time() {
    let provider = provider();
    let guard = provider
        .lock("metrics:drop")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    drop(guard);
    let l = [("lock", "metrics:drop"), ("outcome", "released")];
    assert_eq!(histogram("mongolock_hold_seconds", &l).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_is_recorded_as_cancelled() {
    let provider = provider();
    let lock = provider.lock("metrics:cancel").unwrap();
    let held = lock.acquire().await.unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(30), lock.acquire()).await;
    assert!(gave_up.is_err());
    held.release().await.unwrap();
    let l = [("lock", "metrics:cancel"), ("outcome", "cancelled")];
    assert_eq!(histogram("mongolock_acquire_wait_seconds", &l).len(), 1);
    assert_eq!(
        counter("mongolock_contended_total", &[("lock", "metrics:cancel")]),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losses_are_counted_by_reason() {
    let provider = provider();
    // Taken: a force-release, which the memory backend reports to the holder at once.
    let guard = provider
        .lock("metrics:taken")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(provider.force_release("metrics:taken").await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    assert!(guard.is_lost());
    drop(guard);
    let taken = [("lock", "metrics:taken"), ("reason", "taken")];
    // The guard's background tasks record the loss.
    assert!(
        eventually(Duration::from_secs(5), || async {
            counter("mongolock_lost_total", &taken) == 1
        })
        .await
    );
    let lost = [("lock", "metrics:taken"), ("outcome", "lost")];
    assert_eq!(histogram("mongolock_hold_seconds", &lost).len(), 1);
    let released = [("lock", "metrics:taken"), ("outcome", "released")];
    assert!(histogram("mongolock_hold_seconds", &released).is_empty());

    // Deadline: a short lease (the shortest accepted) without automatic extension runs out.
    let provider = LockProvider::builder(MemoryBackend::new())
        .auto_extend(false)
        .build()
        .unwrap();
    let guard = provider
        .lock("metrics:deadline")
        .unwrap()
        .with_expiry(mongolock::MIN_EXPIRY)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    let deadline = [("lock", "metrics:deadline"), ("reason", "deadline")];
    assert_eq!(counter("mongolock_lost_total", &deadline), 1);

    // Expired: an extension that finds the lease gone (taken over after it expired).
    let provider = LockProvider::builder(MemoryBackend::new())
        .auto_extend(false)
        .build()
        .unwrap();
    let lock = provider
        .lock("metrics:expired")
        .unwrap()
        .with_expiry(Duration::from_millis(200))
        .unwrap();
    let guard = lock.acquire().await.unwrap();
    // Ended at the server without a notification reaching the guard first: force-release, then
    // extend at once (the memory backend's notification and the extension race; either reason
    // is a loss, counted once).
    assert!(provider.force_release("metrics:expired").await.unwrap());
    assert!(!guard.extend(Duration::from_millis(200)).await.unwrap());
    let expired = counter(
        "mongolock_lost_total",
        &[("lock", "metrics:expired"), ("reason", "expired")],
    );
    let taken = counter(
        "mongolock_lost_total",
        &[("lock", "metrics:expired"), ("reason", "taken")],
    );
    assert_eq!(expired + taken, 1);
}

/// A memory backend whose extensions fail while `fail_extend` is set.
struct FailingExtend {
    inner: MemoryBackend,
    fail_extend: AtomicBool,
}

#[async_trait]
impl LockBackend for FailingExtend {
    async fn try_acquire(&self, req: &AcquireRequest) -> mongolock::Result<Attempt> {
        self.inner.try_acquire(req).await
    }
    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> mongolock::Result<Option<SystemTime>> {
        if self.fail_extend.load(Ordering::SeqCst) {
            return Err(Error::unavailable("injected extension failure"));
        }
        self.inner.extend(name, lease_id, ttl).await
    }
    async fn release(&self, name: &str, lease_id: &LeaseId) -> mongolock::Result<bool> {
        self.inner.release(name, lease_id).await
    }
    async fn inspect(&self, name: &str) -> mongolock::Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
    async fn list(&self) -> mongolock::Result<Vec<LockInfo>> {
        self.inner.list().await
    }
    async fn force_release(&self, name: &str) -> mongolock::Result<bool> {
        self.inner.force_release(name).await
    }
    fn notifications(&self) -> Option<&dyn ChangeNotifications> {
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_failures_are_counted_and_end_in_a_deadline_loss() {
    snapshotter();
    let backend = Arc::new(FailingExtend {
        inner: MemoryBackend::new(),
        fail_extend: AtomicBool::new(true),
    });
    let provider = LockProvider::builder_shared(backend)
        .expiry(Duration::from_millis(300))
        .extension_cadence(Duration::from_millis(50))
        .build()
        .unwrap();
    let guard = provider
        .lock("metrics:extend")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    let failures = counter(
        "mongolock_extension_failures_total",
        &[("lock", "metrics:extend")],
    );
    assert!(failures >= 1, "{failures}");
    let deadline = [("lock", "metrics:extend"), ("reason", "deadline")];
    assert_eq!(counter("mongolock_lost_total", &deadline), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_mapping_bounds_cardinality() {
    snapshotter();
    let provider = LockProvider::builder(MemoryBackend::new())
        .metrics_labels(MetricsLabels::Prefix(':'))
        .build()
        .unwrap();
    for id in 0..3 {
        let guard = provider
            .lock(format!("mapped:{id}"))
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
    assert_eq!(
        counter("mongolock_acquisitions_total", &[("lock", "mapped")]),
        3
    );
    assert_eq!(
        counter("mongolock_acquisitions_total", &[("lock", "mapped:0")]),
        0
    );
    let holds = [("lock", "mapped"), ("outcome", "released")];
    assert_eq!(histogram("mongolock_hold_seconds", &holds).len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_sets_the_leader_gauge() {
    let provider = provider();
    let election = provider.election("metrics-role").unwrap();
    let role = [("role", "metrics-role")];
    let leadership = election.campaign().await.unwrap();
    assert_eq!(gauge("mongolock_is_leader", &role), Some(1.0));
    leadership.resign().await.unwrap();
    assert_eq!(gauge("mongolock_is_leader", &role), Some(0.0));

    // Lost leadership also clears it.
    let leadership = election.campaign().await.unwrap();
    assert_eq!(gauge("mongolock_is_leader", &role), Some(1.0));
    assert!(provider.force_release("metrics-role").await.unwrap());
    leadership.lost().await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            gauge("mongolock_is_leader", &role) == Some(0.0)
        })
        .await
    );
    drop(leadership);
    assert_eq!(gauge("mongolock_is_leader", &role), Some(0.0));
}
