//! mongolock's `PostgresBackend` in the same harness (`BENCH_LIBS=pg`), against a PostgreSQL
//! the benchmark starts itself (or `POSTGRES_URL`).
//!
//! The server: `initdb` in a temporary directory and `pg_ctl start` on a free port (as the
//! `postgres` user when running as root; binaries from `PG_BIN_DIR`, else the newest
//! `/usr/lib/postgresql/*/bin`, else the `PATH`), like the tests' `tests/support/postgres.rs`,
//! with `pg_stat_statements` preloaded. Statements are counted by the server
//! (`pg_stat_statements`: `calls` of every top-level statement, utility statements such as
//! `LISTEN` included, the benchmark's own counting query left out), so counting costs the
//! client nothing. Server CPU is the sum over the postmaster and its children
//! (`/proc/<pid>/stat`): the backends serving the pool and the listening connection, and the
//! background processes (WAL writer, checkpointer, ...). With `POSTGRES_URL` the server is
//! not ours: server CPU is not reported, and statements are counted only if the extension is
//! loaded there.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use mongolock::{LockProvider, PostgresBackend};
use tokio_postgres::{Client, NoTls};

use crate::proc_cpu;

/// A PostgreSQL cluster in a temporary directory (stopped and removed on drop), or an existing
/// server (`POSTGRES_URL`).
pub struct PgServer {
    url: String,
    /// The cluster, when we started it.
    ours: Option<Cluster>,
}

struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    /// `(uid, gid)` of the `postgres` user when running as root.
    run_as: Option<(u32, u32)>,
}

fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BIN_DIR") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
}

