//! The backend trait and the plain data types it exchanges with the core.
//!
//! A backend supplies *single atomic attempts* only: one try to acquire, one extension, one
//! release, one read. Everything else — waiting between attempts, backoff, retrying transient
//! errors within the caller's budget, automatic extension, loss detection and cancellation
//! safety — lives in the shared core ([`Lock`](crate::Lock), [`LockGuard`](crate::LockGuard)),
//! so every backend gets the same behaviour. A backend must satisfy this contract (the shared
//! contract suite, `mongolock::testing` with the `testing` feature, checks it):
//!
//! * **Server time.** Expiry is computed and compared with the backend's own clock (the
//!   database's), never the caller's.
//! * **Mutual exclusion.** [`try_acquire`](LockBackend::try_acquire) grants an exclusive lease
//!   only when the name has no lease, its lease has expired by server time, or the lease already
//!   belongs to the request's lease id (an idempotent retry after a transient error) — and no
//!   semaphore slot is unexpired (see [lease modes](#lease-modes-locks-and-semaphores) for
//!   slots).
//! * **Fencing tokens only grow.** Every grant returns a token strictly larger than every token
//!   ever returned for the name, across release, expiry, takeover, force-release and any cleanup
//!   of stored state.
//! * **Ownership.** [`extend`](LockBackend::extend) acts only on the caller's unexpired lease;
//!   [`release`](LockBackend::release) only on the caller's lease, and is idempotent for it.
//! * **Reads only read.** The reads ([`inspect`](LockBackend::inspect),
//!   [`list`](LockBackend::list), [`list_matching`](LockBackend::list_matching),
//!   [`holders`](LockBackend::holders), [`waiters`](LockBackend::waiters),
//!   [`slot_limit`](LockBackend::slot_limit)) never create or alter anything, and report only
//!   the backend's own data: a store holding someone else's data is refused with
//!   [`Error::ForeignCollection`](crate::Error::ForeignCollection), as writes refuse it; a
//!   store that must be created before use and does not exist yet (PostgreSQL's table) with
//!   [`Error::MissingLockTable`](crate::Error::MissingLockTable).
//!
//! The data types exchanged here ([`AcquireRequest`], [`Lease`], [`Attempt`], [`LockInfo`],
//! [`LeaseHolder`]) are plain structs and enums with public fields, not `#[non_exhaustive]`: a
//! backend outside this crate builds them with struct literals and matches them exhaustively.
//! A field added to one is therefore a breaking change, made only in a new minor version of
//! 0.x (with a CHANGELOG entry), never in a patch release.
//!
//! # Lease modes: locks and semaphores
//! A request carries a [`LeaseMode`]. A name's state is, at any instant of server time, either
//! (at most) one [`Exclusive`](LeaseMode::Exclusive) lease or a *set* of
//! [`Slot`](LeaseMode::Slot) leases (a semaphore's holders), never both:
//!
//! * An exclusive request is granted only when the name has no unexpired exclusive lease *and
//!   no unexpired slot*.
//! * A slot request `Slot { limit }` is granted only when the name has no unexpired exclusive
//!   lease and fewer than `limit` unexpired slots. Expired slots are discarded by server time in
//!   the same atomic step. While unexpired slots exist, the name's limit is theirs: a request
//!   with another limit fails with [`Error::LimitMismatch`](crate::Error::LimitMismatch)
//!   (once every slot has expired or been released, the next request sets a new limit). A
//!   request whose lease id already holds a slot (a retry after a lost reply) has that slot
//!   replaced: it is discarded and, if a slot is free, a new one granted with a new token and
//!   an expiry counted from this request.
//! * Every grant, in either mode, takes the next token of the name's one sequence, so tokens
//!   grow across slots and across both modes.
//! * [`extend`](LockBackend::extend) and [`release`](LockBackend::release) find the caller's
//!   lease id wherever it is (the exclusive lease or one slot) and touch nothing else;
//!   [`force_release`](LockBackend::force_release) ends the exclusive lease and every slot.
//!
//! A backend written before modes existed grants every request exclusively: that keeps at most
//! one holder (never more than a semaphore allows), but it is not a semaphore; the contract
//! suite's semaphore cases fail for it.
//!
//! # Minimum hold: at most once per interval
//! [`release_after`](LockBackend::release_after)`(name, lease_id, min_hold)` is a release that
//! ends the caller's exclusive lease *no earlier than `min_hold` after it was granted*, in one
//! atomic step judged by the backend's clock. With `hold_until = acquired_at + min_hold`
//! (`acquired_at` the server time of the grant):
//!
//! * `hold_until <= now`, or the lease already expired: exactly a [`release`](LockBackend::release)
//!   (the same write, the same handoff to waiters).
//! * Otherwise the lease stays the caller's — same lease id, fencing token, holder and grant
//!   time — with its expiry set to `hold_until` (later *or earlier* than the expiry it had),
//!   and its id is recorded among the released ones. From then on it is *ended by its holder*:
//!   [`extend`](LockBackend::extend) refuses it (a late extension still in flight cannot move
//!   the end of the hold), a retried `release_after` reports success without changing it,
//!   [`force_release`](LockBackend::force_release) still ends it (and so does a plain
//!   `release` of the same lease id, which the core never sends after `release_after`). At
//!   `hold_until` it expires like any lease: the name is free at once, with no write needed.
//! * Waiters are told of the change (the same notification as a release: MongoDB's change
//!   stream, PostgreSQL's `NOTIFY`, the memory backend's wake-ups), so that a waiter that went
//!   to sleep until the old expiry retries, learns the new one, and sleeps until `hold_until`
//!   only.
//!
//! **Why this gives "at most once per interval" whatever the clocks of the callers.** Two
//! grants of the name are at least `min_hold` apart *by the server's clock*: a grant happens
//! only once the previous lease is released or expired, and a lease ended with
//! `release_after` stays unexpired until its grant time plus `min_hold`, both read from the
//! same clock (the database's). The callers' clocks are never read. So replicas whose schedules
//! fire at slightly different times run a job once per interval as long as each run ends its
//! lease with a minimum hold at least the spread of their schedules.
//!
//! **The limit.** The hold is written when the holder ends its lease. A holder that crashes
//! (or loses its lease) before that holds the name only until its lease expires (its TTL,
//! counted from its last extension), which may be sooner than `min_hold`: the guarantee holds
//! for work that ends — successfully or not — while its holder is alive, as a command run by
//! `mongolock exec --min-hold` does.
//!
//! Covered: exclusive leases (locks, and read-write locks' writers) on the memory, MongoDB and
//! PostgreSQL backends. Semaphore slots (and readers) are refused with
//! [`Error::MinHoldUnsupported`](crate::Error::MinHoldUnsupported), as by the default of this
//! method for backends that do not implement it: nothing is ever released early in silence.
//!
//! # Change notifications (an optional capability)
//! The six atomic operations above are all a backend must implement. A backend that also
//! learns of changes as they happen (MongoDB through one change stream per backend, PostgreSQL
//! through one `LISTEN` connection, the memory backend directly) implements
//! [`ChangeNotifications`] as well and returns itself from
//! [`LockBackend::notifications`]. It then offers three things; without it the core polls:
//!
//! * [`waiter`](ChangeNotifications::waiter): an acquirer registers, *before* each
//!   attempt, for the next change of the name, and waits on it after a busy attempt. One waiting
//!   acquirer per name and process is woken per change (no stampede). While the waiter
//!   [is live](ChangeWaiter::is_live), the core sleeps until the holder's reported expiry instead
//!   of the wait strategy's delay.
//! * [`wait`](ChangeNotifications::wait): every caller is woken on a
//!   change (for observers that only read).
//! * [`lease_lost`](ChangeNotifications::lease_lost): a holder learns, unasked, that its lease
//!   was taken over or ended by someone else.
//!
//! The core reaches them through [`LockBackendExt`]
//! ([`change_waiter`](LockBackendExt::change_waiter),
//! [`wait_for_change`](LockBackendExt::wait_for_change),
//! [`live_notifications`](LockBackendExt::live_notifications),
//! [`lease_gone`](LockBackendExt::lease_gone)), which dispatch to
//! [`notifications`](LockBackend::notifications) (and poll, sleep or stay pending without it).
//! `LockBackendExt` is implemented for every `LockBackend` and cannot be implemented otherwise,
//! so a backend cannot override one dispatch and forget another.
//!
//! # Wrapper backends
//! A backend that wraps another (to count calls, inject failures, add logging) forwards
//! **every** method of [`LockBackend`], including those with a default: a default describes a
//! backend *without* that capability (no minimum hold, no conditional force-release, no queue,
//! no notifications, unmarked lease ids), so a wrapper that leaves one out silently turns the
//! capability off. In particular it forwards [`notifications`](LockBackend::notifications)
//! (returning the inner backend's) and [`new_lease_id`](LockBackend::new_lease_id) (MongoDB marks
//! its lease ids so that its change stream can tell its own writes). To observe notifications,
//! return a [`ChangeNotifications`] of the wrapper's own that forwards to the inner one.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::error::Result;
use crate::holder::HolderInfo;

