//! Check (6): `mongolock exec` commands on one lock never overlap. Each command prepares a
//! directory holding its owner record (fencing token, pid and the pid's start time, so that a
//! recycled pid is never taken for the owner), then renames it to a shared
//! path D and sleeps: rename(2) onto an existing (never empty) D fails, so D always names its
//! owner. A failed rename while D's owner is still running is an overlap and is appended to a
//! log; a D whose owner is dead was left by a command killed before it could clean up (not an
//! overlap) and is replaced. With `--cli-faults`, `mongolock` processes (not their commands) are
//! SIGKILLed or SIGSTOPped for longer than the lease.
//!
//! Beside those, [`LIVE_LOOPS`] loops run `mongolock exec --json-fd 1` on the liveness name
//! [`CLI_LIVE_NAME`] of the workers' own lock collection (so that its grants are in the
//! recorded history), leased like the workers' liveness names, with `--wait` running out now and
//! then; with `exec_sigint` a waiting `mongolock` is sent SIGINT (Ctrl-C) or SIGKILL. Each run's
//! wait is read from its JSON events (`waiting`, then `acquired`, `busy` or `interrupted`,
//! timed with this host's clock) for the liveness check ([`crate::liveness`]).
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::watch;

use crate::liveness::{WaitEnd, Waiter};
use crate::worklog::now_us;

