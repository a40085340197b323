//! PostgreSQL connection settings against a real server: TLS (`sslmode`, `sslrootcert`) with a
//! CA and server certificate made by the test, and the statement/lock timeouts of pooled
//! connections when a session keeps a lock row locked.
//!
//! The TLS tests start a server of their own (they turn `ssl` on), so they are skipped when
//! `POSTGRES_URL` points at an existing server.

use crate::support::postgres;

use postgres::admin;
use std::path::Path;
use std::time::Duration;

use mongolock::{
    AcquireRequest, Attempt, Error, HolderInfo, LeaseId, LockBackend, LockProvider, PostgresBackend,
};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::time::Instant;

/// A CA (certificate PEM) and a server certificate + key signed by it for `names`.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn pki(names: &[&str]) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "mongolock test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "mongolock test server");
    let cert = params.signed_by(&key, &issuer).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// Writes `contents` to `path`, owned like `owner_of` (the server's directory), mode `mode`.
fn write_as_server(path: &Path, contents: &str, owner_of: &Path, mode: u32) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::write(path, contents).unwrap();
    let meta = std::fs::metadata(owner_of).unwrap();
    std::os::unix::fs::chown(path, Some(meta.uid()), Some(meta.gid())).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A server of this test's own with `ssl = on` and a certificate for `localhost` (not for
/// `127.0.0.1`, the address of its URL) signed by the returned CA; `None` (skip) without PostgreSQL binaries or with
/// `POSTGRES_URL`.
async fn tls_server() -> Option<(postgres::PgServer, Pki)> {
    if std::env::var("POSTGRES_URL").is_ok_and(|u| !u.is_empty()) {
        eprintln!("skipped: POSTGRES_URL is set and these tests must configure TLS on the server");
        return None;
    }
    if postgres::bin_dir().is_none() {
        eprintln!("skipped: no PostgreSQL binaries");
        return None;
    }
    let server = postgres::PgServer::start().expect("start PostgreSQL");
    let pki = pki(&["localhost"]);
    let dir = server.dir().to_owned();
    write_as_server(&dir.join("server.crt"), &pki.cert_pem, &dir, 0o644);
    write_as_server(&dir.join("server.key"), &pki.key_pem, &dir, 0o600);
    let client = admin(&server.url()).await;
    // One statement per query: ALTER SYSTEM cannot run in the implicit transaction of a
    // multi-statement query.
    for sql in [
        format!(
            "ALTER SYSTEM SET ssl_cert_file = '{}/server.crt'",
            dir.display()
        ),
        format!(
            "ALTER SYSTEM SET ssl_key_file = '{}/server.key'",
            dir.display()
        ),
        "ALTER SYSTEM SET ssl = on".to_owned(),
        "SELECT pg_reload_conf()".to_owned(),
    ] {
        client.batch_execute(&sql).await.expect("turn ssl on");
    }
    // The postmaster reloads asynchronously; new connections see ssl = on once it did.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let on = admin(&server.url())
            .await
            .query_one("SHOW ssl", &[])
            .await
            .map(|r| r.get::<_, String>(0) == "on")
            .unwrap_or(false);
        if on {
            break;
        }
        assert!(Instant::now() < deadline, "ssl did not turn on");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Some((server, pki))
}

fn request(name: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        name: name.to_owned(),
        lease_id: LeaseId::random(),
        ttl,
        holder: HolderInfo::current(Some("pg-tls-test".into())),
        mode: mongolock::LeaseMode::Exclusive,
    }
}

