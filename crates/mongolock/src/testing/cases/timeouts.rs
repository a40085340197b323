//! Contract cases of acquire timeouts: zero is one attempt, a finite timeout ends on time, no
//! timeout waits until the holder releases; a lock's own lease duration (`with_expiry`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::testing::{builder, provider, unique_name, Counting};
use crate::{LockBackend, WaitStrategy};

/// A zero timeout makes exactly one attempt, in every API form.
pub async fn timeout_zero_is_one_attempt(backend: Arc<dyn LockBackend>) {
    let name = unique_name("zero");
    let holder = provider(&backend);
    let g = holder.lock(name.clone()).unwrap().acquire().await.unwrap();
    let counting = Counting::new(backend.clone());
    let p = builder(&(counting.clone() as Arc<dyn LockBackend>))
        .build()
        .unwrap();
    let lock = p.lock(name.clone()).unwrap();

    assert!(lock.try_acquire().await.unwrap().is_none());
    assert_eq!(counting.acquires.swap(0, Ordering::SeqCst), 1);
    assert!(lock
        .acquire_timeout(Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    assert_eq!(counting.acquires.swap(0, Ordering::SeqCst), 1);
    assert!(p
        .lock(name.clone())
        .unwrap()
        .with_expiry(Duration::from_secs(5))
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert_eq!(counting.acquires.swap(0, Ordering::SeqCst), 1);

    g.release().await.unwrap();
    let mine = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("free lock is taken in one attempt");
    assert_eq!(counting.acquires.load(Ordering::SeqCst), 1);
    mine.release().await.unwrap();
}

/// A finite timeout returns `None` once it elapsed (not much earlier, not much later).
pub async fn timeout_finite_returns_none_on_time(backend: Arc<dyn LockBackend>) {
    let name = unique_name("finite");
    let holder = provider(&backend);
    let g = holder.lock(name.clone()).unwrap().acquire().await.unwrap();
    for strategy in [WaitStrategy::default(), WaitStrategy::exponential()] {
        let p = builder(&backend).wait_strategy(strategy).build().unwrap();
        let started = Instant::now();
        let got = p
            .lock(name.clone())
            .unwrap()
            .acquire_timeout(Duration::from_millis(700))
            .await
            .unwrap();
        let elapsed = started.elapsed();
        assert!(got.is_none());
        assert!(
            elapsed >= Duration::from_millis(690),
            "returned early: {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_secs(5),
            "returned late: {elapsed:?}"
        );
    }
    assert!(!g.is_lost());
    g.release().await.unwrap();
}

/// Without a timeout, acquire waits until the holder releases (both API forms).
pub async fn timeout_forever_waits_until_released(backend: Arc<dyn LockBackend>) {
    let name = unique_name("forever");
    let p = provider(&backend);
    for form in 0..2 {
        let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
        let released = Arc::new(AtomicBool::new(false));
        let waiter = {
            let p = p.clone();
            let name = name.clone();
            let released = released.clone();
            tokio::spawn(async move {
                let got = if form == 0 {
                    p.lock(name).unwrap().acquire().await.unwrap()
                } else {
                    p.lock(name)
                        .unwrap()
                        .with_expiry(Duration::from_secs(5))
                        .unwrap()
                        .acquire()
                        .await
                        .unwrap()
                };
                assert!(
                    released.load(Ordering::SeqCst),
                    "acquired before the release"
                );
                got
            })
        };
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!waiter.is_finished());
        let first = g.fencing_token();
        released.store(true, Ordering::SeqCst);
        g.release().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("waiter acquires after release")
            .unwrap();
        assert!(got.fencing_token() > first);
        got.release().await.unwrap();
    }
}

/// A lock's own lease duration (`provider.lock(name)?.with_expiry(ttl)`), with each acquire
/// form.
pub async fn with_expiry_sets_the_lease_duration(backend: Arc<dyn LockBackend>) {
    let key = unique_name("door:front");
    let p = provider(&backend);
    let lock = p
        .lock(key.clone())
        .unwrap()
        .with_expiry(Duration::from_secs(30))
        .unwrap();
    assert_eq!(lock.expiry(), Duration::from_secs(30));
    let g = lock.try_acquire().await.unwrap().expect("free");
    let ttl = g.expires_at().duration_since(g.acquired_at()).unwrap();
    assert!(
        ttl >= Duration::from_millis(29_990) && ttl <= Duration::from_millis(30_010),
        "{key}: a 30 s lease lasts {ttl:?} by server time"
    );
    let none = lock
        .acquire_timeout(Duration::from_millis(200))
        .await
        .unwrap();
    assert!(
        none.is_none(),
        "{key}: held, so acquire_timeout returns None"
    );
    g.release().await.unwrap();
    let again = p
        .lock(key.clone())
        .unwrap()
        .with_expiry(Duration::from_secs(1))
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free again");
    let ttl = again
        .expires_at()
        .duration_since(again.acquired_at())
        .unwrap();
    assert!(
        ttl >= Duration::from_millis(990) && ttl <= Duration::from_millis(1_010),
        "{key}: a 1 s lease lasts {ttl:?} by server time"
    );
    again.release().await.unwrap();
}
