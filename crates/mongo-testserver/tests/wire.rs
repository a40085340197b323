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
    // Unknown command.
    let r = command(&mut s, doc! {"nope": 1, "$db": "db"}).await;
    assert_eq!(r.get_i32("code"), Ok(59));
    assert_eq!(r.get_str("codeName"), Ok("CommandNotFound"));
    server.shutdown().await;
}