/// The command each `mongolock exec` runs. A TERM (mongolock stopping it after losing the lock)
/// removes D if this command created it. (An earlier version made D with `mkdir` and wrote the
/// owner next to it afterwards: a command killed between the two left an ownerless D that every
/// later command reported as an overlap.)
const SCRIPT: &str = r#"trap 'if [ -n "$M" ]; then rm -rf "$D"; fi; rm -rf "$T"; exit 143' TERM
# Running: signalable and not a zombie (a zombie has exited; it only waits to be reaped).
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
# The start time of process $1 (field 22 of /proc/PID/stat, counted after the parenthesised
# name): with the pid it names one process for good, so a recycled pid is not taken for it.
started() { s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0; echo "${s##*) }" | cut -d' ' -f20; }
# Process $1 is alive and is the one that started at $2.
still() { [ -n "$1" ] && [ -n "$2" ] && alive "$1" && [ "$(started "$1")" = "$2" ]; }
# Whether live process $1 was already SIGKILLed and only waits for the scheduler to let it exit
# (it runs no more of its own code): SIGKILL pending (bit 9 of SigPnd or ShdPnd; the last three
# hex digits hold it) or exiting (PF_EXITING, 0x4, in field 9 of /proc/PID/stat).
killed() {
  for m in $(awk '/^(SigPnd|ShdPnd):/ { print $2 }' "/proc/$1/status" 2>/dev/null); do
    [ $(( 0x${m#${m%???}} & 0x100 )) -ne 0 ] && { echo "SIGKILL pending"; return; }
  done
  s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo "gone"; return; }
  f=$(echo "${s##*) }" | cut -d' ' -f7)
  if [ -n "$f" ] && [ $(( f & 4 )) -ne 0 ]; then echo "exiting"; else echo "not killed"; fi
}
T="$D.new.$$"
mkdir "$T" && echo "$MONGOLOCK_FENCING_TOKEN $$ $(started $$)" > "$T/owner" || exit 98
if ! mv -T "$T" "$D" 2>/dev/null; then
  set -- $(cat "$D/owner" 2>/dev/null)
  otoken=$1 pid=$2 ostart=$3
  if still "$pid" "$ostart"; then
    state=$(grep '^State:' "/proc/$pid/status" 2>/dev/null | tr -s '[:space:]' ' ')
    parent=$(grep '^PPid:' "/proc/$pid/status" 2>/dev/null | tr -s '[:space:]' ' ')
    echo "overlap: command with token $MONGOLOCK_FENCING_TOKEN (pid $$) started while the command with token $otoken (pid $pid, $state,$parent, $(killed "$pid")) was still running, at $(date +%s.%N)" >> "$LOG"
    rm -rf "$T"
    exit 99
  fi
  # Left behind by a command killed before it could clean up: not an overlap.
  echo "stale: $otoken $pid $ostart" >> "$LOG.stale"
  rm -rf "$D"
  mv -T "$T" "$D" 2>/dev/null || { echo "overlap: token $MONGOLOCK_FENCING_TOKEN lost a race for $D" >> "$LOG"; rm -rf "$T"; exit 99; }
fi
M=1
# Descendants of earlier commands that are still running (exec_setsid) overlap this one. Each
# wrote "TOKEN PID START COMMAND-PID" to its file and touches it while it runs.
for f in "$D".desc.*; do
  [ -f "$f" ] || continue
  set -- $(cat "$f" 2>/dev/null)
  dtoken=$1 dpid=$2 dstart=$3 dcmd=$4
  if [ "$dtoken" != "$MONGOLOCK_FENCING_TOKEN" ] && still "$dpid" "$dstart"; then
    # What the descendant is doing, and who its parent is: the supervisor (late), mongolock
    # (a subreaper: its sweep not yet done) or init (both gone).
    age=$(( $(date +%s%N) / 1000000 - $(stat -c %.3Y "$f" 2>/dev/null | tr -d .) ))
    dstate=$(grep '^State:' "/proc/$dpid/status" 2>/dev/null | tr -s '[:space:]' ' ')
    dparent=$(grep '^PPid:' "/proc/$dpid/status" 2>/dev/null | tr -cd '0-9')
    pwhat=$(tr '\0\n' '  ' < "/proc/$dparent/cmdline" 2>/dev/null | cut -c1-50)
    echo "overlap: command with token $MONGOLOCK_FENCING_TOKEN (pid $$) started while a setsid descendant of the command with token $dtoken (command pid $dcmd) (pid $dpid, started at tick $dstart,$dstate, $(killed "$dpid"), parent $dparent '$pwhat', its file touched ${age} ms ago) was still running, at $(date +%s.%N)" >> "$LOG"
  elif ! still "$dpid" "$dstart"; then
    rm -f "$f"
  fi
done
if [ "$SETSID" = 1 ]; then
  # A descendant in a session of its own that keeps working on the shared directory for a
  # second longer than this command.
  CMDPID=$$ setsid sh -c 'echo "$MONGOLOCK_FENCING_TOKEN $$ $(cut -d" " -f22 /proc/$$/stat) $CMDPID" > "$D.desc.$$"; echo "$$" >> "$LOG.setsid"
    end=$(( $(date +%s%N) / 1000000 + RMS + 1000 ))
    while [ $(( $(date +%s%N) / 1000000 )) -lt $end ]; do touch "$D.desc.$$"; sleep 0.1; done
    rm -f "$D.desc.$$"' </dev/null >/dev/null 2>&1 &
fi
sleep "$R" &
wait $!
rm -rf "$D"
"#;

/// Where to find the `mongolock` binary: `--mongolock-bin` / `MONGOLOCK_BIN`, else next to this
/// program (`target/<profile>/mongolock`, built by `cargo build --workspace` / `cargo test
/// --workspace`).
pub fn find_binary(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    find_program(explicit, "mongolock", "mongolock-cli")
}

/// Finds program `name` (built by package `package`): `explicit`, else next to this program.
pub fn find_program(
    explicit: Option<PathBuf>,
    name: &str,
    package: &str,
) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{} does not exist", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.join(name));
        if let Some(up) = dir.parent() {
            // Test binaries live in target/<profile>/deps.
            candidates.push(up.join(name));
        }
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "no {name} binary at {} (build it with `cargo build -p {package}`, or pass its \
                 path: --mongolock-bin / MONGOLOCK_BIN, --testserver-bin / MONGO_TESTSERVER_BIN)",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )
        })
}

