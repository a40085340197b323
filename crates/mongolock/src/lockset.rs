//! [`LockSet`]: several named locks held together, all or nothing, without deadlock.
//!
//! # One global order
//! A set is kept sorted by name (the byte order of the names' UTF-8, `str`'s `Ord`), without
//! duplicates, and is always acquired in that order: one name after the other, each with the
//! lock's own acquire loop (waiting, wake-ups, backoff, transient retries, cancellation safety).
//! The order depends on the names only, so it is the same in every process, on every host, for
//! every set that shares a name.
//!
//! # Holding while waiting, and why it cannot deadlock
//! While a set waits for its `k`-th name, it holds the names before it; their guards keep
//! extending them as usual (so a long wait never lets them expire). This is ordered two-phase
//! locking: a caller only ever waits for a name that sorts after every name it holds. A cycle of
//! waiters (A holds `x` and waits for `y` while B holds `y` and waits for `x`) would need one of
//! them to wait for a name that sorts before one it holds, so no cycle, hence no deadlock, can
//! form among sets — however many callers, and in whatever order their names were written.
//! The price is that the held names are unavailable to others meanwhile.
//!
//! The order protects sets from each other. A caller that holds some other lock (a
//! [`LockGuard`] from [`Lock::acquire`]) while it acquires a set steps outside the order; do
//! that only with a lock whose name sorts before every name of the set, or not at all.
//!
//! # All or nothing
//! [`LockSet::acquire`] (and `try_acquire`, `acquire_timeout`) returns a [`LockSetGuard`]
//! holding every name, or nothing: when a
//! name stays busy until the timeout, or an error ends the call, the names taken so far are
//! released before the call returns (each release bounded by the
//! [release timeout](crate::LockProviderBuilder::release_timeout); one that fails leaves that
//! lease to expire by itself). When a held name is lost while the set waits for a later one
//! (force-released, or not renewed in time), the set releases what it holds and starts again
//! from its first name, within the same timeout. The guard returned holds unlost leases on
//! every name.
//!
//! # Cancellation
//! Dropping an acquire future drops the guards taken so far, whose `Drop` releases them in the
//! background (as any [`LockGuard`]'s), and the acquire of the name in progress, which is
//! cancel-safe on its own: nothing stays held with nobody to release or extend it.
//!
//! # Semaphores and read-write locks
//! A set holds exclusive locks only. Semaphore slots and read-write locks do not join a set: take
//! them separately. An exclusive lock excludes every slot holder and reader of the same name,
//! as always.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures_util::future::{join_all, select_all};
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::guard::{LockGuard, LossReason, LostSignal};
use crate::lock::{Lock, Timeout};
use crate::provider::LockProvider;

impl LockProvider {
    /// A [`LockSet`] on `names`, to be held all together (sends nothing). The names are sorted
    /// and duplicates removed: a set holds each name once, and always takes its names in this
    /// one global order, so that sets never deadlock each other.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name; [`Error::InvalidOptions`] (option `names`) when
    /// `names` is empty.
    pub fn lock_set<I, S>(&self, names: I) -> Result<LockSet>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut names: Vec<String> = names.into_iter().map(Into::into).collect();
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            return Err(Error::invalid_option(
                "names",
                "a lock set needs at least one name; pass the names of the locks to hold together",
            ));
        }
        let locks = names
            .into_iter()
            .map(|name| self.lock(name))
            .collect::<Result<Vec<_>>>()?;
        Ok(LockSet { locks })
    }
}

