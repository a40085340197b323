//! What a backend remembers of the leases it granted: whether each is a semaphore slot (its
//! extend, release and loss checks take the slot path, `slots.rs`) and its fencing token, by
//! which a release that finds the lease gone tells its own earlier try from a loss
//! (`document::released_by_holder`).
//!
//! A lease is remembered from its grant until its release has had an outcome and
//! [`KEPT_AFTER_RELEASE`] more releases of this backend followed: so a repeated release (a
//! caller's retry after a reply it never saw) is still recognised, and a release whose outcome
//! was an error stays recognisable for as long as the caller retries it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use crate::backend::LeaseId;

/// What a backend remembers of one lease it granted.
#[derive(Clone, Copy, Debug)]
pub(super) struct Granted {
    /// A semaphore slot (else an exclusive lease).
    pub(super) slot: bool,
    /// The lease's fencing token.
    pub(super) token: u64,
}

/// At most this many exclusive leases are remembered (a process holding more at once, or
/// whose releases keep failing, has its retried releases reported as losses: the safe
/// direction). Slots are always remembered: their path depends on it.
const MAX_REMEMBERED: usize = 1 << 16;

/// How many later releases a released lease is remembered for.
const KEPT_AFTER_RELEASE: usize = 1024;

#[derive(Debug, Default)]
pub(super) struct Leases {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each lease, and whether its release had an outcome.
    granted: HashMap<LeaseId, (Granted, bool)>,
    /// Released leases, oldest first (each forgotten [`KEPT_AFTER_RELEASE`] releases later).
    released: VecDeque<LeaseId>,
}

impl Leases {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Single inserts, reads and removals: a poisoned map is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers a lease this backend granted.
    pub(super) fn granted(&self, lease_id: &LeaseId, granted: Granted) {
        let mut inner = self.inner();
        if granted.slot || inner.granted.len() < MAX_REMEMBERED {
            inner.granted.insert(lease_id.clone(), (granted, false));
        }
    }

    pub(super) fn get(&self, lease_id: &LeaseId) -> Option<Granted> {
        self.inner().granted.get(lease_id).map(|(g, _)| *g)
    }

    pub(super) fn is_slot(&self, lease_id: &LeaseId) -> bool {
        self.get(lease_id).is_some_and(|g| g.slot)
    }

    /// The release of `lease_id` had an outcome: it is forgotten after
    /// [`KEPT_AFTER_RELEASE`] more.
    pub(super) fn released(&self, lease_id: &LeaseId) {
        let mut inner = self.inner();
        match inner.granted.get_mut(lease_id) {
            Some((_, released)) if !*released => *released = true,
            _ => return,
        }
        inner.released.push_back(lease_id.clone());
        while inner.released.len() > KEPT_AFTER_RELEASE {
            if let Some(old) = inner.released.pop_front() {
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
        let leases = Leases::default();
        let first = LeaseId::random();
        leases.granted(
            &first,
            Granted {
                slot: true,
                token: 7,
            },
        );
        leases.released(&first);
        leases.released(&first);
        assert_eq!(leases.get(&first).map(|g| g.token), Some(7));
        assert!(leases.is_slot(&first));
        for token in 0..KEPT_AFTER_RELEASE as u64 - 1 {
            let id = LeaseId::random();
            leases.granted(&id, Granted { slot: false, token });
            leases.released(&id);
        }
        assert!(leases.get(&first).is_some(), "forgotten too early");
        let last = LeaseId::random();
        leases.granted(
            &last,
            Granted {
                slot: false,
                token: 1,
            },
        );
        leases.released(&last);
        assert!(leases.get(&first).is_none(), "kept too long");
        assert!(leases.get(&last).is_some());
        assert_eq!(leases.inner().granted.len(), KEPT_AFTER_RELEASE);
    }
}
