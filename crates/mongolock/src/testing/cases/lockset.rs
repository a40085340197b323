//! The contract cases of lock sets ([`LockSet`](crate::LockSet)), run by every backend through
//! [`contract_suite!`](crate::contract_suite).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::{builder, eventually, provider, unique_name};
use crate::{Error, LockBackend};

/// The names of `names` that `backend` reports held.
async fn held_names(backend: &Arc<dyn LockBackend>, names: &[String]) -> Vec<String> {
    let mut held = Vec::new();
    for name in names {
        if backend
            .inspect(name)
            .await
            .expect("inspect")
            .is_some_and(|i| i.held)
        {
            held.push(name.clone());
        }
    }
    held
}

/// 16 tasks on 3 providers take overlapping sets written in opposite orders ({a,b} and {b,a},
/// and the triples {a,b,c} and {c,b,a}, {b,c} and {c,a}): every task finishes (no deadlock),
/// no two holders are ever inside one name together, each name's tokens grow in the order its
/// holders entered, and every set guard holds every name it was asked for.
pub async fn lock_sets_in_opposite_orders_never_deadlock(backend: Arc<dyn LockBackend>) {
    const TASKS: usize = 16;
    const ROUNDS: usize = 8;
    let providers: Vec<_> = (0..3).map(|_| provider(&backend)).collect();
    let base = unique_name("set");
    let [a, b, c] = ["a", "b", "c"].map(|n| format!("{base}-{n}"));
    let orders: [Vec<String>; 6] = [
        vec![a.clone(), b.clone()],
        vec![b.clone(), a.clone()],
        vec![a.clone(), b.clone(), c.clone()],
        vec![c.clone(), b.clone(), a.clone()],
        vec![b.clone(), c.clone()],
        vec![c.clone(), a.clone()],
    ];
    // Per name: how many holders are inside, and the tokens in the order holders entered.
    let inside: Arc<HashMap<String, AtomicUsize>> = Arc::new(
        [&a, &b, &c]
            .into_iter()
            .map(|n| (n.clone(), AtomicUsize::new(0)))
            .collect(),
    );
    let tokens: Arc<Mutex<HashMap<String, Vec<u64>>>> = Arc::default();
    let progress: Arc<Vec<AtomicUsize>> =
        Arc::new((0..TASKS).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let asked = orders[task % orders.len()].clone();
        let set = providers[task % providers.len()]
            .lock_set(asked.clone())
            .expect("valid names");
        let (inside, tokens, progress) = (inside.clone(), tokens.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let guard = set.acquire().await.expect("acquire the set");
                let mut sorted = asked.clone();
                sorted.sort();
                assert_eq!(
                    guard.names().collect::<Vec<_>>(),
                    sorted,
                    "task {task} round {round}: the guard does not hold the names asked for"
                );
                for name in &asked {
                    let token = guard.fencing_token(name).expect("a token per name");
                    let before = inside[name].fetch_add(1, Ordering::SeqCst);
                    assert_eq!(
                        before, 0,
                        "task {task} round {round}: {name:?} (token {token}) entered with \
                         {before} other holder(s) inside"
                    );
                    tokens
                        .lock()
                        .unwrap()
                        .entry(name.clone())
                        .or_default()
                        .push(token);
                }
                assert!(!guard.is_lost(), "task {task} round {round}: lost at once");
                tokio::task::yield_now().await;
                if rand::rng().random_bool(0.5) {
                    let hold = rand::rng().random_range(1..4);
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                }
                for name in &asked {
                    inside[name].fetch_sub(1, Ordering::SeqCst);
                }
                guard.release().await.expect("release the set");
                progress[task].fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.expect("task");
        }
    };
    if tokio::time::timeout(Duration::from_secs(180), all)
        .await
        .is_err()
    {
        let stuck: Vec<String> = progress
            .iter()
            .enumerate()
            .filter(|(_, p)| p.load(Ordering::SeqCst) < ROUNDS)
            .map(|(t, p)| {
                format!(
                    "task {t} {:?}: {} of {ROUNDS} rounds",
                    orders[t % orders.len()],
                    p.load(Ordering::SeqCst)
                )
            })
            .collect();
        let held = held_names(&backend, &[a.clone(), b.clone(), c.clone()]).await;
        panic!("lock sets did not finish within 180 s (deadlock?); held now: {held:?}; {stuck:#?}");
    }
    let tokens = tokens.lock().unwrap().clone();
    for (name, seq) in tokens.iter() {
        assert!(
            seq.windows(2).all(|w| w[0] < w[1]),
            "{name}: fencing tokens must strictly grow in the order holders entered: {seq:?}"
        );
    }
    let total: usize = tokens.values().map(Vec::len).sum();
    let expected: usize = (0..TASKS)
        .map(|t| orders[t % orders.len()].len() * ROUNDS)
        .sum();
    assert_eq!(
        total, expected,
        "every round of every task entered every name"
    );
    assert!(
        held_names(&backend, &[a, b, c]).await.is_empty(),
        "a name is still held after every set was released"
    );
}

