//! LISTEN/NOTIFY wake-ups and early loss detection: **one listening connection per
//! [`PostgresBackend`](super::PostgresBackend)** (shared by its clones, every waiter and every
//! holder), opened on first need, **listening only on the buckets of the names this backend
//! uses**.
//!
//! # What is published
//! A trigger on the lock table (created by the migration, `schema.rs`) calls `pg_notify` for
//! every insert, every delete and every update that changes the lease id or the fencing token,
//! with the payload `<token> <lease id or -> <name>`, or for a release that designates the next
//! process `<token>/<designated mark>/<releasing mark> - <name>` (`queue.rs`). A lease its
//! holder keeps on with a minimum hold (`release_after`: neither lease id nor token changes) is
//! published by the statement itself as `<token> - <name>`, which wakes one acquirer per
//! process (it retries and learns the new expiry); no holder of the name remains to be misled
//! by its "no lease". So grants, releases, takeovers, force-releases and cleanup are
//! published; extensions (only `expires_at` changes) and busy attempts (no write, or only the
//! queue) are not. PostgreSQL delivers a notification when its transaction commits, in commit
//! order, to every session that listens on the channel: the change is visible to a read made
//! after it arrives.
//!
//! # Channels: one per bucket of names, and one per table
//! Each payload is published twice, in the same transaction:
//!
//! * on the **bucket channel** of its name, `mongolock_<16 hex digits of a hash of
//!   schema.table>_<bucket>`, where the bucket is the first three hex digits of the SHA-256 of
//!   the name's UTF-8 bytes (4096 buckets). The trigger computes it with the server's
//!   `sha256(convert_to(name, 'UTF8'))` and this backend with the `sha2` crate
//!   (`schema::bucket`), the same bytes and the same function on both sides, so knowing a
//!   name's channel costs no round trip. (`hashtext` is undocumented and may change between
//!   server versions; `md5` fails on FIPS-mode servers; SHA-256 has neither problem and is
//!   built in since PostgreSQL 11, our minimum.)
//! * on the **table channel**, `mongolock_<16 hex digits>`, which earlier versions listen on
//!   (they keep working unchanged during a rolling upgrade) and which a backend using more
//!   names than [`MAX_LISTENED_BUCKETS`] buckets listens on instead of buckets.
//!
//! Why 4096 buckets: with P processes each using its own name, a write reaches the other
//! processes whose names share its bucket, about (P - 1) / 4096 of them (0.02 at 100
//! processes; with 256 buckets it would be 0.4), while a backend listens on one channel per
//! bucket in use, never more than [`MAX_LISTENED_BUCKETS`] (each notification is compared
//! with that list by every listening session, so it must stay short).
//!
//! What this saves is what reaches the processes: a notification is sent to, parsed and
//! dispatched by only the processes listening on its bucket. Inside the server (PostgreSQL 15
//! and earlier at least), every commit that notifies still signals every listening session of
//! the database, which reads the new queue entries and drops those of channels it does not
//! listen on.
//!
//! # Listening on the names in use (`backends/notify/coverage.rs`)
//! The connection listens on the buckets of the names this backend uses: the registry's
//! entries (names with a waiting acquirer, an observer or a held lease), plus names that went
//! out of use while the set is small (at most twice the names in use plus [`KEEP_COVERED`]),
//! so that contention moving among a few names does not `LISTEN` and `UNLISTEN` each time.
//! The registry's coverage (`Covered::Only`) is that set of names; the rules that keep a
//! narrowed feed from losing a wake-up are the core's:
//!
//! * An acquirer is live only if its name is covered. An uncovered acquirer whose attempt was
//!   busy asks for its name as it starts to wait (an uncontended acquisition never waits, so
//!   it costs nothing) and polls with the wait strategy meanwhile; observers ask when they
//!   start to wait.
//! * The task then runs `LISTEN` for the new buckets (one statement list, one round trip, on
//!   the same connection, which stays live for the names it covered), and only once it has
//!   taken effect installs the new coverage: the acquirers and observers of the newly covered
//!   names are woken to re-check and their holders read their row once, since changes before
//!   the `LISTEN` are unknown. A change committed before the `LISTEN` took effect is seen by
//!   the re-check's read; one committed after is delivered. None is lost.
//! * Held names are covered lazily: a name held for [`COVER_HELD_AFTER`] without coverage is
//!   added at the task's next look (once a second), so a short critical section costs no
//!   `LISTEN`, and a long-held lease still learns of a takeover or force-release within about
//!   two seconds (plus one read). Until then, loss is detected by extension and the local
//!   deadline, as without notifications.
//! * A name is never dropped from coverage while it is in use: the new set is built from the
//!   registry, and a name registered after that snapshot but left out is woken and asked for
//!   again. Buckets no longer needed are `UNLISTEN`ed lazily, in the same statement list as the
//!   next `LISTEN` (not on every release), and the new coverage is installed after both, so a
//!   name losing coverage is woken to poll.
//! * Past [`MAX_LISTENED_BUCKETS`] buckets the connection listens on the table channel instead
//!   (and on no bucket: one statement list switches, in one transaction, so no change is
//!   missed) and covers every name; once the names in use fit in half that many buckets again,
//!   it narrows back the same way.
//! * The cross-process handoff queue (`queue.rs`) registers an acquirer only while its name is
//!   covered, so a release never designates a process that would not hear of it.
//!
//! A notification of a name in a listened bucket that is not in the covered set (another name
//! of the bucket) is delivered like any other: it is a real change, and a name nobody here
//! uses costs one hash lookup.
//!
//! # Mixed versions (rolling upgrades)
//! The migration replaces the trigger function (version mark `mongolock payload v3`, in
//! `schema.rs`). The new function still publishes every payload on the table channel, so a
//! process of an earlier version, listening there, misses nothing. Its body also carries the
//! previous mark (`mongolock payload v2`), so an earlier version starting up finds its own
//! mark, takes the table for migrated and does not put its function back. An earlier
//! version's explicit `migrate` (`PostgresBackend::migrate`, `mongolock migrate`) does replace
//! it: until a process of this version migrates again (each checks once, when it first uses
//! the table), its changes are published on the table channel only, so this version's
//! processes hear nothing: their waiters sleep until the holder's expiry (or poll, when not
//! covered), and their holders detect a loss by extension and their local deadline. Slower,
//! never unsafe: notifications only ever decide when somebody tries again or reads.
//!
//! # Everything else is the shared notification core
//! The listening connection is the [`Feed`] of the backend's [`Notifier`]
//! (`backends/notify/`), which the MongoDB backend's change stream shares; this module only
//! opens the connection, chooses its channels and reads its payloads. Each payload is
//! delivered to the name's entry in the per-name registry (`backends/notify/hub.rs`): a
//! payload without a lease (release, force-release, delete) wakes every observer and the
//! holders, and one registered acquirer of the name in this process — at once when the
//! release designated this backend or nobody (or the payload names no designation), else only
//! after the handoff fallback if nothing else happened to the name (`queue.rs`); a grant wakes
//! observers and holders only (it frees nothing). The notifications of this backend's own
//! exclusive releases are ignored: the releasing call delivers them in-process from its reply.
//! Every payload carries the row's fencing token, so a holder judges a late notification (one
//! from before its grant) by its smaller token, and reads its row only for a lease the backend
//! did not grant itself or after a reconnection (see the core's loss detection).
//!
//! # Fallback and reconnection
//! Notifications sent while no session listens are lost (PostgreSQL keeps no history), so
//! every break of the connection is [`Broke::Lost`] and every open is [`Opened::Fresh`]; the
//! core's rules (`backends/notify/feed.rs`) then give:
//! * while the listening connection is down (connection refused, killed with
//!   `pg_terminate_backend`, server restart), the registry is not live: every waiter is woken
//!   and polls with the provider's wait strategy, and holders rely on extension and their
//!   local deadline;
//! * the task reconnects with exponential backoff (50 ms to 5 s) and listens again on the
//!   buckets of the names in use (and kept); once `LISTEN` is in place, every waiter is woken
//!   to re-check and every holder reads its row once;
//! * a connection that stops answering is detected by a ping (an empty query) after
//!   [`PING_EVERY`] without traffic, answered within [`PING_TIMEOUT`], and replaced; a
//!   `LISTEN` that fails or gets no answer within [`PING_TIMEOUT`] replaces it too.
//!
//! The task ends when the last clone of the backend is dropped.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Config, Notification};

