//! Input MongoDB refuses is refused with MongoDB's codes, and whatever cannot be sent is
//! answered with an error: never a dropped connection, never a skipped change event.

mod common;

use bson::{doc, Bson, Document};
use futures_util::{StreamExt, TryStreamExt};
use mongo_testserver::TestServer;
use mongodb::options::FullDocumentType;
use mongodb::Database;

use common::{client, code};

/// Runs a command and returns the server's error code; a transport error (a dropped
/// connection) fails the test.
async fn err_code(db: &Database, cmd: Document) -> i32 {
    match db.run_command(cmd.clone()).await {
        Ok(r) => panic!("{cmd} succeeded: {r}"),
        Err(e) => code(&e).unwrap_or_else(|| panic!("{cmd}: not a server error: {e}")),
    }
}

async fn ok(db: &Database, cmd: Document) -> Document {
    db.run_command(cmd.clone())
        .await
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// `{x: {x: ... {x: 1}}}` with `levels` levels (the document itself being level 1).
fn nested(levels: usize) -> Document {
    let mut d = doc! {"x": 1};
    for _ in 1..levels {
        d = doc! {"x": d};
    }
    d
}

#[tokio::test]
async fn nul_bytes_in_field_names_are_refused_on_every_write_path() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    ok(&db, doc! {"insert": "c", "documents": [{"_id": 1, "a": 1}]}).await;

    // $rename to a name with a NUL byte: BadValue.
    let upd = |u: Bson, upsert: bool| {
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": u, "upsert": upsert}]}
    };
    let write_error = |r: Document| -> i32 {
        let errors = r.get_array("writeErrors").expect("writeErrors");
        errors[0].as_document().unwrap().get_i32("code").unwrap()
    };
    let r = ok(
        &db,
        upd(Bson::Document(doc! {"$rename": {"a": "b\0"}}), false),
    )
    .await;
    assert_eq!(write_error(r), 2);

    // Pipeline updates: $setField (refused up front, 9534700), $arrayToObject ([k, v] and {k, v}
    // forms), $replaceWith.
    let cases: Vec<(Bson, i32)> = vec![
        (
            bson::bson!([{"$set": {"n": {"$setField": {"field": "b\0", "input": {}, "value": 1}}}}]),
            9534700,
        ),
        (
            bson::bson!([{"$replaceWith": {"$setField": {"field": "b\0", "input": "$$ROOT", "value": 1}}}]),
            9534700,
        ),
        (
            bson::bson!([{"$set": {"n": {"$arrayToObject": [[["b\0", 1]]]}}}]),
            4940400,
        ),
        (
            bson::bson!([{"$set": {"n": {"$arrayToObject": [[{"k": "b\0", "v": 1}]]}}}]),
            4940401,
        ),
        (
            bson::bson!([{"$replaceWith": {"$arrayToObject": [[["_id", 1], ["\0", 1]]]}}]),
            4940400,
        ),
    ];
    for (pipeline, expected) in &cases {
        let r = ok(&db, upd(pipeline.clone(), false)).await;
        assert_eq!(write_error(r), *expected, "{pipeline}");
        // findAndModify, on the document and as an upsert.
        for (q, upsert) in [(doc! {"_id": 1}, false), (doc! {"_id": 2}, true)] {
            let got = err_code(
                &db,
                doc! {"findAndModify": "c", "query": q, "update": pipeline.clone(), "upsert": upsert},
            )
            .await;
            assert_eq!(got, *expected, "{pipeline}");
        }
    }
    // An upsert through update with $rename/$setField stores nothing either.
    let r = ok(
        &db,
        doc! {"update": "c", "updates": [{"q": {"_id": 3}, "u": cases[0].0.clone(), "upsert": true}]},
    )
    .await;
    assert_eq!(write_error(r), 9534700);

    // Aggregation results that would carry such a name fail the same way.
    let agg = |expr: Bson| {
        doc! {"aggregate": "c", "pipeline": [{"$project": {"n": expr}}], "cursor": {}}
    };
    assert_eq!(
        err_code(&db, agg(bson::bson!({"$arrayToObject": [[["a\0b", 1]]]}))).await,
        4940400
    );
    assert_eq!(
        err_code(
            &db,
            agg(bson::bson!({"$setField": {"field": "a\0", "input": {}, "value": 1}}))
        )
        .await,
        9534700
    );

    // Nothing was stored: the collection holds the one original document and reads fine.
    let docs: Vec<Document> = db
        .collection::<Document>("c")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(docs, vec![doc! {"_id": 1, "a": 1}]);
    server.shutdown().await;
}

