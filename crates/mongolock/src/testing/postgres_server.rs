//! A real PostgreSQL server for tests and the torture harness (features `testing` and
//! `postgres`, Unix only; **not API-stable**).
//!
//! [`PgServer::start`] creates a cluster in a temporary directory with `initdb`, starts it with
//! `pg_ctl` on a free port (TCP on 127.0.0.1, its Unix socket in the same directory), as the
//! `postgres` user when running as root (PostgreSQL refuses to run as root), waits until it
//! accepts connections, and stops and removes it when dropped. The binaries are taken from
//! `PG_BIN_DIR`, else the newest `/usr/lib/postgresql/*/bin` (Debian's `postgresql` package),
//! else the `PATH`.
//!
//! [`shared_url`] is what most tests use: `POSTGRES_URL` when set (an existing server), else one
//! server per process, started on first use and stopped when the process exits. Tests isolate
//! themselves with their own table or schema names.
//!
//! Why it ships in the library: the PostgreSQL contract run, the CLI's PostgreSQL tests and the
//! torture harness (a program of its own, `mongolock-torture`) all start their server with it,
//! and a crate's `tests/` directory cannot be shared with other crates; a published test helper
//! lets your own tests run [`contract_suite!`](crate::contract_suite) and your PostgreSQL code
//! against a throwaway server the same way. It costs nothing unless asked for: it is compiled only
//! with both the `testing` and `postgres` features (neither `testing` nor its launcher is in the
//! default build), on Unix, and it adds no dependency (it runs `initdb` and `pg_ctl` with
//! `std::process`; `libc`, which it uses to find the `postgres` user, is already the library's for
//! its boot-time clock).
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// Why [`shared_url`] found no server to use (and tests skip).
pub const NO_BINARIES: &str = "no PostgreSQL binaries found (install Debian's postgresql \
                               package, set PG_BIN_DIR, or set POSTGRES_URL to an existing \
                               server)";

/// A PostgreSQL cluster in a temporary directory; stopped and removed on drop.
#[derive(Debug)]
pub struct PgServer {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// `(uid, gid)` of the `postgres` user when running as root.
    run_as: Option<(u32, u32)>,
}

/// Where the PostgreSQL server binaries are, if anywhere.
pub fn bin_dir() -> Option<PathBuf> {
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

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free local port: {e}"))
}

/// The `postgres` user's ids, when running as root.
fn postgres_user() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    // SAFETY: a NUL-terminated literal; the returned record is read at once, before any other
    // call that could overwrite it (callers of this helper do not look up users elsewhere
    // concurrently).
    let pw = unsafe { libc::getpwnam(c"postgres".as_ptr()) };
    if pw.is_null() {
        return Err(
            "running as root, but there is no `postgres` user to run PostgreSQL as (install \
             Debian's postgresql package, which creates it)"
                .into(),
        );
    }
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(Some((uid, gid)))
}

impl PgServer {
    /// Creates and starts a cluster. Errors say what failed, with the server log.
    pub fn start() -> Result<PgServer, String> {
        let bin = bin_dir().ok_or(NO_BINARIES)?;
        let run_as = postgres_user()?;
        // /tmp rather than TMPDIR: the postgres user must be able to reach the directory.
        let base = if run_as.is_some() {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("mongolock-pg-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        // From here on, dropping `server` removes the directory.
        let mut server = PgServer {
            dir,
            bin,
            port: 0,
            run_as,
        };
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&server.dir, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", server.dir.display()))?;
        }
        server.run(
            "initdb",
            &[
                "-D",
                &server.data().display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ],
        )?;
        // A port taken between our probe and the server's bind: try another.
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port()?;
            match server.pg_ctl_start() {
                Ok(()) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Runs one of the PostgreSQL binaries (as the postgres user when root).
    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = self.run_as {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        let out = cmd.output().map_err(|e| format!("run {program}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "{program} {args:?} failed ({}): {}{}\nserver log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tail(usize::MAX)
        ))
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400 -c fsync=off \
             -c full_page_writes=off",
            self.port,
            self.dir.display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-l",
                &self.log_path().display().to_string(),
                "-w",
                "-t",
                "120",
                "-o",
                &options,
                "start",
            ],
        )
    }

    /// Starts the server again (same port and data) after [`stop_immediately`](Self::stop_immediately).
    pub fn restart(&self) -> Result<(), String> {
        self.pg_ctl_start()
    }

    /// `pg_ctl stop -m immediate`: the server quits at once, like a crash.
    pub fn stop_immediately(&self) -> Result<(), String> {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        )
    }

    /// A connection URL for the `postgres` database as the `postgres` user.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The cluster's directory (data, socket and log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// The last `lines` lines of the server's log (empty when there is none yet).
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.data().join("postmaster.pid").exists() {
            let _ = self.stop_immediately();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The process-wide server behind [`shared_url`] (when `POSTGRES_URL` is not set).
static SHARED: Mutex<Option<PgServer>> = Mutex::new(None);
static SHARED_URL: OnceLock<Result<Option<String>, String>> = OnceLock::new();

extern "C" fn stop_shared() {
    if let Ok(mut server) = SHARED.lock() {
        drop(server.take());
    }
}

/// `POSTGRES_URL` when set, else the URL of this process's server (started on first call,
/// stopped when the process exits). `Ok(None)` when no PostgreSQL binaries exist
/// ([`NO_BINARIES`] says what to do); an error when they exist but the server cannot be
/// started (that is a failure, not a reason to skip).
pub fn shared_url() -> Result<Option<String>, String> {
    if let Ok(url) = std::env::var("POSTGRES_URL") {
        if !url.is_empty() {
            return Ok(Some(url));
        }
    }
    SHARED_URL
        .get_or_init(|| {
            if bin_dir().is_none() {
                return Ok(None);
            }
            let server = PgServer::start()?;
            let url = server.url();
            match SHARED.lock() {
                Ok(mut shared) => *shared = Some(server),
                Err(poisoned) => *poisoned.into_inner() = Some(server),
            }
            // SAFETY: registering a plain extern "C" function; it runs at process exit.
            unsafe { libc::atexit(stop_shared) };
            Ok(Some(url))
        })
        .clone()
}
