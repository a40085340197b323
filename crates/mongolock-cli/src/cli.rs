//! Command-line definitions (clap). Every command's `--help` ends with examples.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration::{
    display, parse_command_ttl, parse_duration, parse_positive, parse_ttl, parse_wait, Wait,
};

/// Default connection string when none of `--uri`, `MONGOLOCK_URI` and `MONGODB_URI` is given.
pub const DEFAULT_URI: &str = "mongodb://localhost:27017";
/// Default database of the lock collection.
pub const DEFAULT_DB: &str = "mongolock";
/// Default lock collection (the library's default).
pub const DEFAULT_COLLECTION: &str = "distributed.locks";

/// The main `--help` text after the options; the demo example only when `demo` is built in.
macro_rules! main_examples {
    ($demo:expr) => {
        concat!(
            "Examples:\n",
            $demo,
            "  # Run a nightly job on at most one host at a time:
  mongolock --uri mongodb://db1:27017 exec nightly-report -- ./report.sh --full

  # Skip the run if another host is still busy (exit status 75):
  mongolock exec --wait 0 nightly-report -- ./report.sh

  # At most 3 exports at once; readers side by side, a writer alone:
  mongolock exec --limit 3 exports -- ./export.sh
  mongolock exec --shared config -- ./read-config.sh

  # Two locks at once, all or nothing (never a deadlock):
  mongolock exec db-a db-b -- ./sync.sh

  # Run a scheduler only on the elected leader:
  mongolock elect scheduler -- ./scheduler

  # What is locked right now, and by whom:
  mongolock list
  mongolock inspect nightly-report --json

  # Remove a stuck lease, only if it is still the one with fencing token 42:
  mongolock release --force --token 42 nightly-report

  # Who waits for a lock; only the held locks whose names start with reports:
  mongolock inspect nightly-report
  mongolock list --held --prefix reports:

  # Keep a live view of the locks open in a terminal:
  mongolock watch

  # Machine-readable events of a run, one JSON object per line on fd 3:
  mongolock exec --json-fd 3 nightly-report -- ./report.sh 3>>events.jsonl

  # Shell completions and the manual page:
  mongolock completions bash > /etc/bash_completion.d/mongolock
  mongolock man | man -l -

Environment:
  MONGOLOCK_URI, MONGOLOCK_DB, MONGOLOCK_COLLECTION --uri, --db, --collection
  MONGODB_URI                                       read when neither --uri nor
                                                    MONGOLOCK_URI is given
  MONGOLOCK_TTL, MONGOLOCK_WAIT, MONGOLOCK_GRACE    --ttl, --wait, --grace of exec/elect
  MONGOLOCK_LOG                                     a tracing filter for diagnostics
  MONGOLOCK_QUIET                                   -q (1, true, yes: on; 0, false, no: off)
  An empty variable counts as unset.

Exit statuses:
  0      success; exec/elect pass through the command's own status (1-255)
  1      mongolock failed (cannot connect, bad URI, authentication, server error)
  2      usage error
  3      inspect: no such lock; release --force: the lock was not held
  66     list/inspect/watch: the PostgreSQL lock table does not exist (read commands
         create nothing; the first exec creates it)
  75     exec --wait ran out while the lock was held elsewhere; the command was not run
         (--conflict-exit-code chooses another status)
  76     the lock was lost while the command ran; the command was stopped
  77     --collection holds data that is not mongolock's (an application's); nothing
         was written there: choose another collection or table
  78     exec --limit/--shared: the name is held with another slot limit; not run
  79     release --force --token N: no unexpired lease with token N holds the name
         (it was released, expired or taken over); nothing was released
  126    the command could not be executed
  127    the command was not found
  128+N  the command died from signal N, or mongolock was interrupted while waiting
"
        )
    };
}

#[cfg(feature = "demo")]
const MAIN_EXAMPLES: &str =
    main_examples!("  # See it work, no database needed:\n  mongolock demo\n\n");
#[cfg(not(feature = "demo"))]
const MAIN_EXAMPLES: &str = main_examples!("");