#[tokio::test]
async fn nesting_limits_are_answered_not_dropped() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");

    // A stored document may nest 180 levels; empty documents do not count.
    let mut deepest = nested(180);
    deepest.insert("_id", 1);
    deepest.insert("e", doc! {});
    ok(&db, doc! {"insert": "c", "documents": [deepest.clone()]}).await;
    let r = ok(&db, doc! {"find": "c", "filter": {"_id": 1}}).await;
    let got = r
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(got.len(), 1);

    // 181 levels: Overflow, through insert, update and findAndModify.
    let mut too_deep = nested(181);
    too_deep.insert("_id", 2);
    let r = ok(&db, doc! {"insert": "c", "documents": [too_deep]}).await;
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(e.get_i32("code").unwrap(), 15, "{e}");
    let deep_value = nested(180);
    let r = ok(
        &db,
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"y": deep_value.clone()}}}]},
    )
    .await;
    assert!(r.get_array("writeErrors").is_ok(), "{r}");
    assert_eq!(
        err_code(
            &db,
            doc! {"findAndModify": "c", "query": {"_id": 9}, "update": {"$set": {"y": deep_value}}, "upsert": true}
        )
        .await,
        15
    );

    // A command of 200 levels is parsed; a deeper one is answered with Overflow.
    let filter = |levels: usize| doc! {"find": "c", "filter": {"x": nested(levels - 2)}};
    ok(&db, filter(200)).await;
    assert_eq!(err_code(&db, filter(201)).await, 15);
    assert_eq!(err_code(&db, filter(260)).await, 15);
    // Deep but accepted aggregation input (expressions, $match) does not crash the server.
    let mut expr = Bson::String("$_id".into());
    for _ in 0..95 {
        expr = Bson::Document(doc! {"$add": [expr, 1]});
    }
    ok(
        &db,
        doc! {"aggregate": "c", "pipeline": [{"$project": {"v": expr}}], "cursor": {}},
    )
    .await;
    // The connection is still in service.
    ok(&db, doc! {"ping": 1}).await;
    server.shutdown().await;
}

#[tokio::test]
async fn results_over_16_mib_are_bson_object_too_large() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let big = "x".repeat(9 << 20);
    for id in 0..2 {
        ok(
            &db,
            doc! {"insert": "c", "documents": [{"_id": id, "s": big.clone()}]},
        )
        .await;
    }
    // Each document fits; one document holding both does not.
    let r = ok(&db, doc! {"find": "c", "batchSize": 1}).await;
    assert!(r.get_document("cursor").is_ok());
    let got = err_code(
        &db,
        doc! {"aggregate": "c", "pipeline": [{"$group": {"_id": null, "all": {"$push": "$s"}}}], "cursor": {}},
    )
    .await;
    assert_eq!(got, 10334);
    // Both in one reply would be over 16 MiB: the driver gets them in two batches.
    let all: Vec<Document> = db
        .collection::<Document>("c")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.len(), 2);
    server.shutdown().await;
}

