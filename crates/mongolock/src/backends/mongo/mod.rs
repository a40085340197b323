//! MongoDB backend (feature `mongodb`).
//!
//! # The lock document
//! One document per lock name in the lock collection (default `distributed.locks`):
//!
//! ```text
//! { _id: <name>, leaseId: <string|null>, fencingToken: <int64|null>,
//!   acquiredAt: <date>, expiresAt: <date>, holder: { host, pid, app } }
//! ```
//!
//! plus one counter document per collection, `{ _id: { mongolock: "fencing-epoch" }, epoch }`
//! (its `_id` is not a string, so [`list`](crate::LockBackend::list) skips it; it has no
//! `expiresAt`, so the TTL index never removes it).
//!
//! # Acquire: one round trip (`acquire.rs`)
//! One `findAndModify` on `{_id: name}` with `upsert: true`, `new: true` and an update
//! **pipeline**. MongoDB refuses `$expr` in the filter of an upsert, so the test "is the name
//! free?" lives inside the pipeline: free = `leaseId` is null/missing, or `expiresAt <= $$NOW`
//! (server time), or `leaseId` is already ours (an idempotent retry after a lost reply). The
//! pipeline is one `$replaceWith: {$cond: [free, {$mergeObjects: ["$$ROOT", <new lease>]},
//! "$$ROOT"]}` (so "free" is evaluated once), and a busy attempt is a no-op write. The reply is
//! projected to the lease fields. The client compares the returned `leaseId` with its own. This is DistributedLock's
//! single-round-trip scheme; we prefer it to a filter + duplicate-key scheme because a busy
//! attempt costs no error round trip and leaves the document untouched.
//!
//! # Fencing tokens that survive TTL cleanup
//! Release never deletes the document: it sets `leaseId: null` and `expiresAt` to server now,
//! keeping `fencingToken`, and each grant sets `fencingToken = fencingToken + 1`. Only the TTL
//! monitor deletes documents (after `expiresAt + cleanup_after`). A document created by the
//! upsert has no token yet (`$add` of a missing field gives null), and neither does any grant
//! until the first one that *stamps* it: the acquirer then increments the per-collection epoch
//! counter (`$inc`, upsert; the first increment creates it with epoch 1) and sets
//! `fencingToken = max(fencingToken + 1, (epoch - 1) · 2³² + 1)` on its own unexpired lease. So
//! the first name ever locked in a collection gets token 1, and each later document lifetime
//! starts in a fresh range of 2³² tokens. This costs two extra round trips on the first
//! acquisition of a name (and after each TTL cleanup) only.
//!
//! Why tokens keep growing: the epoch is incremented *after* the document was created, and every
//! earlier lifetime of the name obtained its epoch before its document was deleted, which was
//! before this document was created. So the new epoch `e` is larger than every earlier
//! lifetime's epoch `e'`, i.e. `e' <= e - 1`. The lifetime with epoch `e'` issued tokens from
//! `(e' - 1) · 2³² + 1` upwards, fewer than 2³² of them, so all below `e' · 2³² <= (e - 1) · 2³²`,
//! which is below the new floor `(e - 1) · 2³² + 1`. Bound: fewer than 2³² (4 billion)
//! acquisitions per lifetime of a document, and at most 2³¹ document creations per collection.
//!
//! # Extend and release
//! * Extend: `findAndModify` with filter `{_id, leaseId: ours, $expr: {$gt: ["$expiresAt",
//!   "$$NOW"]}}` and pipeline `$set expiresAt = $$NOW + ttl`; returns the new expiry. An expired
//!   lease is never extended.
//! * Release: `updateOne` `{_id, leaseId: ours}` → `leaseId: null`, `expiresAt: min(expiresAt,
//!   $$NOW)`.
//!
//! Dates are computed with `$add` on dates (not `$dateAdd`), so **MongoDB 4.4 or newer** works
//! (pipeline updates and `$$NOW` appeared in 4.2, which has every feature used but is not
//! supported). Writes use `w: "majority"` by default. Uncontended acquire + release is 2
//! commands.
//!
//! # TTL index
//! An index `{expiresAt: 1}` with `expireAfterSeconds = cleanup_after` (default 1 hour) is created
//! once per collection per process, in the background, on the first acquisition. Failures are
//! logged with `tracing` and never fatal: correctness never depends on the index.
//! [`MongoBackend::ensure_indexes`] creates it explicitly and reports errors.
//!
//! # Change-stream wake-ups (`watch.rs`)
//! One change stream per backend (shared by its clones) wakes one waiting acquirer per name and
//! process within milliseconds of a release or takeover, lets busy waiters sleep until the
//! holder's expiry otherwise, and tells holders at once when their lease was taken. It falls back
//! to polling where change streams are unavailable (standalone servers, code 40573; missing
//! privileges; [`MongoBackendBuilder::change_streams`]`(false)`), resumes from its resume token
//! after network errors and wakes every waiter to re-check whenever it had to start afresh. See
//! `watch.rs` for the details.
//!
//! # Reads
//! Every read that decides something — [`inspect`](crate::LockBackend::inspect) and
//! [`list`](crate::LockBackend::list) (and so `Election::leader` and `watch_leader`), the
//! change stream, and the check a holder makes when an event may concern its lease — goes to
//! the primary with majority read concern, whatever read preference and read concern the
//! database handle carries: a secondary can lag and show a lease already released or taken.
//!
//! # Release is idempotent for the holder
//! A release whose reply was lost (and whose driver retry failed too) is retried by the core.
//! Release therefore records the released lease id in `released` (the last 8) in the same
//! write, and a retry that finds its id there reports success; a lease that someone else ended
//! never appears there, so [`Error::LeaseLost`](crate::Error::LeaseLost) means just that. The
//! filter and pipeline are in `document.rs` (`release_update`), shared with document locks.
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
mod ops;
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
    AcquireRequest, Attempt, ChangeNotifications, ChangeWaiter, LeaseId, LockBackend, LockInfo,
};
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
    /// primary with majority read concern, whatever the database handle's read preference.
    reads: Collection<Document>,
    cleanup_after: Duration,
    create_ttl_index: bool,
    /// The change stream shared by all clones (see `watch.rs`).
    watch: Arc<watch::Watcher>,
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
}

