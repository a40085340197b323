//! The `mongo-testserver` binary: announces its address, serves, exits on SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bson::doc;
use mongodb::Client;

#[tokio::test]
async fn binary_starts_prints_listening_and_exits_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mongo-testserver"))
        .args(["--port", "0", "--ttl-monitor-secs", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the binary");
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(line.contains("listening on "), "{line}");
    let addr = line.trim().rsplit(' ').next().unwrap().to_owned();
    let c = Client::with_uri_str(format!("mongodb://{addr}/?directConnection=true"))
        .await
        .unwrap();
    c.database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || {
        for _ in 0..100 {
            if let Some(s) = child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        None
    })
    .await
    .unwrap();
    let exit = exit.expect("the binary exits after SIGTERM");
    assert!(exit.success(), "{exit:?}");
}
