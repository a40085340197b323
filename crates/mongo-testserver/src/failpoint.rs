//! The `failCommand` fail point, with mongod's document shape and semantics.
//!
//! `configureFailPoint: "failCommand"` takes `mode` (`"alwaysOn"`, `"off"`, `{times: n}`,
//! `{skip: n}`, `{activationProbability: p}`) and `data` (`failCommands`, `errorCode`,
//! `errorLabels`, `closeConnection`, `blockConnection` + `blockTimeMS`, `writeConcernError`,
//! `appName`, `namespace`). As in mongod, a command only counts against `times`/`skip` when it
//! matches `data` (name, appName, namespace) and the data asks for an effect; the
//! `configureFailPoint` command itself is never affected.

use std::time::Duration;

use bson::{Bson, Document};

use crate::error::{CommandError, CommandResult};

/// How often the fail point fires.
#[derive(Debug, Clone, PartialEq)]
enum Mode {
    Off,
    AlwaysOn,
    Times(i64),
    Skip(i64),
    Probability(f64),
}

/// What a fired fail point does to the command.
#[derive(Debug, Clone, Default)]
pub struct Effect {
    /// Sleep this long first.
    pub block: Option<Duration>,
    /// Close the connection without a reply.
    pub close_connection: bool,
    /// Fail with this error.
    pub error: Option<CommandError>,
    /// `errorLabels` from the data (replaces the labels the server would compute).
    pub labels_override: Option<Vec<String>>,
    /// Attach this `writeConcernError` to the reply of a write that ran.
    pub write_concern_error: Option<Document>,
}

/// The fail point's configuration and counters.
pub struct FailCommand {
    mode: Mode,
    data: Document,
    times_entered: i64,
}

impl Default for FailCommand {
    fn default() -> Self {
        FailCommand {
            mode: Mode::Off,
            data: Document::new(),
            times_entered: 0,
        }
    }
}

fn as_i64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.fract() == 0.0 => Some(*f as i64),
        _ => None,
    }
}

/// Commands whose replies may carry a `writeConcernError`.
pub fn supports_write_concern(command: &str) -> bool {
    matches!(
        command,
        "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "findandmodify"
            | "create"
            | "drop"
            | "dropDatabase"
            | "createIndexes"
            | "dropIndexes"
    )
}

