//! The database of a run with worker processes, MongoDB or PostgreSQL: it starts the server
//! (or uses the given one), sets up the run's storage and the independent recorder before any
//! worker starts, tells the orchestrator how far the run got, what is still held at the end,
//! and hands the recorded history to the checker.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use mongolock::testing::postgres_server::{PgServer, NO_BINARIES};
use tokio::task::JoinHandle;

use crate::checker::Checker;
use crate::config::{CLI_LIVE_COLLECTION, JOBS_COLLECTION, JOBS_LOCK_FIELD, LOCK_COLLECTION};
use crate::faults::FaultTarget;
use crate::history::{micros, LockHistory, ResourceHistory, SlotHistory};
use crate::options::{Backend, RunArgs};
use crate::postgres;
use crate::recorder::{self, Followed, Progress};
use crate::resource::RESOURCE_COLLECTION;

type AnyError = Box<dyn std::error::Error + Send + Sync>;

/// A lease found held after the end: name, lease id, expiry (µs).
pub type Held = (String, String, i64);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// What the recorder handed over at the end.
pub struct Recorded {
    /// The checker, fed with every grant and accepted write recorded.
    pub checker: Checker,
    /// Acquisitions recorded in all (`None`: report the count at the stop).
    pub acquisitions: Option<u64>,
    /// Lock documents (rows) deleted by TTL (cleanup).
    pub deletes: u64,
    /// Change streams reopened, and reopenings that failed (MongoDB).
    pub resumes: (u64, u64),
}

/// The database of a process-based run.
pub enum Store {
    /// MongoDB.
    Mongo(MongoStore),
    /// PostgreSQL.
    Postgres(PgStore),
}

impl Store {
    /// Starts the server (or connects), prepares the run's storage and starts recording.
    /// `server_uri`: a MongoDB server the run started itself elsewhere (in a network
    /// namespace, [`crate::netns`]): fail points are used as with the embedded server.
    pub async fn start(
        args: &RunArgs,
        seed: u64,
        server_uri: Option<String>,
    ) -> Result<Store, AnyError> {
        match args.backend {
            Backend::Mongo => Ok(Store::Mongo(
                MongoStore::start(args, seed, server_uri).await?,
            )),
            Backend::Postgres => Ok(Store::Postgres(PgStore::start(args, seed).await?)),
            Backend::Memory => Err("the memory backend runs without a store".into()),
        }
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        match self {
            Store::Mongo(_) => Backend::Mongo,
            Store::Postgres(_) => Backend::Postgres,
        }
    }

    /// The URI (URL) the workers and the CLI connect to.
    pub fn uri(&self) -> &str {
        match self {
            Store::Mongo(m) => &m.uri,
            Store::Postgres(p) => &p.url,
        }
    }

    /// The run's database (MongoDB) or schema (PostgreSQL).
    pub fn db(&self) -> &str {
        match self {
            Store::Mongo(m) => &m.db_name,
            Store::Postgres(p) => &p.schema,
        }
    }

    /// The `--collection` of the CLI check's locks.
    pub fn cli_collection(&self) -> String {
        match self {
            Store::Mongo(_) => "cli_locks".into(),
            Store::Postgres(p) => format!("{}.cli_locks", p.schema),
        }
    }

    /// The `--collection` of the CLI check's liveness name, whose history is recorded: a
    /// collection of its own on MongoDB ([`CLI_LIVE_COLLECTION`]), the workers' lock table on
    /// PostgreSQL.
    pub fn live_collection(&self) -> String {
        match self {
            Store::Mongo(_) => CLI_LIVE_COLLECTION.into(),
            Store::Postgres(p) => format!("{}.{LOCK_COLLECTION}", p.schema),
        }
    }

    /// Whether fail points may be used (the embedded server, or `--failpoints`).
    pub fn fail_points(&self) -> bool {
        match self {
            Store::Mongo(m) => m.fail_points,
            Store::Postgres(_) => false,
        }
    }

    /// Where the fault injector injects faults (PostgreSQL: a connection of its own).
    pub async fn fault_target(&self) -> Result<FaultTarget, AnyError> {
        match self {
            Store::Mongo(m) => Ok(FaultTarget::Mongo {
                admin: m.control.database("admin"),
                db: m.db.clone(),
                progress: m.progress.clone(),
            }),
            Store::Postgres(p) => {
                let config = postgres::config(&p.url, "torture-faults")?;
                Ok(FaultTarget::Postgres(postgres::connect(&config).await?))
            }
        }
    }

