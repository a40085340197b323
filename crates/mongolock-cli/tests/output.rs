//! End-to-end tests of what `exec` and `elect` print for people: `--quiet`, the waiting status
//! line in a terminal, the report of an unreachable database while waiting, a loss reported
//! once, durations for people, the JSON events' version and busy holder, and the options that
//! come from environment variables.

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::pty::Pty;
use common::*;
use mongodb::bson::doc;
use serde_json::Value;
use tokio::io::AsyncReadExt;

/// Erases the terminal's current line (how the status line is redrawn and cleared).
const ERASE: &str = "\r\x1b[K";

/// A holder of `name` with the application name `holder-app`, holding until `$D/stop`.
async fn hold(env: &Env, name: &str) -> tokio::process::Child {
    hold_as(env, name, "held", "stop").await
}

/// [`hold`] with its own files: `$D/<started>` (its token) and `$D/<stop>`.
async fn hold_as(env: &Env, name: &str, started: &str, stop: &str) -> tokio::process::Child {
    let holder = env.spawn(&[
        "exec",
        "--app-name",
        "holder-app",
        name,
        "--",
        "sh",
        "-c",
        &hold_until(started, stop),
    ]);
    wait_for("the holder", LONG, || env.path(started).exists()).await;
    holder
}

async fn release(env: &Env, holder: tokio::process::Child) {
    release_as(env, holder, "stop").await;
}

