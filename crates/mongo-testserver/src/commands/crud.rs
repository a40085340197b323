//! insert, update, delete, findAndModify, and the helpers they share with queries.

use std::borrow::Cow;

use bson::{doc, oid::ObjectId, Bson, Document};

use super::args::{self, check_fields};
use super::Ctx;
use crate::engine::compare::values_equal;
use crate::engine::expr::Vars;
use crate::engine::matcher::Filter;
use crate::engine::update::{upsert_seed, Update};
use crate::error::{CommandError, CommandResult};
use crate::keys::doc_size;
use crate::sessions::session_key;
use crate::state::State;
use crate::store::{validate_names, Collection, RecordId};
use crate::wire::{MAX_BSON_OBJECT_SIZE, MAX_NESTING_DEPTH};

/// Most statements one write command may carry.
const MAX_WRITE_BATCH: usize = 100_000;

/// Runs a write under the state lock, as a retryable write when it carries `lsid` and
/// `txnNumber`: a repeated `(lsid, txnNumber)` returns the stored reply without running again.
fn retryable(
    ctx: &Ctx<'_>,
    cmd: &Document,
    run: impl FnOnce(&mut State) -> CommandResult<Document>,
) -> CommandResult<Document> {
    let txn = cmd.get("txnNumber").and_then(args::as_i64);
    let lsid = cmd.get_document("lsid").ok();
    let mut st = ctx.shared.lock();
    let reply = match (txn, lsid) {
        (Some(txn), Some(lsid)) => {
            let key = session_key(lsid);
            if let Some(stored) = st.sessions.check(&key, txn)? {
                return Ok(stored);
            }
            let reply = run(&mut st)?;
            st.sessions.record(key, txn, reply.clone());
            reply
        }
        _ => run(&mut st)?,
    };
    drop(st);
    Ok(args::with_write_concern_error(ctx, cmd, reply))
}

fn check_batch(len: usize) -> CommandResult<()> {
    if len == 0 || len > MAX_WRITE_BATCH {
        return Err(CommandError::new(
            16,
            "InvalidLength",
            format!(
                "Write batch sizes must be between 1 and {MAX_WRITE_BATCH}. Got {len} operations."
            ),
        ));
    }
    Ok(())
}

/// A writeErrors entry.
fn write_error(index: usize, e: CommandError) -> Document {
    let mut d = doc! {"index": index as i32, "code": e.code, "errmsg": e.message};
    for (k, v) in e.extra {
        d.insert(k, v);
    }
    d
}

/// Validates `_id` and puts it first, generating an ObjectId when missing.
pub(super) fn prepare_new_doc(mut doc: Document) -> CommandResult<Document> {
    match doc.get("_id") {
        Some(Bson::Array(_)) => {
            return Err(CommandError::new(
                53,
                "InvalidIdField",
                "can't use an array for _id",
            ))
        }
        Some(Bson::RegularExpression(_)) => {
            return Err(CommandError::new(
                53,
                "InvalidIdField",
                "can't use a regex for _id",
            ))
        }
        Some(Bson::Undefined) => {
            return Err(CommandError::new(
                53,
                "InvalidIdField",
                "can't use a undefined for _id",
            ))
        }
        _ => {}
    }
    let first_is_id = doc.keys().next().map(String::as_str) == Some("_id");
    if !first_is_id {
        let id = doc
            .remove("_id")
            .unwrap_or_else(|| Bson::ObjectId(ObjectId::new()));
        let mut out = Document::new();
        out.insert("_id", id);
        out.extend(doc);
        doc = out;
    }
    Ok(doc)
}

fn check_insert_size(doc: &Document) -> CommandResult<()> {
    let size = doc_size(doc);
    if size > MAX_BSON_OBJECT_SIZE {
        return Err(CommandError::bad_value(format!(
            "object to insert too large. size in bytes: {size}, max size: {MAX_BSON_OBJECT_SIZE}"
        )));
    }
    Ok(())
}

