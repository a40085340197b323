//! [`LockGuard`]: a held lease, its renewal task and its lost signal.
//!
//! # Loss detection
//! Every grant or extension records a *local deadline*: the monotonic instant taken **before**
//! the request that produced it was sent, plus the lease duration, minus the
//! [drift margin](crate::DriftMargin) (default 1 % + 5 ms). The server cannot expire the lease
//! before that instant (under the clock assumption stated there), so trusting the lease until
//! then is never late.
//!
//! The deadline is kept on the monotonic clock and, on Linux, on `CLOCK_BOOTTIME` too, which
//! keeps counting while the machine is suspended (see `clock.rs`); it has passed when either
//! clock says so. Every wait that ends at the deadline (the lost signal, the watchdog, a manual
//! extension's race against it) sleeps with `clock::sleep_until_deadline`, which re-reads the
//! boot clock at least every 250 ms: after a suspend longer than the lease, the lost signal
//! fires within about that bound of the process running again, not when the monotonic deadline
//! is finally reached.
//!
//! # Extensions that shorten the lease
//! An extension sets the expiry to server now + its TTL, which can be *earlier* than the
//! current expiry (a shorter TTL than what is left). The server may apply it as soon as it is
//! sent, whether or not its reply ever reaches the guard (a dropped `extend` future, a lost
//! reply, an error after the write). So before an extension is sent, the local deadline is
//! lowered to `min(current, sent_at + ttl - margin)` on both clocks, and it is raised again only
//! when an extension's reply is applied (to that extension's own `sent_at + ttl - margin`).
//!
//! A request whose outcome stays unknown (its future dropped, or an error without a reply) can
//! still be applied *after* a later extension, on another connection: it then sets the expiry
//! to `T + ttl_k` with `T` after the later one's `sent_at`. So from then on every extension is
//! trusted for `min(ttl, ttl_k)` only, `ttl_k` the shortest TTL of the unanswered requests, and
//! renewals come at that shorter cadence. An unanswered request with the usual TTL changes
//! nothing; one with a shorter TTL makes the rest of the lease's renewals trusted that long.
//! Whatever became of each request, the server's expiry is then never earlier than the guard's
//! deadline: an extension `j` applied last gives `T_j + ttl_j >= sent_j + ttl_j`; an unanswered
//! `k` applied after `j` gives `T_k + ttl_k > sent_j + ttl_k`.
//!
//! The deadline is enforced where it is read, not only by a background task:
//! [`LockGuard::is_lost`], [`LostSignal::is_lost`] and every internal "still held?" check compare
//! the monotonic clock with the deadline and mark the lease lost once it has passed, and
//! [`LostSignal::wait`] sleeps until the deadline itself. So on a starved runtime (a task that
//! blocks its worker thread, an overloaded host) or in a process that was paused (SIGSTOP, a
//! stop-the-world pause), the first check after user code runs again already says "lost" — no
//! watchdog needs to have run. An extension whose reply arrives after the deadline does not
//! revive the lease: loss is final.
//!
//! A watchdog task per guard:
//!
//! * extends the lease every extension cadence (when automatic extension is on), retrying
//!   transient errors with a short backoff;
//! * races every extension against the deadline (`tokio::select!`), so a hung request (blocked
//!   connection) cannot delay the lost signal past the deadline;
//! * signals loss at once when the backend says the lease is gone, and at the deadline when no
//!   extension succeeded in time.
//!
//! Once loss is signalled, [`LockGuard::extend`] returns `false` without contacting the server.
//!
//! # Release
//! The release when a guard is dropped and the clean-up release of an acquire attempt whose
//! outcome is unknown run in their own task; [`LockGuard::release`] runs in the caller's task and
//! moves to a task of its own if its future is dropped half-way. All are bounded by the
//! [release timeout](crate::LockProviderBuilder::release_timeout) (default 5 s): a connection
//! that stops answering cannot hold a caller longer than that. A release that did not complete
//! is given up; the lease then expires by itself. Backends make release idempotent for the
//! owner (a retry after a lost reply reports success), so [`Error::LeaseLost`] means someone
//! else really ended or took the lease.
//!
//! # Minimum hold
//! [`LockGuard::release_after`] is the same release (the same task, timeout and retries: one
//! mechanism) with a different request: the backend's atomic
//! [`release_after`](LockBackend::release_after), which keeps the lease until its grant time
//! plus the minimum hold *by the server's clock* and refuses every extension from then on.
//! The guard is consumed as by a release: its watchdog stops first, so it sends no extension
//! after the request; an extension already in flight is refused by the server (the lease's id
//! is recorded as released), so it cannot move the end of the hold. Safety: two grants of a
//! name are then at least the minimum hold apart by the server's clock, whatever the callers'
//! clocks — for holders that end their lease this way; a holder that dies first holds the name
//! only until its lease expires. See the
//! [backend contract](crate::backend#minimum-hold-at-most-once-per-interval).

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use async_trait::async_trait;
use tracing::Instrument;

