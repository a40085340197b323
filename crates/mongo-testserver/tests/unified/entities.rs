//! The entity map of a unified test: clients (with their recorded command events), databases,
//! collections, change streams, cursors and saved BSON values.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{Bson, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::{
    ClientOptions, CollectionOptions, DatabaseOptions, ReadConcern, ReadPreference,
    ReadPreferenceOptions, SelectionCriteria, TagSet, WriteConcern,
};
use mongodb::{Client, Collection, Cursor, Database};

use super::matching::EntityLookup;
use super::{Failure, Outcome};

/// One command monitoring event, as recorded for a client.
#[derive(Debug, Clone)]
pub enum RecordedEvent {
    Started {
        command: Document,
        command_name: String,
        database_name: String,
        request_id: i32,
        has_service_id: bool,
        has_server_connection_id: bool,
    },
    Succeeded {
        reply: Document,
        command_name: String,
        request_id: i32,
        has_service_id: bool,
        has_server_connection_id: bool,
    },
    Failed {
        command_name: String,
        request_id: i32,
        failure: String,
        has_service_id: bool,
        has_server_connection_id: bool,
    },
}

impl RecordedEvent {
    pub fn kind(&self) -> &'static str {
        match self {
            RecordedEvent::Started { .. } => "commandStartedEvent",
            RecordedEvent::Succeeded { .. } => "commandSucceededEvent",
            RecordedEvent::Failed { .. } => "commandFailedEvent",
        }
    }

    pub fn command_name(&self) -> &str {
        match self {
            RecordedEvent::Started { command_name, .. }
            | RecordedEvent::Succeeded { command_name, .. }
            | RecordedEvent::Failed { command_name, .. } => command_name,
        }
    }

    pub fn request_id(&self) -> i32 {
        match self {
            RecordedEvent::Started { request_id, .. }
            | RecordedEvent::Succeeded { request_id, .. }
            | RecordedEvent::Failed { request_id, .. } => *request_id,
        }
    }

    /// A one-line description for failure messages.
    pub fn describe(&self) -> String {
        match self {
            RecordedEvent::Started {
                command,
                database_name,
                ..
            } => format!(
                "commandStartedEvent db={database_name} {}",
                super::matching::show(&Bson::Document(command.clone()))
            ),
            RecordedEvent::Succeeded {
                reply,
                command_name,
                ..
            } => format!(
                "commandSucceededEvent {command_name} {}",
                super::matching::show(&Bson::Document(reply.clone()))
            ),
            RecordedEvent::Failed {
                command_name,
                failure,
                ..
            } => format!("commandFailedEvent {command_name}: {failure}"),
        }
    }
}

/// Commands whose events are never observed unless `observeSensitiveCommands` is true.
const SENSITIVE_COMMANDS: &[&str] = &[
    "authenticate",
    "saslstart",
    "saslcontinue",
    "getnonce",
    "createuser",
    "updateuser",
    "copydbgetnonce",
    "copydbsaslstart",
    "copydb",
];

pub struct ClientEntity {
    pub client: Client,
    pub events: Arc<Mutex<Vec<RecordedEvent>>>,
    pub observe: HashSet<String>,
    pub ignore_commands: HashSet<String>,
    pub observe_sensitive: bool,
}

impl ClientEntity {
    /// Number of events recorded so far (all kinds, unfiltered).
    pub fn event_count(&self) -> usize {
        self.events.lock().unwrap().len()
    }

    /// All events recorded since `from` (unfiltered).
    pub fn events_since(&self, from: usize) -> Vec<RecordedEvent> {
        self.events.lock().unwrap()[from..].to_vec()
    }

    /// Whether the runner must leave this event out of `expectEvents` comparisons.
    pub fn is_ignored(&self, event: &RecordedEvent, all: &[RecordedEvent]) -> bool {
        if !self.observe.contains(event.kind()) {
            return true;
        }
        let name = event.command_name();
        if name == "configureFailPoint" || self.ignore_commands.contains(name) {
            return true;
        }
        if self.observe_sensitive {
            return false;
        }
        let lower = name.to_ascii_lowercase();
        if SENSITIVE_COMMANDS.contains(&lower.as_str()) {
            return true;
        }
        if lower == "hello" || lower == "ismaster" {
            // Sensitive when it carries speculativeAuthenticate: the driver then redacts the
            // command (and reply) to an empty document.
            let started = all.iter().find_map(|e| match e {
                RecordedEvent::Started {
                    command,
                    request_id,
                    ..
                } if *request_id == event.request_id() => Some(command),
                _ => None,
            });
            return started.is_none_or(|c| c.is_empty());
        }
        false
    }
}

