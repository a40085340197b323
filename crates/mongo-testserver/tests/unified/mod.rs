//! A runner for the drivers' unified test format
//! (mongodb/specifications, source/unified-test-format/unified-test-format.md), executing spec
//! test files through the official `mongodb` crate against a fresh `TestServer` per test, or
//! against a real deployment when `MONGODB_URI` is set.
//!
//! Every test is reported as passed, skipped (with the reason) or failed (with what differed
//! and the commands the failing operation sent).

mod entities;
mod features;
mod matching;
mod operations;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{ReadConcern, WriteConcern};
use mongodb::Client;

use entities::{ClientEntity, Entities, Entity, RecordedEvent};
use matching::{match_root_array, match_value, show};
use operations::{Args, OpError, OpOutput};

/// Schema versions this runner implements (major 1; minor up to this).
const MAX_SCHEMA_MINOR: u64 = 21;

/// Why a test failed.
#[derive(Debug, Clone)]
pub enum Failure {
    /// The runner could not execute something (unsupported by the runner, bad test file).
    Runner(String),
    /// An assertion of the test failed.
    Check(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Runner(m) => write!(f, "[runner] {m}"),
            Failure::Check(m) => write!(f, "{m}"),
        }
    }
}

/// The result of one test.
#[derive(Debug, Clone)]
pub enum Outcome {
    Pass,
    Skip(String),
    Fail(Failure),
}

fn check_fail(msg: impl Into<String>) -> Outcome {
    Outcome::Fail(Failure::Check(msg.into()))
}

fn runner_fail(msg: impl Into<String>) -> Outcome {
    Outcome::Fail(Failure::Runner(msg.into()))
}

/// What the tests run against.
struct Deployment {
    /// The URI of a real deployment (MONGODB_URI); `None`: a fresh TestServer per test.
    external_uri: Option<String>,
    /// A client of the external deployment (for serverParameters requirements).
    probe: Option<Client>,
    version: (u64, u64, u64),
    topology: String,
}

impl Deployment {
    async fn detect() -> Result<Deployment, String> {
        let Ok(uri) = std::env::var("MONGODB_URI") else {
            // Issue 2: the test server is a MongoDB 7.0 single-node replica set.
            return Ok(Deployment {
                external_uri: None,
                probe: None,
                version: (7, 0, 0),
                topology: "replicaset".to_string(),
            });
        };
        let client = Client::with_uri_str(&uri)
            .await
            .map_err(|e| format!("MONGODB_URI {uri}: {e}"))?;
        let admin = client.database("admin");
        let hello = admin
            .run_command(doc! {"hello": 1})
            .await
            .map_err(|e| format!("hello on {uri}: {e}"))?;
        let build = admin
            .run_command(doc! {"buildInfo": 1})
            .await
            .map_err(|e| format!("buildInfo on {uri}: {e}"))?;
        let parts: Vec<u64> = build
            .get_array("versionArray")
            .map(|a| a.iter().take(3).filter_map(operations::as_u64).collect())
            .unwrap_or_default();
        let version = (
            parts.first().copied().unwrap_or(0),
            parts.get(1).copied().unwrap_or(0),
            parts.get(2).copied().unwrap_or(0),
        );
        let topology = if hello.get_str("msg") == Ok("isdbgrid") {
            "sharded"
        } else if hello.contains_key("serviceId") {
            "load-balanced"
        } else if hello.contains_key("setName") {
            "replicaset"
        } else {
            "single"
        };
        Ok(Deployment {
            external_uri: Some(uri),
            probe: Some(client),
            version,
            topology: topology.to_string(),
        })
    }

    fn is_test_server(&self) -> bool {
        self.external_uri.is_none()
    }

    fn describe(&self) -> String {
        let (a, b, c) = self.version;
        match &self.external_uri {
            None => format!(
                "mongo-testserver (as MongoDB {a}.{b}.{c} {})",
                self.topology
            ),
            Some(uri) => format!("{uri} (MongoDB {a}.{b}.{c} {})", self.topology),
        }
    }
}

