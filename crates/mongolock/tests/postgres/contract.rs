//! The contract suite against a real PostgreSQL (started by the tests, or `POSTGRES_URL`).

use std::sync::Arc;

use mongolock::testing::Env;
use mongolock::{LockBackend, PostgresBackend};

use crate::support::postgres;

async fn setup() -> Option<Env> {
    let url = postgres::url()?;
    let table = postgres::unique_table("contract");
    let backend = PostgresBackend::builder(&url)
        .table(&table)
        .build()
        .expect("valid options");
    // The cases read a store that exists: reads never create the table (they fail with
    // `MissingLockTable` before its first use; `tables.rs`).
    backend.migrate().await.expect("create the lock table");
    let env = Env::new(Arc::new(backend))
        .with_notifications()
        // A backend per candidate in the election cases, created in the runtime that will use
        // it (its pool and listening connection belong to that runtime).
        .with_backend_factory(move || {
            let (url, table) = (url.clone(), table.clone());
            async move {
                let backend = PostgresBackend::builder(&url)
                    .table(&table)
                    .build()
                    .expect("valid options");
                Arc::new(backend) as Arc<dyn LockBackend>
            }
        });
    Some(env)
}

mongolock::contract_suite!(setup);
