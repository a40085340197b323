//! The drivers' unified-format spec tests (../shared/mongo-spec-tests), run through the official
//! `mongodb` crate against a fresh `TestServer` per test, or against the deployment named by
//! `MONGODB_URI` when it is set.
//!
//! `cargo test -p mongo-testserver --test spec_crud -- --nocapture` prints one line per spec
//! test (PASS / SKIP with its reason / FAIL with what differed) and a summary per suite.
//! `SPEC_TEST_FILTER=<text>` runs only the tests whose "file / description" contains the text;
//! `MONGO_SPEC_TESTS_DIR` points at another copy of the spec tests.

mod unified;

/// Every file of `crud/`.
#[test]
fn spec_crud() {
    unified::run_suite("crud");
}

/// Every file of `change-streams/`.
#[test]
fn spec_change_streams() {
    unified::run_suite("change-streams");
}