fn check_update_size(doc: &Document) -> CommandResult<()> {
    if crate::keys::too_deep(doc, MAX_NESTING_DEPTH) {
        return Err(CommandError::new(
            15,
            "Overflow",
            format!("Resulting document after update exceeds the maximum nesting depth of {MAX_NESTING_DEPTH}"),
        ));
    }
    if doc_size(doc) > MAX_BSON_OBJECT_SIZE {
        return Err(CommandError::new(
            17419,
            "Location17419",
            format!("Resulting document after update is larger than {MAX_BSON_OBJECT_SIZE}"),
        ));
    }
    Ok(())
}

/// `insert`.
pub fn insert(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        "insert",
        &["documents", "ordered", "bypassDocumentValidation"],
    )?;
    let coll = args::coll_name(cmd, "insert")?;
    validate_names(ctx.db, coll)?;
    let docs = args::get_docs(cmd, "insert", "documents")?;
    check_batch(docs.len())?;
    let ordered = args::get_strict_bool(cmd, "insert", "ordered")?.unwrap_or(true);
    args::get_bool(cmd, "insert", "bypassDocumentValidation")?;
    retryable(ctx, cmd, |st| {
        let mut n = 0i32;
        let mut errors = Vec::new();
        for (i, doc) in docs.iter().enumerate() {
            let result = check_insert_size(doc)
                .and_then(|()| prepare_new_doc((*doc).clone()))
                .and_then(|d| st.insert_doc(ctx.db, coll, d, &ctx.vars));
            match result {
                Ok(()) => n += 1,
                Err(e) => {
                    errors.push(write_error(i, e));
                    if ordered {
                        break;
                    }
                }
            }
        }
        let mut reply = doc! {"n": n};
        if !errors.is_empty() {
            reply.insert("writeErrors", errors);
        }
        Ok(reply)
    })
}

/// The record a single-document operation targets: the first match in natural order, or the
/// first in `sort` order. Uses the `_id` index when the filter has an `_id` equality.
pub(super) fn find_one(
    coll: &Collection,
    filter: &Filter,
    sort: Option<&Document>,
    vars: &Vars,
) -> CommandResult<Option<RecordId>> {
    if let Some(id) = filter.id_equality() {
        return match coll.find_id(id) {
            Some(rid) => {
                let doc = coll.get(rid).ok_or_else(|| {
                    CommandError::new(1, "InternalError", "index points at no record")
                })?;
                coll.examined(1);
                Ok(if filter.matches(doc, vars)? {
                    Some(rid)
                } else {
                    None
                })
            }
            None => Ok(None),
        };
    }
    match sort {
        Some(spec) if !spec.is_empty() => {
            let all = find_all(coll, filter, vars)?;
            if all.is_empty() {
                return Ok(None);
            }
            let mut docs: Vec<Document> = Vec::with_capacity(all.len());
            for rid in &all {
                if let Some(d) = coll.get(*rid) {
                    let mut d = d.clone();
                    // Carry the record id through the sort in a field no user can name.
                    d.insert("\u{0}rid", *rid as i64);
                    docs.push(d);
                }
            }
            crate::engine::pipeline::sort_documents(&mut docs, spec)?;
            Ok(docs
                .first()
                .and_then(|d| d.get_i64("\u{0}rid").ok())
                .map(|r| r as RecordId))
        }
        _ => {
            let mut examined = 0;
            let mut found = None;
            for (rid, doc) in examine(coll, filter) {
                examined += 1;
                if filter.matches(doc, vars)? {
                    found = Some(rid);
                    break;
                }
            }
            coll.examined(examined);
            Ok(found)
        }
    }
}

/// The records a query with `filter` examines, in natural order: the candidates of an index
/// that serves the filter, else every record.
fn examine<'c>(
    coll: &'c Collection,
    filter: &Filter,
) -> Box<dyn Iterator<Item = (RecordId, &'c Document)> + 'c> {
    match coll.candidates(filter) {
        Some(rids) => Box::new(
            rids.into_iter()
                .filter_map(move |rid| coll.get(rid).map(|d| (rid, d))),
        ),
        None => Box::new(coll.iter()),
    }
}

/// Every matching record in natural order.
pub(super) fn find_all(
    coll: &Collection,
    filter: &Filter,
    vars: &Vars,
) -> CommandResult<Vec<RecordId>> {
    if filter.id_equality().is_some() {
        return Ok(find_one(coll, filter, None, vars)?.into_iter().collect());
    }
    let mut out = Vec::new();
    let mut examined = 0;
    for (rid, doc) in examine(coll, filter) {
        examined += 1;
        if filter.matches(doc, vars)? {
            out.push(rid);
        }
    }
    coll.examined(examined);
    Ok(out)
}

/// Which version of an updated document the caller wants back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Nothing,
    Before,
    After,
}

