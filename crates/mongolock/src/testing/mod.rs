//! The contract suite (feature `testing`; **not API-stable**): the cases every
//! [`LockBackend`] must pass — ours (memory, MongoDB, PostgreSQL) and your own.
//!
//! A backend's test file provides `async fn setup() -> Env` (a backend on fresh, isolated
//! storage; or `Option<Env>`, `None` skipping with a printed reason) and invokes
//! `mongolock::contract_suite!(setup)`, which generates one `#[tokio::test]` per case (the test
//! crate needs `tokio` with the `macros` and `rt-multi-thread` features):
//!
//! ```
//! use std::sync::Arc;
//! use mongolock::testing::Env;
//!
//! async fn setup() -> Env {
//!     Env::new(Arc::new(mongolock::MemoryBackend::new())).with_notifications()
//! }
//!
//! mongolock::contract_suite!(setup);
//! # fn main() {}
//! ```
//!
//! # Writing a backend
//! A backend implements [`LockBackend`]: single atomic attempts (acquire, extend, release,
//! release with a minimum hold, force-release, inspect, list), judged by the store's clock.
//! The rules those operations must follow, and why the core's guarantees follow from them,
//! are the [backend contract](crate::backend); the core supplies waiting, retries, renewal,
//! loss detection and cancellation safety. A backend that learns of changes as they happen
//! also implements [`ChangeNotifications`] and declares it with
//! [`Env::with_notifications`], which adds the cases for wake-ups and early loss detection.
//! The suite then checks the rules on your store: mutual exclusion under contention, tokens
//! across release, expiry, takeover and force-release, ownership, idempotent release, slots,
//! read-write locks, lock sets, minimum holds and guard edges. mongolock's own backends run
//! it from `crates/mongolock/tests/` (the MongoDB run against `mongo-testserver`, or a real
//! deployment when `MONGODB_URI` is set).
//!
//! Cases panic on a contract violation, as tests do. The change-notification cases (a
//! force-release signalled to the holder at once, a release waking a waiter at once, handoffs
//! without a stampede) run only for an [`Env`] declared
//! [`with_notifications`](Env::with_notifications); for other backends they skip with a printed
//! reason.
//! Cases wait with generous deadlines and poll instead of asserting tight timings.

use std::any::Any;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::{
    AcquireRequest, Attempt, ChangeNotifications, Error, LeaseId, LockBackend, LockInfo,
    LockProvider, LockProviderBuilder, Timeout, WaitStrategy,
};
use async_trait::async_trait;
use rand::Rng;
use tokio::time::Instant;

mod guard_edges;
mod lockset;
mod min_hold;
mod operator;
#[cfg(all(feature = "postgres", unix))]
pub mod postgres_server;
mod rwlock;
mod semaphore;
pub use guard_edges::*;
pub use lockset::*;
pub use min_hold::*;
pub use operator::*;
pub use rwlock::*;
pub use semaphore::*;

/// A backend on isolated storage, plus whatever must stay alive while it is used (a test
/// server), and the capabilities it declares.
pub struct Env {
    /// The backend under test.
    pub backend: Arc<dyn LockBackend>,
    /// Kept alive until the case ends (a test server, a temporary directory).
    pub keep_alive: Box<dyn Any + Send>,
    /// Whether the backend delivers change notifications (its `change_waiter`, `lease_gone`
    /// and `wait_for_change` react to changes): the notification cases run only then.
    pub notifications: bool,
}

impl Env {
    /// A backend with nothing to keep alive and no declared notifications.
    pub fn new(backend: Arc<dyn LockBackend>) -> Env {
        Env {
            backend,
            keep_alive: Box::new(()),
            notifications: false,
        }
    }

    /// Keeps `value` alive while the case runs.
    pub fn keep_alive(mut self, value: impl Any + Send) -> Env {
        self.keep_alive = Box::new(value);
        self
    }

    /// Declares that the backend delivers change notifications.
    pub fn with_notifications(mut self) -> Env {
        self.notifications = true;
        self
    }
}

/// What a backend's `setup` returns: an [`Env`], or `Option<Env>` for a backend that can be
/// missing (`None` skips the case; the setup prints why).
pub trait IntoEnv {
    /// The environment, or `None` to skip.
    fn into_env(self) -> Option<Env>;
}

impl IntoEnv for Env {
    fn into_env(self) -> Option<Env> {
        Some(self)
    }
}

impl IntoEnv for Option<Env> {
    fn into_env(self) -> Option<Env> {
        self
    }
}

