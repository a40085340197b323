//! [`Lock`]: a named lock and the acquire loop (waiting, backoff, transient retries,
//! cancellation safety).
//!
//! # Cancellation safety
//! Each attempt runs in its own spawned task that owns its result. If the attempt grants a lease,
//! the task wraps it in a [`LockGuard`] and sends it through a oneshot channel; if the caller has
//! dropped the acquire future (the receiver is gone) or drops the value unread, the guard's `Drop`
//! releases the lease in the background. The release is therefore always sent *after* the grant
//! arrived, never racing ahead of an in-flight acquire on another connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{AcquireRequest, Attempt, LeaseId, LockInfo};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::provider::{check_ttl, ProviderInner};
use crate::wait::Backoff;

/// How long the last attempt of a finite acquire may take past the deadline.
const LAST_ATTEMPT_GRACE: Duration = Duration::from_millis(500);

/// How long an acquisition may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Timeout {
    /// Exactly one attempt.
    #[default]
    Zero,
    /// Keep trying until this much time has passed, then return `None`.
    After(Duration),
    /// Keep trying until acquired (or the future is dropped).
    Forever,
}

impl From<Duration> for Timeout {
    /// `Duration::ZERO` is [`Timeout::Zero`]; anything else is [`Timeout::After`].
    fn from(d: Duration) -> Self {
        if d.is_zero() {
            Timeout::Zero
        } else {
            Timeout::After(d)
        }
    }
}

impl From<Option<Duration>> for Timeout {
    /// `None` is [`Timeout::Forever`].
    fn from(d: Option<Duration>) -> Self {
        d.map_or(Timeout::Forever, Timeout::from)
    }
}

/// A named lock. Cheap to clone; creating one sends nothing to the backend.
#[derive(Clone)]
pub struct Lock {
    provider: Arc<ProviderInner>,
    name: Arc<str>,
    expiry: Duration,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("expiry", &self.expiry)
            .finish_non_exhaustive()
    }
}

/// What one spawned attempt produced.
enum Outcome {
    Acquired(LockGuard),
    Busy,
}

impl Lock {
    pub(crate) fn new(provider: Arc<ProviderInner>, name: Arc<str>, expiry: Duration) -> Self {
        Lock {
            provider,
            name,
            expiry,
        }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lease duration used by this lock's acquisitions and automatic extensions.
    pub fn expiry(&self) -> Duration {
        self.expiry
    }

    /// The same lock with another lease duration (at least 1 ms, at most one year).
    pub fn with_expiry(mut self, expiry: Duration) -> Result<Self> {
        check_ttl("expiry", expiry)?;
        self.expiry = expiry;
        Ok(self)
    }

    /// Waits until the lock is held. Transient backend errors are retried (logged with
    /// `tracing`) for as long as it takes; permanent ones are returned. Drop the future to give
    /// up (for a deadline, see [`acquire_timeout`](Self::acquire_timeout)).
    pub async fn acquire(&self) -> Result<LockGuard> {
        loop {
            // With `Forever` the loop only returns `None` if the wait logic is broken; keep
            // trying rather than panic.
            if let Some(guard) = self.acquire_with(Timeout::Forever).await? {
                return Ok(guard);
            }
        }
    }

    /// Exactly one attempt: `Some` if the lock was free, `None` if it is held by someone else.
    /// Errors, transient or not, are returned without retry.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_with(Timeout::Zero).await
    }

