//! Real network partitions (`partition`, `netem`; MongoDB, as root): the test server
//! (`mongo-testserver`, a process of its own) runs in a network namespace of its own, each
//! worker slot in another, joined to the server's by a veth pair on a private /30; the
//! orchestrator (recorder, fault injector, final checks) and the CLI check reach the server over
//! a control veth pair from the root namespace that is never cut.
//!
//! ```text
//!  root ns                    server ns ({prefix}s)                 worker ns ({prefix}w<i>)
//!  {prefix}c 10.231.a.b+1 --- ctl 10.231.a.b+2
//!                              w<i> 10.232.<i>.1/30 ------------------ eth0 10.232.<i>.2/30
//! ```
//!
//! A partition sets the server's end of a worker's link down (`ip link set w<i> down`); a
//! degradation adds `tc qdisc ... netem loss 100%` or a delay beyond the lease to it. Both last
//! longer than the lease and are healed before the run drains its workers. Either counts as
//! taking effect when the worker's namespace retransmitted TCP segments during it (its
//! `/proc/net/snmp` `RetransSegs` grew) or a retransmission timer fired (`/proc/net/netstat`
//! `TCPTimeouts` grew: with the link down, the worker's end has no carrier and the resend
//! fails before it counts as a retransmitted segment): the worker was talking to the server and
//! its packets or the replies were lost.
//!
//! Names carry the orchestrator's pid (`mlt<pid>`), so parallel runs never collide; the
//! namespaces are deleted when the [`Net`] is dropped, from the panic hook and on Ctrl-C
//! ([`cleanup_all`]), and namespaces of runs whose orchestrator no longer exists (killed with
//! SIGKILL) are deleted at the next setup.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Namespaces created by this process and not yet deleted (for [`cleanup_all`]).
static CREATED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The pid of the server started in the server's namespace (0: none), for [`cleanup_all`].
static SERVER_PID: AtomicU32 = AtomicU32::new(0);

/// Kills the server (Ctrl-C, panic: no destructor runs) and deletes every namespace this
/// process created and has not deleted yet. Workers exit on their own when the orchestrator's
/// end of their stdin closes.
pub fn cleanup_all() {
    let pid = SERVER_PID.swap(0, Ordering::SeqCst);
    if pid != 0 {
        // SAFETY: kill(2) on the pid of the server this process started and has not reaped
        // (it is reaped only in `Drop for Net`, which clears SERVER_PID first).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let names = std::mem::take(&mut *lock(&CREATED));
    for n in names {
        let _ = Command::new("ip")
            .args(["netns", "del", &n])
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `ip`/`tc` (or any program) and returns an error with its stderr when it fails.
fn sh(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Why partitions cannot run here (`None`: they can): not root, or `ip` / `tc` missing.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root (run as root, e.g. in CI)".into());
    }
    for p in ["ip", "tc"] {
        if !on_path(p) {
            return Some(format!(
                "`{p}` is not installed (Debian: apt-get install iproute2)"
            ));
        }
    }
    None
}

/// Where to find `mongo-testserver`: the given path, else next to this program (as
/// [`crate::cli_check::find_binary`] finds `mongolock`).
pub fn find_testserver(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    crate::cli_check::find_program(explicit, "mongo-testserver", "mongo-testserver")
}

/// Deletes namespaces named after an orchestrator pid that no longer exists.
fn delete_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix("mlt") else {
            continue;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = digits.parse::<u32>() else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = sh("ip", &["netns", "del", name]);
        }
    }
}

/// How a link is hurt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// `ip link set down`.
    Down,
    /// `tc netem loss 100%`.
    Loss,
    /// `tc netem delay <ms>ms`.
    Delay(u64),
}

/// The network of a run: the server's namespace, one per worker slot, the server process.
pub struct Net {
    server_ns: String,
    worker_ns: Vec<String>,
    control_addr: String,
    port: u16,
    server: Mutex<Option<Child>>,
    netem: bool,
}

