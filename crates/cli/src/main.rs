//! `lemonade`: the local LLM server and its command line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

mod chat;
mod client;
mod process;

use client::{LoadArgs, Target};

#[derive(Parser)]
#[command(
    name = "lemonade",
    version,
    about = "A local LLM server with OpenAI-compatible APIs for many models at once.",
    long_about = "A local LLM server with OpenAI-compatible APIs for many models at once.\n\n\
        `lemonade serve` runs the server; the other commands talk to a running server over HTTP \
        (list, pull, delete and recipes start a temporary one when none answers; run starts one \
        for as long as the chat lasts). Every flag can also come from its LEMONADE_* variable.",
    after_help = "Examples:\n  lemonade serve\n  lemonade pull user.Phi-4-Mini-GGUF --checkpoint unsloth/Phi-4-mini-instruct-GGUF:Q4_K_M --recipe llamacpp\n  lemonade run user.Phi-4-Mini-GGUF\n  lemonade status --json"
)]
#[command(help_expected = true)]
struct Cli {
    /// Host of the server (to listen on, for serve; to connect to, for the other commands).
    #[arg(long, global = true, env = "LEMONADE_HOST", default_value = "localhost")]
    host: String,
    /// Port of the server (to listen on, for serve; to connect to, for the other commands).
    #[arg(long, global = true, env = "LEMONADE_PORT", default_value_t = 8000)]
    port: u16,
    /// API key: serve requires it as `Authorization: Bearer <key>`; the other commands send it
    /// (or `LEMONADE_ADMIN_API_KEY` when that is set: it is accepted everywhere).
    #[arg(long, global = true, env = "LEMONADE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Print machine-readable JSON (one document on stdout) instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the server in the foreground (Ctrl+C stops it and every backend it started).
    Serve(ServeArgs),
    /// Chat with a model in the terminal: starts a server if none answers (and stops it at the
    /// end), loads the model (pulling it first if needed), then streams each answer.
    /// Ctrl-C stops an answer; /exit or Ctrl-D quits.
    Run {
        /// Model to chat with.
        model: String,
        #[command(flatten)]
        load: LoadArgs,
        /// Extra models folder, for a server that `run` starts.
        #[arg(long, env = "LEMONADE_EXTRA_MODELS_DIR")]
        extra_models_dir: Option<PathBuf>,
        /// Longest answer, in tokens (default: until the model stops or its context is full).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_tokens: Option<u32>,
    },
    /// List the models available on this machine (and whether they are downloaded).
    List,
    /// Download a model into the Hugging Face cache (with a live progress bar); `user.<name>`
    /// with --checkpoint and --recipe registers a new model.
    Pull(client::PullArgs),
    /// Delete a downloaded model (and a user.* registration).
    Delete {
        /// Name of the model to delete.
        model: String,
    },
    /// Load a model now (with optional settings for this load).
    Load {
        /// Model to load.
        model: String,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Pin a loaded model: never evicted nor unloaded for idleness until unpinned or
    /// unloaded.
    Pin {
        /// Model to pin (loaded or loading).
        model: String,
    },
    /// Unpin a model.
    Unpin {
        /// Model to unpin.
        model: String,
    },
    /// Unload one model, or every model when none is named.
    Unload {
        /// Model to unload (all when omitted).
        model: Option<String>,
    },
    /// Say whether a server answers on --host/--port, with its loaded models (exit 0 if it
    /// does, 1 if not).
    Status,
    /// Stop the server on --port and every backend it started: SIGTERM, then SIGKILL for
    /// anything left after --timeout (also for a wedged server).
    Stop {
        /// Seconds to wait for a clean exit before killing.
        #[arg(long, default_value_t = 10)]
        timeout: u64,
    },
    /// Show each recipe's backends and their state, or install/uninstall one.
    Recipes {
        /// Install a backend, as recipe:backend (e.g. llamacpp:cpu).
        #[arg(long, value_name = "RECIPE:BACKEND", conflicts_with = "uninstall")]
        install: Option<String>,
        /// Uninstall a backend, as recipe:backend.
        #[arg(long, value_name = "RECIPE:BACKEND")]
        uninstall: Option<String>,
    },
    /// Remote OpenAI-compatible providers (vLLM, SGLang, TGI, a hosted API, another
    /// lemonade): their models are served here as `<NAME>.<id>` and take no local slot.
    Cloud {
        #[command(subcommand)]
        action: client::CloudAction,
    },
    /// Show the server's configuration (every key, the value in force), or change it with
    /// `set key=value …` (saved in config.json; a value is JSON where it parses, else text;
    /// `key=null` resets a key).
    Config {
        #[command(subcommand)]
        action: Option<client::ConfigAction>,
    },
    /// Write a model's definition as a file `lemonade import` (or `POST /v1/pull`) takes: for a
    /// collection, its policy and its registered components' definitions.
    Export {
        /// The model or collection.
        model: String,
        /// The file to write (default: standard output).
        #[arg(long, short)]
        output: Option<std::path::PathBuf>,
    },
    /// Register a model or collection from a file `lemonade export` wrote.
    Import {
        /// A file `lemonade export` wrote (a `POST /v1/pull` body).
        file: std::path::PathBuf,
    },
    /// Ask Hugging Face whether downloaded models have newer commits than the ones pulled.
    CheckUpdates,
    /// Remove orphaned files from the models' folders of the Hugging Face cache: partial
    /// downloads nothing will resume, blobs no snapshot uses.
    /// With --prompt-cache: empty the server's prompt cache (the KV state saved before
    /// backends stop) instead.
    CleanupCache {
        /// List what would be removed, removing nothing.
        #[arg(long)]
        dry_run: bool,
        /// Empty the prompt cache instead of cleaning the Hugging Face cache.
        #[arg(long, conflicts_with = "dry_run")]
        prompt_cache: bool,
    },
    /// The server's download jobs (`pull --background`), or pause, resume, cancel or remove one.
    Downloads {
        #[command(subcommand)]
        action: Option<client::DownloadAction>,
    },
    /// Model aliases: names that mean another model, wherever a model name is taken.
    Alias {
        #[command(subcommand)]
        action: client::AliasAction,
    },
    /// Show the hardware and the backends' state.
    SystemInfo {
        /// Add details: versions, paths, the backend binaries in use.
        #[arg(long)]
        verbose: bool,
    },
    /// Print a shell completion script, e.g. `lemonade completions bash > ~/.local/share/bash-completion/completions/lemonade`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Run lemonade as a systemd user service: `install` writes
    /// ~/.config/systemd/user/lemonade.service (running `lemonade serve` with the arguments
    /// after `--`) and enables and starts it; `uninstall` stops, disables and removes it;
    /// `status` says where it is and whether it runs. `systemctl --user reload lemonade`
    /// re-reads config.json.
    Service {
        #[command(subcommand)]
        action: ServiceAction,
    },
    /// Write the man pages (lemonade.1 and one per command) into DIR (for packaging).
    #[command(hide = true)]
    Manpages {
        /// Where the pages go.
        dir: std::path::PathBuf,
    },
}

#[derive(Subcommand)]
enum ServiceAction {
    /// Write the user unit, then `systemctl --user daemon-reload` and `enable --now`.
    Install {
        /// Write the unit only; start nothing.
        #[arg(long)]
        no_start: bool,
        /// Arguments of `lemonade serve` in the unit, e.g. `-- --port 8001`.
        #[arg(last = true, allow_hyphen_values = true)]
        serve_args: Vec<String>,
    },
    /// `systemctl --user disable --now`, then remove the unit.
    Uninstall,
    /// Where the unit is, and `systemctl --user is-active`.
    Status,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogLevel {
    Critical,
    Error,
    Warning,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    fn name(self) -> &'static str {
        match self {
            LogLevel::Critical => "critical",
            LogLevel::Error => "error",
            LogLevel::Warning => "warning",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum LlamaBackend {
    Cpu,
    Vulkan,
    Rocm,
    Metal,
    /// The llama-server found on PATH.
    System,
}

/// Serve options (the listening address is the global --host and --port; every address the
/// host name resolves to is bound).
#[derive(clap::Args)]
struct ServeArgs {
    /// Log level.
    #[arg(long, env = "LEMONADE_LOG_LEVEL", value_enum, default_value = "info")]
    log_level: LogLevel,
    /// Context size for loaded models [default: 4096; embedding models at least 8192]; -1 or
    /// auto: the largest each model was trained for that fits the memory there is.
    #[arg(long, env = "LEMONADE_CTX_SIZE", allow_hyphen_values = true)]
    ctx_size: Option<api_types::CtxSize>,
    /// llama.cpp backend to run models with (`system`: the llama-server on PATH). A missing
    /// backend is installed on first use where a release exists for this platform.
    #[arg(long, env = "LEMONADE_LLAMACPP", value_enum, default_value = "cpu")]
    llamacpp: LlamaBackend,
    /// Extra llama-server arguments for every model, e.g. "--threads 4 --no-context-shift".
    /// Flags lemonade manages itself (-m, --port, --ctx-size, -ngl, …) are rejected.
    #[arg(long, env = "LEMONADE_LLAMACPP_ARGS", allow_hyphen_values = true)]
    llamacpp_args: Option<String>,
    /// Folder scanned for GGUF files to serve as `extra.<file name>` / `extra.<folder>` models.
    #[arg(long, env = "LEMONADE_EXTRA_MODELS_DIR")]
    extra_models_dir: Option<PathBuf>,
    /// Models of each type kept loaded (-1 = unlimited). One value sets every type; up to
    /// three set llm, embedding and reranking (other types get 1). Default 1 (or the saved
    /// value in config.json, see `lemonade config`).
    #[arg(long, env = "LEMONADE_MAX_LOADED_MODELS", num_args = 1..=3, value_delimiter = ' ',
          allow_negative_numbers = true)]
    max_loaded_models: Option<Vec<i64>>,
    /// Reject inference on a model that is not loaded (codes `model_not_loaded`,
    /// `model_loading`, `model_unloading`, `model_failed`) instead of loading it.
    #[arg(long, env = "LEMONADE_NO_AUTO_LOAD")]
    no_auto_load: bool,
    /// Seconds a backend gets to exit after SIGTERM before it is killed.
    #[arg(long, env = "LEMONADE_STOP_TIMEOUT", default_value_t = 5)]
    stop_timeout: u64,
    /// How often loaded backends are probed (ms); three failed probes in a row kill a wedged
    /// backend, whose model then reloads on the next request. 0 disables the watchdog.
    #[arg(long, env = "LEMONADE_WATCHDOG_INTERVAL_MS", default_value_t = 5000)]
    watchdog_interval_ms: u64,
    /// Seconds an automatic pull (a request for a model that is not downloaded) may take.
    #[arg(long, env = "LEMONADE_PULL_TIMEOUT", default_value_t = 3600)]
    pull_timeout: u64,
    /// Seconds a model may take to load before the load is abandoned.
    #[arg(long, env = "LEMONADE_LOAD_TIMEOUT", default_value_t = 600)]
    load_timeout: u64,
    /// Unload a model that has had no request for this many seconds (0 = never, the
    /// default). A model's own value (`load` with `idle_timeout`) takes precedence.
    #[arg(long, env = "LEMONADE_IDLE_TIMEOUT")]
    idle_timeout: Option<u64>,
    /// Requests that may wait for models, all together; beyond it, 503 with Retry-After
    /// (0 = unbounded). Default 256.
    #[arg(long, env = "LEMONADE_MAX_QUEUE")]
    max_queue: Option<u64>,
    /// Requests a model serves at once; further ones wait in lemonade's queue (default: the
    /// backend's parallel slots, 4 for llama-server unless --parallel is in its args).
    #[arg(long, env = "LEMONADE_MAX_CONCURRENT")]
    max_concurrent: Option<u32>,
    /// Memory lemonade lets its backends take together: bytes (8G, 512M), `auto` (free memory
    /// at start less a tenth, at least 1 GiB) or `none`. Least recently used models give way;
    /// a model that can never fit is refused (507). Default `auto`.
    #[arg(long, env = "LEMONADE_MEMORY_BUDGET")]
    memory_budget: Option<String>,
    /// GPU memory that models on GPU backends (llamacpp vulkan, rocm, metal) may take
    /// together, estimated from their GGUF with every layer offloaded: bytes, `auto` (free
    /// VRAM from NVML or amdgpu's sysfs, less a tenth, at least 512 MiB; no budget without a
    /// GPU) or `none`. Default `auto`.
    #[arg(long, env = "LEMONADE_VRAM_BUDGET")]
    vram_budget: Option<String>,
    /// Anti-thrash: how long (ms) a model that is serving keeps its slot against requests for
    /// another model before they swap it out (0 = swap at once). Default 2000.
    #[arg(long, env = "LEMONADE_SWAP_HOLD_MS")]
    swap_hold_ms: Option<u64>,
    /// Disk the prompt cache may take: bytes (4G, 512M) or 0 to turn it off. Before an LLM's
    /// llama-server is stopped (eviction, unload, idle timeout, swap; not a crash) the KV state
    /// of each slot that holds a prompt is saved under the cache dir, keyed by the model file
    /// and every option that shapes the cache; when the model loads again, a request that
    /// continues a saved prompt gets it back, so only its new tokens are prefilled. Least
    /// recently used files go first. Default 4G.
    #[arg(long, env = "LEMONADE_PROMPT_CACHE_SIZE", default_value = "4G")]
    prompt_cache_size: String,
    /// Seconds a remote provider may take to start answering (and to send the next chunk of a
    /// stream) before the request fails with 504 naming it.
    #[arg(long, env = "LEMONADE_REMOTE_TIMEOUT", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    remote_timeout: u64,
    /// The low-transfer timeout: seconds a streamed answer's backend may send nothing (no
    /// token; a long prefill is kept alive with SSE comments meanwhile) before the stream is
    /// cut with an error event. v11's `global_timeout` sets it too.
    #[arg(long, env = "LEMONADE_STREAM_TIMEOUT", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    stream_timeout: u64,
    /// No network call at all: no update check, no Hugging Face (a pull is a 400 naming the
    /// setting), no backend release download. Local models and installed backends serve as
    /// usual.
    #[arg(long, env = "LEMONADE_OFFLINE")]
    offline: bool,
    /// Bytes per second that downloads (models, backend releases) share: a number or a size
    /// such as 50M or 800K; 0 is unlimited (the default).
    #[arg(long, env = "LEMONADE_DOWNLOAD_RATE_LIMIT")]
    download_rate_limit: Option<String>,
    /// How listings name models: `v11` (current Lemonade, the default: a registered model by
    /// its bare name, a shadowed built-in as `builtin.X`) or `v9` (`user.X`, for clients
    /// pinned to Lemonade v9). Every name form is accepted in requests either way.
    #[arg(long, env = "LEMONADE_MODEL_NAMES", value_parser = ["v11", "v9"])]
    model_names: Option<String>,
    /// Export OpenTelemetry spans (each request, load and pull) over OTLP/HTTP to this endpoint,
    /// e.g. http://127.0.0.1:4318 (its /v1/traces). Off by default.
    #[arg(long, env = "LEMONADE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Seconds between refreshes of the remote providers' model lists (0: only on demand,
    /// `lemonade cloud list --refresh`).
    #[arg(long, env = "LEMONADE_REMOTE_REFRESH", default_value_t = 60)]
    remote_refresh: u64,
    /// The names `/metrics` also exports the per-model serving gauges under: `vllm` adds
    /// `vllm:num_requests_waiting`, `vllm:num_requests_running` and `vllm:kv_cache_usage_perc`
    /// (label `model_name`), so routers and inference gateways built for vLLM read lemonade.
    #[arg(long, env = "LEMONADE_METRICS_NAMES", value_enum, default_value = "lemonade")]
    metrics_names: MetricsNames,
    /// The request header that names a conversation; it is forwarded, with `traceparent` and
    /// `tracestate`, to the backends and remote upstreams.
    #[arg(long, env = "LEMONADE_SESSION_HEADER", default_value = "x-session-id", value_parser = session_header)]
    session_header: String,
    /// Failed requests in a row that open a remote provider's circuit breaker (0: never):
    /// while open, its requests are answered 503 with Retry-After without reaching it.
    #[arg(long, env = "LEMONADE_BREAKER_FAILURES", default_value_t = 5)]
    breaker_failures: u32,
    /// How long (ms) an open breaker refuses before one request probes the provider again.
    #[arg(long, env = "LEMONADE_BREAKER_OPEN_MS", default_value_t = 30_000)]
    breaker_open_ms: u64,
    /// Models to load at start, pulling them if needed (comma-separated).
    #[arg(long, env = "LEMONADE_PRELOAD", value_delimiter = ',')]
    preload: Vec<String>,
    /// Ask Hugging Face at start, in the background, whether the downloaded models have newer
    /// commits (Lemonade v11's start-up update check: `update_check_done` in health,
    /// `update_available` in /models). Off by default: lemonade makes no request a user did
    /// not ask for.
    #[arg(long, env = "LEMONADE_CHECK_UPDATES")]
    check_updates: bool,
    /// Serve an address other machines can reach (`--host 0.0.0.0`, a LAN address) with no API
    /// key. Without it such a start is refused: set LEMONADE_API_KEY instead.
    #[arg(long, env = "LEMONADE_ALLOW_NO_API_KEY")]
    allow_no_api_key: bool,
    /// How the kernel confines each backend process (Landlock with no_new_privs): `strict`
    /// (every rule enforced: files, TCP ports, signals; a kernel that cannot is an error),
    /// `best-effort` (what the kernel supports, the rest named in a warning and in
    /// /api/v1/health) or `off`. Default: strict where the kernel holds it, else best-effort.
    #[arg(long, env = "LEMONADE_SANDBOX", value_parser = sandbox_mode)]
    sandbox: Option<String>,
    /// The crash back-off's first pause (ms); it doubles with each crash in a row.
    #[arg(long, env = "LEMONADE_CRASH_BACKOFF_MS", default_value_t = 1_000, hide = true)]
    crash_backoff_ms: u64,
    /// How long (ms) a backend must run before its crashes stop counting towards the back-off.
    #[arg(long, env = "LEMONADE_CRASH_RESET_MS", default_value_t = 60_000, hide = true)]
    crash_reset_ms: u64,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum MetricsNames {
    Lemonade,
    Vllm,
}

/// `--sandbox`'s value.
fn sandbox_mode(s: &str) -> anyhow::Result<String> {
    match s == "auto" || backends::sandbox::Mode::parse(s).is_some() {
        true => Ok(s.trim().to_ascii_lowercase()),
        false => Err(anyhow::anyhow!("'{s}' is not strict, best-effort, off or auto")),
    }
}

/// A header name, lowercased (`--session-header`).
fn session_header(s: &str) -> anyhow::Result<String> {
    reqwest::header::HeaderName::from_bytes(s.trim().as_bytes())
        .map(|h| h.as_str().to_string())
        .map_err(|_| anyhow::anyhow!("'{s}' is not an HTTP header name"))
}

/// The configuration keys the flags and `LEMONADE_*` variables given on this command line set
/// (defaults left out): this run's overrides of `config.json`, never written back.
fn config_flags(a: &ServeArgs, m: Option<&clap::ArgMatches>) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::Value;
    let given =
        |id: &str| m.and_then(|m| m.value_source(id)).is_some_and(|s| s != clap::parser::ValueSource::DefaultValue);
    let backend = match a.llamacpp {
        LlamaBackend::Cpu => "cpu",
        LlamaBackend::Vulkan => "vulkan",
        LlamaBackend::Rocm => "rocm",
        LlamaBackend::Metal => "metal",
        LlamaBackend::System => "system",
    };
    let limits =
        a.max_loaded_models.as_ref().map(|v| if v.len() == 1 { Value::from(v[0]) } else { Value::from(v.clone()) });
    let all: [(&str, &str, Value); 19] = [
        ("sandbox", "sandbox", a.sandbox.clone().into()),
        ("log_level", "log_level", a.log_level.name().into()),
        ("extra_models_dir", "extra_models_dir", a.extra_models_dir.as_ref().map(|d| d.display().to_string()).into()),
        ("load_timeout", "load_timeout", a.load_timeout.into()),
        ("pull_timeout", "pull_timeout", a.pull_timeout.into()),
        ("remote_timeout", "remote_timeout", a.remote_timeout.into()),
        ("stream_timeout", "stream_timeout", a.stream_timeout.into()),
        ("offline", "offline", a.offline.into()),
        ("download_rate_limit", "download_rate_limit", download_rate(a.download_rate_limit.as_deref())),
        ("model_names", "model_names", a.model_names.clone().into()),
        ("max_loaded_models", "max_loaded_models", limits.unwrap_or(Value::Null)),
        ("idle_timeout", "idle_timeout", a.idle_timeout.into()),
        ("max_queue", "max_queue", a.max_queue.into()),
        ("memory_budget", "memory_budget", a.memory_budget.clone().into()),
        ("vram_budget", "vram_budget", a.vram_budget.clone().into()),
        ("swap_hold_ms", "swap_hold_ms", a.swap_hold_ms.into()),
        ("ctx_size", "ctx_size", serde_json::to_value(a.ctx_size).unwrap_or(Value::Null)),
        ("llamacpp_backend", "llamacpp", backend.into()),
        ("llamacpp_args", "llamacpp_args", a.llamacpp_args.clone().into()),
    ];
    all.into_iter().filter(|(_, id, v)| given(id) && !v.is_null()).map(|(k, _, v)| (k.to_string(), v)).collect()
}

/// `--download-rate-limit` as the config key takes it: a number, or the size string as given.
fn download_rate(v: Option<&str>) -> serde_json::Value {
    match v {
        None => serde_json::Value::Null,
        Some(s) => s.trim().parse::<u64>().map(serde_json::Value::from).unwrap_or_else(|_| s.into()),
    }
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LEMONADE_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("lemonade")
}

fn truthy(var: &str) -> bool {
    matches!(std::env::var(var).as_deref(), Ok("1" | "true" | "TRUE" | "yes"))
}

async fn serve(
    args: ServeArgs,
    start: engine::config::file::StartValues,
    host: String,
    port: u16,
    api_key: Option<String>,
    logs: std::sync::Arc<host::logging::LogHub>,
) -> anyhow::Result<()> {
    let cache = cache_dir();
    let mut cfg = engine::Config::new(cache.clone(), host::hf_cache::cache_root_from_env(|k| std::env::var(k).ok()));
    engine::config::file::configure(&mut cfg, &start)?;
    cfg.max_concurrent = args.max_concurrent.filter(|n| *n > 0);
    cfg.preload = args.preload.iter().map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect();
    for (pool, b) in [("memory", cfg.scheduler.memory_budget), ("VRAM", cfg.scheduler.vram_budget)] {
        if let Some(Some(b)) = b {
            tracing::info!(budget = %engine::error::bytes(b), "{pool} budget");
        }
    }
    cfg.disable_filtering = truthy("LEMONADE_DISABLE_MODEL_FILTERING");
    cfg.auto_load = !args.no_auto_load;
    cfg.stop_grace = Duration::from_secs(args.stop_timeout);
    cfg.remote_refresh = (args.remote_refresh > 0).then(|| Duration::from_secs(args.remote_refresh));
    cfg.prompt_cache_size = engine::config::settings::parse_bytes(&args.prompt_cache_size).with_context(|| {
        format!("--prompt-cache-size: '{}' is not a size (4G, 512M, bytes or 0)", args.prompt_cache_size)
    })?;
    cfg.crash_backoff = (Duration::from_millis(args.crash_backoff_ms), Duration::from_millis(args.crash_reset_ms));
    let confinement = host::sandbox::status(cfg.live.sandbox())?;
    if confinement.missing.is_empty() {
        tracing::info!(mode = %confinement.mode, landlock_abi = confinement.landlock_abi, "backends are sandboxed");
    } else {
        tracing::warn!(mode = %confinement.mode, landlock_abi = confinement.landlock_abi, missing = %confinement.missing.join("; "), "backends are not fully sandboxed");
    }
    cfg.watchdog_interval = (args.watchdog_interval_ms > 0).then(|| Duration::from_millis(args.watchdog_interval_ms));
    cfg.metrics_names = match args.metrics_names {
        MetricsNames::Lemonade => engine::metrics::MetricsNames::Lemonade,
        MetricsNames::Vllm => engine::metrics::MetricsNames::Vllm,
    };
    cfg.session_header = args.session_header.clone();
    cfg.breaker = backends::upstream::BreakerSettings {
        failures: if args.breaker_failures == 0 { u32::MAX } else { args.breaker_failures },
        open_ms: args.breaker_open_ms,
    };
    let mut http = server::Http::default();
    http.access.api_key = api_key.filter(|k| !k.is_empty());
    let env = |k: &str| std::env::var(k).ok();
    http.access.admin_key = env("LEMONADE_ADMIN_API_KEY").filter(|k| !k.is_empty());
    http.access.allowed_origins = server::access::Access::origins_from(env("LEMONADE_ALLOWED_ORIGINS").as_deref());
    http.access.allowed_hosts = server::access::Access::hosts_from(env("LEMONADE_ALLOWED_HOSTS").as_deref());
    http.access.listen_host = host.clone();

    // Bound first: an address other machines reach with no key is refused before anything starts.
    let listeners = server::bind(&host, port).await?;
    let keyless = http.access.api_key.is_none() && http.access.admin_key.is_none();
    if let Some(open) = listeners.iter().filter_map(|l| l.local_addr().ok()).find(|a| !a.ip().is_loopback()) {
        if keyless && !args.allow_no_api_key {
            anyhow::bail!(
                "refusing to listen on {open} (--host {host}) with no API key: anyone who can reach this machine could                  run, pull and delete models and change its settings. Set a key, e.g. `LEMONADE_API_KEY=$(openssl rand -hex 16)                  lemonade serve --host {host}` (clients then send `Authorization: Bearer <key>`; LEMONADE_ADMIN_API_KEY                  guards the management API apart), or pass --allow-no-api-key to serve it open anyway"
            );
        }
    }
    let engine = engine::Engine::start(cfg)?.with_logs(logs);
    engine::loads::preload(&engine);
    if args.check_updates {
        engine::pulls::check_updates_in_background(&engine);
    }
    reload_on_sighup(&engine);
    let rt = server::AppState::new(engine, http);
    // One PID file per port actually bound (port 0 picks one), removed again at exit.
    let mut ports: Vec<u16> = listeners.iter().filter_map(|l| l.local_addr().ok()).map(|a| a.port()).collect();
    ports.dedup();
    let mut pid_files = Vec::new();
    for p in ports {
        match process::write_pid_file(&cache, p) {
            Ok(f) => pid_files.push(f),
            Err(e) => tracing::warn!(error = %e, "no PID file: `lemonade stop` will not find this server"),
        }
    }
    let r = server::serve(rt, listeners, shutdown_signal()).await;
    for f in pid_files {
        let _ = std::fs::remove_file(f);
    }
    r
}

fn exit_code(r: anyhow::Result<()>) -> std::process::ExitCode {
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `lemonade service install|uninstall|status` (a systemd user unit; no server needed).
fn service(action: ServiceAction) -> anyhow::Result<()> {
    use host::service as svc;
    let path = svc::unit_path(|k| std::env::var(k).ok()).context("neither XDG_CONFIG_HOME nor HOME is set")?;
    match action {
        ServiceAction::Install { no_start, serve_args } => {
            let exe = std::env::current_exe().context("the path of this lemonade")?;
            svc::write_unit(&path, &svc::user_unit(&exe, &serve_args))?;
            println!("Wrote {}", path.display());
            if no_start {
                println!("Start it with: systemctl --user daemon-reload && systemctl --user enable --now lemonade");
                return Ok(());
            }
            svc::systemctl(&["daemon-reload"])?;
            svc::systemctl(&["enable", "--now", svc::UNIT])?;
            println!("lemonade.service enabled and started (systemctl --user status lemonade)");
        }
        ServiceAction::Uninstall => {
            // Stopping fails when it is not loaded: removing the file is what matters.
            let _ = svc::systemctl(&["disable", "--now", svc::UNIT]);
            let removed = svc::remove_unit(&path)?;
            let _ = svc::systemctl(&["daemon-reload"]);
            if removed {
                println!("Removed {}", path.display());
            } else {
                println!("No unit at {}; nothing to remove", path.display());
            }
        }
        ServiceAction::Status => {
            let installed = path.is_file();
            println!("unit: {} ({})", path.display(), if installed { "installed" } else { "not installed" });
            match svc::systemctl(&["is-active", svc::UNIT]) {
                Ok(state) => println!("state: {state}"),
                Err(e) => println!("state: unknown ({e})"),
            }
        }
    }
    Ok(())
}

/// SIGHUP (`systemctl reload`): config.json is read again and its changes applied.
fn reload_on_sighup(engine: &engine::Engine) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
    let engine = engine.clone();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match engine::configure::reload(&engine).await {
                Ok(keys) => tracing::info!(keys = ?keys.keys().collect::<Vec<_>>(), "SIGHUP: config.json reloaded"),
                Err(e) => tracing::error!(error = %e, "SIGHUP: config.json not reloaded; nothing changed"),
            }
        }
    });
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}

