//! Leader-election scenarios against MongoDB (a real deployment when `MONGODB_URI` is set, else
//! a `mongo_testserver::TestServer`), plus candidates in separate OS processes.
#![cfg(feature = "mongodb")]

mod election_scenarios;

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use election_scenarios::{provider_over, unique_role, Env, MakeProvider};
use mongo_testserver::TestServer;
use mongodb::options::ClientOptions;
use mongodb::Client;
use mongolock::election::Election;
use mongolock::{LockProvider, MongoBackend};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// Where the tests' MongoDB is, and the test server when there is no `MONGODB_URI`.
struct Deployment {
    uri: String,
    _server: Option<TestServer>,
}

async fn deployment() -> Deployment {
    match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => Deployment { uri, _server: None },
        _ => {
            let server = TestServer::start().await.expect("TestServer::start");
            Deployment {
                uri: server.uri(),
                _server: Some(server),
            }
        }
    }
}

async fn client(uri: &str) -> Client {
    let mut options = ClientOptions::parse(uri).await.expect("valid MongoDB URI");
    options.server_selection_timeout = Some(Duration::from_secs(10));
    Client::with_options(options).expect("client")
}

async fn mongo_provider(uri: &str, db: &str) -> LockProvider {
    let client = client(uri).await;
    let backend = MongoBackend::builder(&client.database(db))
        .build()
        .expect("valid backend options");
    provider_over(Arc::new(backend))
}

fn unique_db() -> String {
    format!("mongolock_election_{:08x}", rand::random::<u32>())
}

async fn setup() -> Env {
    let deployment = deployment().await;
    let uri = deployment.uri.clone();
    let db = unique_db();
    let make_provider: MakeProvider = Arc::new(move || {
        let (uri, db) = (uri.clone(), db.clone());
        // A client per provider, created in the runtime that will use it.
        Box::pin(async move { mongo_provider(&uri, &db).await })
    });
    Env {
        make_provider,
        count_tasks: false,
        keep_alive: Box::new(deployment),
    }
}

election_suite!(setup);

// ---------------------------------------------------------------------------------------------
// Candidates in separate OS processes.
//
// The parent test re-runs this test binary with `--exact election_child_candidate` and the
// environment variables below; in a normal test run (variables unset) that test returns at once.

const CHILD_URI: &str = "MONGOLOCK_ELECTION_CHILD_URI";
const CHILD_DB: &str = "MONGOLOCK_ELECTION_CHILD_DB";
const CHILD_ROLE: &str = "MONGOLOCK_ELECTION_CHILD_ROLE";
const CHILD_EXPIRY_MS: &str = "MONGOLOCK_ELECTION_CHILD_EXPIRY_MS";
const LINE_PREFIX: &str = "ELECTION-CHILD";

/// One candidate process: runs the election loop and prints `ELECTION-CHILD elected <term>
/// <pid>` when its leader function starts. Stops (resigning) when its stdin closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_child_candidate() {
    let Ok(uri) = std::env::var(CHILD_URI) else {
        return; // Not started by `candidate_processes_leader_killed`.
    };
    let db = std::env::var(CHILD_DB).unwrap();
    let role = std::env::var(CHILD_ROLE).unwrap();
    let expiry = Duration::from_millis(std::env::var(CHILD_EXPIRY_MS).unwrap().parse().unwrap());
    let election = Election::new(&mongo_provider(&uri, &db).await, role)
        .unwrap()
        .with_expiry(expiry)
        .unwrap();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while matches!(std::io::Read::read(&mut std::io::stdin(), &mut buf), Ok(n) if n > 0) {}
        let _ = closed_tx.send(());
    });
    let stdin_closed = async {
        let _ = closed_rx.await;
    };
    election
        .run_until(
            |leader| async move {
                println!(
                    "{LINE_PREFIX} elected {} {}",
                    leader.term(),
                    std::process::id()
                );
                std::future::pending::<()>().await
            },
            stdin_closed,
        )
        .await
        .unwrap();
    println!("{LINE_PREFIX} stopped {}", std::process::id());
}

struct ChildCandidate {
    child: Child,
    pid: u32,
}

/// `(candidate index, term, pid)` of an `elected` line.
type Elected = (usize, u64, u32);

fn spawn_candidate(
    index: usize,
    uri: &str,
    db: &str,
    role: &str,
    expiry: Duration,
    lines: mpsc::UnboundedSender<Elected>,
) -> ChildCandidate {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "election_child_candidate",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_URI, uri)
        .env(CHILD_DB, db)
        .env(CHILD_ROLE, role)
        .env(CHILD_EXPIRY_MS, expiry.as_millis().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let stdout = child.stdout.take().unwrap();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let [LINE_PREFIX, "elected", term, pid] = words[..] {
                let _ = lines.send((index, term.parse().unwrap(), pid.parse().unwrap()));
            }
        }
    });
    ChildCandidate { child, pid }
}

async fn next_elected(rx: &mut mpsc::UnboundedReceiver<Elected>, within: Duration) -> Elected {
    tokio::time::timeout(within, rx.recv())
        .await
        .expect("a candidate process was elected in time")
        .expect("the output readers are alive")
}

/// Three candidate processes; SIGKILL the leader → exactly one new leader after the lease
/// expires, with a larger term; twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn candidate_processes_leader_killed() {
    if std::env::var(CHILD_URI).is_ok() {
        return; // We are a child; only `election_child_candidate` runs here.
    }
    let deployment = deployment().await;
    let db = unique_db();
    let role = unique_role("election-processes");
    let expiry = Duration::from_secs(2);
    let observer =
        Election::new(&mongo_provider(&deployment.uri, &db).await, role.clone()).unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut children: Vec<ChildCandidate> = (0..3)
        .map(|i| spawn_candidate(i, &deployment.uri, &db, &role, expiry, tx.clone()))
        .collect();
    drop(tx);

    // Generous: the children are test binaries that start a runtime and connect first.
    let (mut leader, mut term, pid) = next_elected(&mut rx, Duration::from_secs(60)).await;
    assert_eq!(pid, children[leader].pid);
    let mut killed = HashSet::new();
    for round in 0..2 {
        let info = observer.leader().await.unwrap().expect("a leader");
        assert_eq!(info.term, term);
        assert_eq!(
            info.holder.as_ref().map(|h| h.pid),
            Some(children[leader].pid)
        );

        children[leader].child.start_kill().unwrap(); // SIGKILL on Unix
        children[leader].child.wait().await.unwrap();
        killed.insert(leader);

        let (next, next_term, next_pid) =
            next_elected(&mut rx, expiry + Duration::from_secs(30)).await;
        assert!(
            !killed.contains(&next),
            "round {round}: a killed candidate was elected"
        );
        assert_eq!(next_pid, children[next].pid);
        assert!(next_term > term, "round {round}: terms must increase");

        // Exactly one new leader: nobody else is elected while it leads.
        let extra = tokio::time::timeout(expiry + expiry / 2, rx.recv()).await;
        assert!(
            !matches!(extra, Ok(Some(_))),
            "round {round}: a second leader was elected: {extra:?}"
        );
        (leader, term) = (next, next_term);
    }
    let info = observer.leader().await.unwrap().expect("a leader");
    assert_eq!(info.term, term);

    // The last candidate stops cleanly when its stdin closes: it resigns and exits with success.
    let last = &mut children[leader];
    drop(last.child.stdin.take());
    let status = tokio::time::timeout(Duration::from_secs(30), last.child.wait())
        .await
        .expect("the last candidate stopped")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        observer.leader().await.unwrap().is_none(),
        "stopping resigns"
    );
}
