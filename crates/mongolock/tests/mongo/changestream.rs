//! Change-stream wake-ups and early loss detection: prompt handoffs without a stampede, one
//! stream per backend for thousands of names, no release missed while the stream reconnects,
//! loss signalled on takeover before the next extension, and the polling fallback on a
//! standalone server. The memory backend runs the same handoff and loss tests.
//!
//! Runs against the embedded mongo-testserver, or against `MONGODB_URI` when set (a replica
//! set; the fault-injection test needs `MONGODB_FAILPOINTS=1`, the standalone test needs the
//! embedded server).

use crate::support::mongo;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use mongo::{test_database, test_database_with, unique};
use mongo_testserver::TestServer;
use mongodb::bson::{doc, Bson, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::Client;
use mongolock::{
    LockBackend, LockBackendExt, LockProvider, MemoryBackend, MongoBackend, WaitStrategy,
};
use tokio::time::Instant;

/// A wait strategy whose shortest sleep is far above a change-stream handoff: a prompt handoff
/// can only come from a wake-up.
fn slow_polling() -> WaitStrategy {
    WaitStrategy::random_sleep(Duration::from_millis(300), Duration::from_millis(600))
}

use mongolock::testing::eventually;

/// Waits until the backend's change notifications are live (the stream is open).
async fn until_live(backend: &dyn LockBackend) {
    let live = eventually(Duration::from_secs(20), || async {
        backend.live_notifications()
    })
    .await;
    assert!(live, "change notifications did not become live");
}

fn is_change_stream_open(name: &str, body: &Document) -> bool {
    name == "aggregate"
        && body
            .get_array("pipeline")
            .ok()
            .and_then(|p| p.first())
            .and_then(Bson::as_document)
            .is_some_and(|s| s.contains_key("$changeStream"))
}

/// Counts of what a client sent.
#[derive(Default)]
struct Sent {
    /// Every command.
    all: AtomicUsize,
    stream_opens: AtomicUsize,
    find_and_modify: AtomicUsize,
    /// `findAndModify`s of the uncontended shortcut (its filter requires `leaseId: null`).
    cheap_acquires: AtomicUsize,
    /// Short releases (their filter requires our lease id and an empty queue).
    short_releases: AtomicUsize,
    get_more: AtomicUsize,
    find: AtomicUsize,
    kill_cursors: AtomicUsize,
    /// Failed getMore/aggregate commands (injected faults that hit the stream).
    stream_failures: AtomicUsize,
}

/// A client (optionally with an application name, to aim fail points) that counts commands.
async fn counting_client(uri: &str, app: Option<&str>) -> (Client, Arc<Sent>) {
    let sent = Arc::new(Sent::default());
    let mut options = ClientOptions::parse(uri).await.unwrap();
    options.app_name = app.map(str::to_owned);
    options.server_selection_timeout = Some(Duration::from_secs(10));
    let sink = sent.clone();
    options.command_event_handler =
        Some(EventHandler::callback(move |ev: CommandEvent| match ev {
            CommandEvent::Started(s) => {
                sink.all.fetch_add(1, Ordering::SeqCst);
                if is_change_stream_open(&s.command_name, &s.command) {
                    sink.stream_opens.fetch_add(1, Ordering::SeqCst);
                }
                let counter = match s.command_name.as_str() {
                    "findAndModify" => Some(&sink.find_and_modify),
                    "getMore" => Some(&sink.get_more),
                    "find" => Some(&sink.find),
                    "killCursors" => Some(&sink.kill_cursors),
                    _ => None,
                };
                if let Some(c) = counter {
                    c.fetch_add(1, Ordering::SeqCst);
                }
                let cheap = s.command_name == "findAndModify"
                    && s.command
                        .get_document("query")
                        .is_ok_and(|q| q.get("leaseId") == Some(&Bson::Null));
                if cheap {
                    sink.cheap_acquires.fetch_add(1, Ordering::SeqCst);
                }
                let short = s.command_name == "findAndModify"
                    && s.command
                        .get_document("query")
                        .is_ok_and(|q| q.contains_key("waiters") && q.get_str("leaseId").is_ok());
                if short {
                    sink.short_releases.fetch_add(1, Ordering::SeqCst);
                }
            }
            CommandEvent::Failed(f) => {
                if matches!(f.command_name.as_str(), "getMore" | "aggregate") {
                    sink.stream_failures.fetch_add(1, Ordering::SeqCst);
                }
            }
            _ => {}
        }));
    (Client::with_options(options).unwrap(), sent)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Nine tasks (one holder, eight waiters) hand one lock around `handoffs` times (see
/// [`mongolock::testing::hand_around`]); returns the handoff latencies.
async fn handoffs(provider: &LockProvider, handoffs: usize) -> Vec<Duration> {
    mongolock::testing::hand_around(provider, &unique("handoff"), 8, handoffs).await
}

/// With the change stream open, an uncontended acquire + release costs exactly two commands:
/// the stream leaves out the backend's own grants and releases, so no `getMore` answers them
/// (an idle stream's empty `getMore` comes about once per `maxAwaitTimeMS`, 1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uncontended_pairs_cost_two_commands_with_the_stream_open() {
    const PAIRS: usize = 300;
    let t = test_database().await;
    let (client, sent) = counting_client(&t.uri, None).await;
    let backend = MongoBackend::builder(&client.database(t.db.name()))
        .collection(unique("locks"))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend.clone()).build().unwrap();
    let lock = provider.lock(unique("pairs")).unwrap();
    // Warm-up: creates the document, stamps the first token, creates the TTL index and opens
    // the stream (a holder's loss detection starts it).
    for _ in 0..5 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    until_live(&backend).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all_before = sent.all.load(Ordering::SeqCst);
    let get_more_before = sent.get_more.load(Ordering::SeqCst);
    let fam_before = sent.find_and_modify.load(Ordering::SeqCst);
    let cheap_before = sent.cheap_acquires.load(Ordering::SeqCst);
    let short_before = sent.short_releases.load(Ordering::SeqCst);
    let started = Instant::now();
    for _ in 0..PAIRS {
        let g = lock.acquire().await.unwrap();
        assert!(!g.is_lost());
        g.release().await.unwrap();
    }
    let elapsed = started.elapsed();
    let all = sent.all.load(Ordering::SeqCst) - all_before;
    let get_more = sent.get_more.load(Ordering::SeqCst) - get_more_before;
    let find_and_modify = sent.find_and_modify.load(Ordering::SeqCst) - fam_before;
    assert!(backend.live_notifications(), "the stream stayed open");
    assert_eq!(
        find_and_modify,
        2 * PAIRS,
        "one findAndModify per acquisition and one per release"
    );
    assert_eq!(
        sent.cheap_acquires.load(Ordering::SeqCst) - cheap_before,
        PAIRS,
        "every acquisition after the backend's own unqueued release takes the uncontended \
         shortcut"
    );
    assert_eq!(
        sent.short_releases.load(Ordering::SeqCst) - short_before,
        PAIRS,
        "every lease granted by the shortcut is released by the short release"
    );
    assert_eq!(
        all - get_more,
        2 * PAIRS,
        "exactly one acquire and one release command per pair ({all} commands, {get_more} getMore)"
    );
    let idle = elapsed.as_secs() as usize + 2;
    assert!(
        get_more <= idle,
        "{get_more} getMore in {elapsed:?} for {PAIRS} pairs: the stream answered our own writes"
    );
    assert_eq!(sent.stream_opens.load(Ordering::SeqCst), 1);
}

/// The uncontended shortcut is only a shortcut: when another process took the name after this
/// backend's release, the short command matches nothing and the full attempt decides (busy);
/// tokens keep growing through both kinds of grant, and an expired lease is taken over by the
/// full attempt, which records it as ended by someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_uncontended_shortcut_falls_back_to_the_full_attempt() {
    let t = test_database().await;
    let coll = unique("locks");
    let name = unique("shortcut");
    let (client_a, sent_a) = counting_client(&t.uri, None).await;
    let backend = |client: &Client| {
        MongoBackend::builder(&client.database(t.db.name()))
            .collection(coll.clone())
            .build()
            .unwrap()
    };
    let a = backend(&client_a);
    let b = backend(&mongo::client(&t.uri, None).await);
    // No automatic extension: a lease below is left to expire.
    let (pa, pb) = (
        LockProvider::builder(a.clone())
            .auto_extend(false)
            .build()
            .unwrap(),
        LockProvider::builder(b.clone()).build().unwrap(),
    );
    let cheap = || sent_a.cheap_acquires.load(Ordering::SeqCst);
    let ga = pa.lock(name.as_str()).unwrap().acquire().await.unwrap();
    let t1 = ga.fencing_token();
    ga.release().await.unwrap();
    // B takes the name after A's unqueued release: A's shortcut misses, its full attempt is
    // busy.
    let gb = pb.lock(name.as_str()).unwrap().acquire().await.unwrap();
    let t2 = gb.fencing_token();
    assert!(t2 > t1, "tokens {t1} then {t2}");
    let before = cheap();
    let busy = pa.lock(name.as_str()).unwrap().try_acquire().await.unwrap();
    assert!(busy.is_none(), "A got {name} while B holds it");
    assert_eq!(cheap() - before, 1, "A tried the shortcut once");
    // Its next attempt is the full one (one shortcut per release).
    let before = cheap();
    assert!(pa
        .lock(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert_eq!(cheap(), before, "no shortcut without a release of A's own");
    gb.release().await.unwrap();
    // Full attempt, then the shortcut after A's own release: tokens still grow by one.
    let g = pa.lock(name.as_str()).unwrap().acquire().await.unwrap();
    let t3 = g.fencing_token();
    assert!(t3 > t2, "tokens {t2} then {t3}");
    g.release().await.unwrap();
    let before = cheap();
    let g = pa
        .lock(name.as_str())
        .unwrap()
        .with_expiry(Duration::from_millis(300))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert_eq!(cheap() - before, 1, "granted by the shortcut");
    let t4 = g.fencing_token();
    assert_eq!(
        t4,
        t3 + 1,
        "the shortcut issues the next token of the epoch"
    );
    // A lease left to expire is taken over by the full attempt (the shortcut needs a released
    // lease), which records the expired lease as ended by someone else: its holder's release
    // reports the loss.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let gb = pb.lock(name.as_str()).unwrap().acquire().await.unwrap();
    assert!(gb.fencing_token() > t4);
    let (fam, finds) = (
        sent_a.find_and_modify.load(Ordering::SeqCst),
        sent_a.find.load(Ordering::SeqCst),
    );
    let lost = g.release().await;
    assert!(
        matches!(lost, Err(mongolock::Error::LeaseLost { .. })),
        "the release of the taken-over lease {t4} reported {lost:?}"
    );
    // The short release and the full one match nothing, one read tells the loss; a lease the
    // backend knows as exclusive is not tried as a semaphore slot too.
    let (fam, finds) = (
        sent_a.find_and_modify.load(Ordering::SeqCst) - fam,
        sent_a.find.load(Ordering::SeqCst) - finds,
    );
    assert!(
        fam == 2 && finds == 1,
        "the lost release cost {fam} findAndModify and {finds} find"
    );
    gb.release().await.unwrap();
    // A lease granted by the shortcut, and a process that queues while it is held: the short
    // release matches nothing (the queue is not empty) and the full release hands the lock
    // to the queued process.
    let g = pa.lock(name.as_str()).unwrap().acquire().await.unwrap();
    g.release().await.unwrap();
    let before = cheap();
    let g = pa.lock(name.as_str()).unwrap().acquire().await.unwrap();
    assert_eq!(cheap() - before, 1, "granted by the shortcut");
    until_live(&b).await;
    let waiter = {
        let lock = pb.lock(name.as_str()).unwrap();
        tokio::spawn(async move {
            lock.acquire_timeout(Duration::from_secs(60))
                .await
                .unwrap()
                .expect("B got the lock within 60 s of A's release")
        })
    };
    let queued = eventually(Duration::from_secs(20), || async {
        t.db.collection::<Document>(&coll)
            .find_one(doc! { "_id": name.as_str() })
            .await
            .unwrap()
            .and_then(|d| d.get_array("waiters").ok().map(|w| w.len()))
            == Some(1)
    })
    .await;
    assert!(queued, "B's process did not queue for {name}");
    let short_before = sent_a.short_releases.load(Ordering::SeqCst);
    let token = g.fencing_token();
    g.release().await.unwrap();
    assert_eq!(
        sent_a.short_releases.load(Ordering::SeqCst) - short_before,
        1,
        "the short release was tried"
    );
    let gb = waiter.await.unwrap();
    assert!(gb.fencing_token() > token);
    gb.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handoffs_are_prompt_and_do_not_stampede() {
    const HANDOFFS: usize = 60;
    let t = test_database().await;
    let (client, sent) = counting_client(&t.uri, None).await;
    let backend = MongoBackend::builder(&client.database(t.db.name()))
        .collection(unique("locks"))
        .build()
        .unwrap();
    until_live(&backend).await;
    let provider = LockProvider::builder(backend.clone())
        .wait_strategy(slow_polling())
        .build()
        .unwrap();
    let before = sent.find_and_modify.load(Ordering::SeqCst);
    let samples = handoffs(&provider, HANDOFFS).await;
    let attempts = sent.find_and_modify.load(Ordering::SeqCst) - before;
    let m = median(samples.clone());
    eprintln!(
        "mongodb handoff median {m:?}, max {:?}; {:.1} findAndModify per handoff",
        samples.iter().max().unwrap(),
        attempts as f64 / HANDOFFS as f64
    );
    // Polling alone sleeps at least 300 ms; a loose bound, not a benchmark.
    assert!(m < Duration::from_millis(150), "median handoff {m:?}");
    // A stampede would be >= 8 attempts per release; wake-ups cost about three (the woken
    // waiter, one waiter re-reading the new expiry, the releaser's next try). The first use of
    // the name adds two.
    assert!(
        attempts < HANDOFFS * 6,
        "{attempts} findAndModify for {HANDOFFS} handoffs"
    );
    // Opened before any name was in use, then reopened (where it was) once to cover the name.
    let opens = sent.stream_opens.load(Ordering::SeqCst);
    assert!(opens <= 2, "{opens} stream opens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_handoffs_are_prompt() {
    let provider = LockProvider::builder(MemoryBackend::new())
        .wait_strategy(slow_polling())
        .build()
        .unwrap();
    let samples = handoffs(&provider, 100).await;
    let m = median(samples);
    assert!(m < Duration::from_millis(150), "median handoff {m:?}");
}

/// Waiters in two backends (two "processes"): each backend's stream wakes its own waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_in_several_backends_all_get_turns() {
    let t = test_database().await;
    let coll = unique("locks");
    let providers: Vec<LockProvider> = (0..2)
        .map(|_| {
            let backend = MongoBackend::builder(&t.db)
                .collection(coll.clone())
                .build()
                .unwrap();
            LockProvider::builder(backend)
                .wait_strategy(slow_polling())
                .build()
                .unwrap()
        })
        .collect();
    for p in &providers {
        until_live(p.backend().as_ref()).await;
    }
    let name = unique("shared");
    let held_by = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, p) in providers.iter().enumerate() {
        for _ in 0..3 {
            let lock = p.lock(name.clone()).unwrap();
            let held_by = held_by.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let g = lock.acquire().await.unwrap();
                    held_by.lock().unwrap().push((i, g.fencing_token()));
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    g.release().await.unwrap();
                }
            }));
        }
    }
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    let held_by = held_by.lock().unwrap();
    assert_eq!(held_by.len(), 30);
    assert!(held_by.windows(2).all(|w| w[0].1 < w[1].1));
    let backends: HashSet<usize> = held_by.iter().map(|(i, _)| *i).collect();
    assert_eq!(backends.len(), 2);
    // 30 acquisitions; polling alone would need at least 300 ms for most of them.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
}

