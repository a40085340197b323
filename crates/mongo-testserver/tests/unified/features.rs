//! Which spec tests use MongoDB features outside issue 2's list (the server's contract).
//!
//! Only such tests may be skipped when running against the test server, and each skip names
//! the feature. Against a real deployment (MONGODB_URI) nothing is skipped for this reason.

use mongodb::bson::{Bson, Document};

/// Query operators of issue 2, item 4.
const QUERY_OPS: &[&str] = &[
    "$eq",
    "$ne",
    "$gt",
    "$gte",
    "$lt",
    "$lte",
    "$in",
    "$nin",
    "$exists",
    "$type",
    "$and",
    "$or",
    "$nor",
    "$not",
    "$elemMatch",
    "$size",
    "$expr",
];

/// Aggregation expression operators of issue 2, item 5.
const EXPR_OPS: &[&str] = &[
    "$literal",
    "$add",
    "$subtract",
    "$multiply",
    "$cond",
    "$ifNull",
    "$eq",
    "$ne",
    "$lt",
    "$lte",
    "$gt",
    "$gte",
    "$cmp",
    "$and",
    "$or",
    "$not",
    "$max",
    "$min",
    "$type",
    "$toLong",
    "$toDate",
    "$size",
    "$filter",
    "$map",
    "$concatArrays",
    "$in",
    "$arrayElemAt",
    "$dateAdd",
];

/// Update operators of issue 2, item 6 (with `$each` for `$push`/`$addToSet`, and `$type`
/// inside `$currentDate`).
const UPDATE_OPS: &[&str] = &[
    "$set",
    "$unset",
    "$inc",
    "$mul",
    "$min",
    "$max",
    "$rename",
    "$setOnInsert",
    "$currentDate",
    "$push",
    "$pull",
    "$addToSet",
    "$each",
];

/// Pipeline-update stages of issue 2, item 6.
const UPDATE_STAGES: &[&str] = &[
    "$set",
    "$addFields",
    "$unset",
    "$project",
    "$replaceWith",
    "$replaceRoot",
];

/// Aggregation stages of issue 2, item 3.
const AGG_STAGES: &[&str] = &[
    "$match",
    "$sort",
    "$skip",
    "$limit",
    "$project",
    "$count",
    "$changeStream",
];

/// Stages the test server allows after `$changeStream` (those of the list that MongoDB allows
/// in a change stream pipeline).
const CHANGE_STREAM_STAGES: &[&str] = &["$match", "$project"];

/// Commands of issue 2, item 3.
const COMMANDS: &[&str] = &[
    "ping",
    "buildinfo",
    "hello",
    "ismaster",
    "endsessions",
    "insert",
    "find",
    "getmore",
    "killcursors",
    "update",
    "delete",
    "findandmodify",
    "aggregate",
    "count",
    "createindexes",
    "listindexes",
    "dropindexes",
    "create",
    "drop",
    "dropdatabase",
    "listcollections",
    "listdatabases",
    "setparameter",
    "configurefailpoint",
];

fn operation_skip(name: &str) -> Option<&'static str> {
    Some(match name {
        "distinct" => "the distinct command is outside issue 2's command list",
        "countDocuments" => {
            "countDocuments runs an aggregate with $group, a stage outside issue 2's list"
        }
        "rename" => "renameCollection is outside issue 2's command list",
        "clientBulkWrite" => "the bulkWrite command (MongoDB 8.0) is outside issue 2's list",
        "startTransaction" | "commitTransaction" | "abortTransaction" | "withTransaction" => {
            "transactions are outside issue 2's list"
        }
        "endSession"
        | "assertSessionPinned"
        | "assertSessionUnpinned"
        | "assertSessionTransactionState"
        | "assertSessionDirty"
        | "assertSessionNotDirty"
        | "assertSameLsidOnLastTwoCommands"
        | "assertDifferentLsidOnLastTwoCommands"
        | "targetedFailPoint" => "explicit sessions / mongos pinning are outside issue 2's list",
        "createSearchIndex"
        | "createSearchIndexes"
        | "dropSearchIndex"
        | "listSearchIndexes"
        | "updateSearchIndex" => "Atlas search indexes are outside issue 2's list",
        "modifyCollection" | "createView" => "collMod/views are outside issue 2's list",
        _ => return None,
    })
}

/// Arguments (options) that ask for a feature outside issue 2's list.
fn argument_skip(op: &str, arg: &str) -> Option<String> {
    let feature = match (op, arg) {
        (_, "collation") => "collation",
        (_, "hint") => "index hints",
        (_, "let") => "let variables",
        (_, "session") => "explicit sessions",
        (_, "allowDiskUse") => "allowDiskUse",
        (_, "min" | "max" | "returnKey" | "showRecordId") => "min/max/returnKey/showRecordId",
        (_, "cursorType") => "tailable cursors (capped collections)",
        (_, "fullDocumentBeforeChange") => "change stream pre-images",
        (_, "showExpandedEvents") => "expanded change events",
        (_, "startAtOperationTime") => "change streams started at an operation time",
        ("createCollection", a) if a != "collection" => return Some(format!("create option {a}")),
        ("createIndex", a) if !matches!(a, "keys" | "name" | "unique" | "expireAfterSeconds") => {
            return Some(format!("index option {a}"))
        }
        _ => return None,
    };
    Some(feature.to_string())
}

#[derive(Clone, Copy)]
enum Context {
    Filter,
    UpdateDocument,
    Expressions,
}

fn allowed(ctx: Context, key: &str) -> bool {
    match ctx {
        Context::Filter => QUERY_OPS.contains(&key) || EXPR_OPS.contains(&key),
        Context::UpdateDocument => {
            UPDATE_OPS.contains(&key) || QUERY_OPS.contains(&key) || key == "$type"
        }
        Context::Expressions => QUERY_OPS.contains(&key) || EXPR_OPS.contains(&key),
    }
}

