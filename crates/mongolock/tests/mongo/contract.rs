//! The contract suite against MongoDB (embedded mongo-testserver, or `MONGODB_URI`).

use std::sync::Arc;

use mongolock::testing::Env;
use mongolock::{LockBackend, MongoBackend};

use crate::support::mongo;

async fn setup() -> Env {
    let db = mongo::test_database().await;
    // Change streams need a replica set or a sharded cluster: the embedded server is one; a
    // real deployment given by MONGODB_URI is asked (a standalone server falls back to polling,
    // and the notification cases do not apply to it).
    let notifications = db.server.is_some() || has_change_streams(&db.db).await;
    let (uri, db_name, coll) = (
        db.uri.clone(),
        db.db.name().to_owned(),
        mongo::unique("locks"),
    );
    let backend = MongoBackend::builder(&db.db)
        .collection(&coll)
        .build()
        .expect("valid collection name");
    let env = Env::new(mongo::shared(backend))
        .keep_alive(db)
        // A client per backend, created in the runtime that will use it (the election cases
        // give each candidate one, as separate processes would have).
        .with_backend_factory(move || {
            let (uri, db_name, coll) = (uri.clone(), db_name.clone(), coll.clone());
            async move {
                let client = mongo::client(&uri, None).await;
                let backend = MongoBackend::builder(&client.database(&db_name))
                    .collection(coll)
                    .build()
                    .expect("valid collection name");
                Arc::new(backend) as Arc<dyn LockBackend>
            }
        });
    if notifications {
        env.with_notifications()
    } else {
        env
    }
}

/// Whether the deployment behind `db` offers change streams: a replica set member (`setName`)
/// or a mongos (`msg: "isdbgrid"`), by the `hello` command.
async fn has_change_streams(db: &mongodb::Database) -> bool {
    let hello = db
        .client()
        .database("admin")
        .run_command(mongodb::bson::doc! { "hello": 1 })
        .await
        .expect("the hello command of the deployment in MONGODB_URI");
    hello.contains_key("setName") || hello.get_str("msg") == Ok("isdbgrid")
}

mongolock::contract_suite!(setup);
