//! Command dispatch: generic fields, fail points, error labels, cluster time; one module per
//! group of commands.

mod admin;
pub(crate) mod args;
mod crud;
mod ddl;
mod query;

use std::net::SocketAddr;
use std::sync::Arc;

use bson::{doc, spec::BinarySubtype, Binary, Bson, DateTime, Document};

use crate::engine::expr::Vars;
use crate::error::{CommandError, CommandResult};
use crate::failpoint::{self, Effect};
use crate::server::Shared;

/// Per-connection state.
pub struct Conn {
    /// mongod's connectionId.
    pub id: i64,
    /// The client's address.
    pub peer: SocketAddr,
    /// `client.application.name` from the handshake.
    pub app_name: Option<String>,
    /// Whether client metadata was received (it may only be sent once).
    pub metadata_seen: bool,
}

impl Conn {
    /// A new connection.
    pub fn new(id: i64, peer: SocketAddr) -> Conn {
        Conn {
            id,
            peer,
            app_name: None,
            metadata_seen: false,
        }
    }
}

/// What the connection does after a command.
pub enum Outcome {
    /// Send this reply.
    Reply(Document),
    /// Close the connection without replying (fail point `closeConnection`).
    Close,
}

/// What a command handler sees.
pub struct Ctx<'a> {
    /// The server.
    pub shared: &'a Shared,
    /// The connection.
    pub conn: &'a Conn,
    /// `$db`.
    pub db: &'a str,
    /// Variables (`$$NOW` etc.) for this operation.
    pub vars: Vars,
}

/// Handles one command document (with its OP_MSG document sequences).
pub async fn handle(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    mut body: Document,
    sequences: Vec<(String, Vec<Document>)>,
) -> Outcome {
    for (name, docs) in sequences {
        if body.contains_key(&name) {
            return Outcome::Reply(finish(
                shared,
                &body,
                Err(CommandError::bad_value(format!(
                    "Duplicate field '{name}' in the command body and a document sequence"
                ))),
            ));
        }
        body.insert(
            name,
            Bson::Array(docs.into_iter().map(Bson::Document).collect()),
        );
    }
    let name = match body.keys().next() {
        Some(n) => n.clone(),
        None => {
            return Outcome::Reply(finish(
                shared,
                &body,
                Err(CommandError::command_not_found("")),
            ))
        }
    };
    let db = match body.get("$db") {
        Some(Bson::String(s)) => s.clone(),
        _ => {
            return Outcome::Reply(finish(
                shared,
                &body,
                Err(CommandError::new(
                    40571,
                    "Location40571",
                    "OP_MSG requests require a $db argument",
                )),
            ))
        }
    };

    // Client metadata is accepted once per connection, in the handshake.
    if matches!(name.as_str(), "hello" | "isMaster" | "ismaster") {
        if let Some(client) = body.get("client") {
            if conn.metadata_seen {
                return Outcome::Reply(finish(
                    shared,
                    &body,
                    Err(CommandError::new(
                        186,
                        "ClientMetadataCannotBeMutated",
                        "The client metadata document may only be sent in the first hello",
                    )),
                ));
            }
            conn.metadata_seen = true;
            conn.app_name = client
                .as_document()
                .and_then(|c| c.get_document("application").ok())
                .and_then(|a| a.get_str("name").ok())
                .map(str::to_owned);
        }
    }

    shared.command_counts.count(&name);
    let is_stream = is_stream_command(shared, &name, &body);

    // Fail point.
    let effect = {
        let namespace = match body.get(&name) {
            Some(Bson::String(coll)) => format!("{db}.{coll}"),
            _ => format!("{db}.$cmd"),
        };
        shared
            .failpoint()
            .evaluate(&name, &namespace, conn.app_name.as_deref())
    };
    if let Some(effect) = &effect {
        if let Some(d) = effect.block {
            tokio::time::sleep(d).await;
        }
        if effect.close_connection {
            return Outcome::Close;
        }
        if let Some(err) = &effect.error {
            let mut err = err.clone();
            if let Some(labels) = &effect.labels_override {
                err.labels = labels.clone();
            } else {
                add_labels(
                    is_stream,
                    &name,
                    &body,
                    &mut err.labels,
                    Some(err.code),
                    None,
                );
            }
            return Outcome::Reply(finish_labeled(shared, &body, Err(err)));
        }
    }

    let mut vars = Vars::new(DateTime::now());
    if !shared.config.standalone {
        vars = vars.with_cluster_time(shared.lock().clock.now());
    }
    let ctx = Ctx {
        shared,
        conn,
        db: &db,
        vars,
    };
    let result = dispatch(&ctx, &name, &mut body).await;
    let result = result.map(|mut reply| {
        if let Some(Effect {
            write_concern_error: Some(wce),
            ..
        }) = &effect
        {
            reply.insert("writeConcernError", wce.clone());
        }
        reply
    });
    let mut result = result;
    match &mut result {
        Ok(reply) => {
            let wce_code = reply
                .get_document("writeConcernError")
                .ok()
                .and_then(|w| args::as_i64(w.get("code")?))
                .map(|c| c as i32);
            if wce_code.is_some() {
                let mut labels = Vec::new();
                match effect.as_ref().and_then(|e| e.labels_override.clone()) {
                    Some(l) => labels = l,
                    None => add_labels(is_stream, &name, &body, &mut labels, None, wce_code),
                }
                if !labels.is_empty() {
                    reply.insert("errorLabels", labels);
                }
            }
        }
        Err(err) => {
            let code = err.code;
            let mut labels = std::mem::take(&mut err.labels);
            add_labels(is_stream, &name, &body, &mut labels, Some(code), None);
            err.labels = labels;
        }
    }
    Outcome::Reply(finish_labeled(shared, &body, result))
}

