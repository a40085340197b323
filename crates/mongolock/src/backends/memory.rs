//! In-memory backend: the full lock contract inside one process.
//!
//! Useful for unit tests of code that takes a [`LockProvider`](crate::LockProvider), and as the
//! reference implementation of the contract. State lives in a `Mutex<HashMap>` shared by all
//! clones of a [`MemoryBackend`]. "Server time" is the backend's own clock: the wall-clock time
//! at creation advanced by a monotonic clock, so it never jumps backwards. Entries are never
//! removed, so fencing tokens never restart.
//!
//! # Notifications
//! Every grant, release and force-release of a name (and every lease kept on by a minimum hold,
//! `release_after`, whose expiry moved) is delivered at once through the same
//! per-name wake-ups the MongoDB and PostgreSQL backends use for their feeds
//! (`backends/notify/hub.rs`): one waiting acquirer per change, every observer, and
//! [`lease_gone`](crate::LockBackendExt::lease_gone) for holders, which checks the state directly.
//! Notifications are always live, so waiters sleep until the holder's expiry.
//!
//! # Acquire path
//! [`MemoryBackend::try_acquire`](crate::LockBackend::try_acquire): under the mutex, expired
//! slots are discarded; then an exclusive request is free when the name has no lease (or an
//! expired one, or one that already belongs to the request's lease id) and no slot, and a slot
//! request (`slot_attempt`) when the name has no unexpired exclusive lease and fewer slots than
//! its limit. A grant increments the name's one token counter and stores the lease (or pushes
//! the slot).
//!
//! # Wait queue
//! The memory backend's equivalent of the MongoDB and PostgreSQL handoff queues, for
//! [`waiters`](crate::LockBackend::waiters) only (wake-ups need no queue in one process): a
//! busy exclusive attempt made while an acquirer of the name waits for a change (registered
//! with the hub) records its lease id and holder until the holder's expiry plus
//! `REGISTRATION` (2 s), moving its entry's time when it is already queued; a grant removes the
//! granted call's entry. One entry per waiting acquire call.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;

use super::notify::hub::{Change, Hub, Status};
use crate::backend::LeaseMode;
use crate::backend::{
    AcquireRequest, Attempt, ChangeNotifications, ChangeWaiter, Lease, LeaseHolder, LeaseId,
    LockBackend, LockInfo, RELEASED_KEPT_FOR, RELEASED_KEPT_MAX,
};
use crate::error::{Error, Result};
use crate::holder::HolderInfo;

/// `now + ttl`, saturating far in the future instead of panicking on overflow.
fn later(now: SystemTime, ttl: Duration) -> SystemTime {
    now.checked_add(ttl)
        .unwrap_or_else(|| now + crate::options::MAX_EXPIRY)
}

/// In-memory lock storage; clones share the same locks. See the [module docs](self).
#[derive(Clone)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

struct Inner {
    entries: Mutex<HashMap<String, Entry>>,
    origin_wall: SystemTime,
    origin_mono: Instant,
    hub: Arc<Hub>,
}

#[derive(Clone)]
struct Entry {
    lease_id: Option<LeaseId>,
    fencing_token: u64,
    acquired_at: SystemTime,
    expires_at: SystemTime,
    holder: Option<HolderInfo>,
    /// The lease ids released by their own holders, with the time of their release, oldest
    /// first: those of the last [`RELEASED_KEPT_FOR`], at most [`RELEASED_KEPT_MAX`]. A
    /// repeated release of one of them reports success (as every backend does for a retried
    /// release).
    released: VecDeque<(LeaseId, SystemTime)>,
    /// A semaphore's holders (empty while the name is used as a lock). Only unexpired ones
    /// count; expired ones are discarded at the next acquisition.
    slots: Vec<Slot>,
    /// The limit of the holders in `slots`.
    limit: u32,
    /// The wait queue (see the module docs): waiting calls in order of first registration,
    /// each until its registration runs out.
    queue: Vec<Queued>,
}

/// How long a queue registration outlives the holder's expiry (as in the MongoDB and
/// PostgreSQL queues, `backends/notify/handoff.rs`).
const REGISTRATION: Duration = Duration::from_secs(2);

/// One entry of a name's wait queue.
#[derive(Clone)]
struct Queued {
    lease_id: LeaseId,
    holder: HolderInfo,
    until: SystemTime,
}

/// One semaphore holder.
#[derive(Clone)]
struct Slot {
    lease_id: LeaseId,
    fencing_token: u64,
    acquired_at: SystemTime,
    expires_at: SystemTime,
    holder: HolderInfo,
}

impl Entry {
    /// Whether an unexpired exclusive lease holds the name.
    fn exclusive_held(&self, now: SystemTime) -> bool {
        self.lease_id.is_some() && self.expires_at > now
    }

