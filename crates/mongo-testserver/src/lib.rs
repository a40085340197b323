//! A MongoDB-compatible server for tests.
//!
//! `mongo-testserver` speaks the MongoDB wire protocol (OP_MSG, plus the legacy OP_QUERY
//! handshake) and implements, with MongoDB 7.0's documented semantics, the part of MongoDB that
//! lock libraries and typical applications use: CRUD with the query, update and aggregation
//! languages, `findAndModify`, upserts and duplicate-key errors, unique and TTL indexes, cursors,
//! retryable writes, change streams and the `failCommand` fail point. Test code talks to it
//! through the official `mongodb` driver over TCP, exactly as it would talk to `mongod`.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let server = mongo_testserver::TestServer::start().await?;
//! let uri = server.uri(); // mongodb://127.0.0.1:PORT/?directConnection=true
//! // ... connect with mongodb::Client::with_uri_str(&uri) ...
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # What it is
//! By default the server presents itself as the primary of a single-node replica set (so
//! drivers enable retryable writes, `$clusterTime` gossip and change streams);
//! [`Builder::standalone`] makes it a standalone server instead. Data lives in memory only.
//!
//! # Concurrency design
//! All mutable state — databases, collections, documents, indexes, cursors, retryable-write
//! records, the cluster clock and the change-stream event log — sits behind **one**
//! `std::sync::Mutex` (see `state::State`). Every command performs its whole
//! read-modify-write (find the target document, apply the update, check unique indexes, store
//! the result, append the change event, record the retryable-write reply) inside a single
//! critical section, and the lock is never held across an `.await`. Consequences:
//!
//! - every single-document write, `findAndModify` included, is atomic with respect to every
//!   other client: there is no window between "read" and "write" in which another command can
//!   run, so racing upserts on one `_id` produce exactly one insert and the other racers see
//!   the document (or an E11000, exactly as MongoDB specifies);
//! - multi-document writes are also applied without interleaving (stronger than MongoDB, which
//!   only promises per-document atomicity);
//! - change-stream events are appended in the same critical section as the write that caused
//!   them, so the event order is the write order; change-stream `getMore`s that find nothing
//!   subscribe to a `tokio::sync::watch` channel *before* releasing the lock and sleep on it,
//!   so they wake as soon as the next event is logged, without polling;
//! - blocking fail points (`blockConnection`) sleep asynchronously outside the lock.
//!
//! Parsing (commands, filters, updates) happens before the lock is taken and replies are
//! encoded after it is released, so critical sections are short; lookups by `_id` use a hash
//! index, and other queries and writes the ordered entries of a plain index's first field when
//! their filter allows (`range_index.rs`: equality, `$in`, ranges, `$and`, `$or` of indexable
//! branches; `serverStatus` `metrics.queryExecutor.scanned`/`scannedObjects` count what they
//! examined). Connections are independent tasks: a malformed frame closes only its own connection.
//!
//! A change stream tests the conjuncts of its leading `$match` that read only `operationType`,
//! `ns` and `documentKey` against those fields of a write before it builds the change event
//! (as mongod 5.1+ filters during its oplog read), so a stream narrowed to a few documents
//! costs little for the writes it does not deliver; it returns exactly the events it would
//! without that test (the argument is in `changestream.rs`). A request nesting more than 32
//! levels, and every `getMore` of a change stream whose stages do, runs on a thread with a
//! large stack.
//!
//! # Limits
//! Documents over 16 MiB are refused with mongod's errors, messages over 48 MB close the
//! connection, idle cursors expire after 10 minutes, the change-stream event log keeps the
//! last 100 000 events. Transactions, collations other than `simple`, text/geo indexes,
//! `$lookup`-style stages and anything else not implemented are refused with an error that
//! names the feature — never silently ignored.
//!
//! As in mongod, a command may nest 200 levels (deeper messages are answered with `Overflow`,
//! 15, and the connection stays open), a stored document 180 (`Overflow` on insert or
//! update), and a returned document may be at most 16 MiB + 16 KiB (`BSONObjectTooLarge`,
//! 10334, for an aggregation result or a change event that is larger). Field names with a NUL
//! byte are refused wherever a command could create one (`$rename`: 2; `$arrayToObject`:
//! 4940400/4940401; `$setField`/`$unsetField`/`$getField`: 9534700; a field path: 16411; any other path: 31032). No reply is ever replaced by a
//! dropped connection: a reply that cannot be encoded becomes an error reply, and a change
//! stream that reaches an event it cannot send fails at that event on every getMore and every
//! resume — it never skips it.
//!
//! # What is implemented
//! - **Query operators**: `$eq $ne $gt $gte $lt $lte $in $nin $exists $type $size $all
//!   $elemMatch $mod $regex $not $and $or $nor $expr $comment $bitsAllSet $bitsAllClear
//!   $bitsAnySet $bitsAnyClear`. Range comparisons never match NaN (`$gte`/`$lte` NaN match
//!   NaN). Not implemented: `$where`, `$text`, `$jsonSchema`, geospatial operators.
//! - **Update operators**: `$set $unset $setOnInsert $inc $mul $min $max $rename $currentDate
//!   $push (with $each $position $slice $sort) $addToSet $pop $pull $pullAll $bit`, plus
//!   replacements and pipeline updates (with an update statement's constants `c` as `$$name`). `$`-prefixed names below the top level are allowed
//!   (MongoDB 5.0+); a top-level one only when an upsert inserts. The positional operators `$` (the position the query's match recorded on
//!   each document, as for the positional projection below, even from a condition on another
//!   array), `$[]` and `$[<identifier>]` with `arrayFilters` (update and findAndModify), nested
//!   as well; the errors MongoDB gives for no recorded position or an upsert inserting (2), two
//!   `$` or a positional element first in a path (2), `$` landing on another operator's path
//!   (40), a missing or unused array filter (2, 9), a missing or non-array field for `$[]` (2)
//!   and dynamic `$rename` paths (2).
//! - **Find projections** (find, findAndModify `fields`): inclusion, exclusion, computed
//!   fields, paths through arrays (scalars dropped by inclusions, nested arrays projected),
//!   `$slice` (applied after the rest, its path included by an inclusion; it walks documents in
//!   arrays on its path, leaving other elements and nested arrays alone), `$elemMatch` (alone it
//!   includes, alongside exclusions it excludes) and the positional `a.$`: the first array on
//!   the path keeps the element at the position the query's match recorded, as mongod's
//!   elemMatchKey (MongoDB 4.4+: from the last condition, in mongod's normalized order, that
//!   matched through an array, even another array; `$or`, `$nor` and negations record none;
//!   51246 without a position, 51247 past the array's end). Not implemented (refused by name):
//!   `$meta`.
//! - **Command options** are checked as mongod's parsers check them: an unknown field is
//!   40415, a wrongly typed option TypeMismatch (14), a negative `skip`/`limit`/`batchSize`
//!   51024; numbers are truncated where mongod truncates them (`batchSize: 1.9` is 1); null is
//!   an omitted option where mongod's parser says so, but not for `find`'s boolean flags
//!   nor its `filter`/`projection`/`sort` (14); `listCollections`' `nameOnly` and
//!   `authorizedCollections` take only booleans; `$changeStream`'s `showSystemEvents` and
//!   `showExpandedEvents` are refused under `apiStrict: true` (323);
//!   `findAndModify`'s `new`/`upsert`/`remove`/`bypassDocumentValidation` take numbers, while
//!   `ordered` and an update statement's `upsert`/`multi` must be booleans; `maxTimeMS` is
//!   refused with BadValue (2) unless an integral number in `[0, 2^31)` (`aggregate` and
//!   `getMore` check its type first: 14, and 51024 for `aggregate`); a malformed update or
//!   delete statement fails the whole command before any statement runs; a `hint` that is
//!   neither a string nor an object is FailedToParse (9), one naming no index BadValue (2) (a
//!   write error for update and delete statements).
//! - **Stages**: `$match $project $addFields/$set $unset $replaceRoot/$replaceWith $group
//!   $sort $skip $limit $count $unwind $changeStream` (update pipelines: `$addFields/$set
//!   $project $unset $replaceRoot/$replaceWith`). Not implemented (refused by name):
//!   `$lookup $graphLookup $unionWith $facet $bucket $bucketAuto $sortByCount $sample $out
//!   $merge $geoNear $redact $densify $fill $setWindowFields $documents $search
//!   $changeStreamSplitLargeEvent` and the diagnostic stages.
//! - **Accumulators**: `$sum $avg $min $max $first $last $push $addToSet $count
//!   $mergeObjects`. Not implemented: `$stdDevPop $stdDevSamp $top $bottom $topN $bottomN
//!   $firstN $lastN $maxN $minN $median $percentile $accumulator`.
//! - **Expression operators**: arithmetic `$add $subtract $multiply $divide $mod $abs $ceil
//!   $floor $trunc $sqrt $pow`; comparison `$eq $ne $gt $gte $lt $lte $cmp`; boolean `$and $or
//!   $not`; conditional `$cond $ifNull $switch`; arrays `$arrayElemAt $concatArrays $filter
//!   $map $reduce $in $indexOfArray $isArray $range $reverseArray $size $slice $first $last
//!   $allElementsTrue $anyElementTrue $arrayToObject $objectToArray`; objects
//!   `$mergeObjects $getField $setField $unsetField`; strings `$concat $toLower $toUpper
//!   $strLenBytes $strLenCP`; types `$type $convert $toBool $toDate $toDecimal $toDouble
//!   $toInt $toLong $toObjectId $toString $isNumber`; dates `$dateAdd $dateSubtract $dateDiff
//!   $dateToString $year $month $dayOfMonth $dayOfWeek $dayOfYear $hour $minute $second
//!   $millisecond`; `$min $max $sum $avg $let $literal`. Any other operator is refused with
//!   InvalidPipelineOperator (168), among them: `$substr $substrBytes $substrCP $split $trim
//!   $ltrim $rtrim $regexMatch $regexFind $regexFindAll $replaceOne $replaceAll $indexOfBytes
//!   $indexOfCP $strcasecmp $round $exp $ln $log $log10` and the trigonometric operators,
//!   `$zip $sortArray $setUnion $setIntersection $setDifference $setEquals $setIsSubset
//!   $firstN $lastN $maxN $minN`, `$dateFromString $dateFromParts $dateToParts $dateTrunc
//!   $week $isoWeek $isoWeekYear $isoDayOfWeek`, `$rand $binarySize $bsonSize $function`.
//! - **Decimal128** is computed as IEEE 754-2008 decimal128 (`$add $subtract $multiply
//!   $divide $mod $abs $floor $ceil $trunc`, `$inc $mul`, `$sum $avg`) and compared with other
//!   numbers exactly; `$sqrt` and `$pow` on decimals are computed in binary and converted.
//! - **Indexes**: single and compound, unique, sparse, partial (equality, `$exists: true`,
//!   ranges, `$type`, `$in`, `$and`/`$or`; other filters: CannotCreateIndex, 67; equivalent
//!   filters name the same index), TTL (`expireAfterSeconds` stored as an int). `createIndexes`
//!   compares a request with existing indexes as mongod: same name and key with the same
//!   unique/sparse/partial filter but other options 85 (IndexOptionsConflict), same name with
//!   another key or identifying option 86 (IndexKeySpecsConflict), another name with the same
//!   key and identifying options 85, an identical index a no-op (`note: "all indexes already
//!   exist"`); option types as mongod's `validateIndexSpec` (unknown option 197, wrong type 14,
//!   `v` other than 1 or 2: 67). Not implemented: text, geospatial, hashed, wildcard and hidden
//!   indexes, collations.

