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
// Parts of the registry (stream status, transitions) serve only the MongoDB change-stream watcher.
#[cfg_attr(not(feature = "mongodb"), allow(dead_code))]
pub(crate) mod wakeups;