/// A server for the duration of one command: the running one, or (for commands that v9 also
/// serves this way, and `run`) one started on the configured port with `extra` serve flags,
/// stopped afterwards. `announce` says so on stderr (for `run`, whose chat can take long).
async fn with_server<T>(
    t: &Target,
    temporary: bool,
    extra: Vec<std::ffi::OsString>,
    announce: bool,
    f: impl AsyncFnOnce(&Target) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    if !temporary || t.health(Duration::from_secs(3)).await.is_some() {
        return f(t).await;
    }
    if announce {
        eprintln!("Starting Lemonade Server on port {}…", t.port);
    }
    let mut args: Vec<std::ffi::OsString> =
        vec!["--host".into(), t.host.clone().into(), "--port".into(), t.port.to_string().into()];
    args.extend(extra);
    let t2 = t.clone();
    let spawned = process::spawn_server(&cache_dir(), t.port, args, t.api_key.as_deref(), || {
        let t = t2.clone();
        async move { t.health(Duration::from_secs(1)).await.is_some() }
    })
    .await?;
    if announce {
        eprintln!("Server log: {}", spawned.log.display());
    }
    let r = f(t).await;
    if announce {
        eprintln!("Stopping the server this chat started…");
    }
    spawned.stop();
    r
}

async fn run(
    t: &Target,
    model: &str,
    load: &LoadArgs,
    extra_models_dir: Option<PathBuf>,
    max_tokens: Option<u32>,
) -> anyhow::Result<()> {
    let mut extra = Vec::new();
    if let Some(d) = extra_models_dir {
        extra.extend(["--extra-models-dir".into(), d.into_os_string()]);
    }
    with_server(t, true, extra, true, async |t| {
        eprintln!("Loading {model}…");
        let (body, client) = (load.body(model), t.client(None));
        tokio::select! {
            r = client.load(&body) => { r.context("Failed to load model")?; }
            _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted while loading {model}"),
        }
        chat::run(t, model, max_tokens).await
    })
    .await
}