/// Applies `update` to the stored document `rid`: returns the wanted version and whether the
/// document changed. Works on one copy; the stored document is untouched on error.
fn apply_update(
    st: &mut State,
    db: &str,
    coll: &str,
    rid: RecordId,
    update: &Update,
    vars: &Vars,
    want: Want,
) -> CommandResult<(Option<Document>, bool)> {
    let stored = st
        .store
        .coll(db, coll)
        .and_then(|c| c.get(rid))
        .ok_or_else(|| CommandError::new(1, "InternalError", "record vanished"))?;
    let old_id = stored.get("_id").cloned().unwrap_or(Bson::Null);
    let Some(mut work) = update.apply_to(stored, false, vars)? else {
        // Unchanged: the stored document is both versions.
        return Ok(((want != Want::Nothing).then(|| stored.clone()), false));
    };
    match work.get("_id") {
        None => {
            let mut d = Document::new();
            d.insert("_id", old_id);
            d.extend(work);
            work = d;
        }
        Some(new_id) if !values_equal(new_id, &old_id) || !same_type(new_id, &old_id) => {
            return Err(CommandError::new(
                66,
                "ImmutableField",
                format!(
                    "After applying the update, the (immutable) field '_id' was found to have been altered to _id: {}",
                    crate::keys::render(new_id)
                ),
            ));
        }
        Some(_) => {}
    }
    check_update_size(&work)?;
    let after = (want == Want::After).then(|| work.clone());
    // MongoDB 4.4 logs pipeline updates as replacements (the whole new document).
    let as_replace =
        update.is_replacement() || (update.is_pipeline() && st.pipeline_updates_as_replace);
    let before = st.update_doc(db, coll, rid, work, as_replace, vars)?;
    Ok((
        match want {
            Want::Nothing => None,
            Want::Before => Some(before),
            Want::After => after,
        },
        true,
    ))
}

fn same_type(a: &Bson, b: &Bson) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
        || (is_number(a) && is_number(b) && crate::keys::key_of(a) == crate::keys::key_of(b))
}

fn is_number(v: &Bson) -> bool {
    matches!(
        v,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
    )
}

/// The document an upsert inserts (not yet stored).
fn upsert_doc(
    filter_doc: &Document,
    filter: &Filter,
    update: &Update,
    vars: &Vars,
) -> CommandResult<Document> {
    let mut doc = if update.is_replacement() {
        let mut d = Document::new();
        update.apply(&mut d, true, vars)?;
        if !d.contains_key("_id") {
            if let Some(id) = filter.id_equality() {
                let mut with_id = doc! {"_id": id.clone()};
                with_id.extend(d);
                d = with_id;
            }
        }
        d
    } else {
        let mut d = upsert_seed(filter_doc)?;
        update.apply(&mut d, true, vars)?;
        d
    };
    doc = prepare_new_doc(doc)?;
    check_update_size(&doc)?;
    Ok(doc)
}

struct UpdateStatement<'a> {
    stmt: &'a Document,
    /// `c`: constants a pipeline update reads as `$$name`.
    constants: Option<&'a Document>,
    filter_doc: &'a Document,
    filter: Filter,
    update: Update,
    upsert: bool,
    multi: bool,
}

