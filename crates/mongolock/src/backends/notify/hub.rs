//! Per-name wake-ups for backends that learn of changes as they happen (the memory backend from
//! its own writes, MongoDB and PostgreSQL from the feed of their notifier, `backends/notify/`).
//!
//! A [`Hub`] keeps a registry `name → NameState` holding, for one lock name:
//!
//! * `turn`: a [`Notify`] for acquirers. Each change calls `notify_one`, which wakes the
//!   longest-waiting registered acquirer (or, when none is registered, stores one permit for the
//!   next). Acquirers register *before* their attempt ([`Hub::change_waiter`]), so a change that
//!   happens during the attempt wakes them as soon as they wait. This is the no-stampede rule:
//!   per process, one acquirer retries per change; a woken acquirer whose attempt fails passes
//!   the wake-up on, and one that is dropped after being woken passes it on as well (tokio's
//!   `Notify` forwards an unconsumed `notify_one`).
//! * `all`: a [`Notify`] for observers ([`Hub::wait_for_change`]); every one is woken.
//! * `changes`: a [`watch`] of the latest change (with a hub-wide sequence number), for holders
//!   that want to know whether their lease is gone. Coalescing is safe: once a lease id has
//!   lost a name it never gets it back, so the latest change decides.
//!
//! When the last acquirer of a name stops waiting while the backend's mark may be in the
//! name's cross-process handoff queue, the hub has the backend withdraw it
//! ([`Hub::set_withdraw`], `Hub::withdraw_later`; `handoff.rs`).
//!
//! Entries are reference counted by [`NameRef`] handles and removed when the last one is
//! dropped, so the registry holds only names somebody in this process waits on or holds (it
//! scales to thousands of names). Dispatching a change to a name nobody watches is one hash
//! lookup.
//!
//! # Coverage
//! A feed may deliver the changes of some names only (MongoDB's narrowed change stream,
//! PostgreSQL's bucket channels): the
//! hub records which names the open feed covers (every name unless a feed says otherwise) and
//! an acquirer is [live](ChangeWaiter::is_live) only when the feed is live and covers its name.
//! How a narrowed feed is widened without losing a wake-up is in `coverage.rs` (MongoDB,
//! PostgreSQL).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::backend::ChangeWaiter;

/// What one change tells about a name's lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing observed yet.
    Nothing,
    /// After the change the name is held by `lease_id` (`None`: no lease), with `token` when the
    /// change reported it.
    Lease {
        lease_id: Option<String>,
        token: Option<u64>,
    },
    /// Something happened that the event does not describe (a delete, a dropped collection):
    /// whoever cares must read the lock again.
    Unknown,
}

/// A [`Change::Lease`] (for tests).
#[cfg(test)]
pub(crate) fn lease(id: Option<&str>, token: Option<u64>) -> Change {
    Change::Lease {
        lease_id: id.map(str::to_owned),
        token,
    }
}

/// Notification state of a hub (one per backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Status {
    /// No change stream yet; started on first need.
    Idle = 0,
    /// Opening (or re-opening from scratch): changes are not delivered yet.
    Opening = 1,
    /// Every change is delivered.
    Live = 2,
    /// The stream broke and is being resumed from its resume token: changes meanwhile are
    /// delivered once it resumes.
    Resuming = 3,
    /// Notifications are not available (standalone server, permissions, old version): poll;
    /// the feed's task tries again every minute.
    Unavailable = 4,
}

impl Status {
    fn from_u8(v: u8) -> Status {
        match v {
            1 => Status::Opening,
            2 => Status::Live,
            3 => Status::Resuming,
            4 => Status::Unavailable,
            _ => Status::Idle,
        }
    }
}

/// The registry of watched names; see the [module docs](self).
pub(crate) struct Hub {
    pub(super) names: Mutex<Names>,
    status: AtomicU8,
    /// How the backend takes its mark out of a name's handoff queue ([`Hub::set_withdraw`]).
    withdraw: OnceLock<Withdraw>,
    /// Withdrawals started and not finished ([`Hub::settle`]).
    pending: Arc<Pending>,
    /// Told when a name that is not covered is wanted (see `Hub::want`).
    #[cfg(any(feature = "mongodb", feature = "postgres"))]
    pub(super) widen: Notify,
}

