//! The one acquire loop shared by named locks ([`Lock`](crate::Lock)) and document locks
//! ([`DocumentLocks`](crate::documents::DocumentLocks)): waiting, backoff, transient retries,
//! deadlines, cancellation safety and the clean-up of attempts whose outcome is unknown. What
//! differs — how one attempt is made, how to wait for a change, how to release a lease id — is
//! an [`Attempts`] implementation.
//!
//! # Cancellation safety
//! Each attempt runs to completion even when the caller stops waiting for it
//! ([`spawn_attempt`], built on [`finish_on_drop`]): it runs in the caller's task (no task
//! spawn per attempt), and if the caller drops it after it started and before it completed,
//! the rest of it — the same future, with its request possibly in flight — is moved into a task
//! of its own on the runtime that started it. If the attempt grants a lease, it wraps it in a
//! guard; when nobody receives that guard (the acquire future was dropped), the guard is dropped
//! and its `Drop` releases the lease in the background. That release is therefore always sent
//! *after* the grant arrived, never racing ahead of an in-flight acquire. A panic inside an
//! attempt is caught and reported as an error, as it was when every attempt had its own task.
//!
//! # No orphan grants
//! One lease id serves every attempt of one acquire call, so a retry after a lost reply takes
//! over the grant instead of leaving it behind. When an attempt fails (an error, or no answer
//! before a finite deadline), its outcome is unknown: the server may have granted the lease and
//! only the reply was lost, or a later step of the attempt failed after the grant. If the call
//! then ends without a lease — it returns an error, `None`, or its future is dropped — the lease
//! id is released in the background ([`Attempts::abandon`], bounded by the release timeout).
//! Release matches only that lease id, so this can never end anyone else's lease.
//!
//! # Waiting while the lock is busy
//! Before each attempt the loop registers for the next change of the target
//! ([`Attempts::change_waiter`]), so a release that happens while the attempt is in flight is
//! not missed. After a busy attempt:
//!
//! * **Live notifications** (a healthy MongoDB change stream, the memory backend): wait for the
//!   next change, or until the holder's reported expiry plus [`EXPIRY_MARGIN`] when nothing is
//!   written (a crashed holder), capped at [`LIVE_WAIT_CAP`]. Per process one waiter per name is
//!   woken per change; if its attempt then fails with an error it passes the wake-up on.
//! * **No notifications** (standalone server, polling fallback, custom backends, document
//!   locks): sleep for the wait strategy's delay, ended early by [`Attempts::wait_for_change`].
//!
//! The expiry is server time and is compared with this machine's clock only to decide *when to
//! try again*; who holds the lock is always decided by the server. With this clock ahead of the
//! server's, an expiry that looks past falls back to the strategy's delay; with it behind, a
//! takeover after a crash comes late by the difference (at most [`LIVE_WAIT_CAP`] per wait).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures_util::FutureExt;
use tokio::time::Instant;

use crate::backend::{ChangeWaiter, LeaseId};
use crate::error::{Error, Result};
use crate::lock::Timeout;
use crate::wait::{Backoff, WaitStrategy};

/// How long the last attempt of a finite acquire may take past the deadline.
const LAST_ATTEMPT_GRACE: Duration = Duration::from_millis(500);

/// Added to the holder's reported expiry before retrying, so the retry reaches the server after
/// the lease ran out there (expiry has millisecond resolution).
const EXPIRY_MARGIN: Duration = Duration::from_millis(5);

/// Longest single wait while notifications are live: a safety net against a lost wake-up or a
/// clock jump (the backend wakes every waiter whenever notifications stop or restart).
const LIVE_WAIT_CAP: Duration = Duration::from_secs(60);

/// What one attempt produced.
pub(crate) enum Step<G> {
    /// The lease was granted; `G` holds its guard.
    Acquired(G),
    /// Someone else holds it.
    Busy {
        /// Server time at which the holder's lease expires, when known.
        holder_expires_at: Option<SystemTime>,
    },
    /// Nothing to wait for: end the call with `Ok(None)` (nothing claimable) or this error (the
    /// document does not exist). Nothing was granted. Only document locks (MongoDB) give up.
    #[cfg_attr(not(feature = "mongodb"), allow(dead_code))]
    GiveUp(Option<Error>),
}

/// What the loop needs from one kind of lock.
#[async_trait]
pub(crate) trait Attempts: Send + Sync {
    /// The granted value; dropping it releases the lease.
    type Granted: Send + 'static;

    /// One attempt for `lease_id`, normally through [`spawn_attempt`].
    async fn attempt(&self, lease_id: &LeaseId) -> Result<Step<Self::Granted>>;

