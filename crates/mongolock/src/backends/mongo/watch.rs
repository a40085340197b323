//! Change-stream wake-ups and early loss detection: **one change stream per
//! [`MongoBackend`](super::MongoBackend)** (shared by all its clones, every waiter and every
//! holder), started on first need.
//!
//! # The stream
//! A background task watches the lock collection with
//!
//! ```text
//! $match: (operationType in [insert, replace, delete, drop, dropDatabase, rename, invalidate]
//!          or (operationType = update and updateDescription.updatedFields.leaseId exists)
//!          or (operationType = update and updateDescription.updatedFields.lastReleased exists))
//!         and not one of this backend's own grants or releases (see below)
//! $project: operationType, ns, documentKey, updatedFields.{leaseId, fencingToken, next},
//!           fullDocument.{leaseId, fencingToken, next}
//! ```
//!
//! so it sees grants, releases, takeovers and deletions by others, but not extensions (they
//! change only `expiresAt`) and no busy attempts (they write nothing). A lease its holder kept
//! on with a minimum hold (`release_after`: the lease stays, `expiresAt` moves, `lastReleased`
//! becomes its id) passes by its `lastReleased`: the event has no `leaseId`, so it is an
//! unknown change that wakes one acquirer per process, which retries and learns the new
//! expiry. This backend's own such write is filtered out like its releases (its `leaseId` is
//! absent, which `$match` treats as null, and `lastReleased` is in its range) and dispatched
//! in-process. On MongoDB 4.4 (replace events) a document whose `leaseId` equals its
//! `lastReleased` is the same: an unknown change, news even though the lease is the same. No `fullDocument: "updateLookup"`
//! is needed: an update event carries the new `leaseId` (and the new token on a grant) as of the
//! event.
//!
//! The stream is the [`Feed`] of the backend's [`Notifier`], the notification core it shares
//! with the PostgreSQL backend (`backends/notify/`): the core runs the task (started on first
//! need, ended when the last clone of the backend is dropped), remembers the leases this
//! backend granted, judges changes for holders, and does the fallback and resubscription
//! bookkeeping. This module only opens the stream, reads its events and filters out (and
//! reports in-process) this backend's own writes. Each event is delivered to the name's entry
//! in the per-name registry (`backends/notify/hub.rs`), which holds only names that somebody in
//! this process waits on or holds.
//!
//! # Our own writes stay out of the stream (2 commands per uncontended acquire + release)
//! An open stream always has one `getMore` waiting at the server; every event that passes the
//! `$match` answers it and costs another. If the backend's own grant and release passed, every
//! uncontended acquire + release would cost four commands instead of two. So:
//!
//! * Every lease id this backend hands out starts with a mark of the backend, 16 random hex
//!   digits and `-` ([`new_mark`]; [`LockBackend::new_lease_id`](crate::LockBackend)). Lease
//!   ids are hex, so the backend's ids are exactly the strings in the range `[mark-, mark.)`,
//!   which a plain range `$match` tests on any MongoDB.
//! * A release records the released id in the scalar `lastReleased` (next to `released`).
//! * The `$match` drops events whose new `leaseId` is in our range (our grants: update or
//!   insert events, and under MongoDB 4.4 replace events, which also cover our extensions),
//!   events that set `leaseId` to null with `lastReleased` in our range (our releases), and
//!   events that set `leaseId` to `{released: <id in our range>}` (our semaphore slots'
//!   releases, `slots.rs`; they are dispatched in-process like the others).
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
//!   which is above ours, so the holder judges it a loss. A force-release sets `lastReleased`
//!   to its own unique string (`force-release-<random>`, in no backend's range), so it passes
//!   every backend's `$match` — also on MongoDB 4.4, whose replace events carry the whole
//!   document: a stale `lastReleased` there would make the backend that made the previous
//!   release filter the force-release out as its own. A holder no longer sees its own release
//!   — it is not listening any more then (the guard stops its watchdog before releasing).
//! * Documents locked in place ([`Target::Documents`]) keep the unfiltered pipeline; their
//!   acquirers poll.
//!
//! In the steady state an uncontended acquire + release is then two `findAndModify`s; the idle stream adds one empty `getMore` per `maxAwaitTimeMS` (1 s), not per
//! acquisition.
//!
//! # Narrowed to the names in use (costs flat as processes grow)
//! Unfiltered, every grant and release by any process reaches every other process's stream:
//! with P processes each write costs the server P events and P `getMore` replies, although
//! most processes neither wait on nor hold that name. So the stream of the lock collection
//! delivers only the names this backend uses, plus the events that concern every name:
//!
//! ```text
//! $match: ... and (documentKey._id in [names in use] or operationType in [drop, dropDatabase, rename, invalidate])
//! ```
//!
//! The names in use are the registry's entries (`backends/notify/hub.rs`, "Coverage"): names with
//! a waiting acquirer, an observer or a held lease. When one is needed that the stream does not
//! cover, the stream is reopened **from its resume token** with the wider `$match`, so the
//! names it covered before miss nothing, and it stays live throughout:
//!
//! * An acquirer registers before each attempt as before, but is live only if its name is
//!   covered. An uncovered acquirer whose attempt was busy asks for its name as it starts to
//!   wait (an uncontended acquisition never waits, so it costs the stream nothing) and polls
//!   with the wait strategy. Once the stream is reopened, every acquirer and observer of a newly
//!   covered name is woken to re-check, and every holder of it reads its lock once: changes of
//!   that name before the reopening may have been filtered out. Changes after the resume token
//!   are delivered. So a release is either before the re-check (seen by it) or after the resume
//!   token (delivered): none is lost.
//! * Observers ask for their name when they start to wait.
//! * Held names are added lazily: a name held for [`COVER_HELD_AFTER`] without coverage is
//!   added at the next `getMore` answer, so the usual short critical section costs the stream
//!   nothing, and a long-held lease still learns of a takeover or force-release within about
//!   two seconds (plus one read). Until then, loss is detected by extension and the local
//!   deadline, as without change streams.
//! * A name is never dropped from the `$match` while it is in use: the new `$match` is built
//!   from the registry, and a name registered after that snapshot but left out is woken and
//!   asked for again. Names that went out of use stay covered while the set is small (at most
//!   twice the names in use plus [`KEEP_COVERED`]), so contention moving among a few names does
//!   not reopen the stream each time; past [`MAX_NARROWED`] names the stream covers every name.
//! * The cross-process handoff queue (`queue.rs`) registers an acquirer only while its name is
//!   covered, so a release never designates a process whose stream would not tell it.
//! * Documents locked in place keep an unfiltered stream (only holders use it).
//!
//! # Only the releases meant for this process (flat cost with many waiting processes)
//! Narrowed to its names, a stream still received every grant and release of a name that many
//! processes wait on: with P processes on one name, about 2·P events per acquisition, although
//! the handoff queue (`queue.rs`) lets only the designated process try. So the stream covers a
//! name in one of two ways ([`Narrowed`], `backends/notify/coverage.rs`):
//!
//! * **fully** (the `$match` above): the names observed here, and the names held here for
//!   [`COVER_HELD_AFTER`] (which asks for a reopen; the reopen also covers every name held for
//!   [`COVER_HELD_WITH`], and keeps a held name covered fully) — a holder needs takeovers and
//!   force-releases, an observer every change;
//! * **for handoffs**: every other name in use (only waited on) and the names kept covered
//!   after use. Of these the stream delivers only what an acquirer must act on:
//!
//!   ```text
//!   documentKey._id in [names for handoffs] and (
//!       operationType in [insert, replace, delete]
//!    or updateDescription.updatedFields.next   in [<mark>, <mark>.)    -- designated first
//!    or updateDescription.updatedFields.backup in [<mark>, <mark>.)    -- designated as backup
//!    or updateDescription.updatedFields.next   in ["/", "0")           -- nobody was queued
//!    or (updatedFields.leaseId is null and no updatedFields.next)      -- a lock without a queue
//!    or updatedFields["leaseId.released"] exists                       -- a semaphore slot's release
//!    or (updatedFields.lastReleased exists, no updatedFields.leaseId)) -- kept on with a minimum hold
//!   ```
//!
//! A release pops the first live entry of the queue into `next` and names the second in
//! `backup` (`queue.rs`), both as `"<mark>/<released id>"`, so each release reaches the
//! streams of two processes. The first wakes one acquirer at once; the backup one after the
//! handoff fallback, if nothing else reached it for the name meanwhile (the first died or its
//! acquirers gave up). Grants reach no stream that only waits (they free nothing; an acquirer
//! that lost the race sleeps until the winner's expiry or its own designation). Why no
//! acquirer waits for ever:
//!
//! * a queued process is designated in turn (each release pops one entry; a busy attempt
//!   re-registers);
//! * a process whose last acquirer of the name stops waiting without the lock (a timeout, a
//!   dropped future, an error) withdraws from the queue in the background
//!   (`backends/notify/hub.rs`, `Hub::withdraw_later`; `queue.rs` `withdraw`), so releases do
//!   not designate processes that no longer wait;
//! * an acquirer that the next release would not reach — its process is third or further back
//!   in the queue, or not queued (the queue is full, its entry was withdrawn under it) — reads
//!   the lock once a second while it waits (`probe.rs`) and tries once the name has been free
//!   for the handoff fallback: if the first and the backup died, were stopped, or exited before
//!   their withdrawal was sent, a live waiter behind them holds the name within about a second,
//!   not at the holder's reported expiry. The price is one read per second per waiting process
//!   beyond the second, while the name is held (a read writes nothing, so it wakes no stream).
//!   Queue entries of dead processes end two seconds after the holder's expiry;
//! * a process whose name was not covered when it tried polls with the wait strategy.
//!
//! Releases of a lock without a queue, semaphore slot releases (slots are not queued), leases
//! kept on with a minimum hold, deletions and inserts reach every waiting process as before;
//! so does everything on MongoDB 4.4, whose replace events carry no update description.
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
//! nobody; otherwise (this backend is the backup, or the name is covered fully) one after the
//! fallback delay, if nothing else happened to the name meanwhile (`queue.rs`). With the stream healthy, a busy acquirer otherwise sleeps until the
//! holder's reported expiry (a crashed holder writes nothing). Observers
//! ([`wait_for_change`](crate::LockBackendExt::wait_for_change)) are all woken.
//!
//! # Early loss detection
//! [`lease_gone`](crate::LockBackendExt::lease_gone) is the core's
//! ([`Notifier::lease_gone`]): it completes when an event shows the name with another lease id
//! or none, judging a change that names a *token* by it (below our token it is old news).
//! Changes without a token (a release, a delete, an insert of a new document) are checked with
//! one read of the lock document ([`Watcher::lease_gone_at`]: primary, majority read concern).
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
//! How the stream maps onto the core's rules (`backends/notify/feed.rs`):
//! * Opening the stream fails with an error that means change streams cannot work with this
//!   deployment as it is ([`is_permanent`]: a standalone server answers 40573, a missing
//!   `changeStream`/`find` privilege 13, a namespace change streams refuse 73, a view 166, a
//!   server without `$changeStream` 40324): [`OpenFailed::Unavailable`]. The backend polls with
//!   the configured wait strategy, logs it once (`tracing`), and `lease_gone` stays pending
//!   (loss is detected by extension and the local deadline); the stream is tried again every
//!   minute (`backends/notify/feed.rs`, `REPROBE_EVERY`), and once it opens, wake-ups are
//!   live again.
//! * Opening fails with any other error, transient or not known to be permanent (a failover,
//!   134 while a majority snapshot is not available yet, a refusal mongolock does not know):
//!   [`OpenFailed::Failed`], retried with backoff (at most 5 s apart) while waiters poll. One
//!   such error when the stream first opens no longer turns wake-ups off.
//! * A resumable error (network, failover, `ResumableChangeStreamError`) or a `getMore` that
//!   stalls for [`STALL_LIMIT`]: the driver resumes once by itself; beyond that the stream
//!   breaks [`Broke::Resumable`] and the task reopens it from its resume token (after a short
//!   backoff if it keeps failing), so no event is lost. While it cannot, waiters are woken and
//!   poll with the wait strategy.
//! * The resume token is refused (history lost, 286; [`OpenFailed::ResumeLost`]) or the stream
//!   fails otherwise, or the collection was dropped (invalidate; the drop event already woke
//!   every waiter and holder): [`Broke::Lost`], the stream is reopened from now, and once it is open
//!   **every waiter is woken to re-check and every holder reads its lock once**, since changes
//!   in between are unknown.
//! * After the first open every waiter is woken once too: a release between the first
//!   registration and the open could otherwise slip by.