/// Distributed locks on MongoDB or PostgreSQL from the shell: run a command while holding a lock, run a
/// command only on the elected leader, list, inspect and force-release locks.
#[derive(Debug, Parser)]
#[command(
    name = "mongolock",
    version,
    about = "Run commands under distributed locks on MongoDB or PostgreSQL",
    long_about = "Distributed locks on MongoDB or PostgreSQL from the shell, in the spirit of `flock`, `etcdctl lock` \
                  and `consul lock`: run a command while holding a named lock (fencing token in \
                  the environment), run a command only while elected leader, list, inspect and \
                  force-release locks.\n\nLeases are timed by the server's clock and renewed in \
                  the background while the command runs; a crashed holder's lock is free again \
                  once its lease (--ttl) runs out.",
    after_help = MAIN_EXAMPLES,
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// Options every command accepts (before or after the command name).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Connection string of the MongoDB or PostgreSQL server; its scheme picks the database:
    /// mongodb:// or mongodb+srv:// for MongoDB, postgres:// or postgresql:// for PostgreSQL.
    /// Its password is never printed. A serverSelectionTimeoutMS (MongoDB) or connect_timeout
    /// (PostgreSQL) of 5 s applies unless the URI sets one. Precedence: --uri, then
    /// MONGOLOCK_URI, then MONGODB_URI (kept for existing setups), then the default
    /// [default: mongodb://localhost:27017].
    #[arg(
        long,
        global = true,
        env = "MONGOLOCK_URI",
        hide_env_values = true,
        value_name = "URI"
    )]
    pub uri: Option<String>,

    /// Database holding the lock collection (MongoDB; for PostgreSQL the database is the
    /// URI's).
    #[arg(
        long,
        global = true,
        env = "MONGOLOCK_DB",
        hide_env_values = true,
        default_value = DEFAULT_DB,
        value_name = "NAME"
    )]
    pub db: String,

    /// Lock collection (MongoDB), or lock table as [SCHEMA.]TABLE (PostgreSQL; the default
    /// means public.mongolock_locks).
    #[arg(
        long,
        global = true,
        env = "MONGOLOCK_COLLECTION",
        hide_env_values = true,
        default_value = DEFAULT_COLLECTION,
        value_name = "NAME"
    )]
    pub collection: String,

    /// More diagnostics on stderr (-v: progress, -vv: debug). MONGOLOCK_LOG (a tracing filter
    /// such as `mongolock=debug`) overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Print nothing on stderr but errors: no message for a busy lock (`exec --wait`) or a
    /// normal run, no waiting status line, no warnings. Failures (cannot connect, lease lost,
    /// database unreachable while waiting, usage) are still reported; the exit status is
    /// unchanged. For cron: `exec -q --wait 0 --conflict-exit-code 0 --min-hold 10m`.
    #[arg(
        short,
        long,
        global = true,
        env = "MONGOLOCK_QUIET",
        value_parser = clap::builder::FalseyValueParser::new(),
        action = clap::ArgAction::SetTrue
    )]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding a lock.
    #[command(
        override_usage = "mongolock [GLOBAL OPTIONS] exec [OPTIONS] <NAME> [NAME]... -- <CMD> [ARGS]...",
        long_about = "Acquire the lock NAME (waiting up to --wait, default forever), run CMD while \
                      holding it, renew the lease in the background, release it when CMD exits, \
                      and exit with CMD's status.\n\n\
                      CMD's environment has MONGOLOCK_NAME (the lock name) and \
                      MONGOLOCK_FENCING_TOKEN (a number larger than every earlier holder's: pass \
                      it to the resource you protect so that it can refuse stale writers).\n\n\
                      CMD is dead before its lease can expire. While renewals fail (database \
                      unreachable), CMD gets SIGTERM when --grace of trusted lease time is left \
                      and SIGKILL by the lease's local deadline; a successful renewal moves both. \
                      If the lock is lost while time is left (force-released, taken over), CMD \
                      gets SIGTERM at once and SIGKILL after --grace at the latest (--grace 0: \
                      SIGKILL at once). Either way mongolock exits with status 76. If --wait runs \
                      out, CMD is not run and the status is 75.\n\n\
                      CMD runs under a small supervisor process that enforces these deadlines on \
                      its own, so they hold even if mongolock is stopped or starved; if mongolock \
                      dies (kill -9, OOM killer), the supervisor SIGKILLs CMD at once. On Linux CMD \
                      also dies with the supervisor (parent-death signal); other platforms have no \
                      parent-death signal. On Linux the SIGTERM of a deadline reaches every \
                      process CMD started as well, also one in a session of its own (setsid), \
                      and when CMD exits or must die the supervisor SIGKILLs whatever of its tree \
                      is left.\n\n\
                      SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to mongolock are passed on to CMD; the lock is released once CMD \
                      has exited.\n\n\
                      Outside an interactive terminal, CMD runs in its own process group and \
                      signals go to the whole group (everything CMD started). In a terminal's \
                      foreground, CMD stays in the terminal's process group so that it can read \
                      the terminal; Ctrl-C then reaches it directly.\n\n\
                      By default NAME is held exclusively. --limit N holds one of N slots of the \
                      semaphore NAME instead (up to N commands at once; every process must use \
                      the same N, else exit status 78). --shared holds NAME as a reader of a \
                      read-write lock (readers run together, never with a writer); --write as its \
                      writer. A plain `exec NAME` also excludes every reader and slot holder, but \
                      can wait indefinitely while readers keep overlapping; a waiting --write \
                      makes new readers wait, so it cannot be starved. Everything else (--wait, \
                      --ttl, --grace, supervision, events) is the same in every mode.\n\n\
                      Several names (`exec a b -- CMD`; `--` is then required) are held \
                      together, all or nothing: they are taken one after the other in the \
                      order of their names (byte order, duplicates dropped), whatever order \
                      they were written in, so that commands asking for overlapping names \
                      never deadlock. While mongolock waits for a name, it holds (and renews) \
                      the names before it. If --wait runs out, the names taken are released and \
                      the status is 75. CMD's environment then has MONGOLOCK_NAMES (the names \
                      in that order, separated by spaces) and MONGOLOCK_FENCING_TOKENS (each \
                      name's fencing token, in the same order) instead of MONGOLOCK_NAME and \
                      MONGOLOCK_FENCING_TOKEN; with one name both forms are set. CMD is stopped \
                      as above as soon as any of the leases is lost, and by the earliest lease's \
                      deadline. Several names are exclusive locks only: --limit, --shared and \
                      --write take one NAME (usage error, status 2).",
        after_help = "\
Examples:
  # Wait as long as it takes, then run the job:
  mongolock exec nightly-report -- ./report.sh --full

  # One attempt only; exit 75 without running anything if the lock is busy:
  mongolock exec --wait 0 nightly-report -- ./report.sh

  # Wait at most 2 minutes, hold a 1-minute lease (renewed every 20 s while the job runs):
  mongolock exec --wait 2m --ttl 1m db-migrate -- ./migrate up

  # Use the fencing token:
  mongolock exec deploy -- sh -c 'deploy --fencing-token \"$MONGOLOCK_FENCING_TOKEN\"'

  # Cron on every replica: one run per night however far apart the crons fire (the lock
  # stays held 10 minutes from its grant, by the database's clock); a busy lock is not an
  # error (like `flock -E 0`) and -q mails nothing for it:
  mongolock exec -q --wait 0 --conflict-exit-code 0 --min-hold 10m nightly-report -- ./report.sh

  # At most 3 exports at once, across all hosts (a semaphore with 3 slots):
  mongolock exec --limit 3 exports -- ./export.sh

  # Readers run side by side; a writer runs alone and new readers wait while it waits:
  mongolock exec --shared config -- ./read-config.sh
  mongolock exec --write config -- ./rewrite-config.sh

  # Hold two locks together (any order on any host: never a deadlock):
  mongolock exec account:1 account:2 -- sh -c 'transfer --tokens \"$MONGOLOCK_FENCING_TOKENS\"'

  # Defaults from the environment (options given on the command line win):
  MONGOLOCK_TTL=1m MONGOLOCK_WAIT=0 mongolock exec nightly-report -- ./report.sh

  # Events for a log shipper, one JSON object per line on fd 3 (stderr stays for people):
  mongolock exec --json-fd 3 nightly-report -- ./report.sh 3>>/var/log/report-lock.jsonl

  # Events instead of messages on stderr:
  mongolock exec --json nightly-report -- ./report.sh 2> >(jq -c 'select(.event == \"acquired\")')"
    )]
    Exec(ExecArgs),

    /// Run a command only while elected leader; campaign again after losing leadership.
    #[command(
        override_usage = "mongolock [GLOBAL OPTIONS] elect [OPTIONS] <NAME> -- <CMD> [ARGS]...",
        long_about = "Campaign for the role NAME (a lock that is waited for forever), run CMD while \
                      leader, and renew the lease in the background. CMD is supervised as under \
                      `exec`: it is dead before the term's lease can expire (SIGTERM when --grace \
                      of trusted lease time is left without a renewal, SIGKILL by the deadline; \
                      on a reported loss SIGTERM at once, SIGKILL after --grace at the latest), \
                      and it dies with mongolock. After a loss mongolock campaigns again. \
                      mongolock exits when CMD exits on its own, with CMD's status, after \
                      resigning (releasing the role).\n\n\
                      CMD's environment has MONGOLOCK_NAME and MONGOLOCK_FENCING_TOKEN (larger \
                      for every new term). Leadership changes are reported on stderr.",
        after_help = "\
Examples:
  # Run the scheduler on exactly one of the hosts running this line:
  mongolock elect scheduler -- ./scheduler --config /etc/scheduler.toml

  # Fail over within about 10 s of a leader crash:
  mongolock elect --ttl 10s scheduler -- ./scheduler

  # Leadership changes as JSON lines on fd 3:
  mongolock elect --json-fd 3 scheduler -- ./scheduler 3>>/var/log/scheduler-leader.jsonl"
    )]
    Elect(ElectArgs),

    /// List locks: holder, fencing token, acquired, expires.
    #[command(after_help = "\
