//! Where the locks live (schema, table, sequence, notification channels), the SQL of every
//! operation, and the migration that creates them.
//!
//! The migration creates only what is missing, and alters or indexes only a table that is
//! mongolock's: before any DDL, in the same transaction, the table (if one of that name
//! exists) must be an ordinary table with every column of the first version's lock table
//! ([`CORE_COLUMNS`]). Another table of that name (an application's) is refused with
//! [`Error::ForeignCollection`] and left exactly as it was. Only writing operations run the
//! migration; read-only ones never create or alter anything (`Schema::missing_table`,
//! `Schema::outdated_table`, and the backend's `read_query`).

use super::ops::{ended_after, kept_on, released_by_holder};
use super::queue;
use crate::error::{Error, Result};

/// The longest table name accepted: PostgreSQL allows 63 bytes per identifier, and the
/// sequence and index are named after the table with a suffix of up to 13 bytes.
pub(crate) const MAX_TABLE_LEN: usize = 50;

/// The longest schema name PostgreSQL accepts without truncating it.
pub(crate) const MAX_SCHEMA_LEN: usize = 63;

/// Name of the trigger (on the lock table) and of its function (in the lock schema) that
/// publish every change of a lease with `pg_notify`.
const NOTIFY: &str = "mongolock_notify";

/// A comment in the body of the trigger function of this version (bucket channels): a table
/// whose trigger calls an older function (replaced by an older build's migration) is migrated
/// again.
const NOTIFY_VERSION: &str = "mongolock payload v3";

/// The previous version's mark, also in the body of this version's function: builds of that
/// version look for it, and finding it they leave the function alone instead of replacing it
/// with theirs (which publishes on the table channel only). This version publishes everything
/// the previous one did, on the same channel (see [`Schema::ddl`]).
const NOTIFY_VERSION_V2: &str = "mongolock payload v2";

/// How many hex digits of a name's SHA-256 name its notification bucket: 3, so 4096 buckets.
const BUCKET_HEX_DIGITS: usize = 3;

/// The notification bucket of a lock name: the first [`BUCKET_HEX_DIGITS`] hex digits of the
/// SHA-256 of its UTF-8 bytes, exactly as [`bucket_sql`] computes it on the server.
pub(crate) fn bucket(name: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().take(2).map(|b| format!("{b:02x}")).collect();
    hex[..BUCKET_HEX_DIGITS].to_owned()
}

/// The channel of `name`'s bucket for the table channel `channel`:
/// `<channel>_<`[`bucket`]`(name)>` (at most 30 bytes: a plain identifier).
pub(crate) fn bucket_channel(channel: &str, name: &str) -> String {
    format!("{channel}_{}", bucket(name))
}

/// The SQL of [`bucket`] for the `text` expression `name`: `convert_to` gives its UTF-8 bytes
/// whatever the database's encoding, `sha256` (PostgreSQL 11+, a documented builtin that works
/// on FIPS-mode servers, unlike `md5`) hashes them.
fn bucket_sql(name: &str) -> String {
    format!("substr(encode(sha256(convert_to({name}, 'UTF8')), 'hex'), 1, {BUCKET_HEX_DIGITS})")
}

/// The columns of the lock table since its first version: a table named like the lock table
/// without all of them is not mongolock's, and is refused rather than altered.
const CORE_COLUMNS: [&str; 9] = [
    "name",
    "lease_id",
    "fencing_token",
    "acquired_at",
    "expires_at",
    "holder_host",
    "holder_pid",
    "holder_app",
    "released",
];

