//! Field names of the lock document and conversions from BSON.

use std::time::{Duration, SystemTime};

use mongodb::bson::{doc, Bson, DateTime, Document};

use crate::backend::{LeaseId, LockInfo};
use crate::error::{Error, Result};
use crate::holder::HolderInfo;

pub(super) const LEASE_ID: &str = "leaseId";
pub(super) const TOKEN: &str = "fencingToken";
pub(super) const ACQUIRED_AT: &str = "acquiredAt";
pub(super) const EXPIRES_AT: &str = "expiresAt";
pub(super) const HOLDER: &str = "holder";
/// Added by inspection queries: the server time of the read.
pub(super) const OBSERVED_AT: &str = "__mongolockObservedAt";

/// A lease duration in whole milliseconds (rounded up, so a lease is never shorter than asked).
pub(super) fn ttl_millis(ttl: Duration) -> i64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

pub(super) fn holder_doc(h: &HolderInfo) -> Document {
    doc! {
        "host": h.host.as_str(),
        "pid": i64::from(h.pid),
        "app": h.app_name.as_deref().map_or(Bson::Null, |a| Bson::String(a.to_owned())),
    }
}

fn bad_document(name: &str, what: &str) -> Error {
    Error::backend(
        format!("lock document {name:?} has {what}"),
        "the lock collection holds documents that mongolock did not write; use a dedicated \
         collection for locks",
    )
}

pub(super) fn lease_id(d: &Document) -> Option<&str> {
    d.get_str(LEASE_ID).ok()
}

pub(super) fn date(d: &Document, field: &str) -> Option<SystemTime> {
    d.get_datetime(field)
        .ok()
        .map(|t: &DateTime| t.to_system_time())
}

/// The fencing token; `Ok(None)` when none was stamped yet (null or missing).
pub(super) fn token(d: &Document, name: &str) -> Result<Option<u64>> {
    match d.get(TOKEN) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int64(t)) if *t >= 0 => Ok(Some(*t as u64)),
        Some(Bson::Int32(t)) if *t >= 0 => Ok(Some(*t as u64)),
        Some(Bson::Double(t)) if *t >= 0.0 && t.fract() == 0.0 && *t < 9.0e15 => {
            Ok(Some(*t as u64))
        }
        Some(other) => Err(bad_document(name, &format!("a fencingToken of {other}"))),
    }
}

pub(super) fn require_date(d: &Document, field: &str, name: &str) -> Result<SystemTime> {
    date(d, field).ok_or_else(|| bad_document(name, &format!("no date in `{field}`")))
}

fn holder(d: &Document) -> Option<HolderInfo> {
    let h = d.get_document(HOLDER).ok()?;
    let pid = match h.get("pid") {
        Some(Bson::Int64(p)) => u32::try_from(*p).unwrap_or(0),
        Some(Bson::Int32(p)) => u32::try_from(*p).unwrap_or(0),
        _ => 0,
    };
    Some(HolderInfo {
        host: h.get_str("host").unwrap_or("unknown").to_owned(),
        pid,
        app_name: h.get_str("app").ok().map(str::to_owned),
    })
}

/// Converts a lock document read together with the server time (`OBSERVED_AT`).
pub(super) fn lock_info(d: &Document) -> Result<LockInfo> {
    let name = d
        .get_str("_id")
        .map_err(|_| bad_document("?", "a non-string _id"))?
        .to_owned();
    let observed_at = require_date(d, OBSERVED_AT, &name)?;
    let expires_at = date(d, EXPIRES_AT);
    let lease = lease_id(d).map(LeaseId::from_string);
    Ok(LockInfo {
        held: lease.is_some() && expires_at.is_some_and(|e| e > observed_at),
        lease_id: lease,
        fencing_token: token(d, &name)?.unwrap_or(0),
        holder: holder(d),
        acquired_at: date(d, ACQUIRED_AT),
        expires_at,
        observed_at,
        name,
    })
}
