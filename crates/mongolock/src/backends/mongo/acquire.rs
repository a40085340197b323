//! The acquire path: one `findAndModify` upsert with an update pipeline; on the first grant of a
//! document's lifetime, the fencing token is stamped from the per-collection epoch counter. See
//! the [module docs](super) for why tokens keep growing across TTL cleanup.

use mongodb::action::Action;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{ReturnDocument, UpdateModifications};
use mongodb::Collection;

use super::document::{
    self, holder_doc, ttl_millis, LockSite, ACQUIRED_AT, EXPIRES_AT, HOLDER, LEASE_ID, TOKEN,
};
use super::errors::{self, classify, DUPLICATE_KEY};
use crate::backend::{AcquireRequest, Attempt};
use crate::error::{Error, Result};

/// `_id` of the per-collection epoch counter document.
fn epoch_id() -> Document {
    doc! { "mongolock": "fencing-epoch" }
}

/// Size of the token range reserved for one lifetime of a lock document.
const EPOCH_SPAN: i64 = 1 << 32;

/// The update pipeline: take the lease when the name is free, else leave the document as it
/// is. One `$replaceWith` of `$cond: [free, $$ROOT merged with the new lease, $$ROOT]`, so the
/// server evaluates "free" once per attempt (not once per field).
fn acquire_pipeline(req: &AcquireRequest) -> Vec<Document> {
    let mine = Bson::String(req.lease_id.as_str().to_owned());
    // free = no lease, or the lease expired by server time, or the lease is already ours (a retry
    // after a lost reply).
    let free = doc! {
        "$or": [
            { "$eq": [{ "$ifNull": ["$leaseId", Bson::Null] }, Bson::Null] },
            { "$lte": ["$expiresAt", "$$NOW"] },
            { "$eq": ["$leaseId", mine.clone()] },
        ]
    };
    let lease = doc! {
        LEASE_ID: { "$literal": mine },
        // A document without a token (new, or never stamped) keeps a null token: `$add` of a
        // missing or null field is null. `stamp_token` then assigns one.
        TOKEN: { "$add": ["$fencingToken", 1_i64] },
        ACQUIRED_AT: "$$NOW",
        EXPIRES_AT: { "$add": ["$$NOW", ttl_millis(req.ttl)] },
        HOLDER: { "$literal": holder_doc(&req.holder) },
    };
    vec![doc! {
        "$replaceWith": { "$cond": [
            free,
            { "$mergeObjects": ["$$ROOT", lease] },
            "$$ROOT",
        ] }
    }]
}

/// One acquisition attempt.
pub(super) async fn try_acquire(
    coll: &Collection<Document>,
    req: &AcquireRequest,
) -> Result<Attempt> {
    let doc = upsert(
        coll,
        doc! { "_id": req.name.as_str() },
        acquire_pipeline(req),
        // Only what the client reads back: the holder and the released ids stay on the server.
        Some(doc! { LEASE_ID: 1, TOKEN: 1, ACQUIRED_AT: 1, EXPIRES_AT: 1 }),
        "acquire (findAndModify)",
    )
    .await?;
    if document::lease_id(&doc) != Some(req.lease_id.as_str()) {
        return Ok(Attempt::Busy {
            holder_expires_at: document::date(&doc, EXPIRES_AT),
        });
    }
    match document::token(&doc, LockSite::Named, &req.name)? {
        Some(token) => Ok(Attempt::Acquired(document::lease(
            &doc,
            token,
            LockSite::Named,
            &req.name,
        )?)),
        None => stamp_token(coll, req).await,
    }
}

/// One `findAndModify` upsert of `filter` that returns the post-image. Two clients that create the
/// document at once race on its `_id`: the loser retries (up to five times) on the now existing
/// document.
async fn upsert(
    coll: &Collection<Document>,
    filter: Document,
    update: impl Into<UpdateModifications>,
    projection: Option<Document>,
    what: &str,
) -> Result<Document> {
    let update = update.into();
    let mut duplicate_keys = 0;
    loop {
        let result = coll
            .find_one_and_update(filter.clone(), update.clone())
            .upsert(true)
            .return_document(ReturnDocument::After)
            .optional(projection.clone(), |b, p| b.projection(p))
            .await;
        match result {
            Ok(Some(doc)) => return Ok(doc),
            Ok(None) => {
                return Err(Error::backend(
                    "findAndModify with upsert and new: true returned no document",
                    "the server does not behave like MongoDB; check the deployment",
                ))
            }
            Err(e) if errors::code(&e) == Some(DUPLICATE_KEY) && duplicate_keys < 5 => {
                duplicate_keys += 1;
            }
            Err(e) => return Err(classify(e, what)),
        }
    }
}

/// The smallest token of the document lifetime that took epoch `epoch` (the counter starts at 1,
/// so the very first lifetime of a collection starts at token 1): `(epoch - 1) · 2³² + 1`.
fn token_floor(epoch: i64) -> Option<i64> {
    epoch
        .checked_sub(1)
        .filter(|e| *e >= 0)
        .and_then(|e| e.checked_mul(EPOCH_SPAN))
        .and_then(|f| f.checked_add(1))
}

/// The first grant of a document's lifetime: take a new epoch, then stamp our (unexpired) lease
/// with `max(token + 1, (epoch - 1) · 2³² + 1)`.
async fn stamp_token(coll: &Collection<Document>, req: &AcquireRequest) -> Result<Attempt> {
    let epoch = next_epoch(coll).await?;
    let floor = token_floor(epoch).ok_or_else(|| {
        Error::backend(
            format!("the fencing epoch counter reached {epoch}"),
            "the lock collection has created more than 2^31 lock documents; use a new \
                 collection",
        )
    })?;
    let stamped = coll
        .find_one_and_update(
            doc! {
                "_id": req.name.as_str(),
                LEASE_ID: req.lease_id.as_str(),
                "$expr": { "$gt": ["$expiresAt", "$$NOW"] },
            },
            vec![doc! {
                "$set": {
                    TOKEN: { "$max": [
                        { "$add": [{ "$ifNull": ["$fencingToken", 0_i64] }, 1_i64] },
                        floor,
                    ] }
                }
            }],
        )
        .return_document(ReturnDocument::After)
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

/// Increments the collection's epoch counter and returns the new value.
async fn next_epoch(coll: &Collection<Document>) -> Result<i64> {
    let doc = upsert(
        coll,
        doc! { "_id": epoch_id() },
        doc! { "$inc": { "epoch": 1_i64 } },
        None,
        "acquire (fencing epoch)",
    )
    .await?;
    match doc.get("epoch") {
        Some(Bson::Int64(e)) if *e > 0 => Ok(*e),
        Some(Bson::Int32(e)) if *e > 0 => Ok(i64::from(*e)),
        other => Err(Error::backend(
            format!("the fencing epoch document holds {other:?}"),
            "the lock collection holds documents mongolock did not write; use a dedicated \
             collection for locks",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::token_floor;

    #[test]
    fn the_first_lifetime_starts_at_one_and_lifetimes_do_not_overlap() {
        assert_eq!(token_floor(1), Some(1));
        assert_eq!(token_floor(2), Some((1 << 32) + 1));
        // Every token of lifetime e (below floor(e) + 2^32) is below floor(e + 1).
        for e in [1_i64, 2, 1000, 1 << 30] {
            let (this, next) = (token_floor(e).unwrap(), token_floor(e + 1).unwrap());
            assert_eq!(next - this, 1 << 32);
        }
        assert_eq!(token_floor(0), None);
        assert!(token_floor(1 << 31).is_some());
        assert_eq!(token_floor(i64::MAX), None);
    }
}
