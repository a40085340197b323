//! Command-line options.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

/// Torture test of mongolock: worker processes lock a mix of names under random faults; an
/// independent checker reads the lock and resource collections (through change streams) and the
/// workers' logs and reports every violation. Exit status: 0 no violation, 1 violations, 2 the
/// run could not be set up, 3 the recorded history is incomplete (nothing is proven).
#[derive(Debug, Parser)]
#[command(name = "mongolock-torture", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Sub>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands (internal).
#[derive(Debug, Subcommand)]
pub enum Sub {
    /// A worker process (started by the orchestrator; configured through the environment).
    #[command(hide = true)]
    Worker,
}

/// The backend under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// MongoDB (the embedded test server, or `--uri`).
    Mongo,
    /// PostgreSQL (a cluster of the run's own, started with `initdb` / `pg_ctl`, or
    /// `--postgres-url` / `POSTGRES_URL`).
    Postgres,
    /// The in-memory backend, in one process with many tasks.
    Memory,
}

impl Backend {
    /// Short name used in the summary.
    pub fn label(self) -> &'static str {
        match self {
            Backend::Mongo => "mongo",
            Backend::Postgres => "postgres",
            Backend::Memory => "memory",
        }
    }
}

/// Options of a run.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// MongoDB URI of a real deployment; default: start the embedded test server. Fail points
    /// are then used only with --failpoints (they need enableTestCommands).
    #[arg(long, env = "MONGODB_URI", hide_env_values = true)]
    pub uri: Option<String>,
    /// PostgreSQL URL of an existing server for `--backend postgres` (the run creates a schema
    /// of its own there); default: start a cluster with `initdb` / `pg_ctl` in a temporary
    /// directory. A `postgres://` `--uri` is taken as this too.
    #[arg(long, env = "POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// Use fail points against --uri (the deployment must run with enableTestCommands=1).
    #[arg(long)]
    pub failpoints: bool,
    /// Backend.
    #[arg(long, value_enum, default_value_t = Backend::Mongo)]
    pub backend: Backend,
    /// Worker processes (memory backend: groups of tasks).
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Concurrent loops per worker.
    #[arg(long, default_value_t = 4)]
    pub tasks: usize,
    /// Stop once this many acquisitions were recorded.
    #[arg(long)]
    pub acquisitions: Option<u64>,
    /// Stop after this long (e.g. `30s`, `10m`); default: 60 s when --acquisitions is not given.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Seed of every random choice (default: random, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Names with many contenders.
    #[arg(long, default_value_t = 4)]
    pub hot_names: usize,
    /// Names rarely contended (their documents expire and get TTL-deleted).
    #[arg(long, default_value_t = 500)]
    pub cold_names: usize,
    /// Documents locked in place (document locks).
    #[arg(long, default_value_t = 16)]
    pub jobs: usize,
    /// Lease duration.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub lease: Duration,
    /// Liveness names (`live-0..`): two loops of each worker wait for them (`acquire` until
    /// granted, `acquire_timeout` that runs out, `acquire` futures dropped), and the liveness
    /// check measures how soon a free one reaches a live waiter (MongoDB, PostgreSQL; 0: none).
    #[arg(long, default_value_t = 2)]
    pub live_names: usize,
    /// Lease of the liveness names: long, so that a waiter left to sleep until the holder's
    /// expiry shows (it would wait up to this long).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub live_lease: Duration,
    /// Period of the liveness rounds: at the start of each, the liveness loops of every worker
    /// queue up on one name (those that will give up first), then no newcomer comes.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "4s")]
    pub live_round: Duration,
    /// Slack added to the library's delays in the liveness bounds: a free liveness name must
    /// reach a live waiter within 500 ms (the handoff fallback) + this after a release, and
    /// 5 ms + this after an expiry.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub liveness_slack: Duration,
    /// Mean time between two injected faults.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "250ms")]
    pub fault_interval: Duration,
    /// Fault kinds to inject, comma-separated, `all` (every kind of the backend) or `none`.
    /// MongoDB: transient_error, duplicate_key, write_conflict, shutdown, close_connection,
    /// block_connection (fail points), sigkill, sigstop, short_extension (extensions to a
    /// shorter TTL dropped while the server is slowed), ttl_index_zero (an operator's
    /// 0-second TTL index replaces the library's), exec_group_stop and exec_setsid (with
    /// --cli-faults: job-control stops of `mongolock exec`'s process group; commands with
    /// `setsid` descendants), partition and netem (as root: links of workers in network
    /// namespaces cut or degraded). PostgreSQL: sigkill, sigstop, terminate_listener,
    /// terminate_connection (`pg_terminate_backend` of a worker's listening or pooled
    /// connection), short_extension (the lock row held `FOR UPDATE`), exec_group_stop,
    /// exec_setsid. Memory: none (futures are dropped unless --no-dropped-futures). Kinds that
    /// cannot run here are listed in the summary's `skipped` with the reason. Both backends
    /// also: waiter_exit (a worker exits with its waits in progress) and exec_sigint (with
    /// --cli-faults: SIGINT to a waiting `mongolock exec`).
    #[arg(long, default_value = "all")]
    pub faults: String,
    /// Do not drop acquire / release futures at random points.
    #[arg(long)]
    pub no_dropped_futures: bool,
    /// TTL monitor period of the embedded server; PostgreSQL: the period of the idle-row
    /// cleanup run by two of the workers.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub ttl_monitor: Duration,
    /// Delay after expiry before a lock document may be TTL-deleted (whole seconds). 2 s or
    /// more exercises the first acquisition that creates the document with its epoch (a
    /// window of half the delay); below 2 s every new document is stamped after its creation.
    /// PostgreSQL: the workers' `cleanup_after`.
    #[arg(long, default_value_t = 2)]
    pub cleanup_after_secs: u64,
    /// Skip the `mongolock exec` check.
    #[arg(long)]
    pub no_cli: bool,
    /// SIGKILL / SIGSTOP `mongolock` processes during the CLI check.
    #[arg(long)]
    pub cli_faults: bool,
    /// Concurrent `mongolock exec` loops.
    #[arg(long, default_value_t = 3)]
    pub cli_loops: usize,
    /// The `mongolock` binary (default: next to this program).
    #[arg(long, env = "MONGOLOCK_BIN")]
    pub mongolock_bin: Option<PathBuf>,
    /// The `mongo-testserver` binary, run in a network namespace for `partition` / `netem`
    /// (default: next to this program).
    #[arg(long, env = "MONGO_TESTSERVER_BIN")]
    pub testserver_bin: Option<PathBuf>,
    /// Directory for the workers' logs (default: a fresh directory under the system temp dir).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Violations printed with their evidence.
    #[arg(long, default_value_t = 5)]
    pub show: usize,
}
