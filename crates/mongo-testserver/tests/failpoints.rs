//! The `failCommand` fail point, used exactly as against a mongod with enableTestCommands.

mod common;

use std::time::{Duration, Instant};

use bson::{doc, Document};
use mongo_testserver::TestServer;
use mongodb::Client;

use common::{client, client_named, code};

async fn configure(c: &Client, cmd: Document) -> Document {
    c.database("admin")
        .run_command(cmd)
        .await
        .expect("configureFailPoint")
}

async fn off(c: &Client) {
    configure(c, doc! {"configureFailPoint": "failCommand", "mode": "off"}).await;
}

async fn find_code(c: &Client) -> Option<i32> {
    match c
        .database("db")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
    {
        Ok(_) => None,
        Err(e) => Some(code(&e).unwrap_or(-1)),
    }
}

#[tokio::test]
async fn times_mode_fails_n_matching_commands() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": {"times": 2}, "data": {"failCommands": ["find"], "errorCode": 2}},
    )
    .await;
    // A command not in the list neither fails nor counts.
    c.database("db")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    assert_eq!(find_code(&c).await, Some(2));
    assert_eq!(find_code(&c).await, Some(2));
    assert_eq!(find_code(&c).await, None);
    server.shutdown().await;
}

#[tokio::test]
async fn skip_mode_lets_n_pass_first() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": {"skip": 2}, "data": {"failCommands": ["find"], "errorCode": 2}},
    )
    .await;
    assert_eq!(find_code(&c).await, None);
    assert_eq!(find_code(&c).await, None);
    assert_eq!(find_code(&c).await, Some(2));
    assert_eq!(find_code(&c).await, Some(2));
    off(&c).await;
    assert_eq!(find_code(&c).await, None);
    server.shutdown().await;
}

#[tokio::test]
async fn always_on_and_off_and_count() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let r = configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["find", "insert"], "errorCode": 2}},
    )
    .await;
    assert!(r.contains_key("count"));
    for _ in 0..3 {
        assert_eq!(find_code(&c).await, Some(2));
    }
    let r = configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": "off"},
    )
    .await;
    assert_eq!(r.get_i64("count").unwrap(), 3, "times entered so far");
    assert_eq!(find_code(&c).await, None);
    // Unknown fail point and bad modes are errors.
    assert!(c
        .database("admin")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": "sometimes"})
        .await
        .is_err());
    server.shutdown().await;
}

#[tokio::test]
async fn close_connection_and_retryable_write() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("c");
    coll.insert_one(doc! {"warm": 1}).await.unwrap();
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "closeConnection": true}},
    )
    .await;
    // The driver sees a network error and retries once: the document is inserted exactly once.
    coll.insert_one(doc! {"_id": "once"}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {"_id": "once"}).await.unwrap(), 1);
    // A runCommand is not retried: the closed connection is an I/O error.
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["ping"], "closeConnection": true}},
    )
    .await;
    let err = c
        .database("db")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert!(
        matches!(*err.kind, mongodb::error::ErrorKind::Io(_)),
        "{err}"
    );
    c.database("db")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn retryable_error_codes_get_the_label_unless_overridden() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("c");
    // 91 ShutdownInProgress on a retryable write: the server labels it RetryableWriteError,
    // the driver retries, the write succeeds.
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "errorCode": 91}},
    )
    .await;
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    // With errorLabels: [] the label is suppressed: no retry, the error surfaces.
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "errorCode": 91, "errorLabels": []}},
    )
    .await;
    let err = coll.insert_one(doc! {"_id": 2}).await.unwrap_err();
    assert_eq!(code(&err), Some(91));
    assert!(!err.contains_label("RetryableWriteError"));
    // Custom labels are passed through.
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["find"], "errorCode": 2, "errorLabels": ["MyLabel"]}},
    )
    .await;
    let err = coll.find_one(doc! {}).await.unwrap_err();
    assert!(err.contains_label("MyLabel"));
    server.shutdown().await;
}

#[tokio::test]
async fn block_connection_delays_the_command() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    c.database("db")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["ping"], "blockConnection": true, "blockTimeMS": 3000}},
    )
    .await;
    let t = Instant::now();
    c.database("db")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(3000),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    c.database("db")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    // The fail point fired once: the next ping is not blocked (a generous bound, far below the
    // 3 s block, for a shared and noisy machine).
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn app_name_filter_only_hits_that_client() {
    let server = TestServer::start().await.unwrap();
    let a = client_named(&server, Some("appA")).await;
    let b = client_named(&server, Some("appB")).await;
    configure(
        &a,
        doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["find"], "errorCode": 2, "appName": "appA"}},
    )
    .await;
    assert_eq!(find_code(&b).await, None);
    assert_eq!(find_code(&a).await, Some(2));
    assert_eq!(find_code(&b).await, None);
    off(&a).await;
    server.shutdown().await;
}

#[tokio::test]
async fn write_concern_error_is_attached_after_the_write() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "writeConcernError": {"code": 100, "codeName": "UnsatisfiableWriteConcern", "errmsg": "Not enough data-bearing nodes"}}},
    )
    .await;
    let coll = c.database("db").collection::<Document>("w");
    let err = coll.insert_one(doc! {"_id": 1}).await.unwrap_err();
    assert_eq!(code(&err), Some(100));
    // The write itself happened.
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn namespace_filter() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    configure(
        &c,
        doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["find"], "errorCode": 2, "namespace": "db.other"}},
    )
    .await;
    assert_eq!(find_code(&c).await, None);
    let err = c
        .database("db")
        .collection::<Document>("other")
        .find_one(doc! {})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(2));
    off(&c).await;
    server.shutdown().await;
}
