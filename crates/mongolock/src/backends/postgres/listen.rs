//! LISTEN/NOTIFY wake-ups and early loss detection: **one listening connection per
//! [`PostgresBackend`](super::PostgresBackend)** (shared by its clones, every waiter and every
//! holder), opened on first need.
//!
//! # What is published
//! A trigger on the lock table (created by the migration, `schema.rs`) calls `pg_notify` on
//! the table's channel for every insert, every delete and every update that changes the lease
//! id or the fencing token, with the payload `<token> <lease id or -> <name>`. So grants,
//! releases, takeovers, force-releases and cleanup are published; extensions (only
//! `expires_at` changes) and busy attempts (no write) are not. PostgreSQL delivers a
//! notification when its transaction commits, in commit order, to every session that listens
//! on the channel: the change is visible to a read made after it arrives.
//!
//! # Wake-ups, without a stampede
//! Each notification is dispatched to the name's entry in the per-name registry shared with
//! the other backends (`backends/wakeups.rs`), which holds only names somebody in this process
//! waits on or holds. A payload without a lease (release, force-release, delete) wakes the
//! longest-waiting registered acquirer of the name in this process (one per change) and every
//! observer; a grant wakes observers and holders only (it frees nothing). While the listener is
//! up, a busy acquirer otherwise sleeps until the holder's reported expiry (an expiry writes
//! nothing, and a crashed holder neither).
//!
//! # Early loss detection
//! [`lease_gone`](crate::LockBackend::lease_gone) completes when a notification shows the name
//! with another lease id or none. Every payload carries the row's fencing token, and the
//! backend remembers the token of each lease it granted until it is released, so a late
//! notification (one from before our grant) is recognized by its smaller token. For a lease the
//! backend did not grant itself, or after the listener had to reconnect (changes in between are
//! unknown), the holder reads its row once.
//!
//! # Fallback and reconnection
//! Notifications sent while no session listens are lost (PostgreSQL keeps no history), so:
//! * while the listening connection is down (connection refused, killed with
//!   `pg_terminate_backend`, server restart), the registry is not live: every waiter is woken
//!   and polls with the provider's wait strategy, and holders rely on extension and their
//!   local deadline;
//! * the task reconnects with exponential backoff (50 ms to 5 s); once `LISTEN` is in place
//!   again, every waiter is woken to re-check and every holder reads its row once;
//! * a connection that stops answering is detected by a ping (an empty query) every
//!   [`PING_EVERY`], answered within [`PING_TIMEOUT`], and replaced.
//!
//! The task ends when the last clone of the backend is dropped.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, Config, Notification};

use super::tls::MakeTls;

use super::errors;
use crate::backend::{ChangeWaiter, LeaseId};
use crate::backends::wakeups::{Change, Hub, NameRef, Status};
use crate::wait::WaitStrategy;

/// Leases remembered for loss detection; beyond this (leaked guards), new grants are not
/// remembered and their changes are checked with a read instead.
const MAX_REMEMBERED_LEASES: usize = 1 << 20;

/// How often an idle listening connection is pinged.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(5);

/// How long a ping (or opening the connection and `LISTEN`) may take before the connection is
/// taken for dead.
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection that broke sooner than this after opening is reopened after a backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(1);

/// A lease granted by this backend, remembered until it is released.
struct Held {
    /// Keeps the name's entry (and so its latest change) while the lease is held.
    entry: NameRef,
    token: u64,
    /// The last change judged for this lease.
    seen: u64,
}

/// What a change means for a holder.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Still ours (or old news).
    Held,
    /// Another lease id, or none, at or after our grant.
    Gone,
    /// Cannot tell from the change: read the row.
    Check,
}

