//! A program on a pseudo-terminal, driven like a person at a keyboard: `send` keys, `expect`
//! text (bounded waits). Ctrl-C (`\x03`) reaches the program as SIGINT, as in a real terminal.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Pty {
    master: std::fs::File,
    out: Arc<Mutex<Vec<u8>>>,
    pub child: Child,
}

impl Pty {
    pub fn spawn(cmd: &mut Command) -> Pty {
        use std::os::unix::process::CommandExt;
        let (mut master, mut slave) = (-1, -1);
        let ws = libc::winsize { ws_row: 40, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: openpty fills two fds; the other pointers may be null / point to a winsize.
        let r = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &ws) };
        assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both fds were just opened and are owned here.
        let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave.try_clone().unwrap()));
        // SAFETY: setsid and ioctl are async-signal-safe; fd 0 is the pty's slave side.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                libc::ioctl(0, libc::TIOCSCTTY, 0);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn on a pty");
        drop(slave);
        let master = std::fs::File::from(master);
        let mut reader = master.try_clone().unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        let out2 = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out2.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty { master, out, child }
    }

    /// Types `s`.
    pub fn send(&mut self, s: &str) {
        self.master.write_all(s.as_bytes()).unwrap();
        self.master.flush().unwrap();
    }

    /// Everything the program printed so far (lossy UTF-8).
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Bytes printed so far (an offset for `expect`).
    pub fn len(&self) -> usize {
        self.out.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until `needle` appears after byte `from`; returns the offset just past it.
    pub fn expect(&self, needle: &str, from: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let out = self.out.lock().unwrap();
                let hay = &out[from.min(out.len())..];
                if let Some(i) = hay.windows(needle.len()).position(|w| w == needle.as_bytes()) {
                    return from + i + needle.len();
                }
            }
            if Instant::now() > deadline {
                panic!("{needle:?} did not appear within {timeout:?}; output:\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the program to exit.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        crate::wait_child(&mut self.child, timeout)
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
