//! `--backend postgres`: the independent history, the fenced resource and the connection
//! faults on PostgreSQL.
//!
//! * **History.** Before any worker starts, the orchestrator installs, in the run's schema, a
//!   table [`LOCK_HISTORY`] and an `AFTER INSERT OR UPDATE OR DELETE ... FOR EACH ROW` trigger on
//!   the lock table that appends every row change to it: a `bigserial` sequence number, the
//!   operation, `clock_timestamp()`, the name, the old and new lease id and token, the new
//!   `acquired_at` / `expires_at`, the holder's application name and the semaphore columns
//!   `slot_limit` and `slots` (an update that changes none of the lease's or the slots'
//!   columns, only the library's handoff queue, is left out). The trigger is the
//!   harness's SQL, not the library's, and relies only on the table's documented columns. It
//!   runs in the transaction of the change, so the history holds exactly the committed changes.
//!   The lock statement holds the row lock of the name while the trigger draws the sequence
//!   number, and the next write of that name waits for that lock, so sequence order is write
//!   order per name (a deletion by cleanup excludes every lock write by a table lock). After
//!   the run the history is read in sequence order into [`LockHistory::apply_state`] and the
//!   checker, with microsecond times, and each row's slots (`{id, token, at, exp, holder}`)
//!   into [`SlotHistory::apply_state`], as the MongoDB recorder's are. The row keeps no mark
//!   of which slot a release removed (in slot mode `lease_id` stays null and every slot grant
//!   or release draws a new `fencing_token`): the release is inferred from the write
//!   ([`SlotRelease::Inferred`]).
//! * **Resource.** A table [`RESOURCE_TABLE`] with one row per name, `max_token` and the last
//!   accepted write. A fenced write is one `INSERT ... ON CONFLICT DO UPDATE ... WHERE
//!   max_token <= token`: accepted only when its token is at least every token accepted
//!   before. A trigger logs every accepted write (a refused one changes no row) into
//!   [`RESOURCE_HISTORY`], read after the run in sequence order.
//! * **Faults.** `pg_terminate_backend` of a random worker connection: a listening one
//!   (`application_name` ending in ` (listen)`, set by the library) or a pooled one.

use std::path::Path;
use std::time::Duration;

use mongolock::PostgresBackend;
use rand::Rng;
use tokio_postgres::{Client, Config, NoTls};

use crate::checker::{AcceptedWrite, Checker, SlotEvent};
use crate::config::{LOCK_COLLECTION, WORKER_APP_NAME};
use crate::history::{LockHistory, LockState, SlotEntry, SlotHistory, SlotRelease, SlotState};
use crate::resource::FencedWrite;
use crate::worker::system_us;

/// History of the lock table's row changes (filled by the harness's trigger).
pub const LOCK_HISTORY: &str = "lock_history";
/// The fenced resource.
pub const RESOURCE_TABLE: &str = "resource";
/// History of the resource's accepted writes (filled by the harness's trigger).
pub const RESOURCE_HISTORY: &str = "resource_history";

type AnyError = Box<dyn std::error::Error + Send + Sync>;

/// `ident` as a quoted SQL identifier.
pub fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Parses `url` and sets the connection's `application_name` (and a connect timeout when the
/// URL has none).
pub fn config(url: &str, app: &str) -> Result<Config, AnyError> {
    let mut config: Config = url
        .parse()
        .map_err(|e| format!("not a PostgreSQL URL ({e}): {url}"))?;
    config.application_name(app);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    Ok(config)
}

