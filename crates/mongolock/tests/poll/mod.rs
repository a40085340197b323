//! Waiting for a condition in tests: poll it with a generous deadline instead of asserting on
//! wall-clock timing (the machines running tests are shared and noisy).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Polls `f` every 20 ms until it returns true (→ `true`) or `within` passed (→ `false`).
pub async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
