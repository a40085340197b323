//! Contract cases of plain locks: mutual exclusion, expiry and takeover, fencing tokens that
//! grow, inspection and listing, and bad input rejected before the backend is called.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;

use crate::testing::{builder, provider, unique_name, Counting};
use crate::{Error, LockBackend, WaitStrategy, MIN_EXPIRY};

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
    assert!(r.contains("minimum of 100 ms"), "{r}");
    // Below the minimum lease (1 ms gave a guard that was already lost): refused at every entry
    // point, with a message that states the minimum.
    for short in [
        Duration::from_millis(1),
        MIN_EXPIRY - Duration::from_nanos(1),
    ] {
        let (o, r) = opt(builder(&shared).expiry(short).build().unwrap_err());
        assert_eq!(o, "expiry", "{short:?}");
        assert!(r.contains("minimum of 100 ms"), "{short:?}: {r}");
        let lock = p.lock("short").unwrap();
        let (o, r) = opt(lock.with_expiry(short).unwrap_err());
        assert_eq!(o, "expiry", "{short:?}");
        assert!(r.contains("minimum of 100 ms"), "{short:?}: {r}");
        let (o, _) = opt(p
            .semaphore("short", 2)
            .unwrap()
            .with_expiry(short)
            .unwrap_err());
        assert_eq!(o, "expiry", "semaphore {short:?}");
        let (o, _) = opt(p.rw_lock("short").unwrap().with_expiry(short).unwrap_err());
        assert_eq!(o, "expiry", "read-write lock {short:?}");
        let (o, _) = opt(p
            .lock_set(["a", "b"])
            .unwrap()
            .with_expiry(short)
            .unwrap_err());
        assert_eq!(o, "expiry", "lock set {short:?}");
        let (o, _) = opt(p.election("short").unwrap().with_expiry(short).unwrap_err());
        assert_eq!(o, "expiry", "election {short:?}");
    }
    let at_min = builder(&shared).expiry(MIN_EXPIRY).build().unwrap();
    assert_eq!(at_min.lock("min").unwrap().expiry(), MIN_EXPIRY);
    assert_eq!(
        p.lock("min")
            .unwrap()
            .with_expiry(MIN_EXPIRY)
            .unwrap()
            .expiry(),
        MIN_EXPIRY
    );
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
        p.lock("k").unwrap().with_expiry(Duration::ZERO),
        Err(Error::InvalidOptions { .. })
    ));
    assert!(matches!(p.lock(""), Err(Error::InvalidName { .. })));
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

    // extend(0), and extend below the minimum lease, on a held guard are refused locally too.
    let g = lock.acquire().await.unwrap();
    let calls = counting.calls.load(Ordering::SeqCst);
    assert!(matches!(
        g.extend(Duration::ZERO).await,
        Err(Error::InvalidOptions { option: "ttl", .. })
    ));
    match g.extend(Duration::from_millis(1)).await {
        Err(Error::InvalidOptions {
            option: "ttl",
            reason,
        }) => {
            assert!(reason.contains("minimum of 100 ms"), "{reason}");
        }
        other => panic!("extend(1 ms): expected InvalidOptions, got {other:?}"),
    }
    assert!(!g.is_lost(), "a refused extension must not touch the lease");
    assert_eq!(counting.calls.load(Ordering::SeqCst), calls);
    g.release().await.unwrap();
}
