//! The `mongolock.lease` span: opened at the grant with the lock name and fencing token, kept
//! open while the lease is held, closed on release, on drop and on loss (even while the lost
//! guard is still alive). One test, in a binary of its own: it installs the process-wide
//! (global) tracing subscriber.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongolock::LockProvider;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Clone, Debug, Default)]
struct LeaseSpan {
    id: u64,
    lock: String,
    token: u64,
    closed: bool,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<LeaseSpan>>>);

impl Recorder {
    fn find(&self, lock: &str) -> Option<LeaseSpan> {
        let spans = self.0.lock().unwrap();
        spans.iter().find(|s| s.lock == lock).cloned()
    }
}

#[derive(Default)]
struct Fields {
    lock: String,
    token: u64,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "token" {
            self.token = value;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "lock" {
            self.lock = format!("{value:?}");
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        if attrs.metadata().name() != "mongolock.lease" {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        self.0.lock().unwrap().push(LeaseSpan {
            id: id.into_u64(),
            lock: fields.lock,
            token: fields.token,
            closed: false,
        });
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        for span in self.0.lock().unwrap().iter_mut() {
            if span.id == id.into_u64() {
                span.closed = true;
            }
        }
    }
}

async fn closed(recorder: &Recorder, lock: &str) -> bool {
    mongolock::testing::eventually(Duration::from_secs(5), || {
        let closed = recorder.find(lock).is_some_and(|s| s.closed);
        async move { closed }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_span_covers_the_lease_from_grant_to_release_or_loss() {
    let recorder = Recorder::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(recorder.clone()))
        .expect("no other global subscriber");
    let provider = LockProvider::memory();

    // Held: open, with the name and token; released: closed.
    let guard = provider
        .lock("spans:released")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let span = recorder.find("spans:released").expect("a lease span");
    assert_eq!(span.token, guard.fencing_token());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!recorder.find("spans:released").unwrap().closed);
    guard.release().await.unwrap();
    assert!(closed(&recorder, "spans:released").await);

    // Dropped: closed once the background release is done.
    let guard = provider
        .lock("spans:dropped")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    drop(guard);
    assert!(closed(&recorder, "spans:dropped").await);

    // Lost: closed although the guard is still alive.
    let guard = provider
        .lock("spans:lost")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(provider.force_release("spans:lost").await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    assert!(closed(&recorder, "spans:lost").await);
    assert!(guard.is_lost());
    drop(guard);
}