/// Which names the open feed delivers changes of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Covered {
    /// Every change of every name.
    #[default]
    All,
    /// Some names only (narrowed feeds: MongoDB, PostgreSQL, `coverage.rs`).
    #[cfg(any(feature = "mongodb", feature = "postgres"))]
    Only(Narrowed),
}

/// The names a narrowed feed covers, and how (`coverage.rs`).
#[cfg(any(feature = "mongodb", feature = "postgres"))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Narrowed {
    /// Names of which every change is delivered: what holders and observers need.
    pub(crate) full: std::collections::HashSet<Arc<str>>,
    /// Names of which only the releases that concern this process's acquirers are delivered:
    /// those that designate this process, first or as backup, or nobody (MongoDB's handoff
    /// queue, `mongo/queue.rs`).
    pub(crate) handoffs: std::collections::HashSet<Arc<str>>,
}

#[cfg(any(feature = "mongodb", feature = "postgres"))]
impl Narrowed {
    /// How many names are covered, either way.
    pub(crate) fn len(&self) -> usize {
        self.full.len() + self.handoffs.len()
    }
}

impl Covered {
    /// Whether the acquirers of `name` hear of the releases meant for them.
    pub(super) fn covers(&self, name: &str) -> bool {
        match self {
            Covered::All => {
                let _ = name;
                true
            }
            #[cfg(any(feature = "mongodb", feature = "postgres"))]
            Covered::Only(n) => n.full.contains(name) || n.handoffs.contains(name),
        }
    }

    /// Whether every change of `name` is delivered (what holders and observers need).
    #[cfg(any(feature = "mongodb", feature = "postgres"))]
    pub(crate) fn covers_fully(&self, name: &str) -> bool {
        match self {
            Covered::All => true,
            Covered::Only(n) => n.full.contains(name),
        }
    }
}

#[derive(Default)]
pub(super) struct Names {
    pub(super) map: HashMap<Arc<str>, Arc<NameState>>,
    /// Sequence number of the last dispatched change (hub-wide, so that it stays comparable
    /// when a name's entry is removed and created again).
    pub(super) seq: u64,
    /// The lease last reported by a whole-document (`replace`) event, per name, kept when the
    /// name's entry goes (a waiter re-registers after each wake-up); see
    /// [`Hub::is_news`]. Cleared when it grows past [`MAX_KNOWN`].
    #[cfg(feature = "mongodb")]
    known: HashMap<Arc<str>, Change>,
    /// What the open feed covers.
    pub(super) covered: Covered,
    /// Whether a name that is not covered was wanted since the last `Hub::interest`.
    #[cfg(any(feature = "mongodb", feature = "postgres"))]
    pub(super) wanted: bool,
}

/// Bound of [`Names::known`]: forgetting costs at most one spurious wake-up per name.
#[cfg(feature = "mongodb")]
const MAX_KNOWN: usize = 1 << 16;

pub(crate) struct NameState {
    pub(super) turn: Arc<Notify>,
    pub(super) all: Notify,
    pub(super) changes: watch::Sender<(u64, Change)>,
    /// Acquirers registered with [`Hub::change_waiter`] and not yet woken or dropped.
    acquirers: AtomicUsize,
    /// Whether this backend's mark may be in the name's handoff queue: set by a busy attempt
    /// that registered, cleared by a grant that did not requeue and by a withdrawal
    /// ([`Hub::set_queued`]).
    queued: AtomicBool,
    /// When the entry was created (a narrowed feed covers holders' names lazily, see
    /// `Hub::uncovered_since`).
    #[cfg(any(feature = "mongodb", feature = "postgres"))]
    pub(super) since: std::time::Instant,
    /// Leases of the name this backend granted and holds ([`Hub::holder`]).
    pub(super) holders: AtomicUsize,
    /// When `holders` last went from 0 to 1 (a narrowed feed covers held names fully only
    /// after a while, `coverage.rs`).
    pub(super) held_since: Mutex<Option<std::time::Instant>>,
    /// Observers waiting in [`Hub::wait_for_change`].
    pub(super) observers: AtomicUsize,
}

