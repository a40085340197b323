//! The embedded lock sub-document: its field names, its typed form for users' document types,
//! and conversions from BSON.

use std::time::{Duration, SystemTime};

use mongodb::bson::{doc, Bson, DateTime, Document};
use serde::{Deserialize, Serialize};

use crate::backend::{Lease, LeaseId, LockInfo};
use crate::error::{Error, Result};
use crate::holder::HolderInfo;

pub(super) const LEASE_ID: &str = "leaseId";
pub(super) const TOKEN: &str = "fencingToken";
pub(super) const ACQUIRED_AT: &str = "acquiredAt";
pub(super) const EXPIRES_AT: &str = "expiresAt";
pub(super) const HOLDER: &str = "holder";
/// Added by inspection reads: the server time of the read. Never stored.
pub(super) const OBSERVED_AT: &str = "__mongolockObservedAt";

/// The lock sub-document that [`DocumentLocks`](super::DocumentLocks) embeds in a user's
/// document under its lock field (default `_lock`), as stored:
///
/// ```text
/// { leaseId: <string|null>, fencingToken: <int64>, acquiredAt: <date>, expiresAt: <date>,
///   holder: { host: <string>, pid: <int64>, app: <string|null> } }
/// ```
///
/// Use it to give your document type a field for the lock, so that the locked document you get
/// back shows who holds it. Mark the field `skip_serializing` so that your own writes
/// (`insert_one`, `replace_one`) never overwrite a lock:
///
/// ```
/// use mongolock::documents::EmbeddedLock;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize)]
/// struct Job {
///     #[serde(rename = "_id")]
///     id: i64,
///     done: bool,
///     #[serde(rename = "_lock", default, skip_serializing)]
///     lock: Option<EmbeddedLock>,
/// }
/// ```
///
/// The lock is held when `lease_id` is set and `expires_at` is later than the *server's* current
/// time; compare with [`DocumentLocks::inspect`](super::DocumentLocks::inspect), which reads the
/// server time with the document, rather than with the local clock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmbeddedLock {
    /// The id of the current (or, once expired, the most recent) lease; `None` after release.
    #[serde(default)]
    pub lease_id: Option<String>,
    /// The fencing token of the most recent lease: it grows by one with every lock or claim of
    /// this document and is kept across release.
    #[serde(default)]
    pub fencing_token: Option<u64>,
    /// Server time at which the most recent lease was granted.
    #[serde(default)]
    pub acquired_at: Option<DateTime>,
    /// Server time at which the most recent lease expires (or ended, after release).
    #[serde(default)]
    pub expires_at: Option<DateTime>,
    /// Who took the most recent lease.
    #[serde(default)]
    pub holder: Option<EmbeddedHolder>,
}

/// Holder metadata inside an [`EmbeddedLock`] (informational only; ownership is decided by the
/// lease id).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddedHolder {
    /// Host name of the holding process.
    #[serde(default)]
    pub host: String,
    /// Operating-system process id of the holding process.
    #[serde(default)]
    pub pid: u32,
    /// Application name configured with
    /// [`DocumentLocksBuilder::app_name`](super::DocumentLocksBuilder::app_name).
    #[serde(default)]
    pub app: Option<String>,
}

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

/// The error for a lock sub-document that mongolock did not write.
fn bad_lock(what: &str, field: &str, id: &str) -> Error {
    Error::backend(
        format!("the lock field `{field}` of document {id} has {what}"),
        format!(
            "the documents use `{field}` for something else; choose another lock field with \
             DocumentLocks::builder(..).field(..)"
        ),
    )
}

/// The lock sub-document of `d`, if it is a document.
pub(super) fn lock_doc<'a>(d: &'a Document, field: &str) -> Option<&'a Document> {
    d.get_document(field).ok()
}

pub(super) fn lease_id(lock: &Document) -> Option<&str> {
    lock.get_str(LEASE_ID).ok()
}

pub(super) fn date(lock: &Document, name: &str) -> Option<SystemTime> {
    lock.get_datetime(name).ok().map(|t| t.to_system_time())
}

