//! Command options checked as mongod's parsers check them: the error code for each wrongly typed
//! or out-of-range option, and the odd values mongod accepts.

mod common;

use bson::{doc, Bson, Decimal128, Document};
use mongo_testserver::TestServer;
use mongodb::Database;

use common::{client, code};

/// What a command's reply should be.
#[derive(Debug, PartialEq)]
enum Outcome {
    Ok,
    /// A command error with this code.
    Error(i32),
    /// `ok: 1` with a first write error of this code.
    WriteError(i32),
}
use Outcome::{Error, Ok as Accepted, WriteError};

async fn outcome(db: &Database, cmd: Document) -> Outcome {
    match db.run_command(cmd).await {
        Ok(reply) => match reply.get_array("writeErrors") {
            Ok(errors) => WriteError(
                errors[0]
                    .as_document()
                    .and_then(|e| e.get_i32("code").ok())
                    .unwrap_or(-1),
            ),
            Err(_) => Accepted,
        },
        Err(e) => Error(code(&e).unwrap_or(-1)),
    }
}

async fn check(db: &Database, cases: Vec<(&str, Document, Outcome)>) {
    let mut wrong = Vec::new();
    for (what, cmd, expected) in cases {
        let got = outcome(db, cmd.clone()).await;
        if got != expected {
            wrong.push(format!("{what}: {cmd} gave {got:?}, expected {expected:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn dec(s: &str) -> Bson {
    Bson::Decimal128(s.parse::<Decimal128>().unwrap())
}

async fn setup() -> (TestServer, Database) {
    let server = TestServer::start().await.unwrap();
    let db = client(&server).await.database("db");
    let docs: Vec<Document> = (0..5).map(|i| doc! {"_id": i, "n": i}).collect();
    db.run_command(doc! {"insert": "c", "documents": docs})
        .await
        .unwrap();
    (server, db)
}

#[tokio::test]
async fn find_and_modify_options() {
    let (server, db) = setup().await;
    let fam = |extra: Document| {
        let mut cmd =
            doc! {"findAndModify": "c", "query": {"_id": 1}, "update": {"$inc": {"n": 1}}};
        cmd.extend(extra);
        cmd
    };
    check(
        &db,
        vec![
            ("sort", fam(doc! {"sort": "x"}), Error(14)),
            ("fields", fam(doc! {"fields": 1}), Error(14)),
            ("query", fam(doc! {"query": "x"}), Error(14)),
            ("new", fam(doc! {"new": "x"}), Error(14)),
            ("upsert", fam(doc! {"upsert": [true]}), Error(14)),
            ("bypass", fam(doc! {"bypassDocumentValidation": "x"}), Error(14)),
            ("arrayFilters", fam(doc! {"arrayFilters": "x"}), Error(14)),
            ("arrayFilters items", fam(doc! {"arrayFilters": [1]}), Error(14)),
            ("let", fam(doc! {"let": 1}), Error(14)),
            ("batchSize", fam(doc! {"batchSize": "x"}), Error(14)),
            ("singleBatch", fam(doc! {"singleBatch": 1}), Error(14)),
            (
                "remove",
                doc! {"findAndModify": "c", "query": {}, "remove": "x"},
                Error(14),
            ),
            // maxTimeMS goes through mongod's generic parseMaxTimeMS: BadValue.
            ("maxTimeMS string", fam(doc! {"maxTimeMS": "x"}), Error(2)),
            ("maxTimeMS null", fam(doc! {"maxTimeMS": null}), Error(2)),
            ("maxTimeMS negative", fam(doc! {"maxTimeMS": -1}), Error(2)),
            ("maxTimeMS fraction", fam(doc! {"maxTimeMS": 1.5}), Error(2)),
            (
                "maxTimeMS too large",
                fam(doc! {"maxTimeMS": 2_147_483_648i64}),
                Error(2),
            ),
            ("hint type", fam(doc! {"hint": 1}), Error(9)),
            ("hint name", fam(doc! {"hint": "nope"}), Error(2)),
            ("hint key", fam(doc! {"hint": {"nope": 1}}), Error(2)),
            // Accepted: numbers as booleans, null as an omitted option, batchSize/singleBatch.
            (
                "numeric booleans",
                fam(doc! {"new": 1i64, "upsert": dec("0"), "bypassDocumentValidation": 0.0}),
                Accepted,
            ),
            (
                "nulls",
                fam(doc! {"new": null, "upsert": null, "remove": null, "sort": null, "fields": null, "let": null, "arrayFilters": null}),
                Accepted,
            ),
            (
                "cursor options",
                fam(doc! {"batchSize": 5, "singleBatch": true}),
                Accepted,
            ),
            (
                "maxTimeMS",
                fam(doc! {"maxTimeMS": 1000.0, "hint": {"_id": 1}}),
                Accepted,
            ),
            (
                "remove as a number",
                doc! {"findAndModify": "c", "query": {"_id": 4}, "remove": dec("1")},
                Accepted,
            ),
        ],
    )
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn find_count_distinct_and_get_more_options() {
    let (server, db) = setup().await;
    let find = |extra: Document| {
        let mut cmd = doc! {"find": "c"};
        cmd.extend(extra);
        cmd
    };
    check(
        &db,
        vec![
            // safeInt64 with a {gte: 0} validator: 51024 when negative, doubles truncated.
            ("limit", find(doc! {"limit": -1}), Error(51024)),
            ("skip", find(doc! {"skip": -1i64}), Error(51024)),
            ("batchSize", find(doc! {"batchSize": -1.1}), Error(51024)),
            ("batchSize type", find(doc! {"batchSize": true}), Error(14)),
            ("limit type", find(doc! {"limit": "x"}), Error(14)),
            (
                "fractions",
                find(doc! {"batchSize": 1.9, "limit": dec("2"), "skip": null}),
                Accepted,
            ),
            // optionalBool flags: a boolean, not even null.
            ("singleBatch", find(doc! {"singleBatch": 1}), Error(14)),
            (
                "singleBatch null",
                find(doc! {"singleBatch": null}),
                Error(14),
            ),
            (
                "noCursorTimeout",
                find(doc! {"noCursorTimeout": "x"}),
                Error(14),
            ),
            ("allowDiskUse", find(doc! {"allowDiskUse": 0}), Error(14)),
            ("sort", find(doc! {"sort": "x"}), Error(14)),
            // `object_owned_nonempty_serialize` fields (find_command.idl): their deserializer
            // takes only an object, null included.
            ("filter null", find(doc! {"filter": null}), Error(14)),
            (
                "projection null",
                find(doc! {"projection": null}),
                Error(14),
            ),
            ("sort null", find(doc! {"sort": null}), Error(14)),
            ("filter empty", find(doc! {"filter": {}}), Accepted),
            ("maxTimeMS string", find(doc! {"maxTimeMS": "x"}), Error(2)),
            ("maxTimeMS negative", find(doc! {"maxTimeMS": -1}), Error(2)),
            ("hint", find(doc! {"hint": "nope"}), Error(2)),
            ("count skip", doc! {"count": "c", "skip": -1}, Error(51024)),
            ("count limit", doc! {"count": "c", "limit": "x"}, Error(14)),
            ("count hint", doc! {"count": "c", "hint": "nope"}, Error(2)),
            (
                "distinct hint",
                doc! {"distinct": "c", "key": "n", "hint": "nope"},
                Error(2),
            ),
            (
                "distinct hint type",
                doc! {"distinct": "c", "key": "n", "hint": 1},
                Error(9),
            ),
        ],
    )
    .await;

    // getMore: batchSize is validated like find's, maxTimeMS is a safeInt64 first.
    let r = db
        .run_command(doc! {"find": "c", "batchSize": 1})
        .await
        .unwrap();
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    check(
        &db,
        vec![
            (
                "getMore batchSize",
                doc! {"getMore": id, "collection": "c", "batchSize": -1},
                Error(51024),
            ),
            (
                "getMore batchSize type",
                doc! {"getMore": id, "collection": "c", "batchSize": false},
                Error(14),
            ),
            (
                "getMore maxTimeMS type",
                doc! {"getMore": id, "collection": "c", "maxTimeMS": "x"},
                Error(14),
            ),
            (
                "getMore maxTimeMS range",
                doc! {"getMore": id, "collection": "c", "maxTimeMS": -1},
                Error(2),
            ),
            (
                "getMore collection type",
                doc! {"getMore": id, "collection": {}},
                Error(14),
            ),
            (
                "getMore empty collection",
                doc! {"getMore": id, "collection": ""},
                Error(73),
            ),
            (
                "getMore cursor id type",
                doc! {"getMore": 1, "collection": "c"},
                Error(14),
            ),
            (
                "getMore",
                doc! {"getMore": id, "collection": "c", "batchSize": 1.9},
                Accepted,
            ),
        ],
    )
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn aggregate_options() {
    let (server, db) = setup().await;
    let agg = |extra: Document| {
        let mut cmd = doc! {"aggregate": "c", "pipeline": [], "cursor": {}};
        cmd.extend(extra);
        cmd
    };
    check(
        &db,
        vec![
            // aggregate parses maxTimeMS as a non-negative safeInt64 before parseMaxTimeMS.
            ("maxTimeMS type", agg(doc! {"maxTimeMS": "x"}), Error(14)),
            ("maxTimeMS negative", agg(doc! {"maxTimeMS": -1}), Error(51024)),
            ("maxTimeMS null", agg(doc! {"maxTimeMS": null}), Error(2)),
            ("maxTimeMS fraction", agg(doc! {"maxTimeMS": 1.5}), Error(2)),
            (
                "batchSize",
                agg(doc! {"cursor": {"batchSize": -1}}),
                Error(51024),
            ),
            (
                "batchSize type",
                agg(doc! {"cursor": {"batchSize": "x"}}),
                Error(14),
            ),
            ("cursor type", agg(doc! {"cursor": 1}), Error(14)),
            (
                "no cursor",
                doc! {"aggregate": "c", "pipeline": []},
                Error(9),
            ),
            ("allowDiskUse", agg(doc! {"allowDiskUse": 1}), Error(14)),
            ("explain", agg(doc! {"explain": "x"}), Error(14)),
            (
                "bypassDocumentValidation",
                agg(doc! {"bypassDocumentValidation": "x"}),
                Error(14),
            ),
            ("hint type", agg(doc! {"hint": 1}), Error(9)),
            ("hint", agg(doc! {"hint": "nope"}), Error(2)),
            (
                "$match",
                agg(doc! {"pipeline": [{"$match": 1}]}),
                Error(15959),
            ),
            (
                "accepted",
                agg(doc! {"maxTimeMS": 10.0, "cursor": {"batchSize": 1.5}, "allowDiskUse": false, "bypassDocumentValidation": 1}),
                Accepted,
            ),
        ],
    )
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn write_command_options() {
    let (server, db) = setup().await;
    let update = |stmt: Document, extra: Document| {
        let mut cmd = doc! {"update": "c", "updates": [stmt]};
        cmd.extend(extra);
        cmd
    };
    let delete = |stmt: Document, extra: Document| {
        let mut cmd = doc! {"delete": "c", "deletes": [stmt]};
        cmd.extend(extra);
        cmd
    };
    let set = doc! {"$set": {"x": 1}};
    check(
        &db,
        vec![
            // `ordered` and the statements' upsert/multi are IDL `bool`: only booleans (null
            // is omitted); errors in a statement's shape fail the whole command.
            (
                "insert ordered",
                doc! {"insert": "c", "documents": [{}], "ordered": 1},
                Error(14),
            ),
            (
                "insert bypass",
                doc! {"insert": "c", "documents": [{}], "bypassDocumentValidation": "x"},
                Error(14),
            ),
            (
                "update ordered",
                update(doc! {"q": {}, "u": set.clone()}, doc! {"ordered": "x"}),
                Error(14),
            ),
            (
                "upsert",
                update(doc! {"q": {}, "u": set.clone(), "upsert": 1}, doc! {}),
                Error(14),
            ),
            (
                "multi",
                update(doc! {"q": {}, "u": set.clone(), "multi": "x"}, doc! {}),
                Error(14),
            ),
            (
                "q",
                update(doc! {"q": 1, "u": set.clone()}, doc! {}),
                Error(14),
            ),
            (
                "unknown field",
                update(doc! {"q": {}, "u": set.clone(), "zz": 1}, doc! {}),
                Error(40415),
            ),
            (
                "arrayFilters",
                update(doc! {"q": {}, "u": set.clone(), "arrayFilters": "x"}, doc! {}),
                Error(14),
            ),
            (
                "u type",
                update(doc! {"q": {}, "u": 1}, doc! {}),
                Error(9),
            ),
            (
                "constants without a pipeline",
                update(doc! {"q": {}, "u": set.clone(), "c": {"v": 1}}, doc! {}),
                WriteError(51198),
            ),
            (
                "constants type",
                update(doc! {"q": {}, "u": [{"$set": {"x": 1}}], "c": 1}, doc! {}),
                Error(14),
            ),
            (
                "update hint type",
                update(doc! {"q": {}, "u": set.clone(), "hint": 1}, doc! {}),
                Error(9),
            ),
            // A hint naming no index fails the statement.
            (
                "update hint",
                update(doc! {"q": {}, "u": set.clone(), "hint": "nope"}, doc! {}),
                WriteError(2),
            ),
            (
                "update accepted",
                update(
                    doc! {"q": {}, "u": set.clone(), "upsert": null, "multi": false, "hint": {"_id": 1}},
                    doc! {"ordered": null, "bypassDocumentValidation": 1},
                ),
                Accepted,
            ),
            (
                "delete ordered",
                delete(doc! {"q": {}, "limit": 1}, doc! {"ordered": 0}),
                Error(14),
            ),
            (
                "delete limit",
                delete(doc! {"q": {}, "limit": 2}, doc! {}),
                Error(9),
            ),
            (
                "delete limit fraction",
                delete(doc! {"q": {}, "limit": 0.5}, doc! {}),
                Error(9),
            ),
            (
                "delete q",
                delete(doc! {"limit": 1}, doc! {}),
                Error(40414),
            ),
            (
                "delete hint",
                delete(doc! {"q": {"_id": 9}, "limit": 1, "hint": "nope"}, doc! {}),
                WriteError(2),
            ),
            // mongod reads limit as a double: a non-number is 0 (delete every match).
            (
                "delete limit null",
                delete(doc! {"q": {"_id": 9}, "limit": null}, doc! {}),
                Accepted,
            ),
        ],
    )
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn change_stream_options() {
    let (server, db) = setup().await;
    let stream =
        |spec: Bson| doc! {"aggregate": "c", "pipeline": [{"$changeStream": spec}], "cursor": {}};
    check(
        &db,
        vec![
            ("not an object", stream(Bson::Int32(1)), Error(50808)),
            (
                "flag",
                stream(Bson::Document(doc! {"showExpandedEvents": 1})),
                Error(14),
            ),
            (
                "fullDocument type",
                stream(Bson::Document(doc! {"fullDocument": 1})),
                Error(14),
            ),
            (
                "fullDocument value",
                stream(Bson::Document(doc! {"fullDocument": "nope"})),
                Error(2),
            ),
            (
                "fullDocumentBeforeChange value",
                stream(Bson::Document(doc! {"fullDocumentBeforeChange": "nope"})),
                Error(2),
            ),
            (
                "resumeAfter type",
                stream(Bson::Document(doc! {"resumeAfter": "x"})),
                Error(14),
            ),
            (
                "startAtOperationTime type",
                stream(Bson::Document(doc! {"startAtOperationTime": 1})),
                Error(14),
            ),
            (
                "unknown option",
                stream(Bson::Document(doc! {"nope": true})),
                Error(40415),
            ),
            // A boolean only (no system collection exists here, so `true` shows nothing more).
            (
                "showSystemEvents number",
                stream(Bson::Document(doc! {"showSystemEvents": 1})),
                Error(14),
            ),
            (
                "nulls and flags",
                stream(Bson::Document(
                    doc! {"fullDocument": null, "resumeAfter": null, "showMigrationEvents": false, "showSystemEvents": true},
                )),
                Accepted,
            ),
        ],
    )
    .await;
    // Not in API Version 1: refused under apiStrict (APIStrictError).
    let strict = |flag: &str| {
        let mut spec = Document::new();
        spec.insert(flag, false);
        doc! {
            "aggregate": "c",
            "pipeline": [{"$changeStream": spec}],
            "cursor": {},
            "apiVersion": "1",
            "apiStrict": true,
        }
    };
    check(
        &db,
        vec![
            (
                "showSystemEvents strict",
                strict("showSystemEvents"),
                Error(323),
            ),
            (
                "showExpandedEvents strict",
                strict("showExpandedEvents"),
                Error(323),
            ),
        ],
    )
    .await;
    let local = client(&server).await.database("local");
    check(
        &local,
        vec![(
            "local",
            doc! {"aggregate": 1, "pipeline": [{"$changeStream": {}}], "cursor": {}},
            Error(73),
        )],
    )
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn update_constants_reach_the_pipeline() {
    let (server, db) = setup().await;
    let r = db
        .run_command(doc! {"update": "c", "updates": [{
            "q": {"_id": 1},
            "u": [{"$set": {"v": "$$k", "w": {"$add": ["$n", "$$inc"]}}}],
            "c": {"k": "constant", "inc": 10},
        }]})
        .await
        .unwrap();
    assert_eq!(r.get_i32("nModified").unwrap(), 1, "{r}");
    let d = db
        .collection::<Document>("c")
        .find_one(doc! {"_id": 1})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d, doc! {"_id": 1, "n": 1, "v": "constant", "w": 11});
    server.shutdown().await;
}

#[tokio::test]
async fn list_collections_options() {
    let (server, db) = setup().await;
    let list = |extra: Document| {
        let mut cmd = doc! {"listCollections": 1};
        cmd.extend(extra);
        cmd
    };
    check(
        &db,
        vec![
            // IDL type `bool` (list_collections.idl): only a boolean; null is the default.
            ("nameOnly number", list(doc! {"nameOnly": 1}), Error(14)),
            ("nameOnly null", list(doc! {"nameOnly": null}), Accepted),
            ("nameOnly", list(doc! {"nameOnly": true}), Accepted),
            (
                "authorizedCollections number",
                list(doc! {"authorizedCollections": 0}),
                Error(14),
            ),
            (
                "authorizedCollections string",
                list(doc! {"authorizedCollections": "x"}),
                Error(14),
            ),
            (
                "authorizedCollections",
                list(doc! {"authorizedCollections": true, "nameOnly": true}),
                Accepted,
            ),
            ("filter null", list(doc! {"filter": null}), Accepted),
        ],
    )
    .await;
    server.shutdown().await;
}
