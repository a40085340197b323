//! Deployments that behave differently where mongolock depends on them, emulated by the
//! embedded test server (each test skips against `MONGODB_URI`, which is one deployment).

use crate::support::mongo;

use std::time::Duration;

use mongo::{test_database_with, unique};
use mongo_testserver::TestServer;
use mongolock::{LockProvider, MongoBackend};
use tokio::time::Instant;

/// MongoDB 4.4 started with `--enableMajorityReadConcern=false` (the usual setting of a
/// primary-secondary-arbiter set) refuses read concern `majority` except on change streams
/// (error 148). Every operation works there: acquisitions, reads for operators, releases, and
/// a handoff between processes woken by the change stream. Before the fallback every
/// acquisition failed with a backend error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_reads_disabled_every_operation_works() {
    let t = test_database_with(TestServer::builder().majority_read_concern(false)).await;
    if t.server.is_none() {
        eprintln!("skipped: needs the embedded server to emulate enableMajorityReadConcern=false");
        return;
    }
    let coll = unique("locks");
    let provider = || {
        LockProvider::builder(
            MongoBackend::builder(&t.db)
                .collection(coll.clone())
                .build()
                .unwrap(),
        )
        .expiry(Duration::from_secs(60))
        .build()
        .unwrap()
    };
    let (a, b) = (provider(), provider());
    let name = unique("psa");
    let guard = a.lock(name.as_str()).unwrap().acquire().await.unwrap();
    let info = a.inspect(&name).await.unwrap().expect("the lock is listed");
    assert!(info.held, "{info:?}");
    assert_eq!(a.list().await.unwrap().len(), 1);
    let lock = b.lock(name.as_str()).unwrap();
    let waiting = tokio::spawn(async move {
        let g = lock
            .acquire_timeout(Duration::from_secs(30))
            .await
            .unwrap()
            .expect("the waiter gets the lock");
        (Instant::now(), g.fencing_token())
    });
    // Let the waiter queue (its stream opens, its attempt is busy).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let released = Instant::now();
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let (got, next) = waiting.await.unwrap();
    eprintln!("handoff with majority reads disabled: {:?}", got - released);
    assert!(next > token);
    // Far below the 60 s lease: a wake-up, or at worst the probe.
    assert!(
        got - released < Duration::from_secs(15),
        "{:?}",
        got - released
    );
}
