//! The contract cases of semaphores ([`LeaseMode::Slot`](crate::LeaseMode::Slot)): every
//! backend runs them through [`contract_suite!`](crate::contract_suite).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::{
    builder, drop_acquires_at_random, eventually, provider, slow_polling, unique_name, until_live,
};
use crate::{Error, LockBackend, LockProvider};

/// 12 tasks × 15 acquisitions of a semaphore of 3 around a shared "inside" counter: never more
/// than 3 inside at once, more than one inside at some point, every token distinct and tokens
/// growing in grant order.
pub async fn semaphore_never_exceeds_its_limit(backend: Arc<dyn LockBackend>) {
    const LIMIT: u32 = 3;
    const TASKS: usize = 12;
    const ROUNDS: usize = 15;
    let p = provider(&backend);
    let name = unique_name("sem-limit");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let sem = p.semaphore(name.clone(), LIMIT).unwrap();
        let (inside, most, tokens) = (inside.clone(), most.clone(), tokens.clone());
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let guard = sem.acquire().await.expect("acquire a slot");
                let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(
                    now_inside <= LIMIT as usize,
                    "{name}: {now_inside} holders inside a semaphore of {LIMIT} (task {task}, \
                     round {round}, token {})",
                    guard.fencing_token()
                );
                most.fetch_max(now_inside, Ordering::SeqCst);
                tokens.lock().unwrap().push(guard.fencing_token());
                let hold = rand::rng().random_range(0..4);
                tokio::time::sleep(Duration::from_millis(hold)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release a slot");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let tokens = tokens.lock().unwrap();
    let mut sorted = tokens.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        TASKS * ROUNDS,
        "{name}: fencing tokens were repeated"
    );
    let most = most.load(Ordering::SeqCst);
    assert!(
        most >= 2,
        "{name}: never more than {most} holder at once: the semaphore behaves like a lock"
    );
}

/// Tokens grow across slots, across release and across the name's use as a lock.
pub async fn semaphore_tokens_grow_across_slots(backend: Arc<dyn LockBackend>) {
    let p = provider(&backend);
    let name = unique_name("sem-tokens");
    let sem = p.semaphore(name.clone(), 3).unwrap();
    let a = sem.acquire().await.unwrap();
    let b = sem.acquire().await.unwrap();
    let c = sem.acquire().await.unwrap();
    let (ta, tb, tc) = (a.fencing_token(), b.fencing_token(), c.fencing_token());
    assert!(ta < tb && tb < tc, "{name}: tokens {ta}, {tb}, {tc}");
    b.release().await.unwrap();
    let d = sem.acquire().await.unwrap();
    assert!(
        d.fencing_token() > tc,
        "{name}: {} after {tc}",
        d.fencing_token()
    );
    let td = d.fencing_token();
    for g in [a, c, d] {
        g.release().await.unwrap();
    }
    let lock = p.lock(name.clone()).unwrap().acquire().await.unwrap();
    assert!(
        lock.fencing_token() > td,
        "{name}: lock token {} after slot {td}",
        lock.fencing_token()
    );
    let tl = lock.fencing_token();
    lock.release().await.unwrap();
    let e = sem.acquire().await.unwrap();
    assert!(
        e.fencing_token() > tl,
        "{name}: slot token {} after lock {tl}",
        e.fencing_token()
    );
    e.release().await.unwrap();
}

/// A slot of `name` (of `limit`) whose holder never extends it: a 600 ms lease, as a crashed
/// holder's.
async fn crashed_slot(backend: &Arc<dyn LockBackend>, name: &str, limit: u32) -> crate::LockGuard {
    builder(backend)
        .auto_extend(false)
        .expiry(Duration::from_millis(600))
        .build()
        .unwrap()
        .semaphore(name, limit)
        .unwrap()
        .acquire()
        .await
        .unwrap()
}

