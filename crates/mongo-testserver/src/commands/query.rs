//! find, getMore, killCursors, count, distinct, aggregate (including `$changeStream`).

use std::collections::VecDeque;
use std::time::Duration;

use bson::{doc, Bson, Document};
use tokio::time::Instant;

use super::args::{self, check_fields};
use super::crud::{find_all, with_let};
use super::Ctx;
use crate::changestream::{Scope, StreamCursor};
use crate::cursors::{Cursor, CursorKind};
use crate::engine::expr::Vars;
use crate::engine::matcher::Filter;
use crate::error::{CommandError, CommandResult};
use crate::store::Collection;
use crate::wire::MAX_BSON_OBJECT_SIZE;

/// Documents in a first batch when the client does not say.
const DEFAULT_FIRST_BATCH: usize = 101;
/// How long a change-stream getMore waits for events when the client does not say.
const DEFAULT_AWAIT: Duration = Duration::from_millis(1000);

/// Takes up to `max` documents (and at most 16 MiB, but at least one document). A document
/// that cannot be returned (see `limits::check_result`) fails the batch, as in mongod.
fn take_batch(rest: &mut VecDeque<Document>, max: usize) -> CommandResult<Vec<Document>> {
    let mut out = Vec::new();
    let mut size = 0;
    while out.len() < max {
        let Some(d) = rest.front() else { break };
        let s = crate::limits::check_result(d)?;
        if !out.is_empty() && size + s > MAX_BSON_OBJECT_SIZE {
            break;
        }
        size += s;
        if let Some(d) = rest.pop_front() {
            out.push(d);
        }
    }
    Ok(out)
}

/// A `hint` names an existing index (by name or key pattern); mongod answers BadValue otherwise.
pub(super) fn check_hint(coll: &Collection, cmd: &Document) -> CommandResult<()> {
    let ok = match cmd.get("hint") {
        None => true,
        Some(Bson::String(name)) => coll.indexes.iter().any(|i| &i.name == name),
        Some(Bson::Document(key)) if key.is_empty() => true,
        Some(Bson::Document(key)) => coll.indexes.iter().any(|i| &i.key == key),
        Some(_) => false,
    };
    if ok {
        Ok(())
    } else {
        Err(CommandError::bad_value(
            "hint provided does not correspond to an existing index",
        ))
    }
}

/// Opens a cursor over `rest` when documents remain; returns the cursor id (0: exhausted).
fn open_query_cursor(
    ctx: &Ctx<'_>,
    coll: &str,
    ns: &str,
    rest: VecDeque<Document>,
    no_timeout: bool,
) -> i64 {
    if rest.is_empty() {
        return 0;
    }
    ctx.shared.lock().cursors.open(Cursor {
        db: ctx.db.to_owned(),
        coll: coll.to_owned(),
        ns: ns.to_owned(),
        kind: CursorKind::Query(rest),
        last_used: Instant::now(),
        no_timeout,
    })
}

