//! Fair handoff across processes: the lock document's queue of waiting processes, and the
//! designation a release writes for the change streams.
//!
//! Without it, a release wakes one acquirer in *every* process that waits for the name (each
//! has its own change stream), so with 32 waiting processes a handoff costs 32 acquire
//! attempts, 31 of them busy. With it:
//!
//! * A busy attempt of an acquirer that is going to wait for a change (and whose backend's
//!   stream is live) registers its **backend** in the document's queue, in the same write:
//!   `waiters: [{m: <backend mark>, until: <date>, holder: {host, pid, app}}, ...]`, in order
//!   of first registration (a later busy attempt moves `until` and rewrites `holder` with its
//!   acquirer's metadata, which only operators read: `waiters`; entries written by earlier
//!   versions have no `holder`). An entry lives until the holder's expiry plus
//!   [`REGISTRATION`] (a waiter re-registers each time it wakes at the holder's expiry and finds
//!   the lease extended), so a process that died leaves the queue by itself. At most
//!   [`MAX_WAITERS`] entries; later processes are not queued (they are woken by the fallback).
//! * A grant removes the acquiring backend's entry, and puts it back at the end when that
//!   backend has more acquirers waiting for the name (so processes take turns).
//! * When the last of a backend's acquirers of the name stops waiting without the lock (its
//!   timeout ran out, its future was dropped, it failed), the backend removes its entry in the
//!   background ([`withdraw`]: a `$pull` by mark, after a 50 ms grace in which a new acquirer
//!   of the process keeps the entry), so a release does not designate a process that no
//!   longer waits, and operators do not see it waiting. A new acquirer whose busy attempt lands
//!   just before the withdrawal loses its entry; its next busy attempt (or its probe) covers
//!   it.
//! * A release (and a force-release) pops the first live entry and records it in
//!   `next: "<mark>/<released lease id>"` (an empty mark when nobody is queued; the lease id
//!   makes every release's `next` new, so a change stream always reports it, and a scalar is
//!   reported whole, never as dotted sub-fields), and the entry after it, which stays queued,
//!   in `backup: "<mark>/<released lease id>"` (an empty mark when there is none).
//! * With **fair handoff** (`MongoBackendBuilder::fair_handoff`, off by default) the release
//!   also reserves the lock for the designated process for [`HANDOFF_FALLBACK`] of server time
//!   (`reserved: {m, until}`): until then an attempt of another process finds the lock busy
//!   (and queues), so a process that releases and at once asks again does not barge ahead of
//!   the queue, and processes are served in queue order. A grant clears the reservation. The
//!   price: a designated process that died, or whose acquirers gave up, holds the lock up for
//!   that long, single attempts (`try_acquire`, `exec --wait 0`) included. Every backend
//!   honours a reservation, whoever wrote it. An attempt that finds the lock reserved for
//!   another process reports it busy until the reservation's `until` (not until a lease after
//!   it): an acquirer that started waiting during the reservation heard no release and has no
//!   fallback armed, so it retries as the reservation lapses — at once served if the
//!   designated process died, busy until that process's expiry (and woken by its release) if it
//!   took the lock.
//! * A process's change stream then wakes one of its acquirers only when `next` names its
//!   backend (or names nobody). The backup wakes one after [`HANDOFF_FALLBACK`] if nothing else
//!   happened to the name meanwhile: the designated process died or its acquirers gave up.
//!   Processes further back, which the release does not reach, probe the lock once a second
//!   while they wait (`probe.rs`), so a free name reaches a live one within about a second
//!   whatever stands ahead of it.
//!   Other processes that only wait on the name do not receive the release at all (their
//!   streams pass only the releases that designate them, `watch.rs`, "Only the releases meant
//!   for this process"); processes whose stream covers the name fully (they hold or observe it)
//!   receive it and act as the backup does. The releasing backend learns `next` from its
//!   release's reply and does the same in-process.
//!
//! The queue only orders who may try first: acquisition stays one atomic test of "free or
//! expired by `$$NOW`" (plus "not reserved for another process") and grant, so the queue
//! cannot break mutual exclusion or token order; a wrong or stale designation costs at most
//! the fallback delay. (What the PostgreSQL queue shares with this one: `backends/notify/handoff.rs`.)

use std::time::SystemTime;

use mongodb::bson::{doc, Bson, Document};
use mongodb::Collection;

use super::document::{self, holder_doc};

pub(crate) use crate::backends::notify::handoff::{Handoff, Queueing};
use crate::backends::notify::handoff::{MAX_WAITERS, REGISTRATION};
use crate::backends::notify::hub::HANDOFF_FALLBACK;
use crate::holder::HolderInfo;
use crate::QueuedWaiter;