fn parse_version(s: &str) -> (u64, u64, u64) {
    let mut parts = s.split('.').map(|p| {
        p.split('-')
            .next()
            .unwrap_or("0")
            .parse::<u64>()
            .unwrap_or(0)
    });
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// Why `req` is not met by `dep` (`None`: it is met).
async fn requirement_unmet(req: &Document, dep: &Deployment) -> Option<String> {
    for (k, v) in req {
        match (k.as_str(), v) {
            ("minServerVersion", Bson::String(s)) if dep.version < parse_version(s) => {
                return Some(format!("needs server version >= {s}"));
            }
            ("maxServerVersion", Bson::String(s)) if dep.version > parse_version(s) => {
                return Some(format!("needs server version <= {s}"));
            }
            ("minServerVersion" | "maxServerVersion", _) => {}
            ("topologies", Bson::Array(list)) => {
                let ok = list.iter().filter_map(Bson::as_str).any(|t| {
                    t == dep.topology || (t == "sharded-replicaset" && dep.topology == "sharded")
                });
                if !ok {
                    return Some(format!("needs topology {list:?}"));
                }
            }
            ("serverless", Bson::String(s)) => {
                if s == "require" {
                    return Some("needs Atlas Serverless".to_string());
                }
            }
            ("auth", Bson::Boolean(b)) => {
                // Neither the test server nor the runner's URI handling uses authentication.
                if *b {
                    return Some("needs authentication".to_string());
                }
            }
            ("authMechanism", _) => return Some("needs an authentication mechanism".to_string()),
            ("csfle", v) => {
                if v != &Bson::Boolean(false) {
                    return Some("needs client-side field level encryption".to_string());
                }
            }
            ("serverParameters", Bson::Document(params)) => {
                let Some(internal) = &dep.probe else {
                    return Some(
                        "needs server parameters (getParameter is outside issue 2's list)"
                            .to_string(),
                    );
                };
                for (name, want) in params {
                    let reply = internal
                        .database("admin")
                        .run_command(doc! {"getParameter": 1, name.clone(): 1})
                        .await;
                    let ok = reply
                        .ok()
                        .and_then(|r| r.get(name).cloned())
                        .is_some_and(|got| {
                            match_value(want, Some(&got), false, "", &matching::NoEntities).is_ok()
                        });
                    if !ok {
                        return Some(format!("needs server parameter {name} = {want}"));
                    }
                }
            }
            (other, _) => return Some(format!("unknown runOnRequirement {other:?}")),
        }
    }
    None
}

/// `None` when any requirement of the list is met (or there is no list), else the reasons.
async fn requirements_unmet(reqs: Option<&Vec<Bson>>, dep: &Deployment) -> Option<String> {
    let reqs = reqs?;
    let mut reasons = Vec::new();
    for r in reqs {
        let Some(r) = r.as_document() else {
            return Some("malformed runOnRequirements".to_string());
        };
        match requirement_unmet(r, dep).await {
            None => return None,
            Some(reason) => reasons.push(reason),
        }
    }
    Some(format!(
        "runOnRequirements not met by {}: {}",
        dep.describe(),
        reasons.join(" / ")
    ))
}

/// One test's report line.
struct Report {
    file: String,
    test: String,
    outcome: Outcome,
    notes: Vec<String>,
}

/// The state of one running test.
struct TestRun<'a> {
    uri: String,
    internal: Client,
    entities: Entities,
    fail_points: Vec<String>,
    notes: Vec<String>,
    file: &'a Document,
}

fn spec_dir(suite: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("MONGO_SPEC_TESTS_DIR") {
        return Path::new(&dir).join(suite);
    }
    // <workspace>/../shared/mongo-spec-tests, the workspace being two levels above this crate.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/mongo-spec-tests")
        .join(suite)
}

/// Runs every JSON file of `<spec tests>/<suite>/`, prints one line per test and a summary,
/// and panics when a test failed.
pub fn run_suite(suite: &str) {
    let dir = spec_dir(suite);
    let label = format!("spec {suite}");
    if !dir.is_dir() {
        println!(
            "{label}: skipped: the spec test folder {} does not exist",
            dir.display()
        );
        return;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let filter = std::env::var("SPEC_TEST_FILTER").ok();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let reports = runtime.block_on(async {
        let dep = match Deployment::detect().await {
            Ok(d) => d,
            Err(e) => panic!("{label}: cannot reach the deployment: {e}"),
        };
        println!(
            "{label}: running {} file(s) against {}",
            files.len(),
            dep.describe()
        );
        let mut reports = Vec::new();
        for path in &files {
            run_file(path, &dep, filter.as_deref(), &mut reports).await;
        }
        reports
    });
    runtime.shutdown_timeout(Duration::from_secs(5));

    summarize(&label, &reports);
}

fn summarize(label: &str, reports: &[Report]) {
    let mut passed = 0;
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for r in reports {
        match &r.outcome {
            Outcome::Pass => passed += 1,
            Outcome::Skip(reason) => *skipped.entry(reason.clone()).or_default() += 1,
            Outcome::Fail(f) => failures.push(format!("  {} / {}:\n    {f}", r.file, r.test)),
        }
    }
    let n_skipped: usize = skipped.values().sum();
    let reasons: Vec<String> = skipped
        .iter()
        .map(|(reason, n)| format!("{n}× {reason}"))
        .collect();
    if !failures.is_empty() {
        println!("\n{label}: FAILURES\n{}", failures.join("\n"));
    }
    println!(
        "\n{label}: {passed} passed, {} failed, {n_skipped} skipped{}",
        failures.len(),
        if reasons.is_empty() {
            String::new()
        } else {
            format!(" (reasons: {})", reasons.join("; "))
        }
    );
    assert!(
        failures.is_empty(),
        "{label}: {} test(s) failed (listed above)",
        failures.len()
    );
}

fn load(path: &Path) -> Result<Document, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    // Extended JSON (relaxed or canonical) to BSON.
    match Bson::try_from(json).map_err(|e| e.to_string())? {
        Bson::Document(d) => Ok(d),
        _ => Err("the file is not a JSON object".to_string()),
    }
}