/// Generates one test per contract case for a backend.
#[macro_export]
macro_rules! contract_suite {
    ($setup:path) => {
        $crate::contract_suite!(@cases $setup;
            mutual_exclusion,
            expiry_and_takeover,
            extend_semantics,
            release_checks_ownership,
            fencing_tokens_grow,
            timeout_zero_is_one_attempt,
            timeout_finite_returns_none_on_time,
            timeout_forever_waits_until_released,
            dropped_acquire_futures_leave_nothing_held,
            auto_extension_keeps_others_out,
            bad_input_is_rejected_before_the_backend,
            inspect_and_list_show_the_holder,
            force_release_ends_the_lease_and_signals_loss,
            dropping_a_guard_releases,
            dropping_a_release_future_still_releases,
            acquire_for_with_ttl_and_timeout,
            release_is_idempotent_for_the_owner,
            a_lost_grant_is_released_when_the_call_gives_up,
            semaphore_never_exceeds_its_limit,
            semaphore_tokens_grow_across_slots,
            semaphore_slot_returns_after_a_crashed_holders_lease,
            semaphore_bad_limits_are_typed_errors,
            semaphore_and_lock_on_one_name_exclude_each_other,
            semaphore_slots_are_separate_leases,
            holders_shows_every_slot_holder,
            dropped_semaphore_acquires_leave_no_slot_held,
            rwlock_readers_overlap_and_a_writer_excludes_everyone,
            rwlock_tokens_are_shared_by_readers_and_writers,
            rwlock_a_waiting_writer_is_not_starved,
            dropped_rwlock_acquires_leave_nothing_held,
            a_shortened_extension_without_a_reply_ends_the_lease,
            an_unanswered_short_extension_overtaken_by_a_longer_one_ends_the_lease,
            an_abandoned_attempt_that_grants_later_is_released,
            min_hold_keeps_the_name_until_granted_plus_min_hold,
            min_hold_already_passed_is_a_plain_release,
            force_release_ends_a_min_hold,
            min_hold_is_idempotent_and_refuses_extension,
            force_release_token_ends_only_that_lease,
            force_release_token_ends_one_semaphore_slot,
            list_matching_filters_by_prefix_and_state,
            lock_sets_in_opposite_orders_never_deadlock,
            a_timed_out_lock_set_leaves_nothing_held,
            dropped_lock_set_acquires_leave_nothing_held,
            a_lock_set_guard_reports_any_loss_and_releases_all,
            a_lock_set_keeps_the_names_it_holds_while_waiting,
        );
        $crate::contract_suite!(@notifications $setup;
            force_release_is_signalled_to_the_holder_at_once,
            a_release_wakes_a_waiter_at_once,
            handoffs_are_prompt_and_do_not_stampede,
            a_slot_release_wakes_a_waiter_at_once,
            waiters_show_who_waits,
        );
    };
    (@cases $setup:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                // A setup may return `Option<Env>`: `None` skips (it printed why).
                let Some(env) = $crate::testing::IntoEnv::into_env($setup().await) else {
                    return;
                };
                $crate::testing::$case(env.backend.clone()).await;
                drop(env);
            }
        )*
    };
    (@notifications $setup:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(env) = $crate::testing::IntoEnv::into_env($setup().await) else {
                    return;
                };
                if !env.notifications {
                    eprintln!("skipped: the backend declares no change notifications");
                    return;
                }
                $crate::testing::$case(env.backend.clone()).await;
                drop(env);
            }
        )*
    };
}

/// A unique lock name per test run.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// A provider builder with fast waits (so contention tests are quick).
pub fn builder(backend: &Arc<dyn LockBackend>) -> LockProviderBuilder {
    LockProvider::builder_shared(backend.clone())
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_millis(1),
            Duration::from_millis(15),
        ))
        .app_name("mongolock-contract")
}

/// A provider with fast waits (see [`builder`]).
pub fn provider(backend: &Arc<dyn LockBackend>) -> LockProvider {
    builder(backend).build().expect("valid options")
}

/// Polls `f` every 20 ms until it returns true (→ `true`) or `within` passed (→ `false`).
pub async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn is_held(backend: &Arc<dyn LockBackend>, name: &str) -> bool {
    backend
        .inspect(name)
        .await
        .expect("inspect")
        .is_some_and(|i| i.held)
}

/// Counts the calls a provider makes to its backend.
pub struct Counting {
    /// The backend counted.
    pub inner: Arc<dyn LockBackend>,
    /// Acquire attempts.
    pub acquires: AtomicUsize,
    /// Every call but `wait_for_change`.
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
    async fn wait_for_change(&self, name: &str, max_wait: Duration) {
        self.inner.wait_for_change(name, max_wait).await
    }
}

/// 16 tasks × 50 acquisitions around a non-atomic read-modify-write: the total is exact, no two
/// tasks are ever inside together, and tokens grow in critical-section order.
pub async fn mutual_exclusion(backend: Arc<dyn LockBackend>) {
    const TASKS: u64 = 16;
    const ROUNDS: u64 = 50;
    let provider = provider(&backend);
    let name = unique_name("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let lock = provider.lock(name.clone()).unwrap();
        let (counter, inside, tokens) = (counter.clone(), inside.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = lock.acquire().await.expect("acquire");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders inside"
                );
                tokens.lock().unwrap().push(guard.fencing_token());
                let read = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                if rand::rng().random_bool(0.3) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                counter.store(read + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(counter.load(Ordering::SeqCst), TASKS * ROUNDS);
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len() as u64, TASKS * ROUNDS);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens must strictly grow in critical-section order"
    );
}

