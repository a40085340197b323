//! Databases, collections, documents and indexes.
//!
//! A collection keeps its documents in insertion order (`BTreeMap` keyed by an increasing record
//! id) and finds a document by `_id` in O(1) through a hash map from the canonical key of the `_id`
//! (see [`crate::keys`]). Unique secondary indexes keep the same kind of map per index, and
//! every plain index keeps the ordered entries of its first field, which queries use to read
//! only the documents their conditions point at (`range_index.rs`). Nothing here locks: the
//! whole store lives inside the server's single mutex (see the crate docs).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bson::{doc, Bson, Document};

use crate::engine::expr::Vars;
use crate::engine::matcher::Filter;
use crate::error::{CommandError, CommandResult};
use crate::keys::{self, KeyBytes};
use crate::range_index::{self, RangeIndex, ScanCounters};

/// Record id: position of a document in insertion order.
pub type RecordId = u64;

/// All databases.
#[derive(Default)]
pub struct Store {
    /// Databases by name.
    pub dbs: BTreeMap<String, Database>,
    /// Keys and documents examined by queries, over every collection.
    pub counters: Arc<ScanCounters>,
}

/// One database.
#[derive(Default)]
pub struct Database {
    /// Collections by name.
    pub colls: BTreeMap<String, Collection>,
}

impl Store {
    /// A collection, if it exists.
    pub fn coll(&self, db: &str, coll: &str) -> Option<&Collection> {
        self.dbs.get(db).and_then(|d| d.colls.get(coll))
    }

    /// A collection for writing, if it exists.
    pub fn coll_mut(&mut self, db: &str, coll: &str) -> Option<&mut Collection> {
        self.dbs.get_mut(db).and_then(|d| d.colls.get_mut(coll))
    }

    /// A collection for writing, created (with its `_id` index) if missing. The flag tells
    /// whether it was created.
    pub fn coll_or_create(
        &mut self,
        db: &str,
        coll: &str,
    ) -> CommandResult<(&mut Collection, bool)> {
        validate_names(db, coll)?;
        let counters = self.counters.clone();
        let database = self.dbs.entry(db.to_owned()).or_default();
        let mut created = false;
        let c = database.colls.entry(coll.to_owned()).or_insert_with(|| {
            created = true;
            Collection::new(db, coll, Document::new(), counters)
        });
        Ok((c, created))
    }
}

/// Checks database and collection names as mongod does.
pub fn validate_names(db: &str, coll: &str) -> CommandResult<()> {
    if db.is_empty() || db.contains(['/', '\\', '.', ' ', '"', '$', '\0']) || db.len() >= 64 {
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!("Invalid database name: '{db}'"),
        ));
    }
    if coll.is_empty() || coll.contains('\0') || coll.starts_with('.') || coll.contains('$') {
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!("Invalid collection name: {coll}"),
        ));
    }
    if coll.starts_with("system.") {
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!("Invalid system namespace: {db}.{coll}"),
        ));
    }
    Ok(())
}

/// An index's definition (and, for unique indexes, its entries).
pub struct Index {
    /// Name, e.g. `_id_` or `expiresAt_1`.
    pub name: String,
    /// Key pattern.
    pub key: Document,
    /// Whether keys must be unique.
    pub unique: bool,
    /// Whether documents missing every key field are left out.
    pub sparse: bool,
    /// TTL in seconds (TTL index).
    pub expire_after_seconds: Option<i64>,
    /// Partial filter (its document and the parsed form).
    pub partial: Option<(Document, Filter)>,
    /// The specification as listIndexes shows it.
    pub spec: Document,
    /// Entries of a unique secondary index: key → record.
    entries: HashMap<KeyBytes, RecordId>,
    /// Ordered entries of the first field, when queries can use them (`range_index.rs`).
    range: Option<RangeIndex>,
}

impl Index {
    /// The `_id_` index.
    fn id_index() -> Index {
        Index {
            name: "_id_".into(),
            key: doc! {"_id": 1},
            unique: true,
            sparse: false,
            expire_after_seconds: None,
            partial: None,
            spec: doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"},
            entries: HashMap::new(),
            range: None,
        }
    }

