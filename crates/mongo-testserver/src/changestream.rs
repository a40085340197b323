//! Change streams: the event log every write appends to (inside the store's critical section, so
//! events are totally ordered with writes) and the cursors that read it.
//!
//! Resume tokens are `{_data: <hex>}` where the hex encodes this server's epoch, the event's
//! cluster time, its sequence number and a kind byte (event, invalidate, or high-water mark).
//!
//! # Filtering before building an event
//! Every write is read by every open stream of its namespace. Building a change event costs
//! (the resume token, a copy of the full document, the `updateDescription`, an `updateLookup`
//! read of the collection), and a stream narrowed by its `$match` to a few documents (or to a
//! few kinds of update) drops most of them. So, as mongod 5.1 and later does during its oplog
//! read (it rewrites predicates on `operationType`, `ns`, `documentKey` and
//! `updateDescription` into its oplog filter: `jstests/change_streams/`
//! `change_stream_match_pushdown_*_rewrite.js`), a stream first tests part of its leading
//! `$match` against the event's *key fields* alone — `operationType`, `ns`, `documentKey` and
//! `updateDescription`, built at most once per write — and builds the full event only when that
//! test passes. (Which predicate shapes mongod rewrites differs by version; a predicate it does
//! not rewrite costs it a built event, never a different result.) The events a stream returns
//! are exactly those it returned without the test:
//!
//! * Only a stream whose first stage is a `$match` (and whose stages all parse) is tested, so
//!   the `$match` sees the event as built, before any other stage changes it.
//! * The `$match` filter is split into its top-level conjuncts (`$and`s flattened). A conjunct
//!   is *pushed down* only if every field path it reads, through `$and`/`$or`/`$nor`, starts with
//!   `operationType`, `ns`, `documentKey` or `updateDescription`, and it uses no top-level operator other than
//!   `$and`, `$or`, `$nor`, `$comment`, `$alwaysTrue`, `$alwaysFalse` (so not `$expr`, which may
//!   read anything). A query predicate on a path reads only the values at that path, and the
//!   partial event holds those four fields with the very values the full event holds (and
//!   lacks them exactly when the full event does). So a pushed-down conjunct is true of the
//!   partial event exactly when it is true of the full one: it cannot depend on a field the
//!   partial event lacks. A conjunct that reads anything else (`fullDocument`, `clusterTime`,
//!   an `$or` with one such branch...) is never evaluated early.
//! * The partial event is used only to *reject*: when a pushed-down conjunct is false, the
//!   whole conjunction is false on the full event too, and the event is skipped. Otherwise the
//!   full event is built and the whole `$match` (and every later stage) runs on it as before.
//! * Only a `$match` without `$expr` anywhere is pushed down: a filter without `$expr` cannot
//!   fail while matching, so rejecting early cannot hide an error a later-evaluated conjunct
//!   would have raised on the full event. Building an event has no effects (an `updateLookup`
//!   only reads), and a skipped event still ends the stream when it is the drop that
//!   invalidates it.

use std::collections::VecDeque;

use bson::{doc, Bson, DateTime, Document, Timestamp};
use tokio::sync::watch;

use crate::clock::ts_cmp;
use crate::engine::expr::Vars;
use crate::engine::matcher::Filter;
use crate::error::{CommandError, CommandResult};
use crate::store::Store;

/// How many events the log keeps; resuming before the oldest answers ChangeStreamHistoryLost.
pub const EVENT_LOG_CAPACITY: usize = 100_000;

/// The kind of a logged change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpType {
    /// A document was inserted.
    Insert,
    /// A document was updated with operators or a pipeline.
    Update,
    /// A document was replaced.
    Replace,
    /// A document was deleted.
    Delete,
    /// A collection was dropped.
    Drop,
    /// A database was dropped.
    DropDatabase,
}

impl OpType {
    fn name(self) -> &'static str {
        match self {
            OpType::Insert => "insert",
            OpType::Update => "update",
            OpType::Replace => "replace",
            OpType::Delete => "delete",
            OpType::Drop => "drop",
            OpType::DropDatabase => "dropDatabase",
        }
    }
}

/// One logged change.
#[derive(Debug, Clone)]
pub struct Event {
    /// Position in the log (strictly increasing).
    pub seq: u64,
    /// Wall-clock time of the write.
    pub wall_time: DateTime,
    /// What changed.
    pub change: NewEvent,
    /// The event's key fields (`operationType`, `ns`, `documentKey`), exactly as the full event
    /// shows them: what a stream's [pushed-down](self#filtering-before-building-an-event)
    /// conjuncts are tested against. Built when a stream first needs them (never when no
    /// stream pushes a conjunct down), then shared by every stream.
    key_fields: std::sync::OnceLock<Document>,
}

