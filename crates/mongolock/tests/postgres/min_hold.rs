//! The minimum hold (`LockGuard::release_after`) with the waiter in another "process": each
//! backend on the same table has its own listening connection and mark, as a separate process
//! would. The waiter polls only every 45-50 s, so only the notification of the hold's write gets
//! it the name soon after the hold (its lease's TTL is 60 s). The contract suite runs the same
//! scenario with both on one backend; `mongo/min_hold.rs` runs it on MongoDB.

use std::sync::Arc;

use mongolock::testing::min_hold_frees_the_name_for_a_waiter_of_another_backend as scenario;
use mongolock::{LockBackend, LockBackendExt, PostgresBackend};

use crate::support::postgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_of_another_process_gets_the_name_after_the_hold() {
    let Some(url) = postgres::url() else {
        return;
    };
    let table = postgres::unique_table("minhold");
    let mut backends = Vec::new();
    for _ in 0..2 {
        let b = PostgresBackend::builder(&url)
            .table(&table)
            .build()
            .expect("valid options");
        b.migrate().await.expect("migrate");
        backends.push(b);
    }
    for b in &backends {
        let live = mongolock::testing::eventually(std::time::Duration::from_secs(20), || async {
            b.live_notifications()
        })
        .await;
        assert!(live, "the listening connection never came up");
    }
    let holder: Arc<dyn LockBackend> = Arc::new(backends[0].clone());
    let waiter: Arc<dyn LockBackend> = Arc::new(backends[1].clone());
    scenario(holder, waiter, true).await;
}
