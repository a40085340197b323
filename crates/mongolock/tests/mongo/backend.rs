//! MongoDB-specific behaviour: document shape, round trips, fencing across TTL cleanup,
//! collection-name validation, error classification. Runs against the embedded
//! mongo-testserver, or against `MONGODB_URI` when set.

use crate::support::mongo;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryStreamExt;
use mongo::{test_database, test_database_with, unique};
use mongo_testserver::TestServer;
use mongodb::bson::{doc, Bson, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::Client;
use mongolock::{Error, LockProvider, MongoBackend};

/// A client that records the names (and bodies) of the commands it sends.
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

/// Whether a command belongs to the backend's change stream (opened once per backend, in the
/// background), not to a lock operation.
fn is_change_stream(name: &str, body: &Document) -> bool {
    match name {
        "getMore" | "killCursors" => true,
        "aggregate" => body
            .get_array("pipeline")
            .ok()
            .and_then(|p| p.first())
            .and_then(Bson::as_document)
            .is_some_and(|s| s.contains_key("$changeStream")),
        _ => false,
    }
}

/// The lock commands sent (change-stream commands left out).
fn names(seen: &Mutex<Vec<(String, Document)>>) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(n, body)| !is_change_stream(n, body))
        .map(|(n, _)| n.clone())
        .collect()
}

#[tokio::test]
async fn one_command_to_acquire_one_to_release() {
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
    let lock = provider.lock("orders").unwrap();

    // First use of the backend: one `find` checks that the collection holds only mongolock's
    // documents. First use of a name: the attempt finds no document, `listIndexes` verifies
    // that no TTL index deletes lock documents too soon (the verdict is kept 10 s), then two
    // writes: the name's epoch counter and the upsert that creates the document with its
    // first token.
    let g = lock.acquire().await.unwrap();
    g.release().await.unwrap();
    let first = seen.lock().unwrap().clone();
    let lock_commands: Vec<_> = first
        .iter()
        .filter(|(n, body)| !is_change_stream(n, body))
        .collect();
    assert_eq!(
        names(&seen),
        [
            "find",
            "findAndModify",
            "listIndexes",
            "findAndModify",
            "findAndModify",
            "findAndModify"
        ],
        "{lock_commands:#?}"
    );
    let targets: Vec<_> = lock_commands
        .iter()
        .filter(|(n, _)| n == "findAndModify")
        .map(|(_, body)| (body.get("query").cloned(), body.get_bool("upsert").ok()))
        .collect();
    assert_eq!(
        targets[..3],
        [
            (Some(Bson::Document(doc! { "_id": "orders" })), Some(false)),
            (
                Some(Bson::Document(
                    doc! { "_id": MongoBackend::fencing_epoch_id("orders") }
                )),
                Some(true)
            ),
            (Some(Bson::Document(doc! { "_id": "orders" })), Some(true)),
        ],
        "{lock_commands:#?}"
    );
    // From then on: exactly one command to acquire and one to release.
    for _ in 0..3 {
        seen.lock().unwrap().clear();
        let g = lock.acquire().await.unwrap();
        g.release().await.unwrap();
        assert_eq!(names(&seen), ["findAndModify", "findAndModify"]);
    }
    // Lock writes carry the majority write concern.
    let (_, fam) = seen.lock().unwrap()[0].clone();
    assert_eq!(
        fam.get_document("writeConcern").unwrap().get("w"),
        Some(&Bson::String("majority".into()))
    );
    // A busy attempt is one command and changes nothing.
    let held = lock.acquire().await.unwrap();
    let before = db
        .collection::<Document>(&coll_name)
        .find_one(doc! { "_id": "orders" })
        .await
        .unwrap();
    seen.lock().unwrap().clear();
    assert!(lock.try_acquire().await.unwrap().is_none());
    assert_eq!(names(&seen), ["findAndModify"]);
    let after = db
        .collection::<Document>(&coll_name)
        .find_one(doc! { "_id": "orders" })
        .await
        .unwrap();
    assert_eq!(before, after);
    held.release().await.unwrap();
}

