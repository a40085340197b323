//! The PostgreSQL backend's test binary (`cargo test -p mongolock --test postgres`), against a
//! real server the tests start from Debian's `postgresql` package (or `POSTGRES_URL`). One
//! module per topic; shared helpers in `tests/support/`.
//!
//! The process tests run this binary again with `processes::child_entry` selected by its full
//! path: renaming that module means changing the string in `support/contention.rs`.

#[path = "../support"]
mod support {
    pub mod contention;
    pub mod liveness;
    pub mod postgres;
}

mod backend;
mod buckets;
mod contract;
mod handoff;
mod min_hold;
mod processes;
mod tables;
mod tls;
