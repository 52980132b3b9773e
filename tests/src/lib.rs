//! Test support for lemonade's integration and end-to-end tests.
//!
//! * Paths of what `cargo xtask setup` provisioned (real llama-server, real GGUF models).
//!   Missing files fail the test with a message; they are never a silent skip.
//! * [`Lemonade`]: the real `lemonade serve` binary in a sandbox of its own (lemonade cache,
//!   Hugging Face cache, extra models dir), on an OS-chosen port.
//! * Process helpers to prove no backend outlives the server.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub mod hub;
pub mod keys;
pub mod pty;
pub mod release;

fn dev_cache() -> PathBuf {
    std::env::var_os("LEMONADE_DEV_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into())).join(".cache/lemonade-dev")
    })
}

/// The provisioned llama-server (`LEMONADE_TEST_LLAMA_SERVER`, else the dev cache).
pub fn llama_server() -> PathBuf {
    let p = std::env::var_os("LEMONADE_TEST_LLAMA_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| dev_cache().join("llama-server/11434.0.0-cpu-avx2-rpc-bi/llama-server"));
    assert!(p.is_file(), "llama-server not found at {}: run `cargo xtask setup` first", p.display());
    p
}

/// The oldest llama.cpp lemonade supports, b9093 (`LEMONADE_TEST_LLAMA_SERVER_OLDEST`, else the
/// dev cache): the capability tests run against it beside [`llama_server`].
pub fn llama_server_oldest() -> PathBuf {
    let p = std::env::var_os("LEMONADE_TEST_LLAMA_SERVER_OLDEST")
        .map(PathBuf::from)
        .unwrap_or_else(|| dev_cache().join("llama-server/9093.0.0-cpu-avx2-bi/llama-server"));
    assert!(p.is_file(), "the oldest llama-server not found at {}: run `cargo xtask setup` first", p.display());
    p
}

/// Runs `tests/py/<script>` with the test venv's Python and `args`; panics with its output
/// unless it exits 0.
pub fn py_client(script: &str, args: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("py").join(script);
    let out = Command::new(python()).arg(path).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script}:\n{text}");
    text
}

/// [`py_client`] off the async runtime, for the clients that end by printing "every check
/// held": panics with the script's output unless it did; returns that output.
pub async fn py_checks(script: &'static str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        py_client(script, &refs)
    })
    .await
    .expect("the Python client ran");
    assert!(out.contains("every check held"), "{script}:\n{out}");
    out
}

