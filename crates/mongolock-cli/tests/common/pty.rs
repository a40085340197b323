//! A pseudo-terminal for the tests that need mongolock (or a job-control shell) on a terminal.
#![allow(unsafe_code)] // libc calls; each unsafe block says why it is sound

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::{text, BIN};

/// A pseudo-terminal whose output is collected by a thread.
pub struct Pty {
    pub master: OwnedFd,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    /// Runs `sh -m -c SCRIPT` (a job-control shell) as the session leader of a new
    /// pseudo-terminal, with `D` and `MONGOLOCK` (the binary) in its environment.
    pub fn shell(dir: &Path, script: &str) -> (Pty, std::process::Child) {
        let (mut master, mut slave) = (-1, -1);
        // A terminal wide enough for a status line with a host, pid and app name.
        let size = libc::winsize {
            ws_row: 50,
            ws_col: 200,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: openpty writes two descriptors; the null pointers ask for defaults.
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors are new and ours.
        let (master, slave) =
            unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        // SAFETY: fcntl on our open descriptor.
        unsafe { libc::fcntl(master.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        let stdio = |fd: &OwnedFd| std::process::Stdio::from(fd.try_clone().expect("dup"));
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-m", "-c", script])
            .env("D", dir)
            .env("MONGOLOCK", BIN)
            .env_remove("MONGODB_URI")
            .env_remove("MONGOLOCK_TTL")
            .env_remove("MONGOLOCK_GRACE")
            .env_remove("MONGOLOCK_WAIT")
            .env_remove("MONGOLOCK_QUIET")
            .stdin(stdio(&slave))
            .stdout(stdio(&slave))
            .stderr(stdio(&slave));
        // SAFETY: setsid and ioctl are async-signal-safe; fd 0 is the terminal's slave side.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn the shell in a terminal");
        drop(slave);
        let output = Arc::new(Mutex::new(Vec::new()));
        let reader = master.try_clone().expect("dup");
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut file = std::fs::File::from(reader);
            let mut buf = [0u8; 4096];
            loop {
                match std::io::Read::read(&mut file, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => sink.lock().expect("output").extend_from_slice(&buf[..n]),
                }
            }
        });
        (Pty { master, output }, child)
    }

    /// Types `bytes` (e.g. `\x1a`, Ctrl-Z).
    pub fn type_in(&self, bytes: &[u8]) {
        // SAFETY: writing from a valid buffer to our open descriptor.
        let n = unsafe { libc::write(self.master.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(n, bytes.len() as isize);
    }

    pub fn output(&self) -> String {
        text(&self.output.lock().expect("output"))
    }
}
