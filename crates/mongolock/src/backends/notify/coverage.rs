//! Narrowed feeds (MongoDB, PostgreSQL): the [`Hub`] part for a feed that delivers the changes
//! of some names only, or only some changes of them.
//!
//! A feed may deliver the changes of some names only (MongoDB narrows its change stream to the
//! names this process waits on or holds, `mongo/watch.rs`; PostgreSQL listens on the channels
//! of their buckets, `postgres/listen.rs`). The hub records which names the open feed covers
//! and how ([`Hub::cover`]; every change of every name unless a feed says otherwise):
//!
//! * **fully**: every change of the name is delivered — what holders (a takeover, a
//!   force-release) and observers need;
//! * **for handoffs** (MongoDB only): only the releases that concern this process's acquirers
//!   are delivered — those that designate this process, first or as backup, or nobody, and the
//!   writes that designate no one at all (the handoff queue, `mongo/queue.rs`). That is all an acquirer
//!   needs: a grant frees nothing, and a release that designates two other processes is theirs
//!   to act on.
//!
//! The rules that keep a narrowed feed from losing a wake-up:
//!
//! * An acquirer is [live](crate::backend::ChangeWaiter::is_live) only when the feed is live
//!   **and covers its name** (either way) at registration; otherwise it polls with the wait
//!   strategy.
//! * An acquirer about to wait on a name that is not covered asks for it ([`Hub::want`]), an
//!   observer for a name that is not covered fully ([`Hub::want_fully`]); the feed widens
//!   itself, resuming from where it was, and then [re-checks](Hub::cover) the newly covered
//!   names: their acquirers and observers are woken and their holders read their lock once,
//!   since changes before the widening may have been missed.
//! * A name held here for a while is covered fully ([`Hub::uncovered_since`]), so that a
//!   long-held lease learns of a takeover or force-release from the feed; a lease released soon
//!   after its grant costs the feed nothing.
//! * A name is never dropped from coverage while it has an entry: a narrowed feed is built from
//!   the registry's names, and a name registered after that snapshot but left out is woken and
//!   asked for again when the new coverage is installed.

use std::sync::Arc;
use std::time::Instant;

use super::hub::{Change, Covered, Hub, NameState};

/// What this process does with a name, for a feed deciding how to cover it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Interest {
    /// An observer waits for any change of it.
    pub(crate) observed: bool,
    /// Held here, without a break, since then.
    pub(crate) held_since: Option<Instant>,
}

/// Whether `covered` gives the users of a name's entry what they must have at once: acquirers
/// need the name covered, observers need it covered fully (holders are covered fully lazily,
/// [`Hub::uncovered_since`]).
fn satisfied(covered: &Covered, name: &str, st: &NameState) -> bool {
    covered.covers(name) && (!st.is_observed() || covered.covers_fully(name))
}

impl Hub {
    /// Asks the feed to cover `name` (which must have an entry, held by the caller) if it does
    /// not yet: an acquirer about to wait.
    pub(crate) fn want(&self, name: &str) {
        self.ask_unless(name, Covered::covers);
    }

    /// Asks the feed to deliver every change of `name` (which must have an entry, held by the
    /// caller) if it does not yet: an observer.
    pub(crate) fn want_fully(&self, name: &str) {
        self.ask_unless(name, Covered::covers_fully);
    }

