//! Holder metadata stored with every lease: host name, process id and optional application name.

/// Who holds (or last held) a lease. Stored with the lease so that operators can see which
/// process holds a lock (`mongolock inspect`, [`LockProvider::inspect`](crate::LockProvider::inspect)).
///
/// This is informational only: ownership is decided by the lease id, never by this metadata.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct HolderInfo {
    /// Host name of the holding process (`"unknown"` when it cannot be determined).
    pub host: String,
    /// Operating-system process id of the holding process.
    pub pid: u32,
    /// Application name configured with
    /// [`LockProviderBuilder::app_name`](crate::LockProviderBuilder::app_name).
    /// (Serialized as `app`, the name the lock documents store it under.)
    #[cfg_attr(feature = "serde", serde(rename = "app"))]
    pub app_name: Option<String>,
}

impl HolderInfo {
    /// Metadata with these values (for backends that read it back, and for tests).
    pub fn new(host: impl Into<String>, pid: u32, app_name: Option<String>) -> Self {
        HolderInfo {
            host: host.into(),
            pid,
            app_name,
        }
    }

    /// Metadata describing the current process.
    pub fn current(app_name: Option<String>) -> Self {
        let host = hostname::get()
            .ok()
            .map(|h| h.to_string_lossy().into_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown".to_owned());
        HolderInfo {
            host,
            pid: std::process::id(),
            app_name,
        }
    }
}

impl std::fmt::Display for HolderInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (pid {})", self.host, self.pid)?;
        if let Some(app) = &self.app_name {
            write!(f, " app {app:?}")?;
        }
        Ok(())
    }
}
