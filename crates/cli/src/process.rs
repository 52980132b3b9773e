//! Finding, starting and stopping a lemonade server process.
//!
//! `lemonade serve` writes `<cache>/run/lemonade-<port>.pid` (`<pid>\n<port>\n`) for each port
//! it listens on and removes it when it exits; `status`, `stop` and `run` find the server
//! through it. A stale file (dead PID, or a PID now used by another program) is ignored and
//! removed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub fn pid_file(cache_dir: &Path, port: u16) -> PathBuf {
    cache_dir.join("run").join(format!("lemonade-{port}.pid"))
}

/// Writes the PID file atomically.
pub fn write_pid_file(cache_dir: &Path, port: u16) -> Result<PathBuf> {
    let path = pid_file(cache_dir, port);
    host::files::write_atomic(&path, format!("{}\n{port}\n", std::process::id()).as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The live lemonade process recorded for `port`, if any (a stale file is removed).
pub fn server_pid(cache_dir: &Path, port: u16) -> Option<u32> {
    let path = pid_file(cache_dir, port);
    let text = std::fs::read_to_string(&path).ok()?;
    let pid: u32 = text.lines().next()?.trim().parse().ok()?;
    if is_lemonade(pid) {
        Some(pid)
    } else {
        let _ = std::fs::remove_file(&path);
        None
    }
}

/// The process exists, is not a zombie, and runs a lemonade binary (guards against PID reuse).
fn is_lemonade(pid: u32) -> bool {
    let Some(stat) = proc_stat(pid) else { return false };
    if stat.state == 'Z' {
        return false;
    }
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let argv0 = c.split(|b| *b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(argv0).contains("lemonade")
        })
        .unwrap_or(false)
}

struct Stat {
    state: char,
    ppid: u32,
    start: u64,
}

fn proc_stat(pid: u32) -> Option<Stat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat { state: f.first()?.chars().next()?, ppid: f.get(1)?.parse().ok()?, start: f.get(19)?.parse().ok()? })
}

/// Every descendant of `pid` with its start time (so a reused PID is never signalled).
fn descendants(pid: u32) -> Vec<(u32, u64)> {
    let mut all = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return all };
    let procs: Vec<(u32, Stat)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| Some((p, proc_stat(p)?)))
        .collect();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (p, st) in &procs {
            if st.ppid == parent && !all.iter().any(|(q, _)| q == p) {
                all.push((*p, st.start));
                frontier.push(*p);
            }
        }
    }
    all
}

fn alive_as(pid: u32, start: u64) -> bool {
    proc_stat(pid).is_some_and(|s| s.start == start && s.state != 'Z')
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: a plain kill(2); the PID was checked to be the process we mean just before.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Stops the server `pid` and every process it started: SIGTERM, up to `grace` for a clean
/// exit, then SIGKILL for the server (a wedged or stopped one included) and each descendant
/// still alive. Returns how many processes had to be killed.
pub fn stop(pid: u32, grace: Duration) -> Result<usize> {
    let server_start = proc_stat(pid).map(|s| s.start).context("the server exited already")?;
    let family = descendants(pid);
    signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    let all_gone = || !alive_as(pid, server_start) && family.iter().all(|(p, s)| !alive_as(*p, *s));
    while Instant::now() < deadline && !all_gone() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut killed = 0;
    if alive_as(pid, server_start) {
        signal(pid, libc::SIGKILL);
        killed += 1;
    }
    for (p, s) in &family {
        if alive_as(*p, *s) {
            signal(*p, libc::SIGKILL);
            killed += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && !all_gone() {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !all_gone() {
        bail!("some processes of the server (pid {pid}) are still alive after SIGKILL");
    }
    Ok(killed)
}

/// A server this command started (for `run` and the temporary server of client commands).
pub struct Spawned {
    pub child: Child,
    pub log: PathBuf,
}

impl Spawned {
    /// Stops the server and its backends (bounded: SIGKILL after 15 s).
    pub fn stop(mut self) {
        let pid = self.child.id();
        if let Ok(None) = self.child.try_wait() {
            let _ = stop(pid, Duration::from_secs(15));
        }
        let _ = self.child.wait();
    }
}

/// Starts `lemonade serve` in the background (its own session, so the terminal's Ctrl-C does
/// not reach it; SIGTERM when this process dies), logging to `<cache>/logs/lemonade-<port>.log`,
/// and waits until `ready` answers true or the process exits.
pub async fn spawn_server<F: std::future::Future<Output = bool>>(
    cache_dir: &Path,
    port: u16,
    args: Vec<OsString>,
    api_key: Option<&str>,
    ready: impl Fn() -> F,
) -> Result<Spawned> {
    use std::os::unix::process::CommandExt;
    let logs = cache_dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let log = logs.join(format!("lemonade-{port}.log"));
    let out = std::fs::File::create(&log).with_context(|| format!("cannot write {}", log.display()))?;
    let exe = std::env::current_exe().context("cannot find the lemonade executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve").args(args).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    if let Some(key) = api_key {
        // Through the environment, never on a command line other users can read.
        cmd.env("LEMONADE_API_KEY", key);
    }
    // SAFETY: setsid and prctl are async-signal-safe and touch no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            // The server lives as long as this command: if it dies (closed terminal, kill),
            // the server gets SIGTERM and shuts down with its backends.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start lemonade serve")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect();
            bail!("lemonade serve exited ({status}):\n{}", tail.join("\n"));
        }
        if ready().await {
            return Ok(Spawned { child, log });
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("lemonade serve did not answer within 60 s (log: {})", log.display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_reads_this_process() {
        let me = proc_stat(std::process::id()).unwrap();
        assert!(me.state == 'R' || me.state == 'S');
        assert!(me.start > 0);
        assert!(!is_lemonade(u32::MAX - 1));
    }

    #[test]
    fn stale_pid_files_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let p = pid_file(tmp.path(), 1234);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        // PID 1 exists but is not lemonade.
        std::fs::write(&p, "1\n1234\n").unwrap();
        assert_eq!(server_pid(tmp.path(), 1234), None);
        assert!(!p.exists());
    }
}
