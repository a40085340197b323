//! The local clocks a guard uses to stop trusting a lease early.
//!
//! A lease's local deadline is kept on two clocks, and the lease counts as lost when either has
//! passed it:
//! * the monotonic clock (`tokio::time::Instant`), which drives every timer;
//! * on Linux, `CLOCK_BOOTTIME`, which also counts the time the machine was suspended. The
//!   monotonic clock stops during a suspend (a laptop's sleep, some VM pauses) while the
//!   server's clock goes on, so after a resume the monotonic deadline alone would trust the
//!   lease too long; the boot-time deadline has passed by then. Elsewhere the second clock is
//!   the monotonic one again.
//!
//! # Sleeping until a deadline
//! Tokio's timers run on the monotonic clock: a timer set for a lease's deadline would, after
//! a suspend, fire as late as the suspend was long. Every wait that ends at a lease deadline
//! (a guard's lost signal, its watchdog, a manual extension's race against the deadline, and
//! through the lost signal the election's run loop) therefore sleeps with
//! [`sleep_until_deadline`], in slices of at most [`BOOT_CHECK_SLICE`] (250 ms) of monotonic
//! time, re-reading the boot clock after each. After a resume it returns within one slice of
//! the process running again (plus scheduling delay) once the boot-time deadline has passed,
//! instead of at the monotonic deadline. The cost is one timer wake-up per slice per waiting
//! sleeper, and only while more than a slice is left on the boot clock.
//!
//! # A test-only offset
//! Suspends cannot be made in a test. [`boot_now`] adds an offset that only tests set:
//! * in-process, with the `testing` feature, `mongolock::testing::advance_boot_clock`;
//! * across processes, when the environment variable `MONGOLOCK_TEST_BOOT_OFFSET_FILE` is set
//!   (read once per process): the number of milliseconds written in that file, re-read on each
//!   call (a missing, empty or unparseable file counts as 0). The CLI's supervisor reads the same
//!   variable with the same meaning.
//!
//! Both are zero unless a test sets them; without the variable, the file is never read.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::time::Duration;

use tokio::time::Instant;

/// The instant a request was sent, on both clocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stamp {
    pub mono: Instant,
    pub boot: Duration,
}

impl Stamp {
    pub fn now() -> Self {
        Stamp {
            mono: Instant::now(),
            boot: boot_now(),
        }
    }
}

/// Time on `CLOCK_BOOTTIME` (Linux): monotonic, and counting time spent suspended; plus the
/// test-only offset (see the module docs).
pub(crate) fn boot_now() -> Duration {
    raw_boot_now() + test_offset()
}

/// Time on `CLOCK_BOOTTIME` without the test offset.
#[cfg(target_os = "linux")]
fn raw_boot_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec. CLOCK_BOOTTIME exists since Linux 2.6.39;
    // should the call fail, the zeroed value makes the boot-time check never fire and the
    // monotonic deadline alone applies.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Without `CLOCK_BOOTTIME`: the monotonic clock, measured from a fixed origin.
#[cfg(not(target_os = "linux"))]
fn raw_boot_now() -> Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

/// The environment variable naming a file that holds a boot-clock offset in milliseconds
/// (tests only; see the module docs).
pub(crate) const BOOT_OFFSET_FILE_VAR: &str = "MONGOLOCK_TEST_BOOT_OFFSET_FILE";

/// The in-process offset, in milliseconds (feature `testing`).
#[cfg(feature = "testing")]
static IN_PROCESS_OFFSET_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Moves the boot clock forward by `by`, as a suspend of that length would (tests only).
#[cfg(feature = "testing")]
pub(crate) fn advance_boot_clock(by: Duration) {
    let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
    IN_PROCESS_OFFSET_MS.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
}

/// The test-only offset: the in-process one plus the one in `MONGOLOCK_TEST_BOOT_OFFSET_FILE`.
fn test_offset() -> Duration {
    static FILE: std::sync::OnceLock<Option<std::ffi::OsString>> = std::sync::OnceLock::new();
    #[cfg(feature = "testing")]
    let ms = IN_PROCESS_OFFSET_MS.load(std::sync::atomic::Ordering::SeqCst);
    #[cfg(not(feature = "testing"))]
    let ms: u64 = 0;
    if let Some(path) = FILE.get_or_init(|| std::env::var_os(BOOT_OFFSET_FILE_VAR)) {
        return Duration::from_millis(ms.saturating_add(offset_in_file(path.as_ref())));
    }
    Duration::from_millis(ms)
}

/// The milliseconds written in `path` (surrounding whitespace ignored); 0 when the file is
/// missing, empty or holds anything else.
fn offset_in_file(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// The longest monotonic sleep [`sleep_until_deadline`] takes before re-reading the boot clock.
pub(crate) const BOOT_CHECK_SLICE: Duration = Duration::from_millis(250);

/// Sleeps until `mono` on the monotonic clock or `boot` on the boot clock, whichever comes
/// first. The monotonic part is exact (a Tokio timer); the boot part is checked at least every
/// [`BOOT_CHECK_SLICE`] of monotonic time, so after a suspend (when the boot clock jumped ahead)
/// it returns within one slice of running again. Cancel-safe: it only sleeps.
pub(crate) async fn sleep_until_deadline(mono: Instant, boot: Duration) {
    loop {
        let now = Instant::now();
        let now_boot = boot_now();
        if now >= mono || now_boot >= boot {
            return;
        }
        let wake = mono.min(now + (boot - now_boot).min(BOOT_CHECK_SLICE));
        tokio::time::sleep_until(wake).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_advances_with_the_monotonic_clock() {
        let a = Stamp::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = Stamp::now();
        assert!(b.boot >= a.boot + Duration::from_millis(19), "{a:?} {b:?}");
        assert!(b.mono >= a.mono + Duration::from_millis(19));
    }

    #[test]
    fn the_offset_file_holds_milliseconds_or_counts_as_zero() {
        let dir =
            std::env::temp_dir().join(format!("mongolock-boot-offset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("offset");
        assert_eq!(offset_in_file(&file), 0, "missing file");
        for (text, ms) in [
            ("", 0),
            ("1500", 1500),
            ("  2500\n", 2500),
            ("1.5", 0),
            ("-3", 0),
            ("abc", 0),
        ] {
            std::fs::write(&file, text).unwrap();
            assert_eq!(offset_in_file(&file), ms, "file holding {text:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_deadline_sleep_ends_at_the_monotonic_deadline() {
        let start = Instant::now();
        let far = boot_now() + Duration::from_secs(3600);
        sleep_until_deadline(start + Duration::from_millis(30), far).await;
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    #[tokio::test]
    async fn a_deadline_sleep_ends_at_the_boot_deadline() {
        let start = Instant::now();
        let far = start + Duration::from_secs(3600);
        sleep_until_deadline(far, boot_now() + Duration::from_millis(30)).await;
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(25), "{took:?}");
        assert!(took < Duration::from_secs(60), "{took:?}");
    }
}