/// How long a backend at least remembers, per name, that a lease's holder released it: a
/// release retried within this time after its first try was applied (a lost reply) reports
/// success. (The MongoDB and PostgreSQL backends keep a record in the lock that has no time
/// limit, and remember the fencing token of each lease they granted for this long after its
/// release; see their module docs.)
/// Well above the default [release timeout](crate::LockProviderBuilder::release_timeout) (5 s),
/// within which the core retries a release; with a longer release timeout, a retry later than
/// this may report [`Error::LeaseLost`](crate::Error::LeaseLost).
pub const RELEASED_KEPT_FOR: Duration = Duration::from_secs(60);

/// At most this many released lease ids are remembered per name (the most recent ones): a
/// retried release after more than this many other releases of the same name within
/// [`RELEASED_KEPT_FOR`] may report [`Error::LeaseLost`](crate::Error::LeaseLost) (the safe
/// direction). Bounds the list the in-memory backend keeps.
pub const RELEASED_KEPT_MAX: usize = 256;

/// Unique identifier of one lease (one successful acquire call). Extension and release are
/// matched against it, so a process can never extend or release someone else's lease.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(transparent))]
pub struct LeaseId(String);

impl LeaseId {
    /// A new random lease id (128 random bits, 32 hex digits).
    pub fn random() -> Self {
        LeaseId(format!("{:032x}", rand::random::<u128>()))
    }

