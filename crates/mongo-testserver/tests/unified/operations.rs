//! Executes the operations of a unified test through the `mongodb` crate and converts their
//! results to BSON for matching.

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::ChangeStream;
use mongodb::options::{
    AggregateOptions, ChangeStreamOptions, Collation, CountOptions, CursorType, DeleteOptions,
    DistinctOptions, EstimatedDocumentCountOptions, FindOneAndDeleteOptions,
    FindOneAndReplaceOptions, FindOneAndUpdateOptions, FindOneOptions, FindOptions,
    FullDocumentBeforeChangeType, FullDocumentType, Hint, IndexOptions, InsertManyOptions,
    InsertOneOptions, ReplaceOptions, ReturnDocument, SelectionCriteria, UpdateModifications,
    UpdateOptions,
};
use mongodb::{Client, Collection, Cursor, Database, IndexModel};

use super::entities::{self, Entities, Entity};
use super::{Failure, Outcome};

/// What an operation produced.
pub struct OpOutput {
    /// The result converted to BSON (`None`: the operation returns nothing).
    pub value: Option<Bson>,
    /// The result is an iterated list of root-level documents (find, aggregate, list*).
    pub root_documents: bool,
    /// A driver object to store with `saveResultAsEntity` (change stream, cursor).
    pub entity: Option<Entity>,
}

impl OpOutput {
    fn none() -> Self {
        OpOutput {
            value: None,
            root_documents: false,
            entity: None,
        }
    }
    fn value(v: impl Into<Bson>) -> Self {
        OpOutput {
            value: Some(v.into()),
            root_documents: false,
            entity: None,
        }
    }
    fn documents(docs: Vec<Document>) -> Self {
        OpOutput {
            value: Some(Bson::Array(docs.into_iter().map(Bson::Document).collect())),
            root_documents: true,
            entity: None,
        }
    }
    /// A list of names (databases, collections, indexes) as an array of strings.
    fn names(names: Vec<String>) -> Self {
        OpOutput::value(names.into_iter().map(Bson::String).collect::<Vec<_>>())
    }
    /// A driver object (no value) for `saveResultAsEntity`.
    fn entity(entity: Entity) -> Self {
        OpOutput {
            value: None,
            root_documents: false,
            entity: Some(entity),
        }
    }
    fn change_stream(stream: ChangeStream<Document>, client: &str) -> Self {
        OpOutput::entity(Entity::ChangeStream {
            stream: Box::new(stream),
            client: client.to_string(),
        })
    }
}

/// An error the driver returned; `partial_result` is the write result the error carries
/// (for insertMany: the counts the server reported before the error).
pub struct DriverFailure {
    pub error: mongodb::error::Error,
    pub partial_result: Option<Bson>,
}

/// Why an operation did not produce an output.
pub enum OpError {
    /// The driver returned an error.
    Driver(Box<DriverFailure>),
    /// The runner could not execute the operation (or it must be skipped).
    Runner(Outcome),
}

impl From<Outcome> for OpError {
    fn from(o: Outcome) -> Self {
        OpError::Runner(o)
    }
}

impl From<mongodb::error::Error> for OpError {
    fn from(error: mongodb::error::Error) -> Self {
        OpError::Driver(Box::new(DriverFailure {
            error,
            partial_result: None,
        }))
    }
}

fn runner_err(msg: impl Into<String>) -> OpError {
    OpError::Runner(Outcome::Fail(Failure::Runner(msg.into())))
}

pub fn as_u64(v: &Bson) -> Option<u64> {
    match v {
        Bson::Int32(i) => u64::try_from(*i).ok(),
        Bson::Int64(i) => u64::try_from(*i).ok(),
        Bson::Double(d) if d.fract() == 0.0 && *d >= 0.0 => Some(*d as u64),
        _ => None,
    }
}

fn as_i64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) if d.fract() == 0.0 => Some(*d as i64),
        _ => None,
    }
}

/// The arguments of an operation; every argument must be consumed, an unknown one is an error.
pub struct Args {
    op: String,
    doc: Document,
}

impl Args {
    pub fn new(op: &str, doc: Document) -> Self {
        Args {
            op: op.to_string(),
            doc,
        }
    }

    fn missing(&self, key: &str) -> OpError {
        runner_err(format!("{}: missing required argument {key:?}", self.op))
    }

