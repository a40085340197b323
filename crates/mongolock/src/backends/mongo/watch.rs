//! Change-stream wake-ups and early loss detection: **one change stream per
//! [`MongoBackend`](super::MongoBackend)** (shared by all its clones, every waiter and every
//! holder), started on first need.
//!
//! # The stream
//! A background task watches the lock collection with
//!
//! ```text
//! $match: (operationType in [insert, replace, delete, drop, dropDatabase, rename, invalidate]
//!          or (operationType = update and updateDescription.updatedFields.leaseId exists))
//!         and not one of this backend's own grants or releases (see below)
//! $project: operationType, ns, documentKey, updatedFields.{leaseId, fencingToken, next},
//!           fullDocument.{leaseId, fencingToken, next}
//! ```
//!
//! so it sees grants, releases, takeovers and deletions by others, but not extensions (they
//! change only `expiresAt`) and no busy attempts (they write nothing). No `fullDocument: "updateLookup"`
//! is needed: an update event carries the new `leaseId` (and the new token on a grant) as of the
//! event. Each event is dispatched to the name's entry in a registry (`backends/wakeups.rs`),
//! which holds only names that somebody in this process waits on or holds; the task ends when the
//! last clone of the backend is dropped.
//!
//! # Our own writes stay out of the stream (2 commands per uncontended acquire + release)
//! An open stream always has one `getMore` waiting at the server; every event that passes the
//! `$match` answers it and costs another. If the backend's own grant and release passed, every
//! uncontended acquire + release would cost four commands instead of two. So:
//!
//! * Every lease id this backend hands out starts with a mark of the backend, 16 random hex
//!   digits and `-` ([`own_prefix`]; [`LockBackend::new_lease_id`](crate::LockBackend)). Lease
//!   ids are hex, so the backend's ids are exactly the strings in the range `[mark-, mark.)`,
//!   which a plain range `$match` tests on any MongoDB.
//! * A release records the released id in the scalar `lastReleased` (next to `released`).
//! * The `$match` drops events whose new `leaseId` is in our range (our grants: update or
//!   insert events, and under MongoDB 4.4 replace events, which also cover our extensions), and
//!   events that set `leaseId` to null with `lastReleased` in our range (our releases).
//! * What the stream no longer tells this backend is told in-process instead, as the memory
//!   backend does: after each of its releases the backend dispatches "no lease" to the name
//!   (one acquirer woken, observers woken, holders check), and after each grant it dispatches
//!   the new lease and token to holders and observers (acquirers are not woken by a grant).
//!
//! Why nothing is lost:
//! * **Waiters.** A release frees a name for waiters in every backend. Other backends (in this
//!   process or others) have other marks, so the release passes their `$match` as before. This
//!   backend's waiters are woken by the in-process dispatch, which runs after the release's
//!   reply, so the server already shows the name free when the woken waiter retries; they
//!   registered before their attempt, so a release during their attempt is kept as a permit.
//!   A release whose outcome is unknown (error, timeout) is dispatched too: at worst a
//!   spurious retry. Expiries write nothing either way: busy waiters sleep until the holder's
//!   reported expiry.
//! * **Holders.** A takeover is always a grant to *another* lease id. Granted by another
//!   backend, it carries another mark and passes the `$match`; granted by this backend (a
//!   sibling took over after our lease expired), it is dispatched in-process with its token,
//!   which is above ours, so the holder judges it a loss. Force-releases write no
//!   `lastReleased` and pass. A holder no longer sees its own release — it is not listening
//!   any more then (the guard stops its watchdog before releasing).
//! * Documents locked in place ([`Target::Documents`]) keep the unfiltered pipeline; their
//!   acquirers poll.
//!
//! In the steady state an uncontended acquire + release is then two `findAndModify`s; the idle stream adds one empty `getMore` per `maxAwaitTimeMS` (1 s), not per
//! acquisition.
//!
//! # MongoDB 4.4: pipeline updates are replace events
//! MongoDB 4.4 reports an update made with a pipeline (all of ours) as a `replace` event with
//! the whole document and no `updateDescription`, so other backends' *extensions* pass the
//! `$match` too. The registry remembers, per name, the lease (id and token) of the last replace
//! event and delivers a replace event that shows the same lease to nobody
//! ([`Hub::is_news`]): the name was held throughout (a lease id never gets a
//! name back once it lost it), so no waiter needs to retry. The first one after the registry
//! knew nothing costs at most one retry. (mongo-testserver reproduces 4.4 with
//! `Builder::pipeline_updates_as_replace`.)
//!
//! # Wake-ups, without a stampede
//! An acquirer registers for the name's next change before each attempt; an event wakes the
//! longest-waiting registered acquirer of the name in this process (one per event), which
//! retries at once. Grants, this backend's or another's, wake no acquirer (the name is held
//! again; the release or expiry before a grant is what lets a waiter in); observers and holders
//! hear of them. A release wakes one only when its handoff (`next`) designates this backend or
//! nobody; otherwise one after the fallback delay, if nothing else happened to the name
//! meanwhile (`queue.rs`). With the stream healthy, a busy acquirer otherwise sleeps until the
//! holder's reported expiry (a crashed holder writes nothing). Observers
//! ([`wait_for_change`](crate::LockBackend::wait_for_change)) are all woken.
//!
//! # Early loss detection
//! [`lease_gone`](crate::LockBackend::lease_gone) completes when an event shows the name with
//! another lease id or none. Events can arrive late (an old release delivered after our grant),
//! so a change that names a *token* is judged by it: below our token it is old news, at or
//! above it the lease is gone. Changes without a token (a release, a delete, an insert of a new
//! document) are checked with one read of the lock document. The backend remembers the token of
//! every lease it granted until the lease is released.
//!
//! # Document locks
//! The same machinery serves [`DocumentLocks`](crate::documents::DocumentLocks) ([`Target`]):
//! one stream per `DocumentLocks` (shared by its clones and guards) on the user's collection,
//! keyed by [`document_key`] of any `_id`, judging `<field>.leaseId` / `<field>.fencingToken`.
//! Update events report those either as the whole sub-document or as dotted paths; the
//! pipeline picks out both with `$objectToArray` (and `<field>` among `removedFields`), so
//! extensions (`<field>.expiresAt` only) and writes of the user's own fields do not pass. Only
//! holders use it (document acquirers poll with their wait strategy).
//!
//! # Fallback and resume
//! * Opening the stream fails with a non-resumable error (a standalone server answers 40573, a
//!   missing `changeStream`/`find` privilege 13, old versions 40324/115, ...): the backend polls
//!   with the configured wait strategy from then on, logs it once (`tracing`), and `lease_gone`
//!   stays pending (loss is detected by extension and the local deadline).
//! * A resumable error (network, failover, `ResumableChangeStreamError`): the driver resumes once
//!   by itself; beyond that the task reopens the stream from its resume token (after a short
//!   backoff if it keeps failing), so no event is lost. While it cannot, waiters are woken and
//!   poll with the wait strategy.
//! * The resume token is refused (history lost, 286) or the stream fails otherwise, or the
//!   collection was dropped (invalidate): the stream is reopened from now, and **every waiter is
//!   woken to re-check** once it is open, since changes in between are unknown.
//! * After every fresh open every waiter is woken once too: a release between the first
//!   registration and the open could otherwise slip by.

