//! The harness the contract cases run in: the [`Env`] a backend's `setup` returns, and the
//! helpers the cases share (unique names, fast-polling providers, [`eventually`], and the
//! handing-around drivers [`hand_around`] and [`hand_around_among`], which backend-specific tests
//! use too).

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::{LockBackend, LockBackendExt, LockProvider, LockProviderBuilder, WaitStrategy};

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
    /// Builds another backend on the same storage, inside the runtime that awaits it (its own
    /// client or pool, as another process would have): the election cases give each candidate
    /// one. `None`: they share [`backend`](Env::backend).
    pub backend_factory: Option<BackendFactory>,
    /// Whether the backend runs no tasks of its own, so that a case may check that nothing is
    /// left running by counting the runtime's alive tasks.
    pub no_background_tasks: bool,
}

/// Builds a backend on the storage of an [`Env`] (see [`Env::with_backend_factory`]).
pub type BackendFactory =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Arc<dyn LockBackend>> + Send>> + Send + Sync>;

impl Env {
    /// A backend with nothing to keep alive and no declared notifications.
    pub fn new(backend: Arc<dyn LockBackend>) -> Env {
        Env {
            backend,
            keep_alive: Box::new(()),
            notifications: false,
            backend_factory: None,
            no_background_tasks: false,
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

    /// Gives the cases a way to build further backends on the same storage, each inside the
    /// runtime that awaits `factory()` (a backend with runtime-bound resources, such as a
    /// MongoDB client or a connection pool, creates them there).
    pub fn with_backend_factory<F, Fut>(mut self, factory: F) -> Env
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Arc<dyn LockBackend>> + Send + 'static,
    {
        self.backend_factory = Some(Arc::new(move || Box::pin(factory())));
        self
    }

    /// Declares that the backend runs no tasks of its own (as the memory backend): cases then
    /// check that nothing is left running by counting the runtime's alive tasks.
    pub fn without_background_tasks(mut self) -> Env {
        self.no_background_tasks = true;
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

pub(crate) async fn is_held(backend: &Arc<dyn LockBackend>, name: &str) -> bool {
    backend
        .inspect(name)
        .await
        .expect("inspect")
        .is_some_and(|i| i.held)
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
