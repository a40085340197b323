//! Contract cases of leader election ([`Election`](crate::election::Election)): one leader at
//! a time with growing terms, resign and crash handovers, lost leadership, observers, dropped
//! `run` futures and input checks. Every backend runs them through
//! [`contract_suite!`](crate::contract_suite); a case builds its candidates' providers with
//! [`Env::with_backend_factory`] when the backend has one (a client per candidate, as separate
//! processes would have), else over the shared [`Env::backend`].

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::election::{ElectionEvent, ElectionEvents, LeaderInfo, LeaderWatch, Leadership};
use crate::testing::{eventually, Env};
use crate::{Error, LockBackend, LockProvider, WaitStrategy};

/// Builds a provider on the backend under test. Called inside whatever runtime will use the
/// provider (the crash scenario gives each candidate its own runtime), so a backend with
/// runtime-bound resources (a MongoDB client) creates them there.
type MakeProvider =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = LockProvider> + Send>> + Send + Sync>;

/// Providers over a new backend from the env's factory, or over its shared backend.
fn make_provider(env: &Env) -> MakeProvider {
    match &env.backend_factory {
        Some(factory) => {
            let factory = factory.clone();
            Arc::new(move || {
                let factory = factory.clone();
                Box::pin(async move { provider_over(factory().await) })
            })
        }
        None => {
            let backend = env.backend.clone();
            Arc::new(move || {
                let backend = backend.clone();
                Box::pin(async move { provider_over(backend) })
            })
        }
    }
}

impl Env {
    /// A provider for one candidate (see [`make_provider`]).
    async fn provider(&self) -> LockProvider {
        make_provider(self)().await
    }
}

/// Test app name stored with every lease.
const APP: &str = "mongolock-election-test";

/// The provider options the scenarios use: fast waits, so handovers are quick.
fn provider_over(backend: Arc<dyn LockBackend>) -> LockProvider {
    LockProvider::builder_shared(backend)
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_millis(1),
            Duration::from_millis(15),
        ))
        .app_name(APP)
        .build()
        .expect("valid options")
}

/// A unique role name per test run.
fn unique_role(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// Counts the leader functions running at once, and records every term they ran for.
#[derive(Default)]
struct Tracker {
    current: AtomicUsize,
    max: AtomicUsize,
    terms: Mutex<Vec<(usize, u64)>>,
}

/// Held by a running leader function; dropping it (the function returned or was cancelled)
/// leaves.
struct Entered(Arc<Tracker>);

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.current.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Tracker {
    pub fn enter(self: &Arc<Self>, candidate: usize, term: u64) -> Entered {
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        self.terms.lock().unwrap().push((candidate, term));
        Entered(self.clone())
    }

    pub fn terms(&self) -> Vec<(usize, u64)> {
        self.terms.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.terms.lock().unwrap().len()
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    pub fn current(&self) -> usize {
        self.current.load(Ordering::SeqCst)
    }
}

/// A future completing when `rx` says stop (or its sender is gone).
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Reads every event until the stream ends (all elections and leaderships dropped).
async fn drain(mut events: ElectionEvents) -> Vec<ElectionEvent> {
    let mut all = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
            Ok(Some(e)) => all.push(e),
            Ok(None) => return all,
            Err(_) => {
                panic!("the event stream did not end after its election was dropped: {all:?}")
            }
        }
    }
}

/// Checks that events come in pairs: `Elected{t}` then exactly one of `Lost{t}` / `Resigned{t}`.
/// Returns the elected terms.
fn check_event_pairs(events: &[ElectionEvent]) -> Vec<u64> {
    assert!(
        events.len().is_multiple_of(2),
        "unpaired events: {events:?}"
    );
    let mut terms = Vec::new();
    for pair in events.chunks(2) {
        match (pair[0], pair[1]) {
            (ElectionEvent::Elected { term: a }, ElectionEvent::Resigned { term: b })
            | (ElectionEvent::Elected { term: a }, ElectionEvent::Lost { term: b })
                if a == b =>
            {
                terms.push(a)
            }
            other => panic!("events out of order: {other:?} in {events:?}"),
        }
    }
    terms
}

async fn next_event(events: &mut ElectionEvents) -> ElectionEvent {
    tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("an event within 10 s")
        .expect("the stream goes on")
}