Examples:
  mongolock list
  mongolock list --held --prefix reports:
  mongolock --db app --collection locks list
  mongolock list --json | jq '.[] | select(.held) | .name'

Exits with status 77 when --collection holds data that is not mongolock's, and 66 when the
PostgreSQL lock table does not exist (nothing is created).")]
    List(ListArgs),

    /// Show one lock: holder, fencing token, lease, times, who waits for it; a semaphore's
    /// limit and every holder.
    #[command(
        long_about = "Show one lock: its state, holder, fencing token, lease id and times by \
                      the server's clock. A semaphore (exec --limit) or read-write lock \
                      (--shared) also shows its slot limit and every holder with its token. \
                      Processes waiting for the lock (exec, elect, library acquirers with \
                      change notifications) are listed in queue order with host, pid, \
                      application name and until when their registration lasts (a waiter \
                      renews it each time it finds the lock busy; a dead one drops out).",
        after_help = "\
Examples:
  mongolock inspect nightly-report
  mongolock inspect nightly-report --json | jq .holder.host
  mongolock inspect nightly-report --json | jq '.waiters[].holder.pid'

Exits with status 3 when there is no lock with that name, 77 when --collection holds data that
is not mongolock's, and 66 when the PostgreSQL lock table does not exist (nothing is created)."
    )]
    Inspect(InspectArgs),

    /// Forcibly end the lease on a lock (an operator action for stuck holders).
    #[command(
        override_usage = "mongolock [GLOBAL OPTIONS] release --force [--token N] <NAME>",
        long_about = "End whatever lease holds NAME, so that the next waiter can take it at once. \
                      The fencing token keeps growing: the next holder's token is larger than the \
                      removed holder's, so a resource that checks tokens refuses the old holder's \
                      late writes. The old holder learns of the loss at its next renewal (a \
                      `mongolock exec` holder then stops its command and exits 76).\n\n\
                      --force is required: the old holder may still be running.\n\n\
                      With --token N the lease is ended only if it still has fencing token N \
                      (read it with `inspect`): the check and the release are one conditional \
                      write on the server, so a new holder that took the lock over in between \
                      is never ended. For a semaphore or read-write lock, --token ends that one \
                      slot and leaves the others.",
        after_help = "\
Examples:
  mongolock release --force nightly-report
  mongolock release --force --token 42 nightly-report

