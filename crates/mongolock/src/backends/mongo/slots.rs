//! Semaphore slots ([`LeaseMode::Slot`](crate::LeaseMode::Slot)) in the lock document: the
//! slot acquire path, and extend/release of a slot.
//!
//! # The document in slot mode
//! A name's document is in *slot mode* while `limit` is a number. Its holders are in `slots`:
//!
//! ```text
//! { _id: <name>, limit: <int>, slots: [{ id: <lease id>, token: <int64|null>, at: <date>,
//!   exp: <date>, holder: {...} }], leaseId: <last writer's mark>, fencingToken, epoch,
//!   acquiredAt, expiresAt: <at least every unexpired slot's exp>, holder, ended, endedFrom }
//! ```
//!
//! Exclusive grants (which require every slot expired) and force-release set `limit: null`
//! (exclusive mode) and `slots: []`. Every write that drops a slot its holder did not release
//! (an expired slot discarded by a grant, a busy attempt or a release; a force-released one)
//! records the slot's token in `ended`, so that a retried release of a slot is told from a
//! lost one exactly as an exclusive lease's (`document::released_by_holder`).
//! In slot mode `leaseId` is never null: a grant sets it to the new slot's lease id (the change
//! stream reports a grant: observers learn of it, no acquirer is woken) and a release to
//! `{released: <lease id>}`, which the stream reports as a change it cannot describe, so one
//! waiting acquirer per process is woken (in the releasing process too, where the release
//! already woke one: at worst one spurious attempt). Each write changes `leaseId`, so each is
//! reported. `leaseId` is not an owner in slot mode: the exclusive extend, release and stamp
//! filters require `limit: null`. (On MongoDB 4.4, which reports pipeline updates as replace
//! events, a slot's extension after a release also wakes one acquirer per process: spurious
//! attempts, never a missed one.)
//!
//! # Acquire: one `findAndModify`
//! One pipeline update on `{_id: name}`: live slots = `slots` whose `exp > $$NOW` (none unless
//! in slot mode); free = no unexpired exclusive lease (not slot mode, `leaseId` set,
//! `expiresAt > $$NOW`), fewer live slots than the limit, and the document's limit equal to
//! ours unless no slot is live, and our slot's id not retired (a late attempt of a slot
//! released after an attempt of it failed: `retired.rs`). Our own earlier slot (a retry after a lost reply) does not
//! count and is replaced, so the expiry the caller trusts is counted from this request. A
//! grant pushes our slot with the next token (the epoch rules of the [module docs](super), the
//! same expressions as exclusive grants), sets `limit`, and raises `expiresAt` to at least our
//! slot's `exp`. A busy attempt only discards expired slots. The client reads its slot from
//! the reply; a limit mismatch is reported as [`Error::LimitMismatch`]. The MongoDB handoff
//! queue (`queue.rs`) is for exclusive locks; slot requests neither join nor honour it.
//!
//! # Why there are never more than `limit` holders
//! A document is updated atomically, and a grant counts the live slots by the server's `$$NOW`
//! at that update; a slot stays in `slots` until its holder releases it (or force-release
//! clears all), and counts while `exp > $$NOW`. Extension only moves the `exp` of the caller's
//! unexpired slot. So at any instant of server time, the slots with `exp` past that instant are
//! at most `limit`: when each was granted, the others live then were fewer than `limit`, and a
//! slot that ends never comes back. Exclusive grants require no live slot (their `free` test:
//! `expiresAt <= $$NOW`, and `expiresAt` is at least every live slot's `exp`), and slot grants
//! require no unexpired exclusive lease.
//!
//! # Why tokens only grow
//! A slot's token is taken exactly like an exclusive lease's: `fencingToken + 1` within the
//! document's epoch, the epoch's first token when the upsert creates the document within the
//! creation window, or else a stamp from a fresh epoch (`stamp`) — which needs our slot
//! unexpired, and, unlike an exclusive lease's, also needs the fresh epoch's range to reach
//! `fencingToken + 1`: other slots keep being granted (and stamped) while ours waits for its
//! stamp, so the token may have left that epoch behind; the stamp then takes another epoch
//! instead of moving `epoch` backwards. So every token lies in the range of the epoch
//! recorded with it, taken from the counter, and the argument of the [module docs](super)
//! carries over: the invariant
//! "`expiresAt` ≥ the `exp` of every unexpired slot" (kept by grant, extend and release) means
//! the TTL monitor deletes a document only after every slot's lease ended plus
//! `cleanup_after`, as for an exclusive lease. Every grant and stamp writes the document's
//! `fencingToken`, which both modes share, so tokens grow across slots and modes.

