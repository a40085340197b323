//! The accept loop, one task per connection, and the background tasks (TTL monitor, janitor).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bson::{doc, Bson, Document};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::commands::{self, Conn, Outcome};
use crate::error::CommandError;
use crate::failpoint::FailCommand;
use crate::limits;
use crate::state::State;
use crate::wire::{self, Request, WireError};

/// Server-wide settings fixed at start.
#[derive(Debug, Clone)]
pub struct Config {
    /// Report a standalone server instead of a replica-set primary.
    pub standalone: bool,
    /// Replica set name.
    pub set_name: String,
    /// Report pipeline-style updates in change streams as `replace` events (MongoDB 4.4).
    pub pipeline_updates_as_replace: bool,
    /// `host:port` reported in `hello` (`me`, `primary`, `hosts`).
    pub host: String,
    /// Whether read concern `majority` is served (false: as MongoDB 4.4 started with
    /// `--enableMajorityReadConcern=false`, which refuses it except on change streams).
    pub majority_read_concern: bool,
}

/// State shared by every task of one server.
pub struct Shared {
    state: Mutex<State>,
    /// The `failCommand` fail point.
    pub failpoint: Mutex<FailCommand>,
    /// Settings.
    pub config: Config,
    /// TTL monitor period in milliseconds.
    pub ttl_interval_ms: AtomicU64,
    /// Woken when the TTL period changes.
    pub ttl_changed: tokio::sync::Notify,
    next_conn_id: AtomicI64,
    next_request_id: AtomicI32,
    /// Commands received, per name (`serverStatus` reports them as `metrics.commands`).
    pub command_counts: CommandCounts,
    /// Connections open now.
    pub connections_current: AtomicI64,
}

/// Counters of received commands by name, as mongod's `serverStatus().metrics.commands.<name>.total`
/// (lock-free: one relaxed increment per command).
pub struct CommandCounts {
    counts: Vec<AtomicU64>,
}

