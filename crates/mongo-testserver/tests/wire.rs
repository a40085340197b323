//! The wire protocol spoken by hand: legacy handshake, garbage input, checksums, document
//! sequences, retryable writes.

mod common;

use std::time::Duration;

use bson::{doc, Bson, Document};
use mongo_testserver::wire::{self, Request};
use mongo_testserver::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let n = i32::from_le_bytes(len) as usize;
    let mut buf = vec![0u8; n];
    buf[..4].copy_from_slice(&len);
    s.read_exact(&mut buf[4..]).await?;
    Ok(buf)
}

async fn command(s: &mut TcpStream, body: Document) -> Document {
    let bytes = wire::encode_msg_request(1, &body).unwrap();
    s.write_all(&bytes).await.unwrap();
    let reply = read_frame(s).await.unwrap();
    match wire::parse_request(&reply).unwrap() {
        Request::Msg(m) => m.body,
        Request::Query(_) => panic!("expected OP_MSG"),
    }
}

/// An OP_MSG with a body and one document sequence.
fn msg_with_sequence(body: &Document, id: &str, docs: &[Document]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&7i32.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&2013i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(0);
    body.to_writer(&mut out).unwrap();
    out.push(1);
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(id.as_bytes());
    out.push(0);
    for d in docs {
        d.to_writer(&mut out).unwrap();
    }
    let seq_len = (out.len() - start) as i32;
    out[start..start + 4].copy_from_slice(&seq_len.to_le_bytes());
    let len = out.len() as i32;
    out[..4].copy_from_slice(&len.to_le_bytes());
    out
}

#[tokio::test]
async fn legacy_op_query_handshake_gets_op_reply() {
    let server = TestServer::start().await.unwrap();
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    let query = doc! {"isMaster": 1, "helloOk": true, "client": {"application": {"name": "py"}}};
    let mut msg = Vec::new();
    msg.extend_from_slice(&[0; 4]);
    msg.extend_from_slice(&42i32.to_le_bytes());
    msg.extend_from_slice(&0i32.to_le_bytes());
    msg.extend_from_slice(&2004i32.to_le_bytes());
    msg.extend_from_slice(&0i32.to_le_bytes()); // flags
    msg.extend_from_slice(b"admin.$cmd\0");
    msg.extend_from_slice(&0i32.to_le_bytes()); // skip
    msg.extend_from_slice(&(-1i32).to_le_bytes()); // return
    query.to_writer(&mut msg).unwrap();
    let len = msg.len() as i32;
    msg[..4].copy_from_slice(&len.to_le_bytes());
    s.write_all(&msg).await.unwrap();
    let reply = read_frame(&mut s).await.unwrap();
    assert_eq!(
        i32::from_le_bytes(reply[8..12].try_into().unwrap()),
        42,
        "responseTo"
    );
    assert_eq!(
        i32::from_le_bytes(reply[12..16].try_into().unwrap()),
        1,
        "OP_REPLY"
    );
    assert_eq!(
        i32::from_le_bytes(reply[32..36].try_into().unwrap()),
        1,
        "numberReturned"
    );
    let d = Document::from_reader(&reply[36..]).unwrap();
    assert_eq!(d.get_bool("ismaster"), Ok(true));
    assert_eq!(d.get_bool("helloOk"), Ok(true));
    assert_eq!(d.get_i32("maxWireVersion"), Ok(21));
    assert_eq!(d.get_str("setName"), Ok("mongolock-test"));
    assert!(!d.contains_key("topologyVersion"));
    // The same connection continues with OP_MSG.
    let r = command(&mut s, doc! {"hello": 1, "$db": "admin"}).await;
    assert_eq!(r.get_bool("isWritablePrimary"), Ok(true));
    server.shutdown().await;
}

#[tokio::test]
async fn garbage_closes_only_that_connection() {
    let server = TestServer::start().await.unwrap();
    let mut good = TcpStream::connect(server.addr()).await.unwrap();
    let r = command(&mut good, doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok"), Ok(1.0));

    let garbage: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0xFF; 64],
        // Valid header, opcode 2013, then junk instead of BSON.
        {
            let mut m = vec![
                40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xDD, 0x07, 0, 0, 0, 0, 0, 0, 0,
            ];
            m.extend_from_slice(&[0x55; 19]);
            m
        },
        // A claimed length over 48 MB.
        vec![
            0x00, 0x00, 0x00, 0x7F, 1, 0, 0, 0, 0, 0, 0, 0, 0xDD, 0x07, 0, 0,
        ],
    ];
    for g in garbage {
        let mut bad = TcpStream::connect(server.addr()).await.unwrap();
        bad.write_all(&g).await.unwrap();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), bad.read(&mut buf))
            .await
            .expect("server closes the bad connection")
            .unwrap_or(0);
        assert_eq!(n, 0, "no reply to garbage");
        let r = command(&mut good, doc! {"ping": 1, "$db": "admin"}).await;
        assert_eq!(r.get_f64("ok"), Ok(1.0));
    }
    server.shutdown().await;
}

