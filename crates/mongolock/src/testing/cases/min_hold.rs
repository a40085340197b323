//! Contract cases of the minimum hold ([`LockGuard::release_after`](crate::LockGuard::release_after),
//! [`LockBackend::release_after`]): see the
//! [backend contract](crate::backend#minimum-hold-at-most-once-per-interval).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{eventually, provider, unique_name};
use crate::{AcquireRequest, Attempt, Error, LeaseId, LockBackend, LockProvider};

/// The lease duration of these cases: far longer than any hold, so that a name freed before
/// it was freed by the hold, not by expiry.
const LONG_TTL: Duration = Duration::from_secs(60);

/// The minimum hold of these cases.
const MIN_HOLD: Duration = Duration::from_secs(3);

/// A provider whose leases last [`LONG_TTL`].
fn long_provider(backend: &Arc<dyn LockBackend>) -> LockProvider {
    super::builder(backend)
        .expiry(LONG_TTL)
        .build()
        .expect("valid options")
}

/// `release_after` keeps the name held until its grant time plus the minimum hold by the
/// server's clock — the same lease id, token and holder; others are busy meanwhile — and frees
/// it right after: a waiter that went to sleep before the hold (until the lease's 60 s expiry)
/// gets the name soon after the hold ends, long before the TTL would have passed, with the
/// next token, and its grant is no earlier than the end of the hold by server time.
pub async fn min_hold_keeps_the_name_until_granted_plus_min_hold(backend: Arc<dyn LockBackend>) {
    min_hold_frees_the_name_for_a_waiter_of_another_backend(backend.clone(), backend, false).await;
}

