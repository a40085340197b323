//! # mongolock
//!
//! Distributed locks for Rust services that already run MongoDB: named locks with server-time
//! leases, fencing tokens that only grow, automatic extension, a lost signal, and an in-memory
//! backend with the same contract for tests.
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
//! // Wait until held (drop the future to give up, or use `acquire_timeout`).
//! let guard = provider.lock("reports:daily")?.acquire().await?;
//! println!("holding {} with fencing token {}", guard.name(), guard.fencing_token());
//!
//! // Others get `None`: `try_acquire` makes exactly one attempt, `acquire_timeout` keeps
//! // trying for a while. `with_expiry` sets this lock's lease duration.
//! let other = provider.lock("reports:daily")?.with_expiry(Duration::from_secs(60))?;
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
//! ## Semaphores
//! [`LockProvider::semaphore`] gives a [`Semaphore`]: at most N holders of a name at once,
//! each with its own lease and [`LockGuard`], and fencing tokens from the name's one sequence.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mongolock::Result<()> {
//! let provider = mongolock::LockProvider::memory();
//! let crawlers = provider.semaphore("crawlers", 2)?;
//! let first = crawlers.acquire().await?;
//! let second = crawlers.acquire().await?;
//! assert!(crawlers.try_acquire().await?.is_none()); // both slots held
//! assert!(second.fencing_token() > first.fencing_token());
//! first.release().await?;
//! assert!(crawlers.try_acquire().await?.is_some()); // a slot is free again
//! # Ok(())
//! # }
//! ```
//!
//! ## Read-write locks
//! [`LockProvider::rw_lock`] gives a [`RwLock`]: many readers or one writer, each with its own
//! lease; once a writer waits, new readers wait (see [`rwlock`]).
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
//! assert!(writer.fencing_token() > read_token);
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
//! ## One vocabulary
//! Every lock type has the same three forms: a waiting one (`acquire`; [`RwLock::read`] /
//! [`RwLock::write`]; [`Election::campaign`]; `DocumentLocks::lock` and `claim`), exactly one
//! attempt (`try_acquire`,
//! `try_read`, `try_write`, `try_campaign`, `try_lock`, `try_claim`: `None` when busy), and
//! waiting up to a timeout (`acquire_timeout`, `read_timeout`, `write_timeout`,
//! `campaign_timeout`, `lock_timeout`, `claim_timeout`: `None` when it ran out). Everything is
//! created from the [`LockProvider`]: [`lock`](LockProvider::lock),
//! [`semaphore`](LockProvider::semaphore), [`rw_lock`](LockProvider::rw_lock),
//! [`lock_set`](LockProvider::lock_set), [`election`](LockProvider::election) and
//! `documents` (feature `mongodb`); `with_expiry` sets another lease duration on any of them.
//!
//! For tests of code that takes a [`LockProvider`], [`LockProvider::memory()`] gives the same
//! contract without a database. Configure with [`LockProvider::builder`] and
//! [`MongoBackend::builder`] (collection, write concern, TTL cleanup delay).
//!
//! ## The contract
//! 1. **Mutual exclusion per lease**: at any instant of server time at most one holder has an
//!    unexpired lease on a name.
//! 2. **Server time only**: expiry is computed and compared by the database (`$$NOW`); local
//!    monotonic clocks only stop trusting a lease early, never late.
//! 3. **Fencing tokens only grow**, across release, expiry, takeover, force-release and TTL
//!    cleanup of the lock document.
//! 4. **Ownership is checked**: extend and release act only on the caller's own lease.
//! 5. **Loss is signalled** by [`LockGuard::lost`] / [`LockGuard::is_lost`], at the lease's
//!    local deadline at the latest — checked when read, so a starved runtime or a paused
//!    process cannot see a lease as held past it; [`LockGuard::lost_reason`] says why
//!    ([`LossReason`]).
//! 6. **Crash safety**: a crashed holder's lock is free once its lease expires.
//! 7. **Durability**: MongoDB writes use `w: "majority"` by default.
//! 8. **Cancellation safety**: dropping an acquire future never leaves a lease held (a grant whose
//!    reply was lost included); dropping a guard releases it in the background, within the
//!    release timeout.
//! 9. **Semaphores**: at most N unexpired slots of a [`Semaphore`] at any instant of server
//!    time, each slot a lease with all of the above; tokens from the name's one sequence; a
//!    name is never shared between a lock holder and slot holders.
//!
//! ## Where things are
//! * [`LockProvider`] / [`LockProviderBuilder`] (`provider.rs`): options, creating locks,
//!   inspection.
//! * [`Lock`] (`lock.rs`): a named lock's acquire forms, on the one acquire loop
//!   (`acquire_loop.rs`: waiting, backoff, retries, cancellation safety, clean-up of attempts
//!   with an unknown outcome) that document locks use too.
//! * [`Semaphore`] (`semaphore.rs`): at most N holders of a name, each with its own lease and
//!   guard; a [`Lock`] whose requests carry [`LeaseMode::Slot`] (same loop, same guard).
//! * [`RwLock`] (`rwlock.rs`): readers are slots, writers the exclusive lease, plus a writers'
//!   intent lock; no backend code of its own.
//! * [`LockSet`] (`lockset.rs`): several locks held together, all or nothing, taken in one
//!   global order (sorted by name) so that sets never deadlock; one guard per name under a
//!   [`LockSetGuard`]. No backend code of its own.
//! * [`LockGuard`] (`guard.rs`): renewal task, loss detection, release, the lease's span.
//! * Metrics (`metrics.rs`, feature `metrics`): the hooks the acquire loop, the guard and
//!   elections call; empty without the feature.
//! * [`LockBackend`] (`backend.rs`): the trait backends implement (single atomic attempts).
//! * [`MemoryBackend`] (`backends/memory.rs`) and [`MongoBackend`] (`backends/mongo/`, the
//!   acquire path is in `backends/mongo/acquire.rs`).
//! * `PostgresBackend` (feature `postgres`, `backends/postgres/`: one statement per operation,
//!   LISTEN/NOTIFY wake-ups in `listen.rs`).
//! * `testing` (feature `testing`): the contract suite every backend runs, not API-stable.
//! * Change notifications: one notification core (`backends/notify/`: held leases and loss
//!   detection, the subscription task with fallback, resubscription and re-checks) fed by the
//!   MongoDB change stream (`backends/mongo/watch.rs`) or the PostgreSQL `LISTEN` connection
//!   (`backends/postgres/listen.rs`), and the per-name wake-ups it shares with the memory
//!   backend (`backends/notify/hub.rs`: one waiter per change, no stampede).
//!
//! Requires a Tokio runtime with the time driver enabled (`#[tokio::main]` has it).
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