use std::borrow::Cow;
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;
use mongodb::Collection;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::document::{self, LAST_RELEASED, LEASE_ID, TOKEN};
use super::errors;
use super::queue::{Handoff, NEXT};
use crate::backend::{ChangeWaiter, LeaseId};
use crate::backends::wakeups::{Change, Hub, NameRef, Status};
use crate::wait::WaitStrategy;

/// Leases remembered for loss detection; beyond this (leaked guards), new grants are not
/// remembered and their changes are checked with a read instead.
const MAX_REMEMBERED_LEASES: usize = 1 << 20;

/// A stream that broke sooner than this after opening is reopened after a backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(1);

/// How long the server holds an empty `getMore` open (`maxAwaitTimeMS`).
const MAX_AWAIT: Duration = Duration::from_secs(1);

/// A `getMore` that has not answered after this long is taken for a dead connection (no socket
/// timeout would end it): the stream is resumed from its resume token on a new one.
const STALL_LIMIT: Duration = Duration::from_secs(20);

/// How long a stopped task keeps its cursor before dropping it (see [`retire`]).
const RETIRE_AFTER: Duration = Duration::from_millis(200);

/// A lease granted by this backend, remembered until it is released.
struct Held {
    /// Keeps the name's entry (and so its latest change) while the lease is held.
    entry: NameRef,
    token: u64,
    /// The last change judged for this lease.
    seen: u64,
}

/// What a stream watches: which documents are locks, how they are keyed in the registry and
/// where their lease fields live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// The lock collection of a [`MongoBackend`](super::MongoBackend): `_id` is the lock name
    /// (a string; other `_id`s, like the epoch counter's, are ignored), `leaseId` and
    /// `fencingToken` are top-level fields.
    Names,
    /// A collection of the user's documents locked in place
    /// ([`DocumentLocks`](crate::documents::DocumentLocks)): any `_id` (keyed by
    /// [`document_key`]), the lease fields under the top-level sub-document `field`.
    Documents { field: String },
}

/// The registry key of a document `_id` (relaxed extended JSON, so `1_i32` and `1_i64`, equal
/// for MongoDB, share a key).
pub(crate) fn document_key(id: &Bson) -> String {
    id.clone().into_relaxed_extjson().to_string()
}

/// Computed by document-lock pipelines: the lease fields among `updatedFields`
/// (`<field>`, `<field>.leaseId`, `<field>.fencingToken`, whichever the server reported).
const DOC_UPDATED: &str = "__mongolockLease";
/// Computed by document-lock pipelines: `<field>` or `<field>.leaseId` among `removedFields`.
const DOC_REMOVED: &str = "__mongolockRemoved";

