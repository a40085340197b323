//! LISTEN/NOTIFY wake-ups and early loss detection: **one listening connection per
//! [`PostgresBackend`](super::PostgresBackend)** (shared by its clones, every waiter and every
//! holder), opened on first need.
//!
//! # What is published
//! A trigger on the lock table (created by the migration, `schema.rs`) calls `pg_notify` on
//! the table's channel for every insert, every delete and every update that changes the lease
//! id or the fencing token, with the payload `<token> <lease id or -> <name>`, or for a release
//! that designates the next process `<token>/<designated mark>/<releasing mark> - <name>`
//! (`queue.rs`). A lease its holder keeps on with a minimum hold (`release_after`: neither lease
//! id nor token changes) is published by the statement itself as `<token> - <name>`, which
//! wakes one acquirer per process (it retries and learns the new expiry); no holder of the name
//! remains to be misled by its "no lease". So grants, releases, takeovers, force-releases and cleanup are published;
//! extensions (only `expires_at` changes) and busy attempts (no write, or only the queue) are
//! not. PostgreSQL delivers a notification when its transaction commits, in commit order, to
//! every session that listens on the channel: the change is visible to a read made after it
//! arrives.
//!
//! # Everything else is the shared notification core
//! The listening connection is the [`Feed`] of the backend's [`Notifier`]
//! (`backends/notify/`), which the MongoDB backend's change stream shares; this module only
//! opens the connection and reads its payloads. Each payload is delivered to the name's entry
//! in the per-name registry (`backends/notify/hub.rs`): a payload without a lease (release,
//! force-release, delete) wakes every observer and the holders, and one registered acquirer of
//! the name in this process — at once when the release designated this backend or nobody (or
//! the payload names no designation), else only after the handoff fallback if nothing else
//! happened to the name (`queue.rs`); a grant wakes observers and holders only (it frees
//! nothing). The notifications of this backend's own exclusive releases are ignored: the
//! releasing call delivers them in-process from its reply. Every payload carries the row's
//! fencing token, so a holder judges a late notification (one from before its grant) by its
//! smaller token, and reads its row only for a lease the backend did not grant itself or after
//! a reconnection (see the core's loss detection).
//!
//! # Fallback and reconnection
//! Notifications sent while no session listens are lost (PostgreSQL keeps no history), so
//! every break of the connection is [`Broke::Lost`] and every open is [`Opened::Fresh`]; the
//! core's rules (`backends/notify/feed.rs`) then give:
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Config, Notification};

use super::errors;
use super::queue::parse_first;
use super::tls::MakeTls;
use crate::backends::notify::hub::Hub;
use crate::backends::notify::{Broke, Feed, Notifier, OpenFailed, Opened};

/// How often an idle listening connection is pinged.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(5);

/// How long a ping (or opening the connection and `LISTEN`) may take before the connection is
/// taken for dead.
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// The notifications of one backend, fed by its listening connection; see the
/// [module docs](self).
pub(crate) type Listener = Notifier<Listening>;

impl Listener {
    /// A listener whose connection opens on first need; `enabled: false` means never (poll).
    /// `own` is the backend's mark (`queue.rs`); `received` counts every notification the
    /// listening connection receives.
    pub(crate) fn new(
        config: Config,
        tls: MakeTls,
        channel: String,
        enabled: bool,
        own: String,
        received: Arc<AtomicU64>,
    ) -> Listener {
        Notifier::with_feed(enabled, move || Listening {
            label: format!("lock notification connection (channel {channel})"),
            config: config.clone(),
            tls: tls.clone(),
            channel: channel.clone(),
            own: own.clone(),
            received: received.clone(),
            conn: None,
        })
    }
}

/// Delivers one payload (`queue.rs`: [`parse_first`] and what a designation means) to the
/// registry of the backend marked `own`.
fn dispatch(hub: &Hub, own: &str, payload: &str) {
    match parse_first(payload) {
        // This backend's own release: delivered in-process after its reply.
        Some(notice) if !notice.by.is_empty() && notice.by == own => {}
        Some(notice) => hub.deliver(notice.name, notice.change, notice.handoff.wakes(own)),
        None => {
            tracing::warn!(%payload, "unexpected lock notification; every waiter and holder re-checks");
            hub.wake_all(true);
        }
    }
}

/// The listening connection as a [`Feed`]: one connection per run of the notifier's task.
pub(crate) struct Listening {
    label: String,
    config: Config,
    /// The same TLS settings as the pool's connections.
    tls: MakeTls,
    channel: String,
    /// The backend's mark.
    own: String,
    /// Notifications received, ever (shared with the backend: diagnostics).
    received: Arc<AtomicU64>,
    conn: Option<Open>,
}

impl Feed for Listening {
    fn label(&self) -> &str {
        &self.label
    }

    async fn open(&mut self, _hub: &Hub) -> Result<Opened, OpenFailed> {
        self.conn = None;
        match tokio::time::timeout(PING_TIMEOUT, open(&self.config, &self.tls, &self.channel)).await
        {
            Ok(Ok(conn)) => {
                self.conn = Some(conn);
                // Changes before LISTEN took effect are unknown.
                Ok(Opened::Fresh)
            }
            Ok(Err(error)) => Err(OpenFailed::Failed(error)),
            Err(_) => Err(OpenFailed::Failed(format!(
                "no answer within {PING_TIMEOUT:?}"
            ))),
        }
    }

    async fn deliver(&mut self, hub: &Hub) -> Broke {
        let Some(conn) = self.conn.as_mut() else {
            return Broke::Lost;
        };
        let error = loop {
            tokio::select! {
                n = conn.notifications.recv() => match n {
                    Some(Ok(n)) => {
                        self.received.fetch_add(1, Ordering::Relaxed);
                        dispatch(hub, &self.own, n.payload());
                    }
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
        tracing::warn!(channel = %self.channel, %error, "lost the lock notification connection; waiters poll until it is back");
        // PostgreSQL keeps no notifications for sessions that do not listen.
        Broke::Lost
    }

    fn close(&mut self) {
        self.conn = None;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn designations_and_own_releases() {
        let hub = Hub::new(crate::backends::notify::hub::Status::Live);
        // Designated elsewhere: nobody here at once.
        let w = hub.change_waiter("x");
        dispatch(&hub, "me-", "5/other-/them- - x");
        assert!(!w.wait(Duration::from_millis(50)).await);
        // Designated here, or nobody, or an old payload: one at once.
        for payload in ["6/me-/them- - x", "7//them- - x", "8 - x"] {
            let w = hub.change_waiter("x");
            dispatch(&hub, "me-", payload);
            assert!(w.wait(Duration::from_secs(5)).await, "{payload}");
        }
        // Our own release: delivered by the releasing call, not by the listener.
        let w = hub.change_waiter("x");
        dispatch(&hub, "me-", "9/me-/me- - x");
        assert!(!w.wait(Duration::from_millis(50)).await);
    }
}