/// A lease that is not extended expires by server time; another holder takes it only after the
/// expiry, the old guard reports the loss, its extend returns false and its release fails.
pub async fn expiry_and_takeover(backend: Arc<dyn LockBackend>) {
    let name = unique_name("takeover");
    let a_provider = builder(&backend)
        .auto_extend(false)
        .expiry(Duration::from_millis(500))
        .build()
        .unwrap();
    let b_provider = provider(&backend);
    let a = a_provider
        .lock(name.clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let b = b_provider
        .lock(name.clone())
        .unwrap()
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .expect("B takes the lock after A's lease expired");
    assert!(
        b.acquired_at() >= a.expires_at(),
        "taken over at {:?}, before A's expiry {:?}",
        b.acquired_at(),
        a.expires_at()
    );
    assert!(b.fencing_token() > a.fencing_token());
    tokio::time::timeout(Duration::from_secs(5), a.lost())
        .await
        .expect("A's lost signal fires");
    assert!(a.is_lost());
    assert!(!a.extend(Duration::from_secs(5)).await.unwrap());
    match a.release().await {
        Err(Error::LeaseLost { name: n }) => assert_eq!(n, name),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert!(info.held);
    assert_eq!(info.lease_id.as_ref(), Some(b.lease_id()));
    assert!(!b.is_lost());
    b.release().await.unwrap();
}

/// extend(ttl) sets expiry to server now + ttl; on an expired lease the backend refuses and the
/// guard reports the loss.
pub async fn extend_semantics(backend: Arc<dyn LockBackend>) {
    let name = unique_name("extend");
    let p = builder(&backend)
        .auto_extend(false)
        .expiry(Duration::from_secs(2))
        .build()
        .unwrap();
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let first_expiry = g.expires_at();
    let first_deadline = g.local_deadline();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(g.extend(Duration::from_secs(10)).await.unwrap());
    assert!(g.expires_at() >= first_expiry + Duration::from_secs(7));
    assert!(g.local_deadline() > first_deadline);
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert_eq!(info.expires_at, Some(g.expires_at()));
    // Resets rather than adds: a shorter ttl moves the expiry earlier.
    assert!(g.extend(Duration::from_millis(300)).await.unwrap());
    assert!(g.expires_at() < first_expiry);
    // Let it expire: the lost signal fires, extend returns false.
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost fires after the lease ran out");
    assert!(g.is_lost());
    assert!(!g.extend(Duration::from_secs(5)).await.unwrap());
    // The backend itself refuses to extend an expired lease, even if nobody took the name.
    assert!(
        eventually(Duration::from_secs(5), || async {
            !is_held(&backend, &name).await
        })
        .await
    );
    assert_eq!(
        backend
            .extend(&name, g.lease_id(), Duration::from_secs(5))
            .await
            .unwrap(),
        None
    );
    assert!(!is_held(&backend, &name).await);
    drop(g);
}

/// Release and extend act only on the caller's own lease.
pub async fn release_checks_ownership(backend: Arc<dyn LockBackend>) {
    let name = unique_name("owner");
    let p = provider(&backend);
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let stranger = LeaseId::random();
    assert!(!backend.release(&name, &stranger).await.unwrap());
    assert_eq!(
        backend
            .extend(&name, &stranger, Duration::from_secs(60))
            .await
            .unwrap(),
        None
    );
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert!(info.held);
    assert_eq!(info.lease_id.as_ref(), Some(g.lease_id()));
    assert!(!backend
        .release("no-such-lock-xyz", &stranger)
        .await
        .unwrap());
    g.release().await.unwrap();
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert!(!info.held);
    assert_eq!(info.lease_id, None);
}

/// Tokens strictly grow across release, expiry, takeover, drop and force-release.
pub async fn fencing_tokens_grow(backend: Arc<dyn LockBackend>) {
    let name = unique_name("fencing");
    let p = provider(&backend);
    let short = builder(&backend)
        .auto_extend(false)
        .expiry(Duration::from_millis(200))
        .build()
        .unwrap();
    let lock = p.lock(name.clone()).unwrap();
    let mut tokens = Vec::new();
    for _ in 0..5 {
        let g = lock.acquire().await.unwrap();
        tokens.push(g.fencing_token());
        g.release().await.unwrap();
    }
    // After expiry (never released) and takeover.
    let g = short.lock(name.clone()).unwrap().acquire().await.unwrap();
    tokens.push(g.fencing_token());
    let taken = lock
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .expect("takeover after expiry");
    tokens.push(taken.fencing_token());
    drop(g);
    // After force-release.
    assert!(p.force_release(&name).await.unwrap());
    let after_force = lock
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap();
    tokens.push(after_force.fencing_token());
    drop(taken);
    // After a dropped guard.
    drop(after_force);
    let after_drop = lock
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap();
    tokens.push(after_drop.fencing_token());
    after_drop.release().await.unwrap();
    assert!(tokens[0] >= 1);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly grow: {tokens:?}"
    );
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert_eq!(info.fencing_token, tokens.last().copied());
}

/// A zero timeout makes exactly one attempt, in every API form.
pub async fn timeout_zero_is_one_attempt(backend: Arc<dyn LockBackend>) {
    let name = unique_name("zero");
    let holder = provider(&backend);
    let g = holder.lock(name.clone()).unwrap().acquire().await.unwrap();
    let counting = Counting::new(backend.clone());
    let p = builder(&(counting.clone() as Arc<dyn LockBackend>))
        .build()
        .unwrap();
    let lock = p.lock(name.clone()).unwrap();

    assert!(lock.try_acquire().await.unwrap().is_none());
    assert_eq!(counting.acquires.swap(0, Ordering::SeqCst), 1);
    assert!(lock
        .acquire_timeout(Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    assert_eq!(counting.acquires.swap(0, Ordering::SeqCst), 1);
    assert!(p
        .acquire_for(&name, Duration::from_secs(5), Timeout::Zero)
        .await
        .unwrap()
        .is_none());
    assert_eq!(counting.acquires.swap(0, Ordering::SeqCst), 1);
    assert!(lock
        .acquire_with(Duration::ZERO.into())
        .await
        .unwrap()
        .is_none());
    assert_eq!(counting.acquires.swap(0, Ordering::SeqCst), 1);

    g.release().await.unwrap();
    let mine = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("free lock is taken in one attempt");
    assert_eq!(counting.acquires.load(Ordering::SeqCst), 1);
    mine.release().await.unwrap();
}

/// A finite timeout returns `None` once it elapsed (not much earlier, not much later).
pub async fn timeout_finite_returns_none_on_time(backend: Arc<dyn LockBackend>) {
    let name = unique_name("finite");
    let holder = provider(&backend);
    let g = holder.lock(name.clone()).unwrap().acquire().await.unwrap();
    for strategy in [WaitStrategy::default(), WaitStrategy::exponential()] {
        let p = builder(&backend).wait_strategy(strategy).build().unwrap();
        let started = Instant::now();
        let got = p
            .lock(name.clone())
            .unwrap()
            .acquire_timeout(Duration::from_millis(700))
            .await
            .unwrap();
        let elapsed = started.elapsed();
        assert!(got.is_none());
        assert!(
            elapsed >= Duration::from_millis(690),
            "returned early: {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_secs(5),
            "returned late: {elapsed:?}"
        );
    }
    assert!(!g.is_lost());
    g.release().await.unwrap();
}

/// Without a timeout, acquire waits until the holder releases (both API forms).
pub async fn timeout_forever_waits_until_released(backend: Arc<dyn LockBackend>) {
    let name = unique_name("forever");
    let p = provider(&backend);
    for form in 0..2 {
        let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
        let released = Arc::new(AtomicBool::new(false));
        let waiter = {
            let p = p.clone();
            let name = name.clone();
            let released = released.clone();
            tokio::spawn(async move {
                let got = if form == 0 {
                    p.lock(name).unwrap().acquire().await.unwrap()
                } else {
                    p.acquire_for(&name, Duration::from_secs(5), Timeout::Forever)
                        .await
                        .unwrap()
                        .expect("Forever never returns None")
                };
                assert!(
                    released.load(Ordering::SeqCst),
                    "acquired before the release"
                );
                got
            })
        };
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!waiter.is_finished());
        let first = g.fencing_token();
        released.store(true, Ordering::SeqCst);
        g.release().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("waiter acquires after release")
            .unwrap();
        assert!(got.fencing_token() > first);
        got.release().await.unwrap();
    }
}

/// Runs `acquire` `rounds` times, dropping every tenth future before its first poll and the
/// others after a random 0–4 ms; a call that got its lease in time drops its guard (released in
/// the background). Returns how many calls got a lease.
pub(crate) async fn drop_acquires_at_random<F, Fut>(rounds: usize, acquire: F) -> usize
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = crate::Result<crate::LockGuard>>,
{
    let mut completed = 0;
    for i in 0..rounds {
        let micros = rand::rng().random_range(0..4000);
        let fut = acquire();
        let res = if i % 10 == 0 {
            // Dropped before ever being polled.
            drop(fut);
            Err(())
        } else {
            tokio::time::timeout(Duration::from_micros(micros), fut)
                .await
                .map_err(|_| ())
        };
        if let Ok(guard) = res {
            completed += 1;
            drop(guard.unwrap());
        }
    }
    completed
}

/// Dropping acquire futures at random moments, hundreds of times, leaves no lease held.
pub async fn dropped_acquire_futures_leave_nothing_held(backend: Arc<dyn LockBackend>) {
    let name = unique_name("dropped");
    // A long expiry: the lock must end up free because leases were released, not expired.
    let p = builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Background contention: a holder that takes and releases the lock repeatedly.
    let churn = {
        let lock = p.lock(name.clone()).unwrap();
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(g) = lock
                    .acquire_timeout(Duration::from_millis(50))
                    .await
                    .unwrap()
                {
                    let hold = rand::rng().random_range(0..3);
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    g.release().await.unwrap();
                }
            }
        })
    };
    let lock = p.lock(name.clone()).unwrap();
    let completed = drop_acquires_at_random(300, || lock.acquire()).await;
    stop.store(true, Ordering::SeqCst);
    churn.await.unwrap();
    let free = eventually(Duration::from_secs(20), || async {
        !is_held(&backend, &name).await
    })
    .await;
    assert!(
        free,
        "a lease is still held after all acquire futures and guards were dropped"
    );
    eprintln!("{completed} of 300 acquire futures completed before being dropped");
}

