//! The short torture runs CI does: a few worker processes for a few seconds with a few faults of
//! every kind, on MongoDB (the embedded server), PostgreSQL (a cluster the run starts) and the
//! memory backend. Each asserts zero violations *and* that every fault kind actually happened
//! (so that a run that injected nothing cannot pass); a kind may be missing only when the
//! summary says why it was skipped (`partition` / `netem` where network namespaces cannot be
//! made: not root, no `ip` / `tc`). The checker's ability to detect violations
//! is tested by its unit tests (planted overlaps, repeated tokens, stale writes, writes after
//! loss, slots over the limit) and, for the PostgreSQL history, by `tests/postgres_history.rs`
//! (planted overlap, repeated token, stale write, slot over the limit, repeated slot token).
//!
//! The liveness check runs in them too (zero `liveness` violations, stretches measured, and
//! waiters that gave up, were dropped, killed, stopped or exited), with a bound loose enough for
//! a loaded 2-core machine and for PostgreSQL's table-lock stalls behind the idle-row cleanup
//! (up to about 2 s, see docs/reliability.md, 2026-11-29) (`--liveness-slack 4s`: 4.5 s after a
//! release, where the run's own default is 1.5 s) and liveness leases of 8 s, so that a waiter
//! left to sleep until the holder's expiry (issue 32) would still stand out; rounds of 1 s on one name (4 s on two in
//! the run's default) give a 20-second run of three workers enough waits in one queue. Its detection is tested by the liveness
//! checker's unit tests (`src/liveness.rs`: a planted stall behind dead waiters, a waiter that
//! gave up on a free name).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn run(args: &[&str], summary: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_mongolock-torture"))
        .args(args)
        .arg("--summary-json")
        .arg(summary)
        .output()
        .expect("run mongolock-torture");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    let text = std::fs::read_to_string(summary).expect("summary written");
    let json: Value = serde_json::from_str(&text).expect("summary is JSON");
    assert_eq!(
        json["violations_total"], 0,
        "violations: {:#}",
        json["first_violations"]
    );
    assert!(out.status.success(), "exit status {:?}", out.status);
    json
}

/// Whether `partition` / `netem` must run here: as root with `ip` and `tc` installed and
/// network namespaces permitted (CI).
fn netns_expected() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let has = |p: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !(root && has("ip") && has("tc")) {
        return false;
    }
    let probe = format!("torture-probe-{}", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &probe])
        .output()
        .is_ok_and(|o| o.status.success());
    if made {
        let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    }
    made
}

/// Whether the workspace binary `name` was built next to this package's binary.
fn built(name: &str) -> bool {
    Path::new(env!("CARGO_BIN_EXE_mongolock-torture"))
        .parent()
        .is_some_and(|d| d.join(name).is_file())
}

fn count(json: &Value, section: &str, key: &str) -> u64 {
    json[section][key].as_u64().unwrap_or(0)
}