/// The provisioned whisper-server (`LEMONADE_TEST_WHISPER_SERVER`, else the dev cache).
pub fn whisper_server() -> PathBuf {
    let p = std::env::var_os("LEMONADE_TEST_WHISPER_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| dev_cache().join("whisper-server/1.5.1-cpu-avx2/whisper-server"));
    assert!(p.is_file(), "whisper-server not found at {}: run `cargo xtask setup` first", p.display());
    p
}

/// The provisioned sd-server (`LEMONADE_TEST_SD_SERVER`, else the dev cache).
pub fn sd_server() -> PathBuf {
    let p = std::env::var_os("LEMONADE_TEST_SD_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| dev_cache().join("sd-server/0.4.7-cpu-avx2/sd-server"));
    assert!(p.is_file(), "sd-server not found at {}: run `cargo xtask setup` first", p.display());
    p
}

/// The provisioned Kokoro backend, `koko` (`LEMONADE_TEST_KOKO`, else the dev cache).
pub fn koko() -> PathBuf {
    let p = std::env::var_os("LEMONADE_TEST_KOKO")
        .map(PathBuf::from)
        .unwrap_or_else(|| dev_cache().join("kokoro/kokoro-onnx-0.6.1/koko"));
    assert!(p.is_file(), "koko not found at {}: run `cargo xtask setup` first", p.display());
    p
}

/// A provisioned model file, e.g. `serve/SmolLM2-135M-Instruct.Q4_1.gguf`.
pub fn model(rel: &str) -> PathBuf {
    let root =
        std::env::var_os("LEMONADE_TEST_MODELS").map(PathBuf::from).unwrap_or_else(|| dev_cache().join("models/v1"));
    let p = root.join(rel);
    assert!(p.is_file(), "model not found at {}: run `cargo xtask setup` first", p.display());
    p
}

/// A sentence espeak-ng speaks and Whisper tiny.en hears back (the audio tests' sample).
pub const SENTENCE: &str = "Lemonade serves many models on one port.";
pub const SMOL_FILE: &str = "serve/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Whisper tiny.en in ggml, converted by setup from a CTranslate2 package.
pub const WHISPER_FILE: &str = "audio/ggml-tiny.en.bin";
const WHISPER_SHA256: &str = "688ba2f39cb0eee711f1b137b890d2086b26c3af6c054e6890222463ac0d8ef7";
/// The transcription model of [`Sandbox::with_whisper`].
pub const WHISPER: &str = "user.Whisper-Tiny-En";
/// RANDOM weights in the SDXS-512 architecture (setup generates them): sd-server runs them and
/// answers real PNGs of noise. Never assert what an image shows.
pub const SD_FILE: &str = "plumbing/sdxs-512-random-F16.safetensors";
const SD_SHA256: &str = "f9bf9de14b164718b60a28ff454c7a14bb442fd189f7a944ac0d6be4516fb3d2";
/// The image model of [`Sandbox::with_sd`] (one step, 256×256 by default).
pub const SD: &str = "user.SDXS-Random";
/// Kokoro-82M (int8 ONNX) and the voices a package ships (five Japanese ones; they speak the
/// English phonemes espeak-ng makes).
pub const KOKORO_FILE: &str = "tts/kokoro-v1.0.int8.onnx";
pub const KOKORO_VOICES_FILE: &str = "tts/voices-ja.npz";
const KOKORO_SHA256: &str = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb";
const KOKORO_VOICES_SHA256: &str = "fc663c0f5c64d1f10c7c6daa2323ea20efe1b255a891b0d912d07bf58c529d15";
/// The speech model of [`Sandbox::with_kokoro`].
pub const KOKORO: &str = "user.Kokoro-82M";
/// The repository [`Sandbox::with_kokoro`] files it under (model, voices, `index.json`).
pub const KOKORO_REPO: &str = "lemonade-dev/kokoro-82m-int8-onnx";

/// The files of a Kokoro repository, as the `kokoro` recipe reads it, put in `dir`: the model
/// and voices (links to the provisioned files) and an `index.json` naming them.
pub fn kokoro_repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::os::unix::fs::symlink(model(KOKORO_FILE), dir.join("kokoro-v1.0.int8.onnx")).unwrap();
    std::os::unix::fs::symlink(model(KOKORO_VOICES_FILE), dir.join("voices.bin")).unwrap();
    std::fs::write(dir.join("index.json"), KOKORO_INDEX).unwrap();
}
const KOKORO_INDEX: &str = r#"{"model": "kokoro-v1.0.int8.onnx", "voices": "voices.bin"}"#;
pub const GEMMA_FILE: &str = "serve/gemma-3-270m-Q4_K_M.gguf";
pub const MINILM_FILE: &str = "serve/all-MiniLM-L6-v2-F32.gguf";
pub const RERANK_FILE: &str = "plumbing/minilm-random-rerank-F32.gguf";

/// Names under which the sandbox serves the models.
/// The id listings show for a model named `name` that no other model shares a bare name with
/// (current Lemonade's naming): the name without its `user.` or `extra.` prefix.
pub fn shown(name: &str) -> &str {
    name.strip_prefix("user.").or_else(|| name.strip_prefix("extra.")).unwrap_or(name)
}

pub const SMOL: &str = "user.SmolLM2-135M-Instruct-GGUF";
pub const SMOL_COPY: &str = "user.SmolLM2-Copy-GGUF";
pub const GEMMA: &str = "extra.gemma-3-270m-Q4_K_M";
pub const MINILM: &str = "extra.all-MiniLM-L6-v2-F32";
/// Random-weight reranking head: plumbing only, its scores mean nothing.
pub const RERANKER: &str = "extra.minilm-random-rerank-F32";

/// A sandbox: lemonade cache, HF cache holding SmolLM2 in huggingface_hub's layout (blob +
/// snapshot symlink + refs/main) registered as two `user.*` models, and an extra models dir
/// with Gemma, MiniLM and the plumbing reranker.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
}

