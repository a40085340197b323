//! PostgreSQL-specific behaviour against a real server (started by the tests, or
//! `POSTGRES_URL`): tokens across cleanup, notifications, killed connections, a stopped server,
//! and typed errors for bad input.

use crate::support::postgres;

use postgres::admin;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mongolock::testing::eventually;
use mongolock::testing::CountingAll;
use mongolock::{
    AcquireRequest, Attempt, Error, HolderInfo, LeaseId, LockBackend, LockBackendExt, LockProvider,
    PostgresBackend, WaitStrategy,
};
use tokio::time::Instant;

/// The shared test server's URL, or `None` (skip, reason printed).
fn url() -> Option<String> {
    postgres::url()
}

/// A backend on a fresh table, with its connections named `app` in `pg_stat_activity`.
fn backend_as(url: &str, table: &str, app: &str) -> PostgresBackend {
    let mut config: tokio_postgres::Config = url.parse().expect("valid URL");
    config.application_name(app);
    PostgresBackend::builder_with_config(config)
        .table(table)
        .build()
        .expect("valid options")
}

/// Terminates every connection whose application name is `app`; returns how many.
async fn terminate(url: &str, app: &str) -> i64 {
    admin(url)
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .expect("terminate")
        .get(0)
}

/// The process id of the listening connection named `app`, if one is connected.
async fn listener_pid(url: &str, app: &str) -> Option<i32> {
    admin(url)
        .await
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .expect("read pg_stat_activity")
        .map(|r| r.get(0))
}

fn request(name: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        name: name.to_owned(),
        lease_id: LeaseId::random(),
        ttl,
        holder: HolderInfo::current(Some("pg-test".into())),
        mode: mongolock::LeaseMode::Exclusive,
    }
}

async fn grant(b: &PostgresBackend, name: &str, ttl: Duration) -> (LeaseId, u64) {
    let req = request(name, ttl);
    match b.try_acquire(&req).await.expect("acquire") {
        Attempt::Acquired(lease) => (req.lease_id, lease.fencing_token),
        other => panic!("{name}: expected a grant, got {other:?}"),
    }
}