/// Settings of the CLI check.
#[derive(Clone, Debug)]
pub struct CliPlan {
    /// The `mongolock` binary.
    pub bin: PathBuf,
    /// MongoDB URI or PostgreSQL URL.
    pub uri: String,
    /// Database (MongoDB).
    pub db: String,
    /// Lock collection (MongoDB) or `schema.table` (PostgreSQL).
    pub collection: String,
    /// Concurrent `mongolock exec` loops.
    pub loops: usize,
    /// SIGKILL / SIGSTOP mongolock processes.
    pub faults: bool,
    /// Stop whole `mongolock exec` process groups (`exec_group_stop`).
    pub group_stops: bool,
    /// Commands start `setsid` descendants (`exec_setsid`).
    pub setsid: bool,
    /// Run directory.
    pub dir: PathBuf,
    /// Seed.
    pub seed: u64,
    /// The liveness loops' lock collection (the workers'; PostgreSQL: `schema.table`) and
    /// lease, if they run.
    pub live: Option<(String, Duration)>,
    /// Send SIGINT (and now and then SIGKILL) to waiting `mongolock exec`s (`exec_sigint`).
    pub sigint: bool,
}

/// What the CLI check saw.
#[derive(Debug, Default)]
pub struct CliReport {
    /// Commands started by mongolock.
    pub runs: u64,
    /// mongolock processes SIGKILLed.
    pub killed: u64,
    /// mongolock processes SIGSTOPped.
    pub stopped: u64,
    /// Overlap lines written by the commands.
    pub overlaps: Vec<String>,
    /// Overlap episodes (distinct still-running commands that a new holder found), by the fault
    /// that hit the old command's mongolock (`sigkill`, `sigstop`, `exec_group_stop` or `none`;
    /// `exec_setsid after <that fault>` for a descendant that left the group), with ` (killed, not yet exited)` appended when the
    /// process had already been SIGKILLed and only waited for the scheduler to let it exit.
    pub episodes: BTreeMap<String, u64>,
    /// Directories found left behind by a dead command (not overlaps).
    pub stale: u64,
    /// Process groups of `mongolock exec` stopped (`exec_group_stop`), and of those, the ones
    /// stopped while their command was running.
    pub group_stops: (u64, u64),
    /// Commands asked to start a `setsid` descendant, and descendants that started.
    pub setsid: (u64, u64),
    /// The liveness loops: `mongolock exec` runs.
    pub live_runs: u64,
    /// Their waits.
    pub live_waits: Vec<Waiter>,
    /// SIGINTs sent to a waiting `mongolock exec`, and the ones it reported as ending its
    /// wait (`exec_sigint`).
    pub sigint_sent: (u64, u64),
    /// SIGKILLs of a waiting `mongolock exec`.
    pub live_killed: u64,
}

