//! `--ops`: what the *shape* of the acquire and release commands costs, with the driver alone
//! (no lock library): mongolock's commands as sent today, a smaller variant of each, and the
//! minimal update a polling peer sends. Client and server CPU per acquire + release pair.

use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::{Client, Collection};

use crate::{own_cpu, Server};

const RELEASED_KEPT: i32 = 8;

fn lease_id() -> String {
    format!("{:016x}-{:024x}", 7_u64, rand_u128() >> 32)
}

fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    (u128::from(h.finish()) << 64) | u128::from(h.finish().rotate_left(17))
}

fn holder() -> Document {
    doc! { "host": "bench-host", "pid": 4242_i64, "app": Bson::Null }
}

/// mongolock's acquire pipeline today (`backends/mongo/acquire.rs`).
fn acquire_today(mine: &str) -> Vec<Document> {
    let free = doc! {
        "$or": [
            { "$eq": [{ "$ifNull": ["$leaseId", Bson::Null] }, Bson::Null] },
            { "$lte": ["$expiresAt", "$$NOW"] },
            { "$eq": ["$leaseId", mine] },
        ]
    };
    let lease = doc! {
        "leaseId": { "$literal": mine },
        "fencingToken": { "$add": ["$fencingToken", 1_i64] },
        "acquiredAt": "$$NOW",
        "expiresAt": { "$add": ["$$NOW", 30_000_i64] },
        "holder": { "$literal": holder() },
    };
    vec![doc! {
        "$replaceWith": { "$cond": [
            free,
            { "$mergeObjects": ["$$ROOT", lease] },
            "$$ROOT",
        ] }
    }]
}

/// mongolock's release today (`backends/mongo/document.rs`, `release_update`).
fn release_today(name: &str, mine: &str) -> (Document, Vec<Document>) {
    let ours = doc! { "$literal": mine };
    let is_mine = doc! { "$eq": ["$leaseId", ours.clone()] };
    let filter = doc! { "_id": name, "$or": [ { "leaseId": mine }, { "released": mine } ] };
    let pipeline = vec![doc! {
        "$set": {
            "leaseId": { "$cond": [is_mine.clone(), Bson::Null, "$leaseId"] },
            "expiresAt": { "$cond": [is_mine.clone(), { "$min": ["$expiresAt", "$$NOW"] }, "$expiresAt"] },
            "released": { "$cond": [
                is_mine.clone(),
                { "$slice": [
                    { "$concatArrays": [{ "$ifNull": ["$released", []] }, [ours.clone()]] },
                    -RELEASED_KEPT,
                ] },
                "$released",
            ] },
            "lastReleased": { "$cond": [is_mine, ours, "$lastReleased"] },
        }
    }];
    (filter, pipeline)
}

/// A smaller release: the filter matches our lease only (a retry after a lost reply matches
/// `lastReleased` instead and changes nothing), so no `$cond` per field and no `released`
/// array in the document.
fn release_small(name: &str, mine: &str) -> (Document, Vec<Document>) {
    let filter = doc! { "_id": name, "leaseId": mine };
    let pipeline = vec![doc! {
        "$set": {
            "leaseId": Bson::Null,
            "expiresAt": { "$min": ["$expiresAt", "$$NOW"] },
            "lastReleased": { "$literal": mine },
        }
    }];
    (filter, pipeline)
}

async fn pair_today(coll: &Collection<Document>, name: &str, small_release: bool) {
    let mine = lease_id();
    let d = coll
        .find_one_and_update(doc! { "_id": name }, acquire_today(&mine))
        .upsert(true)
        .return_document(ReturnDocument::After)
        .projection(doc! { "leaseId": 1, "fencingToken": 1, "acquiredAt": 1, "expiresAt": 1 })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.get_str("leaseId").unwrap(), mine);
    let (f, p) = if small_release {
        release_small(name, &mine)
    } else {
        release_today(name, &mine)
    };
    let r = coll.update_one(f, p).await.unwrap();
    assert_eq!(r.matched_count, 1);
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
            let mut rows = Vec::new();
            for variant in [
                "today",
                "small release",
                "findAndModify, operators",
                "minimal (peer-like)",
            ] {
                let name = format!("ops-{variant}");
                let run = |n: usize| {
                    let coll = coll.clone();
                    let name = name.clone();
                    async move {
                        for _ in 0..n {
                            match variant {
                                "today" => pair_today(&coll, &name, false).await,
                                "small release" => pair_today(&coll, &name, true).await,
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
