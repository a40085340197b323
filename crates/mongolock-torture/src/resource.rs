//! The protected resource: a collection with one document per name, `{_id: name, maxToken,
//! last: {token, writeId, worker, at}}`. A fenced write is accepted only when its token is at
//! least `maxToken`, in **one** atomic write (a `findAndModify` upsert whose update pipeline sets
//! both fields with `$cond`), with the server's `$$NOW` as the acceptance time. Every accepted
//! write changes `last.writeId`, so the resource collection's change stream is the log of
//! accepted writes (read by the recorder, checked by the checker).
//!
//! The in-memory variant (for `--backend memory`) applies the same rule under a mutex and keeps
//! the log itself.

use std::collections::HashMap;
use std::sync::Mutex;

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::Collection;

use crate::checker::AcceptedWrite;

/// Name of the resource collection.
pub const RESOURCE_COLLECTION: &str = "resource";

/// A fenced write to send.
#[derive(Clone, Debug)]
pub struct FencedWrite {
    /// Resource (lock) name.
    pub name: String,
    /// The writer's fencing token.
    pub token: u64,
    /// Unique id of this write.
    pub write_id: String,
    /// The writer.
    pub worker: String,
}

/// The update pipeline: accept when `maxToken` is missing or `<= token`.
fn pipeline(w: &FencedWrite) -> Vec<Document> {
    let token = w.token as i64;
    let accept = doc! { "$lte": [{ "$ifNull": ["$maxToken", Bson::Int64(-1)] }, token] };
    vec![doc! { "$set": {
        "maxToken": { "$cond": [accept.clone(), { "$literal": token }, "$maxToken"] },
        "last": { "$cond": [accept, {
            "token": { "$literal": token },
            "writeId": { "$literal": w.write_id.as_str() },
            "worker": { "$literal": w.worker.as_str() },
            "at": "$$NOW",
        }, "$last"] },
    } }]
}

/// Sends a fenced write; `Ok(true)` when the resource accepted it.
pub async fn fenced_write(
    coll: &Collection<Document>,
    w: &FencedWrite,
) -> mongodb::error::Result<bool> {
    let after = coll
        .find_one_and_update(doc! { "_id": w.name.as_str() }, pipeline(w))
        .upsert(true)
        .return_document(ReturnDocument::After)
        .await?;
    Ok(after.is_some_and(|d| {
        matches!(crate::history::get_path(&d, "last.writeId"), Some(Bson::String(s)) if *s == w.write_id)
    }))
}

/// The in-memory resource: same rule, same log.
#[derive(Default)]
pub struct MemoryResource {
    inner: Mutex<MemoryInner>,
}

#[derive(Default)]
struct MemoryInner {
    max: HashMap<String, u64>,
    log: Vec<AcceptedWrite>,
}

impl MemoryResource {
    /// An empty resource.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies a fenced write at time `at_us`; true when accepted.
    pub fn write(&self, w: &FencedWrite, at_us: i64) -> bool {
        let mut inner = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let max = inner.max.get(&w.name).copied();
        if max.is_some_and(|m| m > w.token) {
            return false;
        }
        inner.max.insert(w.name.clone(), w.token);
        inner.log.push(AcceptedWrite {
            name: w.name.clone(),
            token: w.token,
            write_id: w.write_id.clone(),
            worker: w.worker.clone(),
            at_us,
        });
        true
    }

    /// The accepted writes, in acceptance order.
    pub fn take_log(&self) -> Vec<AcceptedWrite> {
        let mut inner = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        std::mem::take(&mut inner.log)
    }
}