/// A holder that stops extending (a crash) frees its slot when its lease expires by server
/// time, not before; its guard reports the loss.
pub async fn semaphore_slot_returns_after_a_crashed_holders_lease(backend: Arc<dyn LockBackend>) {
    let name = unique_name("sem-crash");
    let a = crashed_slot(&backend, &name, 2).await;
    let live = provider(&backend);
    let b = live
        .semaphore(name.clone(), 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let sem = live.semaphore(name.clone(), 2).unwrap();
    let c = sem
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: no slot within 20 s after a holder's lease of 600 ms"));
    assert!(
        c.acquired_at() >= a.expires_at(),
        "{name}: slot taken at {:?}, before the crashed holder's expiry {:?}",
        c.acquired_at(),
        a.expires_at()
    );
    assert!(c.fencing_token() > b.fencing_token());
    tokio::time::timeout(Duration::from_secs(5), a.lost())
        .await
        .unwrap_or_else(|_| panic!("{name}: the crashed holder's guard did not report the loss"));
    assert!(!a.extend(Duration::from_secs(5)).await.unwrap());
    assert!(matches!(a.release().await, Err(Error::LeaseLost { .. })));
    // The other holders are untouched.
    assert!(!b.is_lost() && !c.is_lost());
    assert!(b.extend(Duration::from_secs(30)).await.unwrap());
    b.release().await.unwrap();
    c.release().await.unwrap();
}

/// A slot that expired unreleased and whose name was then taken as a lock (an exclusive
/// grant, which ends every slot) reports the loss when its holder releases it, and so does a
/// slot whose holder releases it twice after that.
pub async fn an_expired_slot_taken_by_a_lock_reports_its_loss(backend: Arc<dyn LockBackend>) {
    let name = unique_name("sem-then-lock");
    let a = crashed_slot(&backend, &name, 1).await;
    let live = provider(&backend);
    let lock = live
        .lock(name.clone())
        .unwrap()
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: not taken as a lock after a slot's lease of 600 ms"));
    assert!(
        lock.fencing_token() > a.fencing_token(),
        "{name}: lock token {} after slot token {}",
        lock.fencing_token(),
        a.fencing_token()
    );
    let slot_token = a.fencing_token();
    let lease_id = a.lease_id().clone();
    match a.release().await {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!("{name}: release of the expired slot (token {}) after the lock's grant (token {}): {other:?}",
            slot_token, lock.fencing_token()),
    }
    assert!(
        !backend.release(&name, &lease_id).await.unwrap(),
        "{name}: a repeated release of the lost slot reported success"
    );
    assert!(!lock.is_lost());
    lock.release().await.unwrap();
}

/// A limit of 0 and a limit other than the holders' are typed errors with clear messages;
/// once every slot is released a new limit applies.
pub async fn semaphore_bad_limits_are_typed_errors(backend: Arc<dyn LockBackend>) {
    let p = provider(&backend);
    let name = unique_name("sem-limits");
    match p.semaphore(name.clone(), 0) {
        Err(Error::InvalidOptions { option, reason }) => {
            assert_eq!(option, "limit");
            assert!(reason.contains("at least 1"), "{reason}");
        }
        other => panic!("expected InvalidOptions for a limit of 0, got {other:?}"),
    }
    let two = p.semaphore(name.clone(), 2).unwrap();
    let g = two.acquire().await.unwrap();
    let three = p.semaphore(name.clone(), 3).unwrap();
    for attempt in [
        three.try_acquire().await,
        three.acquire_timeout(Duration::from_millis(200)).await,
    ] {
        match attempt {
            Err(e @ Error::LimitMismatch { .. }) => {
                let Error::LimitMismatch {
                    requested, held, ..
                } = &e
                else {
                    unreachable!()
                };
                assert_eq!((*requested, *held), (3, 2), "{e}");
                let msg = e.to_string();
                assert!(msg.contains("limit of 2") && msg.contains("3"), "{msg}");
            }
            other => panic!("{name}: expected LimitMismatch, got {other:?}"),
        }
    }
    g.release().await.unwrap();
    let g3 = three
        .try_acquire()
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: a new limit applies once every slot is released"));
    assert!(matches!(
        two.try_acquire().await,
        Err(Error::LimitMismatch { .. })
    ));
    g3.release().await.unwrap();
}

/// A name held as a lock excludes slot holders and the other way round.
pub async fn semaphore_and_lock_on_one_name_exclude_each_other(backend: Arc<dyn LockBackend>) {
    let p = provider(&backend);
    let name = unique_name("sem-mixed");
    let sem = p.semaphore(name.clone(), 3).unwrap();
    let lock = p.lock(name.clone()).unwrap();
    let slot = sem.acquire().await.unwrap();
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "{name}: a lock was granted while a slot was held"
    );
    slot.release().await.unwrap();
    let held = lock.try_acquire().await.unwrap().expect("the lock is free");
    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "{name}: a slot was granted while the lock was held"
    );
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_timeout(Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let token = held.fencing_token();
    held.release().await.unwrap();
    let got = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("a slot after the lock's release");
    assert!(got.fencing_token() > token);
    got.release().await.unwrap();
}