/// Every lock write names one document by `_id` equality (on a collection sharded by `_id`,
/// mongos sends it to one shard), and so does `inspect`; only `list` reads the whole collection.
#[tokio::test]
async fn every_lock_write_targets_one_document_by_id() {
    let t = test_database().await;
    let (client, seen) = recording_client(&t.uri).await;
    let db = client.database(t.db.name());
    let backend = MongoBackend::builder(&db)
        .collection(unique("locks"))
        .create_ttl_index(false)
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    for name in ["orders:1", "orders:2"] {
        let lock = provider.lock(name).unwrap();
        let g = lock.acquire().await.unwrap();
        assert!(g.extend(Duration::from_secs(20)).await.unwrap());
        g.release().await.unwrap();
        let g = lock.acquire().await.unwrap();
        assert!(lock.try_acquire().await.unwrap().is_none());
        assert!(provider.force_release(name).await.unwrap());
        drop(g);
        assert!(provider.inspect(name).await.unwrap().is_some());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let commands: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, body)| !is_change_stream(n, body))
        .cloned()
        .collect();
    let mut writes = 0;
    for (name, body) in &commands {
        let filters: Vec<Document> = match name.as_str() {
            "findAndModify" => vec![body.get_document("query").unwrap().clone()],
            "update" | "delete" => {
                let key = if name == "update" {
                    "updates"
                } else {
                    "deletes"
                };
                body.get_array(key)
                    .unwrap()
                    .iter()
                    .map(|u| u.as_document().unwrap().get_document("q").unwrap().clone())
                    .collect()
            }
            // The backend's one-time check that the collection holds only mongolock's
            // documents, and the verification of its TTL indexes: no document written.
            "find" if body.get_document("filter").unwrap().contains_key("$nor") => continue,
            "listIndexes" => continue,
            // A holder's loss check reads its lock document.
            "find" => vec![body.get_document("filter").unwrap().clone()],
            "aggregate" => {
                // inspect: the first stage matches one `_id`.
                let first = body.get_array("pipeline").unwrap()[0]
                    .as_document()
                    .unwrap();
                vec![first.get_document("$match").unwrap().clone()]
            }
            other => panic!("unexpected command {other}: {body}"),
        };
        for f in filters {
            let id = f.get("_id");
            assert!(
                matches!(id, Some(Bson::String(_) | Bson::Document(_)))
                    && !matches!(id, Some(Bson::Document(d)) if d.keys().any(|k| k.starts_with('$'))),
                "{name} does not target one document by _id: {f}"
            );
            writes += usize::from(name != "aggregate" && name != "find");
        }
    }
    assert!(writes >= 14, "{commands:#?}");
}

#[tokio::test]
async fn the_lock_document_keeps_its_token_after_release() {
    let t = test_database().await;
    let coll_name = unique("locks");
    let backend = MongoBackend::builder(&t.db)
        .collection(coll_name.clone())
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend)
        .app_name("shape-test")
        .build()
        .unwrap();
    let coll = t.db.collection::<Document>(&coll_name);
    let g = provider.lock("jobs:1").unwrap().acquire().await.unwrap();
    let d = coll
        .find_one(doc! { "_id": "jobs:1" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.get_str("leaseId").unwrap(), g.lease_id().as_str());
    assert_eq!(
        d.get("fencingToken"),
        Some(&Bson::Int64(g.fencing_token() as i64))
    );
    assert!(matches!(d.get("acquiredAt"), Some(Bson::DateTime(_))));
    assert!(matches!(d.get("expiresAt"), Some(Bson::DateTime(_))));
    let holder = d.get_document("holder").unwrap();
    assert_eq!(
        holder.get("pid"),
        Some(&Bson::Int64(i64::from(std::process::id())))
    );
    assert_eq!(holder.get_str("app").unwrap(), "shape-test");
    assert!(!holder.get_str("host").unwrap().is_empty());
    // The first lock of a new collection gets token 1: its document's lifetime took epoch 1 of
    // its counter, and epoch e starts at (e - 1) · 2^20 + 1.
    assert_eq!(g.fencing_token(), 1);
    assert_eq!(d.get("epoch"), Some(&Bson::Int64(1)));

    let token = g.fencing_token();
    g.release().await.unwrap();
    let d = coll
        .find_one(doc! { "_id": "jobs:1" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.get("leaseId"), Some(&Bson::Null));
    assert_eq!(d.get("fencingToken"), Some(&Bson::Int64(token as i64)));

    // The name's epoch counter lives in the same collection but is not a lock.
    let epoch = coll
        .find_one(doc! { "_id": MongoBackend::fencing_epoch_id("jobs:1") })
        .await
        .unwrap()
        .expect("epoch counter document");
    assert!(epoch.get_i64("epoch").unwrap() >= 1);
    let all = provider.list().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].name, "jobs:1");
}

/// Fencing tokens keep growing after the TTL monitor deleted the lock document: new lifetimes
/// stamped after their creation (`cleanup_after` under 2 s)...
#[tokio::test]
async fn fencing_tokens_grow_after_ttl_cleanup() {
    tokens_grow_after_ttl_cleanup(Duration::ZERO).await;
}

/// ... and new lifetimes created with an epoch taken just before (the first-acquisition path).
#[tokio::test]
async fn fencing_tokens_grow_after_ttl_cleanup_of_lifetimes_created_with_their_epoch() {
    tokens_grow_after_ttl_cleanup(Duration::from_secs(2)).await;
}

