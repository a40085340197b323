//! Classifies driver errors as transient (retried by the core) or permanent (returned with a
//! hint).

use mongodb::error::{ErrorKind, WriteFailure};

use crate::error::Error;

/// Server error codes that mean "try again later": host unreachable/not found, network timeout,
/// shutdown in progress, primary stepped down, exceeded time limit, socket exception, not
/// writable primary, interrupted at shutdown / due to a replica-set state change, not primary,
/// and write-concern timeouts.
const TRANSIENT_CODES: &[i32] = &[
    6, 7, 64, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
];

/// Duplicate key: a concurrent upsert created the same document first.
pub(super) const DUPLICATE_KEY: i32 = 11000;

/// The server's error code, if any.
pub(super) fn code(e: &mongodb::error::Error) -> Option<i32> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    }
}

fn hint_for(code: Option<i32>) -> &'static str {
    match code {
        Some(13) => {
            "the user is not authorized; grant it readWrite on the lock database (find, \
             update, insert, aggregate, createIndex on the lock collection)"
        }
        Some(18) => "authentication failed; check the credentials in the connection string",
        Some(73) => "MongoDB refused the namespace; choose another lock collection name",
        Some(100) => {
            "the write concern cannot be satisfied by this deployment; lower `w` in \
             MongoBackend::builder(..).write_concern(..)"
        }
        Some(9) | Some(14) | Some(15) | Some(168) | Some(40324) | Some(31325) => {
            "the server does not understand the update pipeline or $$NOW; mongolock needs \
             MongoDB 4.4 or newer"
        }
        Some(2) | Some(28) | Some(40) | Some(52) => {
            "the lock collection holds documents mongolock did not write; use a dedicated \
             collection for locks"
        }
        _ => "see the server's message; retrying will not help until it is fixed",
    }
}

/// Converts a driver error from operation `op`.
pub(super) fn classify(e: mongodb::error::Error, op: &str) -> Error {
    let code = code(&e);
    let transient_kind = matches!(
        e.kind.as_ref(),
        ErrorKind::Io(_)
            | ErrorKind::ServerSelection { .. }
            | ErrorKind::ConnectionPoolCleared { .. }
    );
    let transient_label = e.contains_label("RetryableWriteError")
        || e.contains_label("TransientTransactionError")
        || e.contains_label("RetryableError");
    let transient_code = code.is_some_and(|c| TRANSIENT_CODES.contains(&c));
    let message = format!("{op}: {e}");
    if transient_kind || transient_label || transient_code {
        return Error::Unavailable {
            message,
            source: Some(Box::new(e)),
        };
    }
    let hint = match e.kind.as_ref() {
        ErrorKind::Authentication { .. } => {
            "authentication failed; check the credentials in the connection string"
        }
        ErrorKind::IncompatibleServer { .. } => "mongolock needs MongoDB 4.4 or newer",
        ErrorKind::BsonDeserialization(_) => {
            "the lock collection holds documents mongolock did not write; use a dedicated \
             collection for locks"
        }
        ErrorKind::Shutdown => "the MongoDB client was shut down; create a new client",
        _ => hint_for(code),
    };
    Error::Backend {
        message,
        code,
        hint: hint.to_owned(),
        source: Some(Box::new(e)),
    }
}
