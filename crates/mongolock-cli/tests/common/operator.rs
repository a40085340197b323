//! The operator's view, end to end through the binary, on any [`Cli`] environment (MongoDB in
//! `operator.rs`, PostgreSQL in `postgres.rs`): the wait queue in `inspect`, a semaphore's
//! limit and holders, `list`/`watch --held --prefix`, `release --force --token`, and the
//! connection string from `MONGOLOCK_URI` / `MONGODB_URI`.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};

use super::*;

/// The `name`s of `list --json` (or of a `watch --json` refresh's `locks`).
fn names(locks: &Value) -> Vec<String> {
    locks
        .as_array()
        .unwrap_or_else(|| panic!("a JSON array: {locks}"))
        .iter()
        .map(|l| l["name"].as_str().expect("a name").to_owned())
        .collect()
}

async fn ok(env: &impl Cli, args: &[&str]) -> Output {
    let out = env.run(args).await;
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", describe(&out));
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", describe(out)))
}

/// A holder of `name` (`exec`, plus `extra` options) whose command writes its token to
/// `$D/<started>` and holds until `$D/<stop>` exists; returns it with its token.
async fn hold(
    env: &impl Cli,
    name: &str,
    extra: &[&str],
    started: &str,
    stop: &str,
) -> (Child, u64) {
    let script = hold_until(started, stop);
    let mut args = vec!["exec"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[name, "--", "sh", "-c", &script]);
    let child = env.spawn(&args);
    wait_for(&format!("the holder of {name} to start"), LONG, || {
        env.path(started).exists()
    })
    .await;
    let token = read_token(&env.path(started));
    (child, token)
}

