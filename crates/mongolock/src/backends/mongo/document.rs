//! Field names of a lock-shaped document and conversions from BSON: shared by the named locks
//! (one document per lock in the lock collection) and by [`documents`](crate::documents) (the
//! lock sub-document embedded in a user's document), whose lock fields have the same shape:
//!
//! ```text
//! { leaseId: <string|null>, fencingToken: <int64>, acquiredAt: <date>, expiresAt: <date>,
//!   holder: { host: <string>, pid: <int64>, app: <string|null> } }
//! ```

use std::time::{Duration, SystemTime};

use mongodb::bson::{doc, Bson, DateTime, Document};

use crate::backend::{Lease, LeaseId, LockInfo};
use crate::error::{Error, Result};
use crate::holder::HolderInfo;

pub(crate) const LEASE_ID: &str = "leaseId";
pub(crate) const TOKEN: &str = "fencingToken";
/// The fencing epoch whose token range the current token belongs to (named locks only; null
/// while a grant waits for its token to be stamped). See the backend's module docs.
pub(crate) const EPOCH: &str = "epoch";
pub(crate) const ACQUIRED_AT: &str = "acquiredAt";
pub(crate) const EXPIRES_AT: &str = "expiresAt";
pub(crate) const HOLDER: &str = "holder";
/// The fencing tokens of leases that someone other than their holder ended: taken over after
/// they expired unreleased, or force-released (the last [`ENDED_KEPT`], in the order they
/// were ended). See [`released_by_holder`].
pub(crate) const ENDED: &str = "ended";
/// The floor of [`ENDED`]: every lease of the document's current lifetime with a token at or
/// above it that someone else ended is listed there. Set to the first token issued after the
/// document was created (or after it lacked one), raised when entries leave the list.
pub(crate) const ENDED_FROM: &str = "endedFrom";
/// How many tokens [`ENDED`] keeps. Leases end that way only after a crash, a stall past
/// expiry or an operator's force-release, so the list is usually empty.
pub(crate) const ENDED_KEPT: i64 = 64;
/// The lease id of the last release (a scalar, so that a change stream's `$match` can tell
/// whose release an event reports; see `watch.rs`).
pub(crate) const LAST_RELEASED: &str = "lastReleased";
/// Added by inspection reads: the server time of the read. Never stored.
pub(crate) const OBSERVED_AT: &str = "__mongolockObservedAt";

/// Where a lock-shaped document lives, for error messages about documents mongolock did not
/// write. Together with the lock's name (or the user document's id) it names the document.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LockSite<'a> {
    /// A named lock's own document in the lock collection.
    Named,
    /// The lock sub-document under this field of a user's document.
    Embedded(&'a str),
}

impl LockSite<'_> {
    /// The error for the lock document of `id` (the lock's name, or the user document's id) that
    /// has `what`.
    pub(crate) fn bad(self, id: &str, what: &str) -> Error {
        match self {
            LockSite::Named => Error::backend(
                format!("lock document {id:?} has {what}"),
                "the lock collection holds documents that mongolock did not write; use a \
                 dedicated collection for locks",
            ),
            LockSite::Embedded(field) => Error::backend(
                format!("the lock field `{field}` of document {id} has {what}"),
                format!(
                    "the documents use `{field}` for something else; choose another lock field \
                     with provider.documents(..).field(..)"
                ),
            ),
        }
    }
}

