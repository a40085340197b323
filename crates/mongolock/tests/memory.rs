//! The contract suite against the in-memory backend.

mod contract;
mod poll;

use std::sync::Arc;

use contract::Env;
use mongolock::MemoryBackend;

async fn setup() -> Env {
    Env {
        backend: Arc::new(MemoryBackend::new()),
        keep_alive: Box::new(()),
    }
}

contract_suite!(setup);
