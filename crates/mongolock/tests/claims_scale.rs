//! What a claim costs when many documents are locked: with `DocumentLocks::ensure_indexes`, a
//! claim examines the free documents its index conditions point at, not the locked ones in
//! front of them. Measured with the server's own counter of examined documents (`serverStatus`
//! `metrics.queryExecutor.scannedObjects`, which mongod and mongo-testserver both keep).
//!
//! A test binary of its own (not a module of `tests/mongo/`), so that no other test's queries run
//! on the server meanwhile (with `MONGODB_URI`, the tests of one binary share a deployment). Runs
//! against the embedded mongo-testserver, or `MONGODB_URI` when set (on a shared deployment
//! other clients' queries add to the counter, which only makes the indexed figure larger).

#[path = "support/mongo.rs"]
mod mongo;

use mongo::docs_with;
use mongo::{test_database, unique};
use mongodb::bson::{doc, Document};
use mongodb::{Collection, Database};
use mongolock::documents::{DocumentLocks, LockedDocument};

const LOCKED: i64 = 300;
const FREE: i64 = 40;
const CLAIMS: usize = 20;

async fn scanned_objects(db: &Database) -> i64 {
    let status = db
        .client()
        .database("admin")
        .run_command(doc! { "serverStatus": 1 })
        .await
        .expect("serverStatus");
    let metrics = status
        .get_document("metrics")
        .expect("serverStatus.metrics");
    let executor = metrics
        .get_document("queryExecutor")
        .expect("serverStatus.metrics.queryExecutor");
    match executor.get("scannedObjects") {
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_i32().map(i64::from))
            .expect("scannedObjects is an integer"),
        None => panic!("no scannedObjects in {executor:?}"),
    }
}

/// Documents examined per claim over `CLAIMS` claims (each one holds its document, so the next
/// one has to look further); the guards are returned so the caller decides when to release.
async fn claim_cost(
    db: &Database,
    locks: &DocumentLocks<Document>,
) -> (f64, Vec<LockedDocument<Document>>) {
    let before = scanned_objects(db).await;
    let mut held = Vec::new();
    for i in 0..CLAIMS {
        let claimed = locks
            .try_claim(doc! { "done": false }, None)
            .await
            .unwrap_or_else(|e| panic!("claim {i}: {e}"))
            .unwrap_or_else(|| panic!("claim {i}: nothing claimable"));
        held.push(claimed);
    }
    let after = scanned_objects(db).await;
    ((after - before) as f64 / CLAIMS as f64, held)
}

#[tokio::test]
async fn a_claim_examines_free_documents_not_every_locked_one() {
    let t = test_database().await;
    let coll: Collection<Document> = t.db.collection(&unique("jobs"));
    let docs: Vec<Document> = (0..LOCKED + FREE)
        .map(|i| doc! { "_id": i, "done": false })
        .collect();
    coll.insert_many(docs).await.expect("insert jobs");
    let locks = docs_with(&coll, |b| b.app_name("claims-scale-test"))
        .build()
        .expect("document locks");
    // The first LOCKED documents (in natural order) are held throughout.
    let mut held = Vec::new();
    for i in 0..LOCKED {
        held.push(
            locks
                .try_lock(i)
                .await
                .unwrap_or_else(|e| panic!("lock {i}: {e}"))
                .unwrap_or_else(|| panic!("document {i} was not free")),
        );
    }

    // Without indexes a claim reads every locked document before the first free one.
    let (unindexed, claimed) = claim_cost(&t.db, &locks).await;
    for locked in claimed {
        locked.guard.release().await.expect("release a claimed job");
    }
    locks.ensure_indexes().await.expect("ensure_indexes");
    let (indexed, claimed) = claim_cost(&t.db, &locks).await;
    eprintln!(
        "documents examined per claim with {LOCKED} locked and {FREE} free: \
         {unindexed:.1} without indexes, {indexed:.1} with"
    );
    assert!(
        unindexed >= LOCKED as f64,
        "without indexes a claim should read the {LOCKED} locked documents in front of the \
         free ones; it read {unindexed:.1} per claim (is scannedObjects counted?)"
    );
    assert!(
        indexed <= 30.0,
        "with indexes a claim should read only a few free documents, not the {LOCKED} locked \
         ones: it read {indexed:.1} per claim"
    );
    drop(claimed);
    drop(held);
}
