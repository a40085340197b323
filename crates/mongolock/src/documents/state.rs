//! The embedded lock sub-document: its field names, its typed form for users' document types,
//! and conversions from BSON.

use mongodb::bson::{DateTime, Document};
use serde::{Deserialize, Serialize};

use crate::backend::{Lease, LeaseId, LockInfo};
use crate::backends::mongo::document::{self as codec, LockSite};
pub(super) use crate::backends::mongo::document::{
    date, holder_doc, lease_id, ttl_millis, ACQUIRED_AT, ENDED, ENDED_FROM, EXPIRES_AT, HOLDER,
    LAST_RELEASED, LEASE_ID, OBSERVED_AT, TOKEN,
};
use crate::error::{Error, Result};

/// The server time of the first grant of the lock sub-document's current lifetime (the
/// document was inserted, or re-inserted, since): a release that finds its lease gone counts
/// only the record of a lifetime that began no later than its own grant (`control.rs`), since
/// a re-inserted document starts its tokens again at 1.
pub(super) const SINCE: &str = "since";

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
#[non_exhaustive]
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
#[non_exhaustive]
pub struct EmbeddedHolder {
    /// Host name of the holding process.
    #[serde(default)]
    pub host: String,
    /// Operating-system process id of the holding process.
    #[serde(default)]
    pub pid: u32,
    /// Application name configured with
    /// [`LockProviderBuilder::app_name`](crate::LockProviderBuilder::app_name).
    #[serde(default)]
    pub app: Option<String>,
}

/// The lock sub-document of `d`, if it is a document.
pub(super) fn lock_doc<'a>(d: &'a Document, field: &str) -> Option<&'a Document> {
    d.get_document(field).ok()
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
    let site = LockSite::Embedded(field);
    let fencing_token = codec::token(lock, site, id)?
        .ok_or_else(|| site.bad(id, "no fencing token after a grant"))?;
    codec::lease(lock, fencing_token, site, id).map(Some)
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
    codec::lock_state(lock, observed_at, LockSite::Embedded(field), name)
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