/// A holder learns of a takeover from the notification, long before its next extension.
async fn takeover_is_signalled_at_once(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    until_live(a.as_ref()).await;
    let holder = LockProvider::builder_shared(a)
        .expiry(Duration::from_secs(60))
        .extension_cadence(Duration::from_secs(20))
        .build()
        .unwrap();
    let other = LockProvider::builder_shared(b).build().unwrap();
    let name = unique("takeover");
    let g = holder.lock(name.clone()).unwrap().acquire().await.unwrap();
    // Other traffic on the name that is not a loss: our own extensions.
    for _ in 0..3 {
        assert!(g.extend(Duration::from_secs(60)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!g.is_lost(), "extensions are not a loss");

    let started = Instant::now();
    assert!(other.force_release(&name).await.unwrap());
    let taker = other
        .lock(name.clone())
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("free after force-release");
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("the lost signal fires on the takeover, not at the next extension (20 s)");
    assert!(g.is_lost());
    eprintln!(
        "loss signalled {:?} after the takeover began",
        started.elapsed()
    );
    assert!(taker.fencing_token() > g.fencing_token());
    assert!(!taker.is_lost());
    taker.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mongodb_takeover_is_signalled_at_once() {
    let t = test_database().await;
    let coll = unique("locks");
    let backend = |db: &mongodb::Database| -> Arc<dyn LockBackend> {
        Arc::new(
            MongoBackend::builder(db)
                .collection(coll.clone())
                .build()
                .unwrap(),
        )
    };
    takeover_is_signalled_at_once(backend(&t.db), backend(&t.db)).await;
}

/// MongoDB 4.4 reports pipeline updates as `replace` events: a holder in another backend that
/// keeps extending does not wake the waiter at each extension (only the first event, before
/// the waiter's registry knows the lease, may cost it one attempt), its release still hands
/// the lock over at once, and a takeover is still signalled to the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mongodb_44_replace_events_wake_waiters_only_on_real_changes() {
    let t = test_database_with(TestServer::builder().pipeline_updates_as_replace(true)).await;
    if t.server.is_none() {
        eprintln!("skipped: needs the embedded server's MongoDB 4.4 mode");
        return;
    }
    let coll = unique("locks");
    let holder_backend = MongoBackend::builder(&t.db)
        .collection(coll.clone())
        .build()
        .unwrap();
    let (client, sent) = counting_client(&t.uri, None).await;
    let waiter_backend = MongoBackend::builder(&client.database(t.db.name()))
        .collection(coll)
        .build()
        .unwrap();
    until_live(&waiter_backend).await;
    let holder = LockProvider::builder(holder_backend.clone())
        .expiry(Duration::from_secs(3))
        .extension_cadence(Duration::from_millis(100))
        .build()
        .unwrap();
    // Polling alone would sleep at least 5 s: a prompt handoff can only come from a wake-up.
    let waiter = LockProvider::builder(waiter_backend.clone())
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_secs(5),
            Duration::from_secs(6),
        ))
        .build()
        .unwrap();
    let name = unique("replace44");
    let g = holder.lock(name.clone()).unwrap().acquire().await.unwrap();
    let before = sent.find_and_modify.load(Ordering::SeqCst);
    let waiting = {
        let lock = waiter.lock(name.clone()).unwrap();
        tokio::spawn(async move { lock.acquire().await.unwrap() })
    };
    // About fifteen extensions, each a replace event showing the same lease.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!g.is_lost(), "extensions are not a loss");
    let attempts = sent.find_and_modify.load(Ordering::SeqCst) - before;
    assert!(
        attempts <= 3,
        "{attempts} acquire attempts while the holder only extended: extensions woke the waiter"
    );
    let released = Instant::now();
    g.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(4), waiting)
        .await
        .expect("the release (a replace event without a lease) wakes the waiter")
        .unwrap();
    eprintln!(
        "4.4 mode: {attempts} attempts while waiting; handoff in {:?}",
        released.elapsed()
    );
    next.release().await.unwrap();
    // Takeovers are still signalled to holders.
    takeover_is_signalled_at_once(mongo::shared(holder_backend), mongo::shared(waiter_backend))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_takeover_is_signalled_at_once() {
    let b: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    takeover_is_signalled_at_once(b.clone(), b).await;
}