    /// A new random lease id that starts with `prefix` (a backend's mark on its own leases;
    /// 96 random bits follow it).
    pub fn random_with_prefix(prefix: &str) -> Self {
        LeaseId(format!("{prefix}{:024x}", rand::random::<u128>() >> 32))
    }

    /// Wraps a lease id read back from storage.
    pub fn from_string(id: impl Into<String>) -> Self {
        LeaseId(id.into())
    }

    /// The id as a string (as stored by the backend).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a lease shares its name with other leases (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseMode {
    /// The only lease on the name: a [`Lock`](crate::Lock).
    #[default]
    Exclusive,
    /// One of at most `limit` concurrent slots of a [`Semaphore`](crate::Semaphore).
    Slot {
        /// The most slots the name may have at once (at least 1).
        limit: u32,
    },
}

/// One acquisition attempt, as handed to [`LockBackend::try_acquire`].
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// The lock name (already validated: non-empty, at most [`MAX_NAME_LEN`](crate::MAX_NAME_LEN)
    /// bytes).
    pub name: String,
    /// The lease id to store when the lease is granted. The core reuses it when it retries after
    /// a transient error, so a grant whose reply was lost is taken over by the retry instead of
    /// being left behind.
    pub lease_id: LeaseId,
    /// Lease duration: the backend sets expiry to server now + `ttl`.
    pub ttl: Duration,
    /// Metadata to store with the lease.
    pub holder: HolderInfo,
    /// Exclusive lease or one slot of a semaphore (see the [module docs](self)).
    pub mode: LeaseMode,
}

