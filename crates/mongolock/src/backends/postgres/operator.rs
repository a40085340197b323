//! The operator's operations (`crate::operator`) on PostgreSQL: the wait queue and slot limit
//! of a name, lists filtered by prefix on the server, and the conditional force-release by
//! fencing token. Each is one statement, built from the table's names when called (the
//! connection caches the prepared statement by its text).

use std::time::SystemTime;

use super::{ops, PostgresBackend};
use super::{queue, schema};
use crate::backend::LockInfo;
use crate::error::Result;
use crate::holder::HolderInfo;
use crate::operator::{ListFilter, QueuedWaiter};

impl PostgresBackend {
    /// The live entries of `name`'s queue (`waiters`, `queue.rs`), in queue order.
    pub(super) async fn queued(&self, name: &str) -> Result<Vec<QueuedWaiter>> {
        ops::check_name(name)?;
        let sql = format!(
            "SELECT e.w->>'m' AS mark, (e.w->>'u')::timestamptz AS until,
                    e.w->'h'->>'host' AS host, (e.w->'h'->>'pid')::bigint AS pid,
                    e.w->'h'->>'app' AS app
               FROM {t} AS l, jsonb_array_elements(l.waiters) WITH ORDINALITY AS e(w, i)
              WHERE l.name = $1 AND (e.w->>'u')::timestamptz > clock_timestamp()
              ORDER BY e.i",
            t = self.inner.schema.table_sql()
        );
        let rows = self
            .read_query("read the wait queue", &sql, &[&name])
            .await?;
        rows.iter()
            .map(|row| {
                let mark: Option<String> = row.try_get("mark").map_err(ops::decode)?;
                let until: SystemTime = row.try_get("until").map_err(ops::decode)?;
                let host: Option<String> = row.try_get("host").map_err(ops::decode)?;
                let pid: Option<i64> = row.try_get("pid").map_err(ops::decode)?;
                let app: Option<String> = row.try_get("app").map_err(ops::decode)?;
                Ok(QueuedWaiter::new(
                    mark.unwrap_or_default(),
                    host.map(|host| HolderInfo {
                        host,
                        pid: pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
                        app_name: app,
                    }),
                    until,
                ))
            })
            .collect()
    }

    /// The limit of `name` while an unexpired slot holds it.
    pub(super) async fn live_slot_limit(&self, name: &str) -> Result<Option<u32>> {
        ops::check_name(name)?;
        let sql = format!(
            "SELECT slot_limit FROM {t} AS l
              WHERE name = $1 AND slot_limit IS NOT NULL
                AND EXISTS (SELECT 1 FROM jsonb_array_elements(l.slots) s
                             WHERE (s->>'exp')::timestamptz > clock_timestamp())",
            t = self.inner.schema.table_sql()
        );
        let rows = self
            .read_query("read the slot limit", &sql, &[&name])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let limit: Option<i32> = row.try_get("slot_limit").map_err(ops::decode)?;
        Ok(limit.and_then(|l| u32::try_from(l).ok()))
    }

    /// The locks passing `filter`, sorted by name: the prefix selected by the server with a
    /// comparison of the name's first characters (`left(name, n) = prefix`: no character of
    /// the prefix is special, unlike in a `LIKE` pattern), the state judged by the server's
    /// time of the read.
    pub(super) async fn matching(&self, filter: &ListFilter) -> Result<Vec<LockInfo>> {
        let mut all = match filter.prefix_str() {
            None => {
                self.read_query("list", &self.inner.schema.list, &[])
                    .await?
            }
            // No name holds a NUL character (`ops::check_name`).
            Some(prefix) if prefix.contains('\0') => return Ok(Vec::new()),
            Some(prefix) => {
                let sql = format!(
                    "SELECT * FROM ({}) AS x
                      WHERE left(x.name, char_length($1::text)) = $1::text
                      ORDER BY x.name COLLATE \"C\"",
                    self.inner.schema.list
                );
                self.read_query("list", &sql, &[&prefix]).await?
            }
        }
        .iter()
        .map(ops::info)
        .collect::<Result<Vec<_>>>()?;
        all.retain(|i| filter.matches(i));
        Ok(all)
    }

