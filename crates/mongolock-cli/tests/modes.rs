//! End-to-end tests of `exec --limit N` (a semaphore slot), `exec --shared` (a reader) and
//! `exec --write` (a writer) on the real binary against a test server (or `MONGODB_URI`).
//! `postgres.rs` runs the same scenarios on PostgreSQL.
//!
//! Deadlines are generous and conditions are polled; nothing asserts tight timings.

mod common;

use common::*;
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread")]
async fn exec_limit_3_runs_at_most_3_of_4_commands_at_once() {
    let env = Env::new("limit").await;
    exec_limit_runs_at_most_n_at_once(&env, 3, "exports").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_readers_overlap_and_a_plain_exec_never_overlaps_them() {
    let env = Env::new("shared").await;
    readers_overlap_and_a_writer_never_overlaps_them(&env, "config", &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_write_exec_turns_new_readers_away() {
    let env = Env::new("write").await;
    readers_overlap_and_a_writer_never_overlaps_them(&env, "config", &["--write"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_semaphore_shows_its_holders_and_a_limit_mismatch_exits_78() {
    let env = Env::new("mismatch").await;
    a_held_semaphore_shows_its_holders_and_refuses_other_limits(&env, "exports").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn limit_0_and_conflicting_modes_are_usage_errors() {
    for (args, expect) in [
        (&["--limit", "0"][..], "at least 1 slot"),
        (&["--shared", "--limit", "2"], "cannot be used with"),
        (&["--write", "--shared"], "cannot be used with"),
        (&["--limit", "many"], "not a number of slots"),
    ] {
        let mut all = vec!["exec"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["job", "--", "true"]);
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
