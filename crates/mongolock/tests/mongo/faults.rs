//! Injected faults on the extension writes (the `failCommand` fail point, aimed at the lock
//! client by its `appName`): the lost signal fires no later than the lease's local deadline,
//! and extend then returns false. Runs against the embedded mongo-testserver, or against
//! `MONGODB_URI` when `MONGODB_FAILPOINTS=1` says the deployment enables test commands.

use crate::support::mongo;

use std::time::Duration;

use mongo::{test_database, unique, TestDb};
use mongodb::bson::{doc, Document};
use mongolock::{LockProvider, MongoBackend};
use tokio::time::Instant;

const EXPIRY: Duration = Duration::from_secs(2);
/// Scheduling slack for "no later than the deadline" (the deadline itself is 1 % early).
const SLACK: Duration = Duration::from_millis(300);

async fn setup(t: &TestDb, app: &str) -> (LockProvider, String) {
    let db = t.database_as(app).await;
    let coll = unique("locks");
    let backend = MongoBackend::builder(&db)
        .collection(coll.clone())
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend)
        .expiry(EXPIRY)
        .extension_cadence(Duration::from_millis(300))
        .build()
        .unwrap();
    (provider, coll)
}

/// Acquires, turns the fault on, and checks that the lost signal fires by the deadline.
async fn lost_by_the_deadline(fault: Document) {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("faults");
    let (provider, coll) = setup(&t, &app).await;
    let name = unique("fragile");
    let guard = provider
        .lock(name.clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let mut data = doc! { "failCommands": ["findAndModify", "update"], "appName": app.as_str() };
    data.extend(fault);
    t.fail_point("alwaysOn".into(), data).await;
    // Every extension that succeeded was sent before this instant, so the local deadline is at
    // most `EXPIRY` after it.
    let fault_on = Instant::now();
    tokio::time::timeout_at(fault_on + EXPIRY + SLACK, guard.lost())
        .await
        .expect("the lost signal fires no later than the local deadline");
    let fired = Instant::now();
    assert!(guard.is_lost());
    assert!(
        fired + SLACK >= guard.local_deadline(),
        "lost fired {:?} before the deadline",
        guard.local_deadline() - fired
    );
    assert!(
        !guard.extend(EXPIRY).await.unwrap(),
        "extend returns false once lost"
    );
    t.fail_point_off().await;

    // Someone else gets the lock after the lease expired, with a larger token.
    let other = LockProvider::builder(
        MongoBackend::builder(&t.db)
            .collection(coll)
            .build()
            .unwrap(),
    )
    .build()
    .unwrap();
    let next = other
        .lock(name)
        .unwrap()
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .expect("free after the lease expired");
    assert!(next.fencing_token() > guard.fencing_token());
    assert!(next.acquired_at() >= guard.expires_at());
    drop(guard);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_by_the_deadline_when_extensions_fail() {
    // 91 = ShutdownInProgress: a transient error, retried until the deadline.
    lost_by_the_deadline(doc! { "errorCode": 91 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_by_the_deadline_when_connections_close() {
    lost_by_the_deadline(doc! { "closeConnection": true }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_by_the_deadline_when_extensions_hang() {
    // The server holds each extension for 10 s: longer than the whole lease.
    lost_by_the_deadline(doc! { "blockConnection": true, "blockTimeMS": 10_000 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_by_the_deadline_on_permanent_errors() {
    // 13 = Unauthorized: not transient, but renewal still keeps trying until the deadline.
    lost_by_the_deadline(doc! { "errorCode": 13 }).await;
}

/// A short burst of failed extensions that ends before the deadline does not lose the lock.
async fn survives(mode: mongodb::bson::Bson, fault: Document) {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("outage");
    let (provider, _) = setup(&t, &app).await;
    let guard = provider.lock("steady").unwrap().acquire().await.unwrap();
    let mut data = doc! { "failCommands": ["findAndModify"], "appName": app.as_str() };
    data.extend(fault);
    t.fail_point(mode, data).await;
    tokio::time::sleep(EXPIRY * 2).await;
    t.fail_point_off().await;
    assert!(!guard.is_lost(), "a brief outage must not lose the lease");
    assert!(guard.extend(EXPIRY).await.unwrap());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_transient_errors_is_survived() {
    // Six failures: the driver's own retry absorbs one per command, the renewal loop the rest.
    survives(doc! { "times": 6 }.into(), doc! { "errorCode": 91 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_is_survived() {
    survives(doc! { "times": 1 }.into(), doc! { "closeConnection": true }).await;
}
