//! Waiting strategies: how long to wait between acquisition attempts while a lock is busy.

use std::time::Duration;

use rand::Rng;

use crate::error::{Error, Result};

/// How long [`Lock::acquire`](crate::Lock::acquire) waits between attempts while the lock is
/// held by someone else. The wait ends early when the backend reports a change
/// ([`LockBackendExt::wait_for_change`](crate::LockBackendExt::wait_for_change)).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum WaitStrategy {
    /// Sleep a uniformly random time in `min..=max` before each retry (DistributedLock's
    /// `BusyWaitSleepTime`; default 10–800 ms).
    RandomSleep {
        /// Shortest sleep.
        min: Duration,
        /// Longest sleep; must not be below `min`.
        max: Duration,
    },
    /// Exponential backoff: `initial`, multiplied by `multiplier` after each busy attempt up to
    /// `max`, each sleep scaled by a random factor in `1 ± jitter`. Resets on every acquire call.
    ExponentialBackoff {
        /// First sleep (before jitter).
        initial: Duration,
        /// Largest sleep (before jitter).
        max: Duration,
        /// Growth factor per attempt; at least 1.
        multiplier: f64,
        /// Relative jitter in `0.0..1.0` (0.25 = ±25 %).
        jitter: f64,
    },
}

impl Default for WaitStrategy {
    /// Random sleep between 10 ms and 800 ms.
    fn default() -> Self {
        WaitStrategy::RandomSleep {
            min: Duration::from_millis(10),
            max: Duration::from_millis(800),
        }
    }
}

impl WaitStrategy {
    /// Random sleep in `min..=max`.
    pub fn random_sleep(min: Duration, max: Duration) -> Self {
        WaitStrategy::RandomSleep { min, max }
    }

    /// Exponential backoff from 100 ms doubling to 5 s with ±25 % jitter.
    pub fn exponential() -> Self {
        WaitStrategy::ExponentialBackoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            multiplier: 2.0,
            jitter: 0.25,
        }
    }

    /// Checks the parameters; the error says which one to change.
    pub fn validate(&self) -> Result<()> {
        match *self {
            WaitStrategy::RandomSleep { min, max } => {
                if min > max {
                    return Err(Error::invalid_option(
                        "wait_strategy",
                        format!(
                            "the random sleep range has min {min:?} above max {max:?}; \
                             choose min <= max"
                        ),
                    ));
                }
                if max > MAX_WAIT {
                    return Err(Error::invalid_option(
                        "wait_strategy",
                        format!("the random sleep max {max:?} is above {MAX_WAIT:?}; lower it"),
                    ));
                }
            }
            WaitStrategy::ExponentialBackoff {
                initial,
                max,
                multiplier,
                jitter,
            } => {
                if initial.is_zero() {
                    return Err(Error::invalid_option(
                        "wait_strategy",
                        "the exponential backoff's initial sleep is zero; choose a positive \
                         duration such as 100 ms",
                    ));
                }
                if initial > max {
                    return Err(Error::invalid_option(
                        "wait_strategy",
                        format!(
                            "the exponential backoff's initial sleep {initial:?} is above its \
                             max {max:?}; choose initial <= max"
                        ),
                    ));
                }
                if max > MAX_WAIT {
                    return Err(Error::invalid_option(
                        "wait_strategy",
                        format!("the exponential backoff max {max:?} is above {MAX_WAIT:?}"),
                    ));
                }
                if !(multiplier.is_finite() && multiplier >= 1.0) {
                    return Err(Error::invalid_option(
                        "wait_strategy",
                        format!(
                            "the exponential backoff multiplier {multiplier} must be a finite \
                             number >= 1"
                        ),
                    ));
                }
                if !(jitter.is_finite() && (0.0..1.0).contains(&jitter)) {
                    return Err(Error::invalid_option(
                        "wait_strategy",
                        format!("the jitter {jitter} must be in 0.0..1.0 (0.25 = ±25 %)"),
                    ));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn start(&self) -> Backoff {
        let current = match self {
            WaitStrategy::RandomSleep { min, .. } => *min,
            WaitStrategy::ExponentialBackoff { initial, .. } => *initial,
        };
        Backoff {
            strategy: self.clone(),
            current,
        }
    }
}

/// Longest sleep a strategy may configure (one hour).
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The state of one wait sequence (one acquire call).
#[derive(Debug)]
pub(crate) struct Backoff {
    strategy: WaitStrategy,
    current: Duration,
}

impl Backoff {
    /// An exponential backoff for retrying transient errors: 50 ms doubling to 2 s, ±25 %.
    pub(crate) fn for_errors() -> Self {
        WaitStrategy::ExponentialBackoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(2),
            multiplier: 2.0,
            jitter: 0.25,
        }
        .start()
    }

    /// The next sleep.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let mut rng = rand::rng();
        match self.strategy {
            WaitStrategy::RandomSleep { min, max } => {
                if min >= max {
                    min
                } else {
                    rng.random_range(min..=max)
                }
            }
            WaitStrategy::ExponentialBackoff {
                max,
                multiplier,
                jitter,
                ..
            } => {
                let base = self.current.min(max);
                self.current = scale(base, multiplier).min(max);
                let factor = if jitter > 0.0 && jitter < 1.0 {
                    rng.random_range((1.0 - jitter)..=(1.0 + jitter))
                } else {
                    1.0
                };
                scale(base, factor)
            }
        }
    }
}

/// `d · factor`, saturating instead of panicking on overflow or a non-finite factor.
fn scale(d: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(if factor > 1.0 {
        MAX_WAIT
    } else {
        d
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_sleep_stays_in_range() {
        let mut b = WaitStrategy::default().start();
        for _ in 0..1000 {
            let d = b.next_delay();
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(800));
        }
    }

    #[test]
    fn exponential_grows_to_max_with_jitter() {
        let mut b = WaitStrategy::exponential().start();
        let delays: Vec<_> = (0..12).map(|_| b.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(75) && delays[0] <= Duration::from_millis(125));
        assert!(delays[1] >= Duration::from_millis(150) && delays[1] <= Duration::from_millis(250));
        for d in &delays[8..] {
            assert!(*d >= Duration::from_millis(3750) && *d <= Duration::from_millis(6250));
        }
    }

    #[test]
    fn huge_multipliers_saturate() {
        let mut b = WaitStrategy::ExponentialBackoff {
            initial: Duration::from_millis(1),
            max: Duration::from_secs(60),
            multiplier: 1e300,
            jitter: 0.0,
        }
        .start();
        assert_eq!(b.next_delay(), Duration::from_millis(1));
        assert_eq!(b.next_delay(), Duration::from_secs(60));
    }

    #[test]
    fn validation_says_what_to_change() {
        let err = WaitStrategy::random_sleep(Duration::from_secs(2), Duration::from_secs(1))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("min <= max"), "{err}");
        let bad = WaitStrategy::ExponentialBackoff {
            initial: Duration::ZERO,
            max: Duration::from_secs(1),
            multiplier: 2.0,
            jitter: 0.1,
        };
        assert!(bad.validate().is_err());
        let bad = WaitStrategy::ExponentialBackoff {
            initial: Duration::from_millis(1),
            max: Duration::from_secs(1),
            multiplier: f64::NAN,
            jitter: 0.1,
        };
        assert!(bad.validate().is_err());
        assert!(WaitStrategy::exponential().validate().is_ok());
    }
}
