//! A table that is not mongolock's is refused, never altered: against a real PostgreSQL
//! (started by the tests, or `POSTGRES_URL`).

use crate::support::postgres;

use mongolock::{Error, LockProvider, PostgresBackend};

/// Everything about `table` that a migration could change: its columns (with types), indexes,
/// triggers, rows, and whether mongolock's sequence for it exists.
async fn snapshot(client: &tokio_postgres::Client, table: &str) -> Vec<String> {
    let mut facts = Vec::new();
    for row in client
        .query(
            "SELECT attname || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute
              WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
              ORDER BY attnum",
            &[&table],
        )
        .await
        .unwrap()
    {
        facts.push(format!("column {}", row.get::<_, String>(0)));
    }
    for row in client
        .query(
            "SELECT indexdef FROM pg_indexes WHERE tablename = $1 ORDER BY indexname",
            &[&table],
        )
        .await
        .unwrap()
    {
        facts.push(format!("index {}", row.get::<_, String>(0)));
    }
    for row in client
        .query(
            "SELECT tgname::text FROM pg_trigger WHERE tgrelid = to_regclass($1) ORDER BY 1",
            &[&table],
        )
        .await
        .unwrap()
    {
        facts.push(format!("trigger {}", row.get::<_, String>(0)));
    }
    for row in client
        .query(
            &format!("SELECT row_to_json(t)::text FROM \"{table}\" t ORDER BY 1"),
            &[],
        )
        .await
        .unwrap()
    {
        facts.push(format!("row {}", row.get::<_, String>(0)));
    }
    let sequence: bool = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&format!("{table}_fencing_token")],
        )
        .await
        .unwrap()
        .get(0);
    facts.push(format!("sequence {sequence}"));
    facts
}

/// An application's table with the lock table's name: every lock operation and `migrate`
/// fail with `ForeignCollection`, and the table is exactly as it was (no column, index,
/// trigger or row added; no sequence created).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_table_is_refused_and_left_unchanged() {
    let Some(url) = postgres::url() else { return };
    let admin = postgres::admin(&url).await;
    let table = postgres::unique_table("users");
    admin
        .batch_execute(&format!(
            "CREATE TABLE \"{table}\" (id integer PRIMARY KEY, name text, expires_at timestamptz);
             INSERT INTO \"{table}\" VALUES (1, 'alice', now() - interval '1 day');"
        ))
        .await
        .unwrap();
    let before = snapshot(&admin, &table).await;
    let backend = PostgresBackend::builder(&url)
        .table(table.clone())
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend.clone()).build().unwrap();
    let namespace = format!("public.{table}");
    let check = |what: &str, e: Error| match e {
        Error::ForeignCollection {
            namespace: ns, fix, ..
        } => {
            assert_eq!(ns, namespace, "{what}");
            assert!(fix.contains("public.mongolock_locks"), "{what}: {fix}");
        }
        other => panic!("{what}: expected ForeignCollection, got {other:?}"),
    };
    check(
        "lock",
        provider.lock("x").unwrap().try_acquire().await.unwrap_err(),
    );
    check(
        "semaphore",
        provider
            .semaphore("x", 2)
            .unwrap()
            .try_acquire()
            .await
            .unwrap_err(),
    );
    check("migrate", backend.migrate().await.unwrap_err());
    assert_eq!(snapshot(&admin, &table).await, before, "the table changed");
}

/// The check lets mongolock's own table through: a second backend (another process) on a
/// table the first one created uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_table_is_accepted_by_a_new_backend() {
    let Some(url) = postgres::url() else { return };
    let table = postgres::unique_table("locks");
    let make = || {
        let backend = PostgresBackend::builder(&url)
            .table(table.clone())
            .build()
            .unwrap();
        LockProvider::builder(backend).build().unwrap()
    };
    let first = make();
    let g = first.lock("a").unwrap().acquire().await.unwrap();
    let token = g.fencing_token();
    g.release().await.unwrap();
    let second = make();
    let backend = PostgresBackend::builder(&url)
        .table(table.clone())
        .build()
        .unwrap();
    backend.migrate().await.unwrap();
    let g = second.lock("a").unwrap().acquire().await.unwrap();
    assert!(
        g.fencing_token() > token,
        "{} after {token}",
        g.fencing_token()
    );
    g.release().await.unwrap();
}
