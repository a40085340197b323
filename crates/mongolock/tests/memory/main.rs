//! The memory backend's test binary (`cargo test -p mongolock --test memory`): the contract
//! suite, leader election included (`contract.rs`), and the `serde` feature (`serde.rs`, with
//! `--features serde`).

mod contract;
#[cfg(feature = "serde")]
mod serde;
