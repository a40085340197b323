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

/// Which of the schema, the table and its fencing-token sequence exist.
async fn objects(client: &tokio_postgres::Client, schema: &str, table: &str) -> [bool; 3] {
    let row = client
        .query_one(
            "SELECT to_regnamespace(quote_ident($1)) IS NOT NULL,
                    to_regclass(quote_ident($1) || '.' || quote_ident($2)) IS NOT NULL,
                    to_regclass(quote_ident($1) || '.' || quote_ident($2 || '_fencing_token'))
                      IS NOT NULL",
            &[&schema, &table],
        )
        .await
        .unwrap();
    [row.get(0), row.get(1), row.get(2)]
}

/// Every read-only operation of `provider`, each with its result as `Result<String>`.
async fn reads(provider: &LockProvider) -> Vec<(&'static str, mongolock::Result<String>)> {
    let show = |r: mongolock::Result<String>| r;
    vec![
        (
            "list",
            show(provider.list().await.map(|v| format!("{v:?}"))),
        ),
        (
            "list_matching",
            show(
                provider
                    .list_matching(&mongolock::ListFilter::new())
                    .await
                    .map(|v| format!("{v:?}")),
            ),
        ),
        (
            "list_matching with a prefix",
            show(
                provider
                    .list_matching(&mongolock::ListFilter::new().prefix("n").held(true))
                    .await
                    .map(|v| format!("{v:?}")),
            ),
        ),
        (
            "inspect",
            show(provider.inspect("nightly").await.map(|v| format!("{v:?}"))),
        ),
        (
            "holders",
            show(provider.holders("nightly").await.map(|v| format!("{v:?}"))),
        ),
        (
            "waiters",
            show(provider.waiters("nightly").await.map(|v| format!("{v:?}"))),
        ),
        (
            "slot_limit",
            show(
                provider
                    .slot_limit("nightly")
                    .await
                    .map(|v| format!("{v:?}")),
            ),
        ),
    ]
}

/// Every read fails with `MissingLockTable` naming `display`, and says what to do.
async fn assert_reads_missing(provider: &LockProvider, display: &str) {
    for (what, r) in reads(provider).await {
        match r {
            Err(Error::MissingLockTable { table, fix }) => {
                assert_eq!(table, display, "{what}");
                assert!(fix.contains("migrate"), "{what}: {fix}");
            }
            other => panic!("{what}: expected MissingLockTable for {display}, got {other:?}"),
        }
    }
}

/// Read-only operations never create or alter anything (issue 32 §4: `--collection
/// bad.schema.name list` created schema `bad`, table `"schema.name"`, a sequence and a
/// trigger; `'weird"name'` created a table): on a missing schema or table they fail with
/// `MissingLockTable` and create nothing; the first acquisition then creates the table, and
/// a table dropped later is reported missing again (not re-created by a read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_never_create_the_table_and_report_it_missing() {
    let Some(url) = postgres::url() else { return };
    let admin = postgres::admin(&url).await;
    let bad_schema = postgres::unique_table("bad");
    let weird = postgres::unique_table("weird\"name");
    for (schema, table) in [
        (bad_schema.as_str(), "schema.name"),
        ("public", weird.as_str()),
    ] {
        let backend = PostgresBackend::builder(&url)
            .schema(schema)
            .table(table)
            .build()
            .unwrap();
        let display = backend.table().to_owned();
        let provider = LockProvider::builder(backend).build().unwrap();
        assert_reads_missing(&provider, &display).await;
        let exists = objects(&admin, schema, table).await;
        assert_eq!(
            exists,
            [schema == "public", false, false],
            "a read created part of {display} (schema, table, sequence)"
        );
        // A fresh backend, too (its first read).
        let fresh = PostgresBackend::builder(&url)
            .schema(schema)
            .table(table)
            .build()
            .unwrap();
        let fresh = LockProvider::builder(fresh).build().unwrap();
        assert!(matches!(
            fresh.list().await,
            Err(Error::MissingLockTable { .. })
        ));
        assert_eq!(objects(&admin, schema, table).await, exists);

        // The first acquisition creates it; then reads see the lock.
        let g = provider.lock("nightly").unwrap().acquire().await.unwrap();
        assert_eq!(objects(&admin, schema, table).await, [true, true, true]);
        for (what, r) in reads(&provider).await {
            assert!(r.is_ok(), "{what}: {r:?}");
        }
        assert!(fresh
            .inspect("nightly")
            .await
            .unwrap()
            .is_some_and(|i| i.held));
        g.release().await.unwrap();

        // Dropped while in use: reads report it missing and leave it so.
        admin
            .batch_execute(&format!(
                "DROP TABLE {display_q}",
                display_q = format_args!(
                    "\"{}\".\"{}\"",
                    schema.replace('"', "\"\""),
                    table.replace('"', "\"\"")
                )
            ))
            .await
            .unwrap();
        assert_reads_missing(&provider, &display).await;
        assert!(
            !objects(&admin, schema, table).await[1],
            "a read re-created it"
        );
    }
    admin
        .batch_execute(&format!("DROP SCHEMA \"{bad_schema}\" CASCADE"))
        .await
        .unwrap();
}