    /// Ends the unexpired lease of `name` with fencing token `token`: the exclusive lease
    /// (handed off like a force-release, `queue.rs`), or the one slot with that token (the
    /// other slots stay; the row takes a new token so that the trigger publishes the change,
    /// as a slot release does). One `UPDATE` whose `WHERE` requires the token and the lease
    /// unexpired by `clock_timestamp()` under the row lock.
    pub(super) async fn end_token(&self, name: &str, token: u64) -> Result<bool> {
        ops::check_name(name)?;
        let Ok(token) = i64::try_from(token) else {
            return Ok(false);
        };
        // With one clock reading `c.now`: the slots kept (the others, unexpired), and the
        // tokens of the slots it ends (that one, and the expired ones it discards), recorded as
        // ended by someone else (`ops::released_by_holder`); the exclusive lease's likewise,
        // unless its holder kept it on.
        let rest = "(SELECT coalesce(jsonb_agg(s), '[]'::jsonb)
                       FROM jsonb_array_elements(l.slots) s
                      WHERE (s->>'token')::bigint IS DISTINCT FROM $2::bigint
                        AND (s->>'exp')::timestamptz > c.now)";
        let (ended, ended_from) = ops::ended_after("e.a", "NULL::bigint");
        let sql = format!(
            "UPDATE {t} AS l SET
               (lease_id, expires_at, fencing_token, slots, waiters, handoff, ended, ended_from) = (
                 SELECT NULL::text,
                        CASE WHEN l.slot_limit IS NULL OR jsonb_array_length(r.rest) = 0
                             THEN least(l.expires_at, clock_timestamp())
                             ELSE (SELECT max((s->>'exp')::timestamptz)
                                     FROM jsonb_array_elements(r.rest) s) END,
                        CASE WHEN l.slot_limit IS NULL THEN l.fencing_token
                             ELSE nextval({seq}) END,
                        CASE WHEN l.slot_limit IS NULL THEN l.slots ELSE r.rest END,
                        CASE WHEN l.slot_limit IS NULL THEN {popped} ELSE l.waiters END,
                        CASE WHEN l.slot_limit IS NULL THEN {designation} ELSE l.handoff END,
                        {ended}, {ended_from}
                   FROM (SELECT clock_timestamp() AS now) c,
                        LATERAL (SELECT {rest} AS rest) r, (SELECT {live} AS live) q,
                        LATERAL (SELECT l.ended || CASE
                                   WHEN l.slot_limit IS NOT NULL THEN {slots_ended}
                                   WHEN {kept_on} THEN '{{}}'::bigint[]
                                   ELSE ARRAY[l.fencing_token] END AS a) e)
              WHERE name = $1
                AND ((l.slot_limit IS NULL AND l.lease_id IS NOT NULL
                      AND l.fencing_token = $2::bigint AND l.expires_at > clock_timestamp())
                  OR (l.slot_limit IS NOT NULL AND EXISTS (
                        SELECT 1 FROM jsonb_array_elements(l.slots) s
                         WHERE (s->>'token')::bigint = $2::bigint
                           AND (s->>'exp')::timestamptz > clock_timestamp())))
              RETURNING 1",
            t = self.inner.schema.table_sql(),
            seq = self.inner.schema.sequence_literal(),
            popped = queue::popped("q.live"),
            designation = queue::designation("q.live", "''", "l.lease_id"),
            live = queue::live("l", "clock_timestamp()"),
            kept_on = ops::kept_on("l"),
            slots_ended = schema::slot_tokens(
                "jsonb_array_elements(l.slots)",
                "((s->>'token')::bigint = $2::bigint OR (s->>'exp')::timestamptz <= c.now)",
            ),
        );
        let rows = self
            .query("force release by token", &sql, &[&name, &token])
            .await?;
        Ok(!rows.is_empty())
    }
}
