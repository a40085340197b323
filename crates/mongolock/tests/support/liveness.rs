//! One liveness scenario for the backends with a cross-process handoff queue (`mongo/liveness.rs`
//! for MongoDB, `postgres/handoff.rs` for PostgreSQL): a free name reaches a live waiter fast,
//! whatever stands ahead of it in the queue — waiters of other processes that gave up (timed
//! out, dropped their acquire future), and processes that died or were stopped while queued.
//! The holder's lease is two minutes long; before waiters withdrew and MongoDB's waiters probed,
//! a live waiter behind two such entries waited until that lease's reported expiry.
//!
//! Each provider a [`Site`] makes stands for one process: a backend of its own, with its own
//! mark in the queue and its own change feed.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use mongolock::testing::eventually;
use mongolock::{LockBackend, LockProvider};
use tokio::time::Instant;

/// The lease of the holder: far beyond what any of these waits may take.
pub const HOLDER_TTL: Duration = Duration::from_secs(120);

/// How long after the release the live waiter may take the name at most: the probe period
/// (about a second) and the handoff fallback, with room for a loaded machine. Far below
/// [`HOLDER_TTL`], which is what it waited before.
pub const BOUND: Duration = Duration::from_secs(15);

/// What stands ahead of the live waiter in the queue.
#[derive(Clone, Copy, Debug)]
pub enum Ahead {
    /// Waiters of other processes whose `acquire_timeout` ran out.
    TimedOut,
    /// Waiters of other processes whose acquire futures were dropped.
    Dropped,
    /// Processes that died (or are stopped) while queued: entries nobody withdraws, written
    /// as such a process would have left them.
    Dead,
}

/// Where the scenario runs: one lock table or collection of one backend.
pub trait Site {
    /// A provider with a backend of its own (one "process"), leases of [`HOLDER_TTL`].
    fn provider(&self) -> impl Future<Output = LockProvider>;
    /// The marks in the queue of `name`, in queue order, as stored.
    fn queued(&self, name: &str) -> impl Future<Output = Vec<String>>;
    /// Puts entries for `marks` in the queue of `name` (held) that last an hour.
    fn plant_dead(&self, name: &str, marks: &[String]) -> impl Future<Output = ()>;
    /// What to print when something fails (the table or collection).
    fn describe(&self) -> String;
}

/// A backend's mark: the prefix of its lease ids, up to and including the first `-`.
pub fn mark_of(backend: &dyn LockBackend) -> String {
    let id = backend.new_lease_id();
    let id = id.as_str();
    id[..=id.find('-').expect("a marked lease id")].to_owned()
}

/// `count` processes queue on `name`, held for [`HOLDER_TTL`], then give up (or died while
/// queued), with a live waiter queued behind them. Those that gave up withdraw (operators no
/// longer see them waiting), and the live waiter holds the name within [`BOUND`] of the
/// release.
pub async fn live_waiter_behind(site: &impl Site, name: &str, ahead: Ahead, count: usize) {
    let state = |what: &str| {
        format!(
            "{what} ({ahead:?} x{count}, lock {name} in {})",
            site.describe()
        )
    };
    let holder = site.provider().await;
    let guard = holder.lock(name).unwrap().acquire().await.unwrap();

    // Those ahead queue first.
    let mut others = Vec::new();
    for _ in 0..count {
        others.push(site.provider().await);
    }
    let marks: Vec<String> = others.iter().map(|p| mark_of(&**p.backend())).collect();
    let mut tasks = Vec::new();
    match ahead {
        Ahead::Dead => site.plant_dead(name, &marks).await,
        Ahead::TimedOut | Ahead::Dropped => {
            for p in &others {
                let lock = p.lock(name).unwrap();
                tasks.push(tokio::spawn(async move {
                    match ahead {
                        Ahead::TimedOut => lock.acquire_timeout(Duration::from_secs(20)).await,
                        _ => lock.acquire().await.map(Some),
                    }
                    .map(|g| g.is_some())
                }));
            }
        }
    }
    let all_queued = eventually(Duration::from_secs(18), || async {
        let q = site.queued(name).await;
        marks.iter().all(|m| q.contains(m))
    })
    .await;
    assert!(
        all_queued,
        "{}: queue {:?}, expected {marks:?}",
        state("those ahead did not all queue"),
        site.queued(name).await
    );

    // The live waiter queues behind them.
    let waiter = site.provider().await;
    let waiter_mark = mark_of(&**waiter.backend());
    let lock = waiter.lock(name).unwrap();
    let waiting = tokio::spawn(async move {
        let got = lock
            .acquire_timeout(Duration::from_secs(100))
            .await
            .unwrap();
        (Instant::now(), got.map(|g| g.fencing_token()))
    });
    let behind = eventually(Duration::from_secs(20), || async {
        site.queued(name).await.contains(&waiter_mark)
    })
    .await;
    assert!(
        behind,
        "{}: queue {:?}",
        state("the live waiter did not queue"),
        site.queued(name).await
    );

    // Those ahead give up.
    match ahead {
        Ahead::Dead => {}
        Ahead::TimedOut => {
            for task in tasks {
                // Gave up: `None`, or the error of a last attempt still unanswered at the
                // deadline on a loaded machine; never the lock.
                match task.await.unwrap() {
                    Ok(got) => assert!(!got, "{}", state("a waiter ahead got the lock")),
                    Err(e) => eprintln!("a waiter ahead gave up with an error: {e}"),
                }
            }
        }
        Ahead::Dropped => tasks.iter().for_each(|t| t.abort()),
    }
    if !matches!(ahead, Ahead::Dead) {
        // They withdraw in the background; operators no longer see them waiting.
        let withdrawn = eventually(Duration::from_secs(20), || async {
            let q = site.queued(name).await;
            !q.iter().any(|m| marks.contains(m))
        })
        .await;
        assert!(
            withdrawn,
            "{}: queue {:?}, gave up: {marks:?}",
            state("waiters that gave up are still queued"),
            site.queued(name).await
        );
        let listed: Vec<String> = waiter
            .backend()
            .waiters(name)
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.id)
            .collect();
        assert_eq!(
            listed,
            vec![waiter_mark.clone()],
            "{}",
            state("waiters listed")
        );
    }

    let held_token = guard.fencing_token();
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (got_at, token) = waiting.await.unwrap();
    let waited = got_at.saturating_duration_since(released_at);
    eprintln!(
        "{ahead:?} x{count}: the live waiter took the lock {waited:?} after the release (holder's lease {HOLDER_TTL:?})"
    );
    let token = token.unwrap_or_else(|| panic!("{}", state("the live waiter never got the lock")));
    assert!(
        token > held_token,
        "{}: token {token} after {held_token}",
        state("tokens")
    );
    assert!(
        waited < BOUND,
        "{}: waited {waited:?} after the release",
        state("the live waiter was held up")
    );
    drop(others);
}
