//! Rebuilds the history of every lock name (grants, extensions, releases, deletions) and of
//! every resource (accepted fenced writes).
//!
//! The core, [`LockHistory::apply_state`], takes each written version of a lock's fields
//! ([`LockState`]) or its deletion, in write order per name. Two inputs feed it:
//!
//! * MongoDB: [`LockHistory::apply`] reads a collection's change events, relying only on the
//!   documented shape of the documents (`leaseId`, `fencingToken`, `acquiredAt`, `expiresAt`,
//!   optionally under a lock field such as `_lock`), ignoring every other field. It keeps a copy
//!   of each document to which it applies `updatedFields` / `removedFields` (with dotted paths),
//!   so it never depends on `fullDocument: "updateLookup"` (which shows the document as it is
//!   *now*, not as the write left it).
//! * PostgreSQL: the rows of the history table filled by the harness's own trigger on the lock
//!   table (`postgres.rs`), each already a [`LockState`] with microsecond times.
//!
//! The slots of semaphore names are rebuilt the same way by [`SlotHistory`]: its core,
//! [`SlotHistory::apply_state`], takes each written version of a name's slots ([`SlotState`]),
//! read from MongoDB's change events ([`SlotHistory::apply`]) or from the same PostgreSQL
//! history rows (their `slot_limit` and `slots`).

use std::collections::{BTreeMap, HashMap};

use mongodb::bson::{Bson, Document};

use crate::checker::{AcceptedWrite, Grant, SlotEvent};

/// What happened to a document, as read from a change event.
#[derive(Clone, Debug)]
pub enum Change {
    /// `insert` or `replace`: the whole new document.
    Full(Document),
    /// `update`: the fields written (dotted paths allowed) and the fields removed.
    Update {
        updated: Document,
        removed: Vec<String>,
        /// `truncatedArrays`: (path, new length).
        truncated: Vec<(String, usize)>,
    },
    /// `delete` (for lock documents: the TTL monitor).
    Delete,
}

/// Applies `truncatedArrays`, then `updatedFields` / `removedFields` to a stored copy of a
/// document (an update's indexes are always within the truncated length).
pub fn apply_update(
    doc: &mut Document,
    updated: &Document,
    removed: &[String],
    truncated: &[(String, usize)],
) {
    for (path, len) in truncated {
        truncate_path(doc, path, *len);
    }
    for (path, value) in updated {
        set_path(doc, path, value.clone());
    }
    for path in removed {
        remove_path(doc, path);
    }
}

fn set_path(doc: &mut Document, path: &str, value: Bson) {
    match path.split_once('.') {
        None => {
            doc.insert(path, value);
        }
        Some((head, rest)) => {
            if !matches!(doc.get(head), Some(Bson::Document(_) | Bson::Array(_))) {
                doc.insert(head, Document::new());
            }
            if let Some(inner) = doc.get_mut(head) {
                set_in(inner, rest, value);
            }
        }
    }
}

/// Sets a dotted path inside a document or an array (numeric segments index arrays, as in
/// `updatedFields` such as `slots.2` or `slots.0.exp`).
fn set_in(target: &mut Bson, path: &str, value: Bson) {
    match target {
        Bson::Document(d) => set_path(d, path, value),
        Bson::Array(a) => {
            let (head, rest) = match path.split_once('.') {
                Some((h, r)) => (h, Some(r)),
                None => (path, None),
            };
            let Ok(i) = head.parse::<usize>() else { return };
            while a.len() <= i {
                a.push(Bson::Null);
            }
            match rest {
                None => a[i] = value,
                Some(rest) => {
                    if !matches!(a[i], Bson::Document(_) | Bson::Array(_)) {
                        a[i] = Bson::Document(Document::new());
                    }
                    set_in(&mut a[i], rest, value);
                }
            }
        }
        _ => {}
    }
}

