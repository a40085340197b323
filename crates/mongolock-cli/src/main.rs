//! `mongolock`: distributed MongoDB or PostgreSQL locks from the shell. See `mongolock --help` and
//! `crates/mongolock-cli/README.md`; exit statuses are documented in [`exit`].

/// Prints one line on stderr with a single write, so that it is not interleaved with what the
/// supervised command (which shares stderr) prints at the same moment, nor with the waiting
/// status line (see `status_line.rs`).
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = crate::status_line::write_stderr(line.as_bytes());
    }};
}

mod cli;
mod connect;
#[cfg(feature = "demo")]
mod demo;
mod docs;
mod duration;
mod elect;
mod env_vars;
mod events;
mod exec;
mod exit;
mod held;
mod inspect;
mod list;
mod man_sections;
mod release;
mod signals;
mod status_line;
mod supervisor;
mod uri;
mod watch;

use std::io::{IsTerminal, Write};

use clap::CommandFactory;

use crate::cli::{Cli, Command};

fn main() {
    // Help and usage errors are printed by clap, which exits 0 or 2.
    env_vars::forget_empty();
    let (mut cli, matches) = env_vars::parse();
    cli.normalize();
    if let Err(message) = cli.check() {
        let message = env_vars::name_variables(message, &matches);
        // Reported with the subcommand's usage line, like clap's own errors.
        let mut command = Cli::command();
        let sub = cli.command.name();
        let usage = command.find_subcommand_mut(sub).cloned();
        usage
            .unwrap_or(command)
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit();
    }
    install_panic_hook();
    if let Command::Supervise(args) = &cli.command {
        // Single-threaded, before any runtime exists: see the supervisor's module docs.
        std::process::exit(supervisor::run(args));
    }
    // `--json` on stderr replaces the messages there, so diagnostics are off unless asked for.
    let mut quiet = false;
    if let Command::Exec(cli::ExecArgs { events: e, .. })
    | Command::Elect(cli::ElectArgs { events: e, .. }) = &cli.command
    {
        if let Err(err) = events::init(e) {
            // Reported like clap's usage errors (the descriptor is part of the command line).
            say!("mongolock: {err}");
            std::process::exit(err.code);
        }
        quiet = events::json_on_stderr(e);
    }
    if cli.global.quiet {
        events::set_quiet();
    }
    init_tracing(cli.global.verbose, quiet, cli.global.quiet);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("mongolock: cannot start the async runtime: {e}");
            std::process::exit(exit::FAILURE);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            events::error(&e);
            e.code
        }
    };
    // A waiter that gave up withdraws from the lock's handoff queue in the background.
    runtime.block_on(connect::flush());
    events::exit(code);
    let _ = std::io::stdout().flush();
    // Exit without shutting the runtime down: every lease has been released or handed back by
    // now, and tearing down the driver's background tasks mid-flight can make them panic.
    std::process::exit(code);
}

/// Panics (bugs) are reported on one line; RUST_BACKTRACE=1 restores the full report.
fn install_panic_hook() {
    if std::env::var_os("RUST_BACKTRACE").is_some() {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        say!(
            "mongolock: internal error{location}: {} (set RUST_BACKTRACE=1 for details)",
            exit::one_line(&payload)
        );
    }));
}

async fn run(cli: Cli) -> Result<i32, exit::CliError> {
    let global = &cli.global;
    match cli.command {
        Command::Exec(args) => exec::run(global, args).await,
        Command::Elect(args) => elect::run(global, args).await,
        Command::List(args) => list::run(global, args).await,
        Command::Inspect(args) => inspect::run(global, args).await,
        Command::Release(args) => release::run(global, args).await,
        Command::Watch(args) => watch::run(global, args).await,
        Command::Completions(args) => docs::completions(&args),
        Command::Man(args) => docs::man(&args),
        #[cfg(feature = "demo")]
        Command::Demo(args) => demo::run(args).await,
        #[cfg(feature = "demo")]
        Command::DemoWorker(args) => demo::worker(global, args).await,
        Command::Supervise(_) => Err(exit::CliError::failure(
            "the supervisor runs without an async runtime",
        )),
    }
}

/// Diagnostics on stderr: warnings by default (none when `off`, errors only with `--quiet`;
/// `-v` info, `-vv` debug); `MONGOLOCK_LOG` takes a full tracing filter. The library's own
/// warning about a lost lease or leadership is left out: mongolock reports the loss itself, once.
fn init_tracing(verbose: u8, off: bool, quiet: bool) {
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 if off => "off",
        0 if quiet => "error",
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = std::env::var("MONGOLOCK_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(|| status_line::Stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(verbose >= 2)
        .without_time()
        .with_filter(filter_fn(|meta| !reported_as_message(meta)))
        .with_filter(filter);
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// The library's warnings "lock lost" (the guard's, with the loss `reason`) and "leadership
/// lost": `exec` and `elect` report every loss as their own message (and `lost` event).
fn reported_as_message(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_event()
        && *meta.level() == tracing::Level::WARN
        && match meta.target() {
            "mongolock::guard" => meta.fields().field("reason").is_some(),
            "mongolock::election::leadership" => meta.fields().field("role").is_some(),
            _ => false,
        }
}