use crate::backend::{Lease, LeaseId, LockBackend, LockBackendExt};
use crate::clock::{self, Stamp};
use crate::error::{Error, Result};
use crate::options::{DriftMargin, GuardPolicy};
use crate::provider::{check_ttl, ProviderInner};
use crate::wait::Backoff;

/// The local deadline, on both clocks, of a lease granted or extended by a request sent at
/// `sent_at`.
fn local_deadline(sent_at: Stamp, ttl: Duration, drift: DriftMargin) -> (Instant, Duration) {
    let trusted = ttl.saturating_sub(drift.margin(ttl));
    (sent_at.mono + trusted, sent_at.boot + trusted)
}

/// Why a lease was lost: what [`LockGuard::lost_reason`] and [`LostSignal::reason`] return.
/// Its `Display` is a sentence for logs and messages. New reasons may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The lease's local deadline passed before an extension succeeded: the server was slow
    /// or unreachable, or this process did not run in time (a starved runtime, a pause, a
    /// suspend).
    DeadlinePassed,
    /// An extension called with [`LockGuard::extend`] did not complete before the lease's
    /// local deadline.
    ExtensionTooLate,
    /// An extension found the lease gone at the server: it expired, was released or was taken
    /// over.
    Expired,
    /// The store reported, unasked (a change notification), that the lease was taken over,
    /// released or removed by someone else (for example a force-release).
    TakenOver,
    /// The release found the lease already ended or taken by someone else.
    EndedBeforeRelease,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::DeadlinePassed => {
                "the lease's local deadline passed before an extension succeeded (the server was \
                 slow or unreachable, or this process did not run in time)"
            }
            LossReason::ExtensionTooLate => {
                "extension did not complete before the lease's local deadline"
            }
            LossReason::Expired => {
                "the server reports the lease expired, was released or taken over"
            }
            LossReason::TakenOver => {
                "the store reports the lease was taken over, released or removed by someone else"
            }
            LossReason::EndedBeforeRelease => {
                "the lease was ended or taken by someone else before its release"
            }
        })
    }
}

impl LossReason {
    /// The metrics' `reason` label of a loss.
    fn metrics_label(self) -> crate::metrics::LossReason {
        use crate::metrics::LossReason as Label;
        match self {
            LossReason::DeadlinePassed | LossReason::ExtensionTooLate => Label::Deadline,
            LossReason::Expired => Label::Expired,
            LossReason::TakenOver | LossReason::EndedBeforeRelease => Label::Taken,
        }
    }
}

#[derive(Clone, Debug)]
enum Status {
    Held,
    /// Lost, with the reason.
    Lost(LossReason),
    /// Released, or the guard was dropped.
    Ended,
}

impl Status {
    fn is_held(&self) -> bool {
        matches!(self, Status::Held)
    }
}

/// What a guard needs from whatever stores its lease: a named lock in a lock collection, or a
/// lock embedded in a user's document. One guard mechanism (renewal, loss detection, release)
/// serves both.
#[async_trait]
pub(crate) trait LeaseControl: Send + Sync + 'static {
    /// Sets the lease's expiry to server now + `ttl`; `None` when the lease is gone.
    async fn extend(&self, ttl: Duration) -> Result<Option<SystemTime>>;
    /// Ends the lease; `false` when it no longer held the lock.
    async fn release(&self) -> Result<bool>;
    /// Ends the lease no earlier than `min_hold` after its grant, by the store's clock (see
    /// [`LockBackend::release_after`]); `false` when it no longer held the lock. The default
    /// refuses without touching the lease (document locks).
    async fn release_after(&self, name: &str, min_hold: Duration) -> Result<bool> {
        let _ = min_hold;
        Err(Error::MinHoldUnsupported {
            name: name.to_owned(),
            what: "document lock",
            reason: "a lock embedded in a document cannot be held on after its release".into(),
        })
    }
    /// Completes when the store learns, unasked, that the lease is gone (taken over, released
    /// or removed by someone else). Pending forever when the store cannot tell.
    async fn gone(&self);
}

/// The lease of a named lock, held through a [`LockBackend`].
struct NamedLease {
    backend: Arc<dyn LockBackend>,
    name: Arc<str>,
    lease_id: LeaseId,
}

#[async_trait]
impl LeaseControl for NamedLease {
    async fn extend(&self, ttl: Duration) -> Result<Option<SystemTime>> {
        self.backend.extend(&self.name, &self.lease_id, ttl).await
    }

    async fn release(&self) -> Result<bool> {
        self.backend.release(&self.name, &self.lease_id).await
    }

