//! `mongolock-torture`: see the crate docs and the README's "Reliability" section.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a harness that reports on its terminal

use clap::Parser;
use mongolock_torture::options::{Cli, Sub};

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("TORTURE_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mongolock-torture: cannot start the runtime: {e}");
            std::process::exit(2);
        }
    };
    let status = runtime.block_on(async move {
        match cli.command {
            Some(Sub::Worker) => match mongolock_torture::worker::worker_main().await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("mongolock-torture worker: {e}");
                    2
                }
            },
            None => match mongolock_torture::run::run(cli.run).await {
                Ok(status) => status,
                Err(e) => {
                    eprintln!("mongolock-torture: {e}");
                    2
                }
            },
        }
    });
    // Do not wait for background tasks (e.g. a worker's background releases) to end.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    std::process::exit(status);
}