/// `lease_gone` judged directly: a late event from before the grant is not a loss; a
/// takeover is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_gone_ignores_old_news_and_sees_takeovers() {
    let t = test_database().await;
    let coll = unique("locks");
    let a = MongoBackend::builder(&t.db)
        .collection(coll.clone())
        .build()
        .unwrap();
    let b = MongoBackend::builder(&t.db)
        .collection(coll)
        .build()
        .unwrap();
    until_live(&a).await;
    let pa = LockProvider::builder(a.clone()).build().unwrap();
    let pb = LockProvider::builder(b).build().unwrap();
    let name = unique("judge");
    // Many quick handoffs between the two backends, then a holder in A: the events of the
    // earlier holders arrive around A's grant and must not count as a loss.
    for _ in 0..10 {
        mongo::take_once(&pb, &name).await;
    }
    let g = pa.lock(name.clone()).unwrap().acquire().await.unwrap();
    let gone = tokio::time::timeout(
        Duration::from_millis(700),
        a.lease_gone(&name, g.lease_id()),
    )
    .await;
    assert!(gone.is_err(), "old events were taken for a loss");
    let id = g.lease_id().clone();
    let waiting = {
        let a = a.clone();
        let name = name.clone();
        tokio::spawn(async move { a.lease_gone(&name, &id).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(pb.force_release(&name).await.unwrap());
    let next = pb.lock(name.clone()).unwrap().acquire().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("lease_gone completes on the takeover")
        .unwrap();
    next.release().await.unwrap();
    drop(g);
}

/// Thousands of names in one process share the backend's one change stream, and the registry
/// empties when they are no longer used.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_names_share_one_stream() {
    const NAMES: usize = 2000;
    const CONTENDED: usize = 100;
    let t = test_database().await;
    let (client, sent) = counting_client(&t.uri, None).await;
    let backend = MongoBackend::builder(&client.database(t.db.name()))
        .collection(unique("locks"))
        .create_ttl_index(false)
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend.clone())
        .wait_strategy(slow_polling())
        .build()
        .unwrap();
    let names: Vec<String> = (0..NAMES).map(|i| format!("job-{i:05}")).collect();
    let guards: Vec<_> = futures_util::stream::iter(names.iter().cloned())
        .map(|n| {
            let p = provider.clone();
            async move { p.lock(n).unwrap().acquire().await.unwrap() }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    assert_eq!(guards.len(), NAMES);
    until_live(&backend).await;
    // Waiters on some of the names, in the same process.
    let waiters: Vec<_> = names[..CONTENDED]
        .iter()
        .map(|n| {
            let lock = provider.lock(n.clone()).unwrap();
            tokio::spawn(async move { lock.acquire().await.unwrap() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(backend.watched_names() >= NAMES);
    let released = Instant::now();
    futures_util::stream::iter(guards)
        .for_each_concurrent(64, |g| async move { g.release().await.unwrap() })
        .await;
    for w in waiters {
        w.await.unwrap().release().await.unwrap();
    }
    eprintln!(
        "{NAMES} releases and {CONTENDED} handoffs took {:?}",
        released.elapsed()
    );
    // One stream, reopened where it was when it widened to newly used names (held names are
    // covered lazily, a batch at a getMore answer, until past the narrowing bound it covers every
    // name) and to the waiters' names. How many batches that takes depends on how the 2000
    // acquisitions spread over time (4 on an idle machine, 5 seen under load), never on the
    // number of names: a stream per name, or a reopening per name, would be thousands.
    let opens = sent.stream_opens.load(Ordering::SeqCst);
    eprintln!("{opens} change stream opens for {NAMES} names");
    assert!(
        opens <= 16,
        "one change stream for the backend, reopened only to widen: {opens} opens for {NAMES} \
         names"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            backend.watched_names() == 0
        })
        .await,
        "{} names still registered after every guard and waiter finished",
        backend.watched_names()
    );
}

/// Each process's stream carries only the names it uses: another process's acquisitions and
/// releases of other names reach it not at all (so the server's work per write does not grow
/// with the number of processes), while a name it starts waiting on is covered without missing
/// the release, and a name it holds for long is covered so that a force-release is signalled
/// before the next extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_stream_carries_only_the_names_its_process_uses() {
    let t = test_database().await;
    let coll = unique("locks");
    let backend = || {
        MongoBackend::builder(&t.db)
            .collection(coll.clone())
            .create_ttl_index(false)
            .build()
            .unwrap()
    };
    let (a, b) = (backend(), backend());
    let pa = LockProvider::builder(a.clone())
        .expiry(Duration::from_secs(60))
        .extension_cadence(Duration::from_secs(50))
        .wait_strategy(slow_polling())
        .build()
        .unwrap();
    let pb = LockProvider::builder(b.clone())
        .wait_strategy(slow_polling())
        .build()
        .unwrap();
    // A holds a name for long: its stream opens, and covers the name after about a second.
    let held_name = unique("held");
    let held = pa.lock(held_name.clone()).unwrap().acquire().await.unwrap();
    until_live(&a).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = a.stream_events();
    // B works on other names, and on one name many times.
    let busy = unique("busy");
    for i in 0..20 {
        let g = pb
            .lock(format!("{busy}-{i}"))
            .unwrap()
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
        let g = pb.lock(busy.clone()).unwrap().acquire().await.unwrap();
        g.release().await.unwrap();
    }
    // Two idle getMore periods: anything that passed A's stream has arrived by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let unrelated = a.stream_events() - before;
    assert_eq!(
        unrelated, 0,
        "A's stream delivered {unrelated} events of names A neither waits on nor holds"
    );
    // A waits on a name B holds: covered on demand, and B's release reaches A's waiter.
    let contended = unique("contended");
    let gb = pb.lock(contended.clone()).unwrap().acquire().await.unwrap();
    let waiter = {
        let lock = pa.lock(contended.clone()).unwrap();
        tokio::spawn(async move { lock.acquire().await.unwrap() })
    };
    // The waiter registered (the held name and the contended one), then its attempt was busy.
    assert!(eventually(Duration::from_secs(20), || async { a.watched_names() == 2 }).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let token_b = gb.fencing_token();
    gb.release().await.unwrap();
    let ga = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("A's waiter took the lock after B's release")
        .unwrap();
    assert!(ga.fencing_token() > token_b);
    ga.release().await.unwrap();
    // A force-release of A's long-held name is signalled through the stream, well before the
    // 50 s extension.
    let forced = Instant::now();
    assert!(pb.force_release(&held_name).await.unwrap());
    tokio::time::timeout(Duration::from_secs(20), held.lost())
        .await
        .expect("the force-release of a long-held lease is signalled through the stream");
    eprintln!(
        "A's stream: {} events in all; force-release signalled after {:?}",
        a.stream_events(),
        forced.elapsed()
    );
}

/// The stream task ends with the last clone of its backend: its cursor is killed and no more
/// getMores are sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_ends_with_the_backend() {
    let t = test_database().await;
    let (client, sent) = counting_client(&t.uri, None).await;
    let backend = MongoBackend::builder(&client.database(t.db.name()))
        .collection(unique("locks"))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend.clone()).build().unwrap();
    let clone = backend.clone();
    until_live(&clone).await;
    provider
        .lock("x")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    drop((backend, provider));
    // A clone keeps it alive: getMores continue (the server answers an idle one after 1 s).
    let before = sent.get_more.load(Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(10), || async {
            sent.get_more.load(Ordering::SeqCst) > before
        })
        .await
    );
    drop(clone);
    assert!(
        eventually(Duration::from_secs(10), || async {
            sent.kill_cursors.load(Ordering::SeqCst) >= 1
        })
        .await,
        "the cursor is killed when the backend is gone"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = sent.get_more.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        sent.get_more.load(Ordering::SeqCst),
        after,
        "no getMore after the backend was dropped"
    );
}

/// A release that happens while the waiter's stream is broken and reconnecting (resumed by
/// the driver, resumed by mongolock from its resume token, or rebuilt from scratch) still wakes
/// the waiter, long before its polling delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_release_is_missed_while_the_stream_reconnects() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("reconnect");
    let (client, sent) = counting_client(&t.uri, Some(&app)).await;
    let coll = unique("locks");
    let waiting_backend = MongoBackend::builder(&client.database(t.db.name()))
        .collection(coll.clone())
        .build()
        .unwrap();
    let waiters = LockProvider::builder(waiting_backend.clone())
        // Polling alone would take at least 20 s.
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_secs(20),
            Duration::from_secs(30),
        ))
        .build()
        .unwrap();
    let holders = LockProvider::builder(
        MongoBackend::builder(&t.db)
            .collection(coll)
            .build()
            .unwrap(),
    )
    .build()
    .unwrap();
    until_live(&waiting_backend).await;
    let faults = [
        // The driver resumes by itself after each closed getMore.
        (
            doc! { "times": 3 },
            doc! { "failCommands": ["getMore"], "closeConnection": true },
        ),
        // The driver's own resume fails too: mongolock resumes from the resume token.
        (
            doc! { "times": 4 },
            doc! { "failCommands": ["getMore", "aggregate"], "closeConnection": true },
        ),
        // Not resumable: the stream is rebuilt and every waiter re-checks.
        (
            doc! { "times": 1 },
            doc! { "failCommands": ["getMore"], "errorCode": 286 },
        ),
    ];
    for round in 0..12 {
        let (mode, fault) = faults[round % faults.len()].clone();
        let name = format!("reconnect-{round}");
        let held = holders.lock(name.clone()).unwrap().acquire().await.unwrap();
        let waiter = {
            let lock = waiters.lock(name.clone()).unwrap();
            tokio::spawn(async move { lock.acquire().await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut data = fault;
        data.insert("appName", app.as_str());
        t.fail_point(mode.into(), data).await;
        // A write elsewhere ends the stream's current getMore, so the fault hits the next one
        // at once; the release then lands at some point of the reconnect.
        holders
            .lock(format!("poke-{round}"))
            .unwrap()
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let pause = [0, 5, 20, 50, 100, 200, 400][round % 7];
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let g = tokio::time::timeout(Duration::from_secs(15), waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter missed the release"))
            .unwrap();
        eprintln!("round {round}: waiter held after {:?}", released.elapsed());
        t.fail_point_off().await;
        g.release().await.unwrap();
    }
    eprintln!(
        "{} failed getMore/aggregate commands, {} change stream opens",
        sent.stream_failures.load(Ordering::SeqCst),
        sent.stream_opens.load(Ordering::SeqCst)
    );
    assert!(
        sent.stream_failures.load(Ordering::SeqCst) > 0,
        "the injected faults never hit the change stream"
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            waiting_backend.live_notifications()
        })
        .await
    );
}

/// A change stream whose first open is refused with an error that is transient (134,
/// ReadConcernMajorityNotAvailableYet) or not known to be permanent (1, InternalError) is
/// retried with backoff: once the fault is gone it becomes live, and a release wakes a waiter
/// long before its polling delay. (Before, one such refusal turned wake-ups off for the life of
/// the backend.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_first_open_does_not_turn_wake_ups_off() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    for code in [134, 1] {
        let app = unique("refused-open");
        let (client, sent) = counting_client(&t.uri, Some(&app)).await;
        let coll = unique("locks");
        let waiting_backend = MongoBackend::builder(&client.database(t.db.name()))
            .collection(coll.clone())
            .build()
            .unwrap();
        let waiters = LockProvider::builder(waiting_backend.clone())
            // Polling alone would take at least 20 s.
            .wait_strategy(WaitStrategy::random_sleep(
                Duration::from_secs(20),
                Duration::from_secs(30),
            ))
            .build()
            .unwrap();
        let holders = LockProvider::builder(
            MongoBackend::builder(&t.db)
                .collection(coll)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
        t.fail_point(
            "alwaysOn".into(),
            doc! { "failCommands": ["aggregate"], "errorCode": code, "appName": app.as_str() },
        )
        .await;
        // Starts the stream: its opens are refused.
        assert!(!waiting_backend.live_notifications());
        let refused = eventually(Duration::from_secs(20), || async {
            sent.stream_failures.load(Ordering::SeqCst) >= 1
        })
        .await;
        assert!(refused, "{code}: the fault never hit the stream's open");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting_backend.live_notifications());
        t.fail_point_off().await;
        let live = eventually(Duration::from_secs(20), || async {
            waiting_backend.live_notifications()
        })
        .await;
        assert!(
            live,
            "{code}: change notifications did not become live after the fault was gone \
             ({} refused opens)",
            sent.stream_failures.load(Ordering::SeqCst)
        );
        let name = unique("refused");
        let held = holders.lock(name.clone()).unwrap().acquire().await.unwrap();
        let waiter = {
            let lock = waiters.lock(name.clone()).unwrap();
            tokio::spawn(async move { lock.acquire().await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let g = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("{code}: the waiter was not woken by the release"))
            .unwrap();
        let took = released.elapsed();
        eprintln!("{code}: waiter held {took:?} after the release");
        g.release().await.unwrap();
    }
}

/// A first open refused with an error that means change streams cannot work here (40573: a
/// standalone server; 13: a missing privilege) still falls back to polling: no waiter
/// registrations, waiters poll their way to the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_refusal_falls_back_to_polling() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    for code in [40573, 13] {
        let app = unique("unavailable");
        let (client, sent) = counting_client(&t.uri, Some(&app)).await;
        let backend = MongoBackend::builder(&client.database(t.db.name()))
            .collection(unique("locks"))
            .build()
            .unwrap();
        let provider = LockProvider::builder(backend.clone())
            .wait_strategy(WaitStrategy::random_sleep(
                Duration::from_millis(10),
                Duration::from_millis(50),
            ))
            .build()
            .unwrap();
        t.fail_point(
            "alwaysOn".into(),
            doc! { "failCommands": ["aggregate"], "errorCode": code, "appName": app.as_str() },
        )
        .await;
        let name = unique("polled");
        let unavailable = eventually(Duration::from_secs(20), || async {
            !backend.live_notifications() && backend.change_waiter(&name).is_none()
        })
        .await;
        assert!(
            unavailable,
            "{code}: notifications did not turn unavailable"
        );
        let opens = sent.stream_opens.load(Ordering::SeqCst);
        let held = provider
            .lock(name.clone())
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let waiter = {
            let lock = provider.lock(name.clone()).unwrap();
            tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(20)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        let g = waiter
            .await
            .unwrap()
            .unwrap()
            .expect("the waiter polls its way to the lock");
        g.release().await.unwrap();
        t.fail_point_off().await;
        // Not retried with backoff (the next try is a minute away).
        assert!(
            sent.stream_opens.load(Ordering::SeqCst) <= opens + 1,
            "{code}: a permanent refusal is not retried with backoff"
        );
    }
}

