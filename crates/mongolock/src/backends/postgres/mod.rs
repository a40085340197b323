//! PostgreSQL backend (feature `postgres`).
//!
//! # Client
//! [`tokio-postgres`](https://docs.rs/tokio-postgres) with a
//! [`deadpool-postgres`](https://docs.rs/deadpool-postgres) pool. `tokio-postgres` is the
//! maintained asynchronous PostgreSQL client of the `rust-postgres` project, built on Tokio
//! (which mongolock already requires), and gives direct access to the connection's
//! asynchronous messages, which `LISTEN`/`NOTIFY` needs (`listen.rs`). `deadpool-postgres` is
//! a small pool for exactly that client (no runtime of its own, no macros). `sqlx` was not
//! chosen: it brings compile-time query macros, a runtime abstraction and drivers for other
//! databases that mongolock does not use, and its listener reconnects inside `recv`, while
//! mongolock wants to see each lost connection to switch waiters to polling and make them
//! re-check.
//!
//! # TLS
//! libpq's `sslmode` (`disable`, `prefer` (the default), `require`, `verify-ca`, `verify-full`)
//! and `sslrootcert` (a PEM file, or `system`), in the connection string or with
//! [`PostgresBackendBuilder::ssl_mode`] and [`PostgresBackendBuilder::ssl_root_cert`], on
//! [`rustls`](https://docs.rs/rustls) with the `ring` provider (through
//! [`tokio-postgres-rustls`](https://docs.rs/tokio-postgres-rustls)). The semantics are
//! libpq's: `prefer` and `require` encrypt without checking the server's certificate unless
//! root certificates are given (`sslrootcert`, or `~/.postgresql/root.crt` when it exists),
//! then they check the chain as `verify-ca` does; `verify-ca` checks the chain to a given
//! root; `verify-full` also checks that the certificate names the host of the connection
//! string (or its IP address). A certificate that is not accepted, or a server without TLS
//! under `require` or stricter, is [`Error::Backend`](crate::Error) (retrying does not help)
//! with a hint. Client certificates (`sslcert`, `sslkey`) and `sslmode=allow` are refused by
//! [`PostgresBackendBuilder::build`]. TLS is part of the `postgres` feature rather than a
//! feature of its own: a connection to a hosted database needs it, and `rustls` with `ring`
//! is already in the default build (the MongoDB driver uses them).
//!
//! # Statement and lock timeouts
//! Every pooled connection runs with `statement_timeout` (default
//! [`DEFAULT_STATEMENT_TIMEOUT`], [`PostgresBackendBuilder::statement_timeout`]) and
//! `lock_timeout` (three quarters of it), set once when the pool opens the connection. A lock statement waits for the row lock of its name, which
//! other lock statements hold for microseconds; a session that keeps the row locked (a
//! `SELECT ... FOR UPDATE` in a transaction left open, a stuck migration) would otherwise
//! block the statement, and the pooled connection under it, for as long as that session
//! lives. With the timeouts the server cancels the statement instead, and the operation
//! returns [`Error::Unavailable`](crate::Error) saying which timeout fired (the core retries it
//! within the caller's budget: an extension until the lease's local deadline). Keep the
//! timeout well below the shortest lease TTL you use, so that an extension blocked by such a
//! session has time to fail and be retried before the lease's deadline.
//!
//! # The lock table
//! One row per lock name, in a configurable schema and table (default
//! `public.mongolock_locks`), created by the first writing operation (an acquisition, a
//! release, a force-release) or by [`PostgresBackend::migrate`] — never by a read:
//!
//! ```text
//! name text PRIMARY KEY, lease_id text, fencing_token bigint NOT NULL,
//! acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
//! holder_host text, holder_pid bigint, holder_app text,
//! released text[] NOT NULL DEFAULT '{}',      -- the lease id kept on by a minimum hold
//! slot_limit integer, slots jsonb NOT NULL DEFAULT '[]',   -- semaphores (below)
//! waiters jsonb NOT NULL DEFAULT '[]', handoff text        -- the handoff queue (`queue.rs`)
//! ended bigint[] NOT NULL DEFAULT '{}', ended_from bigint  -- leases ended by others (below)
//! retired text[] NOT NULL DEFAULT '{}'        -- lease ids no late attempt may grant (below)
//! ```
//!
//! plus a sequence `<table>_fencing_token` (the source of every fencing token of the table), an
//! index on `expires_at` (for cleanup) and a trigger that publishes lease changes with
//! `pg_notify` on the name's bucket channel and the table channel (`listen.rs`). The migration runs in one transaction under an advisory lock, so
//! processes starting together do not race; a backend checks once (one query) whether it ran:
//! whether the table has every column and its trigger calls this version's function. Tables
//! created by earlier versions get the columns added since (`slot_limit`/`slots`, then
//! `waiters`/`handoff`, then `ended`/`ended_from`, then `retired`: `ALTER TABLE .. ADD COLUMN
//! IF NOT EXISTS`)
//! and the current trigger function; rows written before keep their tokens.
//!
//! # One statement per operation, on the server's clock
//! Every operation is one SQL statement in its own (autocommit) transaction: one round trip.
//! Uncontended acquire + release is two. Times are `clock_timestamp()`, the server's wall clock
//! when the expression is evaluated. `now()` would be the start of the statement's transaction,
//! which for a statement that waited for a row lock (another acquirer or a cleanup held it) can
//! lie arbitrarily far in the past: an expiry test with it would judge a lease by a stale time,
//! and an extension could succeed for a lease that had expired by the time the row was
//! written. `clock_timestamp()` in the `WHERE` and `SET` of an `UPDATE` (and of `ON CONFLICT DO
//! UPDATE`) is evaluated *after* the row is locked, so every decision is made with the time at
//! which it takes effect. (Successive calls within one statement differ by microseconds; every
//! comparison is made against a call at or after the moment the row was locked.) The client's
//! clock is never used.
//!
//! * **Acquire**: `INSERT ... VALUES (name, lease, nextval(seq), clock_timestamp(), + ttl)
//!   ON CONFLICT (name) DO UPDATE SET lease, token = nextval(seq), times, holder WHERE
//!   (lease_id IS NULL OR expires_at <= clock_timestamp() OR lease_id = ours) AND NOT ours =
//!   ANY(retired) RETURNING ...`,
//!   wrapped in a CTE whose outer `SELECT` also returns the current holder's expiry when the
//!   attempt was busy (from the statement's snapshot; a stale value only makes a waiter retry
//!   early). The update's `SET` decides the grant once, from one `clock_timestamp()` (`g.ok`),
//!   and writes either the new lease or the old lease columns unchanged. A busy attempt writes
//!   nothing, except when it registers its backend in the handoff queue (`queue.rs`): then
//!   the update runs whatever the grant test says, rewrites only `waiters`, and returns the
//!   holder's latest expiry.
//! * **Retire**, before the release of a lease id one of whose attempts failed with a
//!   transient error (its statement may still reach the server and be applied, for instance
//!   retransmitted after a partition on a connection the client gave up, after a later attempt
//!   of the same call was granted and released): `UPDATE ... SET retired = (retired ||
//!   ours)[last 16]` (`ops::retire_sql`). No grant is made to a retired id, so such a late
//!   attempt never grants the name to a lease nobody holds; the argument is MongoDB's
//!   (`backends/mongo/retired.rs`).
//! * **Extend**: `UPDATE ... SET expires_at = clock_timestamp() + ttl WHERE name AND lease_id =
//!   ours AND expires_at > clock_timestamp()` (and not kept on by a minimum hold, below): an
//!   expired lease is never extended.
//! * **Release**: `UPDATE ... SET lease_id = NULL, expires_at = least(expires_at,
//!   clock_timestamp()) WHERE lease_id = ours`, popping the first queued backend into
//!   `handoff` (returned with the reply). When it matches nothing, the same statement tells an
//!   earlier try of this release (a retry after a lost reply, however many other releases
//!   came between) from a loss by the lease's fencing token, which the backend remembers from
//!   the grant until a minute after the release: the row records the tokens of the leases
//!   that someone *other* than their holder ended (`ended`, the last 64, complete from
//!   `ended_from`), so a token of the row's lifetime that is not there was released by its
//!   holder. The argument, with the care the statement's snapshot needs, is at
//!   `ops::released_by_holder`. Nothing in the row grows with a busy name's traffic: a
//!   release writes the same few columns however many came before it.
//! * **Release with a minimum hold** (`release_after`, see the
//!   [backend contract](crate::backend#minimum-hold-at-most-once-per-interval)): the release's
//!   `UPDATE` whose `SET` decides with one `clock_timestamp()`: while the lease is unexpired and
//!   `acquired_at + min_hold` is ahead, it keeps the lease (same `lease_id`, token, holder,
//!   `acquired_at`), sets `expires_at = acquired_at + min_hold` and records the id in
//!   `released`; otherwise it is the plain release. Extend's `WHERE` refuses a lease
//!   whose id is in `released`, so a late extension cannot move the end of the hold, and the
//!   grant that takes the name at the end of the hold does not record it as ended by others.
//!   The trigger publishes only lease id or token changes, so the statement publishes a kept lease
//!   itself (`pg_notify`, `<token> - <name>`): waiters retry and learn the new expiry. A
//!   semaphore slot's lease id is reported (`is_slot`) and refused.
//! * **Force-release**: clears an unexpired lease (popping the queue likewise) and records its
//!   token (a semaphore's: every slot's) in `ended`; the row's token is kept. Grants that take
//!   over an expired lease, and slot grants and releases that discard expired slots, record
//!   those tokens likewise, in the same write.
//! * **Inspect / list**: one `SELECT` each; `held` is judged with one `clock_timestamp()`.
//!   `list` is sorted by name bytewise (`COLLATE "C"`), as Rust sorts strings.
//!
//! **Reads create and alter nothing.** The reads (`inspect`, `list`, `list_matching`,
//! `holders`, `waiters`, `slot_limit`) skip the migration: each is its one `SELECT`, with no
//! check before it, and its error tells what is wrong. A missing schema or table (`42P01`,
//! `3F000`) is [`Error::MissingLockTable`]: no lock was ever taken there, or the name is
//! wrong. A missing column (`42703`) costs one more query (the migration's own inventory) to
//! tell a table that is not mongolock's ([`Error::ForeignCollection`], as the writes refuse
//! it) from a lock table of an older version, which a read does not upgrade
//! ([`Error::Backend`] saying to run [`PostgresBackend::migrate`] or acquire once).
//!
//! **The uncontended shortcut.** The acquire and release statements carry the queue, the
//! semaphore slots and the record of ended leases, and PostgreSQL sets up every node of their
//! plans on each execution (`ExecutorStart`, the largest part of their cost, see
//! `docs/benchmarks.md`) even on a row that has none of these. So when this backend's own last
//! release of a name found nobody queued (`backends/leases.rs` `CheapNames`; one use per
//! release) and the grant need not queue the backend again, its next attempt on the name first
//! runs a small `UPDATE` (`Schema::acquire_cheap`): `WHERE lease_id IS NULL AND slot_limit IS
//! NULL AND slots = '[]' AND waiters = '[]' AND ended_from IS NOT NULL`, setting the lease id,
//! `nextval` of the sequence, the times from one `clock_timestamp()` and the holder. On such a
//! row the full statement writes exactly these columns: the lease is free (no lease, exclusive
//! mode), no lease ends (so `ended` and `ended_from` stay), the queue stays empty and `slots`
//! already is. So a grant by the shortcut is a grant of the full statement, decided under the
//! row lock by the same test on the latest row version (a concurrent committed write makes
//! PostgreSQL re-check the `WHERE` on the new version), and every argument below covers it.
//! The token (`nextval`) and the time are read in the `SET`'s sub-select, which refers to the
//! row: PostgreSQL evaluates it for the row, and again for the new version when it re-checks
//! one. An *uncorrelated* sub-select would be evaluated once per statement, before any wait for
//! the row lock: a statement that drew its token and then waited while another grant took a
//! later token and its holder released could write the older token (a token going backwards)
//! and an `acquired_at` before the previous lease ended. The first version of the shortcut did
//! exactly that; the torture run found it (test
//! `backend::the_shortcut_draws_its_token_after_waiting_for_the_row`). When the statement waited
//! only for a session that locked the row without changing it, its time is from before the
//! wait: still after the request was sent, so the expiry is never earlier than the one the
//! client trusts, and no grant of the name can have come between. A lease granted this way is released the same
//! way first (`Schema::release_cheap`: `WHERE lease_id = ours AND slot_limit IS NULL AND
//! waiters = '[]' AND ended_from IS NOT NULL`, setting no lease, `least(expires_at,
//! clock_timestamp())`, the designation of nobody by this backend, and no kept lease — what
//! the full release writes when nobody is queued). Either falls back to the full statement
//! when it matches no row: one more round trip, once per release.
//!
//! # Why two holders never overlap (in server time)
//! A grant writes the row of the name while holding its row lock, and only when the row has no
//! lease, an expired one (`expires_at <= clock_timestamp()`, evaluated after the lock was
//! taken), or the requester's own. The acquire statement evaluates that test once per row
//! (`g.ok`, one `clock_timestamp()` call in the `SET`'s sub-select) and every lease column's
//! new value follows that one result: either all are the new lease's or all are kept, so no
//! interleaving of clock readings can write a half-granted row. (The `WHERE` repeats the test
//! only to skip the write of a busy attempt that needs not register; it decides nothing: when
//! it passes, `g.ok` is evaluated later on the same locked row and is what counts.)
//! Extensions only move `expires_at` of an unexpired lease of the same lease id, also under the
//! row lock. Row locks serialize every write of a name, so
//! each write sees the result of the previous one: a second lease id can be written only at a
//! server time at or after the first lease's last `expires_at`. The first insert of a name is
//! serialized by the primary key (`ON CONFLICT` turns a concurrent insert into the update path,
//! which then sees the inserted row).
//!
//! # Why fencing tokens only grow, across cleanup
//! Every token is `nextval` of the table's sequence, which never returns a value twice nor a
//! smaller one than a value it returned before (it is not rolled back with transactions, and
//! survives crashes). Consider a grant of name `n` with token `t`, and any earlier grant of `n`
//! with token `t'`:
//!
//! * **The row existed** (the update path): `t` is evaluated in `SET`, after the row lock was
//!   taken, so after the transaction that wrote `t'` (or a later token) committed; `t'` was
//!   drawn before that commit, so `t' < t`.
//! * **The row did not exist** (the insert path, whose `VALUES` draws `t` before the conflict
//!   check): either `n` was never granted, or its row was deleted by cleanup. Cleanup runs
//!   `DELETE` inside a transaction that first takes `LOCK TABLE ... IN SHARE MODE`, which
//!   conflicts with the `ROW EXCLUSIVE` lock that every `INSERT`/`UPDATE` statement holds from
//!   before it starts executing until it commits. So the deleting transaction committed before
//!   our statement started (it cannot overlap it), `t'` was drawn before the row was deleted,
//!   and `t` after: `t' < t`.
//!
//! Release, expiry, takeover and force-release never lower `fencing_token`; a busy attempt
//! that registers in the queue writes it back unchanged; nothing else writes it. Tokens are therefore strictly increasing per name, forever, and (a consequence
//! of one sequence per table) unique across the table's names; they have gaps.
//!
//! # Semaphores
//! A [`Semaphore`](crate::Semaphore)'s holders live in the name's row: `slot_limit` (not null
//! exactly while the row is in *slot mode*) and `slots`, a `jsonb` array of `{id, token, at,
//! exp}` (`exp` and `at` as timestamps). Tables created before semaphores get both columns from
//! the migration (`ALTER TABLE .. ADD COLUMN IF NOT EXISTS`; the "already migrated" check
//! looks for them). One statement (`acquire_slot` in `schema.rs`), an `INSERT .. ON CONFLICT DO
//! UPDATE` as for locks, takes a slot: the update's `WHERE` is evaluated on the locked, latest
//! row version, and grants only when no unexpired exclusive lease holds the row, fewer than
//! the limit of *other* unexpired slots exist (the caller's own earlier slot, a retry after a
//! lost reply, is replaced), and the row's limit equals the request's unless no slot is live.
//! The grant writes the unexpired slots plus the new one, `expires_at` = the latest of their
//! expiries, and the next value of the table's one sequence as both the row's and the slot's
//! token, so tokens keep growing across slots, modes and cleanup exactly as for locks.
//!
//! **Never more than the limit**: every grant runs under the row lock and counts the slots
//! unexpired by `clock_timestamp()` at that moment; a slot is only removed by its holder's
//! release or force-release, extension only moves the caller's unexpired slot, so at any
//! instant of server time at most `limit` slots have an expiry after it. Exclusive grants need
//! `expires_at <= clock_timestamp()` in slot mode (`expires_at` is at least every unexpired
//! slot's expiry: grant, extend and release keep it so), and slot grants need no unexpired
//! exclusive lease. Extend and release are the lock statements, which find the caller's lease
//! id either as the exclusive lease (`slot_limit IS NULL`) or among the slots. In slot mode
//! `lease_id` stays null and a release (and force-release) takes a sequence value too, so that
//! the notification trigger publishes it and a waiter is woken.
//!
//! # Idle-row cleanup
//! [`PostgresBackend::cleanup`] deletes the rows whose lease ended or expired more than
//! `cleanup_after` ago (default 1 hour), under the table lock above (taken with a 2 s
//! `lock_timeout`, so it never stalls lock traffic for long; it is retried next time). A
//! background task of each backend runs it every [`DEFAULT_CLEANUP_EVERY`] (configurable, or
//! off). Correctness never depends on cleanup.
//!
//! # The handoff queue cannot break either guarantee (`queue.rs`)
//! The columns `waiters` and `handoff` order which process tries first after a release. They
//! are written only inside the lock statements above, under the same row lock, and no grant
//! condition reads them: the acquire statement's `g.ok`, the slot statement's conditions, the
//! extension's and the release's `WHERE` are the ones argued above, word for word. A busy
//! attempt that registers rewrites `lease_id`, `fencing_token`, `acquired_at`, `expires_at`,
//! the holder and `slot_limit` with the values it read under the row lock, so the row's lease
//! is exactly what it was; it draws no token. So mutual exclusion and token order hold as
//! argued, whatever the queue says, and a wrong, stale or lost designation only delays a
//! waiter, by at most the handoff fallback (500 ms).
//!
//! # Wake-ups (`listen.rs`)
//! One `LISTEN` connection per backend wakes waiting acquirers within milliseconds of a
//! release — one in the process that the release designated (the first in the row's queue),
//! the other processes one each only if the lock was not taken within the handoff fallback
//! (`queue.rs`) — lets busy waiters sleep until the holder's expiry otherwise, tells holders
//! when their lease was taken or force-released, and falls back to polling (and re-checks)
//! while it reconnects. The trigger publishes each change on the channel of its name's bucket
//! (4096 buckets, by SHA-256 of the name) and on the table's channel; the connection listens
//! only on the buckets of the names this backend waits on, observes or has held for a second,
//! so a write reaches only the processes that use its name (or a name of its bucket), not
//! every process of the table. Earlier versions, listening on the table channel, keep
//! working during a rolling upgrade. Behind PgBouncer in transaction pooling mode `LISTEN`
//! does not work: turn notifications off ([`PostgresBackendBuilder::notifications`]) or point
//! the backend at the server directly.
//!
//! # Errors
//! Connection failures, pool timeouts and the SQLSTATEs of class `08` (connection), `53`
//! (resources), `57P01`–`57P03` (shutdown, starting up), `57014` (statement timeout), `40001`,
//! `40P01`, `55P03` and `25006` (read-only during a failover) are
//! [`Error::Unavailable`](crate::Error) (the core retries them within the caller's budget). A
//! missing table (dropped while in use) is also transient for writes: the next attempt
//! creates it again (reads report it, above).
//! Anything else (`42501` permission denied, `28P01` authentication, `3D000` no such
//! database, ...) is [`Error::Backend`](crate::Error) with the server's message, SQLSTATE and
//! a hint. Lock names containing NUL (which `text` cannot store) are
//! [`Error::InvalidName`](crate::Error).
//!
//! # Requirements
//! PostgreSQL 11 or newer (`EXECUTE FUNCTION` in triggers); tested with PostgreSQL 15. The
//! first writing operation needs `CREATE` on the database (if the schema is missing) or on the
//! schema, unless the table was created beforehand with [`PostgresBackend::migrate`] by a user
//! who may. Reads need only `USAGE` on the schema and `SELECT` on the table.