/// `ident` as a quoted SQL identifier.
fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// `text` as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Checks a schema or table name the way PostgreSQL would (before anything is sent), so a bad
/// name is an [`Error::InvalidOptions`] naming the option.
pub(crate) fn validate(option: &'static str, name: &str, max: usize) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid_option(
            option,
            "the name is empty; use a name such as \"mongolock\"",
        ));
    }
    if name.contains('\0') {
        return Err(Error::invalid_option(
            option,
            "the name contains a NUL character, which PostgreSQL identifiers cannot hold",
        ));
    }
    if name.len() > max {
        return Err(Error::invalid_option(
            option,
            format!(
                "{name:?} is {} bytes; use at most {max} (PostgreSQL truncates identifiers \
                 longer than 63 bytes, and mongolock names the sequence and index after the \
                 table)",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// A stable 64-bit FNV-1a hash (the same in every process and version), naming the
/// notification channel of a table.
fn fnv1a(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes() {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Every name and statement of one lock table, built once per backend.
#[derive(Debug)]
pub(crate) struct Schema {
    /// `schema.table`, unquoted, for messages.
    pub(crate) display: String,
    /// The table channel: `mongolock_` and 16 hex digits of a hash of `schema.table`. Every
    /// change of the table is published on it, and on the channel of the name's bucket,
    /// [`bucket_channel`](Self::bucket_channel).
    pub(crate) channel: String,
    schema_q: String,
    table_q: String,
    sequence_q: String,
    index_q: String,
    pub(crate) acquire: String,
    /// The uncontended shortcut's grant (`$1`–`$6` as [`acquire`](Self::acquire)'s): one row
    /// when granted, none when the row is not in the shortcut's state (see "The uncontended
    /// shortcut" in the backend's module docs).
    pub(crate) acquire_cheap: String,
    /// The slot acquire statement of a semaphore (`$7` = the limit).
    pub(crate) acquire_slot: String,
    pub(crate) extend: String,
    pub(crate) release: String,
    /// The release of a lease granted by the shortcut while nobody queued (`$1` name, `$2`
    /// lease id, `$3` the releasing backend's mark): one row, shaped as
    /// [`release`](Self::release)'s, when it released; none otherwise.
    pub(crate) release_cheap: String,
    /// The release with a minimum hold (`$4` = the minimum hold in microseconds).
    pub(crate) release_after: String,
    pub(crate) force_release: String,
    pub(crate) inspect: String,
    /// Every current holder of `$1`: rows of [`ops::holder`](super::ops::holder).
    pub(crate) holders: String,
    pub(crate) list: String,
    pub(crate) lease_of: String,
    pub(crate) cleanup: String,
}

/// The acquirer's metadata (`$4` host, `$5` pid, `$6` app of the acquire statement) as the
/// `jsonb` object a queue entry stores (`queue.rs`).
const WAITER_HOLDER: &str =
    "jsonb_build_object('host', $4::text, 'pid', $5::bigint, 'app', $6::text)";

/// The fencing tokens (a `bigint[]`, possibly empty) of the slots of `source` (a set-returning
/// expression of slot objects named `s`) that satisfy `cond`.
pub(crate) fn slot_tokens(source: &str, cond: &str) -> String {
    format!(
        "(SELECT coalesce(array_agg((s->>'token')::bigint), '{{}}'::bigint[]) FROM {source} s
           WHERE s->>'token' IS NOT NULL AND {cond})"
    )
}

/// `$n` (microseconds, bigint) as an interval.
fn micros(n: u8) -> String {
    format!("(${n}::bigint * interval '1 microsecond')")
}

impl Schema {
    /// The names and statements for `schema.table` (both already validated).
    pub(crate) fn new(schema: &str, table: &str) -> Schema {
        let schema_q = quote(schema);
        let table_q = format!("{schema_q}.{}", quote(table));
        let sequence_q = format!("{schema_q}.{}", quote(&format!("{table}_fencing_token")));
        let index_q = quote(&format!("{table}_expires_at"));
        let sequence_lit = literal(&sequence_q);
        let t = &table_q;
        let next = format!("nextval({sequence_lit})");
        let ttl = micros(3);
        let columns = "name, lease_id, fencing_token, acquired_at, expires_at, holder_host, \
                       holder_pid, holder_app";
        // The grant is decided once, by `g.ok` (see "Why two holders never overlap" in the
        // module docs); the queue (`queue.rs`: `$7` the backend's mark, `$8` register when
        // busy, `$9` requeue when granted) only rides along. A busy attempt writes nothing (the
        // `WHERE`) unless it registers (`$8`) and its backend is not yet queued for the current
        // holder's expiry; then it rewrites the row with its lease unchanged.
        // Free, or already ours (a retry after a lost reply); never for a retired lease id
        // (a late attempt: `retired_sql`).
        let free = |now: &str| {
            format!(
                "(NOT (EXCLUDED.lease_id = ANY(l.retired))
                  AND ((l.lease_id IS NULL AND l.slot_limit IS NULL) OR l.expires_at <= {now}
                       OR l.lease_id = EXCLUDED.lease_id))"
            )
        };
        let keep = |column: &str, granted: &str| {
            format!("CASE WHEN g.ok THEN {granted} ELSE l.{column} END")
        };
        // The leases a grant ends without their holders' release (`ops::released_by_holder`):
        // a semaphore's slots (all expired, or the grant would not be free), or an expired
        // exclusive lease of someone else that its holder did not keep on.
        let (ended, ended_from) = ended_after("e.a", "CASE WHEN g.ok THEN l.fencing_token + 1 END");
        let ended_by_grant = format!(
            "CASE WHEN NOT g.ok THEN '{{}}'::bigint[]
                  WHEN l.slot_limit IS NOT NULL THEN {slots}
                  WHEN l.lease_id IS NOT NULL AND l.lease_id <> EXCLUDED.lease_id
                       AND NOT {kept_on} THEN ARRAY[l.fencing_token]
                  ELSE '{{}}'::bigint[] END",
            slots = slot_tokens("jsonb_array_elements(l.slots)", "true"),
            kept_on = kept_on("l"),
        );
        let acquire = format!(
            "WITH granted AS (
               INSERT INTO {t} AS l ({columns}, waiters, ended_from)
               SELECT $1::text, $2::text, c.v, c.now, c.now + {ttl}, $4::text, $5::bigint,
                      $6::text, {first}, c.v
                 FROM (SELECT clock_timestamp() AS now, {next} AS v) c
               ON CONFLICT (name) DO UPDATE SET
                 (lease_id, fencing_token, acquired_at, expires_at, holder_host, holder_pid,
                  holder_app, slot_limit, slots, waiters, ended, ended_from) =
                 (SELECT {lease}, {token}, {acquired}, {expires}, {host}, {pid}, {app},
                         CASE WHEN g.ok THEN NULL ELSE l.slot_limit END,
                         CASE WHEN g.ok THEN '[]'::jsonb ELSE l.slots END,
                         CASE WHEN g.ok THEN {after_grant}
                              WHEN $8::boolean THEN {after_busy}
                              ELSE l.waiters END,
                         {ended}, {ended_from}
                    FROM (SELECT c.now, {free_c} AS ok
                            FROM (SELECT clock_timestamp() AS now) c) g,
                         LATERAL (SELECT l.ended || {ended_by_grant} AS a) e)
               WHERE {free_now} OR ($8::boolean AND NOT {queued})
               RETURNING l.lease_id IS NOT DISTINCT FROM $2::text AS acquired, l.fencing_token,
                         l.acquired_at, l.expires_at
             )
             SELECT acquired, fencing_token, acquired_at, expires_at FROM granted
             UNION ALL
             SELECT false, fencing_token, acquired_at, expires_at FROM {t}
              WHERE name = $1 AND (lease_id IS NOT NULL OR slot_limit IS NOT NULL)
                AND NOT EXISTS (SELECT 1 FROM granted)",
            first = queue::first(
                "$7::text",
                &format!("c.now + {ttl}"),
                "$9::boolean",
                WAITER_HOLDER
            ),
            lease = keep("lease_id", "EXCLUDED.lease_id"),
            token = keep("fencing_token", &next),
            acquired = keep("acquired_at", "g.now"),
            expires = keep("expires_at", &format!("g.now + {ttl}")),
            host = keep("holder_host", "EXCLUDED.holder_host"),
            pid = keep("holder_pid", "EXCLUDED.holder_pid"),
            app = keep("holder_app", "EXCLUDED.holder_app"),
            after_grant = queue::after_grant(
                "l",
                "g.now",
                "$7::text",
                &format!("g.now + {ttl}"),
                "$9::boolean",
                WAITER_HOLDER
            ),
            after_busy = queue::after_busy("l", "g.now", "$7::text", WAITER_HOLDER),
            free_c = free("c.now"),
            free_now = free("clock_timestamp()"),
            queued = queue::is_queued("l", "$7::text"),
        );
        // A semaphore's slots (`slot_limit` not null): see "Semaphores" in the backend's
        // module docs.
        let slots_of = |row: &str| {
            format!(
                "jsonb_array_elements(CASE WHEN {row}.slot_limit IS NULL THEN '[]'::jsonb \
                 ELSE {row}.slots END)"
            )
        };
        // The unexpired slots other than the caller's (a retry after a lost reply replaces
        // the caller's earlier slot with a new one).
        let live_where = "(s->>'exp')::timestamptz > clock_timestamp() AND s->>'id' <> $2::text";
        // In the grant, judged with the one clock reading `c.now`: the slots kept, and the
        // tokens of those discarded as expired (ended without their holders' release).
        let live_at_c = format!(
            "(SELECT coalesce(jsonb_agg(s), '[]'::jsonb) FROM {} s
               WHERE (s->>'exp')::timestamptz > c.now AND s->>'id' <> $2::text)",
            slots_of("l")
        );
        let expired_at_c = slot_tokens(&slots_of("l"), "(s->>'exp')::timestamptz <= c.now");
        // An expired exclusive lease taken by the slot (the grant needs it expired), unless
        // its holder kept it on.
        let slot_takes_lease = format!(
            "CASE WHEN l.slot_limit IS NULL AND l.lease_id IS NOT NULL AND NOT {}
                  THEN ARRAY[l.fencing_token] ELSE '{{}}'::bigint[] END",
            kept_on("l")
        );
        let (slot_ended, slot_ended_from) = ended_after("e.a", "l.fencing_token + 1");
        let live_count = |row: &str| {
            format!(
                "(SELECT count(*) FROM {} s WHERE {live_where})",
                slots_of(row)
            )
        };
        let next_exp = |row: &str| {
            format!(
                "(SELECT min((s->>'exp')::timestamptz) FROM {} s WHERE {live_where})",
                slots_of(row)
            )
        };
        let acquire_slot = format!(
            "WITH granted AS (
               INSERT INTO {t} AS l ({columns}, slot_limit, slots, ended_from)
               SELECT $1::text, NULL::text, n.v, c.now, c.now + {ttl}, $4::text, $5::bigint,
                      $6::text, $7::integer,
                      jsonb_build_array(jsonb_build_object('id', $2::text, 'token', n.v,
                        'at', c.now, 'exp', c.now + {ttl}, 'holder', {slot_holder})), n.v
                 FROM (SELECT {next} AS v) n, (SELECT clock_timestamp() AS now) c
               ON CONFLICT (name) DO UPDATE SET
                 (fencing_token, acquired_at, expires_at, slots, lease_id, slot_limit,
                  holder_host, holder_pid, holder_app, ended, ended_from) =
                 (SELECT n.v, c.now, greatest(c.now + {ttl}, l.expires_at),
                         {live_at_c} || jsonb_build_array(jsonb_build_object('id', $2::text,
                           'token', n.v, 'at', c.now, 'exp', c.now + {ttl},
                           'holder', {slot_holder})),
                         NULL::text, EXCLUDED.slot_limit, EXCLUDED.holder_host,
                         EXCLUDED.holder_pid, EXCLUDED.holder_app, {slot_ended}, {slot_ended_from}
                    FROM (SELECT {next} AS v) n, (SELECT clock_timestamp() AS now) c,
                         LATERAL (SELECT l.ended || {expired_at_c} || {slot_takes_lease} AS a) e)
               WHERE NOT (l.slot_limit IS NULL AND l.lease_id IS NOT NULL
                          AND l.expires_at > clock_timestamp())
                 AND NOT ($2::text = ANY(l.retired))
                 AND {count_l} < $7::integer
                 AND ({count_l} = 0 OR l.slot_limit = $7::integer)
               RETURNING l.fencing_token, l.acquired_at, l.acquired_at + {ttl} AS slot_expires_at
             )
             SELECT true AS acquired, fencing_token, acquired_at, slot_expires_at AS expires_at,
                    NULL::integer AS slot_limit, 0::bigint AS live
               FROM granted
             UNION ALL
             SELECT false, fencing_token, acquired_at,
                    CASE WHEN slot_limit IS NULL THEN expires_at ELSE {next_t} END,
                    slot_limit, {count_t}
               FROM {t}
              WHERE name = $1 AND (lease_id IS NOT NULL OR slot_limit IS NOT NULL)
                AND NOT EXISTS (SELECT 1 FROM granted)",
            count_l = live_count("l"),
            slot_holder =
                "jsonb_build_object('host', $4::text, 'pid', $5::bigint, 'app', $6::text)",
            next_t = next_exp(t),
            count_t = live_count(t),
        );
        // Either the exclusive lease or one unexpired slot of the caller.
        let extend = format!(
            "UPDATE {t} AS l SET (expires_at, slots) =
               (SELECT CASE WHEN l.slot_limit IS NULL THEN c.now + {ttl}
                            ELSE greatest(l.expires_at, c.now + {ttl}) END,
                       CASE WHEN l.slot_limit IS NULL THEN l.slots
                            ELSE (SELECT jsonb_agg(CASE WHEN s->>'id' = $2
                                    THEN s || jsonb_build_object('exp', c.now + {ttl})
                                    ELSE s END)
                                    FROM jsonb_array_elements(l.slots) s) END
                  FROM (SELECT clock_timestamp() AS now) c)
              WHERE name = $1
                AND ((l.slot_limit IS NULL AND lease_id = $2 AND expires_at > clock_timestamp()
                      AND NOT {kept_on})
                  OR (l.slot_limit IS NOT NULL AND EXISTS (
                        SELECT 1 FROM jsonb_array_elements(l.slots) s
                         WHERE s->>'id' = $2 AND (s->>'exp')::timestamptz > clock_timestamp())))
              RETURNING CASE WHEN l.slot_limit IS NULL THEN l.expires_at
                             ELSE (SELECT (s->>'exp')::timestamptz
                                     FROM jsonb_array_elements(l.slots) s
                                    WHERE s->>'id' = $2 LIMIT 1) END AS expires_at",
            // A lease kept on by its holder with a minimum hold is never extended.
            kept_on = kept_on("l"),
        );
        // The slots left after the caller's release: the others that have not expired.
        // Judged with one clock reading `c.now`: the slots left after the caller's release (the
        // others that have not expired), and the tokens of the others it discards as expired
        // (ended without their holders' release).
        let rest =
            "(SELECT coalesce(jsonb_agg(s), '[]'::jsonb) FROM jsonb_array_elements(l.slots) s
                      WHERE s->>'id' <> $2 AND (s->>'exp')::timestamptz > c.now)";
        let discarded = slot_tokens(
            "jsonb_array_elements(l.slots)",
            "s->>'id' <> $2 AND (s->>'exp')::timestamptz <= c.now",
        );
        let (release_ended, release_ended_from) = ended_after("e.a", "NULL::bigint");
        // Whether an earlier try of this release ended the lease `$2` (fencing token `$4` or
        // `$5`, as the backend remembers it; `NULL` if it does not).
        let by_holder = |token: &str| {
            format!(
                "EXISTS (SELECT 1 FROM {t} AS l WHERE l.name = $1 AND {})",
                released_by_holder("l", "$2::text", token)
            )
        };
        // An exclusive release also pops the first queued backend into `handoff` (`queue.rs`;
        // `$3` is the releasing backend's mark); a slot's leaves the queue alone.
        let release = format!(
            "WITH ended AS (
               UPDATE {t} AS l SET
                 (lease_id, fencing_token, slots, expires_at, waiters, handoff, released, ended,
                  ended_from) = (
                   SELECT NULL::text,
                          CASE WHEN l.slot_limit IS NULL THEN l.fencing_token ELSE {next} END,
                          CASE WHEN l.slot_limit IS NULL THEN l.slots ELSE r.rest END,
                          CASE WHEN l.slot_limit IS NULL OR jsonb_array_length(r.rest) = 0
                               THEN least(l.expires_at, clock_timestamp())
                               ELSE (SELECT max((s->>'exp')::timestamptz)
                                       FROM jsonb_array_elements(r.rest) s) END,
                          CASE WHEN l.slot_limit IS NULL THEN {popped} ELSE l.waiters END,
                          CASE WHEN l.slot_limit IS NULL THEN {designation} ELSE l.handoff END,
                          '{{}}'::text[], {release_ended}, {release_ended_from}
                     FROM (SELECT clock_timestamp() AS now) c,
                          LATERAL (SELECT {rest} AS rest) r, (SELECT {live} AS live) q,
                          LATERAL (SELECT l.ended || CASE WHEN l.slot_limit IS NULL
                                     THEN '{{}}'::bigint[] ELSE {discarded} END AS a) e)
               WHERE name = $1
                 AND ((l.slot_limit IS NULL AND lease_id = $2)
                   OR (l.slot_limit IS NOT NULL AND EXISTS (
                         SELECT 1 FROM jsonb_array_elements(l.slots) s WHERE s->>'id' = $2)))
               RETURNING l.fencing_token, CASE WHEN l.slot_limit IS NULL THEN l.handoff END AS handoff
             )
             SELECT EXISTS (SELECT 1 FROM ended) OR {by_holder} AS released,
                    (SELECT handoff FROM ended) AS handoff,
                    (SELECT fencing_token FROM ended) AS fencing_token",
            popped = queue::popped("q.live"),
            designation = queue::designation("q.live", "$3::text", "$2::text"),
            by_holder = by_holder("$4::bigint"),
            live = queue::live("l", "clock_timestamp()"),
        );
        // A release with a minimum hold (see "Minimum hold" in the backend's module docs):
        // one UPDATE decides, with one reading of the clock (`h`), between keeping the lease
        // (unexpired, and `acquired_at + $4` ahead: the same lease id, token and holder, the
        // expiry set to that, the id recorded in `released`) and the plain release above.
        // A kept lease is published with `pg_notify` (the trigger publishes only lease id or
        // token changes) as `<token> - <name>`, on the channels the trigger uses (the name's
        // bucket channel and the table channel), so that every waiter retries and learns the
        // new expiry. `is_slot`: the lease id is a semaphore slot's (refused by the caller).
        let channel = format!("mongolock_{:016x}", fnv1a(&format!("{schema}.{table}")));
        let release_after = format!(
            "WITH ended AS (
               UPDATE {t} AS l SET
                 (lease_id, expires_at, waiters, handoff, released) = (
                   SELECT CASE WHEN h.hold THEN l.lease_id ELSE NULL::text END,
                          CASE WHEN h.hold THEN h.until ELSE least(l.expires_at, h.now) END,
                          CASE WHEN h.hold THEN l.waiters ELSE {popped} END,
                          CASE WHEN h.hold THEN l.handoff ELSE {designation} END,
                          CASE WHEN h.hold THEN ARRAY[$2::text] ELSE '{{}}'::text[] END
                     FROM (SELECT c.now, l.acquired_at + {min_hold} AS until,
                                  l.expires_at > c.now AND l.acquired_at + {min_hold} > c.now
                                    AS hold
                             FROM (SELECT clock_timestamp() AS now) c) h,
                          (SELECT {live} AS live) q)
               WHERE name = $1 AND l.slot_limit IS NULL AND lease_id = $2
               RETURNING l.name, l.lease_id IS NOT NULL AS held_on, l.fencing_token, l.handoff
             )
             SELECT EXISTS (SELECT 1 FROM ended) OR {by_holder} AS released,
                    coalesce((SELECT held_on FROM ended), false) AS held_on,
                    (SELECT CASE WHEN held_on THEN NULL ELSE handoff END FROM ended) AS handoff,
                    (SELECT fencing_token FROM ended) AS fencing_token,
                    (SELECT count(*) FROM (
                       SELECT pg_notify({channel_lit} || '_' || {bucket}, fencing_token || ' - ' || name),
                              pg_notify({channel_lit}, fencing_token || ' - ' || name)
                         FROM ended WHERE held_on) n) AS notified,
                    EXISTS (SELECT 1 FROM {t}
                             WHERE name = $1 AND slot_limit IS NOT NULL AND EXISTS (
                                   SELECT 1 FROM jsonb_array_elements(slots) s
                                    WHERE s->>'id' = $2)) AS is_slot",
            popped = queue::popped("q.live"),
            designation = queue::designation("q.live", "$3::text", "$2::text"),
            by_holder = by_holder("$5::bigint"),
            live = queue::live("l", "clock_timestamp()"),
            min_hold = micros(4),
            channel_lit = literal(&channel),
            bucket = bucket_sql("name"),
        );
        // An exclusive lease forced out hands off like a release (by nobody's mark). The leases
        // it ends are recorded: every slot, or the exclusive lease unless its holder kept it on.
        let (forced_ended, forced_ended_from) = ended_after("e.a", "NULL::bigint");
        let force_release = format!(
            "UPDATE {t} AS l SET
               (lease_id, expires_at, fencing_token, slot_limit, slots, waiters, handoff, ended,
                ended_from) = (
                 SELECT NULL::text, least(l.expires_at, clock_timestamp()),
                        CASE WHEN l.slot_limit IS NULL THEN l.fencing_token ELSE {next} END,
                        NULL::integer, '[]'::jsonb,
                        CASE WHEN l.slot_limit IS NULL THEN {popped} ELSE l.waiters END,
                        CASE WHEN l.slot_limit IS NULL THEN {designation} ELSE l.handoff END,
                        {forced_ended}, {forced_ended_from}
                   FROM (SELECT {live} AS live) q,
                        LATERAL (SELECT l.ended || CASE
                                   WHEN l.slot_limit IS NOT NULL THEN {all_slots}
                                   WHEN {kept_on} THEN '{{}}'::bigint[]
                                   ELSE ARRAY[l.fencing_token] END AS a) e)
              WHERE name = $1 AND (lease_id IS NOT NULL OR slot_limit IS NOT NULL)
                AND expires_at > clock_timestamp()
              RETURNING 1",
            popped = queue::popped("q.live"),
            designation = queue::designation("q.live", "''", "l.lease_id"),
            live = queue::live("l", "clock_timestamp()"),
            all_slots = slot_tokens("jsonb_array_elements(l.slots)", "true"),
            kept_on = kept_on("l"),
        );
        let select = format!(
            "SELECT name, lease_id, fencing_token, acquired_at, expires_at, holder_host,
                    holder_pid, holder_app, c.now AS observed_at,
                    ((lease_id IS NOT NULL OR slot_limit IS NOT NULL) AND expires_at > c.now) AS held
               FROM {t}, (SELECT clock_timestamp() AS now) c"
        );
        let inspect = format!("{select} WHERE name = $1");
        // Every current holder: the unexpired slots (semaphore mode), or the unexpired
        // exclusive lease; in grant order.
        let holders = format!(
            "SELECT s->>'id' AS lease_id, (s->>'token')::bigint AS fencing_token,
                    (s->>'at')::timestamptz AS acquired_at, (s->>'exp')::timestamptz AS expires_at,
                    s->'holder'->>'host' AS holder_host, (s->'holder'->>'pid')::bigint AS holder_pid,
                    s->'holder'->>'app' AS holder_app
               FROM {t}, jsonb_array_elements(CASE WHEN slot_limit IS NULL THEN '[]'::jsonb
                                                   ELSE slots END) s
              WHERE name = $1 AND s->>'token' IS NOT NULL
                AND (s->>'exp')::timestamptz > clock_timestamp()
             UNION ALL
             SELECT lease_id, fencing_token, acquired_at, expires_at, holder_host, holder_pid,
                    holder_app
               FROM {t}
              WHERE name = $1 AND slot_limit IS NULL AND lease_id IS NOT NULL
                AND expires_at > clock_timestamp()
             ORDER BY fencing_token"
        );
        let list = format!("{select} ORDER BY name COLLATE \"C\"");
        // Whether `$2` still holds the name: its exclusive lease or one of its slots.
        let lease_of = format!(
            "SELECT lease_id = $2 AND slot_limit IS NULL
                    OR (slot_limit IS NOT NULL AND EXISTS (
                          SELECT 1 FROM jsonb_array_elements(slots) s WHERE s->>'id' = $2))
               FROM {t} WHERE name = $1"
        );
        let cleanup = format!(
            "DELETE FROM {t}
              WHERE (lease_id IS NULL OR expires_at <= clock_timestamp())
                AND expires_at < clock_timestamp() - {}",
            micros(1)
        );
        // The uncontended shortcut (module docs): on a row with no lease, in exclusive mode, with
        // no slots, an empty queue and the record of ended leases started, the full acquire
        // statement writes exactly these columns (no lease ends, so `ended` and `ended_from`
        // stay; the queue stays empty; `slots` is already empty); and the full release of a
        // lease nobody queued for writes exactly those. The token and the time are read in the
        // `SET`'s sub-select, which refers to the row (`WHERE l.lease_id IS NULL`, true on
        // every row the `UPDATE` writes): so it is evaluated for the row, again when a
        // concurrent write makes PostgreSQL re-check the row, and not once per statement
        // before any wait (as an uncorrelated sub-select is: see the module docs).
        let acquire_cheap = format!(
            "UPDATE {t} AS l SET
               (lease_id, fencing_token, acquired_at, expires_at, holder_host, holder_pid,
                holder_app) =
               (SELECT $2::text, {next}, c.now, c.now + {ttl}, $4::text, $5::bigint, $6::text
                  FROM (SELECT clock_timestamp() AS now) c WHERE l.lease_id IS NULL)
             WHERE l.name = $1 AND l.lease_id IS NULL AND l.slot_limit IS NULL
               AND l.slots = '[]'::jsonb AND l.waiters = '[]'::jsonb
               AND l.ended_from IS NOT NULL AND NOT ($2::text = ANY(l.retired))
             RETURNING true AS acquired, l.fencing_token, l.acquired_at, l.expires_at"
        );
        let release_cheap = format!(
            "UPDATE {t} AS l SET
               (lease_id, expires_at, handoff, released) =
               (SELECT NULL::text, least(l.expires_at, clock_timestamp()), {designation},
                       '{{}}'::text[])
             WHERE l.name = $1 AND l.lease_id = $2 AND l.slot_limit IS NULL
               AND l.waiters = '[]'::jsonb AND l.ended_from IS NOT NULL
             RETURNING true AS released, l.handoff, l.fencing_token",
            designation = queue::designation("'[]'::jsonb", "$3::text", "$2::text"),
        );
        Schema {
            display: format!("{schema}.{table}"),
            channel,
            schema_q,
            acquire,
            acquire_cheap,
            acquire_slot,
            extend,
            release,
            release_cheap,
            release_after,
            force_release,
            inspect,
            holders,
            list,
            lease_of,
            cleanup,
            table_q,
            sequence_q,
            index_q,
        }
    }

    /// The channel on which the changes of `name` are published besides the table channel:
    /// the table channel, `_` and the name's [`bucket`].
    pub(crate) fn bucket_channel(&self, name: &str) -> String {
        bucket_channel(&self.channel, name)
    }

    /// The lock table as a quoted SQL name (`"schema"."table"`).
    pub(crate) fn table_sql(&self) -> &str {
        &self.table_q
    }

    /// The sequence of the fencing tokens as an SQL string literal (for `nextval`).
    pub(crate) fn sequence_literal(&self) -> String {
        literal(&self.sequence_q)
    }

    /// Whether the migration already ran (the trigger exists and calls this version's function,
    /// and the table has every column): one query with `$1` = the quoted table name, `$2` =
    /// the trigger name and `$3` = the function's version mark ([`NOTIFY_VERSION`]).
    pub(crate) fn migrated_query(&self) -> (&'static str, String, &'static str, &'static str) {
        (
            "SELECT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
                             WHERE t.tgrelid = to_regclass($1) AND t.tgname = $2
                               AND p.prosrc LIKE '%' || $3 || '%')
                AND (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1)
                      AND attname IN ('slots', 'waiters', 'handoff', 'ended', 'ended_from',
                                      'retired')
                      AND NOT attisdropped) = 6",
            self.table_q.clone(),
            NOTIFY,
            NOTIFY_VERSION,
        )
    }

    /// The advisory lock key that serializes migrations across processes: one per schema,
    /// since the tables of a schema share the schema and the trigger function.
    pub(crate) fn migration_lock_key(&self) -> i64 {
        // Reinterpreting the bits: any 64-bit value is a valid advisory lock key.
        fnv1a(&format!("mongolock-migrate:{}", self.schema_q)) as i64
    }

    /// One query reporting which objects exist: schema, sequence, table, index, trigger, the
    /// semaphore columns, the queue columns (seven booleans, in that order); then whether the
    /// table, if it exists, is mongolock's ([`OURS`](Self::OURS)); then whether it has the
    /// columns of the record of ended leases; then whether it has the retired lease ids.
    pub(crate) fn existing_query(&self) -> String {
        let s = &self.schema_q;
        let core = CORE_COLUMNS
            .iter()
            .map(|c| literal(c))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "SELECT to_regnamespace({}) IS NOT NULL, to_regclass({}) IS NOT NULL,
                    to_regclass({}) IS NOT NULL, to_regclass({}) IS NOT NULL,
                    EXISTS (SELECT 1 FROM pg_trigger
                             WHERE tgrelid = to_regclass({}) AND tgname = {}),
                    EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass({})
                             AND attname = 'slots' AND NOT attisdropped),
                    (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass({})
                      AND attname IN ('waiters', 'handoff') AND NOT attisdropped) = 2,
                    to_regclass({t}) IS NULL
                      OR ((SELECT relkind FROM pg_class WHERE oid = to_regclass({t})) = 'r'
                          AND (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass({t})
                                AND attname IN ({core}) AND NOT attisdropped) = {n}),
                    (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass({t})
                      AND attname IN ('ended', 'ended_from') AND NOT attisdropped) = 2,
                    EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass({t})
                             AND attname = 'retired' AND NOT attisdropped)",
            literal(s),
            literal(&self.sequence_q),
            literal(&self.table_q),
            literal(&format!("{s}.{}", self.index_q)),
            literal(&self.table_q),
            literal(NOTIFY),
            literal(&self.table_q),
            literal(&self.table_q),
            t = literal(&self.table_q),
            n = CORE_COLUMNS.len(),
        )
    }

    /// The index of the flag of [`existing_query`](Self::existing_query) that says the table is
    /// absent or mongolock's: an ordinary table with every column of
    /// [`CORE_COLUMNS`]. A table that is not is never altered (the migration refuses it with
    /// [`Error::ForeignCollection`]).
    pub(crate) const OURS: usize = 7;

    /// The index of the flag of [`existing_query`](Self::existing_query) that says the table
    /// exists.
    pub(crate) const TABLE: usize = 2;

    /// The error of a read-only operation that found no table (or no schema): reads never
    /// create it.
    pub(crate) fn missing_table(&self) -> Error {
        Error::MissingLockTable {
            table: self.display.clone(),
            fix: "Check the schema and table name (the CLI's --collection [SCHEMA.]TABLE, \
                  PostgresBackend::builder(..).schema(..).table(..)); the table is created by \
                  the first acquisition (such as `mongolock exec`) or by \
                  PostgresBackend::migrate"
                .to_owned(),
        }
    }

    /// The error of a read-only operation on a lock table made by an older version, which
    /// lacks columns the read needs: reads never alter it.
    pub(crate) fn outdated_table(&self, detail: &str) -> Error {
        Error::backend(
            format!(
                "read {}: the table was created by an older version of mongolock and lacks \
                 columns this version reads ({detail})",
                self.display
            ),
            "upgrade it once: PostgresBackend::migrate, or any acquisition by this version \
             (such as `mongolock exec`), adds the missing columns and keeps the rows; \
             read-only operations never alter the table",
        )
    }

    /// The error for a lock table that is not mongolock's.
    pub(crate) fn foreign_table(&self) -> Error {
        Error::ForeignCollection {
            namespace: self.display.clone(),
            found: format!(
                "the table exists but is not a mongolock lock table (it lacks some of the \
                 columns {})",
                CORE_COLUMNS.join(", ")
            ),
            fix: "Choose another table (the default is public.mongolock_locks; the CLI's \
                  --collection [SCHEMA.]TABLE, PostgresBackend::builder(..).table(..)); \
                  mongolock creates its table itself and never alters one it did not create"
                .to_owned(),
        }
    }

    /// The DDL statements, in order, each with the index of the flag of
    /// [`existing_query`](Self::existing_query) that says it is not needed (`None`: always
    /// run). Run in one transaction under [`migration_lock_key`](Self::migration_lock_key).
    /// Only missing objects are created, so a migration of a table in use takes no lock on it
    /// (which could deadlock with lock operations that already hold a weaker one).
    pub(crate) fn ddl(&self) -> Vec<(Option<usize>, String)> {
        let (s, t, seq, idx) = (
            &self.schema_q,
            &self.table_q,
            &self.sequence_q,
            &self.index_q,
        );
        let function = format!("{s}.{}", quote(NOTIFY));
        vec![
            (Some(0), format!("CREATE SCHEMA IF NOT EXISTS {s}")),
            (
                Some(1),
                format!("CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 NO CYCLE"),
            ),
            (
                Some(2),
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                       name text PRIMARY KEY,
                       lease_id text,
                       fencing_token bigint NOT NULL,
                       acquired_at timestamptz NOT NULL,
                       expires_at timestamptz NOT NULL,
                       holder_host text,
                       holder_pid bigint,
                       holder_app text,
                       released text[] NOT NULL DEFAULT '{{}}'
                     )"
                ),
            ),
            // Semaphores (added after the first release: tables created before get them here).
            (
                Some(5),
                format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS slot_limit integer,
                       ADD COLUMN IF NOT EXISTS slots jsonb NOT NULL DEFAULT '[]'"
                ),
            ),
            // The handoff queue (`queue.rs`; added after semaphores, likewise).
            (
                Some(6),
                format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS waiters jsonb NOT NULL DEFAULT '[]',
                       ADD COLUMN IF NOT EXISTS handoff text"
                ),
            ),
            // The record of leases ended by someone other than their holder
            // (`ops::released_by_holder`; added after the queue). Rows written before have no
            // floor (`ended_from`): their next grant sets it.
            (
                Some(8),
                format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS ended bigint[] NOT NULL DEFAULT '{{}}',
                       ADD COLUMN IF NOT EXISTS ended_from bigint"
                ),
            ),
            // Retired lease ids (`ops::retire_sql`; added after the record of ended leases).
            (
                Some(9),
                format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS retired text[] NOT NULL DEFAULT '{{}}'"),
            ),
            (
                Some(3),
                format!("CREATE INDEX IF NOT EXISTS {idx} ON {t} (expires_at)"),
            ),
            // Payload: `<token> <lease id, or - for none> <name>`, and for a release with a
            // new designation `<token>/<designated mark>/<releasing mark> - <name>`
            // (`queue.rs`); a deleted row reports no lease. Extensions and queue registrations
            // (neither lease id nor token changes) publish nothing. Each payload goes to the
            // channel of the name's bucket (`<table channel>_<bucket>`, which this version's
            // backends listen on: `listen.rs`) and to the table channel (`TG_ARGV[0]`, which
            // earlier versions listen on, and a backend that uses too many names to listen on
            // their buckets). The function is shared by the tables of the schema, so it reads
            // `handoff` through `to_jsonb`, which also works for a table that does not have the
            // column yet.
            (
                None,
                format!(
                    "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $fn$
                     DECLARE
                       h text;
                       d text := '';
                       p text;
                       n text;
                     BEGIN
                       -- {NOTIFY_VERSION}: bucket channels, and everything {NOTIFY_VERSION_V2}
                       -- published on the table channel
                       IF TG_OP = 'DELETE' THEN
                         n := OLD.name;
                         p := OLD.fencing_token || ' - ' || n;
                       ELSE
                         IF TG_OP = 'UPDATE' THEN
                           IF OLD.lease_id IS NOT DISTINCT FROM NEW.lease_id
                              AND OLD.fencing_token = NEW.fencing_token THEN
                             RETURN NEW;
                           END IF;
                           h := to_jsonb(NEW)->>'handoff';
                           IF h IS NOT NULL AND h IS DISTINCT FROM to_jsonb(OLD)->>'handoff' THEN
                             d := '/' || split_part(h, '/', 1) || '/' || split_part(h, '/', 2);
                           END IF;
                         END IF;
                         n := NEW.name;
                         p := NEW.fencing_token || d || ' ' || coalesce(NEW.lease_id, '-') || ' ' || n;
                       END IF;
                       PERFORM pg_notify(TG_ARGV[0] || '_' || {bucket}, p);
                       PERFORM pg_notify(TG_ARGV[0], p);
                       IF TG_OP = 'DELETE' THEN
                         RETURN OLD;
                       END IF;
                       RETURN NEW;
                     END
                     $fn$",
                    bucket = bucket_sql("n"),
                ),
            ),
            (
                Some(4),
                format!(
                    "CREATE TRIGGER {} AFTER INSERT OR UPDATE OR DELETE ON {t}
                       FOR EACH ROW EXECUTE FUNCTION {function}({})",
                    quote(NOTIFY),
                    literal(&self.channel)
                ),
            ),
        ]
    }

    /// Takes the table lock that keeps cleanup apart from every lock write (see the module
    /// docs: why tokens survive cleanup).
    pub(crate) fn cleanup_lock(&self) -> String {
        format!("LOCK TABLE {} IN SHARE MODE", self.table_q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_and_checked() {
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
        assert_eq!(literal("it's"), "'it''s'");
        assert!(validate("table", "locks", MAX_TABLE_LEN).is_ok());
        assert!(validate("table", "", MAX_TABLE_LEN).is_err());
        assert!(validate("table", "a\0b", MAX_TABLE_LEN).is_err());
        assert!(validate("table", &"x".repeat(51), MAX_TABLE_LEN).is_err());
        let s = Schema::new("my schema", "Locks");
        assert_eq!(s.table_q, "\"my schema\".\"Locks\"");
        assert!(s.channel.starts_with("mongolock_") && s.channel.len() == 26);
        assert_eq!(s.channel, Schema::new("my schema", "Locks").channel);
        assert_ne!(s.channel, Schema::new("my schema", "locks").channel);
    }

    #[test]
    fn buckets_are_the_first_hex_digits_of_sha256() {
        // sha256('') = e3b0c442..., sha256('abc') = ba7816bf... (FIPS 180-2 test vectors).
        assert_eq!(bucket(""), "e3b");
        assert_eq!(bucket("abc"), "ba7");
        let s = Schema::new("public", "locks");
        assert_eq!(s.bucket_channel("abc"), format!("{}_ba7", s.channel));
        // A channel is an identifier: at most 63 bytes.
        assert!(s.bucket_channel("abc").len() <= 63);
        assert!(bucket_sql("n").contains("sha256(convert_to(n, 'UTF8'))"));
    }
}