fn print_report(r: &Report) {
    match &r.outcome {
        Outcome::Pass => println!("PASS {} / {}", r.file, r.test),
        Outcome::Skip(reason) => println!("SKIP {} / {}: {reason}", r.file, r.test),
        Outcome::Fail(f) => println!("FAIL {} / {}: {f}", r.file, r.test),
    }
    for n in &r.notes {
        println!("     note: {n}");
    }
}

async fn run_file(path: &Path, dep: &Deployment, filter: Option<&str>, reports: &mut Vec<Report>) {
    let file_name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file = match load(path) {
        Ok(f) => f,
        Err(e) => {
            let r = Report {
                file: file_name,
                test: "(file)".to_string(),
                outcome: runner_fail(format!("cannot load: {e}")),
                notes: Vec::new(),
            };
            print_report(&r);
            reports.push(r);
            return;
        }
    };
    let tests: Vec<Document> = file
        .get_array("tests")
        .map(|t| t.iter().filter_map(|t| t.as_document().cloned()).collect())
        .unwrap_or_default();
    let schema = file.get_str("schemaVersion").unwrap_or("");
    let (major, minor, _) = parse_version(schema);
    let schema_error = (major != 1 || minor > MAX_SCHEMA_MINOR)
        .then(|| format!("schemaVersion {schema:?} is not supported by this runner"));
    for test in &tests {
        let name = test.get_str("description").unwrap_or("(no description)");
        if filter.is_some_and(|f| !format!("{file_name} / {name}").contains(f)) {
            continue;
        }
        let mut notes = Vec::new();
        let outcome = match &schema_error {
            Some(e) => runner_fail(e.clone()),
            None => {
                let fut = run_test(&file, test, dep, &mut notes);
                match tokio::time::timeout(Duration::from_secs(120), fut).await {
                    Ok(o) => o,
                    Err(_) => check_fail("the test did not finish within 120 s"),
                }
            }
        };
        let r = Report {
            file: file_name.clone(),
            test: name.to_string(),
            outcome,
            notes,
        };
        print_report(&r);
        reports.push(r);
    }
}

fn client_entity_ids(list: &[Bson]) -> Vec<String> {
    list.iter()
        .filter_map(Bson::as_document)
        .filter_map(|e| e.get_document("client").ok())
        .filter_map(|c| c.get_str("id").ok().map(str::to_string))
        .collect()
}

async fn run_test(
    file: &Document,
    test: &Document,
    dep: &Deployment,
    notes: &mut Vec<String>,
) -> Outcome {
    if let Ok(reason) = test.get_str("skipReason") {
        return Outcome::Skip(format!("skipReason: {reason}"));
    }
    for level in [file, test] {
        if let Some(reason) =
            requirements_unmet(level.get_array("runOnRequirements").ok(), dep).await
        {
            return Outcome::Skip(reason);
        }
    }
    if let Some(reason) = features::driver_defect(test) {
        return Outcome::Skip(reason);
    }
    let entity_list = file
        .get_array("createEntities")
        .cloned()
        .unwrap_or_default();
    if dep.is_test_server() {
        let mut clients = client_entity_ids(&entity_list);
        for op in test.get_array("operations").into_iter().flatten() {
            if let Some(list) = op
                .as_document()
                .and_then(|o| o.get_document("arguments").ok())
                .and_then(|a| a.get_array("entities").ok())
            {
                clients.extend(client_entity_ids(list));
            }
        }
        if let Some(reason) = features::outside_issue(test, &entity_list, &clients) {
            return Outcome::Skip(reason);
        }
    }

    // A fresh server for every test (or the external deployment); dropped last.
    let mut _server = None;
    let uri = match &dep.external_uri {
        Some(uri) => uri.clone(),
        None => match mongo_testserver::TestServer::start().await {
            Ok(s) => {
                let uri = s.uri().to_string();
                _server = Some(s);
                uri
            }
            Err(e) => return check_fail(format!("TestServer::start failed: {e}")),
        },
    };
    let internal_uri =
        match entities::uri_with_options(&uri, &doc! {"serverSelectionTimeoutMS": 10_000}) {
            Ok(u) => u,
            Err(o) => return o,
        };
    let internal = match Client::with_uri_str(&internal_uri).await {
        Ok(c) => c,
        Err(e) => return check_fail(format!("internal client: {e}")),
    };

    let mut run = TestRun {
        uri,
        internal,
        entities: Entities::default(),
        fail_points: Vec::new(),
        notes: Vec::new(),
        file,
    };
    let outcome = run.execute(test, &entity_list).await;
    notes.append(&mut run.notes);
    // Entities (clients, cursors, change streams) go before the server does.
    drop(run);
    outcome
}

