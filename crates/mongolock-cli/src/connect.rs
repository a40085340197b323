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
        CliError::failure(one_line(&redact(
            &format!("{context}: {}", describe_lock_error(e)),
            &self.uri,
        )))
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
        db: database,
        collection: collection.to_owned(),
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
