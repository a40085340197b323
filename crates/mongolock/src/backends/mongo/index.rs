//! The collection checks of a backend, and the TTL index on `expiresAt`.
//!
//! # The collection must be ours
//! Before its first read, write or index creation, a backend checks once (per backend and
//! its clones) that its collection is empty or holds only mongolock's documents: one `find` for a
//! document that is *not* ours, `limit: 1`, projected to `_id`, on the primary with majority
//! read concern. Ours are the lock documents (a string `_id`, a `leaseId` field and a date
//! `expiresAt`: every grant writes all three, see `document.rs`) and the fencing-epoch counters
//! (`_id: {mongolock: "fencing-epoch", bucket}`). On a collection of application documents the
//! scan stops at the first document; on a lock collection it reads each document once, once per
//! backend. A foreign document makes every operation fail with [`Error::ForeignCollection`]:
//! writes (nothing written: no lock fields, no counters, no TTL index, which would delete
//! application documents by *their* `expiresAt`) and reads alike (`list`, `inspect`, the
//! holders, the wait queue, the slot limit: an application document is never shown as a
//! lock). A failed check (network, permissions) is not remembered: the next operation checks
//! again. After the check passed, reads still check every document they return
//! ([`is_lock_document`], no extra round trip): a document written there since (with a
//! string `_id`: `list` reads only those) fails the read the same way.
//!
//! A collection that does not exist passes the check (it holds nothing) and reads as empty:
//! MongoDB creates a collection on its first write, so "no collection" and "no lock was ever
//! taken there" are the same thing, and `find` and `aggregate` on it create nothing.
//!
//! # The TTL index
//! Created once per collection per process, in the background, after the check above:
//! `{expiresAt: 1}` with `expireAfterSeconds = cleanup_after`. A failure (another index on
//! `expiresAt` with other options, no privilege) is logged and never fatal: correctness never
//! depends on this index existing. It does depend on no TTL index deleting lock documents
//! *sooner* than the first-acquisition shortcut allows, which is verified, not assumed:
//!
//! # Verifying the TTL indexes before the first-acquisition shortcut
//! The shortcut (a first acquisition creates its document with the first token of an epoch it
//! took just before: `acquire.rs`, proof in the [module docs](super)) is safe only if no lock
//! document is deleted less than `2W` after its last lease ended, where `W` is the creation
//! window. So it is used only when `listIndexes` (on the primary) shows that **every** TTL
//! index of the collection — any index with `expireAfterSeconds`, on any field — has the key
//! `{expiresAt: ±1}` alone and `expireAfterSeconds >= 2W` (in whole seconds, rounded up). No
//! TTL index at all also qualifies (nothing is deleted). Anything else — a 0-second index made
//! by an operator, another process's shorter `cleanup_after`, a TTL index on `acquiredAt`, an
//! unreadable reply, a failed or unauthorised `listIndexes` — means "not verified", and the
//! first acquisition takes the stamp path (create the document without a token, then stamp
//! one from an epoch taken *after* the creation), which needs no assumption about deletions.
//!
//! The verdict, either way, is kept for [`TTL_CHECK_EVERY`] (10 s) per backend and its
//! clones, then checked again before the next first acquisition. The residual assumption (in
//! the proof): no TTL index deleting sooner than `2W` is created in the `TTL_CHECK_EVERY + W`
//! (at most 70 s) before a document is created by the shortcut — the verification it relies
//! on was made at most `TTL_CHECK_EVERY` before its epoch was taken, and the creation follows
//! the epoch within `W`.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{IndexOptions, ReadPreference, SelectionCriteria};
use mongodb::{Collection, IndexModel};

use super::document::{EXPIRES_AT, LEASE_ID};
use super::errors::{self, classify};
use crate::error::{Error, Result};

/// Name of the TTL index.
pub(super) const TTL_INDEX_NAME: &str = "mongolock_expiresAt_ttl";

/// How long a verdict on the collection's TTL indexes is trusted (see the module docs).
pub(super) const TTL_CHECK_EVERY: Duration = Duration::from_secs(10);

/// `NamespaceNotFound`: `listIndexes` on a collection that does not exist (no index at all).
const NAMESPACE_NOT_FOUND: i32 = 26;

