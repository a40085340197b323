//! The recorder: follows the change streams of the lock collection, the jobs collection
//! (document locks), the resource collection and the CLI check's liveness collection
//! (`cli_live`) from before the first worker starts until an
//! end marker, rebuilds their histories ([`crate::history`]) and hands every closed grant and
//! accepted write to the checker. It uses its own client (its own `appName`), so fail points
//! never hit it. It resumes from the last resume token after any error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType, ResumeToken};
use mongodb::Collection;
use tokio::task::JoinHandle;

use crate::checker::{Checker, SlotEvent};
use crate::config::SEM_PREFIX;
use crate::history::{Change, LockHistory, ResourceHistory, SlotHistory};

/// `_id` of the end marker inserted into each followed collection.
pub fn end_marker() -> Document {
    doc! { "_id": { "torture": "end" } }
}

/// What a followed collection holds.
pub enum Followed {
    /// Lock documents; `name` maps a document `_id` to a lock name (`None`: not a lock).
    /// With `slots`, the names with [`SEM_PREFIX`] are semaphores: their documents go to the
    /// slot history instead of the lock history.
    Locks {
        history: LockHistory,
        name: fn(&Bson) -> Option<String>,
        slots: Option<SlotHistory>,
    },
    /// The resource.
    Resource(ResourceHistory),
}

/// Counters the orchestrator reads while the run goes on.
#[derive(Default)]
pub struct Progress {
    /// Grants seen (acquisitions).
    pub grants: AtomicU64,
    /// Lock documents deleted (TTL cleanup).
    pub deletes: AtomicU64,
    /// Semaphore slots granted.
    pub slot_grants: AtomicU64,
    /// Change events read.
    pub events: AtomicU64,
    /// Times a change stream had to be reopened.
    pub resumes: AtomicU64,
    /// Times reopening failed (events may have been missed: the history is incomplete).
    pub gaps: AtomicU64,
}

/// A lock name: the `_id` when it is a string.
pub fn string_id(id: &Bson) -> Option<String> {
    match id {
        Bson::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// A document-lock name: `jobs:<_id>` for integer ids.
pub fn job_id(id: &Bson) -> Option<String> {
    match id {
        Bson::Int32(i) => Some(format!("jobs:{i}")),
        Bson::Int64(i) => Some(format!("jobs:{i}")),
        _ => None,
    }
}

fn is_marker(id: &Bson) -> bool {
    matches!(id, Bson::Document(d) if d.get_str("torture") == Ok("end"))
}

/// Opens the change stream now (so that nothing written after this call is missed) and follows
/// it in a task until the end marker.
pub async fn follow(
    coll: Collection<Document>,
    mut followed: Followed,
    checker: Arc<Mutex<Checker>>,
    progress: Arc<Progress>,
) -> mongodb::error::Result<JoinHandle<()>> {
    let mut stream = coll.watch().await?;
    Ok(tokio::spawn(async move {
        let mut token: Option<ResumeToken> = stream.resume_token();
        loop {
            let next = stream.next().await;
            let event: ChangeStreamEvent<Document> = match next {
                Some(Ok(e)) => e,
                other => {
                    if let Some(Err(e)) = other {
                        eprintln!("torture: recorder: change stream error, resuming: {e}");
                    }
                    progress.resumes.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let mut w = coll.watch();
                    if let Some(t) = token.clone() {
                        w = w.resume_after(t);
                    }
                    match w.await {
                        Ok(s) => stream = s,
                        Err(e) => {
                            progress.gaps.fetch_add(1, Ordering::Relaxed);
                            eprintln!("torture: recorder: cannot resume: {e}");
                        }
                    }
                    continue;
                }
            };
            token = Some(event.id.clone());
            progress.events.fetch_add(1, Ordering::Relaxed);
            let Some(id) = event
                .document_key
                .as_ref()
                .and_then(|k| k.get("_id"))
                .cloned()
            else {
                continue;
            };
            if is_marker(&id) {
                break;
            }
            let change = match event.operation_type {
                OperationType::Insert | OperationType::Replace => match event.full_document {
                    Some(d) => Change::Full(d),
                    None => continue,
                },
                OperationType::Update => match event.update_description {
                    Some(u) => Change::Update {
                        updated: u.updated_fields,
                        removed: u.removed_fields,
                        truncated: u
                            .truncated_arrays
                            .unwrap_or_default()
                            .into_iter()
                            .map(|t| (t.field, usize::try_from(t.new_size).unwrap_or(0)))
                            .collect(),
                    },
                    None => continue,
                },
                OperationType::Delete => Change::Delete,
                _ => continue,
            };
            match &mut followed {
                Followed::Locks {
                    history,
                    name,
                    slots,
                } => {
                    let Some(name) = name(&id) else { continue };
                    if let Some(slots) = slots.as_mut().filter(|_| name.starts_with(SEM_PREFIX)) {
                        let events = slots.apply(&name, change);
                        if !events.is_empty() {
                            let mut c = lock(&checker);
                            for e in events {
                                if matches!(e, SlotEvent::Granted { .. }) {
                                    progress.slot_grants.fetch_add(1, Ordering::Relaxed);
                                }
                                c.slot(e);
                            }
                        }
                        continue;
                    }
                    let before = history.grants_opened();
                    let closed = history.apply(&name, change);
                    progress
                        .grants
                        .fetch_add(history.grants_opened() - before, Ordering::Relaxed);
                    if matches!(event.operation_type, OperationType::Delete) {
                        progress.deletes.fetch_add(1, Ordering::Relaxed);
                    }
                    if !closed.is_empty() {
                        let mut c = lock(&checker);
                        for g in closed {
                            c.grant(g);
                        }
                    }
                }
                Followed::Resource(history) => {
                    let Some(name) = string_id(&id) else { continue };
                    if let Some(w) = history.apply(&name, change) {
                        lock(&checker).accepted_write(w);
                    }
                }
            }
        }
        if let Followed::Locks { history, .. } = &mut followed {
            let mut c = lock(&checker);
            for g in history.finish() {
                c.grant_ended_unknown(g);
            }
        }
    }))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
