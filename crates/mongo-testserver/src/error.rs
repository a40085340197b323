//! The error a command answers with: MongoDB's `{ok: 0, errmsg, code, codeName}` shape.

use bson::{doc, Document};

/// The message of [`CommandError::authentication_not_supported`].
pub const AUTHENTICATION_NOT_SUPPORTED: &str = "authentication is not supported by \
    mongo-testserver; connect without credentials (remove the user:password from the URI)";

/// An error reply to a command, shaped as mongod shapes it.
///
/// Every failure inside the server becomes one of these; the connection turns it into
/// `{ok: 0, errmsg, code, codeName, errorLabels?, ...extra}`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code_name} ({code}): {message}")]
pub struct CommandError {
    /// MongoDB's numeric error code, e.g. 11000 for DuplicateKey.
    pub code: i32,
    /// MongoDB's name for the code, e.g. `"DuplicateKey"`.
    pub code_name: String,
    /// A message that says what was wrong.
    pub message: String,
    /// `errorLabels` to attach to the reply, e.g. `RetryableWriteError`.
    pub labels: Vec<String>,
    /// Extra top-level fields of the reply (e.g. `keyPattern` and `keyValue` of E11000).
    pub extra: Document,
}

impl CommandError {
    /// An error with the given code, code name and message.
    pub fn new(code: i32, code_name: impl Into<String>, message: impl Into<String>) -> Self {
        CommandError {
            code,
            code_name: code_name.into(),
            message: message.into(),
            labels: Vec::new(),
            extra: Document::new(),
        }
    }

    /// Code 2, BadValue: an argument has a wrong value.
    pub fn bad_value(message: impl Into<String>) -> Self {
        Self::new(2, "BadValue", message)
    }

    /// Code 9, FailedToParse: a command or operator could not be parsed.
    pub fn failed_to_parse(message: impl Into<String>) -> Self {
        Self::new(9, "FailedToParse", message)
    }

    /// Code 14, TypeMismatch: a value has the wrong BSON type.
    pub fn type_mismatch(message: impl Into<String>) -> Self {
        Self::new(14, "TypeMismatch", message)
    }

    /// Code 40324, an unrecognized aggregation stage.
    pub fn unknown_stage(stage: &str) -> Self {
        Self::new(
            40324,
            "Location40324",
            format!("Unrecognized pipeline stage name: '{stage}'"),
        )
    }

    /// Code 168, InvalidPipelineOperator: an unknown aggregation expression operator.
    pub fn unknown_expression(op: &str) -> Self {
        Self::new(
            168,
            "InvalidPipelineOperator",
            format!("Unrecognized expression '{op}'"),
        )
    }

    /// Code 18, AuthenticationFailed: the answer to every login attempt (`saslStart`,
    /// `saslContinue`, `authenticate`). The test server has no users; the message says to
    /// connect without credentials.
    pub fn authentication_not_supported() -> Self {
        Self::new(18, "AuthenticationFailed", AUTHENTICATION_NOT_SUPPORTED)
    }

    /// Code 59, CommandNotFound.
    pub fn command_not_found(name: &str) -> Self {
        Self::new(59, "CommandNotFound", format!("no such command: '{name}'"))
    }

    /// Adds an error label.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.labels.push(label.into());
        self
    }

    /// Adds an extra top-level reply field.
    pub fn with_extra(mut self, key: &str, value: impl Into<bson::Bson>) -> Self {
        self.extra.insert(key, value.into());
        self
    }

    /// The reply document for this error.
    pub fn to_reply(&self) -> Document {
        let mut reply = doc! {
            "ok": 0.0,
            "errmsg": self.message.clone(),
            "code": self.code,
            "codeName": self.code_name.clone(),
        };
        if !self.labels.is_empty() {
            reply.insert("errorLabels", self.labels.clone());
        }
        for (k, v) in &self.extra {
            reply.insert(k.clone(), v.clone());
        }
        reply
    }
}

/// Result of a command or an engine operation.
pub type CommandResult<T> = Result<T, CommandError>;