/// A lease granted by [`LockBackend::try_acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Fencing token: strictly larger than every token previously issued for the name.
    pub fencing_token: u64,
    /// Server time at which the lease was granted.
    pub acquired_at: SystemTime,
    /// Server time at which the lease expires unless extended.
    pub expires_at: SystemTime,
}

/// The outcome of one acquisition attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The lease was granted to the request's lease id.
    Acquired(Lease),
    /// Someone else holds an unexpired lease.
    Busy {
        /// Server time at which the current holder's lease expires, when known.
        holder_expires_at: Option<SystemTime>,
    },
}

/// A read-only view of one lock, as returned by [`LockBackend::inspect`] and
/// [`LockBackend::list`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LockInfo {
    /// The lock name.
    pub name: String,
    /// Whether an unexpired lease exists, judged by server time at `observed_at`.
    pub held: bool,
    /// The current lease id; `None` after release or force-release. May be `Some` while `held`
    /// is false: the lease expired and nobody has taken the name since.
    pub lease_id: Option<LeaseId>,
    /// The fencing token of the current (or, when none, the most recent) lease. `None` when that
    /// lease has no token yet: nothing was ever granted (a document lock never taken), or — on
    /// MongoDB, for a few milliseconds — the lease was granted and its token is still being
    /// issued from a fresh fencing epoch (or never was: the grant expired first). Never the
    /// previous holder's token next to the new holder's lease id.
    pub fencing_token: Option<u64>,
    /// Metadata of the current or most recent holder.
    pub holder: Option<HolderInfo>,
    /// Server time at which the current or most recent lease was granted.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "crate::serde_time::rfc3339_opt")
    )]
    pub acquired_at: Option<SystemTime>,
    /// Server time at which the current lease expires (or the most recent one ended).
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "crate::serde_time::rfc3339_opt")
    )]
    pub expires_at: Option<SystemTime>,
    /// Server time of the read.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "crate::serde_time::rfc3339")
    )]
    pub observed_at: SystemTime,
}

/// One current holder of a name, as returned by [`LockBackend::holders`]: the exclusive lease,
/// one semaphore slot, or one reader of a read-write lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LeaseHolder {
    /// The holder's lease id.
    pub lease_id: LeaseId,
    /// The fencing token issued with this lease.
    pub fencing_token: u64,
    /// Server time at which this lease was granted.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "crate::serde_time::rfc3339")
    )]
    pub acquired_at: SystemTime,
    /// Server time at which this lease expires unless extended.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "crate::serde_time::rfc3339")
    )]
    pub expires_at: SystemTime,
    /// The holder's metadata, when the backend stores it for this lease.
    pub holder: Option<HolderInfo>,
}

impl LeaseHolder {
    /// The holder described by `info`: `Some` while `info` shows an unexpired lease with its
    /// lease id, token and times (`None` while the lease's token is still being issued). (A
    /// semaphore's [`LockInfo`] describes only its most recent slot.)
    pub fn from_info(info: &LockInfo) -> Option<LeaseHolder> {
        if !info.held {
            return None;
        }
        Some(LeaseHolder {
            lease_id: info.lease_id.clone()?,
            fencing_token: info.fencing_token?,
            acquired_at: info.acquired_at?,
            expires_at: info.expires_at?,
            holder: info.holder.clone(),
        })
    }
}

