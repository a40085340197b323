//! Everything behind the server's one mutex, and the write primitives that keep documents,
//! indexes, the cluster time and the change-stream event log consistent.

use bson::{doc, Bson, Document};

use crate::changestream::{EventLog, NewEvent, OpType};
use crate::clock::ClusterClock;
use crate::cursors::Cursors;
use crate::engine::expr::Vars;
use crate::error::{CommandError, CommandResult};
use crate::sessions::Sessions;
use crate::store::{RecordId, Store};

/// The server's mutable state. One `std::sync::Mutex` guards all of it; every command does its
/// whole read-modify-write inside one critical section and never holds the lock across `.await`.
#[derive(Default)]
pub struct State {
    /// Databases, collections, documents, indexes.
    pub store: Store,
    /// Open cursors.
    pub cursors: Cursors,
    /// Retryable-write records.
    pub sessions: Sessions,
    /// Change-stream event log.
    pub events: EventLog,
    /// Cluster time.
    pub clock: ClusterClock,
    /// Log pipeline-style updates as `replace` events with the full document, as MongoDB 4.4
    /// does (5.0 and later report them as `update` events with an update description).
    pub pipeline_updates_as_replace: bool,
}

fn internal(msg: &str) -> CommandError {
    CommandError::new(1, "InternalError", msg.to_owned())
}

impl State {
    /// Inserts a prepared document (its `_id` first), creating the collection if needed.
    pub fn insert_doc(
        &mut self,
        db: &str,
        coll: &str,
        doc: Document,
        vars: &Vars,
    ) -> CommandResult<()> {
        crate::limits::check_storage(&doc, true)?;
        let (c, _) = self.store.coll_or_create(db, coll)?;
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let full = doc.clone();
        c.insert(doc, vars)?;
        let ts = self.clock.tick();
        self.events.push(NewEvent {
            cluster_time: ts,
            db: db.to_owned(),
            coll: coll.to_owned(),
            op: OpType::Insert,
            document_key: Some(doc! {"_id": id}),
            full_document: Some(full),
            update_description: None,
        });
        Ok(())
    }

    /// Stores a new version of the document `rid`, logs an update (or replace) event and
    /// returns the previous version.
    pub fn update_doc(
        &mut self,
        db: &str,
        coll: &str,
        rid: RecordId,
        new_doc: Document,
        replacement: bool,
        vars: &Vars,
    ) -> CommandResult<Document> {
        crate::limits::check_storage(&new_doc, false)?;
        let c = self
            .store
            .coll_mut(db, coll)
            .ok_or_else(|| internal("collection vanished during an update"))?;
        let full = if replacement {
            Some(new_doc.clone())
        } else {
            None
        };
        let old = c.replace(rid, new_doc, vars)?;
        let id = old.get("_id").cloned().unwrap_or(Bson::Null);
        let update_description = if replacement {
            None
        } else {
            let new = c
                .get(rid)
                .ok_or_else(|| internal("record vanished during an update"))?;
            let d = crate::engine::diff::describe_update(&old, new);
            Some(doc! {
                "updatedFields": d.updated_fields,
                "removedFields": d.removed_fields,
                "truncatedArrays": d.truncated_arrays,
            })
        };
        let ts = self.clock.tick();
        self.events.push(NewEvent {
            cluster_time: ts,
            db: db.to_owned(),
            coll: coll.to_owned(),
            op: if replacement {
                OpType::Replace
            } else {
                OpType::Update
            },
            document_key: Some(doc! {"_id": id}),
            full_document: full,
            update_description,
        });
        Ok(old)
    }

    /// Deletes the document `rid` and logs a delete event.
    pub fn delete_doc(
        &mut self,
        db: &str,
        coll: &str,
        rid: RecordId,
        vars: &Vars,
    ) -> Option<Document> {
        let c = self.store.coll_mut(db, coll)?;
        let old = c.remove(rid, vars)?;
        let id = old.get("_id").cloned().unwrap_or(Bson::Null);
        let ts = self.clock.tick();
        self.events.push(NewEvent {
            cluster_time: ts,
            db: db.to_owned(),
            coll: coll.to_owned(),
            op: OpType::Delete,
            document_key: Some(doc! {"_id": id}),
            full_document: None,
            update_description: None,
        });
        Some(old)
    }

    /// Drops a collection (logging a drop event); returns its index count if it existed.
    pub fn drop_collection(&mut self, db: &str, coll: &str) -> Option<usize> {
        let database = self.store.dbs.get_mut(db)?;
        let removed = database.colls.remove(coll)?;
        if database.colls.is_empty() {
            self.store.dbs.remove(db);
        }
        self.cursors.kill_namespace(db, Some(coll));
        let ts = self.clock.tick();
        self.events.push(NewEvent {
            cluster_time: ts,
            db: db.to_owned(),
            coll: coll.to_owned(),
            op: OpType::Drop,
            document_key: None,
            full_document: None,
            update_description: None,
        });
        Some(removed.indexes.len())
    }

    /// Drops a database: a drop event per collection, then a dropDatabase event.
    pub fn drop_database(&mut self, db: &str) {
        if !self.store.dbs.contains_key(db) {
            return;
        }
        let names: Vec<String> = self
            .store
            .dbs
            .get(db)
            .map(|d| d.colls.keys().cloned().collect())
            .unwrap_or_default();
        for name in names {
            self.drop_collection(db, &name);
        }
        self.store.dbs.remove(db);
        self.cursors.kill_namespace(db, None);
        let ts = self.clock.tick();
        self.events.push(NewEvent {
            cluster_time: ts,
            db: db.to_owned(),
            coll: String::new(),
            op: OpType::DropDatabase,
            document_key: None,
            full_document: None,
            update_description: None,
        });
    }
}
