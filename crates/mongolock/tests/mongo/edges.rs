//! The lease at the edges: a starved runtime and a paused process never see a lease as held past
//! its local deadline; an acquire that gives up after a grant whose reply was lost leaves
//! nothing held; a release retried after a lost reply succeeds; release is bounded in time;
//! decision reads go to the primary whatever the handle's read preference.
//!
//! Lost replies are injected with `failCommand` + `writeConcernError`: as on `mongod`, the write
//! runs and the reply carries the error (code 91, which the driver retries once and then
//! reports; `times: 2` covers the retry). Runs against the embedded mongo-testserver, or
//! against `MONGODB_URI` (fault cases only with `MONGODB_FAILPOINTS=1`).
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use crate::support::mongo;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::mongo::docs_with;
use futures_util::FutureExt;
use mongo::{test_database, unique, TestDb};
use mongodb::bson::{doc, Bson, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::{ClientOptions, ReadConcern, ReadPreference, SelectionCriteria};
use mongolock::{DriftMargin, Error, LockGuard, LockProvider, MongoBackend};
use std::future::IntoFuture;
use tokio::time::Instant;

const CHILD_ENV: &str = "MONGOLOCK_EDGES_CHILD";

fn provider_on(db: &mongodb::Database, coll: &str, expiry: Duration) -> LockProvider {
    let backend = MongoBackend::builder(db).collection(coll).build().unwrap();
    LockProvider::builder(backend)
        .expiry(expiry)
        .build()
        .unwrap()
}

/// Blocks the calling thread (the runtime's only worker) for `d`: no task runs meanwhile.
fn starve(d: Duration) {
    std::thread::sleep(d);
}

/// After the only worker thread was blocked past the deadline, every read of the guard says
/// lost before any other task (the watchdog) had a chance to run.
async fn starved_guard_reads_lost(guard: LockGuard, expiry: Duration) {
    let lost = guard.lost();
    assert!(!guard.is_lost(), "fresh guard {guard:?} reads as lost");
    let deadline = guard.local_deadline();
    starve(expiry + Duration::from_millis(200));
    assert!(Instant::now() > deadline);
    assert!(
        lost.is_lost(),
        "LostSignal::is_lost is false {:?} after the local deadline",
        Instant::now() - deadline
    );
    assert!(guard.is_lost(), "is_lost is false after the local deadline");
    let reason = guard.lost_reason().expect("a reason");
    assert_eq!(
        reason,
        mongolock::LossReason::DeadlinePassed,
        "reason: {reason}"
    );
    assert!(
        reason.to_string().contains("local deadline"),
        "reason: {reason}"
    );
    assert!(
        guard.lost().wait().now_or_never().is_some(),
        "the lost future is ready at once"
    );
    assert!(
        !guard.extend(expiry).await.unwrap(),
        "extend after the deadline returns false"
    );
}

#[test]
fn a_starved_runtime_reads_lost_at_the_deadline_memory() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let expiry = Duration::from_millis(300);
        let provider = LockProvider::builder(mongolock::MemoryBackend::new())
            .expiry(expiry)
            .build()
            .unwrap();
        let guard = provider.lock("starved").unwrap().acquire().await.unwrap();
        starved_guard_reads_lost(guard, expiry).await;
    });
}

#[test]
fn a_starved_runtime_reads_lost_at_the_deadline_mongodb() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let t = test_database().await;
        let expiry = Duration::from_millis(800);
        let provider = provider_on(&t.db, &unique("locks"), expiry);
        let guard = provider
            .lock(unique("starved"))
            .unwrap()
            .acquire()
            .await
            .unwrap();
        starved_guard_reads_lost(guard, expiry).await;
    });
}