Exits with status 3 when the lock was not held (nothing was released), and with status 79
when --token N was given and no unexpired lease with token N holds the lock (it was
released, expired or taken over; nothing was released)."
    )]
    Release(ReleaseArgs),

    /// A live view of the locks, refreshed as they change.
    #[command(
        long_about = "Show the locks as `list` does and keep the view up to date: it is redrawn \
                      as soon as the database reports a change to a lock on screen (MongoDB \
                      change streams, PostgreSQL LISTEN/NOTIFY), when a lease on screen would \
                      expire, and every --interval otherwise (which also picks up new lock \
                      names, and is the only refresh where change notifications are \
                      unavailable). Leave it open in a terminal; Ctrl-C ends it.\n\n\
                      In a terminal each refresh replaces the screen. When stdout is not a \
                      terminal each refresh is printed as a plain text block (a header line, \
                      the table, a blank line), and --json prints each refresh as one JSON \
                      object per line. --once and --count end it after that many refreshes.",
        after_help = "\
Examples:
  mongolock watch
  mongolock watch --interval 10s
  mongolock watch --once
  mongolock watch --count 5 --json | jq -c '.locks[] | {name, state}'

A failed read is shown and tried again at the next refresh (a PostgreSQL lock table that does
not exist yet appears once the first exec creates it; watch creates nothing). Exits with status
77 at once when --collection holds data that is not mongolock's; with --once, or when the last
of --count N refreshes failed, with that failure's status (66: the PostgreSQL lock table does
not exist)."
    )]
    Watch(WatchArgs),

    /// Print a shell completion script.
    #[command(
        long_about = "Print the completion script for SHELL on stdout, generated from the \
                      same definitions as --help.",
        after_help = "\
Examples:
  # bash (system-wide, or source it from ~/.bashrc):
  mongolock completions bash > /etc/bash_completion.d/mongolock
  source <(mongolock completions bash)

  # zsh (a directory in $fpath):
  mongolock completions zsh > ~/.zfunc/_mongolock

  # fish:
  mongolock completions fish > ~/.config/fish/completions/mongolock.fish"
    )]
    Completions(CompletionsArgs),

    /// Print the manual page (roff), or write one page per command.
    #[command(
        long_about = "Print the manual page of mongolock, or of one COMMAND, in roff on \
                      stdout; with --dir, write mongolock.1 and one mongolock-COMMAND.1 per \
                      command into a directory instead. Generated from the same definitions \
                      as --help.",
        after_help = "\
Examples:
  mongolock man | man -l -
  mongolock man exec | man -l -
  mongolock man --dir /usr/local/share/man/man1"
    )]
    Man(ManArgs),

    /// Watch workers contend for a lock on an embedded test server; no database needed.
    #[cfg(feature = "demo")]
    #[command(
        long_about = "Start the embedded MongoDB-compatible test server in this process and run \
                      several worker processes (this same binary) that contend for one lock. \
                      One worker is killed with SIGKILL while it holds the lock; another takes \
                      over once the dead worker's lease has expired. A live timeline is printed, \
                      then a summary: acquisitions, handoff latencies, failover time, and a check \
                      that fencing tokens strictly increased and no two holders overlapped. \
                      The connection options (--uri, --db, --collection) are not used: the demo \
                      never touches a database of yours.",
        after_help = "\
Examples:
  mongolock demo
  mongolock demo --workers 6 --ttl 3s
  cargo run -p mongolock-cli -- demo"
    )]
    Demo(DemoArgs),

    /// One worker of `mongolock demo` (internal).
    #[cfg(feature = "demo")]
    #[command(hide = true)]
    DemoWorker(DemoWorkerArgs),

    /// The process between `exec`/`elect` and their command (internal; see `supervisor.rs`).
    #[command(name = crate::supervisor::SUBCOMMAND, hide = true)]
    Supervise(SuperviseArgs),
}

