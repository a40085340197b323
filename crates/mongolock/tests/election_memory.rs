//! Leader-election scenarios against the in-memory backend.

mod election_scenarios;
mod poll;

use std::sync::Arc;

use election_scenarios::{provider_over, Env, MakeProvider};
use mongolock::{LockBackend, MemoryBackend};

async fn setup() -> Env {
    let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    let make_provider: MakeProvider = Arc::new(move || {
        let backend = backend.clone();
        Box::pin(async move { provider_over(backend) })
    });
    Env {
        make_provider,
        count_tasks: true,
        keep_alive: Box::new(()),
    }
}

election_suite!(setup);