fn remove_path(doc: &mut Document, path: &str) {
    match path.split_once('.') {
        None => {
            doc.remove(path);
        }
        Some((head, rest)) => match doc.get_mut(head) {
            Some(Bson::Document(inner)) => remove_path(inner, rest),
            Some(Bson::Array(a)) => {
                let (idx, rest) = match rest.split_once('.') {
                    Some((h, r)) => (h, Some(r)),
                    None => (rest, None),
                };
                if let (Ok(i), Some(rest)) = (idx.parse::<usize>(), rest) {
                    if let Some(Bson::Document(inner)) = a.get_mut(i) {
                        remove_path(inner, rest);
                    }
                }
            }
            _ => {}
        },
    }
}

/// Applies a `truncatedArrays` entry: the array at `path` keeps its first `len` elements.
fn truncate_path(doc: &mut Document, path: &str, len: usize) {
    match path.split_once('.') {
        None => {
            if let Some(Bson::Array(a)) = doc.get_mut(path) {
                a.truncate(len);
            }
        }
        Some((head, rest)) => {
            if let Some(Bson::Document(inner)) = doc.get_mut(head) {
                truncate_path(inner, rest, len);
            }
        }
    }
}

/// Reads a (possibly dotted) path.
pub fn get_path<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    match path.split_once('.') {
        None => doc.get(path),
        Some((head, rest)) => match doc.get(head) {
            Some(Bson::Document(inner)) => get_path(inner, rest),
            _ => None,
        },
    }
}

/// A date (or integer milliseconds) as µs since the epoch.
pub fn micros(v: Option<&Bson>) -> Option<i64> {
    match v? {
        Bson::DateTime(d) => Some(d.timestamp_millis().saturating_mul(1000)),
        Bson::Int64(i) => Some(i.saturating_mul(1000)),
        Bson::Int32(i) => Some(i64::from(*i) * 1000),
        _ => None,
    }
}

/// A non-negative integer.
pub fn uint(v: Option<&Bson>) -> Option<u64> {
    match v? {
        Bson::Int64(i) => u64::try_from(*i).ok(),
        Bson::Int32(i) => u64::try_from(*i).ok(),
        Bson::Double(f) if *f >= 0.0 && f.fract() == 0.0 => Some(*f as u64),
        _ => None,
    }
}

/// The lease currently open on a name.
#[derive(Clone, Debug)]
struct Open {
    lease: String,
    holder: String,
    tokens: Vec<u64>,
    start_us: i64,
    end_us: i64,
}

impl Open {
    fn close(self, name: &str, released: bool) -> Grant {
        Grant {
            name: name.to_owned(),
            lease: self.lease,
            tokens: self.tokens,
            start_us: self.start_us,
            end_us: self.end_us,
            released,
            holder: self.holder,
        }
    }
}

/// The lock fields of one written version of a lock document or row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockState {
    /// The lease id (`None`: no lease, e.g. after a release).
    pub lease: Option<String>,
    /// The fencing token (`None`: not stamped yet).
    pub token: Option<u64>,
    /// Server time (µs) of the grant.
    pub acquired_us: Option<i64>,
    /// Server time (µs) of the expiry.
    pub expires_us: Option<i64>,
    /// The holder's application name.
    pub holder: String,
}

/// Per name: the stored copy of the document (MongoDB) and the lease open on it.
#[derive(Default)]
struct NameState {
    doc: Document,
    open: Option<Open>,
}

/// The grant history of one lock collection.
pub struct LockHistory {
    /// Prefix of the lock fields: `""` for a lock collection, `"_lock."` for document locks.
    prefix: String,
    names: HashMap<String, NameState>,
    grants_opened: u64,
    deletes: u64,
}

impl LockHistory {
    /// A history of the lock fields found under `lock_field` (`None`: top level).
    pub fn new(lock_field: Option<&str>) -> Self {
        LockHistory {
            prefix: lock_field.map(|f| format!("{f}.")).unwrap_or_default(),
            names: HashMap::new(),
            grants_opened: 0,
            deletes: 0,
        }
    }

