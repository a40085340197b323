//! A real PostgreSQL server for tests: [`mongolock::testing::postgres_server`] (shared with the
//! torture harness), plus what the tests add: [`url`], which skips or panics, and table names.
#![allow(dead_code, unused_imports)]

pub use mongolock::testing::postgres_server::{bin_dir, PgServer};
use mongolock::testing::postgres_server::{shared_url, NO_BINARIES};

/// `POSTGRES_URL` when set, else the URL of this process's test server (started on first
/// call). `None` (after printing why) only when no PostgreSQL binaries exist: the caller skips.
/// Panics when binaries exist but the server cannot be started (that is a failure, not a skip).
pub fn url() -> Option<String> {
    match shared_url() {
        Ok(Some(url)) => Some(url),
        Ok(None) => {
            eprintln!("skipped: {NO_BINARIES}");
            None
        }
        Err(e) => panic!("start PostgreSQL: {e}"),
    }
}

/// A fresh table name for one test.
pub fn unique_table(prefix: &str) -> String {
    format!("{prefix}_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// An administrative connection (for `pg_terminate_backend`, direct reads and DDL).
pub async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(conn);
    client
}
