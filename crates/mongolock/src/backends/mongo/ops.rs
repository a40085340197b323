//! Extend, release, inspect, list and force-release.

use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::Collection;

use super::acquire;
use super::document::{
    self, ttl_millis, ENDED, ENDED_FROM, EXPIRES_AT, LAST_RELEASED, LEASE_ID, OBSERVED_AT,
};
use super::errors::classify;
use super::slots::{self, LIMIT, SLOTS};
use super::{index, queue};
use crate::backend::{LeaseHolder, LeaseId, LockInfo};
use crate::error::Result;

/// The pipeline of a force-release: no lease id, expiry no later than now, the token stays, and
/// the first waiting process is designated (and with `reserve`, the lock reserved for it:
/// `queue.rs`).
///
/// `lastReleased` is set to the force-release's own unique string, which lies in no backend's
/// lease-id range: left as it was, it would name the previous release's lease id, and on
/// MongoDB 4.4 (pipeline updates reported as replace events carrying the whole document) the
/// change stream of the backend that made that release would take the force-release for its
/// own release and filter it out (`watch.rs`), so its waiters would sleep until the old
/// expiry. It also lets a replace event's `next` be recognised as this force-release's
/// designation (`Handoff::of`).
///
/// The tokens of the leases it ends (the exclusive lease, or every slot) are recorded in
/// `ended` (`document.rs`), so that their holders' releases report the loss.
pub(super) fn end_lease(reserve: bool) -> Vec<Document> {
    let forced = format!("force-release-{}", LeaseId::random().as_str());
    let ending = Bson::Document(acquire::ended_by_grant(None));
    let set = doc! {
        ENDED: document::ended_after("$ended", ending.clone()),
        ENDED_FROM: document::ended_from_after("$ended", "$endedFrom", ending, "$$REMOVE".into()),
        LEASE_ID: null,
        EXPIRES_AT: { "$min": ["$expiresAt", "$$NOW"] },
        LAST_RELEASED: { "$literal": forced.as_str() },
        // Every semaphore slot ends too (`slots.rs`).
        LIMIT: Bson::Null,
        SLOTS: [],
    };
    vec![
        doc! { "$replaceWith": { "$mergeObjects": ["$$ROOT", set, queue::pop(&forced, reserve)] } },
    ]
}

pub(super) async fn extend(
    coll: &Collection<Document>,
    name: &str,
    lease_id: &LeaseId,
    ttl: Duration,
) -> Result<Option<SystemTime>> {
    let doc = coll
        .find_one_and_update(
            doc! {
                "_id": name,
                LEASE_ID: lease_id.as_str(),
                // Not a semaphore's document, whose `leaseId` only marks its last write.
                LIMIT: Bson::Null,
                // Not a lease its holder ended with a minimum hold (`release_after`).
                LAST_RELEASED: { "$ne": lease_id.as_str() },
                "$expr": { "$gt": ["$expiresAt", "$$NOW"] },
            },
            vec![doc! { "$set": { EXPIRES_AT: { "$add": ["$$NOW", ttl_millis(ttl)] } } }],
        )
        .return_document(ReturnDocument::After)
        .projection(doc! { EXPIRES_AT: 1 })
        .await
        .map_err(|e| classify(e, "extend (findAndModify)"))?;
    match doc {
        None => Ok(None),
        Some(d) => Ok(Some(document::require_date(
            &d,
            EXPIRES_AT,
            document::LockSite::Named,
            name,
        )?)),
    }
}

/// The release's `findAndModify`: filter, pipeline and reply projection.
pub(super) fn release_command(
    name: &str,
    lease_id: &LeaseId,
    reserve: bool,
) -> (Document, Vec<Document>, Document) {
    let (mut filter, pipeline) = document::release_update("", lease_id.as_str(), Some(reserve));
    filter.insert("_id", name);
    // Not a semaphore's document, whose `leaseId` only marks its last write (`slots.rs`).
    filter.insert(LIMIT, Bson::Null);
    (filter, pipeline, doc! { queue::NEXT: 1 })
}

/// The short release of a lease granted by the uncontended shortcut (`acquire.rs`): filter,
/// update and reply projection. It matches only while nobody is queued (`waiters` null or empty), when the full
/// release ([`release_command`]) writes exactly these fields: its queue part adds nothing to
/// a lock without a queue.
pub(super) fn short_release_command(
    name: &str,
    lease_id: &LeaseId,
) -> (Document, Vec<Document>, Document) {
    let filter = doc! {
        "_id": name,
        LEASE_ID: lease_id.as_str(),
        LIMIT: Bson::Null,
        queue::WAITERS: { "$in": [Bson::Null, []] },
    };
    let update = vec![doc! { "$set": {
        LEASE_ID: Bson::Null,
        EXPIRES_AT: { "$min": ["$expiresAt", "$$NOW"] },
        LAST_RELEASED: { "$literal": lease_id.as_str() },
    } }];
    (filter, update, doc! { "_id": 1 })
}