/// The shared change stream of one backend (or one set of document locks); see the
/// [module docs](self).
pub(crate) struct Watcher {
    hub: Arc<Hub>,
    coll: Collection<Document>,
    target: Arc<Target>,
    /// The mark on this backend's own lease ids (see [`own_prefix`]).
    own: String,
    /// The stream's pipeline.
    pipeline: Arc<Vec<Document>>,
    /// Dropping the sender (with the backend) stops the task.
    task: Mutex<Option<oneshot::Sender<()>>>,
    held: Mutex<HashMap<LeaseId, Held>>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("status", &self.hub.status())
            .field("watched_names", &self.hub.watched_names())
            .finish_non_exhaustive()
    }
}

/// What a change means for a holder.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Still ours (or old news).
    Held,
    /// Another lease id, or none, at or after our grant.
    Gone,
    /// Cannot tell from the event: read the document.
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

impl Watcher {
    /// A watcher whose stream starts on first need; `enabled: false` means never (poll).
    pub(crate) fn new(coll: Collection<Document>, enabled: bool, target: Target) -> Watcher {
        let own = own_prefix();
        let pipeline = Arc::new(pipeline(&target, &own));
        Watcher {
            own,
            pipeline,
            hub: Hub::new(if enabled {
                Status::Idle
            } else {
                Status::Unavailable
            }),
            coll,
            target: Arc::new(target),
            task: Mutex::new(None),
            held: Mutex::new(HashMap::new()),
        }
    }

