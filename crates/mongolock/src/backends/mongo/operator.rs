//! The operator's operations (`crate::operator`): the wait queue and slot limit of a name,
//! lists filtered by prefix on the server, and the conditional force-release by fencing token.

use mongodb::bson::{doc, Bson, Document, Regex};
use mongodb::Collection;

use super::document::{self, EPOCH, LEASE_ID, OBSERVED_AT, TOKEN};
use super::errors::classify;
use super::slots::{self, LIMIT};
use super::{ops, queue};
use crate::backend::LockInfo;
use crate::error::Result;
use crate::operator::{ListFilter, QueuedWaiter};

/// The lock document of `name` read together with the server time (`OBSERVED_AT`);
/// [`Error::ForeignCollection`](crate::Error::ForeignCollection) when the document of that
/// `_id` is not a lock document.
async fn read_one(coll: &Collection<Document>, name: &str, op: &str) -> Result<Option<Document>> {
    let docs = ops::read_docs(coll, doc! { "_id": name }, op).await?;
    Ok(docs.into_iter().next())
}

/// The live entries of `name`'s queue, in queue order.
pub(super) async fn waiters(coll: &Collection<Document>, name: &str) -> Result<Vec<QueuedWaiter>> {
    let Some(d) = read_one(coll, name, "waiters (aggregate)").await? else {
        return Ok(Vec::new());
    };
    let observed_at = document::require_date(&d, OBSERVED_AT, document::LockSite::Named, name)?;
    Ok(queue::waiters(&d, observed_at))
}

/// The limit of `name` while an unexpired slot holds it.
pub(super) async fn slot_limit(coll: &Collection<Document>, name: &str) -> Result<Option<u32>> {
    let Some(d) = read_one(coll, name, "slot limit (aggregate)").await? else {
        return Ok(None);
    };
    let observed_at = document::require_date(&d, OBSERVED_AT, document::LockSite::Named, name)?;
    Ok(slots::live_limit(&d, observed_at))
}

/// The locks passing `filter`, sorted by name: the prefix as an anchored, escaped `$regex` on
/// `_id` (the `_id` index serves it), the state judged by the server time of the read.
pub(super) async fn list_matching(
    coll: &Collection<Document>,
    filter: &ListFilter,
) -> Result<Vec<LockInfo>> {
    // String ids only: this skips the fencing epoch counters.
    let mut id = doc! { "$type": "string" };
    if let Some(pattern) = filter.prefix_str().and_then(anchored_pattern) {
        id.insert(
            "$regex",
            Bson::RegularExpression(Regex {
                pattern,
                options: String::new(),
            }),
        );
    }
    let mut all = ops::read(coll, doc! { "_id": id }, "list (aggregate)").await?;
    // The prefix once more in the client (a prefix a pattern cannot hold, NUL, is applied
    // here only), and the state.
    all.retain(|i| filter.matches(i));
    all.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(all)
}

/// Ends the exclusive lease of `name` if it is unexpired and has fencing token `token`: one
/// update whose filter requires exactly that (and a token that was issued: a grant whose
/// token is still being stamped, `epoch: null`, shows the previous holder's). Returns whether
/// it matched.
pub(super) async fn force_release_exclusive(
    coll: &Collection<Document>,
    name: &str,
    token: u64,
    reserve: bool,
) -> Result<bool> {
    let Ok(token) = i64::try_from(token) else {
        return Ok(false);
    };
    let r = coll
        .update_one(
            doc! {
                "_id": name,
                LEASE_ID: { "$ne": null },
                // Exclusive mode (a semaphore's `leaseId` only marks its last write).
                LIMIT: Bson::Null,
                "$expr": { "$and": [
                    { "$eq": [format!("${TOKEN}"), token] },
                    { "$gt": ["$expiresAt", "$$NOW"] },
                    { "$ne": [{ "$type": format!("${EPOCH}") }, "null"] },
                ] },
            },
            ops::end_lease(reserve),
        )
        .await
        .map_err(|e| classify(e, "force release by token (update)"))?;
    Ok(r.matched_count == 1)
}

/// [`force_release_exclusive`], else the slot with that token ([`slots::force_release_token`]).
/// A token names one lease of the name, so at most one of the two updates matches.
pub(super) async fn force_release_token(
    coll: &Collection<Document>,
    name: &str,
    token: u64,
    reserve: bool,
) -> Result<bool> {
    if force_release_exclusive(coll, name, token, reserve).await? {
        return Ok(true);
    }
    slots::force_release_token(coll, name, token).await
}

/// `prefix` as the start of a PCRE pattern that matches it literally (MongoDB's `$regex`):
/// every ASCII punctuation character escaped (a backslash before a non-alphanumeric character
/// is always a literal in PCRE), everything else as it is. `None` when the prefix holds a NUL
/// character, which a pattern cannot.
pub(crate) fn anchored_pattern(prefix: &str) -> Option<String> {
    if prefix.contains('\0') {
        return None;
    }
    let mut pattern = String::with_capacity(prefix.len() * 2 + 1);
    pattern.push('^');
    for c in prefix.chars() {
        if c.is_ascii_punctuation() {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    Some(pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_escape_every_metacharacter() {
        assert_eq!(anchored_pattern("a.b*").as_deref(), Some(r"^a\.b\*"));
        assert_eq!(
            anchored_pattern(r"x(y)[z]{1}|^$\?+").as_deref(),
            Some(r"^x\(y\)\[z\]\{1\}\|\^\$\\\?\+")
        );
        assert_eq!(anchored_pattern("évé 1").as_deref(), Some("^évé 1"));
        assert_eq!(anchored_pattern("a\0b"), None);
    }
}
