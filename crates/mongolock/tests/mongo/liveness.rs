//! A free name reaches a live waiter fast, whatever stands ahead of it in the handoff queue:
//! waiters of other processes that gave up (timed out, dropped their acquire future), and
//! processes that died or were stopped while queued. The holder's lease is two minutes long;
//! without withdrawal and the probe (`mongo/probe.rs`), the live waiter behind two such entries
//! heard nothing of the release and waited until that lease's reported expiry.
//!
//! Runs against the embedded mongo-testserver, or against `MONGODB_URI` when set (the MongoDB
//! 4.4 variant needs the embedded server).

use crate::support::mongo;

use std::time::Duration;

use mongo::{test_database, test_database_with, unique, TestDb};
use mongo_testserver::TestServer;
use mongodb::bson::{doc, DateTime, Document};
use mongolock::testing::eventually;
use mongolock::{LockBackend, LockProvider, MongoBackend};

use tokio::time::Instant;

/// The holder's lease: far beyond what any of these waits may take.
const HOLDER_TTL: Duration = Duration::from_secs(120);

/// How long after the release the live waiter may take the name at most: the probe period
/// (about a second) and the handoff fallback, with room for a loaded machine. Far below
/// [`HOLDER_TTL`], which is what it waited before.
const BOUND: Duration = Duration::from_secs(15);

/// What stands ahead of the live waiter in the queue.
#[derive(Clone, Copy, Debug)]
enum Ahead {
    /// Waiters of other processes whose `acquire_timeout` ran out.
    TimedOut,
    /// Waiters of other processes whose acquire futures were dropped.
    Dropped,
    /// Processes that died (or are stopped) while queued: entries nobody withdraws, written
    /// as a process would have left them.
    Dead,
}

fn mark_of(backend: &dyn LockBackend) -> String {
    let id = backend.new_lease_id();
    let id = id.as_str();
    id[..=id.find('-').expect("a marked lease id")].to_owned()
}

/// A provider with a client of its own, as in a process of its own (a shared client's pool
/// would be held by the other providers' change streams).
async fn provider(t: &TestDb, coll: &str) -> LockProvider {
    let client = mongo::client(&t.uri, None).await;
    LockProvider::builder(
        MongoBackend::builder(&client.database(t.db.name()))
            .collection(coll.to_owned())
            .build()
            .unwrap(),
    )
    .expiry(HOLDER_TTL)
    .build()
    .unwrap()
}

