//! placeholder
pub mod engine;
