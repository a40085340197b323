//! `mongolock elect`: campaign for a role, run CMD while leader, campaign again after losing
//! leadership, exit when CMD exits on its own.
//!
//! Built on the lock API: the role is a lock acquired with no time limit; the guard's lost
//! signal is the loss of leadership; resigning is releasing.

use std::time::Duration;

use crate::cli::{ElectArgs, GlobalArgs};
use crate::connect::connect;
use crate::duration::human;
use crate::exec::{default_app_name, describe_holder, finish, release_quietly, spawn, supervise};
use crate::exit::{self, CliError};
use crate::signals::{self, Signals};

/// Pause before campaigning again after a loss, so that a flapping connection does not make
/// the command restart in a tight loop.
const RECAMPAIGN_PAUSE: Duration = Duration::from_millis(200);

/// `mongolock elect`.
pub async fn run(global: &GlobalArgs, args: ElectArgs) -> Result<i32, CliError> {
    let mut signals = Signals::install()?;
    let conn = tokio::select! {
        c = connect(global) => c?,
        sig = signals.recv() => return Ok(exit::for_signal(sig)),
    };
    let app = args
        .app_name
        .clone()
        .unwrap_or_else(|| default_app_name("elect", &args.command));
    let provider = conn.provider(Some(args.ttl), Some(app))?;
    let lock = provider
        .lock(args.name.clone())
        .map_err(|e| conn.error("cannot use this role name", &e))?;
    let name = &args.name;

    let mut terms = 0u64;
    loop {
        if terms == 0 {
            match describe_holder(&provider, name).await {
                Some(leader) => eprintln!(
                    "mongolock: campaigning for leadership of {name:?} (current leader: {leader})"
                ),
                None => eprintln!("mongolock: campaigning for leadership of {name:?}"),
            }
        }
        let started = tokio::time::Instant::now();
        let guard = tokio::select! {
            r = lock.acquire() => r.map_err(|e| conn.error(&format!("cannot campaign for {name:?}"), &e))?,
            sig = signals.recv() => {
                eprintln!(
                    "mongolock: {} received while campaigning for {name:?}; exiting",
                    signals::name(sig)
                );
                return Ok(exit::for_signal(sig));
            }
        };
        terms += 1;
        eprintln!(
            "mongolock: elected leader of {name:?} (fencing token {}) after {}; starting the \
             command",
            guard.fencing_token(),
            human(started.elapsed())
        );
        let child = match spawn(&args.command, &guard) {
            Ok(child) => child,
            Err(e) => {
                release_quietly(guard, &conn).await;
                return Err(e);
            }
        };
        let outcome = supervise(&guard, child, &mut signals, args.grace, "leadership of").await?;
        if outcome.lost {
            drop(guard);
            eprintln!(
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
        let code = finish(guard, outcome, &conn, "leadership of").await?;
        if code != exit::LOCK_LOST {
            eprintln!("mongolock: the command exited; resigned leadership of {name:?}");
        }
        return Ok(code);
    }
}
