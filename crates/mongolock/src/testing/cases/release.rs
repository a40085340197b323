//! Contract cases of ending a lease: ownership checks, force-release, release on drop (of a guard
//! or of a release future) and idempotent release by the owner.

use std::sync::Arc;
use std::time::Duration;

use crate::testing::harness::is_held;
use crate::testing::{builder, eventually, provider, unique_name};
use crate::{AcquireRequest, Attempt, Error, LeaseId, LockBackend};

/// Release and extend act only on the caller's own lease.
pub async fn release_checks_ownership(backend: Arc<dyn LockBackend>) {
    let name = unique_name("owner");
    let p = provider(&backend);
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let stranger = LeaseId::random();
    assert!(!backend.release(&name, &stranger).await.unwrap());
    assert_eq!(
        backend
            .extend(&name, &stranger, Duration::from_secs(60))
            .await
            .unwrap(),
        None
    );
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert!(info.held);
    assert_eq!(info.lease_id.as_ref(), Some(g.lease_id()));
    assert!(!backend
        .release("no-such-lock-xyz", &stranger)
        .await
        .unwrap());
    g.release().await.unwrap();
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert!(!info.held);
    assert_eq!(info.lease_id, None);
}

/// force_release ends a live lease; the holder's guard learns of it at its next extension.
pub async fn force_release_ends_the_lease_and_signals_loss(backend: Arc<dyn LockBackend>) {
    let name = unique_name("force");
    let p = builder(&backend)
        .expiry(Duration::from_secs(3))
        .extension_cadence(Duration::from_millis(200))
        .build()
        .unwrap();
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let lost = g.lost();
    assert!(!lost.is_lost());
    assert!(p.force_release(&name).await.unwrap());
    assert!(
        !p.force_release(&name).await.unwrap(),
        "nothing left to end"
    );
    tokio::time::timeout(Duration::from_secs(5), lost.clone())
        .await
        .expect("lost fires after force-release");
    assert!(lost.is_lost() && g.is_lost());
    let next = p
        .lock(name.clone())
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(next.fencing_token() > g.fencing_token());
    assert!(matches!(g.release().await, Err(Error::LeaseLost { .. })));
    next.release().await.unwrap();
}

/// Dropping a guard releases its lease in the background and completes its lost signal.
pub async fn dropping_a_guard_releases(backend: Arc<dyn LockBackend>) {
    let name = unique_name("drop");
    let p = builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let lost = g.lost();
    drop(g);
    tokio::time::timeout(Duration::from_secs(5), lost.clone())
        .await
        .expect("the signal completes when the guard is dropped");
    assert!(!lost.is_lost(), "a dropped guard is not a lost lease");
    assert!(
        eventually(Duration::from_secs(10), || async {
            !is_held(&backend, &name).await
        })
        .await
    );
}

/// A `release()` future dropped before it completes (after one poll, so the release has
/// started) still ends the lease: nothing stays held until expiry.
pub async fn dropping_a_release_future_still_releases(backend: Arc<dyn LockBackend>) {
    let name = unique_name("drop-release");
    let p = builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    for _ in 0..20 {
        let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
        let mut release = Box::pin(g.release());
        // Poll once, then drop the future mid-way.
        let _ = futures_util::poll!(&mut release);
        drop(release);
        assert!(
            eventually(Duration::from_secs(10), || async {
                !is_held(&backend, &name).await
            })
            .await,
            "a dropped release future left the lease held"
        );
    }
}

/// A repeated release by the owner (a retry after a lost reply) reports success; a lease that
/// someone else ended (force-release, expiry and takeover) reports false.
pub async fn release_is_idempotent_for_the_owner(backend: Arc<dyn LockBackend>) {
    let name = unique_name("idempotent");
    let request = |lease_id: &LeaseId, ttl: Duration| AcquireRequest {
        mode: crate::LeaseMode::Exclusive,
        name: name.clone(),
        lease_id: lease_id.clone(),
        ttl,
        holder: crate::HolderInfo::current(None),
    };
    let granted = |a: Attempt| matches!(a, Attempt::Acquired(_));
    let long = Duration::from_secs(60);

    let first = LeaseId::random();
    assert!(granted(
        backend.try_acquire(&request(&first, long)).await.unwrap()
    ));
    assert!(backend.release(&name, &first).await.unwrap());
    assert!(
        backend.release(&name, &first).await.unwrap(),
        "a repeated release by the owner reports success"
    );
    assert!(!backend.inspect(&name).await.unwrap().unwrap().held);

    // Still recognised after another holder took and released the name...
    let second = LeaseId::random();
    assert!(granted(
        backend.try_acquire(&request(&second, long)).await.unwrap()
    ));
    assert!(backend.release(&name, &second).await.unwrap());
    assert!(backend.release(&name, &first).await.unwrap());
    // ...and a repeated release never touches the current holder's lease.
    let third = LeaseId::random();
    assert!(granted(
        backend.try_acquire(&request(&third, long)).await.unwrap()
    ));
    assert!(backend.release(&name, &first).await.unwrap());
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert!(
        info.held && info.lease_id.as_ref() == Some(&third),
        "{info:?}"
    );

    // Force-released: someone else ended it.
    assert!(backend.force_release(&name).await.unwrap());
    assert!(!backend.release(&name, &third).await.unwrap());

    // Expired and taken over: someone else took it.
    let short = LeaseId::random();
    assert!(granted(
        backend
            .try_acquire(&request(&short, Duration::from_millis(200)))
            .await
            .unwrap()
    ));
    let taker = LeaseId::random();
    let took = eventually(Duration::from_secs(30), || async {
        granted(backend.try_acquire(&request(&taker, long)).await.unwrap())
    })
    .await;
    assert!(took, "the expired lease of {name} was never taken over");
    assert!(!backend.release(&name, &short).await.unwrap());
    assert!(backend.release(&name, &taker).await.unwrap());
}
