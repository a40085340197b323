//! What the cross-process handoff queues of the MongoDB (`mongo/queue.rs`) and PostgreSQL
//! (`postgres/queue.rs`) backends share: the backend's mark, when an attempt registers or
//! requeues, the limits of a queue, and whom a release designated.
//!
//! Each backend (one per process, as a rule) has a **mark**, [`new_mark`], that starts its
//! lease ids and names it in the queue of a lock. A busy attempt of an acquirer that is going to
//! wait for a change, while the backend's feed delivers the changes of the name, registers the
//! mark in the lock's queue; a grant removes it, or moves it to the end when more of the
//! backend's acquirers wait ([`Queueing`]). A release pops the first live entry: the
//! **designated** backend ([`Handoff`]) wakes one acquirer at once, every other backend that
//! receives the release one only after
//! [`HANDOFF_FALLBACK`](crate::backends::notify::hub::HANDOFF_FALLBACK) if nothing else happened
//! to the name (`backends/notify/hub.rs`, `Hub::deliver`). (MongoDB's change streams deliver a
//! release only to the designated backend and a backup, the next in the queue, among the
//! processes that only wait on the name: `mongo/watch.rs`.) Entries live until the
//! holder's expiry plus [`REGISTRATION`] (a waiter re-registers each time it wakes at the
//! holder's expiry and finds the lease extended), so a process that died leaves the queue by
//! itself; a queue holds at most [`MAX_WAITERS`] entries. A process whose last acquirer of a
//! name stops waiting without the lock withdraws its entry at once, in the background
//! (`Hub::withdraw_later` in `hub.rs`, `withdraw` in each queue module).
//!
//! The queue only orders who tries first: every backend keeps acquisition one atomic test of
//! "free or expired by the server's clock" and grant, so a queue cannot break mutual exclusion
//! or token order, and a wrong or stale designation costs at most the fallback delay.

use std::time::Duration;

/// How long a registration outlives the holder's expiry.
pub(crate) const REGISTRATION: Duration = Duration::from_secs(2);

/// Most entries in a queue; later processes are not queued (the fallback wakes them).
pub(crate) const MAX_WAITERS: i64 = 64;

/// A new mark for one backend: 16 random hex digits and `-`. Lease ids are hex digits, so the
/// ids a backend marks with it are exactly the strings in `[mark, mark with '-' replaced by
/// '.')` (`.` follows `-`), and a mark never contains a space or a `/`.
pub(crate) fn new_mark() -> String {
    format!("{:016x}-", rand::random::<u64>())
}

/// What an acquire attempt does with the lock's queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Queueing<'a> {
    /// The backend's mark (the prefix of its lease ids).
    pub(crate) mark: &'a str,
    /// Register the backend when the attempt is busy.
    pub(crate) register: bool,
    /// Keep the backend at the end of the queue when the attempt is granted.
    pub(crate) requeue: bool,
}

impl<'a> Queueing<'a> {
    /// The queueing of an attempt of a backend with `mark`, while `acquirers` of its acquirers
    /// (this attempt's own included, registered before it when the call will wait) wait for a
    /// change of the name, and the feed delivers the name's changes (`live`): a busy attempt
    /// registers when the caller will wait for a change that the feed will report (a release
    /// must never designate a process that would not hear of it), and a grant requeues when
    /// more of the backend's acquirers wait.
    pub(crate) fn new(mark: &'a str, acquirers: usize, live: bool) -> Queueing<'a> {
        Queueing {
            mark,
            register: acquirers >= 1 && live,
            requeue: acquirers >= 2,
        }
    }
}

/// Whom a release handed the lock to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Handoff {
    /// Not known (the event or reply says nothing, e.g. written by an older version): wake one
    /// acquirer per process, as without a queue.
    Unknown,
    /// Nobody was queued: wake one acquirer per process.
    Nobody,
    /// The backend with this mark.
    To(String),
}

impl Handoff {
    /// The handoff to `mark`, an empty mark meaning nobody.
    pub(crate) fn to_mark(mark: &str) -> Handoff {
        if mark.is_empty() {
            Handoff::Nobody
        } else {
            Handoff::To(mark.to_owned())
        }
    }

    /// Whether a process whose backend has mark `own` should wake one of its acquirers at once.
    pub(crate) fn wakes(&self, own: &str) -> bool {
        match self {
            Handoff::To(m) => m == own,
            Handoff::Unknown | Handoff::Nobody => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_designations_and_queueing() {
        let m = new_mark();
        assert_eq!(m.len(), 17);
        assert!(m.ends_with('-') && !m.contains(' ') && !m.contains('/'));
        assert_ne!(m, new_mark());
        assert_eq!(Handoff::to_mark(""), Handoff::Nobody);
        assert!(Handoff::to_mark("m-").wakes("m-"));
        assert!(!Handoff::to_mark("m-").wakes("n-"));
        assert!(Handoff::Nobody.wakes("n-") && Handoff::Unknown.wakes("n-"));
        let q = Queueing::new("m-", 1, true);
        assert!(q.register && !q.requeue);
        let q = Queueing::new("m-", 2, false);
        assert!(!q.register && q.requeue);
        assert!(!Queueing::new("m-", 0, true).register);
    }
}
