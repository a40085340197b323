//! Property test: random field names (NUL bytes, `$`, `.`, empty, non-ASCII) and random nested
//! documents go through insert, update (operators, replacements, pipelines), findAndModify,
//! aggregate and a change stream over TCP with the official driver. Whatever the input, every
//! command gets a reply that decodes — a document or an error with a code — the connection is
//! never dropped, and the change stream delivers every write up to a final sentinel.
//!
//! `MONGO_TESTSERVER_FUZZ_CASES` sets the number of cases (default 24, a few seconds).

mod common;

use std::time::Duration;

use bson::{doc, Bson, Document};
use futures_util::StreamExt;
use mongo_testserver::TestServer;
use mongodb::error::ErrorKind;
use mongodb::options::{ClientOptions, FullDocumentType};
use mongodb::{Client, Database};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// A field name made of characters MongoDB treats specially.
fn name() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        Just('\0'),
        Just('$'),
        Just('.'),
        Just('a'),
        Just('b'),
        Just('_'),
        Just('é'),
        Just('🔒'),
        Just(' '),
    ];
    prop_oneof![
        4 => proptest::collection::vec(ch, 0..5).prop_map(String::from_iter),
        1 => Just("_id".to_string()),
        1 => Just("$set".to_string()),
    ]
}

/// A name the driver can send as a document key (BSON keys cannot hold NUL).
fn key(n: &str) -> String {
    n.replace('\0', "0")
}

fn leaf() -> impl Strategy<Value = Bson> {
    prop_oneof![
        any::<i32>().prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(-0.0)
        ]
        .prop_map(Bson::Double),
        name().prop_map(Bson::String),
        any::<bool>().prop_map(Bson::Boolean),
        Just(Bson::Null),
        prop_oneof![
            Just("0.1"),
            Just("1.00"),
            Just("-0"),
            Just("NaN"),
            Just("-Infinity"),
            Just("1E-6176"),
            Just("9.999999999999999999999999999999999E+6144"),
        ]
        .prop_map(|s| Bson::Decimal128(s.parse().unwrap())),
    ]
}

/// Random documents and arrays, up to a few levels, with random names.
fn value() -> impl Strategy<Value = Bson> {
    leaf().prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
            proptest::collection::vec((name(), inner), 0..4).prop_map(|fields| {
                Bson::Document(fields.into_iter().map(|(k, v)| (key(&k), v)).collect())
            }),
        ]
    })
}

/// `{x: {x: ... v}}`, `levels` deep.
fn nested(levels: usize, v: Bson) -> Bson {
    let mut d = v;
    for _ in 0..levels {
        d = Bson::Document(doc! {"x": d});
    }
    d
}

#[derive(Debug, Clone)]
struct Case {
    names: Vec<String>,
    values: Vec<Bson>,
    deep: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(name(), 4),
        proptest::collection::vec(value(), 4),
        prop_oneof![Just(0usize), 150usize..=215],
    )
        .prop_map(|(names, values, deep)| Case {
            names,
            values,
            deep,
        })
}

