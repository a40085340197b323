//! Extension and release of a lock embedded in a document: the [`LeaseControl`] behind every
//! document [`LockGuard`](crate::LockGuard), and inspection.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures_util::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;

use super::state::{self, ttl_millis, EXPIRES_AT, LEASE_ID, OBSERVED_AT, SINCE};
use super::{classify, Inner};
use crate::backend::{LeaseId, LockInfo};
use crate::backends::mongo::document::{release_update, released_by_holder};
use crate::error::Result;
use crate::guard::LeaseControl;

/// The lease of one document lock. Only `<field>.*` is ever written.
pub(super) struct DocumentLease {
    pub(super) inner: Arc<Inner>,
    pub(super) id: Bson,
    /// The change-stream registry key of `id`.
    pub(super) key: String,
    pub(super) name: String,
    pub(super) lease_id: LeaseId,
    /// The lease's fencing token and grant time (server time), by which a retried release
    /// tells its own earlier try from a loss.
    pub(super) token: u64,
    pub(super) acquired_at: SystemTime,
}

#[async_trait]
impl LeaseControl for DocumentLease {
    /// `{_id, <field>.leaseId: ours, $expr: {$gt: ["$<field>.expiresAt", "$$NOW"]}}` →
    /// `<field>.expiresAt = $$NOW + ttl`. An expired lease is never extended.
    async fn extend(&self, ttl: Duration) -> Result<Option<SystemTime>> {
        let field = self.inner.field.as_str();
        let expires_path = format!("{field}.{EXPIRES_AT}");
        let doc = self
            .inner
            .coll
            .find_one_and_update(
                doc! {
                    "_id": self.id.clone(),
                    format!("{field}.{LEASE_ID}"): self.lease_id.as_str(),
                    "$expr": { "$gt": [format!("${expires_path}"), "$$NOW"] },
                },
                vec![doc! {
                    "$set": { expires_path.as_str(): { "$add": ["$$NOW", ttl_millis(ttl)] } }
                }],
            )
            .upsert(false)
            .return_document(ReturnDocument::After)
            .projection(doc! { expires_path.as_str(): 1 })
            .await
            .map_err(|e| classify(e, "extend document lock (findAndModify)", field))?;
        let Some(doc) = doc else {
            return Ok(None);
        };
        let expires_at = state::lock_doc(&doc, field).and_then(|l| state::date(l, EXPIRES_AT));
        match expires_at {
            Some(t) => Ok(Some(t)),
            None => Err(crate::error::Error::backend(
                format!(
                    "the extended lock of document {} has no date in `{expires_path}`",
                    self.name
                ),
                "the server does not behave like MongoDB; check the deployment",
            )),
        }
    }

    /// The idempotent release of `release_update`: ends the lease while it is ours, and
    /// reports success again when a retry finds that its holder ended it (by its fencing
    /// token: `document::released_by_holder`; the record of leases ended by others survives
    /// later grants of the document). A lease taken over or force-released reports the loss.
    async fn release(&self) -> Result<bool> {
        release(
            &self.inner,
            Some(&self.id),
            &self.lease_id,
            Some((self.token, self.acquired_at)),
        )
        .await
    }

    /// Completes when the collection's change stream shows `<field>.leaseId` changed away from
    /// ours (at or after our grant, judged by the fencing token) or the document deleted;
    /// pending while change streams are unavailable (loss is then detected by
    /// extension and the local deadline).
    async fn gone(&self) {
        self.inner
            .watch
            .lease_gone_at(&self.key, &self.id, &self.lease_id)
            .await;
    }
}

impl Drop for DocumentLease {
    fn drop(&mut self) {
        // Released, lost or abandoned: its token is no longer needed to judge changes.
        self.inner.watch.released(&self.lease_id);
    }
}