    async fn release_after(&self, _name: &str, min_hold: Duration) -> Result<bool> {
        self.backend
            .release_after(&self.name, &self.lease_id, min_hold)
            .await
    }

    async fn gone(&self) {
        self.backend.lease_gone(&self.name, &self.lease_id).await
    }
}

/// What [`LockGuard::from_control`] needs to know about a fresh grant.
pub(crate) struct GrantedLease {
    /// The lock's name (for a document lock, a readable form of its `_id`).
    pub name: Arc<str>,
    pub lease_id: LeaseId,
    pub lease: Lease,
    pub ttl: Duration,
    /// Taken before the granting request was sent.
    pub sent_at: Stamp,
    pub policy: GuardPolicy,
}

struct LeaseState {
    expires_at: SystemTime,
    deadline: Instant,
    /// The same deadline on the boot-time clock (see `clock.rs`).
    deadline_boot: Duration,
    ttl: Duration,
    last_extend_sent: Instant,
    /// The shortest TTL among extensions whose outcome is unknown (future dropped, or an error
    /// without a reply): such a request may still be applied after a later one, so every
    /// later extension is trusted for at most this long (see "Extensions that shorten the
    /// lease" in the module docs).
    unanswered_ttl: Option<Duration>,
}

struct Shared {
    control: Box<dyn LeaseControl>,
    name: Arc<str>,
    lease_id: LeaseId,
    fencing_token: u64,
    acquired_at: SystemTime,
    policy: GuardPolicy,
    state: Mutex<LeaseState>,
    /// Serialises extensions so that the recorded deadline matches the last applied write.
    extend_lock: tokio::sync::Mutex<()>,
    /// Wakes the watchdog when the deadline moved (manual extension).
    changed: Notify,
    /// Ticks whenever the local deadline moves (an applied extension, or one lowered before an
    /// extension is sent), so that every wait for it re-reads it.
    deadline_moved: watch::Sender<()>,
    status: watch::Sender<Status>,
    /// The lease's span (`mongolock.lease`): entered by the watchdog and the release, dropped
    /// here when the lease is lost or ended, so it closes once those tasks are done.
    span: Mutex<Option<tracing::Span>>,
    /// Hold time, losses, extension failures (feature `metrics`; zero-sized without it).
    metrics: crate::metrics::LeaseMetrics,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, LeaseState> {
        // The state is plain data updated in single assignments; a poisoned lock still holds
        // consistent values.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_lost(&self) -> bool {
        // Checks the deadline first, so that a passed deadline reads as lost.
        !self.is_held() && matches!(*self.status.borrow(), Status::Lost(_))
    }

    fn lost_reason(&self) -> Option<LossReason> {
        self.is_held();
        match &*self.status.borrow() {
            Status::Lost(reason) => Some(*reason),
            _ => None,
        }
    }

    /// Whether the lease is still trusted: not ended or lost, and its local deadline not
    /// passed. Marks it lost when the deadline has passed (whoever notices first).
    fn is_held(&self) -> bool {
        if !self.status.borrow().is_held() {
            return false;
        }
        if self.deadline_passed() {
            self.mark_lost(LossReason::DeadlinePassed);
            return false;
        }
        true
    }

    /// Whether the local deadline has passed on either clock.
    fn deadline_passed(&self) -> bool {
        let st = self.state();
        Instant::now() >= st.deadline || clock::boot_now() >= st.deadline_boot
    }

    /// Completes once the local deadline has passed on either clock, following the deadline
    /// when it moves meanwhile. On the boot clock it is noticed within
    /// [`clock::BOOT_CHECK_SLICE`] of running again after a suspend (see `clock.rs`).
    async fn deadline_passes(&self) {
        // Subscribed before the deadline is read: a move after the read ends the sleep.
        let mut moved = self.deadline_moved.subscribe();
        loop {
            let (mono, boot) = {
                let st = self.state();
                (st.deadline, st.deadline_boot)
            };
            tokio::select! {
                () = clock::sleep_until_deadline(mono, boot) => {
                    if self.deadline_passed() {
                        return;
                    }
                }
                // The sender lives in `self`: it cannot be gone, so this only ends on a move.
                _ = moved.changed() => {}
            }
        }
    }

    /// Sets the local deadline and wakes every wait for it.
    fn set_deadline(&self, st: &mut LeaseState, (mono, boot): (Instant, Duration)) {
        st.deadline = mono;
        st.deadline_boot = boot;
        self.deadline_moved.send_modify(|_| {});
    }

    fn cadence_for(&self, ttl: Duration) -> Duration {
        match self.policy.extension_cadence {
            Some(c) if c < ttl => c,
            _ => ttl / 3,
        }
    }

    /// The lease's span while it is held (a disabled span afterwards).
    fn span(&self) -> tracing::Span {
        let span = self.span.lock().unwrap_or_else(|e| e.into_inner());
        span.clone().unwrap_or_else(tracing::Span::none)
    }

