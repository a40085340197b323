//! The positional update operator `$` through the driver: it takes the array position the
//! query's match recorded on the document (mongod's elemMatchKey, as the positional projection
//! does: `src/mongo/db/exec/update_stage.cpp`, `src/mongo/db/update/update_object_node.cpp`),
//! in update, updateMany, findAndModify and multi-statement updates, with mongod's error codes.

mod common;

use bson::{doc, Bson, Document};
use mongo_testserver::TestServer;
use mongodb::{Collection, Database};

use common::{client, code};

async fn setup(docs: Vec<Document>) -> (TestServer, Database, Collection<Document>) {
    let server = TestServer::start().await.unwrap();
    let db = client(&server).await.database("db");
    let coll = db.collection::<Document>("c");
    if !docs.is_empty() {
        coll.insert_many(docs).await.unwrap();
    }
    (server, db, coll)
}

async fn get(coll: &Collection<Document>, id: i32) -> Document {
    coll.find_one(doc! {"_id": id})
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no document {id}"))
}

/// The code of the error of a one-statement `update` command (a write error or a command
/// error).
async fn update_error(db: &Database, stmt: Document) -> i32 {
    match db
        .run_command(doc! {"update": "c", "updates": [stmt.clone()]})
        .await
    {
        Ok(r) => r
            .get_array("writeErrors")
            .ok()
            .and_then(|w| w.first())
            .and_then(Bson::as_document)
            .and_then(|w| w.get_i32("code").ok())
            .unwrap_or_else(|| panic!("{stmt} succeeded: {r}")),
        Err(e) => code(&e).unwrap_or_else(|| panic!("{stmt}: {e}")),
    }
}

#[tokio::test]
async fn manual_examples() {
    let (server, _db, coll) = setup(vec![
        doc! {"_id": 1, "grades": [85, 80, 80]},
        doc! {"_id": 2, "grades": [88, 90, 92]},
        doc! {"_id": 3, "grades": [85, 100, 90]},
        doc! {"_id": 4, "grades": [
            {"grade": 80, "mean": 75, "std": 8},
            {"grade": 85, "mean": 90, "std": 5},
            {"grade": 85, "mean": 85, "std": 8},
        ]},
        doc! {"_id": 5, "grades": [
            {"grade": 80, "mean": 75, "std": 8},
            {"grade": 85, "mean": 90, "std": 5},
            {"grade": 90, "mean": 85, "std": 3},
        ]},
    ])
    .await;
    // Update values in an array: the first element equal to 80.
    let r = coll
        .update_one(
            doc! {"_id": 1, "grades": 80},
            doc! {"$set": {"grades.$": 82}},
        )
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    assert_eq!(get(&coll, 1).await, doc! {"_id": 1, "grades": [85, 82, 80]});
    // Update documents in an array (`grades.$.std`).
    coll.update_one(
        doc! {"_id": 4, "grades.grade": 85},
        doc! {"$set": {"grades.$.std": 6}},
    )
    .await
    .unwrap();
    assert_eq!(
        get(&coll, 4).await.get_array("grades").unwrap()[1],
        Bson::Document(doc! {"grade": 85, "mean": 90, "std": 6})
    );
    // Several conditions on one element: `$elemMatch`.
    coll.update_one(
        doc! {"_id": 5, "grades": {"$elemMatch": {"grade": {"$lte": 90}, "mean": {"$gt": 80}}}},
        doc! {"$set": {"grades.$.std": 6}},
    )
    .await
    .unwrap();
    assert_eq!(
        get(&coll, 5).await,
        doc! {"_id": 5, "grades": [
            {"grade": 80, "mean": 75, "std": 8},
            {"grade": 85, "mean": 90, "std": 6},
            {"grade": 90, "mean": 85, "std": 3},
        ]}
    );
    // `$unset` of an element leaves null in its place.
    coll.update_one(
        doc! {"_id": 3, "grades": 100},
        doc! {"$unset": {"grades.$": ""}},
    )
    .await
    .unwrap();
    assert_eq!(
        get(&coll, 3).await,
        doc! {"_id": 3, "grades": [85, Bson::Null, 90]}
    );
    // Other operators on the element, `$inc` and `$push` below it.
    coll.update_one(
        doc! {"_id": 2, "grades": {"$gt": 89}},
        doc! {"$inc": {"grades.$": 1}},
    )
    .await
    .unwrap();
    assert_eq!(get(&coll, 2).await, doc! {"_id": 2, "grades": [88, 91, 92]});
    coll.update_one(
        doc! {"grades.grade": 90},
        doc! {"$push": {"grades.$.notes": "top"}},
    )
    .await
    .unwrap();
    assert_eq!(
        get(&coll, 5).await.get_array("grades").unwrap()[2],
        Bson::Document(doc! {"grade": 90, "mean": 85, "std": 3, "notes": ["top"]})
    );
    server.shutdown().await;
}

