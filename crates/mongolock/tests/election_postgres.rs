//! Leader-election scenarios against a real PostgreSQL (started by the tests, or
//! `POSTGRES_URL`).

mod election_scenarios;
mod pg;
mod poll;

use std::sync::Arc;

use election_scenarios::{provider_over, Env, MakeProvider};
use mongolock::PostgresBackend;

async fn setup() -> Option<Env> {
    let url = pg::url()?;
    let table = pg::unique_table("election");
    let make_provider: MakeProvider = Arc::new(move || {
        let (url, table) = (url.clone(), table.clone());
        // A backend per provider, created in the runtime that will use it (its pool and
        // listening connection belong to that runtime).
        Box::pin(async move {
            let backend = PostgresBackend::builder(&url)
                .table(&table)
                .build()
                .expect("valid backend options");
            provider_over(Arc::new(backend))
        })
    });
    Some(Env {
        make_provider,
        // The pool and the listening connection run tasks of their own.
        count_tasks: false,
        keep_alive: Box::new(()),
    })
}

election_suite!(setup);