mod errors;
mod listen;
mod operator;
mod ops;
mod queue;
mod schema;

mod tls;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime,
};

use crate::backend::{
    AcquireRequest, Attempt, ChangeNotifications, ChangeWaiter, LeaseId, LeaseMode, LockBackend,
    LockInfo,
};
use crate::backends::leases::{CheapNames, Granted, Leases, Tainted};
use crate::backends::notify::handoff;
use crate::backends::notify::hub::Change;
use crate::error::{Error, Result};
use listen::Listener;
use schema::Schema;

pub use tls::SslMode;

/// The client configuration type ([`tokio_postgres::Config`]), for
/// [`PostgresBackend::builder_with_config`] without a direct dependency on `tokio-postgres`.
pub use tokio_postgres::Config;

/// Default schema of the lock table.
pub const DEFAULT_SCHEMA: &str = "public";

/// Default lock table.
pub const DEFAULT_TABLE: &str = "mongolock_locks";

/// Default delay after a lease ended before cleanup may delete its row.
pub const DEFAULT_CLEANUP_AFTER: Duration = Duration::from_secs(3600);

/// Default period of the background cleanup.
pub const DEFAULT_CLEANUP_EVERY: Duration = Duration::from_secs(600);

/// Default number of pooled connections (the listening connection comes on top).
pub const DEFAULT_POOL_SIZE: usize = 8;

