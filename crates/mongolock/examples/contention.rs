//! Workers contending for one lock, on an embedded MongoDB-compatible test server.
//!
//! ```text
//! cargo run --example contention
//! MONGODB_URI=mongodb://localhost:27017 cargo run --example contention   # a real deployment
//! ```

use std::sync::Arc;
use std::time::Duration;

use mongo_testserver::TestServer;
use mongolock::{LockProvider, MongoBackend, WaitStrategy};
use tokio::time::Instant;

const WORKERS: usize = 4;
const ROUNDS: usize = 3;
const LOCK: &str = "reports:daily";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, uri) = match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => (None, uri),
        _ => {
            let server = TestServer::start().await?;
            let uri = server.uri();
            println!("started the embedded mongo-testserver at {uri}");
            (Some(server), uri)
        }
    };
    let client = mongodb::Client::with_uri_str(&uri).await?;
    let db = client.database("mongolock_contention_example");
    let backend = MongoBackend::builder(&db)
        .collection("distributed.locks")
        .build()?;
    let provider = LockProvider::builder(backend)
        .expiry(Duration::from_secs(5))
        .wait_strategy(WaitStrategy::random_sleep(
            Duration::from_millis(10),
            Duration::from_millis(100),
        ))
        .app_name("contention-example")
        .build()?;
    println!(
        "{WORKERS} workers take lock {LOCK:?} {ROUNDS} times each (lease {:?}, extended every {:?})\n",
        provider.options().expiry(),
        provider.options().extension_cadence()
    );

    let start = Arc::new(Instant::now());
    let mut workers = Vec::new();
    for id in 1..=WORKERS {
        let lock = provider.lock(LOCK)?;
        let start = start.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let asked = Instant::now();
                let guard = lock.acquire().await?;
                println!(
                    "[{:>6.3}s] worker {id} acquired  token {:>12}  (waited {:>4} ms)",
                    start.elapsed().as_secs_f64(),
                    guard.fencing_token(),
                    asked.elapsed().as_millis()
                );
                // The protected work; a real worker would pass the fencing token along with
                // every write and stop if `guard.lost()` fires.
                tokio::time::sleep(Duration::from_millis(150)).await;
                println!(
                    "[{:>6.3}s] worker {id} releases token {:>12}",
                    start.elapsed().as_secs_f64(),
                    guard.fencing_token()
                );
                guard.release().await?;
                // Other work between rounds gives the waiters their turn.
                tokio::time::sleep(Duration::from_millis(120)).await;
            }
            Ok::<_, mongolock::Error>(())
        }));
    }

    // Meanwhile, a one-shot attempt (`try_acquire`) that does not wait, with its own lease
    // duration.
    tokio::time::sleep(Duration::from_millis(50)).await;
    match provider
        .lock(LOCK)?
        .with_expiry(Duration::from_secs(5))?
        .try_acquire()
        .await?
    {
        Some(guard) => guard.release().await?,
        None => println!(
            "[{:>6.3}s] a one-shot try_acquire found the lock busy and returned None",
            start.elapsed().as_secs_f64()
        ),
    }
    if let Some(info) = provider.inspect(LOCK).await? {
        if let Some(holder) = &info.holder {
            println!(
                "[{:>6.3}s] inspect: held={} by {holder}, token {}",
                start.elapsed().as_secs_f64(),
                info.held,
                info.fencing_token.map_or("-".to_owned(), |t| t.to_string())
            );
        }
    }

    for worker in workers {
        worker.await??;
    }

    println!("\nlocks in the collection:");
    for info in provider.list().await? {
        let ago = info
            .expires_at
            .and_then(|e| info.observed_at.duration_since(e).ok())
            .unwrap_or_default();
        println!(
            "  {:<16} held={:<5} last token {:>12}  last holder {}  (lease ended {:?} ago)",
            info.name,
            info.held,
            info.fencing_token.map_or("-".to_owned(), |t| t.to_string()),
            info.holder.map(|h| h.to_string()).unwrap_or_default(),
            ago
        );
    }
    println!(
        "\nFencing tokens only grow. The first lock document of a collection starts at 1, each \
         later one at (epoch - 1) * 2^20 + 1, so tokens keep growing even after the TTL index \
         removed an unused document."
    );
    Ok(())
}
