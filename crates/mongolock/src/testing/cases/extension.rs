//! Contract cases of lease extension: `extend(ttl)` semantics and the automatic extension that
//! keeps others out while a guard is held.

use std::sync::Arc;
use std::time::Duration;

use crate::testing::harness::is_held;
use crate::testing::{builder, eventually, provider, unique_name};
use crate::LockBackend;

/// extend(ttl) sets expiry to server now + ttl; on an expired lease the backend refuses and the
/// guard reports the loss.
pub async fn extend_semantics(backend: Arc<dyn LockBackend>) {
    let name = unique_name("extend");
    let p = builder(&backend)
        .auto_extend(false)
        .expiry(Duration::from_secs(2))
        .build()
        .unwrap();
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let first_expiry = g.expires_at();
    let first_deadline = g.local_deadline();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(g.extend(Duration::from_secs(10)).await.unwrap());
    assert!(g.expires_at() >= first_expiry + Duration::from_secs(7));
    assert!(g.local_deadline() > first_deadline);
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert_eq!(info.expires_at, Some(g.expires_at()));
    // Resets rather than adds: a shorter ttl moves the expiry earlier.
    assert!(g.extend(Duration::from_millis(300)).await.unwrap());
    assert!(g.expires_at() < first_expiry);
    // Let it expire: the lost signal fires, extend returns false.
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost fires after the lease ran out");
    assert!(g.is_lost());
    assert!(!g.extend(Duration::from_secs(5)).await.unwrap());
    // The backend itself refuses to extend an expired lease, even if nobody took the name.
    assert!(
        eventually(Duration::from_secs(5), || async {
            !is_held(&backend, &name).await
        })
        .await
    );
    assert_eq!(
        backend
            .extend(&name, g.lease_id(), Duration::from_secs(5))
            .await
            .unwrap(),
        None
    );
    assert!(!is_held(&backend, &name).await);
    drop(g);
}

/// Holding for three times the expiry keeps everyone else out (automatic extension).
pub async fn auto_extension_keeps_others_out(backend: Arc<dyn LockBackend>) {
    let name = unique_name("autoextend");
    let p = builder(&backend)
        .expiry(Duration::from_secs(1))
        .build()
        .unwrap();
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let first_expiry = g.expires_at();
    let other = provider(&backend);
    let got = other
        .lock(name.clone())
        .unwrap()
        .acquire_timeout(Duration::from_secs(3))
        .await
        .unwrap();
    assert!(
        got.is_none(),
        "another holder got in while the lease was being extended"
    );
    assert!(!g.is_lost());
    assert!(g.expires_at() > first_expiry + Duration::from_secs(1));
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert!(info.held);
    assert_eq!(info.lease_id.as_ref(), Some(g.lease_id()));
    assert_eq!(info.fencing_token, Some(g.fencing_token()));
    g.release().await.unwrap();
}