use std::borrow::Cow;
use std::collections::HashSet;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;
use mongodb::Collection;

use super::document::{self, LAST_RELEASED, LEASE_ID, TOKEN};
use super::errors;
use super::queue::{Handoff, BACKUP, NEXT};
use crate::backend::{ChangeWaiter, LeaseId};
use crate::backends::notify::handoff::new_mark;
use crate::backends::notify::hub::{Change, Covered, Hub, Narrowed};
use crate::backends::notify::{Broke, Feed, Notifier, OpenFailed, Opened};

/// How long the server holds an empty `getMore` open (`maxAwaitTimeMS`).
const MAX_AWAIT: Duration = Duration::from_secs(1);

/// A `getMore` that has not answered after this long is taken for a dead connection (no socket
/// timeout would end it): the stream is resumed from its resume token on a new one.
const STALL_LIMIT: Duration = Duration::from_secs(20);

/// How long a stopped task keeps its cursor before dropping it (see [`ChangeFeed::retire`]).
const RETIRE_AFTER: Duration = Duration::from_millis(200);

/// A stream narrowed to more names than this covers every name instead.
const MAX_NARROWED: usize = 1000;

/// Names kept covered after they went out of use, beyond twice the names in use.
const KEEP_COVERED: usize = 64;

/// A name held here this long without coverage is added (leases released sooner cost the
/// stream nothing).
const COVER_HELD_AFTER: Duration = Duration::from_secs(1);