/// A lease duration in whole milliseconds (rounded up, so a lease is never shorter than asked).
pub(crate) fn ttl_millis(ttl: Duration) -> i64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// An idempotent release of `lease_id` for lock fields under `prefix` (`""` for a named lock's
/// document, `"<field>."` for a lock embedded in a user's document): the filter to add to the
/// document's `_id` and the update pipeline.
///
/// The filter matches the document only while `leaseId` is ours, so the pipeline is
/// unconditional: `leaseId: null`, `expiresAt: min(expiresAt, $$NOW)`, the fencing token kept;
/// our lease id recorded in [`LAST_RELEASED`]. A release writes nothing that grows with the
/// lock's traffic.
///
/// When it matches nothing, the lease is not ours any more: either someone else ended it
/// (expiry and takeover, force-release), or this is a retry of a release whose first try was
/// applied but whose reply was lost. [`released_by_holder`] tells them apart by the lease's
/// fencing token.
///
/// With `queue` (named locks, whose `prefix` is empty: `Some(reserve)`), the release also pops
/// the first waiting process of the lock's queue into `next`, and with `reserve` reserves the
/// lock for it (see `queue.rs`); the update is then one `$replaceWith` merging the lease fields
/// and the queue's into the document.
pub(crate) fn release_update(
    prefix: &str,
    lease_id: &str,
    queue: Option<bool>,
) -> (Document, Vec<Document>) {
    let lease_path = format!("{prefix}{LEASE_ID}");
    let expires_path = format!("{prefix}{EXPIRES_AT}");
    let last_released_path = format!("{prefix}{LAST_RELEASED}");
    let ours = doc! { "$literal": lease_id };
    let filter = doc! { lease_path.as_str(): lease_id };
    let set = doc! {
        lease_path.as_str(): Bson::Null,
        expires_path.as_str(): { "$min": [format!("${expires_path}"), "$$NOW"] },
        last_released_path.as_str(): ours,
    };
    match queue {
        // Named locks (no prefix): the queue's fields are computed together (`queue::pop`).
        Some(reserve) => (
            filter,
            vec![doc! { "$replaceWith": { "$mergeObjects": [
                "$$ROOT",
                set,
                super::queue::pop(lease_id, reserve),
            ] } }],
        ),
        None => (filter, vec![doc! { "$set": set }]),
    }
}

/// The filter (to add to the document's `_id`, if known) that finds a lock whose lease with
/// fencing token `token` was ended by its own holder: the check after a [`release_update`]
/// that matched nothing (the lease is not current any more).
///
/// Why it is exact, in the safe direction. A lease of the document's current lifetime ends in
/// one of three ways: its holder's release, a takeover after it expired unreleased (a grant
/// to someone else), or a force-release. Every takeover and force-release appends the ended
/// lease's token to [`ENDED`] in the same write that ends it (grants of every kind, slot
/// grants and slot releases that discard expired slots, force-releases by name or token;
/// never for a lease its holder released with a minimum hold, whose id is `lastReleased`),
/// and the list loses entries only together with raising [`ENDED_FROM`] above them. So when
/// `endedFrom <= token <= fencingToken` (the token belongs to this lifetime: a later lifetime
/// starts its floor above every earlier token) and `token` is not in `ended`, the lease was
/// ended by its holder. Otherwise the retry reports the loss: correctly, or spuriously when
/// the token fell below the floor (more than [`ENDED_KEPT`] leases ended by others since) or
/// the document was deleted by TTL cleanup meanwhile.
pub(crate) fn released_by_holder(prefix: &str, token: u64) -> Document {
    let token = i64::try_from(token).unwrap_or(i64::MAX);
    doc! {
        format!("{prefix}{ENDED_FROM}"): { "$lte": token },
        format!("{prefix}{TOKEN}"): { "$gte": token },
        format!("{prefix}{ENDED}"): { "$ne": token },
    }
}

/// Aggregation expression: the tokens of `tokens` (an array expression; nulls, tokens never
/// issued, are left out) appended to the ended list at `path` (`$`-prefixed field path), the
/// last [`ENDED_KEPT`] kept.
pub(crate) fn ended_after(path: &str, tokens: Bson) -> Document {
    doc! { "$slice": [all_ended(path, tokens), -ENDED_KEPT] }
}

/// Aggregation expression: the floor at `from_path` after appending `tokens` to the list at
/// `path` (both `$`-prefixed): raised above every token that leaves the list, and
/// `if_missing` when the document has no floor yet (`$$REMOVE` to leave it unset).
pub(crate) fn ended_from_after(
    path: &str,
    from_path: &str,
    tokens: Bson,
    if_missing: Bson,
) -> Document {
    let all = all_ended(path, tokens);
    let dropped = doc! { "$slice": [
        "$$all",
        0,
        { "$max": [1_i64, { "$subtract": [{ "$size": "$$all" }, ENDED_KEPT] }] },
    ] };
    doc! { "$let": {
        "vars": { "all": all },
        "in": { "$cond": [
            { "$and": [
                { "$gt": [{ "$size": "$$all" }, ENDED_KEPT] },
                { "$isNumber": from_path },
            ] },
            { "$reduce": {
                "input": dropped,
                "initialValue": from_path,
                "in": { "$max": ["$$value", { "$add": ["$$this", 1_i64] }] },
            } },
            { "$ifNull": [from_path, if_missing] },
        ] },
    } }
}

fn all_ended(path: &str, tokens: Bson) -> Document {
    doc! { "$concatArrays": [
        { "$ifNull": [path, []] },
        { "$filter": { "input": tokens, "cond": { "$isNumber": "$$this" } } },
    ] }
}

