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
// What a database backend remembers of the leases it granted.
#[cfg(any(feature = "mongodb", feature = "postgres"))]
pub(crate) mod leases;
// Change notifications: the in-process hub, the feeds' task, the handoff queue rule.
pub(crate) mod notify;
