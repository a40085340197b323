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

fn dec(s: &str) -> bson::Bson {
    bson::Bson::Decimal128(s.parse().unwrap())
}

#[tokio::test]
async fn decimal128_is_computed_as_ieee_decimal() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let coll = db.collection::<Document>("d");
    coll.insert_many(vec![
        doc! {"_id": 1, "a": dec("0.1"), "b": dec("0.2"), "n": dec("10"), "z": dec("-0"), "max": dec("9.999999999999999999999999999999999E+6144")},
        doc! {"_id": 2, "a": dec("1E-6176")},
    ])
    .await
    .unwrap();
    let r: Vec<Document> = coll
        .aggregate(vec![
            doc! {"$match": {"_id": 1}},
            doc! {"$project": {
                "sum": {"$add": ["$a", "$b"]},
                "neg": {"$multiply": ["$z", 1]},
                "max": {"$add": ["$max", 0]},
                "third": {"$divide": [dec("1"), 3]},
            }},
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(r[0].get("sum"), Some(&dec("0.3")));
    assert_eq!(r[0].get("neg"), Some(&dec("-0")));
    assert_eq!(
        r[0].get("max"),
        Some(&dec("9.999999999999999999999999999999999E+6144"))
    );
    assert_eq!(
        r[0].get("third"),
        Some(&dec("0.3333333333333333333333333333333333"))
    );

    // $inc keeps decimal digits: 10 + 5 is 15, not 15.0.
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 5}})
        .await
        .unwrap();
    let d = coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
    assert_eq!(d.get("n"), Some(&dec("15")));

    // Equality across types is numeric and exact.
    assert_eq!(coll.count_documents(doc! {"a": 0.1}).await.unwrap(), 0);
    assert_eq!(
        coll.count_documents(doc! {"a": dec("0.10")}).await.unwrap(),
        1
    );
    assert_eq!(coll.count_documents(doc! {"a": 0}).await.unwrap(), 0);
    assert_eq!(
        coll.count_documents(doc! {"a": {"$gt": 0}}).await.unwrap(),
        2
    );
    assert_eq!(coll.count_documents(doc! {"n": 15.0}).await.unwrap(), 1);

    // A unique index sees 1.0 and 1.00 (and 1) as the same key.
    let u = db.collection::<Document>("du");
    u.create_index(
        IndexModel::builder()
            .keys(doc! {"v": 1})
            .options(IndexOptions::builder().unique(true).build())
            .build(),
    )
    .await
    .unwrap();
    u.insert_one(doc! {"v": dec("1.0")}).await.unwrap();
    let e = u.insert_one(doc! {"v": dec("1.00")}).await.unwrap_err();
    assert_eq!(code(&e), Some(11000));
    let e = u.insert_one(doc! {"v": 1}).await.unwrap_err();
    assert_eq!(code(&e), Some(11000));
    u.insert_one(doc! {"v": 0.1}).await.unwrap();
    u.insert_one(doc! {"v": dec("0.1")}).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn positional_updates_and_array_filters() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let coll = db.collection::<Document>("pos");
    coll.insert_one(doc! {
        "_id": 1,
        "grades": [80, 85, 90],
        "items": [{"n": "a", "q": 1}, {"n": "b", "q": 2}],
        "m": [[1, 2], [3]],
    })
    .await
    .unwrap();
    let get = || {
        let coll = coll.clone();
        async move { coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap() }
    };
    // `$`: the element the query matched.
    coll.update_one(
        doc! {"_id": 1, "grades": 85},
        doc! {"$set": {"grades.$": 82}},
    )
    .await
    .unwrap();
    coll.update_one(
        doc! {"_id": 1, "items.n": "b"},
        doc! {"$inc": {"items.$.q": 10}},
    )
    .await
    .unwrap();
    coll.update_one(
        doc! {"_id": 1, "items": {"$elemMatch": {"n": "a", "q": 1}}},
        doc! {"$set": {"items.$.seen": true}},
    )
    .await
    .unwrap();
    // `$[]`: every element, also nested.
    coll.update_one(
        doc! {"_id": 1},
        doc! {"$inc": {"grades.$[]": 1, "m.$[].$[]": 1}},
    )
    .await
    .unwrap();
    // `$[<id>]` with arrayFilters.
    let r = db
        .run_command(doc! {"update": "pos", "updates": [{
            "q": {"_id": 1},
            "u": {"$set": {"grades.$[hi]": 100, "items.$[e].q": 0}},
            "arrayFilters": [{"hi": {"$gte": 83}}, {"e.n": "a"}],
        }]})
        .await
        .unwrap();
    assert_eq!(r.get_i32("nModified").unwrap(), 1, "{r}");
    assert_eq!(
        get().await,
        doc! {
            "_id": 1,
            "grades": [81, 100, 100],
            "items": [{"n": "a", "q": 0, "seen": true}, {"n": "b", "q": 12}],
            "m": [[2, 3], [4]],
        }
    );
    // findAndModify takes arrayFilters too.
    let r = db
        .run_command(doc! {
            "findAndModify": "pos", "query": {"_id": 1},
            "update": {"$mul": {"grades.$[g]": 2}},
            "arrayFilters": [{"g": {"$lt": 100}}], "new": true,
        })
        .await
        .unwrap();
    let value = r.get_document("value").unwrap();
    assert_eq!(
        value.get_array("grades").unwrap(),
        &vec![
            bson::Bson::Int32(162),
            bson::Bson::Int32(100),
            bson::Bson::Int32(100)
        ]
    );

    // Errors, with MongoDB's codes.
    let err = |u: Document, filters: Option<Vec<Document>>, upsert: bool| {
        let db = db.clone();
        async move {
            let mut stmt =
                doc! {"q": {"_id": if upsert { 2 } else { 1 }}, "u": u, "upsert": upsert};
            if let Some(f) = filters {
                stmt.insert("arrayFilters", f);
            }
            let r = db
                .run_command(doc! {"update": "pos", "updates": [stmt]})
                .await;
            match r {
                Ok(r) => r.get_array("writeErrors").unwrap()[0]
                    .as_document()
                    .unwrap()
                    .get_i32("code")
                    .unwrap(),
                Err(e) => code(&e).unwrap(),
            }
        }
    };
    // No array condition in the query for `$`.
    assert_eq!(err(doc! {"$set": {"grades.$": 1}}, None, false).await, 2);
    // `$` in an upsert that inserts.
    assert_eq!(err(doc! {"$set": {"grades.$": 1}}, None, true).await, 2);
    // An identifier without a filter, a filter without a use.
    assert_eq!(err(doc! {"$set": {"grades.$[y]": 1}}, None, false).await, 2);
    assert_eq!(
        err(
            doc! {"$set": {"grades.$[]": 1}},
            Some(vec![doc! {"z": 1}]),
            false
        )
        .await,
        9
    );
    // `$[]` on a missing field or a non-array.
    assert_eq!(err(doc! {"$set": {"nope.$[]": 1}}, None, false).await, 2);
    assert_eq!(err(doc! {"$set": {"_id.$[]": 1}}, None, false).await, 2);
    // `$rename` paths may not be positional.
    assert_eq!(
        err(doc! {"$rename": {"grades.$[]": "x"}}, None, false).await,
        2
    );
    server.shutdown().await;
}

