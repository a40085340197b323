//! Document locks (feature `mongodb`): lock the documents of your own collection in place,
//! without a separate lock collection.
//!
//! Created with [`LockProvider::documents`] (the provider's options, plus the lock field and
//! the write concern):
//!
//! * [`DocumentLocks::lock`] (and `try_lock`, `lock_timeout`) locks the document with a given
//!   `_id` and returns it, typed, together with a [`LockGuard`];
//! * [`DocumentLocks::claim`] (and `try_claim`, `claim_timeout`) locks **any one** unlocked (or
//!   expired) document matching a filter, the first in an optional sort order, each attempt in
//!   one atomic round trip: many workers can share one collection of jobs. `claim` waits until
//!   there is one; `try_claim` makes exactly one attempt.
//!
//! The guard is the same [`LockGuard`] as for named locks: fencing token, automatic extension,
//! lost signal, [`release`](LockGuard::release), and release in the background on drop.
//! Like named locks, a guard learns of a loss early from a change stream on your collection
//! (one per `DocumentLocks`, shared by its clones, started with the first guard): when the
//! document's `<field>.leaseId` changes away from its lease (a takeover, a forced clear) or the
//! document is deleted, the lost signal fires at once rather than at the next extension. Where
//! change streams are unavailable (a standalone server, missing `changeStream` privilege) loss
//! is detected by extension, as before.
//!
//! ```
//! use std::time::Duration;
//! use mongodb::bson::doc;
//! use mongolock::documents::{EmbeddedLock, LockedDocument};
//! use mongolock::LockProvider;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! struct Job {
//!     #[serde(rename = "_id")]
//!     id: i64,
//!     payload: String,
//!     done: bool,
//!     // The lock sub-document: readable, never written back by our own inserts or replaces.
//!     #[serde(rename = "_lock", default, skip_serializing)]
//!     lock: Option<EmbeddedLock>,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = mongo_testserver::TestServer::start().await?;
//! # let uri = server.uri();
//! // `uri` is e.g. "mongodb://localhost:27017" (here: an embedded test server).
//! let client = mongodb::Client::with_uri_str(&uri).await?;
//! let jobs = client.database("app").collection::<Job>("jobs");
//! for id in 1..=3 {
//!     jobs.insert_one(Job { id, payload: format!("resize {id}"), done: false, lock: None })
//!         .await?;
//! }
//!
//! // The provider's options (30 s leases extended in the background, application name);
//! // lock field `_lock`, `w: "majority"`.
//! let backend = mongolock::MongoBackend::builder(&client.database("app")).build()?;
//! let provider = LockProvider::builder(backend)
//!     .app_name("resizer")
//!     .build()?;
//! let locks = provider.documents(&jobs).build()?;
//!
//! // A worker: claim any one open job, lowest `_id` first, until none is left (`claim` would
//! // wait for one instead).
//! while let Some(LockedDocument { document: job, guard, .. }) =
//!     locks.try_claim(doc! { "done": false }, Some(doc! { "_id": 1 })).await?
//! {
//!     tokio::select! {
//!         _ = guard.lost() => continue, // the lease can no longer be trusted: stop
//!         _ = tokio::time::sleep(Duration::from_millis(1)) => { /* process job.payload */ }
//!     }
//!     // Record the result only while this lease still holds the job.
//!     let marked = jobs
//!         .update_one(
//!             doc! { "_id": job.id, "_lock.leaseId": guard.lease_id().as_str() },
//!             doc! { "$set": { "done": true, "doneWithToken": guard.fencing_token() as i64 } },
//!         )
//!         .await?;
//!     assert_eq!(marked.modified_count, 1);
//!     guard.release().await?;
//! }
//!
//! // Lock one given document, waiting while someone else holds it.
//! let locked = locks.lock(2_i64).await?;
//! assert!(locked.document.done);
//! assert_eq!(locked.guard.fencing_token(), 2); // per document: its second lock
//! // Others get `None` (one attempt) while it is held.
//! assert!(locks.try_lock(2_i64).await?.is_none());
//! locked.guard.release().await?;
//!
//! // A missing document is an error; nothing is inserted.
//! assert!(locks.try_lock(99_i64).await.is_err());
//! # Ok(())
//! # }
//! ```
//!
//! # Claims that read only what they may take
//! With [`DocumentLocks::ensure_indexes`] (indexes on `_lock.leaseId` and `_lock.expiresAt`) a
//! claim reads only the free documents and the leases about to expire: with 300 documents
//! locked ahead of 40 free ones, the server examines 310.5 documents per claim without the
//! indexes and 1.0 with them (`cargo test -p mongolock --test claims_scale -- --nocapture`).
//! [`DocumentLocks::inspect`] reads a document's lock state with the server time.
//!
//! # The lock sub-document
//! The lock lives in **one** embedded document under the lock field (default `_lock`,
//! [`DocumentLocksBuilder::field`]):
//!
//! ```text
//! { _id: 42, <your fields>..., _lock: { leaseId, fencingToken, acquiredAt, expiresAt,
//!                                       holder: { host, pid, app },
//!                                       ended: [<token>], endedFrom, since, lastReleased } }
//! ```
//!
//! (`ended` lists the tokens of the last 64 leases that someone other than their holder ended,
//! a takeover after expiry, `endedFrom` is the token from which that list is complete and
//! `since` the time of the first lock since the document was inserted, so that a release
//! retried after a lost reply is told from a lost lease, also when the document was deleted
//! and inserted again meanwhile; grants keep all three, and a busy document's traffic does
//! not grow them. See "Release is idempotent for the holder" in
//! the MongoDB backend's docs.)
//!
//! Locking, extending and releasing write only this sub-document (update-pipeline `$set` of the
//! field itself, or of `_lock.<subfield>` paths): every other field of your document stays
//! byte-for-byte as it was. The field is added at the end of the document on its first lock and
//! kept afterwards (release clears `leaseId` but keeps the token). Choose a field name your
//! documents do not otherwise use.
//!
//! # Your document type
//! The document you get back is the document as stored right after the lock was granted,
//! *including* the lock sub-document, deserialized as `T`. Model `T` either
//! * without a field for the lock (serde ignores unknown fields unless you use
//!   `#[serde(deny_unknown_fields)]`), or
//! * with `#[serde(rename = "_lock", default, skip_serializing)] lock: Option<EmbeddedLock>`:
//!   `default` covers documents never locked, `skip_serializing` keeps your own `insert_one` /
//!   `replace_one` from overwriting a lock.
//!
//! Write your results with `update_one` and `$set` on your own fields; a `replace_one` with a
//! `T` that lacks the lock field would drop the lock. Guard the write with the lease
//! (`"_lock.leaseId": guard.lease_id().as_str()` in the filter) or the fencing token
//! (`"_lock.fencingToken": token`) so that a worker whose lease expired cannot write over the
//! next holder's work.
//!
//! # Mechanics (all server time)
//! * **Lock by `_id`**, one round trip: `findAndModify` with filter `{_id}`, `upsert: false`,
//!   `new: true` and an update pipeline `$set: {_lock: {$cond: [free, <new lock>, "$_lock"]}}`
//!   where free = no `leaseId`, or `expiresAt <= $$NOW`, or the lease is already ours (an
//!   idempotent retry after a lost reply). A busy attempt is a no-op write; the client compares
//!   the returned `leaseId` with its own. No document returned = no such `_id`: an error, and
//!   nothing is inserted.
//! * **Claim**, one round trip: `findAndModify` with query `{$and: [<your filter>, {$or:
//!   [{"_lock.leaseId": null}, {"_lock.leaseId": <ours>}, {$expr: {$lte: ["$_lock.expiresAt",
//!   "$$NOW"]}}]}]}`, your sort, `upsert: false`, `new: true` and the pipeline `$set: {_lock:
//!   <new lock>}`. MongoDB applies it to one matching document atomically (a concurrent change
//!   makes the server re-check the query), so two workers never claim the same document.
//!   `$expr` is allowed in the query because a claim never upserts. The `$expr` clause also
//!   carries `"_lock.expiresAt": {$lte: <client now + 5 s>}`, which an index can serve, so a
//!   claim reads the free documents and the leases about to expire, never every locked one
//!   (a client clock more than 5 s behind the server's finds expired leases that much later;
//!   the server's clock still decides). Create the indexes with
//!   [`DocumentLocks::ensure_indexes`], or compound ones that start with your filter's
//!   equality fields (`{status: 1, "_lock.leaseId": 1}` and `{status: 1,
//!   "_lock.expiresAt": 1}`). On a sharded collection, MongoDB before 7.1 requires
//!   `findAndModify` filters to contain the shard key: include it in your claim filter (and
//!   shard by `_id` to lock by `_id`).
//! * The new lock is `{leaseId: <random 128 bits>, fencingToken: <previous token> + 1,
//!   acquiredAt: $$NOW, expiresAt: $$NOW + expiry, holder}`.
//! * **Extend**: `findAndModify` `{_id, "_lock.leaseId": ours, $expr: {$gt:
//!   ["$_lock.expiresAt", "$$NOW"]}}` → `_lock.expiresAt = $$NOW + ttl`; an expired lease is
//!   never extended (the guard reports the loss).
//! * **Release**: `updateOne` `{_id, "_lock.leaseId": ours}` → `_lock.leaseId = null`,
//!   `_lock.expiresAt = min(expiresAt, $$NOW)`; the fencing token stays.
//!
//! # Fencing tokens are per document
//! Every lock or claim of a document sets its token to the previous token + 1; release, expiry
//! and takeover keep it, so a document's tokens only grow for as long as the document exists.
//! A document locked for the first time gets token 1. Tokens of different documents are
//! unrelated, and **deleting a document and inserting one with the same `_id` restarts its
//! tokens at 1** (the lock state lives in the document; there is no separate record). If a
//! protected resource may outlive such a recreation, give recreated documents a new `_id` (for
//! example an `ObjectId`), or carry the old `_lock` over into the new document.
//!
//! # Other behaviour shared with named locks
//! Options are the provider's ([`LockProvider::documents`]): expiry (30 s; per handle,
//! [`DocumentLocks::with_expiry`]), extension cadence (expiry / 3), automatic extension, wait
//! strategy between attempts, application name stored as holder metadata; the
//! [`DocumentLocksBuilder`] adds the lock field and the write concern (`w: "majority"` by
//! default). The forms are those of [`Lock`](crate::Lock): waiting (`lock`, `claim`), one
//! attempt (`try_lock`, `try_claim`), or waiting up to a timeout (`lock_timeout`,
//! `claim_timeout`). Waiting forms try again at the wait strategy's interval, and at once when
//! a release by this process frees a document of the collection. An attempt that is dropped half-way finishes in a task of its own (the same
//! acquire loop as named locks), so dropping a waiting future never leaves a document locked
//! with nobody to release it. Transient errors (network, failover) are retried
//! within the caller's wait budget; permanent ones are returned with a hint.
//!
//! A claim retried after a transient error whose reply was lost may have locked a document that
//! the caller never sees; that document is free again when the lease expires, like after a
//! crash.

