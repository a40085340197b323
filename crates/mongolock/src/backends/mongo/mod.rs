//! MongoDB backend (feature `mongodb`).
//!
//! # The lock document
//! One document per lock name in the lock collection (default `distributed.locks`):
//!
//! ```text
//! { _id: <name>, leaseId: <string|null>, fencingToken: <int64>, epoch: <int64|null>,
//!   acquiredAt: <date>, expiresAt: <date>, holder: { host, pid, app },
//!   ended: [<token>], endedFrom: <int64>, lastReleased: <string>,
//!   waiters: [{ m: <backend mark>, until: <date> }], next: <string>, backup: <string>,
//!   reserved: { m: <backend mark>, until: <date> } | null, retired: [<lease id>] }
//! ```
//!
//! (`waiters`, `next`, `backup` and `reserved` order the handoff between processes:
//! `queue.rs`; `retired` lists lease ids that no late attempt may grant again: `retired.rs`.)
//!
//! plus up to 4096 small fencing epoch counters, `{ _id: { mongolock: "fencing-epoch", bucket:
//! <0..4095> }, epoch, takenAt }` (their `_id` is not a string, so
//! [`list`](crate::LockBackend::list) skips them; they have no `expiresAt`, so the TTL index
//! never removes them). A name always draws from the same counter: FNV-1a (64 bit) of the
//! name's UTF-8 bytes modulo 4096. That function, the 4096 and the 2²⁰ below are part of the
//! storage format.
//!
//! # Acquire: one round trip (`acquire.rs`)
//! One `findAndModify` on `{_id: name}` with `new: true` and an update **pipeline**. MongoDB
//! refuses `$expr` in the filter of an upsert, so the test "is the name free?" lives inside the
//! pipeline: free = `leaseId` is null/missing, or `expiresAt <= $$NOW` (server time), or
//! `leaseId` is already ours (an idempotent retry after a lost reply) — and in both cases our
//! lease id is not `retired` (a late attempt of a lease released after an attempt of it failed:
//! `retired.rs`). The pipeline is one
//! `$replaceWith: {$cond: [free, {$mergeObjects: ["$$ROOT", <new lease>]}, "$$ROOT"]}` (so
//! "free" is evaluated once), and a busy attempt is a no-op write. The reply is projected to
//! the lease fields. The client compares the returned `leaseId` with its own. This is
//! DistributedLock's single-round-trip scheme; we prefer it to a filter + duplicate-key scheme
//! because a busy attempt costs no error round trip and leaves the document untouched.
//!
//! **The uncontended shortcut.** When this backend's own last release of a name found nobody
//! queued (`backends/leases.rs` `CheapNames`; one use per release), its next attempt on the name first
//! sends a smaller command: the "free" test in the filter — `leaseId: null` (released by its
//! holder or force-released), `limit: null` (exclusive mode), `waiters` null or empty,
//! `reserved` null, `epoch` a number and `fencingToken < epoch · 2²⁰`, our lease id not in
//! `retired` — and a one-stage `$set`
//! of `leaseId`, `fencingToken + 1`, `acquiredAt: $$NOW`, `expiresAt: $$NOW + ttl` and the
//! holder. On such a document the full pipeline would write exactly these fields: the lease
//! is free (so `free` holds), the epoch has a token left (so the token is `fencingToken + 1`
//! and the epoch stays), no lease ends (`leaseId` is null: its holder released it, or a
//! force-release already recorded its token in `ended`), and there is no queue, reservation
//! or slot to update. So a grant by the shortcut is a grant of the full pipeline, and every
//! argument below (exclusion, tokens, the record of ended leases) covers it. When the filter
//! matches nothing (someone else took the name, or it is queued, reserved, in slot mode, at
//! the end of its epoch, or gone), the full attempt follows: one more command, once per
//! release. A lease granted this way is released the same way first (`ops::release`): filter
//! `{_id, leaseId: ours, limit: null, waiters: null or []}`, `$set` of `leaseId: null`,
//! `expiresAt: min(expiresAt, $$NOW)` and `lastReleased` — what the full release writes when
//! nobody is queued; when someone queued meanwhile (or the lease is not ours any more) it
//! matches nothing and the full release follows.
//!
//! # Fencing tokens: epochs of 2²⁰ tokens
//! Tokens are issued in **epochs**: epoch `e` owns the tokens `(e - 1) · 2²⁰ + 1 ..= e · 2²⁰`.
//! A document's `epoch`, when set, is the epoch its next grant may draw from: a grant takes
//! `fencingToken + 1` when that is still in `epoch`'s range (`fencingToken < epoch · 2²⁰`).
//! `fencingToken`, once set, holds the last token issued for the document; `epoch` is null while
//! a grant waits for its token to be stamped (the document then still shows the previous
//! holder's token, or none when it is new). Otherwise (a new document, or the epoch used up) the grant is made with
//! `epoch: null`, and the acquirer takes a new epoch `e` from the name's
//! counter (`findAndModify`, pipeline `epoch + 1`, upsert; a counter starts at 1) and stamps its
//! lease, if still its own and unexpired, with `fencingToken = max(fencingToken + 1, (e - 1) ·
//! 2²⁰ + 1)` and `epoch = e`. Release never deletes the document (it sets `leaseId: null` and
//! `expiresAt` to server now, keeping the token); only the TTL monitor deletes documents, after
//! `expiresAt` plus a TTL index's `expireAfterSeconds` (ours: `cleanup_after`).
//!
//! **First acquisition** of a name (no document): the attempt above matches nothing (it does not
//! upsert). If the collection's TTL indexes were verified (see below), the acquirer then takes
//! an epoch `e` first, learning the server time `t_e` of the increment, and upserts with the
//! same pipeline, which gives a document *it creates* the token `(e - 1) · 2²⁰ + 1` and epoch
//! `e` only if the server's `$$NOW < t_e + W`, where `W = min(cleanup_after / 2, 60 s)`
//! (`cleanup_after` in whole seconds; no such window when it is under 2 s). So a first
//! acquisition is 2 writes (3 commands: the first findAndModify matched nothing, plus a
//! `listIndexes` at most every 10 s), and no document is written by every first acquisition
//! (the counters are spread over 4096 documents). When the window has passed, or another
//! process created the document meanwhile, the upsert acts like any grant (and a grant without
//! a token is stamped as above). When the TTL indexes were not verified, the upsert is made
//! without a window: the document is created with `epoch: null` and stamped (the stamp path).
//!
//! **The verification** (`index.rs`): the window is used only when `listIndexes`, at most
//! `TTL_CHECK_EVERY` (10 s) before the epoch is taken, showed that every TTL index of the
//! collection (any index with `expireAfterSeconds`, on any field) is `{expiresAt: ±1}` alone
//! with `expireAfterSeconds >= 2W` — or that there is none. A failed or unauthorised
//! `listIndexes`, or any other TTL index, means the stamp path.
//!
//! **Why tokens only grow.** Within one lifetime of a document (creation to deletion): a grant
//! in its epoch's range issues `token + 1`; a stamp issues at least `token + 1`. So tokens grow
//! by one document's rules. Across lifetimes, let lifetime `L` follow lifetime `L'` of the same
//! name (`L'` was deleted before `L`'s document was created). Every epoch `L'` used was taken
//! from the same counter as `L`'s first epoch `e`, and we show each is smaller than `e`; since
//! tokens of epoch `e'` are at most `e' · 2²⁰ < (e - 1) · 2²⁰ + 1`, `L`'s first token is above
//! all of `L'`'s (and later ones only grow).
//! * `L` stamped its first token: `e` was taken after `L`'s creation, after `L'`'s deletion,
//!   after every epoch `L'` took. A counter only grows, so each is below `e`.
//! * `L` was created with `e` (the first-acquisition path): suppose `L'` used an epoch `e' > e`.
//!   It was taken after `e`, at `t' > t_e`, by a lease of `L'` that expires after `t'` (a stamp
//!   needs an unexpired lease; a creation follows its epoch and its lease ends after it). `L'`
//!   was deleted between `t'` and `L`'s creation, so within `W` after `t_e`. Only TTL indexes
//!   delete lock documents, and a TTL index deletes a document no sooner than its
//!   `expireAfterSeconds` after the date of its field. **Assumption:** every TTL index that
//!   exists while `L'` is deleted was verified, i.e. is on `expiresAt` alone with
//!   `expireAfterSeconds >= 2W`. Then `L'` was deleted at or after its last lease's end plus
//!   `2W`, so after `t' + 2W > t_e + 2W`, and `L` was created after that — but its creation
//!   required `$$NOW < t_e + W`. Contradiction, as long as the clocks of the servers that
//!   evaluated these times (primaries across failovers, mongos) differ by less than `W` (a
//!   minute by default; half of `cleanup_after` when that is shorter).
//!
//!   **The residual window.** The verification `L`'s acquirer relied on was made at `v`, at
//!   most `TTL_CHECK_EVERY` before it took `e` (so `v > t_e - 10 s`), and found no offending
//!   TTL index; the deletion of `L'` happened after `t_e`. So the assumption can fail only if
//!   an offending TTL index (a shorter `expireAfterSeconds`, or a TTL index on another field
//!   such as `acquiredAt`) is created in the `TTL_CHECK_EVERY + W` (70 s by default) before
//!   `L`'s creation, *and* the TTL monitor deletes the document of a later lifetime of the
//!   same counter in the `W` between `t_e` and that creation. Every later verification (every
//!   10 s) sees the index and sends first acquisitions down the stamp path, which needs no
//!   assumption about deletions. Deleting lock documents by hand is outside the model (as is
//!   dropping the collection, below).
//!
//! **Bounds.** Tokens stay at or below 2⁵³ (exact in JSON and JavaScript): an epoch beyond
//! 2³³ is refused with [`Error::FencingTokensExhausted`](crate::Error) before anything is
//! granted. A counter grows by one per document lifetime (and per 2²⁰ grants of one name), so at
//! 1,000 new documents per second over the 4096 counters tokens pass 10¹⁵ after about 1,000
//! years. A new name starts at `(e - 1) · 2²⁰ + 1` where `e` counts the lifetimes of the names
//! sharing its counter: 1 for the first. A grant needs no bound on the number of grants of a
//! name: when its epoch is used up, the next grant takes a new epoch.
//!
//! **Dropping the collection** (or deleting the counters) restarts tokens at 1: nothing outside
//! the collection remembers them. A protected resource that stored a token then refuses the new,
//! smaller ones until its stored token is reset; do that together with the drop.
//!
//! # Extend and release
//! * Extend: `findAndModify` with filter `{_id, leaseId: ours, $expr: {$gt: ["$expiresAt",
//!   "$$NOW"]}}` and pipeline `$set expiresAt = $$NOW + ttl`; returns the new expiry. An expired
//!   lease is never extended.
//! * Retirement first, for a lease id one of whose attempts failed (its outcome unknown: the
//!   command may still be applied later): one `update` adds it to `retired`, so a late attempt
//!   never grants it again (`retired.rs`). Then the release, as for any lease.
//! * Release: `findAndModify` `{_id, leaseId: ours}` → `leaseId: null`, `expiresAt:
//!   min(expiresAt, $$NOW)`, the handoff to the first queued process and the second as backup
//!   (`queue.rs`), whose marks the reply returns (projected to `next`).
//! * Release with a minimum hold (`release_after`, see the
//!   [backend contract](crate::backend#minimum-hold-at-most-once-per-interval)): the same
//!   filter and one `$replaceWith` whose `$cond` decides by `$$NOW`: while the lease is
//!   unexpired and `acquiredAt + min_hold` is ahead, the lease stays (same `leaseId`, token,
//!   holder, `acquiredAt`) with `expiresAt = acquiredAt + min_hold` and its id written to
//!   `lastReleased`; otherwise the plain release above.
//!   Extend's filter has `lastReleased: {$ne: ours}`, so a lease kept on is never extended
//!   (a late extension cannot move the end of the hold). The write changes `lastReleased`,
//!   which other backends' change streams pass (`watch.rs`), so their waiters retry and learn
//!   the new expiry; this backend's own waiters are told in-process.
//!
//! Dates are computed with `$add` on dates (not `$dateAdd`), so **MongoDB 4.4 or newer** works
//! (pipeline updates and `$$NOW` appeared in 4.2, which has every feature used but is not
//! supported). Writes use `w: "majority"` by default. Uncontended acquire + release of an
//! existing name is 2 commands.
//!
//! # Semaphores (`slots.rs`)
//! A [`Semaphore`](crate::Semaphore)'s holders live in the same document, in a `slots` array
//! with a `limit` (slot mode): one `findAndModify` takes a slot and discards expired ones.
//! `slots.rs` holds the format, the acquire path and the safety argument (never more than
//! `limit` holders; tokens from the same epochs, so they grow across slots and across the
//! name's use as a lock).
//!
//! # The collection, and the TTL index (`index.rs`)
//! A backend uses only a collection that is empty or holds only mongolock's documents (lock
//! documents and epoch counters): before its first read, write or index creation it checks,
//! once, with one `find` for a document that is not ours; otherwise every operation fails
//! with [`Error::ForeignCollection`] — writes (nothing is written) and reads alike
//! ([`inspect`](crate::LockBackend::inspect), [`list`](crate::LockBackend::list),
//! [`list_matching`](crate::LockBackend::list_matching),
//! [`holders`](crate::LockBackend::holders), [`waiters`](crate::LockBackend::waiters),
//! [`slot_limit`](crate::LockBackend::slot_limit): an application's document is never
//! reported as a lock). Reads also check each document they return, at no extra round trip,
//! so a foreign document written after the check fails them the same way. Reads never
//! create anything: a collection that does not exist reads as empty (no locks), which is what
//! it holds — MongoDB creates a collection on its first write, so it exists once a lock was
//! taken there.
//!
//! An index `{expiresAt: 1}` with `expireAfterSeconds = cleanup_after` (default 1 hour) is
//! created once per collection per process, in the background, on the first acquisition.
//! Failures are logged with `tracing` and never fatal: correctness never depends on the index
//! existing; fencing depends only on no TTL index deleting lock documents too soon, which is
//! verified as above. Processes with different `cleanup_after` may share a collection: a first
//! acquisition whose verification finds the existing index too short for its window stamps.
//! [`MongoBackend::ensure_indexes`] creates the index explicitly and reports errors.
//!
//! # Change-stream wake-ups (`watch.rs`)
//! One change stream per backend (shared by its clones) wakes one waiting acquirer per name and
//! process within milliseconds of a release or takeover, lets busy waiters sleep until the
//! holder's expiry otherwise, and tells holders at once when their lease was taken. It falls back
//! to polling where change streams are unavailable (standalone servers, code 40573; missing
//! privileges; [`MongoBackendBuilder::notifications`]`(false)`), resumes from its resume token
//! after network errors and wakes every waiter to re-check whenever it had to start afresh. See
//! `watch.rs` for the details.
//!
//! # Reads
//! Every read that decides something — [`inspect`](crate::LockBackend::inspect) and
//! [`list`](crate::LockBackend::list) (and so `Election::leader` and `watch_leader`), the
//! change stream, and the check a holder makes when an event may concern its lease — goes to
//! the primary with majority read concern, whatever read preference and read concern the
//! database handle carries: a secondary can lag and show a lease already released or taken.
//! A deployment that refuses majority reads (MongoDB 4.4 started with
//! `enableMajorityReadConcern=false`, usual on primary-secondary-arbiter sets: error 148) is
//! read with local read concern on the primary instead, from the first refusal on; what that
//! gives up, and why no guarantee depends on it, is on `Reads`. (Document locks do not fall
//! back yet: on such a deployment their reads fail with that error.)
//!
//! # Release is idempotent for the holder
//! A release whose reply was lost (and whose driver retry failed too) is retried by the core.
//! The release matches the document only while the lease is ours (one command); when it
//! matches nothing, the lease ended either by an earlier try of this release or by someone
//! else. The document tells them apart by fencing token, with a record that does not grow
//! with the name's traffic: every write that ends a lease *without* its holder's release — a
//! grant that takes over an expired lease, a slot discarded after its expiry, a force-release
//! — appends that lease's token to `ended` (the last 64), and `endedFrom` is a floor above
//! which that list is complete (the lifetime's first token, raised when entries leave the
//! list). So one read decides: the lease was released by its holder when its token is at or
//! above the floor, at most the document's token, and not in `ended` (the argument is at
//! `document::released_by_holder`). The backend remembers the token of each lease it
//! granted (`backends/leases.rs`) until a minute after the lease's release (at most the 16,384 most
//! recently released); a release of a lease id it never saw granted (an abandoned attempt's)
//! counts a gone lease as not ours.
//! So [`Error::LeaseLost`] means someone else really ended the lease (or, the safe way
//! round, that more than 64 leases of the name were ended by others meanwhile, or the
//! document was deleted by TTL cleanup). Nothing a release writes grows with the name's
//! traffic. The filter and pipeline are in `document.rs` (`release_update`), shared with
//! document locks.
//!
//! # Errors
//! Network errors, server selection timeouts, pool clears, the retryable error labels and the
//! not-primary / shutdown / interrupted codes are [`Error::Unavailable`](crate::Error) (the core
//! retries them within the caller's wait budget); anything else, such as `Unauthorized` (13) or
//! `InvalidNamespace` (73), is [`Error::Backend`](crate::Error) with the server's message and a
//! hint. Messages are one line built from the error kind, code, code name and the server's
//! message (not the driver's `Display`, which adds labels, sources and raw replies), and say
//! what to do.

