//! [`RwLock`]: many readers or one writer, each with its own lease, built on the two lease
//! modes every backend already has (no backend code of its own):
//!
//! * A **reader** holds a slot ([`LeaseMode::Slot`]) of the name, with the limit
//!   [`READERS_LIMIT`]; a **writer** holds the name's exclusive lease. The backend contract
//!   already keeps an exclusive lease and slots apart, so a writer never overlaps anyone and
//!   readers overlap each other. Readers and writers draw tokens from the name's one sequence,
//!   so a protected resource can order them.
//! * **Writers are not starved** (policy: *once a writer waits, new readers wait*). A writer
//!   first takes the name's *intent lock* (an exclusive lock named
//!   `<name>` + [`INTENT_SUFFIX`]; writers queue on it), then waits for the readers to drain and
//!   takes the exclusive lease, then releases the intent. A reader's attempt first reads the
//!   intent lock: while a writer holds it the reader is busy. A reader that read the intent
//!   just before a writer took it may still get its slot (the read and the grant are two
//!   steps), so a writer waits at most for the readers that started within one round trip of
//!   its intent, plus the readers already holding — never for a stream of new ones.
//!
//! Both acquire forms run the one acquire loop and return the one guard
//! ([`LockGuard`]): extension, lost signal, release on drop, cancellation safety as for locks.
//! The intent lock is an ordinary lock: [`list`](crate::LockProvider::list) and
//! `mongolock list` show it (as `<name>` followed by U+001F and `writer-intent`) while a
//! writer waits. A finite write's timeout covers both steps, and dropping a write future
//! releases the intent with it.

use std::time::Duration;

use async_trait::async_trait;
use tracing::Instrument;

use crate::acquire_loop::{self, Attempts, AttemptsDone, InFlight, Step};
use crate::backend::{ChangeWaiter, LeaseId, LeaseMode};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lock::{Lock, Timeout};
use crate::wait::WaitStrategy;

/// The slot limit of readers: far above any real number of readers. A
/// [`Semaphore`](crate::Semaphore) on the same name with another limit gets
/// [`Error::LimitMismatch`] while readers hold it.
pub const READERS_LIMIT: u32 = 1 << 30;

/// Appended to a read-write lock's name to name its writers' intent lock.
pub const INTENT_SUFFIX: &str = "\u{1f}writer-intent";

/// A named read-write lock: many readers or one writer at any instant of server time, each
/// with its own lease and [`LockGuard`]; a waiting writer makes new readers wait (see the
/// [module docs](self)). Created with [`LockProvider::rw_lock`](crate::LockProvider::rw_lock).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mongolock::Result<()> {
/// let provider = mongolock::LockProvider::memory();
/// let config = provider.rw_lock("config")?;
/// let r1 = config.read().await?;
/// let r2 = config.read().await?; // readers overlap
/// assert!(config.try_write().await?.is_none()); // a writer waits for them
/// let read_token = r2.fencing_token();
/// r1.release().await?;
/// r2.release().await?;
/// let w = config.write().await?;
/// assert!(w.fencing_token() > read_token); // one token sequence
/// assert!(config.try_read().await?.is_none()); // a writer excludes readers
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    readers: Lock,
    writer: Lock,
    intent: Lock,
}

impl RwLock {
    /// `lock` is the read-write lock's name as a plain lock; `intent` its writers' intent lock.
    pub(crate) fn new(lock: Lock, intent: Lock) -> Self {
        RwLock {
            readers: lock.clone().with_mode(LeaseMode::Slot {
                limit: READERS_LIMIT,
            }),
            writer: lock,
            intent,
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        self.writer.name()
    }

    /// The same lock with another lease duration for readers and writers.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a duration below [`MIN_EXPIRY`](crate::MIN_EXPIRY)
    /// (100 ms) or above one year.
    pub fn with_expiry(self, expiry: Duration) -> Result<Self> {
        Ok(RwLock {
            readers: self.readers.with_expiry(expiry)?,
            writer: self.writer.with_expiry(expiry)?,
            intent: self.intent.with_expiry(expiry)?,
        })
    }

    /// Waits until held for reading (while no writer holds or waits).
    ///
    /// # Errors
    /// A permanent backend error; [`Error::LimitMismatch`] when the name is used as a
    /// [`Semaphore`](crate::Semaphore); [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future never leaves a lease held (as [`Lock::acquire`]).
    pub async fn read(&self) -> Result<LockGuard> {
        loop {
            if let Some(g) = self.read_within(Timeout::Forever).await? {
                return Ok(g);
            }
        }
    }

    /// One attempt to read: `None` while a writer holds or waits.
    ///
    /// # Errors
    /// As [`read`](Self::read), and transient errors without retry.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`read`](Self::read).
    pub async fn try_read(&self) -> Result<Option<LockGuard>> {
        self.read_within(Timeout::Zero).await
    }

    /// Keeps trying to read for `timeout`; `None` when it elapsed.
    ///
    /// # Errors
    /// As [`read`](Self::read); the last transient error when the backend stayed unavailable.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`read`](Self::read).
    pub async fn read_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.read_within(Timeout::from(timeout)).await
    }

