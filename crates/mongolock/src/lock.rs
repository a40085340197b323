//! [`Lock`]: a named lock. Its acquire forms run the shared acquire loop
//! (`acquire_loop.rs`: waiting, backoff, transient retries, cancellation safety, clean-up of
//! attempts with an unknown outcome) with one attempt = one [`LockBackend::try_acquire`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::Instrument;

use crate::acquire_loop::{self, spawn_attempt, Attempts, AttemptsDone, InFlight, Step};
use crate::backend::{
    AcquireRequest, Attempt, ChangeWaiter, LeaseId, LeaseMode, LockBackend, LockBackendExt,
    LockInfo,
};
use crate::clock::Stamp;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::provider::{check_ttl, ProviderInner};
use crate::wait::WaitStrategy;

/// How long one acquire call may wait: what the public forms (`acquire`, `try_acquire`,
/// `acquire_timeout`, and their counterparts on the other lock types) pass to the acquire loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Timeout {
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

/// A named lock. Cheap to clone; creating one sends nothing to the backend.
#[derive(Clone)]
pub struct Lock {
    provider: Arc<ProviderInner>,
    name: Arc<str>,
    expiry: Duration,
    /// Exclusive for a lock; a slot for a [`Semaphore`](crate::Semaphore), which wraps a `Lock`.
    mode: LeaseMode,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("expiry", &self.expiry)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Lock {
    pub(crate) fn new(provider: Arc<ProviderInner>, name: Arc<str>, expiry: Duration) -> Self {
        Lock {
            provider,
            name,
            expiry,
            mode: LeaseMode::Exclusive,
        }
    }

    /// The same lock acquiring leases in `mode` (a semaphore's slots).
    pub(crate) fn with_mode(mut self, mode: LeaseMode) -> Self {
        self.mode = mode;
        self
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lease duration used by this lock's acquisitions and automatic extensions.
    pub fn expiry(&self) -> Duration {
        self.expiry
    }

    /// The same lock with another lease duration (at least [`MIN_EXPIRY`](crate::MIN_EXPIRY),
    /// 100 ms, at most one year), for this
    /// lock's acquisitions and automatic extensions; the provider's
    /// [`expiry`](crate::LockProviderBuilder::expiry) is the default.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> mongolock::Result<()> {
    /// use std::time::Duration;
    /// let provider = mongolock::LockProvider::memory();
    /// let lock = provider.lock("reports:daily")?.with_expiry(Duration::from_secs(120))?;
    /// let guard = lock.try_acquire().await?.expect("free");
    /// assert_eq!(lock.expiry(), Duration::from_secs(120));
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a duration outside those bounds.
    pub fn with_expiry(mut self, expiry: Duration) -> Result<Self> {
        check_ttl("expiry", expiry)?;
        self.expiry = expiry;
        Ok(self)
    }

    /// Waits until the lock is held. Transient backend errors are retried (logged with
    /// `tracing`) for as long as it takes; permanent ones are returned. Drop the future to give
    /// up (for a deadline, see [`acquire_timeout`](Self::acquire_timeout)).
    ///
    /// # Errors
    /// A permanent backend error ([`Error::Backend`], e.g. not authorized), or
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future never leaves a lease held. A grant that arrives after
    /// the drop is released by the attempt (which completes in a task of its own when its future
    /// is dropped half-way), and a grant whose reply was lost is released
    /// in the background (within the release timeout).
    pub async fn acquire(&self) -> Result<LockGuard> {
        loop {
            // With `Forever` the loop only returns `None` if the wait logic is broken; keep
            // trying rather than panic.
            if let Some(guard) = self.acquire_within(Timeout::Forever).await? {
                return Ok(guard);
            }
        }
    }

    /// Exactly one attempt: `Some` if the lock was free, `None` if it is held by someone else.
    ///
    /// # Errors
    /// Any backend error, transient or not, without retry. If the error may have followed a
    /// grant (a lost reply), that lease id is released in the background, so nothing stays
    /// held. [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_within(Timeout::Zero).await
    }

    /// Keeps trying for `timeout`; `None` when it elapsed with the lock still held by someone
    /// else. The last attempt is made at the deadline. If the backend stayed unreachable (or did
    /// not answer) until the deadline, the transient error is returned instead of `None`.
    ///
    /// # Errors
    /// A permanent backend error; the last transient error when the backend stayed unavailable
    /// until the deadline (any grant it may have left is released in the background);
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire_within(Timeout::from(timeout)).await
    }