#[tokio::test]
async fn checksummed_messages_are_answered_with_checksums() {
    let server = TestServer::start().await.unwrap();
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    let mut msg = wire::encode_msg_request(5, &doc! {"ping": 1, "$db": "admin"}).unwrap();
    msg[16] |= 1; // checksumPresent
    msg.extend_from_slice(&[0; 4]);
    let len = msg.len() as i32;
    msg[..4].copy_from_slice(&len.to_le_bytes());
    let end = msg.len() - 4;
    let sum = crc32c::crc32c(&msg[..end]);
    msg[end..].copy_from_slice(&sum.to_le_bytes());
    s.write_all(&msg).await.unwrap();
    let reply = read_frame(&mut s).await.unwrap();
    let Request::Msg(m) = wire::parse_request(&reply).unwrap() else {
        panic!("expected OP_MSG");
    };
    assert!(m.has_checksum());
    assert_eq!(m.body.get_f64("ok"), Ok(1.0));
    // A wrong checksum closes the connection.
    let n = msg.len();
    msg[n - 1] ^= 0xFF;
    s.write_all(&msg).await.unwrap();
    let mut buf = [0u8; 4];
    let got = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(got, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn document_sequences_and_size_limit() {
    let server = TestServer::start().await.unwrap();
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    let docs = vec![
        doc! {"_id": 1},
        doc! {"_id": 2},
        doc! {"_id": 1},
        doc! {"_id": 3},
    ];
    let msg = msg_with_sequence(
        &doc! {"insert": "seq", "ordered": false, "$db": "db"},
        "documents",
        &docs,
    );
    s.write_all(&msg).await.unwrap();
    let Request::Msg(m) = wire::parse_request(&read_frame(&mut s).await.unwrap()).unwrap() else {
        panic!()
    };
    assert_eq!(m.body.get_i32("n"), Ok(3));
    let errors = m.body.get_array("writeErrors").unwrap();
    let e = errors[0].as_document().unwrap();
    assert_eq!(e.get_i32("index"), Ok(2));
    assert_eq!(e.get_i32("code"), Ok(11000));
    assert_eq!(e.get_document("keyPattern"), Ok(&doc! {"_id": 1}));
    assert_eq!(e.get_document("keyValue"), Ok(&doc! {"_id": 1}));

    // A document over 16 MiB (inside the 16 MiB + 16 KiB a sequence may carry).
    let big = doc! {"_id": 9, "b": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 16 * 1024 * 1024] })};
    let msg = msg_with_sequence(&doc! {"insert": "seq", "$db": "db"}, "documents", &[big]);
    s.write_all(&msg).await.unwrap();
    let Request::Msg(m) = wire::parse_request(&read_frame(&mut s).await.unwrap()).unwrap() else {
        panic!()
    };
    assert_eq!(m.body.get_i32("n"), Ok(0));
    let e = m.body.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(e.get_i32("code"), Ok(2));
    assert!(e
        .get_str("errmsg")
        .unwrap()
        .contains("object to insert too large"));
    server.shutdown().await;
}

#[tokio::test]
async fn retryable_write_is_not_applied_twice() {
    let server = TestServer::start().await.unwrap();
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    let lsid =
        doc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] }};
    let fam = doc! {
        "findAndModify": "counters",
        "query": {"_id": "c"},
        "update": {"$inc": {"n": 1}},
        "upsert": true,
        "new": true,
        "lsid": lsid.clone(),
        "txnNumber": 1i64,
        "$db": "db",
    };
    let first = command(&mut s, fam.clone()).await;
    let again = command(&mut s, fam.clone()).await;
    assert_eq!(first.get_document("value"), Ok(&doc! {"_id": "c", "n": 1}));
    assert_eq!(again.get_document("value"), Ok(&doc! {"_id": "c", "n": 1}));
    let insert = doc! {"insert": "counters", "documents": [{"x": 1}], "lsid": lsid.clone(), "txnNumber": 2i64, "$db": "db"};
    assert_eq!(command(&mut s, insert.clone()).await.get_i32("n"), Ok(1));
    assert_eq!(command(&mut s, insert).await.get_i32("n"), Ok(1));
    let count = command(&mut s, doc! {"count": "counters", "$db": "db"}).await;
    assert_eq!(count.get_i32("n"), Ok(2));
    let found = command(
        &mut s,
        doc! {"find": "counters", "filter": {"_id": "c"}, "$db": "db"},
    )
    .await;
    let batch = found
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(batch[0].as_document().unwrap().get_i32("n"), Ok(1));
    // An older transaction number is refused.
    let mut old = fam;
    old.insert("txnNumber", 0i64);
    assert_eq!(command(&mut s, old).await.get_i32("code"), Ok(225));
    server.shutdown().await;
}