/// Ends our lease. `Ok(None)`: it was not ours (any more). `Ok(Some(handoff))`: released (or
/// released before, for a retry), and whom the release handed the lock to. One command when
/// the lease was ours; otherwise, when its fencing token `token` is known, a second one, a
/// read through `reads` (the primary, majority read concern), tells whether its holder ended
/// it ([`document::released_by_holder`]). Without the token (a lease id whose grant this
/// backend never saw) a lease that is not current counts as not ours. With `short` (the lease
/// was granted by the uncontended shortcut) the short release is tried first; when it matches
/// nothing (someone queued meanwhile, or the lease is not ours any more) the full release
/// follows.
pub(super) async fn release(
    coll: &Collection<Document>,
    reads: &Collection<Document>,
    name: &str,
    lease_id: &LeaseId,
    token: Option<u64>,
    reserve: bool,
    short: bool,
) -> Result<Option<queue::Handoff>> {
    if short {
        let (filter, update, projection) = short_release_command(name, lease_id);
        let done = coll
            .find_one_and_update(filter, update)
            .projection(projection)
            .await
            .map_err(|e| classify(e, "release (findAndModify)"))?;
        if done.is_some() {
            // Nobody was queued: no designation (as the full release of an unqueued lock).
            return Ok(Some(queue::Handoff::Unknown));
        }
    }
    let (filter, pipeline, projection) = release_command(name, lease_id, reserve);
    let doc = coll
        .find_one_and_update(filter, pipeline)
        .return_document(ReturnDocument::After)
        .projection(projection)
        .await
        .map_err(|e| classify(e, "release (findAndModify)"))?;
    if let Some(d) = doc {
        return Ok(Some(queue::Handoff::of(
            d.get(queue::NEXT),
            Some(lease_id.as_str()),
        )));
    }
    // Not ours any more: released by an earlier try of this release, or ended by someone else.
    let before = released_before(reads, name, token, "release (find)").await?;
    Ok(before.then_some(queue::Handoff::Unknown))
}

/// Whether the holder of the lease with fencing token `token` (if known) of `name` ended it
/// ([`document::released_by_holder`]): one read through `reads`.
pub(super) async fn released_before(
    reads: &Collection<Document>,
    name: &str,
    token: Option<u64>,
    op: &str,
) -> Result<bool> {
    let Some(token) = token else {
        return Ok(false);
    };
    let mut filter = document::released_by_holder("", token);
    filter.insert("_id", name);
    let found = reads
        .find_one(filter)
        .projection(doc! { "_id": 1 })
        .await
        .map_err(|e| classify(e, op))?;
    Ok(found.is_some())
}

/// What a `release_after` did.
pub(super) enum EndedAfter {
    /// The lease is kept on until its grant time plus the minimum hold.
    HeldOn,
    /// Released now (the minimum hold had passed, or the lease had expired), and whom the
    /// release handed the lock to.
    Released(queue::Handoff),
    /// Already released or kept on by an earlier try (a retry after a lost reply).
    Before,
}

/// The `release_after`'s `findAndModify`: filter, pipeline and reply projection. One
/// `$replaceWith` decides, by `$$NOW`, between keeping the lease on (still unexpired, and its
/// `acquiredAt + min_hold` ahead: `expiresAt` set to that, the id recorded in `lastReleased` —
/// so that extensions are refused, a takeover at its end does not count as ending it, a retry
/// succeeds and change streams see the write) and the plain release of [`release_command`] (the same fields, the same
/// handoff).
pub(super) fn release_after_command(
    name: &str,
    lease_id: &LeaseId,
    min_hold: Duration,
    reserve: bool,
) -> (Document, Vec<Document>, Document) {
    let (filter, mut release, _) = release_command(name, lease_id, reserve);
    // The plain release's `$replaceWith` expression (one stage).
    let released = release
        .pop()
        .and_then(|mut stage| stage.remove("$replaceWith"))
        .unwrap_or(Bson::String("$$ROOT".into()));
    let id = lease_id.as_str();
    let hold_until = doc! { "$add": ["$acquiredAt", ttl_millis(min_hold)] };
    let holding = doc! { "$and": [
        { "$gt": ["$expiresAt", "$$NOW"] },
        { "$gt": [hold_until.clone(), "$$NOW"] },
    ] };
    let held_on = doc! { "$mergeObjects": ["$$ROOT", {
        EXPIRES_AT: hold_until,
        LAST_RELEASED: { "$literal": id },
    }] };
    let pipeline = vec![doc! { "$replaceWith": { "$cond": [holding, held_on, released] } }];
    (filter, pipeline, doc! { LEASE_ID: 1, queue::NEXT: 1 })
}

