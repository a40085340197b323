//! The lock collection must be mongolock's, and its TTL indexes must not undercut fencing:
//! an application's collection is refused with nothing written; a TTL index that may delete
//! lock documents sooner than the first-acquisition shortcut allows sends first acquisitions
//! down the stamp path, so tokens never go backwards. Runs against the embedded
//! mongo-testserver, or against `MONGODB_URI` when set.

use crate::support::mongo;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryStreamExt;
use mongo::{test_database, test_database_with, unique, TestDb};
use mongo_testserver::TestServer;
use mongodb::bson::{doc, oid::ObjectId, Bson, DateTime, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, IndexModel};

use crate::support::mongo::docs_with;
use mongolock::{Error, LockProvider, MongoBackend};

/// Every document of `coll`, sorted by `_id` as extended JSON.
async fn all_docs(coll: &Collection<Document>) -> Vec<Document> {
    let mut docs: Vec<Document> = coll
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    docs.sort_by_key(|d| d.get("_id").map(ToString::to_string));
    docs
}

/// The specifications of `coll`'s indexes (as `listIndexes` shows them).
async fn index_specs(coll: &Collection<Document>) -> Vec<Document> {
    let reply = coll
        .client()
        .database(&coll.namespace().db)
        .run_command(doc! { "listIndexes": coll.name(), "cursor": {} })
        .await
        .unwrap();
    reply
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()
        .iter()
        .map(|i| i.as_document().unwrap().clone())
        .collect()
}

fn assert_foreign<T: std::fmt::Debug>(what: &str, r: mongolock::Result<T>, ns: &str) {
    match r {
        Err(Error::ForeignCollection {
            namespace, found, ..
        }) => {
            assert_eq!(namespace, ns, "{what}");
            assert!(
                found.contains("not a mongolock lock document"),
                "{what}: {found}"
            );
        }
        other => panic!("{what}: expected ForeignCollection for {ns}, got {other:?}"),
    }
}

/// An application's collection (here with `expiresAt` dates of its own, which a TTL index on
/// `expiresAt` would delete) is refused by every kind of lock and by `ensure_indexes`, and
/// nothing is written: no lock fields, no epoch counters, no index.
#[tokio::test]
async fn an_application_collection_is_refused_and_left_untouched() {
    let t = test_database().await;
    let coll_name = unique("users");
    let coll = t.db.collection::<Document>(&coll_name);
    let old = DateTime::from_millis(1_000_000_000_000);
    coll.insert_many(vec![
        doc! { "_id": "x", "name": "alice", "expiresAt": old },
        doc! { "_id": ObjectId::new(), "name": "bob", "expiresAt": old },
    ])
    .await
    .unwrap();
    let before = all_docs(&coll).await;
    let indexes_before = index_specs(&coll).await;
    let ns = coll.namespace().to_string();

    let backend = MongoBackend::builder(&t.db)
        .collection(coll_name.clone())
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend.clone()).build().unwrap();
    assert_foreign("lock", provider.lock("x").unwrap().try_acquire().await, &ns);
    assert_foreign(
        "lock with a wait",
        provider
            .lock("y")
            .unwrap()
            .acquire_timeout(Duration::from_secs(2))
            .await,
        &ns,
    );
    assert_foreign(
        "semaphore",
        provider.semaphore("x", 2).unwrap().try_acquire().await,
        &ns,
    );
    assert_foreign(
        "rw lock",
        provider.rw_lock("x").unwrap().try_write().await,
        &ns,
    );
    assert_foreign("force release", provider.force_release("x").await, &ns);
    assert_foreign("ensure_indexes", backend.ensure_indexes().await, &ns);
    let election = provider.election("x").unwrap();
    let campaign = tokio::time::timeout(Duration::from_secs(30), election.campaign())
        .await
        .expect("a campaign on a foreign collection returns its error");
    assert_foreign("election", campaign.map(drop), &ns);
    // The message names the collection and the fix.
    let message = provider
        .lock("x")
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(&ns) && message.contains("distributed.locks"),
        "{message}"
    );

    // Give a background index creation, had one been started, time to land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(all_docs(&coll).await, before, "the documents were changed");
    assert_eq!(
        index_specs(&coll).await,
        indexes_before,
        "an index was created"
    );
}