    fn held(&self) -> MutexGuard<'_, HashMap<LeaseId, Held>> {
        // Single inserts/removes/assignments: a poisoned map is consistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the stream task unless it runs (or notifications are unavailable). Needs a Tokio
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
            self.coll.clone(),
            self.target.clone(),
            self.pipeline.clone(),
            self.own.clone(),
            stopped,
        ));
    }

    /// Whether every change is delivered; starts the stream if needed.
    pub(super) fn is_live(&self) -> bool {
        self.ensure_started();
        self.hub.is_live()
    }

    pub(super) fn watched_names(&self) -> usize {
        self.hub.watched_names()
    }

    pub(super) fn change_waiter(&self, name: &str) -> Option<ChangeWaiter> {
        self.ensure_started();
        if self.hub.status() == Status::Unavailable {
            return None;
        }
        Some(self.hub.change_waiter(name))
    }

    pub(super) async fn wait_for_change(&self, name: &str, max_wait: Duration) {
        self.ensure_started();
        if self.hub.status() == Status::Unavailable {
            tokio::time::sleep(max_wait).await;
        } else {
            self.hub.wait_for_change(name, max_wait).await;
        }
    }

    /// A lease id for an acquire call of this backend: marked with [`own_prefix`], so that the
    /// stream leaves out this backend's own grants and releases (see the [module docs](self)).
    pub(crate) fn new_lease_id(&self) -> LeaseId {
        LeaseId::random_with_prefix(&self.own)
    }

    /// Remembers a lease this backend granted (its token, and which changes are news to it),
    /// and tells this backend's holders and observers of the name at once: the stream leaves
    /// out the grants of this backend's own lease ids. `name` is the registry key (a lock name,
    /// or [`document_key`]).
    pub(crate) fn granted(&self, name: &str, lease_id: &LeaseId, token: u64) {
        if self.hub.status() == Status::Unavailable {
            return;
        }
        self.hub.dispatch_grant(
            name,
            Change::Lease {
                lease_id: Some(lease_id.as_str().to_owned()),
                token: Some(token),
            },
        );
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

    /// After this backend's release of `name` (whatever its outcome): wakes one of this
    /// backend's acquirers of the name and its observers at once, since the stream leaves out
    /// this backend's own releases. A spurious wake-up (the release did nothing) costs one
    /// attempt.
    pub(crate) fn released_name(&self, name: &str, handoff: &Handoff) {
        let change = Change::Lease {
            lease_id: None,
            token: None,
        };
        if handoff.wakes(&self.own) {
            self.hub.dispatch(name, change);
        } else {
            self.hub.dispatch_handoff_elsewhere(name, change);
        }
    }

    /// The mark of this backend's lease ids (see [`own_prefix`]).
    pub(crate) fn own_mark(&self) -> &str {
        &self.own
    }

    /// How many of this backend's acquirers wait for a change of `name`.
    pub(crate) fn acquirers(&self, name: &str) -> usize {
        self.hub.acquirers(name)
    }

    pub(super) async fn lease_gone(&self, name: &str, lease_id: &LeaseId) {
        self.lease_gone_at(name, &Bson::String(name.to_owned()), lease_id)
            .await;
    }

    /// Completes when the lease `lease_id` of the document with `_id` `id` (registry key `name`)
    /// is gone; pending forever when notifications are unavailable.
    pub(crate) async fn lease_gone_at(&self, name: &str, id: &Bson, lease_id: &LeaseId) {
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
                // No more events will come: loss is detected by extension.
                return std::future::pending().await;
            }
            let (seq, change) = changes.borrow_and_update().clone();
            if seq > seen {
                let gone = match judge(&change, lease_id, token) {
                    Verdict::Held => false,
                    Verdict::Gone => true,
                    Verdict::Check => !self.still_holds(name, id, lease_id).await,
                };
                if gone {
                    tracing::debug!(lock = %name, "the change stream shows the lease gone");
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

    /// One read: whether `lease_id` is still the lease of `name`. A failed read counts as
    /// "still held" (the next extension decides).
    async fn still_holds(&self, name: &str, id: &Bson, lease_id: &LeaseId) -> bool {
        let (path, field) = match &*self.target {
            Target::Names => (LEASE_ID.to_owned(), None),
            Target::Documents { field } => (format!("{field}.{LEASE_ID}"), Some(field.as_str())),
        };
        match self
            .coll
            .find_one(doc! { "_id": id.clone() })
            .projection(doc! { path: 1 })
            .await
        {
            Ok(Some(d)) => {
                let lease = match field {
                    None => Some(&d),
                    Some(f) => d.get_document(f).ok(),
                };
                lease.and_then(document::lease_id) == Some(lease_id.as_str())
            }
            Ok(None) => false,
            Err(e) => {
                tracing::debug!(lock = %name, error = %errors::describe(&e), "could not check the lease after a change; the next extension will");
                true
            }
        }
    }
}

/// A new mark for the lease ids of one backend: 16 random hex digits and `-`. Lease ids are
/// hex digits, so the ids of this backend are exactly the strings in
/// `[own, own with '-' replaced by '.')` (`.` follows `-`): a range `$match` can test.
fn own_prefix() -> String {
    format!("{:016x}-", rand::random::<u64>())
}

/// The stream's pipeline; see the [module docs](self).
fn pipeline(target: &Target, own: &str) -> Vec<Document> {
    match target {
        Target::Names => names_pipeline(own),
        Target::Documents { field } => documents_pipeline(field),
    }
}

/// The pipeline of the lock collection; `own` is the backend's lease-id mark (see
/// [`own_prefix`]): events that grant one of its leases, or release one (the release records
/// the id in `lastReleased`), do not pass.
fn names_pipeline(own: &str) -> Vec<Document> {
    let updated = |f: &str| format!("updateDescription.updatedFields.{f}");
    let full = |f: &str| format!("fullDocument.{f}");
    let end = format!("{}.", own.trim_end_matches('-'));
    let ours = || doc! { "$gte": own, "$lt": end.as_str() };
    vec![
        doc! { "$match": {
            "$or": [
                { "operationType": { "$in": [
                    "insert", "replace", "delete", "drop", "dropDatabase", "rename", "invalidate",
                ] } },
                { "operationType": "update", updated(LEASE_ID): { "$exists": true } },
            ],
            "$nor": [
                { updated(LEASE_ID): ours() },
                { updated(LEASE_ID): Bson::Null, updated(LAST_RELEASED): ours() },
                { full(LEASE_ID): ours() },
                { full(LEASE_ID): Bson::Null, full(LAST_RELEASED): ours() },
            ],
        } },
        doc! { "$project": {
            "operationType": 1,
            "ns": 1,
            "documentKey": 1,
            updated(LEASE_ID): 1,
            updated(TOKEN): 1,
            updated(NEXT): 1,
            full(LEASE_ID): 1,
            full(TOKEN): 1,
            full(NEXT): 1,
            full(LAST_RELEASED): 1,
        } },
    ]
}

/// The pipeline of document locks under `field`. Update events report changed sub-fields
/// either as the whole sub-document (`<field>: {...}`) or as dotted paths (`"<field>.leaseId"`),
/// which `$match`/`$project` cannot address: both are picked out with `$objectToArray` into
/// [`DOC_UPDATED`]. Extensions (only `<field>.expiresAt`) and writes of other fields do not
/// pass.
fn documents_pipeline(field: &str) -> Vec<Document> {
    let lease_path = format!("{field}.{LEASE_ID}");
    let token_path = format!("{field}.{TOKEN}");
    vec![
        doc! { "$addFields": {
            DOC_UPDATED: { "$arrayToObject": [{ "$filter": {
                "input": { "$objectToArray": {
                    "$ifNull": ["$updateDescription.updatedFields", {}]
                } },
                "cond": { "$in": ["$$this.k", [field, lease_path.as_str(), token_path.as_str()]] },
            } }] },
            DOC_REMOVED: { "$filter": {
                "input": { "$ifNull": ["$updateDescription.removedFields", []] },
                "cond": { "$in": ["$$this", [field, lease_path.as_str()]] },
            } },
        } },
        doc! { "$match": { "$or": [
            { "operationType": { "$in": [
                "insert", "replace", "delete", "drop", "dropDatabase", "rename", "invalidate",
            ] } },
            { "operationType": "update", DOC_UPDATED: { "$ne": {} } },
            { "operationType": "update", DOC_REMOVED: { "$ne": [] } },
        ] } },
        doc! { "$project": {
            "operationType": 1,
            "ns": 1,
            "documentKey": 1,
            DOC_UPDATED: 1,
            DOC_REMOVED: 1,
            format!("fullDocument.{lease_path}"): 1,
            format!("fullDocument.{token_path}"): 1,
        } },
    ]
}

/// The lease change of a document-lock update event (see [`documents_pipeline`]).
fn document_update(ev: &Document, field: &str) -> Change {
    let removed = ev.get_array(DOC_REMOVED).is_ok_and(|r| !r.is_empty());
    if removed {
        // The lease field was removed: no lease, token unknown.
        return Change::Lease {
            lease_id: None,
            token: None,
        };
    }
    let Ok(updated) = ev.get_document(DOC_UPDATED) else {
        return Change::Unknown;
    };
    match updated.get(field) {
        Some(Bson::Document(whole)) => return lease_change(Some(whole)),
        Some(_) => {
            // The sub-document was overwritten by something else (null, a scalar): no lease.
            return Change::Lease {
                lease_id: None,
                token: None,
            };
        }
        None => {}
    }
    let mut fields = Document::new();
    for (path, name) in [
        (format!("{field}.{LEASE_ID}"), LEASE_ID),
        (format!("{field}.{TOKEN}"), TOKEN),
    ] {
        if let Some(v) = updated.get(&path) {
            fields.insert(name, v.clone());
        }
    }
    lease_change(Some(&fields))
}

/// The lease fields of a (partial) document: `leaseId` (string or null) and `fencingToken`.
fn lease_change(fields: Option<&Document>) -> Change {
    let Some(d) = fields else {
        return Change::Unknown;
    };
    let lease_id = match d.get(LEASE_ID) {
        Some(Bson::String(s)) => Some(s.clone()),
        Some(Bson::Null) => None,
        _ => return Change::Unknown,
    };
    let token = match d.get(TOKEN) {
        Some(Bson::Int64(t)) => u64::try_from(*t).ok(),
        Some(Bson::Int32(t)) => u64::try_from(*t).ok(),
        _ => None,
    };
    Change::Lease { lease_id, token }
}

/// What one event means.
#[derive(Debug, PartialEq, Eq)]
enum Event<'a> {
    /// A change of one lock (by registry key), and whom a release handed it to.
    Name(Cow<'a, str>, Change, Handoff),
    /// Every lock may have changed (the collection was dropped or renamed).
    All,
    /// Not about a lock (the epoch counter, unknown event types).
    Ignore,
}

fn interpret<'a>(ev: &'a Document, target: &Target) -> Event<'a> {
    let op = ev.get_str("operationType").unwrap_or("");
    let id = || {
        ev.get_document("documentKey")
            .ok()
            .and_then(|k| k.get("_id"))
    };
    match op {
        "insert" | "replace" | "update" | "delete" => {
            let Some(id) = id() else {
                return Event::Ignore;
            };
            if let Target::Documents { field } = target {
                let change = match op {
                    "update" => document_update(ev, field),
                    "delete" => Change::Unknown,
                    _ => lease_change(
                        ev.get_document("fullDocument")
                            .ok()
                            .and_then(|d| d.get_document(field).ok()),
                    ),
                };
                return Event::Name(Cow::Owned(document_key(id)), change, Handoff::Unknown);
            }
            // Lock names are strings; the epoch counter's _id is not.
            let Bson::String(name) = id else {
                return Event::Ignore;
            };
            let fields = match op {
                "update" => ev
                    .get_document("updateDescription")
                    .ok()
                    .and_then(|u| u.get_document("updatedFields").ok()),
                "delete" => None,
                _ => ev.get_document("fullDocument").ok(),
            };
            let change = match op {
                "delete" => Change::Unknown,
                _ => lease_change(fields),
            };
            // An update event carries `next` only when this write changed it; a whole document
            // carries the last one, which is this release's only if it names the released id.
            let handoff = match op {
                "update" => Handoff::of(fields.and_then(|f| f.get(NEXT)), None),
                _ => Handoff::of(
                    fields.and_then(|f| f.get(NEXT)),
                    Some(
                        fields
                            .and_then(|f| f.get_str(LAST_RELEASED).ok())
                            .unwrap_or(""),
                    ),
                ),
            };
            Event::Name(Cow::Borrowed(name.as_str()), change, handoff)
        }
        "drop" | "dropDatabase" | "rename" | "invalidate" => Event::All,
        _ => Event::Ignore,
    }
}

