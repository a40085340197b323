//! End-to-end tests of `exec`/`elect` `--json` and `--json-fd` events, `--conflict-exit-code`
//! and the `MONGOLOCK_TTL` / `MONGOLOCK_WAIT` / `MONGOLOCK_GRACE` environment variables, on the
//! real binary against a test server (or `MONGODB_URI`).
//!
//! Deadlines are generous and conditions are polled; nothing asserts tight timings.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::SystemTime;

use common::*;
use serde_json::Value;
use tokio::process::{Child, Command};

/// `mongolock --uri .. --db .. ARGS` (as [`common::command`] sets it up) with fd 3 open for
/// writing on `$D/<file>`: run through `sh`, which opens it and then execs mongolock.
fn with_fd3(env: &Env, file: &str, args: &[&str]) -> Command {
    let script = format!("exec \"$0\" \"$@\" 3>\"$D/{file}\"");
    let cmd = command(&env.uri, &["--db", &env.db], env.dir(), args);
    let std = cmd.as_std();
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(script)
        .arg(std.get_program())
        .args(std.get_args());
    sh.env("D", env.dir())
        .env_remove("MONGODB_URI")
        .env_remove("MONGOLOCK_LOG")
        .env_remove("MONGOLOCK_TTL")
        .env_remove("MONGOLOCK_WAIT")
        .env_remove("MONGOLOCK_GRACE")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    sh
}

/// Every line of `text` parsed as a JSON object (the test fails, showing `context`, on a line
/// that is not one).
fn parse_lines(text: &str, context: &str) -> Vec<Value> {
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{context}"));
            assert!(v.is_object(), "not an object: {line}\n{context}");
            assert!(v["event"].is_string(), "no event kind: {line}\n{context}");
            assert!(v["time"].is_string(), "no time: {line}\n{context}");
            v
        })
        .collect()
}

fn read_events(path: &Path, context: &str) -> Vec<Value> {
    parse_lines(&std::fs::read_to_string(path).unwrap_or_default(), context)
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["event"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn find<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["event"] == kind)
        .unwrap_or_else(|| panic!("no {kind:?} event in {:?}", kinds(events)))
}

