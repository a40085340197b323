//! Notification buckets on PostgreSQL (`backends/postgres/listen.rs`): a change is published
//! on the channel of its name's bucket (and on the table channel, for earlier versions), and a
//! backend listens only on the buckets of the names it uses, so writes of other names never
//! reach it, while the changes of its own names still wake it at once.

use crate::support::postgres;

use std::collections::HashSet;
use std::time::Duration;

use futures_util::StreamExt;
use mongolock::testing::eventually;
use mongolock::{
    AcquireRequest, Attempt, HolderInfo, LeaseId, LockBackend, LockBackendExt, LockProvider,
    PostgresBackend, WaitStrategy,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

fn backend(url: &str, table: &str) -> PostgresBackend {
    PostgresBackend::builder(url)
        .table(table)
        .build()
        .expect("valid options")
}

/// Waiters poll only every 30-40 s: only a notification makes a wake-up prompt.
fn provider(b: &PostgresBackend) -> LockProvider {
    LockProvider::builder(b.clone())
        .expiry(Duration::from_secs(60))
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_secs(30),
            Duration::from_secs(40),
        ))
        .build()
        .expect("valid options")
}

async fn grant(b: &PostgresBackend, name: &str) -> LeaseId {
    let req = AcquireRequest {
        name: name.to_owned(),
        lease_id: b.new_lease_id(),
        ttl: Duration::from_secs(60),
        holder: HolderInfo::current(Some("pg-buckets".into())),
        mode: mongolock::LeaseMode::Exclusive,
    };
    match b.try_acquire(&req).await.expect("acquire") {
        Attempt::Acquired(_) => req.lease_id,
        other => panic!("{name}: expected a grant, got {other:?}"),
    }
}

/// Acquires and releases `name` (two notifications: the grant and the release).
async fn write(b: &PostgresBackend, name: &str) {
    let lease = grant(b, name).await;
    assert!(b.release(name, &lease).await.expect("release"), "{name}");
}

/// A plain session that listens on `channels` and hands on `(channel, payload)`.
async fn raw_listener(
    url: &str,
    channels: &[String],
) -> (
    tokio_postgres::Client,
    mpsc::UnboundedReceiver<(String, String)>,
) {
    let (client, mut conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("listening connection");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
            }
        }
    });
    for c in channels {
        client
            .batch_execute(&format!("LISTEN \"{c}\""))
            .await
            .expect("LISTEN");
    }
    (client, rx)
}

/// Receives until `(channel, payload)` arrived (within 20 s), returning what came before.
async fn expect(
    rx: &mut mpsc::UnboundedReceiver<(String, String)>,
    channel: &str,
    payload_end: &str,
) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((c, p))) if c == channel && p.ends_with(payload_end) => return seen,
            Ok(Some(other)) => seen.push(other),
            _ => panic!("no notification {payload_end:?} on {channel}; got {seen:?}"),
        }
    }
}

/// The server's bucket (the trigger's `sha256(convert_to(name, 'UTF8'))`) and the backend's
/// (`sha2`) agree, for any name; the table channel still gets every change (a process of an
/// earlier version listens there), a kept lease's statement-level notification included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trigger_publishes_on_the_bucket_the_backend_computes() {
    let Some(url) = postgres::url() else { return };
    let table = postgres::unique_table("bucket_channels");
    let b = backend(&url, &table);
    b.migrate().await.expect("migrate");
    // An earlier version looks for its own mark in the function: finding it, it does not put
    // back its function (which publishes on the table channel only).
    let marks: bool = postgres::admin(&url)
        .await
        .query_one(
            "SELECT prosrc LIKE '%mongolock payload v2%' AND prosrc LIKE '%mongolock payload v3%'
               FROM pg_proc WHERE oid = 'public.mongolock_notify()'::regprocedure",
            &[],
        )
        .await
        .expect("read the trigger function")
        .get(0);
    assert!(marks, "the trigger function carries both version marks");
    let names = [
        "plain",
        "with space and/slash",
        "ünïcødé 名前 🔒",
        "'quoted' \"names\"",
    ];
    let table_channel = {
        let c = b.notification_channel("x");
        c[..c.rfind('_').expect("a bucket suffix")].to_owned()
    };
    let mut channels: Vec<String> = names.iter().map(|n| b.notification_channel(n)).collect();
    channels.push(table_channel.clone());
    let (_client, mut rx) = raw_listener(&url, &channels).await;
    for name in names {
        let bucket = b.notification_channel(name);
        assert!(bucket.starts_with(&table_channel) && bucket.len() == table_channel.len() + 4);
        let lease = grant(&b, name).await;
        expect(&mut rx, &bucket, &format!(" {} {name}", lease.as_str())).await;
        expect(
            &mut rx,
            &table_channel,
            &format!(" {} {name}", lease.as_str()),
        )
        .await;
        // A minimum hold keeps the lease on: the statement publishes it itself.
        assert!(b
            .release_after(name, &lease, Duration::from_secs(60))
            .await
            .expect("release after"));
        expect(&mut rx, &bucket, &format!(" - {name}")).await;
        expect(&mut rx, &table_channel, &format!(" - {name}")).await;
        assert!(b.force_release(name).await.expect("force release"));
        expect(&mut rx, &bucket, &format!(" - {name}")).await;
    }
}