    /// A fresh lease id for one acquire call.
    fn new_lease_id(&self) -> LeaseId {
        LeaseId::random()
    }

    /// Registers for the next change of the target before an attempt; `None` without
    /// notifications.
    fn change_waiter(&self) -> Option<ChangeWaiter> {
        None
    }

    /// Waits for a change of the target or `max_wait` (the default sleeps).
    async fn wait_for_change(&self, max_wait: Duration) {
        tokio::time::sleep(max_wait).await;
    }

    /// Starts releasing `lease_id` in the background, bounded by the release timeout: the
    /// clean-up of an attempt whose outcome is unknown. Called at most once per acquire call.
    fn abandon(&self, lease_id: LeaseId);

    /// How to wait between busy attempts without notifications.
    fn wait_strategy(&self) -> &WaitStrategy;

    /// What is being acquired, for messages ("lock \"a\"", "document 42 of jobs").
    fn describe(&self) -> String;

    /// The `lock` label of the metrics (feature `metrics`); the default records none.
    fn metrics_label(&self) -> crate::metrics::Label {
        crate::metrics::Label::none()
    }
}

/// Runs `attempt` to completion and returns its result; if the caller drops the returned
/// future half-way, the attempt completes in a task of its own and a granted value is dropped
/// there, which releases its lease (see [`finish_on_drop`]). A panic in the attempt is returned
/// as an error.
pub(crate) async fn spawn_attempt<G, F>(attempt: F) -> Result<Step<G>>
where
    G: Send + 'static,
    F: Future<Output = Result<Step<G>>> + Send + 'static,
{
    // The attempt owns everything it uses ('static), so a panic cannot leave state of the
    // caller half-updated: asserting unwind safety is sound.
    match finish_on_drop(AssertUnwindSafe(attempt).catch_unwind()).await {
        Ok(outcome) => outcome,
        Err(_panic) => Err(Error::backend(
            "the acquire attempt panicked (in the lock backend)",
            "check the logs for a panic in the lock backend",
        )),
    }
}

/// Runs `fut` in the caller's task, like `fut.await`, except that if the caller drops the
/// returned future after it started and before it completed, the rest of `fut` runs to
/// completion in a new task on the runtime it started on, and its output is dropped there.
///
/// This gives what a `tokio::spawn` + join per operation gives (the operation is never cut
/// short half-way: a request in flight gets its reply handled, a granted lease gets its guard,
/// whose `Drop` releases it), without the cost of a task per operation in the common case where
/// the caller waits. A future dropped before its first poll never started and is simply
/// dropped. If the runtime is shutting down, the rest is dropped with it (as a spawned task
/// would be).
pub(crate) async fn finish_on_drop<T, F>(fut: F) -> T
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    struct Detach<T: Send + 'static> {
        fut: Option<Pin<Box<dyn Future<Output = T> + Send + 'static>>>,
        runtime: Option<tokio::runtime::Handle>,
    }
    impl<T: Send + 'static> Drop for Detach<T> {
        fn drop(&mut self) {
            if let (Some(fut), Some(runtime)) = (self.fut.take(), self.runtime.take()) {
                runtime.spawn(async move {
                    drop(fut.await);
                });
            }
        }
    }
    let mut detach = Detach {
        fut: Some(Box::pin(fut)),
        // Polled, so inside a runtime; without one (a custom executor) the rest would be
        // dropped instead, as a spawn would have failed.
        runtime: tokio::runtime::Handle::try_current().ok(),
    };
    let out = std::future::poll_fn(|cx| match detach.fut.as_mut() {
        Some(f) => f.as_mut().poll(cx),
        // `fut` is only taken after it completed, and then this closure is not polled again.
        None => Poll::Pending,
    })
    .await;
    detach.fut = None;
    out
}

/// Releases an acquire call's lease id when the call ends without a lease after an attempt
/// whose outcome it does not know — including when the call's future is dropped.
struct Cleanup<'a, A: Attempts + ?Sized> {
    attempts: &'a A,
    lease_id: &'a LeaseId,
    /// An attempt's outcome is unknown and no later attempt was granted.
    armed: bool,
}

impl<A: Attempts + ?Sized> Drop for Cleanup<'_, A> {
    fn drop(&mut self) {
        if self.armed {
            tracing::debug!(
                target = %self.attempts.describe(),
                lease_id = %self.lease_id,
                "acquire ended after an attempt with an unknown outcome; releasing its lease id"
            );
            self.attempts.abandon(self.lease_id.clone());
        }
    }
}