#[tokio::test]
async fn the_drift_margin_shortens_the_local_deadline() {
    assert!(DriftMargin::new(0.5, Duration::ZERO).is_err());
    assert!(DriftMargin::new(-0.1, Duration::ZERO).is_err());
    assert!(DriftMargin::new(f64::NAN, Duration::ZERO).is_err());
    let default = DriftMargin::default();
    assert_eq!(
        default.margin(Duration::from_secs(30)),
        Duration::from_millis(305)
    );
    assert_eq!(
        default.margin(Duration::from_millis(2)),
        Duration::from_millis(2),
        "never more than the lease"
    );

    let expiry = Duration::from_secs(10);
    let margin = DriftMargin::new(0.1, Duration::from_millis(500)).unwrap();
    let provider = LockProvider::builder(mongolock::MemoryBackend::new())
        .expiry(expiry)
        .drift_margin(margin)
        .build()
        .unwrap();
    let before = Instant::now();
    let guard = provider.lock("drift").unwrap().acquire().await.unwrap();
    let after = Instant::now();
    let trusted = expiry - Duration::from_millis(1500);
    assert!(
        guard.local_deadline() >= before + trusted && guard.local_deadline() <= after + trusted,
        "deadline {:?} after acquire, expected {trusted:?}",
        guard.local_deadline() - before
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_zero_release_timeout_is_refused() {
    let err = LockProvider::builder(mongolock::MemoryBackend::new())
        .release_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("release timeout"), "{err}");
}

/// A fail point on `commands` for clients named `app` that lets the write run and reports a
/// write concern error (shutdown in progress) on it and on the driver's retry.
async fn lose_replies(t: &TestDb, app: &str, commands: &[&str]) {
    t.fail_point(
        Bson::Document(doc! { "times": 2 }),
        doc! {
            "failCommands": commands.to_vec(),
            "appName": app,
            "writeConcernError": { "code": 91, "codeName": "ShutdownInProgress", "errmsg": "injected: reply lost" },
        },
    )
    .await;
}

/// [`lose_replies`], each lost reply also delayed by `block_ms` (so that an attempt surely
/// outlasts a short acquire budget, however fast the server and the client are).
async fn lose_slow_replies(t: &TestDb, app: &str, commands: &[&str], block_ms: i32) {
    t.fail_point(
        Bson::Document(doc! { "times": 2 }),
        doc! {
            "failCommands": commands.to_vec(),
            "appName": app,
            "blockConnection": true,
            "blockTimeMS": block_ms,
            "writeConcernError": { "code": 91, "codeName": "ShutdownInProgress", "errmsg": "injected: reply lost" },
        },
    )
    .await;
}

#[tokio::test]
async fn an_acquire_that_gives_up_after_a_lost_grant_leaves_nothing_held() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let coll = unique("locks");
    let observer = provider_on(&t.db, &coll, Duration::from_secs(60));
    for form in ["try_acquire", "acquire_timeout"] {
        let app = unique("orphans");
        let provider = provider_on(&t.database_as(&app).await, &coll, Duration::from_secs(60));
        let name = unique(form);
        // Create the document and stamp its token first, so the faulted attempt is the single
        // findAndModify of a grant.
        mongo::take_once(&provider, &name).await;
        // Each lost reply also comes 20 ms late, so the first attempt (the driver's try and its
        // retry) outlasts the 1 ms budget below and the call gives up instead of retrying. (A
        // retry within the budget would take over the grant — same lease id — and succeed.)
        lose_slow_replies(&t, &app, &["findAndModify"], 20).await;
        let lock = provider.lock(name.clone()).unwrap();
        let result = match form {
            "try_acquire" => lock.try_acquire().await,
            _ => lock.acquire_timeout(Duration::from_millis(1)).await,
        };
        t.fail_point_off().await;
        let err = match result {
            Err(e) => e,
            Ok(Some(guard)) => panic!("{form}: got {guard:?} although every reply was lost"),
            Ok(None) => panic!("{form}: reported busy although the lock was free"),
        };
        assert!(err.is_transient(), "{form}: {err}");
        // The grant was applied at the server; the call gave up, so it releases it.
        let gave_up = Instant::now();
        let info = observer.inspect(&name).await.unwrap().unwrap();
        let released = mongolock::testing::eventually(Duration::from_secs(20), || async {
            !observer.inspect(&name).await.unwrap().unwrap().held
        })
        .await;
        assert!(
            released,
            "{form}: lock {name} still held by the abandoned grant (first read: {info:?})"
        );
        eprintln!(
            "{form}: the abandoned grant of {name} was released within {:?} of the call \
             returning (lease 60 s)",
            gave_up.elapsed()
        );
        // And it is free for others at once, with a larger token.
        let next = observer
            .lock(name.clone())
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{form}: {name} not free"));
        assert!(next.fencing_token() > info.fencing_token.unwrap_or(0));
        next.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_retried_release_whose_first_try_was_applied_succeeds() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("releases");
    let coll = unique("locks");
    let provider = provider_on(&t.database_as(&app).await, &coll, Duration::from_secs(60));
    let name = unique("release");
    let guard = provider
        .lock(name.clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let token = guard.fencing_token();
    lose_replies(&t, &app, &["findAndModify"]).await;
    let result = guard.release().await;
    t.fail_point_off().await;
    result.unwrap_or_else(|e| panic!("release of {name} (token {token}) failed: {e}"));
    let info = provider.inspect(&name).await.unwrap().unwrap();
    assert!(!info.held && info.lease_id.is_none(), "{info:?}");

    // A lease someone else ended is still reported lost.
    let guard = provider
        .lock(name.clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(provider.force_release(&name).await.unwrap());
    match guard.release().await {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!("release after force-release: {other:?}"),
    }
}

#[tokio::test]
async fn release_is_bounded_by_the_release_timeout() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("slow");
    let db = t.database_as(&app).await;
    let backend = MongoBackend::builder(&db)
        .collection(unique("locks"))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend)
        .expiry(Duration::from_secs(60))
        .release_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let name = unique("hung");
    let guard = provider
        .lock(name.clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    t.fail_point(
        Bson::Document(doc! { "times": 1 }),
        doc! {
            "failCommands": ["findAndModify"],
            "appName": app.as_str(),
            "blockConnection": true,
            "blockTimeMS": 20_000,
        },
    )
    .await;
    let started = Instant::now();
    let result = guard.release().await;
    let took = started.elapsed();
    t.fail_point_off().await;
    let err = result.expect_err("a release blocked for 20 s cannot succeed within 300 ms");
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("release timeout"), "{err}");
    // Far below the 20 s block: the call returned because of its own limit.
    assert!(took < Duration::from_secs(10), "release took {took:?}");
    eprintln!("release blocked for 20 s at the server returned after {took:?} (timeout 300 ms)");
}

/// A client whose database handle prefers secondaries and reads with `local` concern; every
/// read of ours must still go to the primary with majority read concern.
#[tokio::test]
async fn decision_reads_go_to_the_primary_with_majority_read_concern() {
    let t = test_database().await;
    let seen: Arc<Mutex<Vec<Document>>> = Arc::default();
    // A direct connection sends every read as `primaryPreferred` (the server selection rules
    // for a single server), which would hide the read preference: connect to the embedded
    // server as to a replica set instead.
    let uri = match &t.server {
        Some(_) => t.uri.replace(
            "directConnection=true",
            &format!("replicaSet={}", mongo_testserver::DEFAULT_SET_NAME),
        ),
        None => t.uri.clone(),
    };
    let mut options = ClientOptions::parse(&uri).await.unwrap();
    options.selection_criteria = Some(SelectionCriteria::ReadPreference(
        ReadPreference::SecondaryPreferred {
            options: Default::default(),
        },
    ));
    options.read_concern = Some(ReadConcern::local());
    let sink = seen.clone();
    options.command_event_handler = Some(EventHandler::callback(move |e: CommandEvent| {
        if let CommandEvent::Started(started) = e {
            if matches!(started.command_name.as_str(), "aggregate" | "find") {
                sink.lock().unwrap().push(started.command);
            }
        }
    }));
    let client = mongodb::Client::with_options(options).unwrap();
    let db = client.database(t.db.name());
    let expiry = Duration::from_secs(3);
    let provider = provider_on(&db, &unique("locks"), expiry);
    let name = unique("role");
    let guard = provider
        .lock(name.clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    // Hold across several extensions: nothing may signal a spurious loss.
    tokio::time::sleep(expiry * 2).await;
    assert!(!guard.is_lost(), "spurious loss: {:?}", guard.lost_reason());
    provider.inspect(&name).await.unwrap().unwrap();
    provider.list().await.unwrap();
    let election = provider.election("elected").unwrap();
    assert!(election.leader().await.unwrap().is_none());
    guard.release().await.unwrap();

    let commands = seen.lock().unwrap().clone();
    assert!(
        commands.len() >= 3,
        "expected the reads to be seen: {commands:?}"
    );
    for c in &commands {
        if let Ok(pref) = c.get_document("$readPreference") {
            assert_eq!(pref.get_str("mode"), Ok("primary"), "read with {pref}: {c}");
        }
        let level = c
            .get_document("readConcern")
            .ok()
            .and_then(|r| r.get_str("level").ok());
        assert_eq!(level, Some("majority"), "read concern of {c}");
    }
}

/// Entry point of the paused helper process; a no-op in a normal test run.
#[test]
fn child_entry() {
    let Ok(uri) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = mongo::client(&uri, Some("paused-child")).await;
        let db = client.database(&std::env::var("MONGOLOCK_DB").unwrap());
        // Long enough that the pause surely starts before the deadline; the pause is longer.
        let expiry = Duration::from_millis(5000);
        let provider = provider_on(&db, &std::env::var("MONGOLOCK_COLL").unwrap(), expiry);
        let started = Instant::now();
        let guard = provider.lock("paused").unwrap().acquire().await.unwrap();
        println!(
            "HELD token={} acquire_ms={}",
            guard.fencing_token(),
            started.elapsed().as_millis()
        );
        // Work in small blocking steps, checking the lease before each: the runtime never runs
        // another task meanwhile, so only the guard's own clock check can notice the pause.
        let mut last = Instant::now();
        let end = last + Duration::from_secs(60);
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
            let now = Instant::now();
            let gap = now - last;
            last = now;
            let lost = guard.is_lost();
            if gap > expiry {
                println!(
                    "RESUMED gap_ms={} lost={lost} reason={:?}",
                    gap.as_millis(),
                    guard.lost_reason().map(|r| r.to_string())
                );
                std::process::exit(0);
            }
            if lost {
                println!(
                    "LOST-EARLY gap_ms={} held_for_ms={} since_acquire_began_ms={} reason={:?}",
                    gap.as_millis(),
                    (now - (end - Duration::from_secs(60))).as_millis(),
                    (now - started).as_millis(),
                    guard.lost_reason().map(|r| r.to_string())
                );
                std::process::exit(1);
            }
        }
        println!("NEVER-PAUSED");
        std::process::exit(1);
    });
}

