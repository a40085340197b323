//! hello/isMaster, ping, buildInfo, sessions, listDatabases, parameters, fail points.

use std::sync::atomic::Ordering;

use bson::{doc, oid::ObjectId, Bson, DateTime, Document};

use super::args::{self, check_fields};
use super::Ctx;
use crate::error::{CommandError, CommandResult};
use crate::wire::{MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE};

/// The server version reported by buildInfo.
pub const VERSION: &str = "7.0.0";

/// `hello` / `isMaster`. A `speculativeAuthenticate` field is accepted and never answered
/// (the reply has no `speculativeAuthenticate`, as mongod's when speculative authentication
/// fails): the driver then sends `saslStart` or `authenticate`, which fail with advice to
/// connect without credentials (`CommandError::authentication_not_supported`).
pub fn hello(ctx: &Ctx<'_>, name: &str, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        name,
        &[
            "helloOk",
            "client",
            "compression",
            "saslSupportedMechs",
            "speculativeAuthenticate",
            "loadBalanced",
            "topologyVersion",
            "maxAwaitTimeMS",
            "backpressure",
            "hostInfo",
            "internalClient",
            "forShell",
        ],
    )?;
    let mut r = Document::new();
    if cmd.contains_key("helloOk") {
        r.insert("helloOk", true);
    }
    if name == "hello" {
        r.insert("isWritablePrimary", true);
    } else {
        r.insert("ismaster", true);
    }
    let cfg = &ctx.shared.config;
    if !cfg.standalone {
        let (now, last_write) = {
            let st = ctx.shared.lock();
            (st.clock.now(), DateTime::now())
        };
        r.insert("hosts", vec![cfg.host.clone()]);
        r.insert("setName", cfg.set_name.clone());
        r.insert("setVersion", 1);
        r.insert("secondary", false);
        r.insert("primary", cfg.host.clone());
        r.insert("me", cfg.host.clone());
        // Fixed election id: this primary never changes term.
        r.insert(
            "electionId",
            ObjectId::from_bytes([0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1]),
        );
        r.insert(
            "lastWrite",
            doc! {
                "opTime": {"ts": now, "t": 1i64},
                "lastWriteDate": last_write,
                "majorityOpTime": {"ts": now, "t": 1i64},
                "majorityWriteDate": last_write,
            },
        );
    }
    r.insert("maxBsonObjectSize", MAX_BSON_OBJECT_SIZE as i32);
    r.insert("maxMessageSizeBytes", MAX_MESSAGE_SIZE as i32);
    r.insert("maxWriteBatchSize", 100_000);
    r.insert("localTime", DateTime::now());
    r.insert("logicalSessionTimeoutMinutes", 30);
    r.insert("connectionId", ctx.conn.id);
    r.insert("minWireVersion", 0);
    r.insert("maxWireVersion", 21);
    r.insert("readOnly", false);
    Ok(r)
}

/// `ping`.
pub fn ping(cmd: &Document) -> CommandResult<Document> {
    check_fields(cmd, "ping", &[])?;
    Ok(Document::new())
}

/// `buildInfo`.
pub fn build_info(_cmd: &Document) -> CommandResult<Document> {
    Ok(doc! {
        "version": VERSION,
        "gitVersion": "mongo-testserver",
        "versionArray": [7, 0, 0, 0],
        "bits": 64,
        "debug": false,
        "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE as i32,
        "storageEngines": ["memory"],
        "modules": [],
    })
}

/// `endSessions`.
pub fn end_sessions(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(cmd, "endSessions", &[])?;
    let ids = match cmd.get("endSessions") {
        Some(Bson::Array(a)) => a,
        _ => {
            return Err(CommandError::type_mismatch(
                "endSessions must be an array of session ids",
            ))
        }
    };
    let mut st = ctx.shared.lock();
    for id in ids {
        if let Bson::Document(lsid) = id {
            st.sessions.end(&crate::sessions::session_key(lsid));
        }
    }
    Ok(Document::new())
}

fn require_admin(ctx: &Ctx<'_>, name: &str) -> CommandResult<()> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            format!("{name} may only be run against the admin database."),
        ));
    }
    Ok(())
}

/// `listDatabases`.
pub fn list_databases(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        "listDatabases",
        &["nameOnly", "filter", "authorizedDatabases"],
    )?;
    require_admin(ctx, "listDatabases")?;
    let name_only = args::get_bool(cmd, "listDatabases", "nameOnly")?.unwrap_or(false);
    let filter = match args::get_doc(cmd, "listDatabases", "filter")? {
        Some(f) => Some(crate::engine::matcher::Filter::parse(f)?),
        None => None,
    };
    let st = ctx.shared.lock();
    let mut dbs = Vec::new();
    let mut total: i64 = 0;
    for (name, db) in &st.store.dbs {
        if db.colls.is_empty() {
            continue;
        }
        let size: i64 = db
            .colls
            .values()
            .map(|c| {
                c.iter()
                    .map(|(_, d)| crate::keys::doc_size(d) as i64)
                    .sum::<i64>()
            })
            .sum();
        let entry = if name_only {
            doc! {"name": name.clone()}
        } else {
            doc! {"name": name.clone(), "sizeOnDisk": size.max(4096), "empty": false}
        };
        if let Some(f) = &filter {
            if !f.matches(&entry, &ctx.vars)? {
                continue;
            }
        }
        total += size.max(4096);
        dbs.push(entry);
    }
    if name_only {
        Ok(doc! {"databases": dbs})
    } else {
        Ok(doc! {"databases": dbs, "totalSize": total, "totalSizeMb": total / (1024 * 1024)})
    }
}