/// Releases `lease_id` in the document with `_id` `id` (any document of the collection when
/// `None`: a claim whose outcome is unknown). `false` when the lease id holds no lock and was
/// not released by its holder (judged by the lease's fencing token and grant time `granted`;
/// without them, not).
async fn release(
    inner: &Inner,
    id: Option<&Bson>,
    lease_id: &LeaseId,
    granted: Option<(u64, SystemTime)>,
) -> Result<bool> {
    let field = inner.field.as_str();
    let (mut filter, pipeline) = release_update(&format!("{field}."), lease_id.as_str(), None);
    let r = match id {
        Some(id) => {
            filter.insert("_id", id.clone());
            inner
                .coll
                .update_one(filter, pipeline)
                .upsert(false)
                .await
                .map_err(|e| classify(e, "release document lock (update)", field))?
        }
        None => release_anywhere(inner, filter, pipeline).await?,
    };
    if r.matched_count >= 1 {
        // A document of this collection is free again: wake this process's waiting claims
        // and locks (others find it at their next poll).
        inner.freed.notify_waiters();
        return Ok(true);
    }
    // Not ours any more: released by an earlier try of this release, or ended by someone else.
    let (Some(id), Some((token, acquired_at))) = (id, granted) else {
        return Ok(false);
    };
    let mut before = released_by_holder(&format!("{field}."), token);
    before.insert("_id", id.clone());
    // The record of this lifetime of the document (not of one re-inserted since our grant,
    // whose tokens start again at 1).
    before.insert(
        format!("{field}.{SINCE}"),
        doc! { "$lte": mongodb::bson::DateTime::from_system_time(acquired_at) },
    );
    let found = inner
        .reads
        .find_one(before)
        .projection(doc! { "_id": 1 })
        .await
        .map_err(|e| classify(e, "release document lock (find)", field))?;
    Ok(found.is_some())
}

/// The release of a claim's lease id wherever it holds a lock (`filter` names only the lease
/// id): a multi-document `update` (`multi: true`). On a sharded collection mongos refuses an
/// `update_one` whose filter has neither `_id` nor the shard key before MongoDB 7.1
/// (ShardKeyNotFound 61, or InvalidOptions 72 on later lines); a multi-update needs neither.
/// Lease ids are unique, so at most one document matches. The driver does not retry a
/// multi-update (it is no retryable write), so transient errors are retried here, with a
/// backoff: the release is idempotent (once applied, the filter matches nothing), and its
/// only caller ([`abandon`]) bounds it by the release timeout.
async fn release_anywhere(
    inner: &Inner,
    filter: Document,
    pipeline: Vec<Document>,
) -> Result<mongodb::results::UpdateResult> {
    let field = inner.field.as_str();
    let mut delay = Duration::from_millis(50);
    loop {
        let sent = inner
            .coll
            .update_many(filter.clone(), pipeline.clone())
            .upsert(false)
            .await
            .map_err(|e| classify(e, "release document lock (update, multi)", field));
        match sent {
            Err(e) if e.is_transient() => {
                tracing::debug!(error = %e, "retrying the release of an abandoned claim");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// Releases, in the background and within the release timeout, the lease id of a lock or
/// claim call that ended after an attempt whose outcome it does not know (`id`: the document it
/// tried to lock; `None` for a claim, which may have locked any matching document).
///
/// The release is sent once `after` completes (every attempt of the call has finished), so
/// that it never reaches the server before a detached attempt's grant.
pub(super) fn abandon(
    inner: Arc<Inner>,
    id: Option<Bson>,
    lease_id: LeaseId,
    after: crate::acquire_loop::AttemptsDone,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime (a future dropped during shutdown): a granted lease expires by itself.
        return;
    };
    runtime.spawn(async move {
        after.wait().await;
        let limit = inner.options.release_timeout;
        let outcome = tokio::time::timeout(limit, release(&inner, id.as_ref(), &lease_id, None)).await;
        match outcome {
            Ok(Ok(released)) => tracing::debug!(%lease_id, released, "released the lease id of an abandoned document lock attempt"),
            Ok(Err(e)) => tracing::warn!(%lease_id, error = %e, "could not release the lease id of an abandoned document lock attempt; if it was granted, it expires by itself"),
            Err(_) => tracing::warn!(%lease_id, "the release of an abandoned document lock attempt did not complete within the release timeout; if it was granted, it expires by itself"),
        }
        inner.watch.released(&lease_id);
    });
}

/// Reads the lock state of document `id` together with the server time; `None` when no document
/// has this `_id`.
pub(super) async fn inspect(inner: &Inner, id: &Bson) -> Result<Option<LockInfo>> {
    let field = inner.field.as_str();
    let op = "inspect document lock (aggregate)";
    let cursor = inner
        .reads
        .aggregate(vec![
            doc! { "$match": { "_id": id.clone() } },
            doc! { "$project": { field: 1, OBSERVED_AT: "$$NOW" } },
        ])
        .await
        .map_err(|e| classify(e, op, field))?;
    let docs: Vec<Document> = cursor
        .try_collect()
        .await
        .map_err(|e| classify(e, op, field))?;
    let Some(doc) = docs.into_iter().next() else {
        return Ok(None);
    };
    let id = doc.get("_id").cloned().unwrap_or_else(|| id.clone());
    state::lock_info(&doc, field, super::claim::lease_name(inner, &id)).map(Some)
}