/// Commands run, mongolock processes killed, stopped, process groups stopped (with the
/// command running), setsid commands; and (command pid, fault) pairs.
type Counters = ([AtomicU64; 7], Mutex<Vec<(String, &'static str)>>);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Lease of the CLI's locks.
const CLI_TTL: Duration = Duration::from_secs(1);

/// Runs the loops until `stop`; returns what happened.
pub async fn run(plan: CliPlan, stop: watch::Receiver<bool>) -> CliReport {
    let shared = plan.dir.join("cli-mutex");
    let _ = std::fs::remove_dir_all(&shared);
    let log = plan.dir.join("cli-overlaps.log");
    let counters: Arc<Counters> = Arc::new(Default::default());
    let mut loops = Vec::new();
    for i in 0..plan.loops {
        let plan = plan.clone();
        let (shared, log, counters) = (shared.clone(), log.clone(), counters.clone());
        let mut stop = stop.clone();
        loops.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(plan.seed.wrapping_add(i as u64));
            while !*stop.borrow() {
                tokio::select! {
                    _ = one_run(&plan, &shared, &log, &mut rng, &counters) => {}
                    _ = stop.wait_for(|s| *s) => {}
                }
            }
        }));
    }
    let live = Arc::new(Mutex::new(LiveRecord::default()));
    if let Some((collection, ttl)) = plan.live.clone() {
        for i in 0..LIVE_LOOPS {
            let plan = plan.clone();
            let (collection, live) = (collection.clone(), live.clone());
            let stop = stop.clone();
            loops.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(plan.seed.wrapping_add(1000 + i as u64));
                while !*stop.borrow() {
                    live_run(&plan, &collection, ttl, &mut rng, &live, &stop).await;
                    let pause = Duration::from_millis(rng.random_range(0..300));
                    tokio::time::sleep(pause).await;
                }
            }));
        }
    }
    for l in loops {
        let _ = l.await;
    }
    // Let orphaned commands (whose mongolock was killed) finish before reading the log.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let overlaps: Vec<String> = std::fs::read_to_string(&log)
        .map(|s| {
            s.lines()
                .filter(|l| l.starts_with("overlap:"))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let episodes = episodes(&overlaps, &lock(&counters.1));
    let lines = |suffix: &str| {
        std::fs::read_to_string(plan.dir.join(format!("cli-overlaps.log{suffix}")))
            .map(|s| s.lines().count() as u64)
            .unwrap_or(0)
    };
    let stale = lines(".stale");
    let at = |i: usize| counters.0[i].load(Ordering::Relaxed);
    let live = std::mem::take(&mut *lock(&live));
    CliReport {
        group_stops: (at(3), at(4)),
        setsid: (at(5), lines(".setsid")),
        episodes,
        stale,
        runs: counters.0[0].load(Ordering::Relaxed),
        killed: counters.0[1].load(Ordering::Relaxed),
        stopped: counters.0[2].load(Ordering::Relaxed),
        overlaps,
        live_runs: live.runs,
        live_waits: live.waits,
        sigint_sent: live.sigint,
        live_killed: live.killed,
    }
}

/// Concurrent `mongolock exec` loops on [`CLI_LIVE_NAME`].
pub const LIVE_LOOPS: usize = 3;

/// The liveness name the CLI check's `mongolock exec` loops wait for (in the workers' lock
/// collection).
pub const CLI_LIVE_NAME: &str = "live-cli";

/// What the liveness loops saw.
#[derive(Default)]
struct LiveRecord {
    runs: u64,
    waits: Vec<Waiter>,
    sigint: (u64, u64),
    killed: u64,
}

/// The JSON events of one `mongolock exec` run that time its wait: (event, its `time` in µs).
type Events = Arc<Mutex<Vec<(String, i64)>>>;

/// One event's kind and time (`time`: this host's clock, RFC 3339 with milliseconds).
fn event_of(line: &str) -> Option<(String, i64)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let kind = v.get("event")?.as_str()?.to_owned();
    let t = humantime::parse_rfc3339_weak(v.get("time")?.as_str()?).ok()?;
    Some((kind, crate::worker::system_us(t)))
}

