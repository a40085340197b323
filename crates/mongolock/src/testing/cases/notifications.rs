//! The change-notification cases (run only for an [`Env`](crate::testing::Env) declared
//! [`with_notifications`](crate::testing::Env::with_notifications)): a force-release signalled
//! to the holder at once, a release waking a waiter at once, handoffs without a stampede.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::testing::harness::{slow_polling, until_live};
use crate::testing::{builder, hand_around, unique_name, CountingAll};
use crate::{LockBackend, LockProvider};

/// A force-release is signalled to the holder at once (its next extension is 20 s away).
pub async fn force_release_is_signalled_to_the_holder_at_once(backend: Arc<dyn LockBackend>) {
    let name = unique_name("forced");
    let p = builder(&backend)
        .expiry(Duration::from_secs(60))
        .build()
        .expect("valid options");
    until_live(&backend).await;
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    assert!(!g.is_lost());
    let forced_at = Instant::now();
    assert!(backend.force_release(&name).await.unwrap());
    let told = tokio::time::timeout(Duration::from_secs(15), g.lost().wait()).await;
    assert!(
        told.is_ok(),
        "{name}: the holder (token {}) was not told of the force-release within 15 s",
        g.fencing_token()
    );
    assert!(g.is_lost(), "{name}: reason {:?}", g.lost_reason());
    eprintln!(
        "{name}: loss signalled {:?} after the force-release",
        forced_at.elapsed()
    );
}

/// A release wakes a waiting acquirer at once (it would otherwise sleep 30-40 s).
pub async fn a_release_wakes_a_waiter_at_once(backend: Arc<dyn LockBackend>) {
    let name = unique_name("wake");
    let p = LockProvider::builder_shared(backend.clone())
        .expiry(Duration::from_secs(60))
        .wait_strategy(slow_polling())
        .build()
        .expect("valid options");
    until_live(&backend).await;
    for round in 0..3 {
        let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
        let token = g.fencing_token();
        let waiter = {
            let (p, name) = (p.clone(), name.clone());
            tokio::spawn(async move {
                p.lock(name)
                    .unwrap()
                    .acquire_timeout(Duration::from_secs(25))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        g.release().await.unwrap();
        let got = waiter.await.unwrap().unwrap();
        let took = released_at.elapsed();
        let got = got.unwrap_or_else(|| {
            panic!("{name} round {round}: the waiter was not woken by the release (token {token})")
        });
        assert!(
            took < Duration::from_secs(15),
            "{name} round {round}: woken {took:?} after the release"
        );
        assert!(got.fencing_token() > token);
        got.release().await.unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Nine tasks of one process (one holder, eight waiters, polling only every 30-40 s) hand one
/// lock around 30 times: each release wakes one waiter at once — not all eight (fewer than six
/// attempts per handoff) — tokens grow in acquisition order and no holder is told its lease is
/// gone while it holds it.
pub async fn handoffs_are_prompt_and_do_not_stampede(backend: Arc<dyn LockBackend>) {
    const WAITERS: usize = 8;
    const HANDOFFS: usize = 30;
    let name = unique_name("handoff");
    until_live(&backend).await;
    let counting = Arc::new(CountingAll {
        inner: backend.clone(),
        acquires: AtomicUsize::new(0),
    });
    let p = LockProvider::builder_shared(counting.clone())
        .wait_strategy(slow_polling())
        .build()
        .expect("valid options");
    let samples = hand_around(&p, &name, WAITERS, HANDOFFS).await;
    let attempts = counting.acquires.load(Ordering::SeqCst);
    let m = median(samples.clone());
    eprintln!(
        "{name}: handoff median {m:?}, max {:?}; {:.1} attempts per handoff",
        samples.iter().max(),
        attempts as f64 / HANDOFFS as f64
    );
    assert!(m < Duration::from_secs(5), "{name}: median handoff {m:?}");
    // A stampede would be at least 8 attempts per release; the first use of a name may add a
    // few.
    assert!(
        attempts < (HANDOFFS + 1) * 6,
        "{name}: {attempts} attempts for {HANDOFFS} handoffs"
    );
}