/// The bounded event log.
pub struct EventLog {
    events: VecDeque<Event>,
    next_seq: u64,
    epoch: u32,
    capacity: usize,
    tx: watch::Sender<u64>,
}

impl Default for EventLog {
    fn default() -> Self {
        let (tx, _) = watch::channel(0);
        EventLog {
            events: VecDeque::new(),
            next_seq: 1,
            epoch: rand::random::<u32>(),
            capacity: EVENT_LOG_CAPACITY,
            tx,
        }
    }
}

/// Everything an event needs besides its position (and wall-clock time).
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// Cluster time of the write.
    pub cluster_time: Timestamp,
    /// Database.
    pub db: String,
    /// Collection.
    pub coll: String,
    /// Kind.
    pub op: OpType,
    /// `{_id}`.
    pub document_key: Option<Document>,
    /// Full document (insert/replace).
    pub full_document: Option<Document>,
    /// Update description (update).
    pub update_description: Option<Document>,
}

/// `ns` of an event as its change document shows it.
fn ns_doc(e: &NewEvent) -> Document {
    if e.op == OpType::DropDatabase {
        doc! {"db": e.db.clone()}
    } else {
        doc! {"db": e.db.clone(), "coll": e.coll.clone()}
    }
}

/// The partial event of `e`: its [`KEY_FIELDS`], with the values the full event has.
fn key_fields(e: &NewEvent) -> Document {
    let mut d = doc! {
        "operationType": e.op.name(),
        "ns": ns_doc(e),
    };
    if let Some(k) = &e.document_key {
        d.insert("documentKey", k.clone());
    }
    if let Some(u) = &e.update_description {
        d.insert("updateDescription", u.clone());
    }
    d
}

impl EventLog {
    /// Appends an event and wakes waiting change-stream cursors.
    pub fn push(&mut self, e: NewEvent) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.events.len() >= self.capacity {
            self.events.pop_front();
        }
        self.events.push_back(Event {
            seq,
            wall_time: DateTime::now(),
            change: e,
            key_fields: std::sync::OnceLock::new(),
        });
        self.tx.send_replace(seq);
    }

    /// A receiver that sees every later push.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// The sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn first_seq(&self) -> u64 {
        self.events.front().map(|e| e.seq).unwrap_or(self.next_seq)
    }

    fn get(&self, seq: u64) -> Option<&Event> {
        let first = self.events.front()?.seq;
        let idx = seq.checked_sub(first)?;
        self.events.get(idx as usize)
    }

    /// Events with `seq >= from`.
    fn from(&self, from: u64) -> impl Iterator<Item = &Event> {
        let first = self.first_seq();
        let skip = from.saturating_sub(first) as usize;
        self.events.iter().skip(skip)
    }
}

const KIND_EVENT: u8 = 0;
const KIND_INVALIDATE: u8 = 1;
const KIND_HIGH_WATER: u8 = 2;

fn make_token(epoch: u32, ts: Timestamp, seq: u64, kind: u8) -> Document {
    doc! {"_data": format!("82{:08X}{:08X}{:08X}{:016X}{:02X}", epoch, ts.time, ts.increment, seq, kind)}
}

struct Token {
    epoch: u32,
    ts: Timestamp,
    seq: u64,
    kind: u8,
}

fn parse_token(token: &Bson) -> CommandResult<Token> {
    let bad = || {
        CommandError::new(
            280,
            "ChangeStreamFatalError",
            format!("cannot resume stream; the resume token was not found. {token}"),
        )
    };
    let data = match token {
        Bson::Document(d) => match d.get("_data") {
            Some(Bson::String(s)) if d.len() == 1 => s.as_str(),
            _ => {
                return Err(CommandError::bad_value(format!(
                    "invalid resume token: {token}"
                )))
            }
        },
        other => {
            return Err(CommandError::type_mismatch(format!(
            "BSON field '$changeStream.resumeAfter' is the wrong type '{}', expected type 'object'",
            crate::engine::compare::type_name(other)
        )))
        }
    };
    if data.len() != 2 + 8 + 8 + 8 + 16 + 2 || !data.starts_with("82") {
        return Err(bad());
    }
    let hex = |r: std::ops::Range<usize>| data.get(r).and_then(|s| u64::from_str_radix(s, 16).ok());
    let (Some(epoch), Some(time), Some(inc), Some(seq), Some(kind)) = (
        hex(2..10),
        hex(10..18),
        hex(18..26),
        hex(26..42),
        hex(42..44),
    ) else {
        return Err(bad());
    };
    Ok(Token {
        epoch: epoch as u32,
        ts: Timestamp {
            time: time as u32,
            increment: inc as u32,
        },
        seq,
        kind: kind as u8,
    })
}

/// What a stream watches.
#[derive(Debug, Clone)]
pub enum Scope {
    /// One collection.
    Collection(String, String),
    /// Every collection of a database.
    Database(String),
    /// Every database.
    Cluster,
}