/// Connect timeout used when the connection string sets none.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default `statement_timeout` and `lock_timeout` of the pooled connections.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long cleanup waits for the table lock before giving up until next time.
const CLEANUP_LOCK_TIMEOUT: &str = "2s";

/// Locks stored in a PostgreSQL table. Cheap to clone (clones share the pool and the
/// listening connection). See the [module docs](self) for how it works.
///
/// ```no_run
/// # async fn demo() -> mongolock::Result<()> {
/// use mongolock::{LockProvider, PostgresBackend};
/// let backend = PostgresBackend::builder("postgres://app@localhost/app")
///     .table("locks")
///     .build()?;
/// let provider = LockProvider::builder(backend).app_name("worker").build()?;
/// let guard = provider.lock("reports:daily")?.acquire().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    schema: Schema,
    /// Whether the migration is known to have run (reset when the table turns out missing).
    ready: AtomicBool,
    /// Serializes this backend's migration checks.
    migrating: tokio::sync::Mutex<()>,
    listener: Listener,
    /// Notifications the listening connection received, ever (diagnostics).
    received: Arc<AtomicU64>,
    /// This backend's mark: the prefix of its lease ids and its name in handoff queues
    /// (`queue.rs`).
    mark: String,
    /// The leases this backend granted, with their fencing tokens: a release that finds its
    /// lease gone tells an earlier try of its own from a loss by the token
    /// (`ops::released_by_holder`).
    leases: Leases,
    /// Names this backend's last release left free and unqueued: the uncontended shortcut.
    cheap: CheapNames,
    /// Lease ids whose attempts failed: retired before their release (`ops::retire_sql`).
    tainted: Tainted,
    cleanup_after: Duration,
    cleanup_every: Option<Duration>,
    cleanup_started: AtomicBool,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("table", &self.inner.schema.display)
            .field("listener", &self.inner.listener)
            .finish_non_exhaustive()
    }
}