/// Delivers one event: a grant to observers and holders only (it frees nothing); a release to
/// one acquirer as well when its handoff designated this backend (`own`) or nobody, else to
/// one acquirer only after the fallback delay (`queue.rs`); anything else to one acquirer.
fn dispatch(hub: &Hub, ev: &Document, target: &Target, own: &str) {
    match interpret(ev, target) {
        Event::Name(name, change, handoff) => {
            // MongoDB 4.4 reports pipeline updates — extensions included — as replace events:
            // one that shows the lease the name is known to have is not news.
            if ev.get_str("operationType") == Ok("replace") && !hub.is_news(&name, &change) {
                return;
            }
            match &change {
                Change::Lease {
                    lease_id: Some(_), ..
                } => hub.dispatch_grant(&name, change),
                _ if handoff.wakes(own) => hub.dispatch(&name, change),
                _ => hub.dispatch_handoff_elsewhere(&name, change),
            }
        }
        Event::All => hub.wake_all(true),
        Event::Ignore => {}
    }
}

/// Whether reopening from the resume token can work: network errors, failovers, the
/// `ResumableChangeStreamError` label, a lost cursor.
fn is_resumable(e: &mongodb::error::Error) -> bool {
    const CURSOR_NOT_FOUND: i32 = 43;
    e.contains_label("ResumableChangeStreamError")
        || errors::is_transient(e)
        || errors::code(e) == Some(CURSOR_NOT_FOUND)
}

