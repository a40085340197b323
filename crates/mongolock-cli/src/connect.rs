//! Connecting to the lock store: the URI's scheme picks the backend (`mongodb://` and
//! `mongodb+srv://`: MongoDB; `postgres://` and `postgresql://`: PostgreSQL). The URI is parsed,
//! CLI defaults are applied, and the server is pinged so that an unreachable server, a bad URI
//! or refused credentials fail at once with one clear line (the clients connect lazily and
//! would otherwise report them at the first lock operation).

use std::time::Duration;

use mongodb::bson::doc;
use mongodb::error::ErrorKind;
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use mongolock::{LockProvider, MongoBackend, PostgresBackend};

use crate::cli::{GlobalArgs, DEFAULT_COLLECTION, DEFAULT_URI};
use crate::exit::{one_line, CliError};
use crate::uri::{mask_password, redact};

/// Server selection timeout when the URI sets none: how long a command waits for an unreachable
/// server before failing.
pub const DEFAULT_SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Every provider this process made, so that [`flush`] can wait for their background work
/// before the process exits.
static PROVIDERS: std::sync::Mutex<Vec<LockProvider>> = std::sync::Mutex::new(Vec::new());

/// How long the process waits at exit for the background work of its providers.
const FLUSH_AT_EXIT: Duration = Duration::from_secs(2);

/// Before the process exits: waits (at most [`FLUSH_AT_EXIT`]) until every provider has sent
/// what it started in the background — a waiter that gave up (`--wait` ran out, Ctrl-C)
/// takes this process out of the lock's handoff queue, so that the next release designates a
/// process that still waits.
pub async fn flush() {
    let providers = std::mem::take(&mut *PROVIDERS.lock().unwrap_or_else(|e| e.into_inner()));
    let deadline = tokio::time::Instant::now() + FLUSH_AT_EXIT;
    for p in providers {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !p.flush(left).await {
            tracing::debug!("exiting before the handoff queue withdrawals were sent; the entries end by themselves");
            return;
        }
    }
}

/// Where the locks live.
enum Store {
    Mongo { db: Database, collection: String },
    Postgres(PostgresBackend),
}

/// A connection that answered a ping, and where the locks live.
pub struct Connection {
    store: Store,
    uri: String,
}

impl Connection {
    /// `db.collection` (MongoDB) or `schema.table` (PostgreSQL), for messages.
    pub fn namespace(&self) -> String {
        match &self.store {
            Store::Mongo { db, collection } => format!("{}.{}", db.name(), collection),
            Store::Postgres(backend) => backend.table().to_owned(),
        }
    }

    /// The name of the database system, for messages.
    fn system(&self) -> &'static str {
        match &self.store {
            Store::Mongo { .. } => "MongoDB",
            Store::Postgres(_) => "PostgreSQL",
        }
    }

    /// A lock provider over the lock collection or table with lease duration `ttl` (the
    /// library default when `None`) and holder application name `app_name`.
    pub fn provider(
        &self,
        ttl: Option<Duration>,
        app_name: Option<String>,
    ) -> Result<LockProvider, CliError> {
        let mut builder = match &self.store {
            Store::Mongo { db, collection } => {
                let backend = MongoBackend::builder(db)
                    .collection(collection.clone())
                    .build()
                    .map_err(|e| CliError::failure(one_line(&e.to_string())))?;
                LockProvider::builder(backend)
            }
            Store::Postgres(backend) => LockProvider::builder(backend.clone()),
        };
        if let Some(ttl) = ttl {
            builder = builder.expiry(ttl);
        }
        if let Some(app) = app_name {
            builder = builder.app_name(app);
        }
        let provider = builder
            .build()
            .map_err(|e| CliError::failure(one_line(&e.to_string())))?;
        PROVIDERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(provider.clone());
        Ok(provider)
    }

    /// Describes a library error from an operation on this connection, in one line, with any
    /// trace of the password removed.
    pub fn error(&self, context: &str, e: &mongolock::Error) -> CliError {
        let detail = match e {
            mongolock::Error::Unavailable { message, .. } => format!(
                "{} temporarily unavailable: {}",
                self.system(),
                tidy_driver_text(message)
            ),
            other => describe_lock_error(other),
        };
        // Bad input (a lock name, options) is a usage error, like a bad flag.
        let code = match e {
            mongolock::Error::InvalidName { .. } | mongolock::Error::InvalidOptions { .. } => {
                crate::exit::USAGE
            }
            mongolock::Error::ForeignCollection { .. } => crate::exit::FOREIGN_COLLECTION,
            mongolock::Error::MissingLockTable { .. } => crate::exit::MISSING_TABLE,
            _ => crate::exit::FAILURE,
        };
        CliError::with_code(
            code,
            one_line(&redact(&format!("{context}: {detail}"), &self.uri)),
        )
    }
}

