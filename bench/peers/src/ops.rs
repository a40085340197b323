//! `--ops`: what the *shape* of the acquire and release commands costs, with the driver alone
//! (no lock library around them): mongolock's commands exactly as its MongoDB backend sends
//! them for an uncontended pair, an operator `findAndModify`, and the minimal update a polling
//! peer sends. Client and server CPU per acquire + release pair; the difference between a row
//! here and the library's own row in the main table is what the library adds around its
//! commands.
//!
//! mongolock's commands come in two rows: its full acquire and release pipelines, and its
//! uncontended shortcut (the "free" test in the filter and one small `$set`, then a one-`$set`
//! release), which it sends after its own release found nobody queued. Every pair runs on one
//! name, as on any busy name.

use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::{Client, Collection};
use mongolock::{AcquireRequest, HolderInfo, LeaseMode, LockBackend, LockProvider, MongoBackend};

use crate::{own_cpu, Server};

fn lease_id() -> String {
    format!("{:016x}-{:024x}", 7_u64, rand_u128() >> 32)
}

fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    (u128::from(h.finish()) << 64) | u128::from(h.finish().rotate_left(17))
}

/// An uncontended exclusive request for `name` with a lease id of `backend`.
fn request(backend: &MongoBackend, name: &str) -> AcquireRequest {
    AcquireRequest {
        name: name.to_owned(),
        lease_id: backend.new_lease_id(),
        ttl: Duration::from_secs(30),
        holder: HolderInfo::current(None),
        mode: LeaseMode::Exclusive,
    }
}

/// mongolock's own acquire and release commands, as its MongoDB backend sends them for an
/// uncontended pair (`MongoBackend::command_shapes`), on a lock document that exists: the full
/// pipelines, or with `shortcut` the uncontended shortcut's commands (what the library sends
/// after its own release found nobody queued).
async fn pair_as_sent(
    coll: &Collection<Document>,
    backend: &MongoBackend,
    name: &str,
    shortcut: bool,
) {
    let req = request(backend, name);
    let [(f, p, proj), (rf, rp, rproj)] = backend.command_shapes(&req, shortcut);
    let d = coll
        .find_one_and_update(f, p)
        .return_document(ReturnDocument::After)
        .projection(proj)
        .await
        .unwrap()
        .expect("the lock document exists (and is free)");
    assert_eq!(d.get_str("leaseId").unwrap(), req.lease_id.as_str());
    let r = coll
        .find_one_and_update(rf, rp)
        .return_document(ReturnDocument::After)
        .projection(rproj)
        .await
        .unwrap();
    assert!(r.is_some(), "released");
}

/// The acquire as `findAndModify` with an operator update (no pipeline; not a valid lock
/// acquire, only to price the pipeline) and the minimal release.
async fn pair_fam_operators(coll: &Collection<Document>, name: &str) {
    let mine = lease_id();
    coll.find_one_and_update(
        doc! { "_id": name },
        doc! { "$set": { "leaseId": &mine, "expiresAt": mongodb::bson::DateTime::now() }, "$inc": { "fencingToken": 1_i64 } },
    )
    .upsert(true)
    .return_document(ReturnDocument::After)
    .projection(doc! { "leaseId": 1, "fencingToken": 1, "acquiredAt": 1, "expiresAt": 1 })
    .await
    .unwrap()
    .unwrap();
    coll.update_one(
        doc! { "_id": name, "leaseId": &mine },
        doc! { "$set": { "leaseId": Bson::Null } },
    )
    .await
    .unwrap();
}

/// What a polling peer sends: an update with operators and a delete-free release.
async fn pair_minimal(coll: &Collection<Document>, name: &str) {
    let mine = lease_id();
    let r = coll
        .update_one(
            doc! { "_id": name, "leaseId": Bson::Null },
            doc! { "$set": { "leaseId": &mine, "expiresAt": mongodb::bson::DateTime::now() } },
        )
        .upsert(true)
        .await
        .unwrap();
    assert!(r.modified_count == 1 || r.upserted_id.is_some());
    coll.update_one(
        doc! { "_id": name, "leaseId": &mine },
        doc! { "$set": { "leaseId": Bson::Null } },
    )
    .await
    .unwrap();
}

pub fn ops(pairs: usize) {
    let server = std::sync::Arc::new(Server::start());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let srv = server.clone();
    let rows = rt.block_on(async move {
        tokio::spawn(async move {
            let client = Client::with_uri_str(&srv.uri).await.unwrap();
            let coll: Collection<Document> = client.database("bench_ops").collection("locks");
            // A change stream open on the collection, as mongolock keeps one (its own writes
            // are filtered out; here nothing passes).
            let mut stream = coll
                .watch()
                .pipeline(vec![doc! { "$match": { "operationType": "nothing" } }])
                .await
                .unwrap();
            tokio::spawn(async move {
                use futures_util::StreamExt;
                while stream.next().await.is_some() {}
            });
            let backend = MongoBackend::builder(&client.database("bench_ops"))
                .collection("locks")
                .notifications(false)
                .build()
                .unwrap();
            // The first acquisition creates the lock document (with its fencing epoch).
            let as_sent = "ops-as-sent";
            let provider = LockProvider::builder(backend.clone()).build().unwrap();
            for name in [as_sent, "ops-shortcut"] {
                let lock = provider.lock(name).unwrap();
                lock.acquire().await.unwrap().release().await.unwrap();
            }
            let mut rows = Vec::new();
            for variant in [
                "mongolock's full pipelines, as sent",
                "mongolock's uncontended shortcut, as sent",
                "findAndModify, operators",
                "minimal (peer-like)",
            ] {
                let name = match variant {
                    "mongolock's full pipelines, as sent" => as_sent.to_owned(),
                    "mongolock's uncontended shortcut, as sent" => "ops-shortcut".to_owned(),
                    _ => format!("ops-{variant}"),
                };
                let run = |n: usize| {
                    let coll = coll.clone();
                    let name = name.clone();
                    let backend = backend.clone();
                    async move {
                        for _ in 0..n {
                            match variant {
                                "mongolock's full pipelines, as sent" => {
                                    pair_as_sent(&coll, &backend, &name, false).await
                                }
                                "mongolock's uncontended shortcut, as sent" => {
                                    pair_as_sent(&coll, &backend, &name, true).await
                                }
                                "findAndModify, operators" => {
                                    pair_fam_operators(&coll, &name).await
                                }
                                _ => pair_minimal(&coll, &name).await,
                            }
                        }
                    }
                };
                run(100).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
                let (c0, s0, t0) = (own_cpu(), srv.cpu(), Instant::now());
                run(pairs).await;
                let (c1, s1, el) = (own_cpu(), srv.cpu(), t0.elapsed());
                let n = pairs as f64;
                rows.push((
                    variant,
                    n / el.as_secs_f64(),
                    (c1 - c0).as_secs_f64() * 1e6 / n,
                    match (s0, s1) {
                        (Some(a), Some(b)) => (b - a).as_secs_f64() * 1e6 / n,
                        _ => f64::NAN,
                    },
                ));
            }
            rows
        })
        .await
        .unwrap()
    });
    println!(
        "\nDriver alone, {pairs} acquire+release pairs per command shape (change stream open):\n"
    );
    println!("| commands | pairs/s | client CPU µs / pair | server CPU µs / pair |");
    println!("|---|---:|---:|---:|");
    for (v, r, c, s) in rows {
        println!("| {v} | {r:.0} | {c:.0} | {s:.0} |");
    }
}