mod acquire;
pub(crate) mod document;
pub(crate) mod errors;
mod index;
mod operator;
mod ops;
mod probe;
mod queue;
mod retired;
mod slots;
pub(crate) mod watch;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use mongodb::bson::Document;
use mongodb::options::{
    CollectionOptions, ReadConcern, ReadPreference, SelectionCriteria, WriteConcern,
};
use mongodb::{Collection, Database};

use crate::backend::{
    AcquireRequest, Attempt, ChangeNotifications, ChangeWaiter, LeaseId, LeaseMode, LockBackend,
    LockInfo,
};
use crate::backends::leases::{self, Granted};
use crate::error::{Error, Result};

/// Default lock collection, as DistributedLock.MongoDB.
pub const DEFAULT_COLLECTION: &str = "distributed.locks";

/// Default delay after a lease's expiry before the TTL monitor may delete its document.
pub const DEFAULT_CLEANUP_AFTER: Duration = Duration::from_secs(3600);

/// Locks stored in a MongoDB collection. Cheap to clone. See the [module docs](self) for how it
/// works.
///
/// ```no_run
/// # async fn demo() -> mongolock::Result<()> {
/// use mongolock::{LockProvider, MongoBackend};
/// let client = mongodb::Client::with_uri_str("mongodb://localhost:27017").await.unwrap();
/// let backend = MongoBackend::builder(&client.database("app"))
///     .collection("locks")
///     .build()?;
/// let provider = LockProvider::builder(backend).app_name("worker").build()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MongoBackend {
    /// Lock writes: carries the configured write concern.
    coll: Collection<Document>,
    /// Reads that decide something (inspection, the change stream, loss checks): from the
    /// primary with majority read concern, whatever the database handle's read preference
    /// (local read concern where majority reads are refused: [`Reads`]).
    reads: Reads,
    cleanup_after: Duration,
    create_ttl_index: bool,
    /// Releases reserve the lock for the first queued process (`queue.rs`).
    fair_handoff: bool,
    /// The change stream shared by all clones (see `watch.rs`).
    watch: Arc<watch::Watcher>,
    /// The leases this backend (and its clones) granted (`backends/leases.rs`).
    leases: Arc<leases::Leases>,
    /// Whether the collection is ours, and what its TTL indexes allow (`index.rs`).
    checks: Arc<index::Checks>,
    /// Names this backend released with nobody queued (the uncontended shortcut, `acquire.rs`).
    cheap: Arc<crate::backends::leases::CheapNames>,
    /// Lease ids whose attempts failed: retired before their release (`retired.rs`).
    tainted: Arc<crate::backends::leases::Tainted>,
}