/// The first `$`-prefixed key under `value` that `ctx` does not allow.
fn scan(value: &Bson, ctx: Context) -> Option<String> {
    match value {
        Bson::Document(d) => {
            for (k, v) in d {
                if k == "$literal" {
                    continue;
                }
                if k.starts_with('$') && !allowed(ctx, k) {
                    return Some(k.clone());
                }
                if let Some(found) = scan(v, ctx) {
                    return Some(found);
                }
            }
            None
        }
        Bson::Array(items) => items.iter().find_map(|i| scan(i, ctx)),
        _ => None,
    }
}

fn scan_pipeline(stages: &[Bson], allowed_stages: &[&str], what: &str) -> Option<String> {
    for stage in stages {
        let Some(d) = stage.as_document() else {
            continue;
        };
        for (name, body) in d {
            if !allowed_stages.contains(&name.as_str()) {
                return Some(format!("the {name} stage in {what}"));
            }
            if let Some(op) = scan(body, Context::Expressions) {
                return Some(format!("{op} in {what}"));
            }
        }
    }
    None
}

fn arguments_skip(op: &str, object_is_client: bool, args: &Document) -> Option<String> {
    if op == "createChangeStream" && object_is_client {
        return Some(
            "cluster-wide change streams (allChangesForCluster): issue 2 lists collection and \
             database streams only"
                .to_string(),
        );
    }
    if op == "runCommand" {
        if let Ok(cmd) = args.get_document("command") {
            if let Some(name) = cmd.keys().next() {
                if !COMMANDS.contains(&name.to_ascii_lowercase().as_str()) {
                    return Some(format!("the {name} command"));
                }
            }
        }
    }
    for (k, v) in args {
        if let Some(feature) = argument_skip(op, k) {
            return Some(feature);
        }
        let found = match (k.as_str(), v) {
            ("filter", _) => scan(v, Context::Filter).map(|o| format!("{o} in a filter")),
            ("update", Bson::Array(stages)) => {
                scan_pipeline(stages, UPDATE_STAGES, "an update pipeline")
            }
            ("update", _) => scan(v, Context::UpdateDocument).map(|o| format!("{o} in an update")),
            ("pipeline", Bson::Array(stages)) if op == "createChangeStream" => {
                scan_pipeline(stages, CHANGE_STREAM_STAGES, "a change stream pipeline")
            }
            ("pipeline", Bson::Array(stages)) => {
                scan_pipeline(stages, AGG_STAGES, "an aggregation pipeline")
            }
            ("fullDocument", Bson::String(s)) if s != "updateLookup" && s != "default" => {
                Some(format!("fullDocument: {s}"))
            }
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Why `test` needs a feature outside issue 2's list, if it does. `client_ids` are the ids of
/// the file's client entities.
pub fn outside_issue(test: &Document, entities: &[Bson], client_ids: &[String]) -> Option<String> {
    let entity_lists = std::iter::once(entities.to_vec()).chain(
        test.get_array("operations")
            .into_iter()
            .flatten()
            .filter_map(Bson::as_document)
            .filter(|op| op.get_str("name") == Ok("createEntities"))
            .filter_map(|op| op.get_document("arguments").ok())
            .filter_map(|a| a.get_array("entities").ok().cloned()),
    );
    for list in entity_lists {
        for e in &list {
            if let Some(kind) = e.as_document().and_then(|d| d.keys().next()) {
                let reason = match kind.as_str() {
                    "session" => "explicit session entities",
                    "bucket" => "GridFS buckets",
                    "clientEncryption" => "client-side field level encryption",
                    "thread" => "runner threads (SDAM/CMAP tests)",
                    _ => continue,
                };
                return Some(format!("needs {reason}, outside issue 2's list"));
            }
        }
    }
    for op in operations(test) {
        let name = op.get_str("name").unwrap_or_default();
        if let Some(reason) = operation_skip(name) {
            return Some(format!("operation {name}: {reason}"));
        }
        let object = op.get_str("object").unwrap_or_default();
        let empty = Document::new();
        let args = op.get_document("arguments").unwrap_or(&empty);
        let is_client = client_ids.iter().any(|c| c == object);
        if let Some(feature) = arguments_skip(name, is_client, args) {
            return Some(format!(
                "operation {name} uses {feature}, outside issue 2's list"
            ));
        }
    }
    None
}

/// The operations of a test (none when it has no `operations` array).
fn operations(test: &Document) -> impl Iterator<Item = &Document> {
    test.get_array("operations")
        .into_iter()
        .flatten()
        .filter_map(Bson::as_document)
}

/// Why `test` cannot run through the `mongodb` crate because of a known defect of the driver
/// (not of any server); such tests are skipped against every deployment, with this reason.
pub fn driver_defect(test: &Document) -> Option<String> {
    for op in operations(test) {
        let name = op.get_str("name").unwrap_or_default();
        let has_comment = op
            .get_document("arguments")
            .is_ok_and(|a| a.contains_key("comment"));
        if name == "bulkWrite" {
            return Some(
                "the mongodb crate has no collection-level bulkWrite (only Client::bulk_write, \
                 which needs MongoDB 8.0's bulkWrite command)"
                    .to_string(),
            );
        }
        if name == "createChangeStream" && has_comment {
            return Some(
                "mongodb crate defect RUST-1658: a change stream's `comment` is also serialized \
                 into the $changeStream stage, which MongoDB rejects (code 40415); the driver's \
                 own spec runner skips this test"
                    .to_string(),
            );
        }
    }
    None
}