/// One acquirer's registration for the next change of a lock name, obtained from
/// [`LockBackendExt::change_waiter`] *before* an attempt so that a change during the attempt is not
/// missed.
///
/// Backends wake one registered waiter per name per change; a woken waiter that does not get to
/// act on the change (its attempt failed) hands it on with [`pass_on`](Self::pass_on). Dropping
/// a waiter that was woken but not yet awaited hands the wake-up on as well.
#[must_use = "a waiter does nothing unless awaited"]
pub struct ChangeWaiter {
    changed: Pin<Box<dyn Future<Output = ()> + Send + 'static>>,
    pass_on: Option<Box<dyn FnOnce() + Send + 'static>>,
    /// Run when the waiter starts waiting (a backend learns that the name is contended).
    before_wait: Option<Box<dyn FnOnce() + Send + 'static>>,
    live: bool,
}

impl std::fmt::Debug for ChangeWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeWaiter")
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

impl ChangeWaiter {
    /// A waiter that completes when `changed` does. The registration must already be in place
    /// when this is called (not on the future's first poll). `live` says whether the backend
    /// currently delivers every change (then the core may sleep until the holder's expiry).
    pub fn new(changed: impl Future<Output = ()> + Send + 'static, live: bool) -> Self {
        ChangeWaiter {
            changed: Box::pin(changed),
            pass_on: None,
            before_wait: None,
            live,
        }
    }

    /// Sets what runs when [`wait`](Self::wait) is called (after a busy attempt), e.g. asking
    /// the feed to cover the name.
    pub(crate) fn before_wait(mut self, f: impl FnOnce() + Send + 'static) -> Self {
        self.before_wait = Some(Box::new(f));
        self
    }

    /// Also ends the wait (as a change would) when `other` completes: a backend's own check
    /// that the name may be free although no change reached this process (MongoDB's probe of
    /// a waiter that the next release would not designate, `mongo/probe.rs`). `other` starts
    /// when the wait does.
    #[cfg(feature = "mongodb")]
    pub(crate) fn or_when(mut self, other: impl Future<Output = ()> + Send + 'static) -> Self {
        let changed = std::mem::replace(&mut self.changed, Box::pin(std::future::pending()));
        self.changed = Box::pin(async move {
            tokio::select! {
                () = changed => {}
                () = other => {}
            }
        });
        self
    }

    /// Sets what [`pass_on`](Self::pass_on) does: wake another waiter of the same name.
    pub fn with_pass_on(mut self, pass_on: impl FnOnce() + Send + 'static) -> Self {
        self.pass_on = Some(Box::new(pass_on));
        self
    }

    /// Whether the backend delivered every change at registration time. When false, the core
    /// waits for the wait strategy's delay (a change still ends the wait early).
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// Waits for the change or `max_wait`, whichever is first; true when a change ended it.
    ///
    /// # Errors
    /// None: a wait only ends, by a change or the time limit.
    ///
    /// # Cancel safety
    /// Dropping the future drops the registration: a change it was woken for but had not yet
    /// reported is handed on to another waiter of the name, as when dropping a waiter (see the
    /// type docs). Register again to wait again.
    pub async fn wait(mut self, max_wait: Duration) -> bool {
        if let Some(f) = self.before_wait.take() {
            f();
        }
        tokio::time::timeout(max_wait, &mut self.changed)
            .await
            .is_ok()
    }

    /// Gives up this registration and wakes another waiter of the same name, if any: called by
    /// a waiter that was woken by a change but whose attempt failed, so the change is not lost.
    pub fn pass_on(mut self) {
        let pass_on = self.pass_on.take();
        drop(self);
        if let Some(f) = pass_on {
            f();
        }
    }
}

