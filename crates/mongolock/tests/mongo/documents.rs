//! Document locks: locking the user's own documents in place, and claiming jobs from a shared
//! collection. Runs against the embedded mongo-testserver, or `MONGODB_URI` when set.
//!
//! The crash test's helper process is this test binary itself (as in `processes.rs`):
//! `documents::doc_child_entry` does nothing unless `MONGOLOCK_DOC_CHILD` is set; the parent runs
//! the binary again with `documents::doc_child_entry --exact` and that variable, and SIGKILLs it.

use crate::support::mongo;

use std::collections::HashMap;
use std::io::Write;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::mongo::docs_with;
use futures_util::TryStreamExt;
use mongo::{test_database, test_database_with, unique, TestDb};
use mongo_testserver::TestServer;
use mongodb::bson::{
    doc, oid::ObjectId, spec::BinarySubtype, Binary, Bson, DateTime, Document, RawDocumentBuf,
    Regex, Timestamp,
};
use mongodb::Collection;
use mongolock::documents::{DocumentLocks, EmbeddedLock, LockedDocument};
use mongolock::{Error, WaitStrategy};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Per job: (worker, fencing token) of every time it was processed.
type Claims = HashMap<i64, Vec<(usize, u64)>>;

const CHILD_ENV: &str = "MONGOLOCK_DOC_CHILD";

/// A job as the application models it: the lock field is readable, never written back.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Job {
    #[serde(rename = "_id")]
    id: i64,
    n: i64,
    payload: String,
    done: bool,
    #[serde(rename = "_lock", default, skip_serializing)]
    lock: Option<EmbeddedLock>,
}

/// A type without a field for the lock: the sub-document is ignored on deserialization.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Plain {
    #[serde(rename = "_id")]
    id: String,
    value: i64,
}

fn fast_waits() -> WaitStrategy {
    WaitStrategy::random_sleep(Duration::from_millis(5), Duration::from_millis(40))
}

fn locks_on<T: serde::de::DeserializeOwned + Send + Sync>(
    coll: &Collection<T>,
) -> DocumentLocks<T> {
    docs_with(coll, |b| {
        b.wait_strategy(fast_waits()).app_name("documents-test")
    })
    .build()
    .unwrap()
}

fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::DocumentNotFound { .. }) && e.to_string().contains("not found")
}

async fn raw(coll: &Collection<Document>, id: impl Into<Bson>) -> Option<RawDocumentBuf> {
    coll.clone_with_type::<RawDocumentBuf>()
        .find_one(doc! { "_id": id.into() })
        .await
        .unwrap()
}

/// The document's bytes without the lock field (everything the application owns).
fn without_field(d: &RawDocumentBuf, field: &str) -> Vec<u8> {
    let mut out = RawDocumentBuf::new();
    for element in d.iter() {
        let (key, value) = element.unwrap();
        if key != field {
            out.append(key, value.to_raw_bson());
        }
    }
    out.into_bytes()
}