    /// A new secondary index from an already validated specification.
    pub fn new(
        name: String,
        key: Document,
        unique: bool,
        sparse: bool,
        expire_after_seconds: Option<i64>,
        partial: Option<(Document, Filter)>,
        spec: Document,
    ) -> Index {
        let range = RangeIndex::for_key(&key, partial.is_some(), sparse);
        Index {
            name,
            key,
            unique,
            sparse,
            expire_after_seconds,
            partial,
            spec,
            entries: HashMap::new(),
            range,
        }
    }

    fn is_id(&self) -> bool {
        self.name == "_id_"
    }

    /// Key tuples of a document for this index (`None`: the document is not indexed).
    fn keys_of(
        &self,
        doc: &Document,
        vars: &Vars,
    ) -> CommandResult<Option<Vec<(KeyBytes, Document)>>> {
        if let Some((_, filter)) = &self.partial {
            if !filter.matches(doc, vars)? {
                return Ok(None);
            }
        }
        let mut per_field: Vec<(&str, Vec<Bson>)> = Vec::with_capacity(self.key.len());
        let mut any_present = false;
        for (field, _) in &self.key {
            let mut values = Vec::new();
            collect_in_doc(doc, field, &mut values);
            if values.is_empty() {
                values.push(Bson::Null);
            } else {
                any_present = true;
            }
            per_field.push((field.as_str(), values));
        }
        if self.sparse && !any_present {
            return Ok(None);
        }
        let multi: Vec<&str> = per_field
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(f, _)| *f)
            .collect();
        if multi.len() > 1 {
            return Err(CommandError::new(
                171,
                "CannotIndexParallelArrays",
                format!("cannot index parallel arrays [{}] [{}]", multi[1], multi[0]),
            ));
        }
        // Cartesian product of the per-field values.
        let mut tuples: Vec<(KeyBytes, Document)> = vec![(Vec::new(), Document::new())];
        for (field, values) in per_field {
            let mut next = Vec::with_capacity(tuples.len() * values.len());
            for (bytes, kv) in &tuples {
                for v in &values {
                    let mut b = bytes.clone();
                    keys::push_key(v, &mut b);
                    let mut d = kv.clone();
                    d.insert(field, v.clone());
                    next.push((b, d));
                }
            }
            tuples = next;
        }
        Ok(Some(tuples))
    }
}

/// Values at a dotted path, expanding arrays as MongoDB indexes them (an array value yields its
/// elements; an empty array yields `undefined`-like null).
fn collect_path(value: &Bson, path: &str, out: &mut Vec<Bson>) {
    match value {
        Bson::Document(d) => collect_in_doc(d, path, out),
        Bson::Array(a) => {
            let (head, rest) = split_path(path);
            if let Ok(i) = head.parse::<usize>() {
                if let Some(v) = a.get(i) {
                    match rest {
                        Some(r) => collect_path(v, r, out),
                        None => out.push(v.clone()),
                    }
                    return;
                }
            }
            for el in a {
                if let Bson::Document(d) = el {
                    collect_in_doc(d, path, out);
                }
            }
        }
        _ => {}
    }
}

fn split_path(path: &str) -> (&str, Option<&str>) {
    match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    }
}

fn collect_in_doc(d: &Document, path: &str, out: &mut Vec<Bson>) {
    let (head, rest) = split_path(path);
    if let Some(v) = d.get(head) {
        match rest {
            Some(r) => collect_path(v, r, out),
            None => match v {
                Bson::Array(a) if a.is_empty() => out.push(Bson::Undefined),
                Bson::Array(a) => out.extend(a.iter().cloned()),
                other => out.push(other.clone()),
            },
        }
    }
}

/// Values at a dotted path without index semantics for the last array (used by TTL).
pub fn path_values(doc: &Document, path: &str) -> Vec<Bson> {
    let mut out = Vec::new();
    collect_in_doc(doc, path, &mut out);
    out
}