use std::time::{Duration, SystemTime};

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::Collection;

use super::acquire::{self, NewLifetime, EPOCH_TOKENS};
use super::document::{
    self, holder_doc, ttl_millis, LockSite, ACQUIRED_AT, ENDED, ENDED_FROM, EPOCH, EXPIRES_AT,
    HOLDER, LEASE_ID, TOKEN,
};
use super::errors::classify;
use super::retired;
use crate::backend::{AcquireRequest, Attempt, Lease, LeaseHolder, LeaseId};
use crate::error::{Error, Result};

/// The slot limit; a number exactly in slot mode.
pub(crate) const LIMIT: &str = "limit";
/// The slot holders.
pub(crate) const SLOTS: &str = "slots";

/// Scratch fields of the pipelines (removed by their last stage).
const LIVE: &str = "__mongolockLive";
const FREE: &str = "__mongolockFree";
const NEW_TOKEN: &str = "__mongolockToken";
const NEW_EPOCH: &str = "__mongolockEpoch";
const OK: &str = "__mongolockOk";
const ENDING: &str = "__mongolockEnding";

/// The tokens of the slots for which `cond` (on `$$s`) holds (an array expression).
fn slot_tokens(cond: Document) -> Document {
    doc! { "$map": {
        "input": { "$filter": { "input": { "$ifNull": ["$slots", []] }, "as": "s", "cond": cond } },
        "in": "$$this.token",
    } }
}

/// The `ended` and `endedFrom` fields after recording the tokens in the scratch field
/// [`ENDING`] as ended by someone other than their holders (`document::released_by_holder`);
/// `if_missing` is the floor when the document has none yet.
fn ended_fields(if_missing: Bson) -> Document {
    let ending = Bson::String(format!("${ENDING}"));
    doc! {
        ENDED: document::ended_after("$ended", ending.clone()),
        ENDED_FROM: document::ended_from_after("$ended", "$endedFrom", ending, if_missing),
    }
}

pub(super) fn slot_mode() -> Document {
    doc! { "$isNumber": "$limit" }
}

/// The slots whose lease has not expired by server time (none outside slot mode), except
/// `mine`: a retry after a lost reply replaces its earlier slot.
fn live_slots(mine: &str) -> Document {
    doc! { "$cond": [
        slot_mode(),
        { "$filter": {
            "input": { "$ifNull": ["$slots", []] },
            "as": "s",
            "cond": { "$and": [
                { "$gt": ["$$s.exp", "$$NOW"] },
                { "$ne": ["$$s.id", { "$literal": mine }] },
            ] },
        } },
        [],
    ] }
}

/// Whether the slot `id` exists and has not expired (and the document is in slot mode).
fn holds_unexpired(id: &str) -> Document {
    doc! { "$and": [
        slot_mode(),
        { "$anyElementTrue": [{ "$map": {
            "input": { "$ifNull": ["$slots", []] },
            "as": "s",
            "in": { "$and": [
                { "$eq": ["$$s.id", { "$literal": id }] },
                { "$gt": ["$$s.exp", "$$NOW"] },
            ] },
        } }] },
    ] }
}

/// The largest `exp` of `input` (an array expression of slots), at least `floor`.
fn latest_exp(input: Bson, floor: Bson) -> Document {
    doc! { "$reduce": {
        "input": input,
        "initialValue": floor,
        "in": { "$max": ["$$value", "$$this.exp"] },
    } }
}