/// `find`.
pub fn find(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        "find",
        &[
            "filter",
            "sort",
            "projection",
            "hint",
            "skip",
            "limit",
            "batchSize",
            "singleBatch",
            "noCursorTimeout",
            "allowDiskUse",
            "collation",
            "let",
            "returnKey",
            "showRecordId",
            "tailable",
            "awaitData",
            "allowPartialResults",
            "min",
            "max",
            "readOnce",
            "term",
            "allowSpeculativeMajorityRead",
        ],
    )?;
    for flag in [
        "allowDiskUse",
        "allowPartialResults",
        "readOnce",
        "allowSpeculativeMajorityRead",
    ] {
        args::get_optional_bool(cmd, flag)?;
    }
    for unsupported in ["returnKey", "showRecordId", "tailable", "awaitData"] {
        if args::get_optional_bool(cmd, unsupported)?.unwrap_or(false) {
            return Err(CommandError::bad_value(format!(
                "find option '{unsupported}' is not supported by this server"
            )));
        }
    }
    for unsupported in ["min", "max"] {
        if args::get_doc(cmd, "find", unsupported)?.is_some_and(|d| !d.is_empty()) {
            return Err(CommandError::bad_value(format!(
                "find option '{unsupported}' is not supported by this server"
            )));
        }
    }
    // `filter`, `projection`, `sort`, `collation`, `min` and `max` are of IDL type
    // `object_owned_nonempty_serialize` (`src/mongo/db/query/find_command.idl`), whose
    // deserializer `parseOwnedBSON` takes only an object: null is code 14, not an omitted field.
    for field in ["filter", "projection", "sort", "collation", "min", "max"] {
        if let Some(Bson::Null | Bson::Undefined) = cmd.get(field) {
            return Err(CommandError::type_mismatch(format!(
                "Expected field {field} to be of type object"
            )));
        }
    }
    args::check_collation(cmd)?;
    let coll = args::coll_name(cmd, "find")?;
    let empty = Document::new();
    let filter_doc = args::get_doc(cmd, "find", "filter")?.unwrap_or(&empty);
    let filter = Filter::parse(filter_doc)?;
    let sort = args::get_doc(cmd, "find", "sort")?.filter(|s| !s.is_empty());
    let projection = args::get_doc(cmd, "find", "projection")?.filter(|p| !p.is_empty());
    let skip = args::get_non_negative(cmd, "FindCommandRequest", "skip")?.unwrap_or(0) as usize;
    let limit = args::get_non_negative(cmd, "FindCommandRequest", "limit")?
        .filter(|&l| l > 0)
        .map(|l| l as usize);
    let batch_size =
        args::get_non_negative(cmd, "FindCommandRequest", "batchSize")?.map(|b| b as usize);
    let single_batch = args::get_optional_bool(cmd, "singleBatch")?.unwrap_or(false);
    let no_timeout = args::get_optional_bool(cmd, "noCursorTimeout")?.unwrap_or(false);
    let vars = with_let(ctx, cmd, "find")?;
    let ns = format!("{}.{}", ctx.db, coll);

    let mut docs: Vec<Document> = {
        let st = ctx.shared.lock();
        match st.store.coll(ctx.db, coll) {
            None => Vec::new(),
            Some(c) => {
                check_hint(c, cmd)?;
                if sort.is_some() {
                    let mut all = Vec::new();
                    for rid in find_all(c, &filter, &vars)? {
                        if let Some(d) = c.get(rid) {
                            all.push(d.clone());
                        }
                    }
                    all
                } else {
                    let want = limit.map(|l| l + skip).unwrap_or(usize::MAX);
                    let mut out = Vec::new();
                    if filter.id_equality().is_some() {
                        for rid in find_all(c, &filter, &vars)? {
                            if let Some(d) = c.get(rid) {
                                out.push(d.clone());
                            }
                        }
                    } else {
                        for (_, d) in c.iter() {
                            if out.len() >= want {
                                break;
                            }
                            if filter.matches(d, &vars)? {
                                out.push(d.clone());
                            }
                        }
                    }
                    out
                }
            }
        }
    };
    if let Some(spec) = sort {
        crate::engine::pipeline::sort_documents(&mut docs, spec)?;
    }
    let mut rest: VecDeque<Document> = docs.into_iter().skip(skip).collect();
    if let Some(l) = limit {
        rest.truncate(l);
    }
    if let Some(p) = projection {
        for d in rest.iter_mut() {
            *d = crate::engine::projection::project_matched(d, p, filter_doc, &vars)?;
        }
    }
    let first_max = batch_size.unwrap_or(DEFAULT_FIRST_BATCH);
    let first = take_batch(&mut rest, first_max)?;
    let id = if single_batch {
        0
    } else {
        open_query_cursor(ctx, coll, &ns, rest, no_timeout)
    };
    Ok(doc! {"cursor": {"firstBatch": first, "id": id, "ns": ns}})
}