impl Sandbox {
    /// A sandbox with no models.
    pub fn empty() -> Sandbox {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Sandbox { dir };
        std::fs::create_dir_all(s.cache()).unwrap();
        std::fs::create_dir_all(s.extra()).unwrap();
        s
    }

    pub fn new() -> Sandbox {
        let s = Sandbox::empty();
        let blob = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
        let smol = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF";
        s.add_hf_file(smol, "SmolLM2-135M-Instruct.Q4_1.gguf", &model(SMOL_FILE), blob);
        s.register("SmolLM2-135M-Instruct-GGUF", json!({"checkpoint": format!("{smol}:Q4_1"), "recipe": "llamacpp", "labels": ["custom"], "suggested": true}));
        s.register("SmolLM2-Copy-GGUF", json!({"checkpoint": format!("{smol}:Q4_1"), "recipe": "llamacpp", "labels": ["custom"], "suggested": true}));
        for f in [GEMMA_FILE, MINILM_FILE, RERANK_FILE] {
            let src = model(f);
            std::os::unix::fs::symlink(&src, s.extra().join(src.file_name().unwrap())).unwrap();
        }
        s
    }

    /// This sandbox with Whisper tiny.en downloaded as `ggerganov/whisper.cpp:ggml-tiny.en.bin`
    /// and registered as [`WHISPER`] (recipe whispercpp).
    pub fn with_whisper(self) -> Sandbox {
        self.add_hf_file("ggerganov/whisper.cpp", "ggml-tiny.en.bin", &model(WHISPER_FILE), WHISPER_SHA256);
        let entry = json!({"checkpoint": "ggerganov/whisper.cpp:ggml-tiny.en.bin", "recipe": "whispercpp", "labels": ["audio", "custom"], "suggested": true});
        self.register(WHISPER.trim_start_matches("user."), entry);
        self
    }

    /// This sandbox with the random SDXS-512 downloaded as
    /// `lemonade-dev/sdxs-512-random:sdxs-512-random-F16.safetensors` and registered as [`SD`]
    /// (recipe sd-cpp, image defaults: 1 step, cfg 1, 256×256).
    pub fn with_sd(self) -> Sandbox {
        let file = "sdxs-512-random-F16.safetensors";
        self.add_hf_file("lemonade-dev/sdxs-512-random", file, &model(SD_FILE), SD_SHA256);
        let entry = json!({"checkpoint": format!("lemonade-dev/sdxs-512-random:{file}"), "recipe": "sd-cpp", "labels": ["image", "custom"],
                           "image_defaults": {"steps": 1, "cfg_scale": 1.0, "width": 256, "height": 256}});
        self.register(SD.trim_start_matches("user."), entry);
        self
    }

    /// This sandbox with Kokoro-82M downloaded as [`KOKORO_REPO`] and registered as [`KOKORO`].
    pub fn with_kokoro(self) -> Sandbox {
        // In a folder of its own: a sandboxed backend reads the folder its model files are in.
        let index = self.dir.path().join("kokoro-src").join("index.json");
        std::fs::create_dir_all(index.parent().unwrap()).unwrap();
        std::fs::write(&index, KOKORO_INDEX).unwrap();
        // The blob's name only has to be unique in the repository.
        self.add_hf_file(KOKORO_REPO, "index.json", &index, &"1".repeat(64));
        self.add_hf_file(KOKORO_REPO, "kokoro-v1.0.int8.onnx", &model(KOKORO_FILE), KOKORO_SHA256);
        self.add_hf_file(KOKORO_REPO, "voices.bin", &model(KOKORO_VOICES_FILE), KOKORO_VOICES_SHA256);
        let entry = json!({"checkpoint": KOKORO_REPO, "recipe": "kokoro", "labels": ["custom", "speech", "tts"]});
        self.register(KOKORO.trim_start_matches("user."), entry);
        self
    }