/// A collection holding only mongolock's own documents (locks, semaphore slots and epoch
/// counters) is accepted by a new backend.
#[tokio::test]
async fn a_collection_of_locks_is_accepted_by_a_new_backend() {
    let t = test_database().await;
    let coll_name = unique("locks");
    let make = || {
        let backend = MongoBackend::builder(&t.db)
            .collection(coll_name.clone())
            .build()
            .unwrap();
        LockProvider::builder(backend).build().unwrap()
    };
    let first = make();
    mongo::take_once(&first, "a").await;
    let g = first.semaphore("s", 2).unwrap().acquire().await.unwrap();
    // A second backend (another process) checks the collection afresh.
    let second = make();
    mongo::take_once(&second, "b").await;
    second
        .lock("a")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// Document locks live in the application's collection: they never create a TTL index there
/// (one on `expiresAt` would delete application documents).
#[tokio::test]
async fn document_locks_never_create_a_ttl_index() {
    let t = test_database().await;
    let coll = t.db.collection::<Document>(&unique("jobs"));
    coll.insert_many(vec![
        doc! { "_id": 1, "expiresAt": DateTime::now() },
        doc! { "_id": 2, "state": "ready" },
    ])
    .await
    .unwrap();
    let locks = docs_with(&coll, |b| b).build().unwrap();
    let locked = locks.lock(1).await.unwrap();
    locked.guard.release().await.unwrap();
    let claimed = locks
        .try_claim(doc! { "state": "ready" }, None)
        .await
        .unwrap();
    claimed.expect("claimed").guard.release().await.unwrap();
    locks.ensure_indexes().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let specs = index_specs(&coll).await;
    assert!(specs.len() >= 3, "the claim indexes exist: {specs:?}");
    assert!(
        specs.iter().all(|s| !s.contains_key("expireAfterSeconds")),
        "document locks created a TTL index: {specs:?}"
    );
}

/// A client that records the commands it sends.
async fn recording_client(uri: &str) -> (Client, Arc<Mutex<Vec<(String, Document)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut options = ClientOptions::parse(uri).await.unwrap();
    let sink = seen.clone();
    options.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        if let CommandEvent::Started(s) = ev {
            sink.lock().unwrap().push((s.command_name, s.command));
        }
    }));
    (Client::with_options(options).unwrap(), seen)
}

/// The findAndModify commands sent: (their filter's `_id`, with upsert).
fn find_and_modifies(seen: &Mutex<Vec<(String, Document)>>) -> Vec<(Bson, bool)> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(n, _)| n == "findAndModify")
        .map(|(_, body)| {
            let q = body.get_document("query").unwrap();
            (
                q.get("_id").cloned().unwrap_or(Bson::Null),
                body.get_bool("upsert").unwrap_or(false),
            )
        })
        .collect()
}

async fn create_ttl(coll: &Collection<Document>, field: &str, secs: u64, name: &str) {
    coll.create_index(
        IndexModel::builder()
            .keys(doc! { field: 1 })
            .options(
                mongodb::options::IndexOptions::builder()
                    .name(name.to_owned())
                    .expire_after(Duration::from_secs(secs))
                    .build(),
            )
            .build(),
    )
    .await
    .unwrap();
}

