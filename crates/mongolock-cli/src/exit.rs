//! Exit statuses of `mongolock`, and the error type that carries one.
//!
//! | status  | meaning                                                                          |
//! |---------|----------------------------------------------------------------------------------|
//! | 0       | success (`exec`/`elect`: the command exited 0)                                   |
//! | 1–255   | `exec`/`elect`: the command's own exit status, passed through                    |
//! | 1       | mongolock itself failed: cannot connect, bad URI, authentication, server error   |
//! | 2       | usage error (bad option or argument; printed by the argument parser)             |
//! | 3       | `inspect`: no lock with that name exists; `release --force`: it was not held    |
//! | 66      | `list`/`inspect`/`watch` (PostgreSQL): the lock table (or its schema) does not   |
//! |         | exist; read commands create nothing                                              |
//! | 75      | `exec --wait`: the wait ran out while someone else held the lock; CMD not run    |
//! | 76      | `exec`/`elect`: the lock was lost while CMD ran (CMD was stopped)                |
//! | 77      | the lock collection (table) holds data that is not mongolock's; nothing written  |
//! | 78      | `exec --limit`/`--shared`: NAME is held with another slot limit (another        |
//! |         | `--limit`, or readers vs. a semaphore); CMD not run                              |
//! | 79      | `release --force --token N`: no unexpired lease with token N holds the name      |
//! |         | (released, expired or taken over since); nothing was released                    |
//! | 126     | CMD exists but could not be executed (permissions)                               |
//! | 127     | CMD not found                                                                    |
//! | 128+N   | CMD was killed by signal N, or mongolock was interrupted by signal N while       |
//! |         | waiting for the lock (130 = SIGINT, 143 = SIGTERM)                               |
//!
//! 75 is `EX_TEMPFAIL` from `sysexits.h` ("try again later"); 76 is chosen next to it; 78 is
//! `EX_CONFIG` (the processes sharing a name disagree on its configuration); 77 is `EX_NOPERM`
//! (mongolock refuses to use a collection or table that is not its own, for reads as for
//! writes); 66 is `EX_NOINPUT` (what a read command was asked to read does not exist); 79 follows them
//! (the lease named by the token is not there any more: a script must not retry blindly). A command
//! that itself exits 75 or 76 cannot be told apart from these; scripts that need to can check
//! for the message on stderr.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// Success.
pub const SUCCESS: i32 = 0;
/// mongolock itself failed (connection, URI, authentication, server error, I/O).
pub const FAILURE: i32 = 1;
/// Usage error (clap exits with this status itself).
pub const USAGE: i32 = 2;
/// `inspect`: the lock does not exist.
pub const NOT_FOUND: i32 = 3;
/// A read command (`list`, `inspect`, `watch`) found no lock table (PostgreSQL; or no schema):
/// no lock was ever taken there, or `--collection` is wrong. Nothing was created.
pub const MISSING_TABLE: i32 = 66;
/// `exec --wait D`: the lock stayed held by someone else for D; the command was not run.
pub const WAIT_TIMED_OUT: i32 = 75;
/// The lock was lost while the command ran; the command was stopped.
pub const LOCK_LOST: i32 = 76;
/// The lock collection (MongoDB) or table (PostgreSQL) holds data mongolock did not write
/// (an application's documents or table); mongolock wrote nothing there.
pub const FOREIGN_COLLECTION: i32 = 77;
/// `exec --limit N` / `--shared`: the name's current holders use another slot limit; the
/// command was not run.
pub const LIMIT_MISMATCH: i32 = 78;
/// `release --force --token N`: no unexpired lease with fencing token N holds the name (it was
/// released, expired or taken over); nothing was released.
pub const TOKEN_MISMATCH: i32 = 79;
/// The command could not be executed (permission denied, not an executable).
pub const CANNOT_EXECUTE: i32 = 126;
/// The command was not found.
pub const COMMAND_NOT_FOUND: i32 = 127;

/// The shell convention for death by signal `signo`.
pub fn for_signal(signo: i32) -> i32 {
    128 + signo
}

/// The status to exit with for a child that ended with `status`: its exit code, or 128 + the
/// signal that killed it.
pub fn for_child(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        code
    } else if let Some(sig) = status.signal() {
        for_signal(sig)
    } else {
        FAILURE
    }
}

/// An error that ends mongolock with `code` after printing `message` (one line, prefixed with
/// `mongolock: `).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    /// Exit status.
    pub code: i32,
    /// What went wrong, on one line.
    pub message: String,
}

impl CliError {
    /// A general failure (status 1).
    pub fn failure(message: impl Into<String>) -> Self {
        CliError {
            code: FAILURE,
            message: message.into(),
        }
    }

    /// A failure with a specific status.
    pub fn with_code(code: i32, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
        }
    }
}

/// Turns any message into one line: newlines and runs of whitespace become single spaces.
pub fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_statuses_map_to_shell_conventions() {
        assert_eq!(for_child(ExitStatus::from_raw(0)), 0);
        assert_eq!(for_child(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(for_child(ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(for_child(ExitStatus::from_raw(libc::SIGTERM)), 143);
    }

    #[test]
    fn messages_become_one_line() {
        assert_eq!(one_line("a\n  b\tc \n"), "a b c");
    }
}
