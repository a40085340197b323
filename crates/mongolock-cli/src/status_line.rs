//! What `exec` and `elect` show while they wait: a status line in a terminal, and a periodic
//! report when the database stops answering.
//!
//! # The status line
//! When stderr is a terminal (and neither `--quiet` nor `--json` on stderr), one line at the
//! bottom says what the wait is for and who holds the name: `mongolock: waiting for lock "x":
//! held by host (pid 12) app "..." (token 7) for 2m5s, expires in 12.3s; waited 35s`. It is
//! redrawn in place (`\r`, erase line) about once a second from a fresh read of the lock, kept
//! within the terminal's width (a wrapped line could not be redrawn), and erased when the wait
//! ends. Every other line mongolock writes on stderr (messages, diagnostics) goes through
//! [`write_stderr`], which erases the status line, writes the line and draws the status line
//! again below it, so that the two never mix. CMD does not run while the line is shown.
//!
//! # The database unreachable
//! While waiting, the same reads tell whether the database answers. When none has succeeded for
//! [`REPORT_AFTER`], an `unreachable` event is reported ("the database has not answered for
//! 30.0s ..."), again every [`REPORT_EVERY`] while it lasts, and a `reachable` event once a read
//! succeeds again; in a terminal the status line says so too. These reports are not
//! informational: `--quiet` keeps them (a wait that cannot progress is a problem). Outside a
//! terminal the lock is read only every [`PROBE_EVERY`] (every waiting process reads it), and
//! without the holders the status line would show.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::io::{IsTerminal, Write};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::Duration;

use mongolock::LockProvider;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::duration::human;
use crate::events::{self, Event};

/// How often the status line is refreshed from the database (in a terminal).
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// When the first read is made (a lock that is free is acquired before).
const FIRST_READ: Duration = Duration::from_millis(500);
/// How often the lock is read outside a terminal, only to notice that the database is gone:
/// rarely, so that hundreds of waiting processes add little load (a hundred add about 7 reads a
/// second).
const PROBE_EVERY: Duration = Duration::from_secs(15);
/// The longest a read may take before it counts as unanswered.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the database must have been silent before it is reported unreachable.
pub const REPORT_AFTER: Duration = Duration::from_secs(30);
/// How often an unreachable database is reported again while it lasts.
pub const REPORT_EVERY: Duration = Duration::from_secs(30);

/// Erases the terminal's current line.
const ERASE: &str = "\r\x1b[K";

/// The status line on the terminal: `line` is what is shown now (without [`ERASE`]); `active`
/// is false once the wait ended, so that a draw racing with the end shows nothing.
struct Shown {
    line: Option<String>,
    active: bool,
}

static SHOWN: Mutex<Shown> = Mutex::new(Shown {
    line: None,
    active: false,
});

fn shown() -> std::sync::MutexGuard<'static, Shown> {
    // A poisoned lock only means another thread panicked mid-write; keep going.
    SHOWN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes `bytes` (whole lines) on stderr with a single write; a status line on the terminal
/// is erased first and drawn again after them.
pub fn write_stderr(bytes: &[u8]) -> std::io::Result<()> {
    let shown = shown();
    let mut err = std::io::stderr().lock();
    match &shown.line {
        Some(line) => {
            let mut all = Vec::with_capacity(bytes.len() + line.len() + 2 * ERASE.len());
            all.extend_from_slice(ERASE.as_bytes());
            all.extend_from_slice(bytes);
            all.extend_from_slice(ERASE.as_bytes());
            all.extend_from_slice(line.as_bytes());
            err.write_all(&all)
        }
        None => err.write_all(bytes),
    }
}

/// stderr for the diagnostics (`tracing`), through [`write_stderr`].
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write_stderr(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn draw(text: String) {
    let mut shown = shown();
    if !shown.active {
        return;
    }
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{ERASE}{text}").as_bytes());
    shown.line = Some(text);
}

/// Erases the status line and stops drawing it.
fn stop() {
    let mut shown = shown();
    shown.active = false;
    if shown.line.take().is_some() {
        let _ = std::io::stderr().lock().write_all(ERASE.as_bytes());
    }
}

/// What is being waited for, for the status line and the reports.
pub struct Subject {
    /// The lock (role) name.
    pub name: String,
    /// `waiting for lock "x"`, `campaigning for leadership of "x"`.
    pub doing: String,
    /// How the holder is introduced: `held by`, `leader`.
    pub holder_is: &'static str,
}

/// A wait being shown: the status line (in a terminal) and the unreachable reports. Dropping it
/// erases the line and stops the reads.
pub struct Waiting {
    task: JoinHandle<()>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.task.abort();
        stop();
    }
}

/// Starts showing a wait for `subject`, reading the lock through `provider`.
pub fn start(provider: &LockProvider, subject: Subject) -> Waiting {
    let line = std::io::stderr().is_terminal() && !events::quiet() && events::messages_on_stderr();
    if line {
        shown().active = true;
    }
    let provider = provider.clone();
    Waiting {
        task: tokio::spawn(watch(provider, subject, line)),
    }
}

/// What a read of the lock found.
struct Seen {
    /// `held by host (pid 1) app "x" (token 7) for 2m5s, expires in 12.3s`, or `free`.
    holder: String,
}