impl Net {
    /// Creates the namespaces and links for `workers` slots and starts `testserver` in the
    /// server's namespace (TTL monitor every `ttl_monitor_secs`), its stderr in `dir`.
    pub fn setup(
        workers: usize,
        testserver: &Path,
        ttl_monitor_secs: u64,
        dir: &Path,
    ) -> Result<Net, String> {
        if workers > 250 {
            return Err("partitions support at most 250 workers".into());
        }
        delete_stale();
        let pid = std::process::id();
        let prefix = format!("mlt{pid}");
        let server_ns = format!("{prefix}s");
        let mut net = Net {
            server_ns: server_ns.clone(),
            worker_ns: Vec::new(),
            control_addr: String::new(),
            port: 0,
            server: Mutex::new(None),
            netem: false,
        };
        let add_ns = |name: &str| -> Result<(), String> {
            sh("ip", &["netns", "add", name])?;
            lock(&CREATED).push(name.to_owned());
            sh("ip", &["-n", name, "link", "set", "lo", "up"])
        };
        add_ns(&server_ns)?;
        // The control link: a /30 picked from the pid (the root side is shared by every run).
        let n = pid % 16384;
        let (a, b) = (n / 64, (n % 64) * 4);
        let root_addr = format!("10.231.{a}.{}", b + 1);
        net.control_addr = format!("10.231.{a}.{}", b + 2);
        let root_if = format!("{prefix}c");
        sh(
            "ip",
            &[
                "link", "add", &root_if, "type", "veth", "peer", "name", "ctl", "netns", &server_ns,
            ],
        )?;
        sh(
            "ip",
            &["addr", "add", &format!("{root_addr}/30"), "dev", &root_if],
        )?;
        sh("ip", &["link", "set", &root_if, "up"])?;
        let ctl = format!("{}/30", net.control_addr);
        sh("ip", &["-n", &server_ns, "addr", "add", &ctl, "dev", "ctl"])?;
        sh("ip", &["-n", &server_ns, "link", "set", "ctl", "up"])?;
        for i in 0..workers {
            let ns = format!("{prefix}w{i}");
            add_ns(&ns)?;
            net.worker_ns.push(ns.clone());
            let w = format!("w{i}");
            sh(
                "ip",
                &[
                    "-n", &server_ns, "link", "add", &w, "type", "veth", "peer", "name", "eth0",
                    "netns", &ns,
                ],
            )?;
            let s_addr = format!("10.232.{i}.1/30");
            let w_addr = format!("10.232.{i}.2/30");
            sh("ip", &["-n", &server_ns, "addr", "add", &s_addr, "dev", &w])?;
            sh("ip", &["-n", &server_ns, "link", "set", &w, "up"])?;
            sh("ip", &["-n", &ns, "addr", "add", &w_addr, "dev", "eth0"])?;
            sh("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        // Kernels without the netem qdisc (no sch_netem module, e.g. some containers): the
        // degradation drops every packet at a `pfifo limit 0` qdisc instead (100% loss, no
        // delay variant).
        let probe = [
            "netns", "exec", &server_ns, "tc", "qdisc", "add", "dev", "w0", "root",
        ];
        net.netem =
            workers > 0 && sh("ip", &[&probe[..], &["netem", "delay", "1ms"]].concat()).is_ok();
        if net.netem {
            sh(
                "ip",
                &[
                    "netns", "exec", &server_ns, "tc", "qdisc", "del", "dev", "w0", "root",
                ],
            )?;
        } else {
            eprintln!(
                "torture: the kernel has no netem qdisc (sch_netem); netem degrades links with \
                 `pfifo limit 0` (100% loss) instead"
            );
        }
        let stderr = std::fs::File::create(dir.join("mongo-testserver.stderr"))
            .map_err(|e| format!("cannot create the server's log: {e}"))?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &server_ns])
            .arg(testserver)
            .args(["--bind", "0.0.0.0", "--port", "0", "--ttl-monitor-secs"])
            .arg(ttl_monitor_secs.max(1).to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", testserver.display()))?;
        let stdout = child.stdout.take();
        SERVER_PID.store(child.id(), Ordering::SeqCst);
        *lock(&net.server) = Some(child);
        let mut line = String::new();
        if let Some(out) = stdout {
            let mut reader = BufReader::new(out);
            let _ = reader.read_line(&mut line);
            // Keep reading (and discarding) so the server never blocks on a full pipe.
            std::thread::spawn(move || {
                let mut sink = String::new();
                while reader.read_line(&mut sink).is_ok_and(|n| n > 0) {
                    sink.clear();
                }
            });
        }
        net.port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .filter(|_| line.contains("listening on"))
            .ok_or_else(|| {
                format!(
                    "mongo-testserver did not report its address (got {line:?}); see {}",
                    dir.join("mongo-testserver.stderr").display()
                )
            })?;
        Ok(net)
    }

    /// The URI of the server from the root namespace (control link).
    pub fn control_uri(&self) -> String {
        format!(
            "mongodb://{}:{}/?directConnection=true",
            self.control_addr, self.port
        )
    }

    /// The URI of the server from worker slot `i`'s namespace.
    pub fn worker_uri(&self, i: usize) -> String {
        format!(
            "mongodb://10.232.{i}.1:{}/?directConnection=true",
            self.port
        )
    }

    /// The namespace of worker slot `i`.
    pub fn worker_ns(&self, i: usize) -> Option<&str> {
        self.worker_ns.get(i).map(String::as_str)
    }

    /// Worker slots.
    pub fn slots(&self) -> usize {
        self.worker_ns.len()
    }

    /// TCP segments retransmitted so far in worker slot `i`'s namespace.
    pub fn retransmits(&self, i: usize) -> Option<u64> {
        let ns = self.worker_ns(i)?;
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
        let (head, values) = (tcp.next()?, tcp.next()?);
        let col = head.split_whitespace().position(|h| h == "RetransSegs")?;
        values.split_whitespace().nth(col)?.parse().ok()
    }

    /// TCP retransmission timeouts so far in worker slot `i`'s namespace (`TcpExt`
    /// `TCPTimeouts`): counted when a retransmission timer fires, whether or not the segment
    /// could be sent.
    pub fn timeouts(&self, i: usize) -> Option<u64> {
        let ns = self.worker_ns(i)?;
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "cat", "/proc/net/netstat"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut ext = text.lines().filter(|l| l.starts_with("TcpExt:"));
        let (head, values) = (ext.next()?, ext.next()?);
        let col = head.split_whitespace().position(|h| h == "TCPTimeouts")?;
        values.split_whitespace().nth(col)?.parse().ok()
    }

    /// Hurts worker slot `i`'s link.
    pub fn cut(&self, i: usize, how: Cut) -> Result<(), String> {
        let w = format!("w{i}");
        let ns = self.server_ns.as_str();
        match how {
            Cut::Down => sh("ip", &["-n", ns, "link", "set", &w, "down"]),
            Cut::Loss | Cut::Delay(_) if !self.netem => sh(
                "ip",
                &[
                    "netns", "exec", ns, "tc", "qdisc", "add", "dev", &w, "root", "pfifo", "limit",
                    "0",
                ],
            ),
            Cut::Loss => sh(
                "ip",
                &[
                    "netns", "exec", ns, "tc", "qdisc", "add", "dev", &w, "root", "netem", "loss",
                    "100%",
                ],
            ),
            Cut::Delay(ms) => sh(
                "ip",
                &[
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    &w,
                    "root",
                    "netem",
                    "delay",
                    &format!("{ms}ms"),
                ],
            ),
        }
    }

    /// Heals worker slot `i`'s link.
    pub fn heal(&self, i: usize, how: Cut) -> Result<(), String> {
        let w = format!("w{i}");
        let ns = self.server_ns.as_str();
        match how {
            Cut::Down => sh("ip", &["-n", ns, "link", "set", &w, "up"]),
            Cut::Loss | Cut::Delay(_) => sh(
                "ip",
                &["netns", "exec", ns, "tc", "qdisc", "del", "dev", &w, "root"],
            ),
        }
    }

    /// Hurts slot `i`'s link for `hold`, then heals it; returns whether it took effect (the
    /// worker's namespace retransmitted, or a retransmission timer fired, during the cut), or
    /// an error when `ip`/`tc` failed.
    pub async fn cut_for(
        self: &std::sync::Arc<Self>,
        i: usize,
        how: Cut,
        hold: Duration,
    ) -> Result<bool, String> {
        let net = self.clone();
        // Taken effect: the namespace retransmitted, or a retransmission timer fired (a link
        // set down makes the send fail before the segment counts as retransmitted).
        let counters = move |net: &Net| (net.retransmits(i), net.timeouts(i));
        let before = tokio::task::spawn_blocking(move || {
            let before = counters(&net);
            net.cut(i, how).map(|()| before)
        })
        .await
        .map_err(|e| e.to_string())??;
        tokio::time::sleep(hold).await;
        let net = self.clone();
        tokio::task::spawn_blocking(move || {
            let after = counters(&net);
            net.heal(i, how)?;
            let grew =
                |b: Option<u64>, a: Option<u64>| matches!((b, a), (Some(b), Some(a)) if a > b);
            Ok(grew(before.0, after.0) || grew(before.1, after.1))
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        SERVER_PID.store(0, Ordering::SeqCst);
        if let Some(mut c) = lock(&self.server).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let mut created = lock(&CREATED);
        for ns in std::iter::once(&self.server_ns).chain(self.worker_ns.iter()) {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
            created.retain(|n| n != ns);
        }
    }
}