/// Opens one connection (its connection task runs in the background).
pub async fn connect(config: &Config) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Creates the run's schema and lock table (with the library's own migration, as a user would)
/// and installs the harness's history tables, triggers and resource.
pub async fn install(client: &Client, url: &str, schema: &str) -> Result<(), AnyError> {
    let s = quote(schema);
    client
        .batch_execute(&format!("CREATE SCHEMA {s}"))
        .await
        .map_err(|e| format!("create schema {schema}: {e}"))?;
    PostgresBackend::builder_with_config(config(url, "torture-control")?)
        .schema(schema)
        .table(LOCK_COLLECTION)
        .notifications(false)
        .cleanup_every(None)
        .build()?
        .migrate()
        .await?;
    let locks = format!("{s}.{}", quote(LOCK_COLLECTION));
    let history = format!("{s}.{}", quote(LOCK_HISTORY));
    let resource = format!("{s}.{}", quote(RESOURCE_TABLE));
    let resource_history = format!("{s}.{}", quote(RESOURCE_HISTORY));
    let sql = format!(
        "CREATE TABLE {history} (
           seq bigserial PRIMARY KEY,
           op text NOT NULL,
           at timestamptz NOT NULL,
           name text NOT NULL,
           old_lease text,
           new_lease text,
           old_token bigint,
           new_token bigint,
           acquired_at timestamptz,
           expires_at timestamptz,
           holder_app text,
           slot_limit integer,
           slots jsonb
         );
         CREATE FUNCTION {s}.torture_record_lock() RETURNS trigger LANGUAGE plpgsql AS $fn$
         BEGIN
           IF TG_OP = 'DELETE' THEN
             INSERT INTO {history} (op, at, name, old_lease, old_token, expires_at)
               VALUES ('delete', clock_timestamp(), OLD.name, OLD.lease_id, OLD.fencing_token,
                       OLD.expires_at);
             RETURN OLD;
           ELSIF TG_OP = 'UPDATE' AND OLD.lease_id IS NOT DISTINCT FROM NEW.lease_id
                 AND OLD.fencing_token = NEW.fencing_token
                 AND OLD.expires_at = NEW.expires_at AND OLD.acquired_at = NEW.acquired_at
                 AND OLD.slot_limit IS NOT DISTINCT FROM NEW.slot_limit
                 AND OLD.slots IS NOT DISTINCT FROM NEW.slots THEN
             -- Nothing of the lease or the slots changed (a busy attempt queued its
             -- process): no history.
             RETURN NEW;
           ELSIF TG_OP = 'UPDATE' THEN
             INSERT INTO {history} (op, at, name, old_lease, new_lease, old_token, new_token,
                                    acquired_at, expires_at, holder_app, slot_limit, slots)
               VALUES ('update', clock_timestamp(), NEW.name, OLD.lease_id, NEW.lease_id,
                       OLD.fencing_token, NEW.fencing_token, NEW.acquired_at, NEW.expires_at,
                       NEW.holder_app, NEW.slot_limit, NEW.slots);
           ELSE
             INSERT INTO {history} (op, at, name, new_lease, new_token, acquired_at,
                                    expires_at, holder_app, slot_limit, slots)
               VALUES ('insert', clock_timestamp(), NEW.name, NEW.lease_id, NEW.fencing_token,
                       NEW.acquired_at, NEW.expires_at, NEW.holder_app, NEW.slot_limit,
                       NEW.slots);
           END IF;
           RETURN NEW;
         END
         $fn$;
         CREATE TRIGGER torture_record AFTER INSERT OR UPDATE OR DELETE ON {locks}
           FOR EACH ROW EXECUTE FUNCTION {s}.torture_record_lock();
         CREATE TABLE {resource} (
           name text PRIMARY KEY,
           max_token bigint NOT NULL,
           last_write_id text NOT NULL,
           last_worker text NOT NULL
         );
         CREATE TABLE {resource_history} (
           seq bigserial PRIMARY KEY,
           at timestamptz NOT NULL,
           name text NOT NULL,
           token bigint NOT NULL,
           write_id text NOT NULL,
           worker text NOT NULL
         );
         CREATE FUNCTION {s}.torture_record_write() RETURNS trigger LANGUAGE plpgsql AS $fn$
         BEGIN
           INSERT INTO {resource_history} (at, name, token, write_id, worker)
             VALUES (clock_timestamp(), NEW.name, NEW.max_token, NEW.last_write_id,
                     NEW.last_worker);
           RETURN NEW;
         END
         $fn$;
         CREATE TRIGGER torture_record AFTER INSERT OR UPDATE ON {resource}
           FOR EACH ROW EXECUTE FUNCTION {s}.torture_record_write();"
    );
    client
        .batch_execute(&sql)
        .await
        .map_err(|e| format!("install the history triggers in {schema}: {e}"))?;
    Ok(())
}

/// Drops the run's schema (after a clean run on a server that is not the run's own).
pub async fn drop_schema(client: &Client, schema: &str) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(&format!("DROP SCHEMA {} CASCADE", quote(schema)))
        .await
}

/// Counts grants in the history while the run goes on (for progress and `--acquisitions`).
/// Rows are counted for good only once they are older than the previous poll's newest row
/// (a lock statement's transaction is open for milliseconds, so by then every row below that
/// sequence number has committed); newer rows are counted again at each poll. The final reading
/// of the history takes everything either way.
pub struct Progress {
    schema: String,
    /// Rows up to this sequence number are counted in `settled`.
    settled_upto: i64,
    settled: u64,
    /// The newest sequence number seen at the previous poll.
    newest: i64,
}