/// A change-stream cursor's state.
pub struct StreamCursor {
    scope: Scope,
    update_lookup: bool,
    /// The later stages, parsed once at open; a stage that does not parse fails the first
    /// event that reaches it, as before.
    stages: Result<crate::engine::pipeline::Parsed, CommandError>,
    /// The conjuncts of the leading `$match` that read only [`KEY_FIELDS`] (see
    /// [filtering before building an event](self#filtering-before-building-an-event)); empty
    /// when none can be pushed down.
    pushed_down: Vec<Filter>,
    /// The stages nest deeper than [`DEEP_PIPELINE_LEVELS`]: `getMore` evaluates them on a thread
    /// with a large stack, as the server runs deeply nested requests.
    pub deep: bool,
    /// Next sequence number to read.
    position: u64,
    /// Cluster time of the last thing returned (for high-water-mark tokens).
    last_ts: Timestamp,
    /// A drop was returned; the invalidate comes next.
    pending_invalidate: Option<(u64, Timestamp)>,
    /// The stream ended with an invalidate.
    pub closed: bool,
    epoch: u32,
}

const ALLOWED_STAGES: &[&str] = &[
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
];

impl StreamCursor {
    /// Opens a stream from the `$changeStream` stage `spec` and the later `stages`.
    pub fn open(
        scope: Scope,
        spec: &Document,
        stages: &[Document],
        log: &EventLog,
        now: Timestamp,
    ) -> CommandResult<StreamCursor> {
        let mut update_lookup = false;
        let mut resume: Option<(&str, &Bson)> = None;
        let mut start_at: Option<Timestamp> = None;
        let mut resume_opts = 0;
        for (k, v) in spec {
            // mongod's parser treats null (and undefined) as an omitted option.
            if matches!(v, Bson::Null | Bson::Undefined) {
                continue;
            }
            match k.as_str() {
                "fullDocument" => match enum_option(k, v)? {
                    "default" => {}
                    "updateLookup" => update_lookup = true,
                    other @ ("whenAvailable" | "required") => {
                        return Err(CommandError::bad_value(format!(
                            "fullDocument: '{other}' needs changeStreamPreAndPostImages, which this server does not support"
                        )))
                    }
                    other => return Err(bad_enum(k, other)),
                },
                "fullDocumentBeforeChange" => match enum_option(k, v)? {
                    "off" => {}
                    other @ ("whenAvailable" | "required") => {
                        return Err(CommandError::bad_value(format!(
                            "fullDocumentBeforeChange: '{other}' is not supported by this server"
                        )))
                    }
                    other => return Err(bad_enum(k, other)),
                },
                "resumeAfter" | "startAfter" => {
                    resume = Some((k.as_str(), v));
                    resume_opts += 1;
                }
                "startAtOperationTime" => {
                    let Bson::Timestamp(ts) = v else {
                        return Err(CommandError::type_mismatch(format!(
                            "BSON field '$changeStream.startAtOperationTime' is the wrong type '{}', expected type 'timestamp'",
                            crate::engine::compare::type_name(v)
                        )));
                    };
                    start_at = Some(*ts);
                    resume_opts += 1;
                }
                "allChangesForCluster" => {
                    let on = bool_flag(k, v)?;
                    if on != matches!(scope, Scope::Cluster) {
                        return Err(CommandError::bad_value(
                            "allChangesForCluster must be true exactly when watching the whole cluster (aggregate: 1 on admin)",
                        ));
                    }
                }
                // Events this server never produces (migrations, system collections): the flags
                // change nothing.
                "showMigrationEvents" | "showSystemEvents" | "allowToRunOnConfigDB"
                | "allowToRunOnSystemNS" => {
                    bool_flag(k, v)?;
                }
                "showExpandedEvents" | "showRawUpdateDescription" => {
                    if bool_flag(k, v)? {
                        return Err(CommandError::bad_value(format!(
                            "{k}: true is not supported by this server"
                        )));
                    }
                }
                other => {
                    return Err(CommandError::new(
                        40415,
                        "Location40415",
                        format!("BSON field '$changeStream.{other}' is an unknown field."),
                    ))
                }
            }
        }
        if resume_opts > 1 {
            return Err(CommandError::new(
                40674,
                "Location40674",
                "Only one type of resume option is allowed, but multiple were found.",
            ));
        }
        if matches!(scope, Scope::Cluster)
            && !spec.get_bool("allChangesForCluster").unwrap_or(false)
        {
            return Err(CommandError::bad_value(
                "A $changeStream with 'allChangesForCluster: true' is required on the admin database",
            ));
        }
        for stage in stages {
            let name = stage.keys().next().map(String::as_str).unwrap_or("");
            if !ALLOWED_STAGES.contains(&name) {
                return Err(CommandError::new(
                    20,
                    "IllegalOperation",
                    format!("{name} is not permitted in a $changeStream pipeline"),
                ));
            }
        }
        let parsed = crate::engine::pipeline::Parsed::parse(stages);
        let pushed_down = if parsed.is_ok() {
            push_down(stages)
        } else {
            Vec::new()
        };
        let deep = stages.iter().any(|s| {
            crate::limits::shape(s, DEEP_PIPELINE_LEVELS).depth + 2 > DEEP_PIPELINE_LEVELS
        });
        let mut cursor = StreamCursor {
            scope,
            update_lookup,
            stages: parsed,
            pushed_down,
            deep,
            position: log.next_seq(),
            last_ts: now,
            pending_invalidate: None,
            closed: false,
            epoch: log.epoch,
        };
        if let Some((how, token)) = resume {
            let t = parse_token(token)?;
            let not_found = || {
                CommandError::new(
                    280,
                    "ChangeStreamFatalError",
                    "cannot resume stream; the resume token was not found",
                )
            };
            if t.epoch != log.epoch {
                return Err(not_found());
            }
            let start = match t.kind {
                KIND_HIGH_WATER => t.seq,
                KIND_EVENT => t.seq.saturating_add(1),
                KIND_INVALIDATE => {
                    if how == "resumeAfter" {
                        return Err(CommandError::new(
                            260,
                            "InvalidResumeToken",
                            "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification.",
                        ));
                    }
                    t.seq.saturating_add(1)
                }
                _ => return Err(not_found()),
            };
            if start > log.next_seq {
                return Err(not_found());
            }
            if start < log.first_seq() {
                return Err(history_lost());
            }
            if t.kind != KIND_HIGH_WATER {
                match log.get(t.seq) {
                    // A token names an event of this stream: one from another collection is
                    // not found in it.
                    Some(e) if e.change.cluster_time == t.ts && cursor.matches_scope(e) => {
                        // Resuming from the drop that invalidated a stream yields the
                        // invalidate first.
                        if t.kind == KIND_EVENT && cursor.invalidated_by(e) {
                            cursor.pending_invalidate = Some((t.seq, t.ts));
                        }
                    }
                    _ => return Err(not_found()),
                }
            }
            cursor.position = start;
            cursor.last_ts = t.ts;
        } else if let Some(ts) = start_at {
            // First event at or after ts.
            let first_kept = log.events.front();
            if let Some(front) = first_kept {
                if front.seq > 1 && ts_cmp(ts, front.change.cluster_time).is_lt() {
                    return Err(history_lost());
                }
            }
            cursor.position = log
                .events
                .iter()
                .find(|e| ts_cmp(e.change.cluster_time, ts).is_ge())
                .map(|e| e.seq)
                .unwrap_or(log.next_seq);
            cursor.last_ts = ts;
        }
        Ok(cursor)
    }