/// One run of the paused child: its verdict line and all its output.
async fn paused_child(t: &mongo::TestDb) -> (String, Vec<String>, std::process::ExitStatus) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let exe = std::env::current_exe().unwrap();
    let mut child = tokio::process::Command::new(exe)
        .args([
            "edges::child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &t.uri)
        .env("MONGOLOCK_DB", t.db.name())
        .env("MONGOLOCK_COLL", unique("locks"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap() as i32;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let held = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line.clone());
            if line.contains("HELD token=") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(held, Ok(true), "child output: {seen:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Paused well past its 5 s lease.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    tokio::time::sleep(Duration::from_millis(7000)).await;
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let verdict = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line.clone());
            if line.starts_with("RESUMED") || line.starts_with("LOST") || line.starts_with("NEVER")
            {
                return Some(line);
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    let status = child.wait().await.unwrap();
    let verdict = verdict.unwrap_or_else(|| panic!("no verdict; child output: {seen:?}"));
    (verdict, seen, status)
}

#[tokio::test]
async fn a_process_paused_past_its_lease_reads_lost_when_it_resumes() {
    let t = test_database().await;
    let mut attempt = 0;
    let (verdict, seen, status) = loop {
        attempt += 1;
        let (verdict, seen, status) = paused_child(&t).await;
        // A lease whose local deadline passed before the pause, because the acquisition itself
        // took most of the 5 s lease on a loaded machine (its deadline counts from when the
        // attempt was sent), says nothing about the pause: run again. Lost any earlier is a
        // failure.
        let began_ms = verdict
            .split_whitespace()
            .find_map(|w| w.strip_prefix("since_acquire_began_ms="))
            .and_then(|v| v.parse::<u64>().ok());
        match began_ms {
            Some(ms) if verdict.starts_with("LOST-EARLY") && ms >= 4500 && attempt < 3 => {
                eprintln!("attempt {attempt}: the lease ran out before the pause: {verdict}");
            }
            _ => break (verdict, seen, status),
        }
    };
    assert!(
        verdict.contains("lost=true") && verdict.contains("local deadline"),
        "the first check after the pause must read lost: {verdict} (all output: {seen:?})"
    );
    assert!(status.success(), "{status:?}; output {seen:?}");
    eprintln!("paused child: {verdict}");
}

/// The release of an abandoned claim (a claim whose grant reply was lost: its lease id may
/// hold any matching document) is a multi-document `update` (`multi: true`) whose filter names
/// only the lease id: on a sharded collection, mongos before MongoDB 7.1 refuses an
/// `update_one` whose filter has neither `_id` nor the shard key (ShardKeyNotFound 61,
/// InvalidOptions 72), and the lease would linger until it expired. mongo-testserver cannot
/// emulate mongos yet, so this checks the shape of the command sent, and that the release
/// frees the document, not mongos's refusal.
#[tokio::test]
async fn an_abandoned_claim_is_released_with_a_multi_update() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("claim-release");
    let updates: Arc<Mutex<Vec<Document>>> = Arc::default();
    let mut options = ClientOptions::parse(&t.uri).await.unwrap();
    options.app_name = Some(app.clone());
    let sink = updates.clone();
    options.command_event_handler = Some(EventHandler::callback(move |e: CommandEvent| {
        if let CommandEvent::Started(started) = e {
            if started.command_name == "update" {
                sink.lock().unwrap().push(started.command);
            }
        }
    }));
    let client = mongodb::Client::with_options(options).unwrap();
    let coll_name = unique("jobs");
    let coll = client
        .database(t.db.name())
        .collection::<Document>(&coll_name);
    let plain = t.db.collection::<Document>(&coll_name);
    plain.insert_one(doc! { "_id": 7, "n": 7 }).await.unwrap();
    let locks = docs_with(&coll, |b| b.expiry(Duration::from_secs(60)))
        .build()
        .unwrap();
    let observer = docs_with(&plain, |b| b).build().unwrap();

    lose_replies(&t, &app, &["findAndModify"]).await;
    let err = locks
        .try_claim(doc! { "n": 7 }, None)
        .await
        .map(|d| d.map(|d| d.guard.fencing_token()))
        .unwrap_err();
    t.fail_point_off().await;
    assert!(err.is_transient(), "{err}");
    let freed = mongolock::testing::eventually(Duration::from_secs(20), || async {
        !observer.inspect(7).await.unwrap().unwrap().held
    })
    .await;
    assert!(
        freed,
        "document 7 still locked by the abandoned claim: {:?}",
        observer.inspect(7).await
    );
    let sent = updates.lock().unwrap().clone();
    let releases: Vec<&Document> = sent
        .iter()
        .flat_map(|c| c.get_array("updates").into_iter().flatten())
        .filter_map(Bson::as_document)
        .filter(|u| {
            u.get_document("q")
                .is_ok_and(|q| q.keys().any(|k| k.ends_with(".leaseId")))
        })
        .collect();
    assert!(!releases.is_empty(), "no release was sent: {sent:?}");
    for u in releases {
        let q = u.get_document("q").unwrap();
        assert!(
            !q.contains_key("_id"),
            "the claim's release names a document: {u}"
        );
        assert_eq!(
            u.get_bool("multi"),
            Ok(true),
            "the claim's release must be a multi-update (mongos before 7.1 refuses a \
             single-document update without _id or the shard key): {u}"
        );
    }
}

/// Document locks share the acquire loop and the release scheme: a lost grant reply on a lock
/// by id or on a claim leaves nothing locked, and a release retried after a lost reply succeeds.
#[tokio::test]
async fn document_locks_at_the_edges() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("doc-edges");
    let coll_name = unique("jobs");
    let coll = t.database_as(&app).await.collection::<Document>(&coll_name);
    let plain = t.db.collection::<Document>(&coll_name);
    plain
        .insert_many(vec![doc! { "_id": 1, "n": 1 }, doc! { "_id": 2, "n": 2 }])
        .await
        .unwrap();
    let locks = docs_with(&coll, |b| b.expiry(Duration::from_secs(60)))
        .build()
        .unwrap();
    let observer = docs_with(&plain, |b| b).build().unwrap();
    let is_locked = |id: i32| {
        let observer = observer.clone();
        async move { observer.inspect(id).await.unwrap().unwrap().held }
    };

    // A lock by id whose grant reply is lost.
    lose_replies(&t, &app, &["findAndModify"]).await;
    let err = locks.try_lock(1).await.unwrap_err();
    t.fail_point_off().await;
    assert!(err.is_transient(), "{err}");
    assert!(
        mongolock::testing::eventually(Duration::from_secs(20), || async { !is_locked(1).await })
            .await,
        "document 1 still locked by an abandoned attempt: {:?}",
        observer.inspect(1).await
    );

    // A claim whose grant reply is lost.
    lose_replies(&t, &app, &["findAndModify"]).await;
    let err = locks
        .try_claim(doc! { "n": 2 }, None)
        .await
        .map(|d| d.map(|d| d.guard.fencing_token()))
        .unwrap_err();
    t.fail_point_off().await;
    assert!(err.is_transient(), "{err}");
    assert!(
        mongolock::testing::eventually(Duration::from_secs(20), || async { !is_locked(2).await })
            .await,
        "document 2 still locked by an abandoned claim: {:?}",
        observer.inspect(2).await
    );

    // A release whose reply is lost, retried.
    let locked = locks.lock(1).await.unwrap();
    lose_replies(&t, &app, &["update"]).await;
    let result = locked.guard.release().await;
    t.fail_point_off().await;
    result.unwrap_or_else(|e| panic!("retried release of document 1: {e}"));
    assert!(!is_locked(1).await);
}

/// A write conflict (112) is transient: acquire, extend and release retry it instead of failing.
/// (Found by the torture run, which injects it.)
#[tokio::test]
async fn write_conflicts_are_retried() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("conflicts");
    let provider = provider_on(
        &t.database_as(&app).await,
        &unique("locks"),
        Duration::from_secs(60),
    );
    let conflict = |commands: &[&str]| {
        doc! {
            "failCommands": commands.to_vec(),
            "appName": app.as_str(),
            "errorCode": 112,
            "errmsg": "injected: WriteConflict",
        }
    };
    let name = unique("conflicted");
    t.fail_point(
        Bson::Document(doc! { "times": 2 }),
        conflict(&["findAndModify"]),
    )
    .await;
    let guard = provider
        .lock(name.clone())
        .unwrap()
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("acquire of {name} failed on a write conflict: {e}"))
        .expect("the lock was free");
    t.fail_point(
        Bson::Document(doc! { "times": 2 }),
        conflict(&["findAndModify"]),
    )
    .await;
    let released = guard.release().await;
    t.fail_point_off().await;
    released.unwrap_or_else(|e| panic!("release of {name} failed on a write conflict: {e}"));
}