/// The slot acquire pipeline (see the module docs). `new_lifetime` as for exclusive grants.
fn acquire_pipeline(
    req: &AcquireRequest,
    limit: u32,
    new_lifetime: Option<&NewLifetime>,
) -> Vec<Document> {
    let mine = req.lease_id.as_str();
    let limit = i64::from(limit);
    let exclusive_held = doc! { "$and": [
        { "$not": [slot_mode()] },
        { "$ne": [{ "$ifNull": ["$leaseId", Bson::Null] }, Bson::Null] },
        { "$gt": ["$expiresAt", "$$NOW"] },
    ] };
    let live_count = doc! { "$size": format!("${LIVE}") };
    let free = doc! { "$and": [
        // Not a late attempt of a retired lease id (`retired.rs`).
        retired::not_retired(mine),
        { "$not": [exclusive_held] },
        { "$lt": [live_count.clone(), limit] },
        { "$or": [
            { "$eq": [live_count, 0_i64] },
            { "$eq": ["$limit", limit] },
        ] },
    ] };
    let (token, epoch) = acquire::token_and_epoch(new_lifetime);
    let new_exp = doc! { "$add": ["$$NOW", ttl_millis(req.ttl)] };
    let slot = doc! {
        "id": { "$literal": mine },
        "token": format!("${NEW_TOKEN}"),
        "at": "$$NOW",
        "exp": new_exp.clone(),
        "holder": { "$literal": holder_doc(&req.holder) },
    };
    let grant = doc! {
        LIMIT: { "$literal": limit },
        SLOTS: { "$concatArrays": [format!("${LIVE}"), [slot]] },
        LEASE_ID: { "$literal": mine },
        TOKEN: { "$ifNull": [format!("${NEW_TOKEN}"), "$fencingToken"] },
        EPOCH: format!("${NEW_EPOCH}"),
        ACQUIRED_AT: "$$NOW",
        EXPIRES_AT: latest_exp(Bson::String(format!("${LIVE}")), Bson::Document(new_exp)),
        HOLDER: { "$literal": holder_doc(&req.holder) },
    };
    // The leases this attempt ends unreleased, if it writes: the slots it discards (expired,
    // and our own earlier one), or, outside slot mode, the exclusive lease a grant takes over.
    let ending = doc! { "$cond": [
        slot_mode(),
        slot_tokens(doc! { "$or": [
            { "$lte": ["$$s.exp", "$$NOW"] },
            { "$eq": ["$$s.id", { "$literal": mine }] },
        ] }),
        acquire::ended_by_grant(None),
    ] };
    vec![
        doc! { "$set": { LIVE: live_slots(mine), ENDING: ending } },
        doc! { "$set": { FREE: free, NEW_TOKEN: token, NEW_EPOCH: epoch } },
        doc! { "$replaceWith": { "$cond": [
            format!("${FREE}"),
            { "$mergeObjects": [
                "$$ROOT",
                grant,
                ended_fields(Bson::String(format!("${NEW_TOKEN}"))),
            ] },
            { "$cond": [
                slot_mode(),
                { "$mergeObjects": [
                    "$$ROOT",
                    { SLOTS: format!("${LIVE}") },
                    ended_fields(Bson::String("$$REMOVE".into())),
                ] },
                "$$ROOT",
            ] },
        ] } },
        doc! { "$unset": [LIVE, FREE, NEW_TOKEN, NEW_EPOCH, ENDING] },
    ]
}

fn reply_fields() -> Document {
    doc! { LEASE_ID: 1, EXPIRES_AT: 1, LIMIT: 1, SLOTS: 1 }
}

/// The slot `id` of a reply, if present.
fn find_slot<'a>(d: &'a Document, id: &str) -> Option<&'a Document> {
    d.get_array(SLOTS)
        .ok()?
        .iter()
        .filter_map(Bson::as_document)
        .find(|s| s.get_str("id") == Ok(id))
}

fn limit_of(d: &Document) -> Option<i64> {
    match d.get(LIMIT) {
        Some(Bson::Int32(l)) => Some(i64::from(*l)),
        Some(Bson::Int64(l)) => Some(*l),
        Some(Bson::Double(l)) => Some(*l as i64),
        _ => None,
    }
}

