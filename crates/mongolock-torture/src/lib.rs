//! # mongolock-torture
//!
//! A torture test of mongolock: worker processes (this program re-executed) lock a mix of hot,
//! cold and expiring names through the public API only, make fenced writes to a resource, and
//! log what they did, while faults are injected at random. An independent checker reads the
//! history of the lock and resource storage, the workers' logs and the final state, and reports
//! every violation of the contract.
//!
//! Backends (`--backend`):
//!
//! * `mongo` (default): the embedded test server or `--uri`; the history comes from the lock,
//!   jobs and resource collections' change streams; faults: `failCommand` fail points, SIGKILL,
//!   SIGSTOP, dropped futures, shortened extensions dropped while the server is slowed, an
//!   operator's 0-second TTL index, network partitions ([`netns`], as root), and with
//!   `--cli-faults` SIGKILL / SIGSTOP of `mongolock exec`, stops of its whole process group and
//!   commands with `setsid` descendants.
//! * `postgres`: a cluster the run starts (`initdb` / `pg_ctl` in a temporary directory, as the
//!   `postgres` user when root: `mongolock::testing::postgres_server`, shared with the library's
//!   tests) or `--postgres-url` / `POSTGRES_URL`, in a schema of the run's own. The history comes
//!   from the harness's own triggers on the lock and resource tables (see [`postgres`]); faults:
//!   SIGKILL, SIGSTOP, dropped futures, `pg_terminate_backend` of the workers' listening and
//!   pooled connections, shortened extensions (the row held `FOR UPDATE`), and the CLI faults (`mongolock --uri postgres://... exec`). Two workers
//!   run the idle-row cleanup every `--ttl-monitor` with `cleanup_after` `--cleanup-after-secs`,
//!   so rows are deleted and re-created under load. Release and grant times are both taken after
//!   the row lock, so the checker also counts a grant stamped before the preceding release as an
//!   overlap ([`checker::Checker::strict_release_order`]).
//! * `memory`: one process, many tasks, dropped futures only.
//!
//! Semaphores (MongoDB and PostgreSQL; not the memory backend, which has no independent
//! history): about 12% of a worker's operations take one slot of `sem-0..2`
//! (limit 3) through `acquire` / `try_acquire` / `acquire_timeout`, under the
//! same faults, and end it by release, a dropped release, a dropped guard or (2%, not
//! extended) running out; no fenced writes. Each write of those names goes to
//! [`history::SlotHistory`], which compares the slots it left with the ones before: on MongoDB
//! the recorder sends the documents' change events (a release marks the released slot's id);
//! on PostgreSQL the history trigger records each row's `slot_limit` and `slots` too, and the
//! released slot is inferred from the write ([`history::SlotRelease::Inferred`]: the row keeps
//! no mark). The checker verifies that no more than `limit` slots of a name are live at any
//! grant and that slot tokens only grow per name, and a slot still live after the end is
//! `held_after_end`. The summary counts slots granted, released, expired and the most live at
//! once; the workers' logged grants include slot grants. Slot grants are not counted in
//! `acquisitions` (nor towards `--acquisitions`), and the checker's worker-log rules
//! (`false_release`, the fenced-write rules) do not apply to slots, which take no fenced
//! writes.
//!
//! Liveness (contract item 13, "a free name reaches a live waiter fast"; MongoDB and
//! PostgreSQL): two loops of each worker wait for the liveness names `live-0..` (`--live-names`,
//! leased for `--live-lease`, 5 s: long, so that a waiter left to sleep until the holder's
//! expiry shows; always with wake-ups on; on MongoDB over a client of their own that no fail
//! point reaches) in rounds (`--live-round`, 4 s of the wall clock, which every worker shares):
//! at a round's start the loops queue up on one name — those that will give up first
//! (`acquire_timeout` running out, `acquire` futures dropped while waiting), the waits until
//! granted after them — hold it briefly or for up to a second, and then no newcomer comes, so
//! that a name freed later in the round reaches a waiter only through the handoff (designation,
//! backup, probe, expiry). Each wait is logged (`Wait` before the call, `WaitEnd` after it: got
//! it, timed out, dropped, failed, stopped by the run's end, shut down). With the CLI check,
//! three loops run `mongolock exec --json-fd 1` on `live-cli` (a collection of its own on
//! MongoDB, followed by the recorder; the workers' table on PostgreSQL), some with `--wait`, and
//! `exec_sigint` sends SIGINT (or SIGKILL) to one that waits. `waiter_exit` (SIGUSR1) makes a
//! worker exit with its waits in progress, at once or after ending them and flushing their
//! withdrawals; half the SIGKILLs and SIGSTOPs, and every `waiter_exit`, go to a worker that
//! waits (it marks itself with a file `waiting-<pid>` in the run directory); partitions hit
//! waiting workers too, and the injector records every signal and cut with its times
//! (`timeline.jsonl`). [`liveness`] measures, for every stretch of server time in which a
//! liveness name was free while a live waiter waited (its process neither stopped, cut off,
//! killed nor gone, its wait not over), how long it stayed free; the summary's `liveness[...]`
//! gives p50/p99/max per cause (`release`, split by dead or stopped and by gave-up waiters that
//! may have been queued ahead; `expiry`; `unheld`), and a stretch above the bound — the
//! library's 500 ms handoff fallback plus `--liveness-slack` (1 s) after a release, its 5 ms
//! expiry margin plus the slack after an expiry, plus 2 ms of clock tolerance — is a `liveness`
//! violation. The waits are timed with the workers' clock and the stretches with the server's:
//! the run's servers are on the same host (same clock); against `--uri` / `--postgres-url` the
//! figures are reported but not enforced. `faults[...]` / `fired[...]` count the waiters'
//! nemeses: `waiter_timeout` and `waiter_dropped` (taken effect: while the name was held, so the
//! waiter left a queue), `waiter_sigkill` and `waiter_sigstop` (of a process that was waiting),
//! `waiter_exit` (with a wait in progress), `exec_sigint` (mongolock reported the wait
//! interrupted).
//!
//! `--faults` takes the kinds of the chosen backend ([`faults::FaultKind::of_backend`]); a kind
//! of another backend is refused with an error listing the applicable ones.
//!
//! ```text
//! cargo build -p mongolock-cli    # for the `mongolock exec` check (else it is skipped)
//! cargo run -p mongolock-torture -- --workers 8 --duration 120s --cli-faults
//! cargo run -p mongolock-torture -- --backend postgres --workers 8 --duration 120s --cli-faults
//! ```
//!
//! * `options.rs`: command-line options; `run.rs`: the orchestrator; `store.rs`: the database
//!   of a run (server, storage, recorder) per backend;
//! * `supervisor.rs`: worker processes; `worker.rs`: what a worker does; `worklog.rs`: its log;
//! * `faults.rs`: fault injection; `netns.rs`: the network namespaces of the partitions; `resource.rs`: the fenced resource (MongoDB, memory);
//! * `recorder.rs` + `history.rs`: the independent history (MongoDB change streams; the grant
//!   and slot reconstructions are shared with PostgreSQL); `postgres.rs`: the PostgreSQL history triggers,
//!   resource table and connection faults; `checker.rs`: the rules;
//! * `liveness.rs`: the liveness check (free stretches against the logged waits);
//! * `cli_check.rs`: `mongolock exec` overlap check and liveness loops; `summary.rs`: the
//!   summary line.
#![allow(missing_docs)] // the harness program's own modules (publish = false): no API for others

pub mod checker;
pub mod cli_check;
pub mod config;
pub mod faults;
pub mod history;
pub mod liveness;
pub mod netns;
pub mod options;
pub mod postgres;
pub mod recorder;
pub mod resource;
pub mod run;
pub mod store;
pub mod summary;
pub mod supervisor;
pub mod worker;
pub mod worklog;
