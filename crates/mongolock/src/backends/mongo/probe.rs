//! The probe of a waiter that the next release would not reach: how a live waiter behind
//! processes that died, were stopped, or gave up without withdrawing still gets a free name
//! within about a second.
//!
//! A process's change stream passes a release of a name it only waits on when the release
//! designates it, first (`next`) or as backup (`backup`), or nobody (`watch.rs`, "Only the
//! releases meant for this process"; `queue.rs`). A release pops the first two live entries
//! of the queue, so a process further back hears nothing of it; if the first two processes
//! cannot act (SIGKILLed or SIGSTOPped waiters, a process that exited before its withdrawal
//! was sent, `backends/notify/hub.rs` `Hub::withdraw_later`), the name would stay free until
//! the others woke at the old holder's reported expiry — up to a TTL later.
//!
//! So an acquirer of a name covered only for handoffs, while it waits, reads the lock document
//! every [`PROBE_EVERY`] (give or take a quarter, so that many processes spread their reads):
//! one `find` by `_id` on the primary, with server-computed fields and nothing written (no
//! oplog entry, so no change stream is woken by it). It is a hint, so it reads with read
//! concern `local` (not `majority`, which a 4.4 set with majority reads disabled refuses): a
//! write not yet majority-committed costs at most one early attempt.
//!
//! * `free` — the name may be taken now by this backend (`acquire.rs` `free_for`: no lease or
//!   the lease expired by `$$NOW`, not reserved for another process), and `freeMs`, how long
//!   ago the last lease ended (`$$NOW - expiresAt`; a release sets `expiresAt` to its time);
//! * `pos` — this backend's position among the live entries of the queue (`queue.rs`).
//!
//! When the name is free, the probe ends the wait as a change would, once the name has been
//! free for [`HANDOFF_FALLBACK`] (the designated process and its backup had their turn): the
//! acquirer then attempts as usual. When this backend is first or second in the queue, the
//! next release reaches it (designated or backup), so it stops probing. Otherwise (held, or
//! not queued: the queue is full, or its entry was withdrawn under it) it probes again.
//!
//! The probe only decides *when to try*: whether the attempt is granted is decided by the
//! attempt, atomically, as always. A wrong answer (a lagging read, a failed read) costs one
//! busy attempt or one more period. The price is one read per [`PROBE_EVERY`] per waiting
//! process further back than second, while a name is held.

use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{ReadConcern, ReadPreference, SelectionCriteria};
use mongodb::Collection;

use super::{acquire, queue};
use crate::backends::notify::hub::HANDOFF_FALLBACK;

/// How often a waiter that the next release would not reach reads its lock.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(1);

/// What one probe found.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// The name is free, since this long (by server time).
    Free(Duration),
    /// The next release reaches this backend (first or second in the queue).
    Reached,
    /// Held, and this backend is further back in the queue or not in it.
    Held,
}

/// The probe's projection: server-computed, so that nothing depends on this machine's clock.
fn projection(mark: &str) -> Document {
    doc! {
        "_id": 0,
        "free": acquire::free_for(mark),
        "freeMs": { "$subtract": ["$$NOW", { "$ifNull": ["$expiresAt", "$$NOW"] }] },
        "pos": queue::position(mark),
    }
}

fn judge(d: Option<&Document>) -> Found {
    // No document: nothing holds the name (a first acquisition, or cleaned up).
    let Some(d) = d else {
        return Found::Free(HANDOFF_FALLBACK);
    };
    if d.get_bool("free").unwrap_or(false) {
        let ms = match d.get("freeMs") {
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Int32(n)) => i64::from(*n),
            Some(Bson::Double(f)) => *f as i64,
            _ => 0,
        };
        return Found::Free(Duration::from_millis(ms.max(0) as u64));
    }
    match d.get("pos") {
        Some(Bson::Int32(p)) if (0..2).contains(p) => Found::Reached,
        Some(Bson::Int64(p)) if (0..2).contains(p) => Found::Reached,
        _ => Found::Held,
    }
}

/// Reads the lock `name` for the backend with `mark` ([module docs](self)).
async fn probe(
    coll: &Collection<Document>,
    name: &str,
    mark: &str,
) -> mongodb::error::Result<Found> {
    let d = coll
        .find_one(doc! { "_id": name })
        .projection(projection(mark))
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        // The watcher's collection reads with majority read concern by default.
        .read_concern(ReadConcern::local())
        .await?;
    Ok(judge(d.as_ref()))
}

/// Completes when a probe finds `name` free for the backend with `mark` (and free for at least
/// [`HANDOFF_FALLBACK`]); stays pending once this backend is first or second in the queue. A
/// failed read is logged and retried at the next period. Cancel safe: it only reads.
pub(crate) async fn until_free(coll: Collection<Document>, name: String, mark: String) {
    loop {
        let jitter = rand::random::<f64>() * 0.5 + 0.75;
        tokio::time::sleep(PROBE_EVERY.mul_f64(jitter)).await;
        match probe(&coll, &name, &mark).await {
            Ok(Found::Free(since)) => {
                if let Some(left) = HANDOFF_FALLBACK.checked_sub(since) {
                    tokio::time::sleep(left).await;
                }
                tracing::debug!(lock = %name, free_ms = since.as_millis() as u64, "probe: the name is free although no release reached this process; trying");
                return;
            }
            Ok(Found::Reached) => return std::future::pending().await,
            Ok(Found::Held) => {}
            Err(e) => {
                tracing::debug!(lock = %name, error = %e, "probe of a waiting acquirer failed; probing again later");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_what_the_probe_read() {
        assert_eq!(judge(None), Found::Free(HANDOFF_FALLBACK));
        let free = doc! { "free": true, "freeMs": 1200_i64, "pos": -1 };
        assert_eq!(judge(Some(&free)), Found::Free(Duration::from_millis(1200)));
        let clock_behind = doc! { "free": true, "freeMs": -5_i64, "pos": 3 };
        assert_eq!(judge(Some(&clock_behind)), Found::Free(Duration::ZERO));
        for pos in [0, 1] {
            assert_eq!(
                judge(Some(&doc! { "free": false, "pos": pos })),
                Found::Reached
            );
        }
        for pos in [-1, 2, 40] {
            assert_eq!(
                judge(Some(&doc! { "free": false, "pos": pos })),
                Found::Held
            );
        }
    }
}
