//! End-to-end tests of the operator's view on MongoDB, through the real binary against a test
//! server (or the deployment in `MONGODB_URI`, each test in its own database): who waits in
//! `inspect`, a semaphore's limit and holders, `list`/`watch --held --prefix`,
//! `release --force --token`, `MONGOLOCK_URI`. The same scenarios run on PostgreSQL in
//! `postgres.rs`. Deadlines are generous and conditions are polled.

mod common;

use common::operator::*;
use common::*;

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_three_waiting_processes_with_host_pid_app_and_until() {
    let env = Env::new("waiters").await;
    inspect_shows_the_processes_waiting(&env, "queued").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_a_semaphore_limit_and_holders_and_a_token_ends_one_slot() {
    let env = Env::new("semlimit").await;
    inspect_shows_a_semaphore_and_a_token_ends_one_slot(&env, "exports").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn release_force_token_ends_only_the_lease_with_that_token() {
    let env = Env::new("token").await;
    release_force_token_ends_only_that_lease(&env, "nightly").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn list_and_watch_filter_by_held_and_a_literal_prefix() {
    let env = Env::new("filter").await;
    list_and_watch_filter_by_state_and_prefix(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_uri_comes_from_mongolock_uri_then_mongodb_uri() {
    let env = Env::new("urivars").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let nowhere = format!("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=500");
    let uri = env.uri.clone();
    let db = env.db.clone();
    common::operator::the_uri_comes_from_mongolock_uri_then_mongodb_uri(
        &env,
        &uri,
        &["--db", &db],
        &nowhere,
    )
    .await;

    // The help names the variables and both databases.
    let out = env.run(&["--help"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let help = text(&out.stdout);
    for word in [
        "MONGOLOCK_URI",
        "MONGODB_URI",
        "MongoDB or PostgreSQL",
        "79",
    ] {
        assert!(help.contains(word), "--help lacks {word}:\n{help}");
    }
}
