//! The error type: every variant says what went wrong and what to change.

/// A boxed error used as the `source` of [`Error`] variants.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when using a lock.
///
/// Input errors ([`InvalidName`](Error::InvalidName), [`InvalidOptions`](Error::InvalidOptions),
/// [`InvalidCollection`](Error::InvalidCollection)) are detected locally, before anything is sent
/// to the server. [`Unavailable`](Error::Unavailable) is transient (see [`Error::is_transient`]):
/// the core already retried it within the caller's wait budget. [`Backend`](Error::Backend) is
/// permanent: retrying will not help until something is changed (permissions, configuration).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name cannot be used; `reason` says why and what to change.
    #[error("invalid lock name: {reason}")]
    InvalidName {
        /// Why the name was refused and what to change.
        reason: String,
    },

    /// An option value cannot be used; `reason` says why and what to change.
    #[error("invalid option `{option}`: {reason}")]
    InvalidOptions {
        /// The option that was refused (for example `expiry`).
        option: &'static str,
        /// Why the value was refused and what to change.
        reason: String,
    },

    /// The lock collection name would be refused by MongoDB.
    #[error("invalid lock collection name {name:?}: {reason}")]
    InvalidCollection {
        /// The refused collection name.
        name: String,
        /// Why MongoDB would refuse it and what to change.
        reason: String,
    },

    /// The backend could not be reached or reported a transient condition (network error,
    /// primary step-down, retryable error label). The operation was retried within the caller's
    /// wait budget; this error means the budget ran out (or was zero).
    #[error("lock backend temporarily unavailable: {message}")]
    Unavailable {
        /// Description of the transient condition.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// The backend refused the operation for a reason that retrying will not fix.
    #[error("lock backend error: {message}; {hint}")]
    Backend {
        /// The server's message.
        message: String,
        /// The server's error code, when there is one.
        code: Option<i32>,
        /// What to change so that the operation can succeed.
        hint: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// [`LockGuard::release`](crate::LockGuard::release) found that the lease had already
    /// expired and been taken over (or force-released) before the release reached the server.
    #[error(
        "the lease on lock {name:?} was no longer held when it was released (it expired and was \
         taken over, or was force-released); work done under it may have overlapped another holder"
    )]
    LeaseLost {
        /// The lock name.
        name: String,
    },

    /// A document lock named a document that does not exist (document locks never insert).
    #[error(
        "document {{_id: {id}}} not found in {namespace}: document locks never create documents; \
         insert the document before locking it, or use DocumentLocks::claim to lock any one \
         existing document matching a filter"
    )]
    DocumentNotFound {
        /// The collection's namespace (`db.collection`).
        namespace: String,
        /// The `_id` that was asked for, as extended JSON.
        id: String,
    },

    /// The next fencing token of a lock would exceed `limit` (2⁵³, the largest integer that
    /// JSON parsers and JavaScript represent exactly). Nothing was granted. The bound is far
    /// beyond any realistic use (see the backend's module docs for the figures); reaching it
    /// means the lock collection's counters were set by hand or grew for centuries.
    #[error(
        "the fencing tokens of lock {name:?} are exhausted: the next token would exceed {limit}; \
         use a new lock collection, and reset the last token the protected resource accepted \
         (tokens in a new collection start again at 1)"
    )]
    FencingTokensExhausted {
        /// The lock name.
        name: String,
        /// The largest token the backend issues.
        limit: u64,
    },

    /// A semaphore was acquired with a limit other than the one its current holders use.
    /// Nothing was granted. Every caller of one semaphore name must use the same limit while
    /// any slot is held (a new limit takes effect once every slot has been released or has
    /// expired).
    #[error(
        "semaphore {name:?} is held with a limit of {held} slots, but this caller asked for \
         {requested}; use the same limit in every process that uses the name (or another name), \
         or wait until every slot is released"
    )]
    LimitMismatch {
        /// The semaphore name.
        name: String,
        /// The limit the caller asked for.
        requested: u32,
        /// The limit of the current holders.
        held: u32,
    },

    /// The lock collection (MongoDB) or lock table (PostgreSQL) holds data that mongolock did
    /// not write, such as an application's documents or table. mongolock writes only to a
    /// collection that is empty or holds nothing but its own lock documents and fencing-epoch
    /// counters, and alters only a table it created: nothing was written (no lock fields, no
    /// counters, no index, no column). Not transient: choose another collection or table.
    #[error(
        "refusing to keep locks in {namespace}: {found}; mongolock wrote nothing there. {fix}"
    )]
    ForeignCollection {
        /// The collection's namespace (`database.collection`) or the table (`schema.table`).
        namespace: String,
        /// What was found there that is not mongolock's.
        found: String,
        /// What to do instead.
        fix: String,
    },

    /// A read-only operation ([`inspect`](crate::LockProvider::inspect),
    /// [`list`](crate::LockProvider::list), [`list_matching`](crate::LockProvider::list_matching),
    /// [`holders`](crate::LockProvider::holders), [`waiters`](crate::LockProvider::waiters),
    /// [`slot_limit`](crate::LockProvider::slot_limit)) found no lock table (PostgreSQL) where
    /// the backend keeps its locks: no lock was ever taken there, or the schema or table name
    /// is wrong. Read-only operations never create anything, so nothing was created. The table
    /// is created by the first acquisition or by `PostgresBackend::migrate`. (On MongoDB a
    /// collection that does not exist reads as empty: MongoDB creates collections on first
    /// write.)
    #[error(
        "the lock table {table} does not exist (no lock was ever taken there, or the name is \
         wrong); read-only operations create nothing. {fix}"
    )]
    MissingLockTable {
        /// The table, `schema.table`.
        table: String,
        /// What to do.
        fix: String,
    },

    /// [`LockGuard::release_after`](crate::LockGuard::release_after) (a minimum hold) was
    /// asked of a lease that cannot be held on by the server: a semaphore slot, a reader of a
    /// read-write lock, a document lock, or a backend that does not implement
    /// [`LockBackend::release_after`](crate::LockBackend::release_after). Nothing was sent for
    /// the minimum hold; the guard was consumed and its lease released at once, as when a guard
    /// is dropped.
    #[error(
        "a minimum hold is not supported for {what} {name:?}: {reason}; the lease was released \
         at once instead. Use a minimum hold with an exclusive lock (Lock, or a read-write \
         lock's writer)"
    )]
    MinHoldUnsupported {
        /// The lock name.
        name: String,
        /// What the lease is ("semaphore slot", "document lock", "lock").
        what: &'static str,
        /// Why it cannot be held on.
        reason: String,
    },

    /// A lock operation was started outside a Tokio runtime.
    #[error(
        "mongolock needs a Tokio runtime (it spawns the acquire attempt and the renewal task); \
         call it from within a Tokio runtime"
    )]
    NoRuntime,
}

impl Error {
    /// True for errors that may go away by themselves (network failures, failovers): the
    /// operation can be retried later.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    /// Builds an [`Error::Unavailable`] (for backend implementations).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// Builds an [`Error::Backend`] with a hint saying what to change (for backend
    /// implementations).
    pub fn backend(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Error::Backend {
            message: message.into(),
            code: None,
            hint: hint.into(),
            source: None,
        }
    }

    pub(crate) fn invalid_option(option: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidOptions {
            option,
            reason: reason.into(),
        }
    }
}