/// A backend waiting on one name receives nothing of a hundred writes of names in other
/// buckets, and is still woken at once by the release of its own name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_hears_only_the_buckets_of_its_names() {
    const OTHERS: usize = 100;
    let Some(url) = postgres::url() else { return };
    let table = postgres::unique_table("bucket_listen");
    let holder_b = backend(&url, &table);
    let waiter_b = backend(&url, &table);
    let writer = backend(&url, &table);
    holder_b.migrate().await.expect("migrate");
    let (holder, waiter) = (provider(&holder_b), provider(&waiter_b));
    assert!(
        eventually(Duration::from_secs(20), || async {
            waiter_b.live_notifications()
        })
        .await,
        "the listener did not come up"
    );
    let name = "watched";
    let channel = waiter_b.notification_channel(name);
    // Another name of the same bucket (a probe), and names of other buckets.
    let all: Vec<String> = (0..20_000).map(|i| format!("other-{i}")).collect();
    let probe = all
        .iter()
        .find(|n| waiter_b.notification_channel(n) == channel)
        .expect("a name in the same bucket among 20000")
        .clone();
    let others: Vec<&String> = all
        .iter()
        .filter(|n| waiter_b.notification_channel(n) != channel)
        .take(OTHERS)
        .collect();
    let buckets: HashSet<String> = others
        .iter()
        .map(|n| waiter_b.notification_channel(n))
        .collect();
    let g = holder.lock(name).unwrap().acquire().await.unwrap();
    let token = g.fencing_token();
    let w = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .lock(name)
                .unwrap()
                .acquire_timeout(Duration::from_secs(40))
                .await
        })
    };
    // The waiter's bucket is listened to once the waiter waits: writes of the probe (its
    // bucket, not its name) then reach the waiter's backend.
    let start = waiter_b.notifications_received();
    assert!(
        eventually(Duration::from_secs(20), || async {
            write(&writer, &probe).await;
            waiter_b.notifications_received() > start
        })
        .await,
        "the waiter's backend never heard of writes in its bucket ({channel})"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = waiter_b.notifications_received();
    for other in &others {
        write(&writer, other).await;
    }
    // Notifications arrive in commit order: by the time the waiter hears of the release, it
    // would have heard of every write before it.
    let released_at = Instant::now();
    g.release().await.unwrap();
    let got = w
        .await
        .unwrap()
        .unwrap()
        .unwrap_or_else(|| panic!("the waiter was not woken by the release (token {token})"));
    let took = released_at.elapsed();
    let after = waiter_b.notifications_received();
    assert!(
        took < Duration::from_secs(20),
        "woken {took:?} after the release: only polling (30-40 s) found it"
    );
    assert!(got.fencing_token() > token);
    // The release of `name` and the waiter's own grant, and at most a few late probes: not the
    // 2 × 100 writes of the other names.
    let heard = after - before;
    eprintln!(
        "{} writes in {} other buckets: the waiter's backend received {heard} notifications \
         (woken {took:?} after the release)",
        2 * OTHERS,
        buckets.len()
    );
    assert!(
        heard <= 10,
        "the waiter's backend received {heard} notifications for the release of {name} \
         after {} writes of names in other buckets (its channel {channel})",
        2 * OTHERS
    );
    got.release().await.unwrap();
}
