//! End-to-end tests of the `mongolock` binary on PostgreSQL (`--uri postgres://...`): a real
//! server started by the tests (or `POSTGRES_URL`), each test with its own lock table.
//!
//! Deadlines are generous and conditions are polled; nothing asserts tight timings.

#[path = "../../mongolock/tests/support/postgres.rs"]
mod pg;

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use tokio::process::Command;

/// One test's server URL, lock table and scratch directory (`$D` for the commands).
struct PgEnv {
    url: String,
    table: String,
    dir: PathBuf,
}

impl PgEnv {
    /// `None` (after printing why) when no PostgreSQL is available: the test skips.
    fn new(test: &str) -> Option<PgEnv> {
        let url = pg::url()?;
        let table = pg::unique_table(test);
        let dir = std::env::temp_dir().join(format!("mongolock-cli-pg-{table}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test directory");
        Some(PgEnv { url, table, dir })
    }
}

impl Cli for PgEnv {
    /// `mongolock --uri postgres://.. --collection <table> ARGS`.
    fn cmd(&self, args: &[&str]) -> Command {
        command(&self.url, &["--collection", &self.table], &self.dir, args)
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PgEnv {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_processes_never_overlap_and_tokens_strictly_increase() {
    let Some(env) = PgEnv::new("exec") else {
        return;
    };
    exec_processes_never_overlap(&env, 4, "job").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_with_min_hold_run_a_cron_job_once() {
    let Some(env) = PgEnv::new("minhold") else {
        return;
    };
    min_hold_runs_a_job_once_per_interval(&env, "nightly-report").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_limit_2_runs_at_most_2_of_3_commands_at_once() {
    let Some(env) = PgEnv::new("limit") else {
        return;
    };
    exec_limit_runs_at_most_n_at_once(&env, 2, "exports").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_readers_overlap_and_a_plain_or_write_exec_never_overlaps_them() {
    let Some(env) = PgEnv::new("shared") else {
        return;
    };
    readers_overlap_and_a_writer_never_overlaps_them(&env, "config", &[]).await;
    let Some(env) = PgEnv::new("write") else {
        return;
    };
    readers_overlap_and_a_writer_never_overlaps_them(&env, "config", &["--write"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_semaphore_shows_its_holders_and_a_limit_mismatch_exits_78() {
    let Some(env) = PgEnv::new("mismatch") else {
        return;
    };
    a_held_semaphore_shows_its_holders_and_refuses_other_limits(&env, "exports").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn list_inspect_and_force_release_work_and_the_holder_learns_of_it() {
    let Some(env) = PgEnv::new("list") else {
        return;
    };
    let script = "trap 'echo term > \"$D/term\"; exit 0' TERM; \
                  echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/a.tmp\"; mv \"$D/a.tmp\" \"$D/a\"; \
                  while [ -d \"$D\" ]; do sleep 0.05; done";
    let holder = env.spawn(&[
        "exec",
        "--ttl",
        "30s",
        "--grace",
        "2s",
        "--app-name",
        "nightly report",
        "reports:daily",
        "--",
        "sh",
        "-c",
        script,
    ]);
    let holder_pid = holder.id().expect("running");
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let token = read_token(&env.path("a"));

    let out = env.run(&["list"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let table = text(&out.stdout);
    let row = table.lines().nth(1).expect("one row");
    assert!(row.starts_with("reports:daily"), "{table}");
    assert!(row.contains(&format!("(pid {holder_pid})")), "{table}");
    assert!(row.contains(&token.to_string()), "{table}");

    let out = env.run(&["inspect", "reports:daily", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let info: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(info["fencing_token"].as_u64(), Some(token), "{info}");
    assert_eq!(info["held"], true, "{info}");
    assert_eq!(info["holder"]["app"], "nightly report", "{info}");

    let out = env.run(&["inspect", "no-such-lock"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));

    // The lease lasts 30 s and is renewed every 10 s: the holder learns of the force-release
    // from the notification, stops its command and exits 76 long before that.
    let forced_at = Instant::now();
    let out = env.run(&["release", "--force", "reports:daily"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("lost the lock \"reports:daily\""),
        "{}",
        describe(&out)
    );
    assert!(env.path("term").exists(), "the command got SIGTERM");
    eprintln!(
        "holder stopped {:?} after the force-release",
        forced_at.elapsed()
    );

    let out = env
        .run(&[
            "exec",
            "--wait",
            "30s",
            "reports:daily",
            "--",
            "sh",
            "-c",
            "echo \"$MONGOLOCK_FENCING_TOKEN\" > \"$D/b\"",
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(read_token(&env.path("b")) > token);
    let out = env.run(&["inspect", "reports:daily", "--json"]).await;
    let info: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(info["state"], "released", "{info}");
}

#[tokio::test(flavor = "multi_thread")]
async fn elect_has_one_leader_at_a_time_and_hands_over() {
    let Some(env) = PgEnv::new("elect") else {
        return;
    };
    let script = "id=$1; echo \"$id $MONGOLOCK_FENCING_TOKEN\" >> \"$D/leaders\"; \
                  trap 'exit 143' TERM; \
                  while [ -d \"$D\" ] && [ ! -f \"$D/stop-$id\" ]; do sleep 0.05; done";
    let mut electors = spawn_electors(&env, script);
    let leaders = env.path("leaders");
    wait_for("a first leader", LONG, || read_lines(&leaders).len() == 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(read_lines(&leaders).len(), 1, "only one leader at a time");
    // The leader's command finishes: its elector exits 0 and the other one takes over.
    for round in 0..2 {
        let lines = read_lines(&leaders);
        let id = lines[round].split(' ').next().expect("id").to_owned();
        stop_elector(&env, &mut electors, &id).await;
        if round == 0 {
            wait_for("the next leader", LONG, || read_lines(&leaders).len() == 2).await;
        }
    }
    let tokens: Vec<u64> = read_lines(&leaders)
        .iter()
        .map(|l| l.split(' ').nth(1).expect("token").parse().expect("number"))
        .collect();
    assert!(tokens[0] < tokens[1], "{tokens:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_postgres_uris_and_unreachable_servers_fail_with_one_clean_line() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    for (uri, expect) in [
        (
            format!("postgres://app:secretpw@127.0.0.1:{port}/db"),
            format!("cannot reach PostgreSQL at postgres://app:****@127.0.0.1:{port}/db"),
        ),
        (
            "postgres://app:secretpw@db1:notaport/db".to_owned(),
            "invalid PostgreSQL URI".to_owned(),
        ),
    ] {
        assert_clean_failure(&uri, &expect).await;
    }
    let Some(env) = PgEnv::new("badtable") else {
        return;
    };
    let out = Command::new(BIN)
        .args(["--uri", &env.url, "--collection", &"x".repeat(60), "list"])
        .env_remove("MONGODB_URI")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("invalid --collection"),
        "{}",
        describe(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_shows_an_acquisition_and_a_release() {
    let Some(env) = PgEnv::new("watch") else {
        return;
    };
    watch_shows_an_acquisition_and_a_release_of(&env, "watched").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_json_events_carry_the_lease_and_server_times() {
    let Some(env) = PgEnv::new("json") else {
        return;
    };
    let out = env
        .run(&["exec", "--json", "pgjson", "--", "sh", "-c", "exit 3"])
        .await;
    let context = describe(&out);
    assert_eq!(out.status.code(), Some(3), "{context}");
    let events: Vec<Value> = text(&out.stderr)
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{context}"))
        })
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        kinds,
        ["waiting", "acquired", "started", "exited", "released", "exit"],
        "{context}"
    );
    let token = events[1]["fencing_token"].as_u64().expect("a token");
    for e in &events[1..5] {
        assert_eq!(e["name"], "pgjson", "{e}");
        assert_eq!(e["fencing_token"].as_u64(), Some(token), "{e}");
        assert!(e["lease_id"].is_string(), "{e}");
        let acquired = humantime::parse_rfc3339(e["acquired_at"].as_str().expect("acquired_at"));
        let expires = humantime::parse_rfc3339(e["expires_at"].as_str().expect("expires_at"));
        assert!(
            acquired.expect("RFC 3339") < expires.expect("RFC 3339"),
            "{e}"
        );
    }
    assert_eq!(events[3]["exit_code"], 3, "{context}");
    assert_eq!(events[5]["exit_code"], 3, "{context}");
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_three_waiting_processes_with_host_pid_app_and_until() {
    let Some(env) = PgEnv::new("waiters") else {
        return;
    };
    common::operator::inspect_shows_the_processes_waiting(&env, "queued").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_a_semaphore_limit_and_holders_and_a_token_ends_one_slot() {
    let Some(env) = PgEnv::new("semlimit") else {
        return;
    };
    common::operator::inspect_shows_a_semaphore_and_a_token_ends_one_slot(&env, "exports").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn release_force_token_ends_only_the_lease_with_that_token() {
    let Some(env) = PgEnv::new("token") else {
        return;
    };
    common::operator::release_force_token_ends_only_that_lease(&env, "nightly").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn list_and_watch_filter_by_held_and_a_literal_prefix() {
    let Some(env) = PgEnv::new("filter") else {
        return;
    };
    common::operator::list_and_watch_filter_by_state_and_prefix(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_uri_comes_from_mongolock_uri_then_mongodb_uri() {
    let Some(env) = PgEnv::new("urivars") else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let nowhere = format!("postgres://app@127.0.0.1:{port}/db?connect_timeout=2");
    let (url, table) = (env.url.clone(), env.table.clone());
    common::operator::the_uri_comes_from_mongolock_uri_then_mongodb_uri(
        &env,
        &url,
        &["--collection", &table],
        &nowhere,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_sets_in_opposite_orders_never_deadlock_or_overlap() {
    let Some(env) = PgEnv::new("sets") else {
        return;
    };
    exec_sets_never_deadlock_or_overlap(&env, 12).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_exec_set_exits_75_and_holds_nothing() {
    let Some(env) = PgEnv::new("settimeout") else {
        return;
    };
    a_timed_out_exec_set_leaves_nothing_held(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn losing_any_lease_of_a_set_stops_the_command_with_76() {
    let Some(env) = PgEnv::new("setloss") else {
        return;
    };
    exec_set_stops_the_command_when_any_lease_is_lost(&env).await;
}

/// Which of the schema, the table and its fencing-token sequence exist.
async fn pg_objects(url: &str, schema: &str, table: &str) -> [bool; 3] {
    let admin = pg::admin(url).await;
    let row = admin
        .query_one(
            "SELECT to_regnamespace(quote_ident($1)) IS NOT NULL,
                    to_regclass(quote_ident($1) || '.' || quote_ident($2)) IS NOT NULL,
                    to_regclass(quote_ident($1) || '.' || quote_ident($2 || '_fencing_token'))
                      IS NOT NULL",
            &[&schema, &table],
        )
        .await
        .unwrap();
    [row.get(0), row.get(1), row.get(2)]
}

/// Read commands never create anything (issue 32 §4: `--collection bad.schema.name list`
/// printed "no locks" and created schema `bad`, table `"schema.name"`, a sequence and a
/// trigger; `--collection 'weird"name' list` created a table): on a missing schema or table
/// `list`, `inspect` and `watch` exit 66 saying the table does not exist and how it is
/// created, and nothing is created. After an `exec` created it, they work.
#[tokio::test(flavor = "multi_thread")]
async fn read_commands_on_a_missing_table_exit_66_and_create_nothing() {
    let Some(env) = PgEnv::new("missing") else {
        return;
    };
    let schema = pg::unique_table("bad");
    let weird = pg::unique_table("weird\"name");
    for (collection, schema, table) in [
        (
            format!("{schema}.schema.name"),
            schema.as_str(),
            "schema.name",
        ),
        (weird.clone(), "public", weird.as_str()),
    ] {
        let run = |args: &[&str]| {
            let mut all = vec![];
            all.extend_from_slice(args);
            let cmd = command(&env.url, &["--collection", &collection], &env.dir, &all);
            async move {
                let mut cmd = cmd;
                finish(cmd.spawn().expect("spawn mongolock"), LONG).await
            }
        };
        for args in [
            &["list"][..],
            &["list", "--json"],
            &["inspect", "nightly"],
            &["watch", "--once"],
            &["watch", "--count", "3", "--interval", "1s"],
        ] {
            let out = run(args).await;
            assert_eq!(out.status.code(), Some(66), "{args:?}: {}", describe(&out));
            let stderr = text(&out.stderr);
            assert!(
                stderr.contains("does not exist") && stderr.contains("exec"),
                "{args:?}: {}",
                describe(&out)
            );
            assert!(
                !text(&out.stdout).contains("no locks"),
                "{}",
                describe(&out)
            );
        }
        assert_eq!(
            pg_objects(&env.url, schema, table).await,
            [schema == "public", false, false],
            "{collection}: a read command created something (schema, table, sequence)"
        );
        let out = run(&["exec", "nightly", "--", "true"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let out = run(&["list"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(text(&out.stdout).contains("nightly"), "{}", describe(&out));
    }
    pg::admin(&env.url)
        .await
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

/// Read commands on an application's table with the lock table's name exit 77, like writes.
#[tokio::test(flavor = "multi_thread")]
async fn read_commands_refuse_an_application_table_with_status_77() {
    let Some(env) = PgEnv::new("orders") else {
        return;
    };
    pg::admin(&env.url)
        .await
        .batch_execute(&format!(
            "CREATE TABLE \"{t}\" (name text PRIMARY KEY, customer text);
             INSERT INTO \"{t}\" VALUES ('nightly', 'alice');",
            t = env.table
        ))
        .await
        .unwrap();
    for args in [
        &["list"][..],
        &["inspect", "nightly"],
        &["watch", "--once"],
        &["watch", "--count", "3", "--interval", "1s"],
    ] {
        let out = env.run(args).await;
        assert_eq!(out.status.code(), Some(77), "{args:?}: {}", describe(&out));
    }
}

/// Waiters that gave up or were SIGKILLed while queued do not hold up a live one.
#[tokio::test(flavor = "multi_thread")]
async fn waiters_that_gave_up_or_were_killed_do_not_stall_a_live_one() {
    let Some(env) = PgEnv::new("left") else {
        return;
    };
    waiters_that_left_do_not_stall_a_live_one(&env, 5, 3).await;
}