/// Three `exec` processes wait for the held lock `name`: `inspect --json` lists each of them
/// (pid, host, application name, until when its registration lasts) in the queue while they
/// wait, `inspect` says so in text, and the queue is empty once all have run.
pub async fn inspect_shows_the_processes_waiting(env: &impl Cli, name: &str) {
    let (holder, token) = hold(env, name, &["--app-name", "the holder"], "h", "stop").await;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let app = format!("waiter {i}");
        let child = env.spawn(&[
            "exec",
            "--app-name",
            &app,
            name,
            "--",
            "sh",
            "-c",
            "echo \"$MONGOLOCK_FENCING_TOKEN\" >> \"$D/ran\"",
        ]);
        let pid = child.id().expect("running");
        waiters.push((pid, app, child));
    }
    // Each waiter registers at its first busy attempt with the change feed live: poll.
    let deadline = Instant::now() + LONG;
    let queue = loop {
        let info = inspect_json(env, name).await;
        let queue = info["waiters"].as_array().cloned().unwrap_or_default();
        let pids: Vec<u64> = queue
            .iter()
            .filter_map(|w| w["holder"]["pid"].as_u64())
            .collect();
        if waiters
            .iter()
            .all(|(pid, ..)| pids.contains(&u64::from(*pid)))
        {
            assert_eq!(info["fencing_token"].as_u64(), Some(token), "{info}");
            break queue;
        }
        assert!(
            Instant::now() < deadline,
            "the waiting processes {:?} never all showed in the queue: {info}",
            waiters.iter().map(|(p, ..)| *p).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(queue.len(), 3, "one entry per waiting process: {queue:?}");
    for (pid, app, _) in &waiters {
        let w = queue
            .iter()
            .find(|w| w["holder"]["pid"].as_u64() == Some(u64::from(*pid)))
            .expect("the waiter's entry");
        assert_eq!(w["holder"]["app"], app.as_str(), "{w}");
        assert!(
            w["holder"]["host"].as_str().is_some_and(|h| !h.is_empty()),
            "{w}"
        );
        assert!(w["until"].as_str().is_some_and(|u| u.ends_with('Z')), "{w}");
        assert!(w["until_in_ms"].as_i64().is_some(), "{w}");
        assert!(w["id"].as_str().is_some_and(|id| !id.is_empty()), "{w}");
    }
    let out = ok(env, &["inspect", name]).await;
    let shown = text(&out.stdout);
    assert!(shown.contains("waiting:"), "{shown}");
    for (pid, app, _) in &waiters {
        assert!(
            shown.contains(&format!("(pid {pid}) app {app:?}")),
            "{shown}"
        );
    }
    assert!(shown.contains("registered until"), "{shown}");

    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    for (_, _, child) in waiters {
        let out = finish(child, LONG).await;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    }
    assert_eq!(read_lines(&env.path("ran")).len(), 3);
    let info = inspect_json(env, name).await;
    assert_eq!(info["waiters"], Value::Array(Vec::new()), "{info}");
}

/// A semaphore's `inspect` shows its limit and every holder; `release --force --token N`
/// ends only the slot with token N (its command stops, exit 76), the other holder runs on;
/// the same token again exits 79.
pub async fn inspect_shows_a_semaphore_and_a_token_ends_one_slot(env: &impl Cli, name: &str) {
    let (one, t1) = hold(env, name, &["--limit", "3", "--grace", "1s"], "s1", "stop").await;
    let (two, t2) = hold(env, name, &["--limit", "3"], "s2", "stop").await;
    let info = inspect_json(env, name).await;
    assert_eq!(info["kind"], "semaphore", "{info}");
    assert_eq!(info["limit"], 3, "{info}");
    let tokens: Vec<u64> = info["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter_map(|h| h["fencing_token"].as_u64())
        .collect();
    assert_eq!(tokens, [t1, t2], "{info}");
    let shown = text(&ok(env, &["inspect", name]).await.stdout);
    assert!(shown.contains("limit:         3 slots, 2 held"), "{shown}");
    assert!(shown.contains(&format!("token {t1} ")), "{shown}");
    assert!(shown.contains(&format!("token {t2} ")), "{shown}");

    let out = ok(
        env,
        &["release", "--force", "--token", &t1.to_string(), name],
    )
    .await;
    assert!(
        text(&out.stdout).contains(&format!("fencing token {t1}")),
        "{}",
        describe(&out)
    );
    let out = finish(one, LONG).await;
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    let info = inspect_json(env, name).await;
    let tokens: Vec<u64> = info["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter_map(|h| h["fencing_token"].as_u64())
        .collect();
    assert_eq!(tokens, [t2], "only the other slot is left: {info}");
    let out = env
        .run(&["release", "--force", "--token", &t1.to_string(), name])
        .await;
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));

    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(two, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

/// `release --force --token N` with a token that is not the holder's exits 79 and leaves the
/// lease alone; with the holder's token it ends the lease (its command stops, exit 76); the
/// old token then never ends the next holder.
pub async fn release_force_token_ends_only_that_lease(env: &impl Cli, name: &str) {
    let (a, ta) = hold(env, name, &["--grace", "1s"], "a", "stop-a").await;
    let wrong = (ta + 1).to_string();
    let out = env
        .run(&["release", "--force", "--token", &wrong, name])
        .await;
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("fencing token {wrong}"))
            && err.contains(&format!("held now with fencing token {ta}")),
        "{}",
        describe(&out)
    );
    let info = inspect_json(env, name).await;
    assert_eq!(info["held"], true, "{info}");
    assert_eq!(info["fencing_token"].as_u64(), Some(ta), "{info}");

    ok(
        env,
        &["release", "--force", "--token", &ta.to_string(), name],
    )
    .await;
    let out = finish(a, LONG).await;
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));

    let (b, tb) = hold(env, name, &[], "b", "stop-b").await;
    assert!(tb > ta, "{tb} after {ta}");
    // An operator who read token `ta` before the takeover: the new holder is untouched.
    let out = env
        .run(&["release", "--force", "--token", &ta.to_string(), name])
        .await;
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    let info = inspect_json(env, name).await;
    assert_eq!(info["held"], true, "{info}");
    assert_eq!(info["fencing_token"].as_u64(), Some(tb), "{info}");
    std::fs::write(env.path("stop-b"), "").expect("stop file");
    let out = finish(b, LONG).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "the new holder ran to its end: {}",
        describe(&out)
    );
    // Nothing holds the name: the token of the lease just released ends nothing either.
    let out = env
        .run(&["release", "--force", "--token", &tb.to_string(), name])
        .await;
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("not held now"),
        "{}",
        describe(&out)
    );
}

