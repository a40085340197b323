//! End-to-end tests of `mongolock watch` on the real binary against a test server (or
//! `MONGODB_URI`). Deadlines are generous and conditions are polled.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use tokio::io::AsyncReadExt;

/// The refresh blocks in watch's plain-text output (each starts with its header line).
fn blocks(output: &str) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    for line in output.lines() {
        if line.starts_with("mongolock watch: ") {
            blocks.push(String::new());
        }
        if let Some(block) = blocks.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
}

/// The table row of lock `name` in `block`.
fn row<'a>(block: &'a str, name: &str) -> Option<&'a str> {
    block
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
}

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
    // A long interval: the acquisition of a new name shows at the latest at the next interval,
    // its release through the change notification (or the interval where there is none).
    let mut watch = env.spawn(&["watch", "--interval", "1s"]);
    let mut stdout = watch.stdout.take().expect("piped stdout");
    let seen = Arc::new(Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            loop {
                match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen
                        .lock()
                        .expect("buffer")
                        .push_str(&String::from_utf8_lossy(&buf[..n])),
                }
            }
        })
    };
    let shown = || seen.lock().expect("buffer").clone();
    wait_for("the first refresh", LONG, || !blocks(&shown()).is_empty()).await;

    let holder = env.spawn(&[
        "exec",
        "watched",
        "--",
        "sh",
        "-c",
        &hold_until("a", "stop"),
    ]);
    wait_for("the holder to start", LONG, || env.path("a").exists()).await;
    let token = read_token(&env.path("a"));
    let deadline = Instant::now() + LONG;
    let held_block = loop {
        let all = blocks(&shown());
        if let Some(i) = all.iter().position(|b| {
            row(b, "watched").is_some_and(|r| r.contains(&token.to_string()) && r.contains(" in "))
        }) {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "watch never showed the acquisition:\n{}",
            shown()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    std::fs::write(env.path("stop"), "").expect("stop file");
    let out = finish(holder, LONG).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    wait_for("watch to show the release", LONG, || {
        blocks(&shown())
            .iter()
            .skip(held_block + 1)
            .any(|b| row(b, "watched").is_some_and(|r| r.ends_with("released")))
    })
    .await;
    assert!(
        !shown().contains('\x1b'),
        "no terminal codes outside a terminal"
    );

    watch.start_kill().expect("stop watch");
    let _ = watch.wait().await;
    let _ = reader.await;
}
