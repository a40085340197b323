//! Backends: one module per storage system.
//!
//! * [`memory`]: in-process, for tests and single-process use.
//! * [`mongo`] (feature `mongodb`): MongoDB.

pub mod memory;
#[cfg(feature = "mongodb")]
pub mod mongo;
pub(crate) mod wakeups;
