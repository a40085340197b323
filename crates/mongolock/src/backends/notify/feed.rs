//! The task that keeps a backend's subscription to changes — its [`Feed`] — open and delivers
//! its events to the [`Hub`]; it also does the fallback and resubscription bookkeeping, the
//! same for every feed.
//!
//! # The rules
//! * The task starts on first need ([`Notifier::ensure_started`](super::Notifier)) and ends
//!   when its notifier is dropped (with the last clone of the backend) or its runtime shuts
//!   down. Either way the hub goes back to idle and every waiter is woken, so nobody waits for
//!   changes that will not come; the next use starts a new task (which probes the server again,
//!   also after notifications were unavailable). A stopped feed is handed to [`Feed::retire`] (MongoDB drops its cursor a
//!   little later); a feed cancelled with its runtime is dropped without it.
//! * **Not live while down.** While the subscription is being opened the hub is `Opening`:
//!   [`is_live`](Hub::is_live) is false, so acquirers poll with the wait strategy instead of
//!   sleeping until the holder's expiry. Whenever the subscription goes down and changes may
//!   be missed, every waiter is woken at once to switch to polling.
//! * **Re-check when back.** Once a subscription is open afresh ([`Opened::Fresh`]), whatever
//!   happened before it is unknown: every waiter is woken to re-check once, and — unless this
//!   is the task's first subscription — every holder reads its lock once (changes in between
//!   may have ended its lease). A feed that can resume where it broke ([`Broke::Resumable`],
//!   then [`Opened::Resumed`]: the MongoDB resume token) replays what happened meanwhile, so the
//!   hub stays live (`Resuming`) and nobody re-checks.
//! * **Unavailable, re-probed.** A feed that the server refuses for a reason that will not
//!   go away by itself ([`OpenFailed::Unavailable`]: a standalone MongoDB, missing privileges;
//!   the feed decides, and logs it once) makes the hub `Unavailable`: waiters do not register
//!   and poll, holders rely on extension and their local deadline. The task stays and tries
//!   to open the feed again every [`REPROBE_EVERY`] (a set initiated, a privilege granted,
//!   a refusal that was not so permanent after all): once it opens, the hub is live again,
//!   every waiter re-checks and every holder reads its lock once (it was not told of changes
//!   meanwhile).
//! * **Backoff.** Other failed opens ([`OpenFailed::Failed`]: errors known to be transient
//!   and errors not known to be permanent alike) are retried with exponential backoff (50 ms to
//!   5 s, the first failure logged as a warning, the return to health as info), polling
//!   meanwhile; a subscription that broke sooner than [`HEALTHY_AFTER`] after opening is
//!   reopened after the next backoff step, one that lived longer at once (and the backoff
//!   starts over).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backends::notify::hub::{Hub, Status};
use crate::wait::WaitStrategy;

/// A subscription that broke sooner than this after opening is reopened after a backoff.
pub(crate) const HEALTHY_AFTER: Duration = Duration::from_secs(1);

/// How often a feed that was [`OpenFailed::Unavailable`] is tried again.
#[cfg(not(test))]
pub(crate) const REPROBE_EVERY: Duration = Duration::from_secs(60);
/// Short in unit tests, so that they see the re-probe.
#[cfg(test)]
pub(crate) const REPROBE_EVERY: Duration = Duration::from_millis(100);

/// How a subscription was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opened {
    /// From now: earlier changes are unknown.
    Fresh,
    /// Where the last one broke: the changes in between are delivered (MongoDB's resume token).
    #[cfg(feature = "mongodb")]
    Resumed,
}

/// Why a subscription could not be opened.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OpenFailed {
    /// Notifications cannot work with this server as it is (the feed logged why): poll, and
    /// try again after [`REPROBE_EVERY`] (a standalone MongoDB, missing privileges).
    #[cfg(feature = "mongodb")]
    Unavailable,
    /// The feed cannot resume where it broke and will open from now, at once (the feed logged
    /// it): changes in between are unknown.
    #[cfg(feature = "mongodb")]
    ResumeLost,
    /// Try again after a backoff; the error, for the log.
    Failed(String),
}

