//! Provider options and their validation.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::wait::WaitStrategy;

/// Default lease duration (30 s, as DistributedLock.MongoDB).
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(30);

/// Longest accepted lease duration (one year).
pub const MAX_EXPIRY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Shortest accepted lease duration (100 ms), for every entry point: the provider's
/// [`expiry`](crate::LockProviderBuilder::expiry), `with_expiry` of locks, semaphores,
/// read-write locks, lock sets, elections and document locks, and
/// [`LockGuard::extend`](crate::LockGuard::extend). A guard trusts its lease for the duration
/// less the [drift margin](DriftMargin) (5 ms + 1 % by default), counted from before the request
/// was sent, and an automatic extension must land within a third of it: a shorter lease is lost
/// before the grant's reply is read, or at the first round trip or scheduling delay of a few
/// milliseconds (1 ms gave a guard that was already lost). Shorter durations are
/// [`Error::InvalidOptions`](crate::Error::InvalidOptions). The `mongolock` CLI requires 1 s for
/// the commands it supervises (`exec --ttl`, `elect --ttl`).
pub const MIN_EXPIRY: Duration = Duration::from_millis(100);

/// Longest accepted lock name, in bytes (1 KiB).
pub const MAX_NAME_LEN: usize = 1024;

/// Default limit on how long a release (explicit, on drop, or of an abandoned attempt) may take:
/// 5 s. See [`LockProviderBuilder::release_timeout`](crate::LockProviderBuilder::release_timeout).
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// How much earlier than the lease's nominal end a guard stops trusting it, to absorb
/// differences between clocks: `lease × ratio + fixed`.
///
/// A guard trusts its lease until the monotonic instant taken *before* the granting (or
/// extending) request was sent, plus the lease duration, minus this margin. That instant is
/// before the server's expiry as long as
///
/// * the clocks that evaluate `$$NOW` for the lease's writes and reads (one `mongod`; on a
///   sharded cluster the routing `mongos` instances; after a failover, the new primary) disagree
///   by less than `fixed` plus their share of the ratio, and
/// * this machine's monotonic clock runs no more than `ratio` slower than server time over one
///   lease.
///
/// The default, 1 % of the lease plus 5 ms, covers NTP-disciplined clocks (drift well under
/// 0.01 %, skew of a few ms). If the assumption fails, mutual exclusion by lease can fail for the
/// difference; the fencing token still lets the protected resource refuse the older holder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DriftMargin {
    ratio: f64,
    fixed: Duration,
}

impl Default for DriftMargin {
    fn default() -> Self {
        DriftMargin {
            ratio: 0.01,
            fixed: Duration::from_millis(5),
        }
    }
}

impl DriftMargin {
    /// A margin of `lease × ratio + fixed`. `ratio` must be finite, at least 0 and below 0.5;
    /// anything else is [`Error::InvalidOptions`](crate::Error::InvalidOptions).
    pub fn new(ratio: f64, fixed: Duration) -> Result<Self> {
        if !ratio.is_finite() || !(0.0..0.5).contains(&ratio) {
            return Err(Error::invalid_option(
                "drift_margin",
                format!(
                    "the drift ratio {ratio} is outside [0, 0.5); use a small fraction such as \
                     0.01 (1 % of the lease)"
                ),
            ));
        }
        Ok(DriftMargin { ratio, fixed })
    }

    /// The fraction of the lease subtracted.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The fixed part subtracted.
    pub fn fixed(&self) -> Duration {
        self.fixed
    }

    /// The margin for a lease of `ttl` (at most `ttl`).
    pub fn margin(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.ratio).saturating_add(self.fixed).min(ttl)
    }
}

/// What a guard needs of the options: copied into every guard.
#[derive(Clone, Debug)]
pub(crate) struct GuardPolicy {
    pub auto_extend: bool,
    pub extension_cadence: Option<Duration>,
    pub drift: DriftMargin,
    pub release_timeout: Duration,
    #[cfg(feature = "metrics")]
    pub metrics_labels: crate::metrics::MetricsLabels,
}

/// Options shared by every lock a [`LockProvider`](crate::LockProvider) creates. Built and
/// validated by [`LockProviderBuilder`](crate::LockProviderBuilder).
#[derive(Clone, Debug)]
pub struct LockOptions {
    pub(crate) expiry: Duration,
    pub(crate) extension_cadence: Option<Duration>,
    pub(crate) auto_extend: bool,
    pub(crate) wait: WaitStrategy,
    pub(crate) app_name: Option<String>,
    pub(crate) drift: DriftMargin,
    pub(crate) release_timeout: Duration,
    #[cfg(feature = "metrics")]
    pub(crate) metrics_labels: crate::metrics::MetricsLabels,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            expiry: DEFAULT_EXPIRY,
            extension_cadence: None,
            auto_extend: true,
            wait: WaitStrategy::default(),
            app_name: None,
            drift: DriftMargin::default(),
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            #[cfg(feature = "metrics")]
            metrics_labels: crate::metrics::MetricsLabels::default(),
        }
    }
}