/// How long a waiter with live notifications sleeps when nothing is written: until the holder's
/// expiry (by this machine's clock, which only decides when to retry) plus a margin; the
/// strategy's `fallback` when the expiry is unknown or already past here.
fn live_wait(holder_expires_at: Option<SystemTime>, fallback: Duration) -> Duration {
    match holder_expires_at.and_then(|e| e.duration_since(SystemTime::now()).ok()) {
        Some(left) if !left.is_zero() => (left + EXPIRY_MARGIN).min(LIVE_WAIT_CAP),
        _ => fallback,
    }
}

/// The acquire loop: attempts until granted, until `timeout` runs out (`Ok(None)`), or until a
/// permanent error. Transient errors are retried within the budget; when the budget ran out on
/// one, it is returned instead of `None`.
pub(crate) async fn run<A: Attempts + ?Sized>(
    attempts: &A,
    timeout: Timeout,
) -> Result<Option<A::Granted>> {
    // Metrics (feature `metrics`; nothing without it): a dropped call records `cancelled`.
    let mut probe = crate::metrics::AcquireProbe::start(attempts.metrics_label());
    let result = run_loop(attempts, timeout, &mut probe).await;
    probe.finish(&result);
    result
}

async fn run_loop<A: Attempts + ?Sized>(
    attempts: &A,
    timeout: Timeout,
    probe: &mut crate::metrics::AcquireProbe,
) -> Result<Option<A::Granted>> {
    let started = Instant::now();
    let deadline = match timeout {
        Timeout::Zero => Some(started),
        Timeout::After(d) => started.checked_add(d),
        Timeout::Forever => None,
    };
    let mut waits = attempts.wait_strategy().start();
    let mut error_waits = Backoff::for_errors();
    let lease_id = attempts.new_lease_id();
    let mut cleanup = Cleanup {
        attempts,
        lease_id: &lease_id,
        armed: false,
    };
    let mut tries: u64 = 0;
    // Whether the last wait was ended by a change notification (this waiter was the one woken
    // for it).
    let mut woken = false;
    loop {
        tries += 1;
        // Registered before the attempt: a change while it is in flight ends the wait at once.
        let waiter = match timeout {
            Timeout::Zero => None,
            Timeout::After(_) | Timeout::Forever => attempts.change_waiter(),
        };
        // A finite budget also bounds a hung attempt (blocked connection, unreachable server):
        // stop waiting at the deadline, with a little grace for the last try. An abandoned
        // attempt completes in a task of its own (`finish_on_drop`), which owns its result, so
        // abandoning it is safe.
        let limit = match timeout {
            Timeout::After(_) => deadline.map(|d| d.max(Instant::now() + LAST_ATTEMPT_GRACE)),
            Timeout::Zero | Timeout::Forever => None,
        };
        let result = match limit {
            Some(limit) => tokio::select! {
                r = attempts.attempt(&lease_id) => r,
                _ = tokio::time::sleep_until(limit) => Err(Error::unavailable(format!(
                    "the backend did not answer an acquire attempt on {} before the timeout",
                    attempts.describe()
                ))),
            },
            None => attempts.attempt(&lease_id).await,
        };
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        match result {
            Ok(Step::Acquired(granted)) => {
                cleanup.armed = false;
                tracing::debug!(
                    target = %attempts.describe(),
                    attempts = tries,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "acquired"
                );
                return Ok(Some(granted));
            }
            Ok(Step::GiveUp(error)) => return error.map_or(Ok(None), Err),
            Ok(Step::Busy { holder_expires_at }) => {
                probe.busy();
                let delay = waits.next_delay();
                if remaining.is_some_and(|r| r.is_zero()) {
                    tracing::debug!(target = %attempts.describe(), attempts = tries, "busy; giving up");
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
                        attempts.wait_for_change(wait).await;
                        false
                    }
                };
            }
            Err(e) => {
                // The server may have granted the lease before the error (or the reply was
                // lost): release it if this call ends without a lease.
                cleanup.armed = true;
                // A waiter woken for a change whose attempt failed hands the change on, so
                // another waiter of this process retries too.
                if std::mem::take(&mut woken) {
                    if let Some(w) = waiter {
                        w.pass_on();
                    }
                }
                if !e.is_transient() || remaining.is_some_and(|r| r.is_zero()) {
                    return Err(e);
                }
                let delay = error_waits.next_delay();
                tracing::warn!(
                    target = %attempts.describe(),
                    error = %e,
                    retry_in_ms = delay.as_millis() as u64,
                    "transient error while acquiring; retrying"
                );
                tokio::time::sleep(remaining.map_or(delay, |r| delay.min(r))).await;
            }
        }
    }
}