/// Connects and pings. Every failure is one line naming the cause and the masked URI.
pub async fn connect(global: &GlobalArgs) -> Result<Connection, CliError> {
    connect_to(&uri(global), &global.db, &global.collection).await
}

/// The environment variable read when neither `--uri` nor `MONGOLOCK_URI` (the
/// backend-neutral variable, read by clap) is given: the name earlier versions read, kept so
/// that existing setups keep working.
pub const FALLBACK_URI_VAR: &str = "MONGODB_URI";

/// The connection string: `--uri`, else `MONGOLOCK_URI` (both through clap), else
/// `MONGODB_URI` (an empty value counts as unset), else [`DEFAULT_URI`].
pub fn uri(global: &GlobalArgs) -> String {
    global
        .uri
        .clone()
        .or_else(|| {
            std::env::var(FALLBACK_URI_VAR)
                .ok()
                .filter(|u| !u.is_empty())
        })
        .unwrap_or_else(|| DEFAULT_URI.to_owned())
}

/// Whether `uri` names a PostgreSQL server.
pub fn is_postgres(uri: &str) -> bool {
    let lower = uri.trim_start().to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// [`connect`] with explicit values. For PostgreSQL, `db` is not used (the database is the
/// URI's) and `collection` is the lock table as `[SCHEMA.]TABLE` (the MongoDB default
/// collection name means the PostgreSQL default table, `public.mongolock_locks`).
pub async fn connect_to(uri: &str, db: &str, collection: &str) -> Result<Connection, CliError> {
    if is_postgres(uri) {
        return connect_postgres(uri, collection).await;
    }
    let masked = mask_password(uri);
    let fail = |what: &str, detail: String| {
        CliError::failure(one_line(&redact(
            &format!("{what} {masked}: {detail}"),
            uri,
        )))
    };

    if db.is_empty() {
        return Err(CliError::failure(
            "invalid --db: the database name is empty; use a name such as \"mongolock\"",
        ));
    }
    let mut options = ClientOptions::parse(uri).await.map_err(|e| {
        let (what, detail) = classify(&e, None);
        fail(what, detail)
    })?;
    if options.server_selection_timeout.is_none() {
        options.server_selection_timeout = Some(DEFAULT_SERVER_SELECTION_TIMEOUT);
    }
    if options.connect_timeout.is_none() {
        options.connect_timeout = Some(DEFAULT_SERVER_SELECTION_TIMEOUT);
    }
    if options.app_name.is_none() {
        options.app_name = Some("mongolock".to_owned());
    }
    let selection_timeout = options.server_selection_timeout;
    let client = Client::with_options(options).map_err(|e| {
        let (what, detail) = classify(&e, None);
        fail(what, detail)
    })?;
    let database = client.database(db);
    // `ping` on the lock database: it authenticates the connection (refused credentials are
    // reported here) and needs no privileges.
    if let Err(e) = database.run_command(doc! { "ping": 1 }).await {
        let (what, detail) = classify(&e, selection_timeout);
        return Err(fail(what, detail));
    }
    Ok(Connection {
        store: Store::Mongo {
            db: database,
            collection: collection.to_owned(),
        },
        uri: uri.to_owned(),
    })
}

/// The PostgreSQL half of [`connect_to`]: a connect timeout of 5 s unless the URI sets one.
async fn connect_postgres(uri: &str, table: &str) -> Result<Connection, CliError> {
    let masked = mask_password(uri);
    let fail = |what: &str, detail: String| {
        CliError::failure(one_line(&redact(
            &format!("{what} {masked}: {detail}"),
            uri,
        )))
    };
    let mut config: mongolock::backends::postgres::Config = uri
        .parse()
        .map_err(|e| fail("invalid PostgreSQL URI", format!("{e}")))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_SERVER_SELECTION_TIMEOUT);
    }
    let mut builder = PostgresBackend::builder_with_config(config);
    if table != DEFAULT_COLLECTION {
        builder = match table.split_once('.') {
            Some((schema, table)) => builder.schema(schema).table(table),
            None => builder.table(table),
        };
    }
    let backend = builder.build().map_err(|e| {
        CliError::failure(one_line(&format!(
            "invalid --collection (the PostgreSQL lock table): {e}"
        )))
    })?;
    if let Err(e) = backend.ping().await {
        let what = match &e {
            mongolock::Error::Unavailable { .. } => "cannot reach PostgreSQL at",
            _ => "PostgreSQL refused the connection at",
        };
        let detail = match &e {
            mongolock::Error::Unavailable { message, .. } => message.clone(),
            other => describe_lock_error(other),
        };
        return Err(fail(what, detail));
    }
    Ok(Connection {
        store: Store::Postgres(backend),
        uri: uri.to_owned(),
    })
}

