//! The contract suite against the in-memory backend.

use std::sync::Arc;

use mongolock::testing::Env;
use mongolock::MemoryBackend;

async fn setup() -> Env {
    Env::new(Arc::new(MemoryBackend::new())).with_notifications()
}

mongolock::contract_suite!(setup);