/// The checks of one backend's collection, shared by its clones.
#[derive(Debug, Default)]
pub(super) struct Checks {
    /// Set once the collection was found to hold only mongolock's documents.
    ours: tokio::sync::OnceCell<()>,
    /// The last verdict on the TTL indexes: when it was reached, and whether the
    /// first-acquisition shortcut may be used.
    ttl: Mutex<Option<(Instant, bool)>>,
}

impl Checks {
    /// Ok once the collection holds only mongolock's documents (checked on the first call; see
    /// the module docs). `reads` goes to the primary with majority read concern.
    ///
    /// # Errors
    /// [`Error::ForeignCollection`] when a document is not ours; the `find`'s errors.
    ///
    /// It is the first read of every operation, so it also finds a deployment that refuses
    /// majority reads (148): `reads` then switches to local reads and it checks again
    /// ([`Reads`](super::Reads)).
    pub(super) async fn ensure_ours(&self, reads: &super::Reads) -> Result<()> {
        self.ours
            .get_or_try_init(|| async {
                match check_ours(reads.get()).await {
                    Err(e) if reads.refused_majority(&e) => {
                        tracing::info!(error = %e, "the deployment refuses majority reads (MongoDB 4.4 with enableMajorityReadConcern=false): reading with local read concern on the primary");
                        check_ours(reads.get()).await
                    }
                    other => other,
                }
            })
            .await
            .map(|_| ())
    }

    /// The creation window of the first-acquisition shortcut when the collection's TTL indexes
    /// allow it (see the module docs), else `None` (the stamp path). Never fails: an error is
    /// "not verified".
    pub(super) async fn creation_window(
        &self,
        reads: &Collection<Document>,
        cleanup_after: Duration,
    ) -> Option<Duration> {
        let window = super::acquire::creation_window(cleanup_after)?;
        let cached = *self.ttl.lock().unwrap_or_else(|e| e.into_inner());
        let allowed = match cached {
            Some((at, allowed)) if at.elapsed() < TTL_CHECK_EVERY => allowed,
            _ => {
                let allowed = ttl_indexes_allow(reads, window).await;
                *self.ttl.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), allowed));
                allowed
            }
        };
        allowed.then_some(window)
    }
}

/// The filter of a document that mongolock did not write: neither a lock document nor a
/// fencing-epoch counter.
pub(super) fn foreign_filter() -> Document {
    doc! { "$nor": [
        { "_id": { "$type": "string" }, LEASE_ID: { "$exists": true }, EXPIRES_AT: { "$type": "date" } },
        { "_id.mongolock": "fencing-epoch" },
    ] }
}

async fn check_ours(reads: &Collection<Document>) -> Result<()> {
    let found = reads
        .find_one(foreign_filter())
        .projection(doc! { "_id": 1 })
        .await
        .map_err(|e| classify(e, "check the lock collection (find)"))?;
    match found {
        None => Ok(()),
        Some(d) => Err(foreign(reads, &d)),
    }
}

/// Whether `d` (read from the lock collection) is a lock document: a string `_id`, a
/// `leaseId` field and a date `expiresAt` (what every grant writes; the epoch counters are
/// never read as locks). Reads check every document they return, so that a document written
/// after the once-per-backend check is not shown as a lock.
pub(super) fn is_lock_document(d: &Document) -> bool {
    matches!(d.get("_id"), Some(Bson::String(_)))
        && d.contains_key(LEASE_ID)
        && matches!(d.get(EXPIRES_AT), Some(Bson::DateTime(_)))
}

/// Ok when every document of `docs` is a lock document ([`is_lock_document`]), else
/// [`Error::ForeignCollection`] naming the first that is not.
pub(super) fn ensure_lock_documents<'a>(
    reads: &Collection<Document>,
    docs: impl IntoIterator<Item = &'a Document>,
) -> Result<()> {
    match docs.into_iter().find(|d| !is_lock_document(d)) {
        None => Ok(()),
        Some(d) => Err(foreign(reads, d)),
    }
}

/// The error for a collection in which document `d` is not mongolock's.
fn foreign(reads: &Collection<Document>, d: &Document) -> Error {
    let id = d
        .get("_id")
        .map_or_else(|| "no _id".to_owned(), |id| format!("{{_id: {id}}}"));
    let namespace = reads.namespace().to_string();
    Error::ForeignCollection {
        found: format!("it holds document {id}, which is not a mongolock lock document"),
        fix: format!(
            "Choose another collection (the default is distributed.locks; the CLI's \
             --collection, MongoBackend::builder(..).collection(..)) that is empty or holds \
             only locks; to lock an application document itself, use document locks \
             (DocumentLocks), which never write outside their lock field of {namespace}"
        ),
        namespace,
    }
}

