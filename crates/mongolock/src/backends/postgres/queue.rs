//! Fair handoff across processes on PostgreSQL: the row's queue of waiting backends, the
//! designation a release records, and how the notification and the release's reply carry it.
//! What this shares with the MongoDB queue (marks, limits, [`Queueing`], [`Handoff`]) is in
//! `backends/notify/handoff.rs`.
//!
//! Without a queue, every release's `NOTIFY` wakes one acquirer in *every* listening process,
//! so with 32 waiting processes a handoff costs about 25 acquire attempts, all but one busy.
//! With it:
//!
//! * **Registration.** A busy attempt of an acquirer that is going to wait for a change, while
//!   the backend's listening connection is live, registers the backend's mark in the row's
//!   `waiters` (`jsonb`, `[{"m": <mark>, "u": <until>, "h": {"host", "pid", "app"}}, ...]`, in
//!   order of first registration; a later busy attempt moves `u` and rewrites `h`, the
//!   metadata of its acquirer, which only operators read (`waiters`; entries of earlier
//!   versions have no `h`)), in the same statement as the attempt: the acquire
//!   statement's `ON CONFLICT DO UPDATE` then writes the row, keeping every lease column as it
//!   is when the attempt is busy. A backend already queued until the holder's expiry plus
//!   [`REGISTRATION`] or later writes nothing (each write is a commit, with its WAL flush).
//!   `u` is the holder's expiry plus [`REGISTRATION`], so a backend that died leaves the queue
//!   by itself; entries whose `u` has passed (by `clock_timestamp()`) are dropped by every
//!   statement that rewrites the queue. At most [`MAX_WAITERS`] entries: later backends are not
//!   queued (the fallback wakes them).
//! * **Withdrawal.** When the last of a backend's acquirers of the name stops waiting without
//!   the lock (a timeout, a dropped future, an error), the backend removes its entry in the
//!   background ([`withdraw_sql`]; `Hub::withdraw_later` in `backends/notify/hub.rs`), so a
//!   release does not designate a process that no longer waits. The statement changes neither
//!   `lease_id` nor the token, so it publishes nothing.
//! * **Grant.** A grant removes the granted backend's entry, and puts it back at the end (until
//!   the new lease's expiry plus [`REGISTRATION`]) when more of that backend's acquirers wait,
//!   so processes take turns.
//! * **Release.** A release and a force-release of an exclusive lease pop the first live entry
//!   and record the designation in the row's `handoff` (`text`):
//!   `<designated mark>/<releasing mark>/<ended lease id>`, the designated mark empty when
//!   nobody is queued, the releasing mark empty for a force-release (which any process may
//!   run). The ended lease id makes every release's value new.
//! * **Notification.** The trigger publishes a release whose `handoff` is new (differs from
//!   the row's previous value) as `<token>/<designated mark>/<releasing mark> - <name>`; every
//!   other change as before, `<token> <lease id or -> <name>`, which is also what a trigger
//!   function of an earlier version publishes (both are parsed: [`parse_first`]). A listening
//!   backend whose mark is the releasing mark ignores the notification (it told its waiters
//!   itself, below); any other wakes one acquirer at once when the designated mark is its own
//!   or empty, else only after [`HANDOFF_FALLBACK`] if nothing else happened to the name
//!   (`Hub::deliver`, `backends/notify/hub.rs`): the designated process died or its acquirers
//!   gave up. A notification without a designation wakes one acquirer per process, as before.
//!   (A process of an earlier version, during a rolling upgrade, cannot parse the new format:
//!   it logs a warning and wakes every waiter and holder to re-check, which is safe.)
//! * **The releasing backend** reads `handoff` from its release's reply (`RETURNING`) and
//!   delivers the release in-process the same way, without waiting for its own notification.
//!   A release whose outcome is unknown (an error) is delivered in-process as a release to
//!   anybody (at worst one spurious attempt per process that waits).
//!
//! **Semaphores.** Slot acquisitions neither register nor update the queue, and slot releases
//! (and force-releases of a row in slot mode) designate nobody: they leave `waiters` and
//! `handoff` alone, so their notifications carry no designation and wake one acquirer per
//! process, as before. A freed slot can serve any waiting process, and a waiting process's
//! semaphore acquirers would not be registered. Exclusive acquirers waiting on a row in slot
//! mode (a read-write lock's writer) do register, and are designated by the next exclusive
//! release.
//!
//! **Safety.** The queue only orders who tries first. Whether an attempt is granted is decided
//! exactly as without a queue, once per statement under the row lock (see "Why two holders
//! never overlap" in the backend's module docs); the queue columns are written in the same
//! statement but read by no grant decision, and never change `lease_id`, `fencing_token` or
//! `expires_at`. So the queue cannot break mutual exclusion or token order, and a wrong,
//! stale or lost designation (a designated process that died, a notification from an older
//! trigger function) costs at most the fallback delay.