/// `setParameter` (only `ttlMonitorSleepSecs` and `ttlMonitorEnabled`).
pub fn set_parameter(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    require_admin(ctx, "setParameter")?;
    let mut reply = Document::new();
    let mut any = false;
    for (k, v) in cmd.iter().skip(1) {
        if args::GENERIC_FIELDS.contains(&k.as_str()) {
            continue;
        }
        match k.as_str() {
            "ttlMonitorSleepSecs" => {
                let secs = match args::as_i64(v) {
                    Some(s) if (1..=i64::from(i32::MAX)).contains(&s) => s,
                    _ => {
                        return Err(CommandError::bad_value(format!(
                            "Invalid value for parameter ttlMonitorSleepSecs: {v}; it must be an integer >= 1"
                        )))
                    }
                };
                let was = ctx.shared.ttl_interval_ms.swap(secs as u64 * 1000, Ordering::SeqCst);
                ctx.shared.ttl_changed.notify_one();
                reply.insert("was", (was / 1000) as i32);
                any = true;
            }
            other => {
                return Err(CommandError::new(
                    72,
                    "InvalidOptions",
                    format!("attempted to set unrecognized parameter [{other}], use help:true to see options "),
                ))
            }
        }
    }
    if !any {
        return Err(CommandError::new(
            72,
            "InvalidOptions",
            "no option found to set, use help:true to see options ",
        ));
    }
    Ok(reply)
}

/// `getParameter`.
pub fn get_parameter(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    require_admin(ctx, "getParameter")?;
    let mut reply = Document::new();
    let secs = (ctx.shared.ttl_interval_ms.load(Ordering::SeqCst) / 1000) as i32;
    let all = matches!(cmd.get("getParameter"), Some(Bson::String(s)) if s == "*");
    if all || cmd.contains_key("ttlMonitorSleepSecs") {
        reply.insert("ttlMonitorSleepSecs", secs);
    }
    for (k, _) in cmd.iter().skip(1) {
        if args::GENERIC_FIELDS.contains(&k.as_str()) || k == "ttlMonitorSleepSecs" {
            continue;
        }
        return Err(CommandError::new(
            72,
            "InvalidOptions",
            format!("no option found to get: {k}"),
        ));
    }
    Ok(reply)
}

/// `configureFailPoint`.
pub fn configure_fail_point(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    require_admin(ctx, "configureFailPoint")?;
    match cmd.get("configureFailPoint") {
        Some(Bson::String(s)) if s == "failCommand" => {}
        Some(Bson::String(s)) => {
            return Err(CommandError::bad_value(format!(
                "Cannot find failPoint: {s} (this server implements only failCommand)"
            )))
        }
        _ => {
            return Err(CommandError::type_mismatch(
                "configureFailPoint must be a string",
            ))
        }
    }
    let count = ctx.shared.failpoint().configure(cmd)?;
    Ok(doc! {"count": count})
}

/// `serverStatus` (a minimal subset).
/// `serverStatus`: identity, plus the counters benchmarks read, in mongod's shape:
/// `connections.current`, `metrics.commands.<name>.total` (commands received, this one
/// included), `metrics.cursor.open.total` (and, specific to this server,
/// `metrics.cursor.open.changeStreams`), `metrics.queryExecutor.scanned` (index keys read by
/// queries and writes) and `scannedObjects` (documents they examined).
pub fn server_status(ctx: &Ctx<'_>, _cmd: &Document) -> CommandResult<Document> {
    let (open, streams, scanned, scanned_objects) = {
        let st = ctx.shared.lock();
        let (open, streams) = st.cursors.open_counts();
        let counters = &st.store.counters;
        (
            open,
            streams,
            counters.keys.load(Ordering::Relaxed),
            counters.objects.load(Ordering::Relaxed),
        )
    };
    let mut commands = Document::new();
    for (name, total) in ctx.shared.command_counts.totals() {
        commands.insert(name, doc! {"total": total as i64});
    }
    let current = ctx.shared.connections_current.load(Ordering::Relaxed);
    Ok(doc! {
        "host": ctx.shared.config.host.clone(),
        "version": VERSION,
        "process": "mongod",
        "localTime": DateTime::now(),
        "connections": {"current": current as i32},
        "metrics": {
            "commands": commands,
            "cursor": {"open": {"total": open as i64, "changeStreams": streams as i64}},
            "queryExecutor": {"scanned": scanned as i64, "scannedObjects": scanned_objects as i64},
        },
    })
}