/// Holding for three times the expiry keeps everyone else out (automatic extension).
pub async fn auto_extension_keeps_others_out(backend: Arc<dyn LockBackend>) {
    let name = unique_name("autoextend");
    let p = builder(&backend)
        .expiry(Duration::from_secs(1))
        .build()
        .unwrap();
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let first_expiry = g.expires_at();
    let other = provider(&backend);
    let got = other
        .lock(name.clone())
        .unwrap()
        .acquire_timeout(Duration::from_secs(3))
        .await
        .unwrap();
    assert!(
        got.is_none(),
        "another holder got in while the lease was being extended"
    );
    assert!(!g.is_lost());
    assert!(g.expires_at() > first_expiry + Duration::from_secs(1));
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert!(info.held);
    assert_eq!(info.lease_id.as_ref(), Some(g.lease_id()));
    assert_eq!(info.fencing_token, Some(g.fencing_token()));
    g.release().await.unwrap();
}

/// Every bad input gives a typed error that names what to change; the backend is never called.
pub async fn bad_input_is_rejected_before_the_backend(backend: Arc<dyn LockBackend>) {
    let counting = Counting::new(backend.clone());
    let shared: Arc<dyn LockBackend> = counting.clone();
    let p = builder(&shared).build().unwrap();

    let empty = p.lock("").unwrap_err();
    assert!(matches!(empty, Error::InvalidName { .. }), "{empty}");
    assert!(empty.to_string().contains("empty"), "{empty}");
    let long = p.lock("x".repeat(1025)).unwrap_err();
    assert!(matches!(long, Error::InvalidName { .. }));
    assert!(long.to_string().contains("1024"), "{long}");
    assert!(p.lock("x".repeat(1024)).is_ok());
    assert!(p.lock("é".repeat(513)).is_err(), "the limit counts bytes");

    let opt = |e: Error| match e {
        Error::InvalidOptions { option, reason } => (option, reason),
        other => panic!("expected InvalidOptions, got {other:?}"),
    };
    let (o, r) = opt(builder(&shared).expiry(Duration::ZERO).build().unwrap_err());
    assert_eq!(o, "expiry");
    assert!(r.contains("positive"), "{r}");
    let (o, _) = opt(builder(&shared)
        .expiry(Duration::from_secs(400 * 86400))
        .build()
        .unwrap_err());
    assert_eq!(o, "expiry");
    let (o, r) = opt(builder(&shared)
        .expiry(Duration::from_secs(10))
        .extension_cadence(Duration::from_secs(10))
        .build()
        .unwrap_err());
    assert_eq!(o, "extension_cadence");
    assert!(r.contains("below the expiry"), "{r}");
    let (o, _) = opt(builder(&shared)
        .extension_cadence(Duration::from_secs(31))
        .build()
        .unwrap_err());
    assert_eq!(o, "extension_cadence");
    let (o, _) = opt(builder(&shared)
        .extension_cadence(Duration::ZERO)
        .build()
        .unwrap_err());
    assert_eq!(o, "extension_cadence");
    let (o, r) = opt(builder(&shared)
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_millis(900),
            Duration::from_millis(100),
        ))
        .build()
        .unwrap_err());
    assert_eq!(o, "wait_strategy");
    assert!(r.contains("min <= max"), "{r}");

    let lock = p.lock("fine").unwrap();
    assert!(matches!(
        lock.clone().with_expiry(Duration::ZERO),
        Err(Error::InvalidOptions {
            option: "expiry",
            ..
        })
    ));
    assert!(matches!(
        p.acquire_for("k", Duration::ZERO, Timeout::Zero).await,
        Err(Error::InvalidOptions { .. })
    ));
    assert!(matches!(
        p.acquire_for("", Duration::from_secs(1), Timeout::Forever)
            .await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        p.inspect("").await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        p.force_release("").await,
        Err(Error::InvalidName { .. })
    ));
    assert_eq!(
        counting.calls.load(Ordering::SeqCst),
        0,
        "bad input reached the backend"
    );

    // extend(0) on a held guard is refused locally too.
    let g = lock.acquire().await.unwrap();
    let calls = counting.calls.load(Ordering::SeqCst);
    assert!(matches!(
        g.extend(Duration::ZERO).await,
        Err(Error::InvalidOptions { option: "ttl", .. })
    ));
    assert_eq!(counting.calls.load(Ordering::SeqCst), calls);
    g.release().await.unwrap();
}