/// Which path the first acquisition of a fresh name takes on a collection with `ttl` indexes
/// (field, expireAfterSeconds): `true` for the shortcut (epoch, then the upsert creates the
/// document with its token), `false` for the stamp path (the upsert creates the document
/// without a token, then an epoch and a stamp).
async fn first_acquisition_uses_the_shortcut(t: &TestDb, ttl: &[(&str, u64)]) -> bool {
    let (client, seen) = recording_client(&t.uri).await;
    let db = client.database(t.db.name());
    let coll_name = unique("locks");
    for (i, (field, secs)) in ttl.iter().enumerate() {
        create_ttl(
            &t.db.collection::<Document>(&coll_name),
            field,
            *secs,
            &format!("op_{i}"),
        )
        .await;
    }
    let backend = MongoBackend::builder(&db)
        .collection(coll_name.clone())
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    let g = provider.lock("fresh").unwrap().acquire().await.unwrap();
    let fams = find_and_modifies(&seen);
    let name = Bson::String("fresh".into());
    let epoch = Bson::Document(MongoBackend::fencing_epoch_id("fresh"));
    // Epoch 1 either way: the token is the first one.
    assert_eq!(g.fencing_token(), 1, "{ttl:?}: {fams:?}");
    g.release().await.unwrap();
    let shortcut = [
        (name.clone(), false),
        (epoch.clone(), true),
        (name.clone(), true),
    ];
    let stamp = [
        (name.clone(), false),
        (name.clone(), true),
        (epoch, true),
        (name, false),
    ];
    if fams == shortcut {
        true
    } else if fams == stamp {
        false
    } else {
        panic!("{ttl:?}: unexpected commands {fams:?}");
    }
}

/// The shortcut is used only when every TTL index is on `expiresAt` alone and deletes no
/// sooner than twice the creation window (2 minutes with the default cleanup_after).
#[tokio::test]
async fn first_acquisitions_take_the_shortcut_only_after_verifying_the_ttl_indexes() {
    let t = test_database().await;
    assert!(
        first_acquisition_uses_the_shortcut(&t, &[]).await,
        "no TTL index"
    );
    assert!(
        first_acquisition_uses_the_shortcut(&t, &[("expiresAt", 3600)]).await,
        "the library's own index"
    );
    assert!(
        first_acquisition_uses_the_shortcut(&t, &[("expiresAt", 120)]).await,
        "2 W exactly"
    );
    assert!(
        !first_acquisition_uses_the_shortcut(&t, &[("expiresAt", 0)]).await,
        "an operator's 0-second index"
    );
    assert!(
        !first_acquisition_uses_the_shortcut(&t, &[("expiresAt", 119)]).await,
        "another process's shorter cleanup_after"
    );
    assert!(
        !first_acquisition_uses_the_shortcut(&t, &[("acquiredAt", 3600)]).await,
        "a TTL index on another field deletes lock documents too"
    );
}