    /// Keeps trying for `timeout`; `None` when it elapsed with the lock still held by someone
    /// else. The last attempt is made at the deadline. If the backend stayed unreachable (or did
    /// not answer) until the deadline, the transient error is returned instead of `None`.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire_with(Timeout::from(timeout)).await
    }

    /// Acquire with any [`Timeout`].
    pub async fn acquire_with(&self, timeout: Timeout) -> Result<Option<LockGuard>> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime);
        }
        let span = tracing::debug_span!("mongolock.acquire", lock = %self.name, ?timeout);
        self.acquire_loop(timeout).instrument(span).await
    }

    async fn acquire_loop(&self, timeout: Timeout) -> Result<Option<LockGuard>> {
        let started = Instant::now();
        let deadline = match timeout {
            Timeout::Zero => Some(started),
            Timeout::After(d) => started.checked_add(d),
            Timeout::Forever => None,
        };
        let mut waits = self.provider.options.wait.start();
        let mut error_waits = Backoff::for_errors();
        // One lease id per acquire call: a retry after a transient error reuses it, so a grant
        // whose reply was lost is taken over by the retry instead of staying orphaned.
        let lease_id = LeaseId::random();
        let mut attempts: u64 = 0;
        loop {
            attempts += 1;
            let result = match timeout {
                // A finite budget also bounds a hung attempt (blocked connection, unreachable
                // server): stop waiting at the deadline, with a little grace for the last try.
                // The attempt task owns its result, so abandoning it is safe.
                Timeout::After(_) => {
                    let limit = deadline.map(|d| d.max(Instant::now() + LAST_ATTEMPT_GRACE));
                    match limit {
                        Some(limit) => tokio::select! {
                            r = self.attempt(&lease_id) => r,
                            _ = tokio::time::sleep_until(limit) => Err(Error::unavailable(format!(
                                "the backend did not answer an acquire attempt on {:?} before the \
                                 timeout",
                                self.name
                            ))),
                        },
                        None => self.attempt(&lease_id).await,
                    }
                }
                Timeout::Zero | Timeout::Forever => self.attempt(&lease_id).await,
            };
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            match result {
                Ok(Outcome::Acquired(guard)) => {
                    tracing::debug!(
                        lock = %self.name,
                        token = guard.fencing_token(),
                        attempts,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "lock acquired"
                    );
                    return Ok(Some(guard));
                }
                Ok(Outcome::Busy) => {
                    let delay = waits.next_delay();
                    match remaining {
                        Some(r) if r.is_zero() => {
                            tracing::debug!(lock = %self.name, attempts, "lock busy; giving up");
                            return Ok(None);
                        }
                        Some(r) => {
                            self.provider
                                .backend
                                .wait_for_change(&self.name, delay.min(r))
                                .await
                        }
                        None => {
                            self.provider
                                .backend
                                .wait_for_change(&self.name, delay)
                                .await
                        }
                    }
                }
                Err(e) if e.is_transient() => {
                    if remaining.is_some_and(|r| r.is_zero()) {
                        return Err(e);
                    }
                    let delay = error_waits.next_delay();
                    tracing::warn!(
                        lock = %self.name,
                        error = %e,
                        retry_in_ms = delay.as_millis() as u64,
                        "transient error while acquiring; retrying"
                    );
                    tokio::time::sleep(remaining.map_or(delay, |r| delay.min(r))).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt, run in its own task so that a granted lease is never orphaned by the caller
    /// dropping this future (see the module docs).
    async fn attempt(&self, lease_id: &LeaseId) -> Result<Outcome> {
        let provider = self.provider.clone();
        let req = AcquireRequest {
            name: self.name.to_string(),
            lease_id: lease_id.clone(),
            ttl: self.expiry,
            holder: provider.holder.clone(),
        };
        let name = self.name.clone();
        let (tx, rx) = oneshot::channel::<Result<Outcome>>();
        tokio::spawn(async move {
            // Taken before the request is sent: the lease cannot expire on the server before
            // `sent_at + ttl` (server and local clocks advance at about the same rate).
            let sent_at = Instant::now();
            let outcome = match provider.backend.try_acquire(&req).await {
                Ok(Attempt::Acquired(lease)) => Ok(Outcome::Acquired(LockGuard::start(
                    &provider,
                    name,
                    req.lease_id,
                    req.ttl,
                    lease,
                    sent_at,
                ))),
                Ok(Attempt::Busy { .. }) => Ok(Outcome::Busy),
                Err(e) => Err(e),
            };
            // If the caller is gone the value comes back here and is dropped: a guard in it
            // releases its lease in the background.
            drop(tx.send(outcome));
        });
        rx.await.map_err(|_| {
            Error::backend(
                "the acquire attempt task ended without a result (the backend panicked or the \
                 runtime is shutting down)",
                "check the logs for a panic in the lock backend",
            )
        })?
    }

    /// Reads the current state of this lock; `None` when the backend has no record of it.
    pub async fn inspect(&self) -> Result<Option<LockInfo>> {
        self.provider.backend.inspect(&self.name).await
    }
}