impl LockOptions {
    /// Lease duration of each acquisition (and of each automatic extension).
    pub fn expiry(&self) -> Duration {
        self.expiry
    }

    /// Interval between automatic extensions for a lease of `expiry`: the configured cadence when
    /// it is below `expiry`, else `expiry / 3`.
    pub fn extension_cadence(&self) -> Duration {
        self.cadence_for(self.expiry)
    }

    /// Whether held leases are extended automatically in the background.
    pub fn auto_extend(&self) -> bool {
        self.auto_extend
    }

    /// How acquire waits between attempts while the lock is busy.
    pub fn wait_strategy(&self) -> &WaitStrategy {
        &self.wait
    }

    /// Application name stored with every lease.
    pub fn app_name(&self) -> Option<&str> {
        self.app_name.as_deref()
    }

    /// How much earlier than its nominal end a guard stops trusting a lease.
    pub fn drift_margin(&self) -> DriftMargin {
        self.drift
    }

    /// The longest a release may take before it is given up (the lease then expires by itself).
    pub fn release_timeout(&self) -> Duration {
        self.release_timeout
    }

    /// How lock names become the `lock` label of the metrics (feature `metrics`).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_labels(&self) -> &crate::metrics::MetricsLabels {
        &self.metrics_labels
    }

    pub(crate) fn guard_policy(&self) -> GuardPolicy {
        GuardPolicy {
            auto_extend: self.auto_extend,
            extension_cadence: self.extension_cadence,
            drift: self.drift,
            release_timeout: self.release_timeout,
            #[cfg(feature = "metrics")]
            metrics_labels: self.metrics_labels.clone(),
        }
    }

    /// The extension cadence used for a lease of duration `ttl`.
    pub(crate) fn cadence_for(&self, ttl: Duration) -> Duration {
        match self.extension_cadence {
            Some(c) if c < ttl => c,
            _ => ttl / 3,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        validate_ttl("expiry", self.expiry)?;
        if let Some(c) = self.extension_cadence {
            if c.is_zero() {
                return Err(Error::invalid_option(
                    "extension_cadence",
                    "the extension cadence is zero; choose a positive duration below the expiry \
                     (default: expiry / 3)",
                ));
            }
            if c >= self.expiry {
                return Err(Error::invalid_option(
                    "extension_cadence",
                    format!(
                        "the extension cadence {c:?} is not below the expiry {:?}, so the lease \
                         would expire before it is extended; choose a cadence below the expiry \
                         (default: expiry / 3)",
                        self.expiry
                    ),
                ));
            }
        }
        self.wait.validate()?;
        if self.release_timeout.is_zero() {
            return Err(Error::invalid_option(
                "release_timeout",
                "the release timeout is zero, so no release could ever complete; choose a \
                 positive duration (default 5 s)",
            ));
        }
        if let Some(app) = &self.app_name {
            if app.len() > MAX_NAME_LEN {
                return Err(Error::invalid_option(
                    "app_name",
                    format!(
                        "the application name is {} bytes; use at most {MAX_NAME_LEN}",
                        app.len()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Checks a lease duration (expiry, ttl): at least [`MIN_EXPIRY`], at most [`MAX_EXPIRY`].
pub(crate) fn validate_ttl(option: &'static str, ttl: Duration) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid_option(
            option,
            format!("the {option} is zero, so every lease would expire at once; choose at least the minimum of 100 ms (default 30 s)"),
        ));
    }
    if ttl < MIN_EXPIRY {
        return Err(Error::invalid_option(
            option,
            format!("the {option} {ttl:?} is below the minimum of 100 ms: after the drift margin and a round trip, the lease would be lost as soon as it is granted, or at the first late extension; choose at least 100 ms (default 30 s)"),
        ));
    }
    if ttl > MAX_EXPIRY {
        return Err(Error::invalid_option(
            option,
            format!("the {option} {ttl:?} is above the maximum of one year; choose a shorter lease and let it be extended"),
        ));
    }
    Ok(())
}

/// Checks a lock name: non-empty and at most [`MAX_NAME_LEN`] bytes.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidName {
            reason: "the name is empty; use a non-empty string such as \"orders:42\"".into(),
        });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidName {
            reason: format!(
                "the name is {} bytes long; use at most {MAX_NAME_LEN} bytes (hash long keys)",
                name.len()
            ),
        });
    }
    Ok(())
}