/// Waits until the document's lock is no longer held (a dropped guard releases in the
/// background).
async fn wait_until_free<T: serde::de::DeserializeOwned + Send + Sync>(
    locks: &DocumentLocks<T>,
    id: impl Into<Bson>,
) {
    let id = id.into();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = locks.inspect(id.clone()).await.unwrap().unwrap();
        if !info.held {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the lock was not released: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_workers_process_500_jobs_exactly_once() {
    const JOBS: i64 = 500;
    const WORKERS: usize = 8;
    let t = test_database().await;
    let name = unique("jobs");
    let coll = t.db.collection::<Job>(&name);
    let jobs: Vec<Job> = (0..JOBS)
        .map(|i| Job {
            id: i,
            n: i,
            payload: format!("payload {i}"),
            done: false,
            lock: None,
        })
        .collect();
    coll.insert_many(jobs).await.unwrap();

    let processed: Arc<Mutex<Claims>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        // One client per worker, like separate processes.
        let client = mongo::client(&t.uri, Some(&format!("worker-{w}"))).await;
        let coll = client.database(t.db.name()).collection::<Job>(&name);
        let processed = processed.clone();
        workers.push(tokio::spawn(async move {
            let locks = docs_with(&coll, |b| b.app_name(format!("worker-{w}")))
                .build()
                .unwrap();
            let mut mine = 0usize;
            loop {
                // Every worker asks for the lowest open job: maximal contention on one document.
                let claimed = locks
                    .try_claim(doc! { "done": false }, Some(doc! { "n": 1 }))
                    .await
                    .unwrap();
                let Some(LockedDocument {
                    id,
                    document: job,
                    guard,
                    ..
                }) = claimed
                else {
                    // Nothing free: finished, or the remaining jobs are held by other workers.
                    let open = coll.count_documents(doc! { "done": false }).await.unwrap();
                    if open == 0 {
                        return mine;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                assert_eq!(id, Bson::Int64(job.id));
                assert!(!job.done, "claimed a finished job {}", job.id);
                let lock = job
                    .lock
                    .as_ref()
                    .expect("the claimed document shows its lock");
                assert_eq!(lock.lease_id.as_deref(), Some(guard.lease_id().as_str()));
                assert_eq!(lock.fencing_token, Some(guard.fencing_token()));
                processed
                    .lock()
                    .unwrap()
                    .entry(job.id)
                    .or_default()
                    .push((w, guard.fencing_token()));
                if job.id % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                // Mark done only while this lease holds the job.
                let marked = coll
                    .update_one(
                        doc! {
                            "_id": job.id,
                            "done": false,
                            "_lock.leaseId": guard.lease_id().as_str(),
                        },
                        doc! {
                            "$set": { "done": true, "doneBy": w as i64 },
                            "$inc": { "processedCount": 1 },
                        },
                    )
                    .await
                    .unwrap();
                assert_eq!(marked.modified_count, 1, "job {} was taken away", job.id);
                mine += 1;
                if job.id % 7 == 0 {
                    drop(guard); // released in the background
                } else {
                    guard.release().await.unwrap();
                }
            }
        }));
    }
    let mut per_worker = Vec::new();
    for worker in workers {
        per_worker.push(
            tokio::time::timeout(Duration::from_secs(300), worker)
                .await
                .expect("workers finished")
                .unwrap(),
        );
    }
    assert_eq!(per_worker.iter().sum::<usize>(), JOBS as usize);
    let processed = std::mem::take(&mut *processed.lock().unwrap());
    assert_eq!(processed.len(), JOBS as usize);
    for (id, claims) in processed.iter() {
        assert_eq!(claims.len(), 1, "job {id} was processed {claims:?}");
        assert_eq!(claims[0].1, 1, "job {id}: its first lock has token 1");
    }
    let docs: Vec<Document> =
        t.db.collection::<Document>(&name)
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
    assert_eq!(docs.len(), JOBS as usize, "claims never insert");
    for d in &docs {
        assert_eq!(d.get_bool("done"), Ok(true), "{d}");
        assert_eq!(
            d.get_i32("processedCount")
                .map(i64::from)
                .or_else(|_| d.get_i64("processedCount")),
            Ok(1),
            "{d}"
        );
    }
    println!("jobs per worker: {per_worker:?}");
}

/// Entry point of the helper process; a no-op in a normal test run.
#[test]
fn doc_child_entry() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("child needs {k}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(mode, "claim", "unknown child mode");
        let client = mongo::client(&env("MONGOLOCK_URI"), Some("mongolock-doc-child")).await;
        let coll = client
            .database(&env("MONGOLOCK_DB"))
            .collection::<Job>(&env("MONGOLOCK_COLL"));
        let expiry = Duration::from_millis(env("MONGOLOCK_EXPIRY_MS").parse().unwrap());
        let locks = docs_with(&coll, |b| {
            b.expiry(expiry)
                .app_name(format!("child-{}", std::process::id()))
        })
        .build()
        .unwrap();
        let claimed = locks
            .try_claim(doc! { "done": false }, Some(doc! { "n": 1 }))
            .await
            .unwrap()
            .expect("a job to claim");
        println!(
            "CLAIMED {} {} {}",
            claimed.document.id,
            claimed.guard.fencing_token(),
            claimed.guard.lease_id()
        );
        std::io::stdout().flush().unwrap();
        // "Work" forever with automatic extension, until SIGKILL.
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    });
}

fn spawn_child(t: &TestDb, coll: &str, expiry: Duration) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "documents::doc_child_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, "claim")
    .env("MONGOLOCK_URI", &t.uri)
    .env("MONGOLOCK_DB", t.db.name())
    .env("MONGOLOCK_COLL", coll)
    .env("MONGOLOCK_EXPIRY_MS", expiry.as_millis().to_string())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .kill_on_drop(true);
    cmd.spawn().expect("spawn helper process")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_job_is_claimed_again_only_after_its_lease_expires() {
    const EXPIRY: Duration = Duration::from_secs(2);
    let t = test_database().await;
    let name = unique("jobs");
    let coll = t.db.collection::<Job>(&name);
    for i in 0..3 {
        coll.insert_one(Job {
            id: i,
            n: i,
            payload: format!("job {i}"),
            done: false,
            lock: None,
        })
        .await
        .unwrap();
    }
    let mut child = spawn_child(&t, &name, EXPIRY);
    let child_pid = child.id().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let claimed = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // libtest prints "test documents::doc_child_entry ... " without a newline first.
            if let Some((_, rest)) = line.split_once("CLAIMED ") {
                return rest.to_owned();
            }
        }
        panic!("helper exited without claiming a job");
    })
    .await
    .expect("helper claimed a job");
    let mut parts = claimed.split_whitespace();
    let job_id: i64 = parts.next().unwrap().parse().unwrap();
    let child_token: u64 = parts.next().unwrap().parse().unwrap();
    let child_lease = parts.next().unwrap().to_owned();
    assert_eq!(job_id, 0, "the child claims the lowest job");
    assert_eq!(child_token, 1);

    let locks = locks_on(&coll);
    let info = locks.inspect(job_id).await.unwrap().unwrap();
    assert!(info.held);
    assert_eq!(info.holder.as_ref().map(|h| h.pid), Some(child_pid));
    assert_eq!(
        info.holder.as_ref().and_then(|h| h.app_name.clone()),
        Some(format!("child-{child_pid}"))
    );

    // Other jobs stay claimable meanwhile.
    let other = locks
        .try_claim(doc! { "done": false }, Some(doc! { "n": 1 }))
        .await
        .unwrap()
        .expect("another job is free");
    assert_eq!(other.document.id, 1);
    other.guard.release().await.unwrap();

    // Alive for longer than its expiry: automatic extension keeps the job claimed.
    let only_job = doc! { "_id": job_id, "done": false };
    assert!(locks
        .claim_timeout(only_job.clone(), None, EXPIRY + EXPIRY / 2)
        .await
        .unwrap()
        .is_none());
    assert!(locks.try_lock(job_id).await.unwrap().is_none());

    child.kill().await.unwrap(); // SIGKILL: no release, no more extensions
    let killed_at = Instant::now();
    let info = locks.inspect(job_id).await.unwrap().unwrap();
    assert_eq!(
        info.lease_id.as_ref().map(|l| l.as_str()),
        Some(child_lease.as_str())
    );
    let last_expiry = info.expires_at.unwrap();

    let again = locks
        .claim_timeout(only_job, None, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the job is claimable once the killed worker's lease expired");
    assert!(
        again.guard.acquired_at() >= last_expiry,
        "claimed again at {:?}, before the killed worker's lease expired at {last_expiry:?}",
        again.guard.acquired_at()
    );
    assert_eq!(again.guard.fencing_token(), child_token + 1);
    assert!(!again.document.done);
    let prior = again.document.lock.as_ref().unwrap();
    assert_eq!(
        prior.lease_id.as_deref(),
        Some(again.guard.lease_id().as_str())
    );
    assert!(
        killed_at.elapsed() < EXPIRY + Duration::from_secs(10),
        "failover took {:?}",
        killed_at.elapsed()
    );
    again.guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_other_fields_are_byte_for_byte_unchanged_by_lock_traffic() {
    let t = test_database().await;
    let coll = t.db.collection::<Document>(&unique("docs"));
    let original = doc! {
        "_id": "bytes",
        "s": "héllo ✓ \u{1F512}",
        "i32": 7_i32,
        "i64": 1_i64 << 40,
        "f": 1.5_f64,
        "negzero": -0.0_f64,
        "big": 1e300_f64,
        "b": true,
        "nothing": Bson::Null,
        "date": DateTime::from_millis(1_234_567),
        "oid": ObjectId::new(),
        "bin": Binary { subtype: BinarySubtype::Generic, bytes: vec![0, 1, 2, 255] },
        "arr": [1_i32, "two", { "three": 3_i64 }, [4.0_f64]],
        "nested": { "z": 1_i32, "a": { "deep": [Bson::Null, false] } },
        "ts": Timestamp { time: 7, increment: 9 },
        "re": Regex { pattern: "^a.*b$".into(), options: "i".into() },
        "done": false,
        "zz_last": "order matters",
    };
    coll.insert_one(original.clone()).await.unwrap();
    let before = raw(&coll, "bytes").await.unwrap();
    assert_eq!(
        before.as_bytes(),
        RawDocumentBuf::from_document(&original).unwrap().as_bytes(),
        "the server stores the document as inserted"
    );
    let expected = without_field(&before, "_lock");
    let check = |step: &'static str| {
        let coll = coll.clone();
        let expected = expected.clone();
        async move {
            let now = raw(&coll, "bytes").await.unwrap();
            assert_eq!(
                without_field(&now, "_lock"),
                expected,
                "user fields changed by {step}: {now:?}"
            );
            now
        }
    };

    // A lease long enough that a loaded machine never loses it here; extensions every 100 ms.
    let locks = docs_with(&coll, |b| {
        b.expiry(Duration::from_secs(5))
            .extension_cadence(Duration::from_millis(100))
            .wait_strategy(fast_waits())
    })
    .build()
    .unwrap();

    // lock (first time: the lock field is appended at the end), extend, release.
    let locked = locks.try_lock("bytes").await.unwrap().unwrap();
    let now = check("the first lock").await;
    let last = now.iter().last().unwrap().unwrap();
    assert_eq!(last.0, "_lock", "the lock field is added at the end");
    assert_eq!(locked.document, now.to_document().unwrap());
    assert!(locked.guard.extend(Duration::from_secs(5)).await.unwrap());
    check("extend").await;
    tokio::time::sleep(Duration::from_millis(350)).await; // automatic extensions
    check("automatic extension").await;
    locked.guard.release().await.unwrap();
    check("release").await;

    // lock and drop (background release).
    let locked = locks.lock("bytes").await.unwrap();
    check("lock").await;
    drop(locked);
    wait_until_free(&locks, "bytes").await;
    check("drop").await;

    // claim, a busy claim and a busy lock attempt, release.
    let claimed = locks
        .try_claim(doc! { "done": false }, Some(doc! { "i32": -1 }))
        .await
        .unwrap()
        .unwrap();
    check("claim").await;
    assert!(locks.try_lock("bytes").await.unwrap().is_none());
    assert!(locks.try_claim(doc! {}, None).await.unwrap().is_none());
    check("busy attempts").await;
    claimed.guard.release().await.unwrap();
    check("release of a claim").await;

    // expiry and takeover, and the loser's failed release.
    let short = docs_with(&coll, |b| {
        b.expiry(Duration::from_millis(200)).auto_extend(false)
    })
    .build()
    .unwrap();
    let loser = short.try_lock("bytes").await.unwrap().unwrap();
    let winner = locks
        .lock_timeout("bytes", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    check("takeover").await;
    assert!(!loser.guard.extend(Duration::from_secs(1)).await.unwrap());
    assert!(matches!(
        loser.guard.release().await,
        Err(Error::LeaseLost { .. })
    ));
    check("the loser's extension and release").await;
    winner.guard.release().await.unwrap();
    let after = check("the final release").await;
    let lock = after.get_document("_lock").unwrap();
    assert_eq!(
        lock.get("leaseId").unwrap(),
        Some(mongodb::bson::RawBsonRef::Null)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_document_is_an_error_and_nothing_is_inserted() {
    let t = test_database().await;
    let coll = t.db.collection::<Plain>(&unique("plain"));
    coll.insert_one(Plain {
        id: "present".into(),
        value: 1,
    })
    .await
    .unwrap();
    let locks = locks_on(&coll);

    let err = locks.try_lock("absent").await.unwrap_err();
    assert!(is_not_found(&err), "{err}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("absent"), "{err}");
    let started = Instant::now();
    let err = locks
        .lock_timeout("absent", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(is_not_found(&err), "{err}");
    let err = tokio::time::timeout(Duration::from_secs(5), locks.lock("absent"))
        .await
        .expect("a missing document is reported at once, not waited for")
        .unwrap_err();
    assert!(is_not_found(&err), "{err}");
    assert!(started.elapsed() < Duration::from_secs(4));

    assert!(locks
        .try_claim(doc! { "_id": "absent" }, None)
        .await
        .unwrap()
        .is_none());
    assert!(locks
        .claim_timeout(doc! { "value": 2 }, None, Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    assert!(locks.inspect("absent").await.unwrap().is_none());

    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    assert!(coll
        .find_one(doc! { "_id": "absent" })
        .await
        .unwrap()
        .is_none());

    // The present one locks fine (the type has no lock field: it is ignored).
    let locked = locks.try_lock("present").await.unwrap().unwrap();
    assert_eq!(locked.document.value, 1);
    assert_eq!(locked.id, Bson::String("present".into()));
    locked.guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lost_signal_fires_when_the_lease_is_taken() {
    let t = test_database().await;
    let coll = t.db.collection::<Plain>(&unique("plain"));
    for id in ["a", "b"] {
        coll.insert_one(Plain {
            id: id.into(),
            value: 0,
        })
        .await
        .unwrap();
    }
    let locks = locks_on(&coll);

    // Without automatic extension the lease runs out; another holder takes it after expiry.
    let short = docs_with(&coll, |b| {
        b.expiry(Duration::from_millis(500)).auto_extend(false)
    })
    .build()
    .unwrap();
    let first = short.try_lock("a").await.unwrap().unwrap();
    let lost = first.guard.lost();
    assert!(locks.try_lock("a").await.unwrap().is_none());
    let second = locks
        .lock_timeout("a", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free after expiry");
    assert!(second.guard.acquired_at() >= first.guard.expires_at());
    assert_eq!(
        second.guard.fencing_token(),
        first.guard.fencing_token() + 1
    );
    tokio::time::timeout(Duration::from_secs(5), lost.wait())
        .await
        .expect("the lost signal fired");
    assert!(first.guard.is_lost());
    assert!(!first.guard.extend(Duration::from_secs(1)).await.unwrap());
    assert!(matches!(
        first.guard.release().await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(!second.guard.is_lost());
    second.guard.release().await.unwrap();

    // With automatic extension: someone overwrites the lock (an operator, a buggy writer);
    // the next extension finds the lease gone.
    let extending = docs_with(&coll, |b| {
        b.expiry(Duration::from_secs(3))
            .extension_cadence(Duration::from_millis(100))
    })
    .build()
    .unwrap();
    let held = extending.try_lock("b").await.unwrap().unwrap();
    coll.clone_with_type::<Document>()
        .update_one(
            doc! { "_id": "b" },
            doc! { "$set": { "_lock.leaseId": "intruder" } },
        )
        .await
        .unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), held.guard.lost())
        .await
        .expect("the lost signal fired");
    assert!(started.elapsed() < Duration::from_secs(2));
    let reason = held.guard.lost_reason().unwrap();
    // Whichever comes first: the failed extension or the change stream.
    assert!(
        matches!(
            reason,
            mongolock::LossReason::Expired | mongolock::LossReason::TakenOver
        ),
        "{reason}"
    );
}

/// Early loss detection through the collection's change stream: a cleared lease or a deleted
/// document is noticed long before the next extension (every 20 s); our own extensions (of
/// this guard, and of a frequently extended one) are not a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_stream_reports_a_loss_before_the_next_extension() {
    let t = test_database().await;
    let name = unique("early");
    let coll = t.db.collection::<Plain>(&name);
    for id in ["slow", "busy"] {
        coll.insert_one(Plain {
            id: id.into(),
            value: 0,
        })
        .await
        .unwrap();
    }
    let raw_coll = t.db.collection::<Document>(&name);
    raw_coll
        .insert_one(doc! { "_id": 7_i64, "value": 0_i64 })
        .await
        .unwrap();
    let slow = docs_with(&coll, |b| {
        b.expiry(Duration::from_secs(60))
            .extension_cadence(Duration::from_secs(20))
    })
    .build()
    .unwrap();
    let busy = docs_with(&coll, |b| {
        b.expiry(Duration::from_secs(2))
            .extension_cadence(Duration::from_millis(200))
    })
    .build()
    .unwrap();
    let slow_raw = docs_with(&raw_coll, |b| {
        b.expiry(Duration::from_secs(60))
            .extension_cadence(Duration::from_secs(20))
    })
    .build()
    .unwrap();
    let g = slow.try_lock("slow").await.unwrap().unwrap();
    let b = busy.try_lock("busy").await.unwrap().unwrap();
    let n = slow_raw.try_lock(7_i64).await.unwrap().unwrap();
    for _ in 0..3 {
        assert!(g.guard.extend(Duration::from_secs(60)).await.unwrap());
    }
    // Meanwhile the streams open and `busy` is extended a dozen times.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!g.guard.is_lost(), "extensions are not a loss");
    assert!(!b.guard.is_lost(), "extensions are not a loss");
    assert!(!n.guard.is_lost());

    // Someone clears the lease (an operator's force release).
    let started = Instant::now();
    coll.clone_with_type::<Document>()
        .update_one(
            doc! { "_id": "slow" },
            doc! { "$set": { "_lock.leaseId": Bson::Null } },
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), g.guard.lost())
        .await
        .expect("the lost signal fires on the change, not at the next extension (20 s)");
    assert!(started.elapsed() < Duration::from_secs(10));
    let reason = g.guard.lost_reason().expect("a reason");
    assert_eq!(reason, mongolock::LossReason::TakenOver, "{reason}");
    assert!(reason.to_string().contains("store"), "{reason}");
    // The document is free: the next holder is not told its own grant is a loss.
    let next = slow.try_lock("slow").await.unwrap().expect("free");
    assert_eq!(next.guard.fencing_token(), g.guard.fencing_token() + 1);

    // A document with a numeric `_id`, deleted under its holder.
    let started = Instant::now();
    raw_coll.delete_one(doc! { "_id": 7_i64 }).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), n.guard.lost())
        .await
        .expect("the lost signal fires on the delete");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(n.guard.lost_reason().is_some());

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.guard.is_lost());
    assert!(!next.guard.is_lost());
    b.guard.release().await.unwrap();
    next.guard.release().await.unwrap();
}

/// On a standalone server (no change streams) document guards detect loss by extension only,
/// as before: a cleared lease goes unnoticed until the next extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_servers_detect_document_loss_by_extension() {
    if std::env::var("MONGODB_URI").is_ok_and(|u| !u.is_empty()) {
        eprintln!("skipped: needs the embedded server in standalone mode");
        return;
    }
    let t = test_database_with(TestServer::builder().standalone(true)).await;
    let coll = t.db.collection::<Plain>(&unique("plain"));
    coll.insert_one(Plain {
        id: "a".into(),
        value: 0,
    })
    .await
    .unwrap();
    let locks = docs_with(&coll, |b| {
        b.expiry(Duration::from_secs(60))
            .extension_cadence(Duration::from_secs(20))
    })
    .build()
    .unwrap();
    let g = locks.try_lock("a").await.unwrap().unwrap();
    // Let the stream attempt fail (40573).
    tokio::time::sleep(Duration::from_millis(500)).await;
    coll.clone_with_type::<Document>()
        .update_one(
            doc! { "_id": "a" },
            doc! { "$set": { "_lock.leaseId": Bson::Null } },
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !g.guard.is_lost(),
        "no change stream on a standalone server"
    );
    assert!(!g.guard.extend(Duration::from_secs(60)).await.unwrap());
    assert!(g.guard.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_grow_per_document() {
    let t = test_database().await;
    let coll = t.db.collection::<Plain>(&unique("plain"));
    for id in ["x", "y"] {
        coll.insert_one(Plain {
            id: id.into(),
            value: 0,
        })
        .await
        .unwrap();
    }
    let locks = locks_on(&coll);
    let info = locks.inspect("x").await.unwrap().unwrap();
    assert_eq!((info.fencing_token, info.held), (None, false));

    let mut tokens = Vec::new();
    for _ in 0..3 {
        let locked = locks.try_lock("x").await.unwrap().unwrap();
        tokens.push(locked.guard.fencing_token());
        locked.guard.release().await.unwrap();
    }
    assert_eq!(tokens, [1, 2, 3]);
    let info = locks.inspect("x").await.unwrap().unwrap();
    assert_eq!(info.fencing_token, Some(3), "release keeps the token");
    assert!(!info.held);
    assert!(info.lease_id.is_none());
    assert!(info.expires_at.unwrap() <= info.observed_at);

    // Another document has its own sequence.
    let y = locks.try_lock("y").await.unwrap().unwrap();
    assert_eq!(y.guard.fencing_token(), 1);
    drop(y);

    // A claim continues the document's sequence, and so does a takeover after expiry.
    let claimed = locks
        .try_claim(doc! { "_id": "x" }, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.guard.fencing_token(), 4);
    claimed.guard.release().await.unwrap();
    let short = docs_with(&coll, |b| {
        b.expiry(Duration::from_millis(200)).auto_extend(false)
    })
    .build()
    .unwrap();
    let expiring = short.try_lock("x").await.unwrap().unwrap();
    assert_eq!(expiring.guard.fencing_token(), 5);
    let taken = locks
        .lock_timeout("x", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.guard.fencing_token(), 6);
    taken.guard.release().await.unwrap();
    drop(expiring);

    // Documented: tokens live in the document; recreating it restarts them.
    coll.delete_one(doc! { "_id": "x" }).await.unwrap();
    coll.insert_one(Plain {
        id: "x".into(),
        value: 0,
    })
    .await
    .unwrap();
    let fresh = locks.try_lock("x").await.unwrap().unwrap();
    assert_eq!(fresh.guard.fencing_token(), 1);
    fresh.guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_for_release_and_the_typed_document_shows_the_lock() {
    let t = test_database().await;
    let coll = t.db.collection::<Job>(&unique("jobs"));
    coll.insert_one(Job {
        id: 7,
        n: 7,
        payload: "p".into(),
        done: false,
        lock: None,
    })
    .await
    .unwrap();
    let locks = locks_on(&coll);
    let held = locks.lock(7_i64).await.unwrap();
    let lock = held.document.lock.clone().unwrap();
    assert_eq!(
        lock.lease_id.as_deref(),
        Some(held.guard.lease_id().as_str())
    );
    assert_eq!(lock.fencing_token, Some(1));
    assert_eq!(
        lock.acquired_at.map(|d| d.to_system_time()),
        Some(held.guard.acquired_at())
    );
    assert_eq!(
        lock.expires_at.map(|d| d.to_system_time()),
        Some(held.guard.expires_at())
    );
    let holder = lock.holder.unwrap();
    assert_eq!(holder.pid, std::process::id());
    assert_eq!(holder.app.as_deref(), Some("documents-test"));
    assert!(held.guard.name().contains(':'), "{}", held.guard.name());

    // A waiter gets it once released.
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock(7_i64).await.unwrap() })
    };
    assert!(locks
        .lock_timeout(7_i64, Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());
    held.guard.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter got the document")
        .unwrap();
    assert_eq!(next.guard.fencing_token(), 2);

    // A waiting lock that is given up leaves nothing held behind.
    let abandoned = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock(7_i64).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    abandoned.abort();
    let _ = abandoned.await;
    next.guard.release().await.unwrap();
    let again = locks
        .lock_timeout(7_i64, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free after the abandoned waiter");
    again.guard.release().await.unwrap();
}

/// `claim` waits: started while no document matches, it gets one inserted later; started while
/// every match is locked, it gets the document once its holder releases it — here a holder
/// with another handle, whose release does not wake this one's waits, so the claim finds it by
/// polling, as a claim in another process would. `try_claim` makes exactly one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_gets_a_document_inserted_or_unlocked_later() {
    let t = test_database().await;
    let name = unique("waiting_claims");
    let coll = t.db.collection::<Document>(&name);
    let open = || doc! { "state": "open" };
    let locks = locks_on(&coll);
    assert!(locks.try_claim(open(), None).await.unwrap().is_none());

    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.claim(doc! { "state": "open" }, None).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "claim on {name} returned while no document matched: it must wait"
    );
    coll.insert_one(doc! { "_id": 1, "state": "open" })
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap_or_else(|_| panic!("the waiting claim on {name} never got the inserted document"))
        .unwrap()
        .unwrap();
    assert_eq!(first.id, Bson::Int32(1));
    let token = first.guard.fencing_token();

    let other = locks_on(&coll);
    assert!(other.try_claim(open(), None).await.unwrap().is_none());
    let waiting = {
        let other = other.clone();
        tokio::spawn(async move { other.claim(doc! { "state": "open" }, None).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "claim on {name} returned while the only match was locked (token {token})"
    );
    first.guard.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap_or_else(|_| panic!("the waiting claim on {name} never got the released document"))
        .unwrap()
        .unwrap();
    assert_eq!(second.id, Bson::Int32(1));
    assert!(
        second.guard.fencing_token() > token,
        "token {} after {token}",
        second.guard.fencing_token()
    );
    assert!(locks.try_claim(open(), None).await.unwrap().is_none());
    second.guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_follows_the_filter_and_sort_and_a_custom_field() {
    let t = test_database().await;
    let coll = t.db.collection::<Document>(&unique("queue"));
    for (i, (queue, priority)) in [("a", 1), ("a", 5), ("b", 9), ("a", 3)].iter().enumerate() {
        coll.insert_one(doc! { "_id": i as i32, "queue": *queue, "priority": *priority })
            .await
            .unwrap();
    }
    let locks = docs_with(&coll, |b| b.wait_strategy(fast_waits()))
        .field("lockState")
        .build()
        .unwrap();
    assert_eq!(locks.field(), "lockState");
    let by_priority = Some(doc! { "priority": -1 });
    let mut held = Vec::new();
    for expected in [5, 3, 1] {
        let c = locks
            .try_claim(doc! { "queue": "a" }, by_priority.clone())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(c.document.get_i32("priority"), Ok(expected));
        assert!(c.document.get_document("lockState").is_ok());
        assert!(c.document.get("_lock").is_none());
        held.push(c);
    }
    assert!(locks
        .try_claim(doc! { "queue": "a" }, by_priority.clone())
        .await
        .unwrap()
        .is_none());
    // Release the middle one: it is the only claimable one of queue "a" again.
    let middle = held.remove(1);
    middle.guard.release().await.unwrap();
    let c = locks
        .claim(doc! { "queue": "a" }, by_priority)
        .await
        .unwrap();
    assert_eq!(c.document.get_i32("priority"), Ok(3));
    assert_eq!(c.guard.fencing_token(), 2);
    let b = coll.find_one(doc! { "queue": "b" }).await.unwrap().unwrap();
    assert!(b.get("lockState").is_none(), "queue b was never touched");
}

/// Claims use indexable conditions: with the indexes `ensure_indexes` creates, a claim finds an
/// expired lease among many held ones, and never takes a lease that is about to expire (within
/// the index condition's clock slack) before the server's clock says it has.
#[tokio::test]
async fn claims_find_expired_leases_among_held_ones_with_their_indexes() {
    let t = test_database().await;
    let coll = t.db.collection::<Document>(&unique("jobs"));
    let locks = locks_on(&coll);
    locks.ensure_indexes().await.unwrap();
    locks.ensure_indexes().await.unwrap();
    let indexes: Vec<String> = coll.list_index_names().await.unwrap();
    for name in ["_lock.leaseId_1", "_lock.expiresAt_1"] {
        assert!(
            indexes.iter().any(|i| i == name),
            "{name} missing: {indexes:?}"
        );
    }
    let now = DateTime::now().timestamp_millis();
    let lease = |id: &str, expires_ms: i64| {
        doc! {
            "leaseId": id, "fencingToken": 7_i64,
            "acquiredAt": DateTime::from_millis(now - 60_000),
            "expiresAt": DateTime::from_millis(expires_ms),
            "holder": { "host": "elsewhere", "pid": 1_i64, "app": Bson::Null },
        }
    };
    for i in 0..40 {
        coll.insert_one(doc! { "_id": i, "kind": "job" })
            .await
            .unwrap();
    }
    // Expires 3 s from now: inside the 5 s slack of the index condition, still held.
    coll.insert_one(doc! { "_id": 100, "kind": "job", "_lock": lease("soon", now + 3_000) })
        .await
        .unwrap();
    // Expired a minute ago: claimable.
    coll.insert_one(doc! { "_id": 101, "kind": "job", "_lock": lease("crashed", now - 60_000) })
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..41 {
        let c = locks.try_claim(doc! { "kind": "job" }, None).await.unwrap();
        held.push(c.expect("a free job"));
    }
    let claimed: Vec<i32> = held
        .iter()
        .map(|c| c.document.get_i32("_id").unwrap())
        .collect();
    assert!(
        claimed.contains(&101),
        "the expired lease was not claimed: {claimed:?}"
    );
    assert!(
        !claimed.contains(&100),
        "an unexpired lease was claimed: {claimed:?}"
    );
    let expired = held
        .iter()
        .find(|c| c.document.get_i32("_id") == Ok(101))
        .unwrap();
    assert_eq!(expired.guard.fencing_token(), 8);
    // Only the lease about to expire is left: claimed once it has expired.
    assert!(locks
        .try_claim(doc! { "kind": "job" }, None)
        .await
        .unwrap()
        .is_none());
    let late = locks
        .claim_timeout(doc! { "kind": "job" }, None, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the lease that expired is claimed");
    assert_eq!(late.document.get_i32("_id"), Ok(100));
    assert_eq!(late.guard.fencing_token(), 8);
}

#[tokio::test]
async fn options_are_validated_before_anything_is_sent() {
    let t = test_database().await;
    let coll = t.db.collection::<Document>("never_used");
    for field in ["", "_id", "a.b", "$x"] {
        let err = docs_with(&coll, |b| b).field(field).build().unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidOptions {
                    option: "field",
                    ..
                }
            ),
            "{field:?}: {err}"
        );
    }
    // The lease duration and the other lock options are the provider's (validated by its
    // builder); `with_expiry` checks a handle's own.
    let locks = docs_with(&coll, |b| b).build().unwrap();
    assert_eq!(locks.field(), "_lock");
    assert_eq!(locks.expiry(), Duration::from_secs(30));
    let err = locks.clone().with_expiry(Duration::ZERO).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOptions {
                option: "expiry",
                ..
            }
        ),
        "{err}"
    );
    // Below the minimum lease (1 ms gave a guard that was already lost; the provider's builder
    // refuses it as well, see the contract case `bad_input_is_rejected_before_the_backend`).
    let err = locks
        .clone()
        .with_expiry(Duration::from_millis(1))
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidOptions { option: "expiry", ref reason } if reason.contains("minimum of 100 ms")),
        "{err}"
    );
    assert_eq!(
        locks.with_expiry(Duration::from_secs(5)).unwrap().expiry(),
        Duration::from_secs(5)
    );
    // Shared with the named locks' provider options.
    let provider = mongolock::LockProvider::builder(mongolock::MemoryBackend::new())
        .expiry(Duration::from_secs(12))
        .app_name("shared")
        .build()
        .unwrap();
    let shared = provider.documents(&coll).build().unwrap();
    assert_eq!(shared.expiry(), Duration::from_secs(12));
    assert_eq!(shared.holder().app_name.as_deref(), Some("shared"));
    assert_eq!(shared.holder(), provider.holder());
    let names: Vec<String> = t.db.list_collection_names().await.unwrap();
    assert!(!names.contains(&"never_used".to_owned()));
}