/// Inspection shows the holder's lease id, token, metadata and times; listing includes it.
pub async fn inspect_and_list_show_the_holder(backend: Arc<dyn LockBackend>) {
    let name = unique_name("inspect");
    let p = provider(&backend);
    assert_eq!(p.inspect(&name).await.unwrap(), None);
    assert!(!p.force_release(&name).await.unwrap());
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let info = p.inspect(&name).await.unwrap().expect("lock exists");
    assert_eq!(info.name, name);
    assert!(info.held);
    assert_eq!(info.lease_id.as_ref(), Some(g.lease_id()));
    assert_eq!(info.fencing_token, Some(g.fencing_token()));
    let holder = info.holder.clone().expect("holder metadata");
    assert_eq!(holder.pid, std::process::id());
    assert_eq!(holder.app_name.as_deref(), Some("mongolock-contract"));
    assert!(!holder.host.is_empty());
    assert_eq!(info.acquired_at, Some(g.acquired_at()));
    assert_eq!(info.expires_at, Some(g.expires_at()));
    assert!(info.observed_at >= g.acquired_at());
    assert!(info.observed_at < g.expires_at());

    let other = unique_name("inspect-other");
    let g2 = p.lock(other.clone()).unwrap().acquire().await.unwrap();
    let all = p.list().await.unwrap();
    let names: HashSet<&str> = all.iter().map(|i| i.name.as_str()).collect();
    assert!(
        names.contains(name.as_str()) && names.contains(other.as_str()),
        "{names:?}"
    );
    assert!(
        all.windows(2).all(|w| w[0].name < w[1].name),
        "list is sorted by name"
    );
    assert!(all
        .iter()
        .filter(|i| i.name == name || i.name == other)
        .all(|i| i.held));

    let token = g.fencing_token();
    g.release().await.unwrap();
    g2.release().await.unwrap();
    let info = p.inspect(&name).await.unwrap().unwrap();
    assert!(!info.held);
    assert_eq!(info.lease_id, None);
    assert_eq!(info.fencing_token, Some(token));
}