#[tokio::test]
async fn option_types_as_mongodb_checks_them() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    db.collection::<Document>("o")
        .insert_one(doc! {"_id": 1, "n": 1})
        .await
        .unwrap();
    // $match must be an object, also as the first stage and on a missing collection.
    for coll in ["o", "missing"] {
        let e = db
            .run_command(doc! {"aggregate": coll, "pipeline": [{"$match": 5}], "cursor": {}})
            .await
            .unwrap_err();
        assert_eq!(code(&e), Some(15959));
    }
    // Change streams: not on the internal databases; flags are booleans.
    for internal in ["local", "config"] {
        let e = c
            .database(internal)
            .run_command(doc! {"aggregate": "x", "pipeline": [{"$changeStream": {}}], "cursor": {}})
            .await
            .unwrap_err();
        assert_eq!(code(&e), Some(73), "{internal}");
    }
    let e = db
        .run_command(doc! {"aggregate": "o", "pipeline": [{"$changeStream": {"showExpandedEvents": "yes"}}], "cursor": {}})
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(14));
    // Decimals are booleans and null is an omitted option.
    let r = db
        .run_command(doc! {
            "findAndModify": "o", "query": {"_id": 1}, "update": {"$inc": {"n": 1}},
            "new": dec("1"), "upsert": dec("0"), "sort": null, "fields": null,
        })
        .await
        .unwrap();
    assert_eq!(r.get_document("value").unwrap().get_i32("n").unwrap(), 2);
    // findAndModify option types and hints.
    for (field, value, expected) in [
        ("hint", bson::Bson::Int32(5), 9),
        ("hint", bson::Bson::String("nope".into()), 2),
        (
            "bypassDocumentValidation",
            bson::Bson::String("x".into()),
            14,
        ),
    ] {
        let mut cmd =
            doc! {"findAndModify": "o", "query": {"_id": 1}, "update": {"$inc": {"n": 1}}};
        cmd.insert(field, value);
        let e = db.run_command(cmd).await.unwrap_err();
        assert_eq!(code(&e), Some(expected), "{field}");
    }
    db.run_command(doc! {"findAndModify": "o", "query": {"_id": 1}, "update": {"$inc": {"n": 1}}, "hint": "_id_"})
        .await
        .unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn equivalent_partial_filters_are_the_same_index() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let create = |name: &str, filter: Document| {
        doc! {"createIndexes": "eq", "indexes": [{"key": {"a": 1}, "name": name, "partialFilterExpression": filter}]}
    };
    db.run_command(create("p", doc! {"b": 1, "c": {"$gt": 5}}))
        .await
        .unwrap();
    // The same index written differently: nothing to do.
    let r = db
        .run_command(create(
            "p",
            doc! {"$and": [{"c": {"$gt": 5}}, {"b": {"$eq": 1.0}}]},
        ))
        .await
        .unwrap();
    assert_eq!(
        r.get_i32("numIndexesBefore").unwrap(),
        r.get_i32("numIndexesAfter").unwrap(),
        "{r}"
    );
    // Under another name it conflicts with the existing one.
    let e = db
        .run_command(create("q", doc! {"c": {"$gt": 5}, "b": 1}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(85));
    // A different filter on the same key is another index.
    db.run_command(create("r", doc! {"b": 2})).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn ttl_seconds_are_stored_as_an_int() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    db.run_command(doc! {"createIndexes": "t", "indexes": [{"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 100.7}]})
        .await
        .unwrap();
    // The same index given as an integer is the existing one.
    db.run_command(doc! {"createIndexes": "t", "indexes": [{"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 100}]})
        .await
        .unwrap();
    let r = db.run_command(doc! {"listIndexes": "t"}).await.unwrap();
    let batch = r
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    let ttl = batch[1]
        .as_document()
        .unwrap()
        .get("expireAfterSeconds")
        .cloned();
    assert_eq!(ttl, Some(bson::Bson::Int32(100)));
    server.shutdown().await;
}

#[tokio::test]
async fn projections_elem_match_and_positional() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let coll = db.collection::<Document>("proj");
    coll.insert_one(doc! {"_id": 1, "g": [80, 85, 90], "m": [[1, 2], [5, 6]], "d": 4, "e": 5})
        .await
        .unwrap();
    let find = |filter: Document, projection: Document| {
        let coll = coll.clone();
        async move {
            coll.find_one(filter)
                .projection(projection)
                .await
                .map(Option::unwrap)
        }
    };
    // $elemMatch with operator-only conditions, inside an exclusion projection, and on arrays
    // of arrays (an element that is an array is a document keyed by position).
    assert_eq!(
        find(doc! {}, doc! {"g": {"$elemMatch": {"$gte": 85}}, "d": 0})
            .await
            .unwrap(),
        doc! {"_id": 1, "g": [85], "m": [[1, 2], [5, 6]], "e": 5}
    );
    assert_eq!(
        find(doc! {}, doc! {"m": {"$elemMatch": {"0": 5}}, "_id": 0})
            .await
            .unwrap(),
        doc! {"m": [[5, 6]]}
    );
    // The positional projection keeps the element the query selected (find, findAndModify).
    assert_eq!(
        find(doc! {"g": {"$gt": 80}}, doc! {"g.$": 1})
            .await
            .unwrap(),
        doc! {"_id": 1, "g": [85]}
    );
    let r = db
        .run_command(doc! {"findAndModify": "proj", "query": {"g": 90}, "update": {"$set": {"d": 1}}, "fields": {"g.$": 1, "_id": 0}})
        .await
        .unwrap();
    assert_eq!(r.get_document("value").unwrap(), &doc! {"g": [90]});
    let e = find(doc! {"d": 1}, doc! {"g.$": 1}).await.unwrap_err();
    assert_eq!(code(&e), Some(51246));
    server.shutdown().await;
}
