//! The contract cases of the operator's view (`crate::operator`): the conditional
//! force-release by fencing token, the wait queue, slot limits and filtered lists. Every
//! backend runs them through [`contract_suite!`](crate::contract_suite).

use std::sync::Arc;
use std::time::Duration;

use super::{builder, eventually, provider, unique_name, until_live};
use crate::{Error, ListFilter, LockBackend};

/// `force_release_token` ends the lease only while it has the given token: a wrong token ends
/// nothing, the right one ends it (the guard learns of the loss, the next token is larger),
/// and the old token never ends the next holder.
pub async fn force_release_token_ends_only_that_lease(backend: Arc<dyn LockBackend>) {
    let name = unique_name("force-token");
    let p = builder(&backend)
        .expiry(Duration::from_secs(3))
        .extension_cadence(Duration::from_millis(200))
        .build()
        .unwrap();
    let lock = p.lock(name.clone()).unwrap();
    assert!(
        !p.force_release_token(&name, 1).await.unwrap(),
        "{name}: ended a lease on a name never taken"
    );
    let first = lock.acquire().await.unwrap();
    let t1 = first.fencing_token();
    for wrong in [t1 + 1, t1.saturating_sub(1), u64::MAX] {
        assert!(
            !p.force_release_token(&name, wrong).await.unwrap(),
            "{name}: token {wrong} ended the lease of token {t1}"
        );
    }
    let info = p.inspect(&name).await.unwrap().unwrap();
    assert!(info.held && !first.is_lost(), "{name}: {info:?}");
    assert!(
        p.force_release_token(&name, t1).await.unwrap(),
        "{name}: token {t1} did not end its own lease"
    );
    let lost = first.lost();
    tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .unwrap_or_else(|_| panic!("{name}: the guard of token {t1} never learned of the loss"));
    assert!(
        !p.force_release_token(&name, t1).await.unwrap(),
        "{name}: token {t1} ended twice"
    );
    let second = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the force-release");
    let t2 = second.fencing_token();
    assert!(t2 > t1, "{name}: token {t2} after {t1}");
    // The stale token (an operator who read `inspect` before the takeover) ends nothing.
    assert!(
        !p.force_release_token(&name, t1).await.unwrap(),
        "{name}: the old token {t1} ended the new holder's lease (token {t2})"
    );
    let info = p.inspect(&name).await.unwrap().unwrap();
    assert!(
        info.held && info.fencing_token == Some(t2) && !second.is_lost(),
        "{name}: the new holder was touched: {info:?}"
    );
    assert!(matches!(
        first.release().await,
        Err(Error::LeaseLost { .. })
    ));
    second.release().await.unwrap();
    // A released lease is not ended again.
    assert!(!p.force_release_token(&name, t2).await.unwrap());
}

/// A token names one semaphore slot: `force_release_token` ends it and leaves the others; the
/// slot limit is reported while a slot is held (a read-write lock's readers too).
pub async fn force_release_token_ends_one_semaphore_slot(backend: Arc<dyn LockBackend>) {
    let name = unique_name("force-token-slot");
    let p = provider(&backend);
    let sem = p.semaphore(name.clone(), 3).unwrap();
    assert_eq!(
        p.slot_limit(&name).await.unwrap(),
        None,
        "{name}: no slot yet"
    );
    let a = sem.acquire().await.unwrap();
    let b = sem.acquire().await.unwrap();
    let (ta, tb) = (a.fencing_token(), b.fencing_token());
    assert_eq!(p.slot_limit(&name).await.unwrap(), Some(3), "{name}");
    assert!(!p.force_release_token(&name, tb + 1).await.unwrap());
    assert!(
        p.force_release_token(&name, ta).await.unwrap(),
        "{name}: the slot of token {ta} was not ended"
    );
    let left: Vec<u64> = p
        .holders(&name)
        .await
        .unwrap()
        .iter()
        .map(|h| h.fencing_token)
        .collect();
    assert_eq!(left, [tb], "{name}: holders after ending slot {ta}");
    assert!(!p.force_release_token(&name, ta).await.unwrap());
    assert!(matches!(a.release().await, Err(Error::LeaseLost { .. })));
    // The ended slot is free again: a new one is granted with a larger token.
    let c = sem.try_acquire().await.unwrap().expect("a free slot");
    assert!(c.fencing_token() > tb);
    assert!(p.force_release_token(&name, tb).await.unwrap());
    assert!(p
        .force_release_token(&name, c.fencing_token())
        .await
        .unwrap());
    assert!(p.holders(&name).await.unwrap().is_empty(), "{name}");
    assert_eq!(
        p.slot_limit(&name).await.unwrap(),
        None,
        "{name}: no slot left"
    );
    assert!(!p.inspect(&name).await.unwrap().unwrap().held, "{name}");

    // A lock is not a semaphore; a read-write lock's readers have their limit.
    let lock_name = unique_name("force-token-lock");
    let g = p.lock(lock_name.clone()).unwrap().acquire().await.unwrap();
    assert_eq!(p.slot_limit(&lock_name).await.unwrap(), None);
    g.release().await.unwrap();
    let rw_name = unique_name("force-token-rw");
    let r = p.rw_lock(rw_name.clone()).unwrap().read().await.unwrap();
    assert_eq!(
        p.slot_limit(&rw_name).await.unwrap(),
        Some(crate::rwlock::READERS_LIMIT)
    );
    r.release().await.unwrap();
}