#[tokio::test]
async fn an_event_too_large_to_send_fails_the_stream_and_is_never_skipped() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let coll = db.collection::<Document>("c");
    let mut stream = coll
        .watch()
        .full_document(FullDocumentType::UpdateLookup)
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    // An update event with updateLookup carries the change and the whole document: with a
    // 9 MiB field that is over 16 MiB, which mongod answers with BSONObjectTooLarge.
    let big = "x".repeat(9 << 20);
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"s": big}})
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();

    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.document_key, Some(doc! {"_id": 1}));
    let token = stream.resume_token().unwrap();
    let e = stream.next().await.unwrap().unwrap_err();
    assert_eq!(code(&e), Some(10334), "{e}");

    // Resuming after the last event delivered reaches the same event and fails again: the
    // stream never moves past it.
    for _ in 0..2 {
        // The event is reached while filling the first batch (the aggregate fails) or in a
        // getMore, as in mongod.
        let e = match coll
            .watch()
            .full_document(FullDocumentType::UpdateLookup)
            .resume_after(token.clone())
            .await
        {
            Err(e) => e,
            Ok(mut resumed) => resumed.next().await.unwrap().unwrap_err(),
        };
        assert_eq!(code(&e), Some(10334), "{e}");
    }
    // Without updateLookup the event is small and arrives, and so does the one after it.
    let mut plain = coll.watch().resume_after(token).await.unwrap();
    let update = plain.next().await.unwrap().unwrap();
    assert_eq!(update.document_key, Some(doc! {"_id": 1}));
    let insert = plain.next().await.unwrap().unwrap();
    assert_eq!(insert.document_key, Some(doc! {"_id": 2}));
    server.shutdown().await;
}

#[tokio::test]
async fn dollar_prefixed_names_below_the_top_level_can_be_written() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let db = c.database("db");
    let coll = db.collection::<Document>("c");
    // Inserts accept `$`-prefixed names at any level.
    coll.insert_one(doc! {"_id": 1, "$price": 5, "pricing": {"$discount": 60}})
        .await
        .unwrap();
    coll.update_one(
        doc! {"_id": 1},
        doc! {"$set": {"pricing.$discount": 70, "a.$b": 1}, "$rename": {"pricing.$x": "pricing.$y"}},
    )
    .await
    .unwrap();
    coll.update_one(doc! {"_id": 2}, doc! {"$setOnInsert": {"n.$m": 1}})
        .upsert(true)
        .await
        .unwrap();
    let r = ok(
        &db,
        doc! {"findAndModify": "c", "query": {"_id": 1}, "update": {"$inc": {"pricing.$discount": 1}}, "new": true},
    )
    .await;
    assert_eq!(
        r.get_document("value").unwrap(),
        &doc! {"_id": 1, "$price": 5, "pricing": {"$discount": 71}, "a": {"$b": 1}}
    );
    assert_eq!(
        coll.find_one(doc! {"_id": 2}).await.unwrap().unwrap(),
        doc! {"_id": 2, "n": {"$m": 1}}
    );
    // A top-level `$` name in an update of a stored document is refused.
    let r = ok(
        &db,
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"$price": 6}}}]},
    )
    .await;
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .get_i32("code")
        .unwrap();
    assert_eq!(e, 52);
    // An upsert that inserts may store one (MongoDB's manual: upserts are validated as
    // inserts), and a findAndModify upsert as well.
    let r = ok(
        &db,
        doc! {"update": "c", "updates": [{"q": {"_id": 5}, "u": {"$set": {"$hotel": 320}}, "upsert": true}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
    let r = ok(
        &db,
        doc! {"findAndModify": "c", "query": {"_id": 6}, "update": {"$setOnInsert": {"$room": 1}}, "upsert": true, "new": true},
    )
    .await;
    assert_eq!(
        r.get_document("value").unwrap(),
        &doc! {"_id": 6, "$room": 1}
    );
    // `_id` may not hold `$`-prefixed fields.
    let r = ok(&db, doc! {"insert": "c", "documents": [{"_id": {"$a": 1}}]}).await;
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .get_i32("code")
        .unwrap();
    assert_eq!(e, 52);
    server.shutdown().await;
}
