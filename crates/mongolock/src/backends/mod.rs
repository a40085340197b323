//! Backends: one module per storage system.
//!
//! * [`memory`]: in-process, for tests and single-process use.
//! * [`mongo`] (feature `mongodb`): MongoDB.

pub mod memory;
#[cfg(feature = "mongodb")]
pub mod mongo;
// Parts of the registry (stream status, transitions) serve only the MongoDB change-stream watcher.
#[cfg_attr(not(feature = "mongodb"), allow(dead_code))]
pub(crate) mod wakeups;