/// Whether every TTL index of the collection is on `expiresAt` alone and deletes at least `2 ·
/// window` after expiry (no TTL index at all: true). False when the indexes cannot be read.
async fn ttl_indexes_allow(reads: &Collection<Document>, window: Duration) -> bool {
    let ns = reads.namespace();
    let min_secs = (2 * window).as_secs_f64().ceil();
    let reply = reads
        .client()
        .database(&ns.db)
        .run_command(doc! { "listIndexes": ns.coll.as_str(), "cursor": {} })
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        .await;
    let reply = match reply {
        Ok(reply) => reply,
        Err(e) if errors::code(&e) == Some(NAMESPACE_NOT_FOUND) => return true,
        Err(e) => {
            tracing::debug!(namespace = %ns, error = %e, "listIndexes failed: first acquisitions stamp their tokens");
            return false;
        }
    };
    let verdict = (|| {
        let cursor = reply.get_document("cursor").ok()?;
        // Every index in the first batch (a collection has at most 64; a batch holds 101).
        if !matches!(cursor.get("id"), Some(Bson::Int64(0) | Bson::Int32(0))) {
            return None;
        }
        let indexes = cursor.get_array("firstBatch").ok()?;
        let mut all_allow = true;
        for index in indexes {
            let index = index.as_document()?;
            let Some(after) = index.get("expireAfterSeconds") else {
                continue;
            };
            let secs = match after {
                Bson::Int32(s) => f64::from(*s),
                Bson::Int64(s) => *s as f64,
                Bson::Double(s) => *s,
                _ => return Some(false),
            };
            let key = index.get_document("key").ok()?;
            let on_expires_at = key.len() == 1 && key.get(EXPIRES_AT).is_some_and(is_direction);
            if !on_expires_at || secs.is_nan() || secs < min_secs {
                tracing::debug!(namespace = %ns, index = %index, "a TTL index may delete lock documents early: first acquisitions stamp their tokens");
                all_allow = false;
            }
        }
        Some(all_allow)
    })();
    verdict.unwrap_or(false)
}

/// An ascending or descending index key (`1` or `-1`, of any numeric type).
fn is_direction(key: &Bson) -> bool {
    match key {
        Bson::Int32(k) => k.abs() == 1,
        Bson::Int64(k) => k.abs() == 1,
        Bson::Double(k) => k.abs() == 1.0,
        _ => false,
    }
}

/// Namespaces whose index creation was started by this process.
fn started() -> &'static Mutex<HashSet<String>> {
    static STARTED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    STARTED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Starts creating the index unless this process already did for this namespace. Never fails:
/// errors are logged. Must run inside a Tokio runtime (called from `try_acquire`), after
/// [`Checks::ensure_ours`].
pub(super) fn ensure_in_background(coll: &Collection<Document>, cleanup_after: Duration) {
    let ns = coll.namespace().to_string();
    let first = started()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(ns.clone());
    if !first {
        return;
    }
    let coll = coll.clone();
    tokio::spawn(async move {
        match create_ttl_index(&coll, cleanup_after).await {
            Ok(()) => tracing::debug!(namespace = %ns, "TTL index on expiresAt ensured"),
            Err(e) => tracing::warn!(
                namespace = %ns,
                error = %e,
                "could not create the TTL index on expiresAt; locks work without it, but \
                 unused lock documents are not cleaned up (and while another TTL index may \
                 delete lock documents sooner than cleanup_after, first acquisitions stamp \
                 their tokens: one more round trip)"
            ),
        }
    });
}

/// Creates the TTL index (`createIndexes`), after the caller checked the collection is ours.
pub(super) async fn create_ttl_index(
    coll: &Collection<Document>,
    cleanup_after: Duration,
) -> Result<()> {
    let model = IndexModel::builder()
        .keys(doc! { EXPIRES_AT: 1 })
        .options(
            IndexOptions::builder()
                .name(TTL_INDEX_NAME.to_owned())
                .expire_after(Duration::from_secs(cleanup_after.as_secs()))
                .build(),
        )
        .build();
    coll.create_index(model)
        .await
        .map(|_| ())
        .map_err(|e| classify(e, "createIndexes"))
}
