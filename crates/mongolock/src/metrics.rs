//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`).
//!
//! The rest of the crate calls a handful of hooks defined here: [`AcquireProbe`] (the acquire
//! loop), [`LeaseMetrics`] (the guard) and [`leader`] (elections). Without the feature every
//! hook is an empty inline function on a zero-sized type, so it compiles to nothing.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `mongolock_acquire_wait_seconds` | histogram | `lock`, `outcome` (`acquired`, `timeout`, `error`, `cancelled`) |
//! | `mongolock_acquisitions_total` | counter | `lock` |
//! | `mongolock_contended_total` | counter | `lock` |
//! | `mongolock_hold_seconds` | histogram | `lock`, `outcome` (`released`, `lost`) |
//! | `mongolock_lost_total` | counter | `lock`, `reason` (`deadline`, `expired`, `taken`) |
//! | `mongolock_extension_failures_total` | counter | `lock` |
//! | `mongolock_is_leader` | gauge | `role` |

#[cfg(feature = "metrics")]
pub use enabled::*;

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::*;

/// Why a lease was lost, as the `reason` label of `mongolock_lost_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum LossReason {
    /// The local deadline passed before an extension succeeded (server slow or unreachable,
    /// this process stalled, or automatic extension off).
    Deadline,
    /// An extension found the lease gone at the server (it expired there, or was taken or
    /// force-released).
    Expired,
    /// The store reported that someone else took, released or removed the lease (a change
    /// notification, or a release that found it gone).
    Taken,
}

#[cfg(feature = "metrics")]
mod enabled {
    use std::borrow::Cow;
    use std::fmt;
    use std::sync::Arc;
    use std::time::Instant;

    use metrics::SharedString;

    use super::LossReason;
    use crate::error::Result;
    use crate::options::{GuardPolicy, LockOptions};

    /// How lock names become the `lock` label of the metrics (feature `metrics`), so that
    /// label cardinality stays bounded when names are many (one per order, per user...).
    ///
    /// Set with [`LockProviderBuilder::metrics_labels`](crate::LockProviderBuilder::metrics_labels).
    /// Document locks ([`DocumentLocks`](crate::documents::DocumentLocks)) are always labelled
    /// with their collection's name. Election roles (`mongolock_is_leader`) are labelled with
    /// the role name as it is.
    ///
    /// ```
    /// use mongolock::{LockProvider, MemoryBackend, MetricsLabels};
    /// // "orders:42" and "orders:43" are both counted as "orders".
    /// let provider = LockProvider::builder(MemoryBackend::new())
    ///     .metrics_labels(MetricsLabels::Prefix(':'))
    ///     .build()?;
    /// # Ok::<(), mongolock::Error>(())
    /// ```
    #[derive(Clone, Default)]
    #[non_exhaustive]
    pub enum MetricsLabels {
        /// The lock name as it is (the default): right when names are few and fixed.
        #[default]
        Name,
        /// The part of the name before the first occurrence of this character (the whole name
        /// when it does not occur): `Prefix(':')` labels `"orders:42"` as `"orders"`.
        Prefix(char),
        /// One label for every lock.
        Fixed(String),
        /// Any mapping, e.g. one that keeps a known set of names and maps the rest to `"other"`.
        Map(Arc<dyn Fn(&str) -> String + Send + Sync>),
    }

    impl MetricsLabels {
        /// A custom mapping from lock name to label.
        pub fn map(f: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
            MetricsLabels::Map(Arc::new(f))
        }