/// Builds a [`PostgresBackend`]; see [`PostgresBackend::builder`].
#[must_use]
#[derive(Debug)]
pub struct PostgresBackendBuilder {
    config: Result<tokio_postgres::Config>,
    ssl_mode: Option<SslMode>,
    ssl_root_cert: Option<tls::RootCert>,
    statement_timeout: Option<Duration>,
    schema: String,
    table: String,
    pool_size: usize,
    notifications: bool,
    cleanup_after: Duration,
    cleanup_every: Option<Duration>,
}

impl PostgresBackendBuilder {
    /// The schema of the lock table (default `public`); created with the table if missing.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The lock table (default `mongolock_locks`, at most 50 bytes); created by the first
    /// writing operation or [`PostgresBackend::migrate`]. Reads never create it: before then
    /// they fail with [`Error::MissingLockTable`].
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How many pooled connections lock operations may use at once (default 8, at least 1).
    /// The listening connection comes on top.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Whether to `LISTEN` for lock changes on one extra connection (default true): waiters
    /// are then woken within milliseconds of a release and holders learn of a takeover at
    /// once. Without it, waiters poll with the provider's wait strategy.
    pub fn notifications(mut self, enabled: bool) -> Self {
        self.notifications = enabled;
        self
    }

    /// How long after a lease ended its row may be deleted by cleanup (default 1 hour).
    /// Fencing tokens keep growing across deletions either way.
    pub fn cleanup_after(mut self, after: Duration) -> Self {
        self.cleanup_after = after;
        self
    }

    /// How often the backend runs [`PostgresBackend::cleanup`] in the background (default
    /// every 10 minutes, from the first acquisition on); `None` turns it off.
    pub fn cleanup_every(mut self, every: Option<Duration>) -> Self {
        self.cleanup_every = every;
        self
    }

    /// Whether and how to use TLS; overrides the connection string's `sslmode` (default: the
    /// connection string's, else [`SslMode::Prefer`], as libpq). See the
    /// [module docs](self#tls).
    pub fn ssl_mode(mut self, mode: SslMode) -> Self {
        self.ssl_mode = Some(mode);
        self
    }

