//! Change notifications: how a release in one place wakes a waiter in another, for every
//! backend. The backends supply only what is theirs (the memory backend its own writes; MongoDB
//! its change stream, `mongo/watch.rs`, and handoff queue, `mongo/queue.rs`; PostgreSQL its
//! `LISTEN` connection, `postgres/listen.rs`, and queue, `postgres/queue.rs`); everything else
//! lives here.
//!
//! # What each file holds
//! * [`hub`]: the in-process registry `name → waiters`, one per backend: whom a change of a
//!   name wakes (one acquirer per change and process — the no-stampede rule —, every observer,
//!   every holder), whether the wake-ups are live, and the handoff fallback timer. The memory
//!   backend uses it directly; the others through a [`Notifier`].
//! * `coverage` (MongoDB, PostgreSQL): which names a narrowed feed delivers the changes of, and the
//!   rules that keep a narrowed feed from losing a wake-up (asking for a name, re-checking the
//!   names newly covered); an `impl Hub` block.
//! * `notifier` (MongoDB, PostgreSQL): the [`Notifier`] of a backend with a feed: the hub, the
//!   leases this backend granted (to judge whether a change ended one: early loss detection)
//!   and the handle that stops the feed's task.
//! * `feed` (MongoDB, PostgreSQL): the [`Feed`] trait a backend implements (subscribe, read
//!   events into `(name, change)` deliveries) and the subscription task that keeps it open and
//!   does the fallback-to-polling, resubscription and backoff bookkeeping, the same for every
//!   feed.
//! * `handoff` (MongoDB, PostgreSQL): the cross-process handoff queue rule both queues share:
//!   the backend's mark, when an attempt registers or requeues, the queue's limits, and whom a
//!   release designated.
//!
//! # How a wake-up travels from a release to a waiter
//! An acquirer whose attempt may be busy first registers for the name's next change
//! (`ChangeWaiter`, from [`Hub::change_waiter`](hub::Hub::change_waiter); the registration is in place before the
//! attempt, so a release during the attempt is not missed). Its attempt is busy; with a
//! handoff queue and a live feed it also puts its backend's mark in the lock's queue. The
//! holder releases: the memory backend dispatches the release to its hub at once; MongoDB and
//! PostgreSQL pop the first mark of the lock's queue in the same write, and their feeds (a
//! change stream event, a `NOTIFY` payload) deliver the release, with the designated mark, to
//! the hub of every subscribed process ([`Hub::deliver`](hub::Hub::deliver); the releasing backend also
//! dispatches in-process, ahead of its feed). In the designated process (or every process, when
//! nobody was designated) the hub wakes the longest-waiting registered acquirer of the name at
//! once; elsewhere only after the handoff fallback, if nothing else happened to the name. The
//! woken acquirer retries; if it loses or gives up, it passes the wake-up on to the next
//! acquirer of its process. While no feed is live, nothing is registered as live and waiters
//! poll with their wait strategy instead.

// Without a feed (the memory backend alone) the feed status and the handoff dispatch of the hub
// are unused.
#[cfg_attr(not(any(feature = "mongodb", feature = "postgres")), allow(dead_code))]
pub(crate) mod hub;

#[cfg(any(feature = "mongodb", feature = "postgres"))]
mod coverage;
#[cfg(any(feature = "mongodb", feature = "postgres"))]
mod feed;
#[cfg(any(feature = "mongodb", feature = "postgres"))]
pub(crate) mod handoff;
#[cfg(any(feature = "mongodb", feature = "postgres"))]
mod notifier;

#[cfg(any(feature = "mongodb", feature = "postgres"))]
pub(crate) use feed::{Broke, Feed, OpenFailed, Opened};
#[cfg(any(feature = "mongodb", feature = "postgres"))]
pub(crate) use notifier::Notifier;
