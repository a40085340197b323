//! Behaviour checked against mongod's source: the positional projection's position, `$slice`
//! and paths through arrays in projections, and `createIndexes` conflicts and option types.

mod common;

use bson::{doc, Bson, Document};
use mongo_testserver::TestServer;
use mongodb::Database;

use common::{client, code};

async fn setup(docs: Vec<Document>) -> (TestServer, Database) {
    let server = TestServer::start().await.unwrap();
    let db = client(&server).await.database("db");
    db.run_command(doc! {"insert": "c", "documents": docs})
        .await
        .unwrap();
    (server, db)
}

/// The first batch of a `find`.
async fn find(db: &Database, filter: Document, projection: Document) -> Vec<Document> {
    let r = db
        .run_command(doc! {"find": "c", "filter": filter.clone(), "projection": projection.clone(), "sort": {"_id": 1}})
        .await
        .unwrap_or_else(|e| panic!("find {filter} {projection}: {e}"));
    r.get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap_or_else(|e| panic!("{r}: {e}"))
        .iter()
        .filter_map(|d| d.as_document().cloned())
        .collect()
}

#[tokio::test]
async fn positional_projection_uses_the_position_the_match_recorded() {
    let (server, db) = setup(vec![
        doc! {"_id": 1, "a": [1, 2, 3], "b": [10, 20, 30]},
        doc! {"_id": 8, "activity_ids": [1, 2], "grades": [90, 95], "deans_list": [2021, 2020]},
        doc! {"_id": 9, "items": [{"n": "x", "q": 1}, {"n": "y", "q": 5}]},
        doc! {"_id": 2, "long": [1, 2, 3], "short": [9]},
    ])
    .await;
    // The position comes from a condition on another array (MongoDB 4.4+).
    assert_eq!(
        find(&db, doc! {"a": 2}, doc! {"b.$": 1, "_id": 0}).await,
        vec![doc! {"b": [20]}]
    );
    // Several arrays: the conditions are sorted (operator kind, then path) and the last one
    // that traverses an array decides, here `grades`.
    assert_eq!(
        find(
            &db,
            doc! {"activity_ids": 1, "grades": 95, "deans_list": 2021},
            doc! {"deans_list.$": 1}
        )
        .await,
        vec![doc! {"_id": 8, "deans_list": [2020]}]
    );
    // `$gt` sorts after an equality: its position wins over the one of `a`.
    assert_eq!(
        find(
            &db,
            doc! {"b": {"$gt": 25}, "a": 1},
            doc! {"a.$": 1, "_id": 0}
        )
        .await,
        vec![doc! {"a": [3]}]
    );
    // `items.n.$`: the first array on the path (`items`) is projected.
    assert_eq!(
        find(&db, doc! {"items.q": {"$gte": 2}}, doc! {"items.n.$": 1}).await,
        vec![doc! {"_id": 9, "items": [{"n": "y"}]}]
    );
    // No position recorded (an `$or`), or past the end of the projected array.
    for (filter, projection, expected) in [
        (doc! {"$or": [{"a": 2}, {"z": 1}]}, doc! {"a.$": 1}, 51246),
        (doc! {"long": 3}, doc! {"short.$": 1}, 51247),
    ] {
        let e = db
            .run_command(
                doc! {"find": "c", "filter": filter.clone(), "projection": projection.clone()},
            )
            .await
            .expect_err("positional projection without a position");
        assert_eq!(code(&e), Some(expected), "{filter} {projection}: {e}");
    }
    let e = db
        .run_command(
            doc! {"find": "c", "filter": {"_id": 8, "grades": 95}, "projection": {"a.$": 1, "activity_ids.$": 1}},
        )
        .await
        .expect_err("two positional projections");
    assert_eq!(code(&e), Some(31276), "{e}");
    // No array on the path: a plain inclusion.
    assert_eq!(
        find(&db, doc! {"_id": 1, "b": 30}, doc! {"x.$": 1}).await,
        vec![doc! {"_id": 1}]
    );

    // findAndModify projects the same way (here the pre-image, `new: false`).
    let r = db
        .run_command(doc! {
            "findAndModify": "c",
            "query": {"a": 3, "_id": 1},
            "update": {"$set": {"touched": true}},
            "fields": {"b.$": 1, "_id": 0},
        })
        .await
        .unwrap();
    assert_eq!(r.get_document("value").ok(), Some(&doc! {"b": [30]}), "{r}");
    server.shutdown().await;
}