/// A set that cannot get one of its names within its timeout (or in one attempt) returns `None`
/// and holds nothing afterwards: the names it took before the busy one were released before the
/// call returned. Once the busy name is free, the set is acquired whole.
pub async fn a_timed_out_lock_set_leaves_nothing_held(backend: Arc<dyn LockBackend>) {
    let base = unique_name("set-timeout");
    let names: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| format!("{base}-{n}"))
        .collect();
    // A long expiry: names must be free because they were released, not because they expired.
    let p = builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    let other = provider(&backend);
    let blocker = other
        .lock(names[2].clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let set = p.lock_set(names.iter().rev().cloned()).unwrap();
    let started = Instant::now();
    let got = set
        .acquire_timeout(Duration::from_millis(600))
        .await
        .expect("acquire_timeout");
    assert!(
        got.is_none(),
        "the set was acquired while {:?} was held by another provider",
        names[2]
    );
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "acquire_timeout gave up after {:?}, before its 600 ms",
        started.elapsed()
    );
    for name in &names[..2] {
        let info = backend
            .inspect(name)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name:?} was never taken by the set"));
        assert!(
            !info.held,
            "{name:?} is still held (token {:?}, holder {:?}) after the set timed out",
            info.fencing_token, info.holder
        );
    }
    let tokens_before: Vec<Option<u64>> = {
        let mut v = Vec::new();
        for name in &names[..2] {
            v.push(backend.inspect(name).await.unwrap().unwrap().fencing_token);
        }
        v
    };
    // One attempt per name: the same.
    assert!(set.try_acquire().await.unwrap().is_none());
    let held = held_names(&backend, &names).await;
    assert_eq!(
        held,
        [names[2].clone()],
        "after a failed try_acquire only the blocker's name may be held"
    );
    blocker.release().await.unwrap();
    let guard = set
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the set once every name is free");
    for (i, name) in names[..2].iter().enumerate() {
        let token = guard.fencing_token(name).unwrap();
        assert!(
            Some(token) > tokens_before[i],
            "{name:?}: token {token} not above the earlier grant's {:?}",
            tokens_before[i]
        );
    }
    assert_eq!(held_names(&backend, &names).await, names);
    guard.release().await.unwrap();
    assert!(held_names(&backend, &names).await.is_empty());
}

/// Dropping set acquire futures at random moments (before their first poll, while they wait
/// for a busy name, while they hold the first names) leaves no name held.
pub async fn dropped_lock_set_acquires_leave_nothing_held(backend: Arc<dyn LockBackend>) {
    let base = unique_name("set-dropped");
    let names: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| format!("{base}-{n}"))
        .collect();
    // A long expiry: the names must end up free because leases were released, not expired.
    let p = builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Contention on the middle name, so that futures are dropped while holding the first.
    let churn = {
        let lock = p.lock(names[1].clone()).unwrap();
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                // An attempt left unanswered at the timeout (a loaded machine) is an error
                // here; the churn only makes contention, so it simply tries again.
                if let Ok(Some(g)) = lock.acquire_timeout(Duration::from_millis(50)).await {
                    let hold = rand::rng().random_range(0..4);
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    g.release().await.unwrap();
                }
            }
        })
    };
    let set = p.lock_set(names.clone()).unwrap();
    let mut completed = 0;
    for i in 0..150 {
        let fut = set.acquire();
        if i % 10 == 0 {
            drop(fut);
            continue;
        }
        let limit = Duration::from_micros(rand::rng().random_range(0..6000));
        if let Ok(guard) = tokio::time::timeout(limit, fut).await {
            completed += 1;
            drop(guard.expect("acquire"));
        }
    }
    stop.store(true, Ordering::SeqCst);
    churn.await.unwrap();
    let free = eventually(Duration::from_secs(20), || async {
        held_names(&backend, &names).await.is_empty()
    })
    .await;
    let held = held_names(&backend, &names).await;
    assert!(
        free,
        "{held:?} still held after every set acquire future and guard was dropped"
    );
    eprintln!("{completed} of 150 set acquire futures completed before being dropped");
}

