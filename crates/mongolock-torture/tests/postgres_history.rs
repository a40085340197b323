//! The PostgreSQL history is independent of the library: changes written to the lock and
//! resource tables by plain SQL (as a broken library would) reach the checker through the
//! harness's triggers, and the checker reports them.

use std::time::Duration;

use mongolock::testing::postgres_server::{shared_url, NO_BINARIES};
use mongolock::{LockProvider, PostgresBackend};
use mongolock_torture::checker::{Checker, ViolationKind};
use mongolock_torture::postgres::{self, quote};
use mongolock_torture::resource::FencedWrite;

/// A schema with the harness's history installed, and a provider on its lock table whose
/// leases last 30 s and are not extended; `None` (skipped, reason printed) without PostgreSQL.
struct Planted {
    url: String,
    schema: String,
    client: tokio_postgres::Client,
    locks: String,
    provider: LockProvider,
}

/// Asserts that the checker found exactly one violation of each of `kinds` and nothing else;
/// returns the violations as text.
fn each_once(checker: &Checker, kinds: &[ViolationKind]) -> Vec<String> {
    let counts = checker.counts();
    let evidence: Vec<String> = checker.first().iter().map(|v| v.to_string()).collect();
    for kind in kinds {
        assert_eq!(counts.get(kind), Some(&1), "{kind:?}: {evidence:#?}");
    }
    assert_eq!(checker.total(), kinds.len() as u64, "{evidence:#?}");
    evidence
}