impl FailCommand {
    /// Handles `configureFailPoint: "failCommand"`; returns the reply fields (`count`).
    pub fn configure(&mut self, cmd: &Document) -> CommandResult<i64> {
        let mode = match cmd.get("mode") {
            Some(Bson::String(s)) if s == "off" => Mode::Off,
            Some(Bson::String(s)) if s == "alwaysOn" => Mode::AlwaysOn,
            Some(Bson::Document(d)) => {
                let mut it = d.iter();
                match (it.next(), it.next()) {
                    (Some((k, v)), None) if k == "times" => match as_i64(v) {
                        Some(n) if n >= 0 => Mode::Times(n),
                        _ => return Err(CommandError::bad_value("'times' option to 'mode' must be a positive integer")),
                    },
                    (Some((k, v)), None) if k == "skip" => match as_i64(v) {
                        Some(n) if n >= 0 => Mode::Skip(n),
                        _ => return Err(CommandError::bad_value("'skip' option to 'mode' must be a positive integer")),
                    },
                    (Some((k, v)), None) if k == "activationProbability" => match v {
                        Bson::Double(p) if (0.0..=1.0).contains(p) => Mode::Probability(*p),
                        _ => return Err(CommandError::bad_value("'activationProbability' option to 'mode' must be a double between 0 and 1")),
                    },
                    _ => return Err(CommandError::bad_value(format!("invalid mode object {d}"))),
                }
            }
            Some(other) => {
                return Err(CommandError::type_mismatch(format!(
                    "'mode' must be a string or JSON object, got {other}"
                )))
            }
            None => return Err(CommandError::bad_value("Missing mode")),
        };
        let data = match cmd.get("data") {
            Some(Bson::Document(d)) => d.clone(),
            Some(_) => {
                return Err(CommandError::type_mismatch(
                    "the 'data' option must be a JSON object",
                ))
            }
            None => Document::new(),
        };
        for (k, _) in cmd {
            if !matches!(
                k.as_str(),
                "configureFailPoint"
                    | "mode"
                    | "data"
                    | "$db"
                    | "lsid"
                    | "$clusterTime"
                    | "$readPreference"
                    | "comment"
                    | "apiVersion"
                    | "apiStrict"
                    | "apiDeprecationErrors"
                    | "maxTimeMS"
            ) {
                return Err(CommandError::new(
                    40415,
                    "Location40415",
                    format!("BSON field 'configureFailPoint.{k}' is an unknown field."),
                ));
            }
        }
        if mode != Mode::Off {
            match data.get("failCommands") {
                Some(Bson::Array(a)) if a.iter().all(|v| matches!(v, Bson::String(_))) => {}
                Some(_) => {
                    return Err(CommandError::type_mismatch(
                        "failCommands must be an array of strings",
                    ))
                }
                None => {
                    return Err(CommandError::bad_value(
                        "failCommand fail point requires 'failCommands' in its data",
                    ))
                }
            }
            if let Some(code) = data.get("errorCode") {
                if as_i64(code).is_none() {
                    return Err(CommandError::type_mismatch("errorCode must be an integer"));
                }
            }
            if let Some(Bson::Document(wce)) = data.get("writeConcernError") {
                let _ = wce;
            } else if data.contains_key("writeConcernError") {
                return Err(CommandError::type_mismatch(
                    "writeConcernError must be an object",
                ));
            }
        }
        let previous = self.times_entered;
        self.mode = mode;
        self.data = data;
        Ok(previous)
    }

    /// Decides whether the fail point fires for a command, consuming one activation if it does.
    pub fn evaluate(
        &mut self,
        command: &str,
        namespace: &str,
        app_name: Option<&str>,
    ) -> Option<Effect> {
        if self.mode == Mode::Off || command == "configureFailPoint" {
            return None;
        }
        let d = &self.data;
        let listed = match d.get("failCommands") {
            Some(Bson::Array(a)) => a.iter().any(|v| {
                v.as_str().is_some_and(|name| {
                    name == command
                        || (name.eq_ignore_ascii_case("isMaster")
                            && command.eq_ignore_ascii_case("isMaster"))
                        || (name.eq_ignore_ascii_case("findAndModify")
                            && command.eq_ignore_ascii_case("findAndModify"))
                })
            }),
            _ => false,
        };
        if !listed {
            return None;
        }
        if let Some(Bson::String(want)) = d.get("appName") {
            if app_name != Some(want.as_str()) {
                return None;
            }
        }
        if let Some(Bson::String(ns)) = d.get("namespace") {
            if ns != namespace {
                return None;
            }
        }
        let close = d.get_bool("closeConnection").unwrap_or(false);
        let block = d.get_bool("blockConnection").unwrap_or(false);
        let code = d.get("errorCode").and_then(as_i64);
        let wce = match d.get("writeConcernError") {
            Some(Bson::Document(w)) if supports_write_concern(command) => Some(w.clone()),
            _ => None,
        };
        let has_effect = d.contains_key("closeConnection")
            || d.contains_key("errorCode")
            || d.contains_key("blockConnection")
            || wce.is_some();
        if !has_effect {
            return None;
        }
        let fire = match &mut self.mode {
            Mode::Off => false,
            Mode::AlwaysOn => true,
            Mode::Times(n) => {
                if *n > 0 {
                    *n -= 1;
                    true
                } else {
                    false
                }
            }
            Mode::Skip(n) => {
                if *n > 0 {
                    *n -= 1;
                    false
                } else {
                    true
                }
            }
            Mode::Probability(p) => rand::random::<f64>() < *p,
        };
        if let Mode::Times(0) = self.mode {
            self.mode = Mode::Off;
        }
        if !fire {
            return None;
        }
        self.times_entered += 1;
        let block = if block {
            let ms = d
                .get("blockTimeMS")
                .and_then(as_i64)
                .unwrap_or(0)
                .clamp(0, i64::from(i32::MAX));
            Some(Duration::from_millis(ms as u64))
        } else {
            None
        };
        let labels_override = match d.get("errorLabels") {
            Some(Bson::Array(a)) => Some(
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
            ),
            _ => None,
        };
        let error = code.map(|c| {
            let c = c as i32;
            CommandError::new(
                c,
                code_name(c),
                "Failing command via 'failCommand' failpoint",
            )
        });
        Some(Effect {
            block,
            close_connection: close,
            write_concern_error: if close || error.is_some() { None } else { wce },
            error,
            labels_override,
        })
    }
}