/// A release whose reply was lost (the write applied; the driver's retry, 3 s later, lost too)
/// is retried by the core; meanwhile the lock is handed around more than 8 times, as on a hot
/// lock. The retry must find its lease id among the released ones and report success: nothing
/// overlapped, so `LeaseLost` would be false.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_retried_after_many_other_releases_is_not_a_loss() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let coll = unique("locks");
    let app = unique("lost-release");
    let owner = LockProvider::builder(
        MongoBackend::builder(&t.database_as(&app).await)
            .collection(coll.as_str())
            .build()
            .unwrap(),
    )
    .expiry(Duration::from_secs(60))
    .auto_extend(false)
    .release_timeout(Duration::from_secs(60))
    .build()
    .unwrap();
    let others = provider_on(&t.db, &coll, Duration::from_secs(60));
    let name = unique("hot");
    let guard = owner.lock(name.as_str()).unwrap().acquire().await.unwrap();
    let token = guard.fencing_token();
    lose_slow_replies(&t, &app, &["findAndModify"], 3000).await;
    let releasing = tokio::spawn(async move { guard.release().await });
    // The first try is applied (3 s late); during the driver's retry, others take turns.
    let free = mongolock::testing::eventually(Duration::from_secs(30), || async {
        !others.inspect(&name).await.unwrap().unwrap().held
    })
    .await;
    assert!(free, "the first try of the release was not applied");
    let mut turns = Vec::new();
    for _ in 0..12 {
        let g = others.lock(name.as_str()).unwrap().acquire().await.unwrap();
        turns.push(g.fencing_token());
        g.release().await.unwrap();
    }
    let result = releasing.await.unwrap();
    t.fail_point_off().await;
    eprintln!(
        "released token {token}; then {} turns: {turns:?}",
        turns.len()
    );
    result.unwrap_or_else(|e| {
        panic!("the retried release of token {token} after {turns:?} reported: {e}")
    });
}

