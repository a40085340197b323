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
use mongolock::{LockProvider, MongoBackend};

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