async fn open(
    coll: &Collection<Document>,
    pipeline: &[Document],
    resume: Option<ResumeToken>,
) -> mongodb::error::Result<ChangeStream<Document>> {
    let stream = coll
        .watch()
        .pipeline(pipeline.iter().cloned())
        .resume_after(resume)
        .max_await_time(MAX_AWAIT)
        .await?;
    Ok(stream.with_type::<Document>())
}

/// Marks the task gone when it ends for any reason (also when its runtime shuts down), so the
/// next use starts a new one, and wakes every waiter so nobody waits for events that will not
/// come.
struct Running(Arc<Hub>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.status() != Status::Unavailable {
            self.0.set_status(Status::Idle);
        }
        self.0.wake_all(false);
    }
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

/// Drops a stream whose backend is gone, a little later.
///
/// Dropping a driver cursor spawns a `killCursors` task; if the runtime is shutting down at that
/// moment, the driver (3.9) can panic in that task (its connection pool worker is already gone).
/// Backends are often dropped right before their runtime ends, so the cursor is dropped only
/// after a short pause: if the runtime shuts down meanwhile, this task is cancelled and the
/// cursor is left for the server to time out instead. Streams of tasks cancelled by a runtime
/// shutdown are never dropped for the same reason (they are `ManuallyDrop`).
async fn retire(stream: ManuallyDrop<ChangeStream<Document>>) {
    tokio::time::sleep(RETIRE_AFTER).await;
    drop(ManuallyDrop::into_inner(stream));
}

/// What ended a wait on the stream.
enum Next {
    Stopped,
    /// One `getMore` answered (`Ok(None)`: an empty batch), or it stalled (`Err`).
    Batch(Result<mongodb::error::Result<Option<Document>>, tokio::time::error::Elapsed>),
}

/// Why a stream stopped delivering.
enum Broke {
    Error(mongodb::error::Error),
    Stalled,
    /// Closed by the server after an invalidate (collection dropped or renamed).
    Ended,
}