/// The same for a document locked by `_id`, where every grant rewrites the lock sub-document:
/// the released ids must survive the next holders' grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_document_release_retried_after_other_grants_is_not_a_loss() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("doc-lost-release");
    let coll_name = unique("jobs");
    let plain = t.db.collection::<Document>(&coll_name);
    plain.insert_one(doc! { "_id": 1, "n": 1 }).await.unwrap();
    let owner = docs_with(
        &t.database_as(&app).await.collection::<Document>(&coll_name),
        |b| b.expiry(Duration::from_secs(60)).auto_extend(false),
    )
    .build()
    .unwrap();
    let others = docs_with(&plain, |b| b.expiry(Duration::from_secs(60)))
        .build()
        .unwrap();
    let locked = owner.lock(1).await.unwrap();
    let token = locked.guard.fencing_token();
    // Each try 1.5 s late: the core's own retry still comes within the 5 s release timeout.
    lose_slow_replies(&t, &app, &["update"], 1500).await;
    let releasing = tokio::spawn(async move { locked.guard.release().await });
    let free = mongolock::testing::eventually(Duration::from_secs(30), || async {
        !others.inspect(1).await.unwrap().unwrap().held
    })
    .await;
    assert!(free, "the first try of the release was not applied");
    let mut turns = Vec::new();
    for _ in 0..12 {
        let l = others.lock(1).await.unwrap();
        turns.push(l.guard.fencing_token());
        l.guard.release().await.unwrap();
    }
    let result = releasing.await.unwrap();
    t.fail_point_off().await;
    eprintln!(
        "released token {token}; then {} turns: {turns:?}",
        turns.len()
    );
    result.unwrap_or_else(|e| {
        panic!("the retried release of document 1 (token {token}) after {turns:?} reported: {e}")
    });
}