    /// A PEM file with the root certificates the server's certificate must chain to (libpq's
    /// `sslrootcert`); overrides the connection string's. Needed by
    /// [`SslMode::VerifyCa`] and [`SslMode::VerifyFull`] unless `~/.postgresql/root.crt`
    /// exists; with [`SslMode::Prefer`] or [`SslMode::Require`] it turns the chain check on.
    pub fn ssl_root_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.ssl_root_cert = Some(tls::RootCert::File(path.into()));
        self
    }

    /// `statement_timeout` of the pooled connections (default [`DEFAULT_STATEMENT_TIMEOUT`],
    /// 5 s; whole milliseconds, at least 1 ms), with `lock_timeout` at three quarters of it:
    /// how long one lock statement may run, and wait for a row or table lock, before the
    /// server cancels it, which the operation reports as [`Error::Unavailable`] naming the
    /// timeout. `None` leaves the server's settings.
    /// Keep it well below the shortest lease TTL (see the [module docs](self#statement-and-lock-timeouts)).
    pub fn statement_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// Validates the options and builds the backend. Connects to nothing: the pool connects
    /// on first use.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for an unparsable connection string, an unsupported TLS
    /// parameter (`sslmode=allow`, client certificates), `verify-ca`/`verify-full` without
    /// root certificates, an unreadable `sslrootcert`, a bad schema or table name, a zero pool
    /// size, a zero cleanup period or a statement timeout under 1 ms.
    pub fn build(self) -> Result<PostgresBackend> {
        let mut config = self.config?;
        schema::validate("schema", &self.schema, schema::MAX_SCHEMA_LEN)?;
        schema::validate("table", &self.table, schema::MAX_TABLE_LEN)?;
        if self.pool_size == 0 {
            return Err(Error::invalid_option(
                "pool_size",
                "a pool of 0 connections can run nothing; use at least 1",
            ));
        }
        if self.cleanup_every == Some(Duration::ZERO) {
            return Err(Error::invalid_option(
                "cleanup_every",
                "a zero period would run cleanup without pause; use None to turn it off",
            ));
        }
        let timeout_ms = match self.statement_timeout {
            Some(t) if t.as_millis() == 0 => {
                return Err(Error::invalid_option(
                    "statement_timeout",
                    "PostgreSQL counts timeouts in whole milliseconds and 0 turns them off; \
                     use at least 1 ms, or None to leave the server's settings",
                ))
            }
            Some(t) => Some(
                u64::try_from(t.as_millis())
                    .unwrap_or(u64::MAX)
                    .min(i32::MAX as u64),
            ),
            None => None,
        };
        let tls = tls::connector(&mut config, self.ssl_mode, self.ssl_root_cert.as_ref())?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("mongolock");
        }
        let timeout = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let mut pool = Pool::builder(manager);
        if let Some(ms) = timeout_ms {
            // A lock wait ends a little before the statement would, so that it is reported as
            // what it is (a lock held elsewhere) rather than as a slow statement.
            let lock_ms = (ms * 3 / 4).max(1);
            let set = format!("SET statement_timeout = {ms}; SET lock_timeout = {lock_ms}");
            pool = pool.post_create(Hook::async_fn(move |client, _| {
                let set = set.clone();
                Box::pin(
                    async move { client.batch_execute(&set).await.map_err(HookError::Backend) },
                )
            }));
        }
        let pool = pool
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout))
            .recycle_timeout(Some(timeout))
            .build()
            .map_err(|e| Error::invalid_option("pool_size", e.to_string()))?;
        let schema = Schema::new(&self.schema, &self.table);
        // The listening connection is told apart in `pg_stat_activity`.
        let mut listen_config = config;
        let listen_name = format!(
            "{} (listen)",
            listen_config.get_application_name().unwrap_or("mongolock")
        );
        listen_config.application_name(&listen_name);
        let mark = handoff::new_mark();
        let received = Arc::new(AtomicU64::new(0));
        let listener = Listener::new(
            listen_config,
            tls,
            schema.channel.clone(),
            self.notifications,
            mark.clone(),
            received.clone(),
        );
        let withdraw = queue::withdraw_sql(schema.table_sql());
        let backend = PostgresBackend {
            inner: Arc::new(Inner {
                pool,
                schema,
                ready: AtomicBool::new(false),
                migrating: tokio::sync::Mutex::new(()),
                listener,
                received,
                mark,
                leases: Leases::default(),
                cheap: CheapNames::default(),
                tainted: Tainted::default(),
                cleanup_after: self.cleanup_after,
                cleanup_every: self.cleanup_every,
                cleanup_started: AtomicBool::new(false),
            }),
        };
        // Withdraw from a name's handoff queue when the last acquirer of it here stops
        // waiting (`queue.rs`). Weak: the hook lives in the backend's own listener.
        let weak = Arc::downgrade(&backend.inner);
        let withdraw: Arc<str> = Arc::from(withdraw);
        backend
            .inner
            .listener
            .hub()
            .set_withdraw(Arc::new(move |name: Arc<str>| {
                let (weak, sql) = (weak.clone(), withdraw.clone());
                Box::pin(async move {
                    let Some(inner) = weak.upgrade() else {
                        return;
                    };
                    let backend = PostgresBackend { inner };
                    let mark = backend.inner.mark.clone();
                    match backend
                        .query("withdraw from the handoff queue", &sql, &[&&*name, &mark])
                        .await
                    {
                        Ok(_) => tracing::debug!(lock = %name, "withdrew from the handoff queue: no acquirer of this process waits any more"),
                        Err(e) => tracing::debug!(lock = %name, error = %e, "could not withdraw from the handoff queue; the entry ends by itself"),
                    }
                })
            }));
        Ok(backend)
    }
}

impl PostgresBackend {
    /// Starts building a backend for a connection string: a URL
    /// (`postgres://user:password@host:5432/db?connect_timeout=5`) or key-value pairs
    /// (`host=localhost user=app dbname=app`). It is parsed by
    /// [`build`](PostgresBackendBuilder::build).
    ///
    /// Besides what [`tokio_postgres::Config`] parses, it takes libpq's `sslmode=verify-ca`,
    /// `sslmode=verify-full` and `sslrootcert` (see the [module docs](self#tls)).
    pub fn builder(url: impl AsRef<str>) -> PostgresBackendBuilder {
        let (config, params) = match tls::split_params(url.as_ref()) {
            Ok((rest, params)) => (
                rest.parse::<tokio_postgres::Config>().map_err(|e| {
                    Error::invalid_option("url", format!("not a PostgreSQL connection string: {e}"))
                }),
                params,
            ),
            Err(e) => (Err(e), tls::TlsParams::default()),
        };
        let mut builder = Self::builder_inner(config);
        builder.ssl_mode = params.mode;
        builder.ssl_root_cert = params.root_cert;
        builder
    }

    /// Starts building a backend from a parsed client configuration (its `sslmode` is used
    /// unless [`PostgresBackendBuilder::ssl_mode`] says otherwise).
    pub fn builder_with_config(config: tokio_postgres::Config) -> PostgresBackendBuilder {
        Self::builder_inner(Ok(config))
    }

    fn builder_inner(config: Result<tokio_postgres::Config>) -> PostgresBackendBuilder {
        PostgresBackendBuilder {
            config,
            ssl_mode: None,
            ssl_root_cert: None,
            statement_timeout: Some(DEFAULT_STATEMENT_TIMEOUT),
            schema: DEFAULT_SCHEMA.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            notifications: true,
            cleanup_after: DEFAULT_CLEANUP_AFTER,
            cleanup_every: Some(DEFAULT_CLEANUP_EVERY),
        }
    }

    /// `schema.table` of the lock table.
    pub fn table(&self) -> &str {
        &self.inner.schema.display
    }

