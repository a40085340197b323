//! [`Lock`]: a named lock and the acquire loop (waiting, backoff, transient retries,
//! cancellation safety).
//!
//! # Cancellation safety
//! Each attempt runs in its own spawned task that owns its result. If the attempt grants a lease,
//! the task wraps it in a [`LockGuard`] and sends it through a oneshot channel; if the caller has
//! dropped the acquire future (the receiver is gone) or drops the value unread, the guard's `Drop`
//! releases the lease in the background. The release is therefore always sent *after* the grant
//! arrived, never racing ahead of an in-flight acquire on another connection.
//!
//! # Waiting while the lock is busy
//! Before each attempt the loop registers for the next change of the name
//! ([`LockBackend::change_waiter`](crate::LockBackend::change_waiter)), so a release that happens
//! while the attempt is in flight is not missed. After a busy attempt:
//!
//! * **Live notifications** (a healthy MongoDB change stream, the memory backend): wait for the
//!   next change, or until the holder's reported expiry plus [`EXPIRY_MARGIN`] when nothing is
//!   written (a crashed holder), capped at [`LIVE_WAIT_CAP`]. Per process one waiter per name is
//!   woken per change; if its attempt then fails with an error it passes the wake-up on.
//! * **No notifications** (standalone server, polling fallback, custom backends): sleep for the
//!   wait strategy's delay, ended early by
//!   [`wait_for_change`](crate::LockBackend::wait_for_change).
//!
//! The expiry is server time and is compared with this machine's clock only to decide *when to
//! try again*; who holds the lock is always decided by the server. With this clock ahead of the
//! server's, an expiry that looks past falls back to the strategy's delay; with it behind, a
//! takeover after a crash comes late by the difference (at most [`LIVE_WAIT_CAP`] per wait).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

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

/// Added to the holder's reported expiry before retrying, so the retry reaches the server after
/// the lease ran out there (expiry has millisecond resolution).
const EXPIRY_MARGIN: Duration = Duration::from_millis(5);

/// Longest single wait while notifications are live: a safety net against a lost wake-up or a
/// clock jump (the backend wakes every waiter whenever notifications stop or restart).
const LIVE_WAIT_CAP: Duration = Duration::from_secs(60);

/// How long a waiter with live notifications sleeps when nothing is written: until the holder's
/// expiry (by this machine's clock, which only decides when to retry) plus a margin; the
/// strategy's `fallback` when the expiry is unknown or already past here.
fn live_wait(holder_expires_at: Option<SystemTime>, fallback: Duration) -> Duration {
    match holder_expires_at.and_then(|e| e.duration_since(SystemTime::now()).ok()) {
        Some(left) if !left.is_zero() => (left + EXPIRY_MARGIN).min(LIVE_WAIT_CAP),
        _ => fallback,
    }
}

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
    Busy {
        holder_expires_at: Option<SystemTime>,
    },
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
        // Whether the last wait was ended by a change notification (this waiter was the one
        // woken for it).
        let mut woken = false;
        loop {
            attempts += 1;
            // Registered before the attempt: a change while it is in flight ends the wait at once.
            let waiter = match timeout {
                Timeout::Zero => None,
                Timeout::After(_) | Timeout::Forever => {
                    self.provider.backend.change_waiter(&self.name)
                }
            };
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
                Ok(Outcome::Busy { holder_expires_at }) => {
                    let delay = waits.next_delay();
                    if remaining.is_some_and(|r| r.is_zero()) {
                        tracing::debug!(lock = %self.name, attempts, "lock busy; giving up");
                        return Ok(None);
                    }
                    let wait = match &waiter {
                        Some(w) if w.is_live() => live_wait(holder_expires_at, delay),
                        _ => delay,
                    };
                    let wait = remaining.map_or(wait, |r| wait.min(r));
                    woken = match waiter {
                        Some(w) => w.wait(wait).await,
                        None => {
                            self.provider
                                .backend
                                .wait_for_change(&self.name, wait)
                                .await;
                            false
                        }
                    };
                }
                Err(e) => {
                    // A waiter woken for a change whose attempt failed hands the change on, so
                    // another waiter of this process retries too.
                    if std::mem::take(&mut woken) {
                        if let Some(w) = waiter {
                            w.pass_on();
                        }
                    }
                    if !e.is_transient() {
                        return Err(e);
                    }
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
                Ok(Attempt::Busy { holder_expires_at }) => Ok(Outcome::Busy { holder_expires_at }),
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