/// The queue of waiting backends.
pub(super) const WAITERS: &str = "waiters";
/// The designation of the last release.
pub(super) const NEXT: &str = "next";
/// The backup designation of the last release (the second live entry).
pub(super) const BACKUP: &str = "backup";
/// The designated process's head start: `{m: <mark>, until: <date>}` or null.
pub(super) const RESERVED: &str = "reserved";

fn registration_ms() -> i64 {
    REGISTRATION.as_millis() as i64
}

/// The live entries of the queue (`until` in the future by server time).
fn live() -> Document {
    doc! { "$filter": {
        "input": { "$ifNull": ["$waiters", []] },
        "cond": { "$gt": ["$$this.until", "$$NOW"] },
    } }
}

fn marks(array: &str) -> Document {
    marks_of(array)
}

fn marks_of(array: impl Into<Bson>) -> Document {
    doc! { "$map": { "input": array.into(), "in": "$$this.m" } }
}

/// Aggregation expression: the position of `mark` among the live entries of the queue (0 for
/// the first), -1 when it is not queued (for a waiter's probe, `probe.rs`).
pub(super) fn position(mark: &str) -> Document {
    doc! { "$indexOfArray": [marks_of(live()), { "$literal": mark }] }
}

/// Removes the entry of the backend with `mark` from the queue of `name`: the last of its
/// acquirers of the name stopped waiting (`backends/notify/hub.rs`, `Hub::withdraw_later`).
/// A plain `$pull`, matched only while the entry is there; it changes none of the fields that
/// change streams pass, so it wakes nobody. Best effort: a failure is logged (the entry ends
/// by itself two seconds after the holder's expiry).
pub(super) async fn withdraw(coll: &Collection<Document>, name: &str, mark: &str) {
    let filter = doc! { "_id": name, "waiters.m": mark };
    let update = doc! { "$pull": { WAITERS: { "m": mark } } };
    match coll.update_one(filter, update).await {
        Ok(r) => {
            tracing::debug!(lock = %name, withdrawn = r.modified_count, "withdrew from the handoff queue: no acquirer of this process waits any more")
        }
        Err(e) => {
            tracing::debug!(lock = %name, error = %e, "could not withdraw from the handoff queue; the entry ends by itself")
        }
    }
}

/// The queue after a busy attempt that registers `mark` for an acquirer described by
/// `holder`: its entry's `until` moved to the holder's expiry plus [`REGISTRATION`] (and its
/// `holder` rewritten), or a new entry at the end (when there is room).
pub(super) fn after_busy(mark: &str, holder: &HolderInfo) -> Document {
    let entry = doc! {
        "m": { "$literal": mark },
        "until": { "$add": [{ "$max": ["$expiresAt", "$$NOW"] }, registration_ms()] },
        "holder": { "$literal": holder_doc(holder) },
    };
    doc! { "$let": {
        "vars": { "live": live() },
        "in": { "$cond": [
            { "$in": [{ "$literal": mark }, marks("$$live")] },
            { "$map": {
                "input": "$$live",
                "in": { "$cond": [
                    { "$eq": ["$$this.m", { "$literal": mark }] },
                    entry.clone(),
                    "$$this",
                ] },
            } },
            { "$slice": [{ "$concatArrays": ["$$live", [entry]] }, MAX_WAITERS] },
        ] },
    } }
}

/// The queue after a grant to `mark` of a lease of `ttl_ms`: without its entry, and with it
/// at the end when `requeue`.
fn after_grant(mark: &str, holder: &HolderInfo, ttl_ms: i64, requeue: bool) -> Document {
    // The live entries (`live`) but `mark`'s, in one pass.
    let others = doc! { "$filter": {
        "input": { "$ifNull": ["$waiters", []] },
        "cond": { "$and": [
            { "$gt": ["$$this.until", "$$NOW"] },
            { "$ne": ["$$this.m", { "$literal": mark }] },
        ] },
    } };
    if !requeue {
        return others;
    }
    let entry = doc! {
        "m": { "$literal": mark },
        "until": { "$add": ["$$NOW", ttl_ms + registration_ms()] },
        "holder": { "$literal": holder_doc(holder) },
    };
    doc! { "$slice": [{ "$concatArrays": [others, [entry]] }, MAX_WAITERS] }
}