#![warn(missing_docs)]
// CommandError carries mongod's whole error shape (labels, extra fields); errors are the cold
// path, so results are not boxed.
#![allow(clippy::result_large_err)]
// On docs.rs (`--cfg docsrs`, see Cargo.toml), items behind a feature say which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod changestream;
mod clock;
mod commands;
mod cursors;
pub mod engine;
pub mod error;
mod failpoint;
mod keys;
mod limits;
mod range_index;
mod server;
mod sessions;
mod state;
mod store;
mod ttl;
pub mod wire;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use error::{CommandError, CommandResult};

/// The replica set name reported in replica-set mode.
pub const DEFAULT_SET_NAME: &str = "mongolock-test";
/// mongod's default `ttlMonitorSleepSecs`.
pub const DEFAULT_TTL_MONITOR_INTERVAL: Duration = Duration::from_secs(60);

/// Options for starting a [`TestServer`].
#[derive(Debug, Clone)]
pub struct Builder {
    standalone: bool,
    ttl_interval: Duration,
    bind: IpAddr,
    port: u16,
    set_name: String,
    pipeline_updates_as_replace: bool,
    majority_read_concern: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            standalone: false,
            ttl_interval: DEFAULT_TTL_MONITOR_INTERVAL,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            set_name: DEFAULT_SET_NAME.to_owned(),
            pipeline_updates_as_replace: false,
            majority_read_concern: true,
        }
    }
}