/// A storage backend for locks. Object safe: the provider keeps an `Arc<dyn LockBackend>`.
///
/// Implementations make single atomic attempts; see the [module docs](self) for the contract.
/// A wrapper around another backend forwards every method, those with a default included (see
/// [wrapper backends](self#wrapper-backends)); the core's notification dispatch is in
/// [`LockBackendExt`], which no backend can override.
/// Transient failures must be reported as [`Error::Unavailable`](crate::Error::Unavailable) so
/// that the core retries them; permanent ones as [`Error::Backend`](crate::Error::Backend).
#[async_trait]
pub trait LockBackend: Send + Sync + 'static {
    /// One atomic attempt to take `req.name` for `req.lease_id`.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt>;

    /// Sets the expiry of the caller's unexpired lease to server now + `ttl`, returning the new
    /// expiry; `None` when the lease expired, was released or was taken over.
    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> Result<Option<SystemTime>>;

    /// Ends the caller's lease, keeping the fencing token for the next holder.
    ///
    /// Idempotent for the owner: returns `true` when this call ended the lease *and* when the
    /// lease id had already been released by its owner (a retry after a lost reply). Every
    /// backend recognises a lease released by its holder for at least [`RELEASED_KEPT_FOR`]
    /// after the release, whatever else happens to the name meanwhile: the in-memory backend
    /// keeps the released ids (at most the [`RELEASED_KEPT_MAX`] most recent per name); the
    /// MongoDB and PostgreSQL backends instead record, by fencing token, the leases that
    /// someone *else* ended (see their module docs), which a busy name's traffic does not grow.
    /// Returns `false` only when someone else ended or took the lease (expiry and takeover,
    /// force-release) or the backend has no record of it any more (a retry later than that):
    /// a false loss, never a false success. Never affects another lease id.
    async fn release(&self, name: &str, lease_id: &LeaseId) -> Result<bool>;

    /// Ends the caller's exclusive lease no earlier than `min_hold` after it was granted, by
    /// the backend's clock: the lease is kept (same id, token, holder) until `acquired_at +
    /// min_hold`, or released at once when that has passed (see
    /// [minimum hold](self#minimum-hold-at-most-once-per-interval)). Extensions of the lease
    /// are refused from then on; force-release still ends it; waiters are notified.
    ///
    /// Idempotent for the owner, like [`release`](Self::release): `true` when this call ended
    /// or arranged the end of the lease, and when a previous call (or a release) of the same
    /// lease id already did (a retry after a lost reply); `false` only when someone else ended
    /// or took the lease.
    ///
    /// The default refuses with [`Error::MinHoldUnsupported`](crate::Error::MinHoldUnsupported)
    /// without touching the lease: a backend must implement it to offer minimum holds. The
    /// memory, MongoDB and PostgreSQL backends implement it for exclusive leases, and refuse a
    /// semaphore slot's lease id the same way.
    async fn release_after(
        &self,
        name: &str,
        lease_id: &LeaseId,
        min_hold: Duration,
    ) -> Result<bool> {
        let _ = (lease_id, min_hold);
        Err(crate::error::Error::MinHoldUnsupported {
            name: name.to_owned(),
            what: "lock",
            reason: "this lock backend does not implement LockBackend::release_after".into(),
        })
    }

    /// A fresh lease id for one acquire call. Must be unique; the default is
    /// [`LeaseId::random`]. A backend may mark its own leases (the MongoDB backend prefixes them
    /// so that its change stream can leave out its own writes).
    fn new_lease_id(&self) -> LeaseId {
        LeaseId::random()
    }

    /// Reads one lock; `None` when the backend has no record of the name. Like every read,
    /// creates and alters nothing (see the [contract](crate::backend)).
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>>;

    /// Reads every lock the backend stores, sorted by name. Creates and alters nothing.
    async fn list(&self) -> Result<Vec<LockInfo>>;

    /// Every current holder of `name`, by server time at the read, in the order their leases
    /// were granted: the holder of the exclusive lease, or every unexpired slot of a semaphore
    /// (the readers of a read-write lock). Empty when nobody holds the name.
    ///
    /// The default derives at most one holder from [`inspect`](Self::inspect); the memory,
    /// MongoDB and PostgreSQL backends report every slot.
    async fn holders(&self, name: &str) -> Result<Vec<LeaseHolder>> {
        Ok(self
            .inspect(name)
            .await?
            .as_ref()
            .and_then(LeaseHolder::from_info)
            .into_iter()
            .collect())
    }

    /// Ends whatever unexpired lease holds `name` (an operator action); the fencing token keeps
    /// growing for the next holder. Returns whether a lease was ended.
    async fn force_release(&self, name: &str) -> Result<bool>;

    /// Ends the unexpired lease of `name` whose fencing token is `token`, and nothing else (an
    /// operator action that must not end a holder that took over meanwhile): the exclusive
    /// lease when it has that token, or the one semaphore slot with that token (the other
    /// slots stay). One conditional write, judged by server time: never a read followed by a
    /// write. The fencing token keeps growing for the next holder. Returns whether a lease was
    /// ended.
    ///
    /// The default returns [`Error::Backend`](crate::Error::Backend) (a backend cannot make it
    /// atomic from the other operations); the memory, MongoDB and PostgreSQL backends implement
    /// it.
    async fn force_release_token(&self, name: &str, token: u64) -> Result<bool> {
        let _ = (name, token);
        Err(crate::Error::backend(
            "this lock backend has no conditional force-release (force_release_token)",
            "use force_release, or implement LockBackend::force_release_token as one \
             conditional write",
        ))
    }

    /// The wait queue of `name` by server time at the read: the processes (MongoDB,
    /// PostgreSQL) or calls (memory) registered as waiting for it, in queue order, without the
    /// entries whose registration has run out (see [`QueuedWaiter`](crate::QueuedWaiter)).
    /// Acquirers join the queue only while they wait for a change of an exclusive lease with
    /// live notifications; semaphore slot waiters are not queued.
    ///
    /// The default is empty (a backend without a queue).
    async fn waiters(&self, name: &str) -> Result<Vec<crate::QueuedWaiter>> {
        let _ = name;
        Ok(Vec::new())
    }

    /// The slot limit of `name` while it is held as a semaphore (or by the readers of a
    /// read-write lock, whose limit is [`READERS_LIMIT`](crate::rwlock::READERS_LIMIT)): `Some`
    /// while at least one unexpired slot holds it, by server time; `None` otherwise.
    ///
    /// The default is `None`; the memory, MongoDB and PostgreSQL backends report it.
    async fn slot_limit(&self, name: &str) -> Result<Option<u32>> {
        let _ = name;
        Ok(None)
    }

    /// The locks that pass `filter`, sorted by name. The default filters
    /// [`list`](Self::list) in the client; MongoDB (an anchored `$regex` on `_id`) and
    /// PostgreSQL (a comparison of the name's start) select the prefix on the server.
    async fn list_matching(&self, filter: &crate::ListFilter) -> Result<Vec<LockInfo>> {
        let mut all = self.list().await?;
        all.retain(|i| filter.matches(i));
        Ok(all)
    }

    /// The backend's change notifications, when it has them (see the [module docs](self)).
    /// The default is `None`: waiters poll with the wait strategy and holders detect loss by
    /// extension and their local deadline.
    fn notifications(&self) -> Option<&dyn ChangeNotifications> {
        None
    }
}