/// Default lease duration for `exec` and `elect`.
pub const DEFAULT_TTL: &str = "30s";
/// The longest default grace period between SIGTERM and SIGKILL (the default is this or a third
/// of `--ttl`, whichever is shorter).
pub const MAX_DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// The grace period between SIGTERM and SIGKILL: `explicit`, or min(10 s, ttl/3).
pub fn grace(explicit: Option<Duration>, ttl: Duration) -> Duration {
    explicit.unwrap_or_else(|| MAX_DEFAULT_GRACE.min(ttl / 3))
}

/// `--grace` must fit in the last third of the lease: SIGTERM goes out when that much trusted
/// lease time is left, and renewals happen every third of it.
fn check_grace(explicit: Option<Duration>, ttl: Duration) -> Result<(), String> {
    let Some(grace) = explicit else {
        return Ok(());
    };
    let limit = ttl / 3;
    if grace <= limit {
        return Ok(());
    }
    Err(format!(
        "--grace {} is longer than a third of --ttl {} ({}): the command must be stopped before \
         its lease can expire, so SIGTERM is sent when --grace of trusted lease time is left. \
         Use --grace {} or less, or --ttl {} or more",
        display(grace),
        display(ttl),
        display(limit),
        display(limit),
        display(grace * 3)
    ))
}

impl Command {
    /// The subcommand's name as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Exec(_) => "exec",
            Command::Elect(_) => "elect",
            Command::List(_) => "list",
            Command::Inspect(_) => "inspect",
            Command::Release(_) => "release",
            Command::Watch(_) => "watch",
            Command::Completions(_) => "completions",
            Command::Man(_) => "man",
            #[cfg(feature = "demo")]
            Command::Demo(_) => "demo",
            #[cfg(feature = "demo")]
            Command::DemoWorker(_) => "demo-worker",
            Command::Supervise(_) => crate::supervisor::SUBCOMMAND,
        }
    }
}

impl Cli {
    /// Puts what clap parsed in its final form (see [`ExecArgs::normalize`]).
    pub fn normalize(&mut self) {
        if let Command::Exec(args) = &mut self.command {
            args.normalize();
        }
    }

    /// Checks that go beyond single options; an error is a usage error (exit status 2).
    pub fn check(&self) -> Result<(), String> {
        match &self.command {
            Command::Exec(a) => check_grace(a.grace, a.ttl)
                .and(a.events.check())
                .and(a.check_names()),
            Command::Elect(a) => check_grace(a.grace, a.ttl).and(a.events.check()),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Lease duration: how long the lock stays held after mongolock stops renewing it (for
    /// example after a crash). Renewed every TTL/3 while CMD runs. At least 1s: a renewal must
    /// land within a third of it.
    #[arg(
        long,
        env = "MONGOLOCK_TTL",
        value_name = "DURATION",
        default_value = DEFAULT_TTL,
        value_parser = parse_command_ttl
    )]
    pub ttl: Duration,

    /// How long to wait for the lock: a duration, `0` for a single attempt, or `forever`.
    #[arg(
        long,
        env = "MONGOLOCK_WAIT",
        value_name = "DURATION",
        default_value = "forever",
        value_parser = parse_wait
    )]
    pub wait: Wait,

    /// The exit status when --wait runs out while the lock is held elsewhere (CMD is then not
    /// run), like `flock -E`; for example 0 to treat a busy lock as nothing to do.
    #[arg(long, value_name = "N", default_value_t = crate::exit::WAIT_TIMED_OUT as u8)]
    pub conflict_exit_code: u8,

    /// Keep the lock at least DURATION after it was granted, by the database's clock: when CMD
    /// exits (with any status), the lease ends no earlier than DURATION after its grant instead
    /// of at once (the name is free right after, not after the TTL). With `--wait 0` on every
    /// replica, a scheduled job then runs at most once per DURATION however far apart the
    /// replicas' schedules fire. A lock lost before CMD exited has nothing left to hold
    /// (status 76 as usual). With several names, each lock is kept that long after its own
    /// grant. Not with --limit or --shared.
    #[arg(
        long,
        env = "MONGOLOCK_MIN_HOLD",
        value_name = "DURATION",
        value_parser = parse_min_hold,
        conflicts_with_all = ["limit", "shared"]
    )]
    pub min_hold: Option<Duration>,

    /// How long before the lease's local deadline CMD gets SIGTERM when renewals are failing
    /// (SIGKILL follows at the deadline), and the time between SIGTERM and SIGKILL after the lock
    /// was lost. At most TTL/3; 0 means SIGKILL at once, no SIGTERM [default: 10s or TTL/3,
    /// whichever is shorter].
    #[arg(long, env = "MONGOLOCK_GRACE", value_name = "DURATION", value_parser = parse_duration)]
    pub grace: Option<Duration>,

    /// Application name stored with the lease (shown by `list`/`inspect`) [default: "mongolock
    /// exec CMD"].
    #[arg(long, value_name = "NAME")]
    pub app_name: Option<String>,

    /// Hold one of N slots of the semaphore NAME instead of the lock: up to N commands run at
    /// once. Every process using NAME must pass the same N while any slot is held (otherwise
    /// exit status 78).
    #[arg(
        long,
        value_name = "N",
        value_parser = parse_limit,
        conflicts_with_all = ["shared", "write"],
        help_heading = "Lock mode"
    )]
    pub limit: Option<u32>,

    /// Hold NAME as a reader of a read-write lock: any number of --shared commands run at once,
    /// never together with a writer (--write) or a plain exclusive `exec NAME`.
    #[arg(long, conflicts_with = "write", help_heading = "Lock mode")]
    pub shared: bool,

    /// Hold NAME as the writer of a read-write lock: exclusive like a plain `exec NAME`, and
    /// while it waits new --shared readers wait too, so a stream of readers cannot starve it.
    #[arg(long, help_heading = "Lock mode")]
    pub write: bool,

    #[command(flatten)]
    pub events: EventArgs,

    /// Lock name.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// More lock names, held together with the first: all or nothing, taken in the order of
    /// their names so that commands asking for overlapping names never deadlock. Needs `--`
    /// before CMD; exclusive locks only (no --limit, --shared, --write).
    #[arg(value_name = "NAME", num_args = 1..)]
    pub more_names: Vec<String>,

    #[command(flatten)]
    pub child: ExecCommand,
}

