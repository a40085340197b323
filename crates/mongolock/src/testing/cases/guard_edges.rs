//! Contract cases at the edges of a lease's life: an extension that shortens the lease and
//! whose reply never arrives, and an acquire attempt abandoned by its call that grants and then
//! fails. Plus the test-only boot clock ([`advance_boot_clock`]).

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;

use super::{builder, eventually, provider, unique_name};
use crate::{AcquireRequest, Attempt, Error, LeaseId, LockBackend, LockInfo, LockProvider};

/// Moves the boot clock the library uses for lease deadlines (`CLOCK_BOOTTIME`) forward by
/// `by` in this process, as a suspend of that length would: every lease whose boot-time
/// deadline is now past counts as lost. Process-wide and irreversible: a test binary that uses
/// it should run nothing else concurrently that holds leases. Tests only.
#[doc(hidden)]
pub fn advance_boot_clock(by: Duration) {
    crate::clock::advance_boot_clock(by);
}

/// Delegates everything but change notifications (none), except that once `silent` is set, an
/// extension is applied on the inner backend and its reply is then never delivered (the future
/// stays pending): a reply lost for good, or a caller that stopped waiting.
pub struct ExtendsWithoutReply {
    /// The backend wrapped.
    pub inner: Arc<dyn LockBackend>,
    /// Whether extensions are applied without a reply.
    pub silent: AtomicBool,
}

#[async_trait]
impl LockBackend for ExtendsWithoutReply {
    async fn try_acquire(&self, req: &AcquireRequest) -> crate::Result<Attempt> {
        self.inner.try_acquire(req).await
    }
    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> crate::Result<Option<SystemTime>> {
        let applied = self.inner.extend(name, lease_id, ttl).await;
        if self.silent.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        applied
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
    // No notifications: the holder learns nothing from the store, so only its local deadline
    // can tell it the lease is gone.
}

/// An extension with a TTL shorter than what is left, applied by the server but whose reply
/// never arrives (the caller gave up on it): the guard must not trust the lease past the
/// shorter TTL. Once another acquirer holds the name, the first guard says lost, and a lost
/// signal that was already pending fires.
pub async fn a_shortened_extension_without_a_reply_ends_the_lease(backend: Arc<dyn LockBackend>) {
    let wrapper = Arc::new(ExtendsWithoutReply {
        inner: backend.clone(),
        silent: AtomicBool::new(false),
    });
    let wrapped: Arc<dyn LockBackend> = wrapper.clone();
    let first = builder(&wrapped)
        .expiry(Duration::from_secs(60))
        .auto_extend(false)
        .build()
        .expect("valid options");
    let second = provider(&backend);
    let name = unique_name("shortened");
    let guard = first
        .lock(name.clone())
        .unwrap()
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name} not free"));
    let token = guard.fencing_token();
    // Waiting before the extension: it must follow the lowered deadline.
    let pending_lost = tokio::spawn(guard.lost().into_future());

    wrapper.silent.store(true, Ordering::SeqCst);
    let short = Duration::from_secs(1);
    let called = Instant::now();
    let gave_up = tokio::time::timeout(Duration::from_millis(200), guard.extend(short)).await;
    assert!(
        gave_up.is_err(),
        "extend({short:?}) of {name} returned {gave_up:?} although its reply never arrives"
    );
    // The server applied the shorter TTL: the name is free about 1 s after the call.
    let next = second
        .lock(name.clone())
        .unwrap()
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap_or_else(|| {
            panic!("{name} not free 30 s after an extension to {short:?} was applied")
        });
    let taken_after = called.elapsed();
    assert!(
        guard.is_lost(),
        "{name}: another holder (token {}) took the name {taken_after:?} after the first \
         holder (token {token}) sent an extension to {short:?} whose reply never came, yet the \
         first guard still says held (local deadline in {:?})",
        next.fencing_token(),
        guard
            .local_deadline()
            .saturating_duration_since(Instant::now())
    );
    assert!(next.fencing_token() > token);
    let reason = guard.lost_reason().expect("a loss reason");
    assert!(
        matches!(
            reason,
            crate::LossReason::DeadlinePassed | crate::LossReason::ExtensionTooLate
        ),
        "{name}: reason {reason:?}"
    );
    match tokio::time::timeout(Duration::from_secs(10), pending_lost).await {
        Ok(Ok(())) => {}
        other => panic!(
            "{name}: the lost signal pending since before the extension did not fire \
             ({other:?}, {:?} after the call)",
            called.elapsed()
        ),
    }
    // Once lost, extend does not revive the lease (and sends nothing).
    assert!(!guard.extend(Duration::from_secs(60)).await.unwrap());
    next.release().await.unwrap();
}

/// Delegates everything but change notifications (none), except that once `late` is set, the
/// next extension request is held "in the network": its caller never gets a reply, and it is
/// applied on the inner backend only when [`gate`](Self::gate) gets a permit — possibly after
/// later extensions were applied.
pub struct ExtendsLate {
    /// The backend wrapped.
    pub inner: Arc<dyn LockBackend>,
    /// Whether the next extension is held back (reset when one is).
    pub late: AtomicBool,
    /// Releases the held-back extension to the inner backend.
    pub gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait]