/// The checks mongod's command parser makes on an update statement (before any statement runs:
/// a failure fails the whole command).
fn check_update_statement(stmt: &Document) -> CommandResult<()> {
    for (k, _) in stmt {
        match k.as_str() {
            "q" | "u" | "upsert" | "multi" | "hint" | "upsertSupplied" | "collation"
            | "arrayFilters" | "c" => {}
            other => return Err(args::unknown_field("update.updates", other)),
        }
    }
    args::get_strict_bool(stmt, "update.updates", "upsert")?;
    args::get_strict_bool(stmt, "update.updates", "multi")?;
    args::check_hint_type(stmt)?;
    args::check_doc_array(stmt, "update.updates", "arrayFilters")?;
    if let Some(q) = stmt.get("q").filter(|q| !matches!(q, Bson::Document(_))) {
        return Err(CommandError::type_mismatch(format!(
            "BSON field 'update.updates.q' is the wrong type '{}', expected type 'object'",
            crate::engine::compare::type_name(q)
        )));
    }
    args::get_doc(stmt, "update.updates", "c")?;
    // mongod's parser classifies `u` (the update itself is parsed when the statement runs).
    if let Some(u) = stmt.get("u") {
        if !matches!(u, Bson::Document(_) | Bson::Array(_)) {
            return Err(CommandError::failed_to_parse(format!(
                "Update argument must be either an object or an array, found {}",
                crate::engine::compare::type_name(u)
            )));
        }
    }
    for field in ["q", "u"] {
        if !stmt.contains_key(field) {
            return Err(CommandError::new(
                40414,
                "Location40414",
                format!("BSON field 'update.updates.{field}' is missing but a required field"),
            ));
        }
    }
    Ok(())
}

fn parse_update_statement(stmt: &Document) -> CommandResult<UpdateStatement<'_>> {
    for (k, _) in stmt {
        match k.as_str() {
            "q" | "u" | "upsert" | "multi" | "hint" | "upsertSupplied" => {}
            "collation" => args::check_collation(stmt)?,
            "arrayFilters" | "c" => {}
            other => return Err(args::unknown_field("update.updates", other)),
        }
    }
    let upsert = args::get_strict_bool(stmt, "update.updates", "upsert")?.unwrap_or(false);
    let multi = args::get_strict_bool(stmt, "update.updates", "multi")?.unwrap_or(false);
    let filter_doc = match stmt.get("q") {
        Some(Bson::Document(d)) => d,
        Some(_) => {
            return Err(CommandError::type_mismatch(
                "BSON field 'update.updates.q' is the wrong type, expected type 'object'",
            ))
        }
        None => {
            return Err(CommandError::new(
                40414,
                "Location40414",
                "BSON field 'update.updates.q' is missing but a required field",
            ))
        }
    };
    let u = stmt.get("u").ok_or_else(|| {
        CommandError::new(
            40414,
            "Location40414",
            "BSON field 'update.updates.u' is missing but a required field",
        )
    })?;
    let update = Update::parse(u)?.with_positional(filter_doc, stmt.get("arrayFilters"))?;
    let constants = args::get_doc(stmt, "update.updates", "c")?;
    if constants.is_some() && !update.is_pipeline() {
        return Err(CommandError::new(
            51198,
            "Location51198",
            "Constant values may only be specified for pipeline updates",
        ));
    }
    if multi && update.is_replacement() {
        return Err(CommandError::failed_to_parse(
            "multi update is not supported for replacement-style update",
        ));
    }
    let filter = Filter::parse(filter_doc)?;
    if upsert {
        // mongod refuses `$expr` in an upsert's filter even when a document matches.
        filter.check_upsert_allowed()?;
    }
    Ok(UpdateStatement {
        stmt,
        constants,
        filter_doc,
        filter,
        update,
        upsert,
        multi,
    })
}

/// Runs one update statement: `(n, nModified, upserted _id)`.
fn run_update(
    st: &mut State,
    db: &str,
    coll: &str,
    s: &UpdateStatement<'_>,
    vars: &Vars,
) -> CommandResult<(i64, i64, Option<Bson>)> {
    if let Some(c) = st.store.coll(db, coll) {
        super::query::check_hint(c, s.stmt)?;
    }
    let targets = match st.store.coll(db, coll) {
        None => Vec::new(),
        Some(c) if s.multi => find_all(c, &s.filter, vars)?,
        Some(c) => find_one(c, &s.filter, None, vars)?.into_iter().collect(),
    };
    // `c` is visible to the update pipeline only, not to the query.
    let with_constants;
    let vars = match s.constants {
        Some(c) => {
            let mut user = vars.user.clone();
            user.extend(c.clone());
            with_constants = vars.clone().with_let(user);
            &with_constants
        }
        None => vars,
    };
    if targets.is_empty() {
        if !s.upsert {
            return Ok((0, 0, None));
        }
        let doc = upsert_doc(s.filter_doc, &s.filter, &s.update, vars)?;
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        st.insert_doc(db, coll, doc, vars)?;
        return Ok((1, 0, Some(id)));
    }
    let mut n = 0;
    let mut modified = 0;
    for rid in targets {
        let (_, changed) = apply_update(st, db, coll, rid, &s.update, vars, Want::Nothing)?;
        n += 1;
        if changed {
            modified += 1;
        }
    }
    Ok((n, modified, None))
}