impl Progress {
    /// Nothing counted yet.
    pub fn new(schema: &str) -> Self {
        Progress {
            schema: schema.to_owned(),
            settled_upto: 0,
            settled: 0,
            newest: 0,
        }
    }

    /// Reads the rows not yet settled; returns the grants counted so far.
    pub async fn poll(&mut self, client: &Client) -> Result<u64, tokio_postgres::Error> {
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*) FILTER (WHERE grant_row),
                            count(*) FILTER (WHERE grant_row AND seq <= $2),
                            coalesce(max(seq), 0)
                       FROM (SELECT seq, new_lease IS NOT NULL
                                         AND new_lease IS DISTINCT FROM old_lease AS grant_row
                               FROM {}.{} WHERE seq > $1) h",
                    quote(&self.schema),
                    quote(LOCK_HISTORY)
                ),
                &[&self.settled_upto, &self.newest],
            )
            .await?;
        let count = |i: usize| -> Result<u64, tokio_postgres::Error> {
            Ok(u64::try_from(row.try_get::<_, i64>(i)?).unwrap_or(0))
        };
        let (all, settling) = (count(0)?, count(1)?);
        let total = self.settled + all;
        self.settled += settling;
        self.settled_upto = self.settled_upto.max(self.newest);
        self.newest = self.newest.max(row.try_get(2)?);
        Ok(total)
    }
}

/// What the final reading of the histories found.
#[derive(Debug, Default, Clone, Copy)]
pub struct HistoryTotals {
    /// Rows of the lock history.
    pub rows: u64,
    /// Grants (a new lease id written).
    pub grants: u64,
    /// Rows deleted by cleanup.
    pub deletes: u64,
    /// Semaphore slots granted (each grant and each retry that replaced its own slot).
    pub slot_grants: u64,
}

fn token(v: Option<i64>, what: &str) -> Result<Option<u64>, AnyError> {
    v.map(|t| u64::try_from(t).map_err(|_| format!("negative {what} {t} in the history").into()))
        .transpose()
}

/// The lock history in sequence order, with each row's `slots` taken apart into arrays (in
/// stored order) of the documented fields `id`, `token`, `at`, `exp` and `holder.app`.
fn lock_history_query(schema: &str) -> String {
    format!(
        "SELECT h.op, h.at, h.name, h.new_lease, h.new_token, h.acquired_at, h.expires_at,
                h.holder_app, h.slot_limit, sl.ids AS slot_ids, sl.tokens AS slot_tokens,
                sl.ats AS slot_ats, sl.exps AS slot_exps, sl.holders AS slot_holders
           FROM {}.{} h
           LEFT JOIN LATERAL (
             SELECT array_agg(e.s->>'id' ORDER BY e.i) AS ids,
                    array_agg((e.s->>'token')::bigint ORDER BY e.i) AS tokens,
                    array_agg((e.s->>'at')::timestamptz ORDER BY e.i) AS ats,
                    array_agg((e.s->>'exp')::timestamptz ORDER BY e.i) AS exps,
                    array_agg(e.s->'holder'->>'app' ORDER BY e.i) AS holders
               FROM jsonb_array_elements(CASE WHEN jsonb_typeof(h.slots) = 'array'
                                              THEN h.slots ELSE '[]'::jsonb END)
                    WITH ORDINALITY AS e(s, i)) sl ON true
          ORDER BY h.seq",
        quote(schema),
        quote(LOCK_HISTORY)
    )
}

/// The lock fields of a lock history row (not a deletion).
fn lock_state(row: &tokio_postgres::Row) -> Result<LockState, AnyError> {
    let at = |col: &str| -> Result<Option<i64>, tokio_postgres::Error> {
        let t: Option<std::time::SystemTime> = row.try_get(col)?;
        Ok(t.map(system_us))
    };
    Ok(LockState {
        lease: row.try_get("new_lease")?,
        token: token(row.try_get("new_token")?, "fencing token")?,
        acquired_us: at("acquired_at")?,
        expires_us: at("expires_at")?,
        holder: row
            .try_get::<_, Option<String>>("holder_app")?
            .unwrap_or_default(),
    })
}