/// mongod's name for an error code (`Location<code>` for codes without a name).
pub fn code_name(code: i32) -> String {
    let name = match code {
        1 => "InternalError",
        2 => "BadValue",
        6 => "HostUnreachable",
        7 => "HostNotFound",
        8 => "UnknownError",
        9 => "FailedToParse",
        11 => "UserNotFound",
        13 => "Unauthorized",
        14 => "TypeMismatch",
        18 => "AuthenticationFailed",
        20 => "IllegalOperation",
        24 => "LockTimeout",
        26 => "NamespaceNotFound",
        43 => "CursorNotFound",
        48 => "NamespaceExists",
        50 => "MaxTimeMSExpired",
        59 => "CommandNotFound",
        64 => "WriteConcernFailed",
        67 => "CannotCreateIndex",
        72 => "InvalidOptions",
        79 => "UnknownReplWriteConcern",
        85 => "IndexOptionsConflict",
        86 => "IndexKeySpecsConflict",
        89 => "NetworkTimeout",
        91 => "ShutdownInProgress",
        96 => "OperationFailed",
        100 => "UnsatisfiableWriteConcern",
        112 => "WriteConflict",
        133 => "FailedToSatisfyReadPreference",
        134 => "ReadConcernMajorityNotAvailableYet",
        175 => "QueryPlanKilled",
        189 => "PrimarySteppedDown",
        211 => "KeyNotFound",
        225 => "TransactionTooOld",
        234 => "RetryChangeStream",
        251 => "NoSuchTransaction",
        262 => "ExceededTimeLimit",
        280 => "ChangeStreamFatalError",
        286 => "ChangeStreamHistoryLost",
        9001 => "SocketException",
        10107 => "NotWritablePrimary",
        11000 => "DuplicateKey",
        11600 => "InterruptedAtShutdown",
        11601 => "Interrupted",
        11602 => "InterruptedDueToReplStateChange",
        13435 => "NotPrimaryNoSecondaryOk",
        13436 => "NotPrimaryOrSecondary",
        _ => return format!("Location{code}"),
    };
    name.to_owned()
}

/// Codes for which mongod labels a retryable write's error `RetryableWriteError`.
pub fn is_retryable_write_code(code: i32) -> bool {
    matches!(
        code,
        6 | 7 | 89 | 91 | 189 | 262 | 9001 | 10107 | 11600 | 11602 | 13435 | 13436
    )
}

/// Codes for which mongod labels a change stream's error `ResumableChangeStreamError`.
pub fn is_resumable_change_stream_code(code: i32) -> bool {
    is_retryable_write_code(code) || matches!(code, 63 | 133 | 150 | 234 | 13388 | 43)
}

/// Codes mongod labels `NonResumableChangeStreamError` in change-stream commands.
pub fn is_non_resumable_change_stream_code(code: i32) -> bool {
    matches!(code, 280 | 286)
}