#[cfg(any(feature = "mongodb", feature = "postgres"))]
impl NameState {
    /// Since when the name has been held here without a break (`None`: not held).
    pub(crate) fn held_since(&self) -> Option<std::time::Instant> {
        if self.holders.load(Ordering::SeqCst) == 0 {
            return None;
        }
        *self.held_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an observer waits for a change of the name.
    pub(crate) fn is_observed(&self) -> bool {
        self.observers.load(Ordering::SeqCst) > 0
    }
}

/// Counts one lease of a name held here for as long as it lives; holds the name's entry.
pub(crate) struct HolderRef(NameRef);

impl HolderRef {
    /// The name's entry.
    pub(crate) fn entry(&self) -> &NameRef {
        &self.0
    }
}

impl Drop for HolderRef {
    fn drop(&mut self) {
        // Before the entry handle itself is dropped (fields drop after this).
        self.0.state().holders.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts one observer of a name while it waits.
struct Observer<'a>(&'a NameState);

impl Drop for Observer<'_> {
    fn drop(&mut self) {
        self.0.observers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts one registered acquirer of a name for as long as it lives; holds the name's entry.
struct Acquirer(NameRef);

impl Acquirer {
    fn new(entry: NameRef) -> Acquirer {
        entry.state().acquirers.fetch_add(1, Ordering::SeqCst);
        Acquirer(entry)
    }
}

impl Drop for Acquirer {
    fn drop(&mut self) {
        // Before the entry handle itself is dropped (fields drop after this).
        let state = self.0.state();
        let last = state.acquirers.fetch_sub(1, Ordering::SeqCst) == 1;
        if last && state.queued.load(Ordering::SeqCst) {
            self.0.hub.withdraw_later(self.0.name.clone());
        }
    }
}

/// How a backend takes its mark out of the handoff queue of a name (`backends/notify/handoff.rs`):
/// one write, bounded in time by the backend. Called in a task of its own.
pub(crate) type Withdraw = Arc<
    dyn Fn(Arc<str>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// How long the last acquirer of a name must have been gone before the backend withdraws from
/// the name's queue: an acquirer woken by a change registers again before its next attempt,
/// at once, and one retrying after an error within its backoff (which may be longer: it then
/// queues again, at the end, on its next busy attempt).
pub(crate) const WITHDRAW_GRACE: Duration = Duration::from_millis(50);

/// Longest a withdrawal may take (it is best effort: an entry left behind ends by itself).
pub(crate) const WITHDRAW_TIMEOUT: Duration = Duration::from_secs(5);

/// Counts the withdrawals in flight, so that a process about to exit can wait for them.
#[derive(Default)]
pub(super) struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

/// One withdrawal in flight; counted until dropped.
struct PendingGuard(Arc<Pending>);

impl PendingGuard {
    fn new(pending: &Arc<Pending>) -> PendingGuard {
        pending.count.fetch_add(1, Ordering::SeqCst);
        PendingGuard(pending.clone())
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// How long a process that received a release designating another process waits for that
/// one to take the lock before one acquirer of its own tries (see
/// [`Hub::dispatch_handoff_elsewhere`]): on MongoDB the backup designee (and processes whose
/// stream covers the name fully), on PostgreSQL every other listening process.
pub(crate) const HANDOFF_FALLBACK: Duration = Duration::from_millis(500);

impl NameState {
    /// Receives every later change of the name (the current one counts as seen).
    pub(crate) fn subscribe(&self) -> watch::Receiver<(u64, Change)> {
        self.changes.subscribe()
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("status", &self.status())
            .field("names", &self.watched_names())
            .finish()
    }
}

impl Hub {
    pub(crate) fn new(status: Status) -> Arc<Hub> {
        Arc::new(Hub {
            names: Mutex::new(Names::default()),
            status: AtomicU8::new(status as u8),
            withdraw: OnceLock::new(),
            pending: Arc::default(),
            #[cfg(any(feature = "mongodb", feature = "postgres"))]
            widen: Notify::new(),
        })
    }

    /// Sets how this backend withdraws from a name's handoff queue when the last of its
    /// acquirers of the name stops waiting (gave up, timed out, was dropped) while its mark may
    /// be queued. Without it (the memory backend: no queue) nothing is withdrawn.
    pub(crate) fn set_withdraw(&self, withdraw: Withdraw) {
        let _ = self.withdraw.set(withdraw);
    }

    /// Records whether this backend's mark is (`true`: a busy attempt registered it, a grant
    /// requeued it) or is no longer (`false`: a grant removed it) in the handoff queue of
    /// `name`. Only names with an entry here count: an acquirer of the name is registered.
    pub(crate) fn set_queued(&self, name: &str, queued: bool) {
        if let Some(st) = self.names().map.get(name) {
            st.queued.store(queued, Ordering::SeqCst);
        }
    }

    /// After the last acquirer of `name` stopped waiting while this backend's mark may be in
    /// its queue: unless an acquirer of the name registers again within [`WITHDRAW_GRACE`],
    /// takes the mark out of the queue in the background, so that a release does not designate
    /// a process that no longer waits (and operators no longer see it waiting). Best effort:
    /// without a runtime, or if the write fails, the entry ends by itself two seconds after
    /// the holder's expiry, and live waiters behind it are reached by the fallbacks
    /// (`Hub::deliver`, MongoDB's probe).
    fn withdraw_later(self: &Arc<Self>, name: Arc<str>) {
        let Some(withdraw) = self.withdraw.get().cloned() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pending = PendingGuard::new(&self.pending);
        let hub = Arc::downgrade(self);
        runtime.spawn(async move {
            let _pending = pending;
            tokio::time::sleep(WITHDRAW_GRACE).await;
            // A hub that is gone (the backend was dropped) has no acquirer left: withdraw.
            if let Some(hub) = hub.upgrade() {
                let names = hub.names();
                if let Some(st) = names.map.get(&name) {
                    // Waiting again: the busy attempts of the new acquirer keep the entry.
                    if st.acquirers.load(Ordering::SeqCst) > 0 {
                        return;
                    }
                    st.queued.store(false, Ordering::SeqCst);
                }
            }
            let _ = tokio::time::timeout(WITHDRAW_TIMEOUT, withdraw(name)).await;
        });
    }

    /// Waits until the withdrawals in flight ([`set_withdraw`](Self::set_withdraw)) have
    /// finished, or `within` passed; true when none is left. For a process about to exit.
    pub(crate) async fn settle(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.pending.idle.notified();
                if self.pending.count.load(Ordering::SeqCst) == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    pub(super) fn names(&self) -> MutexGuard<'_, Names> {
        // Every mutation is a single insert/remove or counter bump; a poisoned map is consistent.
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn status(&self) -> Status {
        Status::from_u8(self.status.load(Ordering::SeqCst))
    }

    pub(crate) fn set_status(&self, status: Status) {
        self.status.store(status as u8, Ordering::SeqCst);
    }

    /// Sets `to` only if the status is `from`; returns whether it did.
    pub(crate) fn transition(&self, from: Status, to: Status) -> bool {
        self.status
            .compare_exchange(from as u8, to as u8, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Whether every change is delivered (or will be, after a resume).
    pub(crate) fn is_live(&self) -> bool {
        matches!(self.status(), Status::Live | Status::Resuming)
    }

    /// How many names have an entry (somebody waits on or holds them).
    pub(crate) fn watched_names(&self) -> usize {
        self.names().map.len()
    }

    /// The sequence number of the last dispatched change.
    pub(crate) fn seq(&self) -> u64 {
        self.names().seq
    }

    /// A handle on `name`'s entry, creating it if needed.
    pub(crate) fn name(self: &Arc<Self>, name: &str) -> NameRef {
        let mut names = self.names();
        let (key, state) = match names.map.get_key_value(name) {
            Some((k, v)) => (k.clone(), v.clone()),
            None => {
                let key: Arc<str> = Arc::from(name);
                let state = Arc::new(NameState {
                    turn: Arc::new(Notify::new()),
                    all: Notify::new(),
                    changes: watch::channel((0, Change::Nothing)).0,
                    acquirers: AtomicUsize::new(0),
                    queued: AtomicBool::new(false),
                    #[cfg(any(feature = "mongodb", feature = "postgres"))]
                    since: std::time::Instant::now(),
                    holders: AtomicUsize::new(0),
                    held_since: Mutex::new(None),
                    observers: AtomicUsize::new(0),
                });
                names.map.insert(key.clone(), state.clone());
                (key, state)
            }
        };
        NameRef {
            hub: self.clone(),
            name: key,
            state: Some(state),
        }
    }

    /// Delivers a change of `name` read from a feed (or made by this backend itself): a grant
    /// to every observer and the holders only ([`dispatch_grant`](Self::dispatch_grant)); any
    /// other change to one acquirer as well, at once when `here` (the release's handoff
    /// designated this process or nobody: [`dispatch`](Self::dispatch)), else only after
    /// [`HANDOFF_FALLBACK`] ([`dispatch_handoff_elsewhere`](Self::dispatch_handoff_elsewhere)).
    pub(crate) fn deliver(&self, name: &str, change: Change, here: bool) {
        match &change {
            Change::Lease {
                lease_id: Some(_), ..
            } => self.dispatch_grant(name, change),
            _ if here => self.dispatch(name, change),
            _ => self.dispatch_handoff_elsewhere(name, change),
        }
    }

    /// Delivers a change of `name`: one acquirer, every observer, the holders.
    pub(crate) fn dispatch(&self, name: &str, change: Change) {
        let mut names = self.names();
        names.seq += 1;
        let seq = names.seq;
        if let Some(st) = names.map.get(name) {
            st.turn.notify_one();
            st.all.notify_waiters();
            st.changes.send_replace((seq, change));
        }
    }

    /// Delivers a grant: to every observer and the holders, but to no acquirer (a grant frees
    /// nothing, so waking one would only cost it an attempt).
    pub(crate) fn dispatch_grant(&self, name: &str, change: Change) {
        self.dispatch_to_observers(name, change);
    }

    /// Delivers a change to every observer and the holders; returns the name's state and the
    /// change's sequence number when somebody here watches the name.
    fn dispatch_to_observers(&self, name: &str, change: Change) -> Option<(Weak<NameState>, u64)> {
        let mut names = self.names();
        names.seq += 1;
        let seq = names.seq;
        let st = names.map.get(name)?;
        st.all.notify_waiters();
        st.changes.send_replace((seq, change));
        Some((Arc::downgrade(st), seq))
    }

    /// Delivers a release whose handoff designated another process: to every observer and the
    /// holders now, and to one acquirer only if nothing else happened to the name within
    /// [`HANDOFF_FALLBACK`] (the designated process did not take the lock: it died, or its
    /// acquirers gave up). Needs a Tokio runtime for the timer; without one the acquirer is
    /// woken at once.
    pub(crate) fn dispatch_handoff_elsewhere(&self, name: &str, change: Change) {
        let Some((state, seq)) = self.dispatch_to_observers(name, change) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if let Some(st) = state.upgrade() {
                st.turn.notify_one();
            }
            return;
        };
        // A short timer task; it holds no strong reference, so the entry can go meanwhile.
        runtime.spawn(async move {
            tokio::time::sleep(HANDOFF_FALLBACK).await;
            if let Some(st) = state.upgrade() {
                if st.changes.borrow().0 == seq {
                    st.turn.notify_one();
                }
            }
        });
    }

    /// How many acquirers of `name` in this process are registered for its next change.
    pub(crate) fn acquirers(&self, name: &str) -> usize {
        self.names()
            .map
            .get(name)
            .map_or(0, |st| st.acquirers.load(Ordering::SeqCst))
    }

    /// Whether a change reported with the whole document (a `replace` event) is news, and
    /// remembers it: not when it shows the same lease (id and token) as the name's previous
    /// replace event. MongoDB 4.4 reports every pipeline update, extensions included, as a
    /// replace, and an extension frees nothing. Not knowing the name's lease yet, it is news (at
    /// worst one acquirer retries once). A lease id is never granted again once it lost the
    /// name, so seeing the same lease again means the name was held throughout, or was held
    /// again by the time of the event: nobody waiting needs to retry.
    #[cfg(feature = "mongodb")]
    pub(crate) fn is_news(&self, name: &str, change: &Change) -> bool {
        let mut names = self.names();
        let holds_lease = matches!(
            change,
            Change::Lease {
                lease_id: Some(_),
                ..
            }
        );
        if holds_lease && names.known.get(name) == Some(change) {
            return false;
        }
        if names.known.len() >= MAX_KNOWN {
            names.known.clear();
        }
        names.known.insert(Arc::from(name), change.clone());
        true
    }

    /// Wakes every waiting acquirer and observer of every name so that they check again (after
    /// the stream was opened from scratch, or when notifications stopped). Holders are told
    /// only when `holders_check` (something happened to every document, e.g. a dropped
    /// collection).
    pub(crate) fn wake_all(&self, holders_check: bool) {
        let mut names = self.names();
        names.seq += 1;
        // Whatever was known may have changed unseen.
        #[cfg(feature = "mongodb")]
        names.known.clear();
        let seq = names.seq;
        for st in names.map.values() {
            st.turn.notify_waiters();
            st.all.notify_waiters();
            if holders_check {
                st.changes.send_replace((seq, Change::Unknown));
            }
        }
    }

    /// An acquirer's registration for the next change of `name`, in place when this returns.
    pub(crate) fn change_waiter(self: &Arc<Self>, name: &str) -> ChangeWaiter {
        let entry = self.name(name);
        let turn = entry.state().turn.clone();
        let mut notified = Box::pin(turn.clone().notified_owned());
        // Registered now, so that notify_one during the caller's attempt reaches it.
        notified.as_mut().enable();
        let covered = self.names().covered.covers(name);
        let live = covered && self.is_live();
        let acquirer = Acquirer::new(entry);
        let waiter = ChangeWaiter::new(
            async move {
                notified.await;
                drop(acquirer);
            },
            live,
        )
        .with_pass_on(move || turn.notify_one());
        if covered {
            return waiter;
        }
        // Not covered: the acquirer polls, and asks for the name once it is about to wait (an
        // uncontended attempt never waits, so it costs the feed nothing).
        let hub = Arc::downgrade(self);
        let name: Arc<str> = Arc::from(name);
        waiter.before_wait(move || {
            if let Some(hub) = hub.upgrade() {
                hub.want(&name);
            }
        })
    }

    /// Waits until `name` changes or `max_wait` passed; every waiter is woken.
    pub(crate) async fn wait_for_change(self: &Arc<Self>, name: &str, max_wait: Duration) {
        let entry = self.name(name);
        let state = entry.state();
        let notified = state.all.notified();
        state.observers.fetch_add(1, Ordering::SeqCst);
        let _observer = Observer(state);
        self.want_fully(name);
        let _ = tokio::time::timeout(max_wait, notified).await;
    }

    /// A counted handle on a lease of `name` that this backend granted and holds.
    pub(crate) fn holder(self: &Arc<Self>, name: &str) -> HolderRef {
        let entry = self.name(name);
        let st = entry.state();
        let mut since = st.held_since.lock().unwrap_or_else(|e| e.into_inner());
        if st.holders.fetch_add(1, Ordering::SeqCst) == 0 {
            *since = Some(std::time::Instant::now());
        }
        drop(since);
        HolderRef(entry)
    }

    /// Whether the open feed covers `name` for handoffs only: it delivers the releases that
    /// designate this process (or nobody), not every change (`coverage.rs`).
    #[cfg(feature = "mongodb")]
    pub(crate) fn covers_for_handoffs_only(&self, name: &str) -> bool {
        let names = self.names();
        names.covered.covers(name) && !names.covered.covers_fully(name)
    }

    /// Whether the feed is live and covers `name`.
    pub(crate) fn is_live_for(&self, name: &str) -> bool {
        self.is_live() && self.names().covered.covers(name)
    }

    /// Asks the feed to cover `name`: without narrowed feeds (`coverage.rs`) every
    /// name is covered, so there is nothing to ask.
    #[cfg(not(any(feature = "mongodb", feature = "postgres")))]
    pub(crate) fn want(&self, _name: &str) {}

    /// Asks the feed to deliver every change of `name`: without narrowed feeds, nothing to ask.
    #[cfg(not(any(feature = "mongodb", feature = "postgres")))]
    pub(crate) fn want_fully(&self, _name: &str) {}
}

/// A counted handle on one name's entry; the entry is removed with the last handle.
pub(crate) struct NameRef {
    hub: Arc<Hub>,
    name: Arc<str>,
    state: Option<Arc<NameState>>,
}

impl NameRef {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn state(&self) -> &NameState {
        // Invariant: `state` is `Some` until `drop`.
        match &self.state {
            Some(s) => s,
            None => unreachable!("NameRef used after drop"),
        }
    }
}

impl Drop for NameRef {
    fn drop(&mut self) {
        let mut names = self.hub.names();
        // Dropped under the registry lock, where every clone is made, so the count is exact.
        drop(self.state.take());
        let unused = names
            .map
            .get(&self.name)
            .is_some_and(|s| Arc::strong_count(s) == 1);
        if unused {
            names.map.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_acquirer_per_change_and_entries_vanish() {
        let hub = Hub::new(Status::Live);
        let a = hub.change_waiter("x");
        let b = hub.change_waiter("x");
        assert_eq!(hub.watched_names(), 1);
        hub.dispatch("x", Change::Unknown);
        let (ta, tb) = tokio::join!(
            a.wait(Duration::from_millis(200)),
            b.wait(Duration::from_millis(200))
        );
        assert!(ta ^ tb, "exactly one acquirer is woken: {ta} {tb}");
        assert_eq!(hub.watched_names(), 0);
    }

    #[tokio::test]
    async fn a_change_during_the_attempt_is_not_missed() {
        let hub = Hub::new(Status::Live);
        let w = hub.change_waiter("x");
        // ... the attempt runs; meanwhile:
        hub.dispatch("x", Change::Unknown);
        assert!(w.wait(Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn pass_on_and_drop_forward_the_wake_up() {
        let hub = Hub::new(Status::Live);
        let first = hub.change_waiter("x");
        let second = hub.change_waiter("x");
        hub.dispatch("x", Change::Unknown);
        // `first` was woken but is dropped unconsumed: `second` gets the wake-up.
        drop(first);
        assert!(second.wait(Duration::from_secs(5)).await);
        let third = hub.change_waiter("x");
        let fourth = hub.change_waiter("x");
        third.pass_on();
        assert!(fourth.wait(Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn wake_all_reaches_everyone_and_observers_all_wake() {
        let hub = Hub::new(Status::Live);
        let waiters: Vec<_> = (0..5).map(|_| hub.change_waiter("x")).collect();
        let observers = async {
            tokio::join!(
                hub.wait_for_change("x", Duration::from_secs(5)),
                hub.wait_for_change("x", Duration::from_secs(5))
            )
        };
        let wake = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            hub.dispatch("x", Change::Unknown);
            hub.wake_all(false);
        };
        let started = tokio::time::Instant::now();
        tokio::join!(observers, wake);
        assert!(started.elapsed() < Duration::from_secs(4));
        for w in waiters {
            assert!(w.wait(Duration::from_secs(5)).await);
        }
        assert_eq!(hub.watched_names(), 0);
    }

    #[cfg(feature = "mongodb")]
    fn dispatch_unless_known(hub: &Hub, name: &str, change: Change) {
        if hub.is_news(name, &change) {
            hub.dispatch(name, change);
        }
    }

    #[cfg(feature = "mongodb")]
    #[tokio::test]
    async fn replace_events_showing_the_known_lease_wake_nobody() {
        let hub = Hub::new(Status::Live);
        let lease = |id: Option<&str>, t: u64| lease(id, Some(t));
        // The first event about a name is news (nothing known yet).
        let w = hub.change_waiter("x");
        dispatch_unless_known(&hub, "x", lease(Some("a"), 1));
        assert!(w.wait(Duration::from_secs(5)).await);
        // The waiter re-registered; extensions (same lease) do not wake it.
        let w = hub.change_waiter("x");
        dispatch_unless_known(&hub, "x", lease(Some("a"), 1));
        dispatch_unless_known(&hub, "x", lease(Some("a"), 1));
        assert!(!w.wait(Duration::from_millis(50)).await);
        // A release does, and so does the next grant.
        let w = hub.change_waiter("x");
        dispatch_unless_known(&hub, "x", lease(None, 1));
        assert!(w.wait(Duration::from_secs(5)).await);
        let w = hub.change_waiter("x");
        dispatch_unless_known(&hub, "x", lease(Some("b"), 2));
        assert!(w.wait(Duration::from_secs(5)).await);
        // After wake_all nothing is known any more.
        hub.wake_all(false);
        let w = hub.change_waiter("x");
        dispatch_unless_known(&hub, "x", lease(Some("b"), 2));
        assert!(w.wait(Duration::from_secs(5)).await);
    }

    #[test]
    fn status_round_trips() {
        let hub = Hub::new(Status::Idle);
        assert!(!hub.is_live());
        assert!(hub.transition(Status::Idle, Status::Opening));
        assert!(!hub.transition(Status::Idle, Status::Live));
        hub.set_status(Status::Resuming);
        assert!(hub.is_live());
        hub.set_status(Status::Unavailable);
        assert_eq!(hub.status(), Status::Unavailable);
    }
}