pub(crate) use crate::backends::notify::handoff::{Handoff, Queueing};
use crate::backends::notify::handoff::{MAX_WAITERS, REGISTRATION};
use crate::backends::notify::hub::Change;
#[cfg(doc)]
use crate::backends::notify::hub::HANDOFF_FALLBACK;

/// The statement that takes the backend with mark `$2` out of the queue of the row `$1` (the
/// last of its acquirers of the name stopped waiting: `backends/notify/hub.rs`,
/// `Hub::withdraw_later`). It matches only a row where the mark is queued, and changes neither
/// `lease_id` nor `fencing_token`, so the trigger publishes nothing.
pub(crate) fn withdraw_sql(table: &str) -> String {
    format!(
        "UPDATE {table} AS l SET waiters = coalesce(
           (SELECT jsonb_agg(e.w ORDER BY e.i)
              FROM jsonb_array_elements(l.waiters) WITH ORDINALITY AS e(w, i)
             WHERE e.w->>'m' IS DISTINCT FROM $2::text), '[]'::jsonb)
         WHERE l.name = $1::text
           AND l.waiters @> jsonb_build_array(jsonb_build_object('m', $2::text))"
    )
}

/// `REGISTRATION` as an SQL interval.
fn registration() -> String {
    format!("interval '{} milliseconds'", REGISTRATION.as_millis())
}

/// The live entries of `row`'s queue by time `now`, with their positions (`e.w`, `e.i`), as a
/// `FROM` clause and its condition; `other_than` leaves out one mark.
fn live_entries(row: &str, now: &str, other_than: Option<&str>) -> String {
    let other = other_than
        .map(|m| format!(" AND e.w->>'m' IS DISTINCT FROM {m}"))
        .unwrap_or_default();
    format!(
        "FROM jsonb_array_elements({row}.waiters) WITH ORDINALITY AS e(w, i)
         WHERE (e.w->>'u')::timestamptz > {now}{other}"
    )
}

/// A queue entry for `mark` until `until`, for a waiter described by `holder` (a `jsonb`
/// object `{host, pid, app}`).
fn entry(mark: &str, until: &str, holder: &str) -> String {
    format!("jsonb_build_object('m', {mark}, 'u', {until}, 'h', {holder})")
}

/// The live entries of `row`'s queue by `now`, in order (a `jsonb` array).
pub(super) fn live(row: &str, now: &str) -> String {
    format!(
        "(SELECT coalesce(jsonb_agg(e.w ORDER BY e.i), '[]'::jsonb) {})",
        live_entries(row, now, None)
    )
}

/// The queue after a busy attempt that registers `mark`: its entry's `u` moved to the
/// holder's expiry plus [`REGISTRATION`], or a new entry at the end when there is room.
pub(super) fn after_busy(row: &str, now: &str, mark: &str, holder: &str) -> String {
    let e = entry(
        mark,
        &format!("greatest({row}.expires_at, {now}) + {}", registration()),
        holder,
    );
    format!(
        "(SELECT CASE
            WHEN coalesce(bool_or(e.w->>'m' = {mark}), false) THEN
              jsonb_agg(CASE WHEN e.w->>'m' = {mark} THEN {e} ELSE e.w END ORDER BY e.i)
            WHEN count(*) < {MAX_WAITERS} THEN
              coalesce(jsonb_agg(e.w ORDER BY e.i), '[]'::jsonb) || jsonb_build_array({e})
            ELSE jsonb_agg(e.w ORDER BY e.i) END
          {})",
        live_entries(row, now, None)
    )
}

/// Whether `mark` is already queued in `row` for as long as a registration now would keep it
/// (until the holder's expiry plus [`REGISTRATION`] or later): a busy attempt then needs no
/// write (a write is a commit, with its WAL flush).
pub(super) fn is_queued(row: &str, mark: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM jsonb_array_elements({row}.waiters) AS e(w)
                  WHERE e.w->>'m' = {mark}
                    AND (e.w->>'u')::timestamptz >= {row}.expires_at + {})",
        registration()
    )
}

