//! Leader election on MongoDB with candidates in separate OS processes (a real deployment when
//! `MONGODB_URI` is set, else the embedded mongo-testserver; see `support::mongo`). The
//! election cases every backend runs are in the contract suite (`contract.rs`).

use crate::support::mongo;

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use mongo::{test_database, unique, TestDb};
use mongolock::testing::unique_name;
use mongolock::{LockBackend, LockProvider, MongoBackend};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// A provider on collection `coll` of database `db`, through a new client (created in the
/// calling runtime).
async fn mongo_provider(uri: &str, db: &str, coll: &str) -> LockProvider {
    let client = mongo::client(uri, None).await;
    let backend = MongoBackend::builder(&client.database(db))
        .collection(coll)
        .build()
        .expect("valid backend options");
    mongolock::testing::provider(&(Arc::new(backend) as Arc<dyn LockBackend>))
}

// ---------------------------------------------------------------------------------------------
// Candidates in separate OS processes.
//
// Same mechanism as `processes.rs`: the helper processes are this test binary itself.
// `election::child_entry` is an ordinary test that does nothing unless `MONGOLOCK_TEST_CHILD` is
// set; the parent runs the binary again with `election::child_entry --exact` and that variable.

const CHILD_ENV: &str = "MONGOLOCK_TEST_CHILD";
const ELECTED: &str = "ELECTED ";

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("child process needs {key}"))
}

/// Entry point of the helper processes; a no-op in a normal test run.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    assert_eq!(mode, "candidate", "unknown child mode");
    // `RUST_LOG=mongolock=debug` shows what the helpers do (on stderr).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(candidate());
}

/// Campaigns with the run loop and prints `ELECTED <term> <pid>` when its leader function
/// starts. Stops (resigning) when its stdin closes.
async fn candidate() {
    let provider = mongo_provider(
        &env("MONGOLOCK_URI"),
        &env("MONGOLOCK_DB"),
        &env("MONGOLOCK_COLL"),
    )
    .await;
    let expiry = Duration::from_millis(env("MONGOLOCK_EXPIRY_MS").parse().unwrap());
    let election = provider
        .election(env("MONGOLOCK_NAME"))
        .unwrap()
        .with_expiry(expiry)
        .unwrap();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while matches!(std::io::Read::read(&mut std::io::stdin(), &mut buf), Ok(n) if n > 0) {}
        let _ = closed_tx.send(());
    });
    election
        .run_until(
            |leader| async move {
                println!("{ELECTED}{} {}", leader.term(), std::process::id());
                std::future::pending::<()>().await
            },
            async {
                let _ = closed_rx.await;
            },
        )
        .await
        .unwrap();
}

/// `(candidate index, term, pid)` from an `ELECTED` line.
type Elected = (usize, u64, u32);

fn spawn_candidate(
    index: usize,
    t: &TestDb,
    coll: &str,
    role: &str,
    expiry: Duration,
    elected: mpsc::UnboundedSender<Elected>,
) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "election::child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "candidate")
        .env("MONGOLOCK_URI", &t.uri)
        .env("MONGOLOCK_DB", t.db.name())
        .env("MONGOLOCK_COLL", coll)
        .env("MONGOLOCK_NAME", role)
        .env("MONGOLOCK_EXPIRY_MS", expiry.as_millis().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn helper process");
    let stdout = child.stdout.take().unwrap();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            // libtest prints "test election::child_entry ... " without a newline first.
            if let Some((_, rest)) = line.split_once(ELECTED) {
                let mut words = rest.split_whitespace();
                let term = words.next().unwrap().parse().unwrap();
                let pid = words.next().unwrap().parse().unwrap();
                let _ = elected.send((index, term, pid));
            }
        }
    });
    child
}

async fn next_elected(rx: &mut mpsc::UnboundedReceiver<Elected>, within: Duration) -> Elected {
    tokio::time::timeout(within, rx.recv())
        .await
        .expect("a candidate process was elected in time")
        .expect("the output readers are alive")
}

/// Three candidate processes; SIGKILL the leader → exactly one new leader, only after the killed
/// leader's lease expired (by server time), with a larger term. Twice; then the last one stops
/// cleanly and resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn candidate_processes_leader_killed() {
    const EXPIRY: Duration = Duration::from_secs(2);
    let t = test_database().await;
    let coll = unique("locks");
    let role = unique_name("election-processes");
    let observer = mongo_provider(&t.uri, t.db.name(), &coll)
        .await
        .election(role.clone())
        .unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut children: Vec<Child> = (0..3)
        .map(|i| spawn_candidate(i, &t, &coll, &role, EXPIRY, tx.clone()))
        .collect();
    drop(tx);
    let pids: Vec<u32> = children.iter().map(|c| c.id().unwrap()).collect();

    // Generous: each child is a test binary that starts a runtime and connects first.
    let (mut leader, mut term, pid) = next_elected(&mut rx, Duration::from_secs(60)).await;
    assert_eq!(pid, pids[leader]);
    let mut killed = HashSet::new();
    for round in 0..2 {
        children[leader].kill().await.unwrap(); // SIGKILL on Unix: no release, no extension
        killed.insert(leader);
        let info = observer.leader().await.unwrap();
        let info = info.expect("the killed leader's lease outlives it");
        assert_eq!(info.term, term);
        assert_eq!(info.holder.as_ref().map(|h| h.pid), Some(pids[leader]));
        let last_expiry = info.expires_at.expect("expiry");

        let (next, next_term, next_pid) =
            next_elected(&mut rx, EXPIRY + Duration::from_secs(30)).await;
        assert!(
            !killed.contains(&next),
            "round {round}: a killed candidate was elected"
        );
        assert_eq!(next_pid, pids[next]);
        assert!(next_term > term, "round {round}: terms must increase");
        let now = observer.leader().await.unwrap().expect("the new leader");
        assert_eq!(now.term, next_term);
        assert!(
            now.since.expect("since") >= last_expiry,
            "round {round}: elected at {:?}, before the killed leader's lease expired at \
             {last_expiry:?}",
            now.since
        );

        // Exactly one new leader: nobody else is elected while it leads.
        let extra = tokio::time::timeout(EXPIRY + EXPIRY / 2, rx.recv()).await;
        assert!(
            !matches!(extra, Ok(Some(_))),
            "round {round}: a second leader was elected: {extra:?}"
        );
        (leader, term) = (next, next_term);
    }

    // The last candidate stops cleanly when its stdin closes: it resigns and exits with success.
    let last = &mut children[leader];
    drop(last.stdin.take());
    let status = tokio::time::timeout(Duration::from_secs(30), last.wait())
        .await
        .expect("the last candidate stopped")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        observer.leader().await.unwrap().is_none(),
        "stopping resigns"
    );
}