/// A log sink for tracing events of this thread.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// On a standalone server (no change streams) waiters poll with the wait strategy, logged
/// once per backend, and `lease_gone` stays pending.
#[tokio::test(flavor = "current_thread")]
async fn standalone_servers_fall_back_to_polling() {
    if std::env::var("MONGODB_URI").is_ok_and(|u| !u.is_empty()) {
        eprintln!("skipped: needs the embedded server in standalone mode");
        return;
    }
    let logs = Logs::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // The test runtime has one thread: the stream task logs here too.
    let _logging = tracing::subscriber::set_default(subscriber);

    let t = test_database_with(TestServer::builder().standalone(true)).await;
    let backend = MongoBackend::builder(&t.db)
        .collection(unique("locks"))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend.clone())
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap();
    let name = unique("standalone");
    for _ in 0..3 {
        let held = provider
            .lock(name.clone())
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let waiter = {
            let lock = provider.lock(name.clone()).unwrap();
            tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        let g = waiter
            .await
            .unwrap()
            .unwrap()
            .expect("the waiter polls its way to the lock");
        g.release().await.unwrap();
    }
    assert!(!backend.live_notifications());
    assert!(
        backend.change_waiter(&name).is_none(),
        "no waiter registrations without notifications"
    );
    // Loss detection falls back to extension: lease_gone stays pending even on a takeover.
    let g = provider
        .lock(name.clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(provider.force_release(&name).await.unwrap());
    assert!(tokio::time::timeout(
        Duration::from_millis(300),
        backend.lease_gone(&name, g.lease_id())
    )
    .await
    .is_err());
    drop(g);
    // A clone shares the (failed) stream: still one message.
    let clone = backend.clone();
    assert!(!clone.live_notifications());
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let fallbacks = text.matches("change streams need a replica set").count();
    assert_eq!(fallbacks, 1, "logged once per backend:\n{text}");
}

/// 32 processes (backends, each with its own client and change stream) take turns on one lock:
/// a release hands the lock to the first process in the lock's queue, whose stream wakes its
/// acquirer; the others stay asleep. So a handoff costs about one acquire attempt, not one per
/// waiting process, and the processes are served in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handoff_among_32_waiting_processes_costs_about_one_attempt() {
    handoffs_among_processes(test_database().await, 32, 8, false).await;
}