        /// The label of `name`.
        pub fn label<'a>(&self, name: &'a str) -> Cow<'a, str> {
            match self {
                MetricsLabels::Name => Cow::Borrowed(name),
                MetricsLabels::Prefix(c) => {
                    Cow::Borrowed(name.split_once(*c).map_or(name, |(prefix, _)| prefix))
                }
                MetricsLabels::Fixed(label) => Cow::Owned(label.clone()),
                MetricsLabels::Map(f) => Cow::Owned(f(name)),
            }
        }
    }

    impl fmt::Debug for MetricsLabels {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                MetricsLabels::Name => f.write_str("Name"),
                MetricsLabels::Prefix(c) => f.debug_tuple("Prefix").field(c).finish(),
                MetricsLabels::Fixed(l) => f.debug_tuple("Fixed").field(l).finish(),
                MetricsLabels::Map(_) => f.write_str("Map(..)"),
            }
        }
    }

    /// The `lock` label of one lock; `None` records nothing.
    #[derive(Clone, Debug)]
    pub(crate) struct Label(Option<SharedString>);

    impl Label {
        /// No label: nothing is recorded.
        pub(crate) fn none() -> Label {
            Label(None)
        }

        /// The label of lock `name` under `options`.
        pub(crate) fn of(name: &str, options: &LockOptions) -> Label {
            Label::new(name, &options.metrics_labels)
        }

        fn new(name: &str, labels: &MetricsLabels) -> Label {
            let label: Arc<str> = Arc::from(labels.label(name));
            Label(Some(SharedString::from_shared(label)))
        }
    }

    /// Times one acquire call: records `mongolock_acquire_wait_seconds` when it ends (with
    /// outcome `cancelled` if its future is dropped), counts grants and contention.
    pub(crate) struct AcquireProbe {
        label: Label,
        started: Instant,
        busy: bool,
        outcome: Option<&'static str>,
    }

    impl AcquireProbe {
        pub(crate) fn start(label: Label) -> AcquireProbe {
            AcquireProbe {
                label,
                started: Instant::now(),
                busy: false,
                outcome: None,
            }
        }

        /// An attempt found the target busy.
        pub(crate) fn busy(&mut self) {
            if !std::mem::replace(&mut self.busy, true) {
                if let Some(lock) = &self.label.0 {
                    metrics::counter!("mongolock_contended_total", "lock" => lock.clone())
                        .increment(1);
                }
            }
        }

        /// The call ended with `result`.
        pub(crate) fn finish<G>(mut self, result: &Result<Option<G>>) {
            self.outcome = Some(match result {
                Ok(Some(_)) => "acquired",
                Ok(None) => "timeout",
                Err(_) => "error",
            });
        }
    }

    impl Drop for AcquireProbe {
        fn drop(&mut self) {
            let Some(lock) = &self.label.0 else { return };
            let outcome = self.outcome.unwrap_or("cancelled");
            metrics::histogram!(
                "mongolock_acquire_wait_seconds",
                "lock" => lock.clone(),
                "outcome" => outcome
            )
            .record(self.started.elapsed().as_secs_f64());
            if outcome == "acquired" {
                metrics::counter!("mongolock_acquisitions_total", "lock" => lock.clone())
                    .increment(1);
            }
        }
    }

    /// The metrics of one held lease (in its guard).
    pub(crate) struct LeaseMetrics {
        label: Label,
        granted: Instant,
    }

    impl LeaseMetrics {
        pub(crate) fn start(name: &str, policy: &GuardPolicy) -> LeaseMetrics {
            LeaseMetrics {
                label: Label::new(name, &policy.metrics_labels),
                granted: Instant::now(),
            }
        }

        fn hold(&self, lock: &SharedString, outcome: &'static str) {
            metrics::histogram!("mongolock_hold_seconds", "lock" => lock.clone(), "outcome" => outcome)
                .record(self.granted.elapsed().as_secs_f64());
        }

        /// The lease ended normally (released, or its guard dropped). Called once per lease.
        pub(crate) fn ended(&self) {
            if let Some(lock) = &self.label.0 {
                self.hold(lock, "released");
            }
        }

        /// The lease was lost. Called once per lease, instead of [`ended`](Self::ended).
        pub(crate) fn lost(&self, reason: LossReason) {
            if let Some(lock) = &self.label.0 {
                self.hold(lock, "lost");
                let reason = match reason {
                    LossReason::Deadline => "deadline",
                    LossReason::Expired => "expired",
                    LossReason::Taken => "taken",
                };
                metrics::counter!("mongolock_lost_total", "lock" => lock.clone(), "reason" => reason)
                    .increment(1);
            }
        }

        /// An extension attempt failed with an error (it is retried until the local deadline).
        pub(crate) fn extension_failed(&self) {
            if let Some(lock) = &self.label.0 {
                metrics::counter!("mongolock_extension_failures_total", "lock" => lock.clone())
                    .increment(1);
            }
        }
    }

    /// This process became leader of `role` (`+1.0`) or stopped being it (`-1.0`).
    pub(crate) fn leader(role: &str, delta: f64) {
        metrics::gauge!("mongolock_is_leader", "role" => role.to_owned()).increment(delta);
    }

    /// Registers the descriptions and units of mongolock's metrics with the installed recorder.
    /// Optional: call it once after installing the recorder (exporters show the descriptions
    /// as help texts).
    pub fn describe_metrics() {
        use metrics::Unit;
        metrics::describe_histogram!(
            "mongolock_acquire_wait_seconds",
            Unit::Seconds,
            "Time from an acquire call to its end (label outcome: acquired, timeout, error, cancelled)"
        );
        metrics::describe_histogram!(
            "mongolock_hold_seconds",
            Unit::Seconds,
            "Time from a grant to the release or loss of the lease (label outcome: released, lost)"
        );
        metrics::describe_counter!("mongolock_acquisitions_total", "Leases granted");
        metrics::describe_counter!(
            "mongolock_contended_total",
            "Acquire calls that found the lock busy at least once"
        );
        metrics::describe_counter!(
            "mongolock_lost_total",
            "Leases lost while held (label reason: deadline, expired, taken)"
        );
        metrics::describe_counter!(
            "mongolock_extension_failures_total",
            "Lease extensions that failed with an error (retried until the local deadline)"
        );
        metrics::describe_gauge!(
            "mongolock_is_leader",
            "1 while this process leads the election role, else 0"
        );
    }
}

