//! End-to-end tests of `mongolock watch` on the real binary against a test server (or
//! `MONGODB_URI`). Deadlines are generous and conditions are polled.

mod common;

use common::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread")]
async fn watch_once_prints_the_locks_once_as_plain_text() {
    let env = Env::new("watchonce").await;
    let out = env.run(&["watch", "--once"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let shown = text(&out.stdout);
    assert_eq!(blocks(&shown).len(), 1, "{shown}");
    assert!(shown.contains("no locks"), "{shown}");

    let holder = env.spawn(&["exec", "seen", "--", "sh", "-c", &hold_until("a", "stop")]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let token = read_token(&env.path("a"));
    let out = env.run(&["watch", "--once"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let shown = text(&out.stdout);
    assert!(
        !shown.contains('\x1b'),
        "no terminal codes outside a terminal: {shown:?}"
    );
    let all = blocks(&shown);
    assert_eq!(all.len(), 1, "{shown}");
    assert!(all[0].contains("1 lock, 1 held"), "{shown}");
    let seen = row(&all[0], "seen").unwrap_or_else(|| panic!("no row for the lock:\n{shown}"));
    assert!(seen.contains(&token.to_string()), "{shown}");
    assert!(seen.contains(" in "), "expires in ...: {shown}");

    let out = env.run(&["watch", "--once", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{}", describe(&out));
    let refresh: Value = serde_json::from_str(lines[0]).expect("a JSON line");
    assert_eq!(refresh["locks"][0]["name"], "seen", "{refresh}");
    assert_eq!(
        refresh["locks"][0]["fencing_token"].as_u64(),
        Some(token),
        "{refresh}"
    );

    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_count_exits_after_that_many_refreshes() {
    let env = Env::new("watchcount").await;
    let out = env
        .run(&["watch", "--count", "3", "--interval", "200ms"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(blocks(&text(&out.stdout)).len(), 3, "{}", describe(&out));
    let out = env
        .run(&["watch", "--count", "2", "--json", "--interval", "200ms"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 2, "{}", describe(&out));
    for line in stdout.lines() {
        let v: Value = serde_json::from_str(line).expect("JSON lines");
        assert!(v["locks"].is_array(), "{v}");
    }
    let out = env.run(&["watch", "--once", "--count", "2"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_shows_an_acquisition_and_a_release() {
    let env = Env::new("watchlive").await;
    watch_shows_an_acquisition_and_a_release_of(&env, "watched").await;
}
