//! The operator's view of a lock store: who waits for a name ([`QueuedWaiter`], read from the
//! cross-process handoff queue), a semaphore's limit, lists filtered by prefix and state
//! ([`ListFilter`]), and the conditional force-release that ends a lease only while it still
//! has a given fencing token. The backend operations behind them are provided methods of
//! [`LockBackend`](crate::LockBackend) ([`waiters`](crate::LockBackend::waiters),
//! [`slot_limit`](crate::LockBackend::slot_limit),
//! [`list_matching`](crate::LockBackend::list_matching),
//! [`force_release_token`](crate::LockBackend::force_release_token)); [`LockProvider`] offers
//! them with the name checked first.
//!
//! # Conditional force-release
//! [`LockProvider::force_release_token`] is one conditional write on the server (a filter on
//! the fencing token and the server's clock in the same update), never a read followed by a
//! write: a holder that took the name over between an operator's `inspect` and the release has
//! another token, and is left untouched. The token names one lease: the exclusive lease, or
//! one slot of a semaphore (one reader of a read-write lock), whose other slots stay.

use std::time::SystemTime;

use crate::backend::LockInfo;
use crate::error::Result;
use crate::holder::HolderInfo;
use crate::options::validate_name;
use crate::provider::LockProvider;

/// One entry of a name's wait queue, as returned by [`LockBackend::waiters`](crate::LockBackend::waiters):
/// a process (MongoDB, PostgreSQL: one entry per backend, whatever the number of its waiting
/// acquirers) or an acquire call (the memory backend) that found the name busy and waits for
/// it. Entries are in queue order (the first is designated by the next release).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct QueuedWaiter {
    /// What the entry is keyed by: the waiting backend's mark (the prefix of its lease ids) on
    /// MongoDB and PostgreSQL, the waiting call's lease id on the memory backend.
    pub id: String,
    /// The waiter's metadata (host, pid, application name): that of the acquirer that last
    /// registered the entry. `None` for an entry written by a version that did not store it.
    pub holder: Option<HolderInfo>,
    /// Server time until which the registration lasts unless the waiter renews it (it does
    /// each time it finds the name busy): the holder's expiry plus a short margin. An entry
    /// whose process died drops out by itself at this time.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "crate::serde_time::rfc3339")
    )]
    pub until: SystemTime,
}

impl QueuedWaiter {
    /// An entry (for backend implementations).
    pub fn new(id: impl Into<String>, holder: Option<HolderInfo>, until: SystemTime) -> Self {
        QueuedWaiter {
            id: id.into(),
            holder,
            until,
        }
    }
}

/// Which locks [`LockBackend::list_matching`](crate::LockBackend::list_matching) returns.
/// The default matches every lock.
///
/// ```
/// let filter = mongolock::ListFilter::new().prefix("reports:").held(true);
/// assert_eq!(filter.prefix_str(), Some("reports:"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListFilter {
    prefix: Option<String>,
    held: bool,
}

impl ListFilter {
    /// Every lock.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only names that start with `prefix` (compared as plain text: no character is special).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into()).filter(|p: &String| !p.is_empty());
        self
    }

    /// Only names with an unexpired lease (exclusive or any semaphore slot) by server time at
    /// the read, when `held` is true.
    pub fn held(mut self, held: bool) -> Self {
        self.held = held;
        self
    }

    /// The prefix, when one was set.
    pub fn prefix_str(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// Whether only held locks are wanted.
    pub fn held_only(&self) -> bool {
        self.held
    }

    /// Whether `info` passes the filter.
    pub fn matches(&self, info: &LockInfo) -> bool {
        (!self.held || info.held)
            && self
                .prefix
                .as_deref()
                .is_none_or(|p| info.name.starts_with(p))
    }
}

impl LockProvider {
    /// The wait queue of `name` (see [`LockBackend::waiters`](crate::LockBackend::waiters)):
    /// the processes waiting for it, in queue order, by server time at the read. Empty when
    /// nobody waits, and always for a backend without a queue.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name (nothing is sent); the
    /// backend's error, without retry.
    ///
    /// # Cancel safety
    /// Cancel-safe: a read.
    pub async fn waiters(&self, name: &str) -> Result<Vec<QueuedWaiter>> {
        validate_name(name)?;
        self.backend().waiters(name).await
    }

    /// The slot limit of the semaphore (or read-write lock's readers) holding `name`: `Some`
    /// while at least one unexpired slot holds it (see
    /// [`LockBackend::slot_limit`](crate::LockBackend::slot_limit)).
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name; the backend's error.
    ///
    /// # Cancel safety
    /// Cancel-safe: a read.
    pub async fn slot_limit(&self, name: &str) -> Result<Option<u32>> {
        validate_name(name)?;
        self.backend().slot_limit(name).await
    }

    /// The locks that pass `filter`, sorted by name (the prefix is applied by the server where
    /// the backend can).
    ///
    /// # Errors
    /// The backend's error, without retry.
    ///
    /// # Cancel safety
    /// Cancel-safe: a read.
    pub async fn list_matching(&self, filter: &ListFilter) -> Result<Vec<LockInfo>> {
        self.backend().list_matching(filter).await
    }

    /// Ends the lease on `name` only if it still has fencing token `token` (an unexpired
    /// exclusive lease, or one unexpired semaphore slot): one conditional write, so a holder
    /// that took the name over meanwhile is untouched. Returns whether a lease was ended; the
    /// fencing token keeps growing for the next holder. See the [`LockBackend` docs](crate::LockBackend::force_release_token).
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name (nothing is sent); the
    /// backend's error, without retry ([`Error::Backend`](crate::Error::Backend) for a backend
    /// that has no conditional force-release).
    ///
    /// # Cancel safety
    /// One write: dropping the future after the request was sent may still end the lease.
    pub async fn force_release_token(&self, name: &str, token: u64) -> Result<bool> {
        validate_name(name)?;
        self.backend().force_release_token(name, token).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn filters_match_by_prefix_and_state() {
        let info = |name: &str, held: bool| LockInfo {
            name: name.into(),
            held,
            lease_id: None,
            fencing_token: None,
            holder: None,
            acquired_at: None,
            expires_at: None,
            observed_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1),
        };
        let f = ListFilter::new().prefix("a.b*");
        assert!(f.matches(&info("a.b*c", false)));
        assert!(!f.matches(&info("axb*c", true)));
        assert!(!f.matches(&info("a.bbc", true)));
        let f = ListFilter::new().held(true);
        assert!(f.matches(&info("x", true)) && !f.matches(&info("x", false)));
        assert_eq!(ListFilter::new().prefix(""), ListFilter::new());
    }
}