/// `getMore`.
pub async fn get_more(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        "getMore",
        &[
            "collection",
            "batchSize",
            "term",
            "lastKnownCommittedOpTime",
        ],
    )?;
    let id = match cmd.get("getMore") {
        Some(Bson::Int64(id)) => *id,
        Some(v) => {
            return Err(CommandError::type_mismatch(format!(
                "BSON field 'getMore.getMore' is the wrong type '{v}', expected type 'long'"
            )))
        }
        None => return Err(CommandError::bad_value("missing cursor id")),
    };
    let coll = match cmd.get("collection") {
        Some(Bson::String(s)) if s.is_empty() => {
            return Err(CommandError::new(
                73,
                "InvalidNamespace",
                "Collection names cannot be empty",
            ))
        }
        Some(Bson::String(s)) => s.clone(),
        None | Some(Bson::Null | Bson::Undefined) => {
            return Err(CommandError::new(
                40414,
                "Location40414",
                "BSON field 'getMore.collection' is missing but a required field",
            ))
        }
        Some(v) => {
            return Err(CommandError::type_mismatch(format!(
                "BSON field 'getMore.collection' is the wrong type '{}', expected type 'string'",
                crate::engine::compare::type_name(v)
            )))
        }
    };
    let batch_size = args::get_non_negative(cmd, "getMore", "batchSize")?
        .filter(|&b| b > 0)
        .map(|b| b as usize);
    // Checked with the generic fields.
    let max_time = args::get_i64(cmd, "getMore", "maxTimeMS")?;
    let is_stream = {
        let mut st = ctx.shared.lock();
        let cursor = st.cursors.get_mut(id).ok_or_else(|| cursor_not_found(id))?;
        if cursor.db != ctx.db || cursor.coll != coll {
            return Err(CommandError::new(
                13,
                "Unauthorized",
                format!(
                    "Requested getMore on namespace '{}.{}', but cursor belongs to a different namespace {}",
                    ctx.db, coll, cursor.ns
                ),
            ));
        }
        cursor.last_used = Instant::now();
        match &mut cursor.kind {
            CursorKind::Stream(_) => true,
            CursorKind::Query(rest) => {
                if max_time.is_some() {
                    return Err(CommandError::bad_value(
                        "cannot set maxTimeMS on getMore command for a non-awaitData cursor",
                    ));
                }
                let batch = match take_batch(rest, batch_size.unwrap_or(usize::MAX)) {
                    Ok(b) => b,
                    Err(e) => {
                        // As in mongod, an error ends the cursor.
                        st.cursors.remove(id);
                        return Err(e);
                    }
                };
                let ns = cursor.ns.clone();
                let next_id = if rest.is_empty() {
                    st.cursors.remove(id);
                    0
                } else {
                    id
                };
                return Ok(doc! {"cursor": {"nextBatch": batch, "id": next_id, "ns": ns}});
            }
        }
    };
    debug_assert!(is_stream);
    let wait = max_time
        .map(|ms| Duration::from_millis(ms.min(i64::from(i32::MAX)) as u64))
        .unwrap_or(DEFAULT_AWAIT);
    stream_get_more(
        ctx,
        id,
        batch_size.unwrap_or(usize::MAX),
        Instant::now() + wait,
    )
    .await
}

fn cursor_not_found(id: i64) -> CommandError {
    CommandError::new(43, "CursorNotFound", format!("cursor id {id} not found"))
}

/// Reads a change stream, waiting (without holding the lock) until an event arrives or the
/// deadline passes.
async fn stream_get_more(
    ctx: &Ctx<'_>,
    id: i64,
    max: usize,
    deadline: Instant,
) -> CommandResult<Document> {
    loop {
        let mut rx = {
            let mut guard = ctx.shared.lock();
            let st = &mut *guard;
            let now_ts = st.clock.now();
            let cursor = st.cursors.get_mut(id).ok_or_else(|| cursor_not_found(id))?;
            cursor.last_used = Instant::now();
            let CursorKind::Stream(sc) = &mut cursor.kind else {
                return Err(cursor_not_found(id));
            };
            let batch = match sc.read(&st.events, &st.store, max, &ctx.vars, now_ts) {
                Ok(b) => b,
                Err(e) => {
                    // As in mongod, a failed getMore closes the cursor.
                    st.cursors.remove(id);
                    return Err(e);
                }
            };
            if !batch.is_empty() || sc.closed || Instant::now() >= deadline {
                let token = sc.post_batch_token();
                let ns = cursor.ns.clone();
                let next_id = if sc.closed {
                    st.cursors.remove(id);
                    0
                } else {
                    id
                };
                return Ok(doc! {
                    "cursor": {"nextBatch": batch, "postBatchResumeToken": token, "id": next_id, "ns": ns}
                });
            }
            st.events.subscribe()
        };
        // Woken by the next write (or the deadline); then read again.
        let _ = tokio::time::timeout_at(deadline, rx.changed()).await;
    }
}

