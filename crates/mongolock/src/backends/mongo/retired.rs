//! Retired lease ids: a late attempt never grants a lease id again once its lease ended.
//!
//! One lease id serves every attempt of an acquire call, and an attempt for a lease id that
//! already holds the name counts as free (an idempotent retry after a lost reply). An attempt
//! whose outcome is unknown — the driver returned an error (a connection reset, a network
//! error on the driver's own retry too) while the command may still be pending at the server —
//! can be applied *after* a later attempt of the same call was granted and its lease released:
//! a write the server received is not cancelled when its client goes away (MongoDB kills only
//! reads on disconnect), and a write delayed in the network or at the server arrives when it
//! arrives. Applied then, it would find the name free and grant the same id again, with
//! nobody to extend or release it: the name would stay held until the lease's TTL.
//!
//! So the backend remembers the lease ids of its attempts that failed with a transient error
//! (`Tainted`, in
//! `backends/leases.rs`, shared with PostgreSQL: only
//! those can still be in flight after their call moved on; an attempt that answered has been
//! applied). Before such a lease id is released — by its guard, by an abandoned call's
//! clean-up, with or without a minimum hold — one write adds it to the lock document's
//! `retired` (the last [`KEPT`] such ids), and every grant requires that its lease id is not
//! retired ([`not_retired`]; the uncontended shortcut's filter likewise). The order matters:
//! retired first, released second. A late attempt applied before the retirement finds the
//! lease its own (still held: nothing changes but its expiry) or ended, and one applied after
//! it finds the id retired and grants nothing. The release then ends the lease as usual.
//!
//! The record is bounded: a late attempt could grant again only after [`KEPT`] later
//! retirements of the same name (each one a lease whose attempt failed), which is not a
//! delay any write survives in practice. A lease id never released — its process died — is
//! not retired; its lease expires like any crashed holder's, and so would a late grant of it.
//! Retiring writes `retired` only, which no change stream passes (`watch.rs`), and never
//! decides a grant for anyone but the retired id: mutual exclusion and token order are as
//! before.

use mongodb::bson::{doc, Bson, Document};
use mongodb::Collection;

use super::errors::classify;
use crate::backend::LeaseId;
use crate::error::Result;

/// The field of retired lease ids in a lock document.
pub(super) const RETIRED: &str = "retired";

/// How many retired ids a lock document keeps (the latest).
pub(super) const KEPT: i32 = 16;

/// Aggregation expression: `id` is not among the document's retired lease ids.
pub(super) fn not_retired(id: &str) -> Document {
    doc! { "$not": [{ "$in": [{ "$literal": id }, { "$ifNull": [format!("${RETIRED}"), []] }] }] }
}

/// Query filter: `id` is not among the document's retired lease ids (for the shortcut).
pub(super) fn not_retired_filter(id: &str) -> Bson {
    Bson::Document(doc! { "$ne": id })
}

/// Adds `id` to the retired ids of `name`'s lock document (before its release; see the module
/// docs). Only a lock document matches (it has a `leaseId` field, null once released); the
/// caller has checked that the collection is ours. A missing document has nothing to retire
/// from (a late first acquisition finds the document its call's retry created).
pub(super) async fn retire(coll: &Collection<Document>, name: &str, id: &LeaseId) -> Result<()> {
    coll.update_one(
        doc! { "_id": name, "leaseId": { "$exists": true }, RETIRED: { "$ne": id.as_str() } },
        doc! { "$push": { RETIRED: { "$each": [id.as_str()], "$slice": -KEPT } } },
    )
    .await
    .map_err(|e| classify(e, "retire a lease id (update)"))?;
    Ok(())
}
