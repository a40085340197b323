//! [`Held`]: what `exec` and `elect` run a command under — one lease ([`LockGuard`]), or the
//! leases of several names held together ([`LockSetGuard`], `exec a b -- CMD`). The supervision
//! in `exec.rs` only needs what this trait gives: the earliest local deadline (on both clocks),
//! a lost signal that fires when any lease is lost, the release, CMD's environment, and how to
//! name the leases in messages and events.

use std::future::Future;
use std::time::Duration;

use mongolock::{LockGuard, LockSetGuard, LockSetLostSignal, LostSignal};
use tokio::time::Instant;

use crate::events::{Event, Lease};
use crate::list::timestamp;

/// Environment variable holding the lock names, separated by spaces, in CMD's environment.
pub const ENV_NAMES: &str = "MONGOLOCK_NAMES";
/// Environment variable holding the fencing tokens, in the order of the names.
pub const ENV_FENCING_TOKENS: &str = "MONGOLOCK_FENCING_TOKENS";

/// The leases a supervised command runs under.
pub trait Held {
    /// The earliest local deadline of the leases (monotonic clock).
    fn local_deadline(&self) -> Instant;
    /// The same deadline on the boot clock (see `mongolock::__boot_time_now`).
    fn local_deadline_boot(&self) -> Duration;
    /// Whether any lease is lost.
    fn is_lost(&self) -> bool;
    /// Why a lease was lost (naming it when there are several), once one is.
    fn lost_reason(&self) -> Option<String>;
    /// A signal that fires when any lease is lost.
    fn lost(&self) -> Lost;
    /// `{what} "x" (fencing token 5)`, or for several names `{what} "a" (fencing token 3),
    /// "b" (fencing token 9)`: how messages name the leases.
    fn subject(&self, what: &str) -> String;
    /// The variables CMD gets, and those it must not inherit from mongolock's environment.
    fn env(&self) -> (Vec<(&'static str, String)>, Vec<&'static str>);
    /// A snapshot of each lease, for events after the guard is gone.
    fn leases(&self) -> Vec<Lease>;
    /// Ends every lease; `Error::LeaseLost` names a lease that was lost before. With a minimum
    /// hold (`exec --min-hold`), each lease is ended no earlier than that long after its grant
    /// ([`LockGuard::release_after`]).
    fn release_with(
        self,
        min_hold: Option<Duration>,
    ) -> impl Future<Output = mongolock::Result<()>> + Send;
    /// After a loss: ends the leases that are still held (of several names, the others), before
    /// mongolock exits; failures are only logged (those leases expire by themselves). One lost
    /// lease has nothing left to end.
    fn release_after_loss(self) -> impl Future<Output = ()> + Send;
}

/// [`Held::lost`]: one lease's signal or a set's.
#[derive(Clone)]
pub enum Lost {
    One(LostSignal),
    Set(LockSetLostSignal),
}

impl Lost {
    /// Completes when a lease is lost (or released). Cancel-safe.
    pub async fn wait(&self) {
        match self {
            Lost::One(s) => s.wait().await,
            Lost::Set(s) => s.wait().await,
        }
    }

    /// Why, once a lease is lost.
    pub fn reason(&self) -> Option<String> {
        match self {
            Lost::One(s) => s.reason().map(|r| r.to_string()),
            Lost::Set(s) => s.reason().map(|(name, r)| format!("lock {name:?}: {r}")),
        }
    }
}

impl Held for LockGuard {
    fn local_deadline(&self) -> Instant {
        LockGuard::local_deadline(self)
    }

    fn local_deadline_boot(&self) -> Duration {
        self.__local_deadline_boot()
    }

    fn is_lost(&self) -> bool {
        LockGuard::is_lost(self)
    }

    fn lost_reason(&self) -> Option<String> {
        LockGuard::lost_reason(self).map(|r| r.to_string())
    }

    fn lost(&self) -> Lost {
        Lost::One(LockGuard::lost(self))
    }

    fn subject(&self, what: &str) -> String {
        format!(
            "{what} {:?} (fencing token {})",
            self.name(),
            self.fencing_token()
        )
    }