/// `killCursors`.
pub fn kill_cursors(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(cmd, "killCursors", &["cursors"])?;
    let _coll = args::coll_name(cmd, "killCursors")?;
    let ids = match cmd.get("cursors") {
        Some(Bson::Array(a)) => a,
        _ => {
            return Err(CommandError::new(
                40414,
                "Location40414",
                "BSON field 'killCursors.cursors' is missing but a required field",
            ))
        }
    };
    let mut killed = Vec::new();
    let mut not_found = Vec::new();
    let mut st = ctx.shared.lock();
    for v in ids {
        let Bson::Int64(id) = v else {
            return Err(CommandError::type_mismatch(
                "cursor ids must be of type long",
            ));
        };
        if st.cursors.remove(*id).is_some() {
            killed.push(*id);
        } else {
            not_found.push(*id);
        }
    }
    Ok(doc! {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
    })
}

/// `count`.
pub fn count(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        "count",
        &["query", "limit", "skip", "hint", "collation", "fields"],
    )?;
    args::check_collation(cmd)?;
    let coll = args::coll_name(cmd, "count")?;
    let empty = Document::new();
    let filter = Filter::parse(args::get_doc(cmd, "count", "query")?.unwrap_or(&empty))?;
    let skip = args::get_non_negative(cmd, "count", "skip")?.unwrap_or(0);
    let limit = args::get_i64(cmd, "count", "limit")?
        .map(|l| l.checked_abs().unwrap_or(i64::MAX))
        .filter(|&l| l > 0);
    let st = ctx.shared.lock();
    let n = match st.store.coll(ctx.db, coll) {
        None => 0,
        Some(c) => {
            check_hint(c, cmd)?;
            if filter.id_equality().is_none()
                && args::get_doc(cmd, "count", "query")?.is_none_or(|q| q.is_empty())
            {
                c.len() as i64
            } else {
                find_all(c, &filter, &ctx.vars)?.len() as i64
            }
        }
    };
    let mut n = (n - skip).max(0);
    if let Some(l) = limit {
        n = n.min(l);
    }
    Ok(doc! {"n": n as i32})
}

/// `distinct`.
pub fn distinct(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(cmd, "distinct", &["key", "query", "hint", "collation"])?;
    args::check_collation(cmd)?;
    args::check_hint_type(cmd)?;
    let coll = args::coll_name(cmd, "distinct")?;
    let key = match cmd.get("key") {
        Some(Bson::String(k)) => k.clone(),
        _ => {
            return Err(CommandError::type_mismatch(
                "BSON field 'distinct.key' is missing or not a string",
            ))
        }
    };
    let empty = Document::new();
    let filter = Filter::parse(args::get_doc(cmd, "distinct", "query")?.unwrap_or(&empty))?;
    let st = ctx.shared.lock();
    let mut values: Vec<Bson> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    if let Some(c) = st.store.coll(ctx.db, coll) {
        check_hint(c, cmd)?;
        for rid in find_all(c, &filter, &ctx.vars)? {
            if let Some(d) = c.get(rid) {
                for v in crate::store::path_values(d, &key) {
                    if matches!(v, Bson::Undefined) {
                        continue;
                    }
                    if seen.insert(crate::keys::key_of(&v)) {
                        values.push(v);
                    }
                }
            }
        }
    }
    Ok(doc! {"values": values})
}