/// The lease of the slot `s`, when its token was issued.
fn slot_lease(s: &Document, name: &str) -> Result<Option<Lease>> {
    let Some(token) = document::token(&token_doc(s), LockSite::Named, name)? else {
        return Ok(None);
    };
    Ok(Some(Lease {
        fencing_token: token,
        acquired_at: document::require_date(s, "at", LockSite::Named, name)?,
        expires_at: document::require_date(s, "exp", LockSite::Named, name)?,
    }))
}

/// Every current holder recorded in the lock document `d` read at server time `observed_at`:
/// each unexpired slot whose token was issued, in grant order, in slot mode; else the holder
/// of the unexpired exclusive lease.
pub(super) fn holders(
    d: &Document,
    observed_at: SystemTime,
    name: &str,
) -> Result<Vec<LeaseHolder>> {
    if limit_of(d).is_none() {
        let info = document::lock_state(d, observed_at, LockSite::Named, name.to_owned())?;
        return Ok(LeaseHolder::from_info(&info).into_iter().collect());
    }
    let mut all = Vec::new();
    for s in d
        .get_array(SLOTS)
        .map(|a| a.iter().filter_map(Bson::as_document).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let (Ok(id), Some(lease)) = (s.get_str("id"), slot_lease(s, name)?) else {
            continue;
        };
        if lease.expires_at > observed_at {
            all.push(LeaseHolder {
                lease_id: LeaseId::from_string(id),
                fencing_token: lease.fencing_token,
                acquired_at: lease.acquired_at,
                expires_at: lease.expires_at,
                holder: document::holder(s),
            });
        }
    }
    all.sort_by_key(|h| h.fencing_token);
    Ok(all)
}

/// The slot's token under the field name [`document::token`] reads.
fn token_doc(s: &Document) -> Document {
    let mut d = Document::new();
    if let Some(t) = s.get("token") {
        d.insert(TOKEN, t.clone());
    }
    d
}

/// One slot acquisition attempt.
pub(super) async fn try_acquire(
    coll: &Collection<Document>,
    req: &AcquireRequest,
    limit: u32,
    cleanup_after: Duration,
) -> Result<Attempt> {
    let filter = doc! { "_id": req.name.as_str() };
    let existing = coll
        .find_one_and_update(filter.clone(), acquire_pipeline(req, limit, None))
        .return_document(ReturnDocument::After)
        .projection(reply_fields())
        .await
        .map_err(|e| classify(e, "semaphore acquire (findAndModify)"))?;
    let doc = match existing {
        Some(doc) => doc,
        None => {
            let new_lifetime = match acquire::creation_window(cleanup_after) {
                Some(window) => Some(acquire::take_epoch(coll, &req.name, window).await?),
                None => None,
            };
            acquire::upsert_with(
                coll,
                &filter,
                acquire_pipeline(req, limit, new_lifetime.as_ref()),
                reply_fields(),
            )
            .await?
        }
    };
    outcome(coll, req, limit, &doc).await
}

async fn outcome(
    coll: &Collection<Document>,
    req: &AcquireRequest,
    limit: u32,
    doc: &Document,
) -> Result<Attempt> {
    let mine = req.lease_id.as_str();
    let Some(held_limit) = limit_of(doc) else {
        // An exclusive lease holds the name.
        return Ok(Attempt::Busy {
            holder_expires_at: document::date(doc, EXPIRES_AT),
        });
    };
    // In slot mode the reply holds only unexpired slots (the attempt discarded the others, and
    // our earlier one): ours is there only if this attempt granted it.
    if let Some(slot) = find_slot(doc, mine) {
        return match slot_lease(slot, &req.name)? {
            Some(lease) => Ok(Attempt::Acquired(lease)),
            None => stamp(coll, req).await,
        };
    }
    let exps: Vec<SystemTime> = doc
        .get_array(SLOTS)
        .map(|a| {
            a.iter()
                .filter_map(Bson::as_document)
                .filter_map(|s| document::date(s, "exp"))
                .collect()
        })
        .unwrap_or_default();
    if !exps.is_empty() && held_limit != i64::from(limit) {
        return Err(Error::LimitMismatch {
            name: req.name.clone(),
            requested: limit,
            held: u32::try_from(held_limit).unwrap_or(0),
        });
    }
    Ok(Attempt::Busy {
        holder_expires_at: exps.into_iter().min(),
    })
}