/// At a reopen, a name held here at least this long is covered fully too (not only those held
/// for [`COVER_HELD_AFTER`], which ask for the reopen): so one reopen covers a batch of held
/// names, and a lease released within milliseconds of its grant still costs nothing.
const COVER_HELD_WITH: Duration = Duration::from_millis(100);

/// The stream is reopened at most this often to widen it.
const MIN_WIDEN_INTERVAL: Duration = Duration::from_millis(20);

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

/// The shared change stream of one backend (or one set of document locks): the shared
/// notification core fed by the stream, and what only MongoDB needs (the mark on its own lease
/// ids, the read a holder makes); see the [module docs](self).
pub(crate) struct Watcher {
    notifier: Notifier<ChangeFeed>,
    coll: Collection<Document>,
    target: Arc<Target>,
    /// The mark on this backend's own lease ids (see [`new_mark`]).
    own: String,
    /// Events read from the stream, ever (diagnostics).
    events: Arc<AtomicU64>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("notifier", &self.notifier)
            .finish_non_exhaustive()
    }
}

impl Watcher {
    /// A watcher whose stream starts on first need; `enabled: false` means never (poll).
    pub(crate) fn new(coll: Collection<Document>, enabled: bool, target: Target) -> Watcher {
        let own = new_mark();
        let target = Arc::new(target);
        let events = Arc::new(AtomicU64::new(0));
        let feed = {
            let (coll, target, own) = (coll.clone(), target.clone(), own.clone());
            let events = events.clone();
            let ns = coll.namespace().to_string();
            move || ChangeFeed {
                label: format!("lock change stream on {ns}"),
                ns: ns.clone(),
                coll: coll.clone(),
                target: target.clone(),
                own: own.clone(),
                covered: Covered::All,
                resume: None,
                stream: None,
                opened_at: Instant::now(),
                events: events.clone(),
                unavailable_logged: false,
            }
        };
        let notifier = Notifier::with_feed(enabled, feed);
        if matches!(*target, Target::Names) {
            // Named locks have a handoff queue (`queue.rs`): withdraw from it when the last
            // acquirer of a name here stops waiting.
            let (coll, own) = (coll.clone(), own.clone());
            notifier.hub().set_withdraw(Arc::new(move |name| {
                let (coll, own) = (coll.clone(), own.clone());
                Box::pin(async move { super::queue::withdraw(&coll, &name, &own).await })
            }));
        }
        Watcher {
            notifier,
            coll,
            target,
            own,
            events,
        }
    }