pub(crate) fn holder_doc(h: &HolderInfo) -> Document {
    doc! {
        "host": h.host.as_str(),
        "pid": i64::from(h.pid),
        "app": h.app_name.as_deref().map_or(Bson::Null, |a| Bson::String(a.to_owned())),
    }
}

pub(crate) fn lease_id(d: &Document) -> Option<&str> {
    d.get_str(LEASE_ID).ok()
}

pub(crate) fn date(d: &Document, field: &str) -> Option<SystemTime> {
    d.get_datetime(field)
        .ok()
        .map(|t: &DateTime| t.to_system_time())
}

/// The fencing token; `Ok(None)` when none was stamped yet (null or missing).
pub(crate) fn token(d: &Document, site: LockSite<'_>, id: &str) -> Result<Option<u64>> {
    match d.get(TOKEN) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int64(t)) if *t >= 0 => Ok(Some(*t as u64)),
        Some(Bson::Int32(t)) if *t >= 0 => Ok(Some(*t as u64)),
        Some(Bson::Double(t)) if *t >= 0.0 && t.fract() == 0.0 && *t < 9.0e15 => {
            Ok(Some(*t as u64))
        }
        Some(other) => Err(site.bad(id, &format!("a fencingToken of {other}"))),
    }
}

pub(crate) fn require_date(
    d: &Document,
    field: &str,
    site: LockSite<'_>,
    id: &str,
) -> Result<SystemTime> {
    date(d, field).ok_or_else(|| site.bad(id, &format!("no date in `{field}`")))
}

/// The lease recorded in `d` with the fencing token `fencing_token` (read by the caller).
pub(crate) fn lease(
    d: &Document,
    fencing_token: u64,
    site: LockSite<'_>,
    id: &str,
) -> Result<Lease> {
    Ok(Lease {
        fencing_token,
        acquired_at: require_date(d, ACQUIRED_AT, site, id)?,
        expires_at: require_date(d, EXPIRES_AT, site, id)?,
    })
}

/// The holder metadata in `d`'s `holder` field (a lock document, or one semaphore slot).
pub(crate) fn holder(d: &Document) -> Option<HolderInfo> {
    let h = d.get_document(HOLDER).ok()?;
    let pid = match h.get("pid") {
        Some(Bson::Int64(p)) => u32::try_from(*p).unwrap_or(0),
        Some(Bson::Int32(p)) => u32::try_from(*p).unwrap_or(0),
        _ => 0,
    };
    Some(HolderInfo {
        host: h.get_str("host").unwrap_or("unknown").to_owned(),
        pid,
        app_name: h.get_str("app").ok().map(str::to_owned),
    })
}

/// The state of the lock-shaped document `d` as seen at server time `observed_at`, reported
/// under `name` (which also names the document in errors).
pub(crate) fn lock_state(
    d: &Document,
    observed_at: SystemTime,
    site: LockSite<'_>,
    name: String,
) -> Result<LockInfo> {
    let expires_at = date(d, EXPIRES_AT);
    let lease = lease_id(d).map(LeaseId::from_string);
    // A semaphore's document (a number in `limit`; `slots.rs`) is held while a slot is: its
    // `expiresAt` is at least every unexpired slot's expiry.
    let slot_mode = matches!(
        d.get("limit"),
        Some(Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))
    );
    // A grant that waits for its token (named locks: `epoch: null` next to a lease id, `mod.rs`)
    // still shows the previous lease's token: that one is not the new holder's.
    let stamping = matches!(d.get(EPOCH), Some(Bson::Null)) && lease_id(d).is_some();
    Ok(LockInfo {
        held: (lease.is_some() || slot_mode) && expires_at.is_some_and(|e| e > observed_at),
        lease_id: lease,
        fencing_token: if stamping {
            None
        } else {
            token(d, site, &name)?
        },
        holder: holder(d),
        acquired_at: date(d, ACQUIRED_AT),
        expires_at,
        observed_at,
        name,
    })
}

/// Converts a named lock's document read together with the server time (`OBSERVED_AT`).
pub(super) fn lock_info(d: &Document) -> Result<LockInfo> {
    let name = d
        .get_str("_id")
        .map_err(|_| LockSite::Named.bad("?", "a non-string _id"))?
        .to_owned();
    let observed_at = require_date(d, OBSERVED_AT, LockSite::Named, &name)?;
    lock_state(d, observed_at, LockSite::Named, name)
}
