//! Any client, not only ours: PyMongo (its own handshake, OP_MSG, cursors, pipeline updates,
//! upserts, TTL indexes) against a `TestServer`, through `tests/pymongo_smoke.py`.
//!
//! Skipped (with a printed reason) when `python3 -c "import pymongo"` fails; CI installs
//! pymongo. With `MONGODB_URI` set, the script runs against that deployment instead.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use mongo_testserver::TestServer;
use tokio::process::Command;

async fn pymongo_available() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import pymongo"])
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("python3 cannot be run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`python3 -c \"import pymongo\"` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_smoke() {
    if let Err(reason) = pymongo_available().await {
        println!("pymongo smoke: skipped: {reason} (install it with `pip install pymongo`)");
        return;
    }
    let server;
    let uri = match std::env::var("MONGODB_URI") {
        Ok(uri) => uri,
        Err(_) => {
            server = TestServer::start().await.expect("TestServer::start");
            server.uri().to_string()
        }
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pymongo_smoke.py");
    let child = Command::new("python3")
        .arg(&script)
        .arg(&uri)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), child)
        .await
        .expect("the PyMongo script did not finish within 120 s")
        .expect("python3 could not be run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the PyMongo script failed ({}) against {uri}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}