/// Builds a [`MongoBackend`]; see [`MongoBackend::builder`].
#[must_use]
#[derive(Debug)]
pub struct MongoBackendBuilder {
    db: Database,
    collection: String,
    write_concern: WriteConcern,
    cleanup_after: Duration,
    create_ttl_index: bool,
    change_streams: bool,
    fair_handoff: bool,
}

impl MongoBackendBuilder {
    /// The lock collection (default `distributed.locks`). It must be empty or hold only
    /// mongolock's documents: the backend checks that once, before its first read or write,
    /// and otherwise fails every operation with [`Error::ForeignCollection`], writing nothing
    /// (see the [module docs](self)). A collection that does not exist reads as empty; the
    /// first acquisition creates it.
    pub fn collection(mut self, name: impl Into<String>) -> Self {
        self.collection = name.into();
        self
    }

    /// Write concern of every lock write (default `w: "majority"`, so that a lease is not lost
    /// to a rollback after a primary failover).
    pub fn write_concern(mut self, write_concern: WriteConcern) -> Self {
        self.write_concern = write_concern;
        self
    }

    /// How long after a lease's expiry the TTL index may delete an unused lock document
    /// (`expireAfterSeconds`, default 1 hour, whole seconds). Fencing tokens keep growing across
    /// deletions either way.
    pub fn cleanup_after(mut self, after: Duration) -> Self {
        self.cleanup_after = after;
        self
    }