/// The `postgres` user's ids when running as root (PostgreSQL refuses to run as root).
fn postgres_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: a valid C string; the record is read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(!pw.is_null(), "running as root without a `postgres` user");
    // SAFETY: checked non-null above.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn run(bin: &std::path::Path, run_as: Option<(u32, u32)>, program: &str, args: &[&str]) {
    let mut cmd = Command::new(bin.join(program));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((uid, gid)) = run_as {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(gid);
    }
    let out = cmd.output().expect("run a PostgreSQL binary");
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PgServer {
    pub fn start() -> PgServer {
        if let Ok(url) = std::env::var("POSTGRES_URL") {
            return PgServer { url, ours: None };
        }
        let bin = bin_dir().expect("no PostgreSQL binaries (initdb, pg_ctl); set POSTGRES_URL");
        let run_as = postgres_user();
        let dir = PathBuf::from("/tmp").join(format!("mongolock-bench-pg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the cluster directory");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown");
        }
        let data = dir.join("data").display().to_string();
        run(
            &bin,
            run_as,
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ],
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        // Durability settings stay at their defaults (fsync, synchronous_commit on) unless
        // BENCH_PG_DURABLE=0: the figures include the WAL flush of every commit, as a real
        // deployment's would.
        let mut options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400 \
             -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top",
            dir.display()
        );
        if std::env::var("BENCH_PG_DURABLE").is_ok_and(|v| v == "0") {
            options.push_str(" -c fsync=off -c synchronous_commit=off");
        }
        if std::env::var("BENCH_PG_STATEMENTS").is_ok_and(|v| v == "1") {
            options.push_str(" -c pg_stat_statements.track_planning=on");
        }
        run(
            &bin,
            run_as,
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                &dir.join("log").display().to_string(),
                "-w",
                "-o",
                &options,
                "start",
            ],
        );
        PgServer {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            ours: Some(Cluster { dir, bin, run_as }),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// CPU of the postmaster and all its children (the server's processes); `None` for a
    /// server we did not start.
    pub fn cpu(&self) -> Option<Duration> {
        let dir = &self.ours.as_ref()?.dir;
        let pidfile = std::fs::read_to_string(dir.join("data/postmaster.pid")).ok()?;
        let postmaster: u32 = pidfile.lines().next()?.trim().parse().ok()?;
        let mut total = proc_cpu(postmaster)?;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(close) = stat.rfind(')') else {
                continue;
            };
            let ppid = stat[close + 2..]
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(postmaster) {
                total += proc_cpu(pid).unwrap_or_default();
            }
        }
        Some(total)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(Cluster { dir, bin, run_as }) = self.ours.take() {
            let data = dir.join("data").display().to_string();
            let mut cmd = Command::new(bin.join("pg_ctl"));
            cmd.args(["-D", &data, "-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some((uid, gid)) = run_as {
                use std::os::unix::process::CommandExt;
                cmd.uid(uid).gid(gid);
            }
            let _ = cmd.status();
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// An admin connection that reads `pg_stat_statements`.
pub struct PgStats {
    client: Client,
    available: bool,
}

impl PgStats {
    pub async fn connect(url: &str) -> PgStats {
        let (client, conn) = tokio_postgres::connect(url, NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(conn);
        let available = client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
            .is_ok()
            && client
                .simple_query("SELECT 1 FROM pg_stat_statements LIMIT 1")
                .await
                .is_ok();
        if !available {
            eprintln!("pg_stat_statements is not loaded: statements are not counted");
        }
        PgStats { client, available }
    }

    /// `calls` summed over the top-level statements whose text matches `like` (`%` for all),
    /// this counting query left out. One simple query (no prepared statement of its own).
    pub async fn calls(&self, like: &str) -> Option<u64> {
        if !self.available {
            return None;
        }
        let sql = format!(
            "SELECT coalesce(sum(calls), 0)::bigint::text FROM pg_stat_statements \
             WHERE query NOT LIKE '%pg_stat_statements%' AND query LIKE '{like}'"
        );
        let msgs = self.client.simple_query(&sql).await.ok()?;
        msgs.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
            _ => None,
        })
    }

    /// Forgets the statistics gathered so far (`pg_stat_statements_reset()`).
    pub async fn reset(&self) {
        if self.available {
            let _ = self
                .client
                .simple_query("SELECT pg_stat_statements_reset()")
                .await;
        }
    }

    /// One line per statement since the last [`reset`](Self::reset), the most time first:
    /// calls, plans, mean planning and execution time in µs (triggers included; the commit's
    /// work, such as queueing notifications, is not), and the start of its text. Planning is
    /// timed only on a server started with `pg_stat_statements.track_planning` (ours, under
    /// `BENCH_PG_STATEMENTS=1`).
    pub async fn breakdown(&self) -> Vec<String> {
        if !self.available {
            return Vec::new();
        }
        let sql = "SELECT calls::text, plans::text,
                          round((mean_plan_time * 1000)::numeric)::text,
                          round((mean_exec_time * 1000)::numeric)::text,
                          left(regexp_replace(query, '\\s+', ' ', 'g'), 70)
                     FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
                    ORDER BY total_exec_time DESC LIMIT 8";
        let Ok(msgs) = self.client.simple_query(sql).await else {
            return Vec::new();
        };
        msgs.iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(format!(
                    "{:>8} calls {:>8} plans {:>6} us planning {:>6} us executing  {}",
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?
                )),
                _ => None,
            })
            .collect()
    }

    /// All statements the libraries sent.
    pub async fn statements(&self) -> u64 {
        self.calls("%").await.unwrap_or(0)
    }

    /// Executions of the acquire statement (`INSERT ... ON CONFLICT`): acquire attempts.
    pub async fn acquire_attempts(&self) -> u64 {
        self.calls("%ON CONFLICT%").await.unwrap_or(0)
    }
}

/// A provider on `PostgresBackend` (LISTEN/NOTIFY on), table `table`.
pub fn provider(url: &str, table: &str) -> LockProvider {
    provider_and_backend(url, table).0
}

/// [`provider`] and its backend (to read how many notifications its listening connection
/// received).
pub fn provider_and_backend(url: &str, table: &str) -> (LockProvider, PostgresBackend) {
    let backend = PostgresBackend::builder(url)
        .table(table)
        .build()
        .expect("PostgresBackend");
    let provider = LockProvider::builder(backend.clone())
        .build()
        .expect("provider");
    (provider, backend)
}
