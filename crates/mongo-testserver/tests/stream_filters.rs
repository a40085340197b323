//! Change-stream `$match` stages tested before events are built, and change streams whose
//! stages nest deeply, through the driver.

mod common;

use std::time::Duration;

use bson::{doc, Bson, Document};
use futures_util::StreamExt;
use mongo_testserver::TestServer;
use mongodb::change_stream::ChangeStream;
use mongodb::options::FullDocumentType;
use mongodb::Collection;

use common::client;

const GENEROUS: Duration = Duration::from_secs(20);

async fn next(stream: &mut ChangeStream<Document>) -> Document {
    tokio::time::timeout(GENEROUS, stream.next())
        .await
        .expect("an event within the bound")
        .expect("stream open")
        .unwrap_or_else(|e| panic!("event failed: {e}"))
}

async fn open(coll: &Collection<Document>, pipeline: Vec<Document>) -> ChangeStream<Document> {
    coll.watch()
        .pipeline(pipeline)
        .full_document(FullDocumentType::UpdateLookup)
        .await
        .unwrap_or_else(|e| panic!("watch failed: {e}"))
        .with_type::<Document>()
}

/// Events until (and including) the insert of `_id: "end"`.
async fn until_end(stream: &mut ChangeStream<Document>) -> Vec<Document> {
    let mut out = Vec::new();
    loop {
        let e = next(stream).await;
        let end = e.get_str("operationType") == Ok("insert")
            && e.get_document("documentKey").ok() == Some(&doc! {"_id": "end"});
        out.push(e);
        if end {
            return out;
        }
    }
}

/// Filters in the shapes mongolock and others use: each is watched twice, once as is (its
/// conjuncts on `operationType`/`ns`/`documentKey` tested before the event is built) and once
/// with an `$expr` conjunct that is always true (which turns that off); both must return the
/// same events.
#[tokio::test]
async fn a_filtered_stream_returns_the_same_events_as_an_unfiltered_one() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("locks");
    let names = vec![Bson::from("a"), Bson::from("b"), Bson::from("end")];
    let filters = vec![
        doc! {
            "$or": [
                {"operationType": {"$in": ["insert", "replace", "delete", "drop", "invalidate"]}},
                {"operationType": "update", "updateDescription.updatedFields.lease": {"$exists": true}},
            ],
            "$nor": [
                {"updateDescription.updatedFields.lease": "mine"},
                {"fullDocument.lease": "mine"},
            ],
            "$and": [{"$or": [
                {"documentKey._id": {"$in": names.clone()}},
                {"operationType": {"$in": ["drop", "dropDatabase", "rename", "invalidate"]}},
            ]}],
        },
        doc! {"documentKey._id": {"$nin": ["a"]}, "ns.coll": "locks"},
        doc! {"$nor": [{"documentKey._id": "b"}, {"operationType": "delete"}]},
        doc! {"$or": [{"documentKey._id": "x"}, {"fullDocument.n": 2}, {"_id": {"$exists": false}}]},
        doc! {"$and": [{"operationType": {"$ne": "update"}}, {"fullDocument.n": {"$gte": 1}}]},
    ];
    let mut streams = Vec::new();
    for f in &filters {
        let mut unpushed = f.clone();
        unpushed.insert("$expr", doc! {"$literal": true});
        let project = doc! {"$project": {"wallTime": 0}};
        streams.push((
            f.clone(),
            open(&coll, vec![doc! {"$match": f.clone()}, project.clone()]).await,
            open(&coll, vec![doc! {"$match": unpushed}, project]).await,
        ));
    }
    for name in ["a", "b", "c", "x"] {
        coll.insert_one(doc! {"_id": name, "n": 1}).await.unwrap();
        coll.update_one(doc! {"_id": name}, doc! {"$set": {"lease": "mine", "n": 2}})
            .await
            .unwrap();
        coll.update_one(doc! {"_id": name}, doc! {"$set": {"lease": "other"}})
            .await
            .unwrap();
        coll.update_one(doc! {"_id": name}, vec![doc! {"$set": {"n": 3}}])
            .await
            .unwrap();
        coll.replace_one(doc! {"_id": name}, doc! {"lease": "mine", "n": 4})
            .await
            .unwrap();
    }
    coll.delete_one(doc! {"_id": "b"}).await.unwrap();
    coll.delete_one(doc! {"_id": "c"}).await.unwrap();
    coll.insert_one(doc! {"_id": "end", "n": 2}).await.unwrap();
    for (filter, mut pushed, mut plain) in streams {
        let got = until_end(&mut pushed).await;
        let want = until_end(&mut plain).await;
        assert_eq!(got, want, "events of {filter}");
        assert!(!got.is_empty(), "{filter}");
    }
    server.shutdown().await;
}

/// A stream whose stages nest deeply evaluates them on every `getMore`, not only in the
/// `aggregate` that opened it: those run on a thread with a large stack too.
#[tokio::test]
async fn deeply_nested_stream_stages_are_evaluated_by_get_more() {
    let server = TestServer::start().await.unwrap();
    let c = client(&server).await;
    let coll = c.database("db").collection::<Document>("c");
    let mut expr = Bson::String("$documentKey._id".into());
    for _ in 0..95 {
        expr = Bson::Document(doc! {"$add": [expr, 1]});
    }
    let mut nested_match = doc! {"operationType": "insert"};
    for _ in 0..60 {
        nested_match = doc! {"$and": [nested_match]};
    }
    let mut stream = open(
        &coll,
        vec![
            doc! {"$match": nested_match},
            doc! {"$addFields": {"v": expr}},
        ],
    )
    .await;
    for id in 0..3 {
        coll.insert_one(doc! {"_id": id}).await.unwrap();
    }
    for id in 0..3 {
        let e = next(&mut stream).await;
        assert_eq!(e.get_i32("v"), Ok(id + 95), "{e}");
    }
    // The connection is still in service.
    c.database("db")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    server.shutdown().await;
}
