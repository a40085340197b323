//! The MongoDB backend's test binary (`cargo test -p mongolock --test mongo`), against the
//! embedded mongo-testserver or, when `MONGODB_URI` is set, a real deployment (fault cases
//! only with `MONGODB_FAILPOINTS=1`). One module per topic; shared helpers in `tests/support/`.
//!
//! The tests that start helper processes run this binary again with one test selected by its
//! full path (`processes::child_entry`, `edges::child_entry`, `election::child_entry`,
//! `documents::doc_child_entry`): renaming those modules means changing those strings.

#[path = "../support"]
mod support {
    pub mod contention;
    pub mod liveness;
    pub mod mongo;
}

mod backend;
mod changestream;
mod collections;
mod contract;
mod deployments;
mod documents;
mod edges;
mod election;
mod faults;
mod liveness;
mod min_hold;
mod processes;
