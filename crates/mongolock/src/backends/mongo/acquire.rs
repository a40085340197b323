//! The acquire path: one `findAndModify` with an update pipeline on the lock's document; on a
//! name's first acquisition (no document yet), an epoch from the name's epoch counter first and
//! then the upsert that creates the document with its first token; when a grant has no token
//! of its range left, a stamp from a fresh epoch. See the [module docs](super) for why tokens
//! keep growing across TTL cleanup.

use std::time::Duration;

use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::options::{ReturnDocument, UpdateModifications};
use mongodb::Collection;

use super::document::{
    self, holder_doc, ttl_millis, LockSite, ACQUIRED_AT, ENDED, ENDED_FROM, EPOCH, EXPIRES_AT,
    HOLDER, LEASE_ID, TOKEN,
};
use super::errors::{self, classify, DUPLICATE_KEY};
use super::index::Checks;
use super::queue::{self, Queueing, RESERVED, WAITERS};
use super::retired;
use super::slots::{self, LIMIT, SLOTS};
use crate::backend::{AcquireRequest, Attempt, Lease};
use crate::error::{Error, Result};

/// Tokens of one fencing epoch: epoch `e` owns the tokens `(e - 1) · 2²⁰ + 1 ..= e · 2²⁰`.
/// Part of the storage format: every process using a collection must agree on it.
pub(super) const EPOCH_TOKENS: i64 = 1 << 20;

/// Number of epoch counters per collection; a name's counter is fixed by a hash of the name
/// ([`epoch_bucket`]). Part of the storage format.
pub(super) const EPOCH_BUCKETS: u64 = 4096;

/// The largest epoch: its tokens end at 2⁵³ (exactly representable in JSON and JavaScript).
const MAX_EPOCH: i64 = (1 << 53) / EPOCH_TOKENS;

/// The largest token ever issued.
pub(super) const MAX_TOKEN: u64 = 1 << 53;

/// Longest time allowed between taking an epoch and creating a document with it (see the
/// module docs, "first acquisition"): half of `cleanup_after` in whole seconds (the TTL index's
/// `expireAfterSeconds`), at most a minute. `None` when `cleanup_after` is under 2 s: the first
/// acquisition then creates the document first and stamps it after. The window is used only
/// when the collection's TTL indexes were verified to delete no sooner than twice it
/// (`index.rs`).
pub(super) fn creation_window(cleanup_after: Duration) -> Option<Duration> {
    let whole = Duration::from_secs(cleanup_after.as_secs());
    (whole >= Duration::from_secs(2)).then(|| (whole / 2).min(MAX_WINDOW))
}

const MAX_WINDOW: Duration = Duration::from_secs(60);

/// The epoch counter of `name`: FNV-1a (64 bit) of its UTF-8 bytes, modulo [`EPOCH_BUCKETS`].
/// Part of the storage format: never change it for an existing collection.
pub(super) fn epoch_bucket(name: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Below 4096: fits.
    (hash % EPOCH_BUCKETS) as i64
}

/// `_id` of the epoch counter of `name`.
pub(super) fn epoch_id(name: &str) -> Document {
    doc! { "mongolock": "fencing-epoch", "bucket": epoch_bucket(name) }
}

/// An epoch taken before creating the document, and the server time until which it may be
/// used to create one.
pub(super) struct NewLifetime {
    pub(super) epoch: i64,
    create_before: DateTime,
}

/// The token and epoch expressions of a new grant, shared by exclusive and slot grants (see
/// `acquire_pipeline`): the next token of the document's epoch when it has one left; else,
/// when the upsert is creating the document within `new_lifetime`'s window, the first token of
/// that epoch; else null for both (the caller stamps a token from a fresh epoch).
pub(super) fn token_and_epoch(new_lifetime: Option<&NewLifetime>) -> (Document, Document) {
    let in_range = doc! {
        "$and": [
            { "$isNumber": "$epoch" },
            { "$lt": ["$fencingToken", { "$multiply": ["$epoch", EPOCH_TOKENS] }] },
        ]
    };
    let (token, epoch) = match new_lifetime {
        Some(n) => {
            let creating = doc! {
                "$and": [
                    { "$eq": [{ "$type": "$leaseId" }, "missing"] },
                    { "$lt": ["$$NOW", n.create_before] },
                ]
            };
            (
                Bson::Document(
                    doc! { "$cond": [creating.clone(), { "$literal": token_floor(n.epoch) }, Bson::Null] },
                ),
                Bson::Document(doc! { "$cond": [creating, { "$literal": n.epoch }, Bson::Null] }),
            )
        }
        None => (Bson::Null, Bson::Null),
    };
    (
        doc! { "$cond": [in_range.clone(), { "$add": ["$fencingToken", 1_i64] }, token] },
        doc! { "$cond": [in_range, "$epoch", epoch] },
    )
}

