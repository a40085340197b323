//! The contract suite against a real PostgreSQL (started by the tests, or `POSTGRES_URL`).

mod pg;

use std::sync::Arc;

use mongolock::testing::Env;
use mongolock::PostgresBackend;

async fn setup() -> Option<Env> {
    let url = pg::url()?;
    let backend = PostgresBackend::builder(&url)
        .table(pg::unique_table("contract"))
        .build()
        .expect("valid options");
    Some(Env::new(Arc::new(backend)).with_notifications())
}

mongolock::contract_suite!(setup);