impl Builder {
    /// Report a standalone server instead of a single-node replica-set primary (no change
    /// streams, no retryable writes, no `$clusterTime`).
    pub fn standalone(mut self, standalone: bool) -> Self {
        self.standalone = standalone;
        self
    }

    /// How often the TTL monitor runs (mongod's `ttlMonitorSleepSecs`, default 60 s).
    pub fn ttl_monitor_interval(mut self, interval: Duration) -> Self {
        self.ttl_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The address to listen on (default 127.0.0.1).
    pub fn bind(mut self, addr: IpAddr) -> Self {
        self.bind = addr;
        self
    }

    /// The port to listen on (default 0: a free port).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// The replica set name (default `mongolock-test`).
    pub fn set_name(mut self, name: impl Into<String>) -> Self {
        self.set_name = name.into();
        self
    }

    /// Report updates made with an aggregation pipeline in change streams the way MongoDB 4.4
    /// does: as `replace` events carrying the whole new document (`fullDocument`) and no
    /// `updateDescription` (default false: `update` events with an update description, as
    /// MongoDB 5.0 and later report them). Updates with operators (`$set`, ...) stay `update`
    /// events either way.
    pub fn pipeline_updates_as_replace(mut self, enabled: bool) -> Self {
        self.pipeline_updates_as_replace = enabled;
        self
    }

    /// Serve read concern `majority` (default true), or refuse it as MongoDB 4.4 does when
    /// started with `--enableMajorityReadConcern=false` (the usual setting of a
    /// primary-secondary-arbiter set): every command that asks for it fails with
    /// `ReadConcernMajorityNotEnabled` (148), except a change stream (`aggregate` whose first
    /// stage is `$changeStream`) and a `find` with `allowSpeculativeMajorityRead: true`
    /// (mongod's jstest `speculative_majority_supported_commands.js`). Change streams go on
    /// working.
    pub fn majority_read_concern(mut self, enabled: bool) -> Self {
        self.majority_read_concern = enabled;
        self
    }

    /// Binds the socket and starts serving. Must be called inside a Tokio runtime.
    pub async fn start(self) -> std::io::Result<TestServer> {
        let listener = TcpListener::bind(SocketAddr::new(self.bind, self.port)).await?;
        let addr = listener.local_addr()?;
        let host = if addr.ip().is_unspecified() {
            format!("127.0.0.1:{}", addr.port())
        } else {
            addr.to_string()
        };
        let shared = Arc::new(server::Shared::new(
            server::Config {
                standalone: self.standalone,
                set_name: self.set_name,
                pipeline_updates_as_replace: self.pipeline_updates_as_replace,
                host,
                majority_read_concern: self.majority_read_concern,
            },
            self.ttl_interval,
        ));
        let tasks = vec![
            tokio::spawn(server::accept_loop(listener, shared.clone())),
            tokio::spawn(ttl::run(shared.clone())),
            tokio::spawn(ttl::janitor(shared.clone())),
        ];
        tracing::debug!(%addr, "mongo-testserver listening");
        Ok(TestServer {
            addr,
            shared,
            tasks,
            background: None,
        })
    }

    /// Starts the server on its own thread with its own Tokio runtime, so that one server can
    /// be shared by tests that each run in their own runtime (e.g. one `#[tokio::test]` per
    /// test, sharing a server kept in a `static`). Works inside or outside a runtime.
    pub fn start_background(self) -> std::io::Result<TestServer> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("mongo-testserver".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("mongo-testserver-worker")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                rt.block_on(async move {
                    let started = self.start().await;
                    let ok = started.is_ok();
                    let _ = ready_tx.send(started);
                    if ok {
                        // Serve until the handle is dropped or shut down.
                        let _ = stop_rx.await;
                    }
                });
            })?;
        let mut server = ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the server thread ended before starting"))??;
        server.background = Some(Background {
            stop: Some(stop_tx),
            thread: Some(thread),
        });
        Ok(server)
    }
}

