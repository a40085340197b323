//! `mongo-testserver`: run the MongoDB-compatible test server from the command line.
//!
//! ```text
//! mongo-testserver --port PORT [--bind ADDR] [--standalone] [--ttl-monitor-secs N]
//!                  [--pipeline-updates-as-replace] [--disable-majority-read-concern]
//! ```
//! Prints `listening on HOST:PORT` once connections are accepted; exits on SIGINT/SIGTERM.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line program

use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;

use clap::Parser;

/// A MongoDB-compatible server for tests.
#[derive(Parser, Debug)]
#[command(name = "mongo-testserver", version, about)]
struct Args {
    /// Port to listen on (0 picks a free port).
    #[arg(long, default_value_t = 27017)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Report a standalone server instead of a single-node replica-set primary.
    #[arg(long)]
    standalone: bool,
    /// TTL monitor period in seconds (mongod's ttlMonitorSleepSecs).
    #[arg(long, default_value_t = 60)]
    ttl_monitor_secs: u64,
    /// Replica set name.
    #[arg(long, default_value = mongo_testserver::DEFAULT_SET_NAME)]
    set_name: String,
    /// Report pipeline-style updates in change streams as `replace` events with the full
    /// document, as MongoDB 4.4 does.
    #[arg(long)]
    pipeline_updates_as_replace: bool,
    /// Refuse read concern "majority" except on change streams (error 148), as MongoDB 4.4
    /// started with --enableMajorityReadConcern=false does (usual on PSA sets).
    #[arg(long)]
    disable_majority_read_concern: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let server = match mongo_testserver::TestServer::builder()
        .bind(args.bind)
        .port(args.port)
        .standalone(args.standalone)
        .ttl_monitor_interval(Duration::from_secs(args.ttl_monitor_secs.max(1)))
        .set_name(args.set_name)
        .pipeline_updates_as_replace(args.pipeline_updates_as_replace)
        .majority_read_concern(!args.disable_majority_read_concern)
        .start()
        .await
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "mongo-testserver: cannot listen on {}:{}: {e}",
                args.bind, args.port
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    let mode = if server.is_standalone() {
        "standalone"
    } else {
        "replica set primary"
    };
    println!("mongo-testserver ({mode}) listening on {}", server.addr());
    let _ = std::io::stdout().flush();
    match server.run_until_signal().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mongo-testserver: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
