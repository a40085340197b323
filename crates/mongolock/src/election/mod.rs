//! Leader election: one process at a time holds a named *role*; the others keep trying.
//!
//! # One mechanism
//! Leadership **is** a lease on a lock named after the role, and the **term is that lease's
//! fencing token**. Everything the lock guarantees carries over unchanged:
//!
//! * at most one leader per role at any instant of server time (mutual exclusion per lease);
//! * every term is strictly larger than every earlier term of the role, across resignation,
//!   expiry and crashes (fencing tokens only grow) — pass it to the resources the leader writes
//!   to, so that they can refuse a deposed leader;
//! * the lease is extended in the background; the [`Leadership::lost`] signal fires when it can no
//!   longer be trusted (locally *before* the server lets anybody else in, as far as clocks allow);
//! * a crashed leader is replaced once its lease expires;
//! * campaigning waits with the lock's acquire loop, so it uses the provider's
//!   [`WaitStrategy`](crate::WaitStrategy) and whatever wake-ups the backend offers; dropping a
//!   campaign future leaves nothing held.
//!
//! The lock name is the role name itself: `mongolock inspect <role>` or
//! [`LockProvider::inspect`](crate::LockProvider::inspect) shows the leader, and the lease
//! duration is the provider's expiry unless [`Election::with_expiry`] says otherwise.
//!
//! # Three ways to use it
//! An election comes from [`LockProvider::election`](crate::LockProvider::election).
//! * **By hand:** [`Election::campaign`] waits until elected and returns a [`Leadership`]
//!   (term, lost signal, [`resign`](Leadership::resign); dropping it resigns in the background).
//! * **The run loop:** [`Election::run_until`] campaigns, runs your async function while leader,
//!   cancels it when leadership is lost, and campaigns again, until your shutdown future
//!   completes (or the run future is dropped). See its docs for the exact semantics.
//! * **Observing:** [`Election::leader`] reads the current leader (host, pid, application name,
//!   term, since when, until when) without campaigning; [`Election::watch_leader`] is a stream of
//!   leader changes. [`Election::events`] is a stream of this process's own
//!   elected / lost / resigned events.
//!
//! ```
//! use std::time::Duration;
//! use mongolock::election::ElectionEvent;
//! use mongolock::{LockProvider, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mongolock::Result<()> {
//! // With MongoDB: `LockProvider::mongodb(&client.database("app"))?`.
//! let provider = LockProvider::builder(MemoryBackend::new())
//!     .expiry(Duration::from_secs(10))
//!     .app_name("scheduler")
//!     .build()?;
//! let election = provider.election("scheduler")?;
//! let mut events = election.events();
//!
//! // Run the scheduler while leader; stop when `stop` fires.
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let runner = {
//!     let election = election.clone();
//!     tokio::spawn(async move {
//!         election
//!             .run_until(
//!                 |leader| async move {
//!                     println!("leading {} in term {}", leader.role(), leader.term());
//!                     // The work; it is cancelled (dropped) if leadership is lost. Pass
//!                     // `leader.term()` to what you write to, as a fencing token.
//!                     std::future::pending::<()>().await
//!                 },
//!                 async move {
//!                     let _ = stopped.await;
//!                 },
//!             )
//!             .await
//!     })
//! };
//!
//! let Some(ElectionEvent::Elected { term }) = events.recv().await else { unreachable!() };
//!
//! // Anyone can see who leads, without campaigning.
//! let leader = election.leader().await?.expect("someone leads");
//! assert_eq!(leader.term, term);
//! assert_eq!(leader.holder.as_ref().map(|h| h.pid), Some(std::process::id()));
//!
//! // Stopping resigns at once, so another candidate can take over.
//! let _ = stop.send(());
//! runner.await.expect("the run loop did not panic")?;
//! assert_eq!(events.recv().await, Some(ElectionEvent::Resigned { term }));
//! assert!(election.leader().await?.is_none());
//! # Ok(())
//! # }
//! ```

mod events;
mod leadership;
mod observe;
mod run;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::error::{Error, Result};
use crate::lock::{Lock, Timeout};
use crate::provider::LockProvider;

pub use events::{ElectionEvent, ElectionEvents};
pub use leadership::Leadership;
pub use observe::{LeaderInfo, LeaderWatch};
pub use run::LeaderContext;

impl LockProvider {
    /// An [`Election`] for `role` over this provider's backend and options (sends nothing).
    /// The role is the lock name (same rules: non-empty, at most
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes); leadership is a lease on it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> mongolock::Result<()> {
    /// let provider = mongolock::LockProvider::memory();
    /// let election = provider.election("scheduler")?;
    /// let leadership = election.campaign().await?;
    /// assert!(election.try_campaign().await?.is_none()); // one leader at a time
    /// leadership.resign().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad role name.
    pub fn election(&self, role: impl Into<String>) -> Result<Election> {
        Election::new(self, role)
    }
}

/// Default interval at which [`Election::watch_leader`] re-reads the role (1 s).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How many events an [`ElectionEvents`] receiver may fall behind before it misses some.
const EVENT_CAPACITY: usize = 64;

/// A role that candidates campaign for. Cheap to clone; clones share the event stream.
///
/// Creating one sends nothing to the backend. See the [module docs](self).
#[derive(Clone)]
pub struct Election {
    provider: LockProvider,
    lock: Lock,
    role: Arc<str>,
    events: broadcast::Sender<ElectionEvent>,
    poll_interval: Duration,
    rejoin_delay: Duration,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("role", &self.role)
            .field("expiry", &self.lock.expiry())
            .field("poll_interval", &self.poll_interval)
            .field("rejoin_delay", &self.rejoin_delay)
            .finish_non_exhaustive()
    }
}