    /// Acquisitions recorded so far (for progress and `--acquisitions`).
    pub async fn acquisitions(&mut self) -> u64 {
        match self {
            Store::Mongo(m) => m.progress.grants.load(Ordering::Relaxed),
            Store::Postgres(p) => match p.progress.poll(&p.control).await {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("torture: cannot count the history's grants: {e}");
                    0
                }
            },
        }
    }

    /// Leases held now, in server time.
    pub async fn still_held(&self) -> Result<Vec<Held>, AnyError> {
        match self {
            Store::Mongo(m) => m.still_held().await,
            Store::Postgres(p) => postgres::still_held(&p.control, &p.schema).await,
        }
    }

    /// Ends the recording (every worker has exited) and hands everything to a checker.
    pub async fn finish(&mut self) -> Result<Recorded, AnyError> {
        match self {
            Store::Mongo(m) => m.finish().await,
            Store::Postgres(p) => {
                let mut checker = Checker::strict_release_order();
                let totals = postgres::read_histories(&p.control, &p.schema, &mut checker).await?;
                eprintln!(
                    "torture: PostgreSQL history: {} lock row changes, {} grants, {} slot grants, {} rows deleted by cleanup",
                    totals.rows, totals.grants, totals.slot_grants, totals.deletes
                );
                Ok(Recorded {
                    checker,
                    acquisitions: Some(totals.grants),
                    deletes: totals.deletes,
                    resumes: (0, 0),
                })
            }
        }
    }

    /// After the report: on violations, keeps what helps a diagnosis (PostgreSQL: the lock
    /// history, in `dir`, and the server log's tail); then stops the server of the run, or
    /// drops the run's schema on a server that is not the run's own when the run was clean.
    pub async fn close(self, violations: bool, dir: &Path) {
        match self {
            Store::Mongo(m) => {
                if let Some(s) = m.server {
                    s.shutdown().await;
                }
            }
            Store::Postgres(p) => p.close(violations, dir).await,
        }
    }
}

async fn client(uri: &str, app: &str) -> Result<Client, AnyError> {
    let mut options = ClientOptions::parse(uri).await?;
    options.app_name = Some(app.to_owned());
    options.server_selection_timeout = Some(Duration::from_secs(10));
    Ok(Client::with_options(options)?)
}

/// MongoDB: the embedded server (or `--uri`), and the recorder following the change streams of
/// the lock, jobs and resource collections.
pub struct MongoStore {
    server: Option<mongo_testserver::TestServer>,
    uri: String,
    db_name: String,
    fail_points: bool,
    control: Client,
    db: Database,
    checker: Arc<Mutex<Checker>>,
    progress: Arc<Progress>,
    followers: Vec<JoinHandle<()>>,
}

impl MongoStore {
    async fn start(
        args: &RunArgs,
        seed: u64,
        server_uri: Option<String>,
    ) -> Result<MongoStore, AnyError> {
        let ours = server_uri.is_some();
        let (server, uri) = match (&args.uri, server_uri) {
            (_, Some(u)) => (None, u),
            (Some(u), None) if !u.is_empty() => (None, u.clone()),
            _ => {
                let server = mongo_testserver::TestServer::builder()
                    .ttl_monitor_interval(args.ttl_monitor)
                    .start_background()?;
                let uri = server.uri();
                (Some(server), uri)
            }
        };
        let fail_points = server.is_some() || ours || args.failpoints;
        let control = client(&uri, "torture-control").await?;
        let db_name = format!("torture_{seed:x}");
        let db = control.database(&db_name);
        let recorder_client = client(&uri, "torture-recorder").await?;
        let rdb = recorder_client.database(&db_name);

        // The recorder starts before anything is written.
        let checker = Arc::new(Mutex::new(Checker::new()));
        let progress = Arc::new(Progress::default());
        let mut followers = Vec::new();
        for (coll, followed) in [
            (
                LOCK_COLLECTION,
                Followed::Locks {
                    history: LockHistory::new(None),
                    name: recorder::string_id,
                    slots: Some(SlotHistory::new()),
                },
            ),
            (
                JOBS_COLLECTION,
                Followed::Locks {
                    history: LockHistory::new(Some(JOBS_LOCK_FIELD)),
                    name: recorder::job_id,
                    slots: None,
                },
            ),
            (
                RESOURCE_COLLECTION,
                Followed::Resource(ResourceHistory::new()),
            ),
            (
                CLI_LIVE_COLLECTION,
                Followed::Locks {
                    history: LockHistory::new(None),
                    name: recorder::string_id,
                    slots: None,
                },
            ),
        ] {
            // Create the collection first: a change stream on a missing collection works on
            // MongoDB, but an explicit collection makes the start point unambiguous.
            let _ = db.create_collection(coll).await;
            followers.push(
                recorder::follow(
                    rdb.collection(coll),
                    followed,
                    checker.clone(),
                    progress.clone(),
                )
                .await?,
            );
        }
        let jobs: Vec<Document> = (0..args.jobs as i64)
            .map(|i| doc! { "_id": i, "job": true })
            .collect();
        if !jobs.is_empty() {
            db.collection::<Document>(JOBS_COLLECTION)
                .insert_many(jobs)
                .await?;
        }
        Ok(MongoStore {
            server,
            uri,
            db_name,
            fail_points,
            control,
            db,
            checker,
            progress,
            followers,
        })
    }