    fn matches_scope(&self, e: &Event) -> bool {
        match &self.scope {
            Scope::Collection(db, coll) => e.change.db == *db && e.change.coll == *coll,
            Scope::Database(db) => e.change.db == *db,
            Scope::Cluster => true,
        }
    }

    fn invalidated_by(&self, e: &Event) -> bool {
        match &self.scope {
            Scope::Collection(db, coll) => {
                e.change.op == OpType::Drop && e.change.db == *db && e.change.coll == *coll
            }
            Scope::Database(db) => e.change.op == OpType::DropDatabase && e.change.db == *db,
            Scope::Cluster => false,
        }
    }

    /// The resume token to report after the current position.
    pub fn post_batch_token(&self) -> Document {
        make_token(self.epoch, self.last_ts, self.position, KIND_HIGH_WATER)
    }

    /// Reads up to `max` events that are available now. Returns the event documents; sets
    /// `closed` once an invalidate has been returned.
    pub fn read(
        &mut self,
        log: &EventLog,
        store: &Store,
        max: usize,
        vars: &Vars,
        current_ts: Timestamp,
    ) -> CommandResult<Vec<Document>> {
        let mut out = Vec::new();
        if self.position < log.first_seq() {
            return Err(history_lost());
        }
        if let Some((seq, ts)) = self.pending_invalidate.take() {
            out.push(self.invalidate_doc(seq, ts));
            self.closed = true;
            return Ok(out);
        }
        let mut scanned_to = self.position;
        let mut batch_bytes = 0;
        for e in log.from(self.position) {
            if out.len() >= max || self.closed {
                break;
            }
            let prev_ts = self.last_ts;
            scanned_to = e.seq + 1;
            self.last_ts = e.change.cluster_time;
            if !self.matches_scope(e) {
                continue;
            }
            let built = if self.rejects_early(e, vars) {
                None
            } else {
                self.event_doc(e, store, vars)?
            };
            if let Some(d) = built {
                // An event that cannot be sent fails the getMore that reaches it, and every
                // later one: the stream never moves past it (mongod: BSONObjectTooLarge).
                let first = out.is_empty();
                let fits = crate::limits::check_result(&d).and_then(|size| {
                    batch_bytes += size;
                    if !first && batch_bytes > crate::wire::MAX_BSON_OBJECT_SIZE {
                        Err(crate::limits::too_large(batch_bytes))
                    } else {
                        Ok(())
                    }
                });
                if let Err(err) = fits {
                    if out.is_empty() {
                        self.last_ts = prev_ts;
                        return Err(err);
                    }
                    // Send what fits; the next getMore starts at this event.
                    self.last_ts = prev_ts;
                    scanned_to = e.seq;
                    break;
                }
                out.push(d);
            }
            if self.invalidated_by(e) {
                if out.len() < max {
                    out.push(self.invalidate_doc(e.seq, e.change.cluster_time));
                    self.closed = true;
                } else {
                    self.pending_invalidate = Some((e.seq, e.change.cluster_time));
                }
                scanned_to = e.seq + 1;
                break;
            }
        }
        self.position = scanned_to;
        if scanned_to >= log.next_seq() && !self.closed {
            // Nothing left: the high-water mark is the present.
            if ts_cmp(current_ts, self.last_ts).is_gt() {
                self.last_ts = current_ts;
            }
        }
        Ok(out)
    }