mod claim;
mod control;
mod state;

// The MongoDB backend's classification of driver errors (transient vs permanent), reused as is.
use crate::backends::mongo::errors as driver_errors;

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use mongodb::bson::{Bson, Document};
use mongodb::options::{CollectionOptions, WriteConcern};
use mongodb::Collection;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::acquire_loop::{self, spawn_attempt, Attempts, AttemptsDone, InFlight, Step};
use crate::clock::Stamp;

use crate::backend::{LeaseId, LockInfo};
use crate::backends::mongo::watch::{document_key, Target as WatchTarget, Watcher};
use crate::error::{Error, Result};
use crate::guard::{GrantedLease, LockGuard};
use crate::holder::HolderInfo;
use crate::lock::Timeout;
use crate::options::{validate_ttl, LockOptions};
use crate::provider::LockProvider;
use crate::wait::WaitStrategy;

use claim::{Attempted, Target};
use control::DocumentLease;
use state::{EXPIRES_AT, LEASE_ID};

pub use state::{EmbeddedHolder, EmbeddedLock};

/// Default name of the field that holds the lock sub-document.
pub const DEFAULT_LOCK_FIELD: &str = "_lock";

/// Converts a driver error, with hints that speak of documents rather than a lock collection.
fn classify(e: mongodb::error::Error, op: &str, field: &str) -> Error {
    let mut err = driver_errors::classify(e, op);
    if let Error::Backend { code, hint, .. } = &mut err {
        match code {
            Some(2 | 28 | 40 | 52) => {
                *hint = format!(
                    "check the filter and sort; if they are valid, the documents' `{field}` \
                     field holds a value mongolock did not write: choose another lock field \
                     with provider.documents(..).field(..)"
                )
            }
            Some(100) => {
                *hint = "the write concern cannot be satisfied by this deployment; lower `w` \
                         with provider.documents(..).write_concern(..)"
                    .to_owned()
            }
            Some(13) => {
                *hint = "the user is not authorized; grant it find and update on the collection \
                         (and aggregate for inspect)"
                    .to_owned()
            }
            _ => {}
        }
    }
    err
}

