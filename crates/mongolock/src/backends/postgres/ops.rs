//! The lock operations: one statement each (see `schema.rs` for the SQL), and the decoding of
//! their rows.

use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use super::queue::{self, Handoff};
use crate::backend::{AcquireRequest, Attempt, Lease, LeaseHolder, LeaseId, LockInfo};
use crate::error::{Error, Result};
use crate::holder::HolderInfo;

/// A duration in whole microseconds (the unit the statements multiply `interval '1
/// microsecond'` by), saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// SQL expression (in the release statement, on the row `l`, `$2` the released lease id): the
/// `released` column after the release. Its entries are `<lease id> <server time in Unix
/// milliseconds>`, oldest first; the release keeps those of the last
/// [`RELEASED_KEPT_FOR`](crate::RELEASED_KEPT_FOR) (and untimed entries written by older
/// versions), appends its own, and keeps the last
/// [`RELEASED_KEPT_MAX`](crate::RELEASED_KEPT_MAX). Kept by time, not by count alone: on a hot
/// lock many releases happen before a release whose reply was lost is retried.
pub(crate) fn released_after() -> String {
    let now_ms = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
    format!(
        "(SELECT coalesce(array_agg(k.r ORDER BY k.o), '{{}}'::text[]) FROM (
           SELECT u.r, u.o
             FROM unnest(array_append(l.released, $2::text || ' ' || {now_ms}))
                  WITH ORDINALITY AS u(r, o)
            WHERE coalesce(substring(u.r FROM ' ([0-9]+)$')::bigint, {now_ms}) > {now_ms} - {kept_for}
            ORDER BY u.o DESC LIMIT {kept_max}) k)",
        kept_for = crate::RELEASED_KEPT_FOR.as_millis(),
        kept_max = crate::RELEASED_KEPT_MAX,
    )
}

/// SQL condition on a `released` array column `column` (see [`released_after`]): it holds the
/// lease id `$2`.
pub(crate) fn was_released(column: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM unnest({column}) AS r(id)
                  WHERE r.id = $2::text OR left(r.id, length($2::text) + 1) = $2::text || ' ')"
    )
}

/// PostgreSQL `text` cannot hold NUL characters: such a lock name is refused before it is
/// sent, with a typed error.
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.contains('\0') {
        return Err(Error::InvalidName {
            reason: "the name contains a NUL character, which PostgreSQL text cannot store; \
                     remove it (or encode binary keys, e.g. as hex)"
                .into(),
        });
    }
    Ok(())
}

/// Holder metadata as stored: NUL characters (which `text` cannot hold) become U+FFFD.
pub(crate) fn clean(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "\u{fffd}").into()
    } else {
        text.into()
    }
}

fn token(row: &Row, idx: &str) -> Result<u64> {
    let t: i64 = row.try_get(idx).map_err(decode)?;
    u64::try_from(t).map_err(|_| {
        Error::backend(
            format!("the lock table holds a negative fencing token ({t})"),
            "use a dedicated table that only mongolock writes",
        )
    })
}

/// A row that does not have the types mongolock wrote.
pub(crate) fn decode(e: tokio_postgres::Error) -> Error {
    Error::Backend {
        message: format!("unexpected lock row: {e}"),
        code: None,
        hint: "use a dedicated table that only mongolock writes (created by mongolock)".into(),
        source: Some(Box::new(e)),
    }
}

/// The parameters of the acquire statement, owned.
pub(crate) struct AcquireParams {
    pub(crate) ttl: i64,
    pub(crate) host: String,
    pub(crate) pid: i64,
    pub(crate) app: Option<String>,
}

impl AcquireParams {
    pub(crate) fn new(req: &AcquireRequest) -> Self {
        AcquireParams {
            ttl: micros(req.ttl),
            host: clean(&req.holder.host).into_owned(),
            pid: i64::from(req.holder.pid),
            app: req
                .holder
                .app_name
                .as_deref()
                .map(|a| clean(a).into_owned()),
        }
    }
}

/// The reply of the release statement (one row).
pub(crate) struct Released {
    /// Whether the lease was released (now or by an earlier call).
    pub(crate) released: bool,
    /// Whom this release designated (`queue.rs`): `None` when it ended no exclusive lease now
    /// (a slot, a retry, not ours).
    pub(crate) handoff: Option<Handoff>,
    /// The row's token after the release, when it ended a lease now.
    pub(crate) token: Option<u64>,
}

/// Decodes the release statement's reply.
pub(crate) fn released(rows: &[Row]) -> Result<Released> {
    let Some(row) = rows.first() else {
        return Ok(Released {
            released: false,
            handoff: None,
            token: None,
        });
    };
    let handoff: Option<String> = row.try_get("handoff").map_err(decode)?;
    let token: Option<i64> = row.try_get("fencing_token").map_err(decode)?;
    Ok(Released {
        released: row.try_get("released").map_err(decode)?,
        handoff: handoff.as_deref().map(queue::recorded),
        token: token.and_then(|t| u64::try_from(t).ok()),
    })
}