/// With fair handoff, a release also reserves the lock for the first queued process: the
/// processes are served in turn (the one that just released cannot barge ahead).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_handoff_serves_32_processes_in_turn() {
    handoffs_among_processes(test_database().await, 32, 8, true).await;
}

/// The same under MongoDB 4.4's change events (pipeline updates reported as `replace`, so
/// every registration in the queue and every extension reaches every stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handoffs_among_processes_with_replace_events_cost_about_one_attempt() {
    let t = test_database_with(TestServer::builder().pipeline_updates_as_replace(true)).await;
    handoffs_among_processes(t, 16, 6, true).await;
}

async fn handoffs_among_processes(t: mongo::TestDb, processes: usize, rounds: usize, fair: bool) {
    let coll = unique("locks");
    let name = unique("queue");
    let mut providers = Vec::new();
    let mut counters = Vec::new();
    let mut backends = Vec::new();
    for _ in 0..processes {
        let (client, sent) = counting_client(&t.uri, None).await;
        let backend = MongoBackend::builder(&client.database(t.db.name()))
            .collection(coll.clone())
            .fair_handoff(fair)
            .build()
            .unwrap();
        backends.push(backend.clone());
        providers.push(
            LockProvider::builder(backend)
                .expiry(Duration::from_secs(60))
                .build()
                .unwrap(),
        );
        counters.push(sent);
    }
    // Warm-up: every process takes the lock once, which opens its stream.
    for p in &providers {
        mongo::take_once(p, &name).await;
    }
    for p in &providers {
        until_live(&**p.backend()).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fam = || {
        counters
            .iter()
            .map(|c| c.find_and_modify.load(Ordering::SeqCst))
            .sum::<usize>()
    };
    let before = fam();
    let events = || backends.iter().map(|b| b.stream_events()).sum::<u64>();
    let events_before = events();
    let holders = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, p) in providers.iter().enumerate() {
        let lock = p.lock(name.as_str()).unwrap();
        let (holders, order) = (holders.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = lock
                    .acquire_timeout(Duration::from_secs(120))
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("process {i} waited 120 s"));
                assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                order.lock().unwrap().push((i, g.fencing_token()));
                tokio::time::sleep(Duration::from_millis(2)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let acquisitions = processes * rounds;
    // Every acquisition and every release is one findAndModify; the rest are busy attempts.
    let attempts = fam() - before - acquisitions;
    // Events still on their way have arrived after a getMore period.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let delivered = events() - events_before;
    let events_per_acquisition = delivered as f64 / acquisitions as f64;
    let per_handoff = attempts as f64 / acquisitions as f64;
    let order = order.lock().unwrap().clone();
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens out of order: {order:?}"
    );
    // Turns: how many acquisitions until every process held the lock once, from the start.
    let mut seen = HashSet::new();
    let first_round = order
        .iter()
        .position(|(i, _)| {
            seen.insert(*i);
            seen.len() == processes
        })
        .map_or(usize::MAX, |p| p + 1);
    eprintln!(
        "{processes} processes (fair handoff {fair}), {acquisitions} acquisitions: {attempts} \
         acquire attempts ({per_handoff:.2} per handoff), {delivered} change events delivered \
         ({events_per_acquisition:.2} per acquisition); every process held the lock within \
         the first {first_round} acquisitions"
    );
    if fair {
        // In turn: the first round takes `processes` acquisitions. The bound leaves room for a
        // designated process too slow (on a loaded machine) to take its turn within 500 ms.
        assert!(
            first_round <= 4 * processes,
            "not served in turn: every process held the lock only after {first_round} \
             acquisitions: {order:?}"
        );
    }
    // Without the queue every release woke one acquirer in each of the 32 processes (about 32
    // attempts per handoff). The bound leaves room for the fallback on a loaded machine.
    assert!(
        per_handoff <= 4.0,
        "{attempts} attempts for {acquisitions} acquisitions ({per_handoff:.2} per handoff)"
    );
    // A release reaches only the streams of the processes it designates, first and backup
    // (a grant reaches none that only wait): about 2 events per acquisition, not one per
    // waiting process and write. MongoDB 4.4's replace events (every write, whole) are not
    // narrowed this way. The bound leaves room for held names a stream covers fully.
    if !mongo::pipeline_updates_are_replace_events(&t.db).await {
        assert!(
            events_per_acquisition <= 3.0,
            "{delivered} change events delivered for {acquisitions} acquisitions \
             ({events_per_acquisition:.2} per acquisition) among {processes} processes"
        );
    }
}

/// With fair handoff, a process that died while first in the queue holds the lock up only for
/// its short reservation: the next waiter of another process takes it soon after the release,
/// not after a lease or a registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_process_at_the_head_of_the_queue_holds_nobody_up_for_long() {
    dead_process_at_the_head_of_the_queue(true).await;
}

