//! Single attempts, one `findAndModify` each: lock one document by `_id`, or claim any one
//! unlocked (or expired) document matching a filter. Neither ever upserts.

use std::time::{Duration, SystemTime};

use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::options::ReturnDocument;

use super::state::{
    self, holder_doc, ttl_millis, ACQUIRED_AT, ENDED, ENDED_FROM, EXPIRES_AT, HOLDER,
    LAST_RELEASED, LEASE_ID, SINCE, TOKEN,
};
use super::{classify, Inner};
use crate::backend::{Lease, LeaseId};
use crate::backends::mongo::document::{ended_after, ended_from_after};
use crate::error::{Error, Result};

/// What an acquisition call locks.
#[derive(Clone, Debug)]
pub(super) enum Target {
    /// The document with this `_id`.
    Id(Bson),
    /// Any one unlocked (or expired) document matching `filter`, the first in `sort` order.
    Claim {
        filter: Document,
        sort: Option<Document>,
    },
}

/// A granted lease: the document as stored after the grant, its `_id` and the lease.
pub(super) struct Granted {
    pub(super) doc: Document,
    pub(super) id: Bson,
    pub(super) lease: Lease,
}

/// The outcome of one attempt.
pub(super) enum Attempted {
    /// The lease was granted.
    Acquired(Box<Granted>),
    /// By id: another lease holds the document. Claim: no matching document is free.
    Busy,
    /// By id: no document has this `_id` (nothing was written).
    NotFound,
}

/// The new lock sub-document, as an aggregation expression evaluated by the server: the token is
/// the previous one plus one (1 for a document never locked), the dates are server time, and
/// the record of leases ended by others is kept, with the lease this grant takes over added
/// when its holder did not release it (an expired lease that is neither ours, a retry after a
/// lost reply, nor released with a minimum hold: its id in `lastReleased`), and the time
/// this lifetime of the sub-document began (`since`). So a release retried after a lost reply
/// tells its own earlier try from a loss after later grants too (`control.rs`,
/// `document::released_by_holder`).
fn new_lock(field: &str, lease_id: &LeaseId, ttl: Duration, inner: &Inner) -> Document {
    let old = |f: &str| format!("${field}.{f}");
    let token = doc! { "$add": [{ "$ifNull": [old(TOKEN), 0_i64] }, 1_i64] };
    let taken_over = doc! { "$and": [
        { "$eq": [{ "$type": old(LEASE_ID) }, "string"] },
        { "$ne": [old(LEASE_ID), { "$literal": lease_id.as_str() }] },
        { "$ne": [old(LEASE_ID), { "$ifNull": [old(LAST_RELEASED), Bson::Null] }] },
        { "$isNumber": old(TOKEN) },
    ] };
    let ending = Bson::Document(doc! { "$cond": [taken_over, [old(TOKEN)], []] });
    doc! {
        LEASE_ID: { "$literal": lease_id.as_str() },
        TOKEN: token.clone(),
        ACQUIRED_AT: "$$NOW",
        EXPIRES_AT: { "$add": ["$$NOW", ttl_millis(ttl)] },
        HOLDER: { "$literal": holder_doc(&inner.holder) },
        ENDED: { "$ifNull": [ended_after(&old(ENDED), ending.clone()), "$$REMOVE"] },
        ENDED_FROM: ended_from_after(&old(ENDED), &old(ENDED_FROM), ending, token.into()),
        SINCE: { "$ifNull": [old(SINCE), "$$NOW"] },
    }
}

/// Aggregation expression: the document's lock is free for `lease_id` (no lease, an expired
/// lease by server time, or already ours after a retry whose reply was lost).
fn free_expr(field: &str, lease_id: &LeaseId) -> Document {
    let lease = format!("${field}.{LEASE_ID}");
    doc! {
        "$or": [
            { "$eq": [{ "$ifNull": [lease.as_str(), Bson::Null] }, Bson::Null] },
            { "$lte": [format!("${field}.{EXPIRES_AT}"), "$$NOW"] },
            { "$eq": [lease.as_str(), { "$literal": lease_id.as_str() }] },
        ]
    }
}

/// How far the claim query's index condition on `expiresAt` reaches past the client's clock
/// (see [`free_query`]).
pub(super) const CLAIM_CLOCK_SLACK: Duration = Duration::from_secs(5);

