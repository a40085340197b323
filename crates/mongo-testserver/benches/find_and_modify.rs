//! findAndModify round trips per second with 8 concurrent driver clients on loopback.
//!
//! Run with `cargo bench -p mongo-testserver --bench find_and_modify`
//! (`BENCH_SECS` sets the measuring time, default 3; `MONGODB_URI` measures another server).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use mongodb::options::ReturnDocument;
use mongodb::Client;

const CLIENTS: usize = 8;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let secs: u64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let (uri, _server) = match std::env::var("MONGODB_URI") {
        Ok(uri) => (uri, None),
        Err(_) => {
            let server = mongo_testserver::TestServer::start().await.expect("server");
            (server.uri(), Some(server))
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let client = Client::with_uri_str(&uri).await.expect("client");
        let coll = client.database("bench").collection::<Document>("locks");
        // Warm up the connection.
        coll.find_one(doc! {}).await.expect("warm-up");
        let stop = stop.clone();
        let count = count.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("lock-{}", i % 4);
            while !stop.load(Ordering::Relaxed) {
                coll.find_one_and_update(
                    doc! {"_id": &id},
                    vec![doc! {"$set": {
                        "token": {"$add": [{"$ifNull": ["$token", 0]}, 1]},
                        "expiresAt": {"$add": ["$$NOW", 30_000]},
                    }}],
                )
                .upsert(true)
                .return_document(ReturnDocument::After)
                .await
                .expect("findAndModify");
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let n = count.load(Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    for t in tasks {
        let _ = t.await;
    }
    println!(
        "findAndModify (pipeline upsert, {CLIENTS} clients): {n} round trips in {elapsed:.2} s = {:.0}/s",
        n as f64 / elapsed
    );
}
