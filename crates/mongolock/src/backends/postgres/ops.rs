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

/// How many fencing tokens the `ended` column keeps (as the MongoDB backend's record).
pub(crate) const ENDED_KEPT: i32 = 64;

/// SQL expressions for the `ended` and `ended_from` columns of a write to the row `l` that
/// ends some leases without their holders' release. `all` is the old list with the ended
/// leases' tokens appended (`l.ended || <tokens>`, in the order they ended), given as a column
/// of a `FROM` item so that it is computed once. The list keeps its last [`ENDED_KEPT`]
/// tokens; when some leave it, the floor `ended_from` rises above every token that left.
/// `if_missing` is the floor of a row that has none yet (written by an earlier version): a
/// grant passes a value above every token issued before it, other writes `NULL` (leave it).
/// See [`released_by_holder`] for what the two columns prove.
pub(crate) fn ended_after(all: &str, if_missing: &str) -> (String, String) {
    let n = format!("cardinality({all})");
    let floor = format!("coalesce(l.ended_from, {if_missing})");
    (
        format!(
            "CASE WHEN {n} <= {ENDED_KEPT} THEN {all} ELSE {all}[{n} - {}:] END",
            ENDED_KEPT - 1
        ),
        format!(
            "CASE WHEN {n} <= {ENDED_KEPT} THEN {floor}
                  ELSE greatest({floor},
                                (SELECT max(x) FROM unnest({all}[:{n} - {ENDED_KEPT}]) x) + 1) END"
        ),
    )
}

/// SQL condition on the row `row`: the lease `lease_id` (a `text` expression) with fencing
/// token `token` (a `bigint` expression; `NULL` when the backend no longer knows the token:
/// never true) was ended by its own holder. The check of a release whose `UPDATE` found the
/// lease gone: an earlier try of the same release (whose reply was lost), or a loss?
///
/// Why it is exact, in the safe direction. A lease of the row's current lifetime ends in one
/// of three ways: its holder's release (with or without a minimum hold), a takeover after it
/// expired unreleased (an exclusive or slot grant; or a slot discarded as expired by another
/// slot's grant or release), or a force-release (by name or token). Every takeover, discard and
/// force-release appends the ended lease's token to `ended` in the same `UPDATE` that ends it,
/// under the row lock (never for a lease its holder released with a minimum hold, whose id is
/// in `released`); the list loses entries only together with raising `ended_from` above them.
/// `ended_from` is set when the row is inserted (to its first token) or first granted by this
/// version (above every earlier token), and a row deleted by cleanup and inserted again starts
/// a new lifetime whose tokens, from the table's one sequence, are all above the old ones. So
/// when `ended_from <= token <= fencing_token` (the token belongs to this lifetime) and `token`
/// is not in `ended`, the lease was ended by its holder, provided that the row read shows it
/// ended at all. That proviso matters because the release statement reads the row in its
/// snapshot, which can be older than the version its `UPDATE` found (after waiting for the row
/// lock): if the lease is still current in the snapshot (`lease_id`, or one of the slots),
/// the snapshot cannot say how it ended, and the release reports the loss. (The lease was
/// granted before the release began, so once it ended before the snapshot, the write that
/// ended it, and what it appended to `ended`, is in the snapshot.) Otherwise the release
/// reports the loss: correctly, or spuriously when the token fell below the floor (more than
/// [`ENDED_KEPT`] leases of the name ended by others since), or the row was cleaned up.
pub(crate) fn released_by_holder(row: &str, lease_id: &str, token: &str) -> String {
    format!(
        "({row}.ended_from <= {token} AND {token} <= {row}.fencing_token
          AND NOT ({token} = ANY({row}.ended))
          AND {row}.lease_id IS DISTINCT FROM {lease_id}
          AND NOT ({row}.slot_limit IS NOT NULL AND EXISTS (
                SELECT 1 FROM jsonb_array_elements({row}.slots) s WHERE s->>'id' = {lease_id})))"
    )
}

/// How many retired lease ids a row keeps (the latest).
pub(crate) const RETIRED_KEPT: i32 = 16;

/// The statement that retires the lease id `$2` of the row `$1` before its release: a lease id
/// one of whose attempts failed (its outcome unknown: the statement may still reach the
/// server and be applied later, for instance retransmitted after a partition on a connection
/// the client gave up). Every grant requires that its lease id is not in `retired`, so such a
/// late attempt never grants the id again once it was released; the row keeps the last
/// [`RETIRED_KEPT`]. See `backends/mongo/retired.rs` for the argument, which is the same. It
/// changes neither `lease_id` nor the token, so the trigger publishes nothing.
pub(crate) fn retire_sql(table: &str) -> String {
    format!(
        "UPDATE {table} AS l
            SET retired = (l.retired || $2::text)[greatest(cardinality(l.retired) + 2 - {RETIRED_KEPT}, 1):]
          WHERE l.name = $1::text AND NOT ($2::text = ANY(l.retired))"
    )
}

/// SQL condition on the row `row`: its lease is kept on by its holder's release with a minimum
/// hold (its id is in `released`): ended by its holder, so extensions are refused and a
/// takeover at its end does not count as ending it.
pub(crate) fn kept_on(row: &str) -> String {
    format!("({row}.lease_id = ANY({row}.released))")
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

/// The parameters of the acquire statements, owned.
pub(crate) struct AcquireParams<'a> {
    name: &'a str,
    lease_id: &'a str,
    ttl: i64,
    host: String,
    pid: i64,
    app: Option<String>,
}

/// A statement parameter.
pub(crate) type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

impl<'a> AcquireParams<'a> {
    pub(crate) fn new(req: &'a AcquireRequest) -> Self {
        AcquireParams {
            name: &req.name,
            lease_id: req.lease_id.as_str(),
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

    /// `$1`–`$6` of every acquire statement (name, lease id, TTL in microseconds, host, pid,
    /// application name), followed by `more` (`$7` on).
    pub(crate) fn with<'p>(&'p self, more: &[Param<'p>]) -> Vec<Param<'p>> {
        let mut params: Vec<Param<'p>> = vec![
            &self.name,
            &self.lease_id,
            &self.ttl,
            &self.host,
            &self.pid,
            &self.app,
        ];
        params.extend_from_slice(more);
        params
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