/// Several named locks held together: all or nothing, in one global order (sorted by name), so
/// that sets taken by many callers in any order never deadlock. Cheap to clone; creating one
/// sends nothing. Created with [`LockProvider::lock_set`]; see the [module docs](self) for the
/// order, holding while waiting, and cancellation.
///
/// Holds exclusive locks only: semaphores and read-write locks do not join a set.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mongolock::Result<()> {
/// use std::time::Duration;
/// let provider = mongolock::LockProvider::memory();
/// // Written in any order; taken as "account:1", then "account:2".
/// let transfer = provider.lock_set(["account:2", "account:1"])?;
/// let both = transfer.acquire().await?;
/// assert_eq!(both.names().collect::<Vec<_>>(), ["account:1", "account:2"]);
/// let token = both.fencing_token("account:2").expect("in the set");
///
/// // Another set sharing a name takes "account:0", waits for "account:2" (here: gives up
/// // after 50 ms), and holds nothing after.
/// let other = provider.lock_set(["account:2", "account:0"])?;
/// assert!(other.acquire_timeout(Duration::from_millis(50)).await?.is_none());
/// assert!(!provider.inspect("account:0").await?.expect("it was taken").held);
///
/// tokio::select! {
///     _ = both.lost() => eprintln!("a lease of the set was lost; stop"),
///     _ = tokio::time::sleep(Duration::from_millis(10)) => { /* work, passing the tokens */ }
/// }
/// both.release().await?;
/// let again = other.acquire().await?;
/// assert!(again.fencing_token("account:2").expect("in the set") > token);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockSet {
    /// Sorted by name, no duplicates, not empty.
    locks: Vec<Lock>,
}

impl std::fmt::Debug for LockSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockSet")
            .field("names", &self.names().collect::<Vec<_>>())
            .field("expiry", &self.expiry())
            .finish_non_exhaustive()
    }
}

impl LockSet {
    /// The names, in the order they are acquired (sorted, without duplicates).
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.locks.iter().map(Lock::name)
    }

    /// Lease duration of every lease of the set.
    pub fn expiry(&self) -> Duration {
        self.locks.first().map_or(Duration::ZERO, Lock::expiry)
    }

    /// The same set with another lease duration (at least [`MIN_EXPIRY`](crate::MIN_EXPIRY),
    /// 100 ms, at most one year).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a duration out of range.
    pub fn with_expiry(self, expiry: Duration) -> Result<Self> {
        let locks = self
            .locks
            .into_iter()
            .map(|lock| lock.with_expiry(expiry))
            .collect::<Result<Vec<_>>>()?;
        Ok(LockSet { locks })
    }

    /// Waits until every name is held. Transient backend errors are retried for as long as it
    /// takes; drop the future to give up.
    ///
    /// # Errors
    /// A permanent backend error ([`Error::Backend`]) for any name, after the names already
    /// taken were released; [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future never leaves a lease held. The guards of the names
    /// already taken are dropped, which releases them in the background, and the acquire of the
    /// name in progress is cancel-safe as [`Lock::acquire`].
    pub async fn acquire(&self) -> Result<LockSetGuard> {
        loop {
            // With `Forever` only a broken wait logic returns `None`; keep trying.
            if let Some(guard) = self.acquire_within(Timeout::Forever).await? {
                return Ok(guard);
            }
        }
    }

    /// One attempt per name, in order: `Some` if every name was free, else `None` with nothing
    /// held (the names taken before the busy one are released before it returns).
    ///
    /// # Errors
    /// Any backend error, without retry, after the names already taken were released;
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockSetGuard>> {
        self.acquire_within(Timeout::Zero).await
    }

    /// Keeps trying for `timeout`, which bounds the whole set; `None` when it elapsed with a
    /// name still held by someone else, with nothing held (the names taken are released before
    /// it returns). A name reached after the deadline gets one attempt.
    ///
    /// # Errors
    /// A permanent backend error; the last transient error when the backend stayed unavailable
    /// until the deadline; [`Error::NoRuntime`] outside a Tokio runtime. The names already taken
    /// are released first.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<LockSetGuard>> {
        self.acquire_within(Timeout::from(timeout)).await
    }

    /// The acquisition with any [`Timeout`], which bounds the whole set.
    async fn acquire_within(&self, timeout: Timeout) -> Result<Option<LockSetGuard>> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime);
        }
        let span = tracing::debug_span!(
            "mongolock.acquire_set",
            locks = %self.names().collect::<Vec<_>>().join(","),
            ?timeout
        );
        self.run(timeout).instrument(span).await
    }

    /// The acquisition: the names in order, starting again when a held one is lost.
    async fn run(&self, timeout: Timeout) -> Result<Option<LockSetGuard>> {
        let deadline = match timeout {
            Timeout::After(d) => Some(Instant::now() + d),
            _ => None,
        };
        loop {
            // Dropped with this future on cancellation: each guard releases its lease.
            let mut held: Vec<LockGuard> = Vec::with_capacity(self.locks.len());
            let mut restart = false;
            for lock in &self.locks {
                let step = match deadline {
                    Some(at) => Timeout::from(at.saturating_duration_since(Instant::now())),
                    None => timeout,
                };
                let outcome = tokio::select! {
                    r = lock.acquire_within(step) => Some(r),
                    () = any_lost(&held) => None,
                };
                match outcome {
                    Some(Ok(Some(guard))) => held.push(guard),
                    Some(Ok(None)) => {
                        tracing::debug!(lock = %lock.name(), "a name of the set stayed busy; releasing the names taken");
                        release_taken(held).await;
                        return Ok(None);
                    }
                    Some(Err(e)) => {
                        release_taken(held).await;
                        return Err(e);
                    }
                    None => {
                        restart = true;
                        break;
                    }
                }
            }
            if !restart && !held.iter().any(LockGuard::is_lost) {
                tracing::debug!("lock set acquired");
                return Ok(Some(LockSetGuard { guards: held }));
            }
            if let Some(lost) = held.iter().find(|g| g.is_lost()) {
                tracing::warn!(
                    lock = %lost.name(),
                    reason = %lost.lost_reason().map(|r| r.to_string()).unwrap_or_default(),
                    "a name of the set was lost while the set was being acquired; releasing the \
                     others and starting again"
                );
            }
            release_taken(held).await;
            if timeout == Timeout::Zero {
                return Ok(None);
            }
        }
    }
}

