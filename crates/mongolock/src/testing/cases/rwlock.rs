//! The contract cases of read-write locks ([`RwLock`](crate::RwLock)), run by every backend
//! through [`contract_suite!`](crate::contract_suite).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::{provider, unique_name};
use crate::LockBackend;

/// 6 reader tasks and 2 writer tasks around shared counters: a writer never overlaps anyone,
/// readers overlap each other, tokens are never repeated.
pub async fn rwlock_readers_overlap_and_a_writer_excludes_everyone(backend: Arc<dyn LockBackend>) {
    let p = provider(&backend);
    let name = unique_name("rw-excl");
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for task in 0..8 {
        let rw = p.rw_lock(name.clone()).unwrap();
        let (readers, writers, most, tokens) = (
            readers.clone(),
            writers.clone(),
            most_readers.clone(),
            tokens.clone(),
        );
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..8 {
                if task < 2 {
                    let g = rw.write().await.expect("write");
                    let w = writers.fetch_add(1, Ordering::SeqCst);
                    let r = readers.load(Ordering::SeqCst);
                    assert!(
                        w == 0 && r == 0,
                        "{name}: writer (task {task}, round {round}, token {}) entered with {w} \
                         writers and {r} readers inside",
                        g.fencing_token()
                    );
                    tokens.lock().unwrap().push(g.fencing_token());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    writers.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release write");
                } else {
                    let g = rw.read().await.expect("read");
                    let r = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(r, Ordering::SeqCst);
                    let w = writers.load(Ordering::SeqCst);
                    assert!(
                        w == 0,
                        "{name}: reader (task {task}, round {round}, token {}) entered with a \
                         writer inside",
                        g.fencing_token()
                    );
                    tokens.lock().unwrap().push(g.fencing_token());
                    let hold = rand::rng().random_range(1..6);
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release read");
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .unwrap_or_else(|_| panic!("{name}: the tasks did not finish within 120 s"))
            .expect("task");
    }
    let mut all = tokens.lock().unwrap().clone();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "{name}: repeated fencing tokens");
    // Two readers held together at least once (without a writer between them).
    let rw = p.rw_lock(name.clone()).unwrap();
    let a = rw.read().await.unwrap();
    let b = rw
        .try_read()
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: a second reader was refused"));
    assert!(
        rw.try_write().await.unwrap().is_none(),
        "{name}: a writer joined readers"
    );
    a.release().await.unwrap();
    b.release().await.unwrap();
    eprintln!(
        "{name}: at most {} readers at once in the mixed run",
        most_readers.load(Ordering::SeqCst)
    );
}

/// Readers and writers draw from one token sequence.
pub async fn rwlock_tokens_are_shared_by_readers_and_writers(backend: Arc<dyn LockBackend>) {
    let p = provider(&backend);
    let name = unique_name("rw-tokens");
    let rw = p.rw_lock(name.clone()).unwrap();
    let r1 = rw.read().await.unwrap();
    let r2 = rw.read().await.unwrap();
    let (t1, t2) = (r1.fencing_token(), r2.fencing_token());
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = rw.write().await.unwrap();
    let tw = w.fencing_token();
    assert!(
        t1 < t2 && t2 < tw,
        "{name}: tokens {t1}, {t2}, then writer {tw}"
    );
    assert!(
        rw.try_read().await.unwrap().is_none(),
        "{name}: a reader joined a writer"
    );
    w.release().await.unwrap();
    let r3 = rw.read().await.unwrap();
    assert!(
        r3.fencing_token() > tw,
        "{name}: reader {} after writer {tw}",
        r3.fencing_token()
    );
    r3.release().await.unwrap();
}

/// A continuous stream of overlapping readers does not starve a writer: it gets the lock within
/// 30 s (generous: it needs only the readers already in to finish, a few milliseconds each).
pub async fn rwlock_a_waiting_writer_is_not_starved(backend: Arc<dyn LockBackend>) {
    let p = provider(&backend);
    let name = unique_name("rw-starve");
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let rw = p.rw_lock(name.clone()).unwrap();
        let (stop, reads) = (stop.clone(), reads.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(g) = rw.read_timeout(Duration::from_millis(200)).await.unwrap() {
                    reads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    g.release().await.unwrap();
                }
            }
        }));
    }
    // The readers now overlap: the lock is never free of readers for long.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rw = p.rw_lock(name.clone()).unwrap();
    let started = Instant::now();
    let reads_before = reads.load(Ordering::SeqCst);
    let got = rw.write_timeout(Duration::from_secs(30)).await.unwrap();
    let waited = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let w = got.unwrap_or_else(|| {
        panic!(
            "{name}: the writer was starved for 30 s by a stream of readers ({} reads meanwhile)",
            reads.load(Ordering::SeqCst) - reads_before
        )
    });
    eprintln!("{name}: the writer waited {waited:?} (reads before it: {reads_before})");
    w.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
}

/// Dropping read and write futures at random points (a writer's between its intent and its
/// lock included) never leaves a reader, a writer or an intent held.
pub async fn dropped_rwlock_acquires_leave_nothing_held(backend: Arc<dyn LockBackend>) {
    let name = unique_name("rw-dropped");
    // A long expiry: the lock must end up free because leases were released, not expired.
    let p = super::builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    let rw = p.rw_lock(name.clone()).unwrap();
    // A reader in the background, so that writers wait between their two steps.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (rw, stop) = (rw.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(g) = rw.read_timeout(Duration::from_millis(50)).await.unwrap() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    g.release().await.unwrap();
                }
            }
        })
    };
    for i in 0..150 {
        let micros = rand::rng().random_range(0..5000);
        let limit = Duration::from_micros(micros);
        if i % 2 == 0 {
            if let Ok(g) = tokio::time::timeout(limit, rw.write()).await {
                drop(g.unwrap());
            }
        } else if let Ok(g) = tokio::time::timeout(limit, rw.read()).await {
            drop(g.unwrap());
        }
    }
    stop.store(true, Ordering::SeqCst);
    churn.await.unwrap();
    let free = super::eventually(Duration::from_secs(20), || async {
        match rw.try_write().await.unwrap() {
            Some(g) => {
                g.release().await.unwrap();
                true
            }
            None => false,
        }
    })
    .await;
    assert!(
        free,
        "{name}: a reader, writer or intent is still held after every future was dropped"
    );
}