    /// Whether to create the TTL index in the background on first use (default true). Either
    /// way, first acquisitions create their document with a token only while the collection's
    /// TTL indexes are verified not to delete lock documents too soon (see the [module
    /// docs](self)).
    pub fn create_ttl_index(mut self, enabled: bool) -> Self {
        self.create_ttl_index = enabled;
        self
    }

    /// Whether to receive change notifications, by watching the lock collection with a change
    /// stream (default true; the same option as
    /// `PostgresBackendBuilder::notifications`, which uses `LISTEN`): waiters are
    /// then woken within milliseconds of a release and holders learn of a takeover at once (see
    /// the [module docs](self)). Without it, or where change streams are unavailable (a
    /// standalone server), waiters poll with the provider's wait strategy.
    pub fn notifications(mut self, enabled: bool) -> Self {
        self.change_streams = enabled;
        self
    }

    /// Whether a release reserves the lock for the first process in its queue for 500 ms of
    /// server time (default false): processes are then served strictly in turn, at the price
    /// that a queued process that died or gave up holds the lock up for those 500 ms, single
    /// attempts of other processes included. Either way a release wakes only the first queued
    /// process (see the [module docs](self)).
    pub fn fair_handoff(mut self, enabled: bool) -> Self {
        self.fair_handoff = enabled;
        self
    }