impl CommandCounts {
    /// Names counted separately; every other name is counted under `<other>`.
    pub const NAMES: &'static [&'static str] = &[
        "hello",
        "isMaster",
        "ping",
        "buildInfo",
        "endSessions",
        "listDatabases",
        "setParameter",
        "getParameter",
        "configureFailPoint",
        "serverStatus",
        "whatsmyuri",
        "insert",
        "update",
        "delete",
        "findAndModify",
        "find",
        "getMore",
        "killCursors",
        "count",
        "distinct",
        "aggregate",
        "create",
        "drop",
        "dropDatabase",
        "listCollections",
        "createIndexes",
        "listIndexes",
        "dropIndexes",
        "<other>",
    ];

    fn new() -> CommandCounts {
        CommandCounts {
            counts: Self::NAMES.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts one command named `name` (aliases count under their canonical name).
    pub fn count(&self, name: &str) {
        let canonical = match name {
            "ismaster" => "isMaster",
            "buildinfo" => "buildInfo",
            "findandmodify" => "findAndModify",
            "deleteIndexes" => "dropIndexes",
            other => other,
        };
        let i = Self::NAMES
            .iter()
            .position(|n| *n == canonical)
            .unwrap_or(Self::NAMES.len() - 1);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `(name, total)` for every name counted at least once.
    pub fn totals(&self) -> Vec<(&'static str, u64)> {
        Self::NAMES
            .iter()
            .zip(&self.counts)
            .map(|(n, c)| (*n, c.load(Ordering::Relaxed)))
            .filter(|(_, c)| *c > 0)
            .collect()
    }
}

impl Shared {
    /// A new server state.
    pub fn new(config: Config, ttl_interval: Duration) -> Shared {
        let state = State {
            pipeline_updates_as_replace: config.pipeline_updates_as_replace,
            ..State::default()
        };
        Shared {
            state: Mutex::new(state),
            failpoint: Mutex::new(FailCommand::default()),
            config,
            ttl_interval_ms: AtomicU64::new(ttl_interval.as_millis().max(1) as u64),
            ttl_changed: tokio::sync::Notify::new(),
            next_conn_id: AtomicI64::new(1),
            next_request_id: AtomicI32::new(1),
            command_counts: CommandCounts::new(),
            connections_current: AtomicI64::new(0),
        }
    }

    /// Locks the state. A poisoned lock (a panic while holding it, which the code avoids) is
    /// recovered: every critical section leaves the state consistent before it can fail.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks the fail point.
    pub fn failpoint(&self) -> MutexGuard<'_, FailCommand> {
        self.failpoint.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn request_id(&self) -> i32 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// Accepts connections until the task is aborted; aborting it drops the [`JoinSet`] and with
/// it every connection task.
pub async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let shared = shared.clone();
                    let id = shared.next_conn_id.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(async move { serve_connection(stream, peer, shared, id).await });
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, id: i64) {
    struct Open<'a>(&'a AtomicI64);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
    shared.connections_current.fetch_add(1, Ordering::Relaxed);
    let _open = Open(&shared.connections_current);
    let _ = stream.set_nodelay(true);
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = BufReader::with_capacity(16 * 1024, read_half);
    let mut conn = Conn::new(id, peer);
    let mut in_buf = Vec::with_capacity(4096);
    let mut out_buf = Vec::with_capacity(4096);
    loop {
        let request = match wire::read_request(&mut reader, &mut in_buf).await {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(WireError::TooDeep {
                request_id,
                flags,
                op_query,
            }) => {
                // mongod answers (it does not hang up on) a message it refuses to decode.
                if flags & wire::FLAG_MORE_TO_COME != 0 {
                    continue;
                }
                let reply = commands::error_reply(
                    &shared,
                    CommandError::new(
                        15,
                        "Overflow",
                        "BSONObj exceeds maximum nested object depth",
                    ),
                );
                let checksum = flags & wire::FLAG_CHECKSUM_PRESENT != 0;
                let encoded = if op_query {
                    wire::encode_op_reply(&mut out_buf, shared.request_id(), request_id, &reply)
                } else {
                    wire::encode_msg_reply(
                        &mut out_buf,
                        shared.request_id(),
                        request_id,
                        &reply,
                        checksum,
                    )
                };
                if encoded.is_err() || write_half.write_all(&out_buf).await.is_err() {
                    break;
                }
                continue;
            }
            Err(e) => {
                tracing::debug!(connection = id, "closing connection: {e}");
                break;
            }
        };
        let response_to;
        let mut checksum = false;
        let mut op_reply = false;
        let encoded = match request {
            Request::Msg(msg) => {
                let more_to_come = msg.more_to_come();
                checksum = msg.has_checksum();
                let request_id = msg.request_id;
                response_to = request_id;
                let outcome = handle_msg(
                    &shared,
                    &mut conn,
                    msg.body,
                    msg.sequences,
                    in_buf.len(),
                    msg.depth_bound,
                )
                .await;
                let reply = match outcome {
                    Outcome::Reply(r) => r,
                    Outcome::Close => break,
                };
                if more_to_come {
                    continue;
                }
                wire::encode_msg_reply(
                    &mut out_buf,
                    shared.request_id(),
                    request_id,
                    &reply,
                    checksum,
                )
            }
            Request::Query(q) => {
                response_to = q.request_id;
                op_reply = true;
                let reply =
                    match legacy_query(&shared, &mut conn, q.full_collection_name, q.query).await {
                        Some(r) => r,
                        None => break,
                    };
                wire::encode_op_reply(&mut out_buf, shared.request_id(), q.request_id, &reply)
            }
        };
        let problem = match encoded {
            Err(e) => Some(CommandError::new(
                1,
                "InternalError",
                format!("the reply could not be encoded as BSON: {e}"),
            )),
            Ok(()) if out_buf.len() > wire::MAX_MESSAGE_SIZE => {
                Some(crate::limits::too_large(out_buf.len()))
            }
            Ok(()) => None,
        };
        if let Some(error) = problem {
            // Commands check what they return, so this is a last line of defence: the client
            // gets an error reply instead of a dropped connection.
            tracing::warn!(connection = id, "could not send a reply: {error}");
            let reply = commands::error_reply(&shared, error);
            let encoded = if op_reply {
                wire::encode_op_reply(&mut out_buf, shared.request_id(), response_to, &reply)
            } else {
                wire::encode_msg_reply(
                    &mut out_buf,
                    shared.request_id(),
                    response_to,
                    &reply,
                    checksum,
                )
            };
            if encoded.is_err() {
                break;
            }
        }
        if write_half.write_all(&out_buf).await.is_err() {
            break;
        }
        if out_buf.capacity() > 1 << 20 {
            out_buf = Vec::with_capacity(4096);
        }
        if in_buf.capacity() > 1 << 20 {
            in_buf = Vec::with_capacity(4096);
        }
    }
}

/// Requests nesting deeper than this many levels run on a thread of their own with a large
/// stack: the engine walks commands recursively, and a command may nest up to
/// [`wire::MAX_NESTING_DEPTH`] levels, which a 2 MiB runtime thread (in a debug build) cannot
/// always afford. Each level costs a message at least 7 bytes, so small messages skip the check.
const DEEP_REQUEST_LEVELS: usize = crate::changestream::DEEP_PIPELINE_LEVELS;
/// Stack of the thread that runs a deep request (reserved address space, not memory in use).
const DEEP_REQUEST_STACK: usize = 256 << 20;

/// Whether `body` is a `getMore` on a change stream whose stages nest deeper than
/// [`DEEP_REQUEST_LEVELS`]: the aggregate that opened it ran on a large stack, and so must
/// every `getMore` that evaluates its stages.
fn deep_stream_get_more(shared: &Shared, body: &Document) -> bool {
    match body.iter().next() {
        Some((name, Bson::Int64(id))) if name == "getMore" => {
            shared.lock().cursors.is_deep_stream(*id)
        }
        _ => false,
    }
}

async fn handle_msg(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    body: Document,
    sequences: Vec<(String, Vec<Document>)>,
    frame_len: usize,
    depth_bound: usize,
) -> Outcome {
    // `depth_bound` is never below the depths `limits::shape` finds: within it, no walk.
    let deep = (frame_len >= 7 * DEEP_REQUEST_LEVELS
        && depth_bound > DEEP_REQUEST_LEVELS
        && (limits::shape(&body, DEEP_REQUEST_LEVELS).depth > DEEP_REQUEST_LEVELS
            || sequences
                .iter()
                .flat_map(|(_, docs)| docs)
                .any(|d| limits::shape(d, DEEP_REQUEST_LEVELS).depth + 2 > DEEP_REQUEST_LEVELS)))
        || deep_stream_get_more(shared, &body);
    if !deep {
        return commands::handle(shared, conn, body, sequences).await;
    }
    let runtime = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread_shared = shared.clone();
    let mut thread_conn = std::mem::replace(conn, Conn::new(conn.id, conn.peer));
    let spawned = std::thread::Builder::new()
        .name("mongo-testserver-deep-request".into())
        .stack_size(DEEP_REQUEST_STACK)
        .spawn(move || {
            let outcome = runtime.block_on(commands::handle(
                &thread_shared,
                &mut thread_conn,
                body,
                sequences,
            ));
            let _ = tx.send((outcome, thread_conn));
        });
    let failed = |what: String| {
        Outcome::Reply(commands::error_reply(
            shared,
            CommandError::new(1, "InternalError", what),
        ))
    };
    if let Err(e) = spawned {
        return failed(format!(
            "could not start a thread for a deeply nested request: {e}"
        ));
    }
    match rx.await {
        Ok((outcome, back)) => {
            *conn = back;
            outcome
        }
        Err(_) => failed("the deeply nested request failed".to_string()),
    }
}

/// Serves an OP_QUERY: only `hello`/`isMaster` on `<db>.$cmd` (as mongod 6+); `None` closes the
/// connection.
async fn legacy_query(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    ns: String,
    query: Document,
) -> Option<Document> {
    let (db, coll) = ns.split_once('.').unwrap_or((ns.as_str(), ""));
    let mut cmd = match query.get("$query") {
        Some(Bson::Document(inner)) => inner.clone(),
        _ => query.clone(),
    };
    let name = cmd.keys().next().cloned().unwrap_or_default();
    let is_hello = matches!(name.as_str(), "hello" | "isMaster" | "ismaster");
    if coll != "$cmd" || !is_hello {
        return Some(doc! {
            "ok": 0.0,
            "errmsg": format!("Unsupported OP_QUERY command: {name}. The client driver may require an upgrade. For more details see https://dochub.mongodb.org/core/legacy-opcode-removal"),
            "code": 352,
            "codeName": "UnsupportedOpQueryCommand",
        });
    }
    cmd.insert("$db", db);
    match commands::handle(shared, conn, cmd, Vec::new()).await {
        Outcome::Reply(r) => Some(r),
        Outcome::Close => None,
    }
}
