//! `mongolock demo`: a self-contained demonstration on the embedded test server.
//!
//! The parent process starts [`mongo_testserver::TestServer`] in-process and runs N worker
//! processes — this same binary, `mongolock demo-worker` (hidden) — that loop: acquire the lock,
//! hold it for `--work`, release, pause. Workers report events as JSON lines on stdout with
//! wall-clock timestamps (same host, so comparable across processes); the parent prints them as
//! a timeline relative to the demo's start. After a few acquisitions the parent kills the
//! current holder with SIGKILL (a real crash: no release, no cleanup) and the others take over
//! once its lease has expired by server time. A summary checks what the library promises:
//! fencing tokens strictly increase and no two holders overlap.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mongo_testserver::TestServer;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::cli::{DemoArgs, DemoWorkerArgs, GlobalArgs, DEFAULT_COLLECTION};
use crate::connect::{connect, connect_to};
use crate::duration::{display, human};
use crate::exit::{self, CliError};

/// The lock the workers contend for.
const LOCK_NAME: &str = "demo:nightly-report";
/// Database on the embedded server.
const DEMO_DB: &str = "mongolock_demo";
/// Acquisitions after the crash's takeover before the demo winds down.
const AFTER_TAKEOVER: usize = 3;

/// Seconds since the demo started, from a wall-clock time.
#[derive(Clone, Copy)]
struct Clock {
    start: SystemTime,
}

impl Clock {
    fn rel(self, at: SystemTime) -> Duration {
        at.duration_since(self.start).unwrap_or(Duration::ZERO)
    }

    fn now(self) -> Duration {
        self.rel(SystemTime::now())
    }
}

fn from_micros(us: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us)
}

fn micros(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Prints one line to stdout (ignoring a closed pipe: the demo goes on and exits normally).
fn say(line: &str) {
    let _ = crate::list::write_stdout(&format!("{line}\n"));
}

fn timeline(t: Duration, who: &str, what: &str) {
    let stamp = format!("+{:.3}s", t.as_secs_f64());
    say(&format!("  {stamp:>8}  {who:<9} {what}"));
}

/// One acquisition as seen by the parent.
struct Acquisition {
    worker: u32,
    token: u64,
    /// When the worker held the lock (after the grant), relative to the start.
    start: Duration,
    /// When the worker began releasing it.
    end: Option<Duration>,
    crashed: bool,
}

struct Worker {
    pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
}

enum Msg {
    Event(u32, Value),
    Closed,
}

enum Phase {
    /// Workers take turns; crash the holder of acquisition number `crash_at`.
    Contend { crash_at: usize },
    /// Kill `victim` at `at` (it has just acquired).
    CrashScheduled { victim: u32, at: Instant },
    /// Waiting for someone to take over from the killed worker.
    AwaitTakeover,
    /// Wind down after `until` acquisitions.
    Finish { until: usize },
    /// Workers were told to stop.
    Stopping,
}

struct Crash {
    victim: u32,
    pid: u32,
    token: u64,
    at: Duration,
    /// Server time at which the dead worker's lease expires (read right after the kill).
    lease_expires: Option<SystemTime>,
    takeover: Option<Takeover>,
}

struct Takeover {
    worker: u32,
    at: Duration,
    server_acquired: Option<SystemTime>,
}

/// `mongolock demo`.
pub async fn run(args: DemoArgs) -> Result<i32, CliError> {
    let clock = Clock {
        start: SystemTime::now(),
    };
    let server = TestServer::start()
        .await
        .map_err(|e| CliError::failure(format!("cannot start the embedded test server: {e}")))?;
    let uri = server.uri();
    say(&format!(
        "mongolock demo: {} worker processes contend for the lock {LOCK_NAME:?}",
        args.workers
    ));
    say(&format!(
        "  lease (--ttl) {}, each worker holds the lock for {} per turn; one worker is killed \
         with SIGKILL while it holds the lock",
        display(args.ttl),
        display(args.work)
    ));
    say(&format!(
        "  embedded mongo-testserver at {uri} (database {DEMO_DB}, collection {DEFAULT_COLLECTION})"
    ));
    say("");
    timeline(clock.now(), "demo", "embedded server started");

    // The parent's own connection, to read the lock's state at the crash.
    let conn = connect_to(&uri, DEMO_DB, DEFAULT_COLLECTION).await?;
    let observer = conn.provider(None, None)?;

    let exe = std::env::current_exe()
        .map_err(|e| CliError::failure(format!("cannot find the mongolock executable: {e}")))?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    let mut workers: BTreeMap<u32, Worker> = BTreeMap::new();
    for id in 1..=u32::from(args.workers) {
        let mut child = Command::new(&exe)
            .arg("--uri")
            .arg(&uri)
            .arg("--db")
            .arg(DEMO_DB)
            .arg("--collection")
            .arg(DEFAULT_COLLECTION)
            .arg("demo-worker")
            .arg("--id")
            .arg(id.to_string())
            .arg("--name")
            .arg(LOCK_NAME)
            .arg("--ttl")
            .arg(format!("{}ms", args.ttl.as_millis()))
            .arg("--work")
            .arg(format!("{}ms", args.work.as_millis()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CliError::failure(format!("cannot start demo worker {id}: {e}")))?;
        let pid = child.id().unwrap_or(0);
        let stdin = child.stdin.take();
        if let Some(stdout) = child.stdout.take() {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        let _ = tx.send(Msg::Event(id, v));
                    }
                }
                let _ = tx.send(Msg::Closed);
            });
        }
        workers.insert(id, Worker { pid, child, stdin });
    }
    drop(tx);

    let result = drive(&args, clock, &observer, &mut workers, &mut rx).await;

    // Whatever happened, stop and reap every worker.
    for w in workers.values_mut() {
        w.stdin = None;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for w in workers.values_mut() {
        match tokio::time::timeout_at(deadline, w.child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                let _ = w.child.start_kill();
                let _ = w.child.wait().await;
            }
        }
    }
    drop(server);
    let (acquisitions, crash) = result?;
    timeline(clock.now(), "demo", "all workers stopped");
    summary(&args, &acquisitions, crash.as_ref())
}