    /// Drops the lease's own handle on its span: the span closes when the tasks that entered
    /// it are done.
    fn close_span(&self) {
        drop(self.span.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    fn mark_lost(&self, reason: LossReason) {
        let changed = self.status.send_if_modified(|s| {
            if s.is_held() {
                *s = Status::Lost(reason);
                true
            } else {
                false
            }
        });
        if changed {
            self.span().in_scope(|| {
                tracing::warn!(lock = %self.name, token = self.fencing_token, %reason, "lock lost");
            });
            self.metrics.lost(reason.metrics_label());
            self.close_span();
        }
    }

    fn mark_ended(&self) {
        let changed = self.status.send_if_modified(|s| {
            if s.is_held() {
                *s = Status::Ended;
                true
            } else {
                false
            }
        });
        if changed {
            self.metrics.ended();
            self.close_span();
        }
    }

    /// One extension, serialised with the others. `Ok(false)` when the lease is gone.
    ///
    /// Before the request is sent, the local deadline is lowered to what this extension would
    /// give (`sent_at + ttl - margin`, on both clocks) when that is earlier: from the moment
    /// it is sent, the server may apply it — setting an expiry shorter than what was left —
    /// whether or not its reply ever arrives (a dropped future, a lost reply, an error after the
    /// write). The deadline is raised again only when a reply is applied.
    async fn extend_once(&self, ttl: Duration) -> Result<bool> {
        let _serial = self.extend_lock.lock().await;
        if !self.is_held() {
            return Ok(false);
        }
        let sent_at = Stamp::now();
        // Trusted no longer than the shortest extension whose outcome is unknown: it may still
        // be applied after this one.
        let trusted_ttl = ttl.min(self.state().unanswered_ttl.unwrap_or(ttl));
        let (mono, boot) = local_deadline(sent_at, trusted_ttl, self.policy.drift);
        let lowered = {
            let mut st = self.state();
            let lowered = (st.deadline.min(mono), st.deadline_boot.min(boot));
            if lowered != (st.deadline, st.deadline_boot) {
                self.set_deadline(&mut st, lowered);
                true
            } else {
                false
            }
        };
        if lowered {
            tracing::trace!(lock = %self.name, token = self.fencing_token, ?ttl, "local deadline lowered for a shorter extension");
            self.changed.notify_one();
        }
        // Until a reply is applied, this request's outcome is unknown: if this future is
        // dropped or the call fails, the request may still land later.
        let mut unanswered = Unanswered {
            shared: self,
            ttl: Some(ttl),
        };
        let reply = self.control.extend(ttl).await;
        unanswered.ttl = None;
        match reply {
            Ok(Some(expires_at)) => {
                if !self.is_held() {
                    return Ok(false);
                }
                {
                    let mut st = self.state();
                    st.expires_at = expires_at;
                    self.set_deadline(&mut st, (mono, boot));
                    st.ttl = ttl;
                    st.last_extend_sent = sent_at.mono;
                }
                self.changed.notify_one();
                tracing::trace!(lock = %self.name, token = self.fencing_token, "lease extended");
                Ok(true)
            }
            Ok(None) => {
                self.mark_lost(LossReason::Expired);
                Ok(false)
            }
            Err(e) => {
                self.record_unanswered(ttl);
                Err(e)
            }
        }
    }

    /// Remembers an extension whose outcome is unknown (see [`LeaseState::unanswered_ttl`]).
    fn record_unanswered(&self, ttl: Duration) {
        let mut st = self.state();
        st.unanswered_ttl = Some(st.unanswered_ttl.map_or(ttl, |t| t.min(ttl)));
    }
}

/// Records an extension as unanswered when its future is dropped before the reply arrived.
struct Unanswered<'a> {
    shared: &'a Shared,
    ttl: Option<Duration>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(ttl) = self.ttl {
            self.shared.record_unanswered(ttl);
        }
    }
}