/// Completes when any of `held` is lost (never while none is).
async fn any_lost(held: &[LockGuard]) {
    if held.is_empty() {
        return std::future::pending().await;
    }
    select_all(held.iter().map(|g| g.lost().into_future())).await;
}

/// Releases the names a failed acquisition took, all at once; each release is bounded by the
/// release timeout and cancel-safe. Failures are only logged: the lease then expires by itself.
async fn release_taken(held: Vec<LockGuard>) {
    for (name, result) in release_all(held).await {
        if let Err(e) = result {
            tracing::debug!(lock = %name, error = %e, "could not release a name of an unfinished lock set; its lease expires by itself");
        }
    }
}

/// Releases every guard at once; the results in the guards' order, with their names.
async fn release_all(guards: Vec<LockGuard>) -> Vec<(String, Result<()>)> {
    let names: Vec<String> = guards.iter().map(|g| g.name().to_owned()).collect();
    let results = join_all(guards.into_iter().map(LockGuard::release)).await;
    names.into_iter().zip(results).collect()
}

/// Every lease of a [`LockSet`], held together; one [`LockGuard`] per name, in the set's order.
///
/// * Each name has its own lease, its own [fencing token](Self::fencing_token) (pass each to
///   the resource it protects) and its own automatic extension.
/// * [`lost`](Self::lost) fires when *any* lease of the set is lost: the set as a whole can no
///   longer be trusted.
/// * [`release`](Self::release) ends every lease and reports a lost one as the error; dropping
///   the guard releases every lease in the background instead.
#[must_use = "dropping the guard releases every lock of the set at once"]
pub struct LockSetGuard {
    /// Sorted by name, as the set.
    guards: Vec<LockGuard>,
}

impl std::fmt::Debug for LockSetGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockSetGuard")
            .field("guards", &self.guards)
            .finish()
    }
}