/// The stream task; see the [module docs](self).
async fn run(
    hub: Arc<Hub>,
    coll: Collection<Document>,
    target: Arc<Target>,
    pipeline: Arc<Vec<Document>>,
    own: String,
    mut stopped: oneshot::Receiver<()>,
) {
    let _running = Running(hub.clone());
    let ns = coll.namespace().to_string();
    let mut resume: Option<ResumeToken> = None;
    let mut retry = retry_backoff();
    let mut warned = false;
    loop {
        let opened = tokio::select! {
            _ = &mut stopped => return,
            r = open(&coll, &pipeline, resume.clone()) => r,
        };
        // Never dropped by a cancellation (see `retire`).
        let mut stream = match opened {
            Ok(s) => ManuallyDrop::new(s),
            Err(e) if !is_resumable(&e) => {
                if resume.take().is_some() {
                    tracing::warn!(namespace = %ns, error = %errors::describe(&e), "the lock change stream cannot resume from its resume token; reopening it from now and waking every waiter to re-check");
                    hub.set_status(Status::Opening);
                    hub.wake_all(false);
                    continue;
                }
                log_unavailable(&ns, &e);
                hub.set_status(Status::Unavailable);
                hub.wake_all(false);
                return;
            }
            Err(e) => {
                if !warned {
                    warned = true;
                    tracing::warn!(namespace = %ns, error = %errors::describe(&e), "cannot open the lock change stream; waiters poll until it is back");
                } else {
                    tracing::debug!(namespace = %ns, error = %errors::describe(&e), "cannot open the lock change stream yet");
                }
                // Waiters sleeping until an expiry switch to polling while the stream is down
                // (the resume later replays what they missed).
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
        let fresh = resume.is_none();
        hub.set_status(Status::Live);
        if warned {
            tracing::info!(namespace = %ns, "the lock change stream is back");
            warned = false;
        }
        if fresh {
            tracing::debug!(namespace = %ns, "lock change stream open");
            // Whatever happened before the stream opened is unknown: everyone re-checks once.
            hub.wake_all(false);
        } else {
            tracing::debug!(namespace = %ns, "lock change stream resumed");
        }
        let broke = loop {
            let next = tokio::select! {
                _ = &mut stopped => Next::Stopped,
                n = tokio::time::timeout(STALL_LIMIT, stream.next_if_any()) => Next::Batch(n),
            };
            match next {
                Next::Stopped => return retire(stream).await,
                Next::Batch(Ok(Ok(Some(ev)))) => dispatch(&hub, &ev, &target, &own),
                Next::Batch(Ok(Ok(None))) => {
                    if !stream.is_alive() {
                        break Broke::Ended;
                    }
                }
                Next::Batch(Ok(Err(e))) => break Broke::Error(e),
                Next::Batch(Err(_)) => break Broke::Stalled,
            }
        };
        let quick = opened_at.elapsed() < HEALTHY_AFTER;
        if !quick {
            retry = retry_backoff();
        }
        match broke {
            Broke::Error(e) if !is_resumable(&e) => {
                tracing::warn!(namespace = %ns, error = %errors::describe(&e), "the lock change stream failed; reopening it from now and waking every waiter to re-check");
                resume = None;
                hub.set_status(Status::Opening);
                hub.wake_all(false);
            }
            Broke::Ended => {
                tracing::debug!(namespace = %ns, "the lock change stream was invalidated (collection dropped or renamed); reopening it");
                resume = None;
                hub.set_status(Status::Opening);
                hub.wake_all(true);
            }
            Broke::Error(_) | Broke::Stalled => {
                if let Broke::Error(e) = &broke {
                    tracing::debug!(namespace = %ns, error = %errors::describe(e), "lock change stream interrupted; resuming it from its resume token");
                } else {
                    tracing::warn!(namespace = %ns, "the lock change stream's getMore did not answer for {STALL_LIMIT:?}; resuming it on a new connection");
                }
                resume = stream.resume_token();
                if resume.is_some() {
                    // Changes meanwhile are replayed by the resumed stream.
                    hub.set_status(Status::Resuming);
                } else {
                    hub.set_status(Status::Opening);
                    hub.wake_all(false);
                }
            }
        }
        drop(ManuallyDrop::into_inner(stream));
        if quick && !pause(retry.next_delay(), &mut stopped).await {
            return;
        }
    }
}

/// Logs, once per backend (the task ends after it), why notifications are unavailable.
fn log_unavailable(ns: &str, e: &mongodb::error::Error) {
    const NOT_A_REPLICA_SET: i32 = 40573;
    let error = errors::describe(e);
    if errors::code(e) == Some(NOT_A_REPLICA_SET) {
        tracing::info!(namespace = %ns, %error, "change streams need a replica set; lock waiters poll with the configured wait strategy and loss is detected by extension");
    } else {
        tracing::warn!(namespace = %ns, %error, "cannot open a change stream on the lock collection (it needs a replica set, MongoDB 4.4+ and the changeStream and find privileges); lock waiters poll with the configured wait strategy and loss is detected by extension");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interpret_names(ev: &Document) -> Event<'_> {
        interpret(ev, &Target::Names)
    }

    fn lease(id: Option<&str>, token: Option<u64>) -> Change {
        Change::Lease {
            lease_id: id.map(str::to_owned),
            token,
        }
    }

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
        // A full document showing our token without our lease: released or forced.
        assert_eq!(judge(&lease(None, Some(7)), &ours, Some(7)), Verdict::Gone);
        // A release (no token in the update): whose? Read.
        assert_eq!(judge(&lease(None, None), &ours, Some(7)), Verdict::Check);
        assert_eq!(
            judge(&lease(Some("x"), Some(9)), &ours, None),
            Verdict::Check
        );
        assert_eq!(judge(&Change::Unknown, &ours, Some(7)), Verdict::Check);
        assert_eq!(judge(&Change::Nothing, &ours, Some(7)), Verdict::Held);
    }

    #[test]
    fn document_events_are_interpreted() {
        let target = Target::Documents {
            field: "_lock".into(),
        };
        let key = document_key(&Bson::Int64(7));
        assert_eq!(key, document_key(&Bson::Int32(7)));
        assert_ne!(key, document_key(&Bson::String("7".into())));
        let ev = |extra: Document| {
            let mut d = doc! { "operationType": "update", "documentKey": { "_id": 7_i64 } };
            d.extend(extra);
            d
        };
        // A takeover reported as the whole sub-document.
        let whole = ev(
            doc! { DOC_UPDATED: { "_lock": { "leaseId": "L", "fencingToken": 3_i64, "expiresAt": 1 } }, DOC_REMOVED: [] },
        );
        assert_eq!(
            interpret(&whole, &target),
            Event::Name(
                key.clone().into(),
                lease(Some("L"), Some(3)),
                Handoff::Unknown
            )
        );
        // Dotted paths: a grant, and a forced clear.
        let dotted = ev(
            doc! { DOC_UPDATED: { "_lock.leaseId": "M", "_lock.fencingToken": 4_i64 }, DOC_REMOVED: [] },
        );
        assert_eq!(
            interpret(&dotted, &target),
            Event::Name(
                key.clone().into(),
                lease(Some("M"), Some(4)),
                Handoff::Unknown
            )
        );
        let cleared = ev(doc! { DOC_UPDATED: { "_lock.leaseId": Bson::Null }, DOC_REMOVED: [] });
        assert_eq!(
            interpret(&cleared, &target),
            Event::Name(key.clone().into(), lease(None, None), Handoff::Unknown)
        );
        let removed = ev(doc! { DOC_UPDATED: {}, DOC_REMOVED: ["_lock"] });
        assert_eq!(
            interpret(&removed, &target),
            Event::Name(key.clone().into(), lease(None, None), Handoff::Unknown)
        );
        let insert = doc! {
            "operationType": "insert",
            "documentKey": { "_id": "s" },
            "fullDocument": { "_lock": { "leaseId": "N", "fencingToken": 1_i64 } },
        };
        assert_eq!(
            interpret(&insert, &target),
            Event::Name(
                document_key(&Bson::String("s".into())).into(),
                lease(Some("N"), Some(1)),
                Handoff::Unknown
            )
        );
        let plain =
            doc! { "operationType": "insert", "documentKey": { "_id": 1 }, "fullDocument": {} };
        assert!(matches!(
            interpret(&plain, &target),
            Event::Name(_, Change::Unknown, _)
        ));
        let delete = doc! { "operationType": "delete", "documentKey": { "_id": 7_i64 } };
        assert_eq!(
            interpret(&delete, &target),
            Event::Name(key.into(), Change::Unknown, Handoff::Unknown)
        );
    }

    #[test]
    fn events_are_interpreted() {
        let update = doc! {
            "operationType": "update",
            "documentKey": { "_id": "a" },
            "updateDescription": { "updatedFields": { "leaseId": "L", "fencingToken": 5_i64 } },
        };
        assert_eq!(
            interpret_names(&update),
            Event::Name("a".into(), lease(Some("L"), Some(5)), Handoff::Unknown)
        );
        let release = doc! {
            "operationType": "update",
            "documentKey": { "_id": "a" },
            "updateDescription": { "updatedFields": { "leaseId": Bson::Null } },
        };
        assert_eq!(
            interpret_names(&release),
            Event::Name("a".into(), lease(None, None), Handoff::Unknown)
        );
        let handed = doc! {
            "operationType": "update",
            "documentKey": { "_id": "a" },
            "updateDescription": { "updatedFields": {
                "leaseId": Bson::Null, "next": "0123456789abcdef-/x",
            } },
        };
        assert_eq!(
            interpret_names(&handed),
            Event::Name(
                "a".into(),
                lease(None, None),
                Handoff::To("0123456789abcdef-".into())
            )
        );
        let nobody = doc! {
            "operationType": "replace",
            "documentKey": { "_id": "a" },
            "fullDocument": { "leaseId": Bson::Null, "next": "/y", "lastReleased": "y" },
        };
        assert_eq!(
            interpret_names(&nobody),
            Event::Name("a".into(), lease(None, None), Handoff::Nobody)
        );
        // A whole document whose `next` is from an earlier release (this one had no queue).
        let stale = doc! {
            "operationType": "replace",
            "documentKey": { "_id": "a" },
            "fullDocument": { "leaseId": Bson::Null, "next": "m-/y", "lastReleased": "z" },
        };
        assert_eq!(
            interpret_names(&stale),
            Event::Name("a".into(), lease(None, None), Handoff::Unknown)
        );
        assert!(Handoff::To("m-".into()).wakes("m-"));
        assert!(!Handoff::To("m-".into()).wakes("n-"));
        assert!(Handoff::Nobody.wakes("n-") && Handoff::Unknown.wakes("n-"));
        let insert = doc! {
            "operationType": "insert",
            "documentKey": { "_id": "b" },
            "fullDocument": { "leaseId": "M", "fencingToken": Bson::Null },
        };
        assert_eq!(
            interpret_names(&insert),
            Event::Name("b".into(), lease(Some("M"), None), Handoff::Unknown)
        );
        let delete = doc! { "operationType": "delete", "documentKey": { "_id": "c" } };
        assert_eq!(
            interpret_names(&delete),
            Event::Name("c".into(), Change::Unknown, Handoff::Unknown)
        );
        let epoch = doc! {
            "operationType": "update",
            "documentKey": { "_id": { "mongolock": "fencing-epoch" } },
        };
        assert_eq!(interpret_names(&epoch), Event::Ignore);
        assert_eq!(
            interpret_names(&doc! { "operationType": "drop" }),
            Event::All
        );
        assert_eq!(
            interpret_names(&doc! { "operationType": "invalidate" }),
            Event::All
        );
        let odd = doc! {
            "operationType": "replace",
            "documentKey": { "_id": "d" },
            "fullDocument": { "other": 1 },
        };
        assert_eq!(
            interpret_names(&odd),
            Event::Name("d".into(), Change::Unknown, Handoff::Unknown)
        );
    }
}