/// Without fair handoff the release reaches only the streams of the processes it designates:
/// the dead first one, and the waiter's as backup, which tries after the handoff fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_backup_designee_serves_when_the_first_one_is_dead() {
    dead_process_at_the_head_of_the_queue(false).await;
}

async fn dead_process_at_the_head_of_the_queue(fair: bool) {
    let t = test_database().await;
    let coll = unique("locks");
    let name = unique("dead-head");
    let provider = |db: &mongodb::Database| {
        LockProvider::builder(
            MongoBackend::builder(db)
                .collection(coll.clone())
                .fair_handoff(fair)
                .build()
                .unwrap(),
        )
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap()
    };
    let (holder, waiter) = (provider(&t.db), provider(&t.db));
    let guard = holder.lock(name.as_str()).unwrap().acquire().await.unwrap();
    until_live(&**waiter.backend()).await;
    // A process that queued first and then died: its entry lasts well beyond the test.
    let dead = "00000000deadbeef-";
    let far = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() + 3_600_000,
    );
    t.db.collection::<Document>(&coll)
        .update_one(
            doc! { "_id": name.as_str() },
            doc! { "$set": { "waiters": [{ "m": dead, "until": far }] } },
        )
        .await
        .unwrap();
    let lock = waiter.lock(name.as_str()).unwrap();
    let waiting = tokio::spawn(async move {
        let g = lock
            .acquire_timeout(Duration::from_secs(60))
            .await
            .unwrap()
            .expect("the waiter got the lock");
        let token = g.fencing_token();
        g.release().await.unwrap();
        token
    });
    // The waiter queues behind the dead process.
    let lock_doc = || async {
        t.db.collection::<Document>(&coll)
            .find_one(doc! { "_id": name.as_str() })
            .await
            .unwrap()
            .unwrap()
    };
    let queued = eventually(Duration::from_secs(20), || async {
        lock_doc().await.get_array("waiters").map_or(0, |w| w.len()) == 2
    })
    .await;
    assert!(queued, "the waiter did not queue");
    let released_at = Instant::now();
    let held_token = guard.fencing_token();
    guard.release().await.unwrap();
    let d = lock_doc().await;
    // The waiter's process is the backup designee (its lease ids start with its mark).
    let id = waiter.backend().new_lease_id();
    let waiter_mark = &id.as_str()[..=id.as_str().find('-').unwrap()];
    assert!(
        d.get_str("backup")
            .is_ok_and(|b| b.starts_with(&format!("{waiter_mark}/"))),
        "the release made the waiter's process the backup: {d}"
    );
    assert!(
        d.get_str("next")
            .is_ok_and(|n| n.starts_with(&format!("{dead}/"))),
        "the release designated the dead process: {d}"
    );
    if fair {
        assert_eq!(
            d.get_document("reserved")
                .ok()
                .and_then(|r| r.get_str("m").ok()),
            Some(dead),
            "the release reserved the lock for the dead process: {d}"
        );
    }
    let token = waiting.await.unwrap();
    let waited = released_at.elapsed();
    eprintln!("the waiter took the lock {waited:?} after the release (reservation 500 ms)");
    assert!(token > held_token);
    // Far below the 120 s lease and the hour-long registration (the reservation is 500 ms).
    assert!(waited < Duration::from_secs(30), "{waited:?}");
}

