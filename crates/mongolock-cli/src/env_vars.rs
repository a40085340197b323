//! Options that come from environment variables (`MONGOLOCK_TTL`, `MONGODB_URI`, ... — clap's
//! `env`): an empty variable counts as unset, and an error about a value taken from a variable
//! names the variable (`MONGOLOCK_TTL=abc: invalid duration ...`), since the command line the
//! user looks at does not show it.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

use crate::cli::Cli;

/// Every `(long option, variable)` pair of the command tree.
fn env_options(command: &clap::Command) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = command
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            let var = a.get_env()?.to_str()?;
            Some((long.to_owned(), var.to_owned()))
        })
        .collect();
    for sub in command.get_subcommands() {
        out.extend(env_options(sub));
    }
    out
}

/// Removes the options' variables that are set but empty from this process's environment, so
/// that the parser treats them as unset (clap would take the empty value and refuse it: "a
/// value is required", "invalid duration \"\""). Call before any thread starts. CMD, started
/// later, does not see them either: for it, too, an empty value meant nothing.
pub fn forget_empty() {
    let mut vars: Vec<String> = env_options(&Cli::command())
        .into_iter()
        .map(|(_, var)| var)
        .collect();
    vars.push("MONGOLOCK_LOG".to_owned());
    for var in vars {
        if std::env::var_os(&var).is_some_and(|v| v.is_empty()) {
            // Single-threaded here (see above): nothing reads the environment concurrently.
            std::env::remove_var(&var);
        }
    }
}

/// Parses the command line like `Cli::parse`, but errors about values taken from variables
/// name the variable; returns the parsed arguments and where each value came from.
pub fn parse() -> (Cli, ArgMatches) {
    let args: Vec<OsString> = std::env::args_os().collect();
    let mut command = Cli::command();
    let matches = match command.try_get_matches_from_mut(&args) {
        Ok(m) => m,
        Err(e) => match from_variable(&e, &command, &args) {
            Some(message) => subcommand_of(&args)
                .error(ErrorKind::ValueValidation, message)
                .exit(),
            None => e.exit(),
        },
    };
    match Cli::from_arg_matches(&matches) {
        Ok(cli) => (cli, matches),
        Err(e) => e.format(&mut command).exit(),
    }
}

/// For a bad value that came from a variable: `VAR=value: why`.
fn from_variable(e: &clap::Error, command: &clap::Command, args: &[OsString]) -> Option<String> {
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let Some(ContextValue::String(value)) = e.get(ContextKind::InvalidValue) else {
        return None;
    };
    let long = arg.strip_prefix("--")?.split([' ', '=']).next()?;
    let on_command_line = args.iter().skip(1).take_while(|a| *a != "--").any(|a| {
        a.to_str()
            .is_some_and(|a| a == format!("--{long}") || a.starts_with(&format!("--{long}=")))
    });
    if on_command_line {
        return None;
    }
    let (_, var) = env_options(command)
        .into_iter()
        .find(|(l, var)| l == long && std::env::var(var).as_deref() == Ok(value.as_str()))?;
    let why = std::error::Error::source(e)
        .map_or_else(|| format!("invalid value for --{long}"), |s| s.to_string());
    Some(format!(
        "{var}={value}: {why} (from the environment; --{long} overrides it)"
    ))
}

/// The subcommand named on the command line (for its usage line), or the main command.
fn subcommand_of(args: &[OsString]) -> clap::Command {
    let mut command = Cli::command();
    command.build();
    let name = args
        .iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .find(|a| command.find_subcommand(a).is_some())
        .map(str::to_owned);
    match name.and_then(|n| command.find_subcommand(&n).cloned()) {
        Some(sub) => sub,
        None => command,
    }
}

/// `message` (a usage error from the checks beyond single options) with the variables named
/// whose values it is about: `... (--grace is MONGOLOCK_GRACE=20s from the environment)`.
pub fn name_variables(message: String, matches: &ArgMatches) -> String {
    let Some((_, sub)) = matches.subcommand() else {
        return message;
    };
    let command = Cli::command();
    let mut notes = Vec::new();
    for (long, var) in env_options(&command) {
        let Some(id) = find_id(&command, &long) else {
            continue;
        };
        let from_env = sub
            .try_contains_id(&id)
            .ok()
            .filter(|&present| present)
            .and_then(|_| sub.value_source(&id))
            == Some(ValueSource::EnvVariable);
        if from_env && message.contains(&format!("--{long}")) {
            let value = std::env::var(&var).unwrap_or_default();
            let note = format!("--{long} is {var}={value} from the environment");
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
    }
    if notes.is_empty() {
        message
    } else {
        format!("{message} ({})", notes.join("; "))
    }
}

/// The id of the option `--long` anywhere in the tree.
fn find_id(command: &clap::Command, long: &str) -> Option<String> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .map(|a| a.get_id().to_string())
        .or_else(|| command.get_subcommands().find_map(|s| find_id(s, long)))
}