    /// Whether every change is delivered; starts the stream if needed.
    pub(super) fn is_live(&self) -> bool {
        self.notifier.is_live()
    }

    /// Whether the changes of `name` are delivered (the stream is live and covers it).
    pub(super) fn is_live_for(&self, name: &str) -> bool {
        self.notifier.is_live_for(name)
    }

    /// How many events the stream has delivered, ever.
    pub(super) fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    pub(super) fn watched_names(&self) -> usize {
        self.notifier.watched_names()
    }

    /// An acquirer's registration for the next change of `name`. Of a name the stream covers
    /// for handoffs only, it also ends when a probe finds the name free although no release
    /// reached this process (`probe.rs`).
    pub(super) fn change_waiter(&self, name: &str) -> Option<ChangeWaiter> {
        let waiter = self.notifier.change_waiter(name)?;
        if !waiter.is_live() || !self.notifier.hub().covers_for_handoffs_only(name) {
            return Some(waiter);
        }
        Some(waiter.or_when(super::probe::until_free(
            self.coll.clone(),
            name.to_owned(),
            self.own.clone(),
        )))
    }

    /// Records whether this backend's mark is in the handoff queue of `name` (after a busy
    /// attempt that registered, or a grant), so that it withdraws when its last acquirer of
    /// the name stops waiting.
    pub(super) fn queued(&self, name: &str, queued: bool) {
        self.notifier.hub().set_queued(name, queued);
    }

    /// Waits until this backend's withdrawals from handoff queues have been sent, at most
    /// `within`; true when none is left.
    pub(super) async fn settle(&self, within: Duration) -> bool {
        self.notifier.hub().settle(within).await
    }

    pub(super) async fn wait_for_change(&self, name: &str, max_wait: Duration) {
        self.notifier.wait_for_change(name, max_wait).await;
    }