/// The reply of the release statement with a minimum hold (one row): the release's, whether
/// the lease was kept on, and whether the lease id is a semaphore slot's.
pub(crate) struct ReleasedAfter {
    pub(crate) released: Released,
    pub(crate) held_on: bool,
    pub(crate) is_slot: bool,
}

/// Decodes the reply of the release statement with a minimum hold.
pub(crate) fn released_after_reply(rows: &[Row]) -> Result<ReleasedAfter> {
    let Some(row) = rows.first() else {
        return Err(Error::backend(
            "the release statement with a minimum hold returned no row",
            "the server does not behave like PostgreSQL; check the deployment",
        ));
    };
    Ok(ReleasedAfter {
        released: released(rows)?,
        held_on: row.try_get("held_on").map_err(decode)?,
        is_slot: row.try_get("is_slot").map_err(decode)?,
    })
}

/// The outcome of the acquire statement: at most one row, `acquired` first.
pub(crate) fn attempt(rows: &[Row]) -> Result<Attempt> {
    let Some(row) = rows.first() else {
        // Nobody holds the name in our snapshot, yet the grant did not happen: someone took it
        // while we waited for its row. Its expiry is unknown.
        return Ok(Attempt::Busy {
            holder_expires_at: None,
        });
    };
    let acquired: bool = row.try_get("acquired").map_err(decode)?;
    let expires_at: SystemTime = row.try_get("expires_at").map_err(decode)?;
    if !acquired {
        return Ok(Attempt::Busy {
            holder_expires_at: Some(expires_at),
        });
    }
    Ok(Attempt::Acquired(Lease {
        fencing_token: token(row, "fencing_token")?,
        acquired_at: row.try_get("acquired_at").map_err(decode)?,
        expires_at,
    }))
}

/// The outcome of the slot acquire statement (`schema.rs`): at most one row, `acquired` first;
/// a busy row reports the limit of the holders and how many other unexpired slots there are.
pub(crate) fn slot_attempt(rows: &[Row], name: &str, limit: u32) -> Result<Attempt> {
    let Some(row) = rows.first() else {
        return Ok(Attempt::Busy {
            holder_expires_at: None,
        });
    };
    let acquired: bool = row.try_get("acquired").map_err(decode)?;
    let expires_at: Option<SystemTime> = row.try_get("expires_at").map_err(decode)?;
    if acquired {
        return Ok(Attempt::Acquired(Lease {
            fencing_token: token(row, "fencing_token")?,
            acquired_at: row.try_get("acquired_at").map_err(decode)?,
            expires_at: expires_at.ok_or_else(|| {
                Error::backend(
                    "the slot acquire statement returned no expiry",
                    "use a dedicated table that only mongolock writes",
                )
            })?,
        }));
    }
    let held: Option<i32> = row.try_get("slot_limit").map_err(decode)?;
    let live: i64 = row.try_get("live").map_err(decode)?;
    if let Some(held) = held {
        if live > 0 && i64::from(held) != i64::from(limit) {
            return Err(Error::LimitMismatch {
                name: name.to_owned(),
                requested: limit,
                held: u32::try_from(held).unwrap_or(0),
            });
        }
    }
    Ok(Attempt::Busy {
        holder_expires_at: expires_at,
    })
}

/// A row of the holders query.
pub(crate) fn holder(row: &Row) -> Result<LeaseHolder> {
    let host: Option<String> = row.try_get("holder_host").map_err(decode)?;
    let pid: Option<i64> = row.try_get("holder_pid").map_err(decode)?;
    let app: Option<String> = row.try_get("holder_app").map_err(decode)?;
    let lease_id: String = row.try_get("lease_id").map_err(decode)?;
    Ok(LeaseHolder {
        lease_id: LeaseId::from_string(lease_id),
        fencing_token: token(row, "fencing_token")?,
        acquired_at: row.try_get("acquired_at").map_err(decode)?,
        expires_at: row.try_get("expires_at").map_err(decode)?,
        holder: host.map(|host| HolderInfo {
            host,
            pid: pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
            app_name: app,
        }),
    })
}

/// A row of the inspect/list query.
pub(crate) fn info(row: &Row) -> Result<LockInfo> {
    let lease_id: Option<String> = row.try_get("lease_id").map_err(decode)?;
    let host: Option<String> = row.try_get("holder_host").map_err(decode)?;
    let pid: Option<i64> = row.try_get("holder_pid").map_err(decode)?;
    let app: Option<String> = row.try_get("holder_app").map_err(decode)?;
    Ok(LockInfo {
        name: row.try_get("name").map_err(decode)?,
        held: row.try_get("held").map_err(decode)?,
        lease_id: lease_id.map(LeaseId::from_string),
        fencing_token: Some(token(row, "fencing_token")?),
        holder: host.map(|host| HolderInfo {
            host,
            pid: pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
            app_name: app,
        }),
        acquired_at: Some(row.try_get("acquired_at").map_err(decode)?),
        expires_at: Some(row.try_get("expires_at").map_err(decode)?),
        observed_at: row.try_get("observed_at").map_err(decode)?,
    })
}