    /// Puts `src` in the Hugging Face cache as `repo`'s `file`, in huggingface_hub's layout:
    /// a blob (a symlink to `src`) named by its sha256, a snapshot link and `refs/main`.
    pub fn add_hf_file(&self, repo: &str, file: &str, src: &Path, sha256: &str) {
        let dir = self.hf_cache().join(format!("models--{}", repo.replace('/', "--")));
        let commit = "5b3f2a1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a";
        std::fs::create_dir_all(dir.join("blobs")).unwrap();
        std::fs::create_dir_all(dir.join("refs")).unwrap();
        std::fs::create_dir_all(dir.join("snapshots").join(commit)).unwrap();
        std::fs::write(dir.join("refs/main"), commit).unwrap();
        std::os::unix::fs::symlink(src, dir.join("blobs").join(sha256)).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{sha256}"), dir.join("snapshots").join(commit).join(file))
            .unwrap();
    }

    /// Adds `name` (without `user.`) to `user_models.json`.
    pub fn register(&self, name: &str, entry: Value) {
        let path = self.cache().join("user_models.json");
        let mut all: Value =
            std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(json!({}));
        all[name] = entry;
        std::fs::write(&path, serde_json::to_vec_pretty(&all).unwrap()).unwrap();
    }

    pub fn cache(&self) -> PathBuf {
        self.dir.path().join("lemonade")
    }
    pub fn hf_cache(&self) -> PathBuf {
        self.dir.path().join("hub")
    }
    pub fn extra(&self) -> PathBuf {
        self.dir.path().join("extra")
    }

    /// Gives `cmd` (lemonade, serving or as the CLI) this sandbox's environment and nothing of
    /// the caller's but PATH: its home, cache and Hub cache, a closed loopback port as the Hub
    /// and as the release site,
    /// and one compute thread per llama-server (`LLAMA_ARG_THREADS`, read by llama-server
    /// itself). The suite runs two tests at once on two cores; llama.cpp's threads spin while
    /// they wait for each other, so two 2-thread backends on two cores slow to a crawl (3 tokens/s
    /// against 29 with one thread each, measured with two busy loops beside it).
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("LEMONADE_CACHE_DIR", self.cache())
            .env("HF_HUB_CACHE", self.hf_cache())
            .env("HF_ENDPOINT", "http://127.0.0.1:9")
            // Release archives too: a test that installs names a release double.
            .env("LEMONADE_RELEASES_URL", "http://127.0.0.1:9")
            .env("LLAMA_ARG_THREADS", "1");
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::new()
    }
}

/// A running `lemonade serve`.
pub struct Lemonade {
    child: Child,
    /// The lemonade binary (for CLI calls against this server).
    pub bin: PathBuf,
    pub base: String,
    pub http: reqwest::Client,
    log: Arc<Mutex<Vec<String>>>,
    pub sandbox: Sandbox,
    /// The secrets this server was given, searched for when it is dropped ([`keys`]).
    secrets: Mutex<Vec<String>>,
    /// Every answer the helpers read back (bodies, CLI output), for the key sweep.
    answers: Mutex<Vec<String>>,
    /// Files the test placed that hold a secret by design (the user's token file).
    placed: Mutex<Vec<PathBuf>>,
}

impl Lemonade {
    /// Starts `bin serve` in a fresh [`Sandbox`] with the provisioned llama-server.
    pub async fn start(bin: &Path, args: &[&str]) -> Lemonade {
        Lemonade::start_in(bin, Sandbox::new(), args, &[]).await
    }

