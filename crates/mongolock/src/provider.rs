//! [`LockProvider`]: creates locks by name over one backend, with shared options.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{LockBackend, LockInfo};
use crate::backends::memory::MemoryBackend;
use crate::error::Result;
use crate::holder::HolderInfo;
use crate::lock::Lock;
use crate::options::{validate_name, validate_ttl, LockOptions};
use crate::wait::WaitStrategy;

/// Creates [`Lock`]s by name; cheap to clone (all clones share the backend and options).
///
/// ```
/// # async fn demo() -> mongolock::Result<()> {
/// use std::time::Duration;
/// let provider = mongolock::LockProvider::builder(mongolock::MemoryBackend::new())
///     .expiry(Duration::from_secs(10))
///     .app_name("billing")
///     .build()?;
/// let guard = provider.lock("invoices:2024-06")?.acquire().await?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockProvider {
    pub(crate) inner: Arc<ProviderInner>,
}

pub(crate) struct ProviderInner {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) options: LockOptions,
    pub(crate) holder: HolderInfo,
}

impl std::fmt::Debug for LockProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockProvider")
            .field("options", &self.inner.options)
            .field("holder", &self.inner.holder)
            .finish_non_exhaustive()
    }
}

/// Builds a [`LockProvider`]; see [`LockProvider::builder`]. Validation happens in
/// [`build`](Self::build).
#[must_use]
pub struct LockProviderBuilder {
    backend: Arc<dyn LockBackend>,
    options: LockOptions,
}

impl LockProviderBuilder {
    /// Lease duration of each acquisition (default 30 s; at least
    /// [`MIN_EXPIRY`](crate::MIN_EXPIRY), 100 ms, at most one year). Checked by
    /// [`build`](Self::build): [`Error::InvalidOptions`](crate::Error::InvalidOptions) outside
    /// those bounds.
    pub fn expiry(mut self, expiry: Duration) -> Self {
        self.options.expiry = expiry;
        self
    }

    /// Interval between automatic extensions (default expiry / 3; must be below the expiry).
    /// For leases shorter than this cadence (see [`Lock::with_expiry`],
    /// [`LockGuard::extend`](crate::LockGuard::extend)) the cadence is a third of the lease duration.
    pub fn extension_cadence(mut self, cadence: Duration) -> Self {
        self.options.extension_cadence = Some(cadence);
        self
    }

    /// Whether held leases are extended automatically in the background (default true). Without
    /// it, a lease lasts its expiry unless [`LockGuard::extend`](crate::LockGuard::extend) is called; the lost signal still
    /// fires when it runs out.
    pub fn auto_extend(mut self, enabled: bool) -> Self {
        self.options.auto_extend = enabled;
        self
    }

    /// How acquire waits between attempts while the lock is busy (default: random 10–800 ms).
    pub fn wait_strategy(mut self, strategy: WaitStrategy) -> Self {
        self.options.wait = strategy;
        self
    }

    /// Application name stored with every lease (holder metadata).
    pub fn app_name(mut self, name: impl Into<String>) -> Self {
        self.options.app_name = Some(name.into());
        self
    }

    /// How much earlier than its nominal end a guard stops trusting its lease (default 1 % of
    /// the lease plus 5 ms); see [`DriftMargin`](crate::DriftMargin) for the clock assumption it
    /// encodes.
    pub fn drift_margin(mut self, margin: crate::DriftMargin) -> Self {
        self.options.drift = margin;
        self
    }

    /// The longest a release may take — [`LockGuard::release`](crate::LockGuard::release), the release when a guard is
    /// dropped, and the clean-up of an acquire attempt whose outcome is unknown (default 5 s).
    /// A release that did not complete in time is given up; the lease then expires by itself.
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.options.release_timeout = timeout;
        self
    }

    /// How lock names become the `lock` label of the metrics (feature `metrics`; default: the
    /// name as it is). Map many names to few labels, e.g.
    /// [`MetricsLabels::Prefix(':')`](crate::MetricsLabels::Prefix), when names are many, to
    /// bound the number of time series.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_labels(mut self, labels: crate::MetricsLabels) -> Self {
        self.options.metrics_labels = labels;
        self
    }

    /// Validates the options and builds the provider. Nothing is sent to the backend.
    pub fn build(self) -> Result<LockProvider> {
        self.options.validate()?;
        let holder = HolderInfo::current(self.options.app_name.clone());
        Ok(LockProvider {
            inner: Arc::new(ProviderInner {
                backend: self.backend,
                options: self.options,
                holder,
            }),
        })
    }
}

impl LockProvider {
    /// Starts building a provider over `backend`.
    pub fn builder<B: LockBackend>(backend: B) -> LockProviderBuilder {
        Self::builder_shared(Arc::new(backend))
    }

    /// Starts building a provider over a backend that is already shared.
    pub fn builder_shared(backend: Arc<dyn LockBackend>) -> LockProviderBuilder {
        LockProviderBuilder {
            backend,
            options: LockOptions::default(),
        }
    }

    /// A provider with default options over a fresh [`MemoryBackend`] (locks shared only within
    /// this process; for tests).
    pub fn memory() -> Self {
        let options = LockOptions::default();
        LockProvider {
            inner: Arc::new(ProviderInner {
                backend: Arc::new(MemoryBackend::new()),
                holder: HolderInfo::current(None),
                options,
            }),
        }
    }

    /// A provider with default options over MongoDB: collection `distributed.locks` in `db`,
    /// majority write concern. Use [`MongoBackend::builder`](crate::MongoBackend::builder) and
    /// [`LockProvider::builder`] to configure more.
    #[cfg(feature = "mongodb")]
    pub fn mongodb(db: &mongodb::Database) -> Result<Self> {
        let backend = crate::backends::mongo::MongoBackend::builder(db).build()?;
        LockProvider::builder(backend).build()
    }