/// One `mongolock exec --json-fd 1` of the liveness name: waits (for `--wait` or until
/// granted), runs `sleep` for 0.1–1.5 s; with `sigint`, 40 % of the runs get SIGINT and 10 %
/// SIGKILL if they still wait 0.05–1.5 s after reporting that they wait. The stop of the run interrupts a wait (not counted) and
/// lets a command finish.
async fn live_run(
    plan: &CliPlan,
    collection: &str,
    ttl: Duration,
    rng: &mut StdRng,
    live: &Mutex<LiveRecord>,
    stop: &watch::Receiver<bool>,
) {
    let wait = rng
        .random_bool(0.6)
        .then(|| Duration::from_millis(rng.random_range(300..3000)));
    let hold = format!("{:.3}", rng.random_range(0.1..1.5_f64));
    let mut command = Command::new(&plan.bin);
    command
        .args([
            "--uri",
            &plan.uri,
            "--db",
            &plan.db,
            "--collection",
            collection,
        ])
        .args(["exec", "--json-fd", "1", "--ttl"])
        .arg(format!("{}ms", ttl.as_millis()));
    if let Some(w) = wait {
        command.arg("--wait").arg(format!("{}ms", w.as_millis()));
    }
    // The runs' events go to `cli-live.jsonl` in the run directory (with the run's pid), and
    // with TORTURE_CLI_LOG their diagnostics (`MONGOLOCK_LOG`) to `cli-live.<pid>.stderr`
    // (named once the pid is known).
    let log_to = std::env::var("TORTURE_CLI_LOG").ok().map(|filter| {
        command.env("MONGOLOCK_LOG", filter);
        plan.dir
            .join(format!("cli-live.{}.stderr", rng.random::<u64>()))
    });
    let stderr = log_to
        .as_ref()
        .and_then(|p| std::fs::File::create(p).ok())
        .map_or_else(Stdio::null, Stdio::from);
    let child = command
        .args([CLI_LIVE_NAME, "--", "sleep", &hold])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("torture: cannot run {}: {e}", plan.bin.display());
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
    };
    lock(live).runs += 1;
    let pid = child.id().unwrap_or(0);
    if let Some(p) = &log_to {
        let _ = std::fs::rename(p, plan.dir.join(format!("cli-live.{pid}.stderr")));
    }
    let events: Events = Arc::default();
    let journal = plan.dir.join("cli-live.jsonl");
    let reader = child.stdout.take().map(|out| {
        let events = events.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            let mut kept = String::new();
            while let Ok(Some(l)) = lines.next_line().await {
                if let Some(e) = event_of(&l) {
                    lock(&events).push(e);
                    kept.push_str(&format!("{{\"pid\":{pid},\"line\":{l}}}\n"));
                }
            }
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&journal)
            {
                use std::io::Write;
                let _ = f.write_all(kept.as_bytes());
            }
        })
    });
    let seen = |kind: &str| lock(&events).iter().any(|(k, _)| k == kind);
    let waiting = || seen("waiting") && !seen("acquired") && !seen("busy");
    let roll: f64 = rng.random();
    let signal = if !plan.sigint || roll >= 0.5 {
        None
    } else if roll < 0.4 {
        Some(libc::SIGINT)
    } else {
        Some(libc::SIGKILL)
    };
    let after = Duration::from_millis(rng.random_range(50..1500));
    let mut killed_at = None;
    let mut stop = stop.clone();
    let mut interrupted_by_stop = false;
    // The signal comes `after` the run reported that it waits.
    let waited = async {
        while !seen("waiting") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(after).await;
    };
    tokio::select! {
        _ = child.wait() => {}
        () = waited, if signal.is_some() => {}
        _ = stop.wait_for(|s| *s) => interrupted_by_stop = true,
    }
    let sig = if interrupted_by_stop {
        Some(libc::SIGINT)
    } else {
        signal
    };
    if let Some(sig) = sig.filter(|_| waiting()) {
        let t = now_us();
        // SAFETY: kill(2) on our own child; no memory is involved.
        if unsafe { libc::kill(pid as i32, sig) } == 0 && !interrupted_by_stop {
            let mut l = lock(live);
            if sig == libc::SIGKILL {
                l.killed += 1;
                killed_at = Some(t);
            } else {
                l.sigint.0 += 1;
            }
        }
    }
    let _ = child.wait().await;
    if let Some(r) = reader {
        // The command (`sleep`) holds the pipe too: it ends at the latest with it.
        let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
    }
    let events = std::mem::take(&mut *lock(&events));
    let at = |kind: &str| events.iter().find(|(k, _)| k == kind).map(|(_, t)| *t);
    let Some(start_us) = at("waiting") else {
        return;
    };
    let (end_us, end) = if let Some(t) = at("acquired") {
        (t, WaitEnd::Got)
    } else if let Some(t) = at("busy") {
        (t, WaitEnd::TimedOut)
    } else if let Some(t) = at("interrupted") {
        if !interrupted_by_stop {
            lock(live).sigint.1 += 1;
        }
        (
            t,
            if interrupted_by_stop {
                WaitEnd::Stopped
            } else {
                WaitEnd::Interrupted
            },
        )
    } else if let Some(t) = killed_at {
        (t, WaitEnd::Killed)
    } else {
        (at("exit").unwrap_or_else(now_us), WaitEnd::Failed)
    };
    lock(live).waits.push(Waiter {
        name: CLI_LIVE_NAME.to_owned(),
        who: format!("exec {pid}"),
        via: match wait {
            Some(w) => format!("exec --wait {}ms", w.as_millis()),
            None => "exec".to_owned(),
        },
        start_us,
        end_us,
        end,
        paused: Vec::new(),
        // mongolock withdraws (and flushes) before it exits; a SIGKILL leaves the entry.
        abandoned: end == WaitEnd::Killed,
    });
}