#[tokio::test]
async fn position_from_the_array_the_match_traversed_last() {
    let (server, db, coll) = setup(vec![
        doc! {"_id": 8, "activity_ids": [1, 2], "grades": [90, 95], "deans_list": [2021, 2020]},
        doc! {"_id": 1, "a": [1, 2, 3], "b": [10, 20, 30]},
        doc! {"_id": 2, "a": [{"b": [0]}, {"b": [0, 1]}]},
        doc! {"_id": 3, "x": [1, 2], "obj": {"k": 1}},
    ])
    .await;
    // The manual's "multiple array matches": the position comes from `grades` (index 1), the
    // array the normalized match traverses last, not from `deans_list`.
    coll.update_one(
        doc! {"activity_ids": 1, "grades": 95, "deans_list": 2021},
        doc! {"$set": {"deans_list.$": 2022}},
    )
    .await
    .unwrap();
    assert_eq!(
        get(&coll, 8).await.get_array("deans_list").unwrap(),
        &vec![Bson::Int32(2021), Bson::Int32(2022)]
    );
    // A condition on another array gives the position (MongoDB 4.4+).
    coll.update_one(doc! {"a": 2}, doc! {"$set": {"b.$": 0}})
        .await
        .unwrap();
    assert_eq!(
        get(&coll, 1).await,
        doc! {"_id": 1, "a": [1, 2, 3], "b": [10, 0, 30]}
    );
    // `$gt` sorts after an equality in mongod's normalized order: its position (of `b`, 2)
    // wins over the one of `a` (0), as for the positional projection.
    coll.update_one(doc! {"b": {"$gt": 25}, "a": 1}, doc! {"$set": {"a.$": -1}})
        .await
        .unwrap();
    assert_eq!(
        get(&coll, 1).await,
        doc! {"_id": 1, "a": [1, 2, -1], "b": [10, 0, 30]}
    );
    // The projection agrees with the update on the same query.
    let r = db
        .run_command(doc! {"find": "c", "filter": {"b": {"$gt": 25}, "a": 1}, "projection": {"a.$": 1, "_id": 0}})
        .await
        .unwrap();
    let first = r
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap();
    assert_eq!(first, &vec![Bson::Document(doc! {"a": [-1]})]);
    // Through nested arrays the outermost array's index is recorded.
    coll.update_one(doc! {"a.b": 1}, doc! {"$set": {"a.$.hit": true}})
        .await
        .unwrap();
    assert_eq!(
        get(&coll, 2).await,
        doc! {"_id": 2, "a": [{"b": [0]}, {"b": [0, 1], "hit": true}]}
    );
    // The position names a field wherever the path leads (update_object_node.cpp applies the
    // positional child under that name): a missing path is created as an object.
    coll.update_one(doc! {"x": 2}, doc! {"$set": {"y.$": "new", "obj.$": 5}})
        .await
        .unwrap();
    assert_eq!(
        get(&coll, 3).await,
        doc! {"_id": 3, "x": [1, 2], "obj": {"k": 1, "1": 5}, "y": {"1": "new"}}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn each_document_its_own_position() {
    let (server, db, coll) = setup(vec![
        doc! {"_id": 1, "v": [1, 5, 9]},
        doc! {"_id": 2, "v": [5, 1, 1]},
        doc! {"_id": 3, "v": [0, 0, 5]},
        doc! {"_id": 4, "v": [7]},
    ])
    .await;
    let r = coll
        .update_many(doc! {"v": 5}, doc! {"$set": {"v.$": 50}})
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (3, 3));
    let all: Vec<Document> = {
        let mut cur = coll.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap();
        let mut out = Vec::new();
        while cur.advance().await.unwrap() {
            out.push(cur.deserialize_current().unwrap());
        }
        out
    };
    assert_eq!(
        all,
        vec![
            doc! {"_id": 1, "v": [1, 50, 9]},
            doc! {"_id": 2, "v": [50, 1, 1]},
            doc! {"_id": 3, "v": [0, 0, 50]},
            doc! {"_id": 4, "v": [7]},
        ]
    );
    // Several statements in one command, each with its own query and position.
    let r = db
        .run_command(doc! {"update": "c", "updates": [
            {"q": {"_id": 1, "v": 9}, "u": {"$set": {"v.$": 90}}},
            {"q": {"v": {"$lt": 1}}, "u": {"$inc": {"v.$": 3}}},
            {"q": {"_id": 2, "v": 1}, "u": {"$set": {"v.$": 10}}, "multi": true},
        ]})
        .await
        .unwrap();
    assert_eq!(r.get_i32("nModified").unwrap(), 3, "{r}");
    assert_eq!(get(&coll, 1).await, doc! {"_id": 1, "v": [1, 50, 90]});
    assert_eq!(get(&coll, 2).await, doc! {"_id": 2, "v": [50, 10, 1]});
    assert_eq!(get(&coll, 3).await, doc! {"_id": 3, "v": [3, 0, 50]});
    // findAndModify, with the post-image.
    let r = db
        .run_command(doc! {
            "findAndModify": "c",
            "query": {"_id": 4, "v": {"$elemMatch": {"$gte": 7}}},
            "update": {"$mul": {"v.$": 2}},
            "new": true,
        })
        .await
        .unwrap();
    assert_eq!(
        r.get_document("value").unwrap(),
        &doc! {"_id": 4, "v": [14]}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn upserts() {
    let (server, db, coll) = setup(vec![doc! {"_id": 1, "tags": ["a", "b"]}]).await;
    // An upsert that finds its document updates it like any update.
    let r = coll
        .update_one(doc! {"_id": 1, "tags": "b"}, doc! {"$set": {"tags.$": "B"}})
        .upsert(true)
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.upserted_id), (1, None));
    assert_eq!(get(&coll, 1).await, doc! {"_id": 1, "tags": ["a", "B"]});
    // One that inserts has no position (upsert_stage.cpp applies the update with an empty
    // matched field): code 2, nothing inserted.
    assert_eq!(
        update_error(
            &db,
            doc! {"q": {"_id": 2, "tags": "x"}, "u": {"$set": {"tags.$": "y"}}, "upsert": true}
        )
        .await,
        2
    );
    let e = db
        .run_command(doc! {
            "findAndModify": "c", "query": {"_id": 3, "tags": "x"},
            "update": {"$set": {"tags.$": "y"}}, "upsert": true,
        })
        .await
        .expect_err("positional upsert insert");
    assert_eq!(code(&e), Some(2), "{e}");
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn errors_with_mongod_codes() {
    let (server, db, coll) = setup(vec![doc! {"_id": 1, "a": [1, 2, 3], "n": 5}]).await;
    for (stmt, expected) in [
        // No position recorded: no array in the query, an `$or`, a negation (code 2,
        // update_object_node.cpp).
        (doc! {"q": {"_id": 1}, "u": {"$set": {"a.$": 0}}}, 2),
        (
            doc! {"q": {"$or": [{"a": 2}, {"z": 1}]}, "u": {"$set": {"a.$": 0}}},
            2,
        ),
        (
            doc! {"q": {"a": {"$nin": [7]}}, "u": {"$set": {"a.$": 0}}},
            2,
        ),
        (doc! {"q": {"n": 5}, "u": {"$setOnInsert": {"a.$": 0}}}, 2),
        // Paths: two `$`, `$` or `$[]` first (BadValue when parsed, update_object_node.cpp).
        (doc! {"q": {"a": 2}, "u": {"$set": {"a.$.b.$": 0}}}, 2),
        (doc! {"q": {"a": 2}, "u": {"$set": {"$": 0}}}, 2),
        (doc! {"q": {"a": 2}, "u": {"$set": {"$.x": 0}}}, 2),
        (doc! {"q": {"a": 2}, "u": {"$set": {"$[]": 0}}}, 2),
        // `$` made `a.1` meets `a.1` (update_node.cpp: ConflictingUpdateOperators).
        (
            doc! {"q": {"a": 2}, "u": {"$set": {"a.$": 0, "a.1": 9}}},
            40,
        ),
        (
            doc! {"q": {"a": 2}, "u": {"$set": {"a.$": 0, "a.1.x": 9}}},
            40,
        ),
        (
            doc! {"q": {"a": 2}, "u": {"$set": {"a.$": 0}, "$rename": {"n": "a.1"}}},
            40,
        ),
        // The position names a field of a scalar: the path cannot be created.
        (doc! {"q": {"a": 2}, "u": {"$set": {"n.$": 0}}}, 28),
    ] {
        assert_eq!(update_error(&db, stmt.clone()).await, expected, "{stmt}");
    }
    // Nothing changed.
    assert_eq!(get(&coll, 1).await, doc! {"_id": 1, "a": [1, 2, 3], "n": 5});
    // No conflict when the position is elsewhere.
    coll.update_one(doc! {"a": 3}, doc! {"$set": {"a.$": 30, "a.1": 20}})
        .await
        .unwrap();
    assert_eq!(
        get(&coll, 1).await,
        doc! {"_id": 1, "a": [1, 20, 30], "n": 5}
    );
    // The driver reports the write error with its code.
    let e = coll
        .update_one(doc! {"n": 5}, doc! {"$set": {"a.$": 0}})
        .await
        .expect_err("no position");
    assert_eq!(code(&e), Some(2), "{e}");
    server.shutdown().await;
}