/// The thread and runtime of a server started with [`Builder::start_background`].
struct Background {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        // The thread's runtime shuts down right after; joining it here could block an async
        // caller, so it is detached.
        self.thread.take();
    }
}

/// A running server. Dropping it stops the server (listener, connections and background
/// tasks); [`TestServer::shutdown`] does the same and waits for the tasks to finish.
pub struct TestServer {
    addr: SocketAddr,
    shared: Arc<server::Shared>,
    tasks: Vec<JoinHandle<()>>,
    background: Option<Background>,
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl TestServer {
    /// Starts a replica-set-mode server on a free port of 127.0.0.1, in the current runtime.
    pub async fn start() -> std::io::Result<TestServer> {
        Builder::default().start().await
    }

    /// Starts a replica-set-mode server on its own thread and runtime (see
    /// [`Builder::start_background`]).
    pub fn start_background() -> std::io::Result<TestServer> {
        Builder::default().start_background()
    }

    /// A builder for the other options.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection string: `mongodb://HOST:PORT/?directConnection=true`.
    pub fn uri(&self) -> String {
        format!(
            "mongodb://{}/?directConnection=true",
            self.shared.config.host
        )
    }

    /// Whether the server reports itself as a standalone.
    pub fn is_standalone(&self) -> bool {
        self.shared.config.standalone
    }

    /// Runs one TTL monitor pass now (tests that do not want to wait for the monitor).
    pub fn run_ttl_pass(&self) {
        ttl::pass(&self.shared);
    }

    /// Stops the server and waits until every task has ended.
    pub async fn shutdown(mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        if let Some(mut b) = self.background.take() {
            b.stop();
        }
    }

    /// Serves until SIGINT or SIGTERM (Ctrl-C on non-Unix), then shuts down.
    pub async fn run_until_signal(self) -> std::io::Result<()> {
        wait_for_signal().await?;
        self.shutdown().await;
        Ok(())
    }
}

#[cfg(unix)]
async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

#[cfg(not(unix))]
async fn wait_for_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}

impl Drop for TestServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(mut b) = self.background.take() {
            b.stop();
        }
    }
}
