//! Server times as RFC 3339 strings (UTC, milliseconds) for the `serde` feature.

use std::time::SystemTime;

use serde::Serializer;

/// `2026-11-24T06:58:01.123Z`.
pub(crate) fn rfc3339<S: Serializer>(at: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*at))
}

/// As [`rfc3339`], `None` as null.
pub(crate) fn rfc3339_opt<S: Serializer>(at: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => rfc3339(at, s),
        None => s.serialize_none(),
    }
}
