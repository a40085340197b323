//! [`Semaphore`]: at most N holders of a name at once, each with its own lease.
//!
//! A semaphore is a [`Lock`] whose requests carry [`LeaseMode::Slot`]: the same acquire loop
//! (`acquire_loop.rs`: waiting, change-notification wake-ups, backoff, transient retries,
//! cancellation safety, clean-up of attempts with an unknown outcome) and the same guard
//! ([`LockGuard`]: automatic extension, lost signal, local deadline, release on drop). Only the
//! backend's single atomic attempt differs; each backend documents its slot path (memory:
//! `backends/memory.rs`; MongoDB: `backends/mongo/slots.rs`; PostgreSQL: the slot statement in
//! `backends/postgres/schema.rs`). The rules every backend follows are in the
//! [backend contract](crate::backend#lease-modes-locks-and-semaphores).

use std::time::Duration;

use crate::backend::{LeaseMode, LockInfo};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lock::Lock;

/// A named counting semaphore: at most [`limit`](Self::limit) holders at any instant of server
/// time. Cheap to clone; creating one sends nothing to the backend. Created with
/// [`LockProvider::semaphore`](crate::LockProvider::semaphore).
///
/// * Each holder gets its own [`LockGuard`]: its own lease, automatic extension, lost signal and
///   release on drop, as for a lock. A crashed holder's slot frees when its lease expires.
/// * Each grant's [fencing token](LockGuard::fencing_token) is strictly larger than every token
///   issued for the name before, across all slots (and across the name's use as a plain
///   [`Lock`]): a protected resource can order the holders' writes.
/// * Every caller of a name must use the same limit while a slot is held; a caller with another
///   limit gets [`Error::LimitMismatch`].
/// * A name used as a [`Lock`] and as a semaphore at once is never shared: a lock holder excludes
///   every slot holder and the other way round (both wait for each other).
///
/// ```
/// use std::time::Duration;
/// use mongolock::LockProvider;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mongolock::Result<()> {
/// let provider = LockProvider::memory();
/// // At most 2 concurrent exports.
/// let exports = provider.semaphore("exports", 2)?;
/// let a = exports.acquire().await?;
/// let b = exports.acquire().await?;
/// // A third caller finds both slots taken.
/// assert!(exports.try_acquire().await?.is_none());
/// assert!(b.fencing_token() > a.fencing_token());
/// a.release().await?;
/// let c = exports.acquire_timeout(Duration::from_secs(5)).await?.expect("a slot is free");
/// assert!(c.fencing_token() > b.fencing_token());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    lock: Lock,
    limit: u32,
}

impl Semaphore {
    /// A semaphore of `limit` slots on `lock`'s name. `limit` must be at least 1.
    pub(crate) fn new(lock: Lock, limit: u32) -> Result<Self> {
        if limit == 0 {
            return Err(Error::invalid_option(
                "limit",
                "a semaphore needs at least 1 slot; use a limit of 1 or more (a limit of 1 \
                 behaves like a lock)",
            ));
        }
        Ok(Semaphore {
            lock: lock.with_mode(LeaseMode::Slot { limit }),
            limit,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The most holders at once.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Lease duration of each slot (acquisitions and automatic extensions).
    pub fn expiry(&self) -> Duration {
        self.lock.expiry()
    }

    /// The same semaphore with another lease duration (at least
    /// [`MIN_EXPIRY`](crate::MIN_EXPIRY), 100 ms, at most one year).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a duration outside those bounds.
    pub fn with_expiry(mut self, expiry: Duration) -> Result<Self> {
        self.lock = self.lock.with_expiry(expiry)?;
        Ok(self)
    }

    /// Waits until a slot is held. Transient backend errors are retried for as long as it
    /// takes. Drop the future to give up (for a deadline, see
    /// [`acquire_timeout`](Self::acquire_timeout)).
    ///
    /// # Errors
    /// [`Error::LimitMismatch`] when the current holders use another limit; a permanent backend
    /// error ([`Error::Backend`]); [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future never leaves a slot held (as [`Lock::acquire`]).
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.lock.acquire().await
    }

    /// Exactly one attempt: `Some` if a slot was free, `None` if all `limit` are held (or the
    /// name is held as a [`Lock`]).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), and any transient error without retry.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.lock.try_acquire().await
    }

    /// Keeps trying for `timeout`; `None` when no slot freed in time.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); the last transient error when the backend stayed
    /// unavailable until the deadline.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.lock.acquire_timeout(timeout).await
    }

    /// Reads the name's current state (`held` is true while any slot is held; the token is the
    /// latest issued); `None` when the backend has no record of it.
    ///
    /// # Errors
    /// A backend error.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn inspect(&self) -> Result<Option<LockInfo>> {
        self.lock.inspect().await
    }
}