fn judge(change: &Change, ours: &LeaseId, our_token: Option<u64>) -> Verdict {
    match change {
        Change::Nothing => Verdict::Held,
        Change::Unknown => Verdict::Check,
        Change::Lease {
            lease_id: Some(l), ..
        } if l == ours.as_str() => Verdict::Held,
        Change::Lease { token: Some(t), .. } => match our_token {
            // A change from before our grant, delivered late.
            Some(mine) if *t < mine => Verdict::Held,
            Some(_) => Verdict::Gone,
            None => Verdict::Check,
        },
        Change::Lease { token: None, .. } => Verdict::Check,
    }
}

/// The payload `<token> <lease id or -> <name>` as the name and its change.
fn parse(payload: &str) -> Option<(&str, Change)> {
    let mut parts = payload.splitn(3, ' ');
    let token = parts.next()?.parse::<u64>().ok()?;
    let lease = parts.next()?;
    let name = parts.next()?;
    let lease_id = (lease != "-").then(|| lease.to_owned());
    Some((
        name,
        Change::Lease {
            lease_id,
            token: Some(token),
        },
    ))
}

fn dispatch(hub: &Hub, payload: &str) {
    match parse(payload) {
        Some((
            name,
            change @ Change::Lease {
                lease_id: Some(_), ..
            },
        )) => hub.dispatch_grant(name, change),
        Some((name, change)) => hub.dispatch(name, change),
        None => {
            tracing::warn!(%payload, "unexpected lock notification; every waiter and holder re-checks");
            hub.wake_all(true);
        }
    }
}

/// The shared listening connection of one backend; see the [module docs](self).
pub(crate) struct Listener {
    hub: Arc<Hub>,
    config: Config,
    tls: MakeTls,
    channel: String,
    /// Dropping the sender (with the backend) stops the task.
    task: Mutex<Option<oneshot::Sender<()>>>,
    held: Mutex<HashMap<LeaseId, Held>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("channel", &self.channel)
            .field("status", &self.hub.status())
            .field("watched_names", &self.hub.watched_names())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener whose connection opens on first need; `enabled: false` means never (poll).
    pub(crate) fn new(config: Config, tls: MakeTls, channel: String, enabled: bool) -> Listener {
        Listener {
            hub: Hub::new(if enabled {
                Status::Idle
            } else {
                Status::Unavailable
            }),
            config,
            tls,
            channel,
            task: Mutex::new(None),
            held: Mutex::new(HashMap::new()),
        }
    }

