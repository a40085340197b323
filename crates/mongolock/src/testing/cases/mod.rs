//! The contract cases, one module per topic; all re-exported from
//! [`mongolock::testing`](crate::testing) and run by
//! [`contract_suite!`](crate::contract_suite).

// The harness and wrappers, in scope for the cases as `super::…`.
#[allow(unused_imports)]
use super::harness::*;
#[allow(unused_imports)]
use super::wrappers::*;

mod cancellation;
mod election;
mod extension;
mod guard_edges;
mod locks;
mod lockset;
mod min_hold;
mod notifications;
mod operator;
mod release;
mod rwlock;
mod semaphore;
mod timeouts;

pub use cancellation::*;
pub use election::*;
pub use extension::*;
pub use guard_edges::*;
pub use locks::*;
pub use lockset::*;
pub use min_hold::*;
pub use notifications::*;
pub use operator::*;
pub use release::*;
pub use rwlock::*;
pub use semaphore::*;
pub use timeouts::*;
