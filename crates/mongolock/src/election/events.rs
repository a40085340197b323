//! [`ElectionEvent`] and the [`ElectionEvents`] stream.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::broadcast;

/// Something that happened to this process's leadership of a role. Every term this process
/// wins produces `Elected` followed, exactly once, by `Lost` or `Resigned` with the same term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElectionEvent {
    /// This process became leader.
    Elected {
        /// The term (fencing token) of the new leadership.
        term: u64,
    },
    /// Leadership ended without being given up: the lease expired, could not be extended in
    /// time, or was taken over or force-released. Work done for this term must stop.
    Lost {
        /// The term that ended.
        term: u64,
    },
    /// Leadership was given up: [`Leadership::resign`](super::Leadership::resign), a dropped
    /// [`Leadership`](super::Leadership), or the run loop resigning (its function returned or it
    /// was stopped).
    Resigned {
        /// The term that ended.
        term: u64,
    },
    /// The receiver fell behind and `count` events were dropped before it read them.
    Missed {
        /// How many events were dropped.
        count: u64,
    },
}

impl ElectionEvent {
    /// The term the event is about (`None` for [`Missed`](Self::Missed)).
    pub fn term(&self) -> Option<u64> {
        match *self {
            ElectionEvent::Elected { term }
            | ElectionEvent::Lost { term }
            | ElectionEvent::Resigned { term } => Some(term),
            ElectionEvent::Missed { .. } => None,
        }
    }
}

/// A stream of [`ElectionEvent`]s, from [`Election::events`](super::Election::events).
///
/// Read it with [`recv`](Self::recv) or as a [`Stream`]. It ends when the election, all its
/// clones and every leadership obtained through them are dropped. A reader that falls more than
/// 64 events behind gets [`ElectionEvent::Missed`] in place of the events it lost.
pub struct ElectionEvents {
    inner: Pin<Box<dyn Stream<Item = ElectionEvent> + Send>>,
}

impl std::fmt::Debug for ElectionEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectionEvents").finish_non_exhaustive()
    }
}

impl ElectionEvents {
    pub(super) fn new(rx: broadcast::Receiver<ElectionEvent>) -> Self {
        let inner = stream::unfold(rx, |mut rx| async move {
            match rx.recv().await {
                Ok(event) => Some((event, rx)),
                Err(broadcast::error::RecvError::Lagged(count)) => {
                    Some((ElectionEvent::Missed { count }, rx))
                }
                Err(broadcast::error::RecvError::Closed) => None,
            }
        });
        ElectionEvents {
            inner: Box::pin(inner),
        }
    }

    /// The next event; `None` once the stream has ended (see the type docs).
    ///
    /// # Errors
    /// None; a receiver that fell behind gets [`ElectionEvent::Missed`] instead of the events
    /// it missed.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future loses no event; the next call returns it.
    pub async fn recv(&mut self) -> Option<ElectionEvent> {
        self.inner.next().await
    }
}

impl Stream for ElectionEvents {
    type Item = ElectionEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}