/// The watchdog: automatic extension and deadline-based loss detection. Ends when the lease is
/// lost or ended; aborted when the guard is dropped or released.
async fn watchdog(shared: Arc<Shared>) {
    let mut errors = Backoff::for_errors();
    loop {
        if !shared.is_held() {
            return;
        }
        let (deadline, deadline_boot, next_renewal, ttl) = {
            let st = shared.state();
            (
                st.deadline,
                st.deadline_boot,
                st.last_extend_sent
                    + shared.cadence_for(st.ttl.min(st.unanswered_ttl.unwrap_or(st.ttl))),
                st.ttl,
            )
        };
        if shared.deadline_passed() {
            shared.mark_lost(LossReason::DeadlinePassed);
            return;
        }
        let wake = if shared.policy.auto_extend {
            next_renewal.min(deadline)
        } else {
            deadline
        };
        if Instant::now() < wake {
            tokio::select! {
                // Ends at `wake`, or soon after the boot-time deadline passed (a suspend).
                () = clock::sleep_until_deadline(wake, deadline_boot) => {}
                _ = shared.changed.notified() => {}
                _ = shared.control.gone() => {
                    shared.mark_lost(LossReason::TakenOver);
                    return;
                }
            }
            continue;
        }
        // Time to renew; the deadline check at the top of the loop handles the rest.
        let result = tokio::select! {
            r = shared.extend_once(ttl) => r,
            () = shared.deadline_passes() => continue,
        };
        match result {
            Ok(_) => errors = Backoff::for_errors(),
            Err(e) => {
                shared.metrics.extension_failed();
                let delay = errors.next_delay();
                let level_error = !e.is_transient();
                if level_error {
                    tracing::error!(lock = %shared.name, error = %e, "lease extension failed; retrying until the local deadline");
                } else {
                    tracing::warn!(lock = %shared.name, error = %e, "transient error extending lease; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    () = shared.deadline_passes() => {}
                }
            }
        }
    }
}

/// A held lease on a named lock.
///
/// * [`fencing_token`](Self::fencing_token): pass it to the protected resource, which rejects
///   tokens lower than the highest it has seen.
/// * The lease is extended automatically (unless disabled); watch [`lost`](Self::lost) to learn
///   when it can no longer be trusted.
/// * [`release`](Self::release) ends it and reports problems; dropping the guard releases it in
///   the background instead (if the runtime is gone, the lease simply expires).
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    shared: Arc<Shared>,
    watchdog: AbortHandle,
    runtime: tokio::runtime::Handle,
    finished: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.shared.name)
            .field("lease_id", &self.shared.lease_id)
            .field("fencing_token", &self.shared.fencing_token)
            .field("expires_at", &self.expires_at())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    /// Wraps a fresh grant of a named lock and starts its watchdog. Must run inside a Tokio
    /// runtime (it does: it is called from the acquire attempt).
    pub(crate) fn start(
        provider: &ProviderInner,
        name: Arc<str>,
        lease_id: LeaseId,
        ttl: Duration,
        lease: Lease,
        sent_at: Stamp,
    ) -> LockGuard {
        let control = NamedLease {
            backend: provider.backend.clone(),
            name: name.clone(),
            lease_id: lease_id.clone(),
        };
        LockGuard::from_control(
            Box::new(control),
            GrantedLease {
                name,
                lease_id,
                lease,
                ttl,
                sent_at,
                policy: provider.options.guard_policy(),
            },
        )
    }

    /// Wraps a fresh grant held through any [`LeaseControl`] and starts its watchdog. Must run
    /// inside a Tokio runtime.
    pub(crate) fn from_control(control: Box<dyn LeaseControl>, grant: GrantedLease) -> LockGuard {
        let (status, _) = watch::channel(Status::Held);
        let (deadline, deadline_boot) =
            local_deadline(grant.sent_at, grant.ttl, grant.policy.drift);
        // The lease's whole life, from grant to release or loss: a root span (the lease
        // outlives the acquire call), which follows from the acquire span.
        let span = tracing::info_span!(
            parent: None,
            "mongolock.lease",
            lock = %grant.name,
            token = grant.lease.fencing_token,
            lease_id = %grant.lease_id,
        );
        span.follows_from(tracing::Span::current());
        let metrics = crate::metrics::LeaseMetrics::start(&grant.name, &grant.policy);
        let shared = Arc::new(Shared {
            control,
            name: grant.name,
            lease_id: grant.lease_id,
            fencing_token: grant.lease.fencing_token,
            acquired_at: grant.lease.acquired_at,
            policy: grant.policy,
            state: Mutex::new(LeaseState {
                expires_at: grant.lease.expires_at,
                deadline,
                deadline_boot,
                ttl: grant.ttl,
                last_extend_sent: grant.sent_at.mono,
                unanswered_ttl: None,
            }),
            extend_lock: tokio::sync::Mutex::new(()),
            changed: Notify::new(),
            deadline_moved: watch::channel(()).0,
            status,
            span: Mutex::new(Some(span.clone())),
            metrics,
        });
        let runtime = tokio::runtime::Handle::current();
        let watchdog = runtime
            .spawn(watchdog(shared.clone()).instrument(span))
            .abort_handle();
        LockGuard {
            shared,
            watchdog,
            runtime,
            finished: false,
        }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The id of this lease (stored with it; visible through inspection).
    pub fn lease_id(&self) -> &LeaseId {
        &self.shared.lease_id
    }

    /// The fencing token: strictly larger than every token issued for this name before.
    pub fn fencing_token(&self) -> u64 {
        self.shared.fencing_token
    }

    /// Server time at which the lease was granted.
    pub fn acquired_at(&self) -> SystemTime {
        self.shared.acquired_at
    }

    /// Server time at which the lease expires, as reported by the last successful grant or
    /// extension.
    pub fn expires_at(&self) -> SystemTime {
        self.shared.state().expires_at
    }

    /// The local monotonic instant until which the lease is trusted (see the module docs). The
    /// lost signal fires at this instant at the latest, unless an extension moved it (a
    /// shorter extension lowers it as soon as it is sent). After a suspend, the boot-time copy
    /// of the deadline ends the lease earlier.
    pub fn local_deadline(&self) -> Instant {
        self.shared.state().deadline
    }

    /// The local deadline on the boot clock, on the scale of [`crate::__boot_time_now`] (for the
    /// CLI's supervisor; not API-stable).
    #[doc(hidden)]
    pub fn __local_deadline_boot(&self) -> Duration {
        self.shared.state().deadline_boot
    }

    /// A signal that completes when the lease is lost (or the guard is released or dropped),
    /// at the lease's local deadline at the latest. Cloneable and cancel-safe; await it
    /// directly or use it in `tokio::select!`.
    pub fn lost(&self) -> LostSignal {
        LostSignal {
            shared: self.shared.clone(),
        }
    }

    /// Whether the lease has been lost (non-blocking). True as soon as the local deadline has
    /// passed without a successful extension, even if no background task has run since (a
    /// starved runtime, a paused process): call it right before each step that relies on the
    /// lease.
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Why the lease was lost, once it is (e.g. [`LossReason::Expired`]; its `Display` is a
    /// sentence for messages); `None` while held or after a normal release.
    pub fn lost_reason(&self) -> Option<LossReason> {
        self.shared.lost_reason()
    }

    /// Sets the lease's expiry to server now + `ttl` (not added to the remaining time).
    /// `Ok(false)` when the lease had already expired or been taken; the guard then counts as
    /// lost. A successful call also makes `ttl` the duration of later automatic extensions.
    /// Transient errors are retried until the lease's local deadline.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a `ttl` below [`MIN_EXPIRY`](crate::MIN_EXPIRY) (100 ms)
    /// or over a year (nothing is sent); [`Error::NoRuntime`] outside a Tokio runtime; a permanent backend error
    /// ([`Error::Backend`]). Transient errors are not returned: they are retried until the
    /// local deadline, after which the call returns `Ok(false)` with the lease lost.
    ///
    /// # Cancel safety
    /// Cancel-safe in that the guard never trusts the lease longer than the server keeps it.
    /// Before the request is sent, the guard's local deadline is lowered to what this extension
    /// would give (`now + ttl` minus the drift margin) when that is earlier than the current
    /// one, because the server may apply the extension even if this future is dropped or its
    /// reply is lost: with a `ttl` shorter than the time left, the server's expiry then moves
    /// *earlier*. The deadline is raised again only when an extension's reply is applied. So a
    /// call dropped in flight (a `tokio::time::timeout`, a `select!`) leaves the guard trusting
    /// the lease until `now + ttl` at most — after that [`is_lost`](Self::is_lost) is true and
    /// [`lost`](Self::lost) fires — unless a later extension (automatic, or another call)
    /// succeeds first. Because a dropped request may still be applied after that later
    /// extension, later extensions of this guard are then trusted for at most this call's
    /// `ttl` (and renewed at that cadence). An extension with a longer `ttl` lowers nothing:
    /// if its reply is lost, the server's expiry is later than the guard's deadline, which
    /// stays the safe one.
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        check_ttl("ttl", ttl)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime);
        }
        let mut errors = Backoff::for_errors();
        loop {
            if !self.shared.is_held() {
                return Ok(false);
            }
            // Follows the deadline, which `extend_once` may lower before it sends.
            let result = tokio::select! {
                r = self.shared.extend_once(ttl) => r,
                () = self.shared.deadline_passes() => {
                    self.shared.mark_lost(LossReason::ExtensionTooLate);
                    return Ok(false);
                }
            };
            match result {
                Ok(extended) => return Ok(extended),
                Err(e) if e.is_transient() => {
                    self.shared.metrics.extension_failed();
                    tracing::warn!(lock = %self.shared.name, error = %e, "transient error extending lease; retrying");
                    let delay = errors.next_delay();
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        () = self.shared.deadline_passes() => {}
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Releases the lease.
    ///
    /// # Errors
    /// * [`Error::LeaseLost`] when someone else ended or took the lease before the release (it
    ///   expired and was taken over, or was force-released): work done under it may have
    ///   overlapped another holder's. A release retried after a lost reply is recognised by the
    ///   backend and reports success.
    /// * A transient error when the backend could not be reached within the
    ///   [release timeout](crate::LockProviderBuilder::release_timeout) (retried until then,
    ///   never past the lease's local deadline); the lease then expires by itself.
    ///
    /// # Cancel safety
    /// Dropping this future half-way (a timeout, a `select!`) still ends the lease, within the
    /// release timeout: the rest of the release then runs in a task of its own.
    pub async fn release(self) -> Result<()> {
        self.end(Ending::Now).await
    }

    /// Ends the lease **no earlier than `min_hold` after it was granted**, by the server's
    /// clock: the server keeps the lease until `max(now, granted + min_hold)` — same lease id,
    /// same fencing token, same holder — and then the name is free at once (it does not wait
    /// for the lease's TTL). When `granted + min_hold` has already passed at the server, this
    /// is exactly [`release`](Self::release). Like `release`, it consumes the guard: automatic
    /// extension stops at once, the [lost signal](Self::lost) completes as for a release, and
    /// the server refuses any later extension of the lease. A force-release
    /// ([`LockProvider::force_release`](crate::LockProvider::force_release)) still ends the
    /// hold. Waiting acquirers are told of the new end of the lease and get the name as soon
    /// as the hold is over.
    ///
    /// This is what makes a scheduled job run **at most once per interval across replicas,
    /// whatever their clock skew**: every replica's schedule fires at about the same time,
    /// the first one takes the lock, runs the job, and holds the name for `min_hold` from its
    /// grant, so the others find it busy even when the job finished long before they asked.
    /// The interval is measured on the server's clock only: two grants of the name are at
    /// least `min_hold` apart by that clock. **The limit:** the hold is written when the guard
    /// ends its lease; a holder that crashes (or loses its lease) before that holds the name
    /// only until its lease expires (its TTL). So the guarantee holds for work that ends,
    /// successfully or not, while its holder lives. See the
    /// [backend contract](crate::backend#minimum-hold-at-most-once-per-interval).
    ///
    /// Supported for exclusive leases ([`Lock`](crate::Lock), and a
    /// [`RwLock`](crate::RwLock)'s writer) on the memory, MongoDB and PostgreSQL backends.
    ///
    /// # Errors
    /// * [`Error::MinHoldUnsupported`] for a semaphore slot, a read-write lock's reader, a
    ///   document lock, or a backend without [`LockBackend::release_after`]: nothing was held
    ///   on; the lease was released at once instead (as [`release`](Self::release) does, whose
    ///   problems are then only logged).
    /// * [`Error::InvalidOptions`] for a `min_hold` over a year (nothing is sent; the lease is
    ///   released at once, as when a guard is dropped).
    /// * [`Error::LeaseLost`] and transient errors as for [`release`](Self::release). The
    ///   request is retried after transient errors within the release timeout, and a retry
    ///   after a lost reply is recognised (it reports success and changes nothing).
    ///
    /// # Cancel safety
    /// As [`release`](Self::release): dropping this future half-way still ends the lease
    /// (with its minimum hold), within the release timeout, in a task of its own.
    pub async fn release_after(self, min_hold: Duration) -> Result<()> {
        if min_hold > crate::options::MAX_EXPIRY {
            drop(self);
            return Err(Error::invalid_option(
                "min_hold",
                format!(
                    "a minimum hold of {min_hold:?} is over a year; use a shorter one (the \
                     lease was released at once)"
                ),
            ));
        }
        self.end(Ending::NoEarlierThan(min_hold)).await
    }

    /// The release shared by [`release`](Self::release) and
    /// [`release_after`](Self::release_after): one mechanism for both (retries, the release
    /// timeout, finishing in a task of its own when dropped).
    async fn end(mut self, ending: Ending) -> Result<()> {
        self.finished = true;
        self.watchdog.abort();
        let shared = self.shared.clone();
        let span = shared.span();
        let release = async move {
            match bounded_release(&shared, ending).await {
                Ok(true) => {
                    shared.mark_ended();
                    match ending {
                        Ending::Now => {
                            tracing::debug!(lock = %shared.name, token = shared.fencing_token, "lock released")
                        }
                        Ending::NoEarlierThan(min_hold) => {
                            tracing::debug!(lock = %shared.name, token = shared.fencing_token, ?min_hold, "lock released with a minimum hold")
                        }
                    }
                    Ok(())
                }
                Ok(false) => {
                    shared.mark_lost(LossReason::EndedBeforeRelease);
                    Err(Error::LeaseLost {
                        name: shared.name.to_string(),
                    })
                }
                Err(e @ Error::MinHoldUnsupported { .. }) => {
                    // Refused without touching the lease: never leave it held with nobody
                    // renewing or releasing it.
                    if let Err(release_error) = bounded_release(&shared, Ending::Now).await {
                        tracing::warn!(lock = %shared.name, error = %release_error, "could not release the lease after a refused minimum hold; it expires by itself");
                    }
                    shared.mark_ended();
                    Err(e)
                }
                Err(e) => {
                    shared.mark_ended();
                    Err(e)
                }
            }
        }
        .instrument(span);
        if tokio::runtime::Handle::try_current().is_ok() {
            // Runs in this task; if this future is dropped half-way, the rest runs in a task of
            // its own (`finish_on_drop`), so the release still completes.
            return crate::acquire_loop::finish_on_drop(release).await;
        }
        // Awaited outside any Tokio runtime: run it on the guard's runtime.
        match self.runtime.spawn(release).await {
            Ok(result) => result,
            Err(join_error) => {
                self.shared.mark_ended();
                Err(Error::unavailable(format!(
                    "the release of lock {:?} did not complete ({join_error}); the lease expires by itself",
                    self.shared.name
                )))
            }
        }
    }
}

/// How a guard ends its lease.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// [`LockGuard::release`] (and a dropped guard).
    Now,
    /// [`LockGuard::release_after`]: no earlier than this long after the grant.
    NoEarlierThan(Duration),
}

/// Releases with retries of transient errors, bounded by the release timeout (and, for the
/// retries, by the lease's local deadline). `Ok(false)`: someone else ended or took the lease.
async fn bounded_release(shared: &Shared, ending: Ending) -> Result<bool> {
    let timeout = shared.policy.release_timeout;
    match tokio::time::timeout(timeout, release_with_retries(shared, ending)).await {
        Ok(result) => result,
        Err(_) => Err(Error::unavailable(format!(
            "the release of lock {:?} did not complete within {timeout:?} (the release \
             timeout); the lease expires by itself",
            shared.name
        ))),
    }
}

async fn release_with_retries(shared: &Shared, ending: Ending) -> Result<bool> {
    let mut errors = Backoff::for_errors();
    loop {
        let attempt = match ending {
            Ending::Now => shared.control.release().await,
            Ending::NoEarlierThan(min_hold) => {
                shared.control.release_after(&shared.name, min_hold).await
            }
        };
        match attempt {
            Err(e) if e.is_transient() => {
                let deadline = shared.state().deadline;
                let delay = errors.next_delay();
                if Instant::now() + delay >= deadline {
                    return Err(e);
                }
                tracing::warn!(lock = %shared.name, error = %e, "transient error releasing lease; retrying");
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.watchdog.abort();
        let shared = self.shared.clone();
        let span = shared.span();
        shared.mark_ended();
        // Spawning onto a runtime that has shut down drops the task without running it: the
        // lease then expires by itself.
        let release = async move {
            match bounded_release(&shared, Ending::Now).await {
                Ok(true) => {
                    tracing::debug!(lock = %shared.name, token = shared.fencing_token, "lock released on drop")
                }
                Ok(false) => {
                    tracing::debug!(lock = %shared.name, "lease already gone when the dropped guard released it")
                }
                Err(e) => {
                    tracing::warn!(lock = %shared.name, error = %e, "could not release dropped guard; the lease expires by itself")
                }
            }
        };
        self.runtime.spawn(release.instrument(span));
    }
}

/// Completes when a lease is lost, released or its guard dropped. Obtained from
/// [`LockGuard::lost`]; cloneable and cancel-safe.
///
/// ```
/// # async fn demo(guard: mongolock::LockGuard) {
/// tokio::select! {
///     _ = guard.lost() => eprintln!("lock lost; stop writing"),
///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => { /* work */ }
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct LostSignal {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LostSignal")
            .field("lock", &self.shared.name)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LostSignal {
    /// The name of the lock whose lease this signal watches.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Whether the lease has been lost (false while held and after a normal release). Like
    /// [`LockGuard::is_lost`], true as soon as the local deadline has passed.
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Why the lease was lost, once it is; `None` while held or after a normal release.
    pub fn reason(&self) -> Option<LossReason> {
        self.shared.lost_reason()
    }

    /// Waits until the lease is lost, released or its guard dropped; at the local deadline at
    /// the latest (following it when an extension moves it), whether or not the guard's
    /// watchdog ran. After a suspend of the machine, within about 250 ms of running again once
    /// the boot-time deadline has passed.
    ///
    /// # Errors
    /// None: it only completes.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only observes the lease; a dropped wait can be started again, and
    /// returns at once if the lease ended meanwhile.
    pub async fn wait(&self) {
        let mut rx = self.shared.status.subscribe();
        while self.shared.is_held() {
            tokio::select! {
                changed = rx.changed() => {
                    // The sender lives in `shared`, which we hold: it cannot be gone.
                    if changed.is_err() {
                        return;
                    }
                }
                // Follows the deadline as it moves; `is_held` then marks the lease lost.
                () = self.shared.deadline_passes() => {}
            }
        }
    }
}

impl IntoFuture for LostSignal {
    type Output = ();
    type IntoFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.wait().await })
    }
}
