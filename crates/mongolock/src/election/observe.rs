//! Observing a role without campaigning: [`LeaderInfo`], [`Election::leader`] and
//! [`Election::watch_leader`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures_util::stream::{self, Stream, StreamExt};

use super::{Election, Leadership};
use crate::backend::{LeaseId, LockBackend, LockBackendExt, LockInfo};
use crate::error::Result;
use crate::holder::HolderInfo;

/// Who leads a role, as read from the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The role name.
    pub role: String,
    /// The leader's term: the fencing token of its lease, always the leader's own. A candidate
    /// whose lease was granted but whose token is still being issued (MongoDB, a few
    /// milliseconds) is not reported as leader until it has its term: it has not won yet (its
    /// campaign returns only with the token).
    pub term: u64,
    /// The lease id of the leader's lease.
    pub lease_id: Option<LeaseId>,
    /// Host, process id and application name of the leader (as stored with its lease).
    pub holder: Option<HolderInfo>,
    /// Server time at which the term began.
    pub since: Option<SystemTime>,
    /// Server time at which the leader's lease expires unless extended again.
    pub expires_at: Option<SystemTime>,
    /// Server time of the read.
    pub observed_at: SystemTime,
}

impl LeaderInfo {
    /// The leader described by a lock's state; `None` when nobody holds an unexpired lease, or
    /// when the lease has no token yet (see [`term`](Self::term)).
    pub fn from_lock_info(info: &LockInfo) -> Option<LeaderInfo> {
        if !info.held {
            return None;
        }
        Some(LeaderInfo {
            role: info.name.clone(),
            term: info.fencing_token?,
            lease_id: info.lease_id.clone(),
            holder: info.holder.clone(),
            since: info.acquired_at,
            expires_at: info.expires_at,
            observed_at: info.observed_at,
        })
    }

    /// Whether this is `leadership`'s term (same lease).
    pub fn is(&self, leadership: &Leadership) -> bool {
        self.lease_id.as_ref() == Some(leadership.lease_id())
    }
}

impl Election {
    /// The current leader, read from the backend (one round trip); `None` when nobody leads
    /// (never elected, resigned, or the last leader's lease expired).
    ///
    /// # Errors
    /// The backend's error, without retry: [`Error::Unavailable`](crate::Error::Unavailable)
    /// when it cannot be reached, [`Error::Backend`](crate::Error::Backend) when it refuses the
    /// read; [`Error::MissingLockTable`](crate::Error::MissingLockTable) on PostgreSQL before
    /// anyone campaigned on the table (a read creates nothing; the first campaign creates it).
    ///
    /// # Cancel safety
    /// Cancel-safe: a read; dropping the future changes nothing.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        let info = self.provider.inspect(&self.role).await?;
        Ok(info.as_ref().and_then(LeaderInfo::from_lock_info))
    }

    /// A stream of leader changes, without campaigning.
    ///
    /// The first item is the current leader (or `None`); after that an item comes each time the
    /// leader changes: a new term, or `None` when the role became free (resigned, or the leader's
    /// lease expired). Lease extensions are not changes. The role is re-read every
    /// [`poll_interval`](Election::with_poll_interval), earlier when the backend reports a change
    /// on it, and at the moment the observed leader's lease would expire. A failed read is
    /// yielded as an `Err` item and the stream goes on (the next item then reports a change
    /// relative to the last `Ok` item).
    ///
    /// Nothing runs in the background: the backend is read only while the stream is polled, and
    /// dropping the stream stops everything.
    pub fn watch_leader(&self) -> LeaderWatch {
        let state = WatchState {
            backend: self.provider.backend().clone(),
            role: self.role.clone(),
            interval: self.poll_interval,
            last: None,
            next_wait: None,
        };
        let inner = stream::unfold(state, |mut state| async move {
            let item = state.next_change().await;
            Some((item, state))
        });
        LeaderWatch {
            inner: Box::pin(inner),
        }
    }
}

struct WatchState {
    backend: Arc<dyn LockBackend>,
    role: Arc<str>,
    interval: Duration,
    /// The leader's term as last yielded (`Some(None)`: yielded "no leader"); `None` before the
    /// first item.
    last: Option<Option<u64>>,
    /// How long to wait before the next read; `None` before the first read.
    next_wait: Option<Duration>,
}

impl WatchState {
    async fn next_change(&mut self) -> Result<Option<LeaderInfo>> {
        loop {
            if let Some(wait) = self.next_wait {
                self.backend.wait_for_change(&self.role, wait).await;
            }
            self.next_wait = Some(self.interval);
            let leader = self
                .backend
                .inspect(&self.role)
                .await?
                .as_ref()
                .and_then(LeaderInfo::from_lock_info);
            if let Some(expires_at) = leader.as_ref().and_then(|l| l.expires_at) {
                // Re-read just after the lease would expire if it is not extended.
                let observed = leader.as_ref().map_or(expires_at, |l| l.observed_at);
                if let Ok(left) = expires_at.duration_since(observed) {
                    let wait = left + Duration::from_millis(1);
                    self.next_wait = Some(wait.min(self.interval));
                }
            }
            let key = leader.as_ref().map(|l| l.term);
            if self.last != Some(key) {
                self.last = Some(key);
                return Ok(leader);
            }
        }
    }
}

/// A stream of leader changes from [`Election::watch_leader`]. Never ends by itself; drop it to
/// stop watching.
pub struct LeaderWatch {
    inner: Pin<Box<dyn Stream<Item = Result<Option<LeaderInfo>>> + Send>>,
}

impl std::fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWatch").finish_non_exhaustive()
    }
}

impl LeaderWatch {
    /// The next change: the new leader, or `None` when the role became free.
    ///
    /// # Errors
    /// A failed read of the role (as [`Election::leader`]); the watch goes on, and the next
    /// call reports a change relative to the last successful item.
    ///
    /// # Cancel safety
    /// Cancel-safe: the read or wait in progress stays in the stream and continues on the next
    /// call, so no change is lost.
    pub async fn next_change(&mut self) -> Result<Option<LeaderInfo>> {
        match self.inner.next().await {
            Some(item) => item,
            // The stream is an `unfold` whose step always yields `Some`: it never ends.
            None => std::future::pending().await,
        }
    }
}

impl Stream for LeaderWatch {
    type Item = Result<Option<LeaderInfo>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}