/// Whether the backend's pooled connection (named `app`) uses TLS, per `pg_stat_ssl`.
async fn uses_tls(url: &str, app: &str) -> bool {
    admin(url)
        .await
        .query_one(
            "SELECT coalesce(bool_and(s.ssl), false) FROM pg_stat_ssl s \
             JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
            &[&app],
        )
        .await
        .expect("read pg_stat_ssl")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_modes_connect_verify_and_refuse() {
    let Some((server, certs)) = tls_server().await else {
        return;
    };
    let dir = server.dir().to_owned();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, &certs.ca_pem).unwrap();
    let other_ca = dir.join("other-ca.pem");
    std::fs::write(&other_ca, pki(&["localhost"]).ca_pem).unwrap();
    let base = server.url();
    // The certificate names `localhost`, not the address `127.0.0.1` of `base`.
    let by_name = base.replace("127.0.0.1", "localhost");

    // require (no root: encrypted, not verified), verify-ca (chain only: the address is not in
    // the certificate) and verify-full (by name) with the right CA, in the URL and through the
    // builder: acquire and release work, over TLS.
    let cases = [
        (
            "require",
            format!("{base}?sslmode=require&application_name=tls-require"),
        ),
        (
            "verify-ca",
            format!(
                "{base}?sslmode=verify-ca&sslrootcert={}&application_name=tls-verify-ca",
                ca.display()
            ),
        ),
        (
            "verify-full",
            format!(
                "{by_name}?sslmode=verify-full&sslrootcert={}&application_name=tls-verify-full",
                ca.display()
            ),
        ),
    ];
    for (mode, url) in cases {
        let backend = PostgresBackend::builder(&url)
            .table("tls_locks")
            .build()
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        let provider = LockProvider::builder(backend).build().unwrap();
        let guard = provider
            .lock(format!("tls-{mode}"))
            .unwrap()
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{mode}: acquire over TLS: {e}"));
        assert!(
            uses_tls(&base, &format!("tls-{mode}")).await,
            "{mode}: the connection is not encrypted"
        );
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
    }
    // The builder's options override the URL's.
    let backend = PostgresBackend::builder(format!("{by_name}?application_name=tls-builder"))
        .ssl_mode(mongolock::PostgresSslMode::VerifyFull)
        .ssl_root_cert(&ca)
        .table("tls_locks")
        .build()
        .unwrap();
    match backend
        .try_acquire(&request("tls-builder", Duration::from_secs(30)))
        .await
        .unwrap()
    {
        Attempt::Acquired(_) => {}
        other => panic!("expected a grant, got {other:?}"),
    }
    assert!(uses_tls(&base, "tls-builder").await);

    // verify-full with the wrong CA: a typed, permanent error naming the certificate problem.
    let wrong = PostgresBackend::builder(format!(
        "{by_name}?sslmode=verify-full&sslrootcert={}&connect_timeout=5",
        other_ca.display()
    ))
    .build()
    .unwrap();
    match wrong.ping().await {
        Err(Error::Backend { message, hint, .. }) => {
            assert!(message.contains("TLS"), "{message}");
            // Same CA name, other key: `BadSignature`; another name: `UnknownIssuer`.
            assert!(message.contains("invalid peer certificate"), "{message}");
            assert!(hint.contains("sslrootcert"), "{hint}");
        }
        other => panic!("expected Error::Backend for the wrong CA, got {other:?}"),
    }
    // Through the provider too: the acquire fails with it instead of retrying.
    let provider = LockProvider::builder(wrong).build().unwrap();
    let started = Instant::now();
    match provider.lock("tls-wrong").unwrap().acquire().await {
        Err(Error::Backend { .. }) => {}
        other => panic!(
            "expected Error::Backend, got {:?}",
            other.map(|g| g.fencing_token())
        ),
    }
    assert!(started.elapsed() < Duration::from_secs(30));

    // verify-full against an address the certificate does not list: refused (verify-ca
    // accepted the same server above).
    let mismatch = PostgresBackend::builder(format!(
        "{base}?sslmode=verify-full&sslrootcert={}",
        ca.display()
    ))
    .build()
    .unwrap();
    match mismatch.ping().await {
        Err(Error::Backend { message, .. }) => {
            assert!(message.contains("not valid for name"), "{message}")
        }
        other => panic!("expected a refused certificate name, got {other:?}"),
    }

    // require against a server without TLS: a typed, permanent error.
    let plain = postgres::PgServer::start().expect("start a plain PostgreSQL");
    let backend = PostgresBackend::builder(format!("{}?sslmode=require", plain.url()))
        .build()
        .unwrap();
    match backend.ping().await {
        Err(Error::Backend { hint, .. }) => assert!(hint.contains("ssl"), "{hint}"),
        other => panic!("expected Error::Backend from a server without TLS, got {other:?}"),
    }
    // prefer (the default) falls back to plain TCP there.
    PostgresBackend::builder(plain.url())
        .build()
        .unwrap()
        .ping()
        .await
        .expect("prefer connects without TLS");
}