    pub async fn start_in(bin: &Path, sandbox: Sandbox, args: &[&str], env: &[(&str, &str)]) -> Lemonade {
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--port", "0", "--extra-models-dir"]).arg(sandbox.extra());
        if !args.contains(&"--host") {
            cmd.args(["--host", "127.0.0.1"]);
        }
        if !args.contains(&"--log-level") {
            cmd.args(["--log-level", "debug"]);
        }
        // Tests never reach the internet: the Hub is a closed loopback port unless the caller
        // names a Hub double in `env`.
        sandbox.apply(&mut cmd);
        cmd.args(args).envs(env.iter().copied()).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        // The real llama-server unless the caller names another (e.g. the fake backend).
        if !env.iter().any(|(k, _)| *k == "LEMONADE_LLAMACPP_CPU_BIN") {
            cmd.env("LEMONADE_LLAMACPP_CPU_BIN", llama_server());
        }
        if !env.iter().any(|(k, _)| *k == "LEMONADE_WHISPERCPP_CPU_BIN") {
            cmd.env("LEMONADE_WHISPERCPP_CPU_BIN", whisper_server());
        }
        if !env.iter().any(|(k, _)| *k == "LEMONADE_SDCPP_CPU_BIN") {
            cmd.env("LEMONADE_SDCPP_CPU_BIN", sd_server());
        }
        if !env.iter().any(|(k, _)| *k == "LEMONADE_KOKORO_CPU_BIN") {
            cmd.env("LEMONADE_KOKORO_CPU_BIN", koko());
        }
        let mut child = cmd.spawn().expect("start lemonade");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
                }
                log2.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("lemonade did not start listening:\n{}", log.lock().unwrap().join("\n"));
            }
        };
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let secrets = Mutex::new(keys::secrets_in(env));
        let (bin, base) = (bin.to_path_buf(), format!("http://{addr}"));
        let (answers, placed) = (Mutex::new(Vec::new()), Mutex::new(Vec::new()));
        Lemonade { child, bin, base, http, log, sandbox, secrets, answers, placed }
    }

    /// Names a secret this server holds that its environment does not show (a provider's key
    /// given through the API): the key sweep searches for it too.
    pub fn secret(&self, key: &str) {
        self.secrets.lock().unwrap().push(key.to_string());
    }

    /// Names a file the test placed that holds a secret by design (the user's own token file):
    /// the key sweep does not count it.
    pub fn placed(&self, path: &Path) {
        self.placed.lock().unwrap().push(path.to_path_buf());
    }

    /// Keeps `text` (an answer read back) for the key sweep and returns it.
    fn answered(&self, text: String) -> String {
        self.answers.lock().unwrap().push(text.clone());
        text
    }

    /// Searches the log, the answers and the sandbox's files for every secret; fails the test
    /// on a find (unless it is already failing) and records the sweep for `cargo xtask test`.
    fn sweep_keys(&self) {
        let secrets = std::mem::take(&mut *self.secrets.lock().unwrap());
        let answers = std::mem::take(&mut *self.answers.lock().unwrap());
        let placed = self.placed.lock().unwrap().clone();
        let s = keys::sweep(&secrets, &self.log.lock().unwrap(), &answers, self.sandbox.dir.path(), &placed);
        if secrets.is_empty() {
            return;
        }
        keys::record(&s);
        if !s.leaks.is_empty() && !std::thread::panicking() {
            panic!("the key sweep found a secret:\n{}", s.leaks.join("\n"));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn port(&self) -> u16 {
        self.base.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Runs the `lemonade` CLI against this server (`--host`, `--port` and the sandbox's cache
    /// dir added; blocking, off the async runtime). Returns (exit code, stdout, stderr).
    pub async fn cli(&self, args: &[&str]) -> (i32, String, String) {
        self.cli_env(args, &[]).await
    }

    pub async fn cli_env(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        self.cli_with(args, env, None).await
    }

    /// [`Lemonade::cli`] with `input` (and a newline) on its standard input.
    pub async fn cli_stdin(&self, args: &[&str], input: &str) -> (i32, String, String) {
        self.cli_with(args, &[], Some(format!("{input}\n"))).await
    }

    async fn cli_with(&self, args: &[&str], env: &[(&str, &str)], input: Option<String>) -> (i32, String, String) {
        use std::io::Write;
        let mut cmd = Command::new(&self.bin);
        self.sandbox.apply(&mut cmd);
        cmd.args(args)
            .args(["--host", "127.0.0.1", "--port", &self.port().to_string()])
            .envs(env.iter().copied())
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = tokio::task::spawn_blocking(move || {
            let mut child = cmd.spawn().expect("run the lemonade CLI");
            if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
                let _ = stdin.write_all(text.as_bytes());
            }
            child.wait_with_output().expect("the lemonade CLI ran")
        })
        .await
        .unwrap();
        (
            out.status.code().unwrap_or(-1),
            self.answered(String::from_utf8_lossy(&out.stdout).into_owned()),
            self.answered(String::from_utf8_lossy(&out.stderr).into_owned()),
        )
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.http.get(self.url(path)).send().await.expect("GET");
        let status = r.status().as_u16();
        let text = self.answered(r.text().await.unwrap_or_default());
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        let r = self.http.delete(self.url(path)).send().await.expect("DELETE");
        let status = r.status().as_u16();
        let text = self.answered(r.text().await.unwrap_or_default());
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST");
        let status = r.status().as_u16();
        let text = self.answered(r.text().await.unwrap_or_default());
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Sends a signal to the server process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our own child.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// SIGKILLs the server and returns its sandbox (its files), for a restart on the same state.
    pub fn kill_keeping_sandbox(mut self) -> Sandbox {
        // Never signal a pid that was already reaped (it may belong to another process now).
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGKILL);
            let _ = self.child.wait();
        }
        self.sweep_keys();
        std::mem::replace(&mut self.sandbox, Sandbox::empty())
    }

    /// Waits for the server to exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        wait_child(&mut self.child, timeout)
    }
}