/// How many fresh epochs a slot's stamp takes before it gives up (see [`stamp`]).
const STAMP_TRIES: usize = 8;

/// Aggregation expression: the token a stamp with `epoch` gives, or null when `epoch`'s range
/// ends below the document's `fencingToken + 1` (the stamping rule of [`stamp`]).
fn stamped_token(epoch: i64) -> Document {
    let next = doc! { "$add": [{ "$ifNull": ["$fencingToken", 0_i64] }, 1_i64] };
    doc! { "$cond": [
        { "$lte": [next.clone(), epoch * EPOCH_TOKENS] },
        { "$max": [next, (epoch - 1) * EPOCH_TOKENS + 1] },
        Bson::Null,
    ] }
}

/// A slot granted without a token: take a new epoch `e`, then stamp our (unexpired) slot and
/// the document with `max(fencingToken + 1, (e - 1) · 2²⁰ + 1)` and `epoch: e` — only when
/// `fencingToken + 1 <= e · 2²⁰`, i.e. the new token lies in `e`'s range. Otherwise the stamp
/// writes nothing and we take another epoch.
///
/// Why the condition: other slots are granted and stamped while ours waits for its stamp, so
/// the document's token may have passed the end of `e`'s range by then (2²⁰ grants within one
/// slot lease, or a later epoch's stamp). Stamping with `e` anyway would move `epoch`
/// backwards and, worse, issue a token above every epoch taken from the counter (`e · 2²⁰ +
/// 1` when the token was exactly at the end of the range): a later lifetime of the name,
/// whose first epoch is the next one, could then issue the same token again. With the
/// condition, every token lies in the range of the epoch recorded with it, which was taken
/// from the counter — what the cross-lifetime argument of the [module docs](super) needs.
/// A fresh epoch taken after we saw the token too high starts above it (the counter is at
/// least every epoch whose range holds a token), so one more try normally suffices.
async fn stamp(coll: &Collection<Document>, req: &AcquireRequest) -> Result<Attempt> {
    let mine = req.lease_id.as_str();
    for _ in 0..STAMP_TRIES {
        let NewLifetime { epoch, .. } =
            acquire::take_epoch(coll, &req.name, Duration::ZERO).await?;
        let stamped = coll
            .find_one_and_update(
                doc! {
                    "_id": req.name.as_str(),
                    "slots.id": mine,
                    "$expr": holds_unexpired(mine),
                },
                vec![
                    doc! { "$set": { NEW_TOKEN: stamped_token(epoch) } },
                    doc! { "$set": {
                        TOKEN: { "$ifNull": [format!("${NEW_TOKEN}"), "$fencingToken"] },
                        EPOCH: { "$cond": [
                            { "$eq": [format!("${NEW_TOKEN}"), Bson::Null] },
                            "$epoch",
                            { "$literal": epoch },
                        ] },
                        // The lifetime's first token, when it is.
                        ENDED_FROM: { "$ifNull": ["$endedFrom", format!("${NEW_TOKEN}")] },
                        SLOTS: { "$map": {
                            "input": "$slots",
                            "as": "s",
                            "in": { "$cond": [
                                { "$eq": ["$$s.id", { "$literal": mine }] },
                                { "$mergeObjects": [
                                    "$$s",
                                    { "token": format!("${NEW_TOKEN}") },
                                ] },
                                "$$s",
                            ] },
                        } },
                    } },
                    doc! { "$unset": [NEW_TOKEN] },
                ],
            )
            .return_document(ReturnDocument::After)
            .projection(reply_fields())
            .await
            .map_err(|e| classify(e, "semaphore acquire (stamp fencing token)"))?;
        let Some(slot) = stamped.as_ref().and_then(|d| find_slot(d, mine)) else {
            // Our slot expired (or was force-released) before it was stamped: it never counted.
            return Ok(Attempt::Busy {
                holder_expires_at: None,
            });
        };
        if let Some(lease) = slot_lease(slot, &req.name)? {
            return Ok(Attempt::Acquired(lease));
        }
        // The token passed the end of this epoch's range meanwhile: take a fresh epoch.
    }
    // Only when other processes take epochs of this counter faster than we can stamp.
    Err(Error::unavailable(format!(
        "the fencing token of a slot of semaphore {:?} could not be stamped: {STAMP_TRIES} \
         fresh fencing epochs in a row were already behind its token; retry",
        req.name
    )))
}

