//! Test databases: a real deployment when `MONGODB_URI` is set, else an embedded
//! mongo-testserver. Every test uses its own database and collection names.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use mongo_testserver::TestServer;
use mongodb::bson::{doc, Document};
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use mongolock::{LockBackend, LockProvider, MongoBackend};

/// A database for one test; keeps the embedded server (if any) alive.
pub struct TestDb {
    pub server: Option<TestServer>,
    pub uri: String,
    pub db: Database,
}

/// A unique suffix for database, collection and lock names.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// `MONGODB_URI` if set, else a fresh embedded test server.
pub async fn test_database() -> TestDb {
    test_database_with(TestServer::builder()).await
}

/// Like [`test_database`], configuring the embedded server (ignored for `MONGODB_URI`).
pub async fn test_database_with(builder: mongo_testserver::Builder) -> TestDb {
    let (server, uri) = match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => (None, uri),
        _ => {
            let server = builder.start().await.expect("start mongo-testserver");
            let uri = server.uri();
            (Some(server), uri)
        }
    };
    let client = client(&uri, None).await;
    let db = client.database(&unique("mongolock_test"));
    TestDb { server, uri, db }
}

/// A client for `uri`, optionally with an application name (used to aim fail points).
pub async fn client(uri: &str, app_name: Option<&str>) -> Client {
    let mut options = ClientOptions::parse(uri).await.expect("parse MongoDB URI");
    options.app_name = app_name.map(str::to_owned);
    options.server_selection_timeout = Some(Duration::from_secs(10));
    Client::with_options(options).expect("client")
}

impl TestDb {
    /// A backend on a fresh collection in this database.
    pub fn backend(&self) -> MongoBackend {
        MongoBackend::builder(&self.db)
            .collection(unique("locks"))
            .build()
            .expect("valid collection name")
    }

    /// The same database seen through a client with `app_name`.
    pub async fn database_as(&self, app_name: &str) -> Database {
        client(&self.uri, Some(app_name))
            .await
            .database(self.db.name())
    }

    /// Runs `configureFailPoint: "failCommand"` on the admin database.
    pub async fn fail_point(&self, mode: mongodb::bson::Bson, data: Document) {
        self.db
            .client()
            .database("admin")
            .run_command(doc! { "configureFailPoint": "failCommand", "mode": mode, "data": data })
            .await
            .expect("configureFailPoint");
    }

    /// Turns the failCommand fail point off.
    pub async fn fail_point_off(&self) {
        self.db
            .client()
            .database("admin")
            .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
            .await
            .expect("configureFailPoint off");
    }
}

/// Whether the deployment supports something real MongoDB offers only with test commands
/// enabled (failCommand): true for the embedded server.
pub fn fail_points_available(db: &TestDb) -> bool {
    db.server.is_some() || std::env::var("MONGODB_FAILPOINTS").is_ok_and(|v| v == "1")
}

/// True (after printing why) when the deployment cannot run fail-point tests: the caller
/// returns, skipping the test. Never true for the embedded server.
pub fn skip_without_fail_points(db: &TestDb) -> bool {
    if fail_points_available(db) {
        return false;
    }
    eprintln!("skipped: failCommand needs test commands (set MONGODB_FAILPOINTS=1)");
    true
}

pub fn shared(b: MongoBackend) -> Arc<dyn LockBackend> {
    Arc::new(b)
}

/// Takes `name` once and releases it: creates its lock document with its first token (and
/// starts the backend's change stream).
pub async fn take_once(provider: &LockProvider, name: &str) {
    let guard = provider.lock(name).unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
}

/// A provider on a new lock collection of `t`, with the collection (for raw reads and writes).
pub fn provider_on_new_collection(t: &TestDb) -> (LockProvider, mongodb::Collection<Document>) {
    let name = unique("locks");
    let backend = MongoBackend::builder(&t.db)
        .collection(name.clone())
        .build()
        .unwrap();
    (
        LockProvider::builder(backend).build().unwrap(),
        t.db.collection(&name),
    )
}

/// A BSON date `ms` milliseconds before this machine's now.
pub fn millis_ago(ms: i64) -> mongodb::bson::DateTime {
    mongodb::bson::DateTime::from_millis(mongodb::bson::DateTime::now().timestamp_millis() - ms)
}

/// Document locks on `coll` with the options of a provider configured by `options` (document
/// locks use the provider's options, not its backend).
pub fn docs_with<T: Send + Sync>(
    coll: &mongodb::Collection<T>,
    options: impl FnOnce(mongolock::LockProviderBuilder) -> mongolock::LockProviderBuilder,
) -> mongolock::documents::DocumentLocksBuilder<T> {
    options(mongolock::LockProvider::builder(
        mongolock::MemoryBackend::new(),
    ))
    .build()
    .expect("valid provider options")
    .documents(coll)
}

/// Whether the deployment reports an update made with a pipeline as a `replace` event (MongoDB
/// 4.4, or mongo-testserver built with `pipeline_updates_as_replace`) rather than an `update`
/// event with an update description: asked of the deployment itself, with one change stream
/// on a scratch collection.
pub async fn pipeline_updates_are_replace_events(db: &Database) -> bool {
    let coll = db.collection::<Document>(&unique("probe"));
    coll.insert_one(doc! { "_id": 1, "v": 0 }).await.unwrap();
    let mut stream = coll.watch().await.unwrap();
    coll.update_one(
        doc! { "_id": 1 },
        vec![doc! { "$set": { "v": { "$add": ["$v", 1] } } }],
    )
    .await
    .unwrap();
    let kind = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match stream.next_if_any().await {
                Ok(Some(ev)) => break ev.operation_type,
                Ok(None) => {}
                Err(e) => panic!("the probe's change stream failed: {e}"),
            }
        }
    })
    .await
    .expect("the probe's change event arrived within 30 s");
    coll.drop().await.unwrap();
    kind == mongodb::change_stream::event::OperationType::Replace
}
