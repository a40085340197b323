//! What a worker needs to know, passed from the orchestrator to each worker process as JSON in
//! the environment variable [`WORKER_CONFIG_ENV`], and the names it locks.

use std::path::PathBuf;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::options::Backend;

/// Environment variable carrying a worker's [`WorkerConfig`] as JSON.
pub const WORKER_CONFIG_ENV: &str = "MONGOLOCK_TORTURE_WORKER";

/// Application name of the workers' MongoDB clients: fail points are aimed at it, so the
/// recorder, the fault injector and the final checks are never hit. On PostgreSQL, the prefix
/// of the `application_name` of the workers' lock connections (`pg_terminate_backend` picks
/// among them).
pub const WORKER_APP_NAME: &str = "torture-worker";

/// Application name of the MongoDB client that makes the short extensions
/// (`short_extension`): the injector's `blockConnection` fail point is aimed at it alone.
pub const EXT_APP_NAME: &str = "torture-extend";

/// MongoDB application name of the client of the liveness names ([`LIVE_PREFIX`]): no fail
/// point is aimed at it, so that a waiter's commands are never held by the server (the
/// liveness check is about what stands ahead of a waiter in the queue, not about a server that
/// does not answer).
pub const LIVE_APP_NAME: &str = "torture-live";

/// Prefix of the liveness names: leased for `--live-lease` (long, so that a waiter left to wait
/// for the holder's expiry is seen), their waits logged and checked by
/// [`crate::liveness`].
pub const LIVE_PREFIX: &str = "live-";

/// MongoDB collection of the CLI check's liveness name (`cli_check::CLI_LIVE_NAME`), followed
/// by the recorder. Not the workers' collection: `mongolock` creates its own TTL index
/// (`cleanup_after` 1 h) where it finds none, which would race the `ttl_index_zero` fault's
/// replacement there. (PostgreSQL has no TTL index: there the CLI uses the workers' table.)
pub const CLI_LIVE_COLLECTION: &str = "cli_live";

/// Lock collection of the named locks and elections.
pub const LOCK_COLLECTION: &str = "locks";
/// Collection of the documents locked in place (document locks).
pub const JOBS_COLLECTION: &str = "jobs";
/// Lock field of the document locks.
pub const JOBS_LOCK_FIELD: &str = "_lock";
/// Role of the election.
pub const ELECTION_ROLE: &str = "leader";

/// A worker's configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerConfig {
    /// The backend (MongoDB or PostgreSQL; the memory backend runs no worker process).
    pub backend: Backend,
    /// MongoDB URI or PostgreSQL URL (unused by the memory backend).
    pub uri: String,
    /// Database of the run (PostgreSQL: the schema).
    pub db: String,
    /// Worker id (`w3`) and incarnation (restarts after SIGKILL).
    pub worker: String,
    /// Seed of this worker incarnation's random choices.
    pub seed: u64,
    /// Concurrent loops in the worker.
    pub tasks: usize,
    /// Lease duration in ms.
    pub lease_ms: u64,
    /// Hot names (many contenders).
    pub hot_names: usize,
    /// Cold names (rarely contended; their documents expire and are TTL-deleted).
    pub cold_names: usize,
    /// Documents in the jobs collection.
    pub jobs: usize,
    /// Delay after expiry before the TTL index may delete a lock document (whole seconds).
    pub cleanup_after_secs: u64,
    /// PostgreSQL: the period of this worker's background cleanup (ms), if it runs one.
    pub cleanup_every_ms: Option<u64>,
    /// Whether the worker's lock backend polls instead of following the change stream.
    pub polling: bool,
    /// Whether futures are dropped at random points.
    pub drop_futures: bool,
    /// Whether a loop makes shortened extensions whose futures are dropped while the server
    /// is slowed (`short_extension`).
    #[serde(default)]
    pub short_extensions: bool,
    /// Liveness names (`live-0..`), waited for by [`LIVE_LOOPS`] loops of each worker.
    #[serde(default)]
    pub live_names: usize,
    /// Lease of the liveness names in ms.
    #[serde(default)]
    pub live_lease_ms: u64,
    /// Period of the liveness rounds in ms.
    #[serde(default = "live_round_default")]
    pub live_round_ms: u64,
    /// The worker's log file.
    pub log: PathBuf,
}

/// Loops of each worker that wait for the liveness names (besides `tasks`).
pub const LIVE_LOOPS: usize = 2;

/// How often the liveness loops of every worker start a round (`worker.rs`, `live_loop`) by
/// default (`--live-round`), in wall-clock time, which all the workers share (the fault
/// injector aims some signals at the first part of a round, when they wait).
pub const LIVE_ROUND_MS: u64 = 4000;

fn live_round_default() -> u64 {
    LIVE_ROUND_MS
}

/// A lock name of the mix.
pub fn hot_name(i: usize) -> String {
    format!("hot-{i}")
}

/// A cold lock name.
pub fn cold_name(i: usize) -> String {
    format!("cold-{i}")
}

/// Picks a hot name.
pub fn pick_hot(rng: &mut impl Rng, cfg: &WorkerConfig) -> String {
    hot_name(rng.random_range(0..cfg.hot_names.max(1)))
}

/// A liveness name.
pub fn live_name(i: usize) -> String {
    format!("{LIVE_PREFIX}{i}")
}

/// Picks a cold name.
pub fn pick_cold(rng: &mut impl Rng, cfg: &WorkerConfig) -> String {
    cold_name(rng.random_range(0..cfg.cold_names.max(1)))
}

/// Prefix of the semaphore names (distinct from every lock name).
pub const SEM_PREFIX: &str = "sem-";

/// Semaphore names of the mix (MongoDB, PostgreSQL).
pub const SEMAPHORES: usize = 3;

/// The slot limit of every semaphore of the mix.
pub const SEM_LIMIT: u32 = 3;

/// Picks a semaphore name.
pub fn pick_sem(rng: &mut impl Rng) -> String {
    format!("{SEM_PREFIX}{}", rng.random_range(0..SEMAPHORES))
}