/// The BSON size of the stored document `id` of `coll`, and the document.
async fn stored(coll: &mongodb::Collection<Document>, id: impl Into<Bson>) -> (usize, Document) {
    let d = coll
        .find_one(doc! { "_id": id.into() })
        .await
        .unwrap()
        .expect("the document exists");
    let mut bytes = Vec::new();
    d.to_writer(&mut bytes).unwrap();
    (bytes.len(), d)
}

/// A document deleted and inserted again while locked starts its tokens again at 1: the old
/// holder's release must not take the new lifetime's record for its own and report success.
#[tokio::test]
async fn a_document_reinserted_under_a_lock_is_a_loss_for_its_holder() {
    let t = test_database().await;
    let jobs = t.db.collection::<Document>(&unique("jobs"));
    jobs.insert_one(doc! { "_id": 1, "n": 1 }).await.unwrap();
    let docs = docs_with(&jobs, |b| b.expiry(Duration::from_secs(60)))
        .build()
        .unwrap();
    let old = docs.lock(1).await.unwrap();
    let old_token = old.guard.fencing_token();
    jobs.delete_one(doc! { "_id": 1 }).await.unwrap();
    jobs.insert_one(doc! { "_id": 1, "n": 2 }).await.unwrap();
    // Later than the old grant by the server's clock (millisecond dates).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let new = docs.lock(1).await.unwrap();
    let new_token = new.guard.fencing_token();
    new.guard.release().await.unwrap();
    match old.guard.release().await {
        Err(Error::LeaseLost { .. }) => {}
        other => {
            let (_, d) = stored(&jobs, 1).await;
            panic!(
                "release of token {old_token} after the document was re-inserted and locked \
                 (token {new_token}): {other:?}; {d:?}"
            )
        }
    }
}