    /// A lease id for an acquire call of this backend: marked with [`new_mark`], so that the
    /// stream leaves out this backend's own grants and releases (see the [module docs](self)).
    pub(crate) fn new_lease_id(&self) -> LeaseId {
        LeaseId::random_with_prefix(&self.own)
    }

    /// Remembers a lease this backend granted (its token, and which changes are news to it),
    /// and tells this backend's holders and observers of the name at once: the stream leaves
    /// out the grants of this backend's own lease ids. `name` is the registry key (a lock name,
    /// or [`document_key`]).
    pub(crate) fn granted(&self, name: &str, lease_id: &LeaseId, token: u64) {
        // Before remembering it: a holder does not judge its own grant.
        self.notifier.hub().dispatch_grant(
            name,
            Change::Lease {
                lease_id: Some(lease_id.as_str().to_owned()),
                token: Some(token),
            },
        );
        self.notifier.granted(name, lease_id, token);
    }

    /// Forgets a lease (released, or given up on).
    pub(crate) fn released(&self, lease_id: &LeaseId) {
        self.notifier.released(lease_id);
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
        self.notifier
            .hub()
            .deliver(name, change, handoff.wakes(&self.own));
    }

    /// After this backend kept a lease of `name` on with a minimum hold (its expiry moved, the
    /// lease stays): wakes one of this backend's acquirers of the name (it retries and learns
    /// the new expiry), its observers, and its holders (which read their lock), since the
    /// stream leaves out this backend's own writes.
    pub(crate) fn held_on(&self, name: &str) {
        self.notifier.hub().dispatch(name, Change::Unknown);
    }

    /// The mark of this backend's lease ids (see [`new_mark`]).
    pub(crate) fn own_mark(&self) -> &str {
        &self.own
    }

    /// How many of this backend's acquirers wait for a change of `name`.
    pub(crate) fn acquirers(&self, name: &str) -> usize {
        self.notifier.acquirers(name)
    }

    pub(super) async fn lease_gone(&self, name: &str, lease_id: &LeaseId) {
        self.lease_gone_at(name, &Bson::String(name.to_owned()), lease_id)
            .await;
    }