/// The queue after a grant to `mark` of a lease expiring at `expires`: without its entry, and
/// with it at the end (until `expires` plus [`REGISTRATION`]) when `requeue` (an SQL boolean).
pub(super) fn after_grant(
    row: &str,
    now: &str,
    mark: &str,
    expires: &str,
    requeue: &str,
    holder: &str,
) -> String {
    let e = entry(mark, &format!("{expires} + {}", registration()), holder);
    format!(
        "(SELECT CASE
            WHEN {requeue} AND count(*) < {MAX_WAITERS} THEN
              coalesce(jsonb_agg(e.w ORDER BY e.i), '[]'::jsonb) || jsonb_build_array({e})
            ELSE coalesce(jsonb_agg(e.w ORDER BY e.i), '[]'::jsonb) END
          {})",
        live_entries(row, now, Some(mark))
    )
}

/// The first queue of a new row: the granted backend's entry when `requeue`, else empty.
pub(super) fn first(mark: &str, expires: &str, requeue: &str, holder: &str) -> String {
    format!(
        "CASE WHEN {requeue} THEN jsonb_build_array({}) ELSE '[]'::jsonb END",
        entry(mark, &format!("{expires} + {}", registration()), holder)
    )
}

/// The `handoff` value of a release of `ended` (an SQL text) by the backend marked `by`
/// (empty for a force-release), given the live queue `queue` before the pop.
pub(super) fn designation(queue: &str, by: &str, ended: &str) -> String {
    format!("coalesce({queue}->0->>'m', '') || '/' || {by} || '/' || {ended}")
}

/// The queue after the pop of a release, given the live queue `queue` before it.
pub(super) fn popped(queue: &str) -> String {
    format!("({queue} - 0)")
}

/// A release as recorded in `handoff` (`<designated>/<releasing>/<ended>`): whom it designated.
pub(super) fn recorded(handoff: &str) -> Handoff {
    match handoff.split_once('/') {
        Some((designated, _)) => Handoff::to_mark(designated),
        None => Handoff::Unknown,
    }
}

/// A notification: the name, its change, whom a release designated, and the releasing
/// backend's mark (empty: unknown, or a force-release).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Notice<'a> {
    pub(super) name: &'a str,
    pub(super) change: Change,
    pub(super) handoff: Handoff,
    pub(super) by: &'a str,
}

/// Parses a payload: `<token> <lease id or -> <name>`, or, for a release with a designation,
/// `<token>/<designated mark>/<releasing mark> - <name>` (see the [module docs](self)).
pub(super) fn parse_first(payload: &str) -> Option<Notice<'_>> {
    let mut parts = payload.splitn(3, ' ');
    let first = parts.next()?;
    let lease = parts.next()?;
    let name = parts.next()?;
    let (token, handoff, by) = match first.split_once('/') {
        None => (first, Handoff::Unknown, ""),
        Some((token, rest)) => {
            let (designated, by) = rest.split_once('/')?;
            (token, Handoff::to_mark(designated), by)
        }
    };
    let token = token.parse::<u64>().ok()?;
    Some(Notice {
        name,
        change: Change::Lease {
            lease_id: (lease != "-").then(|| lease.to_owned()),
            token: Some(token),
        },
        handoff,
        by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::notify::hub::lease;

    #[test]
    fn payloads_old_and_new_are_parsed() {
        let n = parse_first("7 abc my lock").unwrap();
        assert_eq!(n.name, "my lock");
        assert_eq!(n.change, lease(Some("abc"), Some(7)));
        assert_eq!((n.handoff, n.by), (Handoff::Unknown, ""));
        let n = parse_first("8 - x y").unwrap();
        assert_eq!((n.name, n.change), ("x y", lease(None, Some(8))));
        let n = parse_first("9/aa-/bb- - x").unwrap();
        assert_eq!(n.change, lease(None, Some(9)));
        assert_eq!((n.handoff, n.by), (Handoff::To("aa-".into()), "bb-"));
        let n = parse_first("9//bb- - x").unwrap();
        assert_eq!((n.handoff, n.by), (Handoff::Nobody, "bb-"));
        let n = parse_first("9/aa-/ - 1/2 3").unwrap();
        assert_eq!(
            (n.name, n.handoff, n.by),
            ("1/2 3", Handoff::To("aa-".into()), "")
        );
        assert_eq!(parse_first("nope - x"), None);
        assert_eq!(parse_first("9 -"), None);
        assert_eq!(parse_first("9/aa- - x"), None);
        assert_eq!(parse_first("x/aa-/ - x"), None);
    }

    #[test]
    fn recorded_designations() {
        assert_eq!(recorded("aa-/bb-/id"), Handoff::To("aa-".into()));
        assert_eq!(recorded("/bb-/id"), Handoff::Nobody);
        assert_eq!(recorded("garbage"), Handoff::Unknown);
    }
}