pub enum Entity {
    Client(Box<ClientEntity>),
    Database {
        db: Database,
        client: String,
    },
    Collection {
        coll: Collection<Document>,
        client: String,
    },
    ChangeStream {
        stream: Box<mongodb::change_stream::ChangeStream<Document>>,
        client: String,
    },
    Cursor {
        cursor: Box<Cursor<Document>>,
        client: String,
    },
    Bson(Bson),
}

impl Entity {
    pub fn type_name(&self) -> &'static str {
        match self {
            Entity::Client(_) => "client",
            Entity::Database { .. } => "database",
            Entity::Collection { .. } => "collection",
            Entity::ChangeStream { .. } => "changeStream",
            Entity::Cursor { .. } => "cursor",
            Entity::Bson(_) => "BSON value",
        }
    }
}

#[derive(Default)]
pub struct Entities {
    pub map: HashMap<String, Entity>,
}

impl EntityLookup for Entities {
    fn bson_entity(&self, name: &str) -> Option<Bson> {
        match self.map.get(name) {
            Some(Entity::Bson(b)) => Some(b.clone()),
            _ => None,
        }
    }
    fn session_lsid(&self, _: &str) -> Option<Document> {
        None
    }
}

fn fail(msg: impl Into<String>) -> Outcome {
    Outcome::Fail(Failure::Runner(msg.into()))
}

impl Entities {
    pub fn insert(&mut self, id: &str, entity: Entity) -> Result<(), Outcome> {
        if self.map.contains_key(id) {
            return Err(fail(format!("entity {id:?} is already defined")));
        }
        self.map.insert(id.to_string(), entity);
        Ok(())
    }

    pub fn client(&self, id: &str) -> Result<&ClientEntity, Outcome> {
        match self.map.get(id) {
            Some(Entity::Client(c)) => Ok(c),
            Some(other) => Err(fail(format!(
                "entity {id:?} is a {}, not a client",
                other.type_name()
            ))),
            None => Err(fail(format!("no client entity {id:?}"))),
        }
    }

    pub fn database(&self, id: &str) -> Result<(&Database, &str), Outcome> {
        match self.map.get(id) {
            Some(Entity::Database { db, client }) => Ok((db, client)),
            Some(other) => Err(fail(format!(
                "entity {id:?} is a {}, not a database",
                other.type_name()
            ))),
            None => Err(fail(format!("no database entity {id:?}"))),
        }
    }

    /// The client entity that owns `id` (itself when `id` is a client).
    pub fn owning_client(&self, id: &str) -> Option<&ClientEntity> {
        let client_id = match self.map.get(id)? {
            Entity::Client(_) => id,
            Entity::Database { client, .. }
            | Entity::Collection { client, .. }
            | Entity::ChangeStream { client, .. }
            | Entity::Cursor { client, .. } => client.as_str(),
            Entity::Bson(_) => return None,
        };
        match self.map.get(client_id)? {
            Entity::Client(c) => Some(c),
            _ => None,
        }
    }