/// The marks queued for `name`, in order, as stored.
async fn queued(t: &TestDb, coll: &str, name: &str) -> Vec<String> {
    let d =
        t.db.collection::<Document>(coll)
            .find_one(doc! { "_id": name })
            .await
            .unwrap()
            .unwrap_or_default();
    d.get_array("waiters")
        .map(|w| {
            w.iter()
                .filter_map(|e| e.as_document()?.get_str("m").ok().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn live_waiter_behind(t: TestDb, ahead: Ahead, count: usize) {
    let coll = unique("locks");
    let name = unique("liveness");
    let holder = provider(&t, &coll).await;
    let guard = holder.lock(name.as_str()).unwrap().acquire().await.unwrap();
    let state = |what: &str| format!("{what} ({ahead:?} x{count}, lock {name} in {coll})");

    // Those ahead queue first.
    let mut others = Vec::new();
    for _ in 0..count {
        others.push(provider(&t, &coll).await);
    }
    let other_marks: Vec<String> = others.iter().map(|p| mark_of(&**p.backend())).collect();
    let mut tasks = Vec::new();
    match ahead {
        Ahead::Dead => {
            let far = DateTime::from_millis(DateTime::now().timestamp_millis() + 3_600_000);
            let entries: Vec<Document> = other_marks
                .iter()
                .map(|m| doc! { "m": m, "until": far })
                .collect();
            t.db.collection::<Document>(&coll)
                .update_one(
                    doc! { "_id": name.as_str() },
                    doc! { "$set": { "waiters": entries } },
                )
                .await
                .unwrap();
        }
        Ahead::TimedOut | Ahead::Dropped => {
            for p in &others {
                let lock = p.lock(name.as_str()).unwrap();
                tasks.push(tokio::spawn(async move {
                    match ahead {
                        Ahead::TimedOut => lock.acquire_timeout(Duration::from_secs(20)).await,
                        _ => lock.acquire().await.map(Some),
                    }
                    .map(|g| g.is_some())
                }));
            }
        }
    }
    let all_queued = eventually(Duration::from_secs(18), || async {
        let q = queued(&t, &coll, &name).await;
        other_marks.iter().all(|m| q.contains(m))
    })
    .await;
    assert!(
        all_queued,
        "{}: queue {:?}, expected {other_marks:?}",
        state("those ahead did not all queue"),
        queued(&t, &coll, &name).await
    );

    // The live waiter queues behind them.
    let waiter = provider(&t, &coll).await;
    let waiter_mark = mark_of(&**waiter.backend());
    let lock = waiter.lock(name.as_str()).unwrap();
    let waiting = tokio::spawn(async move {
        let got = lock
            .acquire_timeout(Duration::from_secs(100))
            .await
            .unwrap();
        (Instant::now(), got.map(|g| g.fencing_token()))
    });
    let behind = eventually(Duration::from_secs(20), || async {
        queued(&t, &coll, &name).await.contains(&waiter_mark)
    })
    .await;
    assert!(
        behind,
        "{}: queue {:?}",
        state("the live waiter did not queue"),
        queued(&t, &coll, &name).await
    );

    // Those ahead give up.
    match ahead {
        Ahead::Dead => {}
        Ahead::TimedOut => {
            for task in tasks {
                // Gave up: `None`, or the error of a last attempt still unanswered at the
                // deadline on a loaded machine; never the lock.
                match task.await.unwrap() {
                    Ok(got) => assert!(!got, "{}", state("a waiter ahead got the lock")),
                    Err(e) => eprintln!("a waiter ahead gave up with an error: {e}"),
                }
            }
        }
        Ahead::Dropped => {
            for task in &tasks {
                task.abort();
            }
        }
    }
    if !matches!(ahead, Ahead::Dead) {
        // They withdraw in the background; operators no longer see them waiting.
        let withdrawn = eventually(Duration::from_secs(20), || async {
            let q = queued(&t, &coll, &name).await;
            !q.iter().any(|m| other_marks.contains(m))
        })
        .await;
        let listed: Vec<String> = waiter
            .backend()
            .waiters(&name)
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.id)
            .collect();
        assert!(
            withdrawn,
            "{}: queue {:?}, gave up: {other_marks:?}",
            state("waiters that gave up are still queued"),
            queued(&t, &coll, &name).await
        );
        assert_eq!(
            listed,
            vec![waiter_mark.clone()],
            "{}",
            state("waiters listed")
        );
    }

    let held_token = guard.fencing_token();
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (got_at, token) = waiting.await.unwrap();
    let waited = got_at.saturating_duration_since(released_at);
    eprintln!(
        "{ahead:?} x{count}: the live waiter took the lock {waited:?} after the release (holder's lease {HOLDER_TTL:?})"
    );
    let token = token.unwrap_or_else(|| panic!("{}", state("the live waiter never got the lock")));
    assert!(
        token > held_token,
        "{}: token {token} after {held_token}",
        state("tokens")
    );
    assert!(
        waited < BOUND,
        "{}: waited {waited:?} after the release",
        state("the live waiter was held up")
    );
    drop(others);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_timed_out_waiters_ahead_do_not_stall_a_live_one() {
    live_waiter_behind(test_database().await, Ahead::TimedOut, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_dropped_waiters_ahead_do_not_stall_a_live_one() {
    live_waiter_behind(test_database().await, Ahead::Dropped, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_timed_out_waiters_ahead_do_not_stall_a_live_one() {
    live_waiter_behind(test_database().await, Ahead::TimedOut, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_dead_processes_ahead_do_not_stall_a_live_waiter() {
    live_waiter_behind(test_database().await, Ahead::Dead, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_dead_processes_ahead_do_not_stall_a_live_waiter() {
    live_waiter_behind(test_database().await, Ahead::Dead, 20).await;
}

/// MongoDB 4.4 reports pipeline updates as replace events (every waiting process receives
/// every release): the same promises hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mongodb_44_dead_and_timed_out_waiters_ahead_do_not_stall_a_live_one() {
    let builder = || TestServer::builder().pipeline_updates_as_replace(true);
    let t = test_database_with(builder()).await;
    if t.server.is_none() {
        eprintln!("skipped: needs the embedded server to behave as MongoDB 4.4");
        return;
    }
    live_waiter_behind(t, Ahead::Dead, 5).await;
    live_waiter_behind(test_database_with(builder()).await, Ahead::TimedOut, 5).await;
}