/// `list` and `watch` with `--held` and `--prefix` (a prefix with regular-expression and
/// `LIKE` metacharacters, taken literally).
pub async fn list_and_watch_filter_by_state_and_prefix(env: &impl Cli) {
    let mut holders = Vec::new();
    for (i, name) in ["a.b*1", "axb*2", "%_x"].iter().enumerate() {
        let (child, _) = hold(env, name, &[], &format!("h{i}"), "stop").await;
        holders.push(child);
    }
    for name in ["a.b*0", "%a", "other"] {
        ok(env, &["exec", name, "--", "true"]).await;
    }
    let list = |args: &[&str]| {
        let mut all = vec!["list", "--json"];
        all.extend_from_slice(args);
        let all: Vec<String> = all.iter().map(|s| (*s).to_owned()).collect();
        async move {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            names(&json(&ok(env, &args).await))
        }
    };
    assert_eq!(list(&["--prefix", "a.b*"]).await, ["a.b*0", "a.b*1"]);
    assert_eq!(list(&["--prefix", "a.b*", "--held"]).await, ["a.b*1"]);
    assert_eq!(list(&["--held"]).await, ["%_x", "a.b*1", "axb*2"]);
    assert_eq!(list(&["--prefix", "%"]).await, ["%_x", "%a"]);
    assert_eq!(list(&["--prefix", "%_"]).await, ["%_x"]);
    assert_eq!(list(&["--prefix", "a"]).await, ["a.b*0", "a.b*1", "axb*2"]);
    assert_eq!(
        list(&[]).await,
        ["%_x", "%a", "a.b*0", "a.b*1", "axb*2", "other"]
    );
    let out = ok(env, &["list", "--prefix", "zz"]).await;
    assert!(
        text(&out.stdout).starts_with("no locks (with prefix \"zz\") in "),
        "{}",
        describe(&out)
    );
    let out = ok(env, &["list", "--held", "--prefix", "a.b*"]).await;
    let table = text(&out.stdout);
    assert_eq!(table.lines().count(), 2, "a header and one row: {table}");
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|r| r.starts_with("a.b*1 ")),
        "{table}"
    );

    let out = ok(
        env,
        &["watch", "--once", "--json", "--held", "--prefix", "a.b*"],
    )
    .await;
    let refresh = json(&out);
    assert_eq!(names(&refresh["locks"]), ["a.b*1"], "{refresh}");
    let out = ok(env, &["watch", "--once", "--prefix", "%"]).await;
    let shown = text(&out.stdout);
    assert!(
        shown.contains("2 locks (with prefix \"%\"), 1 held"),
        "{shown}"
    );

    std::fs::write(env.path("stop"), "").expect("stop file");
    for child in holders {
        let out = finish(child, LONG).await;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    }
}

/// `mongolock LOCATION.. ARGS` with no `--uri` and only the `(variable, value)`s given in
/// the environment.
async fn run_with_vars(
    location: &[&str],
    dir: &Path,
    vars: &[(&str, &str)],
    args: &[&str],
) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(location)
        .args(args)
        .env("D", dir)
        .env_remove("MONGODB_URI")
        .env_remove("MONGOLOCK_URI")
        .env_remove("MONGOLOCK_DB")
        .env_remove("MONGOLOCK_COLLECTION")
        .env_remove("MONGOLOCK_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    finish(cmd.spawn().expect("spawn mongolock"), LONG).await
}

/// The connection string comes from `--uri`, else `MONGOLOCK_URI`, else `MONGODB_URI`: each
/// reaches the test's locks (`inspect` finds the lock `name` made through `--uri`), and a
/// variable of lower precedence pointing nowhere is not used. `nowhere` is a URI of the same
/// database system with nothing listening.
pub async fn the_uri_comes_from_mongolock_uri_then_mongodb_uri(
    env: &impl Cli,
    uri: &str,
    location: &[&str],
    nowhere: &str,
) {
    ok(env, &["exec", "uri-check", "--", "true"]).await;
    let check = ["inspect", "uri-check", "--json"];
    let dir = env.dir();
    for vars in [
        vec![("MONGOLOCK_URI", uri)],
        vec![("MONGODB_URI", uri)],
        vec![("MONGOLOCK_URI", uri), ("MONGODB_URI", nowhere)],
        vec![("MONGOLOCK_URI", uri), ("MONGODB_URI", "")],
    ] {
        let out = run_with_vars(location, dir, &vars, &check).await;
        assert_eq!(out.status.code(), Some(0), "{vars:?}: {}", describe(&out));
        assert_eq!(json(&out)["name"], "uri-check", "{vars:?}");
    }
    // A lower-precedence source pointing at the test's locks does not win over a higher one.
    for (vars, extra) in [
        (
            vec![("MONGOLOCK_URI", nowhere), ("MONGODB_URI", uri)],
            vec![],
        ),
        (vec![("MONGOLOCK_URI", uri)], vec!["--uri", nowhere]),
    ] {
        let mut args = extra.clone();
        args.extend_from_slice(&check);
        let out = run_with_vars(location, dir, &vars, &args).await;
        assert_eq!(
            out.status.code(),
            Some(1),
            "{vars:?} {extra:?} must fail: {}",
            describe(&out)
        );
    }
}
