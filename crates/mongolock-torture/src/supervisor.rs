//! Runs the worker processes (this program re-executed with the `worker` subcommand), restarts
//! them when they die (SIGKILL by the fault injector), and drains them at the end.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

use crate::config::{WorkerConfig, WORKER_CONFIG_ENV};

/// What the orchestrator asks of a worker slot.
enum SlotCmd {
    /// Stop the loops; reply once drained (or dead).
    Stop(oneshot::Sender<()>),
    /// End the process.
    Exit(oneshot::Sender<()>),
}

/// The running workers.
pub struct Supervisor {
    slots: Vec<mpsc::Sender<SlotCmd>>,
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    restarts: Arc<AtomicU64>,
}

/// Builds the configuration of one incarnation of a worker.
pub type ConfigFor = Arc<dyn Fn(usize, u64, PathBuf) -> WorkerConfig + Send + Sync>;

impl Supervisor {
    /// Starts `workers` worker processes of `exe`, logging into `dir`; worker slot `i` runs in
    /// network namespace `netns[i]` when given (`ip netns exec`, which execs the worker: the
    /// pid is the worker's).
    pub fn start(
        exe: PathBuf,
        dir: &Path,
        workers: usize,
        netns: Vec<String>,
        config_for: ConfigFor,
    ) -> Self {
        let pids = Arc::new(Mutex::new(vec![None; workers]));
        let restarts = Arc::new(AtomicU64::new(0));
        let mut slots = Vec::new();
        for id in 0..workers {
            let (tx, rx) = mpsc::channel(4);
            slots.push(tx);
            tokio::spawn(slot(
                id,
                netns.get(id).cloned(),
                exe.clone(),
                dir.to_path_buf(),
                config_for.clone(),
                pids.clone(),
                restarts.clone(),
                rx,
            ));
        }
        Supervisor {
            slots,
            pids,
            restarts,
        }
    }

    /// The pid of each worker that is running now.
    pub fn pids(&self) -> Vec<u32> {
        lock(&self.pids).iter().flatten().copied().collect()
    }

    /// Workers restarted after dying.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Stops every worker's loops and waits until each is drained.
    pub async fn drain(&self) {
        let mut replies = Vec::new();
        for s in &self.slots {
            let (tx, rx) = oneshot::channel();
            if s.send(SlotCmd::Stop(tx)).await.is_ok() {
                replies.push(rx);
            }
        }
        for r in replies {
            let _ = r.await;
        }
    }

    /// Ends every worker process.
    pub async fn exit(&self) {
        let mut replies = Vec::new();
        for s in &self.slots {
            let (tx, rx) = oneshot::channel();
            if s.send(SlotCmd::Exit(tx)).await.is_ok() {
                replies.push(rx);
            }
        }
        for r in replies {
            let _ = r.await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn spawn(
    netns: Option<&str>,
    exe: &Path,
    dir: &Path,
    cfg: &WorkerConfig,
    id: usize,
    inc: u64,
) -> std::io::Result<Child> {
    let json = serde_json::to_string(cfg).map_err(std::io::Error::other)?;
    let stderr = std::fs::File::create(dir.join(format!("worker-{id}-{inc}.stderr")))?;
    let mut command = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    command
        .arg("worker")
        .env(WORKER_CONFIG_ENV, json)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true)
        .spawn()
}

/// One worker slot: (re)starts its process until told to stop.
#[allow(clippy::too_many_arguments)]
async fn slot(
    id: usize,
    netns: Option<String>,
    exe: PathBuf,
    dir: PathBuf,
    config_for: ConfigFor,
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    restarts: Arc<AtomicU64>,
    mut cmds: mpsc::Receiver<SlotCmd>,
) {
    let mut inc = 0u64;
    loop {
        let log = dir.join(format!("worker-{id}-{inc}.jsonl"));
        let cfg = config_for(id, inc, log);
        let mut child = match spawn(netns.as_deref(), &exe, &dir, &cfg, id, inc) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("torture: cannot start worker {id}: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        lock(&pids)[id] = child.id();
        let mut stdin = child.stdin.take();
        let mut stdout = child.stdout.take().map(|s| BufReader::new(s).lines());
        tokio::select! {
            status = child.wait() => {
                lock(&pids)[id] = None;
                if let Ok(s) = status {
                    // A worker asked to exit (`waiter_exit`) is restarted like a killed one.
                    if s.code().is_some_and(|c| c != crate::worker::EXIT_ON_REQUEST) {
                        eprintln!("torture: worker {id} incarnation {inc} exited with {s}; see its .stderr file");
                    }
                }
                restarts.fetch_add(1, Ordering::Relaxed);
                inc += 1;
                continue;
            }
            cmd = cmds.recv() => {
                let Some(SlotCmd::Stop(reply)) = cmd else {
                    let _ = child.kill().await;
                    return;
                };
                if let Some(pid) = child.id() {
                    // Never leave a paused worker behind.
                    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                }
                if let Some(s) = stdin.as_mut() {
                    let _ = s.write_all(b"stop\n").await;
                    let _ = s.flush().await;
                }
                if let Some(lines) = stdout.as_mut() {
                    let drained = async {
                        while let Ok(Some(l)) = lines.next_line().await {
                            if l.trim() == "drained" {
                                break;
                            }
                        }
                    };
                    if tokio::time::timeout(Duration::from_secs(120), drained).await.is_err() {
                        eprintln!("torture: worker {id} did not drain within 120 s");
                    }
                }
                let _ = reply.send(());
                if let Some(SlotCmd::Exit(done)) = cmds.recv().await {
                    if let Some(s) = stdin.as_mut() {
                        let _ = s.write_all(b"exit\n").await;
                        let _ = s.flush().await;
                    }
                    if tokio::time::timeout(Duration::from_secs(20), child.wait()).await.is_err() {
                        let _ = child.kill().await;
                    }
                    lock(&pids)[id] = None;
                    let _ = done.send(());
                } else {
                    let _ = child.kill().await;
                }
                return;
            }
        }
    }
}