/// force_release ends a live lease; the holder's guard learns of it at its next extension.
pub async fn force_release_ends_the_lease_and_signals_loss(backend: Arc<dyn LockBackend>) {
    let name = unique_name("force");
    let p = builder(&backend)
        .expiry(Duration::from_secs(3))
        .extension_cadence(Duration::from_millis(200))
        .build()
        .unwrap();
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let lost = g.lost();
    assert!(!lost.is_lost());
    assert!(p.force_release(&name).await.unwrap());
    assert!(
        !p.force_release(&name).await.unwrap(),
        "nothing left to end"
    );
    tokio::time::timeout(Duration::from_secs(5), lost.clone())
        .await
        .expect("lost fires after force-release");
    assert!(lost.is_lost() && g.is_lost());
    let next = p
        .lock(name.clone())
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(next.fencing_token() > g.fencing_token());
    assert!(matches!(g.release().await, Err(Error::LeaseLost { .. })));
    next.release().await.unwrap();
}

/// Dropping a guard releases its lease in the background and completes its lost signal.
pub async fn dropping_a_guard_releases(backend: Arc<dyn LockBackend>) {
    let name = unique_name("drop");
    let p = builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    let lost = g.lost();
    drop(g);
    tokio::time::timeout(Duration::from_secs(5), lost.clone())
        .await
        .expect("the signal completes when the guard is dropped");
    assert!(!lost.is_lost(), "a dropped guard is not a lost lease");
    assert!(
        eventually(Duration::from_secs(10), || async {
            !is_held(&backend, &name).await
        })
        .await
    );
}

/// A `release()` future dropped before it completes (after one poll, so the release has
/// started) still ends the lease: nothing stays held until expiry.
pub async fn dropping_a_release_future_still_releases(backend: Arc<dyn LockBackend>) {
    let name = unique_name("drop-release");
    let p = builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    for _ in 0..20 {
        let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
        let mut release = Box::pin(g.release());
        // Poll once, then drop the future mid-way.
        let _ = futures_util::poll!(&mut release);
        drop(release);
        assert!(
            eventually(Duration::from_secs(10), || async {
                !is_held(&backend, &name).await
            })
            .await,
            "a dropped release future left the lease held"
        );
    }
}