impl Election {
    /// An election for `role` over `provider`'s backend and options; see
    /// [`LockProvider::election`].
    pub(crate) fn new(provider: &LockProvider, role: impl Into<String>) -> Result<Self> {
        let role: String = role.into();
        let lock = provider.lock(role.clone())?;
        Ok(Election {
            provider: provider.clone(),
            lock,
            role: role.into(),
            events: broadcast::channel(EVENT_CAPACITY).0,
            poll_interval: DEFAULT_POLL_INTERVAL,
            rejoin_delay: Duration::ZERO,
        })
    }

    /// The same election with another lease duration for leadership (default: the provider's
    /// expiry). A crashed leader is replaced after at most this long; it is extended every
    /// third of it (or the provider's extension cadence, when shorter).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a duration below [`MIN_EXPIRY`](crate::MIN_EXPIRY)
    /// (100 ms) or above one year.
    pub fn with_expiry(mut self, expiry: Duration) -> Result<Self> {
        self.lock = self.lock.with_expiry(expiry)?;
        Ok(self)
    }

    /// How often [`watch_leader`](Self::watch_leader) re-reads the role when the backend reports
    /// no change earlier (default [`DEFAULT_POLL_INTERVAL`]; at least 1 ms).
    pub fn with_poll_interval(mut self, interval: Duration) -> Result<Self> {
        if interval < Duration::from_millis(1) {
            return Err(Error::invalid_option(
                "poll_interval",
                format!(
                    "the leader poll interval {interval:?} is below 1 ms; choose a positive \
                     interval such as 1 s (the default)"
                ),
            ));
        }
        self.poll_interval = interval;
        Ok(self)
    }

    /// How long [`run_until`](Self::run_until) waits before campaigning again after the user's
    /// function returned and leadership was resigned (default zero). A pause gives the other
    /// candidates a head start, so that returning from the function actually hands leadership
    /// over instead of this process usually winning it straight back.
    pub fn with_rejoin_delay(mut self, delay: Duration) -> Self {
        self.rejoin_delay = delay;
        self
    }

    /// The role name (also the lock name).
    pub fn role(&self) -> &str {
        &self.role
    }

    /// The lease duration of leadership.
    pub fn expiry(&self) -> Duration {
        self.lock.expiry()
    }

    /// See [`with_poll_interval`](Self::with_poll_interval).
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// See [`with_rejoin_delay`](Self::with_rejoin_delay).
    pub fn rejoin_delay(&self) -> Duration {
        self.rejoin_delay
    }

    /// The provider the election runs on.
    pub fn provider(&self) -> &LockProvider {
        &self.provider
    }

    /// Waits until elected. Transient backend errors are retried for as long as it takes;
    /// permanent ones are returned. Drop the future to stop campaigning: nothing is left held.
    ///
    /// Emits [`ElectionEvent::Elected`].
    ///
    /// # Errors
    /// A permanent backend error ([`Error::Backend`], e.g. not authorized);
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`Lock::acquire`]: dropping the future leaves nothing held and emits no
    /// event.
    pub async fn campaign(&self) -> Result<Leadership> {
        let guard = self.lock.acquire().await?;
        Ok(Leadership::start(
            guard,
            self.role.clone(),
            self.events.clone(),
        ))
    }

    /// One attempt: `Some` when the role was free and is now ours, `None` when another candidate
    /// leads.
    ///
    /// # Errors
    /// Any backend error, without retry (a grant it may have left is released in the
    /// background); [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`campaign`](Self::campaign).
    pub async fn try_campaign(&self) -> Result<Option<Leadership>> {
        self.campaign_with(Timeout::Zero).await
    }

    /// Campaigns for at most `timeout`; `None` when another candidate still leads then.
    ///
    /// # Errors
    /// A permanent backend error; the last transient one when the backend stayed unavailable
    /// until the deadline; [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`campaign`](Self::campaign).
    pub async fn campaign_timeout(&self, timeout: Duration) -> Result<Option<Leadership>> {
        self.campaign_with(Timeout::from(timeout)).await
    }

    async fn campaign_with(&self, timeout: Timeout) -> Result<Option<Leadership>> {
        let guard = self.lock.acquire_within(timeout).await?;
        Ok(guard.map(|g| Leadership::start(g, self.role.clone(), self.events.clone())))
    }

    /// This process's election events (elected, lost, resigned) from now on, for every
    /// [`Leadership`] obtained through this election or its clones (including those of
    /// [`run_until`](Self::run_until)).
    pub fn events(&self) -> ElectionEvents {
        ElectionEvents::new(self.events.subscribe())
    }
}