    fn field<'a>(&self, doc: &'a Document, name: &str) -> Option<&'a Bson> {
        get_path(doc, &format!("{}{name}", self.prefix))
    }

    /// Grants opened so far (the acquisitions the recorder saw).
    pub fn grants_opened(&self) -> u64 {
        self.grants_opened
    }

    /// Documents deleted so far (TTL cleanup).
    pub fn deletes(&self) -> u64 {
        self.deletes
    }

    /// One change of the document of `name` (a MongoDB change event); returns the grants it
    /// closed.
    pub fn apply(&mut self, name: &str, change: Change) -> Vec<Grant> {
        let doc = match change {
            Change::Delete => return self.apply_state(name, None),
            Change::Full(doc) => doc,
            Change::Update {
                updated,
                removed,
                truncated,
            } => {
                let mut doc = self
                    .names
                    .get_mut(name)
                    .map(|s| std::mem::take(&mut s.doc))
                    .unwrap_or_default();
                apply_update(&mut doc, &updated, &removed, &truncated);
                doc
            }
        };
        let state = LockState {
            lease: match self.field(&doc, "leaseId") {
                Some(Bson::String(s)) => Some(s.clone()),
                _ => None,
            },
            token: uint(self.field(&doc, "fencingToken")),
            acquired_us: micros(self.field(&doc, "acquiredAt")),
            expires_us: micros(self.field(&doc, "expiresAt")),
            holder: match self.field(&doc, "holder.app") {
                Some(Bson::String(s)) => s.clone(),
                _ => String::new(),
            },
        };
        let closed = self.apply_state(name, Some(state));
        if let Some(s) = self.names.get_mut(name) {
            s.doc = doc;
        }
        closed
    }

    /// One written version of the lock fields of `name` (`None`: the document or row was
    /// deleted), in write order per name; returns the grants it closed.
    pub fn apply_state(&mut self, name: &str, written: Option<LockState>) -> Vec<Grant> {
        let mut closed = Vec::new();
        let mut state = self.names.remove(name).unwrap_or_default();
        let Some(written) = written else {
            self.deletes += 1;
            if let Some(open) = state.open.take() {
                closed.push(open.close(name, false));
            }
            // Forget the name entirely: its next document starts afresh (tokens are still
            // compared by the checker, which remembers them).
            return closed;
        };
        let LockState {
            lease,
            token,
            acquired_us: acquired,
            expires_us: expires,
            holder,
        } = written;
        match lease {
            Some(lease) => {
                let continuing = state.open.as_ref().is_some_and(|o| o.lease == lease);
                if continuing {
                    if let Some(open) = state.open.as_mut() {
                        if let Some(t) = token {
                            if open.tokens.last() != Some(&t) {
                                open.tokens.push(t);
                            }
                        }
                        if let Some(e) = expires {
                            open.end_us = e;
                        }
                    }
                } else {
                    if let Some(open) = state.open.take() {
                        closed.push(open.close(name, false));
                    }
                    self.grants_opened += 1;
                    let start = acquired.unwrap_or(i64::MIN);
                    state.open = Some(Open {
                        lease,
                        holder,
                        tokens: token.into_iter().collect(),
                        start_us: start,
                        end_us: expires.unwrap_or(start),
                    });
                }
            }
            None => {
                if let Some(mut open) = state.open.take() {
                    if let Some(e) = expires {
                        open.end_us = e;
                    }
                    closed.push(open.close(name, true));
                }
            }
        }
        self.names.insert(name.to_owned(), state);
        closed
    }

    /// Closes every lease still open (end of the recording) and returns them.
    pub fn finish(&mut self) -> Vec<Grant> {
        let mut closed = Vec::new();
        for (name, state) in self.names.iter_mut() {
            if let Some(open) = state.open.take() {
                closed.push(open.close(name, false));
            }
        }
        closed.sort_by(|a, b| a.name.cmp(&b.name));
        closed
    }
}

/// The accepted-writes history of the resource collection: each document holds `maxToken` and
/// `last: {token, writeId, worker, at}`, set together by an accepted fenced write.
#[derive(Default)]
pub struct ResourceHistory {
    docs: HashMap<String, Document>,
}

