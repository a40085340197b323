//! The TTL index on `expiresAt`: created once per collection per process, in the background.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use mongodb::bson::{doc, Document};
use mongodb::options::IndexOptions;
use mongodb::{Collection, IndexModel};

use super::document::EXPIRES_AT;
use super::errors::classify;
use crate::error::Result;

/// Name of the TTL index.
pub(super) const TTL_INDEX_NAME: &str = "mongolock_expiresAt_ttl";

/// Namespaces whose index creation was started by this process.
fn started() -> &'static Mutex<HashSet<String>> {
    static STARTED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    STARTED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Starts creating the index unless this process already did for this namespace. Never fails:
/// errors are logged. Must run inside a Tokio runtime (called from `try_acquire`).
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
                 unused lock documents are not cleaned up"
            ),
        }
    });
}

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