async fn tokens_grow_after_ttl_cleanup(cleanup_after: Duration) {
    let t = test_database_with(TestServer::builder().ttl_monitor_interval(Duration::from_secs(1)))
        .await;
    let backend = MongoBackend::builder(&t.db)
        .collection(unique("locks"))
        .cleanup_after(cleanup_after)
        .build()
        .unwrap();
    backend.ensure_indexes().await.unwrap();
    let provider = LockProvider::builder(backend)
        .expiry(Duration::from_secs(2))
        .build()
        .unwrap();
    let lock = provider.lock("nightly-report").unwrap();
    let mut tokens = Vec::new();
    for round in 0..2 {
        // A few acquisitions in this lifetime of the document.
        for _ in 0..3 {
            let g = lock.acquire().await.unwrap();
            tokens.push(g.fencing_token());
            g.release().await.unwrap();
        }
        // Real MongoDB's TTL monitor runs every 60 s; the embedded server's every second.
        let deleted = poll(Duration::from_secs(150), || async {
            provider.inspect("nightly-report").await.unwrap().is_none()
        })
        .await;
        assert!(
            deleted,
            "round {round}: the TTL monitor did not delete the lock document"
        );
    }
    let g = lock.acquire().await.unwrap();
    tokens.push(g.fencing_token());
    g.release().await.unwrap();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must grow across TTL cleanup: {tokens:?}"
    );
}

/// A grant that was never stamped (the acquirer crashed between its grant and the stamp) does
/// not restart tokens: the next holder stamps a fresh epoch, above every earlier token.
#[tokio::test]
async fn an_unstamped_lease_left_by_a_crash_gets_a_fresh_token() {
    let t = test_database().await;
    let (provider, coll) = mongo::provider_on_new_collection(&t);
    let lock = provider.lock("a").unwrap();
    let mut earlier = Vec::new();
    for _ in 0..3 {
        let g = lock.acquire().await.unwrap();
        earlier.push(g.fencing_token());
        g.release().await.unwrap();
    }
    assert_eq!(earlier, [1, 2, 3]);
    // What a crashed acquirer leaves behind: a grant without a token (`epoch: null`) whose lease
    // has expired.
    let past = mongo::millis_ago(1000);
    coll.update_one(
        doc! { "_id": "a" },
        doc! { "$set": { "leaseId": "crashed", "epoch": Bson::Null, "expiresAt": past } },
    )
    .await
    .unwrap();
    let g = lock.acquire().await.unwrap();
    // The name's counter gives epoch 2, which starts at 2^20 + 1.
    assert_eq!(
        g.fencing_token(),
        (1 << 20) + 1,
        "earlier tokens: {earlier:?}"
    );
    g.release().await.unwrap();
}

/// When a name has used every token of its epoch, the next grant takes a new epoch: tokens keep
/// growing, with no limit on the number of grants of one name.
#[tokio::test]
async fn a_used_up_epoch_is_followed_by_a_new_one() {
    let t = test_database().await;
    let (provider, coll) = mongo::provider_on_new_collection(&t);
    let past = mongo::millis_ago(1000);
    // A name two tokens before the end of epoch 3 of its counter, and the counter at 3.
    coll.insert_one(doc! {
        "_id": "hot", "leaseId": Bson::Null, "fencingToken": 3 * (1_i64 << 20) - 2,
        "epoch": 3_i64, "acquiredAt": past, "expiresAt": past,
    })
    .await
    .unwrap();
    coll.insert_one(doc! { "_id": MongoBackend::fencing_epoch_id("hot"), "epoch": 3_i64 })
        .await
        .unwrap();
    let lock = provider.lock("hot").unwrap();
    let mut tokens = Vec::new();
    for _ in 0..4 {
        let g = lock.acquire().await.unwrap();
        tokens.push(g.fencing_token());
        g.release().await.unwrap();
    }
    let end = 3 * (1_u64 << 20);
    assert_eq!(tokens, [end - 1, end, end + 1, end + 2]);
    let d = coll.find_one(doc! { "_id": "hot" }).await.unwrap().unwrap();
    assert_eq!(d.get("epoch"), Some(&Bson::Int64(4)));
}

