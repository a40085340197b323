//! Query, update and index semantics checked against MongoDB's documented behaviour.

mod common;

use bson::{doc, Document};
use futures_util::TryStreamExt;
use mongo_testserver::TestServer;
use mongodb::options::IndexOptions;
use mongodb::IndexModel;

use common::{client, code};

#[tokio::test]
async fn unique_indexes_tell_empty_arrays_from_null() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("u");
    coll.create_index(
        IndexModel::builder()
            .keys(doc! {"a": 1})
            .options(IndexOptions::builder().unique(true).build())
            .build(),
    )
    .await
    .unwrap();
    coll.insert_one(doc! {"_id": 1, "a": []}).await.unwrap();
    coll.insert_one(doc! {"_id": 2, "a": null}).await.unwrap();
    // A missing field is null; a second empty array is a duplicate.
    let e = coll.insert_one(doc! {"_id": 3}).await.unwrap_err();
    assert_eq!(code(&e), Some(11000));
    let e = coll.insert_one(doc! {"_id": 4, "a": []}).await.unwrap_err();
    assert_eq!(code(&e), Some(11000));
    server.shutdown().await;
}

#[tokio::test]
async fn replacements_count_as_modified_unless_identical() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("r");
    coll.insert_one(doc! {"_id": 1, "a": 1}).await.unwrap();
    // The driver sends the replacement without `_id`: mongod reports it modified.
    let r = coll
        .replace_one(doc! {"_id": 1}, doc! {"a": 1})
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    let r = coll
        .replace_one(doc! {"_id": 1}, doc! {"_id": 1, "a": 1})
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 0));
    server.shutdown().await;
}

#[tokio::test]
async fn nan_matches_only_equality_style_comparisons() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("n");
    coll.insert_many(vec![
        doc! {"_id": 1, "v": f64::NAN},
        doc! {"_id": 2, "v": 5},
    ])
    .await
    .unwrap();
    let ids = |filter: Document| {
        let coll = coll.clone();
        async move {
            let docs: Vec<Document> = coll
                .find(filter)
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            docs.iter()
                .map(|d| d.get_i32("_id").unwrap())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(ids(doc! {"v": {"$lt": 10}}).await, vec![2]);
    assert_eq!(ids(doc! {"v": {"$gt": f64::NAN}}).await, Vec::<i32>::new());
    assert_eq!(ids(doc! {"v": {"$gte": f64::NAN}}).await, vec![1]);
    assert_eq!(ids(doc! {"v": f64::NAN}).await, vec![1]);
    server.shutdown().await;
}

#[tokio::test]
async fn partial_filters_are_limited_to_what_mongodb_allows() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let create = |name: &str, filter: Document| {
        doc! {"createIndexes": "p", "indexes": [{"key": {"a": 1}, "name": name, "partialFilterExpression": filter}]}
    };
    db.run_command(create(
        "ok",
        doc! {"a": {"$gt": 5}, "b": {"$exists": true}, "t": {"$type": "string"}, "$or": [{"c": 1}, {"d": {"$in": [1, 2]}}]},
    ))
    .await
    .unwrap();
    for (i, bad) in [
        doc! {"a": {"$ne": 1}},
        doc! {"a": {"$regex": "^x"}},
        doc! {"a": bson::Regex { pattern: "^x".into(), options: String::new() }},
        doc! {"$expr": {"$eq": ["$a", 1]}},
        doc! {"a": {"$exists": false}},
        doc! {"a": {"$not": {"$gt": 1}}},
        doc! {"$and": [{"a": {"$nin": [1]}}]},
    ]
    .into_iter()
    .enumerate()
    {
        let e = db
            .run_command(create(&format!("bad{i}"), bad.clone()))
            .await
            .unwrap_err();
        assert_eq!(code(&e), Some(67), "{bad}");
    }
    server.shutdown().await;
}