    /// Completes when the lease `lease_id` of the document with `_id` `id` (registry key `name`)
    /// is gone; pending while notifications are unavailable.
    pub(crate) async fn lease_gone_at(&self, name: &str, id: &Bson, lease_id: &LeaseId) {
        self.notifier
            .lease_gone(name, lease_id, || self.still_holds(name, id, lease_id))
            .await;
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

/// The names of `set`, sorted (a stable pipeline for a stable set).
fn sorted(set: &HashSet<Arc<str>>) -> Vec<&str> {
    let mut names: Vec<&str> = set.iter().map(|n| &**n).collect();
    names.sort_unstable();
    names
}

/// The stream's pipeline; see the [module docs](self).
fn pipeline(target: &Target, own: &str, covered: &Covered) -> Vec<Document> {
    match target {
        Target::Names => names_pipeline(own, covered),
        Target::Documents { field } => documents_pipeline(field),
    }
}

/// The pipeline of the lock collection; `own` is the backend's lease-id mark (see
/// [`new_mark`]): events that grant one of its leases, or release one (the release records
/// the id in `lastReleased`), do not pass. With [`Covered::Only`], only those names' events
/// pass (and the events that concern every name).
fn names_pipeline(own: &str, covered: &Covered) -> Vec<Document> {
    let updated = |f: &str| format!("updateDescription.updatedFields.{f}");
    let full = |f: &str| format!("fullDocument.{f}");
    let end = format!("{}.", own.trim_end_matches('-'));
    let ours = || doc! { "$gte": own, "$lt": end.as_str() };
    let released_slot = format!("{LEASE_ID}.released");
    let mut filter = doc! {
            "$or": [
                { "operationType": { "$in": [
                    "insert", "replace", "delete", "drop", "dropDatabase", "rename", "invalidate",
                ] } },
                { "operationType": "update", updated(LEASE_ID): { "$exists": true } },
                // A lease kept on with a minimum hold (`ops::release_after_command`): its
                // expiry moved, waiters must learn it.
                { "operationType": "update", updated(LAST_RELEASED): { "$exists": true } },
            ],
            "$nor": [
                { updated(LEASE_ID): ours() },
                { updated(LEASE_ID): Bson::Null, updated(LAST_RELEASED): ours() },
                { full(LEASE_ID): ours() },
                { full(LEASE_ID): Bson::Null, full(LAST_RELEASED): ours() },
                // A semaphore slot's release (`slots.rs`).
                { updated(&released_slot): ours() },
                { full(&released_slot): ours() },
            ],
    };
    if let Covered::Only(names) = covered {
        // The releases meant for this process: `next` (first) or `backup` names its mark
        // (`"<mark>/<released id>"`, in the range of its lease ids), or `next` names nobody
        // (`"/<released id>"`); a release of a lock without a queue (no `next` written) and a
        // semaphore slot's release (not queued) designate nobody either; a lease kept on with
        // a minimum hold (`lastReleased` written, `leaseId` unchanged) tells every waiter its
        // new expiry. Deletions, inserts and MongoDB 4.4's replace events pass as before.
        let handoffs = vec![
            doc! { "operationType": { "$in": ["insert", "replace", "delete"] } },
            doc! { updated(NEXT): ours() },
            doc! { updated(BACKUP): ours() },
            doc! { updated(NEXT): { "$gte": "/", "$lt": "0" } },
            doc! { updated(LEASE_ID): { "$type": "null" }, updated(NEXT): { "$exists": false } },
            doc! { updated(&released_slot): { "$exists": true } },
            doc! { updated(LAST_RELEASED): { "$exists": true }, updated(LEASE_ID): { "$exists": false } },
        ];
        // First, so that a server testing the conjuncts in order drops other names' events
        // before anything else (mongo-testserver does; mongod plans the whole `$match`).
        let mut narrowed = doc! {
            "$and": [{ "$or": [
                { "documentKey._id": { "$in": sorted(&names.full) } },
                { "documentKey._id": { "$in": sorted(&names.handoffs) }, "$or": handoffs },
                { "operationType": { "$in": ["drop", "dropDatabase", "rename", "invalidate"] } },
            ] }],
        };
        narrowed.extend(filter);
        filter = narrowed;
    }
    vec![
        doc! { "$match": filter },
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

/// Whether a whole lock document shows a lease kept on by its holder with a minimum hold:
/// its `leaseId` is also its `lastReleased`.
fn kept_on(fields: Option<&Document>) -> bool {
    fields.is_some_and(|f| {
        matches!(
            (f.get_str(LEASE_ID), f.get_str(LAST_RELEASED)),
            (Ok(a), Ok(b)) if a == b
        )
    })
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
                // A whole document whose lease its holder kept on with a minimum hold (its
                // id is also the last released one): its expiry moved, so it is news although
                // the lease is the same (MongoDB 4.4 reports the write as a replace event).
                "replace" if kept_on(fields) => Change::Unknown,
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
            hub.deliver(&name, change, handoff.wakes(own));
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
    pipeline: Vec<Document>,
    resume: Option<ResumeToken>,
) -> mongodb::error::Result<ChangeStream<Document>> {
    let stream = coll
        .watch()
        .pipeline(pipeline)
        .resume_after(resume)
        .max_await_time(MAX_AWAIT)
        .await?;
    Ok(stream.with_type::<Document>())
}

/// The change stream as the [`Feed`] of the backend's [`Notifier`]: opened from the last resume
/// token when there is one, so that the changes while it was down are delivered.
pub(crate) struct ChangeFeed {
    label: String,
    ns: String,
    coll: Collection<Document>,
    target: Arc<Target>,
    /// The mark on this backend's own lease ids (see [`new_mark`]).
    own: String,
    /// The names the open stream delivers (see "Narrowed to the names in use").
    covered: Covered,
    resume: Option<ResumeToken>,
    /// Never dropped by a cancellation (see [`retire`](ChangeFeed::retire)).
    stream: Option<ManuallyDrop<ChangeStream<Document>>>,
    opened_at: Instant,
    /// Events read from the stream, ever (shared with the [`Watcher`]).
    events: Arc<AtomicU64>,
    /// Whether this run of the task logged that change streams are unavailable.
    unavailable_logged: bool,
}

impl ChangeFeed {
    /// What the next stream covers: every name for document locks; for lock names, the names
    /// in use here plus those covered now (a name stays covered while the set is small, so
    /// that contention moving between a few names does not reopen the stream each time), or
    /// every name past [`MAX_NARROWED`]. Fully: the names observed here, and those held here
    /// for [`COVER_HELD_WITH`] or held and covered fully now; the others for handoffs only
    /// (see "Only the releases meant for this process").
    fn coverage(&self, hub: &Hub) -> Covered {
        if *self.target != Target::Names {
            return Covered::All;
        }
        let now = Instant::now();
        let narrowed_now = match &self.covered {
            Covered::Only(n) => Some(n),
            Covered::All => None,
        };
        let mut next = Narrowed::default();
        for (name, interest) in hub.interest() {
            let held_long = interest.held_since.is_some_and(|since| {
                now.duration_since(since) >= COVER_HELD_WITH
                    || narrowed_now.is_some_and(|n| n.full.contains(&name))
            });
            if interest.observed || held_long {
                next.full.insert(name);
            } else {
                next.handoffs.insert(name);
            }
        }
        let in_use = next.len();
        if let Some(n) = narrowed_now {
            if n.len() <= 2 * in_use + KEEP_COVERED {
                // Names no longer in use here stay covered, for handoffs only.
                for name in n.full.iter().chain(&n.handoffs) {
                    if !next.full.contains(name) {
                        next.handoffs.insert(name.clone());
                    }
                }
            }
        }
        if next.len() > MAX_NARROWED {
            return Covered::All;
        }
        Covered::Only(next)
    }

    /// Whether the stream should be reopened to cover more names: an acquirer or observer
    /// wants an uncovered name, or a name has been held here for [`COVER_HELD_AFTER`] without
    /// coverage.
    fn should_widen(&self, hub: &Hub) -> bool {
        matches!(self.covered, Covered::Only(_))
            && (hub.is_wanted() || hub.uncovered_since(Instant::now() - COVER_HELD_AFTER))
    }

    /// Where a broken stream can be resumed: its resume token, if it has one.
    fn resume_point(&mut self) -> Broke {
        self.resume = self.stream.as_ref().and_then(|s| s.resume_token());
        if self.resume.is_some() {
            Broke::Resumable
        } else {
            Broke::Lost
        }
    }

    /// Stops the stream to reopen it where it is with more names covered.
    fn widen(&mut self) -> Broke {
        tracing::debug!(namespace = %self.ns, "widening the lock change stream to names newly in use");
        match self.resume_point() {
            Broke::Resumable => Broke::Widen,
            lost => lost,
        }
    }
}

impl Feed for ChangeFeed {
    fn label(&self) -> &str {
        &self.label
    }

    async fn open(&mut self, hub: &Hub) -> Result<Opened, OpenFailed> {
        self.close();
        let ns = &self.ns;
        let covered = self.coverage(hub);
        let pipeline = pipeline(&self.target, &self.own, &covered);
        match open(&self.coll, pipeline, self.resume.clone()).await {
            Ok(stream) => {
                self.stream = Some(ManuallyDrop::new(stream));
                self.opened_at = Instant::now();
                if let Covered::Only(names) = &covered {
                    tracing::debug!(namespace = %ns, fully = names.full.len(), handoffs = names.handoffs.len(), "the lock change stream covers the names in use here");
                }
                self.covered = covered.clone();
                hub.cover(covered);
                Ok(if self.resume.is_some() {
                    Opened::Resumed
                } else {
                    Opened::Fresh
                })
            }
            Err(e) if !is_resumable(&e) && self.resume.take().is_some() => {
                tracing::warn!(namespace = %ns, error = %errors::describe(&e), "the lock change stream cannot resume from its resume token; reopening it from now and waking every waiter to re-check");
                Err(OpenFailed::ResumeLost)
            }
            Err(e) if is_permanent(&e) => {
                if self.unavailable_logged {
                    tracing::debug!(namespace = %ns, error = %errors::describe(&e), "change streams are still unavailable");
                } else {
                    self.unavailable_logged = true;
                    log_unavailable(ns, &e);
                }
                Err(OpenFailed::Unavailable)
            }
            // Transient, or not known to be permanent: retried with backoff.
            Err(e) => Err(OpenFailed::Failed(errors::describe(&e))),
        }
    }

    async fn deliver(&mut self, hub: &Hub) -> Broke {
        let ns = &self.ns;
        if self.stream.is_none() {
            return Broke::Lost;
        }
        loop {
            // Widening cannot wait for an acquirer (it polls meanwhile); a held name can wait
            // for the current getMore to answer.
            if self.should_widen(hub) {
                if self.opened_at.elapsed() < MIN_WIDEN_INTERVAL {
                    tokio::time::sleep_until((self.opened_at + MIN_WIDEN_INTERVAL).into()).await;
                }
                return self.widen();
            }
            let Some(stream) = self.stream.as_mut() else {
                return Broke::Lost;
            };
            let narrowed = matches!(self.covered, Covered::Only(_));
            let next = tokio::select! {
                next = tokio::time::timeout(STALL_LIMIT, stream.next_if_any()) => next,
                // Abandons the getMore in flight: the new stream resumes before it.
                () = hub.widen_wanted(), if narrowed => continue,
            };
            match next {
                Ok(Ok(Some(ev))) => {
                    self.events.fetch_add(1, Ordering::Relaxed);
                    dispatch(hub, &ev, &self.target, &self.own);
                }
                Ok(Ok(None)) => {
                    if !stream.is_alive() {
                        // Every holder reads its lock once the stream is open again.
                        tracing::debug!(namespace = %ns, "the lock change stream was invalidated (collection dropped or renamed); reopening it");
                        self.resume = None;
                        return Broke::Lost;
                    }
                }
                Ok(Err(e)) if !is_resumable(&e) => {
                    tracing::warn!(namespace = %ns, error = %errors::describe(&e), "the lock change stream failed; reopening it from now and waking every waiter to re-check");
                    self.resume = None;
                    return Broke::Lost;
                }
                Ok(Err(e)) => {
                    tracing::debug!(namespace = %ns, error = %errors::describe(&e), "lock change stream interrupted; resuming it from its resume token");
                    return self.resume_point();
                }
                Err(_) => {
                    tracing::warn!(namespace = %ns, "the lock change stream's getMore did not answer for {STALL_LIMIT:?}; resuming it on a new connection");
                    return self.resume_point();
                }
            }
        }
    }

    fn close(&mut self) {
        if let Some(stream) = self.stream.take() {
            drop(ManuallyDrop::into_inner(stream));
        }
    }

    /// Drops the stream of a backend that is gone, a little later.
    ///
    /// Dropping a driver cursor spawns a `killCursors` task; if the runtime is shutting down at
    /// that moment, the driver (3.9) can panic in that task (its connection pool worker is
    /// already gone). Backends are often dropped right before their runtime ends, so the cursor
    /// is dropped only after a short pause: if the runtime shuts down meanwhile, this task is
    /// cancelled and the cursor is left for the server to time out instead. Streams of tasks
    /// cancelled by a runtime shutdown are never dropped for the same reason (they are
    /// `ManuallyDrop`).
    async fn retire(mut self) {
        tokio::time::sleep(RETIRE_AFTER).await;
        self.close();
    }
}

/// A standalone server: "The $changeStream stage is only supported on replica sets".
const NOT_A_REPLICA_SET: i32 = 40573;

/// Server errors that mean change streams cannot work with this deployment as it is, so the
/// backend polls (and tries again every minute) instead of retrying with backoff:
///
/// * 40573 (no code name): a standalone server. Manual, "Change Streams": "Change streams are
///   available for replica sets and sharded clusters".
/// * 13 `Unauthorized`: the user lacks the `changeStream` or `find` privilege on the collection
///   (manual, "Change Streams" › "Access Control"; the built-in `read` role has both).
/// * 73 `InvalidNamespace`: a namespace change streams refuse — the `admin`, `local` and
///   `config` databases and `system.*` collections ("$changeStream may not be opened on the
///   internal ... database"; SERVER-34040).
/// * 166 `CommandNotSupportedOnView`: the collection is a view, which has no change events
///   (SERVER-31476).
/// * 40324 (`Location40324`, "Unrecognized pipeline stage name"): a server without
///   `$changeStream` (older than 3.6, or a look-alike that lacks it).
///
/// Everything else — the transient codes and labels of [`errors::is_transient`] (134
/// `ReadConcernMajorityNotAvailableYet` among them: the driver's retryable-reads list has it),
/// and any error not listed here — is retried with backoff: a refusal that is not known to be
/// permanent must not turn wake-ups off for the life of the process.
fn is_permanent(e: &mongodb::error::Error) -> bool {
    const UNAUTHORIZED: i32 = 13;
    const INVALID_NAMESPACE: i32 = 73;
    const NOT_SUPPORTED_ON_VIEW: i32 = 166;
    const UNRECOGNIZED_STAGE: i32 = 40324;
    !errors::is_transient(e)
        && matches!(
            errors::code(e),
            Some(
                NOT_A_REPLICA_SET
                    | UNAUTHORIZED
                    | INVALID_NAMESPACE
                    | NOT_SUPPORTED_ON_VIEW
                    | UNRECOGNIZED_STAGE
            )
        )
}

/// Logs, once per run of the stream's task (later refusals are logged at debug level), why
/// notifications are unavailable.
fn log_unavailable(ns: &str, e: &mongodb::error::Error) {
    let error = errors::describe(e);
    if errors::code(e) == Some(NOT_A_REPLICA_SET) {
        tracing::info!(namespace = %ns, %error, "change streams need a replica set; lock waiters poll with the configured wait strategy and loss is detected by extension (tried again every minute)");
    } else {
        tracing::warn!(namespace = %ns, %error, "cannot open a change stream on the lock collection (it needs a replica set, MongoDB 4.4+ and the changeStream and find privileges); lock waiters poll with the configured wait strategy and loss is detected by extension (tried again every minute)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::notify::hub::lease;

    fn interpret_names(ev: &Document) -> Event<'_> {
        interpret(ev, &Target::Names)
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
