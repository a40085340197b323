//! The notification core that the MongoDB and PostgreSQL backends share: one [`Notifier`] per
//! backend (shared by its clones, every waiter and every holder) turns a [`Feed`] of changes
//! (a change stream, a `LISTEN` connection) into wake-ups for acquirers and observers and into
//! early loss detection for holders. A backend supplies only the feed — how to subscribe, and
//! how to read its events into `(name, change)` — and a read that says whether a lease still
//! holds its name.
//!
//! # Who owns what
//! * [`Hub`] (`backends/notify/hub.rs`): the per-name registry of waiters and the latest change
//!   of each name, shared with the memory backend. One acquirer per name and process is woken
//!   per change (no stampede), every observer, every holder.
//! * [`Notifier`] (here): the hub, the leases this backend granted (their tokens, for judging
//!   changes) and the handle that stops the feed's task.
//! * The feed's task ([`feed`]): opens the subscription on first need, delivers its events to
//!   the hub, and does the fallback-to-polling and resubscription bookkeeping. It owns the feed
//!   (and so the subscription); dropping the notifier (with the last clone of its backend)
//!   stops it.
//!
//! # Wake-ups
//! An acquirer registers for the name's next change before each attempt
//! ([`Notifier::change_waiter`]); a change that frees the name wakes the longest-waiting
//! registered acquirer of the name in this process, which retries at once. A grant wakes no
//! acquirer (it frees nothing); observers and holders hear of it. While the feed is live, a
//! busy acquirer otherwise sleeps until the holder's reported expiry (an expiry writes nothing,
//! and a crashed holder neither). See [`Hub::deliver`] for the MongoDB handoff designations.
//!
//! # Early loss detection
//! [`Notifier::lease_gone`] completes when a change shows the name with another lease id or
//! none. Changes can arrive late (an old release delivered after our grant), so a change that
//! names a *token* is judged by it: below our token it is old news, at or above it the lease is
//! gone. A change without a token (a release, a delete), a change of a lease this backend did
//! not grant, and "anything may have changed" (after a resubscription that lost changes) are
//! checked with one read of the lock by the caller's `still_holds`. The notifier remembers the
//! token of every lease it granted until the lease is released
//! ([`granted`](Notifier::granted), [`released`](Notifier::released)); a lease id never gets a
//! name back once it lost it, so the latest change of a name decides (the hub coalesces).
//!
//! # Fallback and resubscription
//! See [`feed`]: while the subscription is down, nothing is live and every waiter polls with
//! the wait strategy; holders rely on extension and their local deadline. When it is back and
//! changes may have been missed, every waiter re-checks and every holder reads its lock once.
//! Where the server refuses notifications for a reason that will not go away by itself, the
//! notifier is unavailable: waiters poll and [`lease_gone`](Notifier::lease_gone) stays
//! pending, until a re-probe of the feed succeeds (every minute; then every holder reads its
//! lock once).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use super::feed::{self, Feed};
use crate::backend::{ChangeWaiter, LeaseId};
use crate::backends::notify::hub::{Change, HolderRef, Hub, Status};

/// Leases remembered for loss detection; beyond this (leaked guards), new grants are not
/// remembered and their changes are checked with a read instead.
const MAX_REMEMBERED_LEASES: usize = 1 << 20;

/// A lease granted by this backend, remembered until it is released.
struct Held {
    /// Keeps the name's entry (and so its latest change) while the lease is held, and counts
    /// the lease among the name's holders.
    entry: HolderRef,
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
    /// Cannot tell from the change: read the lock.
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

/// The notifications of one backend; see the [module docs](self).
pub(crate) struct Notifier<F: Feed> {
    hub: Arc<Hub>,
    /// A new, unopened feed for each start of the task.
    new_feed: Box<dyn Fn() -> F + Send + Sync>,
    /// Dropping the sender (with the backend) stops the task.
    task: Mutex<Option<oneshot::Sender<()>>>,
    held: Mutex<HashMap<LeaseId, Held>>,
}

impl<F: Feed> std::fmt::Debug for Notifier<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("status", &self.hub.status())
            .field("watched_names", &self.hub.watched_names())
            .finish_non_exhaustive()
    }
}

impl<F: Feed> Notifier<F> {
    /// A notifier whose feed opens on first need; `enabled: false` means never (poll).
    pub(crate) fn with_feed(
        enabled: bool,
        new_feed: impl Fn() -> F + Send + Sync + 'static,
    ) -> Notifier<F> {
        Notifier {
            hub: Hub::new(if enabled {
                Status::Idle
            } else {
                Status::Unavailable
            }),
            new_feed: Box::new(new_feed),
            task: Mutex::new(None),
            held: Mutex::new(HashMap::new()),
        }
    }

    /// The registry the feed delivers to (for in-process deliveries of a backend's own writes).
    pub(crate) fn hub(&self) -> &Hub {
        &self.hub
    }