fn describe_error(e: &mongodb::error::Error) -> String {
    let mut s = e.to_string();
    if let Some(resp) = e.server_response() {
        if let Ok(d) = Document::try_from(resp.as_ref()) {
            s.push_str(&format!(" — server reply: {}", show(&Bson::Document(d))));
        }
    }
    s
}

/// Commands (and replies) a client sent since event `from`, for failure reports.
fn commands_since(client: Option<&ClientEntity>, from: usize) -> String {
    let Some(client) = client else {
        return String::new();
    };
    let events = client.events_since(from);
    if events.is_empty() {
        return String::new();
    }
    let lines: Vec<String> = events
        .iter()
        .rev()
        .take(8)
        .rev()
        .map(|e| format!("\n      {}", e.describe()))
        .collect();
    format!("\n    commands sent/replies:{}", lines.concat())
}

/// Server error codes and their names (for drivers' errors that carry a code without its name).
const CODE_NAMES: &[(i32, &str)] = &[
    (2, "BadValue"),
    (8, "UnknownError"),
    (9, "FailedToParse"),
    (13, "Unauthorized"),
    (14, "TypeMismatch"),
    (20, "IllegalOperation"),
    (26, "NamespaceNotFound"),
    (27, "IndexNotFound"),
    (40, "ConflictingUpdateOperators"),
    (43, "CursorNotFound"),
    (48, "NamespaceExists"),
    (50, "MaxTimeMSExpired"),
    (52, "DollarPrefixedFieldName"),
    (59, "CommandNotFound"),
    (66, "ImmutableField"),
    (72, "InvalidOptions"),
    (85, "IndexOptionsConflict"),
    (86, "IndexKeySpecsConflict"),
    (91, "ShutdownInProgress"),
    (96, "OperationFailed"),
    (112, "WriteConflict"),
    (115, "CommandNotSupported"),
    (121, "DocumentValidationFailure"),
    (168, "InvalidPipelineOperator"),
    (189, "PrimarySteppedDown"),
    (251, "NoSuchTransaction"),
    (280, "ChangeStreamFatalError"),
    (10107, "NotWritablePrimary"),
    (11000, "DuplicateKey"),
    (11600, "InterruptedAtShutdown"),
    (13435, "NotPrimaryNoSecondaryOk"),
];

/// The server errors a driver error carries: (code, codeName if known, message).
fn server_errors(e: &mongodb::error::Error) -> Vec<(i32, Option<String>, String)> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Command(c) => vec![(c.code, Some(c.code_name.clone()), c.message.clone())],
        ErrorKind::Write(WriteFailure::WriteError(w)) => {
            vec![(w.code, w.code_name.clone(), w.message.clone())]
        }
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
            vec![(w.code, Some(w.code_name.clone()), w.message.clone())]
        }
        ErrorKind::InsertMany(m) => {
            let mut v: Vec<_> = m
                .write_errors
                .iter()
                .flatten()
                .map(|w| (w.code, w.code_name.clone(), w.message.clone()))
                .collect();
            if let Some(w) = &m.write_concern_error {
                v.push((w.code, Some(w.code_name.clone()), w.message.clone()));
            }
            v
        }
        _ => Vec::new(),
    }
    .into_iter()
    .map(|(code, name, msg)| (code, name.filter(|n| !n.is_empty()), msg))
    .collect()
}

fn is_client_error(e: &mongodb::error::Error) -> bool {
    use mongodb::error::ErrorKind;
    !matches!(
        e.kind.as_ref(),
        ErrorKind::Command(_)
            | ErrorKind::Write(_)
            | ErrorKind::InsertMany(_)
            | ErrorKind::BulkWrite(_)
    )
}