async fn next_leader(watch: &mut LeaderWatch) -> Option<LeaderInfo> {
    tokio::time::timeout(Duration::from_secs(10), watch.next_change())
        .await
        .expect("a leader change within 10 s")
        .unwrap()
}

fn assert_strictly_increasing(terms: &[(usize, u64)]) {
    for w in terms.windows(2) {
        assert!(
            w[1].1 > w[0].1,
            "terms must strictly increase across handovers: {terms:?}"
        );
    }
}

/// Three candidates in separate tasks run leader functions that step down after a short while,
/// so leadership changes hands many times. Never two functions at once; every term larger than
/// the one before; events paired per candidate; nothing held after everyone stops.
pub async fn one_leader_at_a_time_and_terms_increase(env: &Env) {
    let role = unique_role("election-handovers");
    let tracker = Arc::new(Tracker::default());
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    for candidate in 0..3 {
        // A long expiry: at the end the role must be free because it was resigned, not
        // because a lease ran out.
        let election = env
            .provider()
            .await
            .election(role.clone())
            .unwrap()
            .with_expiry(Duration::from_secs(120))
            .unwrap()
            .with_rejoin_delay(Duration::from_millis(40));
        let events = election.events();
        let tracker = tracker.clone();
        let stop_rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let result = election
                .run_until(
                    |leader| {
                        let tracker = tracker.clone();
                        async move {
                            let _entered = tracker.enter(candidate, leader.term());
                            let ms = rand::random_range(10..60);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                    },
                    stopped(stop_rx),
                )
                .await;
            drop(election);
            (result, drain(events).await)
        }));
    }
    assert!(
        eventually(Duration::from_secs(60), || async { tracker.count() >= 15 }).await,
        "expected 15 terms within 60 s, got {:?}",
        tracker.terms()
    );
    stop.send(true).unwrap();
    let mut per_candidate = HashMap::new();
    for (candidate, task) in tasks.into_iter().enumerate() {
        let (result, events) = task.await.unwrap();
        result.unwrap();
        per_candidate.insert(candidate, check_event_pairs(&events));
    }
    assert_eq!(tracker.max(), 1, "two leaders at once");
    let terms = tracker.terms();
    assert_strictly_increasing(&terms);
    let leaders: HashSet<usize> = terms.iter().map(|(c, _)| *c).collect();
    assert!(
        leaders.len() >= 2,
        "leadership never changed hands: {terms:?}"
    );
    for (candidate, elected) in per_candidate {
        let ran: Vec<u64> = terms
            .iter()
            .filter(|(c, _)| *c == candidate)
            .map(|(_, t)| *t)
            .collect();
        // Every term the function ran for was announced; a term won just as `stop` fired may
        // have been resigned before its function started.
        assert!(
            ran.iter().all(|t| elected.contains(t)),
            "candidate {candidate}: ran {ran:?}, elected {elected:?}"
        );
        assert!(elected.len() <= ran.len() + 1);
    }
    // A campaign won just as `stop` fired is resigned in the background (its guard is dropped
    // unread); give that release a moment.
    let observer = env.provider().await.election(role).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            observer.leader().await.unwrap().is_none()
        })
        .await,
        "stopping must resign"
    );
}