    /// Creates the entities of a `createEntities` list.
    pub async fn create(&mut self, list: &[Bson], base_uri: &str) -> Result<(), Outcome> {
        for item in list {
            let Some(entity) = item.as_document() else {
                return Err(fail("createEntities element is not a document"));
            };
            if entity.len() != 1 {
                return Err(fail(format!(
                    "an entity must have exactly one key: {entity:?}"
                )));
            }
            let (kind, spec) = entity.iter().next().expect("one key");
            let spec = spec
                .as_document()
                .ok_or_else(|| fail(format!("{kind} entity is not a document")))?;
            let id = spec
                .get_str("id")
                .map_err(|_| fail(format!("{kind} entity without id")))?
                .to_string();
            match kind.as_str() {
                "client" => {
                    let client = create_client(spec, base_uri).await?;
                    self.insert(&id, Entity::Client(Box::new(client)))?;
                }
                "database" => {
                    check_keys(spec, &["id", "client", "databaseName", "databaseOptions"])?;
                    let client_id = spec
                        .get_str("client")
                        .map_err(|_| fail("database entity without client"))?;
                    let name = spec
                        .get_str("databaseName")
                        .map_err(|_| fail("database entity without databaseName"))?;
                    let client = self.client(client_id)?;
                    let db = match spec.get_document("databaseOptions") {
                        Ok(o) => {
                            let (rc, wc, sc) = concerns(o)?;
                            let mut opts = DatabaseOptions::default();
                            opts.read_concern = rc;
                            opts.write_concern = wc;
                            opts.selection_criteria = sc;
                            client.client.database_with_options(name, opts)
                        }
                        Err(_) => client.client.database(name),
                    };
                    let client = client_id.to_string();
                    self.insert(&id, Entity::Database { db, client })?;
                }
                "collection" => {
                    check_keys(
                        spec,
                        &["id", "database", "collectionName", "collectionOptions"],
                    )?;
                    let db_id = spec
                        .get_str("database")
                        .map_err(|_| fail("collection entity without database"))?;
                    let name = spec
                        .get_str("collectionName")
                        .map_err(|_| fail("collection entity without collectionName"))?;
                    let (db, client) = self.database(db_id)?;
                    let coll = match spec.get_document("collectionOptions") {
                        Ok(o) => {
                            let (rc, wc, sc) = concerns(o)?;
                            let mut opts = CollectionOptions::default();
                            opts.read_concern = rc;
                            opts.write_concern = wc;
                            opts.selection_criteria = sc;
                            db.collection_with_options(name, opts)
                        }
                        Err(_) => db.collection(name),
                    };
                    let client = client.to_string();
                    self.insert(&id, Entity::Collection { coll, client })?;
                }
                other => {
                    return Err(fail(format!("unsupported entity type {other:?}")));
                }
            }
        }
        Ok(())
    }
}

fn check_keys(spec: &Document, known: &[&str]) -> Result<(), Outcome> {
    match spec.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(fail(format!("unsupported entity option {k:?}"))),
        None => Ok(()),
    }
}

type Concerns = (
    Option<ReadConcern>,
    Option<WriteConcern>,
    Option<SelectionCriteria>,
);

/// Parses a collectionOrDatabaseOptions document.
pub fn concerns(opts: &Document) -> Result<Concerns, Outcome> {
    let mut rc = None;
    let mut wc = None;
    let mut sc = None;
    for (k, v) in opts {
        match k.as_str() {
            "readConcern" => rc = Some(read_concern(v)?),
            "writeConcern" => wc = Some(write_concern(v)?),
            "readPreference" => sc = Some(read_preference(v)?),
            other => {
                return Err(fail(format!(
                    "unsupported collection/database option {other:?}"
                )))
            }
        }
    }
    Ok((rc, wc, sc))
}

pub fn read_concern(v: &Bson) -> Result<ReadConcern, Outcome> {
    let level = v
        .as_document()
        .and_then(|d| d.get_str("level").ok())
        .ok_or_else(|| fail(format!("bad readConcern {v:?}")))?;
    Ok(ReadConcern::custom(level))
}

pub fn write_concern(v: &Bson) -> Result<WriteConcern, Outcome> {
    let d = v
        .as_document()
        .ok_or_else(|| fail(format!("bad writeConcern {v:?}")))?;
    let mut wc = WriteConcern::default();
    for (k, val) in d {
        match (k.as_str(), val) {
            ("w", Bson::String(s)) if s == "majority" => {
                wc.w = Some(mongodb::options::Acknowledgment::Majority)
            }
            ("w", Bson::String(s)) => {
                wc.w = Some(mongodb::options::Acknowledgment::Custom(s.clone()))
            }
            ("w", n) => {
                let n = super::operations::as_u64(n).ok_or_else(|| fail(format!("bad w {n:?}")))?;
                wc.w = Some(mongodb::options::Acknowledgment::Nodes(n as u32));
            }
            ("journal", Bson::Boolean(b)) => wc.journal = Some(*b),
            ("wtimeoutMS", n) => {
                let n = super::operations::as_u64(n)
                    .ok_or_else(|| fail(format!("bad wtimeoutMS {n:?}")))?;
                wc.w_timeout = Some(Duration::from_millis(n));
            }
            (other, _) => return Err(fail(format!("unsupported writeConcern field {other:?}"))),
        }
    }
    Ok(wc)
}