impl ResourceHistory {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// One change of the resource `name`; returns the write it accepted, if any.
    pub fn apply(&mut self, name: &str, change: Change) -> Option<AcceptedWrite> {
        let doc = self.docs.entry(name.to_owned()).or_default();
        let before = match get_path(doc, "last.writeId") {
            Some(Bson::String(s)) => Some(s.clone()),
            _ => None,
        };
        match change {
            Change::Full(full) => *doc = full,
            Change::Update {
                updated,
                removed,
                truncated,
            } => apply_update(doc, &updated, &removed, &truncated),
            Change::Delete => {
                doc.clear();
                return None;
            }
        }
        let write_id = match get_path(doc, "last.writeId") {
            Some(Bson::String(s)) => s.clone(),
            _ => return None,
        };
        if before.as_deref() == Some(write_id.as_str()) {
            return None;
        }
        Some(AcceptedWrite {
            name: name.to_owned(),
            token: uint(get_path(doc, "last.token")).unwrap_or(0),
            write_id,
            worker: match get_path(doc, "last.worker") {
                Some(Bson::String(s)) => s.clone(),
                _ => String::new(),
            },
            at_us: micros(get_path(doc, "last.at")).unwrap_or(0),
        })
    }
}

/// A slot of a semaphore document as the recorder last saw it.
#[derive(Clone, Debug)]
struct SeenSlot {
    token: Option<u64>,
    at_us: i64,
    exp_us: i64,
}

/// One slot of one written version of a semaphore document or row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotEntry {
    /// The slot's lease id.
    pub id: String,
    /// Its fencing token (`None`: not stamped yet).
    pub token: Option<u64>,
    /// Server time (µs) of its grant (`at`; `None`: missing).
    pub at_us: Option<i64>,
    /// Server time (µs) of its expiry (`exp`; `None`: missing, taken as its `at`).
    pub exp_us: Option<i64>,
    /// The holder's application name.
    pub holder: String,
}

/// How a write of a semaphore tells which slot its holder released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotRelease {
    /// The write names the released slot, or none (MongoDB: `leaseId: {released: <id>}`).
    Marked(Option<String>),
    /// The write names none (PostgreSQL's row keeps no such mark); the release is inferred
    /// from what the write did, `write_us` being a server time at or after the write's own
    /// clock reading (the history trigger's `clock_timestamp()`). A release removes the
    /// caller's slot and, at most, slots already expired, grants none and leaves the row in
    /// slot mode. So in a write that grants no slot and keeps a limit, the slot that
    /// disappeared while unexpired at `write_us` is the released one when there is exactly
    /// one such (else, when one slot disappeared in all, that one: its holder released it
    /// after its expiry). Any other disappearance (more than one unexpired slot gone, or in a
    /// write that grants, drops the limit or deletes the row) counts as not released: those
    /// slots stay counted until their `exp`, so a grant that a wrongly removed slot made room
    /// for is reported.
    Inferred {
        /// Server time (µs) at or after the write.
        write_us: i64,
    },
}

/// The semaphore fields of one written version of a document or row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotState {
    /// The slot limit (`None`: not in slot mode, or no limit written).
    pub limit: Option<u64>,
    /// The slots, in stored order.
    pub slots: Vec<SlotEntry>,
    /// Which slot the write released.
    pub release: SlotRelease,
}

impl SlotState {
    /// The semaphore fields of a MongoDB document: `limit`, `slots: [{id, token, at, exp,
    /// holder}]` and the release mark `leaseId: {released: <id>}`.
    pub fn of_document(doc: &Document) -> SlotState {
        let released = match get_path(doc, "leaseId.released") {
            Some(Bson::String(s)) => Some(s.clone()),
            _ => None,
        };
        let mut slots = Vec::new();
        if let Some(Bson::Array(array)) = doc.get("slots") {
            for s in array {
                let Bson::Document(s) = s else { continue };
                let Ok(id) = s.get_str("id") else { continue };
                slots.push(SlotEntry {
                    id: id.to_owned(),
                    token: uint(s.get("token")),
                    at_us: micros(s.get("at")),
                    exp_us: micros(s.get("exp")),
                    holder: match get_path(s, "holder.app") {
                        Some(Bson::String(h)) => h.clone(),
                        _ => String::new(),
                    },
                });
            }
        }
        SlotState {
            limit: uint(doc.get("limit")),
            slots,
            release: SlotRelease::Marked(released),
        }
    }
}

