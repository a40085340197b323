//! End-to-end tests of the command's supervision: the command is dead before its lease can
//! expire, also when mongolock is SIGKILLed or SIGSTOPped or its renewals hang. (Job control,
//! suspend and the process tree: `lease_edges.rs`.)
//!
//! Each test prints what it measured (`cargo test -- --nocapture` shows it). Deadlines are
//! generous and conditions are polled. Against a real deployment (`MONGODB_URI`), the fail-point
//! test runs only with `MONGODB_FAILPOINTS=1`.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

mod common;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use common::*;
use mongodb::bson::{doc, Document};
use tokio::process::Child;

/// Whether `pid` names a live process (a zombie counts as dead: it no longer runs).
fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z'),
        Err(_) => !cfg!(target_os = "linux"),
    }
}

/// Polls every 2 ms until `pid` is dead; returns the time since `since`. Fails after `timeout`.
async fn wait_dead(what: &str, pid: i32, since: Instant, timeout: Duration) -> Duration {
    while alive(pid) {
        assert!(
            since.elapsed() < timeout,
            "{what} (pid {pid}) still alive {:?} after the event",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    since.elapsed()
}

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .expect("pid file")
        .trim()
        .parse()
        .expect("a pid")
}

fn signal_pid(pid: i32, signo: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, signo);
    }
}

/// A command that ignores SIGTERM, starts a child in its process group and writes both pids.
const STUBBORN_WITH_CHILD: &str = "trap '' TERM; sleep 120 & echo $! > \"$D/child.pid\"; \
                                   echo $$ > \"$D/cmd.tmp\"; mv \"$D/cmd.tmp\" \"$D/cmd.pid\"; wait";

/// A command that ignores SIGTERM and writes its pid (`exec` keeps the pid and the ignored
/// SIGTERM).
const STUBBORN: &str =
    "trap '' TERM; echo $$ > \"$D/cmd.tmp\"; mv \"$D/cmd.tmp\" \"$D/cmd.pid\"; exec sleep 120";

/// The parent of `pid`, from `/proc/PID/stat`.
fn parent(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(')').expect("stat format");
    rest.split_ascii_whitespace()
        .nth(1)
        .and_then(|ppid| ppid.parse().ok())
        .expect("a parent pid")
}