/// Aggregation expression: the backend with `mark` may take the name now — no lease, or the
/// lease expired by server time, and not reserved for another process's turn (`queue.rs`).
/// What an attempt tests (besides "the lease is already ours") and what a waiter's probe reads
/// (`probe.rs`).
pub(super) fn free_for(mark: &str) -> Document {
    doc! { "$and": [
        { "$or": [
            { "$eq": [{ "$ifNull": ["$leaseId", Bson::Null] }, Bson::Null] },
            { "$lte": ["$expiresAt", "$$NOW"] },
        ] },
        queue::not_reserved_for_others(mark),
    ] }
}

/// The update pipeline: take the lease when the name is free, else leave the document as it
/// is. One `$replaceWith` of `$cond: [free, $$ROOT merged with the new lease, $$ROOT]`, so the
/// server evaluates "free" once per attempt (not once per field).
///
/// The new lease's token is the next one of the document's epoch when that epoch has one left;
/// else, when the upsert is creating the document within `new_lifetime`'s window, the first
/// token of that epoch; else none (`epoch: null`, token unchanged): the caller then stamps one
/// from a fresh epoch.
///
/// With `queueing`, a busy attempt registers the backend in the lock's queue and a grant
/// updates it (`queue.rs`); without, a busy attempt leaves the document as it is.
fn acquire_pipeline(
    req: &AcquireRequest,
    new_lifetime: Option<&NewLifetime>,
    queueing: Queueing<'_>,
) -> Vec<Document> {
    let mine = Bson::String(req.lease_id.as_str().to_owned());
    // free = (no lease, or the lease expired by server time) and not reserved for another
    // process's turn (`queue.rs`), or the lease is already ours (a retry after a lost reply);
    // and in either case our lease id was never retired (a late attempt, `retired.rs`).
    let free = doc! { "$and": [
        retired::not_retired(req.lease_id.as_str()),
        { "$or": [
            free_for(queueing.mark),
            { "$eq": ["$leaseId", mine.clone()] },
        ] },
    ] };
    // The document's epoch has a token left (documents without an epoch have none). Bound
    // once (`$$inRange`) for the token and the epoch.
    let mut vars = doc! {
        "inRange": { "$and": [
            { "$isNumber": "$epoch" },
            { "$lt": ["$fencingToken", { "$multiply": ["$epoch", EPOCH_TOKENS] }] },
        ] },
        // The leases this grant ends without their holders' release (`document.rs`).
        "ending": ended_by_grant(Some(&mine)),
    };
    // The token this grant issues, or null when it must be stamped (`$$fresh`, bound below).
    let (fresh, epoch) = match new_lifetime {
        Some(n) => {
            // Created by this upsert (a new document has nothing but `_id`), in time.
            vars.insert(
                "creating",
                doc! { "$and": [
                    { "$eq": [{ "$type": "$leaseId" }, "missing"] },
                    { "$lt": ["$$NOW", n.create_before] },
                ] },
            );
            (
                doc! { "$cond": [
                    "$$inRange",
                    { "$add": ["$fencingToken", 1_i64] },
                    { "$cond": ["$$creating", { "$literal": token_floor(n.epoch) }, Bson::Null] },
                ] },
                Bson::Document(doc! { "$cond": [
                    "$$inRange",
                    "$epoch",
                    { "$cond": ["$$creating", { "$literal": n.epoch }, Bson::Null] },
                ] }),
            )
        }
        None => (
            doc! { "$cond": ["$$inRange", { "$add": ["$fencingToken", 1_i64] }, Bson::Null] },
            Bson::Document(doc! { "$cond": ["$$inRange", "$epoch", Bson::Null] }),
        ),
    };
    let lease = doc! {
        LEASE_ID: { "$literal": mine },
        TOKEN: { "$ifNull": ["$$fresh", "$fencingToken"] },
        EPOCH: epoch,
        ACQUIRED_AT: "$$NOW",
        EXPIRES_AT: { "$add": ["$$NOW", ttl_millis(req.ttl)] },
        HOLDER: { "$literal": holder_doc(&req.holder) },
        // Exclusive mode: the name's semaphore slots, if any, are over (`slots.rs`).
        LIMIT: Bson::Null,
        SLOTS: { "$cond": [slots::slot_mode(), [], "$$REMOVE"] },
        WAITERS: queue::on_grant(
            queueing.mark,
            &req.holder,
            ttl_millis(req.ttl),
            queueing.requeue,
        ),
        RESERVED: queue::clear_reservation(),
        ENDED_FROM: document::ended_from_after(
            "$ended",
            "$endedFrom",
            Bson::String("$$ending".into()),
            Bson::String("$$fresh".into()),
        ),
    };
    let granted = doc! { "$let": {
        "vars": vars,
        "in": { "$let": {
            "vars": { "fresh": fresh },
            "in": { "$mergeObjects": [
                "$$ROOT",
                lease,
                { "$cond": [
                    { "$gt": [{ "$size": "$$ending" }, 0_i64] },
                    { ENDED: document::ended_after("$ended", Bson::String("$$ending".into())) },
                    {},
                ] },
            ] },
        } },
    } };
    let busy = if queueing.register {
        Bson::Document(doc! { "$mergeObjects": [
            "$$ROOT",
            { WAITERS: queue::after_busy(queueing.mark, &req.holder) },
        ] })
    } else {
        Bson::String("$$ROOT".into())
    };
    vec![doc! {
        "$replaceWith": { "$cond": [
            free,
            granted,
            busy,
        ] }
    }]
}