impl LockSetGuard {
    /// The guards, one per name, sorted by name.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The guards, one per name, sorted by name, for use on their own (each releases its lease
    /// when dropped).
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }

    /// The names, sorted.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.guards.iter().map(LockGuard::name)
    }

    /// The guard of `name`, if it is in the set.
    pub fn get(&self, name: &str) -> Option<&LockGuard> {
        self.guards
            .binary_search_by(|g| g.name().cmp(name))
            .ok()
            .map(|i| &self.guards[i])
    }

    /// The fencing token of `name`'s lease, if it is in the set: strictly larger than every
    /// token issued for that name before.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.get(name).map(LockGuard::fencing_token)
    }

    /// Every name with its fencing token, sorted by name.
    pub fn fencing_tokens(&self) -> impl ExactSizeIterator<Item = (&str, u64)> + '_ {
        self.guards.iter().map(|g| (g.name(), g.fencing_token()))
    }

    /// The earliest server expiry of the set's leases (as last reported).
    pub fn expires_at(&self) -> SystemTime {
        self.guards
            .iter()
            .map(LockGuard::expires_at)
            .min()
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// The earliest local deadline of the set's leases (see [`LockGuard::local_deadline`]): the
    /// set is trusted until then at most.
    pub fn local_deadline(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::local_deadline)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// The earliest local deadline on the boot clock (for the CLI's supervisor; not
    /// API-stable).
    #[doc(hidden)]
    pub fn __local_deadline_boot(&self) -> Duration {
        self.guards
            .iter()
            .map(LockGuard::__local_deadline_boot)
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// A signal that completes when any lease of the set is lost (or the guard is released or
    /// dropped), at the earliest local deadline at the latest. Cloneable and cancel-safe.
    pub fn lost(&self) -> LockSetLostSignal {
        LockSetLostSignal {
            signals: self.guards.iter().map(LockGuard::lost).collect(),
        }
    }

    /// Whether any lease of the set has been lost (non-blocking; as [`LockGuard::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Which lease was lost (its name) and why, once one is (the first in the set's order);
    /// `None` while every lease is held or after a normal release.
    pub fn lost_reason(&self) -> Option<(&str, LossReason)> {
        self.guards
            .iter()
            .find_map(|g| g.lost_reason().map(|r| (g.name(), r)))
    }

    /// Extends every lease to server now + `ttl` (see [`LockGuard::extend`]), all at once.
    /// `Ok(false)` when any lease had already expired or been taken.
    ///
    /// # Errors
    /// The first error of any lease's extension, as [`LockGuard::extend`].
    ///
    /// # Cancel safety
    /// As [`LockGuard::extend`], for each lease.
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        let results = join_all(self.guards.iter().map(|g| g.extend(ttl))).await;
        let mut all = true;
        for result in results {
            all &= result?;
        }
        Ok(all)
    }

    /// Releases every lease, all at once.
    ///
    /// # Errors
    /// * [`Error::LeaseLost`] naming a lease that someone else ended or took before the release
    ///   (the first such name in the set's order): work done under the set may have overlapped
    ///   another holder of that name. The other leases were released all the same.
    /// * Otherwise the first other error (a transient one when the backend could not be reached
    ///   within the release timeout; that lease then expires by itself).
    ///
    /// # Cancel safety
    /// Dropping this future half-way still ends every lease, within the release timeout (as
    /// [`LockGuard::release`]).
    pub async fn release(self) -> Result<()> {
        let mut lost = None;
        let mut other = None;
        for (name, result) in release_all(self.guards).await {
            match result {
                Ok(()) => {}
                Err(e @ Error::LeaseLost { .. }) => {
                    if lost.is_none() {
                        lost = Some(e);
                    } else {
                        tracing::debug!(lock = %name, "another lease of the set was lost too");
                    }
                }
                Err(e) => {
                    if other.is_none() {
                        other = Some(e);
                    } else {
                        tracing::warn!(lock = %name, error = %e, "could not release a lease of the set; it expires by itself");
                    }
                }
            }
        }
        match lost.or(other) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Completes when any lease of a [`LockSetGuard`] is lost, released or its guard dropped.
/// Obtained from [`LockSetGuard::lost`]; cloneable and cancel-safe.
#[derive(Clone)]
pub struct LockSetLostSignal {
    signals: Vec<LostSignal>,
}

impl std::fmt::Debug for LockSetLostSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockSetLostSignal")
            .field("signals", &self.signals)
            .finish()
    }
}

impl LockSetLostSignal {
    /// Whether any lease of the set has been lost.
    pub fn is_lost(&self) -> bool {
        self.signals.iter().any(LostSignal::is_lost)
    }

    /// Which lease was lost (its name) and why, once one is (the first in the set's order).
    pub fn reason(&self) -> Option<(&str, LossReason)> {
        self.signals
            .iter()
            .find_map(|s| s.reason().map(|r| (s.name(), r)))
    }

    /// Waits until any lease of the set is lost, released or its guard dropped; at the earliest
    /// local deadline at the latest (see [`LostSignal::wait`]).
    ///
    /// # Errors
    /// None: it only completes.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only observes the leases.
    pub async fn wait(&self) {
        if self.signals.is_empty() {
            return;
        }
        select_all(self.signals.iter().map(|s| s.clone().into_future())).await;
    }
}

impl IntoFuture for LockSetLostSignal {
    type Output = ();
    type IntoFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.wait().await })
    }
}