    fn bad(&self, key: &str, v: &Bson) -> OpError {
        runner_err(format!("{}: bad value for {key:?}: {v:?}", self.op))
    }

    pub fn take(&mut self, key: &str) -> Option<Bson> {
        self.doc.remove(key)
    }

    pub fn doc(&mut self, key: &str) -> Result<Option<Document>, OpError> {
        match self.take(key) {
            None => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d)),
            Some(v) => Err(self.bad(key, &v)),
        }
    }

    pub fn req_doc(&mut self, key: &str) -> Result<Document, OpError> {
        self.doc(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn req_str(&mut self, key: &str) -> Result<String, OpError> {
        match self.take(key) {
            Some(Bson::String(s)) => Ok(s),
            Some(v) => Err(self.bad(key, &v)),
            None => Err(self.missing(key)),
        }
    }

    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, OpError> {
        match self.take(key) {
            None => Ok(None),
            Some(Bson::Boolean(b)) => Ok(Some(b)),
            Some(v) => Err(self.bad(key, &v)),
        }
    }

    pub fn i64(&mut self, key: &str) -> Result<Option<i64>, OpError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => as_i64(&v).map(Some).ok_or_else(|| self.bad(key, &v)),
        }
    }

    pub fn u64(&mut self, key: &str) -> Result<Option<u64>, OpError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => as_u64(&v).map(Some).ok_or_else(|| self.bad(key, &v)),
        }
    }

    pub fn u32(&mut self, key: &str) -> Result<Option<u32>, OpError> {
        match self.u64(key)? {
            None => Ok(None),
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| runner_err(format!("{}: {key} out of range", self.op))),
        }
    }

    pub fn millis(&mut self, key: &str) -> Result<Option<Duration>, OpError> {
        Ok(self.u64(key)?.map(Duration::from_millis))
    }

    pub fn docs(&mut self, key: &str) -> Result<Option<Vec<Document>>, OpError> {
        match self.take(key) {
            None => Ok(None),
            Some(Bson::Array(items)) => items
                .into_iter()
                .map(|i| match i {
                    Bson::Document(d) => Ok(d),
                    other => Err(self.bad(key, &other)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Err(self.bad(key, &v)),
        }
    }

    pub fn req_docs(&mut self, key: &str) -> Result<Vec<Document>, OpError> {
        self.docs(key)?.ok_or_else(|| self.missing(key))
    }

    fn hint(&mut self) -> Result<Option<Hint>, OpError> {
        match self.take("hint") {
            None => Ok(None),
            Some(Bson::String(s)) => Ok(Some(Hint::Name(s))),
            Some(Bson::Document(d)) => Ok(Some(Hint::Keys(d))),
            Some(v) => Err(self.bad("hint", &v)),
        }
    }

    fn collation(&mut self) -> Result<Option<Collation>, OpError> {
        match self.doc("collation")? {
            None => Ok(None),
            Some(d) => mongodb::bson::from_document(d.clone())
                .map(Some)
                .map_err(|e| runner_err(format!("{}: bad collation {d:?}: {e}", self.op))),
        }
    }

    fn write_concern(&mut self) -> Result<Option<mongodb::options::WriteConcern>, OpError> {
        match self.take("writeConcern") {
            None => Ok(None),
            Some(v) => Ok(Some(entities::write_concern(&v)?)),
        }
    }

    fn read_preference(&mut self) -> Result<Option<SelectionCriteria>, OpError> {
        match self.take("readPreference") {
            None => Ok(None),
            Some(v) => Ok(Some(entities::read_preference(&v)?)),
        }
    }

    fn return_document(&mut self) -> Result<Option<ReturnDocument>, OpError> {
        match self.take("returnDocument") {
            None => Ok(None),
            Some(Bson::String(s)) if s.eq_ignore_ascii_case("after") => {
                Ok(Some(ReturnDocument::After))
            }
            Some(Bson::String(s)) if s.eq_ignore_ascii_case("before") => {
                Ok(Some(ReturnDocument::Before))
            }
            Some(v) => Err(self.bad("returnDocument", &v)),
        }
    }

    fn update(&mut self) -> Result<UpdateModifications, OpError> {
        match self.take("update") {
            Some(Bson::Document(d)) => Ok(UpdateModifications::Document(d)),
            Some(Bson::Array(items)) => {
                let stages = items
                    .into_iter()
                    .map(|s| match s {
                        Bson::Document(d) => Ok(d),
                        other => Err(self.bad("update", &other)),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(UpdateModifications::Pipeline(stages))
            }
            Some(v) => Err(self.bad("update", &v)),
            None => Err(self.missing("update")),
        }
    }

    /// Fails when an argument was not consumed.
    pub fn finish(self) -> Result<(), OpError> {
        match self.doc.keys().next() {
            None => Ok(()),
            Some(k) => Err(runner_err(format!(
                "{}: unsupported argument {k:?} (not implemented by this runner)",
                self.op
            ))),
        }
    }
}

/// Runs `future` with a deadline so a server that never answers fails the test instead of
/// hanging the suite.
async fn bounded<T>(
    what: &str,
    future: impl std::future::Future<Output = Result<T, OpError>>,
) -> Result<T, OpError> {
    match tokio::time::timeout(Duration::from_secs(30), future).await {
        Ok(r) => r,
        Err(_) => Err(runner_err(format!("{what}: no answer within 30 s"))),
    }
}

async fn collect(cursor: Cursor<Document>) -> Result<Vec<Document>, OpError> {
    Ok(cursor.try_collect().await?)
}

/// Executes an entity operation.
pub async fn execute(
    entities: &mut Entities,
    object: &str,
    name: &str,
    args: Args,
) -> Result<OpOutput, OpError> {
    let what = format!("{object}.{name}");
    bounded(&what, execute_inner(entities, object, name, args)).await
}

async fn execute_inner(
    entities: &mut Entities,
    object: &str,
    name: &str,
    args: Args,
) -> Result<OpOutput, OpError> {
    // Cursor-like entities need mutable access; everything else is cloned out of the map.
    if let Some(Entity::ChangeStream { .. } | Entity::Cursor { .. }) = entities.map.get(object) {
        return cursor_op(entities, object, name, args).await;
    }
    match entities.map.get(object) {
        Some(Entity::Collection { coll, client }) => {
            let coll = coll.clone();
            let client = client.clone();
            collection_op(entities, &coll, &client, name, args).await
        }
        Some(Entity::Database { db, client }) => {
            let db = db.clone();
            let client = client.clone();
            database_op(&db, &client, name, args).await
        }
        Some(Entity::Client(c)) => {
            let client = c.client.clone();
            client_op(&client, object, name, args).await
        }
        Some(other) => Err(runner_err(format!(
            "operation {name} on a {} entity is not supported",
            other.type_name()
        ))),
        None => Err(runner_err(format!("no entity {object:?}"))),
    }
}

async fn cursor_op(
    entities: &mut Entities,
    object: &str,
    name: &str,
    args: Args,
) -> Result<OpOutput, OpError> {
    args.finish()?;
    match name {
        "iterateUntilDocumentOrError" | "iterateOnce" => {}
        "close" => {
            // Dropping the driver object closes it (killCursors is sent in the background).
            entities.map.remove(object);
            return Ok(OpOutput::none());
        }
        other => {
            return Err(runner_err(format!(
                "operation {other} on a cursor/change stream is not supported"
            )))
        }
    }
    let until_document = name == "iterateUntilDocumentOrError";
    match entities.map.get_mut(object) {
        Some(Entity::ChangeStream { stream, .. }) => {
            if until_document {
                match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
                    Err(_) => Err(runner_err(format!(
                        "{object}: no change event (and no error) within 20 s"
                    ))),
                    Ok(None) => Err(runner_err(format!(
                        "{object}: the change stream ended (it is closed) without a document"
                    ))),
                    Ok(Some(Ok(doc))) => Ok(OpOutput::value(doc)),
                    Ok(Some(Err(e))) => Err(e.into()),
                }
            } else {
                match stream.next_if_any().await? {
                    Some(doc) => Ok(OpOutput::value(doc)),
                    None => Ok(OpOutput::none()),
                }
            }
        }
        Some(Entity::Cursor { cursor, .. }) => {
            let advanced = tokio::time::timeout(Duration::from_secs(20), cursor.advance())
                .await
                .map_err(|_| runner_err(format!("{object}: no document within 20 s")))??;
            if advanced {
                Ok(OpOutput::value(cursor.deserialize_current()?))
            } else if until_document {
                Err(runner_err(format!(
                    "{object}: the cursor is exhausted (no document to return)"
                )))
            } else {
                Ok(OpOutput::none())
            }
        }
        _ => unreachable!("checked by the caller"),
    }
}

/// The pipeline and options of a `createChangeStream` (every argument must be one of them).
fn change_stream_args(mut args: Args) -> Result<(Vec<Document>, ChangeStreamOptions), OpError> {
    let pipeline = args.docs("pipeline")?.unwrap_or_default();
    let opts = change_stream_options(&mut args)?;
    args.finish()?;
    Ok((pipeline, opts))
}

fn change_stream_options(args: &mut Args) -> Result<ChangeStreamOptions, OpError> {
    let mut o = ChangeStreamOptions::default();
    o.batch_size = args.u32("batchSize")?;
    o.comment = args.take("comment");
    o.max_await_time = args.millis("maxAwaitTimeMS")?;
    o.collation = args.collation()?;
    o.show_expanded_events = args.bool("showExpandedEvents")?;
    if let Some(v) = args.take("fullDocument") {
        o.full_document = Some(match v.as_str() {
            Some("updateLookup") => FullDocumentType::UpdateLookup,
            Some("whenAvailable") => FullDocumentType::WhenAvailable,
            Some("required") => FullDocumentType::Required,
            Some("default") => FullDocumentType::Other("default".to_string()),
            _ => return Err(runner_err(format!("bad fullDocument {v:?}"))),
        });
    }
    if let Some(v) = args.take("fullDocumentBeforeChange") {
        o.full_document_before_change = Some(match v.as_str() {
            Some("whenAvailable") => FullDocumentBeforeChangeType::WhenAvailable,
            Some("required") => FullDocumentBeforeChangeType::Required,
            Some("off") => FullDocumentBeforeChangeType::Off,
            _ => return Err(runner_err(format!("bad fullDocumentBeforeChange {v:?}"))),
        });
    }
    for (key, slot) in [("resumeAfter", 0), ("startAfter", 1)] {
        if let Some(token) = args.take(key) {
            let token: mongodb::change_stream::event::ResumeToken = mongodb::bson::from_bson(token)
                .map_err(|e| runner_err(format!("bad {key}: {e}")))?;
            if slot == 0 {
                o.resume_after = Some(token);
            } else {
                o.start_after = Some(token);
            }
        }
    }
    if let Some(v) = args.take("startAtOperationTime") {
        match v {
            Bson::Timestamp(ts) => o.start_at_operation_time = Some(ts),
            other => return Err(runner_err(format!("bad startAtOperationTime {other:?}"))),
        }
    }
    Ok(o)
}

async fn client_op(
    client: &Client,
    object: &str,
    name: &str,
    mut args: Args,
) -> Result<OpOutput, OpError> {
    match name {
        "createChangeStream" => {
            let (pipeline, opts) = change_stream_args(args)?;
            let stream = client
                .watch()
                .pipeline(pipeline)
                .with_options(opts)
                .await?
                .with_type::<Document>();
            Ok(OpOutput::change_stream(stream, object))
        }
        "listDatabases" | "listDatabaseNames" => {
            let filter = args.doc("filter")?;
            let name_only = args.bool("nameOnly")?;
            let authorized = args.bool("authorizedDatabases")?;
            args.finish()?;
            if name == "listDatabaseNames" {
                let mut action = client.list_database_names();
                if let Some(f) = filter {
                    action = action.filter(f);
                }
                if let Some(a) = authorized {
                    action = action.authorized_databases(a);
                }
                let names = action.await?;
                return Ok(OpOutput::names(names));
            }
            // The driver's listDatabases returns typed specifications; the raw command reply
            // carries the same documents.
            let mut cmd = doc! {"listDatabases": 1};
            if let Some(f) = filter {
                cmd.insert("filter", f);
            }
            if let Some(n) = name_only {
                cmd.insert("nameOnly", n);
            }
            if let Some(a) = authorized {
                cmd.insert("authorizedDatabases", a);
            }
            let reply = client.database("admin").run_command(cmd).await?;
            let dbs = reply
                .get_array("databases")
                .map_err(|_| {
                    runner_err(format!("listDatabases reply without databases: {reply:?}"))
                })?
                .iter()
                .filter_map(|d| d.as_document().cloned())
                .collect();
            Ok(OpOutput::documents(dbs))
        }
        other => Err(runner_err(format!(
            "client operation {other} is not implemented by this runner"
        ))),
    }
}

async fn database_op(
    db: &Database,
    client_id: &str,
    name: &str,
    mut args: Args,
) -> Result<OpOutput, OpError> {
    match name {
        "runCommand" => {
            let command = args.req_doc("command")?;
            let _command_name = args.req_str("commandName")?;
            let sc = args.read_preference()?;
            args.finish()?;
            let mut action = db.run_command(command);
            if let Some(sc) = sc {
                action = action.selection_criteria(sc);
            }
            Ok(OpOutput::value(action.await?))
        }
        "aggregate" => {
            let (pipeline, opts) = aggregate_args(args)?;
            let cursor = db.aggregate(pipeline).with_options(opts).await?;
            Ok(OpOutput::documents(collect(cursor).await?))
        }
        "createChangeStream" => {
            let (pipeline, opts) = change_stream_args(args)?;
            let stream = db
                .watch()
                .pipeline(pipeline)
                .with_options(opts)
                .await?
                .with_type::<Document>();
            Ok(OpOutput::change_stream(stream, client_id))
        }
        "createCollection" => {
            let coll = args.req_str("collection")?;
            args.finish()?;
            db.create_collection(coll).await?;
            Ok(OpOutput::none())
        }
        "dropCollection" => {
            let coll = args.req_str("collection")?;
            args.finish()?;
            db.collection::<Document>(&coll).drop().await?;
            Ok(OpOutput::none())
        }
        "listCollections" | "listCollectionNames" => {
            let filter = args.doc("filter")?;
            let batch_size = args.u32("batchSize")?;
            args.finish()?;
            if name == "listCollectionNames" {
                let mut action = db.list_collection_names();
                if let Some(f) = filter {
                    action = action.filter(f);
                }
                let names = action.await?;
                return Ok(OpOutput::names(names));
            }
            let mut action = db.list_collections();
            if let Some(f) = filter {
                action = action.filter(f);
            }
            if let Some(b) = batch_size {
                action = action.batch_size(b);
            }
            let cursor = action.await?.with_type::<Document>();
            Ok(OpOutput::documents(collect(cursor).await?))
        }
        "drop" | "dropDatabase" => {
            args.finish()?;
            db.drop().await?;
            Ok(OpOutput::none())
        }
        other => Err(runner_err(format!(
            "database operation {other} is not implemented by this runner"
        ))),
    }
}

/// The pipeline and options of an `aggregate` (every argument must be one of them).
fn aggregate_args(mut args: Args) -> Result<(Vec<Document>, AggregateOptions), OpError> {
    let pipeline = args.req_docs("pipeline")?;
    let opts = aggregate_options(&mut args)?;
    args.finish()?;
    Ok((pipeline, opts))
}

fn aggregate_options(args: &mut Args) -> Result<AggregateOptions, OpError> {
    let mut o = AggregateOptions::default();
    o.batch_size = args.u32("batchSize")?;
    o.allow_disk_use = args.bool("allowDiskUse")?;
    o.max_time = args.millis("maxTimeMS")?;
    o.comment = args.take("comment");
    o.let_vars = args.doc("let")?;
    o.collation = args.collation()?;
    o.hint = args.hint()?;
    o.bypass_document_validation = args.bool("bypassDocumentValidation")?;
    o.write_concern = args.write_concern()?;
    o.selection_criteria = args.read_preference()?;
    Ok(o)
}

fn find_options(args: &mut Args) -> Result<FindOptions, OpError> {
    let mut o = FindOptions::default();
    o.sort = args.doc("sort")?;
    o.skip = args.u64("skip")?;
    o.limit = args.i64("limit")?;
    o.batch_size = args.u32("batchSize")?;
    o.projection = args.doc("projection")?;
    o.comment = args.take("comment");
    o.hint = args.hint()?;
    o.collation = args.collation()?;
    o.allow_disk_use = args.bool("allowDiskUse")?;
    o.max_time = args.millis("maxTimeMS")?;
    o.max_await_time = args.millis("maxAwaitTimeMS")?;
    o.let_vars = args.doc("let")?;
    o.min = args.doc("min")?;
    o.max = args.doc("max")?;
    o.return_key = args.bool("returnKey")?;
    o.show_record_id = args.bool("showRecordId")?;
    o.no_cursor_timeout = args.bool("noCursorTimeout")?;
    o.allow_partial_results = args.bool("allowPartialResults")?;
    if let Some(v) = args.take("cursorType") {
        o.cursor_type = Some(match v.as_str() {
            Some("tailable") => CursorType::Tailable,
            Some("tailableAwait") => CursorType::TailableAwait,
            Some("nonTailable") => CursorType::NonTailable,
            _ => return Err(runner_err(format!("bad cursorType {v:?}"))),
        });
    }
    Ok(o)
}

fn update_result(r: mongodb::results::UpdateResult) -> Document {
    let mut d = doc! {
        "matchedCount": r.matched_count as i64,
        "modifiedCount": r.modified_count as i64,
        "upsertedCount": i64::from(r.upserted_id.is_some()),
    };
    if let Some(id) = r.upserted_id {
        d.insert("upsertedId", id);
    }
    d
}

/// The insertMany write result carried by an error: the driver keeps the inserted ids private,
/// so the counts come from the server's replies to the `insert` commands the operation sent
/// (`n` is what MongoDB reports as inserted, as a BulkWriteResult would).
fn insert_many_partial_result(entities: &Entities, client_id: &str, from: usize) -> Option<Bson> {
    let client = entities.client(client_id).ok()?;
    let events = client.events_since(from);
    let inserted: i64 = events
        .iter()
        .filter_map(|e| match e {
            super::entities::RecordedEvent::Succeeded {
                reply,
                command_name,
                ..
            } if command_name == "insert" => reply.get("n").and_then(as_i64),
            _ => None,
        })
        .sum();
    Some(Bson::Document(doc! {
        "insertedCount": inserted,
        "matchedCount": 0_i64,
        "modifiedCount": 0_i64,
        "deletedCount": 0_i64,
        "upsertedCount": 0_i64,
        "upsertedIds": {},
    }))
}

async fn collection_op(
    entities: &Entities,
    coll: &Collection<Document>,
    client_id: &str,
    name: &str,
    mut args: Args,
) -> Result<OpOutput, OpError> {
    match name {
        "insertOne" => {
            let document = args.req_doc("document")?;
            let mut o = InsertOneOptions::default();
            o.bypass_document_validation = args.bool("bypassDocumentValidation")?;
            o.comment = args.take("comment");
            o.write_concern = args.write_concern()?;
            args.finish()?;
            let r = coll.insert_one(document).with_options(o).await?;
            Ok(OpOutput::value(doc! {"insertedId": r.inserted_id}))
        }
        "insertMany" => {
            let documents = args.req_docs("documents")?;
            let mut o = InsertManyOptions::default();
            o.ordered = args.bool("ordered")?;
            o.bypass_document_validation = args.bool("bypassDocumentValidation")?;
            o.comment = args.take("comment");
            o.write_concern = args.write_concern()?;
            args.finish()?;
            let from = entities
                .client(client_id)
                .map(|c| c.event_count())
                .unwrap_or(0);
            match coll.insert_many(documents).with_options(o).await {
                Ok(r) => {
                    let mut ids: Vec<(usize, Bson)> = r.inserted_ids.into_iter().collect();
                    ids.sort_by_key(|(i, _)| *i);
                    let ids: Document = ids.into_iter().map(|(i, v)| (i.to_string(), v)).collect();
                    Ok(OpOutput::value(doc! {"insertedIds": ids}))
                }
                Err(error) => {
                    let partial_result =
                        if matches!(*error.kind, mongodb::error::ErrorKind::InsertMany(_)) {
                            insert_many_partial_result(entities, client_id, from)
                        } else {
                            None
                        };
                    Err(OpError::Driver(Box::new(DriverFailure {
                        error,
                        partial_result,
                    })))
                }
            }
        }
        "updateOne" | "updateMany" => {
            let filter = args.req_doc("filter")?;
            let update = args.update()?;
            let mut o = UpdateOptions::default();
            o.upsert = args.bool("upsert")?;
            o.array_filters = args.docs("arrayFilters")?;
            o.hint = args.hint()?;
            o.collation = args.collation()?;
            o.let_vars = args.doc("let")?;
            o.comment = args.take("comment");
            o.bypass_document_validation = args.bool("bypassDocumentValidation")?;
            o.write_concern = args.write_concern()?;
            if name == "updateOne" {
                o.sort = args.doc("sort")?;
            }
            args.finish()?;
            let r = if name == "updateOne" {
                coll.update_one(filter, update).with_options(o).await?
            } else {
                coll.update_many(filter, update).with_options(o).await?
            };
            Ok(OpOutput::value(update_result(r)))
        }
        "replaceOne" => {
            let filter = args.req_doc("filter")?;
            let replacement = args.req_doc("replacement")?;
            let mut o = ReplaceOptions::default();
            o.upsert = args.bool("upsert")?;
            o.hint = args.hint()?;
            o.collation = args.collation()?;
            o.let_vars = args.doc("let")?;
            o.comment = args.take("comment");
            o.bypass_document_validation = args.bool("bypassDocumentValidation")?;
            o.write_concern = args.write_concern()?;
            o.sort = args.doc("sort")?;
            args.finish()?;
            let r = coll
                .replace_one(filter, replacement)
                .with_options(o)
                .await?;
            Ok(OpOutput::value(update_result(r)))
        }
        "deleteOne" | "deleteMany" => {
            let filter = args.req_doc("filter")?;
            let mut o = DeleteOptions::default();
            o.hint = args.hint()?;
            o.collation = args.collation()?;
            o.let_vars = args.doc("let")?;
            o.comment = args.take("comment");
            o.write_concern = args.write_concern()?;
            args.finish()?;
            let r = if name == "deleteOne" {
                coll.delete_one(filter).with_options(o).await?
            } else {
                coll.delete_many(filter).with_options(o).await?
            };
            Ok(OpOutput::value(
                doc! {"deletedCount": r.deleted_count as i64},
            ))
        }
        "find" | "createFindCursor" => {
            let filter = args.doc("filter")?.unwrap_or_default();
            let o = find_options(&mut args)?;
            args.finish()?;
            let cursor = coll.find(filter).with_options(o).await?;
            if name == "find" {
                Ok(OpOutput::documents(collect(cursor).await?))
            } else {
                Ok(OpOutput::entity(Entity::Cursor {
                    cursor: Box::new(cursor),
                    client: client_id.to_string(),
                }))
            }
        }
        "findOne" => {
            let filter = args.doc("filter")?.unwrap_or_default();
            let mut o = FindOneOptions::default();
            o.sort = args.doc("sort")?;
            o.skip = args.u64("skip")?;
            o.projection = args.doc("projection")?;
            o.comment = args.take("comment");
            o.hint = args.hint()?;
            o.collation = args.collation()?;
            o.max_time = args.millis("maxTimeMS")?;
            o.let_vars = args.doc("let")?;
            o.allow_partial_results = args.bool("allowPartialResults")?;
            o.min = args.doc("min")?;
            o.max = args.doc("max")?;
            o.return_key = args.bool("returnKey")?;
            o.show_record_id = args.bool("showRecordId")?;
            args.finish()?;
            let r = coll.find_one(filter).with_options(o).await?;
            Ok(OpOutput::value(r.map_or(Bson::Null, Bson::Document)))
        }
        "findOneAndUpdate" => {
            let filter = args.req_doc("filter")?;
            let update = args.update()?;
            let mut o = FindOneAndUpdateOptions::default();
            o.projection = args.doc("projection")?;
            o.sort = args.doc("sort")?;
            o.upsert = args.bool("upsert")?;
            o.return_document = args.return_document()?;
            o.array_filters = args.docs("arrayFilters")?;
            o.hint = args.hint()?;
            o.collation = args.collation()?;
            o.let_vars = args.doc("let")?;
            o.comment = args.take("comment");
            o.max_time = args.millis("maxTimeMS")?;
            o.bypass_document_validation = args.bool("bypassDocumentValidation")?;
            o.write_concern = args.write_concern()?;
            args.finish()?;
            let r = coll
                .find_one_and_update(filter, update)
                .with_options(o)
                .await?;
            Ok(OpOutput::value(r.map_or(Bson::Null, Bson::Document)))
        }
        "findOneAndReplace" => {
            let filter = args.req_doc("filter")?;
            let replacement = args.req_doc("replacement")?;
            let mut o = FindOneAndReplaceOptions::default();
            o.projection = args.doc("projection")?;
            o.sort = args.doc("sort")?;
            o.upsert = args.bool("upsert")?;
            o.return_document = args.return_document()?;
            o.hint = args.hint()?;
            o.collation = args.collation()?;
            o.let_vars = args.doc("let")?;
            o.comment = args.take("comment");
            o.max_time = args.millis("maxTimeMS")?;
            o.bypass_document_validation = args.bool("bypassDocumentValidation")?;
            o.write_concern = args.write_concern()?;
            args.finish()?;
            let r = coll
                .find_one_and_replace(filter, replacement)
                .with_options(o)
                .await?;
            Ok(OpOutput::value(r.map_or(Bson::Null, Bson::Document)))
        }
        "findOneAndDelete" => {
            let filter = args.req_doc("filter")?;
            let mut o = FindOneAndDeleteOptions::default();
            o.projection = args.doc("projection")?;
            o.sort = args.doc("sort")?;
            o.hint = args.hint()?;
            o.collation = args.collation()?;
            o.let_vars = args.doc("let")?;
            o.comment = args.take("comment");
            o.max_time = args.millis("maxTimeMS")?;
            o.write_concern = args.write_concern()?;
            args.finish()?;
            let r = coll.find_one_and_delete(filter).with_options(o).await?;
            Ok(OpOutput::value(r.map_or(Bson::Null, Bson::Document)))
        }
        "countDocuments" => {
            let filter = args.req_doc("filter")?;
            let mut o = CountOptions::default();
            o.skip = args.u64("skip")?;
            o.limit = args.u64("limit")?;
            o.hint = args.hint()?;
            o.collation = args.collation()?;
            o.comment = args.take("comment");
            o.max_time = args.millis("maxTimeMS")?;
            args.finish()?;
            let n = coll.count_documents(filter).with_options(o).await?;
            Ok(OpOutput::value(n as i64))
        }
        "estimatedDocumentCount" => {
            let mut o = EstimatedDocumentCountOptions::default();
            o.comment = args.take("comment");
            o.max_time = args.millis("maxTimeMS")?;
            args.finish()?;
            let n = coll.estimated_document_count().with_options(o).await?;
            Ok(OpOutput::value(n as i64))
        }
        "distinct" => {
            let field = args.req_str("fieldName")?;
            let filter = args.req_doc("filter")?;
            let mut o = DistinctOptions::default();
            o.collation = args.collation()?;
            o.comment = args.take("comment");
            o.max_time = args.millis("maxTimeMS")?;
            o.hint = args.hint()?;
            args.finish()?;
            let values = coll.distinct(field, filter).with_options(o).await?;
            Ok(OpOutput::value(values))
        }
        "aggregate" => {
            let (pipeline, opts) = aggregate_args(args)?;
            let cursor = coll.aggregate(pipeline).with_options(opts).await?;
            Ok(OpOutput::documents(collect(cursor).await?))
        }
        "createChangeStream" => {
            let (pipeline, opts) = change_stream_args(args)?;
            let stream = coll
                .watch()
                .pipeline(pipeline)
                .with_options(opts)
                .await?
                .with_type::<Document>();
            Ok(OpOutput::change_stream(stream, client_id))
        }
        "createIndex" => {
            let keys = args.req_doc("keys")?;
            let mut options = Document::new();
            for key in [
                "name",
                "unique",
                "expireAfterSeconds",
                "sparse",
                "hidden",
                "partialFilterExpression",
                "background",
            ] {
                if let Some(v) = args.take(key) {
                    options.insert(key, v);
                }
            }
            args.finish()?;
            let options: IndexOptions = mongodb::bson::from_document(options.clone())
                .map_err(|e| runner_err(format!("createIndex: bad options {options:?}: {e}")))?;
            let model = IndexModel::builder().keys(keys).options(options).build();
            let r = coll.create_index(model).await?;
            Ok(OpOutput::value(r.index_name))
        }
        "dropIndex" => {
            let index = args.req_str("name")?;
            args.finish()?;
            coll.drop_index(index).await?;
            Ok(OpOutput::none())
        }
        "dropIndexes" => {
            args.finish()?;
            coll.drop_indexes().await?;
            Ok(OpOutput::none())
        }
        "listIndexes" => {
            let batch_size = args.u32("batchSize")?;
            args.finish()?;
            let mut action = coll.list_indexes();
            if let Some(b) = batch_size {
                action = action.batch_size(b);
            }
            let cursor = action.await?.with_type::<Document>();
            Ok(OpOutput::documents(collect(cursor).await?))
        }
        "listIndexNames" => {
            args.finish()?;
            let names = coll.list_index_names().await?;
            Ok(OpOutput::names(names))
        }
        "drop" => {
            args.finish()?;
            coll.drop().await?;
            Ok(OpOutput::none())
        }
        other => Err(runner_err(format!(
            "collection operation {other} is not implemented by this runner"
        ))),
    }
}