impl Drop for Lemonade {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGTERM);
            if self.wait_exit(Duration::from_secs(10)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("---- lemonade log ----\n{}", self.log());
        }
        self.sweep_keys();
    }
}

/// Waits for `child` to exit, at most `timeout`.
pub fn wait_child(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// How long [`signal_next_backend`] waits for the next backend: a bound against a hang, not a
/// timing. A retry after a failed start comes only after the stop's 5 s grace (a frozen backend
/// ignores SIGTERM), so on two cores busy with the whole suite 10 s left little room.
const SPAWN_WAIT: Duration = Duration::from_secs(30);

/// Sends `sig` to the next backend `server` spawns that is not in `seen`, the moment it exists
/// (its exec done: a child still running the server's own image is forked but not yet exec'd,
/// and signalling it would hit a copy of the server). /proc is polled without pause for at most
/// [`SPAWN_WAIT`]. Its pid.
pub async fn signal_next_backend(server: u32, seen: &[u32], sig: i32) -> Option<u32> {
    let seen = seen.to_vec();
    let exe = |p: u32| std::fs::read_link(format!("/proc/{p}/exe")).ok();
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + SPAWN_WAIT;
        let own = exe(server);
        while std::time::Instant::now() < deadline {
            let exec_done = |c: &u32| exe(*c).is_some_and(|e| Some(&e) != own.as_ref());
            if let Some(c) = child_pids(server).into_iter().find(|c| !seen.contains(c) && exec_done(c)) {
                // SAFETY: a plain syscall on a child of the server under test.
                unsafe {
                    libc::kill(c as i32, sig);
                }
                return Some(c);
            }
            std::thread::yield_now();
        }
        None
    })
    .await
    .unwrap()
}

/// Direct children of `pid` (from /proc), but the short-lived runs of a backend binary that
/// lemonade makes to read what it supports (`--help`, `--version`): they are no backends. A
/// child whose command line reads empty is one of those exiting (its memory, and with it the
/// command line, goes before it is a zombie): not counted either, or a probe caught at its end
/// would be taken for the backend.
pub fn child_pids(pid: u32) -> Vec<u32> {
    let probe = |p: u32| {
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).skip(1).collect();
        cmdline.is_empty() || matches!(args[..], [b"--help"] | [b"--version"])
    };
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            // pid (comm) state ppid …; comm may contain spaces, so split after the last ')'.
            let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or_default();
            let ppid = after.split_whitespace().nth(1).and_then(|s| s.parse::<u32>().ok());
            if ppid == Some(pid) && !probe(p) {
                out.push(p);
            }
        }
    }
    out
}