/// The command `exec` runs: everything after `--`. (Without `--`, the words after the one NAME,
/// as before several names were possible: see [`ExecArgs::normalize`].)
#[derive(Debug, Args)]
pub struct ExecCommand {
    /// The command and its arguments (after `--`).
    #[arg(
        value_name = "CMD",
        required_unless_present = "more_names",
        num_args = 1..,
        last = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

/// How `exec` holds NAME (`--limit`, `--shared`, `--write`; by default exclusively).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecMode {
    /// The plain lock NAME (the default).
    Exclusive,
    /// The writer of the read-write lock NAME (`--write`).
    Write,
    /// A reader of the read-write lock NAME (`--shared`).
    Shared,
    /// One of this many slots of the semaphore NAME (`--limit N`).
    Slots(u32),
}

impl ExecMode {
    /// The mode's name in JSON events: `exclusive`, `write`, `shared` or `slot`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecMode::Exclusive => "exclusive",
            ExecMode::Write => "write",
            ExecMode::Shared => "shared",
            ExecMode::Slots(_) => "slot",
        }
    }
}

impl ExecArgs {
    /// `exec NAME CMD [ARGS]...` without `--` (the form from before several names): the words
    /// after NAME are the command. Only a command given after `--` follows several names.
    pub fn normalize(&mut self) {
        if self.child.command.is_empty() {
            self.child.command = std::mem::take(&mut self.more_names)
                .into_iter()
                .map(OsString::from)
                .collect();
        }
    }

    /// Every lock name, sorted and without duplicates: the order in which they are acquired.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::iter::once(self.name.clone())
            .chain(self.more_names.iter().cloned())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Checks for several names: exclusive locks only, and names that the space-separated
    /// `MONGOLOCK_NAMES` can carry.
    fn check_names(&self) -> Result<(), String> {
        let names = self.names();
        if names.len() < 2 {
            return Ok(());
        }
        let flag = match self.mode() {
            ExecMode::Exclusive => None,
            ExecMode::Slots(_) => Some("--limit"),
            ExecMode::Shared => Some("--shared"),
            ExecMode::Write => Some("--write"),
        };
        if let Some(flag) = flag {
            return Err(format!(
                "{flag} takes one NAME, but {} were given ({}): several names are held as \
                 exclusive locks only; drop {flag}, or run one `mongolock exec {flag}` per name",
                names.len(),
                names.join(", ")
            ));
        }
        if let Some(bad) = names.iter().find(|n| n.chars().any(char::is_whitespace)) {
            return Err(format!(
                "lock name {bad:?} contains whitespace, which cannot be used with several names \
                 (the command gets them in MONGOLOCK_NAMES, separated by spaces); rename the lock"
            ));
        }
        Ok(())
    }

    /// The mode the flags ask for (clap keeps them mutually exclusive).
    pub fn mode(&self) -> ExecMode {
        match (self.limit, self.shared, self.write) {
            (Some(n), _, _) => ExecMode::Slots(n),
            (None, true, _) => ExecMode::Shared,
            (None, false, true) => ExecMode::Write,
            (None, false, false) => ExecMode::Exclusive,
        }
    }
}

/// `--min-hold DURATION`: at most the library's maximum (one year).
fn parse_min_hold(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > mongolock::MAX_EXPIRY {
        return Err(format!(
            "the minimum hold {s:?} is above the maximum of one year; choose a shorter one"
        ));
    }
    Ok(d)
}

/// `--limit N`: a whole number of slots, at least 1.
fn parse_limit(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of slots; use a whole number, 1 or more"))?;
    if n == 0 {
        return Err(
            "a semaphore needs at least 1 slot: use --limit 1 or more (--limit 1 lets \
                    one command run at a time, like a plain exec)"
                .to_owned(),
        );
    }
    Ok(n)
}

