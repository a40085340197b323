//! Helpers shared by the end-to-end tests: a test server (or the deployment in `MONGODB_URI`)
//! per test, the real binary, polling, and the scenarios that the MongoDB tests (`cli.rs`) and
//! the PostgreSQL tests (`postgres.rs`) both run, on any [`Cli`] environment.
#![allow(dead_code)] // each test binary uses a different subset
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

pub mod pty;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongo_testserver::TestServer;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

pub mod operator;

pub const BIN: &str = env!("CARGO_BIN_EXE_mongolock");
pub const LONG: Duration = Duration::from_secs(60);

/// How a test runs the binary against its locks: [`Env`] (MongoDB), `PgEnv` in `postgres.rs`.
pub trait Cli {
    /// `mongolock` with the options that point it at this test's locks, then `args`; see
    /// [`command`].
    fn cmd(&self, args: &[&str]) -> Command;

    /// The test's scratch directory (`$D` for the commands).
    fn dir(&self) -> &Path;

    fn spawn(&self, args: &[&str]) -> Child {
        self.cmd(args).spawn().expect("spawn mongolock")
    }

    fn run(&self, args: &[&str]) -> impl Future<Output = Output> {
        let child = self.spawn(args);
        finish(child, LONG)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir().join(name)
    }
}

