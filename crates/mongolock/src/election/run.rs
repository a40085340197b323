//! The run loop: campaign, run the user's function while leader, repeat.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use super::Election;
use crate::error::Result;
use crate::guard::LostSignal;

/// What the function given to [`Election::run_until`] receives for each term it leads.
#[derive(Clone, Debug)]
pub struct LeaderContext {
    role: Arc<str>,
    term: u64,
    since: SystemTime,
    lost: LostSignal,
}

impl LeaderContext {
    pub(super) fn new(role: Arc<str>, term: u64, since: SystemTime, lost: LostSignal) -> Self {
        LeaderContext {
            role,
            term,
            since,
            lost,
        }
    }

    /// The role name.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// The term: the fencing token of the leadership lease. Pass it to the resources you write
    /// to, so that they can refuse writes from a deposed leader.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Server time at which the term began.
    pub fn since(&self) -> SystemTime {
        self.since
    }

    /// Completes when leadership is lost or given up. The run loop already cancels the function
    /// then; this is for work handed to other tasks.
    pub fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Whether leadership has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }
}

/// Why a term ended inside the run loop.
enum TermOutcome {
    Shutdown,
    Lost,
    Returned,
}

impl Election {
    /// [`run_until`](Self::run_until) without a shutdown future: runs until the returned future
    /// is dropped or a permanent error occurs.
    ///
    /// # Errors
    /// As [`run_until`](Self::run_until).
    ///
    /// # Cancel safety
    /// As [`run_until`](Self::run_until): dropping the future is the way to stop it.
    pub async fn run<F, Fut>(&self, f: F) -> Result<()>
    where
        F: FnMut(LeaderContext) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.run_until(f, std::future::pending()).await
    }

    /// The run loop for the common case: lead with `f` whenever elected, until `shutdown`
    /// completes.
    ///
    /// 1. Campaign until elected ([`ElectionEvent::Elected`](super::ElectionEvent::Elected)).
    /// 2. Call `f` with a [`LeaderContext`] (term, lost signal) and drive its future.
    /// 3. The term ends in one of three ways; in each, `f`'s future is dropped **before**
    ///    leadership is given up, so its work never overlaps the next leader's through this loop:
    ///    * **leadership lost** (lease expired, could not be extended, taken over): `f`'s future
    ///      is cancelled (dropped) at once — after a suspend of the machine longer than the
    ///      lease, within about 250 ms of resuming (the lost signal follows the boot clock), [`Lost`](super::ElectionEvent::Lost) is emitted, and
    ///      the loop campaigns again;
    ///    * **`f` returned**: leadership is resigned
    ///      ([`Resigned`](super::ElectionEvent::Resigned)), the loop waits the [rejoin delay](Self::with_rejoin_delay) and campaigns again.
    ///      Returning from `f` therefore means "step down for now"; to lead until stopped, do not
    ///      return (run your work in a loop, or end with `std::future::pending().await`);
    ///    * **`shutdown` completed**: `f`'s future is dropped, leadership is resigned, and
    ///      `run_until` returns `Ok(())`. Shutdown while campaigning returns at once.
    ///
    /// # Errors
    /// A permanent backend error while campaigning is returned (transient ones are retried by
    /// the lock); [`Error::NoRuntime`](crate::Error::NoRuntime) outside a Tokio runtime. A
    /// failed resignation is logged and reported as an event; the lease then expires by itself
    /// and the loop goes on.
    ///
    /// # Cancel safety
    /// Dropping the returned future stops everything: a pending campaign leaves nothing held,
    /// `f`'s future is dropped, and a held leadership is released in the background. The loop
    /// spawns no tasks of its own besides those of the lock (attempt, renewal, release), which
    /// all end with the lease.
    pub async fn run_until<F, Fut, S>(&self, mut f: F, shutdown: S) -> Result<()>
    where
        F: FnMut(LeaderContext) -> Fut,
        Fut: Future<Output = ()>,
        S: Future<Output = ()>,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let leadership = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                elected = self.campaign() => elected?,
            };
            let outcome = {
                let lost = leadership.lost();
                let work = std::pin::pin!(f(leadership.context()));
                tokio::select! {
                    biased;
                    () = &mut shutdown => TermOutcome::Shutdown,
                    () = lost.wait() => TermOutcome::Lost,
                    () = work => TermOutcome::Returned,
                }
                // `work` (the user's future) is dropped here, before leadership is given up.
            };
            let term = leadership.term();
            match outcome {
                TermOutcome::Lost => {
                    tracing::debug!(
                        role = %self.role,
                        term,
                        "leader function cancelled: leadership lost"
                    );
                    // Emits `Lost`; the background release finds the lease already gone.
                    drop(leadership);
                }
                TermOutcome::Returned | TermOutcome::Shutdown => {
                    if let Err(e) = leadership.resign().await {
                        tracing::warn!(
                            role = %self.role,
                            term,
                            error = %e,
                            "resigning leadership failed"
                        );
                    }
                    if matches!(outcome, TermOutcome::Shutdown) {
                        return Ok(());
                    }
                    if !self.rejoin_delay.is_zero() {
                        tokio::select! {
                            biased;
                            () = &mut shutdown => return Ok(()),
                            () = tokio::time::sleep(self.rejoin_delay) => {}
                        }
                    }
                }
            }
        }
    }
}
