//! Narrowed feeds (MongoDB, PostgreSQL): the [`Hub`] part for a feed that delivers the changes
//! of some names only.
//!
//! A feed may deliver the changes of some names only (MongoDB narrows its change stream to the
//! names this process waits on or holds, `mongo/watch.rs`; PostgreSQL listens on the channels
//! of their buckets, `postgres/listen.rs`). The hub records which names the
//! open feed covers ([`Hub::cover`]; every name unless a feed says otherwise) and the rules
//! that keep a narrowed feed from losing a wake-up:
//!
//! * An acquirer is [live](crate::backend::ChangeWaiter::is_live) only when the feed is live **and covers its
//!   name** at registration; otherwise it polls with the wait strategy.
//! * An acquirer about to wait, or an observer, on a name that is not covered asks for it
//!   ([`Hub::want`]); the feed widens itself, resuming from where it was, and then
//!   [re-checks](Hub::cover) the newly covered names: their acquirers and observers are woken
//!   and their holders read their lock once, since changes before the widening may have been
//!   missed.
//! * A name is never dropped from coverage while it has an entry: a narrowed feed is built from
//!   the registry's names, and a name registered after that snapshot but left out is woken and
//!   asked for again when the new coverage is installed.

use std::sync::Arc;
use std::time::Instant;

use super::hub::{Change, Covered, Hub};

impl Hub {
    /// Asks the feed to cover `name` (which must have an entry, held by the caller) if it does
    /// not yet.
    pub(crate) fn want(&self, name: &str) {
        let mut names = self.names();
        if !names.covered.covers(name) {
            names.wanted = true;
            drop(names);
            self.widen.notify_one();
        }
    }

    /// Completes when a name that is not covered was wanted (at once if one was wanted since
    /// the last call). For the feed's task only (one waiter).
    pub(crate) async fn widen_wanted(&self) {
        self.widen.notified().await;
    }

    /// Whether a name that is not covered was wanted since the last [`interest`](Self::interest)
    /// and is still in use without coverage.
    pub(crate) fn is_wanted(&self) -> bool {
        let mut names = self.names();
        if names.wanted && names.map.keys().all(|n| names.covered.covers(n)) {
            // Covered meanwhile (asked for while the feed was widening), or no longer in use.
            names.wanted = false;
        }
        names.wanted
    }

    /// Whether some name without coverage has had an entry since `before` or earlier (held
    /// names are covered lazily, so that a lease released soon after its grant costs the feed
    /// nothing).
    pub(crate) fn uncovered_since(&self, before: Instant) -> bool {
        let names = self.names();
        match &names.covered {
            Covered::All => false,
            Covered::Only(set) => names
                .map
                .iter()
                .any(|(name, st)| st.since <= before && !set.contains(name)),
        }
    }

    /// The names somebody here waits on or holds, for a feed about to narrow itself to them;
    /// clears [`is_wanted`](Self::is_wanted).
    pub(crate) fn interest(&self) -> Vec<Arc<str>> {
        let mut names = self.names();
        names.wanted = false;
        names.map.keys().cloned().collect()
    }

    /// Installs what a feed that was just opened (or reopened where it was) covers, and
    /// re-checks the names that were not covered before: their acquirers and observers are
    /// woken and their holders read their lock once (changes before now may have been missed).
    /// A name with an entry that `covered` leaves out (registered after the feed's
    /// [`interest`](Self::interest) snapshot) is woken too and wanted again.
    pub(crate) fn cover(&self, covered: Covered) {
        let mut names = self.names();
        let before = std::mem::replace(&mut names.covered, covered);
        names.seq += 1;
        let seq = names.seq;
        let mut left_out = false;
        for (name, st) in &names.map {
            match (before.covers(name), names.covered.covers(name)) {
                (true, true) | (false, false) => {}
                (false, true) => {
                    st.turn.notify_waiters();
                    st.all.notify_waiters();
                    st.changes.send_replace((seq, Change::Unknown));
                }
                (true, false) => {
                    // Its acquirers may be sleeping until the holder's expiry: wake them to poll.
                    left_out = true;
                    st.turn.notify_waiters();
                    st.all.notify_waiters();
                }
            }
        }
        if left_out {
            names.wanted = true;
            drop(names);
            self.widen.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use super::super::hub::Status;
    use super::*;

    #[tokio::test]
    async fn uncovered_names_poll_until_covered_then_re_check() {
        let hub = Hub::new(Status::Live);
        hub.cover(Covered::Only(HashSet::new()));
        let holder = hub.name("x");
        let mut changes = holder.state().subscribe();
        // Not covered: the acquirer is not live, and asks for the name only once it waits.
        let w = hub.change_waiter("x");
        assert!(!w.is_live() && !hub.is_live_for("x"));
        assert!(!hub.is_wanted());
        let waiting = tokio::spawn(w.wait(Duration::from_secs(30)));
        hub.widen_wanted().await;
        assert!(hub.is_wanted());
        assert_eq!(hub.interest().len(), 1);
        assert!(!hub.is_wanted(), "the snapshot clears the request");
        // Covered: the acquirer re-checks at once and the holder reads its lock once.
        hub.cover(Covered::Only([Arc::from("x")].into()));
        assert!(
            waiting.await.unwrap(),
            "the newly covered acquirer was woken"
        );
        changes.changed().await.unwrap();
        assert_eq!(changes.borrow_and_update().1, Change::Unknown);
        assert!(hub.change_waiter("x").is_live());
        // Left out by a narrower coverage while in use: woken, and asked for again.
        let w = hub.change_waiter("x");
        assert!(w.is_live());
        let waiting = tokio::spawn(w.wait(Duration::from_secs(30)));
        tokio::task::yield_now().await;
        hub.cover(Covered::Only(HashSet::new()));
        assert!(waiting.await.unwrap());
        assert!(hub.is_wanted());
        // Covering every name asks for nothing.
        hub.cover(Covered::All);
        assert!(!hub.is_wanted());
        assert!(hub.is_live_for("y"));
    }
}