/// The command `exec` and `elect` run (the last positional arguments).
#[derive(Debug, Args)]
pub struct ChildCommand {
    /// The command and its arguments (after `--`).
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct ElectArgs {
    /// Lease duration of a leadership term: how long the role stays taken after the leader
    /// stops renewing it (for example after a crash). Renewed every TTL/3. At least 1s: a
    /// renewal must land within a third of it.
    #[arg(
        long,
        env = "MONGOLOCK_TTL",
        value_name = "DURATION",
        default_value = DEFAULT_TTL,
        value_parser = parse_command_ttl
    )]
    pub ttl: Duration,

    /// How long before the term's local deadline CMD gets SIGTERM when renewals are failing
    /// (SIGKILL follows at the deadline), and the time between SIGTERM and SIGKILL after
    /// leadership was lost. At most TTL/3; 0 means SIGKILL at once, no SIGTERM [default: 10s or
    /// TTL/3, whichever is shorter].
    #[arg(long, env = "MONGOLOCK_GRACE", value_name = "DURATION", value_parser = parse_duration)]
    pub grace: Option<Duration>,

    /// Application name stored with the lease [default: "mongolock elect CMD"].
    #[arg(long, value_name = "NAME")]
    pub app_name: Option<String>,

    #[command(flatten)]
    pub events: EventArgs,

    /// Role (lock) name.
    #[arg(value_name = "NAME")]
    pub name: String,

    #[command(flatten)]
    pub child: ChildCommand,
}

/// `--json` and `--json-fd` of `exec` and `elect`: see `events.rs`.
#[derive(Debug, Clone, Args)]
pub struct EventArgs {
    /// Report events (acquired, renewed, lost, released, exited, leadership changes...) as one
    /// JSON object per line on stderr, in place of mongolock's messages there (each event
    /// carries the message as "message"). CMD's own stderr output is not changed: prefer
    /// --json-fd when CMD writes to stderr.
    #[arg(long)]
    pub json: bool,

    /// Report the --json events on file descriptor FD (opened by the caller, e.g. `3>file`)
    /// instead; mongolock's messages stay on stderr. CMD does not inherit FD. Not with --json.
    #[arg(long, value_name = "FD", conflicts_with = "json")]
    pub json_fd: Option<i32>,
}

impl EventArgs {
    /// `--json-fd` must name a descriptor other than stdin.
    fn check(&self) -> Result<(), String> {
        match self.json_fd {
            Some(fd) if fd < 1 => Err(format!(
                "--json-fd {fd}: choose an open file descriptor other than stdin (1 for stdout, \
                 3 or above for one the caller opened, e.g. `3>events.jsonl`)"
            )),
            _ => Ok(()),
        }
    }
}

/// `mongolock __supervise`: see `supervisor.rs`.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// The supervisor's end of the control socket.
    #[arg(long)]
    pub control_fd: i32,

    /// The supervisor leads a new process group, which CMD shares; passed-on signals go to the
    /// group (see `supervisor.rs`).
    #[arg(long)]
    pub own_group: bool,

    #[command(flatten)]
    pub child: ChildCommand,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub filter: FilterArgs,
}

/// `--held` and `--prefix` of `list` and `watch`.
#[derive(Debug, Clone, Args)]
pub struct FilterArgs {
    /// Only locks with an unexpired lease (by the server's clock).
    #[arg(long)]
    pub held: bool,

    /// Only locks whose names start with P (plain text: no character is special). Selected by
    /// the server.
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
}

impl FilterArgs {
    /// The library's filter.
    pub fn filter(&self) -> mongolock::ListFilter {
        let mut f = mongolock::ListFilter::new().held(self.held);
        if let Some(p) = &self.prefix {
            f = f.prefix(p.clone());
        }
        f
    }

    /// How the filter reads in messages: ` matching prefix "x", held only`, or empty.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = self.prefix.as_deref().filter(|p| !p.is_empty()) {
            parts.push(format!("with prefix {p:?}"));
        }
        if self.held {
            parts.push("held".to_owned());
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        }
    }
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Print a JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    /// Lock name.
    #[arg(value_name = "NAME")]
    pub name: String,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Required: confirms that the current holder's lease should be ended.
    #[arg(long, required = true)]
    pub force: bool,

    /// End the lease only if it still has fencing token N (see `inspect`): one conditional
    /// write on the server, so a holder that took over meanwhile is left alone (exit status
    /// 79 then). For a semaphore or read-write lock, ends only the slot with that token.
    #[arg(long, value_name = "N")]
    pub token: Option<u64>,

    /// Lock name.
    #[arg(value_name = "NAME")]
    pub name: String,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The longest time between refreshes (changes to the locks on screen are shown at once
    /// where the database reports them).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_positive)]
    pub interval: Duration,

    /// Print the locks once and exit.
    #[arg(long, conflicts_with = "count")]
    pub once: bool,

    /// Exit after N refreshes.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,

    /// Print each refresh as one JSON object per line: {"observed_at", "namespace", "locks"},
    /// each lock as in `list --json`.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write mongolock.1 and one mongolock-COMMAND.1 per command into DIR instead of printing.
    #[arg(long, value_name = "DIR", conflicts_with = "command")]
    pub dir: Option<std::path::PathBuf>,

    /// The command whose page to print (default: the main page).
    #[arg(value_name = "COMMAND")]
    pub command: Option<String>,
}