fn provider(b: &PostgresBackend, expiry: Duration, wait: WaitStrategy) -> LockProvider {
    LockProvider::builder(b.clone())
        .expiry(expiry)
        .wait_strategy(wait)
        .build()
        .expect("valid options")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_growing_after_idle_rows_are_cleaned_up() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("cleanup");
    let b = PostgresBackend::builder(&url)
        .table(&table)
        .cleanup_after(Duration::ZERO)
        .build()
        .unwrap();
    let name = "idle";
    let mut last = 0;
    for round in 0..5 {
        let (lease, token) = grant(&b, name, Duration::from_secs(30)).await;
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        assert!(b.release(name, &lease).await.unwrap());
        let deleted = b.cleanup().await.unwrap();
        assert!(
            deleted >= 1,
            "round {round}: the released row was not cleaned up"
        );
        assert!(
            b.inspect(name).await.unwrap().is_none(),
            "round {round}: the row is still there after cleanup"
        );
    }
    // An expired (never released) lease is cleaned up too, and the token still grows.
    let (_, token) = grant(&b, name, Duration::from_millis(1)).await;
    assert!(token > last);
    last = token;
    assert!(
        eventually(Duration::from_secs(30), || async {
            b.cleanup().await.unwrap() >= 1
        })
        .await
    );
    let (_, token) = grant(&b, name, Duration::from_secs(30)).await;
    assert!(
        token > last,
        "token {token} after cleanup of an expired lease with {last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_grow_per_name_while_cleanup_runs_concurrently() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("cleanrace");
    let b = PostgresBackend::builder(&url)
        .table(&table)
        .cleanup_after(Duration::ZERO)
        .build()
        .unwrap();
    b.migrate().await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cleaner = {
        let (b, stop) = (b.clone(), stop.clone());
        tokio::spawn(async move {
            let mut deleted = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match b.cleanup().await {
                    Ok(n) => deleted += n,
                    // The table lock may time out under load: that is allowed.
                    Err(e) => assert!(e.is_transient(), "cleanup failed: {e}"),
                }
            }
            deleted
        })
    };
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let b = b.clone();
            tokio::spawn(async move {
                let name = format!("n{w}");
                let mut tokens = Vec::new();
                for _ in 0..40 {
                    let (lease, token) = grant(&b, &name, Duration::from_secs(30)).await;
                    tokens.push(token);
                    assert!(b.release(&name, &lease).await.unwrap());
                }
                (name, tokens)
            })
        })
        .collect();
    let mut all = HashMap::new();
    for w in workers {
        let (name, tokens) = w.await.unwrap();
        all.insert(name, tokens);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let deleted = cleaner.await.unwrap();
    assert!(deleted > 0, "cleanup never deleted a row during the run");
    for (name, tokens) in all {
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{name}: tokens did not strictly grow across cleanup: {tokens:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_typed_errors() {
    let invalid = |r: mongolock::Result<PostgresBackend>, option: &str| match r {
        Err(Error::InvalidOptions { option: o, reason }) => {
            assert_eq!(o, option, "{reason}");
            assert!(!reason.is_empty());
        }
        other => panic!("expected InvalidOptions for {option}, got {other:?}"),
    };
    invalid(PostgresBackend::builder("postgres://[::1").build(), "url");
    invalid(
        PostgresBackend::builder("host=h port=notaport").build(),
        "url",
    );
    let ok = "postgres://u@localhost/db";
    invalid(PostgresBackend::builder(ok).table("").build(), "table");
    invalid(PostgresBackend::builder(ok).table("a\0b").build(), "table");
    invalid(
        PostgresBackend::builder(ok).table("x".repeat(51)).build(),
        "table",
    );
    invalid(PostgresBackend::builder(ok).schema("").build(), "schema");
    invalid(
        PostgresBackend::builder(ok).schema("s".repeat(64)).build(),
        "schema",
    );
    invalid(
        PostgresBackend::builder(ok).pool_size(0).build(),
        "pool_size",
    );
    invalid(
        PostgresBackend::builder(ok)
            .cleanup_every(Some(Duration::ZERO))
            .build(),
        "cleanup_every",
    );

    // Nothing listens on this port: transient, and quick.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable = PostgresBackend::builder(format!(
        "postgres://u@127.0.0.1:{port}/db?connect_timeout=2"
    ))
    .build()
    .unwrap();
    let started = Instant::now();
    match unreachable.inspect("x").await {
        Err(e @ Error::Unavailable { .. }) => assert!(e.is_transient()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(30));

    let Some(url) = url() else { return };
    let b = PostgresBackend::builder(&url)
        .table(postgres::unique_table("bad"))
        .build()
        .unwrap();
    // PostgreSQL text cannot hold NUL: refused with a typed error before anything is sent.
    let req = request("a\0b", Duration::from_secs(5));
    assert!(matches!(
        b.try_acquire(&req).await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        b.inspect("a\0b").await,
        Err(Error::InvalidName { .. })
    ));
    // Through the provider too.
    let p = provider(&b, Duration::from_secs(5), WaitStrategy::default());
    assert!(matches!(
        p.lock("a\0b").unwrap().try_acquire().await,
        Err(Error::InvalidName { .. })
    ));

    // A database that does not exist: permanent, with a hint.
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    config.dbname("mongolock_no_such_database");
    let missing = PostgresBackend::builder_with_config(config)
        .build()
        .unwrap();
    match missing.inspect("x").await {
        Err(Error::Backend { message, hint, .. }) => {
            assert!(message.contains("3D000"), "{message}");
            assert!(hint.contains("database"), "{hint}");
        }
        other => panic!("expected Backend for a missing database, got {other:?}"),
    }

    // A user without privileges: permanent, with a hint naming the grants.
    let admin = admin(&url).await;
    let role = postgres::unique_table("nopriv");
    admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .await
        .unwrap();
    b.migrate().await.unwrap();
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    config.user(&role);
    let denied = PostgresBackend::builder_with_config(config)
        .table(b.table().split_once('.').unwrap().1)
        .build()
        .unwrap();
    match denied
        .try_acquire(&request("x", Duration::from_secs(5)))
        .await
    {
        Err(Error::Backend { message, hint, .. }) => {
            assert!(message.contains("42501"), "{message}");
            assert!(hint.contains("grant"), "{hint}");
        }
        other => panic!("expected Backend for missing privileges, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_at_once() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("wake");
    let holder_b = backend_as(&url, &table, "wake-holder");
    let waiter_b = backend_as(&url, &table, "wake-waiter");
    // Waiters sleep 30-40 s between attempts: only a notification wakes them sooner.
    let slow = WaitStrategy::random_sleep(Duration::from_secs(30), Duration::from_secs(40));
    let holder = provider(&holder_b, Duration::from_secs(60), slow.clone());
    let waiter = provider(&waiter_b, Duration::from_secs(60), slow);
    assert!(
        eventually(Duration::from_secs(20), || async {
            waiter_b.live_notifications()
        })
        .await,
        "the listener did not come up"
    );
    for round in 0..3 {
        let g = holder.lock("job").unwrap().acquire().await.unwrap();
        let w = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                waiter
                    .lock("job")
                    .unwrap()
                    .acquire_timeout(Duration::from_secs(25))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        let token = g.fencing_token();
        g.release().await.unwrap();
        let got = w.await.unwrap().unwrap().unwrap_or_else(|| {
            panic!("round {round}: the waiter was not woken by the release (token {token})")
        });
        let took = released_at.elapsed();
        assert!(
            took < Duration::from_secs(15),
            "round {round}: woken {took:?} after the release"
        );
        assert!(got.fencing_token() > token);
        got.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_is_signalled_to_the_holder_at_once() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("takeover");
    let holder_b = backend_as(&url, &table, "takeover-holder");
    let operator = backend_as(&url, &table, "takeover-operator");
    let holder = provider(&holder_b, Duration::from_secs(60), WaitStrategy::default());
    assert!(
        eventually(Duration::from_secs(20), || async {
            holder_b.live_notifications()
        })
        .await
    );
    let g = holder.lock("role").unwrap().acquire().await.unwrap();
    assert!(!g.is_lost());
    let forced_at = Instant::now();
    assert!(operator.force_release("role").await.unwrap());
    // The next extension is 20 s away: within 15 s only the notification can tell the holder.
    tokio::time::timeout(Duration::from_secs(15), g.lost().wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the holder was not told of the force-release (token {})",
                g.fencing_token()
            )
        });
    assert!(g.is_lost(), "reason: {:?}", g.lost_reason());
    eprintln!(
        "loss signalled {:?} after the force-release",
        forced_at.elapsed()
    );
    // A takeover by another lease is signalled too.
    let g = holder.lock("role").unwrap().acquire().await.unwrap();
    assert!(operator.force_release("role").await.unwrap());
    let (_, token) = grant(&operator, "role", Duration::from_secs(60)).await;
    assert!(token > g.fencing_token());
    tokio::time::timeout(Duration::from_secs(15), g.lost().wait())
        .await
        .expect("the holder was not told of the takeover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listener_falls_back_and_recovers() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("relisten");
    let app = format!("relisten-{:x}", rand::random::<u32>());
    let b = backend_as(&url, &table, &app);
    let slow = WaitStrategy::random_sleep(Duration::from_secs(30), Duration::from_secs(40));
    let p = provider(&b, Duration::from_secs(60), slow);
    assert!(eventually(Duration::from_secs(20), || async { b.live_notifications() }).await);
    let listen_app = format!("{app} (listen)");
    let first = listener_pid(&url, &listen_app)
        .await
        .expect("a listening connection");
    let g = p.lock("x").unwrap().acquire().await.unwrap();
    // A waiter is asleep until the holder's expiry (60 s) when the listener is killed.
    let w = {
        let p = p.clone();
        tokio::spawn(async move {
            p.lock("x")
                .unwrap()
                .acquire_timeout(Duration::from_secs(50))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(terminate(&url, &listen_app).await, 1);
    // It reconnects on its own, on a new connection.
    let recovered = eventually(Duration::from_secs(30), || async {
        let now = listener_pid(&url, &listen_app).await;
        b.live_notifications() && now.is_some() && now != Some(first)
    })
    .await;
    assert!(
        recovered,
        "the listener did not reconnect (first pid {first})"
    );
    // And notifications work again: the release wakes the waiter long before its 30 s sleep.
    let released_at = Instant::now();
    g.release().await.unwrap();
    let got = w.await.unwrap().unwrap().expect("the waiter got the lock");
    assert!(
        released_at.elapsed() < Duration::from_secs(20),
        "woken {:?} after the release",
        released_at.elapsed()
    );
    got.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_connections_are_killed_keeps_its_lease() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("killed");
    let app = format!("killed-{:x}", rand::random::<u32>());
    let b = backend_as(&url, &table, &app);
    let p = provider(&b, Duration::from_secs(3), WaitStrategy::default());
    let g = p.lock("held").unwrap().acquire().await.unwrap();
    let started = Instant::now();
    // Kill every connection of the holder, the listener's included, again and again over
    // several extension periods (every second).
    while started.elapsed() < Duration::from_secs(5) {
        terminate(&url, &app).await;
        terminate(&url, &format!("{app} (listen)")).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert!(
        !g.is_lost(),
        "the lease was lost after killed connections: {:?}",
        g.lost_reason()
    );
    let info = b.inspect("held").await.unwrap().expect("the row");
    assert!(info.held, "{info:?}");
    assert_eq!(info.lease_id.as_ref(), Some(g.lease_id()));
    assert_eq!(info.fencing_token, Some(g.fencing_token()));
    assert!(g.expires_at() > SystemTime::now() - Duration::from_secs(60));
    g.release().await.unwrap();
    assert!(!b.inspect("held").await.unwrap().unwrap().held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_means_loss_by_the_deadline_and_nothing_held_after_restart() {
    if postgres::bin_dir().is_none() {
        eprintln!("skipped: no PostgreSQL binaries to start a server of this test's own");
        return;
    }
    let server = postgres::PgServer::start().expect("start PostgreSQL");
    let url = server.url();
    let b = PostgresBackend::builder(format!("{url}?connect_timeout=2"))
        .table("locks")
        .build()
        .unwrap();
    let p = provider(&b, Duration::from_secs(3), WaitStrategy::default());
    let g = p.lock("job").unwrap().acquire().await.unwrap();
    let token = g.fencing_token();
    let deadline = g.local_deadline();
    // A waiter of another backend waits through the outage: it must get the lock once the
    // server is back (polling while the listening connection is down, re-checking once it is
    // up again).
    let waiter_b = PostgresBackend::builder(format!("{url}?connect_timeout=2"))
        .table("locks")
        .build()
        .unwrap();
    let waiter = provider(
        &waiter_b,
        Duration::from_secs(3),
        WaitStrategy::random_sleep(Duration::from_millis(200), Duration::from_millis(400)),
    );
    let waiting = tokio::spawn(async move {
        let got = waiter
            .lock("job")
            .unwrap()
            .acquire_timeout(Duration::from_secs(120))
            .await;
        got.map(|g| g.map(|g| (g.fencing_token(), g)))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop_immediately().expect("pg_ctl stop -m immediate");
    let stopped_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), g.lost().wait())
        .await
        .expect("the lost signal fired");
    assert!(
        Instant::now() <= deadline + Duration::from_secs(2),
        "lost {:?} after the stop, past the local deadline",
        stopped_at.elapsed()
    );
    assert!(g.is_lost());
    drop(g);
    server.restart().expect("pg_ctl start");
    let restarted_at = Instant::now();
    let (waiter_token, waiter_guard) = waiting
        .await
        .unwrap()
        .expect("the waiter's acquire call")
        .expect("the waiter got the lock after the restart");
    eprintln!(
        "the waiter got the lock {:?} after the restart",
        restarted_at.elapsed()
    );
    assert!(waiter_token > token, "{waiter_token} after {token}");
    waiter_guard.release().await.unwrap();
    // Nothing is left held once the lease expired by server time, and the next holder's token
    // is larger.
    let other = provider(&b, Duration::from_secs(3), WaitStrategy::default());
    let next = other
        .lock("job")
        .unwrap()
        .acquire_timeout(Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the lock is free after the restart");
    assert!(next.fencing_token() > waiter_token);
    next.release().await.unwrap();
    let info = b.inspect("job").await.unwrap().unwrap();
    assert!(!info.held, "{info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_concurrently_and_repeatedly() {
    let Some(url) = url() else { return };
    let schema = postgres::unique_table("schema");
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let b = PostgresBackend::builder(&url)
                .schema(&schema)
                .table(format!("t{}", i % 3))
                .build()
                .unwrap();
            tokio::spawn(async move {
                b.migrate().await.unwrap();
                b.migrate().await.unwrap();
                grant(&b, &format!("x{i}"), Duration::from_secs(5)).await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let list = PostgresBackend::builder(&url)
        .schema(&schema)
        .table("t0")
        .build()
        .unwrap()
        .list()
        .await
        .unwrap();
    let names: Vec<&str> = list.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["x0", "x3"]);
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Nine tasks of one process (one holder, eight waiters, all polling only every 30-40 s) hand
/// one lock around: each release must wake one waiter at once (a notification), not all eight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handoffs_are_prompt_and_do_not_stampede() {
    const WAITERS: usize = 8;
    const HANDOFFS: usize = 40;
    let Some(url) = url() else { return };
    let inner = backend_as(&url, &postgres::unique_table("handoff"), "handoff");
    assert!(
        eventually(Duration::from_secs(20), || async {
            inner.live_notifications()
        })
        .await
    );
    let counting = Arc::new(CountingAll {
        inner: Arc::new(inner),
        acquires: Default::default(),
    });
    let provider = LockProvider::builder_shared(counting.clone())
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_secs(30),
            Duration::from_secs(40),
        ))
        .build()
        .unwrap();
    // Uncontended acquire + release, for the report (not asserted).
    let lock = provider.lock("solo").unwrap();
    let started = Instant::now();
    for _ in 0..100 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    eprintln!(
        "postgres uncontended acquire + release: {:?} each",
        started.elapsed() / 100
    );

    let before = counting.acquires.load(std::sync::atomic::Ordering::SeqCst);
    let samples = mongolock::testing::hand_around(&provider, "handoff", WAITERS, HANDOFFS).await;
    let attempts = counting.acquires.load(std::sync::atomic::Ordering::SeqCst) - before;
    let m = median(samples.clone());
    eprintln!(
        "postgres handoff median {m:?}, max {:?}; {:.1} attempts per handoff",
        samples.iter().max().unwrap(),
        attempts as f64 / HANDOFFS as f64
    );
    // Polling alone sleeps at least 30 s: only notifications make handoffs prompt.
    assert!(m < Duration::from_secs(5), "median handoff {m:?}");
    // A stampede would be >= 8 attempts per release.
    assert!(
        attempts < HANDOFFS * 6,
        "{attempts} attempts for {HANDOFFS} handoffs"
    );
}

/// With notifications turned off, waiters poll and holders learn of a loss by extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_notifications_waiters_poll_and_extension_detects_loss() {
    let Some(url) = url() else { return };
    let b = PostgresBackend::builder(&url)
        .table(postgres::unique_table("polling"))
        .notifications(false)
        .build()
        .unwrap();
    assert!(!b.live_notifications());
    assert!(b.change_waiter("x").is_none());
    let p = provider(
        &b,
        Duration::from_secs(2),
        WaitStrategy::random_sleep(Duration::from_millis(20), Duration::from_millis(60)),
    );
    let g = p.lock("x").unwrap().acquire().await.unwrap();
    let w = {
        let p = p.clone();
        tokio::spawn(async move {
            p.lock("x")
                .unwrap()
                .acquire_timeout(Duration::from_secs(30))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let token = g.fencing_token();
    g.release().await.unwrap();
    let got = w
        .await
        .unwrap()
        .unwrap()
        .expect("the polling waiter got the lock");
    assert!(got.fencing_token() > token);
    // A force-release is found by the next extension (every ~0.7 s).
    assert!(b.force_release("x").await.unwrap());
    tokio::time::timeout(Duration::from_secs(15), got.lost().wait())
        .await
        .expect("the extension found the lease gone");
    assert!(got.is_lost());
    assert!(!b.live_notifications());
}

/// The trigger function of the versions before the handoff queue (payload `<token> <lease id
/// or -> <name>`), as their migration installs it.
/// `{schema}` is replaced by the test's own schema.
const OLD_TRIGGER_FUNCTION: &str = "CREATE OR REPLACE FUNCTION \"{schema}\".mongolock_notify()
  RETURNS trigger LANGUAGE plpgsql AS $fn$
  BEGIN
    IF TG_OP = 'DELETE' THEN
      PERFORM pg_notify(TG_ARGV[0], OLD.fencing_token || ' - ' || OLD.name);
      RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE'
       AND OLD.lease_id IS NOT DISTINCT FROM NEW.lease_id
       AND OLD.fencing_token = NEW.fencing_token THEN
      RETURN NEW;
    END IF;
    PERFORM pg_notify(TG_ARGV[0],
      NEW.fencing_token || ' ' || coalesce(NEW.lease_id, '-') || ' ' || NEW.name);
    RETURN NEW;
  END
  $fn$";

/// A table created before semaphores existed (no `slot_limit`/`slots` columns, nor the handoff
/// queue's `waiters`/`handoff`, nor the record of ended leases) gets them from the migration of a new backend, keeps its
/// tokens, and then serves semaphores and hands off across processes. The trigger function
/// (shared by the schema's tables) of the new version works on the old table before it is
/// migrated, and an old version's function (put back by an older build's migration) is
/// replaced. The test has a schema of its own: putting the old function back in `public`
/// would race with (and change the trigger of) every other test's table there.
#[tokio::test]
async fn tables_from_before_semaphores_are_migrated() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("oldtable");
    let schema = postgres::unique_table("oldschema");
    let old = PostgresBackend::builder(&url)
        .schema(&schema)
        .table(&table)
        .build()
        .unwrap();
    old.migrate().await.unwrap();
    let p = LockProvider::builder(old.clone()).build().unwrap();
    let g = p.lock("jobs").unwrap().acquire().await.unwrap();
    let before = g.fencing_token();
    g.release().await.unwrap();
    p.lock("old-row")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let admin = admin(&url).await;
    // The table as the previous versions created it.
    admin
        .batch_execute(&format!(
            "ALTER TABLE \"{schema}\".\"{table}\" DROP COLUMN slot_limit, DROP COLUMN slots,
               DROP COLUMN waiters, DROP COLUMN handoff, DROP COLUMN ended,
               DROP COLUMN ended_from"
        ))
        .await
        .expect("drop the semaphore and queue columns");
    // The new function on a table without the new columns (another table of the schema was
    // migrated first): writes still work and are published.
    admin
        .batch_execute(&format!(
            "UPDATE \"{schema}\".\"{table}\" SET lease_id = 'someone' WHERE name = 'jobs';
             UPDATE \"{schema}\".\"{table}\" SET lease_id = NULL WHERE name = 'jobs';"
        ))
        .await
        .expect("the new trigger function works on an old table");
    // An older build's migration puts its function back.
    admin
        .batch_execute(&OLD_TRIGGER_FUNCTION.replace("{schema}", &schema))
        .await
        .expect("install the old trigger function");
    let new = PostgresBackend::builder(&url)
        .schema(&schema)
        .table(&table)
        .build()
        .unwrap();
    let p = LockProvider::builder(new).build().unwrap();
    let sem = p.semaphore("jobs", 2).unwrap();
    let a = sem.acquire().await.expect("a slot after the migration");
    let b = sem.acquire().await.unwrap();
    assert!(
        a.fencing_token() > before && b.fencing_token() > a.fencing_token(),
        "tokens {before}, {}, {}",
        a.fencing_token(),
        b.fencing_token()
    );
    assert!(sem.try_acquire().await.unwrap().is_none());
    a.release().await.unwrap();
    b.release().await.unwrap();
    let migrated: bool = admin
        .query_one(
            &format!(
                "SELECT p.prosrc LIKE '%handoff%'
                        AND (SELECT count(*) FROM pg_attribute
                              WHERE attrelid = '\"{schema}\".\"{table}\"'::regclass
                                AND attname IN ('slots', 'slot_limit', 'waiters', 'handoff',
                                                'ended', 'ended_from')
                                AND NOT attisdropped) = 6
                   FROM pg_proc p WHERE p.oid = '\"{schema}\".mongolock_notify()'::regprocedure"
            ),
            &[],
        )
        .await
        .expect("read the catalog")
        .get(0);
    assert!(
        migrated,
        "the queue columns and the new trigger function are in place"
    );
    // Locks hand off across processes on the migrated table: a second backend queues and is
    // designated by the release.
    let other = PostgresBackend::builder(&url)
        .schema(&schema)
        .table(&table)
        .build()
        .unwrap();
    let holder = p.lock("x").unwrap().acquire().await.unwrap();
    let q = LockProvider::builder(other.clone())
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_secs(30),
            Duration::from_secs(40),
        ))
        .build()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || async {
            other.live_notifications()
        })
        .await
    );
    let waiting = tokio::spawn(async move { q.lock("x").unwrap().acquire().await });
    let queued = eventually(Duration::from_secs(20), || async {
        admin
            .query_one(
                &format!(
                    "SELECT jsonb_array_length(waiters) FROM \"{schema}\".\"{table}\" WHERE name = 'x'"
                ),
                &[],
            )
            .await
            .map(|r| r.get::<_, i32>(0) == 1)
            .unwrap_or(false)
    })
    .await;
    assert!(queued, "the waiting backend never queued");
    holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the designated backend got the lock")
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    // A row written before the record of ended leases existed (no floor) gets one at its
    // next grant: a repeated release is still told from a loss.
    let (lease, token) = grant(&other, "old-row", Duration::from_secs(60)).await;
    assert!(other.release("old-row", &lease).await.unwrap());
    assert!(
        other.release("old-row", &lease).await.unwrap(),
        "a repeated release of token {token} on a row from before the record"
    );
}

/// A release repeated after its first statement was applied (a retry after a lost reply: the
/// core retries about 50 ms later, with no driver retry in between) reports success even when
/// more than 8 other leases of the name were released in between, as on a hot lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_repeated_after_many_other_releases_reports_success() {
    let Some(url) = url() else { return };
    let b = PostgresBackend::builder(&url)
        .table(postgres::unique_table("released"))
        .build()
        .unwrap();
    let name = "hot";
    let (first, _) = grant(&b, name, Duration::from_secs(60)).await;
    assert!(b.release(name, &first).await.unwrap());
    for _ in 0..12 {
        let (other, _) = grant(&b, name, Duration::from_secs(60)).await;
        assert!(b.release(name, &other).await.unwrap());
    }
    assert!(
        b.release(name, &first).await.unwrap(),
        "a release repeated after 12 other releases reported the lease lost"
    );
    // A lease someone else ended still reports `false`.
    let (taken, _) = grant(&b, name, Duration::from_secs(60)).await;
    assert!(b.force_release(name).await.unwrap());
    assert!(!b.release(name, &taken).await.unwrap());
}

/// The stored size of row `name` of `table` (in `public`), in bytes, and the row as text.
async fn row_size(url: &str, table: &str, name: &str) -> (i32, String) {
    let row = admin(url)
        .await
        .query_one(
            &format!(
                "SELECT pg_column_size(t.*), t::text FROM public.\"{table}\" t WHERE name = $1"
            ),
            &[&name],
        )
        .await
        .expect("read the row");
    (row.get(0), row.get(1))
}

/// A busy name's row does not grow with its traffic: what tells a retried release from a lost
/// lease is kept by fencing token, not as a list of the released lease ids of the last minute
/// (which made every release of a busy name parse, filter and rewrite up to 256 entries: about
/// 5x the server time of an uncontended acquire + release). Named lock and one-slot semaphore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_row_does_not_grow_with_its_releases() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("busy");
    let b = PostgresBackend::builder(&url)
        .table(&table)
        .build()
        .unwrap();
    let p = provider(
        &b,
        Duration::from_secs(60),
        WaitStrategy::random_sleep(Duration::from_millis(10), Duration::from_millis(50)),
    );
    let lock = p.lock("busy").unwrap();
    let sem = p.semaphore("busy-sem", 1).unwrap();
    let mut sizes = Vec::new();
    for round in 0..300 {
        lock.acquire().await.unwrap().release().await.unwrap();
        sem.acquire().await.unwrap().release().await.unwrap();
        if round == 9 || round == 299 {
            sizes.push((
                row_size(&url, &table, "busy").await,
                row_size(&url, &table, "busy-sem").await,
            ));
        }
    }
    for (what, after_10, after_300) in [
        ("named lock", &sizes[0].0, &sizes[1].0),
        ("semaphore", &sizes[0].1, &sizes[1].1),
    ] {
        assert!(
            after_300.0 <= after_10.0 + 16,
            "the {what}'s row grew from {} bytes after 10 releases to {} after 300: {}",
            after_10.0,
            after_300.0,
            after_300.1
        );
    }
}

/// Leases ended by someone else report `false` on release, whatever way they ended: taken over
/// after they expired (exclusive, slot, and a slot taken by an exclusive grant), discarded as
/// expired by another slot's grant or release, force-released (by name or token); a slot
/// released by its holder and retried after other slots' traffic reports success. More such
/// leases than the record keeps (64) raise its floor: the oldest still report the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_tell_leases_ended_by_others_from_their_own() {
    let Some(url) = url() else { return };
    let b = PostgresBackend::builder(&url)
        .table(postgres::unique_table("ended"))
        .build()
        .unwrap();
    let short = Duration::from_millis(200);
    let slot = |name: &str, ttl: Duration, limit: u32| AcquireRequest {
        mode: mongolock::LeaseMode::Slot { limit },
        ..request(name, ttl)
    };
    let grant_slot = |req: AcquireRequest| {
        let b = b.clone();
        async move {
            match b.try_acquire(&req).await.expect("acquire a slot") {
                Attempt::Acquired(lease) => (req.lease_id, lease.fencing_token),
                other => panic!("{}: expected a slot, got {other:?}", req.name),
            }
        }
    };
    // Exclusive, expired and taken over.
    let (old, _) = grant(&b, "x", short).await;
    tokio::time::sleep(short * 2).await;
    let (new, _) = grant(&b, "x", Duration::from_secs(60)).await;
    assert!(
        !b.release("x", &old).await.unwrap(),
        "taken over after expiry"
    );
    assert!(b.release("x", &new).await.unwrap());
    assert!(b.release("x", &new).await.unwrap(), "a repeated release");
    // A slot, expired and taken by an exclusive grant.
    let (s1, _) = grant_slot(slot("s", short, 2)).await;
    tokio::time::sleep(short * 2).await;
    let (x, _) = grant(&b, "s", Duration::from_secs(60)).await;
    assert!(!b.release("s", &s1).await.unwrap(), "slot taken by a lock");
    assert!(b.release("s", &x).await.unwrap());
    // Slots discarded as expired by another slot's grant, and by another slot's release.
    let (s2, _) = grant_slot(slot("t", short, 2)).await;
    let (s3, _) = grant_slot(slot("t", Duration::from_secs(60), 2)).await;
    tokio::time::sleep(short * 2).await;
    let (s4, _) = grant_slot(slot("t", Duration::from_secs(60), 2)).await;
    assert!(
        !b.release("t", &s2).await.unwrap(),
        "slot discarded by a grant"
    );
    let (s5, _) = grant_slot(slot("u", short, 2)).await;
    let (s6, _) = grant_slot(slot("u", Duration::from_secs(60), 2)).await;
    tokio::time::sleep(short * 2).await;
    assert!(b.release("u", &s6).await.unwrap());
    assert!(
        !b.release("u", &s5).await.unwrap(),
        "slot discarded by a release"
    );
    // A slot released by its holder, repeated after other slots came and went.
    assert!(b.release("t", &s3).await.unwrap());
    for _ in 0..12 {
        let (s, _) = grant_slot(slot("t", Duration::from_secs(60), 2)).await;
        assert!(b.release("t", &s).await.unwrap());
    }
    assert!(
        b.release("t", &s3).await.unwrap(),
        "a repeated slot release"
    );
    assert!(b.release("t", &s4).await.unwrap());
    // Force-released slots, by name and by token.
    let (f1, _) = grant_slot(slot("v", Duration::from_secs(60), 2)).await;
    let (f2, t2) = grant_slot(slot("v", Duration::from_secs(60), 2)).await;
    assert!(b.force_release_token("v", t2).await.unwrap());
    assert!(
        !b.release("v", &f2).await.unwrap(),
        "slot force-released by token"
    );
    assert!(b.force_release("v").await.unwrap());
    assert!(
        !b.release("v", &f1).await.unwrap(),
        "slot force-released by name"
    );
    // More than the record keeps.
    let (first, first_token) = grant(&b, "y", Duration::from_secs(60)).await;
    assert!(b.force_release("y").await.unwrap());
    for _ in 0..70 {
        let (id, token) = grant(&b, "y", Duration::from_secs(60)).await;
        assert!(b.force_release_token("y", token).await.unwrap());
        assert!(
            !b.release("y", &id).await.unwrap(),
            "force-released token {token}"
        );
    }
    assert!(
        !b.release("y", &first).await.unwrap(),
        "force-released token {first_token}, below the record's floor"
    );
    let (last, _) = grant(&b, "y", Duration::from_secs(60)).await;
    assert!(b.release("y", &last).await.unwrap());
    assert!(
        b.release("y", &last).await.unwrap(),
        "repeated after the record filled"
    );
}

/// Waits until the connection named `app` waits for a lock (`pg_stat_activity`).
async fn waits_for_a_lock(url: &str, app: &str) -> bool {
    let admin = admin(url).await;
    eventually(Duration::from_secs(20), || async {
        admin
            .query_opt(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = $1
                   AND wait_event_type = 'Lock'",
                &[&app],
            )
            .await
            .map(|r| r.is_some())
            .unwrap_or(false)
    })
    .await
}

/// A release whose statement starts (and takes its snapshot) while its expired lease is still
/// in the row, and whose `UPDATE` runs only after another backend took the name over, reports
/// the loss: the snapshot, which cannot say how the lease ended, is not read as "released by
/// its holder". The order is forced with a row lock held by a third session: the takeover
/// queues for it first, then the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_the_takeover_of_its_expired_lease_reports_the_loss() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("race");
    let a = backend_as(&url, &table, &format!("{table}-a"));
    let b = backend_as(&url, &table, &format!("{table}-b"));
    let (lease, token) = grant(&a, "x", Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut blocker = admin(&url).await;
    let tx = blocker.transaction().await.unwrap();
    tx.execute(
        &format!("SELECT 1 FROM public.\"{table}\" WHERE name = 'x' FOR UPDATE"),
        &[],
    )
    .await
    .unwrap();
    let taking = tokio::spawn({
        let b = b.clone();
        async move { grant(&b, "x", Duration::from_secs(60)).await }
    });
    assert!(
        waits_for_a_lock(&url, &format!("{table}-b")).await,
        "the takeover never queued for the row lock"
    );
    let releasing = tokio::spawn({
        let a = a.clone();
        let lease = lease.clone();
        async move { a.release("x", &lease).await }
    });
    assert!(
        waits_for_a_lock(&url, &format!("{table}-a")).await,
        "the release never queued for the row lock"
    );
    tx.commit().await.unwrap();
    let (_, new_token) = taking.await.unwrap();
    let released = releasing.await.unwrap().unwrap();
    let (_, row) = row_size(&url, &table, "x").await;
    assert!(
        !released,
        "the release of expired token {token}, taken over by token {new_token} while the \
         release waited, reported success; row {row}"
    );
}

/// The last statement of every connection named `app` (`pg_stat_activity`).
async fn last_statements(url: &str, app: &str) -> Vec<String> {
    admin(url)
        .await
        .query(
            "SELECT query FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .expect("read pg_stat_activity")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// What a grant or release wrote to the row of `name`, for lease `lease_id`, with what differs
/// between two equivalent writes (the name's own token and times, the backends' marks) left
/// out: the designation as (designated mark, releasing mark set, ended lease id is `lease_id`).
async fn row_state(url: &str, table: &str, name: &str, lease_id: &LeaseId) -> String {
    let row = admin(url)
        .await
        .query_one(
            &format!(
                "SELECT lease_id IS NOT DISTINCT FROM $2 AS ours, lease_id IS NULL AS free,
                        expires_at > clock_timestamp() AS unexpired, holder_app,
                        slot_limit, slots::text, waiters::text, handoff, released::text,
                        ended::text, ended_from IS NOT NULL AS floor
                   FROM public.\"{table}\" WHERE name = $1"
            ),
            &[&name, &lease_id.as_str()],
        )
        .await
        .expect("read the row");
    let handoff: Option<String> = row.get("handoff");
    let designation = handoff.map(|h| {
        let parts: Vec<&str> = h.splitn(3, '/').collect();
        (
            parts.first().map(|d| d.to_string()),
            parts.get(1).is_some_and(|m| !m.is_empty()),
            parts.get(2) == Some(&lease_id.as_str()),
        )
    });
    format!(
        "ours={} free={} unexpired={} app={:?} slot_limit={:?} slots={} waiters={} \
         designation={designation:?} released={} ended={} floor={}",
        row.get::<_, bool>("ours"),
        row.get::<_, bool>("free"),
        row.get::<_, bool>("unexpired"),
        row.get::<_, Option<String>>("holder_app"),
        row.get::<_, Option<i32>>("slot_limit"),
        row.get::<_, String>("slots"),
        row.get::<_, String>("waiters"),
        row.get::<_, String>("released"),
        row.get::<_, String>("ended"),
        row.get::<_, bool>("floor"),
    )
}

/// The uncontended shortcut (a backend's next attempt on a name its last release left free and
/// unqueued, and that lease's release) writes what the full acquire and release statements
/// write on such a row: the same columns, the same queue, record of ended leases and
/// designation. One name goes through the shortcut, the other (another backend, which has no
/// reason to try it) through the full statements; that the shortcut ran is read from the
/// connections' last statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_uncontended_shortcut_writes_what_the_full_statements_write() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("cheap");
    let cheap = backend_as(&url, &table, "pg-cheap-shortcut");
    let full = backend_as(&url, &table, "pg-cheap-full");
    let ttl = Duration::from_secs(30);
    for name in ["by-shortcut", "by-full"] {
        let (id, _) = grant(&cheap, name, ttl).await;
        assert!(cheap.release(name, &id).await.expect("first release"));
    }
    let (id_s, token_s) = grant(&cheap, "by-shortcut", ttl).await;
    shortcut_ran(
        &url,
        "pg-cheap-shortcut",
        "RETURNING true AS acquired",
        "grant",
    )
    .await;
    let (id_f, token_f) = grant(&full, "by-full", ttl).await;
    same_rows(
        &url,
        &table,
        [&id_s, &id_f],
        &format!("granted (tokens {token_s} and {token_f})"),
    )
    .await;
    assert!(cheap.release("by-shortcut", &id_s).await.expect("release"));
    shortcut_ran(
        &url,
        "pg-cheap-shortcut",
        "RETURNING true AS released",
        "release",
    )
    .await;
    assert!(full.release("by-full", &id_f).await.expect("release"));
    same_rows(&url, &table, [&id_s, &id_f], "released").await;
}

/// Asserts that the last statement of a connection named `app` was one of the shortcut's
/// (`returning` tells which): that the `what` took the shortcut.
async fn shortcut_ran(url: &str, app: &str, returning: &str, what: &str) {
    let statements = last_statements(url, app).await;
    assert!(
        statements
            .iter()
            .any(|q| q.starts_with("UPDATE") && q.contains(returning)),
        "the {what} did not take the shortcut; the connections' last statements: {statements:?}"
    );
}

/// Asserts that the rows `by-shortcut` (lease `ids[0]`) and `by-full` (lease `ids[1]`) show
/// the same state ([`row_state`]) after `stage`.
async fn same_rows(url: &str, table: &str, ids: [&LeaseId; 2], stage: &str) {
    let s = row_state(url, table, "by-shortcut", ids[0]).await;
    let f = row_state(url, table, "by-full", ids[1]).await;
    println!("{stage}:\n  shortcut: {s}\n  full:     {f}");
    assert_eq!(
        s, f,
        "{stage}: the shortcut wrote another row than the full statements"
    );
}

/// A process that queues behind a lease granted by the shortcut is designated by its release:
/// the short release matches nothing once the queue is not empty, and the full release that
/// follows pops the waiter into `handoff`. The waiter then holds the name long before the
/// released lease's expiry (30 s), which is when it would retry without the designation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_queued_behind_a_shortcut_grant_is_designated_by_its_release() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("cheapq");
    let holder = backend_as(&url, &table, "pg-cheapq-holder");
    let waiter = backend_as(&url, &table, "pg-cheapq-waiter");
    let ttl = Duration::from_secs(30);
    let slow = WaitStrategy::random_sleep(Duration::from_secs(20), Duration::from_secs(25));
    let lock = provider(&holder, ttl, slow.clone()).lock("n").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    let guard = lock.acquire().await.unwrap();
    shortcut_ran(
        &url,
        "pg-cheapq-holder",
        "RETURNING true AS acquired",
        "grant",
    )
    .await;
    let waiting = provider(&waiter, ttl, slow).lock("n").unwrap();
    let started = Instant::now();
    // The waiter keeps the lock until the designation was read: its own release would
    // record a new one.
    let waits = tokio::spawn(async move {
        let got = waiting.acquire_timeout(Duration::from_secs(25)).await;
        (got, started.elapsed())
    });
    let queued = |url: String, table: String| async move {
        admin(&url)
            .await
            .query_one(
                &format!("SELECT waiters::text FROM public.\"{table}\" WHERE name = 'n'"),
                &[],
            )
            .await
            .expect("read the queue")
            .get::<_, String>(0)
    };
    let in_queue = eventually(Duration::from_secs(20), || {
        let (url, table) = (url.clone(), table.clone());
        async move { queued(url, table).await != "[]" }
    })
    .await;
    assert!(
        in_queue,
        "the waiter never queued: waiters {}",
        queued(url.clone(), table.clone()).await
    );
    let token = guard.fencing_token();
    guard.release().await.expect("release");
    let (got, after) = waits.await.expect("the waiter's task");
    let handoff: Option<String> = admin(&url)
        .await
        .query_one(
            &format!("SELECT handoff FROM public.\"{table}\" WHERE name = 'n'"),
            &[],
        )
        .await
        .expect("read the designation")
        .get(0);
    let got_token = got.as_ref().map(|g| g.as_ref().map(|g| g.fencing_token()));
    println!(
        "released token {token}; handoff {handoff:?}; the waiter got {got_token:?} after {after:?}"
    );
    assert!(
        handoff.as_deref().is_some_and(|h| !h.starts_with('/')),
        "the release designated nobody although a waiter was queued: handoff {handoff:?}"
    );
    assert!(
        matches!(got_token, Ok(Some(t)) if t > token),
        "the queued waiter did not get the lock after the release: {got_token:?} after {after:?}"
    );
    if let Ok(Some(g)) = got {
        g.release().await.expect("the waiter's release");
    }
}

/// The shortcut's grant draws its token (and reads its time) for the row it writes, after any
/// wait for the row's lock, not once per statement before it. Here the shortcut's `UPDATE` of
/// a free row waits behind another session, which meanwhile takes a later token for the name
/// (as a grant and release by another process would) and commits; the shortcut must then grant
/// a token above that one. Its first version, with the token drawn in an uncorrelated
/// sub-select, wrote the older token here (the torture run found it as tokens going backwards
/// and as grants timed before the previous lease ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shortcut_draws_its_token_after_waiting_for_the_row() {
    let Some(url) = url() else { return };
    let table = postgres::unique_table("cheapwait");
    let app = "pg-cheap-wait";
    let b = backend_as(&url, &table, app);
    let ttl = Duration::from_secs(30);
    let (id, _) = grant(&b, "n", ttl).await;
    assert!(b.release("n", &id).await.expect("release"));
    let other = admin(&url).await;
    other
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM public.\"{table}\" WHERE name = 'n' FOR UPDATE"
        ))
        .await
        .expect("lock the row");
    let req = request("n", ttl);
    let attempt = {
        let (b, req) = (b.clone(), req.clone());
        tokio::spawn(async move { b.try_acquire(&req).await })
    };
    let waiting = eventually(Duration::from_secs(20), || {
        let url = url.clone();
        async move {
            admin(&url)
                .await
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    &[&app],
                )
                .await
                .expect("read pg_stat_activity")
                .get::<_, i64>(0)
                == 1
        }
    })
    .await;
    assert!(
        waiting,
        "the shortcut's UPDATE never waited for the row lock"
    );
    let later: i64 = other
        .query_one(
            &format!(
                "UPDATE public.\"{table}\" SET fencing_token = nextval('public.\"{table}_fencing_token\"')
                  WHERE name = 'n' RETURNING fencing_token"
            ),
            &[],
        )
        .await
        .expect("take a later token")
        .get(0);
    other.batch_execute("COMMIT").await.expect("commit");
    let granted = attempt.await.expect("the attempt's task").expect("acquire");
    shortcut_ran(&url, app, "RETURNING true AS acquired", "grant").await;
    let token = match &granted {
        Attempt::Acquired(lease) => lease.fencing_token,
        other => panic!("the free row was not granted: {other:?}"),
    };
    println!("token {later} taken while the shortcut waited; the shortcut granted {token}");
    assert!(
        token > u64::try_from(later).expect("a positive token"),
        "the shortcut granted token {token}, not above {later}, taken while it waited"
    );
}

/// An attempt whose outcome is unknown (here: it failed waiting for the row lock) may, in
/// general, still be applied later — a statement retransmitted after a partition on a
/// connection its client gave up — after the call's next attempt was granted and that lease
/// released. Applied then (replayed here, the same lease id), it must not grant the name
/// again: nobody would hold that lease, and the name would stay held until the TTL. Also for a
/// semaphore slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_never_grants_a_released_lease_id_again() {
    let Some(url) = url() else { return };
    for mode in [
        mongolock::LeaseMode::Exclusive,
        mongolock::LeaseMode::Slot { limit: 2 },
    ] {
        let table = postgres::unique_table("late");
        let b = PostgresBackend::builder(&url)
            .table(&table)
            .statement_timeout(Some(Duration::from_millis(800)))
            .build()
            .expect("valid options");
        let name = "late";
        let req = AcquireRequest {
            mode,
            ..request(name, Duration::from_secs(120))
        };
        // The row exists; another session holds it locked while the first attempt runs.
        let other = AcquireRequest {
            lease_id: LeaseId::random(),
            ..req.clone()
        };
        assert!(matches!(
            b.try_acquire(&other).await.unwrap(),
            Attempt::Acquired(_)
        ));
        assert!(b.release(name, &other.lease_id).await.unwrap());
        let mut locker = admin(&url).await;
        let tx = locker.transaction().await.unwrap();
        tx.execute(
            &format!("SELECT 1 FROM public.\"{table}\" WHERE name = $1 FOR UPDATE"),
            &[&name],
        )
        .await
        .unwrap();
        let first = b.try_acquire(&req).await;
        tx.rollback().await.unwrap();
        assert!(
            first.is_err(),
            "{mode:?}: the first attempt must fail: {first:?}"
        );
        let Attempt::Acquired(lease) = b.try_acquire(&req).await.unwrap() else {
            panic!("{mode:?}: the retry of {} was not granted", req.lease_id);
        };
        assert!(b.release(name, &req.lease_id).await.unwrap());
        // The first attempt arrives now (twice: the shortcut, then the full statement).
        for late in 0..2 {
            let again = b.try_acquire(&req).await.unwrap();
            let info = b.inspect(name).await.unwrap();
            assert!(
                matches!(again, Attempt::Busy { .. }),
                "{mode:?}: late attempt {late} of {} (token {} released) was granted again: \
                 {again:?}; the lock: {info:?}",
                req.lease_id,
                lease.fencing_token
            );
            assert!(
                !info.is_some_and(|i| i.held),
                "{mode:?}: nobody holds {name}"
            );
        }
        let (_, token) = grant(&b, name, Duration::from_secs(5)).await;
        assert!(token > lease.fencing_token);
    }
}
