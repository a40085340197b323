//! Wrapper backends the cases put between a provider and the backend under test: [`Counting`]
//! and [`CountingAll`] count calls, `LosesReplies` applies grants but loses their replies.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::{AcquireRequest, Attempt, ChangeNotifications, Error, LeaseId, LockBackend, LockInfo};

/// Counts the calls a provider makes to its backend.
pub struct Counting {
    /// The backend counted.
    pub inner: Arc<dyn LockBackend>,
    /// Acquire attempts.
    pub acquires: AtomicUsize,
    /// Calls of the operations that read or write a lock (not `notifications`).
    pub calls: AtomicUsize,
}

impl Counting {
    /// Counts the calls to `inner`.
    pub fn new(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Counting {
            inner,
            acquires: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl LockBackend for Counting {
    async fn try_acquire(&self, req: &AcquireRequest) -> crate::Result<Attempt> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.try_acquire(req).await
    }
    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> crate::Result<Option<SystemTime>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.extend(name, lease_id, ttl).await
    }
    async fn release(&self, name: &str, lease_id: &LeaseId) -> crate::Result<bool> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.release(name, lease_id).await
    }
    async fn release_after(
        &self,
        name: &str,
        lease_id: &LeaseId,
        min_hold: Duration,
    ) -> crate::Result<bool> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.release_after(name, lease_id, min_hold).await
    }
    async fn inspect(&self, name: &str) -> crate::Result<Option<LockInfo>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.inspect(name).await
    }
    async fn list(&self) -> crate::Result<Vec<LockInfo>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.list().await
    }
    async fn force_release(&self, name: &str) -> crate::Result<bool> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.force_release(name).await
    }
    async fn force_release_token(&self, name: &str, token: u64) -> crate::Result<bool> {
        self.inner.force_release_token(name, token).await
    }
    async fn waiters(&self, name: &str) -> crate::Result<Vec<crate::QueuedWaiter>> {
        self.inner.waiters(name).await
    }
    async fn slot_limit(&self, name: &str) -> crate::Result<Option<u32>> {
        self.inner.slot_limit(name).await
    }
    async fn list_matching(&self, filter: &crate::ListFilter) -> crate::Result<Vec<LockInfo>> {
        self.inner.list_matching(filter).await
    }
    fn new_lease_id(&self) -> LeaseId {
        self.inner.new_lease_id()
    }
    fn notifications(&self) -> Option<&dyn ChangeNotifications> {
        self.inner.notifications()
    }
}

/// A backend whose grants are applied but whose replies are lost while `lose` is set.
pub(crate) struct LosesReplies {
    pub(crate) inner: Arc<dyn LockBackend>,
    pub(crate) lose: AtomicBool,
}

#[async_trait]
impl LockBackend for LosesReplies {
    async fn try_acquire(&self, req: &AcquireRequest) -> crate::Result<Attempt> {
        let attempt = self.inner.try_acquire(req).await?;
        if self.lose.load(Ordering::SeqCst) {
            return Err(Error::unavailable("injected: the reply was lost"));
        }
        Ok(attempt)
    }
    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> crate::Result<Option<SystemTime>> {
        self.inner.extend(name, lease_id, ttl).await
    }
    async fn release(&self, name: &str, lease_id: &LeaseId) -> crate::Result<bool> {
        self.inner.release(name, lease_id).await
    }
    async fn release_after(
        &self,
        name: &str,
        lease_id: &LeaseId,
        min_hold: Duration,
    ) -> crate::Result<bool> {
        self.inner.release_after(name, lease_id, min_hold).await
    }
    async fn inspect(&self, name: &str) -> crate::Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
    async fn list(&self) -> crate::Result<Vec<LockInfo>> {
        self.inner.list().await
    }
    async fn force_release(&self, name: &str) -> crate::Result<bool> {
        self.inner.force_release(name).await
    }
    async fn force_release_token(&self, name: &str, token: u64) -> crate::Result<bool> {
        self.inner.force_release_token(name, token).await
    }
    async fn waiters(&self, name: &str) -> crate::Result<Vec<crate::QueuedWaiter>> {
        self.inner.waiters(name).await
    }
    async fn slot_limit(&self, name: &str) -> crate::Result<Option<u32>> {
        self.inner.slot_limit(name).await
    }
    async fn list_matching(&self, filter: &crate::ListFilter) -> crate::Result<Vec<LockInfo>> {
        self.inner.list_matching(filter).await
    }
}

/// Counts every call, delegating everything, the notification hooks included.
pub struct CountingAll {
    /// The backend counted.
    pub inner: Arc<dyn LockBackend>,
    /// Acquire attempts.
    pub acquires: AtomicUsize,
}

#[async_trait]
impl LockBackend for CountingAll {
    async fn try_acquire(&self, req: &AcquireRequest) -> crate::Result<Attempt> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.inner.try_acquire(req).await
    }
    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> crate::Result<Option<SystemTime>> {
        self.inner.extend(name, lease_id, ttl).await
    }
    async fn release(&self, name: &str, lease_id: &LeaseId) -> crate::Result<bool> {
        self.inner.release(name, lease_id).await
    }
    async fn release_after(
        &self,
        name: &str,
        lease_id: &LeaseId,
        min_hold: Duration,
    ) -> crate::Result<bool> {
        self.inner.release_after(name, lease_id, min_hold).await
    }
    fn new_lease_id(&self) -> LeaseId {
        self.inner.new_lease_id()
    }
    async fn inspect(&self, name: &str) -> crate::Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
    async fn list(&self) -> crate::Result<Vec<LockInfo>> {
        self.inner.list().await
    }
    async fn force_release(&self, name: &str) -> crate::Result<bool> {
        self.inner.force_release(name).await
    }
    async fn force_release_token(&self, name: &str, token: u64) -> crate::Result<bool> {
        self.inner.force_release_token(name, token).await
    }
    async fn waiters(&self, name: &str) -> crate::Result<Vec<crate::QueuedWaiter>> {
        self.inner.waiters(name).await
    }
    async fn slot_limit(&self, name: &str) -> crate::Result<Option<u32>> {
        self.inner.slot_limit(name).await
    }
    async fn list_matching(&self, filter: &crate::ListFilter) -> crate::Result<Vec<LockInfo>> {
        self.inner.list_matching(filter).await
    }
    fn notifications(&self) -> Option<&dyn ChangeNotifications> {
        self.inner.notifications()
    }
}