/// Aggregation expression: the fencing tokens of the leases that a grant (to `mine`; `None`
/// for a force-release) ends without their holders' release, evaluated on the document before
/// the write: in slot mode every slot left in `slots` (a holder's release removes its slot,
/// so these expired, or are force-released, unreleased); otherwise the exclusive lease, when
/// there is one, it has a token (`epoch` set: not waiting for its stamp), it is not `mine`
/// (a retry of our own grant) and its holder did not release it with a minimum hold (its id
/// in `lastReleased`). Recorded in `ended` (`document.rs`, [`document::released_by_holder`]).
pub(super) fn ended_by_grant(mine: Option<&Bson>) -> Document {
    let mut unreleased = vec![
        Bson::Document(doc! { "$eq": [{ "$type": "$leaseId" }, "string"] }),
        Bson::Document(doc! { "$ne": ["$leaseId", { "$ifNull": ["$lastReleased", Bson::Null] }] }),
        Bson::Document(doc! { "$isNumber": "$epoch" }),
    ];
    if let Some(mine) = mine {
        unreleased.push(Bson::Document(
            doc! { "$ne": ["$leaseId", { "$literal": mine }] },
        ));
    }
    doc! { "$cond": [
        slots::slot_mode(),
        { "$map": { "input": { "$ifNull": ["$slots", []] }, "in": "$$this.token" } },
        { "$cond": [{ "$and": unreleased }, ["$fencingToken"], []] },
    ] }
}

/// Only what the client reads back: the holder and the record of ended leases stay on the
/// server.
fn reply_fields() -> Document {
    doc! { LEASE_ID: 1, TOKEN: 1, EPOCH: 1, ACQUIRED_AT: 1, EXPIRES_AT: 1, "reserved.until": 1 }
}

/// The cheap attempt's command (see [`try_acquire_cheap`]): filter, update and reply
/// projection.
pub(super) fn cheap_command(req: &AcquireRequest) -> (Document, Vec<Document>, Document) {
    let filter = doc! {
        "_id": req.name.as_str(),
        // Released by its holder (or force-released): no lease to end, nothing for `ended`.
        LEASE_ID: Bson::Null,
        // Exclusive mode, nobody queued, no reservation.
        LIMIT: Bson::Null,
        WAITERS: { "$in": [Bson::Null, []] },
        RESERVED: Bson::Null,
        // The document's epoch has a token left (a missing or null epoch has none).
        EPOCH: { "$type": "number" },
        // Not a late attempt of a retired lease id (`retired.rs`).
        retired::RETIRED: retired::not_retired_filter(req.lease_id.as_str()),
        "$expr": { "$lt": ["$fencingToken", { "$multiply": ["$epoch", EPOCH_TOKENS] }] },
    };
    let update = vec![doc! { "$set": {
        LEASE_ID: { "$literal": req.lease_id.as_str() },
        TOKEN: { "$add": ["$fencingToken", 1_i64] },
        ACQUIRED_AT: "$$NOW",
        EXPIRES_AT: { "$add": ["$$NOW", ttl_millis(req.ttl)] },
        HOLDER: { "$literal": holder_doc(&req.holder) },
    } }];
    (filter, update, reply_fields())
}