pub fn read_preference(v: &Bson) -> Result<SelectionCriteria, Outcome> {
    let d = v
        .as_document()
        .ok_or_else(|| fail(format!("bad readPreference {v:?}")))?;
    let mode = d
        .get_str("mode")
        .map_err(|_| fail("readPreference without mode"))?;
    let mut options = ReadPreferenceOptions::default();
    for (k, val) in d {
        match k.as_str() {
            "mode" => {}
            "tagSets" => {
                let sets = val
                    .as_array()
                    .ok_or_else(|| fail("tagSets must be an array"))?
                    .iter()
                    .map(|s| {
                        s.as_document()
                            .map(|d| {
                                d.iter()
                                    .filter_map(|(k, v)| {
                                        v.as_str().map(|v| (k.clone(), v.to_string()))
                                    })
                                    .collect::<TagSet>()
                            })
                            .ok_or_else(|| fail("a tag set must be a document"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                options.tag_sets = Some(sets);
            }
            "maxStalenessSeconds" => {
                let n = super::operations::as_u64(val)
                    .ok_or_else(|| fail("bad maxStalenessSeconds"))?;
                options.max_staleness = Some(Duration::from_secs(n));
            }
            other => return Err(fail(format!("unsupported readPreference field {other:?}"))),
        }
    }
    let options = Some(options);
    let pref = match mode.to_ascii_lowercase().as_str() {
        "primary" => ReadPreference::Primary,
        "primarypreferred" => ReadPreference::PrimaryPreferred { options },
        "secondary" => ReadPreference::Secondary { options },
        "secondarypreferred" => ReadPreference::SecondaryPreferred { options },
        "nearest" => ReadPreference::Nearest { options },
        other => return Err(fail(format!("unknown readPreference mode {other:?}"))),
    };
    Ok(SelectionCriteria::ReadPreference(pref))
}

/// Renders a URI option value for the connection string.
fn uri_value(v: &Bson) -> Result<Vec<String>, Outcome> {
    Ok(match v {
        Bson::String(s) => vec![s.clone()],
        Bson::Boolean(b) => vec![b.to_string()],
        Bson::Int32(i) => vec![i.to_string()],
        Bson::Int64(i) => vec![i.to_string()],
        Bson::Double(d) => vec![d.to_string()],
        Bson::Array(items) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| fail(format!("unsupported uriOptions array value {i:?}")))
            })
            .collect::<Result<_, _>>()?,
        Bson::Document(d) => {
            // authMechanismProperties and the like: "k:v,k:v".
            let parts: Vec<String> = d
                .iter()
                .map(|(k, v)| match v {
                    Bson::String(s) => Ok(format!("{k}:{s}")),
                    Bson::Boolean(b) => Ok(format!("{k}:{b}")),
                    other => Err(fail(format!("unsupported uriOptions value {other:?}"))),
                })
                .collect::<Result<_, _>>()?;
            vec![parts.join(",")]
        }
        other => return Err(fail(format!("unsupported uriOptions value {other:?}"))),
    })
}

/// `base_uri` with the given options added (overriding options of the same name).
pub fn uri_with_options(base_uri: &str, options: &Document) -> Result<String, Outcome> {
    let (head, query) = match base_uri.split_once('?') {
        Some((h, q)) => (h.to_string(), q.to_string()),
        None => {
            let h = if base_uri.trim_end_matches('/').matches('/').count() > 2 {
                base_uri.to_string()
            } else {
                format!("{}/", base_uri.trim_end_matches('/'))
            };
            (h, String::new())
        }
    };
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (p.to_string(), String::new()),
        })
        .collect();
    for (k, v) in options {
        if matches!(v, Bson::Document(d) if d.contains_key("$$placeholder")) {
            return Err(Outcome::Skip(format!(
                "uriOptions.{k} is a $$placeholder this runner has no value for"
            )));
        }
        pairs.retain(|(pk, _)| !pk.eq_ignore_ascii_case(k));
        for value in uri_value(v)? {
            pairs.push((k.clone(), value));
        }
    }
    let query: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Ok(format!("{head}?{}", query.join("&")))
}