fn is_change_stream(stage: &Document) -> bool {
    stage.keys().next().map(String::as_str) == Some("$changeStream")
}

/// `aggregate`.
pub fn aggregate(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        "aggregate",
        &[
            "pipeline",
            "cursor",
            "explain",
            "allowDiskUse",
            "bypassDocumentValidation",
            "collation",
            "hint",
            "let",
        ],
    )?;
    args::check_collation(cmd)?;
    args::get_optional_bool(cmd, "allowDiskUse")?;
    args::get_bool(cmd, "aggregate", "bypassDocumentValidation")?;
    args::check_hint_type(cmd)?;
    let explain = match cmd.get("explain") {
        None => false,
        Some(Bson::Boolean(b)) => *b,
        Some(_) => {
            return Err(CommandError::type_mismatch("explain must be a boolean"));
        }
    };
    if explain {
        return Err(CommandError::bad_value(
            "explain is not supported by this server",
        ));
    }
    let stages = args::get_docs(cmd, "aggregate", "pipeline")?;
    // `showSystemEvents` and `showExpandedEvents` are no part of API Version 1 (unstable
    // fields of the `$changeStream` spec): under `apiStrict: true` mongod refuses them, given
    // at all, with APIStrictError (323), as `jstests/change_streams/show_system_events.js` and
    // `show_expanded_events.js` check.
    if cmd.get("apiStrict") == Some(&Bson::Boolean(true)) {
        if let Some(Ok(spec)) = stages.first().map(|s| s.get_document("$changeStream")) {
            for flag in ["showSystemEvents", "showExpandedEvents"] {
                if spec.contains_key(flag) {
                    return Err(CommandError::new(
                        323,
                        "APIStrictError",
                        format!(
                            "BSON field '$changeStream.{flag}' is not allowed with apiStrict:true."
                        ),
                    ));
                }
            }
        }
    }
    let cursor_opts =
        match cmd.get("cursor") {
            Some(Bson::Document(c)) => c,
            None => return Err(CommandError::failed_to_parse(
                "The 'cursor' option is required, except for aggregate with the explain argument",
            )),
            Some(_) => {
                return Err(CommandError::type_mismatch(
                    "cursor field must be missing or an object",
                ))
            }
        };
    for (k, _) in cursor_opts {
        if k != "batchSize" {
            return Err(args::unknown_field("aggregate.cursor", k));
        }
    }
    let batch_size =
        args::get_non_negative(cursor_opts, "cursor", "batchSize")?.map(|b| b as usize);
    for (i, s) in stages.iter().enumerate() {
        if s.len() != 1 {
            return Err(CommandError::new(
                40323,
                "Location40323",
                "A pipeline stage specification object must contain exactly one field.",
            ));
        }
        if i > 0 && is_change_stream(s) {
            return Err(CommandError::new(
                40602,
                "Location40602",
                "$changeStream is only valid as the first stage in a pipeline",
            ));
        }
    }
    let target = cmd.get("aggregate");
    let coll: Option<&str> = match target {
        Some(Bson::String(s)) => Some(s),
        Some(v) if args::as_i64(v) == Some(1) => None,
        _ => {
            return Err(CommandError::new(
                73,
                "InvalidNamespace",
                "Invalid {aggregate: ...} value: must be a collection name or 1",
            ))
        }
    };
    if stages.first().is_some_and(|s| is_change_stream(s)) {
        return open_change_stream(ctx, coll, &stages, batch_size);
    }
    let Some(coll) = coll else {
        let first = stages
            .first()
            .and_then(|s| s.keys().next().cloned())
            .unwrap_or_default();
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!("{{aggregate: 1}} is not valid for '{first}'; a collection is required."),
        ));
    };
    let vars = with_let(ctx, cmd, "aggregate")?;
    let ns = format!("{}.{}", ctx.db, coll);
    let owned: Vec<Document> = stages.iter().map(|s| (*s).clone()).collect();
    let docs: Vec<Document> = {
        let st = ctx.shared.lock();
        match st.store.coll(ctx.db, coll) {
            None => Vec::new(),
            Some(c) => {
                check_hint(c, cmd)?;
                // A leading $match is applied here (with the _id index when possible).
                match owned
                    .first()
                    .filter(|s| s.len() == 1)
                    .and_then(|s| s.get_document("$match").ok())
                {
                    Some(m) => {
                        let f = Filter::parse(m)?;
                        let mut out = Vec::new();
                        for rid in find_all(c, &f, &vars)? {
                            if let Some(d) = c.get(rid) {
                                out.push(d.clone());
                            }
                        }
                        out
                    }
                    None => c.iter().map(|(_, d)| d.clone()).collect(),
                }
            }
        }
    };
    // (A `$match` that is not an object is left to the pipeline, which refuses it.)
    let rest_stages = if owned
        .first()
        .is_some_and(|s| s.len() == 1 && s.get_document("$match").is_ok())
    {
        &owned[1..]
    } else {
        &owned[..]
    };
    let results = run_pipeline(rest_stages, docs, &vars)?;
    let mut rest: VecDeque<Document> = results.into();
    let first = take_batch(&mut rest, batch_size.unwrap_or(DEFAULT_FIRST_BATCH))?;
    let id = open_query_cursor(ctx, coll, &ns, rest, false);
    Ok(doc! {"cursor": {"firstBatch": first, "id": id, "ns": ns}})
}