/// A library error without the driver's debugging details (labels, source, raw server
/// response), which the library's messages currently include.
pub fn describe_lock_error(e: &mongolock::Error) -> String {
    match e {
        mongolock::Error::Backend { message, hint, .. } => {
            format!("{}; {hint}", tidy_driver_text(message))
        }
        mongolock::Error::Unavailable { message, .. } => format!(
            "MongoDB temporarily unavailable: {}",
            tidy_driver_text(message)
        ),
        other => other.to_string(),
    }
}

/// Cuts the `, labels: …, source: …, server response: …` tail of a driver error's display and
/// the `Kind: ` prefixes.
fn tidy_driver_text(message: &str) -> String {
    let cut = message
        .find(", labels: ")
        .map_or(message, |i| &message[..i]);
    cut.replace("Kind: ", "")
}

/// What failed (completed by the masked URI) and why, for a connection error.
fn classify(
    e: &mongodb::error::Error,
    selection_timeout: Option<Duration>,
) -> (&'static str, String) {
    match e.kind.as_ref() {
        ErrorKind::ServerSelection { .. } => (
            "cannot reach MongoDB at",
            match selection_timeout {
                Some(t) => format!(
                    "{} (gave up after {}; set serverSelectionTimeoutMS in the URI to wait \
                     longer)",
                    describe(e),
                    crate::duration::display(t)
                ),
                None => describe(e),
            },
        ),
        ErrorKind::Authentication { .. } => ("authentication refused by", describe(e)),
        ErrorKind::Command(c) if c.code == 18 => ("authentication refused by", describe(e)),
        ErrorKind::Io(_) => ("cannot reach MongoDB at", describe(e)),
        ErrorKind::DnsResolve { .. } => ("cannot resolve the MongoDB host in", describe(e)),
        ErrorKind::InvalidTlsConfig { .. } => ("invalid TLS settings for", describe(e)),
        ErrorKind::InvalidArgument { .. } => ("invalid MongoDB URI", describe(e)),
        _ => ("MongoDB error at", describe(e)),
    }
}

/// A driver error as a short cause: for server selection failures, the per-server errors from
/// the topology description (e.g. "I/O error: Connection refused (os error 111)") rather than
/// the whole description.
fn describe(e: &mongodb::error::Error) -> String {
    let text = match e.kind.as_ref() {
        ErrorKind::ServerSelection { message, .. } => {
            let causes = server_errors(message);
            if causes.is_empty() {
                message.clone()
            } else {
                causes.join("; ")
            }
        }
        ErrorKind::Command(c) => format!("{} (code {} {})", c.message, c.code, c.code_name),
        ErrorKind::InvalidArgument { message, .. } => message.clone(),
        ErrorKind::DnsResolve { message, .. } => message.clone(),
        ErrorKind::Authentication { message, .. } => message.clone(),
        kind => kind.to_string(),
    };
    one_line(&text)
}

/// Extracts the `Error: ...` parts of a topology description.
fn server_errors(message: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = message;
    while let Some(start) = rest.find("Error: ") {
        let after = &rest[start + "Error: ".len()..];
        let end = after.find(", labels:").unwrap_or(after.len());
        let mut cause = after[..end].trim();
        if let Some(stripped) = cause.strip_prefix("Kind: ") {
            cause = stripped;
        }
        if !cause.is_empty() && !out.iter().any(|c: &String| c == cause) {
            out.push(cause.to_owned());
        }
        rest = &after[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidies_library_errors() {
        let e = mongolock::Error::Backend {
            message: "list (aggregate): Kind: Command failed: Error code 13 (Unauthorized): not \
                      authorized, labels: {}, source: None, server response: Some(RawDocumentBuf \
                      { data: \"e7\" })"
                .into(),
            code: Some(13),
            hint: "grant readWrite".into(),
            source: None,
        };
        assert_eq!(
            describe_lock_error(&e),
            "list (aggregate): Command failed: Error code 13 (Unauthorized): not authorized; \
             grant readWrite"
        );
    }

    #[test]
    fn extracts_per_server_errors() {
        let msg = "Server selection timeout: No available servers. Topology: { Type: Unknown, \
                   Servers: [ { Address: localhost:1, Type: Unknown, Error: Kind: I/O error: \
                   Connection refused (os error 111), labels: {} } ] }";
        assert_eq!(
            server_errors(msg),
            vec!["I/O error: Connection refused (os error 111)".to_owned()]
        );
        assert!(server_errors("Server selection timeout: nothing").is_empty());
    }
}
