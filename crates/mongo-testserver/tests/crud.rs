//! CRUD, findAndModify, indexes and cursors through the official driver.

mod common;

use std::time::Instant;

use bson::{doc, Bson, Document};
use futures_util::TryStreamExt;
use mongo_testserver::TestServer;
use mongodb::options::{IndexOptions, ReturnDocument};
use mongodb::IndexModel;

use common::{client, code};

#[tokio::test]
async fn start_is_fast_and_ping_works() {
    let t = Instant::now();
    let server = TestServer::start().await.unwrap();
    // Start-up time is measured by the benchmark; here only a generous sanity bound, since
    // the machines running tests are shared and noisy.
    assert!(t.elapsed().as_secs() < 5, "start took {:?}", t.elapsed());
    let c = client(&server).await;
    let r = c
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);
    server.shutdown().await;
}

#[tokio::test]
async fn insert_find_update_delete() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("things");
    coll.insert_many(vec![
        doc! {"_id": 1, "n": 5, "tags": ["a", "b"]},
        doc! {"_id": 2, "n": 3},
        doc! {"_id": 3, "n": 9},
    ])
    .await
    .unwrap();
    let found: Vec<Document> = coll
        .find(doc! {"n": {"$gte": 4}})
        .sort(doc! {"n": -1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let ids: Vec<i32> = found.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!(ids, vec![3, 1]);
    assert_eq!(coll.count_documents(doc! {"tags": "a"}).await.unwrap(), 1);

    let r = coll
        .update_one(
            doc! {"_id": 2},
            doc! {"$inc": {"n": 1}, "$set": {"x": true}},
        )
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    let r = coll
        .update_one(doc! {"_id": 2}, doc! {"$set": {"x": true}})
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 0));
    let r = coll
        .update_one(doc! {"_id": 7}, doc! {"$set": {"y": 1}})
        .upsert(true)
        .await
        .unwrap();
    assert_eq!(r.upserted_id, Some(Bson::Int32(7)));
    let r = coll
        .update_many(doc! {}, doc! {"$set": {"all": 1}})
        .await
        .unwrap();
    assert_eq!(r.matched_count, 4);
    let d = coll.find_one(doc! {"_id": 2}).await.unwrap().unwrap();
    assert_eq!(d, doc! {"_id": 2, "n": 4, "x": true, "all": 1});

    let r = coll.delete_many(doc! {"n": {"$lt": 6}}).await.unwrap();
    assert_eq!(r.deleted_count, 2);
    assert_eq!(coll.estimated_document_count().await.unwrap(), 2);
    server.shutdown().await;
}

#[tokio::test]
async fn duplicate_ids_and_unique_indexes() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("u");
    coll.insert_one(doc! {"_id": "x", "email": "a@b"})
        .await
        .unwrap();
    let err = coll.insert_one(doc! {"_id": "x"}).await.unwrap_err();
    assert_eq!(code(&err), Some(11000));
    let mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) = &*err.kind
    else {
        panic!("expected a write error: {err}");
    };
    assert_eq!(
        w.message,
        "E11000 duplicate key error collection: db.u index: _id_ dup key: { _id: \"x\" }"
    );

    coll.create_index(
        IndexModel::builder()
            .keys(doc! {"email": 1})
            .options(IndexOptions::builder().unique(true).build())
            .build(),
    )
    .await
    .unwrap();
    let err = coll
        .insert_one(doc! {"_id": "y", "email": "a@b"})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(11000));
    // Updating into a conflict is refused too.
    coll.insert_one(doc! {"_id": "z", "email": "c@d"})
        .await
        .unwrap();
    let err = coll
        .update_one(doc! {"_id": "z"}, doc! {"$set": {"email": "a@b"}})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(11000));
    server.shutdown().await;
}