/// MongoDB 4.4 reports pipeline updates as replace events carrying the whole document. A
/// force-release by another process must wake a waiter at once also in the process that made
/// the lock's previous release — whose change stream leaves out events showing no lease and
/// its own lease id in `lastReleased` (its own releases) — not after the forced-out lease's
/// expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mongodb_44_a_force_release_wakes_the_previous_releasers_waiter() {
    let t = test_database_with(TestServer::builder().pipeline_updates_as_replace(true)).await;
    if t.server.is_none() {
        eprintln!("skipped: needs the embedded server's MongoDB 4.4 mode");
        return;
    }
    let coll = unique("locks");
    let backend = || {
        MongoBackend::builder(&t.db)
            .collection(coll.clone())
            .build()
            .unwrap()
    };
    let (releasing, holding, operator) = (backend(), backend(), backend());
    // Polling alone would sleep at least 5 s, and a live waiter sleeps until the 30 s lease's
    // expiry: a prompt wake-up can only come from the stream.
    let releaser = LockProvider::builder(releasing.clone())
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_secs(5),
            Duration::from_secs(6),
        ))
        .build()
        .unwrap();
    let holder = LockProvider::builder(holding)
        .expiry(Duration::from_secs(30))
        .build()
        .unwrap();
    let name = unique("forced44");
    // The releasing process makes the lock's last release: `lastReleased` is its lease id.
    mongo::take_once(&releaser, &name).await;
    until_live(&releasing).await;
    let g = holder.lock(name.clone()).unwrap().acquire().await.unwrap();
    let waiting = {
        let lock = releaser.lock(name.clone()).unwrap();
        tokio::spawn(async move {
            lock.acquire_timeout(Duration::from_secs(60))
                .await
                .unwrap()
                .expect("the waiter got the lock")
        })
    };
    // The waiter's process queues in the document once its stream covers the name.
    let lock_doc = || async {
        t.db.collection::<Document>(&coll)
            .find_one(doc! { "_id": name.as_str() })
            .await
            .unwrap()
            .unwrap()
    };
    let queued = eventually(Duration::from_secs(30), || async {
        lock_doc()
            .await
            .get_array("waiters")
            .is_ok_and(|w| !w.is_empty())
    })
    .await;
    assert!(queued, "the waiter did not queue: {}", lock_doc().await);
    let forced_at = Instant::now();
    assert!(operator.force_release(&name).await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the waiter in the process of the previous release slept through another \
                 process's force-release (the lease it forced out would have expired in {:?})",
                g.expires_at()
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or_default()
            )
        })
        .unwrap();
    eprintln!(
        "4.4 mode: force-release to the previous releaser's waiter in {:?}",
        forced_at.elapsed()
    );
    assert!(next.fencing_token() > g.fencing_token());
    next.release().await.unwrap();
}