#[tokio::test]
async fn slice_and_paths_through_arrays_as_mongod() {
    let (server, db) = setup(vec![doc! {
        "_id": 1,
        "a": [{"b": [1, 2, 3], "c": 1}, 5, [{"b": [4, 5]}], {"c": 2}],
        "z": 1,
    }])
    .await;
    let one = |v: Vec<Document>| v.into_iter().next().unwrap_or_default();
    // `$slice` alone: nothing else changes; documents of `a` are walked, other elements
    // (nested arrays included) kept as they are.
    assert_eq!(
        one(find(&db, doc! {}, doc! {"a.b": {"$slice": 1}, "_id": 0}).await),
        doc! {"a": [{"b": [1], "c": 1}, 5, [{"b": [4, 5]}], {"c": 2}], "z": 1}
    );
    // With an inclusion the `$slice` path is included; scalars of `a` are dropped by it.
    assert_eq!(
        one(find(
            &db,
            doc! {},
            doc! {"a.b": {"$slice": -2}, "a.c": 1, "_id": 0}
        )
        .await),
        doc! {"a": [{"b": [2, 3], "c": 1}, [{"b": [4, 5]}], {"c": 2}]}
    );
    assert_eq!(
        one(find(&db, doc! {}, doc! {"a": {"$slice": [1, 1]}, "z": 1}).await),
        doc! {"_id": 1, "a": [5], "z": 1}
    );
    // Inclusion and exclusion of a path through an array of documents and scalars.
    assert_eq!(
        one(find(&db, doc! {}, doc! {"a.b": 1, "_id": 0}).await),
        doc! {"a": [{"b": [1, 2, 3]}, [{"b": [4, 5]}], {}]}
    );
    assert_eq!(
        one(find(&db, doc! {}, doc! {"a.b": 0, "_id": 0}).await),
        doc! {"a": [{"c": 1}, 5, [{}], {"c": 2}], "z": 1}
    );
    server.shutdown().await;
}

/// The code of a `createIndexes` of `spec` on `c` (0 when it succeeds).
async fn create_index(db: &Database, spec: Document) -> i32 {
    match db
        .run_command(doc! {"createIndexes": "c", "indexes": [spec]})
        .await
    {
        Ok(_) => 0,
        Err(e) => code(&e).unwrap_or(-1),
    }
}

