//! `mongolock elect`: campaign for a role, run CMD while leader, campaign again after losing
//! leadership, exit when CMD exits on its own.
//!
//! Built on the library's [`Election`]: the role is a lock of the same name, the term is the
//! lease's fencing token (CMD's `MONGOLOCK_FENCING_TOKEN`), [`Leadership::lost`] is the loss
//! signal and resigning releases the lease.

use std::time::Duration;

use mongolock::election::{Election, Leadership};

use crate::cli::{self, ElectArgs, GlobalArgs};
use crate::connect::Connection;
use crate::duration::human;
use crate::exec::{
    connect_supervisor, describe_holder, describe_status, lost_before_finish, spawn, supervise,
    Outcome, StopPolicy,
};
use crate::exit::{self, CliError};
use crate::signals::{self, Signals};

/// Pause before campaigning again after a loss, so that a flapping connection does not make
/// the command restart in a tight loop.
const RECAMPAIGN_PAUSE: Duration = Duration::from_millis(200);

/// `mongolock elect`.
pub async fn run(global: &GlobalArgs, args: ElectArgs) -> Result<i32, CliError> {
    let mut signals = Signals::install()?;
    let (conn, provider) = match connect_supervisor(
        global,
        &mut signals,
        "elect",
        args.ttl,
        args.app_name.clone(),
        &args.child.command,
    )
    .await?
    {
        Ok(connected) => connected,
        Err(status) => return Ok(status),
    };
    let election = Election::new(&provider, args.name.clone())
        .and_then(|e| e.with_expiry(args.ttl))
        .map_err(|e| conn.error("cannot use this role name", &e))?;
    let name = &args.name;
    let policy = StopPolicy::new(args.ttl, cli::grace(args.grace, args.ttl));

    let mut terms = 0u64;
    loop {
        if terms == 0 {
            match describe_holder(&provider, name).await {
                Some(leader) => say!(
                    "mongolock: campaigning for leadership of {name:?} (current leader: {leader})"
                ),
                None => say!("mongolock: campaigning for leadership of {name:?}"),
            }
        }
        let started = tokio::time::Instant::now();
        let leadership = tokio::select! {
            r = election.campaign() => r.map_err(|e| conn.error(&format!("cannot campaign for {name:?}"), &e))?,
            sig = signals.recv() => {
                say!(
                    "mongolock: {} received while campaigning for {name:?}; exiting",
                    signals::name(sig)
                );
                return Ok(exit::for_signal(sig));
            }
        };
        terms += 1;
        say!(
            "mongolock: elected leader of {name:?} (term / fencing token {}) after {}; starting \
             the command",
            leadership.term(),
            human(started.elapsed())
        );
        let child = match spawn(&args.child.command, leadership.guard(), policy).await {
            Ok(child) => child,
            Err(e) => {
                if let Err(re) = leadership.resign().await {
                    tracing::warn!(role = %name, error = %conn.error("resign", &re), "could not resign");
                }
                return Err(e);
            }
        };
        let outcome = supervise(
            leadership.guard(),
            child,
            &mut signals,
            policy,
            "leadership of",
        )
        .await?;
        if outcome.lost {
            drop(leadership);
            say!(
                "mongolock: the command was stopped after losing leadership of {name:?}; \
                 campaigning again"
            );
            tokio::select! {
                () = tokio::time::sleep(RECAMPAIGN_PAUSE) => {}
                sig = signals.recv() => return Ok(exit::for_signal(sig)),
            }
            continue;
        }
        // The command exited on its own (or after a signal we passed on): resign and exit with
        // its status.
        return resign(leadership, outcome, &conn).await;
    }
}

/// Resigns after the command exited on its own; the status is the command's, or
/// [`exit::LOCK_LOST`] when leadership turned out to be lost already.
async fn resign(
    leadership: Leadership,
    outcome: Outcome,
    conn: &Connection,
) -> Result<i32, CliError> {
    let name = leadership.role().to_owned();
    if leadership.is_lost() {
        drop(leadership);
        let status = describe_status(outcome.status);
        say!("{}", lost_before_finish("leadership of", &name, &status));
        return Ok(exit::LOCK_LOST);
    }
    match leadership.resign().await {
        Ok(()) => {
            say!("mongolock: the command exited; resigned leadership of {name:?}");
            Ok(exit::for_child(outcome.status))
        }
        Err(mongolock::Error::LeaseLost { .. }) => {
            let status = describe_status(outcome.status);
            say!("{}", lost_before_finish("leadership of", &name, &status));
            Ok(exit::LOCK_LOST)
        }
        Err(e) => {
            say!(
                "mongolock: warning: {}; the lease expires by itself",
                conn.error(&format!("could not resign leadership of {name:?}"), &e)
            );
            Ok(exit::for_child(outcome.status))
        }
    }
}