#[cfg(not(feature = "metrics"))]
mod disabled {
    //! The hooks without the `metrics` feature: zero-sized types, empty inline functions.

    use super::LossReason;
    use crate::error::Result;
    use crate::options::{GuardPolicy, LockOptions};

    #[derive(Clone, Debug)]
    pub(crate) struct Label;

    impl Label {
        #[inline(always)]
        pub(crate) fn none() -> Label {
            Label
        }

        #[inline(always)]
        pub(crate) fn of(_name: &str, _options: &LockOptions) -> Label {
            Label
        }
    }

    pub(crate) struct AcquireProbe;

    impl AcquireProbe {
        #[inline(always)]
        pub(crate) fn start(_label: Label) -> AcquireProbe {
            AcquireProbe
        }
        #[inline(always)]
        pub(crate) fn busy(&mut self) {}
        #[inline(always)]
        pub(crate) fn finish<G>(self, _result: &Result<Option<G>>) {}
    }

    pub(crate) struct LeaseMetrics;

    impl LeaseMetrics {
        #[inline(always)]
        pub(crate) fn start(_name: &str, _policy: &GuardPolicy) -> LeaseMetrics {
            LeaseMetrics
        }
        #[inline(always)]
        pub(crate) fn ended(&self) {}
        #[inline(always)]
        pub(crate) fn lost(&self, _reason: LossReason) {}
        #[inline(always)]
        pub(crate) fn extension_failed(&self) {}
    }

    #[inline(always)]
    pub(crate) fn leader(_role: &str, _delta: f64) {}
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::MetricsLabels;

    #[test]
    fn labels_map_names() {
        assert_eq!(MetricsLabels::Name.label("orders:42"), "orders:42");
        assert_eq!(MetricsLabels::Prefix(':').label("orders:42"), "orders");
        assert_eq!(MetricsLabels::Prefix(':').label("orders"), "orders");
        assert_eq!(MetricsLabels::Fixed("all".into()).label("orders:42"), "all");
        let map = MetricsLabels::map(|n| if n == "a" { n.into() } else { "other".into() });
        assert_eq!(map.label("a"), "a");
        assert_eq!(map.label("b"), "other");
    }
}