#[tokio::test]
async fn create_indexes_conflicts_and_option_types() {
    let (server, db) = setup(vec![doc! {"_id": 1, "a": 1}]).await;
    let mut wrong = Vec::new();
    let cases: Vec<(&str, Document, i32)> = vec![
        ("create", doc! {"key": {"a": 1}, "name": "a_1"}, 0),
        // Same name, other key: 86 IndexKeySpecsConflict.
        (
            "same name, other key",
            doc! {"key": {"b": 1}, "name": "a_1"},
            86,
        ),
        // Same name and key, another identifying option (unique, sparse, partial filter):
        // 86 too, as `compareIndexOptions` answers kDifferent.
        (
            "same name, unique",
            doc! {"key": {"a": 1}, "name": "a_1", "unique": true},
            86,
        ),
        // Same name and key, another non-identifying option: 85 IndexOptionsConflict.
        (
            "same name, ttl",
            doc! {"key": {"a": 1}, "name": "a_1", "expireAfterSeconds": 5},
            85,
        ),
        // Same key and options, another name: 85.
        ("other name", doc! {"key": {"a": 1}, "name": "a_2"}, 85),
        (
            "other name and options",
            doc! {"key": {"a": 1}, "name": "a_2", "expireAfterSeconds": 5},
            85,
        ),
        // Same key, other identifying options, other name: another index.
        (
            "sparse twin",
            doc! {"key": {"a": 1}, "name": "a_sparse", "sparse": true},
            0,
        ),
        // Identical but for creation-time options and number types: a no-op.
        (
            "background",
            doc! {"key": {"a": 1.0}, "name": "a_1", "background": true, "v": 2},
            0,
        ),
        (
            "sparse as a number",
            doc! {"key": {"a": 1}, "name": "a_sparse", "sparse": 1},
            0,
        ),
        // Option types (`validateIndexSpec`).
        (
            "unknown option",
            doc! {"key": {"x": 1}, "name": "x", "foo": 1},
            197,
        ),
        ("key type", doc! {"key": "x", "name": "x"}, 14),
        ("name type", doc! {"key": {"x": 1}, "name": 1}, 14),
        (
            "unique type",
            doc! {"key": {"x": 1}, "name": "x", "unique": "yes"},
            14,
        ),
        (
            "sparse type",
            doc! {"key": {"x": 1}, "name": "x", "sparse": null},
            14,
        ),
        (
            "hidden type",
            doc! {"key": {"x": 1}, "name": "x", "hidden": 1},
            14,
        ),
        ("v type", doc! {"key": {"x": 1}, "name": "x", "v": "2"}, 14),
        ("v value", doc! {"key": {"x": 1}, "name": "x", "v": 3}, 67),
        (
            "v fraction",
            doc! {"key": {"x": 1}, "name": "x", "v": 1.5},
            2,
        ),
        (
            "partial type",
            doc! {"key": {"x": 1}, "name": "x", "partialFilterExpression": 1},
            14,
        ),
        (
            "partial operator",
            doc! {"key": {"x": 1}, "name": "x", "partialFilterExpression": {"x": {"$bad": 1}}},
            2,
        ),
        (
            "ttl type",
            doc! {"key": {"x": 1}, "name": "x", "expireAfterSeconds": "1"},
            67,
        ),
        (
            "ttl range",
            doc! {"key": {"x": 1}, "name": "x", "expireAfterSeconds": -1},
            67,
        ),
        ("key value", doc! {"key": {"x": true}, "name": "x"}, 67),
        ("no key", doc! {"name": "x"}, 9),
        ("no name", doc! {"key": {"x": 1}}, 9),
    ];
    for (what, spec, expected) in cases {
        let got = create_index(&db, spec.clone()).await;
        if got != expected {
            wrong.push(format!("{what}: {spec} gave {got}, expected {expected}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // An identical request is a no-op with a note.
    let r = db
        .run_command(doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1"}]})
        .await
        .unwrap();
    assert_eq!(
        r.get_str("note").ok(),
        Some("all indexes already exist"),
        "{r}"
    );
    assert_eq!(r.get("numIndexesBefore"), r.get("numIndexesAfter"), "{r}");
    assert_eq!(r.get("numIndexesAfter"), Some(&Bson::Int32(3)), "{r}");
    server.shutdown().await;
}

#[tokio::test]
async fn delete_with_limit_null_deletes_every_match() {
    let (server, db) = setup((0..4).map(|i| doc! {"_id": i, "k": i % 2}).collect()).await;
    // mongod reads `limit` with `numberDouble()` (`readMultiDeleteProperty` in
    // `src/mongo/db/ops/write_ops.cpp`): null is 0, "delete every match".
    let r = db
        .run_command(doc! {"delete": "c", "deletes": [{"q": {"k": 1}, "limit": null}]})
        .await
        .unwrap();
    assert_eq!(r.get_i32("n").ok(), Some(2), "{r}");
    server.shutdown().await;
}

/// MongoDB 4.4 started with `--enableMajorityReadConcern=false` (the usual setting of a PSA
/// set) refuses read concern `majority` with ReadConcernMajorityNotEnabled (148), except on
/// change streams and on `find` with `allowSpeculativeMajorityRead` (mongod's jstest
/// `replsets/speculative_majority_supported_commands.js`; messages from `pipeline.cpp` and
/// `read_concern_mongod.cpp`); `local` reads and change streams go on working.
#[tokio::test]
async fn majority_read_concern_disabled_refuses_majority_reads_but_change_streams() {
    use futures_util::StreamExt;
    let server = TestServer::builder()
        .majority_read_concern(false)
        .start()
        .await
        .unwrap();
    let db = client(&server).await.database("db");
    db.run_command(doc! {"insert": "c", "documents": [{"_id": 1}]})
        .await
        .unwrap();
    let majority = doc! {"level": "majority"};
    for cmd in [
        doc! {"find": "c", "readConcern": majority.clone()},
        doc! {"find": "c", "readConcern": majority.clone(), "allowSpeculativeMajorityRead": false},
        doc! {"aggregate": "c", "pipeline": [{"$project": {"_id": 1}}], "cursor": {}, "readConcern": majority.clone()},
        doc! {"count": "c", "readConcern": majority.clone()},
    ] {
        let e = db.run_command(cmd.clone()).await.unwrap_err();
        assert_eq!(code(&e), Some(148), "{cmd}: {e}");
    }
    let e = db
        .run_command(
            doc! {"aggregate": "c", "pipeline": [], "cursor": {}, "readConcern": majority.clone()},
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("Only change stream aggregation queries support 'majority' read concern"),
        "{e}"
    );
    db.run_command(doc! {"find": "c", "readConcern": {"level": "local"}})
        .await
        .unwrap();
    db.run_command(
        doc! {"find": "c", "readConcern": majority.clone(), "allowSpeculativeMajorityRead": true},
    )
    .await
    .unwrap();
    // A change stream (the driver sends majority read concern with it only if asked; ask).
    let coll = db.collection::<Document>("c");
    let mut stream = coll
        .watch()
        .read_concern(mongodb::options::ReadConcern::majority())
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let event = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("a change event")
        .expect("stream open")
        .unwrap();
    assert_eq!(
        event.operation_type,
        mongodb::change_stream::event::OperationType::Insert
    );
    server.shutdown().await;
}

/// By default majority reads are served.
#[tokio::test]
async fn majority_reads_are_served_by_default() {
    let server = TestServer::start().await.unwrap();
    let db = client(&server).await.database("db");
    db.run_command(doc! {"find": "c", "readConcern": {"level": "majority"}})
        .await
        .unwrap();
    server.shutdown().await;
}