async fn client_command(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    // The admin key is accepted on every endpoint, so a client command sends it when it is set.
    let admin = std::env::var("LEMONADE_ADMIN_API_KEY").ok().filter(|k| !k.is_empty());
    let t = Target { host: cli.host, port: cli.port, api_key: admin.or(cli.api_key.filter(|k| !k.is_empty())) };
    let json = cli.json;
    match cli.command {
        Command::Serve(_) | Command::Completions { .. } | Command::Manpages { .. } | Command::Service { .. } => {
            unreachable!("handled in main")
        }
        Command::Run { model, load, extra_models_dir, max_tokens } => {
            run(&t, &model, &load, extra_models_dir, max_tokens).await?
        }
        Command::List => with_server(&t, true, vec![], false, async |t| client::list(t, json).await).await?,
        Command::Pull(a) => with_server(&t, true, vec![], false, async |t| client::pull(t, a, json).await).await?,
        Command::Delete { model } => {
            with_server(&t, true, vec![], false, async |t| client::delete(t, model, json).await).await?
        }
        Command::Load { model, load } => client::load(&t, &model, &load, json).await?,
        Command::Unload { model } => client::unload(&t, model, json).await?,
        Command::Pin { model } => client::pin(&t, model, true, json).await?,
        Command::Unpin { model } => client::pin(&t, model, false, json).await?,
        Command::Status => {
            let pid = process::server_pid(&cache_dir(), t.port);
            if !client::status(&t, pid, json).await? {
                return Ok(std::process::ExitCode::FAILURE);
            }
        }
        Command::Stop { timeout } => stop(&t, Duration::from_secs(timeout), json)?,
        Command::Recipes { install, uninstall } => {
            let temporary = install.is_some() || uninstall.is_some();
            with_server(&t, temporary, vec![], false, async |t| client::recipes(t, install, uninstall, json).await)
                .await?
        }
        Command::Cloud { action } => client::cloud(&t, action, json).await?,
        Command::Alias { action } => client::alias(&t, action, json).await?,
        Command::CheckUpdates => client::check_updates(&t, json).await?,
        Command::Export { model, output } => client::export(&t, &model, output.as_deref()).await?,
        Command::Import { file } => client::import(&t, &file, json).await?,
        Command::CleanupCache { prompt_cache: true, .. } => client::clear_prompt_cache(&t, json).await?,
        Command::CleanupCache { dry_run, .. } => client::cleanup_cache(&t, dry_run, json).await?,
        Command::Downloads { action } => client::downloads(&t, action, json).await?,
        Command::Config { action } => client::config(&t, action, json).await?,
        Command::SystemInfo { verbose } => {
            with_server(&t, true, vec![], false, async |t| client::system_info(t, verbose, json).await).await?
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn stop(t: &Target, timeout: Duration, json: bool) -> anyhow::Result<()> {
    let cache = cache_dir();
    let Some(pid) = process::server_pid(&cache, t.port) else {
        if json {
            println!("{}", serde_json::json!({"status": "not_running", "port": t.port}));
        } else {
            println!("Lemonade Server is not running");
        }
        return Ok(());
    };
    let killed = process::stop(pid, timeout)?;
    let _ = std::fs::remove_file(process::pid_file(&cache, t.port));
    if json {
        println!("{}", serde_json::json!({"status": "stopped", "pid": pid, "port": t.port, "killed": killed}));
    } else if killed > 0 {
        println!("Lemonade Server stopped successfully ({killed} process(es) did not exit in time and were killed).");
    } else {
        println!("Lemonade Server stopped successfully.");
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Serve(args) => {
            let flags = config_flags(&args, matches.subcommand_matches("serve"));
            let start = match engine::config::file::start_values(&cache_dir(), &flags) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("Error: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let otlp = args.otlp_endpoint.clone().filter(|e| !e.is_empty());
            let logs = host::logging::init(engine::config::file::log_level(&start.values), otlp.as_deref());
            let telemetry = logs.clone();
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
            let served = rt.block_on(serve(args, start, cli.host, cli.port, cli.api_key, logs));
            telemetry.shutdown_telemetry();
            match served {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("Error: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "lemonade", &mut std::io::stdout());
            std::process::ExitCode::SUCCESS
        }
        Command::Manpages { dir } => {
            use clap::CommandFactory;
            exit_code(clap_mangen::generate_to(Cli::command(), &dir).map_err(anyhow::Error::from))
        }
        Command::Service { action } => exit_code(service(action)),
        _ => {
            // `lemonade list | head` ends quietly when the reader goes away, as other tools do.
            // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            }
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
            match rt.block_on(client_command(cli)) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("Error: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_argument_is_documented_and_the_cli_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