/// A collection.
pub struct Collection {
    /// `db.coll`.
    pub ns: String,
    /// The collection's UUID.
    pub uuid: bson::Uuid,
    /// Options given to `create`.
    pub options: Document,
    docs: BTreeMap<RecordId, Document>,
    ids: HashMap<KeyBytes, RecordId>,
    next_rid: RecordId,
    /// Indexes; the first is always `_id_`.
    pub indexes: Vec<Index>,
    counters: Arc<ScanCounters>,
}

impl Collection {
    /// A new empty collection with its `_id` index.
    pub fn new(db: &str, coll: &str, options: Document, counters: Arc<ScanCounters>) -> Collection {
        Collection {
            ns: format!("{db}.{coll}"),
            uuid: bson::Uuid::new(),
            options,
            docs: BTreeMap::new(),
            ids: HashMap::new(),
            next_rid: 1,
            indexes: vec![Index::id_index()],
            counters,
        }
    }

    /// The records a query with `filter` has to examine, in natural order, when an index
    /// serves it (`None`: every record). See `range_index.rs`.
    pub fn candidates(&self, filter: &Filter) -> Option<Vec<RecordId>> {
        let ranges = self.indexes.iter().filter_map(|i| i.range.as_ref());
        range_index::candidates(filter, ranges, &self.counters)
    }