    /// Validates the collection name as MongoDB would and builds the backend. Sends nothing.
    pub fn build(self) -> Result<MongoBackend> {
        validate_collection_name(self.db.name(), &self.collection)?;
        if self.cleanup_after.as_secs() > i32::MAX as u64 {
            return Err(Error::invalid_option(
                "cleanup_after",
                format!(
                    "{:?} is above MongoDB's limit for expireAfterSeconds ({} s); choose a \
                     shorter delay",
                    self.cleanup_after,
                    i32::MAX
                ),
            ));
        }
        let options = CollectionOptions::builder()
            .write_concern(self.write_concern)
            .build();
        let reads = Reads::new(&self.db, &self.collection);
        Ok(MongoBackend {
            coll: self.db.collection_with_options(&self.collection, options),
            watch: Arc::new(watch::Watcher::new(
                reads.get().clone(),
                self.change_streams,
                watch::Target::Names,
            )),
            reads,
            cleanup_after: self.cleanup_after,
            create_ttl_index: self.create_ttl_index,
            fair_handoff: self.fair_handoff,
            leases: Arc::default(),
            checks: Arc::default(),
            cheap: Arc::default(),
            tainted: Arc::default(),
        })
    }
}

/// The collection handle of the reads that decide something ([`decision_reads`]): majority
/// read concern on the primary — or, on a deployment that refuses majority reads (MongoDB 4.4
/// started with `enableMajorityReadConcern=false`, the usual setting of a
/// primary-secondary-arbiter set: error 148 on every read but a change stream), local read
/// concern on the primary, from the first refusal on (found by the collection check that
/// precedes every operation, `index.rs` `Checks::ensure_ours`; shared by the backend's clones).
///
/// What local reads on the primary give up there: a read may show a write that is not yet
/// majority-committed, which a failover could roll back — `inspect`, `list` and `leader()`
/// could show such a lease, and a release that found nothing could take an earlier try of
/// its own for done. No grant depends on a read: grants are decided by the atomic
/// `findAndModify`, whose `w: "majority"` still guards durability, so exclusion and fencing
/// are unaffected. Change streams keep majority (MongoDB serves them), and a holder's check of
/// its lease after an event (`watch.rs`) keeps majority too: there it fails, which counts as
/// "still held", so such a holder learns of a takeover by its next extension instead.
#[derive(Clone, Debug)]
pub(crate) struct Reads {
    majority: Collection<Document>,
    local: Collection<Document>,
    refused: Arc<std::sync::atomic::AtomicBool>,
}

impl Reads {
    fn new(db: &Database, collection: &str) -> Reads {
        let local = CollectionOptions::builder()
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .read_concern(ReadConcern::local())
            .build();
        Reads {
            majority: db.collection_with_options(collection, decision_reads()),
            local: db.collection_with_options(collection, local),
            refused: Arc::default(),
        }
    }

    /// The handle to read with now.
    pub(crate) fn get(&self) -> &Collection<Document> {
        if self.refused.load(std::sync::atomic::Ordering::Relaxed) {
            &self.local
        } else {
            &self.majority
        }
    }