    /// Creates whatever is missing of the schema, the table, its sequence, index and
    /// notification trigger now (normally the first writing operation does; reads never do),
    /// and updates the trigger function. Idempotent; safe to run from several processes at
    /// once, and while the table is in use.
    ///
    /// # Cancel safety
    /// The migration is one transaction; dropping the future rolls it back or lets it commit,
    /// never half of it.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the server cannot be reached; [`Error::Backend`] when the
    /// user may not create the objects (`42501`).
    pub async fn migrate(&self) -> Result<()> {
        let mut client = self.pooled("migrate").await?;
        self.inner.run_ddl(&mut client).await?;
        self.inner.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Deletes the rows of names whose lease ended (or expired) more than `cleanup_after` ago,
    /// returning how many. Fencing tokens keep growing (see the module docs). Runs under a
    /// `SHARE` lock on the table, which waits at most 2 s for in-flight lock writes.
    ///
    /// # Cancel safety
    /// One transaction; dropping the future deletes all or nothing.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the server cannot be reached or the table lock was not
    /// granted in time; [`Error::Backend`] for permanent server errors.
    pub async fn cleanup(&self) -> Result<u64> {
        let mut client = self.client("cleanup").await?;
        let result = async {
            let tx = client.transaction().await?;
            tx.batch_execute(&format!(
                "SET LOCAL lock_timeout = '{CLEANUP_LOCK_TIMEOUT}'; {}",
                self.inner.schema.cleanup_lock()
            ))
            .await?;
            let deleted = tx
                .execute(
                    &self.inner.schema.cleanup,
                    &[&ops::micros(self.inner.cleanup_after)],
                )
                .await?;
            tx.commit().await?;
            Ok::<u64, tokio_postgres::Error>(deleted)
        }
        .await;
        result.map_err(|e| self.inner.fail("cleanup", e))
    }

    /// Checks that the server can be reached and accepts the credentials (one `SELECT 1` on a
    /// pooled connection). Creates nothing.
    ///
    /// # Cancel safety
    /// A read; dropping the future has no effect on the server.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the server cannot be reached; [`Error::Backend`] when it
    /// refuses the login or the database does not exist.
    pub async fn ping(&self) -> Result<()> {
        let client = self.pooled("ping").await?;
        client
            .simple_query("SELECT 1")
            .await
            .map(|_| ())
            .map_err(|e| errors::map("ping", e))
    }

    /// How many lock names currently have an entry in the notification registry (names this
    /// backend's waiters wait on or its guards hold). For tests and diagnostics.
    #[doc(hidden)]
    pub fn watched_names(&self) -> usize {
        self.inner.listener.watched_names()
    }

    /// How many notifications this backend's listening connection has received since the
    /// backend was built (every `NOTIFY` delivered to it, its own releases' included, whether
    /// or not somebody here used the name): the PostgreSQL counterpart of
    /// `MongoBackend::stream_events`. For tests and diagnostics.
    #[doc(hidden)]
    pub fn notifications_received(&self) -> u64 {
        self.inner.received.load(Ordering::Relaxed)
    }

    /// The channel on which the changes of `name` are published besides the table's own
    /// channel (see `listen.rs`): `mongolock_<hash of schema.table>_<bucket of name>`. For
    /// tests and diagnostics.
    #[doc(hidden)]
    pub fn notification_channel(&self, name: &str) -> String {
        self.inner.schema.bucket_channel(name)
    }

    /// A pooled connection, without the migration check.
    async fn pooled(&self, op: &str) -> Result<Object> {
        self.inner
            .pool
            .get()
            .await
            .map_err(|e| errors::map_pool(op, e))
    }

    /// A pooled connection on which the lock table is known to exist.
    async fn client(&self, op: &str) -> Result<Object> {
        let mut client = self.pooled(op).await?;
        if !self.inner.ready.load(Ordering::Acquire) {
            self.inner.ensure_schema(&mut client).await?;
        }
        Ok(client)
    }

    /// Runs one statement and returns its rows.
    async fn query(
        &self,
        op: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let client = self.client(op).await?;
        let result = async {
            let statement = client.prepare_cached(sql).await?;
            client.query(&statement, params).await
        }
        .await;
        result.map_err(|e| self.inner.fail(op, e))
    }

    /// Runs one read-only statement and returns its rows, without the migration: a read never
    /// creates or alters anything. No extra round trip: its errors tell what is wrong. A
    /// missing table or schema is [`Error::MissingLockTable`]; a missing column means a table
    /// that is not mongolock's ([`Error::ForeignCollection`]) or one made by an older version
    /// ([`Error::Backend`] saying how to upgrade it), told apart by one more query.
    async fn read_query(
        &self,
        op: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let client = self.pooled(op).await?;
        let result = async {
            let statement = client.prepare_cached(sql).await?;
            client.query(&statement, params).await
        }
        .await;
        let e = match result {
            Ok(rows) => return Ok(rows),
            Err(e) => e,
        };
        if errors::is_missing_table(&e) {
            // Dropped after this backend made sure of it: the next write creates it again.
            self.inner.ready.store(false, Ordering::Release);
            return Err(self.inner.schema.missing_table());
        }
        if e.code() != Some(&tokio_postgres::error::SqlState::UNDEFINED_COLUMN) {
            return Err(self.inner.fail(op, e));
        }
        let detail = errors::describe(&e);
        let row = client
            .query_one(&self.inner.schema.existing_query(), &[])
            .await
            .map_err(|e| self.inner.fail(op, e))?;
        let flag = |i: usize| row.try_get::<_, bool>(i).map_err(ops::decode);
        if !flag(Schema::TABLE)? {
            self.inner.ready.store(false, Ordering::Release);
            Err(self.inner.schema.missing_table())
        } else if !flag(Schema::OURS)? {
            Err(self.inner.schema.foreign_table())
        } else {
            Err(self.inner.schema.outdated_table(&detail))
        }
    }

    /// Starts the background cleanup once (when configured); it ends with the last clone.
    fn start_cleanup(&self) {
        let Some(every) = self.inner.cleanup_every else {
            return;
        };
        if self.inner.cleanup_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.cleanup_started.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                // Spread the processes sharing a table over the period.
                let jitter = every.mul_f64(rand::random::<f64>() * 0.25);
                tokio::time::sleep(every + jitter).await;
                let Some(inner) = weak.upgrade() else { return };
                let backend = PostgresBackend { inner };
                match backend.cleanup().await {
                    Ok(n) => tracing::debug!(table = %backend.table(), deleted = n, "lock table cleanup"),
                    Err(e) => tracing::debug!(table = %backend.table(), error = %e, "lock table cleanup failed; it runs again later"),
                }
            }
        });
    }

    /// Remembers the lease of a granted attempt.
    fn granted(&self, req: &AcquireRequest, attempt: &Attempt, slot: bool, shortcut: bool) {
        if let Attempt::Acquired(lease) = attempt {
            self.inner.leases.granted(
                &req.lease_id,
                Granted {
                    slot,
                    token: lease.fencing_token,
                    shortcut,
                },
            );
        }
    }

    /// The uncontended shortcut's grant, when this backend's last release of the name left it
    /// free and unqueued (and this grant need not queue the backend again): `None` when it was
    /// not tried or the row was not in its state (the full attempt follows).
    async fn try_acquire_cheap(
        &self,
        req: &AcquireRequest,
        p: &ops::AcquireParams<'_>,
        requeue: bool,
    ) -> Result<Option<Attempt>> {
        if requeue || !self.inner.cheap.take(&req.name) {
            return Ok(None);
        }
        let rows = self
            .query(
                "acquire (uncontended)",
                &self.inner.schema.acquire_cheap,
                &p.with(&[]),
            )
            .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        ops::attempt(&rows).map(Some)
    }

    /// The release of a lease the shortcut granted, while nobody queued: `None` when the lease
    /// was not granted so, or the row is no longer in that state (someone queued, or the lease
    /// is not ours any more); the full release follows.
    async fn release_cheap(
        &self,
        name: &str,
        lease_id: &LeaseId,
        granted: Option<Granted>,
    ) -> Result<Option<ops::Released>> {
        if !granted.is_some_and(|g| g.shortcut) {
            return Ok(None);
        }
        let rows = self
            .query(
                "release (uncontended)",
                &self.inner.schema.release_cheap,
                &[&name, &lease_id.as_str(), &self.inner.mark],
            )
            .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        ops::released(&rows).map(Some)
    }

    /// The fencing token of a lease this backend granted (`granted`, from [`Leases::get`]), as
    /// the release statements take it (`NULL` when forgotten: the release then reports a lease
    /// it finds gone as lost).
    fn token_param(granted: Option<Granted>) -> Option<i64> {
        granted.and_then(|g| i64::try_from(g.token).ok())
    }

    /// One read: whether `lease_id` is still the lease of `name`. A failed read counts as
    /// "still held" (the next extension decides).
    async fn still_holds(&self, name: &str, lease_id: &LeaseId) -> bool {
        match self
            .query(
                "check lease",
                &self.inner.schema.lease_of,
                &[&name, &lease_id.as_str()],
            )
            .await
        {
            Ok(rows) => rows
                .first()
                .and_then(|r| r.try_get::<_, Option<bool>>(0).ok().flatten())
                .unwrap_or(false),
            Err(e) => {
                tracing::debug!(lock = %name, error = %e, "could not check the lease after a change; the next extension will");
                true
            }
        }
    }
}