/// Extend and release act on the caller's slot only; force-release ends every slot.
pub async fn semaphore_slots_are_separate_leases(backend: Arc<dyn LockBackend>) {
    let p = provider(&backend);
    let name = unique_name("sem-own");
    let sem = p.semaphore(name.clone(), 2).unwrap();
    let a = sem.acquire().await.unwrap();
    let b = sem.acquire().await.unwrap();
    assert!(a.extend(Duration::from_secs(20)).await.unwrap());
    // Nobody else's lease id releases a slot.
    assert!(!backend
        .release(&name, &crate::LeaseId::from_string("not-a-holder"))
        .await
        .unwrap());
    a.release().await.unwrap();
    assert!(!b.is_lost());
    assert!(b.extend(Duration::from_secs(20)).await.unwrap());
    let info = backend.inspect(&name).await.unwrap().expect("recorded");
    assert!(info.held, "{name}: held while a slot is held: {info:?}");
    assert!(info.fencing_token >= Some(b.fencing_token()));
    let c = sem.acquire().await.unwrap();
    assert!(backend.force_release(&name).await.unwrap());
    for g in [&b, &c] {
        assert!(
            !g.extend(Duration::from_secs(5)).await.unwrap(),
            "{name}: a force-released slot (token {}) was extended",
            g.fencing_token()
        );
    }
    let free = eventually(Duration::from_secs(10), || async {
        !backend
            .inspect(&name)
            .await
            .unwrap()
            .is_some_and(|i| i.held)
    })
    .await;
    assert!(free, "{name}: still held after force-release");
    let d = sem
        .try_acquire()
        .await
        .unwrap()
        .expect("free after force-release");
    assert!(d.fencing_token() > c.fencing_token());
    d.release().await.unwrap();
}

/// `holders` reports every slot holder of a semaphore (lease id, token, times, holder info, in
/// grant order), every reader of a read-write lock, the one holder of a lock, and nobody for a
/// released or unknown name.
pub async fn holders_shows_every_slot_holder(backend: Arc<dyn LockBackend>) {
    let named = |app: &str| builder(&backend).app_name(app).build().unwrap();
    let (pa, pb) = (named("holder-a"), named("holder-b"));
    let name = unique_name("sem-holders");
    let a = pa
        .semaphore(name.clone(), 3)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let b = pb
        .semaphore(name.clone(), 3)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let c = pa
        .semaphore(name.clone(), 3)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let all = pa.holders(&name).await.unwrap();
    let ids: Vec<&str> = all.iter().map(|h| h.lease_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            a.lease_id().as_str(),
            b.lease_id().as_str(),
            c.lease_id().as_str()
        ],
        "{name}: {all:?}"
    );
    for (h, (g, app)) in all
        .iter()
        .zip([(&a, "holder-a"), (&b, "holder-b"), (&c, "holder-a")])
    {
        assert_eq!(h.fencing_token, g.fencing_token(), "{name}: {h:?}");
        assert_eq!(h.acquired_at, g.acquired_at(), "{name}: {h:?}");
        assert!(h.expires_at > h.acquired_at, "{name}: {h:?}");
        let holder = h.holder.as_ref().expect("holder info of a slot");
        assert_eq!(holder.app_name.as_deref(), Some(app), "{name}: {h:?}");
        assert_eq!(holder.pid, std::process::id(), "{name}: {h:?}");
    }
    b.release().await.unwrap();
    let left: Vec<u64> = backend
        .holders(&name)
        .await
        .unwrap()
        .iter()
        .map(|h| h.fencing_token)
        .collect();
    assert_eq!(left, [a.fencing_token(), c.fencing_token()], "{name}");
    a.release().await.unwrap();
    c.release().await.unwrap();
    assert!(backend.holders(&name).await.unwrap().is_empty(), "{name}");

    let rw = pa.rw_lock(unique_name("rw-holders")).unwrap();
    let (r1, r2) = (rw.read().await.unwrap(), rw.read().await.unwrap());
    let readers = backend.holders(rw.name()).await.unwrap();
    assert_eq!(readers.len(), 2, "{readers:?}");
    r1.release().await.unwrap();
    r2.release().await.unwrap();

    let lock_name = unique_name("lock-holders");
    let g = pb.lock(lock_name.clone()).unwrap().acquire().await.unwrap();
    let one = backend.holders(&lock_name).await.unwrap();
    assert_eq!(one.len(), 1, "{lock_name}: {one:?}");
    assert_eq!(one[0].lease_id, *g.lease_id(), "{lock_name}");
    assert_eq!(one[0].fencing_token, g.fencing_token(), "{lock_name}");
    assert_eq!(
        one[0].holder.as_ref().and_then(|h| h.app_name.as_deref()),
        Some("holder-b")
    );
    g.release().await.unwrap();
    assert!(backend.holders(&lock_name).await.unwrap().is_empty());
    assert!(backend
        .holders(&unique_name("never"))
        .await
        .unwrap()
        .is_empty());
}

