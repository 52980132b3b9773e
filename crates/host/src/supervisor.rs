//! Runs one backend process and knows at every moment whether it is alive.
//!
//! * The child gets its own process group and, on Linux, a parent-death signal (SIGKILL), so
//!   it dies with the server even when the server is SIGKILLed; `kill_on_drop` covers the rest.
//! * Its stdout/stderr go line by line into `tracing` (target `backend`, with the model name);
//!   the last lines are kept for error messages.
//! * The endpoint cannot race: the child binds port 0 itself and we read the real port from
//!   its `listening on http://HOST:PORT` line, which llama-server prints once the model is
//!   loaded. A `/health` probe at a short interval then confirms readiness.
//! * A task waits on the child, so its exit is noticed at once ([`Backend::wait_exit`]).
//! * Stop: SIGTERM to the group, then SIGKILL after a grace period.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::{oneshot, watch};

pub use backends::SpawnSpec;

/// Lines kept for error messages.
const LOG_TAIL: usize = 40;
/// Health probe interval while waiting for readiness.
const PROBE_INTERVAL: Duration = Duration::from_millis(10);

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit code {c}"),
            (None, Some(s)) => write!(f, "killed by signal {s}"),
            _ => write!(f, "unknown exit status"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("{label} backend exited ({exit}) before it was ready. Last log lines:\n{tail}")]
    Exited { label: String, exit: ExitInfo, tail: String },
    #[error("{label} backend was not ready after {secs} s. Last log lines:\n{tail}")]
    Timeout { label: String, secs: u64, tail: String },
    #[error("{label} backend was not started: {message}")]
    Sandbox { label: String, message: String },
}

/// A running backend process. Cheap to clone.
#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

struct Inner {
    label: String,
    pid: u32,
    port: std::sync::OnceLock<u16>,
    port_rx: Mutex<Option<oneshot::Receiver<u16>>>,
    health_path: String,
    ready_timeout: Duration,
    exit: watch::Receiver<Option<ExitInfo>>,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Number of output pipes that reached EOF (2 when all output has been read).
    pipes_closed: watch::Receiver<usize>,
    /// The confinement it runs under (None: none was asked).
    sandbox: Option<api_types::SandboxStatus>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("label", &self.inner.label)
            .field("pid", &self.inner.pid)
            .field("port", &self.inner.port)
            .finish()
    }
}

impl Backend {
    /// Starts the process and returns once it answers its health endpoint with 200.
    pub async fn start(spec: SpawnSpec, http: &reqwest::Client) -> Result<Backend, StartError> {
        let b = Backend::spawn(spec)?;
        b.ready(http).await?;
        Ok(b)
    }