/// Tokens never pass 2^53: a counter at its last epoch makes the acquisition fail with a typed
/// error that says what to do, and grants nothing.
#[tokio::test]
async fn exhausted_fencing_tokens_are_a_typed_error() {
    let t = test_database().await;
    let (provider, coll) = mongo::provider_on_new_collection(&t);
    coll.insert_one(doc! { "_id": MongoBackend::fencing_epoch_id("last"), "epoch": 1_i64 << 33 })
        .await
        .unwrap();
    let err = provider
        .lock("last")
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    match &err {
        Error::FencingTokensExhausted { name, limit } => {
            assert_eq!(name, "last");
            assert_eq!(*limit, 1 << 53);
        }
        other => panic!("expected FencingTokensExhausted, got {other:?}"),
    }
    assert!(err.to_string().contains("new lock collection"), "{err}");
    // Nothing is held: the document, if any, carries no unexpired lease.
    let info = provider.inspect("last").await.unwrap();
    assert!(info.as_ref().is_none_or(|i| !i.held), "{info:?}");
}

/// New names start small: each draws from one of 4096 counters, so the first lifetime of most
/// names in a collection gets token 1, and a name sharing a counter with k earlier names gets
/// k · 2^20 + 1.
#[tokio::test]
async fn new_names_start_small() {
    let t = test_database().await;
    let backend = MongoBackend::builder(&t.db)
        .collection(unique("locks"))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    let mut tokens = Vec::new();
    for i in 0..200 {
        let name = format!("order:{i}");
        let g = provider.lock(&name).unwrap().acquire().await.unwrap();
        tokens.push((name, g.fencing_token()));
        g.release().await.unwrap();
    }
    let ones = tokens.iter().filter(|(_, t)| *t == 1).count();
    assert!(
        ones >= 180,
        "{ones} of 200 new names got token 1: {tokens:?}"
    );
    assert!(
        tokens
            .iter()
            .all(|(_, t)| (t - 1) % (1 << 20) == 0 && *t < (4 << 20)),
        "{tokens:?}"
    );
}

/// A first acquisition whose upsert comes later than the creation window after its epoch (here
/// the server holds it back) creates the document without a token and stamps a fresh epoch.
#[tokio::test]
async fn a_late_first_acquisition_stamps_a_fresh_epoch() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let coll_name = unique("locks");
    let app = unique("late");
    // cleanup_after 2 s: a window of 1 s between the epoch and the creation.
    let backend = MongoBackend::builder(&t.database_as(&app).await)
        .collection(coll_name.clone())
        .cleanup_after(Duration::from_secs(2))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend)
        .expiry(Duration::from_secs(120))
        .build()
        .unwrap();
    // The first two findAndModify commands (the attempt, the epoch) run at once; every later one
    // waits 1.5 s at the server before it runs.
    t.fail_point(
        Bson::Document(doc! { "skip": 2 }),
        doc! {
            "failCommands": ["findAndModify"],
            "appName": app.as_str(),
            "blockConnection": true,
            "blockTimeMS": 1500,
        },
    )
    .await;
    let result = provider.lock("late").unwrap().acquire().await;
    t.fail_point_off().await;
    let g = result.unwrap();
    // Epoch 1 was taken for the creation and not used; the stamp took epoch 2.
    assert_eq!(g.fencing_token(), (1 << 20) + 1);
    let d =
        t.db.collection::<Document>(&coll_name)
            .find_one(doc! { "_id": "late" })
            .await
            .unwrap()
            .unwrap();
    assert_eq!(d.get("epoch"), Some(&Bson::Int64(2)), "{d}");
    g.release().await.unwrap();
}

/// Collection names MongoDB would refuse are reported before anything is sent.
#[tokio::test]
async fn bad_collection_names_are_refused_locally() {
    let t = test_database().await;
    let long = "x".repeat(256);
    for name in [
        "",
        "a$b",
        "nul\0char",
        "system.locks",
        ".hidden",
        long.as_str(),
    ] {
        match MongoBackend::builder(&t.db).collection(name).build() {
            Err(Error::InvalidCollection { name: n, reason }) => {
                assert_eq!(n, name);
                assert!(!reason.is_empty());
            }
            other => panic!("{name:?}: expected InvalidCollection, got {other:?}"),
        }
    }
    assert!(matches!(
        MongoBackend::builder(&t.db)
            .cleanup_after(Duration::from_secs(u64::MAX / 2))
            .build(),
        Err(Error::InvalidOptions {
            option: "cleanup_after",
            ..
        })
    ));
    let collections: Vec<String> = t.db.list_collection_names().await.unwrap();
    assert!(
        collections.is_empty(),
        "nothing may be written: {collections:?}"
    );
}

