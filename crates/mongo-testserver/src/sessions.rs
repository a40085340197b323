//! Logical sessions and retryable writes: a write re-sent with the same `(lsid, txnNumber)`
//! returns the stored reply and is not applied again.

use std::collections::HashMap;
use std::time::Duration;

use bson::Document;
use tokio::time::Instant;

use crate::error::{CommandError, CommandResult};
use crate::keys::{self, KeyBytes};

/// Sessions unused this long are forgotten (mongod's `logicalSessionTimeoutMinutes` is 30).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(30 * 60);

struct Entry {
    txn_number: i64,
    reply: Option<Document>,
    last_used: Instant,
}

/// Retryable-write state per session.
#[derive(Default)]
pub struct Sessions {
    map: HashMap<KeyBytes, Entry>,
}

/// The key of a session id document.
pub fn session_key(lsid: &Document) -> KeyBytes {
    let mut out = Vec::with_capacity(40);
    match lsid.get("id") {
        Some(id) => keys::push_key(id, &mut out),
        None => keys::push_key(&bson::Bson::Document(lsid.clone()), &mut out),
    }
    out
}

impl Sessions {
    /// Checks a retryable write: `Ok(Some(reply))` if this transaction number already ran,
    /// `Ok(None)` if it must run now, an error if a newer one has started.
    pub fn check(&mut self, key: &KeyBytes, txn_number: i64) -> CommandResult<Option<Document>> {
        let Some(entry) = self.map.get_mut(key) else {
            return Ok(None);
        };
        entry.last_used = Instant::now();
        if txn_number < entry.txn_number {
            return Err(CommandError::new(
                225,
                "TransactionTooOld",
                format!(
                    "Retryable write with txnNumber {txn_number} is prohibited on session because a newer retryable write with txnNumber {} has already started on this session.",
                    entry.txn_number
                ),
            ));
        }
        if txn_number == entry.txn_number {
            return Ok(entry.reply.clone());
        }
        Ok(None)
    }

    /// Records the reply of a retryable write.
    pub fn record(&mut self, key: KeyBytes, txn_number: i64, reply: Document) {
        self.map.insert(
            key,
            Entry {
                txn_number,
                reply: Some(reply),
                last_used: Instant::now(),
            },
        );
    }

    /// Forgets a session.
    pub fn end(&mut self, key: &KeyBytes) {
        self.map.remove(key);
    }

    /// Forgets sessions idle longer than [`SESSION_TIMEOUT`].
    pub fn reap(&mut self, now: Instant) {
        self.map
            .retain(|_, e| now.duration_since(e.last_used) < SESSION_TIMEOUT);
    }
}
