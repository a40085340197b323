//! # mongolock-torture
//!
//! A torture test of mongolock: worker processes (this program re-executed) lock a mix of hot,
//! cold and expiring names through the public API only, make fenced writes to a resource
//! collection, and log what they did, while faults are injected at random (fail points, SIGKILL,
//! SIGSTOP, dropped futures). An independent checker reads the lock and resource collections'
//! change streams, the workers' logs and the final state, and reports every violation of the
//! contract.
//!
//! * `options.rs`: command-line options; `run.rs`: the orchestrator;
//! * `supervisor.rs`: worker processes; `worker.rs`: what a worker does; `worklog.rs`: its log;
//! * `faults.rs`: fault injection; `resource.rs`: the fenced resource;
//! * `recorder.rs` + `history.rs`: the independent history; `checker.rs`: the rules;
//! * `cli_check.rs`: `mongolock exec` overlap check; `summary.rs`: the summary line.

pub mod checker;
pub mod cli_check;
pub mod config;
pub mod faults;
pub mod history;
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
