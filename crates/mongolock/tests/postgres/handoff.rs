//! The cross-process handoff queue on PostgreSQL (`backends/postgres/queue.rs`), against a
//! real server: each `PostgresBackend` is one "process" for the queue (its own listening
//! connection and mark). A release designates the first queued backend, the others do not
//! attempt at once; a queued backend that died delays the next waiter by the fallback only.

use crate::support::liveness::{live_waiter_behind, Ahead, Site, HOLDER_TTL};
use crate::support::postgres;

use postgres::admin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mongolock::testing::eventually;
use mongolock::testing::CountingAll;
use mongolock::{LockBackend, LockBackendExt, LockProvider, PostgresBackend, WaitStrategy};
use tokio::time::Instant;

/// Waiters only poll every 30-40 s: only notifications make a handoff prompt.
fn slow_polling() -> WaitStrategy {
    WaitStrategy::random_sleep(Duration::from_secs(30), Duration::from_secs(40))
}

/// One "process": a backend on `table` with its own listener, counted.
struct Process {
    backend: PostgresBackend,
    counting: Arc<CountingAll>,
    provider: LockProvider,
}

impl Process {
    async fn new(url: &str, table: &str, expiry: Duration) -> Process {
        let backend = PostgresBackend::builder(url)
            .table(table)
            .build()
            .expect("valid options");
        backend.migrate().await.expect("migrate");
        assert!(
            eventually(Duration::from_secs(20), || async {
                backend.live_notifications()
            })
            .await,
            "the listening connection never came up"
        );
        let counting = Arc::new(CountingAll {
            inner: Arc::new(backend.clone()),
            acquires: AtomicUsize::new(0),
        });
        let provider = LockProvider::builder_shared(counting.clone())
            .expiry(expiry)
            .wait_strategy(slow_polling())
            .build()
            .expect("valid options");
        Process {
            backend,
            counting,
            provider,
        }
    }

    /// The backend's mark: the prefix of its lease ids, its name in the queue.
    fn mark(&self) -> String {
        self.backend.new_lease_id().as_str()[..17].to_owned()
    }

    fn attempts(&self) -> usize {
        self.counting.acquires.load(Ordering::SeqCst)
    }
}

/// The marks in the queue of `name`, in order, and the row's last designation.
async fn queue(client: &tokio_postgres::Client, table: &str, name: &str) -> (Vec<String>, String) {
    let row = client
        .query_one(
            &format!(
                "SELECT ARRAY(SELECT w->>'m' FROM jsonb_array_elements(waiters) WITH ORDINALITY
                               AS e(w, i) ORDER BY i),
                        coalesce(handoff, '')
                   FROM public.\"{table}\" WHERE name = $1"
            ),
            &[&name],
        )
        .await
        .expect("read the queue");
    (row.get(0), row.get(1))
}

/// Eight processes, one task each, hand one lock around in turn (each task asks again only
/// once another holds the lock): each release wakes only the
/// designated process, so a handoff costs about two attempts (the designated one's grant and
/// the releasing one's busy attempt when it asks again), where waking one acquirer per
/// process cost about eight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handoffs_across_processes_cost_about_two_attempts() {
    const PROCESSES: usize = 8;
    const HANDOFFS: usize = 60;
    let Some(url) = postgres::url() else { return };
    let table = postgres::unique_table("queue");
    let mut processes = Vec::new();
    for _ in 0..PROCESSES {
        processes.push(Process::new(&url, &table, Duration::from_secs(30)).await);
    }
    let providers: Vec<LockProvider> = processes.iter().map(|p| p.provider.clone()).collect();
    let samples = mongolock::testing::hand_around_among(&providers, "turns", 1, HANDOFFS).await;
    // After the last counted handoff every other task takes the lock once more: those
    // handoffs' attempts are counted too.
    let handoffs = samples.len() + PROCESSES - 1;
    let attempts: usize = processes.iter().map(Process::attempts).sum();
    let mut samples = samples;
    samples.sort();
    let per_handoff = attempts as f64 / handoffs as f64;
    eprintln!(
        "{PROCESSES} processes: {handoffs} handoffs, {attempts} attempts ({per_handoff:.2} per \
         handoff), handoff median {:?}, max {:?}",
        samples[samples.len() / 2],
        samples.last()
    );
    // Without the queue every release woke one acquirer per process (about 8 attempts).
    assert!(
        per_handoff <= 3.0,
        "{attempts} attempts for {handoffs} handoffs ({per_handoff:.2} each)"
    );
}

