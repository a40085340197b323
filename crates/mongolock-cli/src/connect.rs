//! Connecting to MongoDB: parse the URI, apply CLI defaults, and `ping` so that an unreachable
//! server, a bad URI or refused credentials fail at once with one clear line (the driver
//! connects lazily and would otherwise report them at the first lock operation).

use std::time::Duration;

use mongodb::bson::doc;
use mongodb::error::ErrorKind;
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use mongolock::{LockProvider, MongoBackend};

use crate::cli::GlobalArgs;
use crate::exit::{one_line, CliError};
use crate::uri::{mask_password, redact};

/// Server selection timeout when the URI sets none: how long a command waits for an unreachable
/// server before failing.
pub const DEFAULT_SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// A client that answered `ping`, and where the locks live.
pub struct Connection {
    pub db: Database,
    pub collection: String,
    uri: String,
}

impl Connection {
    /// `db.collection`, for messages.
    pub fn namespace(&self) -> String {
        format!("{}.{}", self.db.name(), self.collection)
    }

    /// A lock provider over the lock collection with lease duration `ttl` (the library default
    /// when `None`) and holder application name `app_name`.
    pub fn provider(
        &self,
        ttl: Option<Duration>,
        app_name: Option<String>,
    ) -> Result<LockProvider, CliError> {
        let backend = MongoBackend::builder(&self.db)
            .collection(self.collection.clone())
            .build()
            .map_err(|e| CliError::failure(one_line(&e.to_string())))?;
        let mut builder = LockProvider::builder(backend);
        if let Some(ttl) = ttl {
            builder = builder.expiry(ttl);
        }
        if let Some(app) = app_name {
            builder = builder.app_name(app);
        }
        builder
            .build()
            .map_err(|e| CliError::failure(one_line(&e.to_string())))
    }

    /// Describes a library error from an operation on this connection, in one line, with any
    /// trace of the password removed.
    pub fn error(&self, context: &str, e: &mongolock::Error) -> CliError {
        CliError::failure(one_line(&redact(&format!("{context}: {e}"), &self.uri)))
    }
}

/// Connects and pings. Every failure is one line naming the cause and the masked URI.
pub async fn connect(global: &GlobalArgs) -> Result<Connection, CliError> {
    connect_to(&global.uri, &global.db, &global.collection).await
}

/// [`connect`] with explicit values.
pub async fn connect_to(uri: &str, db: &str, collection: &str) -> Result<Connection, CliError> {
    let masked = mask_password(uri);
    let fail = |what: &str, detail: String| {
        CliError::failure(one_line(&redact(
            &format!("{what} {masked}: {detail}"),
            uri,
        )))
    };

    let mut options = ClientOptions::parse(uri)
        .await
        .map_err(|e| fail("invalid MongoDB URI", describe(&e)))?;
    if options.server_selection_timeout.is_none() {
        options.server_selection_timeout = Some(DEFAULT_SERVER_SELECTION_TIMEOUT);
    }
    if options.connect_timeout.is_none() {
        options.connect_timeout = Some(DEFAULT_SERVER_SELECTION_TIMEOUT);
    }
    if options.app_name.is_none() {
        options.app_name = Some("mongolock".to_owned());
    }
    let selection_timeout = options
        .server_selection_timeout
        .unwrap_or(DEFAULT_SERVER_SELECTION_TIMEOUT);
    let client =
        Client::with_options(options).map_err(|e| fail("invalid MongoDB URI", describe(&e)))?;

    if db.is_empty() {
        return Err(CliError::failure(
            "invalid --db: the database name is empty; use a name such as \"mongolock\"",
        ));
    }
    let database = client.database(db);
    // `ping` on the lock database: it authenticates the connection (refused credentials are
    // reported here) and needs no privileges.
    match database.run_command(doc! { "ping": 1 }).await {
        Ok(_) => {}
        Err(e) => {
            let (what, detail) = match e.kind.as_ref() {
                ErrorKind::ServerSelection { .. } => (
                    "cannot reach MongoDB at",
                    format!(
                        "{} (gave up after {}; set serverSelectionTimeoutMS in the URI to wait \
                         longer)",
                        describe(&e),
                        crate::duration::display(selection_timeout)
                    ),
                ),
                ErrorKind::Authentication { .. } => ("authentication refused by", describe(&e)),
                ErrorKind::Command(c) if c.code == 18 => {
                    ("authentication refused by", describe(&e))
                }
                ErrorKind::Io(_) => ("cannot reach MongoDB at", describe(&e)),
                ErrorKind::DnsResolve { .. } => ("cannot resolve MongoDB host in", describe(&e)),
                ErrorKind::InvalidTlsConfig { .. } => ("invalid TLS settings for", describe(&e)),
                ErrorKind::InvalidArgument { .. } => ("invalid MongoDB URI", describe(&e)),
                _ => ("MongoDB at", describe(&e)),
            };
            return Err(fail(what, detail));
        }
    }
    Ok(Connection {
        db: database,
        collection: collection.to_owned(),
        uri: uri.to_owned(),
    })
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