/// Runs the scenario until the workers were told to stop and have closed their output.
async fn drive(
    args: &DemoArgs,
    clock: Clock,
    observer: &mongolock::LockProvider,
    workers: &mut BTreeMap<u32, Worker>,
    rx: &mut mpsc::UnboundedReceiver<Msg>,
) -> Result<(Vec<Acquisition>, Option<Crash>), CliError> {
    let mut acquisitions: Vec<Acquisition> = Vec::new();
    let mut crash: Option<Crash> = None;
    let mut phase = Phase::Contend {
        crash_at: (usize::from(args.workers) + 1).max(4),
    };
    let mut open = workers.len();
    let stall_limit = (args.ttl * 5).max(Duration::from_secs(30));
    let crash_delay = (args.work / 4).min(Duration::from_millis(150));

    while open > 0 {
        let crash_at = match phase {
            Phase::CrashScheduled { at, .. } => Some(at),
            _ => None,
        };
        let msg = tokio::select! {
            m = tokio::time::timeout(stall_limit, rx.recv()) => match m {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(_) => {
                    return Err(CliError::failure(format!(
                        "the demo stalled: no worker reported anything for {}",
                        display(stall_limit)
                    )));
                }
            },
            () = sleep_until_opt(crash_at), if crash_at.is_some() => {
                let Phase::CrashScheduled { victim, .. } = phase else { continue };
                let still_holding = acquisitions
                    .last()
                    .is_some_and(|a| a.worker == victim && a.end.is_none());
                if !still_holding {
                    // It released before the kill (a very short --work): crash the next holder.
                    phase = Phase::Contend { crash_at: acquisitions.len() + 1 };
                    continue;
                }
                let Some(w) = workers.get_mut(&victim) else { continue };
                let at = clock.now();
                // start_kill sends SIGKILL.
                if let Err(e) = w.child.start_kill() {
                    return Err(CliError::failure(format!("cannot kill worker {victim}: {e}")));
                }
                let token = acquisitions.last().map_or(0, |a| a.token);
                if let Some(a) = acquisitions.last_mut() {
                    a.crashed = true;
                }
                let info = observer.inspect(LOCK_NAME).await.ok().flatten();
                let lease_expires = info
                    .as_ref()
                    .filter(|i| i.fencing_token == Some(token))
                    .and_then(|i| i.expires_at);
                let expiry_text = lease_expires.map_or_else(String::new, |e| {
                    format!(
                        "; its lease expires at +{:.3}s (server time) and nobody can take the \
                         lock before",
                        clock.rel(e).as_secs_f64()
                    )
                });
                timeline(
                    at,
                    "demo",
                    &format!(
                        "SIGKILL worker {victim} (pid {}) while it holds token {token}{expiry_text}",
                        w.pid
                    ),
                );
                crash = Some(Crash {
                    victim,
                    pid: w.pid,
                    token,
                    at,
                    lease_expires,
                    takeover: None,
                });
                phase = Phase::AwaitTakeover;
                continue;
            }
        };

        let (id, ev) = match msg {
            Msg::Closed => {
                open -= 1;
                continue;
            }
            Msg::Event(id, ev) => (id, ev),
        };
        let who = format!("worker {id}");
        let ts = ev["ts_us"]
            .as_u64()
            .map_or_else(|| clock.now(), |us| clock.rel(from_micros(us)));
        let token = ev["token"].as_u64().unwrap_or(0);
        match ev["ev"].as_str().unwrap_or("") {
            "ready" => {
                timeline(
                    ts,
                    &who,
                    &format!("started (pid {}), waiting for the lock", ev["pid"]),
                );
            }
            "acquired" => {
                let server_acquired = ev["acquired_at_us"].as_u64().map(from_micros);
                let prev = acquisitions.last();
                let mut note = String::new();
                if let Some(p) = prev {
                    if token <= p.token {
                        note.push_str(&format!(
                            "  !! token not above the previous holder's {}",
                            p.token
                        ));
                    }
                }
                let is_takeover = matches!(phase, Phase::AwaitTakeover);
                if is_takeover {
                    if let Some(c) = crash.as_mut() {
                        let after_crash = ts.saturating_sub(c.at);
                        let after_expiry = match (server_acquired, c.lease_expires) {
                            (Some(a), Some(e)) => match a.duration_since(e) {
                                Ok(d) => format!(", {} after its lease expired", human(d)),
                                Err(_) => "  !! BEFORE its lease expired".to_owned(),
                            },
                            _ => String::new(),
                        };
                        note.push_str(&format!(
                            "  <- took over from crashed worker {}: {} after the crash{after_expiry}",
                            c.victim,
                            human(after_crash)
                        ));
                        c.takeover = Some(Takeover {
                            worker: id,
                            at: ts,
                            server_acquired,
                        });
                    }
                } else if let Some(end) = prev.and_then(|p| p.end) {
                    note.push_str(&format!("  (handoff {})", human(ts.saturating_sub(end))));
                }
                timeline(ts, &who, &format!("acquired  token {token}{note}"));
                acquisitions.push(Acquisition {
                    worker: id,
                    token,
                    start: ts,
                    end: None,
                    crashed: false,
                });
                let n = acquisitions.len();
                phase = match phase {
                    Phase::Contend { crash_at } if n >= crash_at => Phase::CrashScheduled {
                        victim: id,
                        at: Instant::now() + crash_delay,
                    },
                    Phase::AwaitTakeover => Phase::Finish {
                        until: n + AFTER_TAKEOVER - 1,
                    },
                    Phase::Finish { until } if n >= until => {
                        timeline(clock.now(), "demo", "enough; telling the workers to stop");
                        for w in workers.values_mut() {
                            w.stdin = None;
                        }
                        Phase::Stopping
                    }
                    other => other,
                };
            }
            "released" => {
                if let Some(a) = acquisitions
                    .iter_mut()
                    .rev()
                    .find(|a| a.worker == id && a.token == token)
                {
                    a.end = Some(ts);
                    let held = ts.saturating_sub(a.start);
                    timeline(
                        ts,
                        &who,
                        &format!("released  token {token} after {}", human(held)),
                    );
                }
            }
            "lost" => timeline(ts, &who, &format!("LOST the lock (token {token})")),
            "error" => timeline(ts, &who, &format!("error: {}", ev["message"])),
            "stopped" => timeline(ts, &who, "stopped"),
            _ => {}
        }
    }
    Ok((acquisitions, crash))
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn median(sorted: &[Duration]) -> Duration {
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// Prints the summary; exit status 0 when every check passed.
fn summary(
    args: &DemoArgs,
    acquisitions: &[Acquisition],
    crash: Option<&Crash>,
) -> Result<i32, CliError> {
    let mut problems: Vec<String> = Vec::new();
    say("");
    say("Summary");

    let mut per_worker: BTreeMap<u32, usize> = BTreeMap::new();
    for a in acquisitions {
        *per_worker.entry(a.worker).or_default() += 1;
    }
    let per = per_worker
        .iter()
        .map(|(w, n)| format!("worker {w}: {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    say(&format!(
        "  acquisitions      {} ({per})",
        acquisitions.len()
    ));

    let mut handoffs: Vec<Duration> = acquisitions
        .windows(2)
        .filter(|w| !w[0].crashed)
        .filter_map(|w| w[0].end.map(|end| w[1].start.saturating_sub(end)))
        .collect();
    handoffs.sort();
    if let (Some(min), Some(max)) = (handoffs.first(), handoffs.last()) {
        say(&format!(
            "  handoffs          {} (release -> next holder): min {}, median {}, max {}",
            handoffs.len(),
            human(*min),
            human(median(&handoffs)),
            human(*max)
        ));
    }

    match crash {
        Some(c) => {
            say(&format!(
                "  crash             worker {} (pid {}) killed at +{:.3}s holding token {}",
                c.victim,
                c.pid,
                c.at.as_secs_f64(),
                c.token
            ));
            match &c.takeover {
                Some(t) => {
                    let expiry = match (t.server_acquired, c.lease_expires) {
                        (Some(a), Some(e)) => match a.duration_since(e) {
                            Ok(d) => format!("; {} after the dead lease expired", human(d)),
                            Err(_) => {
                                problems.push(
                                    "the lock was taken over before the crashed holder's lease \
                                     expired"
                                        .into(),
                                );
                                "; BEFORE the dead lease expired".into()
                            }
                        },
                        _ => String::new(),
                    };
                    say(&format!(
                        "  failover          worker {} took over {} after the crash (lease {}){expiry}",
                        t.worker,
                        human(t.at.saturating_sub(c.at)),
                        display(args.ttl)
                    ));
                }
                None => problems.push("nobody took over after the crash".into()),
            }
        }
        None => problems.push("the crash did not happen".into()),
    }

    let tokens: Vec<u64> = acquisitions.iter().map(|a| a.token).collect();
    let increasing = tokens.windows(2).all(|w| w[0] < w[1]);
    if !increasing {
        problems.push(format!(
            "fencing tokens did not strictly increase: {tokens:?}"
        ));
    }
    if let (Some(first), Some(last)) = (tokens.first(), tokens.last()) {
        say(&format!(
            "  fencing tokens    {first} -> {last}, {}",
            if increasing {
                "strictly increasing"
            } else {
                "NOT strictly increasing"
            }
        ));
    }

    // Mutual exclusion: each holder began after the previous one began releasing (both on this
    // host's clock); after the crash, the takeover was granted after the dead lease's expiry
    // (server clock; checked above).
    let overlaps = acquisitions
        .windows(2)
        .filter(|w| !w[0].crashed)
        .filter(|w| w[0].end.is_some_and(|end| w[1].start < end))
        .count();
    if overlaps > 0 {
        problems.push(format!("{overlaps} overlapping holders"));
    }
    say(&format!(
        "  mutual exclusion  {}",
        if overlaps == 0 {
            "no overlapping holders".to_owned()
        } else {
            format!("{overlaps} OVERLAPS")
        }
    ));

    if acquisitions.len() < 3 {
        problems.push("too few acquisitions".into());
    }
    if problems.is_empty() {
        say("");
        say("All checks passed. Try it on your own database:");
        say("  mongolock --uri mongodb://HOST:27017 exec my-job -- ./my-job.sh");
        Ok(exit::SUCCESS)
    } else {
        Err(CliError::failure(format!(
            "the demo found problems: {}",
            problems.join("; ")
        )))
    }
}

// ----------------------------------------------------------------------------------------------
// The worker process.

/// A random number from the standard library's randomly seeded hasher.
fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(micros(SystemTime::now()));
    h.finish()
}

fn emit(mut event: Value) -> Result<(), CliError> {
    event["ts_us"] = json!(micros(SystemTime::now()));
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    writeln!(out, "{event}")
        .and_then(|()| out.flush())
        .map_err(|e| CliError::failure(format!("demo worker: cannot report to the demo: {e}")))
}

/// `mongolock demo-worker` (hidden): loops acquire / work / release until stdin closes.
pub async fn worker(global: &GlobalArgs, args: DemoWorkerArgs) -> Result<i32, CliError> {
    let conn = connect(global).await?;
    let provider = conn.provider(
        Some(args.ttl),
        Some(format!("mongolock demo worker {}", args.id)),
    )?;
    let lock = provider
        .lock(args.name.clone())
        .map_err(|e| conn.error("demo worker", &e))?;

    // The demo closes our stdin to tell us to stop.
    let (stop_tx, mut stop) = watch::channel(false);
    // A plain thread: a blocking read of stdin must not hold up the runtime's shutdown.
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 256];
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        let _ = stop_tx.send(true);
    });

    emit(json!({ "ev": "ready", "pid": std::process::id() }))?;
    loop {
        if *stop.borrow() {
            break;
        }
        let guard = tokio::select! {
            g = lock.acquire() => g.map_err(|e| conn.error("demo worker: acquire", &e))?,
            _ = stop.changed() => break,
        };
        let token = guard.fencing_token();
        emit(json!({
            "ev": "acquired",
            "token": token,
            "acquired_at_us": micros(guard.acquired_at()),
            "expires_at_us": micros(guard.expires_at()),
        }))?;
        let lost_signal = guard.lost();
        let lost = tokio::select! {
            () = tokio::time::sleep(args.work) => false,
            () = lost_signal.wait() => true,
        };
        if lost {
            emit(json!({ "ev": "lost", "token": token }))?;
            drop(guard);
            continue;
        }
        emit(json!({ "ev": "released", "token": token }))?;
        if let Err(e) = guard.release().await {
            emit(json!({ "ev": "error", "message": conn.error("release", &e).message }))?;
        }
        // Give the others a chance before trying again.
        let pause = Duration::from_millis(100 + random_u64() % 200);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.changed() => break,
        }
    }
    emit(json!({ "ev": "stopped" }))?;
    Ok(exit::SUCCESS)
}