#[tokio::test]
async fn the_default_provider_uses_distributed_locks() {
    let t = test_database().await;
    let provider = LockProvider::mongodb(&t.db).unwrap();
    assert_eq!(provider.options().expiry(), Duration::from_secs(30));
    assert_eq!(
        provider.options().extension_cadence(),
        Duration::from_secs(10)
    );
    let g = provider
        .lock("door:front")
        .unwrap()
        .with_expiry(Duration::from_secs(30))
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let d =
        t.db.collection::<Document>("distributed.locks")
            .find_one(doc! { "_id": "door:front" })
            .await
            .unwrap();
    assert!(d.is_some());
    g.release().await.unwrap();
    // The TTL index is created in the background.
    let indexed = poll(Duration::from_secs(10), || async {
        let names: Vec<String> =
            t.db.collection::<Document>("distributed.locks")
                .list_index_names()
                .await
                .unwrap_or_default();
        names.iter().any(|n| n == "mongolock_expiresAt_ttl")
    })
    .await;
    assert!(indexed);
    let models =
        t.db.collection::<Document>("distributed.locks")
            .list_indexes()
            .await
            .unwrap()
            .try_collect::<Vec<_>>()
            .await
            .unwrap();
    let ttl = models
        .iter()
        .find(|m| m.keys.contains_key("expiresAt"))
        .expect("TTL index on expiresAt");
    assert_eq!(
        ttl.options.as_ref().and_then(|o| o.expire_after),
        Some(Duration::from_secs(3600))
    );
}

/// Transient errors are retried within the wait budget; a zero budget returns them.
#[tokio::test]
async fn transient_errors_are_retried_within_the_budget() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("transient");
    let db = t.database_as(&app).await;
    let backend = MongoBackend::builder(&db)
        .collection(unique("locks"))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    let lock = provider.lock("flaky").unwrap();
    // 91 = ShutdownInProgress. The driver retries a retryable write once, so 5 failures outlast
    // it and reach the core's loop.
    t.fail_point(
        doc! { "times": 5 }.into(),
        doc! { "failCommands": ["findAndModify"], "errorCode": 91, "appName": app.as_str() },
    )
    .await;
    let g = lock
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .expect("acquired once the errors stopped");
    g.release().await.unwrap();

    t.fail_point(
        doc! { "times": 2 }.into(),
        doc! { "failCommands": ["findAndModify"], "errorCode": 91, "appName": app.as_str() },
    )
    .await;
    let err = lock.try_acquire().await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    t.fail_point_off().await;
}

/// 134 (ReadConcernMajorityNotAvailableYet: a majority read before the node has a
/// majority-committed snapshot, just after a restart or an election) is transient: the core
/// retries it, as the driver does once.
#[tokio::test]
async fn reads_refused_with_134_are_retried() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("majority-not-yet");
    let db = t.database_as(&app).await;
    let backend = MongoBackend::builder(&db)
        .collection(unique("locks"))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    let lock = provider.lock("snapshot").unwrap();
    let fault = doc! { "failCommands": ["find"], "errorCode": 134, "appName": app.as_str() };
    // The first acquisition reads the collection (majority) before writing. The driver retries
    // a read once, so 4 failures outlast it and reach the core.
    t.fail_point(doc! { "times": 4 }.into(), fault.clone())
        .await;
    let acquired = lock.acquire_timeout(Duration::from_secs(20)).await;
    t.fail_point_off().await;
    let g = acquired
        .unwrap_or_else(|e| panic!("a read refused with 134 was not retried: {e:?}"))
        .expect("acquired once the errors stopped");
    g.release().await.unwrap();
    let fresh = LockProvider::builder(
        MongoBackend::builder(&db)
            .collection(unique("locks"))
            .build()
            .unwrap(),
    )
    .build()
    .unwrap();
    t.fail_point(doc! { "times": 2 }.into(), fault).await;
    let err = fresh
        .lock("snapshot")
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    t.fail_point_off().await;
    assert!(err.is_transient(), "{err:?}");
}

/// Permanent errors (here: Unauthorized) are returned at once, with a hint.
#[tokio::test]
async fn permanent_errors_are_returned_at_once() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let app = unique("denied");
    let db = t.database_as(&app).await;
    let backend = MongoBackend::builder(&db)
        .collection(unique("locks"))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    t.fail_point(
        "alwaysOn".into(),
        doc! { "failCommands": ["findAndModify"], "errorCode": 13, "appName": app.as_str() },
    )
    .await;
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        provider.lock("x").unwrap().acquire(),
    )
    .await
    .expect("a permanent error ends even an unbounded acquire");
    t.fail_point_off().await;
    match result {
        Err(Error::Backend { code, hint, .. }) => {
            assert_eq!(code, Some(13));
            assert!(hint.contains("readWrite"), "{hint}");
        }
        other => panic!("expected a permanent backend error, got {other:?}"),
    }
}

