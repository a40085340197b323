//! Provider options and their validation.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::wait::WaitStrategy;

/// Default lease duration (30 s, as DistributedLock.MongoDB).
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(30);

/// Longest accepted lease duration (one year).
pub const MAX_EXPIRY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Longest accepted lock name, in bytes (1 KiB).
pub const MAX_NAME_LEN: usize = 1024;

/// Options shared by every lock a [`LockProvider`](crate::LockProvider) creates. Built and
/// validated by [`LockProviderBuilder`](crate::LockProviderBuilder).
#[derive(Clone, Debug)]
pub struct LockOptions {
    pub(crate) expiry: Duration,
    pub(crate) extension_cadence: Option<Duration>,
    pub(crate) auto_extend: bool,
    pub(crate) wait: WaitStrategy,
    pub(crate) app_name: Option<String>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            expiry: DEFAULT_EXPIRY,
            extension_cadence: None,
            auto_extend: true,
            wait: WaitStrategy::default(),
            app_name: None,
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

/// Checks a lease duration (expiry, ttl): at least 1 ms, at most [`MAX_EXPIRY`].
pub(crate) fn validate_ttl(option: &'static str, ttl: Duration) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid_option(
            option,
            format!("the {option} is zero, so every lease would expire at once; choose a positive duration (default 30 s)"),
        ));
    }
    if ttl < Duration::from_millis(1) {
        return Err(Error::invalid_option(
            option,
            format!("the {option} {ttl:?} is below 1 ms, the resolution of server time; choose at least 1 ms"),
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