    /// The read loop with any [`Timeout`].
    async fn read_within(&self, timeout: Timeout) -> Result<Option<LockGuard>> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime);
        }
        let span = tracing::debug_span!("mongolock.read", lock = %self.name(), ?timeout);
        acquire_loop::run(&ReadAttempts(self), timeout)
            .instrument(span)
            .await
    }

    /// Waits until held for writing: queues behind other writers (holding the intent lock, which
    /// makes new readers wait), then waits for the readers to finish.
    ///
    /// # Errors
    /// A permanent backend error; [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future never leaves a lease held; the intent is released
    /// with it (in the background, as a dropped guard).
    pub async fn write(&self) -> Result<LockGuard> {
        loop {
            if let Some(g) = self.write_within(Timeout::Forever).await? {
                return Ok(g);
            }
        }
    }

    /// One attempt to write: `None` while anyone holds the lock or another writer waits.
    ///
    /// # Errors
    /// As [`write`](Self::write), and transient errors without retry.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`write`](Self::write).
    pub async fn try_write(&self) -> Result<Option<LockGuard>> {
        self.write_within(Timeout::Zero).await
    }

    /// Keeps trying to write for `timeout`; `None` when it elapsed.
    ///
    /// # Errors
    /// As [`write`](Self::write); the last transient error when the backend stayed
    /// unavailable.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`write`](Self::write).
    pub async fn write_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.write_within(Timeout::from(timeout)).await
    }

    /// The write steps with any [`Timeout`]; the budget covers both (intent, then the lock).
    async fn write_within(&self, timeout: Timeout) -> Result<Option<LockGuard>> {
        let started = tokio::time::Instant::now();
        let Some(intent) = self.intent.acquire_within(timeout).await? else {
            return Ok(None);
        };
        let rest = match timeout {
            Timeout::After(d) => Timeout::After(d.saturating_sub(started.elapsed())),
            other => other,
        };
        // Dropping this future here drops `intent`, whose guard releases it.
        let granted = self.writer.acquire_within(rest).await;
        if let Err(e) = intent.release().await {
            tracing::debug!(lock = %self.name(), error = %e, "could not release the writer's intent; it expires by itself");
        }
        granted
    }
}

/// A reader's attempt: busy while a writer holds or waits for the intent lock, else one slot
/// attempt.
struct ReadAttempts<'a>(&'a RwLock);

#[async_trait]
impl Attempts for ReadAttempts<'_> {
    type Granted = LockGuard;

    async fn attempt(&self, lease_id: &LeaseId, in_flight: InFlight) -> Result<Step<LockGuard>> {
        let intent = match self.0.intent.inspect().await {
            Ok(intent) => intent,
            // No lock table yet (PostgreSQL, before its first use): no writer holds the
            // intent, and the slot attempt below creates the table.
            Err(crate::Error::MissingLockTable { .. }) => None,
            Err(e) => return Err(e),
        };
        if intent.is_some_and(|i| i.held) {
            return Ok(Step::Busy {
                holder_expires_at: None,
            });
        }
        self.0.readers.attempt(lease_id, in_flight).await
    }

    fn new_lease_id(&self) -> LeaseId {
        self.0.readers.new_lease_id()
    }

    /// None: readers do not take part in the one-acquirer-per-change wake-ups (a writer's
    /// release must wake every waiting reader, not one); they wait with
    /// [`wait_for_change`](Attempts::wait_for_change), which every change ends.
    fn change_waiter(&self) -> Option<ChangeWaiter> {
        None
    }

    async fn wait_for_change(&self, max_wait: Duration) {
        self.0.readers.wait_for_change(max_wait).await;
    }

    fn abandon(&self, lease_id: LeaseId, after: AttemptsDone) {
        self.0.readers.abandon(lease_id, after);
    }

    fn wait_strategy(&self) -> &WaitStrategy {
        self.0.readers.wait_strategy()
    }

    fn describe(&self) -> String {
        format!("read-write lock {:?} (reading)", self.0.name())
    }
}