    fn held(&self) -> MutexGuard<'_, HashMap<LeaseId, Held>> {
        // Single inserts/removes/assignments: a poisoned map is consistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the listening task unless it runs (or notifications are off). Needs a Tokio
    /// runtime; without one nothing starts and callers poll.
    pub(crate) fn ensure_started(&self) {
        if self.hub.status() != Status::Idle {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if !self.hub.transition(Status::Idle, Status::Opening) {
            return;
        }
        let (stop, stopped) = oneshot::channel();
        // Replacing an earlier sender stops an earlier task, should one still run.
        *task = Some(stop);
        runtime.spawn(run(
            self.hub.clone(),
            self.config.clone(),
            self.tls.clone(),
            self.channel.clone(),
            stopped,
        ));
    }

    /// Whether every change is delivered; starts the listener if needed.
    pub(crate) fn is_live(&self) -> bool {
        self.ensure_started();
        self.hub.is_live()
    }

    pub(crate) fn watched_names(&self) -> usize {
        self.hub.watched_names()
    }

    pub(crate) fn change_waiter(&self, name: &str) -> Option<ChangeWaiter> {
        self.ensure_started();
        if self.hub.status() == Status::Unavailable {
            return None;
        }
        Some(self.hub.change_waiter(name))
    }

    pub(crate) async fn wait_for_change(&self, name: &str, max_wait: Duration) {
        self.ensure_started();
        if self.hub.status() == Status::Unavailable {
            tokio::time::sleep(max_wait).await;
        } else {
            self.hub.wait_for_change(name, max_wait).await;
        }
    }

    /// Remembers a lease this backend granted (its token, and which changes are news to it).
    pub(crate) fn granted(&self, name: &str, lease_id: &LeaseId, token: u64) {
        if self.hub.status() == Status::Unavailable {
            return;
        }
        let entry = self.hub.name(name);
        let seen = self.hub.seq();
        let mut held = self.held();
        if held.len() < MAX_REMEMBERED_LEASES || held.contains_key(lease_id) {
            held.insert(lease_id.clone(), Held { entry, token, seen });
        }
    }

    /// Forgets a lease (released, or given up on).
    pub(crate) fn released(&self, lease_id: &LeaseId) {
        let removed = self.held().remove(lease_id);
        // The entry handle is dropped outside the map lock.
        drop(removed);
    }

    /// Completes when the lease `lease_id` of `name` is gone; pending forever when
    /// notifications are off. `still_holds` reads the row (a failed read should say "held":
    /// the next extension decides).
    pub(crate) async fn lease_gone<F, Fut>(&self, name: &str, lease_id: &LeaseId, still_holds: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = bool>,
    {
        self.ensure_started();
        let entry = self.hub.name(name);
        let mut changes = entry.state().subscribe();
        let remembered = self
            .held()
            .get(lease_id)
            .filter(|h| h.entry.name() == name)
            .map(|h| (h.token, h.seen));
        let (token, mut seen) = match remembered {
            Some((token, seen)) => (Some(token), seen),
            // Not granted here: only later changes are news.
            None => (None, changes.borrow().0),
        };
        loop {
            if self.hub.status() == Status::Unavailable {
                // No notifications will come: loss is detected by extension.
                return std::future::pending().await;
            }
            let (seq, change) = changes.borrow_and_update().clone();
            if seq > seen {
                let gone = match judge(&change, lease_id, token) {
                    Verdict::Held => false,
                    Verdict::Gone => true,
                    Verdict::Check => !still_holds().await,
                };
                if gone {
                    tracing::debug!(lock = %name, "a notification shows the lease gone");
                    return;
                }
                seen = seq;
                if let Some(h) = self.held().get_mut(lease_id) {
                    h.seen = h.seen.max(seq);
                }
            }
            if changes.changed().await.is_err() {
                // The sender lives in the entry we hold; never busy-loop.
                return std::future::pending().await;
            }
        }
    }
}

/// Marks the task gone when it ends for any reason (also when its runtime shuts down), so the
/// next use starts a new one, and wakes every waiter so nobody waits for notifications that
/// will not come.
struct Running(Arc<Hub>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.status() != Status::Unavailable {
            self.0.set_status(Status::Idle);
        }
        self.0.wake_all(false);
    }
}

/// Aborts the task driving a connection when dropped.
struct Driver(JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An open listening connection: the client (for pings), its notifications (an error or the
/// end of the channel means the connection is gone) and the task driving it.
struct Open {
    client: tokio_postgres::Client,
    notifications: mpsc::UnboundedReceiver<Result<Notification, tokio_postgres::Error>>,
    _driver: Driver,
}

/// Connects and runs `LISTEN`.
async fn open(config: &Config, tls: &MakeTls, channel: &str) -> Result<Open, String> {
    let (client, mut connection) = config
        .connect(tls.clone())
        .await
        .map_err(|e| errors::describe(&e))?;
    let (tx, notifications) = mpsc::unbounded_channel();
    let driver = Driver(tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(Ok(n)).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    }));
    // The channel is `mongolock_` and hex digits: a plain identifier.
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .map_err(|e| errors::describe(&e))?;
    Ok(Open {
        client,
        notifications,
        _driver: driver,
    })
}

/// Sleeps for `d` unless stopped first; false when stopped.
async fn pause(d: Duration, stopped: &mut oneshot::Receiver<()>) -> bool {
    tokio::select! {
        _ = stopped => false,
        _ = tokio::time::sleep(d) => true,
    }
}

fn retry_backoff() -> crate::wait::Backoff {
    WaitStrategy::ExponentialBackoff {
        initial: Duration::from_millis(50),
        max: Duration::from_secs(5),
        multiplier: 2.0,
        jitter: 0.25,
    }
    .start()
}

/// The listening task; see the [module docs](self).
async fn run(
    hub: Arc<Hub>,
    config: Config,
    tls: MakeTls,
    channel: String,
    mut stopped: oneshot::Receiver<()>,
) {
    let _running = Running(hub.clone());
    let mut retry = retry_backoff();
    let mut warned = false;
    let mut reopened = false;
    loop {
        let opened = tokio::select! {
            _ = &mut stopped => return,
            r = tokio::time::timeout(PING_TIMEOUT, open(&config, &tls, &channel)) => {
                r.unwrap_or_else(|_| Err(format!("no answer within {PING_TIMEOUT:?}")))
            }
        };
        let mut conn = match opened {
            Ok(c) => c,
            Err(error) => {
                if !warned {
                    warned = true;
                    tracing::warn!(%channel, %error, "cannot open the lock notification connection; waiters poll until it is back");
                } else {
                    tracing::debug!(%channel, %error, "cannot open the lock notification connection yet");
                }
                if hub.status() != Status::Opening {
                    hub.set_status(Status::Opening);
                    hub.wake_all(false);
                }
                if !pause(retry.next_delay(), &mut stopped).await {
                    return;
                }
                continue;
            }
        };
        let opened_at = Instant::now();
        hub.set_status(Status::Live);
        if warned {
            tracing::info!(%channel, "the lock notification connection is back");
            warned = false;
        }
        tracing::debug!(%channel, "listening for lock changes");
        // Changes made before LISTEN took effect are unknown: every waiter re-checks once, and
        // after a lost connection every holder reads its row once.
        hub.wake_all(reopened);
        reopened = true;
        let broke = loop {
            tokio::select! {
                _ = &mut stopped => return,
                n = conn.notifications.recv() => match n {
                    Some(Ok(n)) => dispatch(&hub, n.payload()),
                    Some(Err(e)) => break errors::describe(&e),
                    None => break "the connection was closed".to_owned(),
                },
                _ = tokio::time::sleep(PING_EVERY) => {
                    match tokio::time::timeout(PING_TIMEOUT, conn.client.simple_query("")).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => break errors::describe(&e),
                        Err(_) => break format!("a ping got no answer within {PING_TIMEOUT:?}"),
                    }
                }
            }
        };
        drop(conn);
        tracing::warn!(%channel, error = %broke, "lost the lock notification connection; waiters poll until it is back");
        hub.set_status(Status::Opening);
        hub.wake_all(false);
        if opened_at.elapsed() >= HEALTHY_AFTER {
            retry = retry_backoff();
        } else if !pause(retry.next_delay(), &mut stopped).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: Option<&str>, token: Option<u64>) -> Change {
        Change::Lease {
            lease_id: id.map(str::to_owned),
            token,
        }
    }

    #[test]
    fn payloads_are_parsed() {
        assert_eq!(
            parse("7 abc my lock"),
            Some(("my lock", lease(Some("abc"), Some(7))))
        );
        assert_eq!(parse("8 - x y"), Some(("x y", lease(None, Some(8)))));
        assert_eq!(parse("nope - x"), None);
        assert_eq!(parse("9 -"), None);
    }

    #[test]
    fn holders_judge_changes_by_lease_id_and_token() {
        let ours = LeaseId::from_string("ours");
        assert_eq!(
            judge(&lease(Some("ours"), Some(7)), &ours, Some(7)),
            Verdict::Held
        );
        assert_eq!(
            judge(&lease(Some("old"), Some(6)), &ours, Some(7)),
            Verdict::Held
        );
        assert_eq!(
            judge(&lease(Some("new"), Some(8)), &ours, Some(7)),
            Verdict::Gone
        );
        assert_eq!(judge(&lease(None, Some(7)), &ours, Some(7)), Verdict::Gone);
        assert_eq!(judge(&lease(None, Some(7)), &ours, None), Verdict::Check);
        assert_eq!(judge(&Change::Unknown, &ours, Some(7)), Verdict::Check);
    }
}