/// Checks an `expectError` document against the error an operation raised.
fn check_error(
    expected: &Document,
    error: &mongodb::error::Error,
    partial_result: Option<&Bson>,
    entities: &Entities,
) -> Result<(), Outcome> {
    let fail = |msg: String| check_fail(format!("{msg}; the error was: {}", describe_error(error)));
    let server = server_errors(error);
    for (k, v) in expected {
        match (k.as_str(), v) {
            ("isError", Bson::Boolean(true)) => {}
            ("isClientError", Bson::Boolean(want)) => {
                if is_client_error(error) != *want {
                    return Err(fail(format!(
                        "expected {} error",
                        if *want { "a client" } else { "a server" }
                    )));
                }
            }
            ("errorContains", Bson::String(s)) => {
                let needle = s.to_lowercase();
                let found = error.to_string().to_lowercase().contains(&needle)
                    || server
                        .iter()
                        .any(|(_, _, m)| m.to_lowercase().contains(&needle));
                if !found {
                    return Err(fail(format!("expected the error message to contain {s:?}")));
                }
            }
            ("errorCode", code) => {
                let Some(code) = code.as_i64().or_else(|| code.as_i32().map(i64::from)) else {
                    return Err(runner_fail(format!("bad errorCode {code:?}")));
                };
                if !server.iter().any(|(c, _, _)| i64::from(*c) == code) {
                    return Err(fail(format!("expected server error code {code}")));
                }
            }
            ("errorCodeName", Bson::String(name)) => {
                let matched = server.iter().any(|(code, got, _)| match got {
                    Some(got) => got.eq_ignore_ascii_case(name),
                    None => CODE_NAMES
                        .iter()
                        .any(|(c, n)| c == code && n.eq_ignore_ascii_case(name)),
                });
                if !matched {
                    return Err(fail(format!("expected server error codeName {name}")));
                }
            }
            ("errorLabelsContain", Bson::Array(labels)) => {
                for l in labels.iter().filter_map(Bson::as_str) {
                    if !error.contains_label(l) {
                        return Err(fail(format!(
                            "expected error label {l:?}; labels: {:?}",
                            error.labels()
                        )));
                    }
                }
            }
            ("errorLabelsOmit", Bson::Array(labels)) => {
                for l in labels.iter().filter_map(Bson::as_str) {
                    if error.contains_label(l) {
                        return Err(fail(format!("expected no error label {l:?}")));
                    }
                }
            }
            ("errorResponse", exp) => {
                let Some(resp) = error.server_response() else {
                    return Err(fail("expected a server response in the error".to_string()));
                };
                let resp = Document::try_from(resp.as_ref())
                    .map_err(|e| runner_fail(format!("unreadable server response: {e}")))?;
                match_value(
                    exp,
                    Some(&Bson::Document(resp)),
                    true,
                    "errorResponse",
                    entities,
                )
                .map_err(fail)?;
            }
            ("expectResult", exp) => match partial_result {
                None => {
                    return Err(fail(
                        "expected the error to carry a write result; it carries none".to_string(),
                    ))
                }
                Some(actual) => {
                    match_value(exp, Some(actual), true, "error.result", entities)
                        .map_err(|m| fail(format!("error result mismatch: {m}")))?;
                }
            },
            (other, _) => {
                return Err(runner_fail(format!(
                    "expectError.{other} is not implemented by this runner"
                )))
            }
        }
    }
    Ok(())
}