/// Query: the document's lock is free for `lease_id`. `$expr` is allowed here because these
/// queries never upsert.
///
/// Every clause can use an index on `<field>.leaseId` or `<field>.expiresAt`: the expired-lease
/// clause pairs the exact test (`$expr`, server time, which no index serves) with the plain
/// range `expiresAt <= client now + CLAIM_CLOCK_SLACK`, which an index serves and which holds
/// for every expired lease as long as the client's clock is less than the slack behind the
/// server's. So a claim reads the free documents and the leases expiring within the slack, not
/// every locked document. A client clock further behind finds expired leases later (by the
/// difference); it never takes an unexpired one, because the server's clock decides.
fn free_query(field: &str, lease_id: &LeaseId) -> Document {
    let expires = format!("{field}.{EXPIRES_AT}");
    let horizon = DateTime::from_system_time(SystemTime::now() + CLAIM_CLOCK_SLACK);
    doc! {
        "$or": [
            { format!("{field}.{LEASE_ID}"): Bson::Null },
            { format!("{field}.{LEASE_ID}"): lease_id.as_str() },
            {
                expires.as_str(): { "$lte": horizon },
                "$expr": { "$lte": [format!("${expires}"), "$$NOW"] },
            },
        ]
    }
}

/// A readable name for the lease of document `id` (used in logs and by the guard).
pub(super) fn lease_name(inner: &Inner, id: &Bson) -> String {
    format!("{}:{id}", inner.coll.name())
}

/// One attempt on `target` for `lease_id`.
pub(super) async fn attempt(
    inner: &Inner,
    target: &Target,
    lease_id: &LeaseId,
    ttl: Duration,
) -> Result<Attempted> {
    let field = inner.field.as_str();
    let result = match target {
        Target::Id(id) => {
            // Filter on `_id` only, so that a busy document and a missing one can be told apart
            // in one round trip: the pipeline keeps the current lock when it is not free (a
            // no-op write), and the client compares the returned lease id with its own.
            inner
                .coll
                .find_one_and_update(
                    doc! { "_id": id.clone() },
                    vec![doc! {
                        "$set": {
                            field: { "$cond": [
                                free_expr(field, lease_id),
                                new_lock(field, lease_id, ttl, inner),
                                format!("${field}"),
                            ] }
                        }
                    }],
                )
                .upsert(false)
                .return_document(ReturnDocument::After)
                .await
        }
        Target::Claim { filter, sort } => {
            let mut action = inner
                .coll
                .find_one_and_update(
                    doc! { "$and": [filter.clone(), free_query(field, lease_id)] },
                    vec![doc! { "$set": { field: new_lock(field, lease_id, ttl, inner) } }],
                )
                .upsert(false)
                .return_document(ReturnDocument::After);
            if let Some(sort) = sort {
                action = action.sort(sort.clone());
            }
            action.await
        }
    };
    let op = match target {
        Target::Id(_) => "lock document (findAndModify)",
        Target::Claim { .. } => "claim document (findAndModify)",
    };
    let doc = match result.map_err(|e| classify(e, op, field))? {
        Some(doc) => doc,
        None => {
            return Ok(match target {
                Target::Id(_) => Attempted::NotFound,
                Target::Claim { .. } => Attempted::Busy,
            })
        }
    };
    let id = match (doc.get("_id"), target) {
        (Some(id), _) => id.clone(),
        (None, Target::Id(id)) => id.clone(),
        (None, Target::Claim { .. }) => {
            return Err(Error::backend(
                "findAndModify returned a document without `_id`",
                "the server does not behave like MongoDB; check the deployment",
            ))
        }
    };
    let name = lease_name(inner, &id);
    match state::granted(&doc, field, lease_id, &name)? {
        Some(lease) => Ok(Attempted::Acquired(Box::new(Granted { doc, id, lease }))),
        None => match target {
            Target::Id(_) => Ok(Attempted::Busy),
            Target::Claim { .. } => Err(Error::backend(
                format!("claimed document {name} does not carry the new lease"),
                "the server does not behave like MongoDB (findAndModify with new: true); check \
                 the deployment",
            )),
        },
    }
}