    fn env(&self) -> (Vec<(&'static str, String)>, Vec<&'static str>) {
        let token = self.fencing_token().to_string();
        (
            vec![
                (crate::exec::ENV_NAME, self.name().to_owned()),
                (crate::exec::ENV_FENCING_TOKEN, token.clone()),
                (ENV_NAMES, self.name().to_owned()),
                (ENV_FENCING_TOKENS, token),
            ],
            Vec::new(),
        )
    }

    fn leases(&self) -> Vec<Lease> {
        vec![Lease::of(self)]
    }

    async fn release_with(self, min_hold: Option<Duration>) -> mongolock::Result<()> {
        match min_hold {
            Some(d) => LockGuard::release_after(self, d).await,
            None => LockGuard::release(self).await,
        }
    }

    fn release_after_loss(self) -> impl Future<Output = ()> + Send {
        drop(self);
        std::future::ready(())
    }
}

impl Held for LockSetGuard {
    fn local_deadline(&self) -> Instant {
        LockSetGuard::local_deadline(self)
    }

    fn local_deadline_boot(&self) -> Duration {
        self.__local_deadline_boot()
    }

    fn is_lost(&self) -> bool {
        LockSetGuard::is_lost(self)
    }

    fn lost_reason(&self) -> Option<String> {
        LockSetGuard::lost_reason(self).map(|(name, r)| format!("lock {name:?}: {r}"))
    }

    fn lost(&self) -> Lost {
        Lost::Set(LockSetGuard::lost(self))
    }

    fn subject(&self, what: &str) -> String {
        let each: Vec<String> = self
            .fencing_tokens()
            .map(|(name, token)| format!("{name:?} (fencing token {token})"))
            .collect();
        format!("{what} {}", each.join(", "))
    }

    fn env(&self) -> (Vec<(&'static str, String)>, Vec<&'static str>) {
        let names: Vec<&str> = self.names().collect();
        let tokens: Vec<String> = self
            .fencing_tokens()
            .map(|(_, token)| token.to_string())
            .collect();
        (
            vec![
                (ENV_NAMES, names.join(" ")),
                (ENV_FENCING_TOKENS, tokens.join(" ")),
            ],
            // Not one lock: an outer `mongolock exec`'s values must not show through.
            vec![crate::exec::ENV_NAME, crate::exec::ENV_FENCING_TOKEN],
        )
    }

    fn leases(&self) -> Vec<Lease> {
        self.guards().iter().map(Lease::of).collect()
    }

    async fn release_with(self, min_hold: Option<Duration>) -> mongolock::Result<()> {
        let Some(d) = min_hold else {
            return LockSetGuard::release(self).await;
        };
        // Every lease gets its hold, whatever happened to the others; the first error is
        // reported.
        let mut first_error = None;
        for guard in self.into_guards() {
            if let Err(e) = guard.release_after(d).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn release_after_loss(self) {
        // Awaited, not dropped: a dropped guard releases in the background, which the exit of
        // mongolock right after would cut short, leaving the other names held until their TTL.
        if let Err(e) = LockSetGuard::release(self).await {
            tracing::debug!(error = %e, "releasing the rest of the locks after a loss");
        }
    }
}

impl Event {
    /// Adds the fields of what is held: one lease's fields as [`Event::lease`]; for several,
    /// `names`, `fencing_tokens` (in the same order), `leases` (each lease's fields) and the
    /// earliest `expires_at`.
    pub fn held(self, held: &impl Held) -> Self {
        self.leases(&held.leases())
    }

    /// As [`held`](Self::held), from snapshots.
    pub fn leases(self, leases: &[Lease]) -> Self {
        match leases {
            [one] => self.lease_snapshot(one),
            many => {
                let names: Vec<&str> = many.iter().map(|l| l.name.as_str()).collect();
                let tokens: Vec<u64> = many.iter().map(|l| l.fencing_token).collect();
                let each: Vec<serde_json::Value> = many
                    .iter()
                    .map(|l| {
                        serde_json::json!({
                            "name": l.name,
                            "fencing_token": l.fencing_token,
                            "lease_id": l.lease_id,
                            "acquired_at": timestamp(l.acquired_at),
                            "expires_at": timestamp(l.expires_at),
                        })
                    })
                    .collect();
                let earliest = many.iter().map(|l| l.expires_at).min();
                let event = self
                    .field("names", names)
                    .field("fencing_tokens", tokens)
                    .field("leases", each);
                match earliest {
                    Some(at) => event.field("expires_at", timestamp(at)),
                    None => event,
                }
            }
        }
    }
}
