//! `mongolock elect`: campaign for a role, run CMD while leader, campaign again after losing
//! leadership, exit when CMD exits on its own.
//!
//! Built on the library's [`Election`](mongolock::Election): the role is a lock of the same
//! name, the term is the lease's fencing token (CMD's `MONGOLOCK_FENCING_TOKEN`),
//! [`Leadership::lost`] is the loss signal and resigning releases the lease.

use std::time::Duration;

use futures_util::StreamExt;
use mongolock::election::{LeaderInfo, Leadership};

use crate::cli::{self, ElectArgs, GlobalArgs};
use crate::connect::Connection;
use crate::duration::human;
use crate::events::{leader_json, Event, Lease};
use crate::exec::{
    connect_supervisor, describe_status, lost_after_exit, spawn, supervise, Outcome, StopPolicy,
};
use crate::exit::{self, CliError};
use crate::signals::{self, Signals};
use crate::status_line;

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
    let election = provider
        .election(args.name.clone())
        .and_then(|e| e.with_expiry(args.ttl))
        .map_err(|e| conn.error("cannot use this role name", &e))?;
    let name = &args.name;
    let policy = StopPolicy::new(args.ttl, cli::grace(args.grace, args.ttl));

    // The term of the leader last reported (`None`: no leader), so that only changes are.
    let mut known: Option<u64> = None;
    let mut terms = 0u64;
    loop {
        if terms == 0 {
            // Informational: a failed read only leaves the current leader out of the message.
            let leader = election.leader().await.ok().flatten();
            known = leader.as_ref().map(|l| l.term);
            let message = match &leader {
                Some(leader) => format!(
                    "mongolock: campaigning for leadership of {name:?} (current leader: {})",
                    describe_leader(leader)
                ),
                None => format!("mongolock: campaigning for leadership of {name:?}"),
            };
            Event::new("campaigning")
                .name(name)
                .field("leader", leader_json(leader.as_ref()))
                .message(message)
                .info()
                .emit();
        }
        let started = tokio::time::Instant::now();
        // Leader changes are reported while campaigning (our own term as `acquired`).
        let mut leaders = election.watch_leader();
        let waiting = status_line::start(
            &provider,
            status_line::Subject {
                name: name.clone(),
                doing: format!("campaigning for leadership of {name:?}"),
                holder_is: "leader",
            },
        );
        let campaign = election.campaign();
        tokio::pin!(campaign);
        let leadership = loop {
            tokio::select! {
                biased;
                r = &mut campaign => break r.map_err(|e| conn.error(&format!("cannot campaign for {name:?}"), &e))?,
                sig = signals.recv() => {
                    Event::new("interrupted")
                        .name(name)
                        .field("signal", signals::name(sig))
                        .message(format!(
                            "mongolock: {} received while campaigning for {name:?}; exiting",
                            signals::name(sig)
                        ))
                        .emit();
                    return Ok(exit::for_signal(sig));
                }
                Some(change) = leaders.next() => {
                    let Ok(leader) = change else { continue };
                    let term = leader.as_ref().map(|l| l.term);
                    if term == known {
                        continue;
                    }
                    known = term;
                    let ours = leader.as_ref().is_some_and(|l| l.holder.as_ref() == Some(provider.holder()));
                    if !ours {
                        leader_changed(name, leader.as_ref());
                    }
                }
            }
        };
        drop(leaders);
        drop(waiting);
        known = Some(leadership.term());
        terms += 1;
        Event::new("acquired")
            .lease(leadership.guard())
            .field("term", leadership.term())
            .field(
                "waited_ms",
                u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            )
            .message(format!(
                "mongolock: elected leader of {name:?} (term / fencing token {}) after {}; \
                 starting the command",
                leadership.term(),
                human(started.elapsed())
            ))
            .info()
            .emit();
        let child = match spawn(&args.child.command, leadership.guard(), policy).await {
            Ok(child) => child,
            Err(e) if e.code == exit::LOCK_LOST => {
                // The term was lost before the command could start: nothing ran; campaign again.
                let lease = Lease::of(leadership.guard());
                drop(leadership);
                Event::new("lost")
                    .lease_snapshot(&lease)
                    .field("action", "command not run")
                    .message(format!("mongolock: {e}; campaigning again"))
                    .emit();
                tokio::select! {
                    () = tokio::time::sleep(RECAMPAIGN_PAUSE) => {}
                    sig = signals.recv() => return Ok(exit::for_signal(sig)),
                }
                continue;
            }
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
            let lease = Lease::of(leadership.guard());
            drop(leadership);
            Event::new("stopped")
                .lease_snapshot(&lease)
                .message(format!(
                    "mongolock: the command was stopped after losing leadership of {name:?}; \
                     campaigning again"
                ))
                .emit();
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
    let lease = Lease::of(leadership.guard());
    let name = lease.name.clone();
    let status = describe_status(outcome.status);
    if leadership.is_lost() {
        let reason = leadership.guard().lost_reason().map(|r| r.to_string());
        drop(leadership);
        lost_after_exit(&lease, "leadership of", &status, reason);
        return Ok(exit::LOCK_LOST);
    }
    match leadership.resign().await {
        Ok(()) => {
            Event::new("released")
                .lease_snapshot(&lease)
                .message(format!(
                    "mongolock: the command exited; resigned leadership of {name:?}"
                ))
                .info()
                .emit();
            Ok(exit::for_child(outcome.status))
        }
        Err(mongolock::Error::LeaseLost { .. }) => {
            lost_after_exit(&lease, "leadership of", &status, None);
            Ok(exit::LOCK_LOST)
        }
        Err(e) => {
            Event::new("release-failed")
                .lease_snapshot(&lease)
                .message(format!(
                    "mongolock: warning: {}; the lease expires by itself",
                    conn.error(&format!("could not resign leadership of {name:?}"), &e)
                ))
                .emit();
            Ok(exit::for_child(outcome.status))
        }
    }
}

/// `host (pid 12) app "x" (term 7, lease expires in 12.3s)`.
fn describe_leader(leader: &LeaderInfo) -> String {
    let holder = leader
        .holder
        .as_ref()
        .map_or_else(|| "another holder".to_owned(), |h| h.to_string());
    let expires = leader.expires_at.map_or_else(String::new, |at| {
        let left = at
            .duration_since(leader.observed_at)
            .unwrap_or(Duration::ZERO);
        format!(", lease expires in {}", human(left))
    });
    format!("{holder} (term {}{expires})", leader.term)
}

/// Reports that another process became leader of `name`, or that the role became free.
fn leader_changed(name: &str, leader: Option<&LeaderInfo>) {
    let message = match leader {
        Some(l) => format!(
            "mongolock: {} is now leader of {name:?}",
            describe_leader(l)
        ),
        None => format!("mongolock: {name:?} has no leader now"),
    };
    Event::new("leader")
        .name(name)
        .field("leader", leader_json(leader))
        .message(message)
        .info()
        .emit();
}