    /// Starts the process and returns at once; [`Backend::ready`] waits for readiness. Between
    /// the two, [`Backend::stop`] cancels the start.
    pub fn spawn(spec: SpawnSpec) -> Result<Backend, StartError> {
        let mut cmd = Command::new(&spec.program);
        backend_env(cmd.as_std_mut());
        // Its scratch folder is its TMPDIR (the one it may write); set before the launch's own.
        if let Some(dir) = spec.sandbox.as_ref().and_then(|(_, p)| p.scratch.as_ref()) {
            cmd.env("TMPDIR", dir);
        }
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // The parent's pid, read before the fork: the child checks it still has that parent.
        // (Not "the parent is not 1": in a container without an init, lemonade *is* pid 1.)
        let parent = std::process::id() as libc::pid_t;
        let mut confined = match &spec.sandbox {
            Some((mode, policy)) => Some(
                crate::sandbox::prepare(*mode, policy)
                    .map_err(|e| StartError::Sandbox { label: spec.label.clone(), message: e.to_string() })?,
            ),
            None => None,
        };
        let sandbox = confined.as_ref().map(|c| c.status.clone());
        // SAFETY: only async-signal-safe libc calls between fork and exec (the sandbox's are two
        // system calls, no allocation).
        unsafe {
            cmd.pre_exec(move || {
                libc::setpgid(0, 0);
                #[cfg(target_os = "linux")]
                {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    // The parent may have died before prctl took effect.
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                }
                if let Some(c) = confined.as_mut() {
                    c.enforce()?;
                }
                Ok(())
            });
        }
        let mut child =
            cmd.spawn().map_err(|e| StartError::Spawn { program: spec.program.display().to_string(), source: e })?;
        let pid = child.id().unwrap_or(0);
        tracing::info!(model = %spec.label, pid, program = %spec.program.display(), args = ?spec.args, "backend started");

        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(LOG_TAIL)));
        let (port_tx, port_rx) = oneshot::channel();
        let port_tx = Arc::new(Mutex::new(Some(port_tx)));
        let (closed_tx, closed_rx) = watch::channel(0usize);
        let closed_tx = Arc::new(closed_tx);
        for pipe in [
            child.stdout.take().map(|p| Box::new(p) as Box<dyn AsyncRead + Send + Unpin>),
            child.stderr.take().map(|p| Box::new(p) as _),
        ] {
            let (label, tail, port_tx, closed) = (spec.label.clone(), tail.clone(), port_tx.clone(), closed_tx.clone());
            tokio::spawn(async move {
                if let Some(p) = pipe {
                    pump(p, label, tail, port_tx).await;
                }
                closed.send_modify(|n| *n += 1);
            });
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        let label = spec.label.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let info = match status {
                Ok(s) => {
                    use std::os::unix::process::ExitStatusExt;
                    ExitInfo { code: s.code(), signal: s.signal() }
                }
                Err(_) => ExitInfo { code: None, signal: None },
            };
            tracing::info!(model = %label, pid, status = %info, "backend exited");
            let _ = exit_tx.send(Some(info));
        });

        Ok(Backend {
            inner: Arc::new(Inner {
                label: spec.label,
                pid,
                port: spec.port.map(std::sync::OnceLock::from).unwrap_or_default(),
                port_rx: Mutex::new(spec.port.is_none().then_some(port_rx)),
                health_path: spec.health_path,
                ready_timeout: spec.ready_timeout,
                exit: exit_rx,
                tail,
                pipes_closed: closed_rx,
                sandbox,
            }),
        })
    }

    /// Waits until the process reports its port and answers its health endpoint with 200.
    /// Fails at once if the process exits; stops it if it is not ready in time.
    pub async fn ready(&self, http: &reqwest::Client) -> Result<(), StartError> {
        let backend = self;
        let port_rx = backend.inner.port_rx.lock().take();
        let deadline = tokio::time::Instant::now() + backend.inner.ready_timeout;
        let port = match port_rx {
            Some(rx) => backend.until_exit_or(deadline, async { rx.await.ok() }).await?,
            None => backend.inner.port.get().copied(),
        };
        let Some(port) = port else {
            // Both pipes closed without a port line: the process is ending.
            let exit = backend.wait_exit().await;
            return Err(backend.exited_error(exit));
        };
        let _ = backend.inner.port.set(port);
        let pid = backend.inner.pid;
        let url = backend.health_url();
        let probe = async {
            loop {
                if let Ok(r) = http.get(&url).timeout(Duration::from_secs(1)).send().await {
                    if r.status() == reqwest::StatusCode::OK {
                        return;
                    }
                }
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        };
        backend.until_exit_or(deadline, probe).await?;
        tracing::info!(model = %backend.inner.label, pid, port, "backend ready");
        Ok(())
    }

    /// Runs `fut` until it finishes, the child exits, or the deadline passes; a still-running
    /// child is stopped on failure.
    async fn until_exit_or<T>(
        &self,
        deadline: tokio::time::Instant,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T, StartError> {
        tokio::select! {
            v = fut => Ok(v),
            _ = self.wait_exit() => {
                let info = self.exit_status().unwrap_or(ExitInfo { code: None, signal: None });
                self.output_drained().await;
                Err(self.exited_error(info))
            }
            _ = tokio::time::sleep_until(deadline) => {
                self.stop(Duration::from_secs(2)).await;
                Err(StartError::Timeout { label: self.inner.label.clone(), secs: self.inner.ready_timeout.as_secs(), tail: self.log_tail() })
            }
        }
    }

    fn exited_error(&self, exit: ExitInfo) -> StartError {
        StartError::Exited { label: self.inner.label.clone(), exit, tail: self.log_tail() }
    }

    /// The confinement it runs under (None: none was asked).
    pub fn sandbox(&self) -> Option<&api_types::SandboxStatus> {
        self.inner.sandbox.as_ref()
    }

    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// The port, once the process reported it (0 before).
    pub fn port(&self) -> u16 {
        self.inner.port.get().copied().unwrap_or(0)
    }

    /// The URL that answers 200 while the backend is healthy (its readiness endpoint).
    pub fn health_url(&self) -> String {
        format!("{}{}", self.base_url(), self.inner.health_path)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    /// The exit status, once the process has ended.
    pub fn exit_status(&self) -> Option<ExitInfo> {
        *self.inner.exit.borrow()
    }

    /// Resolves when the process has ended.
    pub async fn wait_exit(&self) -> ExitInfo {
        let mut rx = self.inner.exit.clone();
        let exit = match rx.wait_for(|e| e.is_some()).await {
            Ok(e) => *e,
            Err(_) => None,
        };
        exit.unwrap_or(ExitInfo { code: None, signal: None })
    }

    /// Waits (at most 500 ms) until everything the process wrote has been read, so that
    /// [`Backend::log_tail`] after an exit holds its last words.
    pub async fn output_drained(&self) {
        let mut rx = self.inner.pipes_closed.clone();
        let _ = tokio::time::timeout(Duration::from_millis(500), rx.wait_for(|n| *n >= 2)).await;
    }

    /// The last lines the process wrote, oldest first.
    pub fn log_tail(&self) -> String {
        let t = self.inner.tail.lock();
        t.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// SIGTERM to the process group; SIGKILL after `grace`. Returns once the process is gone.
    pub async fn stop(&self, grace: Duration) {
        if self.exit_status().is_some() {
            return;
        }
        self.signal(libc::SIGTERM);
        if tokio::time::timeout(grace, self.wait_exit()).await.is_err() {
            tracing::warn!(model = %self.inner.label, pid = self.inner.pid, "backend ignored SIGTERM; sending SIGKILL");
            self.signal(libc::SIGKILL);
            self.wait_exit().await;
        }
    }

    fn signal(&self, sig: i32) {
        // The waiter task reaps the child, so a pid is only signalled while it is ours.
        if self.exit_status().is_none() && self.inner.pid > 0 {
            // SAFETY: plain syscall; a negative pid addresses the child's process group.
            unsafe {
                libc::kill(-(self.inner.pid as i32), sig);
            }
        }
    }
}

async fn pump<R: AsyncRead + Unpin>(
    r: R,
    label: String,
    tail: Arc<Mutex<VecDeque<String>>>,
    port_tx: Arc<Mutex<Option<oneshot::Sender<u16>>>>,
) {
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(port) = parse_listening_port(&line) {
            if let Some(tx) = port_tx.lock().take() {
                let _ = tx.send(port);
            }
        }
        if line.contains("GET /health") || line.contains("GET /v1/health") {
            continue;
        }
        tracing::debug!(target: "backend", model = %label, "{line}");
        let mut t = tail.lock();
        if t.len() == LOG_TAIL {
            t.pop_front();
        }
        t.push_back(line);
    }
}

/// A port that was free on 127.0.0.1 a moment ago, for backends that cannot bind port 0 and
/// report it. Racy by nature: a backend that fails to bind it fails its start, and the
/// failure policy retries once.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The port of llama-server's `listening on http://127.0.0.1:PORT` line.
pub fn parse_listening_port(line: &str) -> Option<u16> {
    let rest = &line[line.find("listening on http://")? + "listening on http://".len()..];
    let hostport = rest.split_whitespace().next()?;
    hostport.rsplit_once(':')?.1.trim_end_matches('/').parse().ok()
}

/// Runs `program args` to its end (a short command such as `flm validate`), killed after
/// `within`: its exit code (None: killed by a signal) and its output, stdout then stderr.
/// `confined`: under [`backends::sandbox::probe_policy`] (read its install and the system,
/// write nothing, no TCP), as far as the kernel can (a probe is never refused for a weak
/// kernel): for `--help`, `--version` and an install's check, not for `flm pull`.
pub async fn run_once(
    program: &Path,
    args: &[String],
    within: Duration,
    confined: bool,
) -> std::io::Result<(Option<i32>, String)> {
    let mut cmd = Command::new(program);
    backend_env(cmd.as_std_mut());
    cmd.args(args).stdin(Stdio::null()).kill_on_drop(true);
    if confined {
        let policy = backends::sandbox::probe_policy(program, &crate::sandbox::runtime_paths(program));
        let mut c = crate::sandbox::prepare(backends::sandbox::Mode::BestEffort, &policy)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        // SAFETY: the sandbox's two system calls, no allocation, between fork and exec.
        unsafe {
            cmd.pre_exec(move || c.enforce());
        }
    }
    let out = tokio::time::timeout(within, cmd.output()).await.map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, format!("did not finish within {} s", within.as_secs()))
    })??;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code(), text))
}