/// How a subscription broke (the feed logged why).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Broke {
    /// It can be resumed where it broke: changes meanwhile will be delivered (MongoDB).
    #[cfg(feature = "mongodb")]
    Resumable,
    /// Changes from now until it is open again are lost.
    Lost,
    /// The feed covers only some names and must widen to names wanted since it opened
    /// ([`Hub::want`]): it is reopened at once where it stopped, still live (MongoDB).
    #[cfg(feature = "mongodb")]
    Widen,
}

/// A backend's subscription to changes of its locks: how to subscribe and how to read events
/// into `(name, change)` deliveries. One feed serves one run of the task; see the
/// [module docs](self).
pub(crate) trait Feed: Send + 'static {
    /// What the feed is, for logs ("lock change stream on app.locks").
    fn label(&self) -> &str;

    /// Opens the subscription (or resumes it where it broke). A feed that covers only some
    /// names installs its coverage with [`Hub::cover`] once open.
    fn open(&mut self, hub: &Hub) -> impl Future<Output = Result<Opened, OpenFailed>> + Send;

    /// Reads events from the open subscription and delivers each to `hub` (typically with
    /// [`Hub::deliver`], or [`Hub::wake_all`]`(true)` for an event that may concern every
    /// lock), until the subscription breaks. Dropped whenever the task stops.
    fn deliver(&mut self, hub: &Hub) -> impl Future<Output = Broke> + Send;

    /// Closes the subscription after it broke (before the next [`open`](Self::open)).
    fn close(&mut self);

    /// Closes the subscription of a task that is stopping because its backend is gone.
    fn retire(mut self) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
    {
        self.close();
        std::future::ready(())
    }
}

/// Marks the task gone when it ends for any reason (also when its runtime shuts down), so the
/// next use starts a new one, and wakes every waiter so nobody waits for changes that will not
/// come.
struct Running(Arc<Hub>);

impl Drop for Running {
    fn drop(&mut self) {
        // Also after `Unavailable`: the next task probes again.
        self.0.set_status(Status::Idle);
        self.0.wake_all(false);
    }
}

/// Sleeps for `d` unless stopped first; false when stopped.
async fn pause(d: Duration, stopped: &mut oneshot::Receiver<()>) -> bool {
    tokio::select! {
        _ = stopped => false,
        _ = tokio::time::sleep(d) => true,
    }
}

fn retry_backoff() -> crate::wait::Backoff {
    WaitStrategy::ExponentialBackoff {
        initial: Duration::from_millis(50),
        max: Duration::from_secs(5),
        multiplier: 2.0,
        jitter: 0.25,
    }
    .start()
}

