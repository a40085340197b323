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

/// Time on `CLOCK_BOOTTIME` (Linux): monotonic, and counting time spent suspended.
#[cfg(target_os = "linux")]
pub(crate) fn boot_now() -> Duration {
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
pub(crate) fn boot_now() -> Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
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
}