fn rfc3339(v: &Value, field: &str) -> SystemTime {
    let text = v[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a string in {v}"));
    humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{field} {text:?}: {e} in {v}"))
}

/// The lease fields every lease event has.
fn assert_lease_fields(v: &Value, name: &str) {
    assert_eq!(v["name"], name, "{v}");
    assert!(v["fencing_token"].as_u64().is_some(), "{v}");
    assert!(v["lease_id"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    assert!(rfc3339(v, "acquired_at") < rfc3339(v, "expires_at"), "{v}");
}

/// Kinds must appear in this order (others may come in between).
fn assert_in_order(events: &[Value], expected: &[&str], context: &str) {
    let all = kinds(events);
    let mut at = 0;
    for kind in expected {
        match all[at..].iter().position(|k| k == kind) {
            Some(i) => at += i + 1,
            None => panic!("expected {expected:?} in order, got {all:?}\n{context}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_json_fd_reports_the_run_as_json_lines_and_the_command_does_not_inherit_the_fd() {
    let env = Env::new("jsonfd").await;
    let script = "if [ -e /proc/$$/fd/3 ]; then echo inherited > \"$D/fd3\"; fi; \
                  echo to-stderr >&2; sleep 1.5; exit 4";
    let child = with_fd3(
        &env,
        "events.jsonl",
        &[
            "exec",
            "--json-fd",
            "3",
            "--ttl",
            "3s",
            "report",
            "--",
            "sh",
            "-c",
            script,
        ],
    )
    .spawn()
    .expect("spawn");
    let out = finish(child, LONG).await;
    let context = describe(&out);
    assert_eq!(out.status.code(), Some(4), "{context}");
    // Messages and the command's stderr stay on stderr; the events file has JSON only.
    assert!(text(&out.stderr).contains("to-stderr"), "{context}");
    let events = read_events(&env.path("events.jsonl"), &context);
    let context = format!("{context}\n--- events\n{events:#?}");
    assert_in_order(
        &events,
        &[
            "waiting", "acquired", "started", "exited", "released", "exit",
        ],
        &context,
    );
    for kind in ["acquired", "started", "exited", "released"] {
        assert_lease_fields(find(&events, kind), "report");
    }
    let acquired = find(&events, "acquired");
    let token = acquired["fencing_token"].as_u64();
    let lease = acquired["lease_id"].clone();
    for e in events.iter().filter(|e| e.get("lease_id").is_some()) {
        assert_eq!(e["fencing_token"].as_u64(), token, "{context}");
        assert_eq!(e["lease_id"], lease, "{context}");
    }
    assert!(
        find(&events, "started")["pid"].as_u64().is_some(),
        "{context}"
    );
    assert_eq!(find(&events, "exited")["exit_code"], 4, "{context}");
    assert_eq!(events.last().expect("events")["event"], "exit", "{context}");
    assert_eq!(events.last().expect("events")["exit_code"], 4, "{context}");
    // Renewals (every second with --ttl 3s) move expires_at forward.
    for renewed in events.iter().filter(|e| e["event"] == "renewed") {
        assert!(
            rfc3339(renewed, "expires_at") >= rfc3339(acquired, "expires_at"),
            "{context}"
        );
    }
    assert!(!env.path("fd3").exists(), "the command inherited fd 3");
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_json_on_stderr_reports_a_busy_lock_with_the_conflict_exit_code() {
    let env = Env::new("jsonbusy").await;
    let holder = env.spawn(&["exec", "busy", "--", "sh", "-c", &hold_until("a", "stop")]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let token = read_token(&env.path("a"));

    for (code, expected) in [(None, 75), (Some("9"), 9), (Some("0"), 0)] {
        let mut args = vec!["exec", "--json", "--wait", "0"];
        if let Some(code) = code {
            args.extend(["--conflict-exit-code", code]);
        }
        args.extend(["busy", "--", "sh", "-c", "touch \"$D/ran\""]);
        let out = env.run(&args).await;
        let context = format!("{args:?}\n{}", describe(&out));
        assert_eq!(out.status.code(), Some(expected), "{context}");
        let events = parse_lines(&text(&out.stderr), &context);
        assert_eq!(kinds(&events), ["waiting", "busy", "exit"], "{context}");
        let busy = find(&events, "busy");
        assert_eq!(busy["name"], "busy", "{context}");
        assert_eq!(busy["exit_code"], expected, "{context}");
        assert!(
            busy["held_by"]
                .as_str()
                .is_some_and(|h| h.contains(&format!("fencing token {token}"))),
            "{context}"
        );
        assert!(
            busy["message"]
                .as_str()
                .is_some_and(|m| m.contains("command not run")),
            "{context}"
        );
        assert_eq!(find(&events, "exit")["exit_code"], expected, "{context}");
    }
    assert!(!env.path("ran").exists(), "the command must not run");
    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn json_events_report_a_lost_lock_and_the_stopped_command() {
    let env = Env::new("jsonlost").await;
    // The command shares stderr with the events: it keeps its own (and its shell's
    // "Terminated" for the stopped `sleep`) off it.
    let script = "exec 2>/dev/null; trap 'exit 0' TERM; \
                  echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/a.tmp\"; \
                  mv \"$D/a.tmp\" \"$D/a\"; while [ -d \"$D\" ]; do sleep 0.05; done";
    let a = env.spawn(&[
        "exec", "--json", "--ttl", "6s", "--grace", "2s", "stolen", "--", "sh", "-c", script,
    ]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let out = env.run(&["release", "--force", "stolen"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = finish(a, LONG).await;
    let context = describe(&out);
    assert_eq!(out.status.code(), Some(76), "{context}");
    let events = parse_lines(&text(&out.stderr), &context);
    assert_in_order(
        &events,
        &["acquired", "started", "lost", "exited", "stopped", "exit"],
        &context,
    );
    let lost = find(&events, "lost");
    assert_lease_fields(lost, "stolen");
    assert!(
        lost["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{context}"
    );
    assert!(lost["action"].as_str().is_some(), "{context}");
    assert!(
        lost["message"]
            .as_str()
            .is_some_and(|m| m.contains("lost the lock \"stolen\"")),
        "{context}"
    );
    assert_eq!(find(&events, "exit")["exit_code"], 76, "{context}");
}

/// Three electors with events on fd 3 (`$D/<id>.jsonl`); each command waits for
/// `$D/stop-<id>` after recording `<id> <token>` in `$D/leaders`.
fn spawn_json_elector(env: &Env, id: &str) -> Child {
    let script = "id=$1; echo \"$id $MONGOLOCK_FENCING_TOKEN\" >> \"$D/leaders\"; \
                  while [ -d \"$D\" ] && [ ! -f \"$D/stop-$id\" ]; do sleep 0.05; done";
    with_fd3(
        env,
        &format!("{id}.jsonl"),
        &[
            "elect",
            "--json-fd",
            "3",
            "--ttl",
            "3s",
            "role",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            id,
        ],
    )
    .spawn()
    .expect("spawn an elector")
}

fn last_leader(env: &Env) -> (String, u64) {
    let lines = read_lines(&env.path("leaders"));
    let last = lines.last().expect("a leader");
    let (id, token) = last.split_once(' ').expect("id and token");
    (id.to_owned(), token.parse().expect("numeric token"))
}

#[tokio::test(flavor = "multi_thread")]
async fn elect_json_events_report_campaigns_leader_changes_and_terms() {
    let env = Env::new("jsonelect").await;
    let leaders = env.path("leaders");
    let mut electors: Vec<(String, Option<Child>)> = Vec::new();
    electors.push(("one".into(), Some(spawn_json_elector(&env, "one"))));
    wait_for("a first leader", LONG, || read_lines(&leaders).len() == 1).await;
    let (first, first_term) = last_leader(&env);
    assert_eq!(first, "one");
    for id in ["two", "three"] {
        electors.push((id.into(), Some(spawn_json_elector(&env, id))));
    }
    // Both campaign while "one" leads, and report it as the current leader.
    for id in ["two", "three"] {
        let path = env.path(&format!("{id}.jsonl"));
        wait_for("the campaign event", LONG, || {
            read_events(&path, id)
                .iter()
                .any(|e| e["event"] == "campaigning")
        })
        .await;
        let events = read_events(&path, id);
        let campaigning = find(&events, "campaigning");
        assert_eq!(campaigning["name"], "role", "{campaigning}");
        assert_eq!(
            campaigning["leader"]["fencing_token"].as_u64(),
            Some(first_term),
            "{campaigning}"
        );
        assert!(
            campaigning["leader"]["holder"]["pid"].is_u64(),
            "{campaigning}"
        );
    }

    // Hand over twice: each time the elector left campaigning reports the new leader.
    let mut outputs: Vec<(String, Output)> = Vec::new();
    for _ in 0..2 {
        let (current, _) = last_leader(&env);
        let n = read_lines(&leaders).len();
        std::fs::write(env.path(&format!("stop-{current}")), "").expect("stop file");
        let child = electors
            .iter_mut()
            .find(|(i, _)| *i == current)
            .and_then(|(_, c)| c.take())
            .expect("the leader's elector");
        let out = finish(child, LONG).await;
        assert_eq!(out.status.code(), Some(0), "{current}: {}", describe(&out));
        outputs.push((current, out));
        wait_for("the next leader", LONG, || {
            read_lines(&leaders).len() == n + 1
        })
        .await;
        if outputs.len() == 1 {
            // The remaining campaigner sees the new leader's term.
            let (new, new_term) = last_leader(&env);
            let waiting = if new == "two" { "three" } else { "two" };
            let path = env.path(&format!("{waiting}.jsonl"));
            wait_for("a leader event for the new term", LONG, || {
                read_events(&path, waiting).iter().any(|e| {
                    e["event"] == "leader"
                        && e["leader"]["fencing_token"].as_u64() == Some(new_term)
                })
            })
            .await;
        }
    }
    let (last, _) = last_leader(&env);
    std::fs::write(env.path(&format!("stop-{last}")), "").expect("stop file");
    let child = electors
        .iter_mut()
        .find(|(i, _)| *i == last)
        .and_then(|(_, c)| c.take())
        .expect("the last elector");
    let out = finish(child, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    outputs.push((last, out));

    let mut terms = Vec::new();
    for (id, out) in &outputs {
        let context = format!("{id}: {}", describe(out));
        let events = read_events(&env.path(&format!("{id}.jsonl")), &context);
        let context = format!("{context}\n--- events\n{events:#?}");
        assert_in_order(
            &events,
            &[
                "campaigning",
                "acquired",
                "started",
                "exited",
                "released",
                "exit",
            ],
            &context,
        );
        let acquired = find(&events, "acquired");
        assert_lease_fields(acquired, "role");
        assert_eq!(acquired["term"], acquired["fencing_token"], "{context}");
        terms.push(acquired["term"].as_u64().expect("term"));
        // The human messages stay on stderr.
        assert!(text(&out.stderr).contains("elected leader"), "{context}");
    }
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unopened_json_fd_is_a_usage_error() {
    let env = Env::new("badfd").await;
    let out = env
        .run(&["exec", "--json-fd", "57", "x", "--", "true"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("--json-fd 57"),
        "{}",
        describe(&out)
    );
    let out = env
        .run(&["exec", "--json-fd", "0", "x", "--", "true"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn ttl_wait_and_grace_come_from_the_environment() {
    let env = Env::new("envvars").await;
    // MONGOLOCK_TTL sets the lease duration.
    let mut cmd = env.cmd(&[
        "exec",
        "envlock",
        "--",
        "sh",
        "-c",
        &hold_until("a", "stop"),
    ]);
    cmd.env("MONGOLOCK_TTL", "7s");
    let holder = cmd.spawn().expect("spawn");
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let info = inspect_json(&env, "envlock").await;
    let left = info["expires_in_ms"].as_i64().expect("expires_in_ms");
    assert!(left > 0 && left <= 7_000, "MONGOLOCK_TTL=7s: {info}");

    // MONGOLOCK_WAIT=0: one attempt, exit 75; an explicit --wait wins over it.
    let mut cmd = env.cmd(&["exec", "envlock", "--", "true"]);
    cmd.env("MONGOLOCK_WAIT", "0");
    let out = finish(cmd.spawn().expect("spawn"), LONG).await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("after one attempt"),
        "{}",
        describe(&out)
    );
    let mut cmd = env.cmd(&["exec", "--wait", "1s", "envlock", "--", "true"]);
    cmd.env("MONGOLOCK_WAIT", "0");
    let out = finish(cmd.spawn().expect("spawn"), LONG).await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("after waiting"),
        "{}",
        describe(&out)
    );

    // MONGOLOCK_GRACE is checked against the TTL like --grace.
    for sub in ["exec", "elect"] {
        let mut cmd = env.cmd(&[sub, "--ttl", "3s", "other", "--", "true"]);
        cmd.env("MONGOLOCK_GRACE", "5s");
        let out = finish(cmd.spawn().expect("spawn"), LONG).await;
        assert_eq!(out.status.code(), Some(2), "{sub}: {}", describe(&out));
        assert!(
            text(&out.stderr).contains("--grace 5s"),
            "{}",
            describe(&out)
        );
    }
    // A bad value in the environment is a usage error naming the variable's value.
    let mut cmd = env.cmd(&["exec", "other", "--", "true"]);
    cmd.env("MONGOLOCK_TTL", "30");
    let out = finish(cmd.spawn().expect("spawn"), LONG).await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(text(&out.stderr).contains("30s"), "{}", describe(&out));

    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn help_shows_the_environment_variables_and_the_new_options() {
    for (sub, expected) in [
        (
            "exec",
            &[
                "MONGOLOCK_TTL",
                "MONGOLOCK_WAIT",
                "MONGOLOCK_GRACE",
                "--conflict-exit-code",
                "--json",
                "--json-fd",
            ][..],
        ),
        (
            "elect",
            &["MONGOLOCK_TTL", "MONGOLOCK_GRACE", "--json", "--json-fd"][..],
        ),
    ] {
        let out = Command::new(BIN)
            .args([sub, "--help"])
            .env_remove("MONGOLOCK_TTL")
            .output()
            .await
            .expect("run");
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let help = text(&out.stdout);
        for e in expected {
            assert!(help.contains(e), "{sub} --help lacks {e}:\n{help}");
        }
    }
}