impl MongoBackendBuilder {
    /// The lock collection (default `distributed.locks`).
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

    /// Whether to create the TTL index in the background on first use (default true).
    pub fn create_ttl_index(mut self, enabled: bool) -> Self {
        self.create_ttl_index = enabled;
        self
    }

    /// Whether to watch the lock collection with a change stream (default true): waiters are
    /// then woken within milliseconds of a release and holders learn of a takeover at once (see
    /// the [module docs](self)). Without it, or where change streams are unavailable (a
    /// standalone server), waiters poll with the provider's wait strategy.
    pub fn change_streams(mut self, enabled: bool) -> Self {
        self.change_streams = enabled;
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
        let reads = self
            .db
            .collection_with_options(&self.collection, decision_reads());
        Ok(MongoBackend {
            coll: self.db.collection_with_options(&self.collection, options),
            watch: Arc::new(watch::Watcher::new(
                reads.clone(),
                self.change_streams,
                watch::Target::Names,
            )),
            reads,
            cleanup_after: self.cleanup_after,
            create_ttl_index: self.create_ttl_index,
        })
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
    /// on first use).
    pub async fn ensure_indexes(&self) -> Result<()> {
        index::create_ttl_index(&self.coll, self.cleanup_after).await
    }

    /// How many lock names currently have an entry in the change-stream registry (names this
    /// backend's waiters wait on or its guards hold). For tests and diagnostics.
    #[doc(hidden)]
    pub fn watched_names(&self) -> usize {
        self.watch.watched_names()
    }
}

#[async_trait]
impl LockBackend for MongoBackend {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt> {
        if self.create_ttl_index {
            index::ensure_in_background(&self.coll, self.cleanup_after);
        }
        let attempt = acquire::try_acquire(&self.coll, req).await?;
        if let Attempt::Acquired(lease) = &attempt {
            self.watch
                .granted(&req.name, &req.lease_id, lease.fencing_token);
        }
        Ok(attempt)
    }

    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> Result<Option<SystemTime>> {
        ops::extend(&self.coll, name, lease_id, ttl).await
    }

    async fn release(&self, name: &str, lease_id: &LeaseId) -> Result<bool> {
        let released = ops::release(&self.coll, name, lease_id).await;
        // Released, or given up on (the lease then expires): no more loss detection for it.
        self.watch.released(lease_id);
        // The stream leaves out this backend's own releases: its waiters are told here.
        self.watch.released_name(name);
        released
    }

    /// Marked with this backend's prefix, so that its change stream leaves out its own grants
    /// and releases (`watch.rs`).
    fn new_lease_id(&self) -> LeaseId {
        self.watch.new_lease_id()
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        ops::inspect(&self.reads, name).await
    }

    async fn list(&self) -> Result<Vec<LockInfo>> {
        ops::list(&self.reads).await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        ops::force_release(&self.coll, name).await
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

    async fn lease_lost(&self, name: &str, lease_id: &LeaseId) {
        self.watch.lease_gone(name, lease_id).await;
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