    /// Whether a pushed-down conjunct of the leading `$match` rejects `e`'s key fields: then
    /// the full event could not pass the `$match` either, and is not built.
    fn rejects_early(&self, e: &Event, vars: &Vars) -> bool {
        self.pushed_down
            .iter()
            // Pushed-down conjuncts hold no `$expr`, so matching cannot fail; an error would
            // keep the event (the full `$match` then reports it).
            .any(|f| {
                let partial = e.key_fields.get_or_init(|| key_fields(&e.change));
                matches!(f.matches(partial, vars), Ok(false))
            })
    }

    fn invalidate_doc(&self, seq: u64, ts: Timestamp) -> Document {
        doc! {
            "_id": make_token(self.epoch, ts, seq, KIND_INVALIDATE),
            "operationType": "invalidate",
            "clusterTime": ts,
            "wallTime": DateTime::now(),
        }
    }

    fn event_doc(&self, e: &Event, store: &Store, vars: &Vars) -> CommandResult<Option<Document>> {
        let token = make_token(self.epoch, e.change.cluster_time, e.seq, KIND_EVENT);
        let mut d = doc! {
            "_id": token.clone(),
            "operationType": e.change.op.name(),
            "clusterTime": e.change.cluster_time,
            "wallTime": e.wall_time,
        };
        match e.change.op {
            OpType::Insert | OpType::Replace => {
                if let Some(full) = &e.change.full_document {
                    d.insert("fullDocument", full.clone());
                }
            }
            OpType::Update if self.update_lookup => {
                let current = e
                    .change
                    .document_key
                    .as_ref()
                    .and_then(|k| k.get("_id"))
                    .and_then(|id| {
                        let coll = store.coll(&e.change.db, &e.change.coll)?;
                        let rid = coll.find_id(id)?;
                        coll.get(rid).cloned()
                    });
                d.insert(
                    "fullDocument",
                    current.map(Bson::Document).unwrap_or(Bson::Null),
                );
            }
            _ => {}
        }
        d.insert("ns", ns_doc(&e.change));
        if let Some(k) = &e.change.document_key {
            d.insert("documentKey", k.clone());
        }
        if let Some(u) = &e.change.update_description {
            d.insert("updateDescription", u.clone());
        }
        let stages = self.stages.as_ref().map_err(Clone::clone)?;
        if stages.is_empty() {
            return Ok(Some(d));
        }
        let mut out = stages.run(vec![d], vars)?;
        match out.pop() {
            None => Ok(None),
            Some(doc) => {
                if doc.get("_id") != Some(&Bson::Document(token)) {
                    return Err(CommandError::new(
                        280,
                        "ChangeStreamFatalError",
                        "Encountered an event whose _id field, which contains the resume token, was modified by the pipeline. Modifying the _id field of an event makes it impossible to resume the stream from that point. Only transformations that retain the unmodified _id field are allowed.",
                    ));
                }
                Ok(Some(doc))
            }
        }
    }
}

/// The fields of a change event that [`push_down`] conjuncts may read.
const KEY_FIELDS: &[&str] = &["operationType", "ns", "documentKey", "updateDescription"];

/// A stream whose stages nest deeper than this runs its `getMore`s on a thread with a large
/// stack (the level at which the server moves a request there).
pub const DEEP_PIPELINE_LEVELS: usize = 32;