/// Variables a backend may see from lemonade's environment, by exact name: the system's
/// (search path, home, user, locale, time zone, temporary files, the dynamic linker's path).
const ENV_NAMES: &[&str] = &["PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH"];

/// ... and by prefix: the locale's `LC_*`, llama.cpp's own `LLAMA_ARG_*` and ggml's `GGML_*`,
/// FastFlowLM's `FLM_*`,
/// the GPU runtimes' (CUDA, ROCm/HIP, HSA, Vulkan, Mesa, NVIDIA) and the math libraries'
/// threading (OpenMP, OpenBLAS, MKL). Nothing else: not lemonade's keys, `HF_TOKEN`, provider
/// keys, or anything the user set for themselves.
const ENV_PREFIXES: &[&str] = &[
    "LC_",
    "LLAMA_ARG_",
    "GGML_",
    "FLM_",
    "CUDA_",
    "HIP_",
    "ROCR_",
    "HSA_",
    "ROCM_",
    "VK_",
    "MESA_",
    "NVIDIA_",
    "OMP_",
    "OPENBLAS_",
    "MKL_",
];

/// Whether a backend may inherit the variable `name` (an allow-list: see [`ENV_NAMES`]).
pub fn inherits(name: &str) -> bool {
    ENV_NAMES.contains(&name) || ENV_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Gives `cmd` (a backend, or a run of its binary) only the allowed part of lemonade's
/// environment; what the adapter sets for it comes on top.
fn backend_env(cmd: &mut std::process::Command) {
    cmd.env_clear().envs(std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(inherits)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_inherits_only_the_allow_listed_variables() {
        for name in [
            "PATH",
            "HOME",
            "LANG",
            "LC_ALL",
            "LLAMA_ARG_THREADS",
            "CUDA_VISIBLE_DEVICES",
            "HSA_OVERRIDE_GFX_VERSION",
            "OMP_NUM_THREADS",
        ] {
            assert!(inherits(name), "{name}");
        }
        for name in [
            "LEMONADE_API_KEY",
            "LEMONADE_ADMIN_API_KEY",
            "HF_TOKEN",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "SSH_AUTH_SOCK",
            "PATHX",
            "LD_PRELOAD",
        ] {
            assert!(!inherits(name), "{name}");
        }
    }

    /// A probe (`--help`, `--version`, an install's check) writes nothing and reaches no port;
    /// the same command unconfined does (the test can fail). Needs Landlock, as CI's kernel has.
    #[tokio::test]
    async fn a_confined_probe_writes_nothing_and_connects_nowhere() {
        assert!(crate::sandbox::landlock_abi() >= 4, "this kernel cannot confine: the sandbox tests cannot run");
        let tmp = tempfile::tempdir().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let file = tmp.path().join("probe-wrote");
        // bash's /dev/tcp: a TCP connect from the shell itself.
        let script = format!("echo x > {f}; exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected", f = file.display());
        let args = vec!["-c".to_string(), script];
        let (code, out) = run_once(Path::new("/bin/bash"), &args, Duration::from_secs(10), true).await.unwrap();
        assert_ne!(code, Some(0), "{out}");
        assert!(out.contains("Permission denied") && !out.contains("connected"), "{out}");
        assert!(!file.exists(), "a confined probe wrote {}", file.display());
        let (code, out) = run_once(Path::new("/bin/bash"), &args, Duration::from_secs(10), false).await.unwrap();
        assert_eq!(code, Some(0), "{out}");
        assert!(file.exists() && out.contains("connected"), "{out}");
    }

    #[test]
    fn listening_line() {
        assert_eq!(parse_listening_port("main: server is listening on http://127.0.0.1:41235 - starting"), Some(41235));
        assert_eq!(parse_listening_port("srv  start: listening on http://127.0.0.1:8080"), Some(8080));
        assert_eq!(parse_listening_port("listening on http://[::1]:9000"), Some(9000));
        assert_eq!(parse_listening_port("listening on unix:///tmp/x.sock"), None);
        assert_eq!(parse_listening_port("loading model"), None);
    }

    fn sh(label: &str, script: &str) -> SpawnSpec {
        SpawnSpec {
            label: label.into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![],
            health_path: "/health".into(),
            ready_timeout: Duration::from_secs(10),
            port: None,
            sandbox: None,
        }
    }

    #[tokio::test]
    async fn exit_before_ready_reports_status_and_log_tail() {
        let http = reqwest::Client::new();
        let err =
            Backend::start(sh("m", "echo loading; echo 'error: bad model' >&2; exit 3"), &http).await.unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("exit code 3"), "{msg}");
        assert!(msg.contains("error: bad model"), "the last line is in the message: {msg}");
    }

    #[tokio::test]
    async fn timeout_stops_the_child() {
        let http = reqwest::Client::new();
        let mut spec = sh("m", "exec sleep 30");
        spec.ready_timeout = Duration::from_millis(200);
        let b = Backend::spawn(spec).unwrap();
        let pid = b.pid() as libc::pid_t;
        let err = b.ready(&http).await.unwrap_err();
        assert!(matches!(err, StartError::Timeout { .. }), "{err}");
        // The child is gone by the time the timeout is reported: SIGTERMed, waited for, reaped.
        assert_eq!(b.exit_status(), Some(ExitInfo { code: None, signal: Some(libc::SIGTERM) }));
        // SAFETY: signal 0 only checks whether the process exists.
        let exists = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!exists, "pid {pid} still exists after the timeout");
    }

    #[tokio::test]
    async fn spawn_failure_names_the_program() {
        let http = reqwest::Client::new();
        let mut spec = sh("m", "");
        spec.program = "/nonexistent/llama-server".into();
        let msg = Backend::start(spec, &http).await.unwrap_err().to_string();
        assert!(msg.contains("/nonexistent/llama-server"), "{msg}");
    }
}