/// The error for a lock by `_id` on a document that does not exist.
fn not_found(inner: &Inner, id: &Bson) -> Error {
    Error::DocumentNotFound {
        namespace: inner.coll.namespace().to_string(),
        id: id.to_string(),
    }
}

pub(crate) struct Inner {
    /// Lock writes, with the configured write concern.
    pub(crate) coll: Collection<Document>,
    /// Inspection reads, from the primary.
    pub(crate) reads: Collection<Document>,
    pub(crate) field: String,
    pub(crate) options: LockOptions,
    pub(crate) holder: HolderInfo,
    /// The change stream on the collection for early loss detection, shared by all clones and
    /// guards, started by the first guard and stopped with the last of them (see
    /// `backends/mongo/watch.rs`).
    pub(crate) watch: Watcher,
    /// Notified whenever a release by this process frees a document of the collection: ends
    /// the waits of this process's waiting locks and claims early (others poll).
    pub(crate) freed: tokio::sync::Notify,
}

/// Locks documents of one collection in place; see the [module docs](self). Cheap to clone
/// (clones share the collection handle and options). Creating one sends nothing to the server.
pub struct DocumentLocks<T> {
    inner: Arc<Inner>,
    expiry: Duration,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for DocumentLocks<T> {
    fn clone(&self) -> Self {
        DocumentLocks {
            inner: self.inner.clone(),
            expiry: self.expiry,
            _type: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for DocumentLocks<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocumentLocks")
            .field("namespace", &self.inner.coll.namespace().to_string())
            .field("field", &self.inner.field)
            .field("expiry", &self.expiry)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl LockProvider {
    /// Starts building [`DocumentLocks`] on `collection` (any document type; the collection's
    /// client, database and name are used). The document locks take this provider's options
    /// (expiry, extension cadence, automatic extension, wait strategy, drift margin, release
    /// timeout) and holder metadata (application name); the builder adds what is specific to
    /// documents: the lock [`field`](DocumentLocksBuilder::field) and the
    /// [`write_concern`](DocumentLocksBuilder::write_concern). The provider's backend is not
    /// used: the locks live in your documents. For another lease duration than the provider's,
    /// see [`DocumentLocks::with_expiry`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mongo_testserver::TestServer::start().await?;
    /// # let client = mongodb::Client::with_uri_str(server.uri()).await?;
    /// use std::time::Duration;
    /// use mongodb::bson::{doc, Document};
    /// let db = client.database("app");
    /// let provider = mongolock::LockProvider::mongodb(&db)?;
    /// let jobs = db.collection::<Document>("jobs");
    /// jobs.insert_one(doc! { "_id": 1, "state": "open" }).await?;
    /// let locks = provider
    ///     .documents(&jobs)
    ///     .field("lease")
    ///     .build()?
    ///     .with_expiry(Duration::from_secs(60))?;
    /// let job = locks.claim(doc! { "state": "open" }, None).await?;
    /// assert_eq!(job.id, mongodb::bson::Bson::Int32(1));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "mongodb")))]
    pub fn documents<T: Send + Sync>(&self, collection: &Collection<T>) -> DocumentLocksBuilder<T> {
        DocumentLocksBuilder {
            coll: collection.clone_with_type::<Document>(),
            field: DEFAULT_LOCK_FIELD.to_owned(),
            options: self.inner.options.clone(),
            holder: self.inner.holder.clone(),
            write_concern: WriteConcern::majority(),
            _type: PhantomData,
        }
    }
}

/// Builds [`DocumentLocks`]; see [`LockProvider::documents`]. Validation happens in
/// [`build`](Self::build).
#[must_use]
pub struct DocumentLocksBuilder<T> {
    coll: Collection<Document>,
    field: String,
    options: LockOptions,
    holder: HolderInfo,
    write_concern: WriteConcern,
    _type: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for DocumentLocksBuilder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocumentLocksBuilder")
            .field("namespace", &self.coll.namespace().to_string())
            .field("field", &self.field)
            .field("options", &self.options)
            .field("write_concern", &self.write_concern)
            .finish()
    }
}

impl<T> DocumentLocksBuilder<T> {
    /// The top-level field that holds the lock sub-document (default `_lock`). Not `_id`, no
    /// dots, no leading `$`; your documents must not use it for anything else.
    pub fn field(mut self, name: impl Into<String>) -> Self {
        self.field = name.into();
        self
    }

    /// Write concern of every lock write (default `w: "majority"`, so that a lease is not lost to
    /// a rollback after a primary failover). The collection's own write concern is not used for
    /// lock writes.
    pub fn write_concern(mut self, write_concern: WriteConcern) -> Self {
        self.write_concern = write_concern;
        self
    }

    /// Checks the field name and builds the document locks. Sends nothing.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] (option `field`) for a field name that cannot hold the lock:
    /// empty, `_id`, with a dot or a leading `$`.
    pub fn build(self) -> Result<DocumentLocks<T>> {
        state::validate_field(&self.field)?;
        // Document locks are labelled with their collection's name (see `MetricsLabels`).
        #[cfg(feature = "metrics")]
        let options = LockOptions {
            metrics_labels: crate::MetricsLabels::Fixed(self.coll.name().to_owned()),
            ..self.options
        };
        #[cfg(not(feature = "metrics"))]
        let options = self.options;
        let ns = self.coll.namespace();
        let db = self.coll.client().database(&ns.db);
        let writes = CollectionOptions::builder()
            .write_concern(self.write_concern)
            .read_concern(self.coll.read_concern().cloned())
            .build();
        let reads = crate::backends::mongo::decision_reads();
        let holder = self.holder;
        let reads = db.collection_with_options(&ns.coll, reads);
        Ok(DocumentLocks {
            expiry: options.expiry,
            inner: Arc::new(Inner {
                coll: db.collection_with_options(&ns.coll, writes),
                reads: reads.clone(),
                watch: Watcher::new(
                    reads,
                    true,
                    WatchTarget::Documents {
                        field: self.field.clone(),
                    },
                ),
                field: self.field,
                options,
                holder,
                freed: tokio::sync::Notify::new(),
            }),
            _type: PhantomData,
        })
    }
}

/// A locked document: the document as stored right after the lock was granted (lock
/// sub-document included), its `_id`, and the guard of the lease.
///
/// Destructure it (`let LockedDocument { document, guard, .. } = locked;`) to use the parts
/// separately. Dropping it drops the guard, which releases the lock in the background.
#[must_use = "dropping a locked document releases its lock at once"]
#[derive(Debug)]
#[non_exhaustive]
pub struct LockedDocument<T> {
    /// The document's `_id` as stored.
    pub id: Bson,
    /// The document as stored right after the grant, deserialized as `T`.
    pub document: T,
    /// The lease: fencing token, extension, lost signal, release.
    pub guard: LockGuard,
}

/// A grant wrapped in its guard, not yet deserialized.
struct Acquired {
    guard: LockGuard,
    doc: Document,
    id: Bson,
}

/// What one spawned attempt produced.
/// One document lock or claim, as the shared acquire loop sees it.
struct DocumentAttempts<'a> {
    inner: &'a Arc<Inner>,
    target: &'a Target,
    ttl: Duration,
}

#[async_trait]
impl Attempts for DocumentAttempts<'_> {
    type Granted = Box<Acquired>;

    async fn attempt(
        &self,
        lease_id: &LeaseId,
        in_flight: InFlight,
    ) -> Result<Step<Box<Acquired>>> {
        let inner = self.inner.clone();
        let target = self.target.clone();
        let lease_id = lease_id.clone();
        let ttl = self.ttl;
        spawn_attempt(in_flight, async move {
            // Taken before the request is sent: the lease cannot expire on the server before
            // `sent_at + ttl`.
            let sent_at = Stamp::now();
            Ok(
                match claim::attempt(&inner, &target, &lease_id, ttl).await? {
                    Attempted::Acquired(granted) => {
                        let claim::Granted { doc, id, lease } = *granted;
                        let name = claim::lease_name(&inner, &id);
                        let key = document_key(&id);
                        inner.watch.granted(&key, &lease_id, lease.fencing_token);
                        let control = DocumentLease {
                            inner: inner.clone(),
                            id: id.clone(),
                            key,
                            name: name.clone(),
                            lease_id: lease_id.clone(),
                            token: lease.fencing_token,
                            acquired_at: lease.acquired_at,
                        };
                        let guard = LockGuard::from_control(
                            Box::new(control),
                            GrantedLease {
                                name: name.into(),
                                lease_id,
                                lease,
                                ttl,
                                sent_at,
                                policy: inner.options.guard_policy(),
                            },
                        );
                        Step::Acquired(Box::new(Acquired { guard, doc, id }))
                    }
                    Attempted::Busy => Step::Busy {
                        holder_expires_at: None,
                    },
                    Attempted::NotFound => match &target {
                        Target::Id(id) => Step::GiveUp(Some(not_found(&inner, id))),
                        // Only a lock by id reports a missing document.
                        Target::Claim { .. } => Step::GiveUp(None),
                    },
                },
            )
        })
        .await
    }

    fn abandon(&self, lease_id: LeaseId, after: AttemptsDone) {
        let id = match self.target {
            Target::Id(id) => Some(id.clone()),
            // A claim may have locked any matching document: release wherever this lease id
            // holds a lock.
            Target::Claim { .. } => None,
        };
        control::abandon(self.inner.clone(), id, lease_id, after);
    }

    /// Sleeps for the wait strategy's delay, ended early when a release by this process frees
    /// a document of the collection (no change stream: documents of other processes are found
    /// at the next poll).
    async fn wait_for_change(&self, max_wait: Duration) {
        tokio::select! {
            () = tokio::time::sleep(max_wait) => {}
            () = self.inner.freed.notified() => {}
        }
    }

    fn wait_strategy(&self) -> &WaitStrategy {
        &self.inner.options.wait
    }

    fn describe(&self) -> String {
        match self.target {
            Target::Id(id) => format!("document {id} of {}", self.inner.coll.name()),
            Target::Claim { filter, .. } => {
                format!("a document of {} matching {filter}", self.inner.coll.name())
            }
        }
    }

    fn metrics_label(&self) -> crate::metrics::Label {
        crate::metrics::Label::of(self.inner.coll.name(), &self.inner.options)
    }
}

impl<T> DocumentLocks<T>
where
    T: DeserializeOwned + Send + Sync,
{
    /// Creates the indexes that keep claims cheap however many documents are locked:
    /// `{<field>.leaseId: 1}` and `{<field>.expiresAt: 1}` (see the [module docs](self)).
    /// Idempotent. Claims are correct without them; locks by `_id` use the `_id` index.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future may leave an index being built by the server, which is
    /// harmless.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server refuses (for example an index with the same keys but
    /// other options exists, or the user may not create indexes); [`Error::Unavailable`] on
    /// network errors.
    pub async fn ensure_indexes(&self) -> Result<()> {
        let inner = &self.inner;
        let models = [LEASE_ID, EXPIRES_AT].map(|f| {
            mongodb::IndexModel::builder()
                .keys(mongodb::bson::doc! { format!("{}.{f}", inner.field): 1 })
                .build()
        });
        inner
            .coll
            .create_indexes(models)
            .await
            .map(drop)
            .map_err(|e| classify(e, "create claim indexes", &inner.field))
    }

    /// The same document locks with another lease duration (at least
    /// [`MIN_EXPIRY`](crate::MIN_EXPIRY), 100 ms, at most one year;
    /// default: the provider's expiry). Clones share everything else.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a duration outside those bounds.
    pub fn with_expiry(mut self, expiry: Duration) -> Result<Self> {
        validate_ttl("expiry", expiry)?;
        self.expiry = expiry;
        Ok(self)
    }

    /// Lease duration of this handle's locks and claims.
    pub fn expiry(&self) -> Duration {
        self.expiry
    }

    /// The field that holds the lock sub-document.
    pub fn field(&self) -> &str {
        &self.inner.field
    }

    /// The options (expiry, cadence, automatic extension, wait strategy, application name).
    pub fn options(&self) -> &LockOptions {
        &self.inner.options
    }

    /// The metadata stored in the lock sub-document of this handle's leases.
    pub fn holder(&self) -> &HolderInfo {
        &self.inner.holder
    }

    /// Locks the document with `_id` `id`, waiting while someone else holds it. Transient errors
    /// are retried; a missing document is an error ([`Error::DocumentNotFound`], nothing is
    /// inserted). Drop the future to give up.
    ///
    /// # Errors
    /// [`Error::DocumentNotFound`] when no document has this `_id`; a permanent backend error
    /// ([`Error::Backend`], e.g. not authorized, or the stored document does not deserialize as
    /// `T` — the lock is then released again); [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`Lock::acquire`](crate::Lock::acquire): dropping the future never
    /// leaves the document locked (a grant that arrives afterwards, or whose reply was lost, is
    /// released in the background).
    pub async fn lock(&self, id: impl Into<Bson>) -> Result<LockedDocument<T>> {
        let target = Target::Id(id.into());
        loop {
            // With `Forever` the loop only returns `None` if the wait logic is broken; keep
            // trying rather than panic.
            if let Some(locked) = self.acquire_within(&target, Timeout::Forever).await? {
                return Ok(locked);
            }
        }
    }

    /// Exactly one attempt to lock the document with `_id` `id`: `None` when another lease
    /// holds it; an error when no document has this `_id`.
    ///
    /// # Errors
    /// [`Error::DocumentNotFound`] when no document has this `_id`; any backend error, without
    /// retry; a document that does not deserialize as `T` ([`Error::Backend`]; the lock is
    /// released again); [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`Lock::acquire`](crate::Lock::acquire): dropping the future never
    /// leaves the document locked (a grant that arrives afterwards, or whose reply was lost, is
    /// released in the background).
    pub async fn try_lock(&self, id: impl Into<Bson>) -> Result<Option<LockedDocument<T>>> {
        self.acquire_within(&Target::Id(id.into()), Timeout::Zero)
            .await
    }

    /// Keeps trying to lock the document with `_id` `id` for `timeout`; `None` when it elapsed
    /// with the document still locked by someone else.
    ///
    /// # Errors
    /// As [`lock`](Self::lock), plus the last transient error when the backend stayed
    /// unavailable until the deadline.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`Lock::acquire`](crate::Lock::acquire): dropping the future never
    /// leaves the document locked (a grant that arrives afterwards, or whose reply was lost, is
    /// released in the background).
    pub async fn lock_timeout(
        &self,
        id: impl Into<Bson>,
        timeout: Duration,
    ) -> Result<Option<LockedDocument<T>>> {
        self.acquire_within(&Target::Id(id.into()), Timeout::from(timeout))
            .await
    }

    /// Claims any one document that matches `filter` and is unlocked (or whose lease expired),
    /// the first in `sort` order (MongoDB's natural order without one), waiting while there is
    /// none: it tries again after each release by this process and otherwise at the wait
    /// strategy's interval (default 10–800 ms), so it also gets documents inserted, unlocked
    /// or expiring later. Each attempt is one atomic round trip; two workers never claim the
    /// same document. Transient errors are retried. Never inserts. Drop the future to give up
    /// (for a deadline, see [`claim_timeout`](Self::claim_timeout); for one attempt,
    /// [`try_claim`](Self::try_claim)).
    ///
    /// # Errors
    /// A permanent backend error ([`Error::Backend`] also for an invalid filter or sort, or a
    /// claimed document that does not deserialize as `T`, which is released again);
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`Lock::acquire`](crate::Lock::acquire): dropping the future never
    /// leaves a document locked (a grant that arrives afterwards, or whose reply was lost, is
    /// released in the background).
    pub async fn claim(
        &self,
        filter: Document,
        sort: Option<Document>,
    ) -> Result<LockedDocument<T>> {
        let target = Target::Claim { filter, sort };
        loop {
            // With `Forever` the loop only returns `None` if the wait logic is broken; keep
            // trying rather than panic.
            if let Some(locked) = self.acquire_within(&target, Timeout::Forever).await? {
                return Ok(locked);
            }
        }
    }

