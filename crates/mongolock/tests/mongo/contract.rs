//! The contract suite against MongoDB (embedded mongo-testserver, or `MONGODB_URI`).

mod common;

use mongolock::testing::Env;

async fn setup() -> Env {
    let db = common::test_database().await;
    // Change streams need a replica set: the embedded server has them; a real deployment given
    // by MONGODB_URI may be a standalone server, which falls back to polling.
    let notifications = db.server.is_some();
    let env = Env::new(common::shared(db.backend())).keep_alive(db);
    if notifications {
        env.with_notifications()
    } else {
        env
    }
}

mongolock::contract_suite!(setup);
