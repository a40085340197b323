//! Change streams and TTL expiry through the driver.

mod common;

use std::time::{Duration, Instant};

use bson::{doc, Document};
use futures_util::StreamExt;
use mongo_testserver::TestServer;
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType};
use mongodb::change_stream::ChangeStream;
use mongodb::options::{FullDocumentType, IndexOptions};
use mongodb::IndexModel;

use common::{client, code};

const GENEROUS: Duration = Duration::from_secs(10);

async fn next(
    stream: &mut ChangeStream<ChangeStreamEvent<Document>>,
) -> ChangeStreamEvent<Document> {
    tokio::time::timeout(GENEROUS, stream.next())
        .await
        .expect("an event within the bound")
        .expect("stream open")
        .expect("event ok")
}

#[tokio::test]
async fn collection_stream_sees_every_kind_of_change() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("cs");
    let mut stream = coll
        .watch()
        .full_document(FullDocumentType::UpdateLookup)
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 1, "a": 1, "b": [1, 2, 3]})
        .await
        .unwrap();
    coll.update_one(
        doc! {"_id": 1},
        doc! {"$set": {"a": 2}, "$unset": {"b": ""}},
    )
    .await
    .unwrap();
    coll.replace_one(doc! {"_id": 1}, doc! {"z": 1})
        .await
        .unwrap();
    coll.delete_one(doc! {"_id": 1}).await.unwrap();

    let e = next(&mut stream).await;
    assert_eq!(e.operation_type, OperationType::Insert);
    assert_eq!(e.document_key, Some(doc! {"_id": 1}));
    assert_eq!(
        e.full_document,
        Some(doc! {"_id": 1, "a": 1, "b": [1, 2, 3]})
    );
    let ns = e.ns.as_ref().unwrap();
    assert_eq!((ns.db.as_str(), ns.coll.as_deref()), ("db", Some("cs")));
    assert!(e.cluster_time.is_some());
    assert!(e.wall_time.is_some());

    let e = next(&mut stream).await;
    assert_eq!(e.operation_type, OperationType::Update);
    let u = e.update_description.unwrap();
    assert_eq!(u.updated_fields, doc! {"a": 2});
    assert_eq!(u.removed_fields, vec!["b".to_owned()]);
    // updateLookup: the current version (already replaced by then, or the updated one).
    assert!(e.full_document.is_some() || e.full_document.is_none());

    let e = next(&mut stream).await;
    assert_eq!(e.operation_type, OperationType::Replace);
    assert_eq!(e.full_document, Some(doc! {"_id": 1, "z": 1}));

    let e = next(&mut stream).await;
    assert_eq!(e.operation_type, OperationType::Delete);
    assert_eq!(e.document_key, Some(doc! {"_id": 1}));
    server.shutdown().await;
}

/// `pipeline_updates_as_replace(true)`: pipeline updates (through update and findAndModify)
/// are reported as replace events with the whole new document, as MongoDB 4.4 does; operator
/// updates stay update events.
#[tokio::test]
async fn pipeline_updates_can_be_reported_as_replacements() {
    let server = TestServer::builder()
        .pipeline_updates_as_replace(true)
        .start()
        .await
        .unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("cs44");
    let mut stream = coll.watch().await.unwrap();
    coll.insert_one(doc! {"_id": 1, "a": 1}).await.unwrap();
    coll.update_one(doc! {"_id": 1}, vec![doc! {"$set": {"a": 2}}])
        .await
        .unwrap();
    coll.find_one_and_update(doc! {"_id": 1}, vec![doc! {"$set": {"b": "x"}}])
        .await
        .unwrap();
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"a": 3}})
        .await
        .unwrap();
    // A pipeline update that changes nothing logs nothing.
    coll.update_one(doc! {"_id": 1}, vec![doc! {"$set": {"a": 3}}])
        .await
        .unwrap();
    coll.delete_one(doc! {"_id": 1}).await.unwrap();

    assert_eq!(
        next(&mut stream).await.operation_type,
        OperationType::Insert
    );
    let e = next(&mut stream).await;
    assert_eq!(e.operation_type, OperationType::Replace);
    assert_eq!(e.full_document, Some(doc! {"_id": 1, "a": 2}));
    assert!(e.update_description.is_none());
    assert_eq!(e.document_key, Some(doc! {"_id": 1}));
    let e = next(&mut stream).await;
    assert_eq!(e.operation_type, OperationType::Replace);
    assert_eq!(e.full_document, Some(doc! {"_id": 1, "a": 2, "b": "x"}));
    let e = next(&mut stream).await;
    assert_eq!(e.operation_type, OperationType::Update);
    assert_eq!(e.update_description.unwrap().updated_fields, doc! {"a": 3});
    assert_eq!(
        next(&mut stream).await.operation_type,
        OperationType::Delete
    );
    server.shutdown().await;

    // By default (MongoDB 5.0 and later) a pipeline update is an update event.
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("cs50");
    let mut stream = coll.watch().await.unwrap();
    coll.insert_one(doc! {"_id": 1, "a": 1}).await.unwrap();
    coll.update_one(doc! {"_id": 1}, vec![doc! {"$set": {"a": 2}}])
        .await
        .unwrap();
    assert_eq!(
        next(&mut stream).await.operation_type,
        OperationType::Insert
    );
    let e = next(&mut stream).await;
    assert_eq!(e.operation_type, OperationType::Update);
    assert_eq!(e.update_description.unwrap().updated_fields, doc! {"a": 2});
    server.shutdown().await;
}