    /// Asks the feed to widen unless `covered` says the open feed already covers `name`.
    fn ask_unless(&self, name: &str, covered: fn(&Covered, &str) -> bool) {
        let mut names = self.names();
        if !covered(&names.covered, name) {
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

    /// Whether a name that is not covered (as its users need) was wanted since the last
    /// [`interest`](Self::interest) and is still in use without that coverage.
    pub(crate) fn is_wanted(&self) -> bool {
        let mut names = self.names();
        if names.wanted
            && names
                .map
                .iter()
                .all(|(n, st)| satisfied(&names.covered, n, st))
        {
            // Covered meanwhile (asked for while the feed was widening), or no longer in use.
            names.wanted = false;
        }
        names.wanted
    }

    /// Whether some name without coverage has had an entry since `before` or earlier, or some
    /// name held here since `before` or earlier is not covered fully (held names are covered
    /// lazily, so that a lease released soon after its grant costs the feed nothing).
    pub(crate) fn uncovered_since(&self, before: Instant) -> bool {
        let names = self.names();
        if names.covered == Covered::All {
            return false;
        }
        names.map.iter().any(|(name, st)| {
            (st.since <= before && !names.covered.covers(name))
                || (st.held_since().is_some_and(|t| t <= before)
                    && !names.covered.covers_fully(name))
        })
    }

    /// The names somebody here waits on, observes or holds, and how, for a feed about to narrow
    /// itself to them; clears [`is_wanted`](Self::is_wanted).
    pub(crate) fn interest(&self) -> Vec<(Arc<str>, Interest)> {
        let mut names = self.names();
        names.wanted = false;
        names
            .map
            .iter()
            .map(|(name, st)| {
                let interest = Interest {
                    observed: st.is_observed(),
                    held_since: st.held_since(),
                };
                (name.clone(), interest)
            })
            .collect()
    }

    /// Installs what a feed that was just opened (or reopened where it was) covers, and
    /// re-checks the names that were not covered (or not fully) before: their acquirers and
    /// observers are woken and their holders read their lock once (changes before now may
    /// have been missed). A name with an entry that `covered` leaves out (registered after the
    /// feed's [`interest`](Self::interest) snapshot) is woken too and wanted again; so is an
    /// observed name it no longer covers fully.
    pub(crate) fn cover(&self, covered: Covered) {
        let mut names = self.names();
        let before = std::mem::replace(&mut names.covered, covered);
        names.seq += 1;
        let seq = names.seq;
        let mut left_out = false;
        for (name, st) in &names.map {
            let now = &names.covered;
            match (before.covers(name), now.covers(name)) {
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
                _ => match (before.covers_fully(name), now.covers_fully(name)) {
                    (false, true) => {
                        // Grants, takeovers and force-releases may have been left out.
                        st.all.notify_waiters();
                        st.changes.send_replace((seq, Change::Unknown));
                    }
                    (true, false) if st.is_observed() => {
                        left_out = true;
                        st.all.notify_waiters();
                    }
                    _ => {}
                },
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
    use std::time::Duration;

    use super::super::hub::{Narrowed, Status};
    use super::*;

    fn only(full: &[&str], handoffs: &[&str]) -> Covered {
        let set = |names: &[&str]| names.iter().map(|&n| Arc::from(n)).collect();
        Covered::Only(Narrowed {
            full: set(full),
            handoffs: set(handoffs),
        })
    }

    #[tokio::test]
    async fn uncovered_names_poll_until_covered_then_re_check() {
        let hub = Hub::new(Status::Live);
        hub.cover(only(&[], &[]));
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
        hub.cover(only(&["x"], &[]));
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
        hub.cover(only(&[], &[]));
        assert!(waiting.await.unwrap());
        assert!(hub.is_wanted());
        // Covering every name asks for nothing.
        hub.cover(Covered::All);
        assert!(!hub.is_wanted());
        assert!(hub.is_live_for("y"));
    }

    #[tokio::test]
    async fn names_covered_for_handoffs_serve_acquirers_and_widen_for_observers_and_long_holds() {
        let hub = Hub::new(Status::Live);
        hub.cover(only(&[], &["x"]));
        // Acquirers are live on a name covered for handoffs.
        let w = hub.change_waiter("x");
        assert!(w.is_live() && hub.is_live_for("x"));
        drop(w);
        // A holder reads its lock once when the name becomes covered fully.
        let held = hub.holder("x");
        let mut changes = held.entry().state().subscribe();
        assert!(
            !hub.uncovered_since(Instant::now() - Duration::from_secs(5)),
            "a lease held for less than the delay costs the feed nothing"
        );
        assert!(
            hub.uncovered_since(Instant::now() + Duration::from_secs(1)),
            "a long-held name covered only for handoffs is to be covered fully"
        );
        let interest = hub.interest();
        assert_eq!(interest.len(), 1);
        assert!(!interest[0].1.observed && interest[0].1.held_since.is_some());
        hub.cover(only(&["x"], &[]));
        changes.changed().await.unwrap();
        assert_eq!(changes.borrow_and_update().1, Change::Unknown);
        assert!(!hub.uncovered_since(Instant::now() + Duration::from_secs(1)));
        drop(changes);
        drop(held);
        // An observer of a name covered only for handoffs asks for it fully, and is woken to
        // re-check once it is.
        hub.cover(only(&[], &["y"]));
        let observing = {
            let hub = hub.clone();
            tokio::spawn(async move { hub.wait_for_change("y", Duration::from_secs(30)).await })
        };
        hub.widen_wanted().await;
        assert!(hub.is_wanted());
        let interest = hub.interest();
        assert!(interest.iter().any(|(n, i)| &**n == "y" && i.observed));
        hub.cover(only(&["y"], &[]));
        tokio::time::timeout(Duration::from_secs(10), observing)
            .await
            .expect("the observer was woken once the name was covered fully")
            .unwrap();
        assert!(!hub.is_wanted());
    }
}
