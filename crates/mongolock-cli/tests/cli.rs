//! End-to-end tests: the real `mongolock` binary against a `mongo-testserver` started by each
//! test (or the deployment in `MONGODB_URI`, each test in its own database).
//!
//! Deadlines are generous and conditions are polled; nothing asserts tight timings.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::*;
use mongo_testserver::TestServer;
use serde_json::Value;
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread")]
async fn six_exec_processes_never_overlap_and_tokens_strictly_increase() {
    let env = Env::new("six").await;
    exec_processes_never_overlap(&env, 6, "shared-job").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_holder_is_replaced_after_the_ttl_not_before() {
    let env = Env::new("killed").await;
    let ttl = Duration::from_secs(3);
    let a_script = "echo $$ > \"$D/a.pid\"; echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/a.tmp\"; \
                    mv \"$D/a.tmp\" \"$D/a\"; sleep 120";
    let mut a = env.spawn(&["exec", "--ttl", "3s", "crashy", "--", "sh", "-c", a_script]);
    wait_for("the first holder to start", LONG, || env.path("a").exists()).await;
    let a_token = read_token(&env.path("a"));

    a.start_kill().expect("SIGKILL the holder");
    let killed_at = Instant::now();
    let _ = a.wait().await;
    // Its supervisor kills the command; this only tidies up should it still run.
    kill_group_from_pidfile(&env.path("a.pid"));

    let b_script = "echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/b.tmp\"; mv \"$D/b.tmp\" \"$D/b\"";
    let b = env.spawn(&["exec", "--ttl", "3s", "crashy", "--", "sh", "-c", b_script]);
    wait_for("the second holder to take over", LONG, || {
        env.path("b").exists()
    })
    .await;
    let took = killed_at.elapsed();
    let out = finish(b, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    // The dead lease was last renewed at most TTL/3 before the kill, so it ran until at least
    // kill + 2/3 TTL (2 s); allow 0.5 s for clock granularity.
    assert!(
        took >= ttl * 2 / 3 - Duration::from_millis(500),
        "taken over after {took:?}, before the dead holder's lease ({ttl:?}) could have expired"
    );
    assert!(took < ttl + Duration::from_secs(20), "took {took:?}");
    assert!(read_token(&env.path("b")) > a_token);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_lock_stops_the_command_and_exits_76() {
    let env = Env::new("lost").await;
    let a_script = "trap 'echo term > \"$D/term\"; exit 0' TERM; \
                    echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/a.tmp\"; mv \"$D/a.tmp\" \"$D/a\"; \
                    while [ -d \"$D\" ]; do sleep 0.05; done";
    let a = env.spawn(&[
        "exec", "--ttl", "6s", "--grace", "2s", "stolen", "--", "sh", "-c", a_script,
    ]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let a_token = read_token(&env.path("a"));

    // An operator removes the lease and another process takes the lock.
    let out = env.run(&["release", "--force", "stolen"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        text(&out.stdout).contains("released lock \"stolen\""),
        "{}",
        describe(&out)
    );
    let b_script = "echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/b\"";
    let out = env
        .run(&[
            "exec", "--wait", "30s", "stolen", "--", "sh", "-c", b_script,
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        read_token(&env.path("b")) > a_token,
        "the token keeps growing after release --force"
    );

    let out = finish(a, LONG).await;
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("lost the lock \"stolen\""),
        "{}",
        describe(&out)
    );
    assert!(env.path("term").exists(), "the command got SIGTERM");
}

#[tokio::test(flavor = "multi_thread")]
async fn losing_the_server_stops_the_command_when_the_lease_runs_out() {
    let mut env = Env::new("outage").await;
    let Some(server) = env.server.take() else {
        eprintln!("skipped: needs the test server (MONGODB_URI is set)");
        return;
    };
    let a_script = "trap 'echo term > \"$D/term\"; exit 0' TERM; \
                    echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/a.tmp\"; mv \"$D/a.tmp\" \"$D/a\"; \
                    while [ -d \"$D\" ]; do sleep 0.05; done";
    let a = env.spawn(&["exec", "--ttl", "2s", "outage", "--", "sh", "-c", a_script]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    server.shutdown().await;
    let out = finish(a, LONG).await;
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("lost the lock \"outage\""),
        "{}",
        describe(&out)
    );
    assert!(env.path("term").exists(), "the command got SIGTERM");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let env = Env::new("grace").await;
    let a_script = "trap '' TERM; echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/a.tmp\"; \
                    mv \"$D/a.tmp\" \"$D/a\"; while [ -d \"$D\" ]; do sleep 0.05; done";
    let a = env.spawn(&[
        "exec", "--ttl", "3s", "--grace", "1s", "stubborn", "--", "sh", "-c", a_script,
    ]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let out = env.run(&["release", "--force", "stubborn"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = finish(a, LONG).await;
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    assert!(text(&out.stderr).contains("SIGKILL"), "{}", describe(&out));
}

/// `mongolock exec --wait WAIT busy -- sh -c SCRIPT`.
async fn exec_busy(env: &Env, wait: &str, script: &str) -> Output {
    env.run(&["exec", "--wait", wait, "busy", "--", "sh", "-c", script])
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_zero_on_a_held_lock_exits_75_without_running_the_command() {
    let env = Env::new("wait0").await;
    let holder = env.spawn(&["exec", "busy", "--", "sh", "-c", &hold_until("a", "stop")]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;

    let out = exec_busy(&env, "0", "touch \"$D/ran\"").await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("is held by"), "{}", describe(&out));
    assert!(stderr.contains("command not run"), "{}", describe(&out));
    assert_eq!(stderr.trim().lines().count(), 1, "{}", describe(&out));

    let started = Instant::now();
    let out = exec_busy(&env, "1s", "touch \"$D/ran\"").await;
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(!env.path("ran").exists(), "the command must not run");

    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    // Free now: one attempt suffices, and the command's status is passed through.
    let out = exec_busy(&env, "0", "touch \"$D/ran\"; exit 3").await;
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(env.path("ran").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_is_passed_to_the_command_and_the_lock_released_after_it_exits() {
    let env = Env::new("sigterm").await;
    let script = "trap 'echo term > \"$D/term\"; exit 7' TERM; \
                  echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/a.tmp\"; mv \"$D/a.tmp\" \"$D/a\"; \
                  while [ -d \"$D\" ]; do sleep 0.05; done";
    let a = env.spawn(&[
        "exec",
        "--ttl",
        "30s",
        "signalled",
        "--",
        "sh",
        "-c",
        script,
    ]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    send_signal(&a, libc::SIGTERM);
    let out = finish(a, LONG).await;
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(env.path("term").exists());
    let info = inspect_json(&env, "signalled").await;
    assert_eq!(info["state"], "released", "{info}");
}

#[tokio::test(flavor = "multi_thread")]
async fn command_not_found_and_signal_deaths_have_shell_statuses() {
    let env = Env::new("statuses").await;
    let out = env
        .run(&["exec", "x", "--", "/nonexistent/mongolock-test-command"])
        .await;
    assert_eq!(out.status.code(), Some(127), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("command not found"),
        "{}",
        describe(&out)
    );
    let out = env
        .run(&["exec", "x", "--", "sh", "-c", "kill -KILL $$"])
        .await;
    assert_eq!(out.status.code(), Some(137), "{}", describe(&out));
    // The lock was released each time.
    let info = inspect_json(&env, "x").await;
    assert_eq!(info["state"], "released", "{info}");
}

#[tokio::test(flavor = "multi_thread")]
async fn list_and_inspect_show_holder_token_and_expiry() {
    let env = Env::new("list").await;
    let holder = env.spawn(&[
        "exec",
        "--ttl",
        "30s",
        "--app-name",
        "nightly report",
        "reports:daily",
        "--",
        "sh",
        "-c",
        &hold_until("a", "stop"),
    ]);
    let holder_pid = holder.id().expect("running");
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let token = read_token(&env.path("a"));

    let out = env.run(&["list"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let table = text(&out.stdout);
    let mut lines = table.lines();
    let header = lines.next().expect("header");
    for column in ["NAME", "HOLDER", "TOKEN", "ACQUIRED", "EXPIRES"] {
        assert!(header.contains(column), "{table}");
    }
    let row = lines.next().expect("one row");
    assert!(row.starts_with("reports:daily"), "{table}");
    assert!(row.contains(&format!("(pid {holder_pid})")), "{table}");
    assert!(row.contains("nightly report"), "{table}");
    assert!(row.contains(&token.to_string()), "{table}");
    assert!(row.contains(" in "), "expires in ...: {table}");

    let out = env.run(&["list", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let all: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let locks = all.as_array().expect("an array");
    assert_eq!(locks.len(), 1, "{all}");
    let lock = &locks[0];
    assert_eq!(lock["name"], "reports:daily");
    assert_eq!(lock["state"], "held");
    assert_eq!(lock["held"], true);
    assert_eq!(lock["fencing_token"].as_u64(), Some(token));
    assert_eq!(lock["holder"]["pid"].as_u64(), Some(u64::from(holder_pid)));
    assert_eq!(lock["holder"]["app"], "nightly report");
    let left = lock["expires_in_ms"].as_i64().expect("expires_in_ms");
    assert!(left > 0 && left <= 30_000, "{lock}");

    let out = env.run(&["inspect", "reports:daily"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("state:") && shown.contains("held"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("fencing token: {token}")),
        "{shown}"
    );
    assert!(shown.contains("(in "), "{shown}");

    let info = inspect_json(&env, "reports:daily").await;
    assert_eq!(info["fencing_token"].as_u64(), Some(token));
    assert!(info["lease_id"].is_string(), "{info}");

    let out = env.run(&["inspect", "no-such-lock"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("no lock named"),
        "{}",
        describe(&out)
    );

    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let info = inspect_json(&env, "reports:daily").await;
    assert_eq!(info["state"], "released", "{info}");
    assert_eq!(info["held"], false, "{info}");
    let out = env.run(&["list"]).await;
    assert!(text(&out.stdout).contains("released"), "{}", describe(&out));
    let out = env.run(&["release", "--force", "reports:daily"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(text(&out.stderr).contains("not held"), "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn elect_runs_the_command_only_while_leader_and_campaigns_again_after_a_loss() {
    let env = Env::new("elect").await;
    let script = "id=$1; echo \"$id $MONGOLOCK_FENCING_TOKEN\" >> \"$D/leaders\"; \
                  trap 'echo \"$id stopped\" >> \"$D/events\"; exit 143' TERM; \
                  while [ -d \"$D\" ] && [ ! -f \"$D/stop-$id\" ]; do sleep 0.05; done";
    let mut electors = spawn_electors(&env, script);
    let leaders = env.path("leaders");
    wait_for("a first leader", LONG, || read_lines(&leaders).len() == 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(read_lines(&leaders).len(), 1, "only one leader at a time");
    let first = read_lines(&leaders)[0].clone();
    let first_id = first.split(' ').next().expect("id").to_owned();

    // Take leadership away: the first leader's command must be stopped, and someone (the other
    // elector, or the same one after campaigning again) becomes leader.
    let out = env.run(&["release", "--force", "scheduler"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    wait_for("a second leader", LONG, || read_lines(&leaders).len() == 2).await;
    let events = env.path("events");
    wait_for("the first leader's command to be stopped", LONG, || {
        read_lines(&events).contains(&format!("{first_id} stopped"))
    })
    .await;

    // Let each current leader's command finish on its own: that elector exits 0 and the other
    // one takes over.
    for _ in 0..2 {
        let n = read_lines(&leaders).len();
        let current = read_lines(&leaders)[n - 1].clone();
        let id = current.split(' ').next().expect("id").to_owned();
        let out = stop_elector(&env, &mut electors, &id).await;
        assert!(
            text(&out.stderr).contains("elected leader"),
            "{}",
            describe(&out)
        );
        if electors.iter().any(|(_, c)| c.is_some()) {
            wait_for("the next leader", LONG, || {
                read_lines(&leaders).len() == n + 1
            })
            .await;
        }
    }
    let tokens: Vec<u64> = read_lines(&leaders)
        .iter()
        .map(|l| {
            l.split(' ')
                .nth(1)
                .expect("token")
                .parse()
                .expect("numeric")
        })
        .collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[cfg(feature = "demo")]
#[tokio::test(flavor = "multi_thread")]
async fn demo_runs_and_exits_zero() {
    let child = Command::new(BIN)
        .arg("demo")
        .env_remove("MONGOLOCK_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the demo");
    let out = finish(child, Duration::from_secs(120)).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stdout = text(&out.stdout);
    for expected in [
        "SIGKILL worker",
        "took over",
        "Summary",
        "strictly increasing",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?}:\n{stdout}");
    }
}

/// Runs mongolock with `uri` and checks for one clean error line.
#[tokio::test(flavor = "multi_thread")]
async fn bad_uris_and_unreachable_servers_fail_with_one_clean_line() {
    // A port with nothing listening.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    assert_clean_failure(
        &format!("mongodb://app:secretpw@127.0.0.1:{port}/?serverSelectionTimeoutMS=1000"),
        &format!("cannot reach MongoDB at mongodb://app:****@127.0.0.1:{port}/"),
    )
    .await;
    assert_clean_failure("http://db1:27017", "invalid MongoDB URI").await;
    assert_clean_failure("mongodb://app:secretpw@db1:notaport", "invalid MongoDB URI").await;
    assert_clean_failure(
        "mongodb://app:secretpw@db1/?notAnOption=1&w=-5",
        "invalid MongoDB URI",
    )
    .await;

    if std::env::var("MONGODB_URI").is_err() {
        // The test server has no users: any credentials are refused.
        let server = TestServer::start().await.expect("test server");
        let uri = server
            .uri()
            .replace("mongodb://", "mongodb://nobody:secretpw@");
        assert_clean_failure(&uri, "authentication refused by mongodb://nobody:****@").await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_errors_exit_2_and_every_command_has_help_with_examples() {
    let out = Command::new(BIN)
        .args(["release", "some-lock"])
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let out = Command::new(BIN)
        .args(["exec", "--ttl", "30", "x", "--", "true"])
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(text(&out.stderr).contains("30s"), "{}", describe(&out));
    let mut commands = vec!["exec", "elect", "list", "inspect", "release", "watch"];
    if cfg!(feature = "demo") {
        commands.push("demo");
    }
    for command in commands {
        let out = Command::new(BIN)
            .args([command, "--help"])
            .output()
            .await
            .expect("run");
        assert_eq!(out.status.code(), Some(0));
        assert!(text(&out.stdout).contains("Examples:"), "{command} --help");
    }
    let out = Command::new(BIN).arg("--help").output().await.expect("run");
    assert!(text(&out.stdout).contains("Exit statuses:"));
}

#[tokio::test(flavor = "multi_thread")]
async fn release_force_of_a_lock_nobody_holds_exits_3() {
    let env = Env::new("unheld").await;
    // Never created, then released by its holder: nothing to release either time.
    let out = env.run(&["release", "--force", "never-held"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(text(&out.stderr).contains("not held"), "{}", describe(&out));
    let out = env.run(&["exec", "once", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = env.run(&["release", "--force", "once"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(out.stdout.is_empty(), "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_lock_name_is_a_usage_error() {
    let env = Env::new("badname").await;
    for args in [
        vec!["inspect", ""],
        vec!["exec", "", "--", "true"],
        vec!["release", "--force", ""],
    ] {
        let out = env.run(&args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
        assert!(
            text(&out.stderr).contains("invalid lock name"),
            "{args:?}: {}",
            describe(&out)
        );
    }
}

/// `--collection` naming an application's collection: mongolock refuses it with status 77 and
/// a message naming the collection and the fix, and writes nothing there (no lock fields in
/// the document of the lock's name, no epoch counters, no TTL index).
#[tokio::test(flavor = "multi_thread")]
async fn an_application_collection_is_refused_with_status_77_and_left_untouched() {
    use futures_util::TryStreamExt;
    use mongodb::bson::{doc, DateTime, Document};
    let env = Env::new("foreign").await;
    let client = mongodb::Client::with_uri_str(&env.uri).await.unwrap();
    let users = client.database(&env.db).collection::<Document>("users");
    let old = DateTime::from_millis(1_000_000_000_000);
    users
        .insert_many(vec![
            doc! { "_id": "x", "name": "alice", "expiresAt": old },
            doc! { "_id": "y", "name": "bob", "expiresAt": old },
        ])
        .await
        .unwrap();
    let snapshot = || async {
        let docs: Vec<Document> = users
            .find(doc! {})
            .sort(doc! { "_id": 1 })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let indexes = users.list_index_names().await.unwrap();
        (docs, indexes)
    };
    let before = snapshot().await;
    let out = env
        .run(&[
            "--collection",
            "users",
            "exec",
            "x",
            "--",
            "sh",
            "-c",
            "touch \"$D/ran\"",
        ])
        .await;
    assert_eq!(out.status.code(), Some(77), "{}", describe(&out));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("{}.users", env.db)) && stderr.contains("distributed.locks"),
        "{}",
        describe(&out)
    );
    assert!(!env.path("ran").exists(), "the command ran");
    let out = env
        .run(&["--collection", "users", "release", "--force", "x"])
        .await;
    assert_eq!(out.status.code(), Some(77), "{}", describe(&out));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(snapshot().await, before, "the collection was changed");
}

/// Read commands on an application's collection are refused like writes, with status 77
/// (issue 32 §4: `--collection orders list` exited 0 and showed an order as lock `nightly …
/// released`; `inspect nightly` said `state: released`), and write nothing there. A
/// collection that does not exist lists as empty (MongoDB creates collections on first
/// write) and is not created.
#[tokio::test(flavor = "multi_thread")]
async fn read_commands_refuse_an_application_collection_with_status_77() {
    use futures_util::TryStreamExt;
    use mongodb::bson::{doc, Document};
    let env = Env::new("foreignread").await;
    let client = mongodb::Client::with_uri_str(&env.uri).await.unwrap();
    let db = client.database(&env.db);
    let orders = db.collection::<Document>("orders");
    orders
        .insert_many(vec![
            doc! { "_id": "nightly", "customer": "alice", "total": 12 },
            doc! { "_id": "weekly", "customer": "bob", "total": 3 },
        ])
        .await
        .unwrap();
    let snapshot = || async {
        let docs: Vec<Document> = orders
            .find(doc! {})
            .sort(doc! { "_id": 1 })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let indexes = orders.list_index_names().await.unwrap();
        (docs, indexes)
    };
    let before = snapshot().await;
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["list", "--held", "--prefix", "n"],
        &["inspect", "nightly"],
        &["inspect", "nightly", "--json"],
        &["watch", "--once"],
        &["watch", "--count", "3", "--interval", "1s"],
    ] {
        let mut all = vec!["--collection", "orders"];
        all.extend_from_slice(args);
        let out = env.run(&all).await;
        assert_eq!(out.status.code(), Some(77), "{args:?}: {}", describe(&out));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("{}.orders", env.db)) && stderr.contains("distributed.locks"),
            "{args:?}: {}",
            describe(&out)
        );
        assert!(
            !text(&out.stdout).contains("nightly"),
            "{args:?}: {}",
            describe(&out)
        );
    }
    assert_eq!(snapshot().await, before, "the collection was changed");

    // A collection that does not exist: no locks, and still no collection.
    let out = env.run(&["--collection", "nothing_here", "list"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(text(&out.stdout).contains("no locks"), "{}", describe(&out));
    let out = env
        .run(&["--collection", "nothing_here", "inspect", "a"])
        .await;
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let names = db.list_collection_names().await.unwrap();
    assert!(
        !names.iter().any(|n| n == "nothing_here"),
        "a read created the collection: {names:?}"
    );
}

/// Two `exec --wait` that gave up ahead of a live one: it runs soon after the release (it
/// waited until the holder's expiry before they withdrew from the queue).
#[tokio::test(flavor = "multi_thread")]
async fn two_waiters_that_gave_up_do_not_stall_a_live_one() {
    let env = Env::new("gave_up").await;
    waiters_that_left_do_not_stall_a_live_one(&env, 2, 0).await;
}

/// Five that gave up and three SIGKILLed while queued, ahead of a live one.
#[tokio::test(flavor = "multi_thread")]
async fn waiters_that_gave_up_or_were_killed_do_not_stall_a_live_one() {
    let env = Env::new("killed").await;
    waiters_that_left_do_not_stall_a_live_one(&env, 5, 3).await;
}