/// Reads the lock (`detail`: and its other holders, for the status line).
async fn read(provider: &LockProvider, subject: &Subject, detail: bool) -> Result<Seen, String> {
    let info = match provider.inspect(&subject.name).await {
        Ok(Some(info)) if info.held && detail => info,
        Ok(Some(_)) if !detail => {
            return Ok(Seen {
                holder: String::new(),
            })
        }
        Ok(_) => {
            return Ok(Seen {
                holder: "free, acquiring".to_owned(),
            })
        }
        Err(e) => return Err(crate::exit::one_line(&e.to_string())),
    };
    // Slots and readers: how many hold the name besides the one shown.
    let others = provider
        .holders(&subject.name)
        .await
        .map_or(0, |h| h.len().saturating_sub(1));
    let who = info
        .holder
        .as_ref()
        .map_or_else(|| "another holder".to_owned(), |h| h.to_string());
    let token = info
        .fencing_token
        .map_or_else(String::new, |t| format!(" (token {t})"));
    let since = info
        .acquired_at
        .and_then(|at| info.observed_at.duration_since(at).ok())
        .map_or_else(String::new, |d| format!(" for {}", human(d)));
    let expires = info
        .expires_at
        .map(|at| {
            at.duration_since(info.observed_at)
                .unwrap_or(Duration::ZERO)
        })
        .map_or_else(String::new, |d| format!(", expires in {}", human(d)));
    let more = match others {
        0 => String::new(),
        1 => " and 1 other holder".to_owned(),
        n => format!(" and {n} other holders"),
    };
    Ok(Seen {
        holder: format!("{} {who}{token}{since}{expires}{more}", subject.holder_is),
    })
}

async fn watch(provider: LockProvider, subject: Subject, line: bool) {
    let started = Instant::now();
    let every = if line { REFRESH_EVERY } else { PROBE_EVERY };
    // Since when no read has succeeded, and when to report that next.
    let mut silent: Option<(Instant, Instant)> = None;
    let mut reported = false;
    // A free lock is taken at once: no line flashes up for it.
    tokio::time::sleep(FIRST_READ.min(every)).await;
    loop {
        let asked = Instant::now();
        let seen = match tokio::time::timeout(PROBE_TIMEOUT, read(&provider, &subject, line)).await
        {
            Ok(seen) => seen,
            Err(_) => Err(format!("no answer within {}", human(PROBE_TIMEOUT))),
        };
        let waited = human(started.elapsed());
        match seen {
            Ok(seen) => {
                if let Some((since, _)) = silent.take() {
                    if reported {
                        reachable(&subject, since.elapsed());
                    }
                    reported = false;
                }
                if line {
                    draw(fit(&format!(
                        "mongolock: {}: {}; waited {waited}",
                        subject.doing, seen.holder
                    )));
                }
            }
            Err(error) => {
                let now = Instant::now();
                let (since, next) = silent.get_or_insert((asked, asked + REPORT_AFTER));
                let for_how_long = now.duration_since(*since);
                if now >= *next {
                    unreachable(&subject, for_how_long, &error);
                    reported = true;
                    *next = now + REPORT_EVERY;
                }
                if line {
                    draw(fit(&format!(
                        "mongolock: {}: the database has not answered for {} ({error}); still \
                         trying; waited {waited}",
                        subject.doing,
                        human(for_how_long)
                    )));
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

fn unreachable(subject: &Subject, for_how_long: Duration, error: &str) {
    Event::new("unreachable")
        .name(&subject.name)
        .field("unreachable_ms", millis(for_how_long))
        .field("error", error)
        .message(format!(
            "mongolock: still {}: the database has not answered for {} (last error: {error}); \
             still trying",
            subject.doing,
            human(for_how_long)
        ))
        .emit();
}

fn reachable(subject: &Subject, after: Duration) {
    Event::new("reachable")
        .name(&subject.name)
        .field("unreachable_ms", millis(after))
        .message(format!(
            "mongolock: the database answers again (it had not answered for {}); still {}",
            human(after),
            subject.doing
        ))
        .emit();
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `text` with control characters escaped, cut to the terminal's width.
fn fit(text: &str) -> String {
    let width = columns().saturating_sub(1).max(20);
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let piece: String = if c.is_control() {
            c.escape_debug().collect()
        } else {
            c.to_string()
        };
        let len = piece.chars().count();
        if used + len > width {
            out.push('…');
            return out;
        }
        out.push_str(&piece);
        used += len;
    }
    out
}

/// The terminal's width (80 when it cannot be told).
fn columns() -> usize {
    // SAFETY: TIOCGWINSZ writes a winsize into the struct we pass; stderr is open.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::ioctl(
            std::io::stderr().as_raw_fd(),
            libc::TIOCGWINSZ,
            &mut size as *mut libc::winsize,
        )
    };
    if r == 0 && size.ws_col > 0 {
        usize::from(size.ws_col)
    } else {
        80
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_escaped_and_fits_the_terminal() {
        let long = format!("a{}", "b".repeat(300));
        let fitted = fit(&long);
        assert!(fitted.chars().count() <= columns(), "{fitted}");
        assert!(fitted.ends_with('…'));
        assert_eq!(fit("evil\x1b[31m"), "evil\\u{1b}[31m");
    }
}