impl TestRun<'_> {
    async fn execute(&mut self, test: &Document, entity_list: &[Bson]) -> Outcome {
        if let Err(o) = self.initial_data().await {
            return o;
        }
        if let Err(o) = self.entities.create(entity_list, &self.uri).await {
            return o;
        }
        let mut outcome = Outcome::Pass;
        let ops: Vec<Document> = test
            .get_array("operations")
            .map(|o| o.iter().filter_map(|o| o.as_document().cloned()).collect())
            .unwrap_or_default();
        for (i, op) in ops.iter().enumerate() {
            if let Err(o) = self.operation(i, op).await {
                outcome = o;
                break;
            }
        }
        // Events observed during the operations (before any cleanup command).
        let observed: BTreeMap<String, Vec<RecordedEvent>> = self
            .entities
            .map
            .iter()
            .filter_map(|(id, e)| match e {
                Entity::Client(c) => Some((id.clone(), c.events_since(0))),
                _ => None,
            })
            .collect();
        self.disable_fail_points().await;
        if !matches!(outcome, Outcome::Pass) {
            return outcome;
        }
        if let Ok(expect) = test.get_array("expectEvents") {
            if let Err(o) = self.check_events(expect, &observed) {
                return o;
            }
        }
        if let Ok(expected) = test.get_array("outcome") {
            if let Err(o) = self.check_outcome(expected).await {
                return o;
            }
        }
        Outcome::Pass
    }

    async fn initial_data(&mut self) -> Result<(), Outcome> {
        let Ok(list) = self.file.get_array("initialData") else {
            return Ok(());
        };
        let majority = WriteConcern::majority();
        for data in list {
            let data = data
                .as_document()
                .ok_or_else(|| runner_fail("initialData element is not a document"))?;
            let db_name = data
                .get_str("databaseName")
                .map_err(|_| runner_fail("initialData without databaseName"))?;
            let coll_name = data
                .get_str("collectionName")
                .map_err(|_| runner_fail("initialData without collectionName"))?;
            let db = self.internal.database(db_name);
            let setup = |what: &str, e: mongodb::error::Error| {
                check_fail(format!(
                    "initialData: {what} {db_name}.{coll_name} failed: {}",
                    describe_error(&e)
                ))
            };
            for name in [
                coll_name.to_string(),
                format!("enxcol_.{coll_name}.esc"),
                format!("enxcol_.{coll_name}.ecoc"),
            ] {
                db.collection::<Document>(&name)
                    .drop()
                    .write_concern(majority.clone())
                    .await
                    .map_err(|e| setup("drop", e))?;
            }
            let docs: Vec<Document> = data
                .get_array("documents")
                .map(|d| d.iter().filter_map(|d| d.as_document().cloned()).collect())
                .unwrap_or_default();
            if let Ok(opts) = data.get_document("createOptions") {
                let mut cmd = doc! {"create": coll_name};
                cmd.extend(opts.clone());
                cmd.insert("writeConcern", doc! {"w": "majority"});
                db.run_command(cmd).await.map_err(|e| setup("create", e))?;
            } else if docs.is_empty() {
                db.create_collection(coll_name)
                    .write_concern(majority.clone())
                    .await
                    .map_err(|e| setup("create", e))?;
            }
            if !docs.is_empty() {
                db.collection::<Document>(coll_name)
                    .insert_many(docs)
                    .write_concern(majority.clone())
                    .await
                    .map_err(|e| setup("insert", e))?;
            }
        }
        Ok(())
    }

    async fn disable_fail_points(&mut self) {
        for name in std::mem::take(&mut self.fail_points) {
            let r = self
                .internal
                .database("admin")
                .run_command(doc! {"configureFailPoint": &name, "mode": "off"})
                .await;
            if let Err(e) = r {
                self.notes.push(format!(
                    "disabling fail point {name} failed: {}",
                    describe_error(&e)
                ));
            }
        }
    }

    /// Runs operation `i`; an `Err` ends the test with that outcome.
    async fn operation(&mut self, i: usize, op: &Document) -> Result<(), Outcome> {
        let name = op
            .get_str("name")
            .map_err(|_| runner_fail(format!("operation {i} has no name")))?;
        let object = op
            .get_str("object")
            .map_err(|_| runner_fail(format!("operation {i} has no object")))?;
        let args = op.get_document("arguments").cloned().unwrap_or_default();
        let at = format!("operation {i} ({name} on {object})");
        if object == "testRunner" {
            return self
                .special_operation(name, args)
                .await
                .map_err(|o| prefix(o, &at));
        }
        let client_before = self
            .entities
            .owning_client(object)
            .map(ClientEntity::event_count)
            .unwrap_or(0);
        let result =
            operations::execute(&mut self.entities, object, name, Args::new(name, args)).await;
        let commands = || commands_since(self.entities.owning_client(object), client_before);
        if op.get_bool("ignoreResultAndError") == Ok(true) {
            if let Err(OpError::Runner(o)) = result {
                return Err(prefix(o, &at));
            }
            return Ok(());
        }
        match result {
            Err(OpError::Runner(o)) => Err(prefix(o, &at)),
            Err(OpError::Driver(failure)) => {
                let operations::DriverFailure {
                    error,
                    partial_result,
                } = *failure;
                let Ok(expected) = op.get_document("expectError") else {
                    return Err(check_fail(format!(
                        "{at}: unexpected error: {}{}",
                        describe_error(&error),
                        commands()
                    )));
                };
                check_error(expected, &error, partial_result.as_ref(), &self.entities)
                    .map_err(|o| prefix(o, &format!("{at}: expectError")))
                    .map_err(|o| append(o, &commands()))
            }
            Ok(output) => {
                if op.contains_key("expectError") {
                    return Err(check_fail(format!(
                        "{at}: expected an error, the operation succeeded with {}{}",
                        output.value.as_ref().map_or("no result".to_string(), show),
                        commands()
                    )));
                }
                if let Some(expected) = op.get("expectResult") {
                    let checked = match (&output.value, output.root_documents) {
                        (Some(Bson::Array(items)), true) => {
                            match_root_array(expected, items, &self.entities)
                        }
                        (actual, _) => {
                            match_value(expected, actual.as_ref(), true, "", &self.entities)
                        }
                    };
                    if let Err(m) = checked {
                        return Err(check_fail(format!(
                            "{at}: expectResult mismatch: {m}{}",
                            commands()
                        )));
                    }
                }
                if let Ok(id) = op.get_str("saveResultAsEntity") {
                    self.save_entity(id, output).map_err(|o| prefix(o, &at))?;
                }
                Ok(())
            }
        }
    }

    fn save_entity(&mut self, id: &str, output: OpOutput) -> Result<(), Outcome> {
        let entity = match (output.entity, output.value) {
            (Some(e), _) => e,
            (None, Some(v)) => Entity::Bson(v),
            (None, None) => {
                return Err(runner_fail(format!(
                    "saveResultAsEntity {id}: the operation returned nothing"
                )))
            }
        };
        self.entities.insert(id, entity)
    }

    async fn special_operation(&mut self, name: &str, args: Document) -> Result<(), Outcome> {
        let mut args = Args::new(name, args);
        let runner = |e: OpError| match e {
            OpError::Runner(o) => o,
            OpError::Driver(f) => check_fail(describe_error(&f.error)),
        };
        match name {
            "failPoint" => {
                let client_id = args.req_str("client").map_err(runner)?;
                let fail_point = args.req_doc("failPoint").map_err(runner)?;
                args.finish().map_err(runner)?;
                let fp_name = fail_point
                    .get_str("configureFailPoint")
                    .map_err(|_| runner_fail("failPoint without configureFailPoint"))?
                    .to_string();
                let client = self.entities.client(&client_id)?.client.clone();
                client
                    .database("admin")
                    .run_command(fail_point.clone())
                    .selection_criteria(mongodb::options::SelectionCriteria::ReadPreference(
                        mongodb::options::ReadPreference::Primary,
                    ))
                    .await
                    .map_err(|e| {
                        check_fail(format!(
                            "configureFailPoint {} failed: {}",
                            show(&Bson::Document(fail_point.clone())),
                            describe_error(&e)
                        ))
                    })?;
                self.fail_points.push(fp_name);
                Ok(())
            }
            "createEntities" => {
                let list = args.take("entities");
                args.finish().map_err(runner)?;
                let Some(Bson::Array(list)) = list else {
                    return Err(runner_fail("createEntities needs an entities array"));
                };
                let uri = self.uri.clone();
                self.entities.create(&list, &uri).await
            }
            "assertCollectionExists" | "assertCollectionNotExists" => {
                let db = args.req_str("databaseName").map_err(runner)?;
                let coll = args.req_str("collectionName").map_err(runner)?;
                args.finish().map_err(runner)?;
                let names = self
                    .internal
                    .database(&db)
                    .list_collection_names()
                    .await
                    .map_err(|e| check_fail(describe_error(&e)))?;
                let exists = names.contains(&coll);
                if exists != (name == "assertCollectionExists") {
                    return Err(check_fail(format!(
                        "{name}: {db}.{coll} exists = {exists}; collections: {names:?}"
                    )));
                }
                Ok(())
            }
            "assertIndexExists" | "assertIndexNotExists" => {
                let db = args.req_str("databaseName").map_err(runner)?;
                let coll = args.req_str("collectionName").map_err(runner)?;
                let index = args.req_str("indexName").map_err(runner)?;
                args.finish().map_err(runner)?;
                let names = self
                    .internal
                    .database(&db)
                    .collection::<Document>(&coll)
                    .list_index_names()
                    .await;
                let names = match names {
                    Ok(n) => n,
                    Err(_) if name == "assertIndexNotExists" => Vec::new(),
                    Err(e) => return Err(check_fail(describe_error(&e))),
                };
                let exists = names.contains(&index);
                if exists != (name == "assertIndexExists") {
                    return Err(check_fail(format!(
                        "{name}: index {index} on {db}.{coll} exists = {exists}; indexes: {names:?}"
                    )));
                }
                Ok(())
            }
            "wait" => {
                let ms = args.u64("ms").map_err(runner)?.unwrap_or(0);
                args.finish().map_err(runner)?;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(())
            }
            other => Err(runner_fail(format!(
                "special operation {other} is not implemented by this runner"
            ))),
        }
    }

    fn check_events(
        &self,
        expect: &[Bson],
        observed: &BTreeMap<String, Vec<RecordedEvent>>,
    ) -> Result<(), Outcome> {
        for group in expect {
            let group = group
                .as_document()
                .ok_or_else(|| runner_fail("expectEvents element is not a document"))?;
            let client_id = group
                .get_str("client")
                .map_err(|_| runner_fail("expectEvents without client"))?;
            let event_type = group.get_str("eventType").unwrap_or("command");
            if event_type != "command" {
                return Err(runner_fail(format!(
                    "expectEvents eventType {event_type} is not implemented by this runner"
                )));
            }
            let client = self.entities.client(client_id)?;
            let all = observed.get(client_id).cloned().unwrap_or_default();
            let actual: Vec<&RecordedEvent> =
                all.iter().filter(|e| !client.is_ignored(e, &all)).collect();
            let expected = group
                .get_array("events")
                .map_err(|_| runner_fail("expectEvents without events"))?;
            let ignore_extra = group.get_bool("ignoreExtraEvents").unwrap_or(false);
            let listing = || {
                actual
                    .iter()
                    .map(|e| format!("\n      {}", e.describe()))
                    .collect::<String>()
            };
            if actual.len() < expected.len() || (!ignore_extra && actual.len() != expected.len()) {
                return Err(check_fail(format!(
                    "expectEvents for {client_id}: expected {} event(s){}, observed {}:{}",
                    expected.len(),
                    if ignore_extra { " (or more)" } else { "" },
                    actual.len(),
                    listing()
                )));
            }
            for (i, (exp, act)) in expected.iter().zip(&actual).enumerate() {
                check_event(exp, act, &all, &self.entities).map_err(|m| {
                    check_fail(format!(
                        "expectEvents for {client_id}, event {i}: {m}; observed:{}",
                        listing()
                    ))
                })?;
            }
        }
        Ok(())
    }

    async fn check_outcome(&mut self, expected: &[Bson]) -> Result<(), Outcome> {
        for data in expected {
            let data = data
                .as_document()
                .ok_or_else(|| runner_fail("outcome element is not a document"))?;
            let db_name = data
                .get_str("databaseName")
                .map_err(|_| runner_fail("outcome without databaseName"))?;
            let coll_name = data
                .get_str("collectionName")
                .map_err(|_| runner_fail("outcome without collectionName"))?;
            let want: Vec<Bson> = data
                .get_array("documents")
                .map_err(|_| runner_fail("outcome without documents"))?
                .clone();
            let coll = self
                .internal
                .database(db_name)
                .collection_with_options::<Document>(
                    coll_name,
                    mongodb::options::CollectionOptions::builder()
                        .read_concern(ReadConcern::local())
                        .selection_criteria(mongodb::options::SelectionCriteria::ReadPreference(
                            mongodb::options::ReadPreference::Primary,
                        ))
                        .build(),
                );
            let cursor = coll.find(doc! {}).sort(doc! {"_id": 1}).await;
            let got: Vec<Document> = match cursor {
                Ok(c) => futures_util::TryStreamExt::try_collect(c).await,
                Err(e) => Err(e),
            }
            .map_err(|e| {
                check_fail(format!(
                    "outcome: reading {db_name}.{coll_name} failed: {}",
                    describe_error(&e)
                ))
            })?;
            let got: Vec<Bson> = got.into_iter().map(Bson::Document).collect();
            let same = want.len() == got.len()
                && want
                    .iter()
                    .zip(&got)
                    .all(|(w, g)| matching::exact_match(w, g));
            if !same {
                let render = |docs: &[Bson]| {
                    docs.iter()
                        .map(|d| format!("\n        {}", show(d)))
                        .collect::<String>()
                };
                return Err(check_fail(format!(
                    "outcome: {db_name}.{coll_name} differs (exact comparison, key order aside)\
                     \n      expected:{}\n      got:{}",
                    render(&want),
                    render(&got)
                )));
            }
            for (w, g) in want.iter().zip(&got) {
                if !matching::same_key_order(w, g) {
                    self.notes.push(format!(
                        "outcome {db_name}.{coll_name}: key order differs from the spec file \
                         (allowed by the format): expected {}, got {}",
                        show(w),
                        show(g)
                    ));
                }
            }
        }
        Ok(())
    }
}

