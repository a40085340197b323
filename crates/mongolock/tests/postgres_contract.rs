//! The contract suite against a real PostgreSQL (started by the tests, or `POSTGRES_URL`).

mod contract;
mod pg;
mod poll;

use std::sync::Arc;

use contract::Env;
use mongolock::PostgresBackend;

async fn setup() -> Option<Env> {
    let url = pg::url()?;
    let backend = PostgresBackend::builder(&url)
        .table(pg::unique_table("contract"))
        .build()
        .expect("valid options");
    Some(Env {
        backend: Arc::new(backend),
        keep_alive: Box::new(()),
    })
}

contract_suite!(setup);
