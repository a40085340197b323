//! Backends: one module per storage system.
//!
//! * [`memory`]: in-process, for tests and single-process use.
//! * [`mongo`] (feature `mongodb`): MongoDB.
//! * [`postgres`] (feature `postgres`): PostgreSQL.

pub mod memory;
#[cfg(feature = "mongodb")]
pub mod mongo;
#[cfg(feature = "postgres")]
pub mod postgres;
// Parts of the hub (feed status, handoff designations) serve only the backends with a feed.
#[cfg_attr(not(any(feature = "mongodb", feature = "postgres")), allow(dead_code))]
pub(crate) mod notify;