    /// After a read failed with `error`: switches to local reads for good and returns true when
    /// it was the refusal of majority reads (148) by the majority handle.
    pub(crate) fn refused_majority(&self, error: &Error) -> bool {
        let refused = matches!(
            error,
            Error::Backend {
                code: Some(148),
                ..
            }
        );
        refused
            && !self
                .refused
                .swap(true, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Options of the reads that decide something — whether a lease is still held, who leads, what
/// `list`/`inspect` report: the primary (a secondary may lag behind and show a lease that was
/// already released or taken, or miss a new one) and majority read concern (nothing a failover
/// can roll back). Set explicitly, so the database handle's own read preference
/// (`secondaryPreferred`, …) and read concern never apply to them.
pub(crate) fn decision_reads() -> CollectionOptions {
    CollectionOptions::builder()
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        .read_concern(ReadConcern::majority())
        .build()
}

/// Checks a collection name the way the server would, so that a bad name is reported before
/// anything is sent.
fn validate_collection_name(db: &str, coll: &str) -> Result<()> {
    let refuse = |reason: String| {
        Err(Error::InvalidCollection {
            name: coll.to_owned(),
            reason,
        })
    };
    if coll.is_empty() {
        return refuse(format!(
            "it is empty; use a name such as {DEFAULT_COLLECTION:?} (the default)"
        ));
    }
    if coll.contains('$') {
        return refuse("it contains '$', which MongoDB does not allow; remove it".into());
    }
    if coll.contains('\0') {
        return refuse("it contains a NUL character, which MongoDB does not allow".into());
    }
    if coll.starts_with('.') {
        return refuse("it starts with '.', which MongoDB does not allow".into());
    }
    if coll.starts_with("system.") {
        return refuse(
            "names starting with \"system.\" are reserved for MongoDB's own collections; \
             choose another name"
                .into(),
        );
    }
    let ns_len = db.len() + 1 + coll.len();
    if ns_len > 255 {
        return refuse(format!(
            "the namespace \"{db}.{coll}\" is {ns_len} bytes; MongoDB allows at most 255 \
             (database name + '.' + collection name), so shorten the collection name"
        ));
    }
    Ok(())
}

impl MongoBackend {
    /// Starts building a backend on `db`.
    pub fn builder(db: &Database) -> MongoBackendBuilder {
        MongoBackendBuilder {
            db: db.clone(),
            collection: DEFAULT_COLLECTION.to_owned(),
            write_concern: WriteConcern::majority(),
            cleanup_after: DEFAULT_CLEANUP_AFTER,
            create_ttl_index: true,
            change_streams: true,
            fair_handoff: false,
        }
    }

    /// The lock collection.
    pub fn collection(&self) -> &Collection<Document> {
        &self.coll
    }

    /// `database.collection`.
    pub fn namespace(&self) -> String {
        self.coll.namespace().to_string()
    }

    /// Creates the TTL index now, reporting any error (normally this happens in the background
    /// on first use), after checking, like every first write, that the collection is empty or
    /// holds only mongolock's documents.
    ///
    /// # Errors
    /// [`Error::ForeignCollection`] when the collection holds documents mongolock did not write
    /// (nothing is created); [`Error::Backend`] when the server refuses (an index on
    /// `expiresAt` with other options exists, or the user may not create indexes);
    /// [`Error::Unavailable`] on network errors.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future may leave the index being built by the server, which
    /// is harmless (the call is idempotent).
    pub async fn ensure_indexes(&self) -> Result<()> {
        self.checks.ensure_ours(&self.reads).await?;
        index::create_ttl_index(&self.coll, self.cleanup_after).await
    }

    /// The `_id` of the fencing epoch counter that `name` draws from (see the [module
    /// docs](self)). For tests and diagnostics.
    #[doc(hidden)]
    pub fn fencing_epoch_id(name: &str) -> Document {
        acquire::epoch_id(name)
    }

    /// How many change events this backend's stream has delivered since it was built (events
    /// of other processes' writes to names this process uses). For tests and diagnostics.
    #[doc(hidden)]
    pub fn stream_events(&self) -> u64 {
        self.watch.events()
    }

    /// The commands of an uncontended exclusive acquire + release of `req`, exactly as this
    /// backend sends them (filter, update pipeline and reply projection of each
    /// `findAndModify`): the full pipelines, or with `shortcut` the uncontended shortcut's
    /// (`acquire.rs`), for the peer benchmark's `--ops`, which prices their shape with the
    /// driver alone. Not a stable API.
    #[doc(hidden)]
    pub fn command_shapes(
        &self,
        req: &AcquireRequest,
        shortcut: bool,
    ) -> [(Document, Vec<Document>, Document); 2] {
        if shortcut {
            return [
                acquire::cheap_command(req),
                ops::short_release_command(&req.name, &req.lease_id),
            ];
        }
        // Uncontended: no acquirer of this backend waits for the name.
        let queueing = queue::Queueing::new(self.watch.own_mark(), 0, false);
        [
            acquire::command(req, queueing),
            ops::release_command(&req.name, &req.lease_id, self.fair_handoff),
        ]
    }

    fn is_slot(&self, lease_id: &LeaseId) -> bool {
        self.leases.is_slot(lease_id)
    }

    fn token(&self, lease_id: &LeaseId) -> Option<u64> {
        self.leases.get(lease_id).map(|g| g.token)
    }

    /// Releases a semaphore slot and wakes one of this backend's waiters of the name (the
    /// stream leaves out this backend's own writes).
    async fn release_slot(&self, name: &str, lease_id: &LeaseId) -> Result<bool> {
        let token = self.token(lease_id);
        let released = slots::release(&self.coll, self.reads.get(), name, lease_id, token).await;
        self.leases.released(lease_id);
        self.watch.released_name(name, &queue::Handoff::Unknown);
        released
    }

    /// How many lock names currently have an entry in the change-stream registry (names this
    /// backend's waiters wait on or its guards hold). For tests and diagnostics.
    #[doc(hidden)]
    pub fn watched_names(&self) -> usize {
        self.watch.watched_names()
    }
}

impl MongoBackend {
    /// One acquisition attempt ([`LockBackend::try_acquire`], which remembers the lease ids of
    /// the attempts that fail).
    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        // Nothing is written to a collection that is not ours (checked once).
        self.checks.ensure_ours(&self.reads).await?;
        if self.create_ttl_index {
            index::ensure_in_background(&self.coll, self.cleanup_after);
        }
        if let LeaseMode::Slot { limit } = req.mode {
            // The slot path decides on the first-acquisition shortcut by `cleanup_after`: the
            // configured one when the TTL indexes allow the shortcut, else zero (no window:
            // the stamp path). Verified before the attempt (cached: `index.rs`).
            let cleanup_after = match self
                .checks
                .creation_window(self.reads.get(), self.cleanup_after)
                .await
            {
                Some(_) => self.cleanup_after,
                None => Duration::ZERO,
            };
            let attempt = slots::try_acquire(&self.coll, req, limit, cleanup_after).await?;
            if let Attempt::Acquired(lease) = &attempt {
                self.leases.granted(
                    &req.lease_id,
                    Granted {
                        slot: true,
                        token: lease.fencing_token,
                        shortcut: false,
                    },
                );
            }
            return Ok(attempt);
        }
        // The uncontended shortcut, when this backend's last release left the name free and
        // unqueued; otherwise (or when it finds the name otherwise) the full attempt.
        let cheap = if self.cheap.take(&req.name) {
            acquire::try_acquire_cheap(&self.coll, req).await?
        } else {
            None
        };
        let shortcut = cheap.is_some();
        let attempt = match cheap {
            Some(lease) => Attempt::Acquired(lease),
            None => {
                // This attempt's own acquirer is registered before it (when the call will
                // wait).
                let acquirers = self.watch.acquirers(&req.name);
                let queueing = queue::Queueing::new(
                    self.watch.own_mark(),
                    acquirers,
                    self.watch.is_live_for(&req.name),
                );
                let attempt = acquire::try_acquire(
                    &self.coll,
                    self.reads.get(),
                    &self.checks,
                    req,
                    self.cleanup_after,
                    queueing,
                )
                .await?;
                // Whether the mark is now in the queue: registered by a busy attempt, kept
                // at the end by a grant that requeues, removed by any other grant.
                match &attempt {
                    Attempt::Busy { .. } if queueing.register => {
                        self.watch.queued(&req.name, true);
                    }
                    Attempt::Busy { .. } => {}
                    Attempt::Acquired(_) => self.watch.queued(&req.name, queueing.requeue),
                }
                attempt
            }
        };
        if let Attempt::Acquired(lease) = &attempt {
            self.leases.granted(
                &req.lease_id,
                Granted {
                    slot: false,
                    token: lease.fencing_token,
                    shortcut,
                },
            );
            self.watch
                .granted(&req.name, &req.lease_id, lease.fencing_token);
        }
        Ok(attempt)
    }

    /// Before the release of a lease id whose attempt failed: retires it (`retired.rs`), so a
    /// late attempt never grants it again. Kept tainted when the retirement fails (the core
    /// retries the release).
    async fn retire_if_tainted(&self, name: &str, lease_id: &LeaseId) -> Result<()> {
        if self.tainted.contains(lease_id) {
            // Nothing is written to a collection that is not ours (checked once).
            self.checks.ensure_ours(&self.reads).await?;
            retired::retire(&self.coll, name, lease_id).await?;
            self.tainted.forget(lease_id);
        }
        Ok(())
    }

    /// Releases `lease_id` ([`LockBackend::release`], after the retirement).
    async fn release_retired(&self, name: &str, lease_id: &LeaseId) -> Result<bool> {
        if self.is_slot(lease_id) {
            return self.release_slot(name, lease_id).await;
        }
        let granted = self.leases.get(lease_id);
        let released = ops::release(
            &self.coll,
            self.reads.get(),
            name,
            lease_id,
            granted.map(|g| g.token),
            self.fair_handoff,
            granted.is_some_and(|g| g.shortcut),
        )
        .await;
        self.leases.released(lease_id);
        // Released, or given up on (the lease then expires): no more loss detection for it.
        self.watch.released(lease_id);
        // The stream leaves out this backend's own releases: its waiters are told here (after
        // an error, too: at worst a spurious attempt).
        let handoff = match &released {
            Ok(Some(handoff)) => handoff.clone(),
            Ok(None) | Err(_) => queue::Handoff::Unknown,
        };
        if let Ok(Some(queue::Handoff::Nobody | queue::Handoff::Unknown)) = &released {
            self.cheap.released_unqueued(name);
        }
        self.watch.released_name(name, &handoff);
        match released? {
            Some(_) => Ok(true),
            // An exclusive lease this backend granted, ended by someone else: lost.
            None if granted.is_some() => Ok(false),
            // Not an exclusive lease: perhaps a slot whose grant's reply was lost (an abandoned
            // acquire releases its lease id without knowing what was granted).
            None => self.release_slot(name, lease_id).await,
        }
    }
}

#[async_trait]
impl LockBackend for MongoBackend {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt> {
        self.tainted.note(&req.lease_id, self.attempt(req).await)
    }

    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> Result<Option<SystemTime>> {
        if self.is_slot(lease_id) {
            return slots::extend(&self.coll, name, lease_id, ttl).await;
        }
        ops::extend(&self.coll, name, lease_id, ttl).await
    }

    async fn release(&self, name: &str, lease_id: &LeaseId) -> Result<bool> {
        self.retire_if_tainted(name, lease_id).await?;
        self.release_retired(name, lease_id).await
    }

    async fn release_after(
        &self,
        name: &str,
        lease_id: &LeaseId,
        min_hold: Duration,
    ) -> Result<bool> {
        self.retire_if_tainted(name, lease_id).await?;
        if self.is_slot(lease_id) {
            return Err(crate::Error::MinHoldUnsupported {
                name: name.to_owned(),
                what: "semaphore slot",
                reason: "semaphore slots and read-write lock readers cannot be held on".into(),
            });
        }
        let token = self.token(lease_id);
        let ended = ops::release_after(
            &self.coll,
            self.reads.get(),
            name,
            lease_id,
            token,
            min_hold,
            self.fair_handoff,
        )
        .await;
        self.leases.released(lease_id);
        // Ended or given up on: no more loss detection for it.
        self.watch.released(lease_id);
        // The stream leaves out this backend's own writes: its waiters are told here.
        match &ended {
            Ok(Some(ops::EndedAfter::HeldOn)) => self.watch.held_on(name),
            Ok(Some(ops::EndedAfter::Released(handoff))) => self.watch.released_name(name, handoff),
            _ => self.watch.released_name(name, &queue::Handoff::Unknown),
        }
        Ok(ended?.is_some())
    }

    /// Marked with this backend's prefix, so that its change stream leaves out its own grants
    /// and releases (`watch.rs`).
    fn new_lease_id(&self) -> LeaseId {
        self.watch.new_lease_id()
    }

    // Reads check the collection too (once, as writes do; module docs "The collection").

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.checks.ensure_ours(&self.reads).await?;
        ops::inspect(self.reads.get(), name).await
    }

    async fn list(&self) -> Result<Vec<LockInfo>> {
        self.checks.ensure_ours(&self.reads).await?;
        ops::list(self.reads.get()).await
    }

    async fn holders(&self, name: &str) -> Result<Vec<crate::backend::LeaseHolder>> {
        self.checks.ensure_ours(&self.reads).await?;
        ops::holders(self.reads.get(), name).await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        self.checks.ensure_ours(&self.reads).await?;
        ops::force_release(&self.coll, name, self.fair_handoff).await
    }

    async fn force_release_token(&self, name: &str, token: u64) -> Result<bool> {
        self.checks.ensure_ours(&self.reads).await?;
        operator::force_release_token(&self.coll, name, token, self.fair_handoff).await
    }

    async fn waiters(&self, name: &str) -> Result<Vec<crate::QueuedWaiter>> {
        self.checks.ensure_ours(&self.reads).await?;
        operator::waiters(self.reads.get(), name).await
    }

    async fn slot_limit(&self, name: &str) -> Result<Option<u32>> {
        self.checks.ensure_ours(&self.reads).await?;
        operator::slot_limit(self.reads.get(), name).await
    }

    async fn list_matching(&self, filter: &crate::ListFilter) -> Result<Vec<LockInfo>> {
        self.checks.ensure_ours(&self.reads).await?;
        operator::list_matching(self.reads.get(), filter).await
    }

    fn notifications(&self) -> Option<&dyn ChangeNotifications> {
        Some(self)
    }
}

#[async_trait]
impl ChangeNotifications for MongoBackend {
    async fn wait(&self, name: &str, max_wait: Duration) {
        self.watch.wait_for_change(name, max_wait).await;
    }