async fn planted() -> Option<Planted> {
    let url = match shared_url() {
        Ok(Some(url)) => url,
        Ok(None) => {
            eprintln!("skipped: {NO_BINARIES}");
            return None;
        }
        Err(e) => panic!("start PostgreSQL: {e}"),
    };
    let schema = format!("history_test_{:x}", rand::random::<u32>());
    let client = postgres::connect(&postgres::config(&url, "history-test").unwrap())
        .await
        .unwrap();
    postgres::install(&client, &url, &schema).await.unwrap();
    let locks = format!("{}.locks", quote(&schema));
    let backend = PostgresBackend::builder(&url)
        .schema(schema.clone())
        .table("locks")
        .notifications(false)
        .cleanup_every(None)
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend)
        .expiry(Duration::from_secs(30))
        .auto_extend(false)
        .build()
        .unwrap();
    Some(Planted {
        url,
        schema,
        client,
        locks,
        provider,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_overlap_repeated_token_and_stale_write_are_reported() {
    let Some(Planted {
        url,
        schema,
        client,
        locks,
        provider,
    }) = planted().await
    else {
        return;
    };
    // A real grant through the library, held (not extended) for 30 s.
    let guard = provider.lock("n").unwrap().acquire().await.unwrap();
    let token = guard.fencing_token() as i64;

    // An intruder takes the name while the lease runs (overlap), is released, and a third
    // lease gets the intruder's token again (repeated token).
    client
        .batch_execute(&format!(
            "UPDATE {locks} SET lease_id = 'intruder', fencing_token = fencing_token + 1,
                    acquired_at = clock_timestamp(), expires_at = clock_timestamp() + interval '1 s'
              WHERE name = 'n';
             UPDATE {locks} SET lease_id = NULL, expires_at = clock_timestamp() WHERE name = 'n';
             UPDATE {locks} SET lease_id = 'repeat', acquired_at = clock_timestamp(),
                    expires_at = clock_timestamp() + interval '1 s'
              WHERE name = 'n';"
        ))
        .await
        .unwrap();

    // The resource accepts token+1, then (bypassing its rule) token.
    let resource = postgres::PgResource::new(
        postgres::config(&url, "history-test-resource").unwrap(),
        &schema,
    );
    let write = |token: i64, id: &str| FencedWrite {
        name: "n".into(),
        token: token as u64,
        write_id: id.into(),
        worker: "test".into(),
    };
    assert!(resource.write(&write(token + 1, "w1")).await.unwrap());
    assert!(!resource.write(&write(token, "refused")).await.unwrap());
    client
        .batch_execute(&format!(
            "UPDATE {}.resource SET max_token = {token}, last_write_id = 'stale' WHERE name = 'n'",
            quote(&schema)
        ))
        .await
        .unwrap();

    let mut checker = Checker::strict_release_order();
    let totals = postgres::read_histories(&client, &schema, &mut checker)
        .await
        .unwrap();
    assert_eq!(totals.grants, 3, "{totals:?}");
    let evidence = each_once(
        &checker,
        &[
            ViolationKind::Overlap,
            ViolationKind::TokenNotIncreasing,
            ViolationKind::StaleWriteAccepted,
        ],
    );
    assert!(
        evidence.iter().any(|e| e.contains("intruder")),
        "{evidence:#?}"
    );
    // Released before the schema is dropped: a guard dropped instead releases in the background,
    // and that statement can deadlock with `DROP SCHEMA`. (The planted rows may have ended the
    // lease; either outcome will do.)
    let _ = guard.release().await;
    postgres::drop_schema(&client, &schema).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_slot_over_the_limit_and_repeated_slot_token_are_reported() {
    let Some(Planted {
        url: _,
        schema,
        client,
        locks,
        provider,
    }) = planted().await
    else {
        return;
    };
    // Two real slots of a semaphore of limit 2 through the library, held (not extended) for
    // 30 s.
    let sem = provider.semaphore("sem-0", 2).unwrap();
    let first = sem.acquire().await.unwrap();
    let second = sem.acquire().await.unwrap();
    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "limit 2 is full"
    );

    // Every slot still live is held (rule `held_after_end`).
    let held = postgres::still_held(&client, &schema).await.unwrap();
    for guard in [&first, &second] {
        assert!(
            held.iter()
                .any(|(n, id, _)| n == "sem-0" && id == guard.lease_id().as_str()),
            "{held:?}"
        );
    }

    // An intruder adds a third slot while both run (over the limit), and leaves again.
    client
        .batch_execute(&format!(
            "UPDATE {locks} SET fencing_token = fencing_token + 1,
                    slots = slots || jsonb_build_array(jsonb_build_object(
                      'id', 'intruder', 'token', fencing_token + 1, 'at', clock_timestamp(),
                      'exp', clock_timestamp() + interval '1 s',
                      'holder', jsonb_build_object('app', 'intruder')))
              WHERE name = 'sem-0';
             UPDATE {locks} SET slots = (SELECT jsonb_agg(s) FROM jsonb_array_elements(slots) s
                                          WHERE s->>'id' <> 'intruder')
              WHERE name = 'sem-0';"
        ))
        .await
        .unwrap();
    // A real release, then a slot granted with the first slot's token again (not larger than
    // every token granted before for the name), within the limit.
    second.release().await.unwrap();
    let first_token = first.fencing_token() as i64;
    client
        .batch_execute(&format!(
            "UPDATE {locks} SET slots = slots || jsonb_build_array(jsonb_build_object(
                      'id', 'repeat', 'token', {first_token}, 'at', clock_timestamp(),
                      'exp', clock_timestamp() + interval '1 s',
                      'holder', jsonb_build_object('app', 'repeat')))
              WHERE name = 'sem-0';"
        ))
        .await
        .unwrap();

    let mut checker = Checker::strict_release_order();
    let totals = postgres::read_histories(&client, &schema, &mut checker)
        .await
        .unwrap();
    assert_eq!(totals.slot_grants, 4, "{totals:?}");
    assert_eq!(totals.grants, 0, "{totals:?}");
    let evidence = each_once(
        &checker,
        &[
            ViolationKind::SlotOverLimit,
            ViolationKind::SlotTokenNotIncreasing,
        ],
    );
    assert!(
        evidence
            .iter()
            .any(|e| e.starts_with("slot_over_limit") && e.contains("slot intruder")),
        "{evidence:#?}"
    );
    assert!(
        evidence
            .iter()
            .any(|e| e.starts_with("slot_token_not_increasing") && e.contains("slot repeat")),
        "{evidence:#?}"
    );
    // The intruder's removal and the library's release are both told apart as releases.
    let slots = checker.slot_counts();
    assert_eq!((slots.granted, slots.released), (4, 2), "{slots:?}");
    // Released before the schema is dropped (see the test above).
    let _ = first.release().await;
    postgres::drop_schema(&client, &schema).await.unwrap();
}