    async fn still_held(&self) -> Result<Vec<Held>, AnyError> {
        let mut held = held_in(&self.db, LOCK_COLLECTION, "", recorder::string_id).await?;
        held.extend(held_in(&self.db, CLI_LIVE_COLLECTION, "", recorder::string_id).await?);
        held.extend(
            held_in(
                &self.db,
                JOBS_COLLECTION,
                &format!("{JOBS_LOCK_FIELD}."),
                recorder::job_id,
            )
            .await?,
        );
        Ok(held)
    }

    async fn finish(&mut self) -> Result<Recorded, AnyError> {
        // End markers, then the recorder finishes.
        for coll in [
            LOCK_COLLECTION,
            JOBS_COLLECTION,
            RESOURCE_COLLECTION,
            CLI_LIVE_COLLECTION,
        ] {
            self.db
                .collection::<Document>(coll)
                .insert_one(recorder::end_marker())
                .await?;
        }
        for f in std::mem::take(&mut self.followers) {
            if tokio::time::timeout(Duration::from_secs(120), f)
                .await
                .is_err()
            {
                eprintln!("torture: the recorder did not reach the end marker within 120 s");
            }
        }
        // The recorder is done (or gave up): the checker is ours now.
        Ok(Recorded {
            checker: std::mem::take(&mut *lock(&self.checker)),
            acquisitions: None,
            deletes: self.progress.deletes.load(Ordering::Relaxed),
            resumes: (
                self.progress.resumes.load(Ordering::Relaxed),
                self.progress.gaps.load(Ordering::Relaxed),
            ),
        })
    }
}

/// Finds leases still held (server time) in `coll` with lock fields under `prefix`.
async fn held_in(
    db: &Database,
    coll: &str,
    prefix: &str,
    name_of: fn(&Bson) -> Option<String>,
) -> Result<Vec<Held>, AnyError> {
    let mut held = Vec::new();
    let filter = doc! {
        format!("{prefix}leaseId"): { "$type": "string" },
        "$expr": { "$gt": [format!("${prefix}expiresAt"), "$$NOW"] },
    };
    let mut cursor = db.collection::<Document>(coll).find(filter).await?;
    while cursor.advance().await? {
        let d: Document = cursor.deserialize_current()?;
        let name = d.get("_id").and_then(name_of).unwrap_or_default();
        let at = |f: &str| crate::history::get_path(&d, &format!("{prefix}{f}")).cloned();
        let lease = match at("leaseId") {
            Some(Bson::String(s)) => s,
            _ => String::new(),
        };
        held.push((name, lease, micros(at("expiresAt").as_ref()).unwrap_or(0)));
    }
    Ok(held)
}

/// PostgreSQL: a cluster of the run's own (or `--postgres-url`), a schema of the run's own with
/// the lock table, the history trigger and the resource (see [`crate::postgres`]).
pub struct PgStore {
    server: Option<PgServer>,
    url: String,
    schema: String,
    control: tokio_postgres::Client,
    progress: postgres::Progress,
}

impl PgStore {
    async fn start(args: &RunArgs, seed: u64) -> Result<PgStore, AnyError> {
        let given = args
            .postgres_url
            .clone()
            .filter(|u| !u.is_empty())
            .or_else(|| {
                args.uri
                    .clone()
                    .filter(|u| u.starts_with("postgres://") || u.starts_with("postgresql://"))
            });
        let (server, url) = match given {
            Some(url) => (None, url),
            None => {
                if mongolock::testing::postgres_server::bin_dir().is_none() {
                    return Err(format!("cannot start PostgreSQL: {NO_BINARIES}").into());
                }
                let server = tokio::task::spawn_blocking(PgServer::start)
                    .await?
                    .map_err(|e| format!("cannot start PostgreSQL: {e}"))?;
                eprintln!("torture: PostgreSQL started in {}", server.dir().display());
                let url = server.url();
                (Some(server), url)
            }
        };
        let schema = format!("torture_{seed:x}_{}", std::process::id());
        let control = postgres::connect(&postgres::config(&url, "torture-control")?)
            .await
            .map_err(|e| format!("cannot connect to PostgreSQL: {e}"))?;
        postgres::install(&control, &url, &schema).await?;
        Ok(PgStore {
            server,
            url,
            progress: postgres::Progress::new(&schema),
            schema,
            control,
        })
    }

    async fn close(self, violations: bool, dir: &Path) {
        if violations {
            let path = dir.join("lock_history.tsv");
            match postgres::dump_history(&self.control, &self.schema, &path).await {
                Ok(()) => eprintln!("torture: lock history in {}", path.display()),
                Err(e) => eprintln!("torture: cannot write the lock history: {e}"),
            }
            if let Some(s) = &self.server {
                eprintln!("torture: PostgreSQL log (tail):\n{}", s.log_tail(40));
            }
        } else if self.server.is_none() {
            if let Err(e) = postgres::drop_schema(&self.control, &self.schema).await {
                eprintln!("torture: cannot drop schema {}: {e}", self.schema);
            }
        }
        drop(self.control);
        if let Some(s) = self.server {
            // Stopping runs pg_ctl: not on the runtime's threads.
            let _ = tokio::task::spawn_blocking(move || drop(s)).await;
        }
    }
}