/// The queue fields a release of `released` (a lease id, or any unique string for a
/// force-release) whose filter matched only a lock it ends writes: an expression whose value
/// is the document of fields to merge into the lock document (`$mergeObjects`). It pops the
/// first live entry into `next` (and with `reserve` reserves the lock for it); a lock without
/// a queue gets no fields (`{}`). The live entries and the first mark are computed once
/// (`$let`).
pub(super) fn pop(released: &str, reserve: bool) -> Document {
    let mut fields = doc! {
        NEXT: { "$concat": [{ "$ifNull": ["$$first", ""] }, "/", { "$literal": released }] },
        BACKUP: { "$concat": [{ "$ifNull": ["$$second", ""] }, "/", { "$literal": released }] },
        WAITERS: { "$slice": ["$$live", 1, MAX_WAITERS] },
    };
    if reserve {
        fields.insert(
            RESERVED,
            doc! { "$cond": [
                { "$eq": [{ "$ifNull": ["$$first", Bson::Null] }, Bson::Null] },
                Bson::Null,
                { "m": "$$first", "until": { "$add": ["$$NOW", fallback_ms()] } },
            ] },
        );
    }
    // Only a lock with a queue is handed off: without one the fields are left alone, and the
    // event (no `next` in it) wakes one acquirer per process, as designating nobody would.
    doc! { "$cond": [
        queued(),
        { "$let": {
            "vars": { "live": live() },
            "in": { "$let": {
                "vars": {
                    "first": { "$arrayElemAt": [marks("$$live"), 0] },
                    "second": { "$arrayElemAt": [marks("$$live"), 1] },
                },
                "in": fields,
            } },
        } },
        {},
    ] }
}

/// Aggregation expression: the queue has entries (live or not).
fn queued() -> Document {
    doc! { "$gt": [{ "$size": { "$ifNull": ["$waiters", []] } }, 0] }
}

/// The `waiters` value of a grant's new lease fields: [`after_grant`] when the lock has a
/// queue or the grant requeues, else nothing (`$$REMOVE`: an unqueued lock gets no field).
pub(super) fn on_grant(mark: &str, holder: &HolderInfo, ttl_ms: i64, requeue: bool) -> Bson {
    if requeue {
        return Bson::Document(after_grant(mark, holder, ttl_ms, true));
    }
    Bson::Document(doc! { "$cond": [
        { "$isArray": "$waiters" },
        after_grant(mark, holder, ttl_ms, false),
        "$$REMOVE",
    ] })
}

/// The `reserved` value of a grant's new lease fields: a reservation is cleared, an absent one
/// stays absent.
pub(super) fn clear_reservation() -> Document {
    doc! { "$cond": [{ "$ifNull": ["$reserved", false] }, Bson::Null, "$$REMOVE"] }
}

fn fallback_ms() -> i64 {
    HANDOFF_FALLBACK.as_millis() as i64
}

/// Aggregation expression: the lock is not reserved for another process (no reservation, one
/// that has run out by server time, or ours).
pub(super) fn not_reserved_for_others(mark: &str) -> Document {
    doc! { "$or": [
        { "$lte": [{ "$ifNull": ["$reserved.until", Bson::Null] }, "$$NOW"] },
        { "$eq": ["$reserved.m", { "$literal": mark }] },
    ] }
}

impl Handoff {
    /// The handoff recorded in a `next` value (`"<mark>/<released>"`, an empty mark for
    /// nobody), if it was written by the release of `released` (`None`: the value is known to
    /// be new, e.g. it is among an update event's changed fields). A release of a lock without
    /// a queue leaves an older `next` in place: that one is [`Handoff::Unknown`].
    pub(super) fn of(next: Option<&Bson>, released: Option<&str>) -> Handoff {
        let Some(Bson::String(s)) = next else {
            return Handoff::Unknown;
        };
        match s.split_once('/') {
            Some((_, after)) if released.is_some_and(|r| r != after) => Handoff::Unknown,
            Some((mark, _)) => Handoff::to_mark(mark),
            None => Handoff::Unknown,
        }
    }
}

/// The live entries of the queue of the lock document `d`, read at server time `observed_at`,
/// in queue order (for operators: [`LockBackend::waiters`](crate::LockBackend::waiters)).
/// Entries that are not documents with a mark and a date are skipped: they are never written
/// by mongolock, and the queue only orders who tries first.
pub(super) fn waiters(d: &Document, observed_at: SystemTime) -> Vec<QueuedWaiter> {
    let Ok(entries) = d.get_array(WAITERS) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(Bson::as_document)
        .filter_map(|e| {
            let mark = e.get_str("m").ok()?;
            let until = document::date(e, "until")?;
            (until > observed_at).then(|| QueuedWaiter::new(mark, document::holder(e), until))
        })
        .collect()
}