const CLIENT_KEYS: &[&str] = &[
    "id",
    "uriOptions",
    "useMultipleMongoses",
    "observeEvents",
    "ignoreCommandMonitoringEvents",
    "observeSensitiveCommands",
    "storeEventsAsEntities",
    "serverApi",
    "observeLogMessages",
];

const COMMAND_EVENTS: &[&str] = &[
    "commandStartedEvent",
    "commandSucceededEvent",
    "commandFailedEvent",
];

async fn create_client(spec: &Document, base_uri: &str) -> Result<ClientEntity, Outcome> {
    check_keys(spec, CLIENT_KEYS)?;
    if spec.contains_key("storeEventsAsEntities") {
        return Err(fail(
            "client option storeEventsAsEntities is not implemented",
        ));
    }
    if spec.contains_key("observeLogMessages") {
        return Err(fail("client option observeLogMessages is not implemented"));
    }
    let mut observe = HashSet::new();
    if let Ok(list) = spec.get_array("observeEvents") {
        for e in list {
            let name = e
                .as_str()
                .ok_or_else(|| fail("observeEvents entries must be strings"))?;
            if !COMMAND_EVENTS.contains(&name) {
                return Err(fail(format!(
                    "observing {name} (CMAP/SDAM events) is not implemented by this runner"
                )));
            }
            observe.insert(name.to_string());
        }
    }
    let ignore_commands = spec
        .get_array("ignoreCommandMonitoringEvents")
        .map(|l| {
            l.iter()
                .filter_map(|c| c.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let observe_sensitive = spec.get_bool("observeSensitiveCommands").unwrap_or(false);

    let mut uri_options = spec.get_document("uriOptions").cloned().unwrap_or_default();
    // Fail fast instead of waiting 30 s when the server is unreachable, unless the test says.
    if !uri_options
        .keys()
        .any(|k| k.eq_ignore_ascii_case("serverSelectionTimeoutMS"))
    {
        uri_options.insert("serverSelectionTimeoutMS", 10_000);
    }
    let uri = uri_with_options(base_uri, &uri_options)?;
    let mut options = ClientOptions::parse(&uri)
        .await
        .map_err(|e| fail(format!("cannot parse client URI {uri}: {e}")))?;
    if let Ok(api) = spec.get_document("serverApi") {
        let version = api.get_str("version").unwrap_or_default();
        if version != "1" {
            return Err(fail(format!("unsupported serverApi version {version:?}")));
        }
        let mut server_api = mongodb::options::ServerApi::builder()
            .version(mongodb::options::ServerApiVersion::V1)
            .build();
        server_api.strict = api.get_bool("strict").ok();
        server_api.deprecation_errors = api.get_bool("deprecationErrors").ok();
        options.server_api = Some(server_api);
    }
    let events: Arc<Mutex<Vec<RecordedEvent>>> = Arc::default();
    let sink = events.clone();
    options.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        let recorded = match ev {
            CommandEvent::Started(e) => RecordedEvent::Started {
                command: e.command,
                command_name: e.command_name,
                database_name: e.db,
                request_id: e.request_id,
                has_service_id: e.service_id.is_some(),
                has_server_connection_id: e.connection.server_id.is_some(),
            },
            CommandEvent::Succeeded(e) => RecordedEvent::Succeeded {
                reply: e.reply,
                command_name: e.command_name,
                request_id: e.request_id,
                has_service_id: e.service_id.is_some(),
                has_server_connection_id: e.connection.server_id.is_some(),
            },
            CommandEvent::Failed(e) => RecordedEvent::Failed {
                command_name: e.command_name,
                request_id: e.request_id,
                failure: e.failure.to_string(),
                has_service_id: e.service_id.is_some(),
                has_server_connection_id: e.connection.server_id.is_some(),
            },
            _ => return,
        };
        sink.lock().unwrap().push(recorded);
    }));
    let client = Client::with_options(options)
        .map_err(|e| fail(format!("cannot create client for {uri}: {e}")))?;
    Ok(ClientEntity {
        client,
        events,
        observe,
        ignore_commands,
        observe_sensitive,
    })
}