    /// The acquire loop with any [`Timeout`]: `Zero` is `try_acquire`, `After` is
    /// `acquire_timeout`, `Forever` waits like `acquire` (returning `Some`).
    pub(crate) async fn acquire_within(&self, timeout: Timeout) -> Result<Option<LockGuard>> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime);
        }
        let span = tracing::debug_span!("mongolock.acquire", lock = %self.name, ?timeout);
        acquire_loop::run(self, timeout).instrument(span).await
    }

    /// Reads the current state of this lock; `None` when the backend has no record of it.
    ///
    /// # Errors
    /// The backend's error, without retry: [`Error::Unavailable`] when it cannot be reached,
    /// [`Error::Backend`] when it refuses the read.
    ///
    /// # Cancel safety
    /// Cancel-safe: a read; dropping the future changes nothing.
    pub async fn inspect(&self) -> Result<Option<LockInfo>> {
        self.provider.backend.inspect(&self.name).await
    }
}

#[async_trait]
impl Attempts for Lock {
    type Granted = LockGuard;

    async fn attempt(&self, lease_id: &LeaseId, in_flight: InFlight) -> Result<Step<LockGuard>> {
        let provider = self.provider.clone();
        let req = AcquireRequest {
            name: self.name.to_string(),
            lease_id: lease_id.clone(),
            ttl: self.expiry,
            holder: provider.holder.clone(),
            mode: self.mode,
        };
        let name = self.name.clone();
        spawn_attempt(in_flight, async move {
            // Taken before the request is sent: the lease cannot expire on the server before
            // `sent_at + ttl` (server and local clocks advance at about the same rate).
            let sent_at = Stamp::now();
            Ok(match provider.backend.try_acquire(&req).await? {
                Attempt::Acquired(lease) => Step::Acquired(LockGuard::start(
                    &provider,
                    name,
                    req.lease_id,
                    req.ttl,
                    lease,
                    sent_at,
                )),
                Attempt::Busy { holder_expires_at } => Step::Busy { holder_expires_at },
            })
        })
        .await
    }

    fn new_lease_id(&self) -> LeaseId {
        self.provider.backend.new_lease_id()
    }

    fn change_waiter(&self) -> Option<ChangeWaiter> {
        self.provider.backend.change_waiter(&self.name)
    }

    async fn wait_for_change(&self, max_wait: Duration) {
        self.provider
            .backend
            .wait_for_change(&self.name, max_wait)
            .await;
    }

    fn abandon(&self, lease_id: LeaseId, after: AttemptsDone) {
        let backend: Arc<dyn LockBackend> = self.provider.backend.clone();
        let name = self.name.clone();
        let limit = self.provider.options.release_timeout;
        // Without a runtime (a future dropped during shutdown) the lease expires by itself.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // Sent only after every attempt of the call has landed (acquire_loop.rs).
                after.wait().await;
                match tokio::time::timeout(limit, backend.release(&name, &lease_id)).await {
                    Ok(Ok(released)) => tracing::debug!(lock = %name, %lease_id, released, "released the lease id of an abandoned acquire"),
                    Ok(Err(e)) => tracing::warn!(lock = %name, %lease_id, error = %e, "could not release the lease id of an abandoned acquire; if it was granted, it expires by itself"),
                    Err(_) => tracing::warn!(lock = %name, %lease_id, "the release of an abandoned acquire did not complete within the release timeout; if it was granted, it expires by itself"),
                }
            });
        }
    }

    fn wait_strategy(&self) -> &WaitStrategy {
        &self.provider.options.wait
    }

    fn describe(&self) -> String {
        match self.mode {
            LeaseMode::Slot { limit } => format!("semaphore {:?} (limit {limit})", self.name),
            _ => format!("lock {:?}", self.name),
        }
    }

    fn metrics_label(&self) -> crate::metrics::Label {
        crate::metrics::Label::of(&self.name, &self.provider.options)
    }
}