/// Whether `pid` is a live (non-zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(stat.rsplit_once(')').and_then(|x| x.1.split_whitespace().next()), Some("Z") | Some("X")),
        Err(_) => false,
    }
}

/// Polls `f` until it returns Some or `timeout` passes.
pub async fn wait_for<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(|d| d.trim().to_string())
        .collect()
}

/// The fake llama-server (tests/src/bin/fake-llama-server.rs): `LEMONADE_TEST_FAKE_BACKEND`,
/// else built once into this test's target directory.
pub fn fake_llama_server() -> PathBuf {
    if let Some(p) = std::env::var_os("LEMONADE_TEST_FAKE_BACKEND") {
        return p.into();
    }
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            // target/<profile>/deps/<test> → target/<profile>/fake-llama-server
            let exe = std::env::current_exe().expect("test exe");
            let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
            let target_dir = profile_dir.parent().expect("target root");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .args([
                    "build",
                    "-q",
                    "-p",
                    "lemonade-test-support",
                    "--bin",
                    "fake-llama-server",
                    "--bin",
                    "flm-standin",
                ])
                .arg("--target-dir")
                .arg(target_dir)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("cargo build of the fake backend");
            assert!(status.success(), "building fake-llama-server failed");
            profile_dir.join("fake-llama-server")
        })
        .clone()
}

/// Writes a minimal GGUF file (header and metadata, no tensors): `arch` and, when given, its
/// pooling type (1 = mean → an embedding model, 4 = rank → a reranker).
pub fn write_gguf(path: &Path, arch: &str, pooling: Option<u32>) {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(1 + pooling.is_some() as u64).to_le_bytes());
    s(&mut b, "general.architecture");
    b.extend_from_slice(&8u32.to_le_bytes());
    s(&mut b, arch);
    if let Some(p) = pooling {
        s(&mut b, &format!("{arch}.pooling_type"));
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&p.to_le_bytes());
    }
    std::fs::write(path, b).unwrap();
}

/// A sandbox whose extra models dir holds fake models: `name` → (pooling, knobs JSON).
/// Served as `extra.<name>.gguf`; lemonade runs them with the fake backend.
pub fn fake_sandbox(models: &[(&str, Option<u32>, Value)]) -> Sandbox {
    let s = Sandbox::empty();
    for (name, pooling, knobs) in models {
        let p = s.extra().join(format!("{name}.gguf"));
        write_gguf(&p, if pooling.is_some() { "bert" } else { "llama" }, *pooling);
        std::fs::write(format!("{}.json", p.display()), knobs.to_string()).unwrap();
    }
    s
}

/// Registers `user.<name>` as a `ryzenai-llm` (NPU) model whose files are in the sandbox's HF
/// cache (a directory with `genai_config.json`), with `labels`.
pub fn add_npu_model(s: &Sandbox, name: &str, labels: &[&str]) {
    let repo = format!("amd/{name}");
    let snap =
        s.hf_cache().join(format!("models--amd--{name}")).join("snapshots/0000000000000000000000000000000000000000");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("genai_config.json"), "{}").unwrap();
    let path = s.cache().join("user_models.json");
    let mut all: Value = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(json!({}));
    all[name] = json!({"checkpoint": repo, "recipe": "ryzenai-llm", "labels": labels});
    std::fs::write(path, serde_json::to_vec_pretty(&all).unwrap()).unwrap();
}