/// A busy name's document does not grow with its traffic: what tells a retried release from a
/// lost lease is kept by fencing token, not by a list of released lease ids (which made every
/// grant and release of a busy name rewrite and log about 18 KB). Named lock, one-slot
/// semaphore, document lock.
#[tokio::test]
async fn a_busy_lock_document_does_not_grow_with_its_releases() {
    let t = test_database().await;
    let coll = unique("locks");
    let provider = provider_on(&t.db, &coll, Duration::from_secs(60));
    let locks = t.db.collection::<Document>(&coll);
    let (lock_name, sem_name) = (unique("busy"), unique("busy-sem"));
    let lock = provider.lock(lock_name.as_str()).unwrap();
    let sem = provider.semaphore(sem_name.as_str(), 1).unwrap();
    let jobs = t.db.collection::<Document>(&unique("jobs"));
    jobs.insert_one(doc! { "_id": 1, "n": 1 }).await.unwrap();
    let docs = docs_with(&jobs, |b| b.expiry(Duration::from_secs(60)))
        .build()
        .unwrap();
    let mut sizes = Vec::new();
    for round in 0..300 {
        lock.acquire().await.unwrap().release().await.unwrap();
        sem.acquire().await.unwrap().release().await.unwrap();
        docs.lock(1).await.unwrap().guard.release().await.unwrap();
        if round == 9 || round == 299 {
            sizes.push((
                stored(&locks, lock_name.as_str()).await,
                stored(&locks, sem_name.as_str()).await,
                stored(&jobs, 1).await,
            ));
        }
    }
    for (what, after_10, after_300) in [
        ("named lock", &sizes[0].0, &sizes[1].0),
        ("semaphore", &sizes[0].1, &sizes[1].1),
        ("document lock", &sizes[0].2, &sizes[1].2),
    ] {
        assert!(
            after_300.0 <= after_10.0 + 16,
            "the {what}'s document grew from {} bytes after 10 releases to {} after 300: {:?}",
            after_10.0,
            after_300.0,
            after_300.1
        );
    }
}