/// `list_matching` selects names by a plain-text prefix (regular-expression and `LIKE`
/// metacharacters included) and by state, sorted by name.
pub async fn list_matching_filters_by_prefix_and_state(backend: Arc<dyn LockBackend>) {
    let p = provider(&backend);
    let base = unique_name("lm");
    let name = |suffix: &str| format!("{base}/{suffix}");
    let mut guards = Vec::new();
    for held in ["a.b*1", "axb*2", "a.b", "%_x", "a.b*\\3"] {
        guards.push(p.lock(name(held)).unwrap().acquire().await.unwrap());
    }
    for released in ["a.b*0", "%a"] {
        let g = p.lock(name(released)).unwrap().acquire().await.unwrap();
        g.release().await.unwrap();
    }
    let names = |filter: ListFilter| {
        let p = p.clone();
        async move {
            p.list_matching(&filter)
                .await
                .unwrap()
                .into_iter()
                .map(|i| i.name)
                .collect::<Vec<_>>()
        }
    };
    let want = |suffixes: &[&str]| suffixes.iter().map(|s| name(s)).collect::<Vec<_>>();
    assert_eq!(
        names(ListFilter::new().prefix(name("a.b*"))).await,
        want(&["a.b*0", "a.b*1", "a.b*\\3"]),
        "prefix {:?}",
        name("a.b*")
    );
    assert_eq!(
        names(ListFilter::new().prefix(name("a.b*")).held(true)).await,
        want(&["a.b*1", "a.b*\\3"])
    );
    assert_eq!(
        names(ListFilter::new().prefix(name("%"))).await,
        want(&["%_x", "%a"])
    );
    assert_eq!(
        names(ListFilter::new().prefix(name("%_"))).await,
        want(&["%_x"])
    );
    assert_eq!(
        names(ListFilter::new().prefix(name("a.b*\\"))).await,
        want(&["a.b*\\3"])
    );
    assert_eq!(
        names(ListFilter::new().prefix(&base).held(true)).await,
        want(&["%_x", "a.b", "a.b*1", "a.b*\\3", "axb*2"])
    );
    assert!(names(ListFilter::new().prefix(name("zz"))).await.is_empty());
    // Without a prefix: every lock, this run's among them.
    let all = names(ListFilter::new().held(true)).await;
    assert!(all.contains(&name("axb*2")) && !all.contains(&name("%a")));
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A call waiting for a held lock appears in `waiters` with its host, pid and application
/// name, until when its registration lasts, and leaves the queue when it is granted.
pub async fn waiters_show_who_waits(backend: Arc<dyn LockBackend>) {
    until_live(&backend).await;
    let name = unique_name("waiters");
    let holder = provider(&backend);
    let waiter = builder(&backend)
        .app_name("contract-waiter")
        .build()
        .unwrap();
    let g = holder.lock(name.clone()).unwrap().acquire().await.unwrap();
    assert!(holder.waiters(&name).await.unwrap().is_empty(), "{name}");
    let lock = waiter.lock(name.clone()).unwrap();
    let task = tokio::spawn(async move { lock.acquire().await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let seen = holder.waiters(&name).await.unwrap();
        if !seen.is_empty() {
            break seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: the waiting call never appeared in the queue"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let info = holder.inspect(&name).await.unwrap().unwrap();
    assert_eq!(seen.len(), 1, "{name}: {seen:?}");
    let w = &seen[0];
    let meta = w.holder.as_ref().expect("the waiter's metadata");
    assert_eq!(meta.app_name.as_deref(), Some("contract-waiter"), "{w:?}");
    assert_eq!(meta.pid, std::process::id(), "{w:?}");
    assert_eq!(meta.host, waiter.holder().host, "{w:?}");
    assert!(!w.id.is_empty(), "{w:?}");
    assert!(
        w.until > info.observed_at && Some(w.until) > info.expires_at,
        "{name}: registered until {:?}, holder expires {:?}, read at {:?}",
        w.until,
        info.expires_at,
        info.observed_at
    );
    g.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the waiter is granted after the release")
        .expect("task")
        .expect("acquire");
    let left = eventually(Duration::from_secs(30), || {
        let (holder, name) = (holder.clone(), name.clone());
        async move { holder.waiters(&name).await.unwrap().is_empty() }
    })
    .await;
    assert!(
        left,
        "{name}: the granted waiter is still queued: {:?}",
        holder.waiters(&name).await
    );
    granted.release().await.unwrap();
}
