//! What a database backend remembers of the leases it granted: whether each is a semaphore
//! slot (MongoDB's extend, release and loss checks take the slot path, `mongo/slots.rs`) and
//! its fencing token, by which a release that finds the lease gone tells its own earlier try
//! from a loss (MongoDB: `mongo/document.rs` `released_by_holder`; PostgreSQL: "Release" in
//! its module docs).
//!
//! A lease is remembered from its grant until [`RELEASED_KEPT_FOR`] after its release had an
//! outcome (success, loss or error), and at most [`KEPT_RELEASED_MAX`] released leases are
//! kept: so a repeated release (a caller's retry after a reply it never saw, or after an
//! error) is still recognised within the release timeout, and memory stays bounded.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::backend::{LeaseId, RELEASED_KEPT_FOR};
use crate::error::Result;

/// What a backend remembers of one lease it granted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Granted {
    /// A semaphore slot (else an exclusive lease).
    pub(crate) slot: bool,
    /// The lease's fencing token.
    pub(crate) token: u64,
    /// Granted by the uncontended shortcut ([`CheapNames`]; nobody was queued then): its
    /// release tries the short command first (`mongo/ops.rs` `release`, PostgreSQL's
    /// `release`).
    pub(crate) shortcut: bool,
}

/// At most this many exclusive leases are remembered (a process holding more at once, or
/// whose releases keep failing, has its retried releases reported as losses: the safe
/// direction). Slots are always remembered: their path depends on it.
const MAX_REMEMBERED: usize = 1 << 16;

/// At most this many released leases are remembered (the oldest are forgotten first): at
/// 2,000 releases a second by one process, still 8 s, above the default release timeout.
const KEPT_RELEASED_MAX: usize = 1 << 14;

#[derive(Debug, Default)]
pub(crate) struct Leases {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each lease, and whether its release had an outcome.
    granted: HashMap<LeaseId, (Granted, bool)>,
    /// Released leases, oldest first, with the time of their release's outcome.
    released: VecDeque<(LeaseId, Instant)>,
}

impl Leases {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Single inserts, reads and removals: a poisoned map is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers a lease this backend granted.
    pub(crate) fn granted(&self, lease_id: &LeaseId, granted: Granted) {
        let mut inner = self.inner();
        if granted.slot || inner.granted.len() < MAX_REMEMBERED {
            inner.granted.insert(lease_id.clone(), (granted, false));
        }
    }

    pub(crate) fn get(&self, lease_id: &LeaseId) -> Option<Granted> {
        self.inner().granted.get(lease_id).map(|(g, _)| *g)
    }

    pub(crate) fn is_slot(&self, lease_id: &LeaseId) -> bool {
        self.get(lease_id).is_some_and(|g| g.slot)
    }

    /// The release of `lease_id` had an outcome (success, loss or error): it is forgotten
    /// [`RELEASED_KEPT_FOR`] later, or earlier when [`KEPT_RELEASED_MAX`] leases were
    /// released since.
    pub(crate) fn released(&self, lease_id: &LeaseId) {
        let now = Instant::now();
        let mut inner = self.inner();
        match inner.granted.get_mut(lease_id) {
            Some((_, released)) if !*released => *released = true,
            _ => return,
        }
        inner.released.push_back((lease_id.clone(), now));
        while let Some((_, at)) = inner.released.front() {
            if inner.released.len() <= KEPT_RELEASED_MAX
                && now.saturating_duration_since(*at) <= RELEASED_KEPT_FOR
            {
                break;
            }
            if let Some((old, _)) = inner.released.pop_front() {
                inner.granted.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_lease_is_remembered_for_the_next_releases_then_forgotten() {
        // (Forgetting after `RELEASED_KEPT_FOR` is the same loop, by time.)
        let leases = Leases::default();
        let first = LeaseId::random();
        leases.granted(
            &first,
            Granted {
                slot: true,
                token: 7,
                shortcut: false,
            },
        );
        leases.released(&first);
        leases.released(&first);
        assert_eq!(leases.get(&first).map(|g| g.token), Some(7));
        assert!(leases.is_slot(&first));
        for token in 0..KEPT_RELEASED_MAX as u64 - 1 {
            let id = LeaseId::random();
            leases.granted(
                &id,
                Granted {
                    slot: false,
                    token,
                    shortcut: false,
                },
            );
            leases.released(&id);
        }
        assert!(leases.get(&first).is_some(), "forgotten too early");
        let last = LeaseId::random();
        leases.granted(
            &last,
            Granted {
                slot: false,
                token: 1,
                shortcut: false,
            },
        );
        leases.released(&last);
        assert!(leases.get(&first).is_none(), "kept too long");
        assert!(leases.get(&last).is_some());
        assert_eq!(leases.inner().granted.len(), KEPT_RELEASED_MAX);
    }
}

/// The names whose document (or row) this backend's own last release left released, with
/// nobody queued: a first attempt on one of them tries the backend's uncontended shortcut
/// first (MongoDB: `mongo/acquire.rs` `try_acquire_cheap`; PostgreSQL: "The uncontended
/// shortcut" in its module docs). Each release earns one cheap attempt (taken whether it grants
/// or not), so a name that another process took meanwhile costs one missed command, then full
/// attempts until this backend releases it unqueued again.
#[derive(Debug, Default)]
pub(crate) struct CheapNames {
    names: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// At most this many names are remembered (then the set starts over: a forgotten name costs
/// nothing but its shortcut).
const CHEAP_NAMES_MAX: usize = 4096;

impl CheapNames {
    fn names(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        // Single inserts and removals: a poisoned set is still consistent.
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This backend released `name`, and the reply showed nobody queued.
    pub(crate) fn released_unqueued(&self, name: &str) {
        let mut names = self.names();
        if names.len() >= CHEAP_NAMES_MAX {
            names.clear();
        }
        names.insert(name.to_owned());
    }

    /// Whether to try the cheap attempt on `name` (once per release).
    pub(crate) fn take(&self, name: &str) -> bool {
        self.names().remove(name)
    }
}

/// Most tainted ids remembered; past it (a backend whose attempts keep failing and whose
/// leases are never released) the set starts afresh, and a forgotten id is released without
/// being retired.
const MAX_TAINTED: usize = 1 << 16;

/// The lease ids of this backend whose attempts failed (outcome unknown), until released.
#[derive(Debug, Default)]
pub(crate) struct Tainted(Mutex<HashSet<String>>);

impl Tainted {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // Single inserts and removes: a poisoned set is consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Passes an attempt's result of `id` through, remembering `id` when the attempt failed
    /// with a transient error: its outcome is unknown, so its command may still be applied
    /// later (`mongo/retired.rs`). A permanent error is the server's refusal, or was found
    /// before anything was sent.
    pub(crate) fn note<T>(&self, id: &LeaseId, result: Result<T>) -> Result<T> {
        if result.as_ref().is_err_and(crate::Error::is_transient) {
            self.taint(id);
        }
        result
    }

    /// Remembers that an attempt of `id` failed.
    fn taint(&self, id: &LeaseId) {
        let mut set = self.set();
        if set.len() >= MAX_TAINTED {
            set.clear();
        }
        set.insert(id.as_str().to_owned());
    }

    /// Whether an attempt of `id` failed (and its release has not retired it yet).
    pub(crate) fn contains(&self, id: &LeaseId) -> bool {
        self.set().contains(id.as_str())
    }

    /// Forgets `id` (retired).
    pub(crate) fn forget(&self, id: &LeaseId) {
        self.set().remove(id.as_str());
    }
}