/// More leases ended by others than the record keeps (64): the oldest leave it and the floor
/// rises above them, so a release of one of them still reports the loss; a lease released by
/// its holder after that is still told apart from a lost one.
#[tokio::test]
async fn the_record_of_leases_ended_by_others_is_bounded_and_stays_exact() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let coll = unique("locks");
    let app = unique("bounded");
    let provider = provider_on(&t.database_as(&app).await, &coll, Duration::from_secs(60));
    let locks = t.db.collection::<Document>(&coll);
    let name = unique("forced");
    let lock = provider.lock(name.as_str()).unwrap();
    let first = lock.acquire().await.unwrap();
    let first_token = first.fencing_token();
    assert!(provider.force_release(&name).await.unwrap());
    for _ in 0..70 {
        let g = lock.acquire().await.unwrap();
        assert!(provider.force_release(&name).await.unwrap());
        let token = g.fencing_token();
        match g.release().await {
            Err(Error::LeaseLost { .. }) => {}
            other => panic!("release of force-released token {token}: {other:?}"),
        }
    }
    let (_, d) = stored(&locks, name.as_str()).await;
    assert_eq!(d.get_array("ended").unwrap().len(), 64, "{d:?}");
    let floor = d.get_i64("endedFrom").unwrap();
    assert!(floor > first_token as i64, "{d:?}");
    match first.release().await {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!(
            "release of force-released token {first_token} below the floor {floor}: {other:?}"
        ),
    }
    // A release whose reply is lost, retried, is still told from a loss.
    let g = lock.acquire().await.unwrap();
    let token = g.fencing_token();
    lose_replies(&t, &app, &["findAndModify"]).await;
    let result = g.release().await;
    t.fail_point_off().await;
    if let Err(e) = result {
        let (_, d) = stored(&locks, name.as_str()).await;
        panic!("the retried release of token {token} after the record filled: {e}; {d:?}");
    }
}

/// Issue #21 item 1, as reproduced: a shortened extension whose reply never reaches the caller
/// (`tokio::time::timeout` gives up while the server is slowed) is applied anyway; the server
/// then frees the name after the *shorter* TTL. The first guard must say lost by then — from
/// its own deadline, lowered when the extension was sent — not trust the lease until the end
/// of the original 3 s.
#[tokio::test]
async fn a_shortened_extension_given_up_while_the_server_is_slow_ends_the_lease() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("shortened");
    let coll = unique("locks");
    let backend = MongoBackend::builder(&t.database_as(&app).await)
        .collection(coll.as_str())
        .build()
        .unwrap();
    let first = LockProvider::builder(backend)
        .expiry(Duration::from_secs(3))
        .auto_extend(false)
        .build()
        .unwrap();
    let second = provider_on(&t.db, &coll, Duration::from_secs(3));
    let name = unique("shortened");
    let guard = first.lock(name.clone()).unwrap().acquire().await.unwrap();
    let token = guard.fencing_token();
    let pending_lost = tokio::spawn(guard.lost().into_future());
    // The next findAndModify of the first client waits 1 s at the server, then runs.
    t.fail_point(
        Bson::Document(doc! { "times": 1 }),
        doc! {
            "failCommands": ["findAndModify"],
            "appName": app.as_str(),
            "blockConnection": true,
            "blockTimeMS": 1000,
        },
    )
    .await;
    let short = Duration::from_secs(1);
    let called = Instant::now();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), guard.extend(short)).await;
    assert!(
        gave_up.is_err(),
        "extend({short:?}) returned {gave_up:?} through a 1 s block"
    );
    // The server applies it at about 1 s: the name is free at about 2 s, before the 3 s lease
    // ends. Polled (a waiter would sleep until the expiry it was told, the 3 s one).
    let lock = second.lock(name.clone()).unwrap();
    let next: Mutex<Option<LockGuard>> = Mutex::new(None);
    let taken = mongolock::testing::eventually(Duration::from_secs(20), || async {
        let got = lock.try_acquire().await.unwrap();
        let taken = got.is_some();
        *next.lock().unwrap() = got;
        taken
    })
    .await;
    let taken_after = called.elapsed();
    assert!(taken, "{name} not free within 20 s");
    let next = next.into_inner().unwrap().expect("taken");
    t.fail_point_off().await;
    assert!(
        guard.is_lost(),
        "{name}: the second client took the name (token {}) {taken_after:?} after the first \
         (token {token}) sent an extension to {short:?}, yet the first guard says held",
        next.fencing_token()
    );
    let reason = guard.lost_reason().expect("a loss reason");
    assert!(
        matches!(
            reason,
            mongolock::LossReason::DeadlinePassed | mongolock::LossReason::ExtensionTooLate
        ),
        "{name}: the first guard learned of the loss other than by its own deadline: {reason:?} \
         (taken over {taken_after:?} after the call)"
    );
    tokio::time::timeout(Duration::from_secs(10), pending_lost)
        .await
        .unwrap_or_else(|_| panic!("{name}: the pending lost signal did not fire"))
        .unwrap();
    eprintln!(
        "{name}: taken over {taken_after:?} after the shortened extension; first guard: {reason}"
    );
    next.release().await.unwrap();
}