/// The semaphore fields of a lock history row (not a deletion): `slot_limit` and the slots,
/// the release inferred from the write ([`SlotRelease::Inferred`], at the trigger's time).
fn slot_state(row: &tokio_postgres::Row) -> Result<SlotState, AnyError> {
    let limit: Option<i32> = row.try_get("slot_limit")?;
    let at: std::time::SystemTime = row.try_get("at")?;
    let ids: Vec<Option<String>> = row.try_get::<_, Option<_>>("slot_ids")?.unwrap_or_default();
    let tokens: Vec<Option<i64>> = row
        .try_get::<_, Option<_>>("slot_tokens")?
        .unwrap_or_default();
    let times = |col: &str| -> Result<Vec<Option<i64>>, tokio_postgres::Error> {
        let t: Option<Vec<Option<std::time::SystemTime>>> = row.try_get(col)?;
        Ok(t.unwrap_or_default()
            .into_iter()
            .map(|t| t.map(system_us))
            .collect())
    };
    let (ats, exps) = (times("slot_ats")?, times("slot_exps")?);
    let holders: Vec<Option<String>> = row
        .try_get::<_, Option<_>>("slot_holders")?
        .unwrap_or_default();
    let mut slots = Vec::new();
    for (i, id) in ids.into_iter().enumerate() {
        // An element without an id is not a slot (the documented shape has one).
        let Some(id) = id else { continue };
        slots.push(SlotEntry {
            id,
            token: token(tokens.get(i).copied().flatten(), "slot token")?,
            at_us: ats.get(i).copied().flatten(),
            exp_us: exps.get(i).copied().flatten(),
            holder: holders.get(i).cloned().flatten().unwrap_or_default(),
        });
    }
    Ok(SlotState {
        limit: limit.and_then(|l| u64::try_from(l).ok()),
        slots,
        release: SlotRelease::Inferred {
            write_us: system_us(at),
        },
    })
}

/// Reads both histories, in sequence order, into `checker`: each lock history row's lock
/// columns into a [`LockHistory`] (grants), its `slot_limit` and `slots` into a
/// [`SlotHistory`] (semaphore slots; rows of exclusive locks have none).
pub async fn read_histories(
    client: &Client,
    schema: &str,
    checker: &mut Checker,
) -> Result<HistoryTotals, AnyError> {
    let s = quote(schema);
    let rows = client.query(&lock_history_query(schema), &[]).await?;
    let mut history = LockHistory::new(None);
    let mut slots = SlotHistory::new();
    let mut totals = HistoryTotals {
        rows: rows.len() as u64,
        ..HistoryTotals::default()
    };
    for row in &rows {
        let op: String = row.try_get("op")?;
        let name: String = row.try_get("name")?;
        let (state, slots_written) = if op == "delete" {
            (None, None)
        } else {
            (Some(lock_state(row)?), Some(slot_state(row)?))
        };
        for grant in history.apply_state(&name, state) {
            checker.grant(grant);
        }
        for event in slots.apply_state(&name, slots_written) {
            if matches!(event, SlotEvent::Granted { .. }) {
                totals.slot_grants += 1;
            }
            checker.slot(event);
        }
    }
    for grant in history.finish() {
        checker.grant_ended_unknown(grant);
    }
    totals.grants = history.grants_opened();
    totals.deletes = history.deletes();
    let writes = client
        .query(
            &format!(
                "SELECT name, token, write_id, worker, at FROM {s}.{} ORDER BY seq",
                quote(RESOURCE_HISTORY)
            ),
            &[],
        )
        .await?;
    for row in &writes {
        let at: std::time::SystemTime = row.try_get("at")?;
        checker.accepted_write(AcceptedWrite {
            name: row.try_get("name")?,
            token: token(Some(row.try_get("token")?), "resource token")?.unwrap_or(0),
            write_id: row.try_get("write_id")?,
            worker: row.try_get("worker")?,
            at_us: system_us(at),
        });
    }
    Ok(totals)
}