/// The conjuncts of the leading `$match` of `stages` that read nothing but [`KEY_FIELDS`],
/// parsed; empty when the first stage is not a `$match` or the `$match` uses `$expr`
/// anywhere. (See [filtering before building an event](self#filtering-before-building-an-event).)
fn push_down(stages: &[Document]) -> Vec<Filter> {
    let Some(Bson::Document(filter)) = stages.first().and_then(|s| s.get("$match")) else {
        return Vec::new();
    };
    match Filter::parse(filter) {
        Ok(whole) if !whole.uses_expr() => {}
        _ => return Vec::new(),
    }
    let mut conjuncts = Vec::new();
    split_conjuncts(filter, &mut conjuncts);
    conjuncts
        .into_iter()
        .filter(reads_only_key_fields)
        .filter_map(|c| Filter::parse(&c).ok())
        .collect()
}

/// The top-level conjuncts of `filter`, one field each; `$and`s are flattened.
fn split_conjuncts(filter: &Document, out: &mut Vec<Document>) {
    for (k, v) in filter {
        match v {
            Bson::Array(items)
                if k == "$and" && items.iter().all(|i| matches!(i, Bson::Document(_))) =>
            {
                for item in items {
                    if let Bson::Document(d) = item {
                        split_conjuncts(d, out);
                    }
                }
            }
            _ => {
                let mut one = Document::new();
                one.insert(k.clone(), v.clone());
                out.push(one);
            }
        }
    }
}

/// Whether every field path `filter` reads starts with one of [`KEY_FIELDS`] (through `$and`,
/// `$or`, `$nor`); any other top-level operator (`$expr`, ...) reads the whole event.
fn reads_only_key_fields(filter: &Document) -> bool {
    filter.iter().all(|(k, v)| match k.as_str() {
        "$and" | "$or" | "$nor" => match v {
            Bson::Array(items) => items
                .iter()
                .all(|i| matches!(i, Bson::Document(d) if reads_only_key_fields(d))),
            _ => false,
        },
        "$comment" | "$alwaysTrue" | "$alwaysFalse" => true,
        op if op.starts_with('$') => false,
        path => path
            .split('.')
            .next()
            .is_some_and(|first| KEY_FIELDS.contains(&first)),
    })
}

/// A string-valued enumeration option (TypeMismatch when not a string).
fn enum_option<'v>(name: &str, v: &'v Bson) -> CommandResult<&'v str> {
    match v {
        Bson::String(s) => Ok(s),
        other => Err(CommandError::type_mismatch(format!(
            "BSON field '$changeStream.{name}' is the wrong type '{}', expected type 'string'",
            crate::engine::compare::type_name(other)
        ))),
    }
}

/// mongod's error for a string that is not one of an enumeration's values.
fn bad_enum(name: &str, value: &str) -> CommandError {
    CommandError::bad_value(format!(
        "Enumeration value '{value}' for field '$changeStream.{name}' is not a valid value."
    ))
}

/// A boolean `$changeStream` option (mongod refuses other types with TypeMismatch).
fn bool_flag(name: &str, v: &Bson) -> CommandResult<bool> {
    match v {
        Bson::Boolean(b) => Ok(*b),
        other => Err(CommandError::type_mismatch(format!(
            "BSON field '$changeStream.{name}' is the wrong type '{}', expected type 'bool'",
            crate::engine::compare::type_name(other)
        ))),
    }
}

