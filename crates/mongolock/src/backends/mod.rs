//! Backends: one module per storage system.
//!
//! * [`memory`]: in-process, for tests and single-process use.
//! * [`mongo`] (feature `mongodb`): MongoDB.
//! * [`postgres`] (feature `postgres`): PostgreSQL.

pub mod memory;
#[cfg(feature = "mongodb")]
pub mod mongo;
// What the cross-process handoff queues of MongoDB and PostgreSQL share.
#[cfg(any(feature = "mongodb", feature = "postgres"))]
pub(crate) mod handoff;
// The notification core of the backends that subscribe to changes (MongoDB, PostgreSQL).
#[cfg(any(feature = "mongodb", feature = "postgres"))]
pub(crate) mod notify;
#[cfg(feature = "postgres")]
pub mod postgres;
// Parts of the registry (feed status, handoff designations) serve only the backends with a feed.
#[cfg_attr(not(any(feature = "mongodb", feature = "postgres")), allow(dead_code))]
pub(crate) mod wakeups;