fn check_event(
    expected: &Bson,
    actual: &RecordedEvent,
    all: &[RecordedEvent],
    entities: &Entities,
) -> Result<(), String> {
    let exp = expected
        .as_document()
        .filter(|d| d.len() == 1)
        .ok_or("an expected event must have exactly one key")?;
    let (kind, fields) = exp.iter().next().expect("one key");
    let fields = fields
        .as_document()
        .ok_or("expected event fields must be a document")?;
    if kind != actual.kind() {
        return Err(format!("expected a {kind}, observed {}", actual.describe()));
    }
    // The database of a succeeded/failed event is that of its started event.
    let database_name = all.iter().find_map(|e| match e {
        RecordedEvent::Started {
            database_name,
            request_id,
            ..
        } if *request_id == actual.request_id() => Some(database_name.clone()),
        _ => None,
    });
    let (service, server_conn) = match actual {
        RecordedEvent::Started {
            has_service_id,
            has_server_connection_id,
            ..
        }
        | RecordedEvent::Succeeded {
            has_service_id,
            has_server_connection_id,
            ..
        }
        | RecordedEvent::Failed {
            has_service_id,
            has_server_connection_id,
            ..
        } => (*has_service_id, *has_server_connection_id),
    };
    for (k, v) in fields {
        match (k.as_str(), actual) {
            ("command", RecordedEvent::Started { command, .. }) => match_value(
                v,
                Some(&Bson::Document(command.clone())),
                true,
                "command",
                entities,
            )?,
            ("reply", RecordedEvent::Succeeded { reply, .. }) => match_value(
                v,
                Some(&Bson::Document(reply.clone())),
                true,
                "reply",
                entities,
            )?,
            ("commandName", _) => {
                if v.as_str() != Some(actual.command_name()) {
                    return Err(format!(
                        "expected commandName {v}, observed {}",
                        actual.command_name()
                    ));
                }
            }
            ("databaseName", _) => {
                if v.as_str() != database_name.as_deref() {
                    return Err(format!(
                        "expected databaseName {v}, observed {database_name:?}"
                    ));
                }
            }
            ("hasServiceId", _) => {
                let b = &v.as_bool().ok_or("hasServiceId must be a boolean")?;
                if *b != service {
                    return Err(format!("expected hasServiceId {b}"));
                }
            }
            ("hasServerConnectionId", _) => {
                let b = &v
                    .as_bool()
                    .ok_or("hasServerConnectionId must be a boolean")?;
                if *b != server_conn {
                    return Err(format!("expected hasServerConnectionId {b}"));
                }
            }
            (other, _) => {
                return Err(format!(
                    "[runner] {kind}.{other} is not implemented by this runner"
                ))
            }
        }
    }
    Ok(())
}

fn prefix(o: Outcome, at: &str) -> Outcome {
    match o {
        Outcome::Fail(Failure::Runner(m)) => Outcome::Fail(Failure::Runner(format!("{at}: {m}"))),
        Outcome::Fail(Failure::Check(m)) => Outcome::Fail(Failure::Check(format!("{at}: {m}"))),
        other => other,
    }
}

fn append(o: Outcome, extra: &str) -> Outcome {
    match o {
        Outcome::Fail(Failure::Check(m)) => Outcome::Fail(Failure::Check(format!("{m}{extra}"))),
        other => other,
    }
}
