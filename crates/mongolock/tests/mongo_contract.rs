//! The contract suite against MongoDB (embedded mongo-testserver, or `MONGODB_URI`).

mod common;
mod contract;
mod poll;

use contract::Env;

async fn setup() -> Env {
    let db = common::test_database().await;
    Env {
        backend: common::shared(db.backend()),
        keep_alive: Box::new(db),
    }
}

contract_suite!(setup);