/// A 20-second run with worker processes on `backend`: zero violations, at least 200
/// acquisitions, every kind in `kinds` injected and fired, futures dropped, documents (rows)
/// deleted by TTL (cleanup), a lease left to run out and a worker restarted.
fn short_process_run(backend: &str, fault_interval: &str, extra: &[&str], kinds: &[&str]) -> Value {
    let dir = std::env::temp_dir().join(format!("torture-test-{backend}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let summary = dir.join("summary.json");
    let mut args = vec![
        "--live-lease",
        "8s",
        "--liveness-slack",
        "4s",
        "--live-round",
        "1s",
        "--live-names",
        "1",
        "--backend",
        backend,
        "--workers",
        "3",
        "--tasks",
        "3",
        "--duration",
        "20s",
        "--seed",
        "7",
        "--fault-interval",
        fault_interval,
        "--cold-names",
        "100",
        "--run-dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let json = run(&args, &summary);
    assert!(json["acquisitions"].as_u64().unwrap() >= 200, "{json:#}");
    for kind in kinds {
        if let Some(why) = json["faults_skipped"][kind].as_str() {
            // Only where the kind cannot run: the network's kinds without namespaces (not
            // root, no `ip` / `tc`, no permission) or without `mongo-testserver`, the CLI's
            // kinds without `mongolock` (built by `cargo test --workspace`, not by
            // `cargo test -p mongolock-torture` alone).
            let allowed = match *kind {
                "partition" | "netem" => !netns_expected() || !built("mongo-testserver"),
                "exec_group_stop" | "exec_setsid" | "exec_sigint" => !built("mongolock"),
                _ => false,
            };
            assert!(allowed, "{kind} skipped ({why}): {json:#}");
            eprintln!("{kind} skipped: {why}");
            continue;
        }
        assert!(
            count(&json, "faults", kind) >= 1,
            "no {kind} injected: {json:#}"
        );
        assert!(
            count(&json, "faults_fired", kind) >= 1,
            "no {kind} fired: {json:#}"
        );
    }
    for kind in ["dropped_acquire", "dropped_release"] {
        assert!(count(&json, "faults", kind) >= 1, "no {kind}: {json:#}");
    }
    // The liveness check measured stretches, and waiters left the queues in every way: timed
    // out and dropped while the name was held, killed, stopped and exited while waiting.
    let liveness = &json["liveness"];
    assert_eq!(liveness["enforced"], true, "{json:#}");
    assert!(liveness["waits"].as_u64().unwrap() >= 20, "{json:#}");
    let measured: u64 = liveness["stretches"]
        .as_object()
        .unwrap()
        .values()
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    assert!(measured >= 10, "{json:#}");
    for kind in [
        "waiter_timeout",
        "waiter_dropped",
        "waiter_sigkill",
        "waiter_sigstop",
        "waiter_exit",
    ] {
        assert!(count(&json, "faults", kind) >= 1, "no {kind}: {json:#}");
        assert!(
            count(&json, "faults_fired", kind) >= 1,
            "no {kind} took effect: {json:#}"
        );
    }
    assert!(
        json["ttl_deletes"].as_u64().unwrap() >= 1,
        "no TTL deletion (cleanup): {json:#}"
    );
    assert!(
        json["ran_out"].as_u64().unwrap() >= 1,
        "no lease ran out: {json:#}"
    );
    assert!(
        json["restarts"].as_u64().unwrap() >= 1,
        "no worker restarted: {json:#}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    json
}

#[test]
fn short_mongo_run_with_every_fault_kind_has_no_violation() {
    // `partition` / `netem` run the server in a network namespace (as root; the summary
    // says why they were skipped otherwise); the `exec_*` kinds need the `mongolock` binary
    // (built by `cargo test --workspace`).
    let json = short_process_run(
        "mongo",
        "120ms",
        &["--cli-faults"],
        &[
            "transient_error",
            "duplicate_key",
            "write_conflict",
            "shutdown",
            "close_connection",
            "block_connection",
            "sigkill",
            "sigstop",
            "short_extension",
            "ttl_index_zero",
            "exec_group_stop",
            "exec_setsid",
            "partition",
            "netem",
            "waiter_exit",
            "exec_sigint",
        ],
    );
    // Semaphore slots were recorded, released and left to expire, and some names had more
    // than one live slot at once.
    let slots = &json["slots"];
    assert!(slots["granted"].as_u64().unwrap() >= 20, "{json:#}");
    assert!(slots["released"].as_u64().unwrap() >= 1, "{json:#}");
    assert!(slots["expired"].as_u64().unwrap() >= 1, "{json:#}");
    assert!(slots["max_live"].as_u64().unwrap() >= 2, "{json:#}");
}

#[test]
fn short_memory_run_has_no_violation() {
    let dir = std::env::temp_dir().join(format!("torture-test-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let summary = dir.join("summary.json");
    let json = run(
        &[
            "--backend",
            "memory",
            "--workers",
            "4",
            "--duration",
            "5s",
            "--seed",
            "7",
            "--run-dir",
            dir.to_str().unwrap(),
        ],
        &summary,
    );
    assert!(json["acquisitions"].as_u64().unwrap() >= 100, "{json:#}");
    assert!(count(&json, "faults", "dropped_acquire") >= 1, "{json:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn short_postgres_run_with_every_fault_kind_has_no_violation() {
    let external = std::env::var("POSTGRES_URL").is_ok_and(|u| !u.is_empty());
    if !external && mongolock::testing::postgres_server::bin_dir().is_none() {
        eprintln!(
            "skipped: {}",
            mongolock::testing::postgres_server::NO_BINARIES
        );
        return;
    }
    // The CLI faults run `mongolock --uri postgres://... exec` (when the binary was built).
    let json = short_process_run(
        "postgres",
        "150ms",
        &["--cli-faults"],
        &[
            "sigkill",
            "sigstop",
            "terminate_listener",
            "terminate_connection",
            "short_extension",
            "exec_group_stop",
            "exec_setsid",
            "waiter_exit",
            "exec_sigint",
        ],
    );
    // Semaphore slots were recorded from the history trigger's rows (zero violations were
    // checked by the run), released and left to expire, and some names had more than one
    // live slot at once.
    let slots = &json["slots"];
    assert!(slots["granted"].as_u64().unwrap() >= 20, "{json:#}");
    assert!(slots["released"].as_u64().unwrap() >= 1, "{json:#}");
    assert!(slots["expired"].as_u64().unwrap() >= 1, "{json:#}");
    assert!(slots["max_live"].as_u64().unwrap() >= 2, "{json:#}");
}

#[test]
fn fault_kinds_of_another_backend_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_mongolock-torture"))
        .args([
            "--backend",
            "postgres",
            "--faults",
            "sigkill,block_connection",
        ])
        .output()
        .expect("run mongolock-torture");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("\"block_connection\" does not apply to the postgres backend")
            && stderr.contains("terminate_listener"),
        "{stderr}"
    );
}