    /// Counts documents a query examined (`serverStatus` `metrics.queryExecutor.scannedObjects`).
    pub fn examined(&self, n: u64) {
        self.counters.examined(n);
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Documents in natural order.
    pub fn iter(&self) -> impl Iterator<Item = (RecordId, &Document)> {
        self.docs.iter().map(|(r, d)| (*r, d))
    }

    /// A document by record id.
    pub fn get(&self, rid: RecordId) -> Option<&Document> {
        self.docs.get(&rid)
    }

    /// The record holding `_id == id`.
    pub fn find_id(&self, id: &Bson) -> Option<RecordId> {
        self.ids.get(&keys::key_of(id)).copied()
    }

    /// The duplicate-key error for `index` and `key_value`.
    fn dup_key(&self, index: &Index, key_value: Document) -> CommandError {
        CommandError::new(
            11000,
            "DuplicateKey",
            format!(
                "E11000 duplicate key error collection: {} index: {} dup key: {}",
                self.ns,
                index.name,
                keys::render_doc(&key_value)
            ),
        )
        .with_extra("keyPattern", index.key.clone())
        .with_extra("keyValue", key_value)
    }

    /// The duplicate-key error of the `_id` index for `id`.
    pub fn dup_id(&self, id: &Bson) -> CommandError {
        self.dup_key(&self.indexes[0], doc! {"_id": id.clone()})
    }

    /// Computes the secondary unique index keys of `doc`, failing on a conflict with another
    /// record.
    fn unique_keys(
        &self,
        doc: &Document,
        rid: RecordId,
        vars: &Vars,
    ) -> CommandResult<Vec<(usize, Vec<KeyBytes>)>> {
        let mut all = Vec::new();
        for (i, index) in self.indexes.iter().enumerate() {
            if !index.unique || index.is_id() {
                continue;
            }
            let Some(tuples) = index.keys_of(doc, vars)? else {
                continue;
            };
            let mut keys = Vec::with_capacity(tuples.len());
            for (bytes, kv) in tuples {
                if let Some(&other) = index.entries.get(&bytes) {
                    if other != rid {
                        return Err(self.dup_key(index, kv));
                    }
                }
                keys.push(bytes);
            }
            all.push((i, keys));
        }
        Ok(all)
    }

    fn remove_unique_keys(&mut self, doc: &Document, rid: RecordId, vars: &Vars) {
        for index in self.indexes.iter_mut() {
            if !index.unique || index.is_id() {
                continue;
            }
            // Keys were computable when the document was stored; the same input gives the same
            // answer, so an error here cannot happen (and would only leave a stale entry).
            if let Ok(Some(tuples)) = index.keys_of(doc, vars) {
                for (bytes, _) in tuples {
                    if index.entries.get(&bytes) == Some(&rid) {
                        index.entries.remove(&bytes);
                    }
                }
            }
        }
    }

    /// Inserts a document that already has its `_id` first. Fails with E11000 on a duplicate.
    pub fn insert(&mut self, doc: Document, vars: &Vars) -> CommandResult<RecordId> {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let id_key = keys::key_of(&id);
        if self.ids.contains_key(&id_key) {
            return Err(self.dup_id(&id));
        }
        let rid = self.next_rid;
        let unique = self.unique_keys(&doc, rid, vars)?;
        self.next_rid += 1;
        for (i, keys) in unique {
            for k in keys {
                self.indexes[i].entries.insert(k, rid);
            }
        }
        self.ids.insert(id_key, rid);
        for range in self.indexes.iter_mut().filter_map(|i| i.range.as_mut()) {
            range.insert(rid, &doc);
        }
        self.docs.insert(rid, doc);
        Ok(rid)
    }

    /// Replaces the document of `rid` (its `_id` must not change). Fails with E11000 when a
    /// unique index would be violated.
    pub fn replace(
        &mut self,
        rid: RecordId,
        new_doc: Document,
        vars: &Vars,
    ) -> CommandResult<Document> {
        let has_unique = self.indexes.iter().any(|i| i.unique && !i.is_id());
        if has_unique {
            let unique = self.unique_keys(&new_doc, rid, vars)?;
            if let Some(old) = self.docs.get(&rid).cloned() {
                self.remove_unique_keys(&old, rid, vars);
            }
            for (i, keys) in unique {
                for k in keys {
                    self.indexes[i].entries.insert(k, rid);
                }
            }
        }
        if let Some(old) = self.docs.get(&rid) {
            for range in self.indexes.iter_mut().filter_map(|i| i.range.as_mut()) {
                range.remove(rid, old);
                range.insert(rid, &new_doc);
            }
        }
        match self.docs.get_mut(&rid) {
            Some(slot) => Ok(std::mem::replace(slot, new_doc)),
            None => Err(CommandError::new(
                1,
                "InternalError",
                "record vanished during an update",
            )),
        }
    }

    /// Removes a document.
    pub fn remove(&mut self, rid: RecordId, vars: &Vars) -> Option<Document> {
        let doc = self.docs.remove(&rid)?;
        if let Some(id) = doc.get("_id") {
            self.ids.remove(&keys::key_of(id));
        }
        self.remove_unique_keys(&doc, rid, vars);
        for range in self.indexes.iter_mut().filter_map(|i| i.range.as_mut()) {
            range.remove(rid, &doc);
        }
        Some(doc)
    }

    /// Adds a secondary index, building its entries (E11000 if existing data violates it).
    pub fn add_index(&mut self, mut index: Index, vars: &Vars) -> CommandResult<()> {
        if index.unique {
            let mut entries: HashMap<KeyBytes, RecordId> = HashMap::new();
            for (&rid, doc) in &self.docs {
                if let Some(tuples) = index.keys_of(doc, vars)? {
                    for (bytes, kv) in tuples {
                        match entries.get(&bytes) {
                            Some(&other) if other != rid => return Err(self.dup_key(&index, kv)),
                            _ => {
                                entries.insert(bytes, rid);
                            }
                        }
                    }
                }
            }
            index.entries = entries;
        }
        if let Some(range) = index.range.as_mut() {
            for (&rid, doc) in &self.docs {
                range.insert(rid, doc);
            }
        }
        self.indexes.push(index);
        Ok(())
    }

    /// Removes the secondary index at position `i` (never `_id_`).
    pub fn remove_index(&mut self, i: usize) {
        if i > 0 && i < self.indexes.len() {
            self.indexes.remove(i);
        }
    }

    /// Whether any TTL index exists.
    pub fn has_ttl(&self) -> bool {
        self.indexes
            .iter()
            .any(|i| i.expire_after_seconds.is_some())
    }
}