async fn release_as(env: &Env, holder: tokio::process::Child, stop: &str) {
    std::fs::write(env.path(stop), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "holder: {}", describe(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn quiet_prints_nothing_for_a_busy_lock_or_a_normal_run() {
    let env = Env::new("quiet").await;
    let holder = hold(&env, "job").await;
    // The cron line of the README: a busy lock is nothing to do, and says nothing.
    let mut quiet = env.cmd(&[
        "exec",
        "-q",
        "--wait",
        "0",
        "--conflict-exit-code",
        "0",
        "job",
        "--",
        "true",
    ]);
    quiet.env("MONGOLOCK_LOG", "off");
    let out = finish(quiet.spawn().expect("spawn"), LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(
        text(&out.stderr),
        "",
        "-q printed on stderr: {}",
        describe(&out)
    );
    // The same through the environment, and with a wait that runs out.
    let mut quiet = env.cmd(&["exec", "--wait", "1s", "job", "--", "true"]);
    quiet.env("MONGOLOCK_QUIET", "1");
    let out = finish(quiet.spawn().expect("spawn"), LONG).await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert_eq!(
        text(&out.stderr),
        "",
        "MONGOLOCK_QUIET=1: {}",
        describe(&out)
    );
    // Without -q the busy lock is reported (what -q leaves out).
    let out = env.run(&["exec", "--wait", "0", "job", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("command not run"),
        "{}",
        describe(&out)
    );
    release(&env, holder).await;

    // A normal run, exec and elect.
    let out = env
        .run(&["-q", "exec", "job", "--", "sh", "-c", "echo ran"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(text(&out.stdout), "ran\n", "{}", describe(&out));
    assert_eq!(text(&out.stderr), "", "{}", describe(&out));
    let out = env.run(&["elect", "--quiet", "role", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(text(&out.stderr), "", "elect -q: {}", describe(&out));
    let out = env.run(&["elect", "role", "--", "true"]).await;
    assert!(
        text(&out.stderr).contains("elected leader"),
        "elect without -q: {}",
        describe(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn quiet_still_reports_errors() {
    // Nothing listens on port 1: the connection fails quickly.
    let child = command(
        "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=500",
        &[],
        &std::env::temp_dir(),
        &["exec", "-q", "job", "--", "true"],
    )
    .spawn()
    .expect("spawn");
    let out = finish(child, LONG).await;
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("mongolock: cannot reach MongoDB"),
        "{}",
        describe(&out)
    );
    // Usage errors too.
    let child = command(
        "mongodb://127.0.0.1:1",
        &[],
        &std::env::temp_dir(),
        &["exec", "-q", "--ttl", "soon", "job", "--", "true"],
    )
    .spawn()
    .expect("spawn");
    let out = finish(child, LONG).await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(text(&out.stderr).contains("soon"), "{}", describe(&out));
}

/// Lines of `stderr` that report the loss itself: mongolock's message, or a diagnostic
/// (`WARN lock lost ...`) next to it.
fn loss_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.starts_with("mongolock: lost") || l.contains("WARN") || l.contains("lock lost")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_lease_is_reported_once_also_with_quiet() {
    let env = Env::new("lostonce").await;
    for (run, quiet) in [("plain", false), ("quiet", true)] {
        let started = format!("held-{run}");
        let script = format!("echo $$ > \"$D/{started}\"; exec sleep 60");
        let mut args = vec!["exec", "--ttl", "3s", "--grace", "1s", "job"];
        if quiet {
            args.insert(1, "-q");
        }
        args.extend(["--", "sh", "-c", &script]);
        let holder = env.spawn(&args);
        wait_for("the holder", LONG, || env.path(&started).exists()).await;
        let out = env.run(&["release", "--force", "job"]).await;
        assert_eq!(out.status.code(), Some(0), "release: {}", describe(&out));
        let out = finish(holder, LONG).await;
        assert_eq!(out.status.code(), Some(76), "{run}: {}", describe(&out));
        let stderr = text(&out.stderr);
        let lines = loss_lines(&stderr);
        assert_eq!(
            lines.len(),
            1,
            "{run}: the loss must be reported once, by mongolock's own message: {lines:#?}\n{}",
            describe(&out)
        );
        assert!(
            lines[0].starts_with("mongolock: lost the lock \"job\""),
            "{run}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn durations_in_messages_are_rounded_for_people() {
    let env = Env::new("durations").await;
    // A third of 10s is 3.333...s.
    let out = env
        .run(&["exec", "--ttl", "10s", "--grace", "4s", "job", "--", "true"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("(3.3s)") && stderr.contains("--grace 3.3s or less"),
        "{stderr}"
    );
    assert!(!stderr.contains("333ms"), "{stderr}");
    // What the message suggests is accepted back.
    let out = env
        .run(&[
            "exec", "--ttl", "10s", "--grace", "3.3s", "job", "--", "true",
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    // The time waited, in the busy message.
    let holder = hold(&env, "job").await;
    let out = env
        .run(&["exec", "--wait", "1500ms", "job", "--", "true"])
        .await;
    release(&env, holder).await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("(--wait 1.5s)"), "{stderr}");
    assert!(!stderr.contains("1s500ms"), "{stderr}");
}

fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{stderr}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn json_events_have_a_schema_version_and_busy_names_the_holder() {
    let env = Env::new("jsonbusy").await;
    let holder = hold(&env, "job").await;
    let holder_pid = holder.id().expect("holder pid");
    let token = read_token(&env.path("held"));
    let out = env
        .run(&["exec", "--json", "--wait", "0", "job", "--", "true"])
        .await;
    release(&env, holder).await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let events = json_lines(&text(&out.stderr));
    assert!(!events.is_empty(), "{}", describe(&out));
    for event in &events {
        assert_eq!(event["schema_version"], 2, "{event}");
    }
    let busy = events
        .iter()
        .find(|e| e["event"] == "busy")
        .unwrap_or_else(|| panic!("no busy event: {}", describe(&out)));
    let holder = &busy["holder"];
    assert_eq!(holder["pid"], holder_pid, "{busy}");
    assert_eq!(holder["app"], "holder-app", "{busy}");
    assert!(
        holder["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{busy}"
    );
    assert_eq!(holder["fencing_token"], token, "{busy}");
    assert!(holder["lease_id"].as_str().is_some(), "{busy}");
    assert!(holder["expires_at"].as_str().is_some(), "{busy}");
    assert!(
        holder["expires_in_ms"].as_i64().is_some_and(|ms| ms > 0),
        "{busy}"
    );
    // The text form stays for version-1 consumers.
    assert!(
        busy["held_by"]
            .as_str()
            .is_some_and(|h| h.contains("holder-app")),
        "{busy}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn json_with_json_fd_is_a_usage_error() {
    let env = Env::new("jsonboth").await;
    let out = env
        .run(&["exec", "--json", "--json-fd", "1", "job", "--", "true"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--json-fd") && stderr.contains("cannot be used with"),
        "{stderr}"
    );
    assert!(!env.path("ran").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_in_an_environment_variable_names_the_variable() {
    let env = Env::new("envbad").await;
    let mut cmd = env.cmd(&["exec", "job", "--", "true"]);
    cmd.env("MONGOLOCK_TTL", "abc");
    let out = finish(cmd.spawn().expect("spawn"), LONG).await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("MONGOLOCK_TTL=abc: invalid duration \"abc\""),
        "{stderr}"
    );
    // The same value on the command line is reported as the option's.
    let out = env
        .run(&["exec", "--ttl", "abc", "job", "--", "true"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(
        !text(&out.stderr).contains("MONGOLOCK_TTL"),
        "{}",
        describe(&out)
    );
    // A check across options names the variable that set one of them.
    let mut cmd = env.cmd(&["elect", "--ttl", "6s", "role", "--", "true"]);
    cmd.env("MONGOLOCK_GRACE", "5s");
    let out = finish(cmd.spawn().expect("spawn"), LONG).await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("MONGOLOCK_GRACE=5s"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_environment_variable_counts_as_unset() {
    let env = Env::new("envempty").await;
    let mut cmd = env.cmd(&["exec", "job", "--", "sh", "-c", "echo ran"]);
    for var in [
        "MONGOLOCK_TTL",
        "MONGOLOCK_WAIT",
        "MONGOLOCK_GRACE",
        "MONGOLOCK_QUIET",
        "MONGOLOCK_LOG",
        "MONGOLOCK_DB",
        "MONGOLOCK_COLLECTION",
    ] {
        cmd.env(var, "");
    }
    let out = finish(cmd.spawn().expect("spawn"), LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(text(&out.stdout), "ran\n", "{}", describe(&out));
    // An empty MONGODB_URI is no URI: the default is used (whether or not a server listens
    // there), not "".
    let child = tokio::process::Command::new(BIN)
        .args(["--db", &env.db, "list"])
        .env("MONGODB_URI", "")
        .env_remove("MONGOLOCK_DB")
        .env_remove("MONGOLOCK_COLLECTION")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let out = finish(child, LONG).await;
    assert!(
        out.status.code() == Some(0) || text(&out.stderr).contains("mongodb://localhost:27017"),
        "{}",
        describe(&out)
    );
}

/// `mongolock` in a terminal: while it waits for a held lock one status line names the holder
/// and is redrawn in place; it is erased when the lock is acquired; `-q` shows none.
#[tokio::test(flavor = "multi_thread")]
async fn a_terminal_shows_one_status_line_while_waiting() {
    let env = Env::new("statusline").await;
    let holder = hold(&env, "job").await;
    let holder_pid = holder.id().expect("holder pid");
    let token = read_token(&env.path("held"));
    let script = format!(
        "m() {{ \"$MONGOLOCK\" --uri '{}' --db '{}' \"$@\"; }}; \
         m exec --wait 3s job -- true; echo \"[first $?]\"; \
         m exec -q --wait 3s --conflict-exit-code 0 job -- true; echo \"[second $?]\"; \
         m exec job -- echo RAN; echo \"[third $?]\"; \
         while [ ! -f \"$D/go\" ]; do sleep 0.05; done; \
         m elect job -- echo LED; echo \"[fourth $?]\"; sleep 1000",
        env.uri, env.db
    );
    let (pty, mut shell) = Pty::shell(&env.dir, &script);
    wait_for("the second exec to give up", LONG, || {
        pty.output().contains("[second 0]")
    })
    .await;
    // The third waits until the holder is gone: its line appears, then the holder stops.
    wait_for("the third exec's status line", LONG, || {
        pty.output()
            .split("[second 0]")
            .nth(1)
            .is_some_and(|third| third.contains("held by"))
    })
    .await;
    release(&env, holder).await;
    wait_for("the third exec", LONG, || {
        pty.output().contains("[third 0]")
    })
    .await;
    // elect campaigns while another holder has the role.
    let holder = hold_as(&env, "job", "held2", "stop2").await;
    let holder2_pid = holder.id().expect("holder pid");
    std::fs::write(env.path("go"), "").expect("go file");
    wait_for("elect's status line", LONG, || {
        pty.output()
            .split("[third 0]")
            .nth(1)
            .is_some_and(|fourth| fourth.contains("leader "))
    })
    .await;
    release_as(&env, holder, "stop2").await;
    wait_for("elect", LONG, || pty.output().contains("[fourth 0]")).await;
    let _ = shell.kill();
    let _ = shell.wait();
    let output = pty.output();
    println!("terminal output: {output:?}");
    let (first, rest) = output.split_once("[first 75]").expect("first exec: 75");
    let (second, rest) = rest.split_once("[second 0]").expect("second exec: 0");
    let (third, fourth) = rest.split_once("[third 0]").expect("third exec: 0");

    let line = format!("(pid {holder_pid}) app \"holder-app\" (token {token}) for ");
    assert!(
        first.contains("mongolock: waiting for the lock \"job\": held by ")
            && first.contains(&line),
        "the status line names the holder: {first:?}"
    );
    assert!(first.contains(", expires in "), "{first:?}");
    assert!(
        first.matches(ERASE).count() >= 2,
        "the line is redrawn in place: {first:?}"
    );
    // One line: no newline between the redraws, only the busy message ends a line.
    let before_busy = first
        .split("lock \"job\" is held by")
        .next()
        .unwrap_or_default();
    assert!(
        !before_busy.trim_start_matches(['\r', '\n']).contains('\n'),
        "the status line took more than one line: {before_busy:?}"
    );
    assert!(first.contains("command not run"), "{first:?}");

    assert!(
        !second.contains("mongolock") && !second.contains("held by"),
        "-q showed something: {second:?}"
    );

    let ran = third.find("RAN").expect("the third exec ran the command");
    let last_line = third.rfind("held by").expect("the third exec's line");
    let erased = third.rfind(ERASE).expect("the line is erased");
    assert!(
        last_line < erased && erased < ran,
        "the status line is erased before the command runs: {third:?}"
    );

    assert!(
        fourth.contains("mongolock: campaigning for leadership of \"job\": leader ")
            && fourth.contains(&format!("(pid {holder2_pid}) app \"holder-app\"")),
        "elect's status line names the leader (pid {holder2_pid}): {fourth:?}"
    );
    let led = fourth.find("LED").expect("elect ran the command");
    let erased = fourth.rfind(ERASE).expect("erased");
    assert!(
        fourth[..led].rfind(": leader ").is_some_and(|l| l < erased) && erased < led,
        "elect's status line is erased before the command runs: {fourth:?}"
    );
}

/// Without a terminal (stderr piped) nothing of the status line is written.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_terminal_no_status_line_is_written() {
    let env = Env::new("nostatusline").await;
    let holder = hold(&env, "job").await;
    let out = env
        .run(&["exec", "--wait", "3s", "job", "--", "true"])
        .await;
    release(&env, holder).await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(
        !stderr.contains('\r') && !stderr.contains('\x1b'),
        "{stderr:?}"
    );
    assert!(!stderr.contains("waiting for"), "{stderr:?}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "only the busy message: {stderr:?}"
    );
}

/// A waiter whose database stops answering (every command of its connection fails) says so
/// every 30 s, even with `-q`, and when it answers again; then it goes on waiting.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_reports_an_unreachable_database_periodically() {
    let env = Env::new("unreachable").await;
    if env.server.is_none() && std::env::var("MONGODB_FAILPOINTS").as_deref() != Ok("1") {
        eprintln!("skipped: failCommand needs test commands (set MONGODB_FAILPOINTS=1)");
        return;
    }
    let holder = hold(&env, "job").await;
    let mut waiter = env
        .cmd_as("cut", &["exec", "-q", "job", "--", "sh", "-c", "echo ran"])
        .spawn()
        .expect("spawn the waiter");
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut pipe = waiter.stderr.take().expect("stderr");
    let sink = stderr.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf).await {
            if n == 0 {
                break;
            }
            sink.lock()
                .expect("stderr")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    // Let it start waiting, then cut it off.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let observer = mongodb::Client::with_uri_str(with_app_name(&env.uri, "observer"))
        .await
        .expect("observer client");
    let admin = observer.database("admin");
    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": "alwaysOn",
            "data": {
                "failCommands": ["find", "findAndModify", "update", "insert", "delete",
                                 "aggregate", "getMore", "count", "listIndexes", "createIndexes"],
                "appName": "cut",
                "closeConnection": true,
            },
        })
        .await
        .expect("configureFailPoint");
    let seen = |what: &str| stderr.lock().expect("stderr").contains(what);
    wait_for("the unreachable report", Duration::from_secs(120), || {
        seen("the database has not answered for")
    })
    .await;
    admin
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await
        .expect("failpoint off");
    wait_for("the reachable report", Duration::from_secs(120), || {
        seen("the database answers again")
    })
    .await;
    release(&env, holder).await;
    let status = tokio::time::timeout(LONG, waiter.wait())
        .await
        .expect("the waiter finishes")
        .expect("wait");
    let mut stdout = String::new();
    if let Some(mut out) = waiter.stdout.take() {
        let _ = out.read_to_string(&mut stdout).await;
    }
    let stderr = stderr.lock().expect("stderr").clone();
    println!("waiter stderr:\n{stderr}");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "ran\n");
    let report = stderr
        .lines()
        .find(|l| l.contains("has not answered"))
        .expect("report");
    assert!(
        report.starts_with(
            "mongolock: still waiting for the lock \"job\": the database has not answered for "
        ) && report.contains("s (last error: "),
        "{report}"
    );
    // Rate-limited: at most one report per 30 s, not one per retry.
    let reports = stderr
        .lines()
        .filter(|l| l.contains("has not answered"))
        .count();
    assert!(reports <= 3, "{reports} reports:\n{stderr}");
}