#[tokio::test]
async fn upsert_with_existing_id_is_duplicate_key() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("locks");
    coll.insert_one(doc! {"_id": "lock", "owner": "a"})
        .await
        .unwrap();
    let err = coll
        .find_one_and_update(
            doc! {"_id": "lock", "owner": "b"},
            doc! {"$set": {"owner": "b"}},
        )
        .upsert(true)
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(11000), "{err}");
    let raw = c
        .database("db")
        .run_command(doc! {
            "findAndModify": "locks",
            "query": {"_id": "lock", "owner": "b"},
            "update": {"$set": {"owner": "b"}},
            "upsert": true,
        })
        .await
        .unwrap_err();
    let mongodb::error::ErrorKind::Command(ce) = &*raw.kind else {
        panic!("expected a command error, got {raw}");
    };
    assert_eq!(ce.code, 11000);
    assert_eq!(
        ce.message,
        "E11000 duplicate key error collection: db.locks index: _id_ dup key: { _id: \"lock\" }"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn find_and_modify_pipeline_update_uses_server_now() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("locks");
    let before = bson::DateTime::now();
    let pipeline = vec![doc! {"$set": {
        "token": {"$add": [{"$ifNull": ["$token", 0]}, 1]},
        "expiresAt": {"$add": ["$$NOW", 30_000]},
        "acquiredAt": "$$NOW",
    }}];
    let d = coll
        .find_one_and_update(doc! {"_id": "n"}, pipeline.clone())
        .upsert(true)
        .return_document(ReturnDocument::After)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.get_i32("token").unwrap(), 1);
    let acquired = d.get_datetime("acquiredAt").unwrap();
    let expires = d.get_datetime("expiresAt").unwrap();
    assert!(acquired.timestamp_millis() >= before.timestamp_millis() - 1000);
    assert_eq!(
        expires.timestamp_millis() - acquired.timestamp_millis(),
        30_000
    );
    let old = coll
        .find_one_and_update(doc! {"_id": "n"}, pipeline)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.get_i32("token").unwrap(), 1);
    let removed = coll
        .find_one_and_delete(doc! {"_id": "n"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(removed.get_i32("token").unwrap(), 2);
    assert!(coll
        .find_one_and_delete(doc! {"_id": "n"})
        .await
        .unwrap()
        .is_none());
    server.shutdown().await;
}

#[tokio::test]
async fn find_and_modify_reply_shape() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let r = db
        .run_command(doc! {"findAndModify": "c", "query": {"_id": 1}, "update": {"$set": {"a": 1}}, "upsert": true, "new": true, "fields": {"a": 1, "_id": 0}})
        .await
        .unwrap();
    assert_eq!(r.get_document("value").unwrap(), &doc! {"a": 1});
    assert_eq!(
        r.get_document("lastErrorObject").unwrap(),
        &doc! {"n": 1, "updatedExisting": false, "upserted": 1}
    );
    let r = db
        .run_command(doc! {"findAndModify": "c", "query": {"a": 1}, "sort": {"a": 1}, "update": {"$inc": {"a": 1}}})
        .await
        .unwrap();
    assert_eq!(r.get_document("value").unwrap(), &doc! {"_id": 1, "a": 1});
    assert_eq!(
        r.get_document("lastErrorObject").unwrap(),
        &doc! {"n": 1, "updatedExisting": true}
    );
    let err = db
        .run_command(doc! {"findAndModify": "c", "query": {}, "update": {"$set": {"a.$[x]": 1}}, "arrayFilters": [{"x": 1}]})
        .await
        .unwrap_err();
    assert!(code(&err).is_some());
    server.shutdown().await;
}