/// [`min_hold_keeps_the_name_until_granted_plus_min_hold`] with the holder on `backend` and
/// the waiter on `waiters` — another backend on the same storage, as another process would
/// have (its own change stream or listening connection): the hold's write reaches it too.
/// With `slow_polling`, the waiter polls only every 45-50 s: only a notification of the hold
/// gets it the name in time (for backends with live notifications only).
pub async fn min_hold_frees_the_name_for_a_waiter_of_another_backend(
    backend: Arc<dyn LockBackend>,
    waiters: Arc<dyn LockBackend>,
    slow_polling: bool,
) {
    let counting = Arc::new(super::CountingAll {
        inner: waiters,
        acquires: AtomicUsize::new(0),
    });
    let waiters_backend: Arc<dyn LockBackend> = counting.clone();
    let holder = long_provider(&backend);
    let mut other = super::builder(&waiters_backend).expiry(LONG_TTL);
    if slow_polling {
        other = other.wait_strategy(crate::WaitStrategy::random_sleep(
            Duration::from_secs(45),
            Duration::from_secs(50),
        ));
    }
    let other = other.build().expect("valid options");
    let name = unique_name("min-hold");
    let guard = holder.lock(name.clone()).unwrap().acquire().await.unwrap();
    let (token, lease_id, granted) = (
        guard.fencing_token(),
        guard.lease_id().clone(),
        guard.acquired_at(),
    );
    let before = backend.inspect(&name).await.unwrap().expect("held");

    // A waiter that waits up to 40 s (less than the 60 s TTL): it must be served by the end of
    // the hold, not by expiry. It makes its busy attempt (and goes to sleep) before the hold.
    let lock = other.lock(name.clone()).unwrap();
    let waiter = tokio::spawn(async move {
        let r = lock.acquire_timeout(Duration::from_secs(40)).await;
        (r, Instant::now())
    });
    assert!(
        eventually(Duration::from_secs(30), || async {
            counting.acquires.load(Ordering::SeqCst) >= 1
        })
        .await,
        "the waiter on {name} never attempted"
    );
    // Time to start waiting (and, for a narrowed change stream, to have its name covered).
    tokio::time::sleep(Duration::from_secs(1)).await;

    let asked = Instant::now();
    guard.release_after(MIN_HOLD).await.unwrap();
    let hold_until = granted + MIN_HOLD;

    // Held meanwhile: by the same lease (id, token, holder), until the grant plus the hold.
    let during = backend
        .inspect(&name)
        .await
        .unwrap()
        .expect("a lock record");
    if during.observed_at < hold_until {
        assert!(
            during.held,
            "{name} not held during its minimum hold: {during:?}"
        );
        assert_eq!(during.lease_id.as_ref(), Some(&lease_id), "{during:?}");
        assert_eq!(during.fencing_token, Some(token), "{during:?}");
        assert_eq!(during.holder, before.holder, "{during:?}");
        assert_eq!(during.acquired_at, before.acquired_at, "{during:?}");
    }
    let expiry = during.expires_at.expect("an expiry");
    let off = expiry
        .duration_since(hold_until)
        .unwrap_or_else(|e| e.duration());
    assert!(
        off <= Duration::from_millis(2),
        "{name}: the hold ends at {expiry:?}, not at the grant ({granted:?}) plus {MIN_HOLD:?}"
    );
    // Another acquirer is busy while the server's clock is before the end of the hold (a grant
    // is judged by the server's clock: any grant must come at or after it).
    let third = long_provider(&backend);
    loop {
        if let Some(g) = third
            .lock(name.clone())
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
        {
            assert!(
                g.acquired_at() >= hold_until,
                "{name} granted at {:?} (token {}) during the minimum hold, which ends at \
                 {hold_until:?}",
                g.acquired_at(),
                g.fencing_token()
            );
            // A slow machine: the hold was already over. The waiter gets it next.
            g.release().await.unwrap();
            break;
        }
        if Instant::now() >= asked + Duration::from_millis(1500) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (got, at) = waiter.await.unwrap();
    let got = got
        .unwrap()
        .unwrap_or_else(|| panic!("the waiter on {name} did not get it within 40 s of waiting, although the hold ended {MIN_HOLD:?} after the grant (the lease's TTL is {LONG_TTL:?})"));
    assert!(
        got.acquired_at() >= hold_until,
        "the waiter got {name} at {:?}, before the end of the hold {hold_until:?}",
        got.acquired_at()
    );
    assert!(
        got.fencing_token() > token,
        "tokens {token} then {}",
        got.fencing_token()
    );
    // Promptly after the hold (generous: well under the 60 s TTL).
    let after = at.saturating_duration_since(asked);
    assert!(
        after < Duration::from_secs(20),
        "the waiter on {name} got it {after:?} after the hold was asked ({MIN_HOLD:?})"
    );
    got.release().await.unwrap();
}

/// When the grant plus the minimum hold has already passed at the server (and with a zero
/// hold), `release_after` is exactly a release: the name is free at once.
pub async fn min_hold_already_passed_is_a_plain_release(backend: Arc<dyn LockBackend>) {
    let p = long_provider(&backend);
    for (hold, sleep) in [
        (Duration::from_millis(100), Duration::from_millis(400)),
        (Duration::ZERO, Duration::ZERO),
    ] {
        let name = unique_name("min-hold-passed");
        let lock = p.lock(name.clone()).unwrap();
        let g = lock.acquire().await.unwrap();
        let token = g.fencing_token();
        tokio::time::sleep(sleep).await;
        g.release_after(hold).await.unwrap();
        let info = backend
            .inspect(&name)
            .await
            .unwrap()
            .expect("a lock record");
        assert!(
            !info.held,
            "{name} still held after a passed hold of {hold:?}: {info:?}"
        );
        let again =
            lock.try_acquire().await.unwrap().unwrap_or_else(|| {
                panic!("{name} not free at once after a passed hold of {hold:?}")
            });
        assert!(again.fencing_token() > token);
        again.release().await.unwrap();
    }
}

/// A force-release ends a lease kept on by a minimum hold: the name is free at once.
pub async fn force_release_ends_a_min_hold(backend: Arc<dyn LockBackend>) {
    let p = long_provider(&backend);
    let name = unique_name("min-hold-forced");
    let lock = p.lock(name.clone()).unwrap();
    let g = lock.acquire().await.unwrap();
    g.release_after(Duration::from_secs(120)).await.unwrap();
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "{name} free during its hold"
    );
    assert!(
        p.force_release(&name).await.unwrap(),
        "force-release found no lease on {name}"
    );
    let again = lock
        .try_acquire()
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name} still held after a force-release of its hold"));
    again.release().await.unwrap();
}