#[tokio::test]
async fn replica_set_replies_carry_cluster_time() {
    let server = TestServer::start().await.unwrap();
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    let a = command(
        &mut s,
        doc! {"insert": "t", "documents": [{"a": 1}], "$db": "db"},
    )
    .await;
    let b = command(
        &mut s,
        doc! {"insert": "t", "documents": [{"a": 2}], "$db": "db"},
    )
    .await;
    let ta = a.get_timestamp("operationTime").unwrap();
    let tb = b.get_timestamp("operationTime").unwrap();
    assert!((tb.time, tb.increment) > (ta.time, ta.increment));
    assert!(b
        .get_document("$clusterTime")
        .unwrap()
        .get_timestamp("clusterTime")
        .is_ok());
    // w: majority succeeds; w: 3 gets the single-node replica set's writeConcernError.
    let r = command(&mut s, doc! {"insert": "t", "documents": [{"a": 3}], "writeConcern": {"w": "majority"}, "$db": "db"}).await;
    assert_eq!(r.get_f64("ok"), Ok(1.0));
    assert!(!r.contains_key("writeConcernError"));
    let r = command(
        &mut s,
        doc! {"insert": "t", "documents": [{"a": 4}], "writeConcern": {"w": 3}, "$db": "db"},
    )
    .await;
    assert_eq!(
        r.get_document("writeConcernError").unwrap().get_i32("code"),
        Ok(100)
    );
    // A read-only aggregate accepts a writeConcern (as mongod); find does not.
    let r = command(&mut s, doc! {"aggregate": "t", "pipeline": [], "cursor": {}, "writeConcern": {"w": "majority"}, "$db": "db"}).await;
    assert_eq!(r.get_f64("ok"), Ok(1.0), "{r}");
    let r = command(
        &mut s,
        doc! {"find": "t", "writeConcern": {"w": "majority"}, "$db": "db"},
    )
    .await;
    assert_eq!(r.get_i32("code"), Ok(72));
    // Unknown command.
    let r = command(&mut s, doc! {"nope": 1, "$db": "db"}).await;
    assert_eq!(r.get_i32("code"), Ok(59));
    assert_eq!(r.get_str("codeName"), Ok("CommandNotFound"));
    server.shutdown().await;
}