    /// Exactly one atomic attempt to claim any one document that matches `filter` and is
    /// unlocked (or whose lease expired), the first in `sort` order (MongoDB's natural order
    /// without one). `None` when no such document exists right now. Never inserts.
    ///
    /// # Errors
    /// Any backend error, without retry ([`Error::Backend`] also for an invalid filter or
    /// sort, or a claimed document that does not deserialize as `T`, which is released again);
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`Lock::acquire`](crate::Lock::acquire): dropping the future never
    /// leaves the document locked (a grant that arrives afterwards, or whose reply was lost, is
    /// released in the background).
    pub async fn try_claim(
        &self,
        filter: Document,
        sort: Option<Document>,
    ) -> Result<Option<LockedDocument<T>>> {
        self.acquire_within(&Target::Claim { filter, sort }, Timeout::Zero)
            .await
    }

    /// Like [`claim`](Self::claim), waiting up to `timeout` for a matching document to be
    /// free; `None` when none was by then.
    ///
    /// # Errors
    /// A permanent backend error (as [`claim`](Self::claim)); the last transient error when the
    /// backend stayed unavailable until the deadline.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`Lock::acquire`](crate::Lock::acquire): dropping the future never
    /// leaves the document locked (a grant that arrives afterwards, or whose reply was lost, is
    /// released in the background).
    pub async fn claim_timeout(
        &self,
        filter: Document,
        sort: Option<Document>,
        timeout: Duration,
    ) -> Result<Option<LockedDocument<T>>> {
        self.acquire_within(&Target::Claim { filter, sort }, Timeout::from(timeout))
            .await
    }

    /// Reads the lock state of the document with `_id` `id` together with the server time:
    /// `None` when there is no such document; `fencing_token` 0 and `held` false when it was
    /// never locked. [`LockInfo::name`] is `"<collection>:<_id>"`.
    ///
    /// # Errors
    /// The server's error, without retry: [`Error::Unavailable`] on network errors,
    /// [`Error::Backend`] when it refuses the read.
    ///
    /// # Cancel safety
    /// Cancel-safe: a read; dropping the future changes nothing.
    pub async fn inspect(&self, id: impl Into<Bson>) -> Result<Option<LockInfo>> {
        control::inspect(&self.inner, &id.into()).await
    }

    async fn acquire_within(
        &self,
        target: &Target,
        timeout: Timeout,
    ) -> Result<Option<LockedDocument<T>>> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime);
        }
        let span = match target {
            Target::Id(id) => tracing::debug_span!(
                "mongolock.lock_document",
                collection = %self.inner.coll.name(),
                id = %id,
                ?timeout
            ),
            Target::Claim { filter, .. } => tracing::debug_span!(
                "mongolock.claim_document",
                collection = %self.inner.coll.name(),
                filter = %filter,
                ?timeout
            ),
        };
        self.acquire_loop(target, timeout).instrument(span).await
    }

    async fn acquire_loop(
        &self,
        target: &Target,
        timeout: Timeout,
    ) -> Result<Option<LockedDocument<T>>> {
        let attempts = DocumentAttempts {
            inner: &self.inner,
            target,
            ttl: self.expiry,
        };
        match acquire_loop::run(&attempts, timeout).await? {
            Some(acquired) => {
                let Acquired { guard, doc, id } = *acquired;
                self.typed(doc, id, guard).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Deserializes the granted document; on failure the guard is dropped, which releases the
    /// lock in the background.
    fn typed(&self, doc: Document, id: Bson, guard: LockGuard) -> Result<LockedDocument<T>> {
        match mongodb::bson::from_document::<T>(doc) {
            Ok(document) => Ok(LockedDocument {
                id,
                document,
                guard,
            }),
            Err(e) => Err(Error::Backend {
                message: format!(
                    "locked document {} could not be deserialized as {}: {e}",
                    guard.name(),
                    std::any::type_name::<T>()
                ),
                code: None,
                hint: format!(
                    "the lock was released again; make the type accept the stored document, \
                     including the lock field `{}` (ignore it, or model it as \
                     `#[serde(default)] Option<EmbeddedLock>`)",
                    self.inner.field
                ),
                source: Some(Box::new(e)),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::state::validate_field;

    #[test]
    fn lock_field_names_are_checked() {
        assert!(validate_field(super::DEFAULT_LOCK_FIELD).is_ok());
        assert!(validate_field("lock").is_ok());
        for bad in ["", "_id", "$lock", "a.b", "a\0b"] {
            let err = validate_field(bad).unwrap_err();
            assert!(err.to_string().contains("field"), "{err}");
        }
        assert!(validate_field(&"x".repeat(256)).is_err());
    }

    #[test]
    fn default_options_are_valid() {
        assert!(crate::options::LockOptions::default().validate().is_ok());
    }
}