#[cfg(feature = "demo")]
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Number of worker processes (2-16).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(2..=16))]
    pub workers: u8,

    /// Lease duration of each acquisition (the failover time after the crash).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_ttl)]
    pub ttl: Duration,

    /// How long each worker holds the lock per turn.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = parse_positive)]
    pub work: Duration,
}

#[cfg(feature = "demo")]
#[derive(Debug, Args)]
pub struct DemoWorkerArgs {
    /// Worker number (for messages).
    #[arg(long)]
    pub id: u32,

    /// Lock name.
    #[arg(long)]
    pub name: String,

    /// Lease duration.
    #[arg(long, value_parser = parse_positive)]
    pub ttl: Duration,

    /// How long to hold the lock per turn.
    #[arg(long, value_parser = parse_positive)]
    pub work: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_takes_the_command_after_double_dash() {
        let cli = Cli::try_parse_from([
            "mongolock",
            "--db",
            "x",
            "exec",
            "--wait",
            "0",
            "job",
            "--",
            "ls",
            "-l",
            "--wait",
        ])
        .unwrap();
        let Command::Exec(args) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(args.name, "job");
        assert_eq!(args.wait, Wait::For(Duration::ZERO));
        assert_eq!(args.child.command, ["ls", "-l", "--wait"]);
        assert_eq!(cli.global.db, "x");
    }

    #[test]
    fn exec_accepts_options_after_the_name_and_globals_after_the_command() {
        let cli = Cli::try_parse_from([
            "mongolock",
            "exec",
            "job",
            "--ttl",
            "5s",
            "--uri",
            "mongodb://h",
            "--",
            "true",
        ])
        .unwrap();
        let Command::Exec(args) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(args.ttl, Duration::from_secs(5));
        assert_eq!(args.wait, Wait::Forever);
        assert_eq!(cli.global.uri.as_deref(), Some("mongodb://h"));
    }

    #[test]
    fn exec_modes_come_from_the_flags_and_exclude_each_other() {
        let mode = |flags: &[&str]| {
            let mut args = vec!["mongolock", "exec"];
            args.extend_from_slice(flags);
            args.extend_from_slice(&["job", "--", "true"]);
            Cli::try_parse_from(args).map(|cli| match cli.command {
                Command::Exec(a) => a.mode(),
                _ => panic!("not exec"),
            })
        };
        assert_eq!(mode(&[]).unwrap(), ExecMode::Exclusive);
        assert_eq!(mode(&["--limit", "3"]).unwrap(), ExecMode::Slots(3));
        assert_eq!(mode(&["--shared"]).unwrap(), ExecMode::Shared);
        assert_eq!(mode(&["--write"]).unwrap(), ExecMode::Write);
        for bad in [
            &["--limit", "0"][..],
            &["--limit", "-1"],
            &["--limit", "x"],
            &["--shared", "--limit", "2"],
            &["--write", "--limit", "2"],
            &["--shared", "--write"],
        ] {
            let err = mode(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn exec_takes_several_names_before_double_dash() {
        let parse = |args: &[&str]| {
            let mut all = vec!["mongolock", "exec"];
            all.extend_from_slice(args);
            let mut cli = Cli::try_parse_from(all).unwrap();
            cli.normalize();
            match cli.command {
                Command::Exec(a) => (a.names(), a.child.command.clone(), a.ttl),
                _ => panic!("not exec"),
            }
        };
        let (names, cmd, _) = parse(&["b", "a", "--", "sh", "-c", "x", "--", "y"]);
        assert_eq!(names, ["a", "b"]);
        assert_eq!(cmd, ["sh", "-c", "x", "--", "y"]);
        let (names, cmd, ttl) = parse(&["c", "a", "c", "--ttl", "5s", "--", "true"]);
        assert_eq!(names, ["a", "c"]);
        assert_eq!(cmd, ["true"]);
        assert_eq!(ttl, Duration::from_secs(5));
        // Without `--`, as before: one NAME, then the command.
        let (names, cmd, _) = parse(&["job", "ls", "dir"]);
        assert_eq!(names, ["job"]);
        assert_eq!(cmd, ["ls", "dir"]);
    }

    #[test]
    fn release_requires_force() {
        assert!(Cli::try_parse_from(["mongolock", "release", "job"]).is_err());
        assert!(Cli::try_parse_from(["mongolock", "release", "--force", "job"]).is_ok());
    }

    #[test]
    fn exec_requires_a_command() {
        assert!(Cli::try_parse_from(["mongolock", "exec", "job"]).is_err());
        assert!(Cli::try_parse_from(["mongolock", "exec", "job", "--"]).is_err());
    }
}