/// Runs stages through the engine.
fn run_pipeline(
    stages: &[Document],
    docs: Vec<Document>,
    vars: &Vars,
) -> CommandResult<Vec<Document>> {
    if stages.is_empty() {
        return Ok(docs);
    }
    crate::engine::pipeline::run(stages, docs, vars)
}

fn open_change_stream(
    ctx: &Ctx<'_>,
    coll: Option<&str>,
    stages: &[&Document],
    batch_size: Option<usize>,
) -> CommandResult<Document> {
    if ctx.shared.config.standalone {
        return Err(CommandError::new(
            40573,
            "Location40573",
            "The $changeStream stage is only supported on replica sets",
        ));
    }
    let spec = match stages[0].get("$changeStream") {
        Some(Bson::Document(d)) => d,
        _ => {
            return Err(CommandError::new(
                50808,
                "Location50808",
                "$changeStream stage expects a document as argument",
            ))
        }
    };
    let (scope, cursor_coll) = match coll {
        Some(c) => {
            crate::store::validate_names(ctx.db, c)?;
            (
                Scope::Collection(ctx.db.to_owned(), c.to_owned()),
                c.to_owned(),
            )
        }
        None if ctx.db == "admin" => (Scope::Cluster, "$cmd.aggregate".to_owned()),
        None => (
            Scope::Database(ctx.db.to_owned()),
            "$cmd.aggregate".to_owned(),
        ),
    };
    if matches!(ctx.db, "local" | "config") {
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!(
                "$changeStream may not be opened on the internal {} database",
                ctx.db
            ),
        ));
    }
    if matches!(scope, Scope::Collection(..)) && ctx.db == "admin" {
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            "$changeStream may not be opened on the internal admin database",
        ));
    }
    let later: Vec<Document> = stages[1..].iter().map(|s| (*s).clone()).collect();
    let ns = format!("{}.{}", ctx.db, cursor_coll);
    let mut guard = ctx.shared.lock();
    let st = &mut *guard;
    let now = st.clock.now();
    let mut sc = StreamCursor::open(scope, spec, &later, &st.events, now)?;
    let first = sc.read(
        &st.events,
        &st.store,
        batch_size.unwrap_or(DEFAULT_FIRST_BATCH),
        &ctx.vars,
        now,
    )?;
    let token = sc.post_batch_token();
    let id = if sc.closed {
        0
    } else {
        st.cursors.open(Cursor {
            db: ctx.db.to_owned(),
            coll: cursor_coll,
            ns: ns.clone(),
            kind: CursorKind::Stream(Box::new(sc)),
            last_used: Instant::now(),
            no_timeout: false,
        })
    };
    Ok(doc! {"cursor": {"firstBatch": first, "postBatchResumeToken": token, "id": id, "ns": ns}})
}
