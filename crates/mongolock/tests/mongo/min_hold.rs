//! The minimum hold (`LockGuard::release_after`) with the waiter in another "process": each
//! backend on the same storage has its own change stream and mark, as a separate process would.
//! The waiter polls only every 45-50 s, so only the notification of the hold's write gets it the
//! name soon after the hold (its lease's TTL is 60 s). The contract suite runs the same scenario
//! with both on one backend; `postgres/min_hold.rs` runs it on PostgreSQL.

use std::sync::Arc;

use mongo_testserver::TestServer;
use mongolock::testing::min_hold_frees_the_name_for_a_waiter_of_another_backend as scenario;
use mongolock::{LockBackend, MongoBackend};

use crate::support::mongo::{test_database_with, unique, TestDb};

fn backend(t: &TestDb, collection: &str, fair: bool) -> Arc<dyn LockBackend> {
    Arc::new(
        MongoBackend::builder(&t.db)
            .collection(collection)
            .fair_handoff(fair)
            .build()
            .expect("valid collection name"),
    )
}

async fn run(builder: mongo_testserver::Builder, fair: bool) {
    let t = test_database_with(builder).await;
    if t.server.is_none() {
        // A deployment given by MONGODB_URI may be a standalone server (no change
        // streams): the waiter would poll.
        eprintln!("skipped: needs the embedded server's change streams");
        return;
    }
    let coll = unique("locks");
    scenario(backend(&t, &coll, fair), backend(&t, &coll, fair), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_of_another_process_gets_the_name_after_the_hold() {
    run(TestServer::builder(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_of_another_process_with_fair_handoff() {
    run(TestServer::builder(), true).await;
}

/// MongoDB 4.4 reports pipeline updates as replace events with the whole document.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_mongodb_4_4_replace_events() {
    run(
        TestServer::builder().pipeline_updates_as_replace(true),
        false,
    )
    .await;
}
