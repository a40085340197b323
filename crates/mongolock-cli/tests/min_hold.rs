//! End-to-end tests of `exec --min-hold` (issue #22, item 1) on the real binary against a test
//! server (or `MONGODB_URI`); `postgres.rs` runs the scenario on PostgreSQL.
//!
//! Deadlines are generous and conditions are polled; nothing asserts tight timings.

mod common;

use common::*;
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_with_min_hold_run_a_cron_job_once() {
    let env = Env::new("minhold").await;
    min_hold_runs_a_job_once_per_interval(&env, "nightly-report").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn min_hold_is_documented_and_refused_with_limit_or_shared() {
    let help = Command::new(BIN)
        .args(["exec", "--help"])
        .output()
        .await
        .expect("run");
    let help = text(&help.stdout);
    assert!(
        help.contains("--min-hold <DURATION>") && help.contains("MONGOLOCK_MIN_HOLD"),
        "{help}"
    );
    let man = Command::new(BIN)
        .args(["man", "exec"])
        .output()
        .await
        .expect("run");
    let man = text(&man.stdout);
    assert!(
        man.contains("min\\-hold") && man.contains("MONGOLOCK_MIN_HOLD"),
        "{man}"
    );
    for (args, expect) in [
        (
            &["--min-hold", "5s", "--limit", "2"][..],
            "cannot be used with",
        ),
        (&["--min-hold", "5s", "--shared"], "cannot be used with"),
        (&["--min-hold", "soon"], "soon"),
        (&["--min-hold", "400d"], "above the maximum"),
    ] {
        let mut all = vec!["exec"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["job", "--", "true"]);
        let out = Command::new(BIN)
            .args(&all)
            .env_remove("MONGODB_URI")
            .env_remove("MONGOLOCK_MIN_HOLD")
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