fn history_lost() -> CommandError {
    CommandError::new(
        286,
        "ChangeStreamHistoryLost",
        "Resume of change stream was not possible, as the resume point may no longer be in the oplog.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_with(capacity: usize, n: usize) -> EventLog {
        let mut log = EventLog {
            capacity,
            ..EventLog::default()
        };
        for i in 0..n {
            log.push(NewEvent {
                cluster_time: Timestamp {
                    time: 100,
                    increment: i as u32 + 1,
                },
                db: "db".into(),
                coll: "c".into(),
                op: OpType::Insert,
                document_key: Some(doc! {"_id": i as i32}),
                full_document: Some(doc! {"_id": i as i32}),
                update_description: None,
            });
        }
        log
    }

    fn open(log: &EventLog, spec: Document) -> CommandResult<StreamCursor> {
        StreamCursor::open(
            Scope::Collection("db".into(), "c".into()),
            &spec,
            &[],
            log,
            Timestamp {
                time: 100,
                increment: 99,
            },
        )
    }

    fn read_all(cursor: &mut StreamCursor, log: &EventLog) -> CommandResult<Vec<Document>> {
        let vars = Vars::new(DateTime::now());
        cursor.read(
            log,
            &Store::default(),
            100,
            &vars,
            Timestamp {
                time: 100,
                increment: 99,
            },
        )
    }

    /// A log of every kind of event on `db.c` and `db.d`, ending with the database's drop.
    fn mixed_log() -> EventLog {
        let mut log = EventLog::default();
        let mut n = 0;
        let mut push = |coll: &str, op: OpType, id: Option<i32>, a: i32| {
            n += 1;
            let full = matches!(op, OpType::Insert | OpType::Replace)
                .then(|| doc! {"_id": id.unwrap_or(0), "a": a});
            let update_description = (op == OpType::Update).then(|| {
                doc! {"updatedFields": {"a": a}, "removedFields": [], "truncatedArrays": []}
            });
            log.push(NewEvent {
                cluster_time: Timestamp {
                    time: 100,
                    increment: n,
                },
                db: "db".into(),
                coll: coll.into(),
                op,
                document_key: id.map(|id| doc! {"_id": id}),
                full_document: full,
                update_description,
            });
        };
        for id in 1..=4 {
            push("c", OpType::Insert, Some(id), id);
            push("d", OpType::Insert, Some(id), id + 10);
        }
        push("c", OpType::Update, Some(1), 5);
        push("c", OpType::Update, Some(2), 7);
        push("c", OpType::Replace, Some(3), 5);
        push("d", OpType::Update, Some(3), 1);
        push("c", OpType::Delete, Some(4), 0);
        push("d", OpType::Drop, None, 0);
        push("c", OpType::Insert, Some(5), 2);
        push("", OpType::DropDatabase, None, 0);
        log
    }

    /// What a database stream with `stages` returns from `log`, with and without pushing its
    /// `$match` down, and how many conjuncts were pushed down.
    fn both_ways(log: &EventLog, stages: &[Document]) -> (Vec<Document>, Vec<Document>, usize) {
        let vars = Vars::new(DateTime::now());
        let ts = Timestamp {
            time: 100,
            increment: 99,
        };
        let from = doc! {"startAtOperationTime": Timestamp { time: 100, increment: 1 }};
        let run = |push: bool| {
            let mut cursor =
                StreamCursor::open(Scope::Database("db".into()), &from, stages, log, ts).unwrap();
            let pushed = cursor.pushed_down.len();
            if !push {
                cursor.pushed_down.clear();
            }
            let mut out = Vec::new();
            while !cursor.closed {
                let batch = cursor.read(log, &Store::default(), 3, &vars, ts).unwrap();
                if batch.is_empty() {
                    break;
                }
                out.extend(batch.into_iter().map(|mut d| {
                    // An invalidate's wall time is the time it is read.
                    if d.get_str("operationType") == Ok("invalidate") {
                        d.remove("wallTime");
                    }
                    d
                }));
            }
            (out, pushed)
        };
        let (pushed_events, pushed) = run(true);
        let (plain_events, _) = run(false);
        (pushed_events, plain_events, pushed)
    }

    #[test]
    fn pushed_down_match_returns_the_same_events() {
        let log = mixed_log();
        let names = vec![Bson::Int32(1), Bson::Int32(3)];
        let everywhere = vec!["drop", "dropDatabase", "rename", "invalidate"];
        // (filter, conjuncts pushed down)
        let cases: Vec<(Document, usize)> = vec![
            (doc! {"documentKey._id": {"$in": names.clone()}}, 1),
            // The shape of mongolock's narrowed stream.
            (
                doc! {
                    "$or": [
                        {"operationType": {"$in": ["insert", "replace", "delete", "drop", "dropDatabase"]}},
                        {"operationType": "update", "updateDescription.updatedFields.a": {"$exists": true}},
                    ],
                    "$nor": [
                        {"updateDescription.updatedFields.a": 7},
                        {"fullDocument.a": {"$gte": 12, "$lt": 14}},
                    ],
                    "$and": [{"$or": [
                        {"documentKey._id": {"$in": names.clone()}},
                        {"operationType": {"$in": everywhere.clone()}},
                    ]}],
                },
                2,
            ),
            // Names covered for handoffs only: updateDescription is tested before the event is
            // built.
            (
                doc! {"$or": [
                    {"documentKey._id": 1},
                    {"documentKey._id": {"$in": names.clone()}, "$or": [
                        {"updateDescription.updatedFields.a": {"$gte": 6, "$lt": 8}},
                        {"updateDescription.updatedFields.a": {"$type": "null"}, "updateDescription.updatedFields.b": {"$exists": false}},
                    ]},
                ]},
                1,
            ),
            // An $or with a branch on a field the partial event lacks is not pushed down.
            (
                doc! {"$or": [{"documentKey._id": 2}, {"fullDocument.a": 5}]},
                0,
            ),
            (
                doc! {"$nor": [{"ns.coll": "d"}, {"operationType": "delete"}]},
                1,
            ),
            (
                doc! {"$nor": [{"ns.coll": "d"}, {"updateDescription.updatedFields.a": 5}]},
                1,
            ),
            (doc! {"$nor": [{"ns.coll": "d"}, {"fullDocument.a": 5}]}, 0),
            (
                doc! {"fullDocument.a": {"$gt": 2}, "operationType": "insert"},
                1,
            ),
            (
                doc! {"$and": [
                    {"operationType": {"$ne": "update"}},
                    {"$and": [{"ns": {"db": "db", "coll": "c"}}, {"clusterTime": {"$exists": true}}]},
                ]},
                2,
            ),
            // Missing in both: documentKey of drops.
            (doc! {"documentKey": {"$exists": false}}, 1),
            (doc! {"documentKey": null}, 1),
            (doc! {"documentKey": {"_id": 3}, "$comment": "x"}, 2),
            (
                doc! {"operationType": {"$nin": ["insert"]}, "wallTime": {"$exists": true}},
                1,
            ),
            (
                doc! {"updateDescription.updatedFields.a": {"$exists": true}},
                1,
            ),
            (doc! {"updateDescription": {"$exists": false}}, 1),
            (doc! {"documentKey._id": {"$elemMatch": {"$gt": 1}}}, 1),
            // $expr anywhere: nothing is pushed down.
            (
                doc! {"operationType": "insert", "$expr": {"$eq": ["$documentKey._id", 2]}},
                0,
            ),
        ];
        for (filter, expect_pushed) in cases {
            let stages = vec![
                doc! {"$match": filter.clone()},
                doc! {"$project": {"fullDocument": 0}},
            ];
            let (pushed, plain, n) = both_ways(&log, &stages);
            assert_eq!(n, expect_pushed, "conjuncts pushed down for {filter}");
            assert_eq!(pushed, plain, "events of {filter}");
        }
        // A $match after another stage is not pushed down.
        let stages = vec![
            doc! {"$addFields": {"operationType": "insert"}},
            doc! {"$match": {"operationType": "insert"}},
        ];
        let (pushed, plain, n) = both_ways(&log, &stages);
        assert_eq!((n, pushed.len()), (0, plain.len()));
        assert_eq!(pushed, plain);
    }

    #[test]
    fn a_skipped_drop_still_invalidates() {
        let log = mixed_log();
        let stages = vec![doc! {"$match": {"operationType": "insert", "documentKey._id": 5}}];
        let (pushed, plain, n) = both_ways(&log, &stages);
        assert_eq!(n, 2);
        assert_eq!(pushed, plain);
        let kinds: Vec<&str> = pushed
            .iter()
            .map(|d| d.get_str("operationType").unwrap())
            .collect();
        assert_eq!(kinds, ["insert", "invalidate"]);
    }

    #[test]
    fn resume_tokens_round_trip() {
        let log = log_with(10, 4);
        let mut all = open(
            &log,
            doc! {"startAtOperationTime": Timestamp { time: 100, increment: 1 }},
        )
        .unwrap();
        let events = read_all(&mut all, &log).unwrap();
        assert_eq!(events.len(), 4);
        let token = events[1].get("_id").unwrap().clone();
        let mut resumed = open(&log, doc! {"resumeAfter": token}).unwrap();
        let rest = read_all(&mut resumed, &log).unwrap();
        let ids: Vec<&Bson> = rest
            .iter()
            .map(|d| d.get_document("documentKey").unwrap().get("_id").unwrap())
            .collect();
        assert_eq!(ids, vec![&Bson::Int32(2), &Bson::Int32(3)]);
        // The post-batch token resumes after everything seen.
        let pbrt = resumed.post_batch_token();
        let mut from_pbrt = open(&log, doc! {"resumeAfter": pbrt}).unwrap();
        assert!(read_all(&mut from_pbrt, &log).unwrap().is_empty());
    }

    #[test]
    fn evicted_history_and_foreign_tokens() {
        let small = log_with(2, 5);
        let first = make_token(
            small.epoch,
            Timestamp {
                time: 100,
                increment: 1,
            },
            1,
            KIND_EVENT,
        );
        let err = open(&small, doc! {"resumeAfter": first}).err().unwrap();
        assert_eq!(err.code, 286);
        let foreign = make_token(
            small.epoch.wrapping_add(1),
            Timestamp {
                time: 100,
                increment: 5,
            },
            5,
            KIND_EVENT,
        );
        assert_eq!(
            open(&small, doc! {"resumeAfter": foreign})
                .err()
                .unwrap()
                .code,
            280
        );
        let garbage = doc! {"_data": "zz"};
        assert_eq!(
            open(&small, doc! {"resumeAfter": garbage})
                .err()
                .unwrap()
                .code,
            280
        );
        let invalidate = make_token(
            small.epoch,
            Timestamp {
                time: 100,
                increment: 5,
            },
            5,
            KIND_INVALIDATE,
        );
        assert_eq!(
            open(&small, doc! {"resumeAfter": invalidate.clone()})
                .err()
                .unwrap()
                .code,
            260
        );
        assert!(open(&small, doc! {"startAfter": invalidate}).is_ok());
        assert_eq!(open(&small, doc! {"bogus": 1}).err().unwrap().code, 40415);
    }
}