/// The slot history of the semaphore names of a lock collection or table.
///
/// The core, [`SlotHistory::apply_state`], takes each written version of a name's semaphore
/// fields ([`SlotState`]) or its deletion, in write order per name. Two inputs feed it:
///
/// * MongoDB: [`SlotHistory::apply`] reads the change events of the semaphore documents
///   (names with [`crate::config::SEM_PREFIX`]) into a stored copy of each, as
///   [`LockHistory::apply`] does, relying on the documented shape only: `limit`,
///   `slots: [{id, token, at, exp, holder}]`; a release writes `leaseId: {released: <id>}`.
/// * PostgreSQL: the `slot_limit` and `slots` columns recorded by the harness's trigger on the
///   lock table (`postgres.rs`), the release inferred ([`SlotRelease::Inferred`]).
///
/// Per write of a name it compares the slots the write left with the ones before: a slot id
/// that appears is a grant (from its `at`), one whose `at` changed is a grant again (a retry
/// replaces its own slot), a changed `token` is a stamp, a changed `exp` an extension; one that
/// disappears ended: *released* when the write released it (its end is that write, in write
/// order), else pruned after expiry (or deleted with the document or row) and its end is its
/// last `exp` seen.
#[derive(Default)]
pub struct SlotHistory {
    docs: HashMap<String, Document>,
    open: HashMap<String, BTreeMap<String, SeenSlot>>,
}

impl SlotHistory {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// One change of the semaphore document `name` (a MongoDB change event); returns what
    /// happened to its slots, in an order the checker can apply (ends before grants).
    pub fn apply(&mut self, name: &str, change: Change) -> Vec<SlotEvent> {
        let doc = match change {
            Change::Delete => {
                self.docs.remove(name);
                return self.apply_state(name, None);
            }
            Change::Full(doc) => doc,
            Change::Update {
                updated,
                removed,
                truncated,
            } => {
                let mut doc = self.docs.remove(name).unwrap_or_default();
                apply_update(&mut doc, &updated, &removed, &truncated);
                doc
            }
        };
        let state = SlotState::of_document(&doc);
        self.docs.insert(name.to_owned(), doc);
        self.apply_state(name, Some(state))
    }

