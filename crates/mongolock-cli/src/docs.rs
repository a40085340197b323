//! `mongolock completions SHELL` and `mongolock man`: generated from the clap definitions in
//! `cli.rs`, so they never drift from `--help` (the pages' sections: `man_sections.rs`).

use std::io::Write;

use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs, ManArgs};
use crate::exit::{self, CliError};

/// The binary's name in completions and manual pages.
const BIN: &str = "mongolock";

/// `mongolock completions SHELL`: the completion script on stdout.
pub fn completions(args: &CompletionsArgs) -> Result<i32, CliError> {
    let mut command = without_hidden_subcommands(Cli::command());
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, BIN, &mut script);
    write_all(&script)?;
    Ok(exit::SUCCESS)
}

/// `mongolock man [COMMAND]` prints one page in roff; `mongolock man --dir DIR` writes
/// `mongolock.1` and `mongolock-COMMAND.1` for every visible command.
pub fn man(args: &ManArgs) -> Result<i32, CliError> {
    let mut command = Cli::command().disable_help_subcommand(true);
    // Builds the command tree: subcommands get their display names (`mongolock-exec`) and the
    // global options.
    command.build();
    if let Some(dir) = &args.dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            CliError::failure(format!(
                "cannot create the directory {}: {e}",
                dir.display()
            ))
        })?;
        crate::man_sections::generate_to(&command, dir).map_err(|e| {
            CliError::failure(format!(
                "cannot write the manual pages to {}: {e}",
                dir.display()
            ))
        })?;
        return Ok(exit::SUCCESS);
    }
    let page = match &args.command {
        None => command,
        Some(name) => {
            let Some(sub) = command
                .get_subcommands()
                .find(|s| !s.is_hide_set() && s.get_name() == name)
                .cloned()
            else {
                let known: Vec<&str> = command
                    .get_subcommands()
                    .filter(|s| !s.is_hide_set())
                    .map(|s| s.get_name())
                    .collect();
                return Err(CliError::with_code(
                    exit::USAGE,
                    format!(
                        "no command named {name:?}; the commands are: {}",
                        known.join(", ")
                    ),
                ));
            };
            sub
        }
    };
    let mut roff = Vec::new();
    crate::man_sections::render(&page, &mut roff)
        .map_err(|e| CliError::failure(format!("cannot render the manual page: {e}")))?;
    write_all(&roff)?;
    Ok(exit::SUCCESS)
}

/// `command` with its top-level arguments and visible subcommands only: some generators (bash)
/// would otherwise offer the internal `__supervise` and `demo-worker`.
fn without_hidden_subcommands(command: clap::Command) -> clap::Command {
    clap::Command::new(BIN)
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .args(command.get_arguments().cloned())
        .subcommands(
            command
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .cloned(),
        )
}

/// Writes to stdout; a closed pipe is not an error.
fn write_all(bytes: &[u8]) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::failure(format!("cannot write to stdout: {e}"))),
    }
}