/// Reads of an application's table with the lock table's name are refused with
/// `ForeignCollection`, like writes, and leave it exactly as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_a_foreign_table_are_refused_and_leave_it_unchanged() {
    let Some(url) = postgres::url() else { return };
    let admin = postgres::admin(&url).await;
    let table = postgres::unique_table("orders");
    admin
        .batch_execute(&format!(
            "CREATE TABLE \"{table}\" (name text PRIMARY KEY, customer text, total integer);
             INSERT INTO \"{table}\" VALUES ('nightly', 'alice', 12);"
        ))
        .await
        .unwrap();
    let before = snapshot(&admin, &table).await;
    let backend = PostgresBackend::builder(&url)
        .table(table.clone())
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    for (what, r) in reads(&provider).await {
        match r {
            Err(Error::ForeignCollection { namespace, .. }) => {
                assert_eq!(namespace, format!("public.{table}"), "{what}")
            }
            other => panic!("{what}: expected ForeignCollection, got {other:?}"),
        }
    }
    assert_eq!(snapshot(&admin, &table).await, before, "the table changed");
}

/// A lock table of the first version (without the columns added since) is not upgraded by a
/// read: reads fail saying how to upgrade it, and the table is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_never_upgrade_an_old_lock_table() {
    let Some(url) = postgres::url() else { return };
    let admin = postgres::admin(&url).await;
    let table = postgres::unique_table("old");
    admin
        .batch_execute(&format!(
            "CREATE TABLE \"{table}\" (name text PRIMARY KEY, lease_id text,
               fencing_token bigint NOT NULL, acquired_at timestamptz NOT NULL,
               expires_at timestamptz NOT NULL, holder_host text, holder_pid bigint,
               holder_app text, released text[] NOT NULL DEFAULT '{{}}');
             INSERT INTO \"{table}\" VALUES ('nightly', NULL, 7, now(), now(), 'h', 1, NULL);"
        ))
        .await
        .unwrap();
    let before = snapshot(&admin, &table).await;
    let backend = PostgresBackend::builder(&url)
        .table(table.clone())
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend.clone()).build().unwrap();
    let r = provider.list().await;
    match &r {
        Err(Error::Backend { message, hint, .. }) => {
            assert!(message.contains("older version"), "{message}");
            assert!(hint.contains("migrate"), "{hint}");
        }
        other => panic!("expected a Backend error about an old table, got {other:?}"),
    }
    assert!(provider.inspect("nightly").await.is_err());
    assert_eq!(
        snapshot(&admin, &table).await,
        before,
        "a read altered the table"
    );
    // The upgrade keeps the row and its token.
    backend.migrate().await.unwrap();
    let info = provider.inspect("nightly").await.unwrap().unwrap();
    assert_eq!(info.fencing_token, Some(7));
}

/// A read-write lock's reader reads the writer's intent before taking its slot: on a table
/// that does not exist yet that read finds no intent (it creates nothing), and the slot
/// attempt creates the table as every first acquisition does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_is_granted_on_a_table_that_does_not_exist_yet() {
    let Some(url) = postgres::url() else { return };
    let backend = PostgresBackend::builder(&url)
        .table(postgres::unique_table("rw"))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend).build().unwrap();
    let rw = provider.rw_lock("report").unwrap();
    let g = rw
        .try_read()
        .await
        .unwrap()
        .expect("a reader on a free lock");
    assert!(provider
        .inspect("report")
        .await
        .unwrap()
        .is_some_and(|i| i.held));
    g.release().await.unwrap();
}