/// Every command, every field, odd values: each gets a reply (an error or a result), never a
/// dropped connection or a crash.
#[tokio::test]
async fn odd_arguments_get_replies_not_crashes() {
    let server = TestServer::start().await.unwrap();
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    command(
        &mut s,
        doc! {"insert": "c", "documents": [{"_id": 1, "a": [1, 2], "b": {"c": 1}}], "$db": "db"},
    )
    .await;
    let values: Vec<Bson> = vec![
        Bson::Int32(1),
        Bson::Int32(-1),
        Bson::Int64(i64::MIN),
        Bson::Int64(i64::MAX),
        Bson::Double(f64::NAN),
        Bson::Double(-0.5),
        Bson::String(String::new()),
        Bson::String("$a".into()),
        Bson::Null,
        Bson::Boolean(true),
        Bson::Document(doc! {}),
        Bson::Document(doc! {"$bad": 1}),
        Bson::Document(doc! {"a": {"$in": 5}}),
        Bson::Document(doc! {"_id": 1}),
        Bson::Array(vec![]),
        Bson::Array(vec![Bson::Int32(1)]),
        Bson::Array(vec![Bson::Document(
            doc! {"$match": {"$expr": {"$add": ["$a", "x"]}}},
        )]),
        Bson::Array(vec![Bson::Document(
            doc! {"q": {}, "u": {"$set": {"a.$[]": 1}}, "limit": 7},
        )]),
        Bson::Timestamp(bson::Timestamp {
            time: 0,
            increment: 0,
        }),
    ];
    let commands: &[(&str, &[&str])] = &[
        ("hello", &["helloOk", "client"]),
        ("ping", &[]),
        ("insert", &["documents", "ordered"]),
        ("update", &["updates", "ordered", "let"]),
        ("delete", &["deletes", "ordered"]),
        (
            "findAndModify",
            &[
                "query", "update", "remove", "new", "fields", "upsert", "sort",
            ],
        ),
        (
            "find",
            &[
                "filter",
                "sort",
                "projection",
                "skip",
                "limit",
                "batchSize",
                "hint",
            ],
        ),
        ("getMore", &["collection", "batchSize", "maxTimeMS"]),
        ("killCursors", &["cursors"]),
        ("count", &["query", "limit", "skip"]),
        ("distinct", &["key", "query"]),
        ("aggregate", &["pipeline", "cursor"]),
        ("createIndexes", &["indexes"]),
        ("listIndexes", &["cursor"]),
        ("dropIndexes", &["index"]),
        ("listCollections", &["filter", "nameOnly"]),
        ("listDatabases", &["filter", "nameOnly"]),
        ("create", &["capped"]),
        ("endSessions", &[]),
        ("setParameter", &["ttlMonitorSleepSecs"]),
        ("getParameter", &["ttlMonitorSleepSecs"]),
        ("buildInfo", &[]),
    ];
    let mut sent = 0;
    for (name, fields) in commands {
        let dbs: &[&str] = if matches!(*name, "listDatabases" | "setParameter" | "getParameter") {
            &["admin"]
        } else {
            &["db"]
        };
        for db in dbs {
            for v in &values {
                let mut body = doc! {*name: v.clone()};
                body.insert("$db", *db);
                let r = command(&mut s, body).await;
                assert!(r.contains_key("ok"), "{name}: {r}");
                sent += 1;
                for f in *fields {
                    let mut body = doc! {*name: "c"};
                    if *name == "getMore" {
                        body = doc! {"getMore": 1i64};
                    }
                    body.insert(*f, v.clone());
                    body.insert("$db", *db);
                    if *name == "aggregate" && *f != "cursor" {
                        body.insert("cursor", doc! {});
                    }
                    let r = command(&mut s, body).await;
                    assert!(r.contains_key("ok"), "{name}.{f}: {r}");
                    sent += 1;
                }
            }
        }
    }
    assert!(sent > 500);
    // Put the TTL period back and check the server still serves.
    command(
        &mut s,
        doc! {"setParameter": 1, "ttlMonitorSleepSecs": 60, "$db": "admin"},
    )
    .await;
    let r = command(
        &mut s,
        doc! {"find": "c", "filter": {"_id": 1}, "$db": "db"},
    )
    .await;
    assert_eq!(r.get_f64("ok"), Ok(1.0));
    server.shutdown().await;
}

/// The bytes of `{x: {x: ... {x: 1}}}` nested `levels` deep, built without recursion.
fn deep_bson(levels: usize) -> Vec<u8> {
    // Innermost: {x: 1}.
    let mut doc = vec![0u8; 4];
    doc.extend_from_slice(&[0x10, b'x', 0, 1, 0, 0, 0, 0]);
    let len = doc.len() as i32;
    doc[..4].copy_from_slice(&len.to_le_bytes());
    for _ in 1..levels {
        let mut outer = vec![0u8; 4];
        outer.extend_from_slice(&[0x03, b'x', 0]);
        outer.extend_from_slice(&doc);
        outer.push(0);
        let len = outer.len() as i32;
        outer[..4].copy_from_slice(&len.to_le_bytes());
        doc = outer;
    }
    doc
}

#[tokio::test]
async fn messages_nested_too_deep_are_answered_with_overflow() {
    let server = TestServer::start().await.unwrap();
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    for levels in [300, 20_000] {
        // {find: "c", filter: <deep>, $db: "db"}, spliced by hand: the driver-side encoders
        // recurse, the server must not.
        let head = wire::encode_msg_request(5, &doc! {"find": "c"}).unwrap();
        let body_start = 16 + 4 + 1;
        let mut body = head[body_start..head.len() - 1].to_vec();
        body.extend_from_slice(&[0x03]);
        body.extend_from_slice(b"filter\0");
        body.extend_from_slice(&deep_bson(levels));
        let tail = bson::to_vec(&doc! {"$db": "db"}).unwrap();
        body.extend_from_slice(&tail[4..tail.len() - 1]);
        body.push(0);
        let len = body.len() as i32;
        body[..4].copy_from_slice(&len.to_le_bytes());
        let mut frame = head[..body_start].to_vec();
        frame.extend_from_slice(&body);
        let len = frame.len() as i32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        s.write_all(&frame).await.unwrap();
        let reply = read_frame(&mut s).await.unwrap();
        let Request::Msg(m) = wire::parse_request(&reply).unwrap() else {
            panic!("expected OP_MSG");
        };
        assert_eq!(m.body.get_i32("code").unwrap(), 15, "{}", m.body);
        assert_eq!(i32::from_le_bytes(reply[8..12].try_into().unwrap()), 5);
    }
    // The same connection keeps working.
    let r = command(&mut s, doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);
    server.shutdown().await;
}