    /// Whether `lease_id` is the exclusive lease or one of the slots (expired or not).
    fn has(&self, lease_id: &LeaseId) -> bool {
        self.lease_id.as_ref() == Some(lease_id)
            || self.slots.iter().any(|s| s.lease_id == *lease_id)
    }

    /// Remembers a lease id ended by its holder at `now` (a repeated release then reports
    /// success), forgetting those older than [`RELEASED_KEPT_FOR`] and the oldest beyond
    /// [`RELEASED_KEPT_MAX`].
    fn remember_released(&mut self, lease_id: &LeaseId, now: SystemTime) {
        while self
            .released
            .front()
            .is_some_and(|(_, at)| *at + RELEASED_KEPT_FOR <= now)
        {
            self.released.pop_front();
        }
        if self.released.len() >= RELEASED_KEPT_MAX {
            self.released.pop_front();
        }
        self.released.push_back((lease_id.clone(), now));
    }

    /// Whether `lease_id` is among the remembered released ids.
    fn was_released(&self, lease_id: &LeaseId) -> bool {
        self.released.iter().any(|(id, _)| id == lease_id)
    }

    /// One slot attempt (see the module docs), after expired slots were discarded.
    fn slot_attempt(
        &mut self,
        name: &str,
        req: &AcquireRequest,
        limit: u32,
        now: SystemTime,
    ) -> Result<Attempt> {
        // A retry after a lost reply: its earlier slot is replaced by a new one (new token,
        // new expiry), so the lease the caller trusts starts with this request.
        self.slots.retain(|s| s.lease_id != req.lease_id);
        if self.exclusive_held(now) {
            return Ok(Attempt::Busy {
                holder_expires_at: Some(self.expires_at),
            });
        }
        if !self.slots.is_empty() && self.limit != limit {
            return Err(Error::LimitMismatch {
                name: name.to_owned(),
                requested: limit,
                held: self.limit,
            });
        }
        if self.slots.len() >= limit as usize {
            return Ok(Attempt::Busy {
                holder_expires_at: self.slots.iter().map(|s| s.expires_at).min(),
            });
        }
        self.fencing_token += 1;
        self.limit = limit;
        let slot = Slot {
            lease_id: req.lease_id.clone(),
            fencing_token: self.fencing_token,
            acquired_at: now,
            expires_at: later(now, req.ttl),
            holder: req.holder.clone(),
        };
        let lease = Lease {
            fencing_token: slot.fencing_token,
            acquired_at: slot.acquired_at,
            expires_at: slot.expires_at,
        };
        self.slots.push(slot);
        Ok(Attempt::Acquired(lease))
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("locks", &self.entries().len())
            .finish()
    }
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        MemoryBackend {
            inner: Arc::new(Inner {
                entries: Mutex::new(HashMap::new()),
                origin_wall: SystemTime::now(),
                origin_mono: Instant::now(),
                hub: Hub::new(Status::Live),
            }),
        }
    }

    /// The backend's "server" time.
    pub fn now(&self) -> SystemTime {
        self.inner.origin_wall + self.inner.origin_mono.elapsed()
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // Every mutation is a complete assignment; a poisoned map is still consistent.
        self.inner.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self, name: &str, lease_id: Option<&LeaseId>) {
        self.inner.hub.dispatch(
            name,
            Change::Lease {
                lease_id: lease_id.map(|l| l.as_str().to_owned()),
                token: None,
            },
        );
    }

    /// Whether `lease_id` is the current lease of `name` (expired or not).
    fn holds(&self, name: &str, lease_id: &LeaseId) -> bool {
        self.entries().get(name).is_some_and(|e| e.has(lease_id))
    }

    fn info(name: &str, e: &Entry, now: SystemTime) -> LockInfo {
        // A semaphore shows its most recent slot.
        if let Some(last) = e
            .slots
            .iter()
            .filter(|s| s.expires_at > now)
            .max_by_key(|s| s.fencing_token)
        {
            return LockInfo {
                name: name.to_owned(),
                held: true,
                lease_id: Some(last.lease_id.clone()),
                fencing_token: Some(last.fencing_token),
                holder: e.holder.clone(),
                acquired_at: Some(last.acquired_at),
                expires_at: Some(last.expires_at),
                observed_at: now,
            };
        }
        LockInfo {
            name: name.to_owned(),
            held: e.lease_id.is_some() && e.expires_at > now,
            lease_id: e.lease_id.clone(),
            fencing_token: Some(e.fencing_token),
            holder: e.holder.clone(),
            acquired_at: Some(e.acquired_at),
            expires_at: Some(e.expires_at),
            observed_at: now,
        }
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt> {
        // An acquirer of the name waits for a change (its own registers before the attempt):
        // a busy attempt joins the wait queue (module docs).
        let waiting = self.inner.hub.acquirers(&req.name) >= 1;
        let attempt = {
            let mut entries = self.entries();
            let now = self.now();
            let entry = entries.entry(req.name.clone()).or_insert_with(|| Entry {
                lease_id: None,
                fencing_token: 0,
                acquired_at: now,
                expires_at: now,
                holder: None,
                released: VecDeque::new(),
                slots: Vec::new(),
                limit: 0,
                queue: Vec::new(),
            });
            entry.slots.retain(|s| s.expires_at > now);
            entry.queue.retain(|q| q.until > now);
            match req.mode {
                LeaseMode::Slot { limit } => {
                    let attempt = entry.slot_attempt(&req.name, req, limit, now)?;
                    if matches!(attempt, Attempt::Acquired(_)) {
                        entry.holder = Some(req.holder.clone());
                    }
                    attempt
                }
                _ => {
                    let free = match &entry.lease_id {
                        None => true,
                        Some(id) => entry.expires_at <= now || *id == req.lease_id,
                    };
                    if !free || !entry.slots.is_empty() {
                        let slots_end = entry.slots.iter().map(|s| s.expires_at).max();
                        let holder_expires_at = Some(entry.expires_at).max(slots_end);
                        if waiting {
                            let until =
                                later(holder_expires_at.unwrap_or(now).max(now), REGISTRATION);
                            match entry.queue.iter_mut().find(|q| q.lease_id == req.lease_id) {
                                Some(q) => q.until = until,
                                None => entry.queue.push(Queued {
                                    lease_id: req.lease_id.clone(),
                                    holder: req.holder.clone(),
                                    until,
                                }),
                            }
                        }
                        return Ok(Attempt::Busy { holder_expires_at });
                    }
                    entry.queue.retain(|q| q.lease_id != req.lease_id);
                    entry.lease_id = Some(req.lease_id.clone());
                    entry.fencing_token += 1;
                    entry.acquired_at = now;
                    entry.expires_at = later(now, req.ttl);
                    entry.holder = Some(req.holder.clone());
                    Attempt::Acquired(Lease {
                        fencing_token: entry.fencing_token,
                        acquired_at: now,
                        expires_at: entry.expires_at,
                    })
                }
            }
        };
        if matches!(attempt, Attempt::Acquired(_)) {
            self.changed(&req.name, Some(&req.lease_id));
        }
        Ok(attempt)
    }

    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> Result<Option<SystemTime>> {
        let mut entries = self.entries();
        let now = self.now();
        Ok(match entries.get_mut(name) {
            // A lease kept on by its holder's `release_after` (its id is among the released
            // ones) is never extended.
            Some(e)
                if e.lease_id.as_ref() == Some(lease_id)
                    && e.expires_at > now
                    && !e.was_released(lease_id) =>
            {
                e.expires_at = later(now, ttl);
                Some(e.expires_at)
            }
            Some(e) if e.lease_id.as_ref() == Some(lease_id) => None,
            Some(e) => e
                .slots
                .iter_mut()
                .find(|s| s.lease_id == *lease_id && s.expires_at > now)
                .map(|s| {
                    s.expires_at = later(now, ttl);
                    s.expires_at
                }),
            None => None,
        })
    }

    async fn release(&self, name: &str, lease_id: &LeaseId) -> Result<bool> {
        let released = {
            let mut entries = self.entries();
            let now = self.now();
            match entries.get_mut(name) {
                Some(e) if e.lease_id.as_ref() == Some(lease_id) => {
                    e.lease_id = None;
                    e.expires_at = e.expires_at.min(now);
                    e.remember_released(lease_id, now);
                    true
                }
                Some(e) if e.slots.iter().any(|s| s.lease_id == *lease_id) => {
                    e.slots.retain(|s| s.lease_id != *lease_id);
                    e.remember_released(lease_id, now);
                    true
                }
                Some(e) if e.was_released(lease_id) => return Ok(true),
                _ => false,
            }
        };
        if released {
            self.changed(name, None);
        }
        Ok(released)
    }

    /// Under the mutex: an unexpired exclusive lease of `lease_id` whose `acquired_at +
    /// min_hold` is still ahead keeps its id, token and holder with that expiry and is
    /// remembered as released (so `extend` refuses it and a retry reports success); anything
    /// else of ours is [`release`](LockBackend::release)d. A slot is refused.
    async fn release_after(
        &self,
        name: &str,
        lease_id: &LeaseId,
        min_hold: Duration,
    ) -> Result<bool> {
        let held_on = {
            let mut entries = self.entries();
            let now = self.now();
            match entries.get_mut(name) {
                Some(e) if e.slots.iter().any(|s| s.lease_id == *lease_id) => {
                    return Err(Error::MinHoldUnsupported {
                        name: name.to_owned(),
                        what: "semaphore slot",
                        reason: "semaphore slots and read-write lock readers cannot be held on"
                            .into(),
                    });
                }
                Some(e) if e.lease_id.as_ref() == Some(lease_id) => {
                    let until = later(e.acquired_at, min_hold);
                    if e.expires_at > now && until > now {
                        if !e.was_released(lease_id) {
                            e.expires_at = until;
                            e.remember_released(lease_id, now);
                        }
                        true
                    } else {
                        false
                    }
                }
                _ => false,
            }
        };
        if held_on {
            // Waiters that sleep until the old expiry retry and learn the new one.
            self.inner.hub.dispatch(name, Change::Unknown);
            return Ok(true);
        }
        self.release(name, lease_id).await
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let entries = self.entries();
        let now = self.now();
        Ok(entries.get(name).map(|e| Self::info(name, e, now)))
    }

    async fn holders(&self, name: &str) -> Result<Vec<LeaseHolder>> {
        let entries = self.entries();
        let now = self.now();
        let Some(e) = entries.get(name) else {
            return Ok(Vec::new());
        };
        if e.exclusive_held(now) {
            return Ok(LeaseHolder::from_info(&Self::info(name, e, now))
                .into_iter()
                .collect());
        }
        let mut slots: Vec<LeaseHolder> = e
            .slots
            .iter()
            .filter(|s| s.expires_at > now)
            .map(|s| LeaseHolder {
                lease_id: s.lease_id.clone(),
                fencing_token: s.fencing_token,
                acquired_at: s.acquired_at,
                expires_at: s.expires_at,
                holder: Some(s.holder.clone()),
            })
            .collect();
        slots.sort_by_key(|s| s.fencing_token);
        Ok(slots)
    }

    async fn list(&self) -> Result<Vec<LockInfo>> {
        let entries = self.entries();
        let now = self.now();
        let mut all: Vec<LockInfo> = entries
            .iter()
            .map(|(name, e)| Self::info(name, e, now))
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let ended = {
            let mut entries = self.entries();
            let now = self.now();
            match entries.get_mut(name) {
                Some(e) if e.exclusive_held(now) || e.slots.iter().any(|s| s.expires_at > now) => {
                    e.lease_id = None;
                    e.expires_at = e.expires_at.min(now);
                    e.slots.clear();
                    true
                }
                _ => false,
            }
        };
        if ended {
            self.changed(name, None);
        }
        Ok(ended)
    }

    async fn force_release_token(&self, name: &str, token: u64) -> Result<bool> {
        let ended = {
            let mut entries = self.entries();
            let now = self.now();
            match entries.get_mut(name) {
                Some(e) if e.exclusive_held(now) && e.fencing_token == token => {
                    e.lease_id = None;
                    e.expires_at = e.expires_at.min(now);
                    true
                }
                Some(e)
                    if e.slots
                        .iter()
                        .any(|s| s.fencing_token == token && s.expires_at > now) =>
                {
                    e.slots.retain(|s| s.fencing_token != token);
                    true
                }
                _ => false,
            }
        };
        if ended {
            self.changed(name, None);
        }
        Ok(ended)
    }

    async fn waiters(&self, name: &str) -> Result<Vec<crate::QueuedWaiter>> {
        let entries = self.entries();
        let now = self.now();
        Ok(entries.get(name).map_or_else(Vec::new, |e| {
            e.queue
                .iter()
                .filter(|q| q.until > now)
                .map(|q| {
                    crate::QueuedWaiter::new(q.lease_id.as_str(), Some(q.holder.clone()), q.until)
                })
                .collect()
        }))
    }

    async fn slot_limit(&self, name: &str) -> Result<Option<u32>> {
        let entries = self.entries();
        let now = self.now();
        Ok(entries
            .get(name)
            .filter(|e| e.slots.iter().any(|s| s.expires_at > now))
            .map(|e| e.limit))
    }

    fn notifications(&self) -> Option<&dyn ChangeNotifications> {
        Some(self)
    }
}

#[async_trait]
impl ChangeNotifications for MemoryBackend {
    async fn wait(&self, name: &str, max_wait: Duration) {
        self.inner.hub.wait_for_change(name, max_wait).await;
    }

    fn is_live(&self) -> bool {
        true
    }

    fn waiter(&self, name: &str) -> Option<ChangeWaiter> {
        Some(self.inner.hub.change_waiter(name))
    }

    async fn lease_lost(&self, name: &str, lease_id: &LeaseId) {
        let entry = self.inner.hub.name(name);
        // Subscribed before the check, so a change right after it is not missed.
        let mut changes = entry.state().subscribe();
        loop {
            if !self.holds(name, lease_id) {
                return;
            }
            if changes.changed().await.is_err() {
                // The sender lives in the entry we hold: unreachable, but never busy-loop.
                std::future::pending::<()>().await;
            }
        }
    }
}