impl LockBackend for ExtendsLate {
    async fn try_acquire(&self, req: &AcquireRequest) -> crate::Result<Attempt> {
        self.inner.try_acquire(req).await
    }
    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> crate::Result<Option<SystemTime>> {
        if self.late.swap(false, Ordering::SeqCst) {
            let (inner, gate) = (self.inner.clone(), self.gate.clone());
            let (name, lease_id) = (name.to_owned(), lease_id.clone());
            tokio::spawn(async move {
                if let Ok(_permit) = gate.acquire().await {
                    let _ = inner.extend(&name, &lease_id, ttl).await;
                }
            });
            std::future::pending::<()>().await;
        }
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
}

/// A shortened extension that the caller gave up on stays in flight and is applied only after
/// a later, longer extension succeeded (another connection overtook it). The server's expiry
/// is then the short one; the guard must not trust the longer extension past it.
pub async fn an_unanswered_short_extension_overtaken_by_a_longer_one_ends_the_lease(
    backend: Arc<dyn LockBackend>,
) {
    let wrapper = Arc::new(ExtendsLate {
        inner: backend.clone(),
        late: AtomicBool::new(false),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
    });
    let wrapped: Arc<dyn LockBackend> = wrapper.clone();
    let first = builder(&wrapped)
        .expiry(Duration::from_secs(60))
        .auto_extend(false)
        .build()
        .expect("valid options");
    let second = provider(&backend);
    let name = unique_name("overtaken");
    let guard = first
        .lock(name.clone())
        .unwrap()
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name} not free"));
    let token = guard.fencing_token();

    wrapper.late.store(true, Ordering::SeqCst);
    let short = Duration::from_secs(1);
    let gave_up = tokio::time::timeout(Duration::from_millis(200), guard.extend(short)).await;
    assert!(
        gave_up.is_err(),
        "{name}: extend({short:?}) returned {gave_up:?}"
    );
    // A later, longer extension is answered...
    assert!(
        guard.extend(Duration::from_secs(60)).await.unwrap(),
        "{name}: the 60 s extension after the unanswered one failed"
    );
    // ...and then the unanswered short one lands: the server frees the name about 1 s later.
    let landed = Instant::now();
    wrapper.gate.add_permits(1);
    let next = second
        .lock(name.clone())
        .unwrap()
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name} not free 30 s after the {short:?} extension landed"));
    assert!(
        guard.is_lost(),
        "{name}: another holder (token {}) took the name {:?} after the overtaken {short:?} \
         extension landed, yet the first guard (token {token}) still says held (local deadline \
         in {:?})",
        next.fencing_token(),
        landed.elapsed(),
        guard
            .local_deadline()
            .saturating_duration_since(Instant::now())
    );
    next.release().await.unwrap();
}

/// Delegates everything, except that an acquire attempt is slow and, when it grants on the
/// inner backend, reports an error instead (the write landed, the reply did not).
pub struct GrantsThenFails {
    /// The backend wrapped.
    pub inner: Arc<dyn LockBackend>,
    /// How long each attempt takes before it reaches the inner backend.
    pub delay: Duration,
    /// Grants made on the inner backend (each reported as an error).
    pub grants: AtomicUsize,
}

#[async_trait]
impl LockBackend for GrantsThenFails {
    async fn try_acquire(&self, req: &AcquireRequest) -> crate::Result<Attempt> {
        tokio::time::sleep(self.delay).await;
        match self.inner.try_acquire(req).await? {
            Attempt::Acquired(lease) => {
                self.grants.fetch_add(1, Ordering::SeqCst);
                Err(Error::unavailable(format!(
                    "injected: the grant of {:?} (token {}) was applied but its reply was lost",
                    req.name, lease.fencing_token
                )))
            }
            busy => Ok(busy),
        }
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
}

/// An acquire call that stops waiting for a slow attempt (its finite timeout ran out, or its
/// future was dropped) leaves the attempt running on its own; if that attempt then grants and
/// fails, the call's clean-up must still release the grant — after it landed, not before. The
/// name is free again long before the 120 s lease could expire.
pub async fn an_abandoned_attempt_that_grants_later_is_released(backend: Arc<dyn LockBackend>) {
    let slow = Arc::new(GrantsThenFails {
        inner: backend.clone(),
        delay: Duration::from_millis(1500),
        grants: AtomicUsize::new(0),
    });
    let p = LockProvider::builder_shared(slow.clone())
        .expiry(Duration::from_secs(120))
        .build()
        .expect("valid options");
    let observer = provider(&backend);
    for form in ["acquire_timeout", "dropped"] {
        let name = unique_name(form);
        let lock = p.lock(name.clone()).unwrap();
        let grants_before = slow.grants.load(Ordering::SeqCst);
        let called = Instant::now();
        match form {
            "acquire_timeout" => {
                // Gives up at the deadline plus the last attempt's grace (500 ms), before the
                // attempt lands at 1.5 s.
                let err = lock
                    .acquire_timeout(Duration::from_millis(100))
                    .await
                    .expect_err("the attempt cannot succeed");
                assert!(err.is_transient(), "{form}: {err}");
            }
            _ => {
                // Dropped while the first attempt is in flight.
                let r = tokio::time::timeout(Duration::from_millis(300), lock.acquire()).await;
                assert!(r.is_err(), "{form}: acquire of {name} returned {r:?}");
            }
        }
        let returned = called.elapsed();
        // The grant lands about 1.5 s after the call; then it must be released.
        let granted = eventually(Duration::from_secs(20), || async {
            slow.grants.load(Ordering::SeqCst) > grants_before
        })
        .await;
        assert!(granted, "{form}: the slow attempt never granted {name}");
        let info = observer.inspect(&name).await.unwrap();
        let freed = eventually(Duration::from_secs(30), || async {
            match observer.lock(name.clone()).unwrap().try_acquire().await {
                Ok(Some(g)) => {
                    g.release().await.unwrap();
                    true
                }
                _ => false,
            }
        })
        .await;
        assert!(
            freed,
            "{form}: {name} still held {:?} after the call returned (after {returned:?}) by \
             the grant of its abandoned attempt (lease 120 s; read after the grant: {info:?})",
            called.elapsed()
        );
    }
}