    /// One written version of the semaphore fields of `name` (`None`: the document or row was
    /// deleted), in write order per name; returns what happened to its slots, in an order the
    /// checker can apply (ends before grants).
    pub fn apply_state(&mut self, name: &str, written: Option<SlotState>) -> Vec<SlotEvent> {
        let mut events = Vec::new();
        let before = self.open.remove(name).unwrap_or_default();
        let Some(written) = written else {
            for (id, slot) in before {
                events.push(SlotEvent::Ended {
                    name: name.to_owned(),
                    id,
                    released: false,
                    end_us: slot.exp_us,
                });
            }
            return events;
        };
        let limit = written.limit;
        let mut now: BTreeMap<String, (SeenSlot, String)> = BTreeMap::new();
        for s in written.slots {
            let at_us = s.at_us.unwrap_or(i64::MIN);
            let seen = SeenSlot {
                token: s.token,
                at_us,
                exp_us: s.exp_us.unwrap_or(at_us),
            };
            now.insert(s.id, (seen, s.holder));
        }
        let gone: Vec<(&String, &SeenSlot)> = before
            .iter()
            .filter(|(id, _)| !now.contains_key(*id))
            .collect();
        let released = match written.release {
            SlotRelease::Marked(id) => id,
            SlotRelease::Inferred { write_us } => {
                let grants = now.iter().any(|(id, (seen, _))| {
                    before.get(id).is_none_or(|old| old.at_us != seen.at_us)
                });
                let unexpired: Vec<&String> = gone
                    .iter()
                    .filter(|(_, s)| s.exp_us > write_us)
                    .map(|(id, _)| *id)
                    .collect();
                if grants || limit.is_none() {
                    None
                } else if let [id] = unexpired.as_slice() {
                    Some((*id).clone())
                } else if let ([], [(id, _)]) = (unexpired.as_slice(), gone.as_slice()) {
                    Some((*id).clone())
                } else {
                    None
                }
            }
        };
        for (id, slot) in gone {
            events.push(SlotEvent::Ended {
                name: name.to_owned(),
                id: id.clone(),
                released: released.as_deref() == Some(id.as_str()),
                end_us: slot.exp_us,
            });
        }
        let mut open = BTreeMap::new();
        for (id, (seen, holder)) in now {
            match before.get(&id) {
                Some(old) if old.at_us == seen.at_us => {
                    if seen.token.is_some() && seen.token != old.token {
                        events.push(SlotEvent::Token {
                            name: name.to_owned(),
                            id: id.clone(),
                            token: seen.token.unwrap_or(0),
                        });
                    }
                    if seen.exp_us != old.exp_us {
                        events.push(SlotEvent::Extended {
                            name: name.to_owned(),
                            id: id.clone(),
                            exp_us: seen.exp_us,
                        });
                    }
                }
                _ => events.push(SlotEvent::Granted {
                    name: name.to_owned(),
                    id: id.clone(),
                    token: seen.token,
                    at_us: seen.at_us,
                    exp_us: seen.exp_us,
                    limit: limit.unwrap_or(0),
                    holder,
                }),
            }
            open.insert(id, seen);
        }
        if !open.is_empty() {
            self.open.insert(name.to_owned(), open);
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::{Checker, ViolationKind};
    use mongodb::bson::{doc, DateTime};

    fn at(ms: i64) -> DateTime {
        DateTime::from_millis(ms)
    }

    fn grant_doc(lease: &str, token: i64, acquired: i64, expires: i64) -> Document {
        doc! { "leaseId": lease, "fencingToken": token, "acquiredAt": at(acquired),
        "expiresAt": at(expires), "holder": { "host": "h" }, "extra": 1 }
    }

    fn run(events: Vec<Change>) -> Checker {
        let mut h = LockHistory::new(None);
        let mut c = Checker::new();
        for e in events {
            for g in h.apply("n", e) {
                c.grant(g);
            }
        }
        for g in h.finish() {
            c.grant(g);
        }
        c
    }

    #[test]
    fn grant_extend_release_takeover_is_clean() {
        let c = run(vec![
            Change::Full(grant_doc("a", 1, 0, 100)),
            Change::Update {
                updated: doc! { "expiresAt": at(150) },
                removed: vec![],
                truncated: vec![],
            },
            Change::Update {
                updated: doc! { "leaseId": Bson::Null, "expiresAt": at(120) },
                removed: vec![],
                truncated: vec![],
            },
            Change::Update {
                updated: grant_doc("b", 2, 130, 230),
                removed: vec![],
                truncated: vec![],
            },
            // b ran out; c took over after its expiry.
            Change::Update {
                updated: grant_doc("c", 3, 231, 331),
                removed: vec![],
                truncated: vec![],
            },
            Change::Delete,
            // A fresh document after TTL cleanup: unstamped grant, then the stamp.
            Change::Full(doc! { "leaseId": "d", "fencingToken": Bson::Null,
            "acquiredAt": at(5000), "expiresAt": at(5100) }),
            Change::Update {
                updated: doc! { "fencingToken": 4_294_967_297_i64 },
                removed: vec![],
                truncated: vec![],
            },
        ]);
        assert_eq!(c.total(), 0, "{:?}", c.first());
        assert_eq!(c.grants_checked(), 4);
    }

    #[test]
    fn detects_an_overlap_planted_in_change_events() {
        let c = run(vec![
            Change::Full(grant_doc("a", 1, 0, 100)),
            Change::Update {
                updated: doc! { "expiresAt": at(150) },
                removed: vec![],
                truncated: vec![],
            },
            // b granted at 140 while a's lease runs until 150.
            Change::Update {
                updated: grant_doc("b", 2, 140, 240),
                removed: vec![],
                truncated: vec![],
            },
        ]);
        assert_eq!(c.counts().get(&ViolationKind::Overlap), Some(&1));
    }

    #[test]
    fn detects_a_token_repeated_across_ttl_deletion() {
        let c = run(vec![
            Change::Full(grant_doc("a", 7, 0, 100)),
            Change::Delete,
            Change::Full(grant_doc("b", 7, 2000, 2100)),
        ]);
        assert_eq!(c.counts().get(&ViolationKind::TokenNotIncreasing), Some(&1));
    }

    #[test]
    fn reads_document_lock_fields_under_the_lock_field() {
        let mut h = LockHistory::new(Some("_lock"));
        let mut c = Checker::new();
        let events = vec![
            Change::Full(doc! { "_id": 1, "job": true }),
            Change::Update {
                updated: doc! { "_lock": grant_doc("a", 1, 0, 100) },
                removed: vec![],
                truncated: vec![],
            },
            Change::Update {
                updated: doc! { "_lock.expiresAt": at(300) },
                removed: vec![],
                truncated: vec![],
            },
            Change::Update {
                updated: doc! { "_lock": grant_doc("b", 2, 200, 400) },
                removed: vec![],
                truncated: vec![],
            },
        ];
        for e in events {
            for g in h.apply("jobs:1", e) {
                c.grant(g);
            }
        }
        for g in h.finish() {
            c.grant(g);
        }
        assert_eq!(c.counts().get(&ViolationKind::Overlap), Some(&1));
    }

    #[test]
    fn resource_history_reports_each_accepted_write_once() {
        let mut r = ResourceHistory::new();
        let w = |id: &str, token: i64| {
            doc! { "_id": "n", "maxToken": token,
            "last": { "token": token, "writeId": id, "worker": "w1", "at": at(5) } }
        };
        assert!(r.apply("n", Change::Full(w("x1", 1))).is_some());
        // A no-op event (refused write) reports nothing.
        assert!(r
            .apply(
                "n",
                Change::Update {
                    updated: doc! {},
                    removed: vec![],
                    truncated: vec![]
                }
            )
            .is_none());
        let next = r.apply(
            "n",
            Change::Update {
                updated: doc! { "maxToken": 3_i64, "last.token": 3_i64, "last.writeId": "x2" },
                removed: vec![],
                truncated: vec![],
            },
        );
        assert_eq!(next.map(|w| (w.token, w.write_id)), Some((3, "x2".into())));
    }

    fn slot_doc(id: &str, token: i64, at_ms: i64, exp_ms: i64) -> Bson {
        Bson::Document(
            doc! { "id": id, "token": token, "at": at(at_ms), "exp": at(exp_ms),
            "holder": { "app": "torture w1" } },
        )
    }

    #[test]
    fn slot_history_follows_array_updates_and_truncations() {
        let mut h = SlotHistory::new();
        let mut c = Checker::new();
        let events = vec![
            Change::Full(doc! { "_id": "sem-0", "limit": 2, "leaseId": "a",
            "slots": [slot_doc("a", 1, 0, 100)] }),
            // b appended, a extended.
            Change::Update {
                updated: doc! { "slots.1": slot_doc("b", 2, 10, 110), "slots.0.exp": at(150),
                "leaseId": "b" },
                removed: vec![],
                truncated: vec![],
            },
            // a released: b moves to index 0, the array is truncated.
            Change::Update {
                updated: doc! { "slots.0": slot_doc("b", 2, 10, 110),
                "leaseId": { "released": "a" } },
                removed: vec![],
                truncated: vec![("slots".into(), 1)],
            },
            // c granted at 20 (a's `exp` was 150, but a was released first in write order).
            Change::Update {
                updated: doc! { "slots.1": slot_doc("c", 3, 20, 120), "leaseId": "c" },
                removed: vec![],
                truncated: vec![],
            },
            // b expired and is pruned by d's grant at 115: c and d live, limit 2 kept.
            Change::Full(doc! { "_id": "sem-0", "limit": 2, "leaseId": "d",
            "slots": [slot_doc("c", 3, 20, 120), slot_doc("d", 4, 115, 215)] }),
            Change::Delete,
        ];
        for e in events {
            for ev in h.apply("sem-0", e) {
                c.slot(ev);
            }
        }
        assert_eq!(c.total(), 0, "{:?}", c.first());
        let n = c.slot_counts();
        assert_eq!((n.granted, n.released, n.expired), (4, 1, 3));

        // The same, but d granted at 105, before b's expiry (110): three live, limit 2.
        let mut h = SlotHistory::new();
        let mut c = Checker::new();
        for e in [
            Change::Full(doc! { "_id": "sem-0", "limit": 2, "leaseId": "b",
            "slots": [slot_doc("b", 2, 10, 110), slot_doc("c", 3, 20, 120)] }),
            Change::Full(doc! { "_id": "sem-0", "limit": 2, "leaseId": "d",
            "slots": [slot_doc("c", 3, 20, 120), slot_doc("d", 3, 105, 205)] }),
        ] {
            for ev in h.apply("sem-0", e) {
                c.slot(ev);
            }
        }
        assert_eq!(c.counts().get(&ViolationKind::SlotOverLimit), Some(&1));
        assert_eq!(
            c.counts().get(&ViolationKind::SlotTokenNotIncreasing),
            Some(&1)
        );
    }

    fn pg_slot(id: &str, token: u64, at_us: i64, exp_us: i64) -> SlotEntry {
        SlotEntry {
            id: id.into(),
            token: Some(token),
            at_us: Some(at_us),
            exp_us: Some(exp_us),
            holder: "torture w1".into(),
        }
    }

    fn pg_row(limit: Option<u64>, slots: Vec<SlotEntry>, write_us: i64) -> Option<SlotState> {
        Some(SlotState {
            limit,
            slots,
            release: SlotRelease::Inferred { write_us },
        })
    }

    fn run_slots(rows: Vec<Option<SlotState>>) -> Checker {
        let mut h = SlotHistory::new();
        let mut c = Checker::strict_release_order();
        for r in rows {
            for ev in h.apply_state("sem-0", r) {
                c.slot(ev);
            }
        }
        c
    }

    #[test]
    fn slot_history_infers_postgres_releases() {
        // a and b granted; a released (b expired at 60 and pruned by the same write, 70);
        // c granted into the room; c released after its expiry (the only slot gone); d and
        // e granted; the row deleted.
        let c = run_slots(vec![
            pg_row(Some(2), vec![pg_slot("a", 1, 0, 100)], 1),
            pg_row(
                Some(2),
                vec![pg_slot("a", 1, 0, 100), pg_slot("b", 2, 10, 60)],
                11,
            ),
            pg_row(Some(2), vec![], 70),
            pg_row(Some(2), vec![pg_slot("c", 4, 80, 180)], 81),
            pg_row(Some(2), vec![], 200),
            pg_row(
                Some(2),
                vec![pg_slot("d", 6, 210, 310), pg_slot("e", 7, 220, 320)],
                221,
            ),
            None,
        ]);
        assert_eq!(c.total(), 0, "{:?}", c.first());
        let n = c.slot_counts();
        assert_eq!((n.granted, n.released, n.expired), (5, 2, 3), "{n:?}");

        // A write that removes two unexpired slots is not a release: both stay counted until
        // their expiry, so the grant they made room for is over the limit.
        let c = run_slots(vec![
            pg_row(
                Some(2),
                vec![pg_slot("a", 1, 0, 100), pg_slot("b", 2, 10, 100)],
                11,
            ),
            pg_row(Some(2), vec![], 20),
            pg_row(Some(2), vec![pg_slot("c", 4, 30, 130)], 31),
        ]);
        assert_eq!(c.counts().get(&ViolationKind::SlotOverLimit), Some(&1));
        assert_eq!(c.slot_counts().released, 0);

        // Nor is a grant that drops an unexpired slot to make room for its own.
        let c = run_slots(vec![
            pg_row(
                Some(2),
                vec![pg_slot("a", 1, 0, 100), pg_slot("b", 2, 10, 100)],
                11,
            ),
            pg_row(
                Some(2),
                vec![pg_slot("b", 2, 10, 100), pg_slot("c", 3, 20, 120)],
                21,
            ),
        ]);
        assert_eq!(c.counts().get(&ViolationKind::SlotOverLimit), Some(&1));
    }
}
