//! The contract suite against the in-memory backend, and what the memory backend adds.

use std::sync::Arc;

use mongolock::testing::Env;
use mongolock::MemoryBackend;

async fn setup() -> Env {
    Env::new(Arc::new(MemoryBackend::new()))
        .with_notifications()
        .without_background_tasks()
}

mongolock::contract_suite!(setup);

/// A release repeated after its first call was applied (a retry after a lost reply) reports
/// success even when more than 8 other leases of the name were released in between (a hot
/// lock): released ids are kept by time, not only the last few.
#[tokio::test]
async fn a_release_repeated_after_many_other_releases_reports_success() {
    use mongolock::{AcquireRequest, Attempt, HolderInfo, LeaseId, LeaseMode, LockBackend};
    let b = MemoryBackend::new();
    let grant = |lease_id: LeaseId| {
        let b = b.clone();
        async move {
            let req = AcquireRequest {
                name: "hot".into(),
                lease_id,
                ttl: std::time::Duration::from_secs(60),
                holder: HolderInfo::current(None),
                mode: LeaseMode::Exclusive,
            };
            assert!(matches!(
                b.try_acquire(&req).await.unwrap(),
                Attempt::Acquired(_)
            ));
        }
    };
    let first = LeaseId::random();
    grant(first.clone()).await;
    assert!(b.release("hot", &first).await.unwrap());
    for _ in 0..12 {
        let other = LeaseId::random();
        grant(other.clone()).await;
        assert!(b.release("hot", &other).await.unwrap());
    }
    assert!(
        b.release("hot", &first).await.unwrap(),
        "a release repeated after 12 other releases reported the lease lost"
    );
    // A lease someone else ended still reports `false`.
    let taken = LeaseId::random();
    grant(taken.clone()).await;
    assert!(b.force_release("hot").await.unwrap());
    assert!(!b.release("hot", &taken).await.unwrap());
}