/// `update`.
pub fn update(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        "update",
        &["updates", "ordered", "bypassDocumentValidation", "let"],
    )?;
    let coll = args::coll_name(cmd, "update")?;
    validate_names(ctx.db, coll)?;
    let stmts = args::get_docs(cmd, "update", "updates")?;
    check_batch(stmts.len())?;
    let ordered = args::get_strict_bool(cmd, "update", "ordered")?.unwrap_or(true);
    args::get_bool(cmd, "update", "bypassDocumentValidation")?;
    for s in &stmts {
        check_update_statement(s)?;
    }
    let vars = with_let(ctx, cmd, "update")?;
    if cmd.contains_key("txnNumber") {
        for s in &stmts {
            if args::get_strict_bool(s, "update.updates", "multi")?.unwrap_or(false) {
                return Err(CommandError::new(
                    72,
                    "InvalidOptions",
                    "Cannot use (or request) retryable writes with multi=true",
                ));
            }
        }
    }
    retryable(ctx, cmd, |st| {
        let mut n = 0i64;
        let mut n_modified = 0i64;
        let mut upserted = Vec::new();
        let mut errors = Vec::new();
        for (i, stmt) in stmts.iter().enumerate() {
            let result =
                parse_update_statement(stmt).and_then(|s| run_update(st, ctx.db, coll, &s, &vars));
            match result {
                Ok((matched, modified, up)) => {
                    n += matched;
                    n_modified += modified;
                    if let Some(id) = up {
                        upserted.push(doc! {"index": i as i32, "_id": id});
                    }
                }
                Err(e) => {
                    errors.push(write_error(i, e));
                    if ordered {
                        break;
                    }
                }
            }
        }
        let mut reply = doc! {"n": n as i32, "nModified": n_modified as i32};
        if !upserted.is_empty() {
            reply.insert("upserted", upserted);
        }
        if !errors.is_empty() {
            reply.insert("writeErrors", errors);
        }
        Ok(reply)
    })
}

/// The operation's variables with the command's `let` document.
pub(super) fn with_let<'a>(
    ctx: &'a Ctx<'_>,
    cmd: &Document,
    command: &str,
) -> CommandResult<Cow<'a, Vars>> {
    match args::get_doc(cmd, command, "let")? {
        None => Ok(Cow::Borrowed(&ctx.vars)),
        Some(l) => {
            // `let` values are expressions evaluated once, against an empty document.
            let mut evaluated = Document::new();
            for (k, v) in l {
                let value = crate::engine::expr::evaluate(v, &Document::new(), &ctx.vars)?;
                evaluated.insert(k.clone(), value.unwrap_or(Bson::Null));
            }
            Ok(Cow::Owned(ctx.vars.clone().with_let(evaluated)))
        }
    }
}

/// `delete`.
pub fn delete(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(cmd, "delete", &["deletes", "ordered", "let"])?;
    let coll = args::coll_name(cmd, "delete")?;
    validate_names(ctx.db, coll)?;
    let stmts = args::get_docs(cmd, "delete", "deletes")?;
    check_batch(stmts.len())?;
    let ordered = args::get_strict_bool(cmd, "delete", "ordered")?.unwrap_or(true);
    for s in &stmts {
        check_delete_statement(s)?;
    }
    let vars = with_let(ctx, cmd, "delete")?;
    retryable(ctx, cmd, |st| {
        let mut n = 0i64;
        let mut errors = Vec::new();
        for (i, stmt) in stmts.iter().enumerate() {
            match run_delete(st, ctx.db, coll, stmt, &vars) {
                Ok(k) => n += k,
                Err(e) => {
                    errors.push(write_error(i, e));
                    if ordered {
                        break;
                    }
                }
            }
        }
        let mut reply = doc! {"n": n as i32};
        if !errors.is_empty() {
            reply.insert("writeErrors", errors);
        }
        Ok(reply)
    })
}

