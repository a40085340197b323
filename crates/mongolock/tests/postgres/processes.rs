//! Several OS processes contending for one lock on PostgreSQL, and a holder killed with
//! SIGKILL (the shared harness in `support/contention.rs`, which `mongo/processes.rs` runs on
//! MongoDB).

use crate::support::contention;
use crate::support::postgres;

use std::sync::Arc;

use contention::{env, Setup};
use mongolock::{LockBackend, PostgresBackend};

fn backend(url: &str, table: &str) -> Arc<dyn LockBackend> {
    Arc::new(PostgresBackend::builder(url).table(table).build().unwrap())
}

/// Entry point of the helper processes; a no-op in a normal test run.
#[test]
fn child_entry() {
    contention::child_entry(|| async {
        backend(&env("MONGOLOCK_PG_URL"), &env("MONGOLOCK_TABLE"))
    });
}

/// The shared server (or `POSTGRES_URL`) and a fresh table; `None` skips (reason printed).
fn setup() -> Option<(String, String, Setup)> {
    let url = postgres::url()?;
    let table = postgres::unique_table("locks");
    let setup = Setup {
        env: vec![
            ("MONGOLOCK_PG_URL", url.clone()),
            ("MONGOLOCK_TABLE", table.clone()),
        ],
        label: format!("table {table}"),
    };
    Some((url, table, setup))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_contend_without_overlap() {
    let Some((_, _, setup)) = setup() else { return };
    contention::four_processes_contend_without_overlap(&setup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_replaced_only_after_its_lease_expires() {
    let Some((url, table, setup)) = setup() else {
        return;
    };
    contention::a_killed_holder_is_replaced_only_after_its_lease_expires(
        &setup,
        backend(&url, &table),
    )
    .await;
}
