//! End-to-end tests of `exec` with several names (`mongolock exec a b -- CMD`) on the real
//! binary against a test server (or `MONGODB_URI`); `postgres.rs` runs the same scenarios on
//! PostgreSQL.
//!
//! Deadlines are generous and conditions are polled; nothing asserts tight timings.

mod common;

use common::*;
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread")]
async fn exec_sets_in_opposite_orders_never_deadlock_or_overlap() {
    let env = Env::new("sets").await;
    exec_sets_never_deadlock_or_overlap(&env, 16).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_exec_set_exits_75_and_holds_nothing() {
    let env = Env::new("settimeout").await;
    a_timed_out_exec_set_leaves_nothing_held(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn losing_any_lease_of_a_set_stops_the_command_with_76() {
    let env = Env::new("setloss").await;
    exec_set_stops_the_command_when_any_lease_is_lost(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn several_names_with_a_mode_or_a_blank_are_usage_errors() {
    for (args, expect) in [
        (&["--limit", "2", "a", "b"][..], "--limit takes one NAME"),
        (&["--shared", "a", "b"], "--shared takes one NAME"),
        (&["--write", "b", "a"], "--write takes one NAME"),
        (&["a", "my lock"], "contains whitespace"),
    ] {
        let mut all = vec!["exec"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "true"]);
        let out = Command::new(BIN)
            .args(&all)
            .env_remove("MONGODB_URI")
            .output()
            .await
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{all:?}: {}", describe(&out));
        assert!(
            text(&out.stderr).contains(expect),
            "{all:?}: expected {expect:?}: {}",
            describe(&out)
        );
    }
}

/// One name written twice is one name (MONGOLOCK_NAME set as for one lock); the form without
/// `--` still runs the words after the one NAME as the command.
#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_name_is_one_lock_and_the_form_without_dashes_still_works() {
    let env = Env::new("setdup").await;
    let out = env
        .run(&[
            "exec",
            "job",
            "job",
            "--",
            "sh",
            "-c",
            "echo \"$MONGOLOCK_NAME $MONGOLOCK_NAMES\" > \"$D/env\"",
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(read_lines(&env.path("env")), ["job job"]);
    let out = env.run(&["exec", "job", "false"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
}

/// `exec --help` shows the several-names form, the variables CMD gets and an example.
#[tokio::test(flavor = "multi_thread")]
async fn exec_help_documents_several_names() {
    let out = Command::new(BIN)
        .args(["exec", "--help"])
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let help = text(&out.stdout);
    for word in [
        "<NAME> [NAME]... -- <CMD>",
        "MONGOLOCK_NAMES",
        "MONGOLOCK_FENCING_TOKENS",
        "never deadlock",
        "mongolock exec account:1 account:2 --",
    ] {
        assert!(help.contains(word), "exec --help lacks {word:?}:\n{help}");
    }
}