/// Sets our unexpired slot's `exp` to server now + `ttl` (and `expiresAt` to at least that).
/// `None`: the slot is gone or expired.
pub(super) async fn extend(
    coll: &Collection<Document>,
    name: &str,
    lease_id: &LeaseId,
    ttl: Duration,
) -> Result<Option<SystemTime>> {
    let mine = lease_id.as_str();
    let new_exp = doc! { "$add": ["$$NOW", ttl_millis(ttl)] };
    let doc = coll
        .find_one_and_update(
            doc! { "_id": name, "slots.id": mine, "$expr": holds_unexpired(mine) },
            vec![
                doc! { "$set": { OK: new_exp } },
                doc! { "$set": {
                    SLOTS: { "$map": {
                        "input": "$slots",
                        "as": "s",
                        "in": { "$cond": [
                            { "$eq": ["$$s.id", { "$literal": mine }] },
                            { "$mergeObjects": ["$$s", { "exp": format!("${OK}") }] },
                            "$$s",
                        ] },
                    } },
                    EXPIRES_AT: { "$max": ["$expiresAt", format!("${OK}")] },
                } },
                doc! { "$unset": [OK] },
            ],
        )
        .return_document(ReturnDocument::After)
        .projection(doc! { SLOTS: 1 })
        .await
        .map_err(|e| classify(e, "semaphore extend (findAndModify)"))?;
    match doc.as_ref().and_then(|d| find_slot(d, mine)) {
        None => Ok(None),
        Some(s) => Ok(Some(document::require_date(
            s,
            "exp",
            LockSite::Named,
            name,
        )?)),
    }
}

/// Ends our slot: removes it (and expired ones, whose tokens go to `ended`), lowers
/// `expiresAt` to the latest remaining slot's `exp` (or now), and sets `leaseId` to
/// `{released: <id>}` so that the change stream reports the release. `Ok(true)` also for a
/// retry of our own earlier release (told by the slot's token `token`, when known:
/// `document::released_by_holder`); `Ok(false)` when the slot was not ours (any more).
pub(super) async fn release(
    coll: &Collection<Document>,
    reads: &Collection<Document>,
    name: &str,
    lease_id: &LeaseId,
    token: Option<u64>,
) -> Result<bool> {
    let mine = lease_id.as_str();
    let rest = doc! { "$filter": {
        "input": "$slots",
        "as": "s",
        "cond": { "$and": [
            { "$ne": ["$$s.id", { "$literal": mine }] },
            { "$gt": ["$$s.exp", "$$NOW"] },
        ] },
    } };
    let doc = coll
        .find_one_and_update(
            doc! { "_id": name, "slots.id": mine, "$expr": slot_mode() },
            vec![
                doc! { "$set": {
                    OK: rest,
                    // Expired slots of others, discarded unreleased.
                    ENDING: slot_tokens(doc! { "$and": [
                        { "$ne": ["$$s.id", { "$literal": mine }] },
                        { "$lte": ["$$s.exp", "$$NOW"] },
                    ] }),
                } },
                doc! { "$set": {
                    SLOTS: format!("${OK}"),
                    LEASE_ID: { "$literal": { "released": mine } },
                    EXPIRES_AT: { "$cond": [
                        { "$gt": [{ "$size": format!("${OK}") }, 0_i64] },
                        latest_exp(Bson::String(format!("${OK}")), Bson::Null),
                        { "$min": ["$expiresAt", "$$NOW"] },
                    ] },
                } },
                doc! { "$set": ended_fields(Bson::String("$$REMOVE".into())) },
                doc! { "$unset": [OK, ENDING] },
            ],
        )
        .projection(doc! { "_id": 1 })
        .await
        .map_err(|e| classify(e, "semaphore release (findAndModify)"))?;
    if doc.is_some() {
        return Ok(true);
    }
    super::ops::released_before(reads, name, token, "semaphore release (find)").await
}