/// The uncontended case in one small command: grants the lease only when the name's document
/// shows it released, in exclusive mode, with nobody queued or reserved and a token left in
/// its epoch — then the grant of [`acquire_pipeline`] comes down to these fields (the next
/// token of the same epoch; no lease ended, so nothing for `ended`; no queue or reservation
/// to update). `Ok(None)`: the document is not in that state (or missing); the caller makes
/// the full attempt. See "The uncontended shortcut" in the [module docs](super).
pub(super) async fn try_acquire_cheap(
    coll: &Collection<Document>,
    req: &AcquireRequest,
) -> Result<Option<Lease>> {
    // `find_and_modify` projects the reply to `reply_fields()`, as `cheap_command` says.
    let (filter, update, _) = cheap_command(req);
    let Some(doc) = find_and_modify(coll, &filter, update, false).await? else {
        return Ok(None);
    };
    let token = document::token(&doc, LockSite::Named, &req.name)?
        .ok_or_else(|| LockSite::Named.bad(&req.name, "a grant without a fencingToken"))?;
    Ok(Some(document::lease(
        &doc,
        token,
        LockSite::Named,
        &req.name,
    )?))
}

/// One acquisition attempt. `checks` tells (through `reads`) whether a first acquisition may
/// create its document with a token (`index.rs`).
pub(super) async fn try_acquire(
    coll: &Collection<Document>,
    reads: &Collection<Document>,
    checks: &Checks,
    req: &AcquireRequest,
    cleanup_after: Duration,
    queueing: Queueing<'_>,
) -> Result<Attempt> {
    let filter = doc! { "_id": req.name.as_str() };
    // The common case: the document exists. No upsert, so that a first acquisition is known
    // as such before anything is created.
    let existing =
        find_and_modify(coll, &filter, acquire_pipeline(req, None, queueing), false).await?;
    let doc = match existing {
        Some(doc) => doc,
        None => {
            // The shortcut only when no TTL index may delete lock documents too soon;
            // otherwise the document is created without a token and stamped.
            let new_lifetime = match checks.creation_window(reads, cleanup_after).await {
                Some(window) => Some(take_epoch(coll, &req.name, window).await?),
                None => None,
            };
            upsert(
                coll,
                &filter,
                acquire_pipeline(req, new_lifetime.as_ref(), queueing),
            )
            .await?
        }
    };
    if document::lease_id(&doc) != Some(req.lease_id.as_str()) {
        // Held until its expiry; or reserved for another process's turn until the
        // reservation lapses (`queue.rs`): retry then. An acquirer that waited before the
        // release is also woken by its fallback; one that started during the reservation
        // heard no release, so this retry is what serves it when the designated process died
        // (if that process took the lock meanwhile, the retry is busy and waits for its lease).
        let reserved_until = doc
            .get_document(RESERVED)
            .ok()
            .and_then(|r| document::date(r, "until"));
        return Ok(Attempt::Busy {
            holder_expires_at: document::date(&doc, EXPIRES_AT).max(reserved_until),
        });
    }
    if matches!(doc.get(EPOCH), Some(Bson::Int64(_) | Bson::Int32(_))) {
        let token = document::token(&doc, LockSite::Named, &req.name)?
            .ok_or_else(|| LockSite::Named.bad(&req.name, "an epoch but no fencingToken"))?;
        return Ok(Attempt::Acquired(document::lease(
            &doc,
            token,
            LockSite::Named,
            &req.name,
        )?));
    }
    stamp_token(coll, req).await
}