/// Ends our lease no earlier than `min_hold` after its grant (see
/// [`release_after_command`]). `Ok(None)`: it was not ours (any more), and no earlier try
/// ended it.
pub(super) async fn release_after(
    coll: &Collection<Document>,
    reads: &Collection<Document>,
    name: &str,
    lease_id: &LeaseId,
    token: Option<u64>,
    min_hold: Duration,
    reserve: bool,
) -> Result<Option<EndedAfter>> {
    let (filter, pipeline, projection) = release_after_command(name, lease_id, min_hold, reserve);
    let doc = coll
        .find_one_and_update(filter, pipeline)
        .return_document(ReturnDocument::After)
        .projection(projection)
        .await
        .map_err(|e| classify(e, "release with a minimum hold (findAndModify)"))?;
    if let Some(d) = doc {
        if document::lease_id(&d) == Some(lease_id.as_str()) {
            return Ok(Some(EndedAfter::HeldOn));
        }
        return Ok(Some(EndedAfter::Released(queue::Handoff::of(
            d.get(queue::NEXT),
            Some(lease_id.as_str()),
        ))));
    }
    let before = released_before(reads, name, token, "release with a minimum hold (find)").await?;
    Ok(before.then_some(EndedAfter::Before))
}

pub(super) async fn force_release(
    coll: &Collection<Document>,
    name: &str,
    reserve: bool,
) -> Result<bool> {
    let r = coll
        .update_one(
            doc! {
                "_id": name,
                LEASE_ID: { "$ne": null },
                "$expr": { "$gt": ["$expiresAt", "$$NOW"] },
            },
            end_lease(reserve),
        )
        .await
        .map_err(|e| classify(e, "force release (update)"))?;
    Ok(r.matched_count == 1)
}

/// The documents matching `filter` read together with the server time (`OBSERVED_AT`):
/// [`Error::ForeignCollection`](crate::Error::ForeignCollection) when one of them is not a
/// lock document (`index::is_lock_document`).
pub(super) async fn read_docs(
    coll: &Collection<Document>,
    filter: Document,
    op: &str,
) -> Result<Vec<Document>> {
    let cursor = coll
        .aggregate(vec![
            doc! { "$match": filter },
            doc! { "$addFields": { OBSERVED_AT: "$$NOW" } },
        ])
        .await
        .map_err(|e| classify(e, op))?;
    let docs: Vec<Document> = cursor.try_collect().await.map_err(|e| classify(e, op))?;
    index::ensure_lock_documents(coll, &docs)?;
    Ok(docs)
}

/// Reads lock documents matching `filter` together with the server time.
pub(super) async fn read(
    coll: &Collection<Document>,
    filter: Document,
    op: &str,
) -> Result<Vec<LockInfo>> {
    let docs = read_docs(coll, filter, op).await?;
    docs.iter().map(document::lock_info).collect()
}

pub(super) async fn inspect(coll: &Collection<Document>, name: &str) -> Result<Option<LockInfo>> {
    Ok(read(coll, doc! { "_id": name }, "inspect (aggregate)")
        .await?
        .into_iter()
        .next())
}

/// Every current holder of `name` (see [`slots::holders`]), judged by the server's time.
pub(super) async fn holders(coll: &Collection<Document>, name: &str) -> Result<Vec<LeaseHolder>> {
    let docs = read_docs(coll, doc! { "_id": name }, "holders (aggregate)").await?;
    let Some(d) = docs.first() else {
        return Ok(Vec::new());
    };
    let observed_at = document::require_date(d, OBSERVED_AT, document::LockSite::Named, name)?;
    slots::holders(d, observed_at, name)
}

pub(super) async fn list(coll: &Collection<Document>) -> Result<Vec<LockInfo>> {
    // String ids only: this skips the fencing epoch counter.
    let mut all = read(
        coll,
        doc! { "_id": { "$type": "string" } },
        "list (aggregate)",
    )
    .await?;
    all.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(all)
}
