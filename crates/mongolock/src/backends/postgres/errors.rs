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

/// What a cancelled statement means, for `57014` (statement timeout) and `55P03` (lock
/// timeout).
fn timeout_note(code: &str, message: &str) -> Option<&'static str> {
    match code {
        "55P03" => Some(
            "the statement waited longer than lock_timeout for a lock: another session holds \
             the lock row or table (a transaction left open on it? see pg_stat_activity); \
             retried within the caller's budget",
        ),
        "57014" if message.contains("statement timeout") => Some(
            "the statement ran longer than statement_timeout (PostgresBackendBuilder::\
             statement_timeout); the server is overloaded or a session blocks the lock table; \
             retried within the caller's budget",
        ),
        _ => None,
    }
}

/// Whether `e` or one of its sources says `text`.
fn chain_mentions(e: &(dyn std::error::Error + 'static), text: &str) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.to_string().contains(text) {
            return true;
        }
        next = err.source();
    }
    false
}

/// Maps a client error from operation `op` (for the message).
pub(crate) fn map(op: &str, e: tokio_postgres::Error) -> Error {
    let mut message = format!("{op}: {}", describe(&e));
    if e.as_db_error().is_none() {
        if let Some(tls) = super::tls::tls_failure(&e) {
            return Error::Backend {
                message: format!("{op}: TLS handshake with the server failed: {tls}"),
                code: None,
                hint: "the server's certificate was not accepted: check that sslrootcert is the \
                       CA that signed it and, with sslmode=verify-full, that the host in the \
                       connection string is a name (or IP address) the certificate lists; or \
                       use sslmode=require to encrypt without checking it"
                    .into(),
                source: Some(Box::new(e)),
            };
        }
        if chain_mentions(&e, "server does not support TLS") {
            return Error::Backend {
                message: format!("{message}: the server does not support TLS"),
                code: None,
                hint: "the server does not accept TLS connections (ssl = off); turn ssl on in \
                       postgresql.conf, or use sslmode=prefer or disable"
                    .into(),
                source: Some(Box::new(e)),
            };
        }
    }
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code().to_owned();
            if let Some(note) = timeout_note(&code, db.message()) {
                message = format!("{message}: {note}");
            }
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