/// Writes the lock history as tab-separated lines, for diagnosing violations.
pub async fn dump_history(client: &Client, schema: &str, path: &Path) -> Result<(), AnyError> {
    let rows = client
        .query(
            &format!(
                "SELECT seq, op, at::text, name, old_lease, new_lease, old_token, new_token,
                        acquired_at::text, expires_at::text, holder_app, slot_limit::text,
                        slots::text
                   FROM {}.{} ORDER BY seq",
                quote(schema),
                quote(LOCK_HISTORY)
            ),
            &[],
        )
        .await?;
    let mut text = String::from(
        "seq\top\tat\tname\told_lease\tnew_lease\told_token\tnew_token\tacquired_at\texpires_at\tholder_app\tslot_limit\tslots\n",
    );
    for row in &rows {
        let cols: Vec<String> = (0..row.len())
            .map(|i| {
                row.try_get::<_, Option<String>>(i)
                    .ok()
                    .flatten()
                    .or_else(|| {
                        row.try_get::<_, Option<i64>>(i)
                            .ok()
                            .flatten()
                            .map(|v| v.to_string())
                    })
                    .unwrap_or_else(|| "-".into())
            })
            .collect();
        text.push_str(&cols.join("\t"));
        text.push('\n');
    }
    std::fs::write(path, text)?;
    Ok(())
}

/// Leases held now (server time): name, lease id, expiry (µs); exclusive leases and semaphore
/// slots (by slot id).
pub async fn still_held(
    client: &Client,
    schema: &str,
) -> Result<Vec<(String, String, i64)>, AnyError> {
    let rows = client
        .query(
            &format!(
                "SELECT name, lease_id, expires_at FROM {t}
                  WHERE lease_id IS NOT NULL AND expires_at > clock_timestamp()
                 UNION ALL
                 SELECT l.name, coalesce(s->>'id', '?'), (s->>'exp')::timestamptz
                   FROM {t} l, jsonb_array_elements(CASE WHEN jsonb_typeof(l.slots) = 'array'
                                                        THEN l.slots ELSE '[]'::jsonb END) s
                  WHERE l.slot_limit IS NOT NULL
                    AND (s->>'exp')::timestamptz > clock_timestamp()",
                t = format!("{}.{}", quote(schema), quote(LOCK_COLLECTION))
            ),
            &[],
        )
        .await?;
    let mut held = Vec::new();
    for row in &rows {
        let expires: std::time::SystemTime = row.try_get("expires_at")?;
        held.push((
            row.try_get("name")?,
            row.try_get("lease_id")?,
            system_us(expires),
        ));
    }
    Ok(held)
}

/// Terminates one random worker connection: a listening one (`listener`) or a pooled one.
/// Returns whether a connection was terminated (there may be none at that moment).
pub async fn terminate(
    client: &Client,
    listener: bool,
    rng: &mut impl Rng,
) -> Result<bool, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT pid FROM pg_stat_activity
              WHERE application_name LIKE $1 || ' %'
                AND (application_name LIKE '% (listen)') = $2
                AND pid <> pg_backend_pid()",
            &[&WORKER_APP_NAME, &listener],
        )
        .await?;
    if rows.is_empty() {
        return Ok(false);
    }
    let pid: i32 = rows[rng.random_range(0..rows.len())].try_get(0)?;
    let row = client
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await?;
    row.try_get(0)
}

/// A worker's connection to the resource (reconnected after an error closed it); writes are
/// serialized on it.
pub struct PgResource {
    config: Config,
    sql: String,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl PgResource {
    /// The resource of `schema`, reached with `config` (not a worker lock connection: faults
    /// do not aim at it).
    pub fn new(mut config: Config, schema: &str) -> Self {
        config.options("-c statement_timeout=10000");
        let sql = format!(
            "INSERT INTO {}.{} AS r (name, max_token, last_write_id, last_worker)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (name) DO UPDATE SET max_token = EXCLUDED.max_token,
               last_write_id = EXCLUDED.last_write_id, last_worker = EXCLUDED.last_worker
             WHERE r.max_token <= EXCLUDED.max_token
             RETURNING 1",
            quote(schema),
            quote(RESOURCE_TABLE)
        );
        PgResource {
            config,
            sql,
            client: tokio::sync::Mutex::new(None),
        }
    }

    /// Sends a fenced write; `Ok(true)` when the resource accepted it.
    pub async fn write(&self, w: &FencedWrite) -> Result<bool, String> {
        let token =
            i64::try_from(w.token).map_err(|_| format!("token {} exceeds bigint", w.token))?;
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = Some(connect(&self.config).await.map_err(|e| e.to_string())?);
        }
        let Some(client) = slot.as_ref() else {
            return Err("no resource connection".into());
        };
        match client
            .query_opt(&self.sql, &[&w.name, &token, &w.write_id, &w.worker])
            .await
        {
            Ok(row) => Ok(row.is_some()),
            Err(e) => {
                if e.is_closed() {
                    *slot = None;
                }
                Err(e.to_string())
            }
        }
    }
}
