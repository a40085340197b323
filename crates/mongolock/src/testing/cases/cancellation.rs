//! Contract cases of calls that give up: acquire futures dropped at random moments, and an
//! attempt whose reply was lost, released when its call ends without a lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

use crate::testing::harness::{drop_acquires_at_random, is_held};
use crate::testing::wrappers::LosesReplies;
use crate::testing::{builder, eventually, unique_name};
use crate::{LockBackend, LockProvider};

/// Dropping acquire futures at random moments, hundreds of times, leaves no lease held.
pub async fn dropped_acquire_futures_leave_nothing_held(backend: Arc<dyn LockBackend>) {
    let name = unique_name("dropped");
    // A long expiry: the lock must end up free because leases were released, not expired.
    let p = builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Background contention: a holder that takes and releases the lock repeatedly.
    let churn = {
        let lock = p.lock(name.clone()).unwrap();
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(g) = lock
                    .acquire_timeout(Duration::from_millis(50))
                    .await
                    .unwrap()
                {
                    let hold = rand::rng().random_range(0..3);
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    g.release().await.unwrap();
                }
            }
        })
    };
    let lock = p.lock(name.clone()).unwrap();
    let completed = drop_acquires_at_random(300, || lock.acquire()).await;
    stop.store(true, Ordering::SeqCst);
    churn.await.unwrap();
    let free = eventually(Duration::from_secs(20), || async {
        !is_held(&backend, &name).await
    })
    .await;
    assert!(
        free,
        "a lease is still held after all acquire futures and guards were dropped"
    );
    eprintln!("{completed} of 300 acquire futures completed before being dropped");
}

/// An acquire call that ends without a lease after an attempt whose reply was lost — by
/// returning the error, by its timeout, or by being dropped — releases the grant it may have
/// left, so the name is free again long before the lease could expire.
pub async fn a_lost_grant_is_released_when_the_call_gives_up(backend: Arc<dyn LockBackend>) {
    let lossy = Arc::new(LosesReplies {
        inner: backend.clone(),
        lose: AtomicBool::new(true),
    });
    let p = LockProvider::builder_shared(lossy)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    for form in ["try_acquire", "acquire_timeout", "dropped"] {
        let name = unique_name(form);
        let lock = p.lock(name.clone()).unwrap();
        match form {
            "try_acquire" => {
                let err = lock.try_acquire().await.unwrap_err();
                assert!(err.is_transient(), "{err}");
            }
            "acquire_timeout" => {
                let err = lock
                    .acquire_timeout(Duration::from_millis(300))
                    .await
                    .unwrap_err();
                assert!(err.is_transient(), "{err}");
            }
            _ => {
                // Dropped while retrying.
                let r = tokio::time::timeout(Duration::from_millis(300), lock.acquire()).await;
                assert!(r.is_err(), "acquire cannot succeed while replies are lost");
            }
        }
        let info = backend.inspect(&name).await.unwrap();
        let freed = eventually(Duration::from_secs(30), || async {
            !backend.inspect(&name).await.unwrap().unwrap().held
        })
        .await;
        assert!(freed, "{form}: {name} still held (first read {info:?})");
    }
}