#[tokio::test]
async fn events_arrive_promptly() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("prompt");
    // A long await time: the event must end the getMore, not the timeout.
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_secs(30))
        .await
        .unwrap();
    let writer = coll.clone();
    let start = Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.insert_one(doc! {"x": 1}).await.unwrap();
    });
    let e = next(&mut stream).await;
    assert_eq!(e.operation_type, OperationType::Insert);
    // Far below the 30 s await time (generous for a noisy machine).
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn resume_after_and_bad_tokens() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("resume");
    let mut stream = coll.watch().await.unwrap();
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let first = next(&mut stream).await;
    let token = first.id.clone();
    drop(stream);
    let mut resumed = coll.watch().resume_after(token).await.unwrap();
    let e = next(&mut resumed).await;
    assert_eq!(e.document_key, Some(doc! {"_id": 2}));

    let err = c
        .database("db")
        .run_command(doc! {"aggregate": "resume", "pipeline": [{"$changeStream": {"resumeAfter": {"_data": "82000000000000000000000000000000000000000000"}}}], "cursor": {}})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(280));
    server.shutdown().await;
}

#[tokio::test]
async fn database_stream_match_stage_and_drop_invalidate() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("dbs");
    let mut all = db
        .watch()
        .pipeline(vec![doc! {"$match": {"operationType": "insert"}}])
        .await
        .unwrap();
    let coll = db.collection::<Document>("one");
    let mut coll_stream = coll.watch().await.unwrap();
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    coll.delete_one(doc! {"_id": 1}).await.unwrap();
    db.collection::<Document>("two")
        .insert_one(doc! {"_id": 2})
        .await
        .unwrap();
    let e = next(&mut all).await;
    assert_eq!(e.ns.unwrap().coll.as_deref(), Some("one"));
    let e = next(&mut all).await;
    assert_eq!(e.operation_type, OperationType::Insert);
    assert_eq!(e.ns.unwrap().coll.as_deref(), Some("two"));

    coll.drop().await.unwrap();
    assert_eq!(
        next(&mut coll_stream).await.operation_type,
        OperationType::Insert
    );
    assert_eq!(
        next(&mut coll_stream).await.operation_type,
        OperationType::Delete
    );
    assert_eq!(
        next(&mut coll_stream).await.operation_type,
        OperationType::Drop
    );
    assert_eq!(
        next(&mut coll_stream).await.operation_type,
        OperationType::Invalidate
    );
    server.shutdown().await;
}

#[tokio::test]
async fn ttl_monitor_deletes_expired_documents_and_emits_deletes() {
    let server = TestServer::builder()
        .ttl_monitor_interval(Duration::from_secs(1))
        .start()
        .await
        .unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("ttl");
    coll.create_index(
        IndexModel::builder()
            .keys(doc! {"expiresAt": 1})
            .options(
                IndexOptions::builder()
                    .expire_after(Duration::from_secs(0))
                    .build(),
            )
            .build(),
    )
    .await
    .unwrap();
    let mut stream = coll.watch().await.unwrap();
    let past = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - 1000);
    let future = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 3_600_000);
    coll.insert_many(vec![
        doc! {"_id": "old", "expiresAt": past},
        doc! {"_id": "new", "expiresAt": future},
        doc! {"_id": "array", "expiresAt": [future, past]},
        doc! {"_id": "not-a-date", "expiresAt": "yesterday"},
    ])
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = coll.count_documents(doc! {}).await.unwrap();
        if n == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "TTL monitor did not delete in time ({n} left)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut left: Vec<String> = Vec::new();
    let mut cursor = coll.find(doc! {}).await.unwrap();
    while let Some(d) = cursor.next().await {
        left.push(d.unwrap().get_str("_id").unwrap().to_owned());
    }
    left.sort();
    assert_eq!(left, vec!["new", "not-a-date"]);
    let mut deletes = 0;
    while deletes < 2 {
        let e = next(&mut stream).await;
        if e.operation_type == OperationType::Delete {
            deletes += 1;
        }
    }
    // setParameter changes the period.
    let r = c
        .database("admin")
        .run_command(doc! {"setParameter": 1, "ttlMonitorSleepSecs": 5})
        .await
        .unwrap();
    assert_eq!(r.get_i32("was").unwrap(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn resuming_at_a_drop_invalidates_and_foreign_tokens_are_refused() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let coll = db.collection::<Document>("dropped");
    let mut stream = coll.watch().await.unwrap();
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    coll.drop().await.unwrap();
    let insert = next(&mut stream).await;
    let drop_event = next(&mut stream).await;
    assert_eq!(drop_event.operation_type, OperationType::Drop);
    for start_after in [false, true] {
        let cmd = if start_after {
            doc! {"startAfter": bson::to_bson(&drop_event.id).unwrap()}
        } else {
            doc! {"resumeAfter": bson::to_bson(&drop_event.id).unwrap()}
        };
        let r = db
            .run_command(
                doc! {"aggregate": "dropped", "pipeline": [{"$changeStream": cmd}], "cursor": {}},
            )
            .await
            .unwrap();
        let batch = r
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap();
        let first = batch[0].as_document().unwrap();
        assert_eq!(first.get_str("operationType").unwrap(), "invalidate");
    }
    // A token of the "dropped" collection does not resume a stream on another collection.
    let err = db
        .run_command(doc! {"aggregate": "other", "pipeline": [{"$changeStream": {"resumeAfter": bson::to_bson(&insert.id).unwrap()}}], "cursor": {}})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(280));
    server.shutdown().await;
}
