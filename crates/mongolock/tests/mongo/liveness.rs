//! A free name reaches a live waiter fast on MongoDB, whatever stands ahead of it in the
//! handoff queue: the shared scenario `support/liveness.rs`, with 2, 5 and 20 waiters that
//! timed out, dropped their futures, or died while queued; also as MongoDB 4.4 (replace
//! events). A live waiter behind two dead processes waited 60 s (the wait cap) before the
//! probe (`mongo/probe.rs`).
//!
//! Runs against the embedded mongo-testserver, or against `MONGODB_URI` when set (the MongoDB
//! 4.4 variant needs the embedded server).

use crate::support::liveness::{live_waiter_behind, Ahead, Site, HOLDER_TTL};
use crate::support::mongo;

use mongo::{test_database, test_database_with, unique, TestDb};
use mongo_testserver::TestServer;
use mongodb::bson::{doc, DateTime, Document};
use mongolock::{
    AcquireRequest, Attempt, HolderInfo, LeaseMode, LockBackend, LockProvider, MongoBackend,
};

/// A collection of a test database.
struct Mongo {
    t: TestDb,
    coll: String,
}

impl Mongo {
    fn new(t: TestDb) -> Mongo {
        Mongo {
            t,
            coll: unique("locks"),
        }
    }
}

impl Site for Mongo {
    /// With a client of its own, as in a process of its own (a shared client's pool would be
    /// held by the other providers' change streams).
    async fn provider(&self) -> LockProvider {
        let client = mongo::client(&self.t.uri, None).await;
        LockProvider::builder(
            MongoBackend::builder(&client.database(self.t.db.name()))
                .collection(self.coll.clone())
                .build()
                .unwrap(),
        )
        .expiry(HOLDER_TTL)
        .build()
        .unwrap()
    }

    async fn queued(&self, name: &str) -> Vec<String> {
        let d = self
            .t
            .db
            .collection::<Document>(&self.coll)
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

    async fn plant_dead(&self, name: &str, marks: &[String]) {
        let hour = DateTime::from_millis(DateTime::now().timestamp_millis() + 3_600_000);
        let entries: Vec<Document> = marks
            .iter()
            .map(|m| doc! { "m": m, "until": hour })
            .collect();
        self.t
            .db
            .collection::<Document>(&self.coll)
            .update_one(
                doc! { "_id": name },
                doc! { "$set": { "waiters": entries } },
            )
            .await
            .unwrap();
    }

    fn describe(&self) -> String {
        format!("collection {}", self.coll)
    }
}

async fn run(ahead: Ahead, count: usize) {
    let site = Mongo::new(test_database().await);
    live_waiter_behind(&site, &unique("liveness"), ahead, count).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_timed_out_waiters_ahead_do_not_stall_a_live_one() {
    run(Ahead::TimedOut, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_dropped_waiters_ahead_do_not_stall_a_live_one() {
    run(Ahead::Dropped, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_timed_out_waiters_ahead_do_not_stall_a_live_one() {
    run(Ahead::TimedOut, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_dead_processes_ahead_do_not_stall_a_live_waiter() {
    run(Ahead::Dead, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_dead_processes_ahead_do_not_stall_a_live_waiter() {
    run(Ahead::Dead, 20).await;
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
    live_waiter_behind(&Mongo::new(t), &unique("liveness"), Ahead::Dead, 5).await;
    let site = Mongo::new(test_database_with(builder()).await);
    live_waiter_behind(&site, &unique("liveness"), Ahead::TimedOut, 5).await;
}

/// An attempt whose outcome is unknown — the connection closed on it and on the driver's own
/// retry — may still be applied by the server later (a write is not cancelled when its client
/// goes away), after the call's next attempt was granted and that lease released. Applied
/// then (the same command, so the same lease id: replayed here), it must not grant the name
/// again: nobody holds that lease's guard, so the name would stay held until the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_never_grants_a_released_lease_id_again() {
    late_attempt(LeaseMode::Exclusive).await;
}

/// The same for a semaphore slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_slot_attempt_never_grants_a_released_slot_again() {
    late_attempt(LeaseMode::Slot { limit: 2 }).await;
}

async fn late_attempt(mode: LeaseMode) {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("late");
    let coll = unique("locks");
    let backend = MongoBackend::builder(&t.database_as(&app).await)
        .collection(coll.clone())
        .build()
        .unwrap();
    let name = unique("late");
    let req = AcquireRequest {
        name: name.clone(),
        lease_id: backend.new_lease_id(),
        ttl: HOLDER_TTL,
        holder: HolderInfo::current(Some("late".into())),
        mode,
    };
    // The document exists (a late attempt applies to the document its call's retry used).
    let other = AcquireRequest {
        lease_id: backend.new_lease_id(),
        ..req.clone()
    };
    assert!(matches!(
        backend.try_acquire(&other).await.unwrap(),
        Attempt::Acquired(_)
    ));
    assert!(backend.release(&name, &other.lease_id).await.unwrap());

    t.fail_point(
        doc! { "times": 2 }.into(),
        doc! { "failCommands": ["findAndModify"], "closeConnection": true, "appName": app.as_str() },
    )
    .await;
    let first = backend.try_acquire(&req).await;
    t.fail_point_off().await;
    assert!(
        first.is_err(),
        "the first attempt's outcome is unknown: {first:?}"
    );
    let Attempt::Acquired(lease) = backend.try_acquire(&req).await.unwrap() else {
        panic!("the retry of lease {} was not granted", req.lease_id);
    };
    assert!(backend.release(&name, &req.lease_id).await.unwrap());

    // The first attempt arrives now, twice (the uncontended shortcut first, then the full
    // attempt: the backend's last release left the name free and unqueued).
    for late in 0..2 {
        let again = backend.try_acquire(&req).await.unwrap();
        let info = backend.inspect(&name).await.unwrap();
        assert!(
            matches!(again, Attempt::Busy { .. }),
            "late attempt {late} of lease {} (token {} released) was granted again: {again:?}; the lock: {info:?}",
            req.lease_id,
            lease.fencing_token
        );
        assert!(!info.is_some_and(|i| i.held), "nobody holds {name}");
    }
    // Anybody else gets the name at once.
    let fresh = AcquireRequest {
        lease_id: backend.new_lease_id(),
        ..req.clone()
    };
    let Attempt::Acquired(next) = backend.try_acquire(&fresh).await.unwrap() else {
        panic!("the free name was not granted to a new lease");
    };
    assert!(next.fencing_token > lease.fencing_token);
}