/// What the core asks of any [`LockBackend`] about changes: one dispatch to
/// [`LockBackend::notifications`] each, with the behaviour of a backend without notifications
/// (poll, sleep, stay pending) when it returns `None`.
///
/// Implemented for every [`LockBackend`] (and `dyn LockBackend`), and for nothing else: a
/// backend offers notifications by implementing [`ChangeNotifications`] and returning it from
/// [`notifications`](LockBackend::notifications), never by overriding these.
#[async_trait]
pub trait LockBackendExt: LockBackend {
    /// Waits until something about `name` may have changed, or `max_wait` passed: dispatches to
    /// [`ChangeNotifications::wait`], and sleeps for `max_wait` without notifications.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    async fn wait_for_change(&self, name: &str, max_wait: Duration);

    /// Whether the backend currently learns of every change as it happens: dispatches to
    /// [`ChangeNotifications::is_live`]; false without notifications.
    fn live_notifications(&self) -> bool;

    /// Registers an acquirer's interest in the next change of `name`: dispatches to
    /// [`ChangeNotifications::waiter`]; `None` without notifications.
    fn change_waiter(&self, name: &str) -> Option<ChangeWaiter>;

    /// Completes when the backend learns, unasked, that `lease_id` no longer holds `name`:
    /// dispatches to [`ChangeNotifications::lease_lost`]; never completes without
    /// notifications.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    async fn lease_gone(&self, name: &str, lease_id: &LeaseId);
}