fn require_date(lock: &Document, name: &str, field: &str, id: &str) -> Result<SystemTime> {
    date(lock, name).ok_or_else(|| bad_lock(&format!("no date in `{name}`"), field, id))
}

/// The fencing token; `Ok(None)` when there is none (never locked).
pub(super) fn token(lock: &Document, field: &str, id: &str) -> Result<Option<u64>> {
    match lock.get(TOKEN) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int64(t)) if *t >= 0 => Ok(Some(*t as u64)),
        Some(Bson::Int32(t)) if *t >= 0 => Ok(Some(*t as u64)),
        Some(Bson::Double(t)) if *t >= 0.0 && t.fract() == 0.0 && *t < 9.0e15 => {
            Ok(Some(*t as u64))
        }
        Some(other) => Err(bad_lock(&format!("a fencingToken of {other}"), field, id)),
    }
}

/// The lease granted to `mine` in the returned post-image `d`; `None` when the lock sub-document
/// holds another lease (the attempt found the document busy).
pub(super) fn granted(
    d: &Document,
    field: &str,
    mine: &LeaseId,
    id: &str,
) -> Result<Option<Lease>> {
    let Some(lock) = lock_doc(d, field) else {
        return Ok(None);
    };
    if lease_id(lock) != Some(mine.as_str()) {
        return Ok(None);
    }
    let fencing_token = token(lock, field, id)?
        .ok_or_else(|| bad_lock("no fencing token after a grant", field, id))?;
    Ok(Some(Lease {
        fencing_token,
        acquired_at: require_date(lock, ACQUIRED_AT, field, id)?,
        expires_at: require_date(lock, EXPIRES_AT, field, id)?,
    }))
}

fn holder(lock: &Document) -> Option<HolderInfo> {
    let h = lock.get_document(HOLDER).ok()?;
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

/// Converts a document read together with the server time (`OBSERVED_AT`).
pub(super) fn lock_info(d: &Document, field: &str, name: String) -> Result<LockInfo> {
    let observed_at = d
        .get_datetime(OBSERVED_AT)
        .map(|t| t.to_system_time())
        .map_err(|_| {
            Error::backend(
                "the inspection read returned no server time",
                "the server does not behave like MongoDB; check the deployment",
            )
        })?;
    let empty = Document::new();
    let lock = lock_doc(d, field).unwrap_or(&empty);
    let expires_at = date(lock, EXPIRES_AT);
    let lease = lease_id(lock).map(LeaseId::from_string);
    Ok(LockInfo {
        held: lease.is_some() && expires_at.is_some_and(|e| e > observed_at),
        lease_id: lease,
        fencing_token: token(lock, field, &name)?.unwrap_or(0),
        holder: holder(lock),
        acquired_at: date(lock, ACQUIRED_AT),
        expires_at,
        observed_at,
        name,
    })
}

/// Checks a lock field name: one top-level field that MongoDB accepts and updates can address.
pub(super) fn validate_field(field: &str) -> Result<()> {
    let refuse = |reason: String| Err(Error::invalid_option("field", reason));
    if field.is_empty() {
        return refuse(
            "the lock field name is empty; use a name such as \"_lock\" (the default)".into(),
        );
    }
    if field == "_id" {
        return refuse("the lock field cannot be `_id`; use a name such as \"_lock\"".into());
    }
    if field.starts_with('$') {
        return refuse(format!(
            "the lock field {field:?} starts with '$', which update paths cannot address; remove it"
        ));
    }
    if field.contains('.') {
        return refuse(format!(
            "the lock field {field:?} contains '.'; the lock lives in one top-level field, so \
             use a name without dots such as \"_lock\""
        ));
    }
    if field.contains('\0') {
        return refuse("the lock field contains a NUL character, which BSON does not allow".into());
    }
    if field.len() > 255 {
        return refuse(format!(
            "the lock field name is {} bytes; use at most 255",
            field.len()
        ));
    }
    Ok(())
}
