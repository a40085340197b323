//! Classifies client and server errors as transient ([`Error::Unavailable`], retried by the
//! core) or permanent ([`Error::Backend`], returned with a hint saying what to change).

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::error::Error;

/// SQLSTATE classes and codes that mean "try again later".
///
/// * class `08`: connection exceptions;
/// * `57P01` admin shutdown, `57P02` crash shutdown, `57P03` cannot connect now (starting up
///   or in recovery), `57014` query cancelled (statement timeout);
/// * class `53`: insufficient resources (too many connections, out of memory, disk full);
/// * `40001` serialization failure, `40P01` deadlock, `55P03` lock not available (lock
///   timeout);
/// * `25006` read-only transaction (a standby that is being promoted, a failover in progress).
fn is_transient_state(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "57014" | "40001" | "40P01" | "55P03" | "25006"
        )
}

/// What to change for a permanent server error, by SQLSTATE.
fn hint_for(code: &str) -> &'static str {
    match code {
        "42501" => {
            "the database user lacks a privilege; grant it USAGE (and CREATE, for the first \
             use) on the lock schema and SELECT, INSERT, UPDATE, DELETE on the lock table and \
             USAGE on its sequence, or create them once with PostgresBackend::migrate as an owner"
        }
        c if c.starts_with("28") => {
            "authentication failed; check the user and password in the connection string"
        }
        "3D000" => "the database does not exist; create it or fix the database in the URL",
        "42P01" | "3F000" => {
            "the lock table or schema is missing; it is created on first use, or by \
             PostgresBackend::migrate"
        }
        c if c.starts_with("42") => {
            "the lock table does not have the layout mongolock expects; use a dedicated table \
             that mongolock created, and PostgreSQL 11 or newer"
        }
        "22021" => "a value contained a NUL character, which PostgreSQL text cannot store",
        _ => "see the server's message; retrying will not help until it is fixed",
    }
}

/// One line: `SQLSTATE 42501: permission denied for table locks`.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => one_line(&e.to_string()),
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether the table or schema is missing (dropped after it was created): the next operation
/// creates it again.
pub(crate) fn is_missing_table(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::UNDEFINED_TABLE || *c == SqlState::INVALID_SCHEMA_NAME)
}

/// Maps a client error from operation `op` (for the message).
pub(crate) fn map(op: &str, e: tokio_postgres::Error) -> Error {
    let message = format!("{op}: {}", describe(&e));
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code().to_owned();
            if is_transient_state(&code) || is_missing_table(&e) {
                // A missing table is created again by the next attempt (see `schema.rs`).
                Error::Unavailable {
                    message,
                    source: Some(Box::new(e)),
                }
            } else {
                Error::Backend {
                    message,
                    code: None,
                    hint: hint_for(&code).to_owned(),
                    source: Some(Box::new(e)),
                }
            }
        }
        // No server error: the connection broke, timed out or could not be opened.
        None => Error::Unavailable {
            message,
            source: Some(Box::new(e)),
        },
    }
}

/// Maps a pool error: timeouts and connection failures are transient; a refused login or a
/// missing database is not.
pub(crate) fn map_pool(op: &str, e: PoolError) -> Error {
    match e {
        PoolError::Backend(e) => map(op, e),
        PoolError::Timeout(kind) => Error::Unavailable {
            message: format!(
                "{op}: timed out waiting for a PostgreSQL connection ({kind:?}); the server is \
                 unreachable or every pooled connection is busy"
            ),
            source: None,
        },
        PoolError::Closed => Error::backend(
            format!("{op}: the connection pool was closed"),
            "create a new PostgresBackend",
        ),
        other => Error::Unavailable {
            message: format!("{op}: {}", one_line(&other.to_string())),
            source: Some(Box::new(other)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_classified() {
        assert!(is_transient_state("08006"));
        assert!(is_transient_state("57P01"));
        assert!(is_transient_state("53300"));
        assert!(is_transient_state("40001"));
        assert!(!is_transient_state("42501"));
        assert!(!is_transient_state("28P01"));
        assert!(hint_for("28P01").contains("password"));
        assert!(hint_for("42501").contains("grant"));
    }
}