/// The backend operation: a retried `release_after` (a lost reply) reports success and
/// changes nothing, before and after the hold ended and after someone else took the name;
/// an extension of a lease kept on is refused; another lease id is never touched; a
/// semaphore slot is refused with a typed error and stays held, and a semaphore guard's
/// `release_after` is refused (its slot then released at once, never kept on in silence).
pub async fn min_hold_is_idempotent_and_refuses_extension(backend: Arc<dyn LockBackend>) {
    let name = unique_name("min-hold-retry");
    let request = |lease_id: &LeaseId| AcquireRequest {
        mode: crate::LeaseMode::Exclusive,
        name: name.clone(),
        lease_id: lease_id.clone(),
        ttl: LONG_TTL,
        holder: crate::HolderInfo::current(None),
    };
    let first = backend.new_lease_id();
    let Attempt::Acquired(lease) = backend.try_acquire(&request(&first)).await.unwrap() else {
        panic!("{name} not granted");
    };
    let hold = Duration::from_millis(1500);
    assert!(backend.release_after(&name, &first, hold).await.unwrap());
    let held = backend.inspect(&name).await.unwrap().unwrap();
    assert!(
        backend.release_after(&name, &first, hold).await.unwrap(),
        "a retried release_after by the owner reports success"
    );
    let again = backend.inspect(&name).await.unwrap().unwrap();
    assert_eq!(
        (
            again.held,
            &again.lease_id,
            again.fencing_token,
            again.expires_at
        ),
        (
            held.held,
            &held.lease_id,
            held.fencing_token,
            held.expires_at
        ),
        "a retry changed the hold of {name}"
    );
    assert_eq!(held.fencing_token, Some(lease.fencing_token));
    assert_eq!(
        backend.extend(&name, &first, LONG_TTL).await.unwrap(),
        None,
        "a lease kept on by a minimum hold was extended"
    );
    // Another lease id is never granted or ended by it.
    let stranger = backend.new_lease_id();
    assert!(!backend.release_after(&name, &stranger, hold).await.unwrap());
    assert!(backend.inspect(&name).await.unwrap().unwrap().held);

    // After the hold: a retry still reports success, and the name is free.
    let second = backend.new_lease_id();
    let took = eventually(Duration::from_secs(30), || async {
        matches!(
            backend.try_acquire(&request(&second)).await.unwrap(),
            Attempt::Acquired(_)
        )
    })
    .await;
    assert!(took, "{name} never free after its hold of {hold:?}");
    assert!(
        backend.release_after(&name, &first, hold).await.unwrap(),
        "a retry after the hold and a takeover reports success"
    );
    let info = backend.inspect(&name).await.unwrap().unwrap();
    assert_eq!(
        info.lease_id.as_ref(),
        Some(&second),
        "a retry touched the next holder's lease: {info:?}"
    );
    // Someone else ended it: false.
    assert!(backend.force_release(&name).await.unwrap());
    assert!(!backend.release_after(&name, &second, hold).await.unwrap());

    // A semaphore slot: refused, with a typed error, and still held.
    let slots = unique_name("min-hold-slot");
    let slot = backend.new_lease_id();
    let req = AcquireRequest {
        mode: crate::LeaseMode::Slot { limit: 2 },
        name: slots.clone(),
        lease_id: slot.clone(),
        ttl: LONG_TTL,
        holder: crate::HolderInfo::current(None),
    };
    assert!(matches!(
        backend.try_acquire(&req).await.unwrap(),
        Attempt::Acquired(_)
    ));
    let err = backend
        .release_after(&slots, &slot, hold)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::MinHoldUnsupported { .. }),
        "a slot's release_after: {err}"
    );
    let holders = backend.holders(&slots).await.unwrap();
    assert!(
        holders.iter().any(|h| h.lease_id == slot),
        "the refused slot was released: {holders:?}"
    );
    assert!(backend.release(&slots, &slot).await.unwrap());

    // Through a semaphore guard: refused, the slot released at once.
    let p = provider(&backend);
    let sem = p.semaphore(slots.clone(), 1).unwrap();
    let g = sem.acquire().await.unwrap();
    let err = g.release_after(hold).await.unwrap_err();
    assert!(matches!(err, Error::MinHoldUnsupported { .. }), "{err}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            backend.holders(&slots).await.unwrap().is_empty()
        })
        .await,
        "the slot of {slots} stayed held after a refused minimum hold"
    );
}