async fn poll<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Semaphore slots take their tokens from the same epochs as locks: across TTL cleanup of the
/// document, on both first-acquisition paths (stamped after creation, and created with an
/// epoch), tokens grow across all slots.
#[tokio::test]
async fn semaphore_tokens_grow_after_ttl_cleanup() {
    for cleanup_after in [Duration::ZERO, Duration::from_secs(2)] {
        let t =
            test_database_with(TestServer::builder().ttl_monitor_interval(Duration::from_secs(1)))
                .await;
        let backend = MongoBackend::builder(&t.db)
            .collection(unique("locks"))
            .cleanup_after(cleanup_after)
            .build()
            .unwrap();
        backend.ensure_indexes().await.unwrap();
        let provider = LockProvider::builder(backend)
            .expiry(Duration::from_secs(2))
            .build()
            .unwrap();
        let sem = provider.semaphore("exports", 2).unwrap();
        let mut tokens = Vec::new();
        for round in 0..2 {
            for _ in 0..2 {
                let a = sem.acquire().await.unwrap();
                let b = sem.acquire().await.unwrap();
                tokens.push(a.fencing_token());
                tokens.push(b.fencing_token());
                a.release().await.unwrap();
                b.release().await.unwrap();
            }
            let deleted = poll(Duration::from_secs(150), || async {
                provider.inspect("exports").await.unwrap().is_none()
            })
            .await;
            assert!(
                deleted,
                "cleanup_after {cleanup_after:?}, round {round}: the TTL monitor did not delete \
                 the semaphore's document"
            );
        }
        let g = sem.acquire().await.unwrap();
        tokens.push(g.fencing_token());
        g.release().await.unwrap();
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "cleanup_after {cleanup_after:?}: slot tokens must grow across TTL cleanup: {tokens:?}"
        );
    }
}

/// Slots granted across the end of an epoch: the grant without a token left is stamped from a
/// fresh epoch, and tokens keep growing across slots.
#[tokio::test]
async fn semaphore_slots_cross_a_used_up_epoch() {
    let t = test_database().await;
    let (provider, coll) = mongo::provider_on_new_collection(&t);
    let past = mongo::millis_ago(1000);
    coll.insert_one(doc! {
        "_id": "hot", "leaseId": Bson::Null, "fencingToken": 3 * (1_i64 << 20) - 1,
        "epoch": 3_i64, "acquiredAt": past, "expiresAt": past,
    })
    .await
    .unwrap();
    coll.insert_one(doc! { "_id": MongoBackend::fencing_epoch_id("hot"), "epoch": 3_i64 })
        .await
        .unwrap();
    let sem = provider.semaphore("hot", 3).unwrap();
    let a = sem.acquire().await.unwrap();
    let b = sem.acquire().await.unwrap();
    let c = sem.acquire().await.unwrap();
    let end = 3 * (1_u64 << 20);
    let tokens = [a.fencing_token(), b.fencing_token(), c.fencing_token()];
    assert_eq!(tokens[0], end, "{tokens:?}");
    assert!(tokens[1] > tokens[0] && tokens[2] > tokens[1], "{tokens:?}");
    let d = coll.find_one(doc! { "_id": "hot" }).await.unwrap().unwrap();
    assert_eq!(d.get("epoch"), Some(&Bson::Int64(4)), "{d}");
    assert_eq!(d.get_array("slots").map(Vec::len), Ok(3), "{d}");
    for g in [a, b, c] {
        g.release().await.unwrap();
    }
}