    fn held(&self) -> MutexGuard<'_, HashMap<LeaseId, Held>> {
        // Single inserts/removes/assignments: a poisoned map is consistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the feed's task unless it runs (or notifications are unavailable). Needs a Tokio
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
        runtime.spawn(feed::run(self.hub.clone(), (self.new_feed)(), stopped));
    }

    /// Whether every change is delivered (or will be, after a resume); starts the feed if
    /// needed.
    pub(crate) fn is_live(&self) -> bool {
        self.ensure_started();
        self.hub.is_live()
    }

    /// Whether the changes of `name` are delivered (the feed is live and covers it); starts the
    /// feed if needed.
    pub(crate) fn is_live_for(&self, name: &str) -> bool {
        self.ensure_started();
        self.hub.is_live_for(name)
    }

    /// How many names have an entry in the registry (somebody here waits on or holds them).
    pub(crate) fn watched_names(&self) -> usize {
        self.hub.watched_names()
    }

    /// How many acquirers of `name` in this process wait for its next change.
    pub(crate) fn acquirers(&self, name: &str) -> usize {
        self.hub.acquirers(name)
    }

    /// An acquirer's registration for the next change of `name`; `None` when notifications are
    /// unavailable (the caller polls).
    pub(crate) fn change_waiter(&self, name: &str) -> Option<ChangeWaiter> {
        self.ensure_started();
        if self.hub.status() == Status::Unavailable {
            return None;
        }
        Some(self.hub.change_waiter(name))
    }

    /// Waits until `name` changes or `max_wait` passed (every observer is woken); sleeps for
    /// `max_wait` when notifications are unavailable.
    pub(crate) async fn wait_for_change(&self, name: &str, max_wait: Duration) {
        self.ensure_started();
        if self.hub.status() == Status::Unavailable {
            tokio::time::sleep(max_wait).await;
        } else {
            self.hub.wait_for_change(name, max_wait).await;
        }
    }

    /// Remembers a lease this backend granted: its token, and that the changes dispatched so
    /// far are no news to it. `name` is the registry key.
    pub(crate) fn granted(&self, name: &str, lease_id: &LeaseId, token: u64) {
        if self.hub.status() == Status::Unavailable {
            return;
        }
        let entry = self.hub.holder(name);
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

    /// Completes when the lease `lease_id` of `name` (the registry key) is gone; pending while
    /// notifications are unavailable (when they come back, the feed tells every holder to read
    /// its lock). `still_holds` reads the lock once (a failed read should say "held": the next
    /// extension decides).
    pub(crate) async fn lease_gone<H, Fut>(&self, name: &str, lease_id: &LeaseId, still_holds: H)
    where
        H: Fn() -> Fut,
        Fut: Future<Output = bool>,
    {
        self.ensure_started();
        let entry = self.hub.name(name);
        let mut changes = entry.state().subscribe();
        let remembered = self
            .held()
            .get(lease_id)
            .filter(|h| h.entry.entry().name() == name)
            .map(|h| (h.token, h.seen));
        let (token, mut seen) = match remembered {
            Some((token, seen)) => (Some(token), seen),
            // Not granted here: only later changes are news.
            None => (None, changes.borrow().0),
        };
        loop {
            if self.hub.status() == Status::Unavailable {
                // No notifications now: loss is detected by extension. Changes dispatched
                // meanwhile are not judged; once a re-probe opens the feed it tells every holder
                // (a `Change::Unknown`), which is judged below.
                if changes.changed().await.is_err() {
                    // The sender lives in the entry we hold; never busy-loop.
                    return std::future::pending().await;
                }
                continue;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::notify::hub::lease;

    #[test]
    fn holders_judge_changes_by_lease_id_and_token() {
        let ours = LeaseId::from_string("ours");
        // Our own grant or a re-grant after a lost reply.
        assert_eq!(
            judge(&lease(Some("ours"), Some(7)), &ours, Some(7)),
            Verdict::Held
        );
        // Someone else's grant from before ours, delivered late.
        assert_eq!(
            judge(&lease(Some("old"), Some(6)), &ours, Some(7)),
            Verdict::Held
        );
        // A takeover.
        assert_eq!(
            judge(&lease(Some("new"), Some(8)), &ours, Some(7)),
            Verdict::Gone
        );
        // A change showing our token without our lease: released or forced.
        assert_eq!(judge(&lease(None, Some(7)), &ours, Some(7)), Verdict::Gone);
        // Without our token (a lease granted elsewhere) a token decides nothing: read.
        assert_eq!(judge(&lease(None, Some(7)), &ours, None), Verdict::Check);
        assert_eq!(
            judge(&lease(Some("x"), Some(9)), &ours, None),
            Verdict::Check
        );
        // A release without a token: whose? Read.
        assert_eq!(judge(&lease(None, None), &ours, Some(7)), Verdict::Check);
        assert_eq!(judge(&Change::Unknown, &ours, Some(7)), Verdict::Check);
        assert_eq!(judge(&Change::Nothing, &ours, Some(7)), Verdict::Held);
    }
}