impl Inner {
    /// Maps a statement error, noting a missing table so that the next attempt creates it.
    fn fail(&self, op: &str, e: tokio_postgres::Error) -> Error {
        if errors::is_missing_table(&e) {
            self.ready.store(false, Ordering::Release);
        }
        errors::map(op, e)
    }

    /// Runs the migration unless it already ran (one query to check).
    async fn ensure_schema(&self, client: &mut Object) -> Result<()> {
        let _one = self.migrating.lock().await;
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let (sql, table, trigger, version) = self.schema.migrated_query();
        let migrated: bool = client
            .query_one(sql, &[&table, &trigger, &version])
            .await
            .map_err(|e| errors::map("check the lock table", e))?
            .try_get(0)
            .map_err(ops::decode)?;
        if !migrated {
            self.run_ddl(client).await?;
        }
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// The migration: one transaction, under an advisory lock per table.
    async fn run_ddl(&self, client: &mut Object) -> Result<()> {
        let result = async {
            let tx = client.transaction().await?;
            tx.execute(
                "SELECT pg_advisory_xact_lock($1)",
                &[&self.schema.migration_lock_key()],
            )
            .await?;
            // Only what is missing is created: CREATE SCHEMA IF NOT EXISTS needs CREATE on the
            // database even when the schema exists, and DDL on a table in use takes locks.
            let row = tx.query_one(&self.schema.existing_query(), &[]).await?;
            // A table of that name that is not ours is refused, never altered (the
            // transaction rolls back, though nothing was written yet).
            if !row.try_get::<_, bool>(Schema::OURS)? {
                return Ok(false);
            }
            for (exists, statement) in self.schema.ddl() {
                if let Some(i) = exists {
                    if row.try_get::<_, bool>(i)? {
                        continue;
                    }
                }
                tx.batch_execute(&statement).await?;
            }
            tx.commit().await.map(|()| true)
        }
        .await;
        match result {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.schema.foreign_table()),
            Err(e) => Err(errors::map(&format!("create {}", self.schema.display), e)),
        }
    }
}

impl PostgresBackend {
    /// One acquisition attempt ([`LockBackend::try_acquire`], which remembers the lease ids of
    /// the attempts that fail).
    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        ops::check_name(&req.name)?;
        self.start_cleanup();
        let p = ops::AcquireParams::new(req);
        if let LeaseMode::Slot { limit } = req.mode {
            // Above i32::MAX slots is no limit at all in practice: saturate.
            let limit_param = i32::try_from(limit).unwrap_or(i32::MAX);
            let rows = self
                .query(
                    "acquire a semaphore slot",
                    &self.inner.schema.acquire_slot,
                    &p.with(&[&limit_param]),
                )
                .await?;
            // Not remembered by the listener: a slot holder judges every change by reading
            // (`still_holds`), since other slots' grants do not end its lease.
            let attempt = ops::slot_attempt(&rows, &req.name, limit)?;
            self.granted(req, &attempt, true, false);
            return Ok(attempt);
        }
        // This attempt's own acquirer is registered before it (when the call will wait).
        let listener = &self.inner.listener;
        let queueing = queue::Queueing::new(
            &self.inner.mark,
            listener.acquirers(&req.name),
            listener.is_live_for(&req.name),
        );
        let cheap = self.try_acquire_cheap(req, &p, queueing.requeue).await?;
        let shortcut = cheap.is_some();
        let attempt = match cheap {
            Some(attempt) => attempt,
            None => {
                let rows = self
                    .query(
                        "acquire",
                        &self.inner.schema.acquire,
                        &p.with(&[&queueing.mark, &queueing.register, &queueing.requeue]),
                    )
                    .await?;
                ops::attempt(&rows)?
            }
        };
        // Whether the mark is now in the queue: registered by a busy attempt, kept at the end
        // by a grant that requeues, removed by any other grant.
        match &attempt {
            Attempt::Acquired(lease) => {
                self.inner
                    .listener
                    .granted(&req.name, &req.lease_id, lease.fencing_token);
                listener.hub().set_queued(&req.name, queueing.requeue);
            }
            Attempt::Busy { .. } if queueing.register => {
                listener.hub().set_queued(&req.name, true);
            }
            Attempt::Busy { .. } => {}
        }
        self.granted(req, &attempt, false, shortcut);
        Ok(attempt)
    }

    /// Before the release of a lease id whose attempt failed: retires it (`ops::retire_sql`),
    /// so a late attempt never grants it again. Kept tainted when the retirement fails (the
    /// core retries the release).
    async fn retire_if_tainted(&self, name: &str, lease_id: &LeaseId) -> Result<()> {
        if self.inner.tainted.contains(lease_id) {
            let sql = ops::retire_sql(self.inner.schema.table_sql());
            self.query("retire a lease id", &sql, &[&name, &lease_id.as_str()])
                .await?;
            self.inner.tainted.forget(lease_id);
        }
        Ok(())
    }
}