/// A set guard's lost signal fires when any one of its leases is lost (here: force-released),
/// its reason names that lock, and its release reports the loss while releasing the others.
/// Dropping a set guard releases every name.
pub async fn a_lock_set_guard_reports_any_loss_and_releases_all(backend: Arc<dyn LockBackend>) {
    let base = unique_name("set-loss");
    let names: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| format!("{base}-{n}"))
        .collect();
    let p = builder(&backend)
        .expiry(Duration::from_secs(1))
        .build()
        .unwrap();
    let set = p.lock_set(names.clone()).unwrap();
    let guard = set.acquire().await.unwrap();
    let lost = guard.lost();
    assert!(!lost.is_lost() && !guard.is_lost());
    assert!(backend.force_release(&names[1]).await.unwrap());
    tokio::time::timeout(Duration::from_secs(20), lost.wait())
        .await
        .expect("the set's lost signal fires when one of its leases is force-released");
    assert!(guard.is_lost());
    let (lost, reason) = guard.lost_reason().expect("a reason");
    assert_eq!(
        lost, names[1],
        "the set reports {lost:?} ({reason}) as lost instead of the force-released {:?}",
        names[1]
    );
    assert_eq!(
        guard.lost().reason(),
        Some((names[1].as_str(), reason)),
        "the set's lost signal reports the same lease and reason"
    );
    assert!(!guard.get(&names[0]).unwrap().is_lost());
    // Someone else takes the lost name, as in the single-lock case.
    let next = provider(&backend)
        .lock(names[1].clone())
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the force-released name is free");
    match guard.release().await {
        Err(Error::LeaseLost { name }) => assert_eq!(name, names[1]),
        other => panic!("release of a set with a lost lease returned {other:?}"),
    }
    assert_eq!(
        held_names(&backend, &names).await,
        [names[1].clone()],
        "only the new holder's name may be held after the release of the set"
    );
    next.release().await.unwrap();

    let guard = set.acquire().await.unwrap();
    assert_eq!(held_names(&backend, &names).await, names);
    drop(guard);
    let free = eventually(Duration::from_secs(20), || async {
        held_names(&backend, &names).await.is_empty()
    })
    .await;
    assert!(free, "dropping a set guard did not release every name");
}

/// While a set waits for a busy name, the names before it stay held and are extended by their
/// guards (a lease of 1 s outlives a wait of 3 s), and the set keeps those same leases once it
/// gets the busy name. Names are sorted and deduplicated; an empty set is refused.
pub async fn a_lock_set_keeps_the_names_it_holds_while_waiting(backend: Arc<dyn LockBackend>) {
    let base = unique_name("set-wait");
    let (a, b) = (format!("{base}-a"), format!("{base}-b"));
    let p = builder(&backend)
        .expiry(Duration::from_secs(1))
        .build()
        .unwrap();
    let set = p.lock_set([b.clone(), a.clone(), b.clone()]).unwrap();
    assert_eq!(set.names().collect::<Vec<_>>(), [a.as_str(), b.as_str()]);
    assert!(matches!(
        p.lock_set(Vec::<String>::new()),
        Err(Error::InvalidOptions {
            option: "names",
            ..
        })
    ));
    assert!(matches!(
        p.lock_set([a.clone(), String::new()]),
        Err(Error::InvalidName { .. })
    ));

    let blocker = provider(&backend)
        .lock(b.clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let set = set.clone();
        tokio::spawn(async move { set.acquire().await })
    };
    let held_a = eventually(Duration::from_secs(20), || async {
        backend.inspect(&a).await.unwrap().is_some_and(|i| i.held)
    })
    .await;
    assert!(held_a, "{a:?} was not taken while the set waited for {b:?}");
    let first = backend.inspect(&a).await.unwrap().unwrap();
    // Three times the lease: the wait outlives the first lease unless it is extended.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = backend.inspect(&a).await.unwrap().unwrap();
    assert!(
        later.held && later.lease_id == first.lease_id,
        "{a:?} was not kept while the set waited: first {first:?}, 3 s later {later:?}"
    );
    assert!(
        later.expires_at > first.expires_at,
        "{a:?} was not extended while the set waited: {:?} then {:?}",
        first.expires_at,
        later.expires_at
    );
    assert!(
        !waiter.is_finished(),
        "the set was acquired while {b:?} was held"
    );
    blocker.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the set is acquired once the busy name is free")
        .unwrap()
        .unwrap();
    assert_eq!(
        guard.get(&a).map(|g| g.lease_id().clone()),
        first.lease_id,
        "the set did not keep the lease it held while waiting"
    );
    assert_eq!(guard.fencing_token(&a), first.fencing_token);
    guard.release().await.unwrap();
}