    /// A lock on `name` (non-empty, at most [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes).
    /// Creating it sends nothing to the backend.
    pub fn lock(&self, name: impl Into<String>) -> Result<Lock> {
        let name = name.into();
        validate_name(&name)?;
        Ok(Lock::new(
            self.inner.clone(),
            name.into(),
            self.inner.options.expiry,
        ))
    }

    /// A [`Semaphore`](crate::Semaphore) named `name` with `limit` slots (sends nothing). Every
    /// process using the name must use the same limit.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name;
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for a limit of 0.
    pub fn semaphore(&self, name: impl Into<String>, limit: u32) -> Result<crate::Semaphore> {
        crate::Semaphore::new(self.lock(name)?, limit)
    }

    /// A [`RwLock`](crate::RwLock) named `name` (sends nothing): many readers or one writer.
    /// Its writers' intent lock is the lock `name` + [`INTENT_SUFFIX`](crate::rwlock::INTENT_SUFFIX).
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name (including one too long
    /// for the intent lock's name).
    pub fn rw_lock(&self, name: impl Into<String>) -> Result<crate::RwLock> {
        let name = name.into();
        let intent = self.lock(format!("{name}{}", crate::rwlock::INTENT_SUFFIX))?;
        Ok(crate::RwLock::new(self.lock(name)?, intent))
    }

    /// Reads the state of `name`; `None` when the backend has no record of it. Creates and
    /// alters nothing.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name (nothing is sent); the
    /// backend's error, without retry: [`Error::Unavailable`](crate::Error::Unavailable) when it
    /// cannot be reached, [`Error::Backend`](crate::Error::Backend) when it refuses the read,
    /// [`Error::ForeignCollection`](crate::Error::ForeignCollection) when the lock collection
    /// or table holds data that is not mongolock's,
    /// [`Error::MissingLockTable`](crate::Error::MissingLockTable) when the PostgreSQL lock
    /// table does not exist yet (MongoDB: a collection that does not exist reads as empty).
    ///
    /// # Cancel safety
    /// Cancel-safe: a read; dropping the future changes nothing.
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        self.inner.backend.inspect(name).await
    }

    /// Reads every lock in the backend, sorted by name. Creates and alters nothing.
    ///
    /// # Errors
    /// The backend's error, without retry: [`Error::Unavailable`](crate::Error::Unavailable)
    /// when it cannot be reached, [`Error::Backend`](crate::Error::Backend) when it refuses the
    /// read, [`Error::ForeignCollection`](crate::Error::ForeignCollection) and
    /// [`Error::MissingLockTable`](crate::Error::MissingLockTable) as for
    /// [`inspect`](Self::inspect).
    ///
    /// # Cancel safety
    /// Cancel-safe: a read; dropping the future changes nothing.
    pub async fn list(&self) -> Result<Vec<LockInfo>> {
        self.inner.backend.list().await
    }

    /// Every current holder of `name` (see [`LockBackend::holders`]): the exclusive lease's
    /// holder, or every slot holder of a semaphore or reader of a read-write lock.
    ///
    /// # Errors
    /// A backend error; [`Error::InvalidName`](crate::Error::InvalidName) for a bad name.
    pub async fn holders(&self, name: &str) -> Result<Vec<crate::backend::LeaseHolder>> {
        validate_name(name)?;
        self.inner.backend.holders(name).await
    }

    /// Ends whatever lease holds `name` (an operator action, e.g. after a stuck holder); the
    /// holder's guard reports the loss at its next extension. Returns whether a lease was ended.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name (nothing is sent); the
    /// backend's error, without retry: [`Error::Unavailable`](crate::Error::Unavailable) when it
    /// cannot be reached (the lease may or may not have been ended),
    /// [`Error::Backend`](crate::Error::Backend) when it refuses the write.
    ///
    /// # Cancel safety
    /// One write: dropping the future after the request was sent may still end the lease.
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        validate_name(name)?;
        self.inner.backend.force_release(name).await
    }

    /// Waits until the backend has sent what it started in the background for acquire calls
    /// that gave up, or `max_wait` passed; true when nothing is left.
    ///
    /// When the last acquirer of a name in this process stops waiting without the lock — its
    /// `acquire_timeout` ran out, its future was dropped, it failed — the MongoDB and
    /// PostgreSQL backends take the process out of the lock's handoff queue in the background,
    /// so that the next release does not designate a process that no longer waits. A process
    /// that exits right after such a call (a command-line tool, a cron job) calls this first;
    /// otherwise its entry stays queued until two seconds after the holder's expiry (the live
    /// waiters behind it still get the name within about a second). Releases of dropped guards
    /// are not covered: release a guard with [`LockGuard::release`](crate::LockGuard::release)
    /// before exiting.
    ///
    /// # Errors
    /// None: a failed withdrawal is logged at debug level (the entry ends by itself).
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits; the work goes on.
    pub async fn flush(&self, max_wait: Duration) -> bool {
        match self.inner.backend.notifications() {
            Some(n) => n.flush(max_wait).await,
            None => true,
        }
    }

    /// The provider's options.
    pub fn options(&self) -> &LockOptions {
        &self.inner.options
    }

    /// The metadata stored with this provider's leases.
    pub fn holder(&self) -> &HolderInfo {
        &self.inner.holder
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.inner.backend
    }
}

/// Checks a lease duration passed to an API call.
pub(crate) fn check_ttl(option: &'static str, ttl: Duration) -> Result<()> {
    validate_ttl(option, ttl)
}
