//! The document engine: pure functions over `bson` values (no I/O, no locking) that implement
//! MongoDB 7.0's query, update, projection, aggregation and change-description semantics.
//!
//! - [`compare`]: BSON comparison order and query equality.
//! - [`path`]: dotted paths with implicit array traversal.
//! - [`expr`]: aggregation expressions (`$expr`, pipeline updates, `$project`...). [`expr::Vars`]
//!   carries `$$NOW` (one value per operation).
//! - [`matcher`]: query filters.
//! - [`update`]: update operators, replacements and pipeline updates; upsert seeds.
//! - [`projection`]: find projections.
//! - [`pipeline`]: aggregation stages and sorting.
//! - [`diff`]: change-stream `updateDescription`s.

pub mod compare;
pub mod convert;
pub mod date;
pub mod decimal;
pub mod diff;
pub mod expr;
pub mod matcher;
pub mod num;
pub mod path;
pub mod pipeline;
pub mod projection;
pub mod regex;
pub mod update;