#[test]
fn tls_options_are_checked_when_built() {
    let invalid = |r: mongolock::Result<PostgresBackend>, what: &str| match r {
        Err(Error::InvalidOptions {
            option: "url",
            reason,
        }) => {
            assert!(reason.contains(what), "{reason}")
        }
        other => panic!("expected InvalidOptions(url) about {what}, got {other:?}"),
    };
    let base = "postgres://u@localhost/db";
    invalid(
        PostgresBackend::builder(format!("{base}?sslmode=allow")).build(),
        "allow",
    );
    invalid(
        PostgresBackend::builder(format!("{base}?sslmode=sometimes")).build(),
        "sslmode",
    );
    invalid(
        PostgresBackend::builder(format!("{base}?sslcert=client.pem")).build(),
        "client certificates",
    );
    invalid(
        PostgresBackend::builder(format!(
            "{base}?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem"
        ))
        .build(),
        "/nonexistent/ca.pem",
    );
    // verify-full without any root certificate (unless ~/.postgresql/root.crt exists).
    let home_root = std::env::var_os("HOME")
        .map(|h| Path::new(&h).join(".postgresql/root.crt"))
        .is_some_and(|p| p.exists());
    if !home_root {
        invalid(
            PostgresBackend::builder(format!("{base}?sslmode=verify-full")).build(),
            "sslrootcert",
        );
    }
    PostgresBackend::builder("host=localhost user=u sslmode=require")
        .build()
        .expect("key-value form with sslmode");
    match PostgresBackend::builder(base)
        .statement_timeout(Some(Duration::from_micros(10)))
        .build()
    {
        Err(Error::InvalidOptions {
            option: "statement_timeout",
            ..
        }) => {}
        other => panic!("expected InvalidOptions(statement_timeout), got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_holding_the_row_lock_cannot_stall_extend_past_the_lease() {
    let Some(url) = postgres::url() else { return };
    let table = postgres::unique_table("stuck");
    let ttl = Duration::from_secs(20);
    let backend = PostgresBackend::builder(&url)
        .table(&table)
        .statement_timeout(Some(Duration::from_secs(2)))
        .build()
        .unwrap();
    let req = request("stuck", ttl);
    let Attempt::Acquired(_) = backend.try_acquire(&req).await.unwrap() else {
        panic!("expected a grant");
    };
    let granted = Instant::now();

    // Another session locks the row and keeps its transaction open.
    let (mut stuck, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let tx = stuck.transaction().await.unwrap();
    tx.execute(
        &format!("SELECT 1 FROM public.{table} WHERE name = 'stuck' FOR UPDATE"),
        &[],
    )
    .await
    .unwrap();

    // The extension cannot get the row: the server cancels it after lock_timeout, and the
    // backend says so, well before the lease's deadline (no hang).
    let extend = backend.extend("stuck", &req.lease_id, ttl);
    let result = tokio::time::timeout(ttl, extend)
        .await
        .expect("extend returned before the lease's deadline");
    match result {
        Err(Error::Unavailable { message, .. }) => {
            assert!(message.contains("lock_timeout"), "{message}")
        }
        other => panic!("expected Error::Unavailable (lock timeout), got {other:?}"),
    }
    assert!(granted.elapsed() < ttl);
    // Release and acquire are bounded the same way.
    match tokio::time::timeout(ttl, backend.release("stuck", &req.lease_id))
        .await
        .expect("release returned")
    {
        Err(e) => assert!(e.is_transient(), "{e}"),
        Ok(r) => panic!("release went through a locked row: {r}"),
    }
    // The pooled connections are usable again at once (nothing queued behind a stuck
    // statement): another name works.
    let other = request("other", ttl);
    assert!(matches!(
        backend.try_acquire(&other).await.unwrap(),
        Attempt::Acquired(_)
    ));

    // Once the session ends, the lease can be extended and released.
    tx.rollback().await.unwrap();
    assert!(backend
        .extend("stuck", &req.lease_id, ttl)
        .await
        .unwrap()
        .is_some());
    assert!(backend.release("stuck", &req.lease_id).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_outlives_a_stuck_session_shorter_than_its_lease() {
    let Some(url) = postgres::url() else { return };
    let table = postgres::unique_table("stuck_guard");
    let backend = PostgresBackend::builder(&url)
        .table(&table)
        .statement_timeout(Some(Duration::from_millis(500)))
        .build()
        .unwrap();
    let provider = LockProvider::builder(backend)
        .expiry(Duration::from_secs(15))
        .build()
        .unwrap();
    let guard = provider.lock("g").unwrap().acquire().await.unwrap();
    let (mut stuck, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let tx = stuck.transaction().await.unwrap();
    tx.execute(
        &format!("SELECT 1 FROM public.{table} WHERE name = 'g' FOR UPDATE"),
        &[],
    )
    .await
    .unwrap();
    // A manual extension is retried through the lock timeouts while the session holds the
    // row, and succeeds once it lets go (well before the 15 s lease's deadline).
    let release_later = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        tx.rollback().await.unwrap();
    };
    let (extended, ()) = tokio::join!(guard.extend(Duration::from_secs(15)), release_later);
    assert!(
        extended.unwrap(),
        "the lease was extended after the session ended"
    );
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}