#[async_trait]
impl LockBackend for PostgresBackend {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt> {
        // A failed attempt's id is retired before its release (`ops::retire_sql`).
        self.inner
            .tainted
            .note(&req.lease_id, self.attempt(req).await)
    }

    async fn extend(
        &self,
        name: &str,
        lease_id: &LeaseId,
        ttl: Duration,
    ) -> Result<Option<SystemTime>> {
        ops::check_name(name)?;
        let rows = self
            .query(
                "extend",
                &self.inner.schema.extend,
                &[&name, &lease_id.as_str(), &ops::micros(ttl)],
            )
            .await?;
        rows.first()
            .map(|r| r.try_get("expires_at").map_err(ops::decode))
            .transpose()
    }

    async fn release(&self, name: &str, lease_id: &LeaseId) -> Result<bool> {
        // Released, or given up on (the lease then expires): no more loss detection for it.
        self.inner.listener.released(lease_id);
        ops::check_name(name)?;
        self.retire_if_tainted(name, lease_id).await?;
        let granted = self.inner.leases.get(lease_id);
        let released = match self.release_cheap(name, lease_id, granted).await {
            Ok(Some(released)) => Ok(released),
            Ok(None) => self
                .query(
                    "release",
                    &self.inner.schema.release,
                    &[
                        &name,
                        &lease_id.as_str(),
                        &self.inner.mark,
                        &Self::token_param(granted),
                    ],
                )
                .await
                .and_then(|rows| ops::released(&rows)),
            Err(e) => Err(e),
        };
        self.inner.leases.released(lease_id);
        if let Ok(r) = &released {
            if r.released && matches!(r.handoff, Some(queue::Handoff::Nobody)) {
                self.inner.cheap.released_unqueued(name);
            }
        }
        // The listener ignores the notifications of this backend's own exclusive releases
        // (`queue.rs`): they are delivered here, with the reply's designation. A slot's
        // release (no designation) is left to the listener; one whose outcome is unknown is
        // delivered to anybody (at worst a spurious attempt).
        let here = match &released {
            Ok(r) => r
                .handoff
                .as_ref()
                .map(|h| (h.wakes(&self.inner.mark), r.token)),
            Err(_) => Some((true, None)),
        };
        if let Some((here, token)) = here {
            let change = Change::Lease {
                lease_id: None,
                token,
            };
            self.inner.listener.hub().deliver(name, change, here);
        }
        released.map(|r| r.released)
    }

    async fn release_after(
        &self,
        name: &str,
        lease_id: &LeaseId,
        min_hold: Duration,
    ) -> Result<bool> {
        ops::check_name(name)?;
        self.retire_if_tainted(name, lease_id).await?;
        let reply = self
            .query(
                "release with a minimum hold",
                &self.inner.schema.release_after,
                &[
                    &name,
                    &lease_id.as_str(),
                    &self.inner.mark,
                    &ops::micros(min_hold),
                    &Self::token_param(self.inner.leases.get(lease_id)),
                ],
            )
            .await
            .and_then(|rows| ops::released_after_reply(&rows));
        self.inner.leases.released(lease_id);
        if let Ok(r) = &reply {
            if r.is_slot && !r.released.released {
                return Err(crate::Error::MinHoldUnsupported {
                    name: name.to_owned(),
                    what: "semaphore slot",
                    reason: "semaphore slots and read-write lock readers cannot be held on".into(),
                });
            }
        }
        // Ended (now or at the end of the hold), or given up on: no more loss detection.
        self.inner.listener.released(lease_id);
        // A plain release is delivered here, as by `release` (the listener ignores this
        // backend's own releases); a lease kept on is published to every backend, this one
        // included, by the statement's `pg_notify`.
        let here = match &reply {
            Ok(r) if r.held_on => None,
            Ok(r) => r
                .released
                .handoff
                .as_ref()
                .map(|h| (h.wakes(&self.inner.mark), r.released.token)),
            Err(_) => Some((true, None)),
        };
        if let Some((here, token)) = here {
            let change = Change::Lease {
                lease_id: None,
                token,
            };
            self.inner.listener.hub().deliver(name, change, here);
        }
        reply.map(|r| r.released.released)
    }

    /// Marked with this backend's mark (`queue.rs`).
    fn new_lease_id(&self) -> LeaseId {
        LeaseId::random_with_prefix(&self.inner.mark)
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        ops::check_name(name)?;
        let rows = self
            .read_query("inspect", &self.inner.schema.inspect, &[&name])
            .await?;
        rows.first().map(ops::info).transpose()
    }

    async fn list(&self) -> Result<Vec<LockInfo>> {
        let rows = self
            .read_query("list", &self.inner.schema.list, &[])
            .await?;
        rows.iter().map(ops::info).collect()
    }

    async fn holders(&self, name: &str) -> Result<Vec<crate::backend::LeaseHolder>> {
        ops::check_name(name)?;
        let rows = self
            .read_query("holders", &self.inner.schema.holders, &[&name])
            .await?;
        rows.iter().map(ops::holder).collect()
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        ops::check_name(name)?;
        let rows = self
            .query("force release", &self.inner.schema.force_release, &[&name])
            .await?;
        Ok(!rows.is_empty())
    }

    async fn force_release_token(&self, name: &str, token: u64) -> Result<bool> {
        self.end_token(name, token).await
    }

    async fn waiters(&self, name: &str) -> Result<Vec<crate::QueuedWaiter>> {
        self.queued(name).await
    }

    async fn slot_limit(&self, name: &str) -> Result<Option<u32>> {
        self.live_slot_limit(name).await
    }

    async fn list_matching(&self, filter: &crate::ListFilter) -> Result<Vec<LockInfo>> {
        self.matching(filter).await
    }

    fn notifications(&self) -> Option<&dyn ChangeNotifications> {
        Some(self)
    }
}

#[async_trait]
impl ChangeNotifications for PostgresBackend {
    async fn wait(&self, name: &str, max_wait: Duration) {
        self.inner.listener.wait_for_change(name, max_wait).await;
    }

    /// True while the listening connection is up; opens it if it is not.
    fn is_live(&self) -> bool {
        self.inner.listener.is_live()
    }

    fn waiter(&self, name: &str) -> Option<ChangeWaiter> {
        self.inner.listener.change_waiter(name)
    }

    /// Waits for this backend's withdrawals from handoff queues (`queue.rs`).
    async fn flush(&self, max_wait: Duration) -> bool {
        self.inner.listener.hub().settle(max_wait).await
    }

    async fn lease_lost(&self, name: &str, lease_id: &LeaseId) {
        self.inner
            .listener
            .lease_gone(name, lease_id, || self.still_holds(name, lease_id))
            .await;
    }
}