/// SIGKILLs a running `mongolock SUBCOMMAND` and checks that its command and the command's
/// child are gone soon after. With `whole_group`, mongolock's process group and the supervisor
/// are killed at once, which leaves only the parent-death signal (Linux) to stop the command.
async fn sigkill_of_mongolock_kills_the_command(subcommand: &str, whole_group: bool) {
    let test = format!(
        "{subcommand}_sigkill_{}",
        if whole_group { "group" } else { "one" }
    );
    let env = Env::new(&test).await;
    let mut holder = env.spawn(&[
        subcommand,
        "--ttl",
        "30s",
        &test,
        "--",
        "sh",
        "-c",
        STUBBORN_WITH_CHILD,
    ]);
    let mongolock = holder.id().expect("running") as i32;
    wait_for("the command to start", LONG, || {
        env.path("cmd.pid").exists()
    })
    .await;
    let cmd = read_pid(&env.path("cmd.pid"));
    let child = read_pid(&env.path("child.pid"));
    assert!(alive(cmd) && alive(child));

    let killed = Instant::now();
    if whole_group {
        // The supervisor is the command's parent (outside a terminal it leads the group it
        // shares with the command, so it is killed by pid).
        let supervisor = parent(cmd);
        signal_pid(-mongolock, libc::SIGKILL);
        signal_pid(supervisor, libc::SIGKILL);
    } else {
        signal_pid(mongolock, libc::SIGKILL);
    }
    let _ = holder.wait().await;
    let took = wait_dead("the command", cmd, killed, Duration::from_secs(10)).await;
    println!(
        "{test}: mongolock (pid {mongolock}) SIGKILLed{}; its command (pid {cmd}) was dead {took:?} later",
        if whole_group { " with its supervisor" } else { "" }
    );
    if whole_group {
        // The parent-death signal reaches only the command itself.
        signal_pid(child, libc::SIGKILL);
    } else {
        let took = wait_dead(
            "the command's child",
            child,
            killed,
            Duration::from_secs(10),
        )
        .await;
        println!("{test}: the command's child (pid {child}) was dead {took:?} after the kill");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_exec_kills_the_command_and_its_group() {
    sigkill_of_mongolock_kills_the_command("exec", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_elect_kills_the_command_and_its_group() {
    sigkill_of_mongolock_kills_the_command("elect", false).await;
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_exec_and_its_supervisor_kills_the_command_by_parent_death_signal() {
    sigkill_of_mongolock_kills_the_command("exec", true).await;
}

/// The lock document's `expiresAt` and the server's current time, read in one command.
async fn expiry_and_server_now(
    env: &Env,
    observer: &mongodb::Client,
    name: &str,
) -> (SystemTime, SystemTime) {
    use futures_util::TryStreamExt;
    let coll = observer
        .database(&env.db)
        .collection::<Document>("distributed.locks");
    let docs: Vec<Document> = coll
        .aggregate(vec![
            doc! { "$match": { "_id": name } },
            doc! { "$project": { "expiresAt": 1, "now": "$$NOW" } },
        ])
        .await
        .expect("aggregate")
        .try_collect()
        .await
        .expect("aggregate results");
    let d = docs.first().expect("the lock document");
    let time = |field: &str| d.get_datetime(field).expect("a date").to_system_time();
    (time("expiresAt"), time("now"))
}

/// How long before `expires` the instant `now` is (negative: after).
fn margin(expires: SystemTime, now: SystemTime) -> String {
    match expires.duration_since(now) {
        Ok(d) => format!("{d:?} before"),
        Err(e) => format!("{:?} AFTER", e.duration()),
    }
}

async fn observer(env: &Env) -> mongodb::Client {
    mongodb::Client::with_uri_str(with_app_name(&env.uri, "observer"))
        .await
        .expect("observer client")
}

#[tokio::test(flavor = "multi_thread")]
async fn blocked_renewals_stop_the_command_before_the_lease_expires_at_the_server() {
    let env = Env::new("blocked").await;
    if env.server.is_none() && std::env::var("MONGODB_FAILPOINTS").as_deref() != Ok("1") {
        eprintln!("skipped: failCommand needs test commands (set MONGODB_FAILPOINTS=1)");
        return;
    }
    let name = "blocked";
    let victim = env
        .cmd_as(
            "victim",
            &[
                "exec", "--ttl", "10s", "--grace", "3s", name, "--", "sh", "-c", STUBBORN,
            ],
        )
        .spawn()
        .expect("spawn the victim");
    wait_for("the victim's command to start", LONG, || {
        env.path("cmd.pid").exists()
    })
    .await;
    let cmd = read_pid(&env.path("cmd.pid"));
    let observer = observer(&env).await;
    let admin = observer.database("admin");
    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": "alwaysOn",
            "data": {
                "failCommands": ["findAndModify", "update"],
                "appName": "victim",
                "blockConnection": true,
                "blockTimeMS": 30_000,
            },
        })
        .await
        .expect("configureFailPoint");
    let blocked = Instant::now();

    // A second holder waits for the lock; its command records whether the first one was alive.
    let second_script = "if kill -0 \"$(cat \"$D/cmd.pid\")\" 2>/dev/null; then \
                         echo overlap > \"$D/overlap\"; fi; touch \"$D/second\"";
    let second = env
        .cmd_as(
            "second",
            &[
                "exec",
                "--ttl",
                "6s",
                "--wait",
                "60s",
                name,
                "--",
                "sh",
                "-c",
                second_script,
            ],
        )
        .spawn()
        .expect("spawn the second holder");

    let died = wait_dead(
        "the victim's command",
        cmd,
        blocked,
        Duration::from_secs(30),
    )
    .await;
    let (expires, now) = expiry_and_server_now(&env, &observer, name).await;
    let second_started_early = env.path("second").exists();
    admin
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await
        .expect("configureFailPoint off");
    println!(
        "blocked: renewals blocked; the command (pid {cmd}) was dead {died:?} later, {} the lease's \
         expiry at the server (expiresAt {expires:?}, server time read after the death {now:?})",
        margin(expires, now)
    );
    let out = finish(victim, LONG).await;
    assert!(
        expires > now,
        "the command outlived its lease: {}\n{}",
        margin(expires, now),
        describe(&out)
    );
    assert!(
        !second_started_early,
        "the second holder started before the lease expired"
    );
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("lost the lock \"blocked\""),
        "{}",
        describe(&out)
    );
    assert!(text(&out.stderr).contains("SIGTERM"), "{}", describe(&out));

    let out = finish(second, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(env.path("second").exists());
    assert!(
        !env.path("overlap").exists(),
        "the second holder's command overlapped the first"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_mongolock_cannot_keep_its_command_running() {
    let env = Env::new("stopped").await;
    let name = "stopped";
    let holder = env.spawn(&[
        "exec", "--ttl", "10s", "--grace", "3s", name, "--", "sh", "-c", STUBBORN,
    ]);
    let mongolock = holder.id().expect("running") as i32;
    wait_for("the command to start", LONG, || {
        env.path("cmd.pid").exists()
    })
    .await;
    let cmd = read_pid(&env.path("cmd.pid"));

    signal_pid(mongolock, libc::SIGSTOP);
    let stopped = Instant::now();
    let died = wait_dead("the command", cmd, stopped, Duration::from_secs(30)).await;
    let observer = observer(&env).await;
    let (expires, now) = expiry_and_server_now(&env, &observer, name).await;
    println!(
        "stopped: mongolock (pid {mongolock}) SIGSTOPped; its command (pid {cmd}) was dead \
         {died:?} later, {} the lease's expiry at the server",
        margin(expires, now)
    );
    signal_pid(mongolock, libc::SIGCONT);
    let out = finish(holder, LONG).await;
    assert!(
        expires > now,
        "the command outlived its lease: {}",
        margin(expires, now)
    );
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn grace_longer_than_a_third_of_the_ttl_is_a_usage_error() {
    for subcommand in ["exec", "elect"] {
        let out = tokio::process::Command::new(BIN)
            .args([
                subcommand, "--ttl", "3s", "--grace", "2s", "x", "--", "true",
            ])
            .output()
            .await
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("--grace 2s is longer than a third of --ttl 3s")
                && stderr.contains("--grace 1s or less"),
            "{}",
            describe(&out)
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grace_zero_kills_at_once_on_loss() {
    let env = Env::new("grace0").await;
    let script = "trap 'echo term > \"$D/term\"' TERM; echo $$ > \"$D/cmd.tmp\"; \
                  mv \"$D/cmd.tmp\" \"$D/cmd.pid\"; while [ -d \"$D\" ]; do sleep 0.05; done";
    let holder: Child = env.spawn(&[
        "exec", "--ttl", "6s", "--grace", "0", "zero", "--", "sh", "-c", script,
    ]);
    wait_for("the command to start", LONG, || {
        env.path("cmd.pid").exists()
    })
    .await;
    let cmd = read_pid(&env.path("cmd.pid"));
    let released = Instant::now();
    let out = env.run(&["release", "--force", "zero"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let died = wait_dead("the command", cmd, released, LONG).await;
    println!("grace0: force-released; the command (pid {cmd}) was dead {died:?} later");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("SIGKILL now"),
        "{}",
        describe(&out)
    );
    assert!(!env.path("term").exists(), "--grace 0 sends no SIGTERM");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_grace_fits_a_short_ttl() {
    let env = Env::new("defgrace").await;
    let out = env
        .run(&["exec", "--ttl", "1s", "short", "--", "true"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn the_command_inherits_no_control_channel() {
    let env = Env::new("fds").await;
    let script = "for f in /proc/$$/fd/*; do echo \"$f $(readlink \"$f\")\"; done > \"$D/fds\"";
    let out = env.run(&["exec", "fds", "--", "sh", "-c", script]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let fds = read_lines(&env.path("fds"));
    assert!(!fds.is_empty());
    assert!(
        fds.iter().all(|l| !l.contains("socket:")),
        "the command inherited a socket: {fds:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn renewals_keep_a_long_command_running() {
    let env = Env::new("renewed").await;
    // Runs 2.5 leases; without renewals moving the deadlines it would get SIGTERM after ~1.3 s.
    let script = "trap 'echo term > \"$D/term\"' TERM; sleep 5";
    let out = env
        .run(&["exec", "--ttl", "2s", "renewed", "--", "sh", "-c", script])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(!env.path("term").exists(), "{}", describe(&out));
}