#[tokio::test]
async fn racing_upserts_have_one_winner() {
    let server = TestServer::start().await.unwrap();
    let mut handles = Vec::new();
    for i in 0..16 {
        let c = client(&server).await;
        handles.push(tokio::spawn(async move {
            let coll = c.database("db").collection::<Document>("race");
            let mut wins = 0;
            for round in 0..50 {
                let id = format!("lock-{round}");
                // Take the lock only when it is free: the filter misses an owned document, so the
                // upsert inserts (winner) or fails with E11000 (loser).
                let r = coll
                    .find_one_and_update(
                        doc! {"_id": &id, "owner": {"$exists": false}},
                        doc! {"$set": {"owner": i}},
                    )
                    .upsert(true)
                    .return_document(ReturnDocument::After)
                    .await;
                match r {
                    Ok(Some(d)) if d.get_i32("owner") == Ok(i) => wins += 1,
                    Ok(other) => panic!("unexpected {other:?}"),
                    Err(e) => assert_eq!(code(&e), Some(11000), "{e}"),
                }
            }
            wins
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    assert_eq!(total, 50, "each round has exactly one winner");
    server.shutdown().await;
}

#[tokio::test]
async fn concurrent_increments_sum_exactly() {
    let server = TestServer::start().await.unwrap();
    let mut handles = Vec::new();
    for _ in 0..8 {
        let c = client(&server).await;
        handles.push(tokio::spawn(async move {
            let coll = c.database("db").collection::<Document>("counter");
            for _ in 0..200 {
                coll.update_one(doc! {"_id": "c"}, doc! {"$inc": {"n": 1}})
                    .upsert(true)
                    .await
                    .unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let c = client(&server).await;
    let d = c
        .database("db")
        .collection::<Document>("counter")
        .find_one(doc! {"_id": "c"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.get_i32("n").unwrap(), 1600);
    server.shutdown().await;
}

#[tokio::test]
async fn cursors_batch_and_get_more() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("many");
    let docs: Vec<Document> = (0..250).map(|i| doc! {"_id": i, "v": i % 7}).collect();
    coll.insert_many(docs).await.unwrap();
    let all: Vec<Document> = coll
        .find(doc! {})
        .batch_size(20)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.len(), 250);
    let page: Vec<Document> = coll
        .find(doc! {"v": 3})
        .sort(doc! {"_id": -1})
        .skip(2)
        .limit(5)
        .projection(doc! {"v": 0})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let ids: Vec<i32> = page.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!(ids, vec![234, 227, 220, 213, 206]);
    assert!(page.iter().all(|d| !d.contains_key("v")));
    let agg: Vec<Document> = coll
        .aggregate(vec![
            doc! {"$match": {"v": 0}},
            doc! {"$sort": {"_id": -1}},
            doc! {"$limit": 2},
            doc! {"$project": {"_id": 1}},
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(agg, vec![doc! {"_id": 245}, doc! {"_id": 238}]);
    // Unknown cursor.
    let err = c
        .database("db")
        .run_command(doc! {"getMore": 12345i64, "collection": "many"})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(43));
    server.shutdown().await;
}

#[tokio::test]
async fn indexes_list_and_conflicts() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let coll = db.collection::<Document>("idx");
    let ttl_index = || {
        IndexModel::builder()
            .keys(doc! {"expiresAt": 1})
            .options(
                IndexOptions::builder()
                    .expire_after(std::time::Duration::from_secs(0))
                    .build(),
            )
            .build()
    };
    coll.create_index(ttl_index()).await.unwrap();
    // Same index again: no-op.
    coll.create_index(ttl_index()).await.unwrap();
    assert_eq!(index_count(&coll).await, 2);
    let raw = db
        .run_command(doc! {"listIndexes": "idx", "cursor": {}})
        .await
        .unwrap();
    let batch = raw
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    let ttl = batch[1].as_document().unwrap();
    assert_eq!(ttl.get_str("name").unwrap(), "expiresAt_1");
    assert_eq!(args_i64(ttl.get("expireAfterSeconds")), Some(0));
    // Same name, other options: 85.
    let err = db
        .run_command(doc! {"createIndexes": "idx", "indexes": [{"key": {"expiresAt": 1}, "name": "expiresAt_1", "expireAfterSeconds": 10}]})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(85));
    // Same name, other key: 86.
    let err = db
        .run_command(doc! {"createIndexes": "idx", "indexes": [{"key": {"other": 1}, "name": "expiresAt_1"}]})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(86));
    coll.drop_index("expiresAt_1").await.unwrap();
    assert_eq!(index_count(&coll).await, 1);
    server.shutdown().await;
}

async fn index_count(coll: &mongodb::Collection<Document>) -> usize {
    let specs: Vec<IndexModel> = coll
        .list_indexes()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    specs.len()
}

fn args_i64(v: Option<&Bson>) -> Option<i64> {
    match v? {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) => Some(*f as i64),
        _ => None,
    }
}

#[tokio::test]
async fn errors_not_panics() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let err = db.run_command(doc! {"frobnicate": 1}).await.unwrap_err();
    assert_eq!(code(&err), Some(59));
    let err = db
        .run_command(doc! {"find": "x", "bogus": 1})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
    let err = db
        .run_command(doc! {"find": "x", "filter": {"a": {"$where": 1}}})
        .await
        .unwrap_err();
    assert!(code(&err).is_some());
    let err = db
        .run_command(doc! {"insert": "x", "documents": [{"_id": [1]}]})
        .await;
    match err {
        Ok(r) => assert!(r.contains_key("writeErrors")),
        Err(e) => panic!("{e}"),
    }
    let err = db
        .run_command(doc! {"insert": 5, "documents": []})
        .await
        .unwrap_err();
    assert!(code(&err).is_some());
    let err = db
        .run_command(doc! {"update": "x", "updates": [{"q": {}, "u": {"$frob": {"a": 1}}}]})
        .await
        .unwrap();
    assert!(err.contains_key("writeErrors"));
    let err = db
        .run_command(doc! {"aggregate": "x", "pipeline": [{"$frob": {}}], "cursor": {}})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("$frob"), "{err}");
    // The server still works.
    db.collection::<Document>("x")
        .insert_one(doc! {"ok": 1})
        .await
        .unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn collections_and_databases() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("meta");
    db.create_collection("a").await.unwrap();
    db.collection::<Document>("b")
        .insert_one(doc! {"x": 1})
        .await
        .unwrap();
    let mut names = db.list_collection_names().await.unwrap();
    names.sort();
    assert_eq!(names, vec!["a", "b"]);
    let err = db.create_collection("a").await.unwrap_err();
    assert_eq!(code(&err), Some(48));
    assert!(c
        .list_database_names()
        .await
        .unwrap()
        .contains(&"meta".to_owned()));
    db.collection::<Document>("a").drop().await.unwrap();
    assert_eq!(db.list_collection_names().await.unwrap(), vec!["b"]);
    db.drop().await.unwrap();
    assert!(!c
        .list_database_names()
        .await
        .unwrap()
        .contains(&"meta".to_owned()));
    server.shutdown().await;
}

#[tokio::test]
async fn standalone_mode_works_without_sessions_features() {
    let server = TestServer::builder()
        .standalone(true)
        .start()
        .await
        .unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("s");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let hello = c
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .unwrap();
    assert!(!hello.contains_key("setName"));
    assert!(hello.get_bool("isWritablePrimary").unwrap());
    let err = coll.watch().await.unwrap_err();
    assert_eq!(code(&err), Some(40573));
    server.shutdown().await;
}

static SHARED: std::sync::OnceLock<TestServer> = std::sync::OnceLock::new();

/// One server for several tests, each with its own runtime.
fn shared_server() -> &'static TestServer {
    SHARED.get_or_init(|| TestServer::start_background().expect("background server"))
}

#[tokio::test]
async fn shared_background_server_a() {
    let c = client(shared_server()).await;
    let coll = c.database("shared").collection::<Document>("a");
    coll.insert_one(doc! {"x": 1}).await.unwrap();
    assert!(coll.count_documents(doc! {}).await.unwrap() >= 1);
}

#[tokio::test]
async fn shared_background_server_b() {
    let c = client(shared_server()).await;
    let coll = c.database("shared").collection::<Document>("b");
    coll.insert_one(doc! {"x": 1}).await.unwrap();
    assert!(coll.count_documents(doc! {}).await.unwrap() >= 1);
}

#[tokio::test]
async fn upsert_with_expr_in_filter_is_refused_as_mongod_does() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("exprs");
    coll.insert_one(doc! {"_id": 1, "n": 1}).await.unwrap();
    let filter = doc! {"_id": 1, "$expr": {"$eq": ["$n", 1]}};
    // Even though a document matches, mongod answers 224 QueryFeatureNotAllowed.
    let err = coll
        .update_one(filter.clone(), doc! {"$set": {"m": 2}})
        .upsert(true)
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(224), "{err}");
    let err = coll
        .find_one_and_update(filter.clone(), doc! {"$set": {"m": 2}})
        .upsert(true)
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(224), "{err}");
    // Without upsert, $expr is fine.
    let r = coll
        .update_one(filter, doc! {"$set": {"m": 2}})
        .await
        .unwrap();
    assert_eq!(r.modified_count, 1);
    server.shutdown().await;
}