/// `mongolock --uri URI LOCATION.. ARGS`, in its own process group (never the terminal's
/// foreground), with `D` = `dir` in its environment and none of the user's `MONGO*`
/// variables.
pub fn command(uri: &str, location: &[&str], dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--uri")
        .arg(uri)
        .args(location)
        .args(args)
        .env("D", dir)
        .env_remove("MONGODB_URI")
        .env_remove("MONGOLOCK_URI")
        .env_remove("MONGOLOCK_DB")
        .env_remove("MONGOLOCK_COLLECTION")
        .env_remove("MONGOLOCK_LOG")
        .env_remove("MONGOLOCK_TTL")
        .env_remove("MONGOLOCK_WAIT")
        .env_remove("MONGOLOCK_GRACE")
        .env_remove("MONGOLOCK_QUIET")
        .env_remove("MONGOLOCK_MIN_HOLD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    cmd
}

/// Where the locks live for one test.
pub struct Env {
    pub server: Option<TestServer>,
    pub uri: String,
    pub db: String,
    pub dir: PathBuf,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl Env {
    pub async fn new(test: &str) -> Env {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let unique = format!("{}_{}_{n}", std::process::id(), test);
        let (server, uri) = match std::env::var("MONGODB_URI") {
            Ok(uri) if !uri.is_empty() => (None, uri),
            _ => {
                let server = TestServer::start().await.expect("start the test server");
                let uri = server.uri();
                (Some(server), uri)
            }
        };
        let dir = std::env::temp_dir().join(format!("mongolock-cli-{unique}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test directory");
        Env {
            server,
            uri,
            db: format!("cli_{}", unique.chars().take(40).collect::<String>()),
            dir,
        }
    }

    /// [`Cli::cmd`] connecting with the driver's application name `app`, which fail points can
    /// single out.
    pub fn cmd_as(&self, app: &str, args: &[&str]) -> Command {
        self.cmd_with_uri(&with_app_name(&self.uri, app), args)
    }

    fn cmd_with_uri(&self, uri: &str, args: &[&str]) -> Command {
        command(uri, &["--db", &self.db], &self.dir, args)
    }
}

impl Cli for Env {
    /// `mongolock --uri .. --db .. ARGS`.
    fn cmd(&self, args: &[&str]) -> Command {
        self.cmd_with_uri(&self.uri, args)
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub async fn finish(child: Child, timeout: Duration) -> Output {
    tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .expect("mongolock did not finish in time")
        .expect("wait for mongolock")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

pub async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

pub fn read_token(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .expect("token file")
        .trim()
        .parse()
        .expect("a numeric fencing token")
}

pub fn send_signal(child: &Child, signo: i32) {
    let pid = child.id().expect("the process is running") as i32;
    // SAFETY: kill has no memory-safety preconditions; the child has not been reaped.
    unsafe {
        libc::kill(pid, signo);
    }
}

/// Kills the process group led by the pid written in `pidfile` (a command that outlived a
/// killed mongolock).
pub fn kill_group_from_pidfile(pidfile: &Path) {
    if let Ok(pid) = std::fs::read_to_string(pidfile) {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            // SAFETY: as above; at worst the group no longer exists.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
    }
}

pub async fn inspect_json(env: &impl Cli, name: &str) -> Value {
    let out = env.run(&["inspect", name, "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    serde_json::from_slice(&out.stdout).expect("inspect --json prints JSON")
}

/// A command that holds the lock until `$D/<stop>` exists, after writing its token to
/// `$D/<started>`.
pub fn hold_until(started: &str, stop: &str) -> String {
    format!(
        "echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/{started}.tmp\" && mv \"$D/{started}.tmp\" \
         \"$D/{started}\"; while [ -d \"$D\" ] && [ ! -f \"$D/{stop}\" ]; do sleep 0.05; done"
    )
}

/// `uri` with `appName=app` added to its options.
pub fn with_app_name(uri: &str, app: &str) -> String {
    if uri.contains('?') {
        format!("{uri}&appName={app}")
    } else if uri
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'))
    {
        format!("{uri}?appName={app}")
    } else {
        format!("{uri}/?appName={app}")
    }
}

/// `processes` processes run `exec` on the lock `name` at once; inside the lock each claims a
/// directory that must not exist and records the token: nobody overlaps, every command runs,
/// and the tokens strictly grow in holding order.
pub async fn exec_processes_never_overlap(env: &impl Cli, processes: usize, name: &str) {
    // Inside the lock: claim a directory that must not exist, record the token, hold briefly.
    let script = "mkdir \"$D/held\" || { echo OVERLAP; exit 99; }; \
                  echo \"$MONGOLOCK_NAME $MONGOLOCK_FENCING_TOKEN\" >> \"$D/tokens\"; \
                  sleep 0.2; rmdir \"$D/held\"";
    let children: Vec<Child> = (0..processes)
        .map(|_| env.spawn(&["exec", "--ttl", "10s", name, "--", "sh", "-c", script]))
        .collect();
    for child in children {
        let out = finish(child, LONG).await;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(!text(&out.stdout).contains("OVERLAP"), "{}", describe(&out));
    }
    let lines = read_lines(&env.path("tokens"));
    assert_eq!(lines.len(), processes, "{lines:?}");
    let tokens: Vec<u64> = lines
        .iter()
        .map(|l| {
            let (lock, token) = l.split_once(' ').expect("name and token");
            assert_eq!(lock, name);
            token.parse().expect("numeric token")
        })
        .collect();
    // Lines were appended inside the critical section, so the file order is the holding order.
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// Electors `one` and `two` for the role `scheduler` (TTL 3 s), each running `script` with its
/// id as `$1`.
pub fn spawn_electors(env: &impl Cli, script: &str) -> Vec<(String, Option<Child>)> {
    ["one", "two"]
        .iter()
        .map(|id| {
            let child = env.spawn(&[
                "elect",
                "--ttl",
                "3s",
                "scheduler",
                "--",
                "sh",
                "-c",
                script,
                "sh",
                id,
            ]);
            ((*id).to_owned(), Some(child))
        })
        .collect()
}

/// Lets the command of elector `id` finish (it waits for `$D/stop-<id>`) and returns its
/// elector's output, which must have exited 0.
pub async fn stop_elector(
    env: &impl Cli,
    electors: &mut [(String, Option<Child>)],
    id: &str,
) -> Output {
    std::fs::write(env.path(&format!("stop-{id}")), "").expect("stop file");
    let child = electors
        .iter_mut()
        .find(|(i, _)| i == id)
        .and_then(|(_, c)| c.take())
        .expect("the leader's elector is running");
    let out = finish(child, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    out
}

/// `mongolock --uri URI list` fails at once with exit status 1 and one clean line on stderr
/// containing `expect` (no password, no panic, nothing on stdout).
pub async fn assert_clean_failure(uri: &str, expect: &str) {
    let started = Instant::now();
    let child = Command::new(BIN)
        .args(["--uri", uri, "list"])
        .env_remove("MONGODB_URI")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let out = finish(child, Duration::from_secs(30)).await;
    assert_eq!(out.status.code(), Some(1), "{uri}: {}", describe(&out));
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{uri}: one line expected: {stderr}");
    assert!(lines[0].starts_with("mongolock: "), "{stderr}");
    assert!(
        lines[0].contains(expect),
        "{uri}: expected {expect:?} in {stderr}"
    );
    assert!(!stderr.contains("secretpw"), "password leaked: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// The refresh blocks in watch's plain-text output (each starts with its header line).
pub fn blocks(output: &str) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    for line in output.lines() {
        if line.starts_with("mongolock watch: ") {
            blocks.push(String::new());
        }
        if let Some(block) = blocks.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
}

/// The table row of lock `name` in `block`.
pub fn row<'a>(block: &'a str, name: &str) -> Option<&'a str> {
    block
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
}

/// `mongolock watch` (plain text, not a terminal) shows lock `name` being acquired by an `exec`
/// it did not know of yet, then released.
pub async fn watch_shows_an_acquisition_and_a_release_of(env: &impl Cli, name: &str) {
    // A long interval: the acquisition of a new name shows at the latest at the next interval,
    // its release through the change notification (or the interval where there is none).
    let mut watch = env.spawn(&["watch", "--interval", "1s"]);
    let mut stdout = watch.stdout.take().expect("piped stdout");
    let seen = Arc::new(Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            loop {
                match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen
                        .lock()
                        .expect("buffer")
                        .push_str(&String::from_utf8_lossy(&buf[..n])),
                }
            }
        })
    };
    let shown = || seen.lock().expect("buffer").clone();
    wait_for("the first refresh", LONG, || !blocks(&shown()).is_empty()).await;

    let holder = env.spawn(&["exec", name, "--", "sh", "-c", &hold_until("a", "stop")]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let token = read_token(&env.path("a"));
    let deadline = Instant::now() + LONG;
    let held_block = loop {
        let all = blocks(&shown());
        if let Some(i) = all.iter().position(|b| {
            row(b, name).is_some_and(|r| r.contains(&token.to_string()) && r.contains(" in "))
        }) {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "watch never showed the acquisition:\n{}",
            shown()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let deadline = Instant::now() + LONG;
    while !blocks(&shown())
        .iter()
        .skip(held_block + 1)
        .any(|b| row(b, name).is_some_and(|r| r.ends_with("released")))
    {
        assert!(
            Instant::now() < deadline,
            "watch never showed the release:\n{}",
            shown()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !shown().contains('\x1b'),
        "no terminal codes outside a terminal"
    );

    watch.start_kill().expect("stop watch");
    let _ = watch.wait().await;
    let _ = reader.await;
}

/// `n + 1` processes run `exec --limit n` on the semaphore `name` at once. Inside its slot each
/// command adds a file to `$D/run`, records how many files it sees there, and stays until it
/// has seen `n` (or another command has: the last one in never will), then removes its file.
/// Asserts: every command ran and exited 0, nobody ever saw more than `n` at once, `n` did run
/// at the same time, and every slot's fencing token is distinct.
pub async fn exec_limit_runs_at_most_n_at_once(env: &impl Cli, n: usize, name: &str) {
    std::fs::create_dir_all(env.path("run")).expect("run directory");
    let script = format!(
        "me=\"$D/run/$MONGOLOCK_FENCING_TOKEN\"; touch \"$me\"; \
         echo \"$MONGOLOCK_FENCING_TOKEN\" >> \"$D/tokens\"; \
         while [ -d \"$D\" ]; do \
           c=$(ls \"$D/run\" | wc -l); echo $c >> \"$D/counts\"; \
           [ $c -ge {n} ] && touch \"$D/overlapped\"; \
           [ -f \"$D/overlapped\" ] && break; sleep 0.05; \
         done; sleep 0.2; rm \"$me\""
    );
    let limit = n.to_string();
    let children: Vec<Child> = (0..=n)
        .map(|_| {
            env.spawn(&[
                "exec", "--ttl", "10s", "--limit", &limit, name, "--", "sh", "-c", &script,
            ])
        })
        .collect();
    for child in children {
        let out = finish(child, LONG).await;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    }
    let counts: Vec<usize> = read_lines(&env.path("counts"))
        .iter()
        .map(|c| c.trim().parse().expect("a count"))
        .collect();
    let max = counts.iter().copied().max().unwrap_or(0);
    assert!(max <= n, "more than {n} commands ran at once: {counts:?}");
    assert_eq!(max, n, "{n} commands never ran at once: {counts:?}");
    assert!(env.path("overlapped").exists());
    let mut tokens: Vec<u64> = read_lines(&env.path("tokens"))
        .iter()
        .map(|t| t.parse().expect("a numeric token"))
        .collect();
    assert_eq!(tokens.len(), n + 1, "every command ran once: {tokens:?}");
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), n + 1, "distinct tokens: {tokens:?}");
}

/// A reader's command for [`readers_overlap_and_a_writer_never_overlaps_them`]: registers in
/// `$D/readers`, notes `$D/met` once two readers are in at once, fails if a writer is in, and
/// stays until `$D/stop-readers` exists.
const READER: &str = "me=\"$D/readers/$MONGOLOCK_FENCING_TOKEN\"; touch \"$me\"; \
    while [ -d \"$D\" ] && [ ! -f \"$D/stop-readers\" ]; do \
      [ -d \"$D/writer\" ] && { echo OVERLAP; rm \"$me\"; exit 99; }; \
      [ $(ls \"$D/readers\" | wc -l) -ge 2 ] && touch \"$D/met\"; sleep 0.05; \
    done; rm \"$me\"";

/// A writer's command: holds `$D/writer` briefly and fails if a reader is in.
const WRITER: &str = "mkdir \"$D/writer\" || { echo OVERLAP; exit 99; }; \
    [ -n \"$(ls \"$D/readers\")\" ] && { echo OVERLAP; rmdir \"$D/writer\"; exit 99; }; \
    echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/w\"; sleep 0.3; rmdir \"$D/writer\"";

/// Two `exec --shared` readers of `name` run at the same time; a writer (`exec NAME` with
/// `writer_flags`, e.g. none or `--write`) started while they hold waits until both have
/// finished and never overlaps them; a reader started afterwards runs after the writer. With
/// `--write`, a reader arriving while the writer waits is turned away (`--wait 0`: exit 75).
pub async fn readers_overlap_and_a_writer_never_overlaps_them(
    env: &impl Cli,
    name: &str,
    writer_flags: &[&str],
) {
    std::fs::create_dir_all(env.path("readers")).expect("readers directory");
    let reader = |extra: &[&str]| {
        let mut args = vec!["exec", "--ttl", "10s", "--shared"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[name, "--", "sh", "-c", READER]);
        env.spawn(&args)
    };
    let readers = vec![reader(&[]), reader(&[])];
    wait_for("two readers to run at once", LONG, || {
        env.path("met").exists()
    })
    .await;

    let mut args = vec!["exec", "--ttl", "10s"];
    args.extend_from_slice(writer_flags);
    args.extend_from_slice(&[name, "--", "sh", "-c", WRITER]);
    let writer = env.spawn(&args);

    if writer_flags.contains(&"--write") {
        // Once the writer waits (its intent lock is held), a new reader is turned away.
        let intent = format!("{name}\u{1f}writer-intent");
        let deadline = Instant::now() + LONG;
        loop {
            let out = env.run(&["list", "--json"]).await;
            assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
            let locks: Value = serde_json::from_slice(&out.stdout).expect("list --json");
            let waiting = locks.as_array().is_some_and(|all| {
                all.iter()
                    .any(|l| l["name"] == intent.as_str() && l["held"] == true)
            });
            if waiting {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the writer never waited: {locks}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let late = reader(&["--wait", "0"]);
        let out = finish(late, LONG).await;
        assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
        assert!(
            text(&out.stderr).contains("writer is waiting"),
            "{}",
            describe(&out)
        );
    } else {
        // Not a timing assertion: the readers hold until told to stop, so the writer must not
        // have started, however long this takes.
        tokio::time::sleep(Duration::from_millis(500)).await;
        // A semaphore on the readers' name is refused (78), naming the readers.
        let out = env
            .run(&["exec", "--wait", "0", "--limit", "2", name, "--", "true"])
            .await;
        assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
        assert!(
            text(&out.stderr).contains("--shared readers"),
            "{}",
            describe(&out)
        );
    }
    assert!(
        !env.path("w").exists(),
        "the writer ran while readers held the lock"
    );

    std::fs::write(env.path("stop-readers"), "").expect("stop file");
    for child in readers {
        let out = finish(child, LONG).await;
        assert_eq!(out.status.code(), Some(0), "reader: {}", describe(&out));
        assert!(!text(&out.stdout).contains("OVERLAP"), "{}", describe(&out));
    }
    let out = finish(writer, LONG).await;
    assert_eq!(out.status.code(), Some(0), "writer: {}", describe(&out));
    assert!(!text(&out.stdout).contains("OVERLAP"), "{}", describe(&out));
    let writer_token = read_token(&env.path("w"));

    // A reader after the writer: runs, with a larger token (readers and writers share one
    // sequence).
    let after = "echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/r.tmp\" && mv \"$D/r.tmp\" \"$D/r\"";
    let out = env
        .run(&[
            "exec", "--shared", "--wait", "30s", name, "--", "sh", "-c", after,
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(read_token(&env.path("r")) > writer_token);
}

/// Two `exec --limit 2` commands hold the semaphore `name`: `inspect` and `list` (text and
/// JSON) show both holders; a third `--limit 2 --wait 0` is busy (75); `--limit 3` and
/// `--shared` are refused with exit status 78 and a message naming both limits. The first
/// holder's `--json` events carry the mode, the limit, the token and the server's times.
pub async fn a_held_semaphore_shows_its_holders_and_refuses_other_limits(
    env: &impl Cli,
    name: &str,
) {
    let holder = |id: &str, json: bool| {
        let script = hold_until(id, "stop");
        let mut args = vec!["exec"];
        if json {
            args.push("--json");
        }
        args.extend_from_slice(&["--limit", "2", name, "--", "sh", "-c", &script]);
        env.spawn(&args)
    };
    let first = holder("a", true);
    wait_for("the first slot holder", LONG, || env.path("a").exists()).await;
    let second = holder("b", false);
    wait_for("the second slot holder", LONG, || env.path("b").exists()).await;
    let (a, b) = (read_token(&env.path("a")), read_token(&env.path("b")));
    assert!(b > a);

    let info = inspect_json(env, name).await;
    let tokens: Vec<u64> = info["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("no holders array: {info}"))
        .iter()
        .map(|h| h["fencing_token"].as_u64().expect("a token"))
        .collect();
    assert_eq!(tokens, [a, b], "{info}");
    for h in info["holders"].as_array().into_iter().flatten() {
        assert!(
            h["lease_id"].is_string() && h["expires_at"].is_string(),
            "{h}"
        );
        assert!(
            h["holder"]["app"]
                .as_str()
                .is_some_and(|app| app.contains("mongolock exec sh")),
            "{h}"
        );
    }
    let out = env.run(&["inspect", name]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("holders:") && shown.contains(&format!("token {a} ")),
        "{shown}"
    );
    assert!(shown.contains(&format!("token {b} ")), "{shown}");
    let out = env.run(&["list", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let all: Value = serde_json::from_slice(&out.stdout).expect("list --json");
    let row = all
        .as_array()
        .and_then(|a| a.iter().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("{name} not listed: {all}"));
    assert_eq!(row["holders"].as_array().map(Vec::len), Some(2), "{row}");
    let out = env.run(&["list"]).await;
    assert!(text(&out.stdout).contains("+1 more"), "{}", describe(&out));

    let out = env
        .run(&[
            "exec",
            "--wait",
            "0",
            "--limit",
            "2",
            name,
            "--",
            "sh",
            "-c",
            "touch \"$D/never\"",
        ])
        .await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("all 2 slots"),
        "{}",
        describe(&out)
    );

    let out = env
        .run(&[
            "exec",
            "--wait",
            "0",
            "--limit",
            "3",
            name,
            "--",
            "sh",
            "-c",
            "touch \"$D/never\"",
        ])
        .await;
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--limit 3") && stderr.contains("--limit 2"),
        "{}",
        describe(&out)
    );
    assert_eq!(stderr.lines().count(), 1, "{}", describe(&out));

    let out = env
        .run(&[
            "exec",
            "--shared",
            name,
            "--",
            "sh",
            "-c",
            "touch \"$D/never\"",
        ])
        .await;
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    assert!(text(&out.stderr).contains("--shared"), "{}", describe(&out));

    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(second, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = finish(first, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let events: Vec<Value> = text(&out.stderr)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let acquired = events
        .iter()
        .find(|e| e["event"] == "acquired")
        .unwrap_or_else(|| panic!("no acquired event: {}", describe(&out)));
    assert_eq!(acquired["mode"], "slot", "{acquired}");
    assert_eq!(acquired["limit"], 2, "{acquired}");
    assert_eq!(acquired["name"], name, "{acquired}");
    assert_eq!(acquired["fencing_token"], a, "{acquired}");
    assert!(acquired["acquired_at"].is_string() && acquired["expires_at"].is_string());
    assert!(
        events.iter().any(|e| e["event"] == "released"),
        "{}",
        describe(&out)
    );
    assert!(!env.path("never").exists());
}

/// The JSON events of a `--json` run's stderr (other lines, the command's, skipped).
pub fn json_events(out: &Output) -> Vec<Value> {
    text(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("event").is_some())
        .collect()
}

/// The server time of an RFC 3339 field of an event.
pub fn event_time(event: &Value, field: &str) -> std::time::SystemTime {
    let s = event[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {event}"));
    humantime::parse_rfc3339(s).unwrap_or_else(|e| panic!("{field} {s:?} in {event}: {e}"))
}

/// The cron scenario of `exec --min-hold` (issue #22): three replicas whose schedules fire
/// about 0.5 s apart run `exec --wait 0 --conflict-exit-code 0 --min-hold 5s NAME` with a job
/// of 0.2 s that records its token: exactly one runs the job (the others find the name held
/// and exit 0 without running it), although each run ends long before the next replica asks.
/// Then a fresh run that waits (its lease's TTL is 30 s) gets the name promptly once the hold
/// is over — at or after the first grant plus 5 s by the server's clock, long before the TTL —
/// and its `MONGOLOCK_MIN_HOLD` (the environment variable) holds the name after its job
/// failed with status 3, which `exec` returns.
pub async fn min_hold_runs_a_job_once_per_interval(env: &impl Cli, name: &str) {
    let job = "echo \"$MONGOLOCK_FENCING_TOKEN\" >> \"$D/runs\"; sleep 0.2";
    let mut replicas = Vec::new();
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        replicas.push(env.spawn(&[
            "exec",
            "--json",
            "--wait",
            "0",
            "--conflict-exit-code",
            "0",
            "--min-hold",
            "5s",
            "--ttl",
            "30s",
            name,
            "--",
            "sh",
            "-c",
            job,
        ]));
    }
    let mut acquired = Vec::new();
    let mut busy = 0;
    let mut outputs = Vec::new();
    for child in replicas {
        let out = finish(child, LONG).await;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let events = json_events(&out);
        for e in &events {
            match e["event"].as_str() {
                Some("acquired") => acquired.push(e.clone()),
                Some("busy") => busy += 1,
                _ => {}
            }
        }
        outputs.push(describe(&out));
    }
    let runs = read_lines(&env.path("runs"));
    assert_eq!(
        (runs.len(), acquired.len(), busy),
        (1, 1, 2),
        "three replicas 0.5 s apart with --min-hold 5s: exactly one must run the job; runs \
         (tokens) {runs:?}, acquisitions {acquired:?}; outputs:\n{}",
        outputs.join("\n---\n")
    );
    let first = event_time(&acquired[0], "acquired_at");
    let hold_ends = first + Duration::from_secs(5);

    // A fresh run waits (TTL 30 s, wait 15 s) and gets the name once the hold is over.
    let fresh = env
        .cmd(&[
            "exec",
            "--json",
            "--wait",
            "15s",
            "--ttl",
            "30s",
            name,
            "--",
            "sh",
            "-c",
            "echo \"$MONGOLOCK_FENCING_TOKEN\" >> \"$D/runs\"; exit 3",
        ])
        .env("MONGOLOCK_MIN_HOLD", "5s")
        .spawn()
        .expect("spawn mongolock");
    let out = finish(fresh, LONG).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "the job's status: {}",
        describe(&out)
    );
    let events = json_events(&out);
    let got = events
        .iter()
        .find(|e| e["event"] == "acquired")
        .unwrap_or_else(|| panic!("the fresh run never acquired {name}: {}", describe(&out)));
    let second = event_time(got, "acquired_at");
    assert!(
        second >= hold_ends,
        "the fresh run got {name} at {second:?}, before the hold of the first run ended \
         ({hold_ends:?}): {}",
        describe(&out)
    );
    assert!(
        second < first + Duration::from_secs(20),
        "the fresh run got {name} only at {second:?}, {:?} after the first grant ({first:?}); \
         the hold was 5 s: {}",
        second.duration_since(first).unwrap_or_default(),
        describe(&out)
    );
    let released = events
        .iter()
        .find(|e| e["event"] == "released")
        .unwrap_or_else(|| panic!("no released event: {}", describe(&out)));
    assert_eq!(released["min_hold"], "5s", "{released}");
    assert_eq!(read_lines(&env.path("runs")).len(), 2);

    // Its job failed (status 3), and the name is still held by its minimum hold.
    let out = env
        .run(&[
            "exec",
            "--json",
            "--wait",
            "0",
            "--conflict-exit-code",
            "0",
            name,
            "--",
            "true",
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        json_events(&out).iter().any(|e| e["event"] == "busy")
            || event_time(released, "held_until") <= std::time::SystemTime::now(),
        "{name} not held after a failed job with MONGOLOCK_MIN_HOLD=5s: {}",
        describe(&out)
    );
}

/// The command of [`exec_sets_never_deadlock_or_overlap`]: inside every name of
/// `$MONGOLOCK_NAMES` it claims a directory that must not exist and appends that name's token
/// (from `$MONGOLOCK_FENCING_TOKENS`, same order) to `$D/tokens-NAME`; it fails if
/// `MONGOLOCK_NAME` is set (several names have no single name).
const SET_HOLDER: &str = "set -- $MONGOLOCK_FENCING_TOKENS; \
    [ -z \"${MONGOLOCK_NAME+x}\" ] || { echo \"MONGOLOCK_NAME is set\"; exit 98; }; \
    for n in $MONGOLOCK_NAMES; do \
      mkdir \"$D/held-$n\" || { echo \"OVERLAP on $n\"; exit 99; }; \
      echo \"$1\" >> \"$D/tokens-$n\"; shift; \
    done; \
    echo \"$MONGOLOCK_NAMES\" >> \"$D/sets\"; sleep 0.1; \
    for n in $MONGOLOCK_NAMES; do rmdir \"$D/held-$n\"; done";

/// `processes` concurrent `exec` processes over the names a, b, c, their names written in
/// opposite orders (`a b`, `b a`, `c b a`, ...): every one finishes within a generous deadline
/// (no deadlock) with status 0, no two commands ever hold a name together, each name's tokens
/// strictly grow in holding order, and CMD sees the names sorted in `MONGOLOCK_NAMES`.
pub async fn exec_sets_never_deadlock_or_overlap(env: &impl Cli, processes: usize) {
    const ORDERS: [&[&str]; 4] = [&["a", "b"], &["b", "a"], &["c", "b", "a"], &["b", "a", "c"]];
    let mut children = Vec::new();
    for i in 0..processes {
        let names = ORDERS[i % ORDERS.len()];
        let mut args = vec!["exec", "--ttl", "10s"];
        args.extend_from_slice(names);
        args.extend_from_slice(&["--", "sh", "-c", SET_HOLDER]);
        children.push((names, env.spawn(&args)));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    let mut outputs = Vec::new();
    for (names, child) in children {
        let out = match tokio::time::timeout_at(deadline, child.wait_with_output()).await {
            Ok(out) => out.expect("wait for mongolock"),
            Err(_) => {
                let list = env.run(&["list"]).await;
                panic!(
                    "exec {names:?} did not finish within 240 s (deadlock?); finished so far: \
                     {}; sets run: {:?}; list:\n{}",
                    outputs.len(),
                    read_lines(&env.path("sets")),
                    describe(&list)
                );
            }
        };
        assert_eq!(
            out.status.code(),
            Some(0),
            "exec {names:?}: {}",
            describe(&out)
        );
        outputs.push(out);
    }
    let sets = read_lines(&env.path("sets"));
    assert_eq!(sets.len(), processes, "every command ran once: {sets:?}");
    for set in &sets {
        assert!(
            set == "a b" || set == "a b c",
            "MONGOLOCK_NAMES is {set:?}, not the names sorted"
        );
    }
    for name in ["a", "b", "c"] {
        let tokens: Vec<u64> = read_lines(&env.path(&format!("tokens-{name}")))
            .iter()
            .map(|t| t.parse().expect("a numeric token"))
            .collect();
        let expected = (0..processes)
            .filter(|i| ORDERS[i % ORDERS.len()].contains(&name))
            .count();
        assert_eq!(tokens.len(), expected, "{name}: {tokens:?}");
        // Appended inside the critical section: the file order is the holding order.
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{name}: tokens do not strictly grow in holding order: {tokens:?}"
        );
        let info = inspect_json(env, name).await;
        assert_eq!(info["held"], false, "{name} still held: {info}");
    }
}

/// `exec --wait 1s a b c` while another `exec` holds `b`: exit 75 (`--conflict-exit-code`),
/// CMD not run, the message names the busy lock, and `a` (taken before `b`) is free again,
/// not left held; `c` was never taken. Then, once `b` is free, the set runs.
pub async fn a_timed_out_exec_set_leaves_nothing_held(env: &impl Cli) {
    let holder = env.spawn(&["exec", "b", "--", "sh", "-c", &hold_until("b-held", "stop")]);
    let started = env.path("b-held");
    wait_for("the holder of b", LONG, || started.exists()).await;
    let out = env
        .run(&[
            "exec",
            "--wait",
            "1s",
            "a",
            "b",
            "c",
            "--",
            "sh",
            "-c",
            "touch \"$D/ran\"",
        ])
        .await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("lock \"b\" is held by") && stderr.contains("holding none of"),
        "{}",
        describe(&out)
    );
    assert!(!env.path("ran").exists(), "the command ran");
    let a = inspect_json(env, "a").await;
    assert_eq!(
        a["held"], false,
        "a is still held after the set gave up: {a}"
    );
    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = env
        .run(&[
            "exec",
            "--wait",
            "30s",
            "c",
            "a",
            "b",
            "--",
            "sh",
            "-c",
            "echo \"$MONGOLOCK_NAMES|$MONGOLOCK_FENCING_TOKENS\" > \"$D/env\"",
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let line = read_lines(&env.path("env")).join("\n");
    let (names, tokens) = line.split_once('|').expect("names|tokens");
    assert_eq!(names, "a b c");
    assert_eq!(tokens.split(' ').count(), 3, "{line}");
}

/// `exec a b` whose lease on `b` is force-released while CMD runs: CMD is stopped and the exit
/// status is 76, with a message naming `b`.
pub async fn exec_set_stops_the_command_when_any_lease_is_lost(env: &impl Cli) {
    let child = env.spawn(&[
        "exec",
        "--ttl",
        "3s",
        "--grace",
        "1s",
        "a",
        "b",
        "--",
        "sh",
        "-c",
        "touch \"$D/started\"; sleep 300",
    ]);
    let started = env.path("started");
    wait_for("the command under a and b", LONG, || started.exists()).await;
    let out = env.run(&["release", "--force", "b"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = finish(child, LONG).await;
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("lock \"b\""), "{}", describe(&out));
    let a = inspect_json(env, "a").await;
    assert_eq!(a["held"], false, "a is still held after the run: {a}");
}

/// The pids of the processes queued for `name`, as `inspect --json` lists them.
pub async fn queued_pids(env: &impl Cli, name: &str) -> Vec<u64> {
    let v = inspect_json(env, name).await;
    v["waiters"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|e| e["holder"]["pid"].as_u64())
                .collect()
        })
        .unwrap_or_default()
}

/// Waiters ahead of a live one that gave up (`--wait` ran out: exit 75) or were SIGKILLed
/// while queued do not hold it up: the holder (lease 60 s) stops, and the live waiter runs its
/// command soon after, not at the holder's reported expiry. Those that gave up withdrew from
/// the queue before exiting: `inspect` no longer lists them.
pub async fn waiters_that_left_do_not_stall_a_live_one(
    env: &impl Cli,
    gave_up: usize,
    killed: usize,
) {
    let name = "queue";
    let hold = hold_until("held", "stop");
    let holder = env.spawn(&["exec", "--ttl", "60s", name, "--", "sh", "-c", &hold]);
    wait_for("the holder to hold the lock", LONG, || {
        env.path("held").exists()
    })
    .await;
    let quitters: Vec<Child> = (0..gave_up)
        .map(|_| env.spawn(&["exec", "-q", "--wait", "20s", name, "--", "true"]))
        .collect();
    let doomed: Vec<Child> = (0..killed)
        .map(|_| env.spawn(&["exec", "-q", "--wait", "100s", name, "--", "true"]))
        .collect();
    let pids = |children: &[Child]| -> Vec<u64> {
        children
            .iter()
            .filter_map(|c| c.id())
            .map(u64::from)
            .collect()
    };
    let (quitter_pids, doomed_pids) = (pids(&quitters), pids(&doomed));
    let deadline = Instant::now() + Duration::from_secs(18);
    loop {
        let q = queued_pids(env, name).await;
        if quitter_pids
            .iter()
            .chain(&doomed_pids)
            .all(|p| q.contains(p))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all queued: {q:?}; gave up {quitter_pids:?}, killed {doomed_pids:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for c in &doomed {
        send_signal(c, libc::SIGKILL);
    }
    for c in doomed {
        let _ = finish(c, LONG).await;
    }
    for c in quitters {
        let out = finish(c, LONG).await;
        assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    }
    let live = env.spawn(&["exec", "--json", "--wait", "100s", name, "--", "true"]);
    let live_pid = u64::from(live.id().expect("the live waiter's pid"));
    let mut q = Vec::new();
    for _ in 0..150 {
        q = queued_pids(env, name).await;
        if q.contains(&live_pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        q.contains(&live_pid),
        "the live waiter {live_pid} did not queue: {q:?}"
    );
    assert!(
        !q.iter().any(|p| quitter_pids.contains(p)),
        "waiters that gave up are still listed: queued {q:?}, gave up {quitter_pids:?}"
    );
    std::fs::write(env.path("stop"), "").expect("stop the holder");
    let stopped = Instant::now();
    let out = finish(live, LONG).await;
    let waited = stopped.elapsed();
    let held = finish(holder, LONG).await;
    eprintln!(
        "{gave_up} gave up, {killed} killed: the live waiter ran {waited:?} after the holder was told to stop (waited_ms {:?})",
        json_events(&out)
            .iter()
            .find(|e| e["event"] == "acquired")
            .map(|e| e["waited_ms"].clone())
    );
    assert_eq!(
        held.status.code(),
        Some(0),
        "the holder: {}",
        describe(&held)
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "the live waiter: {}",
        describe(&out)
    );
    assert!(
        waited < Duration::from_secs(20),
        "the live waiter ran {waited:?} after the release (the holder's lease is 60 s): {}",
        describe(&out)
    );
}
