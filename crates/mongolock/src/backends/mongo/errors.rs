//! Classifies driver errors as transient (retried by the core) or permanent (returned with a
//! hint).

use mongodb::error::{ErrorKind, WriteFailure};

use crate::error::Error;

/// Server error codes that mean "try again later": host unreachable/not found, network timeout,
/// shutdown in progress, primary stepped down, exceeded time limit, socket exception, not
/// writable primary, interrupted at shutdown / due to a replica-set state change, not primary,
/// write-concern timeouts, write conflicts (112: the write was not applied; MongoDB itself
/// retries single-document writes that conflict), and 134 `ReadConcernMajorityNotAvailableYet`
/// (a majority read before the node has a majority-committed snapshot, e.g. just after a
/// restart or an election; in the retryable-reads specification's list, so the driver retries
/// it once too).
const TRANSIENT_CODES: &[i32] = &[
    6, 7, 64, 89, 91, 112, 134, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
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

/// Whether the error may go away by itself: network errors, server selection timeouts, pool
/// clears, the retryable error labels and the transient codes.
pub(super) fn is_transient(e: &mongodb::error::Error) -> bool {
    let transient_kind = matches!(
        e.kind.as_ref(),
        ErrorKind::Io(_)
            | ErrorKind::ServerSelection { .. }
            | ErrorKind::ConnectionPoolCleared { .. }
    );
    let transient_label = e.contains_label("RetryableWriteError")
        || e.contains_label("TransientTransactionError")
        || e.contains_label("RetryableError");
    transient_kind || transient_label || code(e).is_some_and(|c| TRANSIENT_CODES.contains(&c))
}

/// The longest part of a driver message we repeat (server selection errors list the whole
/// topology).
const MAX_DETAIL: usize = 300;

/// `text` on one line, shortened to [`MAX_DETAIL`] characters.
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_DETAIL + 3));
    let mut last_space = false;
    for c in text.chars() {
        let c = if c.is_whitespace() { ' ' } else { c };
        if c == ' ' && last_space {
            continue;
        }
        last_space = c == ' ';
        if out.chars().count() >= MAX_DETAIL {
            out.push_str("...");
            break;
        }
        out.push(c);
    }
    out.trim().to_owned()
}

/// `server error 13 (Unauthorized): not authorized on app to execute command …`
fn server_error(what: &str, code: i32, code_name: Option<&str>, message: &str) -> String {
    match code_name.filter(|n| !n.is_empty()) {
        Some(name) => format!("{what} {code} ({name}): {}", one_line(message)),
        None => format!("{what} {code}: {}", one_line(message)),
    }
}

/// A one-line description of a driver error built from its kind, code, code name and the
/// server's message — not the driver's `Display`, which adds labels, sources and raw replies.
pub(crate) fn describe(e: &mongodb::error::Error) -> String {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => {
            server_error("server error", c.code, Some(&c.code_name), &c.message)
        }
        ErrorKind::Write(WriteFailure::WriteError(w)) => {
            server_error("write error", w.code, w.code_name.as_deref(), &w.message)
        }
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => server_error(
            "write concern error",
            w.code,
            Some(&w.code_name),
            &w.message,
        ),
        ErrorKind::Io(io) => format!("network error: {}", one_line(&io.to_string())),
        ErrorKind::ServerSelection { message, .. } => {
            format!(
                "no suitable MongoDB server was found: {}",
                one_line(message)
            )
        }
        ErrorKind::ConnectionPoolCleared { message, .. } => {
            format!("the connection pool was cleared: {}", one_line(message))
        }
        ErrorKind::Authentication { message, .. } => {
            format!("authentication failed: {}", one_line(message))
        }
        ErrorKind::DnsResolve { message, .. } => {
            format!("DNS resolution failed: {}", one_line(message))
        }
        ErrorKind::InvalidArgument { message, .. } => {
            format!("invalid argument: {}", one_line(message))
        }
        ErrorKind::InvalidResponse { message, .. } => {
            format!("invalid reply from the server: {}", one_line(message))
        }
        ErrorKind::IncompatibleServer { message, .. } => {
            format!("incompatible server: {}", one_line(message))
        }
        ErrorKind::BsonDeserialization(d) => {
            format!(
                "unexpected document from the server: {}",
                one_line(&d.to_string())
            )
        }
        ErrorKind::Shutdown => "the MongoDB client was shut down".to_owned(),
        other => one_line(&other.to_string()),
    }
}

/// What to do about a transient error (appended to its message).
fn transient_hint(e: &mongodb::error::Error) -> &'static str {
    match e.kind.as_ref() {
        ErrorKind::Io(_)
        | ErrorKind::ServerSelection { .. }
        | ErrorKind::ConnectionPoolCleared { .. } => {
            "check that MongoDB is running and reachable from this host"
        }
        _ => "usually a failover or shutdown in progress; it is retried",
    }
}

/// Converts a driver error from operation `op`.
pub(crate) fn classify(e: mongodb::error::Error, op: &str) -> Error {
    let code = code(&e);
    if is_transient(&e) {
        return Error::Unavailable {
            message: format!("{op}: {}; {}", describe(&e), transient_hint(&e)),
            source: Some(Box::new(e)),
        };
    }
    let message = format!("{op}: {}", describe(&e));
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
        ErrorKind::InvalidArgument { .. } => {
            "the driver refused the request; check the client options and the lock name"
        }
        _ => hint_for(code),
    };
    Error::Backend {
        message,
        code,
        hint: hint.to_owned(),
        source: Some(Box::new(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_short_line() {
        let long = format!("first line\nsecond\tline {}", "x".repeat(1000));
        let m = one_line(&long);
        assert!(!m.contains('\n') && !m.contains('\t'));
        assert!(m.starts_with("first line second line x"));
        assert!(m.ends_with("...") && m.chars().count() <= MAX_DETAIL + 3);
        assert_eq!(
            server_error("server error", 13, Some("Unauthorized"), "not authorized"),
            "server error 13 (Unauthorized): not authorized"
        );
        assert_eq!(
            server_error("write error", 11000, None, "dup"),
            "write error 11000: dup"
        );
    }
}
