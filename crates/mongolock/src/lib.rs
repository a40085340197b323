//! # mongolock
//!
//! Distributed locks for Rust services that already run MongoDB or PostgreSQL: named locks with
//! server-time leases, fencing tokens that only grow, automatic extension and a lost signal;
//! semaphores, read-write locks, several names at once, leader election ([`election`]) and locks
//! on the documents of your own collection ([`documents`]); and an in-memory backend with the same
//! contract for tests. This page is the guide; [What you may rely on](#what-you-may-rely-on) is
//! the contract.
//!
//! ```
//! use std::time::Duration;
//! use mongolock::LockProvider;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = mongo_testserver::TestServer::start().await?;
//! # let uri = server.uri();
//! // `uri` is e.g. "mongodb://localhost:27017" (here: an embedded test server).
//! let client = mongodb::Client::with_uri_str(&uri).await?;
//! // Locks live in the collection "distributed.locks" of database "app".
//! let provider = LockProvider::mongodb(&client.database("app"))?;
//!
//! // Wait until held (drop the future to give up: nothing stays held).
//! let guard = provider.lock("reports:daily")?.acquire().await?;
//! println!("holding {} with fencing token {}", guard.name(), guard.fencing_token());
//!
//! // Others get `None`: `try_acquire` makes exactly one attempt, `acquire_timeout` keeps
//! // trying for a while.
//! let other = provider.lock("reports:daily")?;
//! assert!(other.try_acquire().await?.is_none());
//! assert!(other.acquire_timeout(Duration::from_millis(20)).await?.is_none());
//!
//! // Work while watching the lost signal; pass the fencing token to the protected resource.
//! tokio::select! {
//!     _ = guard.lost() => eprintln!("lease lost; stop"),
//!     _ = tokio::time::sleep(Duration::from_millis(10)) => { /* the protected work */ }
//! }
//! guard.release().await?;
//!
//! let info = provider.inspect("reports:daily").await?.expect("the lock was used");
//! assert!(!info.held);
//! # Ok(())
//! # }
//! ```
//!
//! Requires a Tokio runtime with the time driver enabled (`#[tokio::main]` has it).
//!
//! ## Named locks
//! [`LockProvider::lock`] gives a [`Lock`]; every acquire form runs the same loop (waiting,
//! wake-ups, backoff, retries of transient errors, cancellation safety) and returns the same
//! [`LockGuard`]:
//!
//! * [`Lock::acquire`] waits until held; [`Lock::try_acquire`] makes exactly one attempt
//!   (`None` while held elsewhere); [`Lock::acquire_timeout`] keeps trying up to a duration
//!   (`None` when it ran out). [`Lock::with_expiry`] sets this lock's lease duration (the
//!   provider's expiry otherwise).
//! * The guard extends its lease in the background every `extension_cadence` (expiry / 3).
//!   [`LockGuard::lost`] (a cloneable, cancel-safe future) and [`LockGuard::is_lost`] say when
//!   the lease can no longer be trusted, [`LockGuard::lost_reason`] why (a [`LossReason`]).
//!   [`LockGuard::extend`] sets a new lease duration (`false` once the lease is lost).
//! * [`LockGuard::release`] ends the lease; dropping the guard releases it in the background.
//!   [`LockGuard::release_after`] ends it no earlier than a minimum hold after the grant, by the
//!   database's clock: scheduled jobs on many replicas run at most once per interval (see
//!   [the backend contract](crate::backend#minimum-hold-at-most-once-per-interval)).
//! * [`LockProvider::list`], [`LockProvider::inspect`] and [`LockProvider::holders`] show who
//!   holds what (read-only); [`LockProvider::force_release`] ends a stuck lease (its holder
//!   learns of the loss; the next token is larger).
//!
//! **One vocabulary.** Every lock type has the same three forms: a waiting one (`acquire`;
//! [`RwLock::read`] / [`RwLock::write`]; [`Election::campaign`];
//! [`DocumentLocks::lock`](documents::DocumentLocks::lock) and
//! [`claim`](documents::DocumentLocks::claim)), exactly one attempt (`try_acquire`, `try_read`,
//! `try_write`, `try_campaign`, `try_lock`, `try_claim`: `None` when busy), and waiting up to a
//! timeout (`acquire_timeout`, `read_timeout`, `write_timeout`, `campaign_timeout`,
//! `lock_timeout`, `claim_timeout`: `None` when it ran out). Everything is created from the
//! [`LockProvider`]: [`lock`](LockProvider::lock), [`semaphore`](LockProvider::semaphore),
//! [`rw_lock`](LockProvider::rw_lock), [`lock_set`](LockProvider::lock_set),
//! [`election`](LockProvider::election) and `documents` (feature `mongodb`); `with_expiry`
//! sets another lease duration on any of them.
//!
//! ```
//! use std::time::Duration;
//! use mongolock::LockProvider;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mongolock::Result<()> {
//! let provider = LockProvider::memory(); // the same API on MongoDB and PostgreSQL
//! let lock = provider.lock("door:front")?.with_expiry(Duration::from_secs(30))?;
//! if let Some(guard) = lock.acquire_timeout(Duration::from_secs(5)).await? {
//!     assert!(guard.extend(Duration::from_secs(60)).await?); // false once the lease is lost
//!     let token = guard.fencing_token();
//!     guard.release().await?;
//!     // The next holder's token is larger.
//!     assert!(lock.acquire().await?.fencing_token() > token);
//! }
//!
//! // Who holds what. A token is `None` while a new lease's token is being issued.
//! for info in provider.list().await? {
//!     println!("{} held={} token={:?}", info.name, info.held, info.fencing_token);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ## Semaphores and read-write locks
//! [`LockProvider::semaphore`] gives a [`Semaphore`]: at most N holders of a name at once (N
//! concurrent exports, N connections to a fragile service), each with its own lease and
//! [`LockGuard`], and fencing tokens from the name's one sequence.
//!
//! ```
//! use std::time::Duration;
//! use mongolock::{Error, LockProvider};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let provider = LockProvider::memory();
//! let exports = provider.semaphore("exports", 2)?; // at most 2 holders
//!
//! let a = exports.acquire().await?;                  // waits for a slot
//! let b = exports.acquire_timeout(Duration::from_secs(5)).await?.expect("a free slot");
//! assert!(exports.try_acquire().await?.is_none());   // one attempt: both slots are taken
//! assert!(b.fencing_token() > a.fencing_token());    // tokens grow across slots
//!
//! // Every caller of a name must use the same limit while a slot is held.
//! match provider.semaphore("exports", 3)?.try_acquire().await {
//!     Err(Error::LimitMismatch { held, requested, .. }) => assert_eq!((held, requested), (2, 3)),
//!     other => panic!("{other:?}"),
//! }
//! a.release().await?;
//! drop(b); // released in the background
//! # Ok(())
//! # }
//! ```
//!
//! * **At most N at any instant of server time**: a slot is granted only while fewer than N
//!   unexpired slots exist, judged by the database's clock; a crashed holder's slot returns when
//!   its lease expires. Taking a slot is one round trip uncontended, as a lock is.
//! * **Limits**: a limit of 0 is [`Error::InvalidOptions`]; a limit other than the current
//!   holders' is [`Error::LimitMismatch`] (a new limit applies once every slot has ended).
//! * **A name used as a lock and as a semaphore is never shared**: a lock holder keeps every slot
//!   holder out and the other way round.
//! * Slot waiters are woken by releases (one per process) but not queued in the handoff queue,
//!   which orders exclusive locks only.
//!
//! [`LockProvider::rw_lock`] gives a [`RwLock`]: many readers or one writer, each with its own
//! lease and guard; readers and writers share the name's token sequence, and once a writer waits,
//! new readers wait (the writers' intent lock, see [`rwlock`]). The forms are `read` /
//! `try_read` / `read_timeout` / `read_with` and the same for `write`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mongolock::Result<()> {
//! let provider = mongolock::LockProvider::memory();
//! let table = provider.rw_lock("table:users")?;
//! let reader = table.read().await?;
//! let read_token = reader.fencing_token();
//! assert!(table.try_read().await?.is_some()); // readers share
//! assert!(table.try_write().await?.is_none()); // the writer waits for them
//! reader.release().await?;
//! let writer = table.write().await?;
//! assert!(writer.fencing_token() > read_token); // one token sequence
//! # Ok(())
//! # }
//! ```
//!
//! ## Several names at once
//! [`LockProvider::lock_set`] gives a [`LockSet`]: several locks acquired all or nothing, always
//! in the order of their names, so that callers asking for overlapping sets in any order never
//! deadlock. Its [`LockSetGuard`] has each name's fencing token, and its lost signal fires when
//! any lease of the set is lost (see [`lockset`]).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mongolock::Result<()> {
//! let provider = mongolock::LockProvider::memory();
//! let both = provider.lock_set(["stock:b", "stock:a"])?.acquire().await?;
//! for (name, token) in both.fencing_tokens() {
//!     println!("{name}: fencing token {token}");
//! }
//! assert!(provider.lock_set(["stock:a", "stock:c"])?.try_acquire().await?.is_none());
//! both.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Leader election and document locks
//! * [`election`] ([`LockProvider::election`]): one process at a time holds a named role; the
//!   term is the lease's fencing token. A campaign loop, a run loop that cancels your work when
//!   leadership is lost, resign, and observe-the-leader.
//! * [`documents`] (MongoDB, `provider.documents(&collection)`): lock a document of your own
//!   collection in place, or *claim* any one unlocked document matching a filter, so that many
//!   workers share one collection of jobs.
//!
//! ## Testing your code
//! * [`LockProvider::memory()`] gives the same contract in-process, for unit tests of code that
//!   takes a [`LockProvider`].
//! * [`mongo-testserver`](https://docs.rs/mongo-testserver) runs a MongoDB-compatible server inside
//!   your tests (as the examples on this page do): your MongoDB code, mongolock included, is
//!   tested through the official driver over TCP without installing MongoDB.
//! * [`testing`] (feature `testing`, not API-stable) is the contract suite every backend runs —
//!   ours and yours, if you write a [`LockBackend`].
//!
//! mongolock's own tests run against `mongo-testserver`, or against a real deployment when
//! `MONGODB_URI` is set (a replica set for the change-stream tests; `MONGODB_FAILPOINTS=1` and
//! `enableTestCommands=1` for the fault-injection tests), and against a PostgreSQL they start
//! themselves (`initdb` and `pg_ctl` from Debian's `postgresql` package) or `POSTGRES_URL`.
//!
//! ## What you may rely on
//! 1. **Mutual exclusion per lease.** At any instant of *server* time at most one holder has an
//!    unexpired lease on a name.
//! 2. **Server time only.** Expiry is computed and compared by the database (`$$NOW` in MongoDB,
//!    `clock_timestamp()` in PostgreSQL); client clocks never decide who holds a lock. The local
//!    monotonic clock is used only to stop trusting a lease *early*: the guard's *local deadline*
//!    is the instant taken before the granting (or extending) request was sent, plus the lease,
//!    minus a drift margin (default 1 % of the lease + 5 ms).
//! 3. **Fencing tokens only grow.** Every acquisition of a name returns a token larger than every
//!    token issued for that name before — across release, expiry, takeover, force-release and
//!    cleanup of the lock document. Pass it to the resource you protect; it refuses smaller
//!    tokens. On MongoDB a new name starts at 1, or at a multiple of 2²⁰ plus 1 when it shares
//!    its epoch counter with earlier names or several processes raced to create it (each racer
//!    takes an epoch first; the winner's may be a later one), tokens never exceed 2⁵³ (exact in
//!    JSON and JavaScript; [`Error::FencingTokensExhausted`] long before, in practice never), and
//!    dropping the lock collection restarts them at 1. On PostgreSQL every token comes from the
//!    table's one sequence (unique across names, with gaps).
//! 4. **Ownership is checked.** Extend and release act only on the caller's own lease (a unique
//!    lease id); an expired lease is never extended. Release is idempotent for the owner: a
//!    release retried after a lost reply reports success — however many others took and released
//!    the lock meanwhile (on MongoDB and PostgreSQL unless more than 64 leases of the name were
//!    taken over or force-released meanwhile, the lock was cleaned up, or the retry comes more
//!    than a minute, [`RELEASED_KEPT_FOR`], after the release's outcome; in memory for a minute
//!    after the release and the last 256 releases of a name, [`RELEASED_KEPT_MAX`]) — so
//!    [`Error::LeaseLost`] means someone else really ended or took the lease.
//! 5. **Only its own data.** Named locks, semaphores, read-write locks and elections write only
//!    to a collection that is empty or holds only mongolock's own documents (checked once per
//!    backend, before the first write or index), and on PostgreSQL alter only a table mongolock
//!    created; anything else is [`Error::ForeignCollection`] (CLI: exit status 77) with nothing
//!    written — no lock fields, no counters, no TTL index that would delete an application's
//!    documents. Document locks, which live in your collection, write only their lock field and
//!    never create a TTL index.
//! 6. **Loss is signalled.** [`LockGuard::lost`] and [`LockGuard::is_lost`] fire when renewal
//!    finds the lease gone, when renewal cannot reach the server before the local deadline, or —
//!    with change notifications — as soon as another holder takes the name.
//! 7. **Crash safety.** A crashed holder's lock becomes available once its lease expires. The TTL
//!    index (MongoDB) and idle-row cleanup (PostgreSQL) only tidy up; correctness never depends
//!    on them. Fencing does depend on no TTL index deleting lock documents *sooner*, so that is
//!    verified, not assumed: a first acquisition creates its document with a token only after
//!    `listIndexes` showed every TTL index to be on `expiresAt` alone with at least twice the
//!    creation window (2 minutes by default); otherwise — an operator's 0-second index, another
//!    process's shorter `cleanup_after`, a TTL index on another field, no permission to list
//!    indexes — it creates the document first and stamps a token after (one more round trip).
//!    The verdict is kept 10 s, so the one residual assumption is that no such index appears
//!    within the ~70 s before a first acquisition (see [`backends::mongo`]).
//! 8. **Durability.** MongoDB lock writes use `w: "majority"` by default, so a failover does not
//!    roll back a lease. Reads that decide something (`inspect`, `list`, the election's `leader()`
//!    and `watch_leader()`, the change stream and a holder's loss checks) go to the primary with
//!    majority read concern, whatever read preference the database handle has. On PostgreSQL
//!    durability is the server's: keep `synchronous_commit` on (the default), and use synchronous
//!    replication if a lease must survive a failover to a standby.
//! 9. **Cancellation safety.** Dropping an acquire or release future never leaves a lease held
//!    with nobody to release it (a clean-up release is sent only after the abandoned attempt has
//!    landed); dropping a guard releases its lease in the background and stops its renewal task.
//!    Dropping an [`extend(ttl)`](LockGuard::extend) future with a `ttl` shorter than what is
//!    left still shortens the guard's trust to that `ttl`: the server may have applied it, even
//!    after a later extension, so later extensions of that guard are trusted no longer than that
//!    `ttl` either.
//! 10. **The edges hold.** A guard never reports a lease as held past its local deadline:
//!     `is_lost()` and `lost()` compare the clock with the deadline themselves, so after a
//!     starved runtime or a paused process (SIGSTOP, a stop-the-world pause) the first check
//!     already says "lost", before any background task has run. On Linux the deadline is also
//!     kept on `CLOCK_BOOTTIME`, which counts time the machine spent suspended; a pending
//!     `lost()` (and the election's `run_until`) wakes within about 250 ms of resuming once that
//!     deadline has passed. An acquire call that gives up after an attempt whose outcome it does
//!     not know (a lost reply, an error after the grant) releases that lease id in the
//!     background. `release()`, `resign()` and the release on drop are bounded by the release
//!     timeout (default 5 s); past it the lease simply expires.
//! 11. **At most once per interval.** [`LockGuard::release_after`] keeps an ended lease until a
//!     minimum time after its grant, by the database's clock, so two grants of the name are at
//!     least that far apart whatever the callers' clocks (`mongolock exec --min-hold`).
//! 12. **Semaphores** keep at most N unexpired slots of a name at any instant of server time, each
//!     slot a lease with all of the above; read-write locks keep a writer apart from everyone.
//! 13. **A free name reaches a live waiter fast.** When a name is released while a process waits
//!     for it with live notifications, the first process in the name's queue holds it within
//!     milliseconds; whatever stands ahead of a live waiter — waiters that gave up (they
//!     withdraw), processes that died or were stopped while queued — it holds the name within
//!     about a second (the 500 ms handoff fallback, and on MongoDB a probe every second by the
//!     waiters the next release would not reach), never "at the old lease's expiry". An expired
//!     lease is taken at its expiry by this machine's clock (a waiter sleeps until the holder's
//!     reported expiry). Without notifications (a standalone MongoDB, custom backends) waiters
//!     poll with the wait strategy.
//!
//! **The clock assumption.** Leases are judged by the clock of the database server that runs each
//! command: one `mongod` on a replica set, but the routing `mongos` on a sharded cluster, and the
//! new primary after a failover. Mutual exclusion by lease therefore assumes that those clocks
//! disagree by less than the drift margin ([`LockProviderBuilder::drift_margin`], default 1 % of
//! the lease + 5 ms), and that this machine's monotonic clock does not run slower than server time
//! by more than that. NTP-disciplined clocks stay far inside it. If the assumption is violated, two
//! holders can overlap for the excess; the fencing token still orders them, so a resource that
//! refuses smaller tokens refuses the stale holder's writes.
//!
//! Each item is tested by the contract suite ([`testing`]) on every backend and, at volume, by the
//! torture run with an independent checker (`docs/reliability.md` in the repository).
//!
//! ## Configuration
//!
//! | where | option | default |
//! |---|---|---|
//! | [`LockProvider::builder`]`(backend)` | [`.expiry(d)`](LockProviderBuilder::expiry) — lease duration, at least [`MIN_EXPIRY`] (100 ms) | 30 s |
//! | | `.extension_cadence(d)` — must be below the expiry | expiry / 3 |
//! | | `.auto_extend(bool)` | on |
//! | | `.wait_strategy(`[`WaitStrategy::random_sleep`]`(min, max))` or [`WaitStrategy::exponential`]`()` (100 ms doubling to 5 s, ±25 % jitter) — used when change notifications are unavailable | random 10–800 ms |
//! | | `.app_name(s)` — stored with every lease, with host and pid | none |
//! | | `.drift_margin(`[`DriftMargin::new`]`(ratio, fixed)?)` — how much earlier than the lease's end the guard stops trusting it | 1 % + 5 ms |
//! | | `.release_timeout(d)` — the longest a release (explicit, on drop, or of an abandoned attempt) may take | 5 s |
//! | [`MongoBackend::builder`]`(&db)` | `.collection(name)` | `distributed.locks` |
//! | | `.write_concern(wc)` | majority |
//! | | `.cleanup_after(d)` — TTL index `expireAfterSeconds` on `expiresAt` | 1 h |
//! | | `.create_ttl_index(bool)` | on |
//! | | `.notifications(bool)` — wake-ups and early loss detection; off = polling only | on (falls back to polling by itself where unavailable) |
//! | | `.fair_handoff(bool)` — a release reserves the lock for 500 ms for the first queued process (strict turns) | off |
//! | [`Lock`], [`Semaphore`], [`RwLock`], [`LockSet`] | `.with_expiry(d)` | the provider's |
//!
//! The PostgreSQL options are [below](#postgresql). Bad input — an empty name or one over 1 KiB, a
//! lease duration below [`MIN_EXPIRY`] (here and in every `with_expiry` and `extend`), a cadence
//! not below the expiry, a sleep range with min above max, a collection
//! name MongoDB refuses — returns a typed [`Error`] that says what to change. Nothing panics and
//! nothing is sent to the server.
//!
//! ## Minimum MongoDB version: 4.4
//! Acquire is one `findAndModify` whose update pipeline tests "free or expired by `$$NOW`" and
//! takes the lease in the same atomic write (pipeline updates and `$$NOW` exist from 4.2; dates use
//! `$add`, not the 5.0-only `$dateAdd`). The first acquisition of a name is two writes: one of 4096
//! epoch counters, chosen by a hash of the name, and the upsert that creates the lock document with
//! its first token. Change-stream wake-ups need a replica set or sharded cluster; on a standalone
//! server the library falls back to polling by itself. The mechanics — the lock document, the
//! fencing-epoch scheme that survives TTL deletion (and its proof), error classification — are in
//! [`backends::mongo`]. `docs/real-mongodb.md` in the repository says how to run the suites against
//! real deployments, and `docs/scaling.md` how to shard the lock collection.
//!
//! ## Change notifications
//! Waiters do not poll when the database can tell them of a change.
//!
//! * **One subscription per backend.** A [`MongoBackend`] opens **one** change stream on its lock
//!   collection, lazily, shared by every waiter and holder in the process (thousands of locks cost
//!   one cursor); a `PostgresBackend` one `LISTEN` connection. A busy waiter sleeps until the
//!   holder's reported expiry and is woken at once by a release or takeover of its name; per change
//!   only one waiting acquirer per name and process is woken (it hands the wake-up on if its
//!   attempt fails), so a release does not start a stampede.
//! * **A handoff costs one attempt across processes.** A waiter whose attempt finds the lock busy
//!   queues its process in the lock document (row) in the same write; a release pops the first
//!   live process of the queue and names it, and only that process wakes an acquirer. The others
//!   stay asleep: on MongoDB the release also names the next queued process as backup, which
//!   tries once 500 ms later only if nothing else happened to the name (the designated process
//!   died, or its acquirers gave up), and the other processes' streams do not even receive the
//!   release; on PostgreSQL every other process tries once 500 ms later on the same condition.
//!   A process whose last waiter on a name stops waiting without the lock (a timeout, a dropped
//!   future, an error) takes itself out of the queue in the background
//!   ([`LockProvider::flush`] waits for that before a process exits), and a MongoDB waiter
//!   further back than second, which the next release would not reach, reads the lock once a
//!   second while it waits: processes that died or were stopped while queued hold a live waiter
//!   up by about a second, not until the holder's expiry. With [`MongoBackendBuilder::fair_handoff`]`(true)` the release also
//!   reserves the lock for the designated process for 500 ms, so processes are served strictly in
//!   turn; the price is that a queued process that died or gave up holds the lock up for those
//!   500 ms. The queue only orders who tries first: every grant is still the same atomic "free or
//!   expired by server time" test, so it cannot affect mutual exclusion or fencing. Semaphore
//!   slots are not queued.
//! * **Each process's stream carries only the names it uses** (MongoDB): its `$match` lists the
//!   names the process waits on, observes or holds, so other processes' work on other names costs
//!   it nothing; of a name it only waits on, it receives only the releases that designate it
//!   (first or as backup) or nobody, so with 100 processes waiting on one name each acquisition
//!   costs about two change events in all, not one per process and write. When an acquirer finds a name busy that the stream does not cover yet, it polls for
//!   a moment while the stream is reopened from its resume token with the name added (nothing it
//!   covered is missed). A name held for more than about a second is added too, so a holder's lost
//!   signal fires as soon as the stream shows another holder (or a force-release) on its name; a
//!   lease released sooner learns of loss by extension and its local deadline, as every lease does.
//! * **Fallback.** Where notifications are unavailable (a standalone MongoDB answers code 40573,
//!   old versions, missing privileges, PgBouncer in transaction mode) or turned off, waiters poll
//!   with the wait strategy (logged once); MongoDB's stream is tried again every minute. Other
//!   refusals of the stream (transient or unknown errors) are retried with backoff while waiters
//!   poll. After a network error the stream resumes from its
//!   resume token (the `LISTEN` connection reconnects); if that fails it is rebuilt and every
//!   waiter and holder re-checks, so no wake-up is lost.
//!
//! Measured costs (commands per handoff, events per acquisition with many processes) are in
//! `docs/benchmarks.md` in the repository.
//!
//! ## PostgreSQL
//! The same contract on PostgreSQL, behind the `postgres` feature
//! (`mongolock = { version = "0.1", features = ["postgres"] }`):
//!
//! ```no_run
//! use mongolock::{LockProvider, PostgresBackend};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The table (default public.mongolock_locks) is created on first use.
//! let backend = PostgresBackend::builder("postgres://app:secret@db1:5432/app")
//!     .table("locks")
//!     .build()?;
//! let provider = LockProvider::builder(backend).app_name("worker").build()?;
//! let guard = provider.lock("reports:daily")?.acquire().await?;
//! println!("fencing token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Elections and the CLI (`mongolock --uri postgres://...`) work unchanged. How it holds the
//! guarantees above:
//!
//! * **One statement per operation, on the server's clock.** Acquire is one `INSERT ... ON CONFLICT
//!   DO UPDATE ... WHERE <free or expired>`, extend and release one `UPDATE` each, all judged with
//!   `clock_timestamp()` evaluated after the row is locked (not `now()`, the start of a transaction
//!   that may have waited for the row). Uncontended acquire + release is two round trips.
//! * **Fencing tokens only grow**, across cleanup too: every token comes from the table's sequence
//!   (drawn after the row lock on the update path), and cleanup deletes rows only under a table lock
//!   that cannot overlap a lock write. Tokens are unique across the table's names and have gaps.
//! * **Idle rows are cleaned up** in the background (rows whose lease ended over an hour ago, every
//!   10 minutes; `PostgresBackend::cleanup` does it on demand).
//! * **LISTEN/NOTIFY wake-ups.** A trigger publishes grants, releases and takeovers; one listening
//!   connection per backend wakes a waiter within milliseconds and tells a holder at once that its
//!   lease was taken or force-released. While that connection is down (killed, server restart)
//!   waiters poll with the wait strategy, and after it reconnects every waiter and holder checks
//!   again.
//! * **Cross-process handoff, as on MongoDB.** A waiter whose attempt finds the lock busy queues its
//!   process (its backend's mark) in the lock's row in the same statement; a release pops the first
//!   live process of the queue, and its notification (and the releasing process, from the release's
//!   reply) wakes one acquirer only in that process. The other processes try once 500 ms later,
//!   and only if the designated one did not take the lock (it died, or its acquirers gave up).
//!   Queue entries expire 2 s after the holder's lease, a queue holds at most 64 processes, and a
//!   grant moves its process to the end when more of its acquirers wait. The queue only orders who
//!   tries first: every grant is still the same one-statement "free or expired by
//!   `clock_timestamp()`" test, so it cannot affect mutual exclusion or fencing. Semaphore slots
//!   are not queued: a slot release wakes one waiter per process.
//! * **Durability** is the server's: keep `synchronous_commit` on (the default) for the lock table,
//!   and use synchronous replication if a lease must survive a failover to a standby.
//! * **Typed errors**: connection failures, shutdowns, serialization failures and lock timeouts are
//!   [`Error::Unavailable`] (retried within the caller's budget); permission, authentication and
//!   missing-database errors are [`Error::Backend`] with the SQLSTATE and a hint; a name containing
//!   NUL (PostgreSQL text cannot hold it) is [`Error::InvalidName`].
//!
//! **Minimum version: PostgreSQL 11** (`EXECUTE FUNCTION` triggers); tested with 15. The first use
//! needs `CREATE` on the database (for a missing schema) or schema; otherwise create the objects once
//! with `PostgresBackend::migrate()` as their owner and grant the application `SELECT, INSERT,
//! UPDATE, DELETE` on the table and `USAGE` on its sequence.
//! Behind PgBouncer in transaction mode `LISTEN` does not work: use `.notifications(false)` or a
//! direct connection.
//!
//! | `PostgresBackend::builder(url)` | default |
//! |---|---|
//! | `.schema(name)`, `.table(name)` (at most 50 bytes) | `public`, `mongolock_locks` |
//! | `.pool_size(n)` — pooled connections (the listening one comes on top) | 8 |
//! | `.notifications(bool)` — LISTEN/NOTIFY wake-ups and early loss detection | on |
//! | `.cleanup_after(d)` — how long after a lease ended its row may be deleted | 1 h |
//! | `.cleanup_every(Some(d))` — background cleanup period; `None` turns it off | 10 min |
//! | `.statement_timeout(Some(d))` — `statement_timeout` of pooled connections (`lock_timeout`: ¾ of it); `None`: the server's | 5 s |
//! | `.ssl_mode(PostgresSslMode::…)`, `.ssl_root_cert(path)` — override the URL's `sslmode`, `sslrootcert` | URL's, else `prefer` |
//!
//! **TLS** follows libpq's `sslmode` (in the URL, `?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem`,
//! or with the builder), on rustls with the `ring` provider (part of the `postgres` feature: no
//! system library needed):
//!
//! | `sslmode` | TLS | server certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default) | when the server offers it | not checked, unless root certificates are given (then as `verify-ca`) |
//! | `require` | always | not checked, unless root certificates are given (then as `verify-ca`) |
//! | `verify-ca` | always | must chain to a root of `sslrootcert` |
//! | `verify-full` | always | must chain to a root of `sslrootcert` and name the URL's host (or IP address) |
//!
//! Root certificates come from `sslrootcert` (a PEM file, or `system` for the operating system's
//! trusted roots), else `~/.postgresql/root.crt` when it exists, as in libpq. A certificate that is
//! not accepted (wrong CA, wrong name) or a server without TLS under `require` is [`Error::Backend`]
//! with a hint (retrying does not help); `sslmode=allow` and client certificates (`sslcert`,
//! `sslkey`) are refused when the backend is built.
//!
//! **Statement and lock timeouts.** A lock statement waits for its name's row lock, which other
//! lock statements hold for microseconds. A session that keeps the row locked (a `SELECT ... FOR
//! UPDATE` in a transaction left open) would block an acquire, extend or release, and the pooled
//! connection under it, for as long as it lives. Pooled connections therefore run with
//! `statement_timeout` (5 s by default) and `lock_timeout` (¾ of it): the server cancels such a
//! statement and the operation returns [`Error::Unavailable`] naming the timeout, which the core
//! retries within the caller's budget (an extension until the lease's local deadline, so a session
//! that lets go in time costs nothing). Keep the timeout well below your shortest lease TTL.
//!
//! Document locks (`DocumentLocks`) remain MongoDB-only: locking a row of your own table in place
//! would need lease columns and a trigger on that table, which mongolock does not impose.
//!
//! Cost: two statements per uncontended acquire + release, and 2.00 acquire statements per
//! handoff among 32 processes (`docs/benchmarks.md` in the repository).
//!
//! ## How it is built
//! Every lock type is a thin layer over **one acquire loop** (waiting, wake-ups, backoff,
//! retries, cancellation safety, clean-up of attempts with an unknown outcome) and **one guard**
//! ([`LockGuard`]: renewal, loss detection, release). A backend ([`LockBackend`]) supplies only
//! single atomic attempts — acquire, extend, release, force-release, inspect, list — and
//! optionally change notifications; the rules every backend follows, and why the core's
//! guarantees follow from them, are in [`backend`]. Each backend documents its storage and its
//! safety arguments: [`backends::memory`], [`backends::mongo`] and `backends::postgres`. The map
//! of the source (where each backend's acquire path is) is `docs/ARCHITECTURE.md` in the
//! repository.
//!
//! ## Cargo features
//! | feature | default | what it adds |
//! |---|---|---|
//! | `mongodb` | yes | [`MongoBackend`], [`LockProvider::mongodb`], document locks (`documents`). The `mongodb` driver is used without its default features, with TLS by rustls (ring), the one TLS implementation it needs to compile. |
//! | `dns-resolver` | yes | `mongodb+srv://` URIs: forwards the driver's `dns-resolver` (hickory). Implies `mongodb`. |
//! | `postgres` | no | `PostgresBackend` (tokio-postgres, deadpool, TLS by rustls). |
//! | `metrics` | no | Metrics through the [`metrics`](https://docs.rs/metrics) facade; see below. |
//! | `serde` | no | `serde::Serialize` for [`LockInfo`], [`LeaseHolder`], [`HolderInfo`] and [`LeaseId`] (what `inspect`, `list` and `holders` return; times as RFC 3339 strings). |
//! | `testing` | no | The contract suite every backend runs (`mongolock::testing`; not API-stable). |
//!
//! The default build is the MongoDB backend with the driver's default TLS and DNS behaviour.
//! `default-features = false, features = ["postgres"]` builds without the MongoDB driver;
//! `features = ["mongodb"]` without the SRV resolver. For OpenSSL instead of rustls, enable
//! the driver's `openssl-tls` in your own `mongodb` dependency (the driver prefers OpenSSL when
//! both are on). The library asks Tokio only for `rt`, `time`, `sync` and `macros`.
//!
//! ## Metrics
//! With the `metrics` feature, mongolock records through whatever recorder the application
//! installed (Prometheus, StatsD, ... exporters of the `metrics` ecosystem); without a
//! recorder the calls do nothing, and without the feature they are not compiled in.
//!
//! | metric | kind | labels | meaning |
//! |---|---|---|---|
//! | `mongolock_acquire_wait_seconds` | histogram | `lock`, `outcome` | time from an acquire call to its end; `outcome` is `acquired`, `timeout` (it ended without the lock: the timeout ran out, or the one attempt found it busy), `error` or `cancelled` (the future was dropped) |
//! | `mongolock_acquisitions_total` | counter | `lock` | leases granted |
//! | `mongolock_contended_total` | counter | `lock` | acquire calls that found the lock busy at least once |
//! | `mongolock_hold_seconds` | histogram | `lock`, `outcome` | time from a grant to the lease's end: `released` (release or drop) or `lost` |
//! | `mongolock_lost_total` | counter | `lock`, `reason` | leases lost while held: `deadline` (the local deadline passed before an extension succeeded), `expired` (an extension found the lease gone at the server), `taken` (the store reported another holder, a force-release or a deletion, or the release found the lease gone) |
//! | `mongolock_extension_failures_total` | counter | `lock` | extension attempts that failed with an error (retried until the local deadline) |
//! | `mongolock_is_leader` | gauge | `role` | 1 while this process leads the election role, else 0 |
//!
//! The `lock` label is the lock name by default. When names are many (one per order, per
//! user), bound the number of time series with
//! `LockProviderBuilder::metrics_labels`: `MetricsLabels::Prefix(':')` labels `"orders:42"` as
//! `"orders"`; `MetricsLabels::Fixed` uses one label for all; `MetricsLabels::map` any function.
//! Document locks are labelled with their collection's name. `describe_metrics()` registers
//! descriptions and units with the recorder.
//!
//! ## Tracing
//! Spans (targets under `mongolock::`): `mongolock.acquire` (debug; `lock`, `timeout`) around each
//! acquire call, `mongolock.lock_document` / `mongolock.claim_document` for document locks, and
//! `mongolock.lease` (info; `lock`, `token`, `lease_id`) over a held lease's whole life: its
//! renewal task and its release run inside it, it follows from the acquire span, and it closes
//! when the lease is released or lost. Events: acquired, released, extension errors (warn /
//! error), loss (warn), elected / resigned / lost leadership (info / warn).

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire_loop;
pub mod backend;
pub mod backends;
mod clock;
mod error;
mod guard;
mod holder;
mod lock;
pub mod lockset;
mod metrics;
mod operator;
mod options;
mod provider;
pub mod rwlock;
mod semaphore;
#[cfg(feature = "serde")]
mod serde_time;
mod wait;

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use crate::metrics::{describe_metrics, MetricsLabels};
pub use backend::{
    AcquireRequest, Attempt, ChangeNotifications, ChangeWaiter, Lease, LeaseHolder, LeaseId,
    LeaseMode, LockBackend, LockBackendExt, LockInfo, RELEASED_KEPT_FOR, RELEASED_KEPT_MAX,
};
pub use backends::memory::MemoryBackend;
#[cfg(feature = "mongodb")]
pub use backends::mongo::{MongoBackend, MongoBackendBuilder};
#[cfg(feature = "postgres")]
pub use backends::postgres::{PostgresBackend, PostgresBackendBuilder, SslMode as PostgresSslMode};
pub use error::{BoxError, Error, Result};
pub use guard::{LockGuard, LossReason, LostSignal};
pub use holder::HolderInfo;
pub use lock::Lock;
pub use lockset::{LockSet, LockSetGuard, LockSetLostSignal};
pub use operator::{ListFilter, QueuedWaiter};
pub use options::{
    DriftMargin, LockOptions, DEFAULT_EXPIRY, DEFAULT_RELEASE_TIMEOUT, MAX_EXPIRY, MAX_NAME_LEN,
    MIN_EXPIRY,
};
pub use provider::{LockProvider, LockProviderBuilder};
pub use rwlock::RwLock;
pub use semaphore::Semaphore;
pub use wait::WaitStrategy;

#[cfg(feature = "testing")]
#[allow(clippy::print_stdout, clippy::print_stderr)] // The contract suite reports what it measured.
pub mod testing;

/// Time on the boot clock the library uses for lease deadlines (`CLOCK_BOOTTIME` on Linux),
/// with the test-only offset of `MONGOLOCK_TEST_BOOT_OFFSET_FILE` (and, with the `testing`
/// feature, `testing::advance_boot_clock`) applied. For the CLI's supervisor; not API-stable.
#[doc(hidden)]
pub fn __boot_time_now() -> std::time::Duration {
    clock::boot_now()
}

pub mod election;
pub use election::{
    Election, ElectionEvent, ElectionEvents, LeaderContext, LeaderInfo, LeaderWatch, Leadership,
};

/// The workspace README's Rust examples, compiled as doc tests so that they stay true.
#[cfg(all(doctest, feature = "mongodb"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

#[cfg(feature = "mongodb")]
pub mod documents;
#[cfg(feature = "mongodb")]
pub use documents::{DocumentLocks, DocumentLocksBuilder, LockedDocument};