/// The token regression the verification prevents. A 0-second TTL index on `expiresAt` exists
/// (made by an operator: the library's own index creation fails). Acquirer B's first
/// acquisition of a fresh name stalls at the server (a `blockConnection` fail point holds each
/// of its findAndModify commands from the third on for 5 s). Meanwhile A acquires the name and releases it, and the TTL monitor
/// deletes the document. Then B's stalled command runs. Without the verification B's third
/// command is its upsert, which creates the document with the first token of the epoch B took
/// *before* A's — a smaller token than A's, issued later. With it, B's first acquisition takes
/// the stamp path, and whatever the interleaving the later grant has the larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_first_acquisition_never_issues_a_smaller_token() {
    let t =
        test_database_with(TestServer::builder().ttl_monitor_interval(Duration::from_millis(100)))
            .await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    if t.server.is_none() {
        // Real mongod: its TTL monitor runs every 60 s unless told otherwise.
        if let Err(e) =
            t.db.client()
                .database("admin")
                .run_command(doc! { "setParameter": 1, "ttlMonitorSleepSecs": 1 })
                .await
        {
            eprintln!("skipped: cannot shorten the TTL monitor's interval: {e}");
            return;
        }
    }
    let coll_name = unique("locks");
    let coll = t.db.collection::<Document>(&coll_name);
    create_ttl(&coll, "expiresAt", 0, "operator_ttl").await;
    let name = "stalled";
    let app_b = unique("stalled");
    let provider_for = |db: mongodb::Database| {
        let backend = MongoBackend::builder(&db)
            .collection(coll_name.clone())
            .build()
            .unwrap();
        LockProvider::builder(backend)
            .expiry(Duration::from_secs(60))
            // B's release is held back 5 s too.
            .release_timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let provider_b = provider_for(t.database_as(&app_b).await);
    let provider_a = provider_for(t.database_as(&unique("other")).await);
    // Which grant came first, with its token.
    let grants: Arc<Mutex<Vec<(&str, u64)>>> = Arc::default();

    t.fail_point(
        doc! { "skip": 2 }.into(),
        doc! {
            "failCommands": ["findAndModify"],
            "appName": app_b.as_str(),
            "blockConnection": true,
            "blockTimeMS": 5000,
        },
    )
    .await;
    let b = {
        let grants = grants.clone();
        tokio::spawn(async move {
            let g = provider_b.lock(name).unwrap().acquire().await.unwrap();
            grants.lock().unwrap().push(("B", g.fencing_token()));
            g.release().await.unwrap();
        })
    };
    // B has taken its epoch (without the verification) or created the document (with it):
    // its stalled command comes next.
    let counter = doc! { "_id": MongoBackend::fencing_epoch_id(name) };
    let started = tokio::time::Instant::now();
    loop {
        let epoch = coll.find_one(counter.clone()).await.unwrap();
        let document = coll.find_one(doc! { "_id": name }).await.unwrap();
        if epoch.is_some() || document.is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "B never reached its stalled command"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = {
        let grants = grants.clone();
        tokio::spawn(async move {
            let g = provider_a.lock(name).unwrap().acquire().await.unwrap();
            grants.lock().unwrap().push(("A", g.fencing_token()));
            g.release().await.unwrap();
        })
    };
    tokio::time::timeout(Duration::from_secs(90), async {
        a.await.unwrap();
        b.await.unwrap();
    })
    .await
    .expect("both acquisitions completed");
    t.fail_point_off().await;
    let grants = grants.lock().unwrap().clone();
    assert_eq!(grants.len(), 2, "{grants:?}");
    assert!(
        grants[1].1 > grants[0].1,
        "the later grant has a smaller fencing token: {grants:?} (grant order)"
    );
}

/// The verdict on the TTL indexes is kept for a bounded time (10 s): an offending index created
/// after a verification sends first acquisitions down the stamp path once the verdict is
/// renewed.
#[tokio::test]
async fn a_ttl_index_created_later_is_seen_by_the_next_verification() {
    let t = test_database().await;
    let (client, seen) = recording_client(&t.uri).await;
    let db = client.database(t.db.name());
    let coll_name = unique("locks");
    let backend = MongoBackend::builder(&db)
        .collection(coll_name.clone())
        .create_ttl_index(false)
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    // Verified: no TTL index.
    mongo::take_once(&provider, "one").await;
    let epoch_first = |name: &str| {
        let fams = find_and_modifies(&seen);
        let epoch = Bson::Document(MongoBackend::fencing_epoch_id(name));
        let at = |target: &Bson, upsert: bool| {
            fams.iter()
                .position(|(id, u)| id == target && *u == upsert)
                .unwrap_or_else(|| panic!("{target} (upsert {upsert}) not in {fams:?}"))
        };
        at(&epoch, true) < at(&Bson::String(name.into()), true)
    };
    assert!(epoch_first("one"), "no TTL index: the shortcut");
    // An operator adds a 0-second TTL index; once the verdict has expired, the next first
    // acquisition sees it.
    create_ttl(
        &t.db.collection::<Document>(&coll_name),
        "expiresAt",
        0,
        "operator_ttl",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(11)).await;
    seen.lock().unwrap().clear();
    let g = provider.lock("two").unwrap().acquire().await.unwrap();
    assert!(!epoch_first("two"), "the 0-second index was not seen");
    assert!(g.fencing_token() > 0);
    g.release().await.unwrap();
}

/// Reads of an application's collection are refused like writes (issue 32 §4: `list` showed an
/// application document as lock `nightly … released`): `list`, `list_matching`, `inspect`,
/// `holders`, `waiters` and `slot_limit` fail with `ForeignCollection`, and nothing is written.
#[tokio::test]
async fn reads_of_an_application_collection_are_refused() {
    let t = test_database().await;
    let coll_name = unique("orders");
    let coll = t.db.collection::<Document>(&coll_name);
    coll.insert_many(vec![
        doc! { "_id": "nightly", "customer": "alice", "total": 12 },
        doc! { "_id": ObjectId::new(), "customer": "bob", "total": 3 },
    ])
    .await
    .unwrap();
    let before = all_docs(&coll).await;
    let indexes_before = index_specs(&coll).await;
    let ns = coll.namespace().to_string();
    let backend = MongoBackend::builder(&t.db)
        .collection(coll_name.clone())
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    // Each on a fresh backend too: the first read of a backend checks, as the first write does.
    assert_foreign("inspect", provider.inspect("nightly").await, &ns);
    assert_foreign("list", provider.list().await, &ns);
    assert_foreign(
        "list_matching",
        provider
            .list_matching(&mongolock::ListFilter::new().prefix("n"))
            .await,
        &ns,
    );
    assert_foreign("holders", provider.holders("nightly").await, &ns);
    assert_foreign("waiters", provider.waiters("nightly").await, &ns);
    assert_foreign("slot_limit", provider.slot_limit("nightly").await, &ns);
    let fresh = || {
        LockProvider::builder(
            MongoBackend::builder(&t.db)
                .collection(coll_name.clone())
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
    };
    assert_foreign("list first", fresh().list().await, &ns);
    assert_foreign("holders first", fresh().holders("nightly").await, &ns);
    assert_foreign("waiters first", fresh().waiters("nightly").await, &ns);
    assert_foreign("slot_limit first", fresh().slot_limit("nightly").await, &ns);
    assert_eq!(all_docs(&coll).await, before, "the documents were changed");
    assert_eq!(
        index_specs(&coll).await,
        indexes_before,
        "an index was created"
    );
}

/// A backend whose check passed (the collection held only locks) and then finds a document
/// that is not a lock document while reading reports the collection as foreign, rather than
/// showing the document as a lock.
#[tokio::test]
async fn a_foreign_document_found_while_reading_is_refused() {
    let t = test_database().await;
    let (provider, coll) = mongo::provider_on_new_collection(&t);
    mongo::take_once(&provider, "a").await;
    assert_eq!(provider.list().await.unwrap().len(), 1);
    let ns = coll.namespace().to_string();
    coll.insert_one(doc! { "_id": "nightly", "customer": "alice" })
        .await
        .unwrap();
    assert_foreign("list", provider.list().await, &ns);
    assert_foreign(
        "list_matching",
        provider.list_matching(&mongolock::ListFilter::new()).await,
        &ns,
    );
    assert_foreign("inspect", provider.inspect("nightly").await, &ns);
    // The lock documents themselves still read.
    assert!(provider.inspect("a").await.unwrap().is_some());
}

/// Reads of a collection that does not exist report no locks, as an empty collection (MongoDB
/// creates collections on first write), and create nothing: no collection, no index.
#[tokio::test]
async fn reads_of_a_missing_collection_find_nothing_and_create_nothing() {
    let t = test_database().await;
    // Another collection, so that the database exists on every deployment.
    t.db.collection::<Document>("other")
        .insert_one(doc! { "x": 1 })
        .await
        .unwrap();
    let (provider, coll) = mongo::provider_on_new_collection(&t);
    assert!(provider.list().await.unwrap().is_empty());
    assert!(provider
        .list_matching(&mongolock::ListFilter::new().prefix("a"))
        .await
        .unwrap()
        .is_empty());
    assert!(provider.inspect("a").await.unwrap().is_none());
    assert!(provider.holders("a").await.unwrap().is_empty());
    assert!(provider.waiters("a").await.unwrap().is_empty());
    assert!(provider.slot_limit("a").await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let names = t.db.list_collection_names().await.unwrap();
    assert!(
        !names.iter().any(|n| n == coll.name()),
        "a read created {}: {names:?}",
        coll.name()
    );
}