/// A delete statement's `limit` as mongod reads it (`numberDouble`: a non-number is 0): whether
/// it deletes one document.
fn delete_limit_one(stmt: &Document) -> CommandResult<bool> {
    let limit = match stmt.get("limit") {
        None => {
            return Err(CommandError::new(
                40414,
                "Location40414",
                "BSON field 'delete.deletes.limit' is missing but a required field",
            ))
        }
        Some(Bson::Int32(i)) => f64::from(*i),
        Some(Bson::Int64(i)) => *i as f64,
        Some(Bson::Double(f)) => *f,
        Some(Bson::Decimal128(d)) => {
            crate::engine::decimal::to_f64(crate::engine::decimal::from_bson(d))
        }
        Some(_) => 0.0,
    };
    if limit == 0.0 || limit == 1.0 {
        Ok(limit == 1.0)
    } else {
        Err(CommandError::failed_to_parse(format!(
            "The limit field in delete objects must be 0 or 1. Got {limit}"
        )))
    }
}

/// The checks mongod's command parser makes on a delete statement (before any statement runs).
fn check_delete_statement(stmt: &Document) -> CommandResult<()> {
    for (k, _) in stmt {
        match k.as_str() {
            "q" | "limit" | "hint" | "collation" => {}
            other => return Err(args::unknown_field("delete.deletes", other)),
        }
    }
    match stmt.get("q") {
        Some(Bson::Document(_)) => {}
        None => {
            return Err(CommandError::new(
                40414,
                "Location40414",
                "BSON field 'delete.deletes.q' is missing but a required field",
            ))
        }
        Some(q) => {
            return Err(CommandError::type_mismatch(format!(
                "BSON field 'delete.deletes.q' is the wrong type '{}', expected type 'object'",
                crate::engine::compare::type_name(q)
            )))
        }
    }
    delete_limit_one(stmt)?;
    args::check_hint_type(stmt)
}

fn run_delete(
    st: &mut State,
    db: &str,
    coll: &str,
    stmt: &Document,
    vars: &Vars,
) -> CommandResult<i64> {
    args::check_collation(stmt)?;
    let empty = Document::new();
    let filter_doc = stmt.get_document("q").unwrap_or(&empty);
    let limit_one = delete_limit_one(stmt)?;
    let filter = Filter::parse(filter_doc)?;
    let Some(c) = st.store.coll(db, coll) else {
        return Ok(0);
    };
    super::query::check_hint(c, stmt)?;
    let targets: Vec<RecordId> = if limit_one {
        find_one(c, &filter, None, vars)?.into_iter().collect()
    } else {
        find_all(c, &filter, vars)?
    };
    let mut n = 0;
    for rid in targets {
        if st.delete_doc(db, coll, rid, vars).is_some() {
            n += 1;
        }
    }
    Ok(n)
}