/// A leads; B and C campaign. A resigns → exactly one of B, C leads soon, with a larger term;
/// it resigns → the last one leads.
pub async fn resign_hands_over_to_exactly_one_candidate(env: &Env) {
    let role = unique_role("election-resign");
    let mut elections = Vec::new();
    for _ in 0..3 {
        elections.push(env.provider().await.election(role.clone()).unwrap());
    }
    let first = tokio::time::timeout(Duration::from_secs(10), elections[0].campaign())
        .await
        .expect("an uncontended campaign wins at once")
        .unwrap();
    assert!(!first.is_lost());

    // Observers see the leader and its metadata.
    let info = elections[2].leader().await.unwrap().expect("a leader");
    assert_eq!(info.term, first.term());
    assert!(info.is(&first));
    assert_eq!(info.role, role);
    let holder = info.holder.clone().expect("holder metadata");
    assert_eq!(holder.pid, std::process::id());
    assert_eq!(holder.app_name.as_deref(), Some(APP));
    assert!(info.since.is_some());
    assert!(info.expires_at.expect("expiry") > info.observed_at);

    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Leadership)>();
    let mut waiting = Vec::new();
    for (i, election) in elections.iter().enumerate().skip(1) {
        let election = election.clone();
        let tx = tx.clone();
        waiting.push(tokio::spawn(async move {
            let leadership = election.campaign().await.unwrap();
            let _ = tx.send((i, leadership));
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        rx.try_recv().is_err(),
        "elected while another candidate leads"
    );

    let mut previous = first.term();
    first.resign().await.unwrap();
    let mut winners = HashSet::new();
    for _ in 0..2 {
        let (i, leadership) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a waiting candidate takes over within 10 s after a resignation")
            .unwrap();
        assert!(leadership.term() > previous, "terms must increase");
        previous = leadership.term();
        assert!(winners.insert(i));
        // Exactly one new leader: the other candidate keeps waiting.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(rx.try_recv().is_err(), "two candidates elected at once");
        let info = elections[0].leader().await.unwrap().expect("a leader");
        assert!(info.is(&leadership));
        leadership.resign().await.unwrap();
    }
    for task in waiting {
        task.await.unwrap();
    }
    assert!(elections[0].leader().await.unwrap().is_none());
}

/// A candidate running in its own runtime, so that it can crash: shutting the runtime down
/// stops its tasks (renewal included) without running any release.
struct Candidate {
    crash: Option<oneshot::Sender<()>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Option<crate::Result<()>>>>,
}

impl Candidate {
    fn spawn(index: usize, env: &Env, role: &str, expiry: Duration, tracker: Arc<Tracker>) -> Self {
        let (crash, crashed) = oneshot::channel::<()>();
        let (stop, stopped) = oneshot::channel::<()>();
        let make_provider = make_provider(env);
        let role = role.to_owned();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let outcome = runtime.block_on(async move {
                let task = tokio::spawn(async move {
                    let election = make_provider()
                        .await
                        .election(role)
                        .unwrap()
                        .with_expiry(expiry)
                        .unwrap();
                    election
                        .run_until(
                            |leader| {
                                let tracker = tracker.clone();
                                async move {
                                    let _entered = tracker.enter(index, leader.term());
                                    std::future::pending::<()>().await
                                }
                            },
                            async move {
                                let _ = stopped.await;
                            },
                        )
                        .await
                });
                tokio::select! {
                    _ = crashed => None,
                    result = task => Some(result.unwrap()),
                }
            });
            if outcome.is_none() {
                // The crash: every task is dropped without being polled again, and nothing
                // spawned from here on runs (so no release is sent).
                runtime.shutdown_background();
            }
            outcome
        });
        Candidate {
            crash: Some(crash),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    async fn join(&mut self) -> Option<crate::Result<()>> {
        let thread = self.thread.take().unwrap();
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap()
    }

    async fn crash(&mut self) {
        let _ = self.crash.take().unwrap().send(());
        assert!(
            self.join().await.is_none(),
            "the candidate ended before the crash"
        );
    }

    async fn stop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.join().await.expect("stopped, not crashed").unwrap();
    }
}

/// The leader's process "crashes" (its runtime is shut down; no release is sent). The lease stays
/// until it expires; then exactly one of the two other candidates leads, with a larger term.
pub async fn crashed_leader_is_replaced_once_after_expiry(env: &Env) {
    let role = unique_role("election-crash");
    let expiry = Duration::from_secs(2);
    let tracker = Arc::new(Tracker::default());
    let mut candidates: Vec<Candidate> = (0..3)
        .map(|i| Candidate::spawn(i, env, &role, expiry, tracker.clone()))
        .collect();
    let observer = env.provider().await.election(role).unwrap();

    assert!(
        eventually(Duration::from_secs(30), || async { tracker.count() == 1 }).await,
        "nobody was elected"
    );
    let (crashed, first_term) = tracker.terms()[0];
    candidates[crashed].crash().await;

    // The crash sent no release: the lease is still there until it expires.
    let info = observer
        .leader()
        .await
        .unwrap()
        .expect("the crashed leader's lease");
    assert_eq!(info.term, first_term);
    let last_expiry = info.expires_at.expect("expiry");

    assert!(
        eventually(expiry + Duration::from_secs(30), || async {
            tracker.count() >= 2
        })
        .await,
        "no new leader after the crashed leader's lease expired"
    );
    let (successor, second_term) = tracker.terms()[1];
    assert_ne!(successor, crashed);
    assert!(second_term > first_term);
    let info = observer
        .leader()
        .await
        .unwrap()
        .expect("the successor leads");
    assert_eq!(info.term, second_term);
    assert!(
        info.since.expect("since") >= last_expiry,
        "the successor was elected at {:?}, before the crashed leader's lease expired at \
         {last_expiry:?}",
        info.since
    );

    // Exactly one new leader: the third candidate keeps waiting.
    tokio::time::sleep(expiry + expiry / 2).await;
    assert_eq!(tracker.count(), 2, "{:?}", tracker.terms());
    assert_eq!(tracker.max(), 1, "two leaders at once");
    let info = observer
        .leader()
        .await
        .unwrap()
        .expect("the successor leads");
    assert_eq!(info.term, second_term);

    for (i, candidate) in candidates.iter_mut().enumerate() {
        if i != crashed {
            candidate.stop().await;
        }
    }
    assert_eq!(tracker.current(), 0);
    // A waiting candidate stopped after the leader resigned may have had an attempt in flight
    // that won the role; its grant is released in the background.
    assert!(
        eventually(Duration::from_secs(30), || async {
            observer.leader().await.unwrap().is_none()
        })
        .await,
        "the role is still held after every candidate stopped: {:?}",
        observer.leader().await
    );
}

/// The lease is force-released under the leader: the lost signal fires at the next extension,
/// the leader function is cancelled, `Lost` is emitted, and the loop campaigns and wins again.
pub async fn lost_leadership_cancels_the_function_and_campaigns_again(env: &Env) {
    let role = unique_role("election-lost");
    let provider = env.provider().await;
    // Long enough that a loaded machine cannot lose a term by a late extension before its
    // function first runs; the force-release is noticed by the backend's notifications or at
    // the next extension (a third of the expiry).
    let election = provider
        .election(role.clone())
        .unwrap()
        .with_expiry(Duration::from_secs(6))
        .unwrap();
    let mut events = election.events();
    let tracker = Arc::new(Tracker::default());
    let (stop, stop_rx) = watch::channel(false);
    let task = {
        let election = election.clone();
        let tracker = tracker.clone();
        tokio::spawn(async move {
            election
                .run_until(
                    |leader| {
                        let tracker = tracker.clone();
                        async move {
                            let _entered = tracker.enter(0, leader.term());
                            leader.lost().wait().await;
                            // Cancelled by the loop before getting here, or it would be counted
                            // as running past the loss.
                            std::future::pending::<()>().await
                        }
                    },
                    stopped(stop_rx),
                )
                .await
        })
    };
    let ElectionEvent::Elected { term: first } = next_event(&mut events).await else {
        panic!("expected Elected first")
    };
    // The event comes before the function runs; on a loaded machine the force-release could
    // otherwise end the term before its function ever started.
    assert!(
        eventually(Duration::from_secs(30), || async { tracker.count() == 1 }).await,
        "the function did not run in the first term: {:?}",
        tracker.terms()
    );
    assert!(provider.force_release(&role).await.unwrap());
    assert_eq!(
        next_event(&mut events).await,
        ElectionEvent::Lost { term: first }
    );
    let ElectionEvent::Elected { term: second } = next_event(&mut events).await else {
        panic!("expected to be elected again")
    };
    assert!(second > first);
    assert!(
        eventually(Duration::from_secs(30), || async { tracker.count() == 2 }).await,
        "the function did not run again: {:?}",
        tracker.terms()
    );
    assert_eq!(tracker.max(), 1, "the cancelled function still ran");
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
    assert_eq!(
        next_event(&mut events).await,
        ElectionEvent::Resigned { term: second }
    );
    assert_eq!(tracker.current(), 0);
    assert!(election.leader().await.unwrap().is_none());
}

/// `leader()` and `watch_leader()` follow the leader without campaigning; extensions are not
/// changes; dropping the watch stops it.
pub async fn observe_without_campaigning(env: &Env) {
    let role = unique_role("election-observe");
    let observer = env
        .provider()
        .await
        .election(role.clone())
        .unwrap()
        .with_poll_interval(Duration::from_millis(50))
        .unwrap();
    assert!(observer.leader().await.unwrap().is_none());
    let mut watch = observer.watch_leader();
    assert_eq!(next_leader(&mut watch).await, None, "nobody leads yet");

    // Extensions every second (a third of the expiry): a loaded machine does not lose the term.
    let a = env
        .provider()
        .await
        .election(role.clone())
        .unwrap()
        .with_expiry(Duration::from_secs(3))
        .unwrap();
    let b = env.provider().await.election(role.clone()).unwrap();
    let la = a.campaign().await.unwrap();
    let seen = next_leader(&mut watch).await.expect("a leader");
    assert!(seen.is(&la));
    assert_eq!(seen.term, la.term());
    assert_eq!(
        seen.holder.as_ref().map(|h| (h.pid, h.app_name.clone())),
        Some((std::process::id(), Some(APP.to_owned())))
    );

    // 1.5 s with an extension in it are not leader changes.
    let quiet = tokio::time::timeout(Duration::from_millis(1500), watch.next_change()).await;
    assert!(quiet.is_err(), "extensions reported as a change: {quiet:?}");
    assert!(!la.is_lost());

    let first_term = la.term();
    la.resign().await.unwrap();
    assert_eq!(next_leader(&mut watch).await, None, "resigned");
    let lb = b.campaign().await.unwrap();
    let seen = next_leader(&mut watch).await.expect("the new leader");
    assert!(seen.is(&lb));
    assert!(seen.term > first_term);
    drop(lb); // resigns in the background
    assert_eq!(
        next_leader(&mut watch).await,
        None,
        "a dropped leadership resigns"
    );
    drop(watch);
}

/// Dropping a running `run` future (a task abort) releases leadership in the background, long
/// before the lease would expire, and leaves no task behind.
pub async fn dropping_the_run_future_leaves_nothing_held(env: &Env) {
    let role = unique_role("election-drop");
    let provider = env.provider().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let baseline = metrics.num_alive_tasks();
    let election = provider
        .election(role.clone())
        .unwrap()
        .with_expiry(Duration::from_secs(60))
        .unwrap();
    let tracker = Arc::new(Tracker::default());
    let task = {
        let election = election.clone();
        let tracker = tracker.clone();
        tokio::spawn(async move {
            election
                .run(|leader| {
                    let tracker = tracker.clone();
                    async move {
                        let _entered = tracker.enter(0, leader.term());
                        std::future::pending::<()>().await
                    }
                })
                .await
        })
    };
    assert!(eventually(Duration::from_secs(10), || async { tracker.count() == 1 }).await);
    let watch = election.watch_leader();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(tracker.current(), 0, "the leader function was not dropped");
    assert!(
        eventually(Duration::from_secs(10), || async {
            election.leader().await.unwrap().is_none()
        })
        .await,
        "leadership still held after the run future was dropped"
    );
    let other = env.provider().await.election(role).unwrap();
    let l = other
        .campaign_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free again");
    l.resign().await.unwrap();
    drop(watch);
    if env.no_background_tasks {
        assert!(
            eventually(Duration::from_secs(10), || async {
                metrics.num_alive_tasks() <= baseline
            })
            .await,
            "tasks left behind: {} alive, {baseline} before",
            metrics.num_alive_tasks()
        );
    }
}

/// `try_campaign` is one attempt; bad input is refused before the backend.
pub async fn try_campaign_and_input_checks(env: &Env) {
    let provider = env.provider().await;
    assert!(matches!(
        provider.election(""),
        Err(Error::InvalidName { .. })
    ));
    let role = unique_role("election-try");
    let election = provider.election(role.clone()).unwrap();
    assert!(matches!(
        election.clone().with_poll_interval(Duration::ZERO),
        Err(Error::InvalidOptions { .. })
    ));
    assert!(matches!(
        election.clone().with_expiry(Duration::ZERO),
        Err(Error::InvalidOptions { .. })
    ));
    assert_eq!(election.role(), role);

    let mut events = election.events();
    let leadership = election.try_campaign().await.unwrap().expect("free");
    let other = env.provider().await.election(role).unwrap();
    assert!(other.try_campaign().await.unwrap().is_none());
    assert!(other
        .campaign_timeout(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    let term = leadership.term();
    drop(leadership);
    assert_eq!(events.recv().await, Some(ElectionEvent::Elected { term }));
    assert_eq!(events.recv().await, Some(ElectionEvent::Resigned { term }));
    let again = other
        .campaign_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the dropped leadership was released");
    assert!(again.term() > term);
    again.resign().await.unwrap();
}