/// With fair handoff, a process that starts waiting while the lock is reserved for a process
/// that died (it queued, then its client shut down) gets the lock soon after the reservation
/// lapses: not after the reservation plus a whole lease (30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_that_starts_during_a_dead_designees_reservation_is_served_soon() {
    let t = test_database().await;
    let coll = unique("locks");
    let name = unique("dead-designee");
    let ttl = Duration::from_secs(30);
    let provider = |db: &mongodb::Database| {
        LockProvider::builder(
            MongoBackend::builder(db)
                .collection(coll.clone())
                .fair_handoff(true)
                .build()
                .unwrap(),
        )
        .expiry(ttl)
        .build()
        .unwrap()
    };
    let holder = provider(&t.db);
    let guard = holder.lock(name.as_str()).unwrap().acquire().await.unwrap();
    // The designee: its own client, queued behind the holder, then dead.
    let designee_client = mongo::client(&t.uri, None).await;
    let designee = provider(&designee_client.database(t.db.name()));
    until_live(&**designee.backend()).await;
    let designee_waits = {
        let lock = designee.lock(name.as_str()).unwrap();
        tokio::spawn(async move { lock.acquire().await })
    };
    let coll_handle = t.db.collection::<Document>(&coll);
    let lock_doc = || async {
        coll_handle
            .find_one(doc! { "_id": name.as_str() })
            .await
            .unwrap()
            .unwrap()
    };
    let queued = eventually(Duration::from_secs(30), || async {
        lock_doc()
            .await
            .get_array("waiters")
            .is_ok_and(|w| !w.is_empty())
    })
    .await;
    assert!(queued, "the designee did not queue: {}", lock_doc().await);
    designee_waits.abort();
    drop(designee);
    designee_client.shutdown().await;
    // A waiter of another process, ready before the release: its stream is live and covers
    // the name (a first wait asks for it, and a name stays covered after use). Its polling
    // sleeps 25 s: a prompt acquisition can only come from its live wait.
    let waiter = LockProvider::builder(
        MongoBackend::builder(&t.db)
            .collection(coll.clone())
            .fair_handoff(true)
            .build()
            .unwrap(),
    )
    .expiry(ttl)
    .wait_strategy(WaitStrategy::random_sleep(
        Duration::from_secs(25),
        Duration::from_secs(26),
    ))
    .build()
    .unwrap();
    until_live(&**waiter.backend()).await;
    let primed = waiter
        .lock(name.as_str())
        .unwrap()
        .acquire_timeout(Duration::from_secs(2))
        .await
        .unwrap();
    assert!(primed.is_none(), "the lock is held");
    let held_token = guard.fencing_token();
    guard.release().await.unwrap();
    // The release reserved the lock for the dead designee for 500 ms. So that the waiter surely
    // starts during the reservation on a loaded machine, stretch it to 3 s from now.
    let d = lock_doc().await;
    let reserved_for = d
        .get_document("reserved")
        .ok()
        .and_then(|r| r.get_str("m").ok())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("the release reserved nothing: {d}"));
    coll_handle
        .update_one(
            doc! { "_id": name.as_str() },
            vec![doc! { "$set": { "reserved.until": { "$add": ["$$NOW", 3000_i64] } } }],
        )
        .await
        .unwrap();
    let started = Instant::now();
    let got = waiter
        .lock(name.as_str())
        .unwrap()
        .acquire_timeout(Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the waiter got the lock");
    let waited = started.elapsed();
    eprintln!(
        "reserved for the dead {reserved_for}; the waiter that started during the reservation \
         got the lock after {waited:?}"
    );
    assert!(got.fencing_token() > held_token);
    // The reservation lapses 3 s after the waiter started; before the fix it slept until the
    // reservation plus the 30 s lease.
    assert!(
        waited < Duration::from_secs(20),
        "the waiter slept {waited:?}: until the reservation plus a lease ({ttl:?}), not until \
         the reservation lapsed"
    );
    got.release().await.unwrap();
}
