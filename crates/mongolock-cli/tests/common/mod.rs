//! Helpers shared by the end-to-end tests: a test server (or the deployment in `MONGODB_URI`)
//! per test, the real binary, polling.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use mongo_testserver::TestServer;
use serde_json::Value;
use tokio::process::{Child, Command};

pub const BIN: &str = env!("CARGO_BIN_EXE_mongolock");
pub const LONG: Duration = Duration::from_secs(60);

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

    /// `mongolock --uri .. --db .. ARGS`, in its own process group (never the terminal's
    /// foreground), with `D` = the test directory in its environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
        self.cmd_with_uri(&self.uri, args)
    }

    /// [`Env::cmd`] connecting with the driver's application name `app`, which fail points can
    /// single out.
    pub fn cmd_as(&self, app: &str, args: &[&str]) -> Command {
        self.cmd_with_uri(&with_app_name(&self.uri, app), args)
    }

    fn cmd_with_uri(&self, uri: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--uri")
            .arg(uri)
            .arg("--db")
            .arg(&self.db)
            .args(args)
            .env("D", &self.dir)
            .env_remove("MONGODB_URI")
            .env_remove("MONGOLOCK_DB")
            .env_remove("MONGOLOCK_COLLECTION")
            .env_remove("MONGOLOCK_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        cmd
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.cmd(args).spawn().expect("spawn mongolock")
    }

    pub async fn run(&self, args: &[&str]) -> Output {
        let child = self.spawn(args);
        finish(child, LONG).await
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
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

pub async fn inspect_json(env: &Env, name: &str) -> Value {
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