/// `findAndModify`.
/// `findAndModify`. The `update` value is taken out of `cmd` (left `null`) and parsed by value:
/// nothing reads it afterwards.
pub fn find_and_modify(ctx: &Ctx<'_>, name: &str, cmd: &mut Document) -> CommandResult<Document> {
    let update_arg = cmd.get_mut("update").map(std::mem::take);
    let cmd: &Document = cmd;
    check_fields(
        cmd,
        name,
        &[
            "query",
            "sort",
            "remove",
            "update",
            "new",
            "fields",
            "upsert",
            "bypassDocumentValidation",
            "collation",
            "arrayFilters",
            "hint",
            "let",
            "batchSize",
            "singleBatch",
        ],
    )?;
    let coll = args::coll_name(cmd, name)?;
    validate_names(ctx.db, coll)?;
    let empty = Document::new();
    let query = args::get_doc(cmd, name, "query")?.unwrap_or(&empty);
    let sort = args::get_doc(cmd, name, "sort")?;
    let fields = args::get_doc(cmd, name, "fields")?;
    let remove = args::get_bool(cmd, name, "remove")?.unwrap_or(false);
    let new = args::get_bool(cmd, name, "new")?.unwrap_or(false);
    let upsert = args::get_bool(cmd, name, "upsert")?.unwrap_or(false);
    args::get_bool(cmd, name, "bypassDocumentValidation")?;
    // Accepted and ignored, as by mongod.
    args::get_strict_bool(cmd, name, "singleBatch")?;
    match cmd.get("batchSize") {
        None | Some(Bson::Null | Bson::Undefined | Bson::Int32(_)) => {}
        Some(v) => {
            return Err(CommandError::type_mismatch(format!(
                "BSON field '{name}.batchSize' is the wrong type '{}', expected type 'int'",
                crate::engine::compare::type_name(v)
            )))
        }
    }
    args::check_doc_array(cmd, name, "arrayFilters")?;
    args::check_hint_type(cmd)?;
    args::check_collation(cmd)?;
    let update = match update_arg {
        Some(u) => Some(Update::parse_owned(u)?.with_positional(query, cmd.get("arrayFilters"))?),
        None => None,
    };
    match (&update, remove) {
        (Some(_), true) => {
            return Err(CommandError::failed_to_parse(
                "Cannot specify both an update and remove=true",
            ))
        }
        (None, false) => {
            return Err(CommandError::failed_to_parse(
                "Either an update or remove=true must be specified",
            ))
        }
        _ => {}
    }
    if remove && upsert {
        return Err(CommandError::failed_to_parse(
            "Cannot specify both upsert=true and remove=true ",
        ));
    }
    if remove && new {
        return Err(CommandError::failed_to_parse(
            "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document",
        ));
    }
    let filter = Filter::parse(query)?;
    if upsert {
        // mongod refuses `$expr` in an upsert's filter even when a document matches.
        filter.check_upsert_allowed()?;
    }
    let vars = with_let(ctx, cmd, name)?;
    let project = |d: Document| -> CommandResult<Bson> {
        match fields {
            Some(f) if !f.is_empty() => Ok(Bson::Document(
                crate::engine::projection::project_matched(&d, f, query, &vars)?,
            )),
            _ => Ok(Bson::Document(d)),
        }
    };
    retryable(ctx, cmd, |st| {
        let target = match st.store.coll(ctx.db, coll) {
            Some(c) => {
                super::query::check_hint(c, cmd)?;
                find_one(c, &filter, sort, &vars)?
            }
            None => None,
        };
        match (target, &update) {
            (Some(rid), None) => {
                let old = st
                    .delete_doc(ctx.db, coll, rid, &vars)
                    .ok_or_else(|| CommandError::new(1, "InternalError", "record vanished"))?;
                Ok(doc! {"lastErrorObject": {"n": 1}, "value": project(old)?})
            }
            (None, None) => Ok(doc! {"lastErrorObject": {"n": 0}, "value": Bson::Null}),
            (Some(rid), Some(u)) => {
                let want = if new { Want::After } else { Want::Before };
                let (doc, _) = apply_update(st, ctx.db, coll, rid, u, &vars, want)?;
                let value = match doc {
                    Some(d) => project(d)?,
                    None => Bson::Null,
                };
                Ok(doc! {"lastErrorObject": {"n": 1, "updatedExisting": true}, "value": value})
            }
            (None, Some(u)) => {
                if !upsert {
                    return Ok(
                        doc! {"lastErrorObject": {"n": 0, "updatedExisting": false}, "value": Bson::Null},
                    );
                }
                let doc = upsert_doc(query, &filter, u, &vars)?;
                let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
                st.insert_doc(ctx.db, coll, doc.clone(), &vars)?;
                let value = if new { project(doc)? } else { Bson::Null };
                Ok(doc! {
                    "lastErrorObject": {"n": 1, "updatedExisting": false, "upserted": id},
                    "value": value,
                })
            }
        }
    })
}
