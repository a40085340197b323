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
// Change notifications: the in-process hub, the feeds' task, the handoff queue rule.
pub(crate) mod notify;
