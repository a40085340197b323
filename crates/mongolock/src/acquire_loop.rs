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
//! only the reply was lost, or a later step of the attempt failed after the grant. An attempt
//! still in flight when the call's future is dropped is such an attempt too. If the call then
//! ends without a lease — it returns an error, `None`, or its future is dropped — the lease
//! id is released in the background ([`Attempts::abandon`], bounded by the release timeout).
//! Release matches only that lease id, so this can never end anyone else's lease. (An attempt
//! that failed may also be applied by the server *after* the call's later attempt was granted
//! and released; a backend must then not grant the id again: the MongoDB backend retires such
//! ids before releasing them, `backends/mongo/retired.rs`.)
//!
//! That release is sent only after every attempt of the call has finished ([`InFlight`]): an
//! attempt the loop stopped waiting for (at a finite deadline, or when the call's future was
//! dropped) goes on in a task of its own and may still reach the server after the call ended.
//! A release sent before it would find nothing, and if that attempt then granted the lease and
//! failed afterwards (an error after the write, a lost reply), nobody would release it: the name
//! would stay held until the lease expired. Chained after the attempt, the release always comes
//! later than the grant. (An attempt that never finishes keeps its clean-up waiting with it; a
//! grant it made expires by itself.)
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
    #[cfg(feature = "mongodb")]
    GiveUp(Option<Error>),
}

/// What the loop needs from one kind of lock.
#[async_trait]
pub(crate) trait Attempts: Send + Sync {
    /// The granted value; dropping it releases the lease.
    type Granted: Send + 'static;

    /// One attempt for `lease_id`, through [`spawn_attempt`] with `in_flight` (so that the
    /// clean-up of the call waits for it, see the module docs).
    async fn attempt(&self, lease_id: &LeaseId, in_flight: InFlight)
        -> Result<Step<Self::Granted>>;

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

    /// Starts, in the background, releasing `lease_id` once `after` has completed (every
    /// attempt of the call has finished), the release bounded by the release timeout: the
    /// clean-up of an attempt whose outcome is unknown. Called at most once per acquire call.
    fn abandon(&self, lease_id: LeaseId, after: AttemptsDone);

    /// How to wait between busy attempts without notifications.
    fn wait_strategy(&self) -> &WaitStrategy;

    /// What is being acquired, for messages ("lock \"a\"", "document 42 of jobs").
    fn describe(&self) -> String;

    /// The `lock` label of the metrics (feature `metrics`); the default records none.
    fn metrics_label(&self) -> crate::metrics::Label {
        crate::metrics::Label::none()
    }
}

/// The attempts of one acquire call that have not finished yet, wherever they run (the
/// caller's task, or a task of their own after the caller stopped waiting). Each attempt holds
/// one [`InFlight`] until it finishes or is dropped; [`AttemptsDone`] completes once none is
/// left.
pub(crate) struct InFlight(tokio::sync::mpsc::Sender<()>);

/// Completes when every attempt of an acquire call has finished (see [`InFlight`]).
pub(crate) struct AttemptsDone {
    receiver: tokio::sync::mpsc::Receiver<()>,
}

impl AttemptsDone {
    /// Waits until every [`InFlight`] of the call is dropped. Nothing is ever sent on the
    /// channel: `recv` returns `None` once every sender is gone.
    pub(crate) async fn wait(mut self) {
        while self.receiver.recv().await.is_some() {}
    }
}

/// The tracker of one acquire call: hands out an [`InFlight`] per attempt.
fn in_flight_tracker() -> (InFlight, AttemptsDone) {
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    (InFlight(sender), AttemptsDone { receiver })
}

/// Runs `attempt` to completion and returns its result; if the caller drops the returned
/// future half-way, the attempt completes in a task of its own and a granted value is dropped
/// there, which releases its lease (see [`finish_on_drop`]). A panic in the attempt is returned
/// as an error. `in_flight` is dropped when the attempt has finished (or was dropped without
/// running).
pub(crate) async fn spawn_attempt<G, F>(in_flight: InFlight, attempt: F) -> Result<Step<G>>
where
    G: Send + 'static,
    F: Future<Output = Result<Step<G>>> + Send + 'static,
{
    let attempt = async move {
        let result = attempt.await;
        drop(in_flight);
        result
    };
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
/// whose outcome it does not know — including when the call's future is dropped — once every
/// attempt of the call has finished.
struct Cleanup<'a, A: Attempts + ?Sized> {
    attempts: &'a A,
    lease_id: &'a LeaseId,
    /// An attempt's outcome is unknown and no later attempt was granted.
    armed: bool,
    /// The call's own handle on its attempts: cloned for each attempt, dropped with the call.
    in_flight: Option<InFlight>,
    /// Completes once every attempt of the call has finished.
    done: Option<AttemptsDone>,
}

impl<A: Attempts + ?Sized> Cleanup<'_, A> {
    /// The handle the next attempt holds while it runs.
    fn in_flight(&self) -> InFlight {
        match &self.in_flight {
            Some(InFlight(sender)) => InFlight(sender.clone()),
            // Only taken in `drop`.
            None => in_flight_tracker().0,
        }
    }
}

impl<A: Attempts + ?Sized> Drop for Cleanup<'_, A> {
    fn drop(&mut self) {
        // The call holds no attempt any more: `done` now waits only for detached ones.
        drop(self.in_flight.take());
        if self.armed {
            if let Some(done) = self.done.take() {
                tracing::debug!(
                    target = %self.attempts.describe(),
                    lease_id = %self.lease_id,
                    "acquire ended after an attempt with an unknown outcome; releasing its lease id once its attempts have finished"
                );
                self.attempts.abandon(self.lease_id.clone(), done);
            }
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
    let (in_flight, done) = in_flight_tracker();
    let mut cleanup = Cleanup {
        attempts,
        lease_id: &lease_id,
        armed: false,
        in_flight: Some(in_flight),
        done: Some(done),
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
        let in_flight = cleanup.in_flight();
        // While the attempt is in flight its outcome is unknown: should the call's future be
        // dropped now, the attempt goes on in a task of its own and the lease id is released
        // after it (an attempt that grants hands a guard that releases itself on drop; one that
        // grants and then fails leaves nothing behind this way either).
        let unknown_before = std::mem::replace(&mut cleanup.armed, true);
        let result = match limit {
            Some(limit) => tokio::select! {
                r = attempts.attempt(&lease_id, in_flight) => r,
                _ = tokio::time::sleep_until(limit) => Err(Error::unavailable(format!(
                    "the backend did not answer an acquire attempt on {} before the timeout",
                    attempts.describe()
                ))),
            },
            None => attempts.attempt(&lease_id, in_flight).await,
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
            #[cfg(feature = "mongodb")]
            Ok(Step::GiveUp(error)) => {
                cleanup.armed = unknown_before;
                return error.map_or(Ok(None), Err);
            }
            Ok(Step::Busy { holder_expires_at }) => {
                cleanup.armed = unknown_before;
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