use super::errors;
use super::queue::parse_first;
use super::schema::bucket_channel;
use super::tls::MakeTls;
use crate::backends::notify::hub::{Covered, Hub, Narrowed};
use crate::backends::notify::{Broke, Feed, Notifier, OpenFailed, Opened};

/// How often an idle listening connection is pinged.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(5);

/// How long a ping (or opening the connection, or a `LISTEN`) may take before the connection
/// is taken for dead.
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bucket channels a connection listens on; names in use that need more make it
/// listen on the table channel instead (every change of every name, as before buckets).
pub(crate) const MAX_LISTENED_BUCKETS: usize = 256;

/// Names kept covered after they went out of use, beyond twice the names in use (so that
/// contention moving among a few names does not `LISTEN`/`UNLISTEN` each time).
const KEEP_COVERED: usize = 64;

/// A name held here this long without coverage gets its bucket listened to (leases released
/// sooner cost nothing); also how often the task looks.
const COVER_HELD_AFTER: Duration = Duration::from_secs(1);

/// The notifications of one backend, fed by its listening connection; see the
/// [module docs](self).
pub(crate) type Listener = Notifier<Listening>;

impl Listener {
    /// A listener whose connection opens on first need; `enabled: false` means never (poll).
    /// `channel` is the table channel; `own` is the backend's mark (`queue.rs`); `received`
    /// counts every notification the listening connection receives.
    pub(crate) fn new(
        config: Config,
        tls: MakeTls,
        channel: String,
        enabled: bool,
        own: String,
        received: Arc<AtomicU64>,
    ) -> Listener {
        Notifier::with_feed(enabled, move || Listening {
            label: format!("lock notification connection (channels {channel}_*)"),
            config: config.clone(),
            tls: tls.clone(),
            channel: channel.clone(),
            own: own.clone(),
            received: received.clone(),
            covered: Covered::Only(Narrowed::default()),
            listened: HashSet::new(),
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

/// What the next listening set is: the names in use here plus those covered now (kept while
/// the set is small), and the channels of their buckets; past [`MAX_LISTENED_BUCKETS`]
/// channels, every name on the table channel.
fn coverage(channel: &str, now: &Covered, interest: Vec<Arc<str>>) -> (Covered, HashSet<String>) {
    let in_use = interest.len();
    let mut names: HashSet<Arc<str>> = interest.into_iter().collect();
    if let Covered::Only(now) = now {
        if now.len() <= 2 * in_use + KEEP_COVERED {
            names.extend(now.full.iter().cloned());
        }
    }
    let channels: HashSet<String> = names.iter().map(|n| bucket_channel(channel, n)).collect();
    if channels.len() > MAX_LISTENED_BUCKETS {
        return (Covered::All, HashSet::from([channel.to_owned()]));
    }
    // Every change of a covered name is published on its bucket: covered fully.
    let covered = Narrowed {
        full: names,
        handoffs: HashSet::new(),
    };
    (Covered::Only(covered), channels)
}

/// The statements that turn listening on `from` into listening on `to` (one simple query, so
/// one transaction: the changes take effect together when it commits).
fn relisten_sql(from: &HashSet<String>, to: &HashSet<String>) -> String {
    // Channels are `mongolock_`, hex digits, `_` and hex digits: plain identifiers.
    let mut sql: Vec<String> = to.difference(from).map(|c| format!("LISTEN {c}")).collect();
    sql.extend(from.difference(to).map(|c| format!("UNLISTEN {c}")));
    sql.sort();
    sql.join("; ")
}

/// The listening connection as a [`Feed`]: one connection per run of the notifier's task.
pub(crate) struct Listening {
    label: String,
    config: Config,
    /// The same TLS settings as the pool's connections.
    tls: MakeTls,
    /// The table channel (bucket channels are named after it).
    channel: String,
    /// The backend's mark.
    own: String,
    /// Notifications received, ever (shared with the backend: diagnostics).
    received: Arc<AtomicU64>,
    /// The names whose changes the connection delivers (kept across reconnections: the names
    /// kept covered).
    covered: Covered,
    /// The channels the open connection listens on.
    listened: HashSet<String>,
    conn: Option<Open>,
}

/// What woke the delivering loop.
enum Next {
    Notification(Notification),
    Failed(String),
    /// A name was wanted, or the periodic look at held names and the set's size.
    Look,
    Ping,
}

impl Listening {
    /// Whether the listening set should change: an acquirer or observer wants an uncovered
    /// name, or a name has been held here for [`COVER_HELD_AFTER`] without coverage; or,
    /// listening on the table channel, the names in use fit in half the bucket limit again.
    fn should_relisten(&self, hub: &Hub) -> bool {
        match &self.covered {
            Covered::Only(_) => {
                hub.is_wanted()
                    || Instant::now()
                        .checked_sub(COVER_HELD_AFTER)
                        .is_some_and(|before| hub.uncovered_since(before))
            }
            Covered::All => hub.watched_names() <= MAX_LISTENED_BUCKETS / 2,
        }
    }

    /// Listens on the channels of the names in use (and kept), stops listening on the others,
    /// and only then installs the new coverage ([`Hub::cover`]): a name is live only once the
    /// `LISTEN` of its bucket has taken effect, and the names newly covered are re-checked
    /// (their acquirers and observers woken, their holders read their row once), since their
    /// changes before it are unknown.
    async fn relisten(&mut self, hub: &Hub) -> Result<(), String> {
        let Some(conn) = self.conn.as_ref() else {
            return Err("the connection was closed".to_owned());
        };
        let interest = hub.interest().into_iter().map(|(name, _)| name).collect();
        let (covered, channels) = coverage(&self.channel, &self.covered, interest);
        let sql = relisten_sql(&self.listened, &channels);
        if !sql.is_empty() {
            match tokio::time::timeout(PING_TIMEOUT, conn.client.batch_execute(&sql)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(errors::describe(&e)),
                Err(_) => return Err(format!("LISTEN got no answer within {PING_TIMEOUT:?}")),
            }
            tracing::debug!(
                channels = channels.len(),
                every_name = matches!(covered, Covered::All),
                "the lock notification connection listens on the buckets of the names in use here"
            );
        }
        self.listened = channels;
        self.covered = covered.clone();
        hub.cover(covered);
        Ok(())
    }
}

impl Feed for Listening {
    fn label(&self) -> &str {
        &self.label
    }

    async fn open(&mut self, hub: &Hub) -> Result<Opened, OpenFailed> {
        self.close();
        let opened = async {
            self.conn = Some(connect(&self.config, &self.tls).await?);
            self.relisten(hub).await
        };
        match tokio::time::timeout(PING_TIMEOUT, opened).await {
            // Changes before LISTEN took effect are unknown.
            Ok(Ok(())) => Ok(Opened::Fresh),
            Ok(Err(error)) => Err(OpenFailed::Failed(error)),
            Err(_) => Err(OpenFailed::Failed(format!(
                "no answer within {PING_TIMEOUT:?}"
            ))),
        }
    }

    async fn deliver(&mut self, hub: &Hub) -> Broke {
        let mut look = tokio::time::interval(COVER_HELD_AFTER);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut idle_since = tokio::time::Instant::now();
        // Looked at when asked and once a second, not per notification (the look at held
        // names goes through every name in use).
        let mut look_now = true;
        let error = loop {
            if std::mem::take(&mut look_now) && self.should_relisten(hub) {
                if let Err(error) = self.relisten(hub).await {
                    break error;
                }
            }
            let narrowed = matches!(self.covered, Covered::Only(_));
            let Some(conn) = self.conn.as_mut() else {
                return Broke::Lost;
            };
            let next = tokio::select! {
                n = conn.notifications.recv() => match n {
                    Some(Ok(n)) => Next::Notification(n),
                    Some(Err(e)) => Next::Failed(errors::describe(&e)),
                    None => Next::Failed("the connection was closed".to_owned()),
                },
                () = hub.widen_wanted(), if narrowed => Next::Look,
                _ = look.tick() => Next::Look,
                () = tokio::time::sleep_until(idle_since + PING_EVERY) => Next::Ping,
            };
            match next {
                Next::Notification(n) => {
                    idle_since = tokio::time::Instant::now();
                    self.received.fetch_add(1, Ordering::Relaxed);
                    dispatch(hub, &self.own, n.payload());
                }
                Next::Failed(error) => break error,
                Next::Look => look_now = true,
                Next::Ping => {
                    idle_since = tokio::time::Instant::now();
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
        self.listened.clear();
    }
}

/// Aborts the task driving a connection when dropped.
struct Driver(JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An open listening connection: the client (for `LISTEN` and pings), its notifications (an
/// error or the end of the channel means the connection is gone) and the task driving it.
struct Open {
    client: tokio_postgres::Client,
    notifications: mpsc::UnboundedReceiver<Result<Notification, tokio_postgres::Error>>,
    _driver: Driver,
}

/// Connects (the caller then runs `LISTEN`).
async fn connect(config: &Config, tls: &MakeTls) -> Result<Open, String> {
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

    #[test]
    fn coverage_follows_the_names_in_use_up_to_the_bucket_limit() {
        let names = |v: &[&str]| v.iter().map(|n| Arc::from(*n)).collect::<Vec<Arc<str>>>();
        let (covered, channels) = coverage("ch", &Covered::All, names(&["a", "b"]));
        assert_eq!(
            covered,
            Covered::Only(Narrowed {
                full: names(&["a", "b"]).into_iter().collect(),
                handoffs: HashSet::new(),
            })
        );
        let expected: HashSet<String> =
            ["a", "b"].iter().map(|n| bucket_channel("ch", n)).collect();
        assert_eq!(channels, expected);
        // Names gone out of use stay covered while the set is small.
        let (kept, _) = coverage("ch", &covered, names(&["c"]));
        assert!(matches!(&kept, Covered::Only(n) if n.full.contains("a") && n.full.contains("c")));
        // Too many buckets: every name, on the table channel.
        let many: Vec<String> = (0..5000).map(|i| format!("n{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let (all, channels) = coverage("ch", &kept, names(&many));
        assert_eq!(all, Covered::All);
        assert_eq!(channels, HashSet::from(["ch".to_owned()]));
        // Switching listens before it unlistens, in one statement list.
        let from = HashSet::from(["ch_aaa".to_owned(), "ch_bbb".to_owned()]);
        let to = HashSet::from(["ch_bbb".to_owned(), "ch_ccc".to_owned()]);
        assert_eq!(relisten_sql(&from, &to), "LISTEN ch_ccc; UNLISTEN ch_aaa");
        assert_eq!(relisten_sql(&to, &to), "");
    }

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