/// The late process of an overlap line: the pid in its last "(pid N".
fn late_pid(line: &str) -> Option<&str> {
    line.rsplit("(pid ").next()?.split([')', ',']).next()
}

/// Overlap episodes by kind (see [`CliReport::episodes`]): one per distinct late process in the
/// overlap lines, attributed by `hit` (pid of a process under mongolock, fault that hit it).
fn episodes(overlaps: &[String], hit: &[(String, &'static str)]) -> BTreeMap<String, u64> {
    // The old command's pid (a setsid descendant's own pid).
    let mut owners: Vec<String> = overlaps
        .iter()
        .filter_map(|l| late_pid(l))
        .map(str::to_owned)
        .collect();
    // (descendant pid, pid of the command that started it) of each setsid overlap.
    let setsid_commands: Vec<(String, String)> = overlaps
        .iter()
        .filter(|l| l.contains("setsid descendant"))
        .filter_map(|l| {
            let cmd = l.split("(command pid ").nth(1)?.split(')').next()?;
            Some((late_pid(l)?.to_owned(), cmd.to_owned()))
        })
        .collect();
    // Episodes whose process had already been SIGKILLed (the kill came in time; the scheduler
    // had not yet let the process exit) are told apart from those nobody had killed.
    let killed_owners: Vec<String> = overlaps
        .iter()
        .filter(|l| l.contains(", SIGKILL pending,") || l.contains(", exiting,"))
        .filter_map(|l| late_pid(l))
        .map(str::to_owned)
        .collect();
    owners.sort();
    owners.dedup();
    let mut episodes = BTreeMap::new();
    for o in owners {
        let fault_of = |pid: &str| {
            hit.iter()
                .find(|(p, _)| *p == pid)
                .map_or("none", |(_, k)| *k)
        };
        let kind = match setsid_commands.iter().find(|(d, _)| *d == o) {
            // What hit the mongolock of the command that started the descendant.
            Some((_, cmd)) => format!("exec_setsid after {}", fault_of(cmd)),
            None => fault_of(&o).to_owned(),
        };
        let kind = if killed_owners.contains(&o) {
            format!("{kind} (killed, not yet exited)")
        } else {
            kind
        };
        *episodes.entry(kind).or_default() += 1;
    }
    episodes
}

async fn one_run(plan: &CliPlan, shared: &Path, log: &Path, rng: &mut StdRng, counters: &Counters) {
    let secs = rng.random_range(0.05..2.5_f64);
    let sleep = format!("{secs:.3}");
    let setsid = plan.setsid && rng.random_bool(0.3);
    let child = Command::new(&plan.bin)
        .args([
            "--uri",
            &plan.uri,
            "--db",
            &plan.db,
            "--collection",
            &plan.collection,
        ])
        .args(["exec", "--ttl", "1s", "--grace", "300ms", "cli-lock", "--"])
        .args(["sh", "-c", SCRIPT])
        .env("D", shared)
        .env("LOG", log)
        .env("R", sleep)
        .env("RMS", ((secs * 1000.0) as u64).to_string())
        .env("SETSID", if setsid { "1" } else { "0" })
        // A job of its own, as a shell starts one: `exec_group_stop` stops this group.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("torture: cannot run {}: {e}", plan.bin.display());
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
    };
    counters.0[0].fetch_add(1, Ordering::Relaxed);
    if setsid {
        counters.0[5].fetch_add(1, Ordering::Relaxed);
    }
    let fault: f64 = rng.random();
    if plan.group_stops && (0.4..0.75).contains(&fault) {
        // Job control (Ctrl-Z, `kill -STOP -<pgid>`): the whole group of mongolock, longer
        // than the lease, then continued; once the command runs (mongolock may first wait for
        // the lock, or give up), at a random point of it.
        let Some(pid) = child.id() else { return };
        let mut below = Vec::new();
        for _ in 0..150 {
            below = descendants(pid);
            if !below.is_empty() {
                break;
            }
            tokio::select! {
                _ = child.wait() => return,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        let after = Duration::from_millis(rng.random_range(0..500));
        tokio::select! {
            _ = child.wait() => return,
            _ = tokio::time::sleep(after) => {}
        }
        let now = descendants(pid);
        let running = !now.is_empty();
        below.extend(now);
        lock(&counters.1).extend(below.iter().map(|c| (c.to_string(), "exec_group_stop")));
        // SAFETY: kill(2) on the process group of our own child (its own group: process_group(0)).
        if unsafe { libc::kill(-(pid as i32), libc::SIGSTOP) } == 0 {
            counters.0[3].fetch_add(1, Ordering::Relaxed);
            // Taking effect: mongolock's supervisor or command was running (so a command could
            // outlive the lease while mongolock is stopped).
            if running {
                counters.0[4].fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(CLI_TTL.mul_f64(rng.random_range(1.5..3.0))).await;
            // SAFETY: as above.
            unsafe { libc::kill(-(pid as i32), libc::SIGCONT) };
        }
    } else if plan.faults && fault < 0.4 {
        let after = Duration::from_millis(rng.random_range(0..1500));
        tokio::select! {
            _ = child.wait() => return,
            _ = tokio::time::sleep(after) => {}
        }
        let Some(pid) = child.id() else { return };
        // Remember which command (mongolock's descendant) each fault hit, to attribute
        // overlaps.
        let kind = if fault < 0.2 { "sigkill" } else { "sigstop" };
        lock(&counters.1).extend(descendants(pid).iter().map(|c| (c.to_string(), kind)));
        if fault < 0.2 {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            counters.0[1].fetch_add(1, Ordering::Relaxed);
        } else {
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
            counters.0[2].fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(CLI_TTL.mul_f64(rng.random_range(1.5..3.0))).await;
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }
    let _ = child.wait().await;
}

/// The children of `pid`, from `/proc` (every thread's: a child belongs to the thread that
/// started it).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(
            text.split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    out
}

/// Every descendant of `pid` (children, their children, ...), from `/proc`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in children(p) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setsid_line(cmd: u32, pid: u32, killed: &str) -> String {
        format!(
            "overlap: command with token 8 (pid 900) started while a setsid descendant of the \
             command with token 7 (command pid {cmd}) (pid {pid}, started at tick 4467593,State: \
             R (running) , {killed}, parent 14298 'mongolock __supervise --control-fd 16', its \
             file touched 982 ms ago) was still running, at 1795682448.037648293"
        )
    }

    #[test]
    fn episodes_tell_the_fault_and_whether_the_late_process_was_already_killed() {
        let overlaps = vec![
            // Two commands saw the same late descendant: one episode.
            setsid_line(14299, 14306, "SIGKILL pending"),
            setsid_line(14299, 14306, "SIGKILL pending"),
            setsid_line(5566, 5576, "not killed"),
            setsid_line(7000, 7001, "exiting"),
            "overlap: command with token 9 (pid 901) started while the command with token 8 \
             (pid 555, State: S (sleeping) , PPid: 554, not killed) was still running, at 1.0"
                .to_owned(),
        ];
        let hit = vec![
            ("14299".to_owned(), "exec_group_stop"),
            ("555".to_owned(), "sigstop"),
        ];
        let got = episodes(&overlaps, &hit);
        let want: BTreeMap<String, u64> = [
            (
                "exec_setsid after exec_group_stop (killed, not yet exited)",
                1,
            ),
            ("exec_setsid after none", 1),
            ("exec_setsid after none (killed, not yet exited)", 1),
            ("sigstop", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(got, want, "episodes of {overlaps:#?}");
    }
}