/// Model names in a `/health` body's `all_models_loaded`, in load order.
pub fn loaded_names(health: &Value) -> Vec<String> {
    health["all_models_loaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["model_name"].as_str().unwrap().to_string())
        .collect()
}

impl Lemonade {
    /// A short chat completion ("hi", 2 tokens) against `model`.
    /// `lemonade_requests_in_flight{model=…}` from lemonade's own metrics (0 when absent).
    pub async fn in_flight(&self, model: &str) -> f64 {
        let text = self.http.get(self.url("/metrics")).send().await.unwrap().text().await.unwrap();
        let key = format!("lemonade_requests_in_flight{{model=\"{model}\"}} ");
        text.lines().find_map(|line| line.strip_prefix(&key)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    }

    /// Kills `pid` with SIGKILL once a request for `model` is in flight (within 30 s).
    pub async fn kill_when_in_flight(&self, model: &str, pid: u32) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.in_flight(model).await < 1.0 {
            assert!(std::time::Instant::now() < deadline, "no request for {model} went in flight");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // SAFETY: a plain syscall on a process of this test.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }

    pub async fn chat(&self, model: &str) -> (u16, Value) {
        self.post(
            "/api/v1/chat/completions",
            &json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        )
        .await
    }
}

/// Headless Chromium: `LEMONADE_TEST_CHROMIUM` (set by `cargo xtask test`), else `chromium`.
pub fn chromium() -> PathBuf {
    std::env::var_os("LEMONADE_TEST_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("chromium"))
}

/// The provisioned Python (numpy, gguf, huggingface_hub): `LEMONADE_TEST_PYTHON`, else the
/// dev cache's venv.
pub fn python() -> PathBuf {
    let p = std::env::var_os("LEMONADE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| dev_cache().join("venv/bin/python"));
    assert!(p.is_file(), "python not found at {}: run `cargo xtask setup` first", p.display());
    p
}

/// A stand-in hardware tree for `LEMONADE_HARDWARE_ROOT`: two NVIDIA GPUs as NVML would report
/// them (8 GiB with 1 used, 4 GiB free) and one AMD discrete GPU in amdgpu's sysfs (16 GiB).
pub fn fake_hardware() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    const GIB: u64 = 1 << 30;
    let nvml = json!([
        {"name": "NVIDIA GeForce RTX 4060", "total_bytes": 8 * GIB, "used_bytes": GIB},
        {"name": "NVIDIA RTX A2000", "total_bytes": 4 * GIB, "used_bytes": 0}
    ]);
    std::fs::write(root.join("nvml.json"), nvml.to_string()).unwrap();
    let write = |p: &str, s: String| {
        let p = root.join("sys").join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    };
    write("class/kfd/kfd/topology/nodes/0/properties", "simd_count 0\ngfx_target_version 0\n".into());
    write(
        "class/kfd/kfd/topology/nodes/1/properties",
        "simd_count 96\ngfx_target_version 110000\ndrm_render_minor 129\n".into(),
    );
    write("class/drm/renderD129/device/mem_info_vram_total", (16 * GIB).to_string());
    write("class/drm/renderD129/device/mem_info_vram_used", "0".into());
    write("class/drm/renderD129/device/product_name", "Radeon RX 7800 XT".into());
    // An XDNA 2 NPU bound to the amdxdna driver.
    write("class/accel/accel0/device/device", "0x17f0\n".into());
    std::os::unix::fs::symlink("../../../bus/pci/drivers/amdxdna", root.join("sys/class/accel/accel0/device/driver"))
        .unwrap();
    dir
}

/// The stand-in `flm` (tests/src/bin/flm-standin.rs), beside the fake llama-server.
pub fn flm_standin() -> PathBuf {
    let p = fake_llama_server().with_file_name("flm-standin");
    assert!(p.is_file(), "{} not found: build it with `cargo build -p lemonade-test-support --bins`", p.display());
    p
}

/// The files under `dir` (links not followed) that hold `needle`: where a secret was written.
pub fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let finder = memchr::memmem::Finder::new(needle.as_bytes());
    let holds = |p: &PathBuf| std::fs::read(p).is_ok_and(|b| finder.find(&b).is_some());
    keys::files_under(dir).into_iter().filter(holds).collect()
}