/// The task; see the [module docs](self). Ends when `stopped` fires (or its sender is
/// dropped).
pub(crate) async fn run<F: Feed>(hub: Arc<Hub>, mut feed: F, mut stopped: oneshot::Receiver<()>) {
    let _running = Running(hub.clone());
    let mut retry = retry_backoff();
    let mut warned = false;
    let mut subscribed_before = false;
    // Set while notifications were unavailable since the last open: holders were not told.
    let mut unavailable = false;
    loop {
        let opened = tokio::select! {
            _ = &mut stopped => return,
            r = feed.open(&hub) => r,
        };
        let opened = match opened {
            Ok(opened) => opened,
            #[cfg(feature = "mongodb")]
            Err(OpenFailed::Unavailable) => {
                unavailable = true;
                if hub.status() != Status::Unavailable {
                    hub.set_status(Status::Unavailable);
                    // Waiters switch to polling without registrations.
                    hub.wake_all(false);
                }
                if !pause(REPROBE_EVERY, &mut stopped).await {
                    return;
                }
                retry = retry_backoff();
                continue;
            }
            #[cfg(feature = "mongodb")]
            Err(OpenFailed::ResumeLost) => {
                hub.set_status(Status::Opening);
                hub.wake_all(false);
                continue;
            }
            Err(OpenFailed::Failed(error)) => {
                if !warned {
                    warned = true;
                    tracing::warn!(%error, "cannot open the {}; waiters poll until it is back", feed.label());
                } else {
                    tracing::debug!(%error, "cannot open the {} yet", feed.label());
                }
                // Waiters sleeping until an expiry switch to polling while the subscription is
                // down (a resume later replays what they missed).
                if hub.status() != Status::Opening {
                    hub.set_status(Status::Opening);
                    hub.wake_all(false);
                }
                if !pause(retry.next_delay(), &mut stopped).await {
                    return;
                }
                continue;
            }
        };
        let opened_at = Instant::now();
        hub.set_status(Status::Live);
        if warned || unavailable {
            tracing::info!("the {} is back", feed.label());
            warned = false;
        }
        match opened {
            Opened::Fresh => {
                tracing::debug!("the {} is open", feed.label());
                // Whatever happened before is unknown: every waiter re-checks once, and after a
                // lost subscription (or while notifications were unavailable) every holder
                // reads its lock once.
                hub.wake_all(subscribed_before || unavailable);
            }
            #[cfg(feature = "mongodb")]
            Opened::Resumed => tracing::debug!("the {} resumed", feed.label()),
        }
        subscribed_before = true;
        unavailable = false;
        let broke = tokio::select! {
            _ = &mut stopped => None,
            broke = feed.deliver(&hub) => Some(broke),
        };
        let Some(broke) = broke else {
            return feed.retire().await;
        };
        let quick = opened_at.elapsed() < HEALTHY_AFTER;
        // A widening is no failure: reopened at once.
        #[cfg(feature = "mongodb")]
        let quick = quick && broke != Broke::Widen;
        if !quick {
            retry = retry_backoff();
        }
        match broke {
            // Reopened at once where it stopped: nothing is missed, it stays live.
            #[cfg(feature = "mongodb")]
            Broke::Widen => {}
            // Changes meanwhile are delivered once it resumes.
            #[cfg(feature = "mongodb")]
            Broke::Resumable => hub.set_status(Status::Resuming),
            Broke::Lost => {
                hub.set_status(Status::Opening);
                hub.wake_all(false);
            }
        }
        feed.close();
        if quick && !pause(retry.next_delay(), &mut stopped).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::backends::notify::hub::Change;

    /// One step of a scripted feed.
    enum Step {
        Open(Result<Opened, OpenFailed>),
        /// Delivers a release of `x`, then breaks.
        Deliver(Broke),
        /// Delivers nothing and never breaks.
        #[cfg(feature = "mongodb")]
        Hang,
    }

    struct Scripted {
        steps: Arc<Mutex<VecDeque<Step>>>,
        closed: Arc<Mutex<Vec<&'static str>>>,
    }

    impl Scripted {
        fn next(&self) -> Option<Step> {
            self.steps.lock().unwrap().pop_front()
        }
    }

    impl Feed for Scripted {
        fn label(&self) -> &str {
            "scripted feed"
        }

        async fn open(&mut self, _hub: &Hub) -> Result<Opened, OpenFailed> {
            match self.next() {
                Some(Step::Open(r)) => r,
                _ => std::future::pending().await,
            }
        }

        async fn deliver(&mut self, hub: &Hub) -> Broke {
            match self.next() {
                Some(Step::Deliver(broke)) => {
                    hub.deliver(
                        "x",
                        Change::Lease {
                            lease_id: None,
                            token: Some(1),
                        },
                        true,
                    );
                    broke
                }
                _ => std::future::pending().await,
            }
        }

        fn close(&mut self) {
            self.closed.lock().unwrap().push("close");
        }

        async fn retire(self) {
            self.closed.lock().unwrap().push("retire");
        }
    }

    fn scripted(steps: Vec<Step>) -> (Scripted, Arc<Mutex<Vec<&'static str>>>) {
        let closed = Arc::new(Mutex::new(Vec::new()));
        let feed = Scripted {
            steps: Arc::new(Mutex::new(steps.into())),
            closed: closed.clone(),
        };
        (feed, closed)
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[cfg(feature = "mongodb")]
    #[tokio::test]
    async fn resubscribing_tells_holders_and_retiring_ends_the_task() {
        let hub = Hub::new(Status::Opening);
        let holder = hub.name("x");
        let mut changes = holder.state().subscribe();
        let (feed, closed) = scripted(vec![
            Step::Open(Err(OpenFailed::Failed("refused".into()))),
            Step::Open(Ok(Opened::Fresh)),
            Step::Deliver(Broke::Resumable),
            Step::Open(Ok(Opened::Resumed)),
            Step::Deliver(Broke::Lost),
            Step::Open(Ok(Opened::Fresh)),
            Step::Hang,
        ]);
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(hub.clone(), feed, stopped));
        // First fresh open: waiters re-check, holders are not told; then the release of `x`.
        // Resumed: nothing to re-check. Lost and reopened afresh: holders read their lock.
        let mut seen = Vec::new();
        while seen.last() != Some(&Change::Unknown) {
            changes.changed().await.unwrap();
            seen.push(changes.borrow_and_update().1.clone());
        }
        let release = Change::Lease {
            lease_id: None,
            token: Some(1),
        };
        assert_eq!(seen[0], release);
        assert_eq!(*seen.last().unwrap(), Change::Unknown);
        assert!(seen[..seen.len() - 1].iter().all(|c| *c == release));
        settle().await;
        assert!(hub.is_live());
        drop(stop);
        task.await.unwrap();
        assert_eq!(hub.status(), Status::Idle);
        assert_eq!(*closed.lock().unwrap(), ["close", "close", "retire"]);
    }

    #[cfg(feature = "mongodb")]
    #[tokio::test]
    async fn unavailable_is_probed_again_and_holders_read_once_it_is_back() {
        let hub = Hub::new(Status::Opening);
        let waiter = hub.change_waiter("x");
        let holder = hub.name("x");
        let mut changes = holder.state().subscribe();
        let (feed, _) = scripted(vec![
            Step::Open(Err(OpenFailed::Unavailable)),
            Step::Open(Err(OpenFailed::Unavailable)),
            Step::Open(Ok(Opened::Fresh)),
            Step::Hang,
        ]);
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(hub.clone(), feed, stopped));
        // The waiter was woken to poll.
        assert!(waiter.wait(Duration::from_secs(5)).await);
        assert_eq!(hub.status(), Status::Unavailable);
        assert!(!task.is_finished(), "the task stays to probe again");
        // Probed again after REPROBE_EVERY, twice: live, and every holder reads its lock.
        tokio::time::timeout(Duration::from_secs(10), changes.changed())
            .await
            .expect("holders are told once the feed is back")
            .unwrap();
        assert_eq!(changes.borrow_and_update().1, Change::Unknown);
        assert_eq!(hub.status(), Status::Live);
        drop(stop);
        task.await.unwrap();
        // Idle again: the next use starts a new task.
        assert_eq!(hub.status(), Status::Idle);
    }

    #[tokio::test]
    async fn not_live_while_down() {
        let hub = Hub::new(Status::Opening);
        let (feed, _) = scripted(vec![
            Step::Open(Ok(Opened::Fresh)),
            Step::Deliver(Broke::Lost),
            Step::Open(Err(OpenFailed::Failed("refused".into()))),
        ]);
        let (_stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(hub.clone(), feed, stopped));
        settle().await;
        assert!(!hub.is_live());
        assert_eq!(hub.status(), Status::Opening);
        task.abort();
        let _ = task.await;
        // Cancelled with its runtime, or aborted: idle again, so the next use starts it.
        assert_eq!(hub.status(), Status::Idle);
    }
}