#[async_trait]
impl<B: LockBackend + ?Sized> LockBackendExt for B {
    async fn wait_for_change(&self, name: &str, max_wait: Duration) {
        match self.notifications() {
            Some(n) => n.wait(name, max_wait).await,
            None => tokio::time::sleep(max_wait).await,
        }
    }

    fn live_notifications(&self) -> bool {
        self.notifications()
            .is_some_and(ChangeNotifications::is_live)
    }

    fn change_waiter(&self, name: &str) -> Option<ChangeWaiter> {
        self.notifications().and_then(|n| n.waiter(name))
    }

    async fn lease_gone(&self, name: &str, lease_id: &LeaseId) {
        match self.notifications() {
            Some(n) => n.lease_lost(name, lease_id).await,
            None => std::future::pending::<()>().await,
        }
    }
}

/// The optional capability of a [`LockBackend`] that learns of changes as they happen; see the
/// [module docs](self). Exposed through [`LockBackend::notifications`].
#[async_trait]
pub trait ChangeNotifications: Send + Sync {
    /// Waits until something about `name` may have changed, or `max_wait` passed, whichever is
    /// first. Every caller waiting on `name` is woken by a change (for observers that read the
    /// lock; acquirers use [`waiter`](Self::waiter)). Spurious early returns are
    /// allowed.
    async fn wait(&self, name: &str, max_wait: Duration);

    /// Whether the backend currently learns of every change as it happens (a healthy change
    /// stream or listening connection; always for the memory backend). Informational: the
    /// acquire loop asks each [`ChangeWaiter`] instead.
    fn is_live(&self) -> bool;

    /// Registers an acquirer's interest in the next change of `name`, effective at once (before
    /// the caller's attempt). Per name and process, each change wakes one registered waiter (the
    /// longest waiting). `None` when notifications are unavailable right now (the core then
    /// sleeps with [`wait`](Self::wait) and the wait strategy).
    fn waiter(&self, name: &str) -> Option<ChangeWaiter>;

    /// Completes when the backend learns, without being asked, that `lease_id` no longer holds
    /// `name` (another holder took it, or it was released or removed by someone else). A held
    /// guard's watchdog waits on it to signal loss at once instead of at the next extension.
    /// May stay pending forever (loss is then detected by extension and the local deadline).
    async fn lease_lost(&self, name: &str, lease_id: &LeaseId);

    /// Waits until the backend has sent the withdrawals from handoff queues that it started in
    /// the background, or `max_wait` passed; true when none is left. A backend with a
    /// cross-process handoff queue (MongoDB, PostgreSQL) takes its process out of a lock's
    /// queue when the last of its acquirers of the name stops waiting without the lock; see
    /// [`LockProvider::flush`](crate::LockProvider::flush). The default has nothing to send.
    ///
    /// # Errors
    /// None: a failed withdrawal is logged (the entry ends by itself).
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits; the withdrawals go on.
    async fn flush(&self, max_wait: Duration) -> bool {
        let _ = max_wait;
        true
    }
}