/// The commands one case sends.
fn commands(c: &Case, id: i64) -> Vec<Document> {
    let [n0, n1, n2, n3] = [&c.names[0], &c.names[1], &c.names[2], &c.names[3]];
    let [v0, v1, v2, v3] = [&c.values[0], &c.values[1], &c.values[2], &c.values[3]];
    let mut doc0 = Document::new();
    doc0.insert("_id", id);
    doc0.insert(key(n0), v0.clone());
    doc0.insert(key(n1), v1.clone());
    let q = doc! {"_id": id};
    let upd = |u: Bson, upsert: bool| {
        doc! {"update": "c", "updates": [{"q": q.clone(), "u": u, "upsert": upsert}]}
    };
    let fam = |u: Bson, upsert: bool| {
        doc! {"findAndModify": "c", "query": q.clone(), "update": u, "upsert": upsert, "new": true}
    };
    let set_field = Bson::Document(doc! {
        "$setField": {"field": n2.clone(), "input": "$$ROOT", "value": {"$literal": v2.clone()}}
    });
    let to_object = Bson::Document(doc! {
        "$arrayToObject": [[[n3.clone(), {"$literal": v3.clone()}], ["_id", id]]]
    });
    let mut out = vec![
        doc! {"insert": "c", "documents": [doc0.clone()]},
        upd(
            Bson::Document(
                doc! {"$set": {key(n2): v2.clone(), key(&format!("x.{n3}")): v3.clone()}},
            ),
            false,
        ),
        upd(
            Bson::Document(doc! {"$rename": {key(n0): n1.clone()}}),
            false,
        ),
        upd(
            Bson::Document(doc! {"$setOnInsert": {key(n1): v1.clone()}, "$inc": {"k": 1}}),
            true,
        ),
        upd(Bson::Document(doc0.clone()), false),
        upd(bson::bson!([{"$replaceWith": set_field.clone()}]), false),
        upd(bson::bson!([{"$set": {"o": to_object.clone()}}]), true),
        fam(bson::bson!([{"$replaceWith": to_object.clone()}]), true),
        fam(Bson::Document(doc! {"$set": {key(n3): v0.clone()}}), true),
        fam(
            Bson::Document(doc! {"$rename": {key(n2): n0.clone()}}),
            false,
        ),
        upd(
            Bson::Document(doc! {"$inc": {"i": v0.clone()}, "$mul": {"m": v1.clone()}}),
            true,
        ),
        doc! {"aggregate": "c", "pipeline": [{"$group": {"_id": null,
            "s": {"$sum": {"$literal": v0.clone()}},
            "a": {"$avg": {"$add": [{"$literal": v1.clone()}, {"$literal": v2.clone()}]}},
        }}], "cursor": {}},
        doc! {"aggregate": "c", "pipeline": [
            {"$project": {"a": to_object.clone(), "b": set_field.clone()}},
            {"$group": {"_id": null, "all": {"$push": "$$ROOT"}}},
        ], "cursor": {}},
        doc! {"find": "c", "filter": {key(n0): v0.clone()}, "projection": {"_id": 0}},
        doc! {"aggregate": "c", "pipeline": [{"$replaceWith": {"$mergeObjects": ["$$ROOT", to_object]}}], "cursor": {}},
    ];
    if c.deep > 0 {
        let deep = nested(c.deep, v1.clone());
        out.push(doc! {"insert": "c", "documents": [{"_id": id + 1_000_000, "d": deep.clone()}]});
        out.push(upd(
            Bson::Document(doc! {"$set": {"d": deep.clone()}}),
            true,
        ));
        out.push(doc! {"find": "c", "filter": {"d": deep}});
    }
    out.push(doc! {"delete": "c", "deletes": [{"q": {"_id": {"$gte": id}}, "limit": 0}]});
    out
}

/// Sends one command; any outcome but a reply (a document, or an error the server sent) fails.
async fn send(db: &Database, cmd: Document) -> Result<(), TestCaseError> {
    match db.run_command(cmd.clone()).await {
        Ok(_) => Ok(()),
        Err(e) => match &*e.kind {
            ErrorKind::Command(_) | ErrorKind::Write(_) | ErrorKind::InsertMany(_) => Ok(()),
            // The driver refuses to encode a command it cannot represent: not the server's
            // concern.
            ErrorKind::BsonSerialization(_) | ErrorKind::InvalidArgument { .. } => Ok(()),
            _ => Err(TestCaseError::fail(format!("{cmd}: {e}"))),
        },
    }
}

#[test]
fn random_names_and_documents_never_drop_a_connection() {
    let cases: u32 = std::env::var("MONGO_TESTSERVER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server, client) = rt.block_on(async {
        let server = TestServer::start().await.unwrap();
        let mut opts = ClientOptions::parse(server.uri()).await.unwrap();
        // A retry would hide a dropped connection.
        opts.retry_writes = Some(false);
        opts.retry_reads = Some(false);
        opts.server_selection_timeout = Some(Duration::from_secs(5));
        (server, Client::with_options(opts).unwrap())
    });
    let db = client.database("fuzz");
    let coll = db.collection::<Document>("c");
    let mut stream = rt.block_on(async {
        coll.watch()
            .full_document(FullDocumentType::UpdateLookup)
            .await
            .unwrap()
    });

    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let next_id = std::cell::Cell::new(0i64);
    let result = runner.run(&case(), |c| {
        let id = next_id.get();
        next_id.set(id + 10);
        rt.block_on(async {
            for cmd in commands(&c, id) {
                send(&db, cmd).await?;
            }
            send(&db, doc! {"ping": 1}).await
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }

    // Every event decodes, and the stream reaches a write made after all of them.
    rt.block_on(async {
        coll.insert_one(doc! {"_id": "sentinel"}).await.unwrap();
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("the change stream stalled")
                .expect("the change stream ended")
                .unwrap_or_else(|e| panic!("change stream error: {e}"));
            if event.document_key == Some(doc! {"_id": "sentinel"}) {
                break;
            }
        }
        server.shutdown().await;
    });
}