    /// True while the change stream delivers every change; starts it if it is not running.
    fn is_live(&self) -> bool {
        self.watch.is_live()
    }

    fn waiter(&self, name: &str) -> Option<ChangeWaiter> {
        self.watch.change_waiter(name)
    }

    /// Waits for this backend's withdrawals from handoff queues (`queue.rs`).
    async fn flush(&self, max_wait: Duration) -> bool {
        self.watch.settle(max_wait).await
    }

    async fn lease_lost(&self, name: &str, lease_id: &LeaseId) {
        if !self.is_slot(lease_id) {
            return self.watch.lease_gone(name, lease_id).await;
        }
        // A slot: the stream's events tell nothing about one holder of many, so each change of
        // the name (and at least every minute) is checked with one read.
        loop {
            if !slots::still_holds(self.reads.get(), name, lease_id).await {
                return;
            }
            self.watch
                .wait_for_change(name, Duration::from_secs(60))
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::validate_collection_name as v;

    #[test]
    fn collection_names_are_checked_like_the_server() {
        assert!(v("app", "distributed.locks").is_ok());
        assert!(v("app", "").is_err());
        assert!(v("app", "a$b").is_err());
        assert!(v("app", "a\0b").is_err());
        assert!(v("app", ".locks").is_err());
        assert!(v("app", "system.locks").is_err());
        assert!(v("app", &"x".repeat(251)).is_ok());
        assert!(v("app", &"x".repeat(252)).is_err());
    }
}
