//! Several OS processes contending for one lock on MongoDB, and a holder killed with SIGKILL
//! (the shared harness in `support/contention.rs`, which `postgres/processes.rs` runs on
//! PostgreSQL).

use crate::support::contention;
use crate::support::mongo;

use std::sync::Arc;

use contention::{env, Setup};
use mongo::{test_database, unique, TestDb};
use mongolock::{LockBackend, MongoBackend};

/// The helpers' backend, from the variables of [`setup`].
async fn child_backend() -> Arc<dyn LockBackend> {
    let client = mongo::client(&env("MONGOLOCK_URI"), Some("mongolock-child")).await;
    let db = client.database(&env("MONGOLOCK_DB"));
    let backend = MongoBackend::builder(&db)
        .collection(env("MONGOLOCK_COLL"))
        .build()
        .unwrap();
    Arc::new(backend)
}

/// Entry point of the helper processes; a no-op in a normal test run.
#[test]
fn child_entry() {
    contention::child_entry(child_backend);
}

/// A test database (kept alive by the caller) and a fresh collection in it.
async fn setup() -> (TestDb, String, Setup) {
    let t = test_database().await;
    let coll = unique("locks");
    let setup = Setup {
        env: vec![
            ("MONGOLOCK_URI", t.uri.clone()),
            ("MONGOLOCK_DB", t.db.name().to_owned()),
            ("MONGOLOCK_COLL", coll.clone()),
        ],
        label: format!("collection {coll}"),
    };
    (t, coll, setup)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_contend_without_overlap() {
    let (_t, _, setup) = setup().await;
    contention::four_processes_contend_without_overlap(&setup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_replaced_only_after_its_lease_expires() {
    let (t, coll, setup) = setup().await;
    let backend = MongoBackend::builder(&t.db)
        .collection(coll)
        .build()
        .unwrap();
    contention::a_killed_holder_is_replaced_only_after_its_lease_expires(&setup, Arc::new(backend))
        .await;
}
