//! The termination signals mongolock catches while it holds or waits for a lock: SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT. Once installed, they no longer kill mongolock; the caller
//! decides (abandon the wait, or pass the signal on to the command).

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::exit::CliError;

/// Caught termination signals.
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
}

impl Signals {
    /// Installs the handlers (needs the Tokio runtime).
    pub fn install() -> Result<Self, CliError> {
        let make = |kind: SignalKind| {
            signal(kind)
                .map_err(|e| CliError::failure(format!("cannot install a signal handler: {e}")))
        };
        Ok(Signals {
            int: make(SignalKind::interrupt())?,
            term: make(SignalKind::terminate())?,
            hup: make(SignalKind::hangup())?,
            quit: make(SignalKind::quit())?,
        })
    }

    /// Waits for the next signal and returns its number. Cancel-safe.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
        }
    }
}

/// The signal's conventional name, for messages.
pub fn name(signo: i32) -> String {
    match signo {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGKILL => "SIGKILL".into(),
        n => format!("signal {n}"),
    }
}