/// The common-case attempt's command (the document exists): filter, pipeline and reply
/// projection, as [`try_acquire`] sends them first.
pub(super) fn command(
    req: &AcquireRequest,
    queueing: Queueing<'_>,
) -> (Document, Vec<Document>, Document) {
    (
        doc! { "_id": req.name.as_str() },
        acquire_pipeline(req, None, queueing),
        reply_fields(),
    )
}

/// `findAndModify` of the lock document with the acquire pipeline, returning the projected
/// post-image (`None`: no document and no upsert).
async fn find_and_modify(
    coll: &Collection<Document>,
    filter: &Document,
    update: impl Into<UpdateModifications>,
    upsert: bool,
) -> Result<Option<Document>> {
    coll.find_one_and_update(filter.clone(), update)
        .upsert(upsert)
        .return_document(ReturnDocument::After)
        .projection(reply_fields())
        .await
        .map_err(|e| classify(e, "acquire (findAndModify)"))
}

/// One `findAndModify` upsert of the lock document. Two clients that create the document at
/// once race on its `_id`: the loser retries (up to five times) on the now existing document.
async fn upsert(
    coll: &Collection<Document>,
    filter: &Document,
    pipeline: Vec<Document>,
) -> Result<Document> {
    upsert_with(coll, filter, pipeline, reply_fields()).await
}

/// [`upsert`] with the reply projected to `projection`.
pub(super) async fn upsert_with(
    coll: &Collection<Document>,
    filter: &Document,
    pipeline: Vec<Document>,
    projection: Document,
) -> Result<Document> {
    let mut duplicate_keys = 0;
    loop {
        let result = coll
            .find_one_and_update(filter.clone(), pipeline.clone())
            .upsert(true)
            .return_document(ReturnDocument::After)
            .projection(projection.clone())
            .await;
        match result {
            Ok(Some(doc)) => return Ok(doc),
            Ok(None) => return Err(no_post_image()),
            Err(e) if errors::code(&e) == Some(DUPLICATE_KEY) && duplicate_keys < 5 => {
                duplicate_keys += 1;
            }
            Err(e) => return Err(classify(e, "acquire (findAndModify upsert)")),
        }
    }
}

fn no_post_image() -> Error {
    Error::backend(
        "findAndModify with upsert and new: true returned no document",
        "the server does not behave like MongoDB; check the deployment",
    )
}

/// The smallest token of epoch `epoch` (the counters start at 1, so a name whose counter was
/// never used before starts at token 1): `(epoch - 1) · 2²⁰ + 1`.
fn token_floor(epoch: i64) -> i64 {
    (epoch - 1) * EPOCH_TOKENS + 1
}

/// A grant without a token (its document is new, or its epoch has no token left): take a new
/// epoch, then stamp our (unexpired) lease with `max(token + 1, (epoch - 1) · 2²⁰ + 1)`.
async fn stamp_token(coll: &Collection<Document>, req: &AcquireRequest) -> Result<Attempt> {
    let NewLifetime { epoch, .. } = take_epoch(coll, &req.name, Duration::ZERO).await?;
    let stamped = coll
        .find_one_and_update(
            doc! {
                "_id": req.name.as_str(),
                LEASE_ID: req.lease_id.as_str(),
                LIMIT: Bson::Null,
                "$expr": { "$gt": ["$expiresAt", "$$NOW"] },
            },
            vec![
                doc! { "$set": {
                    TOKEN: { "$max": [
                        { "$add": [{ "$ifNull": ["$fencingToken", 0_i64] }, 1_i64] },
                        token_floor(epoch),
                    ] },
                    EPOCH: epoch,
                } },
                // The lifetime's first token, when it is (`document::released_by_holder`).
                doc! { "$set": { ENDED_FROM: { "$ifNull": ["$endedFrom", "$fencingToken"] } } },
            ],
        )
        .return_document(ReturnDocument::After)
        .projection(reply_fields())
        .await
        .map_err(|e| classify(e, "acquire (stamp fencing token)"))?;
    let Some(doc) = stamped else {
        // Our lease expired (or was taken) before it was stamped: it never counted.
        return Ok(Attempt::Busy {
            holder_expires_at: None,
        });
    };
    let token = document::token(&doc, LockSite::Named, &req.name)?.ok_or_else(|| {
        Error::backend(
            "the fencing token was not stamped",
            "the server does not behave like MongoDB; check the deployment",
        )
    })?;
    Ok(Attempt::Acquired(document::lease(
        &doc,
        token,
        LockSite::Named,
        &req.name,
    )?))
}