/// A holder and three queued processes: the release designates the first queued one, which
/// gets the lock, and the other two do not attempt (the grant is a change of the name, so
/// their fallback never fires).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_designates_the_first_queued_process() {
    let Some(url) = postgres::url() else { return };
    let table = postgres::unique_table("designate");
    let client = admin(&url).await;
    let holder = Process::new(&url, &table, Duration::from_secs(60)).await;
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(Process::new(&url, &table, Duration::from_secs(60)).await);
    }
    let g = holder.provider.lock("x").unwrap().acquire().await.unwrap();
    // Queue them one after the other, in a known order.
    let mut acquiring = Vec::new();
    for (i, w) in waiters.iter().enumerate() {
        let lock = w.provider.lock("x").unwrap();
        acquiring.push(tokio::spawn(async move { lock.acquire().await }));
        let queued = eventually(Duration::from_secs(20), || async {
            queue(&client, &table, "x").await.0.len() == i + 1
        })
        .await;
        assert!(
            queued,
            "waiter {i} never queued: {:?}",
            queue(&client, &table, "x").await
        );
    }
    let marks: Vec<String> = waiters.iter().map(Process::mark).collect();
    assert_eq!(queue(&client, &table, "x").await.0, marks, "queue order");
    let before: Vec<usize> = waiters.iter().map(Process::attempts).collect();
    g.release().await.unwrap();
    let (rest, handoff) = queue(&client, &table, "x").await;
    assert!(
        handoff.starts_with(&format!("{}/{}/", marks[0], holder.mark())),
        "designation {handoff:?}, marks {marks:?}"
    );
    let first = acquiring.remove(0);
    let got = tokio::time::timeout(Duration::from_secs(20), first)
        .await
        .expect("the designated process got the lock")
        .unwrap()
        .unwrap();
    assert_eq!(waiters[0].attempts(), before[0] + 1, "one attempt, granted");
    // The others' queue entries stay, in order (the grant removed the designated one's).
    assert_eq!(rest, marks[1..].to_vec());
    // Well past the fallback: nothing happened to the name but a grant, so nobody else tried.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for (i, w) in waiters.iter().enumerate().skip(1) {
        assert_eq!(
            w.attempts(),
            before[i],
            "waiter {i} attempted although another process was designated"
        );
    }
    // The next release goes to the next in line.
    got.release().await.unwrap();
    let second = acquiring.remove(0);
    let got = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the next designated process got the lock")
        .unwrap()
        .unwrap();
    assert_eq!(waiters[1].attempts(), before[1] + 1);
    got.release().await.unwrap();
    let third = acquiring.remove(0);
    tokio::time::timeout(Duration::from_secs(20), third)
        .await
        .expect("the last process got the lock")
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A queued process that dies (its acquirer dropped, its backend and listener gone) is still
/// designated by the next release; the next process gets the lock after the fallback, not at
/// the holder's expiry (60 s) nor by polling (30-40 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_designated_process_that_died_delays_the_next_by_the_fallback_only() {
    let Some(url) = postgres::url() else { return };
    let table = postgres::unique_table("died");
    let client = admin(&url).await;
    let holder = Process::new(&url, &table, Duration::from_secs(60)).await;
    let doomed = Process::new(&url, &table, Duration::from_secs(60)).await;
    let next = Process::new(&url, &table, Duration::from_secs(60)).await;
    let g = holder.provider.lock("x").unwrap().acquire().await.unwrap();
    let lock = doomed.provider.lock("x").unwrap();
    let dying = tokio::spawn(async move { lock.acquire().await });
    assert!(
        eventually(Duration::from_secs(20), || async {
            queue(&client, &table, "x").await.0.len() == 1
        })
        .await
    );
    let lock = next.provider.lock("x").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await });
    assert!(
        eventually(Duration::from_secs(20), || async {
            queue(&client, &table, "x").await.0.len() == 2
        })
        .await
    );
    let doomed_mark = doomed.mark();
    dying.abort();
    let _ = dying.await;
    drop(doomed);
    g.release().await.unwrap();
    let (_, handoff) = queue(&client, &table, "x").await;
    assert!(
        handoff.starts_with(&doomed_mark),
        "the dead process was first in line: {handoff:?}"
    );
    let started = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the next process got the lock after the fallback")
        .unwrap()
        .unwrap();
    eprintln!(
        "next holder after a dead designated process: {:?}",
        started.elapsed()
    );
    got.release().await.unwrap();
}

/// One lock table, one [`Process`] per provider: the shared liveness scenario
/// (`support/liveness.rs`).
struct Pg {
    url: String,
    table: String,
    client: tokio_postgres::Client,
}

impl Site for Pg {
    async fn provider(&self) -> LockProvider {
        Process::new(&self.url, &self.table, HOLDER_TTL)
            .await
            .provider
    }

    async fn queued(&self, name: &str) -> Vec<String> {
        queue(&self.client, &self.table, name).await.0
    }

    async fn plant_dead(&self, name: &str, marks: &[String]) {
        let entries: Vec<String> = marks
            .iter()
            .map(|m| format!(r#"{{"m": "{m}", "u": "2999-01-01T00:00:00Z"}}"#))
            .collect();
        let sql = format!(
            "UPDATE public.\"{}\" SET waiters = $1::text::jsonb WHERE name = $2",
            self.table
        );
        self.client
            .execute(&sql, &[&format!("[{}]", entries.join(", ")), &name])
            .await
            .unwrap();
    }

    fn describe(&self) -> String {
        format!("table {}", self.table)
    }
}

/// Waiters that gave up or died ahead of a live one (the shared scenario), on a fresh table.
async fn live_waiter_behind_on_postgres(ahead: Ahead, count: usize) {
    let Some(url) = postgres::url() else { return };
    let table = postgres::unique_table("behind");
    let client = admin(&url).await;
    let site = Pg { url, table, client };
    live_waiter_behind(&site, "x", ahead, count).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_timed_out_waiters_ahead_do_not_stall_a_live_one() {
    live_waiter_behind_on_postgres(Ahead::TimedOut, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_dropped_waiters_ahead_do_not_stall_a_live_one() {
    live_waiter_behind_on_postgres(Ahead::Dropped, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_timed_out_waiters_ahead_do_not_stall_a_live_one() {
    live_waiter_behind_on_postgres(Ahead::TimedOut, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_dead_processes_ahead_do_not_stall_a_live_waiter() {
    live_waiter_behind_on_postgres(Ahead::Dead, 20).await;
}