/// The `acquire_for(key, ttl, timeout)` form.
pub async fn acquire_for_with_ttl_and_timeout(backend: Arc<dyn LockBackend>) {
    let key = unique_name("door:front");
    let p = provider(&backend);
    let g = p
        .acquire_for(&key, Duration::from_secs(30), Timeout::Zero)
        .await
        .unwrap()
        .expect("free");
    let ttl = g.expires_at().duration_since(g.acquired_at()).unwrap();
    assert!(
        ttl >= Duration::from_millis(29_990) && ttl <= Duration::from_millis(30_010),
        "{ttl:?}"
    );
    let none = p
        .acquire_for(&key, Duration::from_secs(30), Duration::from_millis(200))
        .await
        .unwrap();
    assert!(none.is_none());
    g.release().await.unwrap();
    let again = p
        .acquire_for(&key, Duration::from_secs(1), Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("free again");
    again.release().await.unwrap();
}

/// A repeated release by the owner (a retry after a lost reply) reports success; a lease that
/// someone else ended (force-release, expiry and takeover) reports false.
pub async fn release_is_idempotent_for_the_owner(backend: Arc<dyn LockBackend>) {
    let name = unique_name("idempotent");
    let request = |lease_id: &LeaseId, ttl: Duration| AcquireRequest {
        mode: crate::LeaseMode::Exclusive,
        name: name.clone(),
        lease_id: lease_id.clone(),
        ttl,
        holder: crate::HolderInfo::current(None),
    };
    let granted = |a: Attempt| matches!(a, Attempt::Acquired(_));
    let long = Duration::from_secs(60);

    let first = LeaseId::random();
    assert!(granted(
        backend.try_acquire(&request(&first, long)).await.unwrap()
    ));
    assert!(backend.release(&name, &first).await.unwrap());
    assert!(
        backend.release(&name, &first).await.unwrap(),
        "a repeated release by the owner reports success"
    );
    assert!(!backend.inspect(&name).await.unwrap().unwrap().held);

    // Still recognised after another holder took and released the name...
    let second = LeaseId::random();
    assert!(granted(
        backend.try_acquire(&request(&second, long)).await.unwrap()
    ));
    assert!(backend.release(&name, &second).await.unwrap());
    assert!(backend.release(&name, &first).await.unwrap());
    // ...and a repeated release never touches the current holder's lease.
    let third = LeaseId::random();
    assert!(granted(
        backend.try_acquire(&request(&third, long)).await.unwrap()
    ));
    assert!(backend.release(&name, &first).await.unwrap());
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert!(
        info.held && info.lease_id.as_ref() == Some(&third),
        "{info:?}"
    );

    // Force-released: someone else ended it.
    assert!(backend.force_release(&name).await.unwrap());
    assert!(!backend.release(&name, &third).await.unwrap());

    // Expired and taken over: someone else took it.
    let short = LeaseId::random();
    assert!(granted(
        backend
            .try_acquire(&request(&short, Duration::from_millis(200)))
            .await
            .unwrap()
    ));
    let taker = LeaseId::random();
    let took = eventually(Duration::from_secs(30), || async {
        granted(backend.try_acquire(&request(&taker, long)).await.unwrap())
    })
    .await;
    assert!(took, "the expired lease of {name} was never taken over");
    assert!(!backend.release(&name, &short).await.unwrap());
    assert!(backend.release(&name, &taker).await.unwrap());
}

/// A backend whose grants are applied but whose replies are lost while `lose` is set.
struct LosesReplies {
    inner: Arc<dyn LockBackend>,
    lose: AtomicBool,
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

/// An acquire call that ends without a lease after an attempt whose reply was lost — by
/// returning the error, by its timeout, or by being dropped — releases the grant it may have
/// left, so the name is free again long before the lease could expire.
pub async fn a_lost_grant_is_released_when_the_call_gives_up(backend: Arc<dyn LockBackend>) {
    let lossy = Arc::new(LosesReplies {
        inner: backend.clone(),
        lose: AtomicBool::new(true),
    });
    let p = LockProvider::builder_shared(lossy)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    for form in ["try_acquire", "acquire_timeout", "dropped"] {
        let name = unique_name(form);
        let lock = p.lock(name.clone()).unwrap();
        match form {
            "try_acquire" => {
                let err = lock.try_acquire().await.unwrap_err();
                assert!(err.is_transient(), "{err}");
            }
            "acquire_timeout" => {
                let err = lock
                    .acquire_timeout(Duration::from_millis(300))
                    .await
                    .unwrap_err();
                assert!(err.is_transient(), "{err}");
            }
            _ => {
                // Dropped while retrying.
                let r = tokio::time::timeout(Duration::from_millis(300), lock.acquire()).await;
                assert!(r.is_err(), "acquire cannot succeed while replies are lost");
            }
        }
        let info = backend.inspect(&name).await.unwrap();
        let freed = eventually(Duration::from_secs(30), || async {
            !backend.inspect(&name).await.unwrap().unwrap().held
        })
        .await;
        assert!(freed, "{form}: {name} still held (first read {info:?})");
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

/// Waits until the backend reports live notifications (generous deadline).
pub(crate) async fn until_live(backend: &Arc<dyn LockBackend>) {
    assert!(
        eventually(Duration::from_secs(30), || async {
            backend.live_notifications()
        })
        .await,
        "the backend declares notifications but never reported them live"
    );
}

/// Polling alone would sleep 30-40 s between attempts: only a notification ends a wait sooner.
pub(crate) fn slow_polling() -> WaitStrategy {
    WaitStrategy::random_sleep(Duration::from_secs(30), Duration::from_secs(40))
}

/// A force-release is signalled to the holder at once (its next extension is 20 s away).
pub async fn force_release_is_signalled_to_the_holder_at_once(backend: Arc<dyn LockBackend>) {
    let name = unique_name("forced");
    let p = builder(&backend)
        .expiry(Duration::from_secs(60))
        .build()
        .expect("valid options");
    until_live(&backend).await;
    let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    assert!(!g.is_lost());
    let forced_at = Instant::now();
    assert!(backend.force_release(&name).await.unwrap());
    let told = tokio::time::timeout(Duration::from_secs(15), g.lost().wait()).await;
    assert!(
        told.is_ok(),
        "{name}: the holder (token {}) was not told of the force-release within 15 s",
        g.fencing_token()
    );
    assert!(g.is_lost(), "{name}: reason {:?}", g.lost_reason());
    eprintln!(
        "{name}: loss signalled {:?} after the force-release",
        forced_at.elapsed()
    );
}

/// A release wakes a waiting acquirer at once (it would otherwise sleep 30-40 s).
pub async fn a_release_wakes_a_waiter_at_once(backend: Arc<dyn LockBackend>) {
    let name = unique_name("wake");
    let p = LockProvider::builder_shared(backend.clone())
        .expiry(Duration::from_secs(60))
        .wait_strategy(slow_polling())
        .build()
        .expect("valid options");
    until_live(&backend).await;
    for round in 0..3 {
        let g = p.lock(name.clone()).unwrap().acquire().await.unwrap();
        let token = g.fencing_token();
        let waiter = {
            let (p, name) = (p.clone(), name.clone());
            tokio::spawn(async move {
                p.lock(name)
                    .unwrap()
                    .acquire_timeout(Duration::from_secs(25))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        g.release().await.unwrap();
        let got = waiter.await.unwrap().unwrap();
        let took = released_at.elapsed();
        let got = got.unwrap_or_else(|| {
            panic!("{name} round {round}: the waiter was not woken by the release (token {token})")
        });
        assert!(
            took < Duration::from_secs(15),
            "{name} round {round}: woken {took:?} after the release"
        );
        assert!(got.fencing_token() > token);
        got.release().await.unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `waiters + 1` tasks of one provider hand the lock `name` around until `handoffs` handoffs
/// happened; see [`hand_around_among`].
pub async fn hand_around(
    provider: &LockProvider,
    name: &str,
    waiters: usize,
    handoffs: usize,
) -> Vec<Duration> {
    hand_around_among(std::slice::from_ref(provider), name, waiters + 1, handoffs).await
}

/// `tasks_each` tasks of every provider (each provider standing for a process) hand the lock
/// `name` around until `handoffs` handoffs happened (a task that released sits out until
/// someone else holds the lock, so every release is a handoff; then each task takes the lock
/// once more and stops). Asserts that there are never two holders, that no holder is told its
/// lease is gone while it holds it, that tokens grow in acquisition order and that the tasks
/// finish within 120 s; returns the handoff latencies (release → next holder).
pub async fn hand_around_among(
    providers: &[LockProvider],
    name: &str,
    tasks_each: usize,
    handoffs: usize,
) -> Vec<Duration> {
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let generation = Arc::new(tokio::sync::watch::channel(0_u64).0);
    let mut tasks = Vec::new();
    for provider in providers
        .iter()
        .flat_map(|p| std::iter::repeat_n(p, tasks_each))
    {
        let lock = provider.lock(name).expect("valid name");
        let (inside, tokens, released_at, samples, generation) = (
            inside.clone(),
            tokens.clone(),
            released_at.clone(),
            samples.clone(),
            generation.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rx = generation.subscribe();
            loop {
                let g = lock.acquire().await.expect("acquire");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokens.lock().unwrap().push(g.fencing_token());
                generation.send_modify(|g| *g += 1);
                let mine = *generation.borrow();
                if let Some(r) = released_at.lock().unwrap().take() {
                    samples.lock().unwrap().push(r.elapsed());
                }
                let done = samples.lock().unwrap().len() >= handoffs;
                tokio::time::sleep(Duration::from_millis(2)).await;
                assert!(!g.is_lost(), "a holder was told its lease is gone");
                inside.fetch_sub(1, Ordering::SeqCst);
                if !done {
                    *released_at.lock().unwrap() = Some(Instant::now());
                }
                g.release().await.expect("release");
                if done {
                    return;
                }
                let _ = rx.wait_for(|g| *g > mine).await;
            }
        }));
    }
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(120), t).await {
            Ok(Ok(())) => {}
            // An assertion of a task failed: fail with its message.
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(Err(e)) => panic!("{name}: a handing-around task ended: {e}"),
            Err(_) => panic!("{name}: handoffs did not finish in 120 s (a waiter was not woken?)"),
        }
    }
    let tokens = tokens.lock().unwrap().clone();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "{name}: tokens must grow in acquisition order: {tokens:?}"
    );
    let samples = samples.lock().unwrap().clone();
    assert!(
        samples.len() >= handoffs,
        "{name}: {} handoffs",
        samples.len()
    );
    samples
}

/// Nine tasks of one process (one holder, eight waiters, polling only every 30-40 s) hand one
/// lock around 30 times: each release wakes one waiter at once — not all eight (fewer than six
/// attempts per handoff) — tokens grow in acquisition order and no holder is told its lease is
/// gone while it holds it.
pub async fn handoffs_are_prompt_and_do_not_stampede(backend: Arc<dyn LockBackend>) {
    const WAITERS: usize = 8;
    const HANDOFFS: usize = 30;
    let name = unique_name("handoff");
    until_live(&backend).await;
    let counting = Arc::new(CountingAll {
        inner: backend.clone(),
        acquires: AtomicUsize::new(0),
    });
    let p = LockProvider::builder_shared(counting.clone())
        .wait_strategy(slow_polling())
        .build()
        .expect("valid options");
    let samples = hand_around(&p, &name, WAITERS, HANDOFFS).await;
    let attempts = counting.acquires.load(Ordering::SeqCst);
    let m = median(samples.clone());
    eprintln!(
        "{name}: handoff median {m:?}, max {:?}; {:.1} attempts per handoff",
        samples.iter().max(),
        attempts as f64 / HANDOFFS as f64
    );
    assert!(m < Duration::from_secs(5), "{name}: median handoff {m:?}");
    // A stampede would be at least 8 attempts per release; the first use of a name may add a
    // few.
    assert!(
        attempts < (HANDOFFS + 1) * 6,
        "{name}: {attempts} attempts for {HANDOFFS} handoffs"
    );
}