/// Increments the epoch counter of `name` and returns the new epoch, with the server time of
/// the increment plus `window` as the time before which it may create a document.
pub(super) async fn take_epoch(
    coll: &Collection<Document>,
    name: &str,
    window: Duration,
) -> Result<NewLifetime> {
    let filter = doc! { "_id": epoch_id(name) };
    let update = vec![doc! { "$set": {
        "epoch": { "$add": [{ "$ifNull": ["$epoch", 0_i64] }, 1_i64] },
        "takenAt": "$$NOW",
    } }];
    let mut duplicate_keys = 0;
    let doc = loop {
        let result = coll
            .find_one_and_update(filter.clone(), update.clone())
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await;
        match result {
            Ok(Some(doc)) => break doc,
            Ok(None) => return Err(no_post_image()),
            Err(e) if errors::code(&e) == Some(DUPLICATE_KEY) && duplicate_keys < 5 => {
                duplicate_keys += 1;
            }
            Err(e) => return Err(classify(e, "acquire (fencing epoch)")),
        }
    };
    let epoch = match doc.get("epoch") {
        Some(Bson::Int64(e)) if *e > 0 => *e,
        Some(Bson::Int32(e)) if *e > 0 => i64::from(*e),
        other => {
            return Err(Error::backend(
                format!("the fencing epoch counter of {name:?} holds {other:?}"),
                "the lock collection holds documents mongolock did not write; use a dedicated \
                 collection for locks",
            ))
        }
    };
    if epoch > MAX_EPOCH {
        return Err(Error::FencingTokensExhausted {
            name: name.to_owned(),
            limit: MAX_TOKEN,
        });
    }
    let taken_at = doc.get_datetime("takenAt").map_err(|_| {
        Error::backend(
            format!("the fencing epoch counter of {name:?} has no `takenAt` date"),
            "the server does not behave like MongoDB; check the deployment",
        )
    })?;
    let window = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    Ok(NewLifetime {
        epoch,
        create_before: DateTime::from_millis(taken_at.timestamp_millis().saturating_add(window)),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{creation_window, epoch_bucket, token_floor, EPOCH_TOKENS, MAX_EPOCH, MAX_TOKEN};

    #[test]
    fn epochs_own_disjoint_ranges_that_end_at_two_to_the_53() {
        assert_eq!(token_floor(1), 1);
        assert_eq!(token_floor(2), EPOCH_TOKENS + 1);
        for e in [1_i64, 2, 1000, MAX_EPOCH - 1] {
            // The last token of epoch e is just below the first of e + 1.
            assert_eq!(token_floor(e + 1) - 1, e * EPOCH_TOKENS);
        }
        assert_eq!((MAX_EPOCH * EPOCH_TOKENS) as u64, MAX_TOKEN);
    }

    #[test]
    fn the_epoch_bucket_is_a_stable_function_of_the_name() {
        // Part of the storage format: these values must never change.
        assert_eq!(epoch_bucket(""), (0xcbf2_9ce4_8422_2325_u64 % 4096) as i64);
        assert_eq!(epoch_bucket("a"), (0xaf63_dc4c_8601_ec8c_u64 % 4096) as i64);
        let buckets: std::collections::HashSet<i64> = (0..1000)
            .map(|i| epoch_bucket(&format!("order:{i}")))
            .collect();
        assert!(buckets.len() > 800, "names spread over the counters");
        assert!(buckets.iter().all(|b| (0..4096).contains(b)));
    }

    #[test]
    fn the_creation_window_is_half_the_cleanup_delay_at_most_a_minute() {
        assert_eq!(creation_window(Duration::ZERO), None);
        assert_eq!(creation_window(Duration::from_secs(1)), None);
        assert_eq!(
            creation_window(Duration::from_secs(2)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            creation_window(Duration::from_secs(3600)),
            Some(Duration::from_secs(60))
        );
        // Whole seconds, as the TTL index's expireAfterSeconds: twice the window never
        // exceeds the library's own index's delay.
        assert_eq!(
            creation_window(Duration::from_millis(3900)),
            Some(Duration::from_millis(1500))
        );
    }
}