/// Whether `lease_id` still has a slot of `name` (expired or not): the check a slot holder
/// makes after a change of its name. A failed read counts as held (the next extension decides).
pub(super) async fn still_holds(
    reads: &Collection<Document>,
    name: &str,
    lease_id: &LeaseId,
) -> bool {
    match reads
        .find_one(doc! { "_id": name, "slots.id": lease_id.as_str(), "$expr": slot_mode() })
        .projection(doc! { "_id": 1 })
        .await
    {
        Ok(found) => found.is_some(),
        Err(_) => true,
    }
}

/// Ends the unexpired slot whose token is `token`, and no other (an operator's conditional
/// force-release): one update whose filter requires slot mode and that slot unexpired by
/// `$$NOW`. Like a release, it removes the slot (and expired ones), lowers `expiresAt` to the
/// latest remaining slot's `exp` (or now), and sets `leaseId` to `{released: <unique string>}`
/// so that the change stream of every backend reports it (the string is in no backend's
/// lease-id range); unlike a release it records the slot's token in `ended`, so the holder's
/// own release reports the loss. Returns whether a slot was ended.
pub(super) async fn force_release_token(
    coll: &Collection<Document>,
    name: &str,
    token: u64,
) -> Result<bool> {
    let Ok(token) = i64::try_from(token) else {
        return Ok(false);
    };
    let forced = format!("force-release-{}", LeaseId::random().as_str());
    let it = doc! { "$and": [
        { "$eq": ["$$s.token", token] },
        { "$gt": ["$$s.exp", "$$NOW"] },
    ] };
    let rest = doc! { "$filter": {
        "input": "$slots",
        "as": "s",
        "cond": { "$and": [
            { "$ne": ["$$s.token", token] },
            { "$gt": ["$$s.exp", "$$NOW"] },
        ] },
    } };
    let r = coll
        .update_one(
            doc! { "_id": name, "$expr": { "$and": [
                slot_mode(),
                { "$anyElementTrue": [{ "$map": {
                    "input": { "$ifNull": ["$slots", []] },
                    "as": "s",
                    "in": it,
                } }] },
            ] } },
            vec![
                doc! { "$set": {
                    OK: rest,
                    // The forced slot and the expired ones, ended unreleased.
                    ENDING: slot_tokens(doc! { "$or": [
                        { "$eq": ["$$s.token", token] },
                        { "$lte": ["$$s.exp", "$$NOW"] },
                    ] }),
                } },
                doc! { "$set": {
                    SLOTS: format!("${OK}"),
                    LEASE_ID: { "$literal": { "released": forced.as_str() } },
                    EXPIRES_AT: { "$cond": [
                        { "$gt": [{ "$size": format!("${OK}") }, 0_i64] },
                        latest_exp(Bson::String(format!("${OK}")), Bson::Null),
                        { "$min": ["$expiresAt", "$$NOW"] },
                    ] },
                } },
                doc! { "$set": ended_fields(Bson::String("$$REMOVE".into())) },
                doc! { "$unset": [OK, ENDING] },
            ],
        )
        .await
        .map_err(|e| classify(e, "semaphore force release (update)"))?;
    Ok(r.matched_count == 1)
}

/// The limit of the lock document `d` read at server time `observed_at`: `Some` in slot mode
/// while a slot is unexpired.
pub(super) fn live_limit(d: &Document, observed_at: SystemTime) -> Option<u32> {
    let limit = limit_of(d)?;
    let live = d.get_array(SLOTS).ok()?.iter().any(|s| {
        s.as_document()
            .and_then(|s| document::date(s, "exp"))
            .is_some_and(|exp| exp > observed_at)
    });
    live.then(|| u32::try_from(limit).ok()).flatten()
}