/// Dropping acquire futures at random points, under contention, never leaves a slot held.
pub async fn dropped_semaphore_acquires_leave_no_slot_held(backend: Arc<dyn LockBackend>) {
    const LIMIT: u32 = 2;
    let name = unique_name("sem-dropped");
    // A long expiry: the slots must end up free because they were released, not expired.
    let p = builder(&backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    let sem = p.semaphore(name.clone(), LIMIT).unwrap();
    // One slot churns in the background, so the other is contended.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (sem, stop) = (sem.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(g) = sem
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
    let completed = drop_acquires_at_random(200, || sem.acquire()).await;
    stop.store(true, Ordering::SeqCst);
    churn.await.unwrap();
    // Every slot can be taken again, by single attempts, well before any lease could expire.
    let all_free = eventually(Duration::from_secs(20), || async {
        let mut held = Vec::new();
        for _ in 0..LIMIT {
            match sem.try_acquire().await.unwrap() {
                Some(g) => held.push(g),
                None => break,
            }
        }
        let ok = held.len() == LIMIT as usize;
        for g in held {
            g.release().await.unwrap();
        }
        ok
    })
    .await;
    assert!(
        all_free,
        "{name}: a slot is still held after all acquire futures and guards were dropped"
    );
    eprintln!("{completed} of 200 slot acquire futures completed before being dropped");
}

/// With notifications, a slot's release wakes a waiter long before any lease could expire.
pub async fn a_slot_release_wakes_a_waiter_at_once(backend: Arc<dyn LockBackend>) {
    let name = unique_name("sem-wake");
    let p = LockProvider::builder_shared(backend.clone())
        .expiry(Duration::from_secs(60))
        .wait_strategy(slow_polling())
        .build()
        .expect("valid options");
    until_live(&backend).await;
    let sem = p.semaphore(name.clone(), 2).unwrap();
    let a = sem.acquire().await.unwrap();
    let mut b = sem.acquire().await.unwrap();
    for round in 0..3 {
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire_timeout(Duration::from_secs(25)).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let token = b.fencing_token();
        let released_at = Instant::now();
        // One slot is released; the other stays held throughout.
        b.release().await.unwrap();
        let got = waiter.await.unwrap().unwrap().unwrap_or_else(|| {
            panic!(
                "{name} round {round}: the waiter was not woken by a slot's release (token {token})"
            )
        });
        let took = released_at.elapsed();
        assert!(
            took < Duration::from_secs(15),
            "{name} round {round}: woken {took:?} after the release (leases last 60 s)"
        );
        assert!(got.fencing_token() > token);
        assert!(
            !a.is_lost(),
            "{name} round {round}: the other slot was lost"
        );
        b = got;
    }
    b.release().await.unwrap();
    a.release().await.unwrap();
}
