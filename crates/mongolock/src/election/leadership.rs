//! [`Leadership`]: a won term of a role.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::broadcast;

use super::events::ElectionEvent;
use super::run::LeaderContext;
use crate::backend::LeaseId;
use crate::error::{Error, Result};
use crate::guard::{LockGuard, LostSignal};

/// Emits the one terminal event (`Lost` or `Resigned`) of a term, whichever path gets there
/// first: the loss monitor, [`Leadership::resign`], or dropping the leadership.
struct TermEnd {
    term: u64,
    role: Arc<str>,
    ended: Arc<AtomicBool>,
    lost: LostSignal,
    events: broadcast::Sender<ElectionEvent>,
}

impl TermEnd {
    /// Emits `Lost` when the lease was lost, else `Resigned`; only the first call per term emits.
    fn finish(&self) {
        finish(
            &self.ended,
            &self.events,
            &self.role,
            self.term,
            self.lost.is_lost(),
        );
    }
}

fn finish(
    ended: &AtomicBool,
    events: &broadcast::Sender<ElectionEvent>,
    role: &str,
    term: u64,
    lost: bool,
) {
    if ended.swap(true, Ordering::AcqRel) {
        return;
    }
    crate::metrics::leader(role, -1.0);
    let event = if lost {
        tracing::warn!(role, term, "leadership lost");
        ElectionEvent::Lost { term }
    } else {
        tracing::info!(role, term, "leadership resigned");
        ElectionEvent::Resigned { term }
    };
    // No receiver is fine: nobody is listening.
    let _ = events.send(event);
}

impl Drop for TermEnd {
    fn drop(&mut self) {
        self.finish();
    }
}

/// This process leads a role, for one term. Obtained from
/// [`Election::campaign`](super::Election::campaign).
///
/// * [`term`](Self::term) is the fencing token of the underlying lease: strictly larger than
///   every earlier term of the role. Pass it to the resources the leader writes to.
/// * The lease is extended in the background. Watch [`lost`](Self::lost) (or poll
///   [`is_lost`](Self::is_lost)) and stop leading when it fires.
/// * [`resign`](Self::resign) gives leadership up at once so that another candidate can take
///   over; dropping the leadership does the same in the background.
#[must_use = "dropping the leadership resigns it at once"]
pub struct Leadership {
    // Field order matters: the guard is dropped (its release started) before `end` emits the
    // terminal event, so the event never precedes the release.
    guard: LockGuard,
    end: TermEnd,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("role", &self.end.role)
            .field("term", &self.end.term)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    /// Wraps a fresh grant: emits `Elected` and starts the loss monitor (a task that ends when
    /// the lease is lost, released or dropped). Must run inside a Tokio runtime; it does, since
    /// acquire just succeeded.
    pub(super) fn start(
        guard: LockGuard,
        role: Arc<str>,
        events: broadcast::Sender<ElectionEvent>,
    ) -> Leadership {
        let term = guard.fencing_token();
        tracing::info!(role = %role, term, "elected");
        crate::metrics::leader(&role, 1.0);
        let _ = events.send(ElectionEvent::Elected { term });
        let end = TermEnd {
            term,
            role,
            ended: Arc::new(AtomicBool::new(false)),
            lost: guard.lost(),
            events,
        };
        let (lost, ended, events, role) = (
            end.lost.clone(),
            end.ended.clone(),
            end.events.clone(),
            end.role.clone(),
        );
        tokio::spawn(async move {
            // Completes when the lease is lost, released or its guard dropped.
            lost.wait().await;
            if lost.is_lost() {
                finish(&ended, &events, &role, term, true);
            }
        });
        Leadership { guard, end }
    }

    /// The term: the fencing token of this leadership's lease.
    pub fn term(&self) -> u64 {
        self.end.term
    }

    /// The role name.
    pub fn role(&self) -> &str {
        &self.end.role
    }

    /// Server time at which this term began.
    pub fn since(&self) -> SystemTime {
        self.guard.acquired_at()
    }

    /// Server time at which the lease expires unless extended again.
    pub fn expires_at(&self) -> SystemTime {
        self.guard.expires_at()
    }

    /// The lease id (compare with [`LeaderInfo::lease_id`](super::LeaderInfo::lease_id)).
    pub fn lease_id(&self) -> &LeaseId {
        self.guard.lease_id()
    }

    /// A signal that completes when leadership is lost (or resigned); cloneable, cancel-safe,
    /// usable in `tokio::select!`.
    pub fn lost(&self) -> LostSignal {
        self.guard.lost()
    }

    /// Whether leadership has been lost (non-blocking). Final once true.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// The underlying lock guard (for its deadline, or to extend the lease by hand).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// What [`run_until`](super::Election::run_until) hands to the user's function.
    pub(super) fn context(&self) -> LeaderContext {
        LeaderContext::new(
            self.end.role.clone(),
            self.end.term,
            self.since(),
            self.lost(),
        )
    }

    /// Gives leadership up at once, so that a waiting candidate can take over. Emits
    /// [`ElectionEvent::Resigned`] (or [`ElectionEvent::Lost`] if someone else had already
    /// ended or taken the lease, in which case this returns [`Error::LeaseLost`]).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] as above; a transient error when the release did not complete
    /// within the provider's release timeout (default 5 s; the lease then expires by itself).
    ///
    /// # Cancel safety
    /// Cancel-safe: the release runs in its own task, so dropping this future does not stop it.
    /// Bounded by the release timeout either way.
    pub async fn resign(self) -> Result<()> {
        let Leadership { guard, end } = self;
        let release = tokio::spawn(guard.release());
        let result = match release.await {
            Ok(result) => result,
            Err(e) => Err(Error::backend(
                format!("the release of leadership ended abnormally: {e}"),
                "check the logs for a panic in the lock backend; the lease expires by itself",
            )),
        };
        end.finish();
        result
    }
}