/// A slot released through one backend (one process's change stream) wakes a waiter of
/// another backend on the same collection at once, long before any lease or poll would end
/// its wait (leases last 60 s, the waiter polls every 40–50 s).
#[tokio::test]
async fn a_slot_release_wakes_a_waiter_of_another_backend() {
    let t = test_database().await;
    let coll = unique("locks");
    let make = || {
        let backend = MongoBackend::builder(&t.db)
            .collection(coll.clone())
            .build()
            .unwrap();
        LockProvider::builder(backend)
            .expiry(Duration::from_secs(60))
            .wait_strategy(mongolock::WaitStrategy::random_sleep(
                Duration::from_secs(40),
                Duration::from_secs(50),
            ))
            .build()
            .unwrap()
    };
    let (holder, waiter) = (make(), make());
    let a = holder
        .semaphore("exports", 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let b = holder
        .semaphore("exports", 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    // The waiter's change stream must be live before the release (it cannot be on a
    // standalone server: then this test is skipped).
    let live = poll(Duration::from_secs(20), || async {
        mongolock::LockBackendExt::live_notifications(waiter.backend().as_ref())
    })
    .await;
    if !live {
        eprintln!("skipped: change streams are not available on this server");
        return;
    }
    let sem = waiter.semaphore("exports", 2).unwrap();
    let task = tokio::spawn(async move { sem.acquire_timeout(Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = tokio::time::Instant::now();
    let token = b.fencing_token();
    b.release().await.unwrap();
    let got = task.await.unwrap().unwrap().unwrap_or_else(|| {
        panic!("the other backend's waiter was not woken by the release of token {token}")
    });
    let took = released_at.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "woken {took:?} after the release of token {token}"
    );
    assert!(got.fencing_token() > token && !a.is_lost());
    got.release().await.unwrap();
    a.release().await.unwrap();
}

/// Never more than N holders across backends (each with its own change stream, as separate
/// processes have): 3 backends × 4 tasks take a semaphore of 2 around a shared counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_semaphore_holds_across_backends() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const LIMIT: u32 = 2;
    let t = test_database().await;
    let coll = unique("locks");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for backend_no in 0..3 {
        let backend = MongoBackend::builder(&t.db)
            .collection(coll.clone())
            .build()
            .unwrap();
        let provider = LockProvider::builder(backend)
            .wait_strategy(mongolock::WaitStrategy::random_sleep(
                Duration::from_millis(1),
                Duration::from_millis(20),
            ))
            .build()
            .unwrap();
        for task_no in 0..4 {
            let sem = provider.semaphore("shared", LIMIT).unwrap();
            let (inside, most, tokens) = (inside.clone(), most.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..10 {
                    let g = sem.acquire().await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(
                        now <= LIMIT as usize,
                        "{now} holders (backend {backend_no}, task {task_no}, round {round}, \
                         token {})",
                        g.fencing_token()
                    );
                    most.fetch_max(now, Ordering::SeqCst);
                    tokens.lock().unwrap().push(g.fencing_token());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("every task finishes within 120 s")
            .unwrap();
    }
    let mut tokens = tokens.lock().unwrap().clone();
    let n = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), n, "repeated fencing tokens");
    assert!(most.load(Ordering::SeqCst) >= 1);
}

/// 2²⁰: the tokens of one fencing epoch (`backends/mongo/mod.rs`).
const EPOCH_TOKENS: i64 = 1 << 20;

/// A lock document whose epoch `epoch` has no token left (as after 2²⁰ grants), with its
/// counter at `epoch`: the next grant takes no token and is stamped from a fresh epoch.
async fn epoch_used_up(coll: &mongodb::Collection<Document>, name: &str, epoch: i64, slots: bool) {
    let past = mongo::millis_ago(60_000);
    let mut lock = doc! {
        "_id": name,
        "leaseId": Bson::Null,
        "fencingToken": epoch * EPOCH_TOKENS,
        "epoch": epoch,
        "acquiredAt": past,
        "expiresAt": past,
        "holder": { "host": "earlier", "pid": 1_i64, "app": Bson::Null },
        "released": [],
    };
    if slots {
        lock.insert("limit", 2_i64);
        lock.insert("slots", Vec::<Bson>::new());
    }
    coll.insert_one(lock).await.unwrap();
    coll.insert_one(doc! { "_id": MongoBackend::fencing_epoch_id(name), "epoch": epoch })
        .await
        .unwrap();
}

/// Blocks every `findAndModify` of clients named `app` after the first two (a grant that took
/// no token and the epoch it takes: the next is the stamp) for `ms` milliseconds.
async fn block_stamps(t: &mongo::TestDb, app: &str, ms: i32) {
    t.fail_point(
        Bson::Document(doc! { "skip": 2 }),
        doc! {
            "failCommands": ["findAndModify"],
            "appName": app,
            "blockConnection": true,
            "blockTimeMS": ms,
        },
    )
    .await;
}

/// A semaphore slot granted without a token is stamped from a fresh epoch; meanwhile other
/// slots' grants and stamps may carry the document's token past that epoch's range (2²⁰ grants
/// within one slot lease, simulated here by writing their outcome). The stamp must then take
/// another epoch: stamping with the stale one would move `epoch` backwards and issue a token
/// above every epoch taken from the counter, which a later lifetime of the name could issue
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_stamp_never_moves_the_epoch_backwards() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let coll_name = unique("locks");
    let coll = t.db.collection::<Document>(&coll_name);
    let name = unique("sem");
    epoch_used_up(&coll, &name, 5, true).await;
    let app = unique("stamper");
    let provider = LockProvider::builder(
        MongoBackend::builder(&t.database_as(&app).await)
            .collection(coll_name.clone())
            .build()
            .unwrap(),
    )
    .expiry(Duration::from_secs(60))
    .build()
    .unwrap();
    block_stamps(&t, &app, 2000).await;
    let sem = provider.semaphore(name.clone(), 2).unwrap();
    let acquiring = tokio::spawn(async move { sem.acquire().await });
    // Our slot took epoch 6 and waits for its stamp; meanwhile another slot takes epoch 7 and
    // 2²⁰ grants use it up.
    let counter = doc! { "_id": MongoBackend::fencing_epoch_id(&name) };
    let took = mongolock::testing::eventually(Duration::from_secs(20), || async {
        let c = coll.find_one(counter.clone()).await.unwrap().unwrap();
        c.get_i64("epoch").ok() == Some(6) || c.get_i32("epoch").ok() == Some(6)
    })
    .await;
    assert!(took, "the slot did not take epoch 6");
    coll.update_one(counter.clone(), doc! { "$set": { "epoch": 7_i64 } })
        .await
        .unwrap();
    coll.update_one(
        doc! { "_id": name.as_str() },
        doc! { "$set": { "fencingToken": 7 * EPOCH_TOKENS, "epoch": 7_i64 } },
    )
    .await
    .unwrap();
    let guard = acquiring.await.unwrap().expect("the slot was granted");
    t.fail_point_off().await;
    let d = coll
        .find_one(doc! { "_id": name.as_str() })
        .await
        .unwrap()
        .unwrap();
    let epoch = d
        .get_i64("epoch")
        .unwrap_or_else(|_| panic!("no epoch: {d}"));
    let token = guard.fencing_token() as i64;
    eprintln!("stamped token {token}, epoch {epoch}: {d}");
    assert!(
        epoch >= 7,
        "the stamp moved the epoch backwards from 7 to {epoch} (token {token}): {d}"
    );
    assert!(
        (epoch - 1) * EPOCH_TOKENS < token && token <= epoch * EPOCH_TOKENS,
        "token {token} lies outside the range of its epoch {epoch}: {d}"
    );
    assert!(token > 7 * EPOCH_TOKENS, "token {token} does not grow: {d}");
    let c = coll.find_one(counter).await.unwrap().unwrap();
    assert!(
        c.get_i64("epoch").unwrap() >= epoch,
        "the recorded epoch {epoch} was never taken from the counter: {c}"
    );
    guard.release().await.unwrap();
}

/// While a grant waits for its token to be stamped (its epoch was used up), `inspect`, `list`
/// and the election's view show the new lease without a token — never the previous holder's
/// token next to the new holder — and nobody as leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_waiting_for_its_token_shows_no_token() {
    let t = test_database().await;
    if mongo::skip_without_fail_points(&t) {
        return;
    }
    let coll_name = unique("locks");
    let coll = t.db.collection::<Document>(&coll_name);
    let name = unique("stamping");
    epoch_used_up(&coll, &name, 5, false).await;
    let app = unique("stamper");
    let provider = LockProvider::builder(
        MongoBackend::builder(&t.database_as(&app).await)
            .collection(coll_name.clone())
            .build()
            .unwrap(),
    )
    .expiry(Duration::from_secs(60))
    .build()
    .unwrap();
    let observer = LockProvider::builder(
        MongoBackend::builder(&t.db)
            .collection(coll_name.clone())
            .build()
            .unwrap(),
    )
    .build()
    .unwrap();
    block_stamps(&t, &app, 3000).await;
    let lock = provider.lock(name.clone()).unwrap();
    let acquiring = tokio::spawn(async move { lock.acquire().await });
    // The grant is written (a lease id, no epoch) and the stamp is blocked.
    let in_flight = mongolock::testing::eventually(Duration::from_secs(20), || async {
        let d = coll
            .find_one(doc! { "_id": name.as_str() })
            .await
            .unwrap()
            .unwrap();
        d.get_str("leaseId").is_ok() && d.get("epoch") == Some(&Bson::Null)
    })
    .await;
    assert!(in_flight, "the grant was not written");
    let info = observer.inspect(&name).await.unwrap().unwrap();
    let listed = observer.list().await.unwrap();
    let guard = acquiring.await.unwrap().expect("granted");
    t.fail_point_off().await;
    eprintln!(
        "during the stamp: {info:?}; then token {}",
        guard.fencing_token()
    );
    assert!(info.held, "{info:?}");
    assert_eq!(
        info.fencing_token, None,
        "inspect during the stamp shows the previous token next to the new holder: {info:?}"
    );
    let listed = listed.iter().find(|i| i.name == name).expect("listed");
    assert_eq!(listed.fencing_token, None, "{listed:?}");
    assert_eq!(
        mongolock::LeaderInfo::from_lock_info(&info),
        None,
        "a leader with the previous term"
    );
    let after = observer.inspect(&name).await.unwrap().unwrap();
    assert_eq!(
        after.fencing_token,
        Some(guard.fencing_token()),
        "{after:?}"
    );
    assert!(guard.fencing_token() as i64 > 5 * EPOCH_TOKENS);
    guard.release().await.unwrap();
}