/// Adds the labels mongod computes: `RetryableWriteError` for retryable writes failing with a
/// retryable code, `ResumableChangeStreamError` for change-stream commands.
fn add_labels(
    is_stream: bool,
    name: &str,
    body: &Document,
    labels: &mut Vec<String>,
    code: Option<i32>,
    wce_code: Option<i32>,
) {
    let mut push = |l: &str| {
        if !labels.iter().any(|x| x == l) {
            labels.push(l.to_owned());
        }
    };
    let retryable_write = body.contains_key("txnNumber")
        && !body.contains_key("autocommit")
        && matches!(
            name,
            "insert" | "update" | "delete" | "findAndModify" | "findandmodify"
        );
    if retryable_write
        && (code.is_some_and(failpoint::is_retryable_write_code)
            || wce_code.is_some_and(failpoint::is_retryable_write_code))
    {
        push("RetryableWriteError");
    }
    if let Some(code) = code {
        if is_stream {
            if failpoint::is_resumable_change_stream_code(code) {
                push("ResumableChangeStreamError");
            }
            if failpoint::is_non_resumable_change_stream_code(code) {
                push("NonResumableChangeStreamError");
            }
        }
    }
}

/// Whether the command is a change-stream aggregate or a getMore on a change stream (known
/// before the command runs: a failing getMore closes its cursor).
fn is_stream_command(shared: &Shared, name: &str, body: &Document) -> bool {
    match name {
        "aggregate" => body
            .get_array("pipeline")
            .ok()
            .and_then(|p| p.first())
            .and_then(Bson::as_document)
            .is_some_and(|s| s.contains_key("$changeStream")),
        "getMore" => body
            .get("getMore")
            .and_then(args::as_i64)
            .is_some_and(|id| shared.lock().cursors.is_stream(id)),
        _ => false,
    }
}

/// The reply to a request that failed before it reached a command (or whose reply could not be
/// sent): the error with the usual `operationTime` and `$clusterTime`.
pub fn error_reply(shared: &Shared, error: CommandError) -> Document {
    finish(shared, &Document::new(), Err(error))
}

fn finish(shared: &Shared, body: &Document, result: CommandResult<Document>) -> Document {
    finish_labeled(shared, body, result)
}

/// Turns a result into the reply: `ok`, error fields, `operationTime` and `$clusterTime`.
fn finish_labeled(shared: &Shared, _body: &Document, result: CommandResult<Document>) -> Document {
    let mut reply = match result {
        Ok(mut r) => {
            if !r.contains_key("ok") {
                r.insert("ok", 1.0);
            }
            r
        }
        Err(e) => e.to_reply(),
    };
    if !shared.config.standalone {
        let now = shared.lock().clock.now();
        reply.insert(
            "$clusterTime",
            doc! {
                "clusterTime": now,
                "signature": {
                    "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] },
                    "keyId": 0i64,
                },
            },
        );
        reply.insert("operationTime", now);
    }
    reply
}

/// Runs the command `cmd` named `name`. A command may take values out of `cmd` that it alone
/// reads (`findAndModify`'s `update`); the caller reads only generic fields afterwards.
async fn dispatch(ctx: &Ctx<'_>, name: &str, cmd: &mut Document) -> CommandResult<Document> {
    // A login attempt, whatever its mechanism and fields: there are no users to log in as. (A
    // `speculativeAuthenticate` in `hello` is left unanswered, as mongod leaves a failed one,
    // so the driver follows it with one of these.)
    if matches!(name, "saslStart" | "saslContinue" | "authenticate") {
        return Err(CommandError::authentication_not_supported());
    }
    args::check_generic(ctx, name, cmd)?;
    if matches!(name, "findAndModify" | "findandmodify") {
        return crud::find_and_modify(ctx, name, cmd);
    }
    let cmd: &Document = cmd;
    match name {
        "hello" | "isMaster" | "ismaster" => admin::hello(ctx, name, cmd),
        "ping" => admin::ping(cmd),
        "buildInfo" | "buildinfo" => admin::build_info(cmd),
        "endSessions" => admin::end_sessions(ctx, cmd),
        "listDatabases" => admin::list_databases(ctx, cmd),
        "setParameter" => admin::set_parameter(ctx, cmd),
        "getParameter" => admin::get_parameter(ctx, cmd),
        "configureFailPoint" => admin::configure_fail_point(ctx, cmd),
        "serverStatus" => admin::server_status(ctx, cmd),
        "whatsmyuri" => Ok(doc! {"you": ctx.conn.peer.to_string()}),
        "insert" => crud::insert(ctx, cmd),
        "update" => crud::update(ctx, cmd),
        "delete" => crud::delete(ctx, cmd),
        "find" => query::find(ctx, cmd),
        "getMore" => query::get_more(ctx, cmd).await,
        "killCursors" => query::kill_cursors(ctx, cmd),
        "count" => query::count(ctx, cmd),
        "distinct" => query::distinct(ctx, cmd),
        "aggregate" => query::aggregate(ctx, cmd),
        "create" => ddl::create(ctx, cmd),
        "drop" => ddl::drop(ctx, cmd),
        "dropDatabase" => ddl::drop_database(ctx, cmd),
        "listCollections" => ddl::list_collections(ctx, cmd),
        "createIndexes" => ddl::create_indexes(ctx, cmd),
        "listIndexes" => ddl::list_indexes(ctx, cmd),
        "dropIndexes" | "deleteIndexes" => ddl::drop_indexes(ctx, cmd),
        "commitTransaction" | "abortTransaction" => Err(args::no_transactions()),
        other => Err(CommandError::command_not_found(other)),
    }
}
