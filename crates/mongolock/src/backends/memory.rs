//! In-memory backend: the full lock contract inside one process.
//!
//! Useful for unit tests of code that takes a [`LockProvider`](crate::LockProvider), and as the
//! reference implementation of the contract. State lives in a `Mutex<HashMap>` shared by all
//! clones of a [`MemoryBackend`]. "Server time" is the backend's own clock: the wall-clock time
//! at creation advanced by a monotonic clock, so it never jumps backwards. Entries are never
//! removed, so fencing tokens never restart. Waiters are woken on every change.
//!
//! # Acquire path
//! [`MemoryBackend::try_acquire`](crate::LockBackend::try_acquire): under the mutex, the name is
//! free when it has no lease, its lease expired, or the lease already belongs to the request's
//! lease id; then the token is incremented and the lease stored.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{AcquireRequest, Attempt, Lease, LeaseId, LockBackend, LockInfo};
use crate::error::Result;
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
    changes: watch::Sender<u64>,
}

#[derive(Clone)]
struct Entry {
    lease_id: Option<LeaseId>,
    fencing_token: u64,
    acquired_at: SystemTime,
    expires_at: SystemTime,
    holder: Option<HolderInfo>,
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
                changes: watch::channel(0).0,
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

    fn changed(&self) {
        self.inner.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn info(name: &str, e: &Entry, now: SystemTime) -> LockInfo {
        LockInfo {
            name: name.to_owned(),
            held: e.lease_id.is_some() && e.expires_at > now,
            lease_id: e.lease_id.clone(),
            fencing_token: e.fencing_token,
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
        let attempt = {
            let mut entries = self.entries();
            let now = self.now();
            let entry = entries.entry(req.name.clone()).or_insert_with(|| Entry {
                lease_id: None,
                fencing_token: 0,
                acquired_at: now,
                expires_at: now,
                holder: None,
            });
            let free = match &entry.lease_id {
                None => true,
                Some(id) => entry.expires_at <= now || *id == req.lease_id,
            };
            if !free {
                return Ok(Attempt::Busy {
                    holder_expires_at: Some(entry.expires_at),
                });
            }
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
        };
        self.changed();
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
            Some(e) if e.lease_id.as_ref() == Some(lease_id) && e.expires_at > now => {
                e.expires_at = later(now, ttl);
                Some(e.expires_at)
            }
            _ => None,
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
                    true
                }
                _ => false,
            }
        };
        if released {
            self.changed();
        }
        Ok(released)
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let entries = self.entries();
        let now = self.now();
        Ok(entries.get(name).map(|e| Self::info(name, e, now)))
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
                Some(e) if e.lease_id.is_some() && e.expires_at > now => {
                    e.lease_id = None;
                    e.expires_at = now;
                    true
                }
                _ => false,
            }
        };
        if ended {
            self.changed();
        }
        Ok(ended)
    }

    async fn wait_for_change(&self, _name: &str, max_wait: Duration) {
        let mut rx = self.inner.changes.subscribe();
        let _ = tokio::time::timeout(max_wait, rx.changed()).await;
    }
}
