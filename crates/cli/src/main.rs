//! `lemonade`: the local LLM server and its command line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use scheduler::Limits;

mod client;

#[derive(Parser)]
#[command(
    name = "lemonade",
    version,
    about = "A local LLM server with OpenAI-compatible APIs for many models at once."
)]
#[command(help_expected = true)]
struct Cli {
    /// Print machine-readable JSON (client commands).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the server in the foreground (Ctrl+C stops it and every backend it started).
    Serve(ServeArgs),
    /// Download a model into the Hugging Face cache (with a live progress bar); `user.<name>`
    /// with --checkpoint and --recipe registers a new model.
    Pull(client::PullArgs),
    /// Delete a downloaded model (and a user.* registration).
    Delete {
        /// Name of the model to delete.
        model: String,
        #[command(flatten)]
        target: client::Target,
    },
    /// List the models available on this machine.
    List {
        #[command(flatten)]
        target: client::Target,
    },
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
    /// Lemonade's levels as a tracing filter; backend output is shown from `debug` on.
    fn filter(self) -> &'static str {
        match self {
            LogLevel::Critical | LogLevel::Error => "error",
            LogLevel::Warning => "warn",
            LogLevel::Info => "info,backend=warn",
            LogLevel::Debug => "debug,backend=debug,hyper=info,reqwest=info",
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
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Port to listen on.
    #[arg(long, env = "LEMONADE_PORT", default_value_t = 8000)]
    port: u16,
    /// Address to listen on; every address the name resolves to is bound.
    #[arg(long, env = "LEMONADE_HOST", default_value = "localhost")]
    host: String,
    /// Log level.
    #[arg(long, env = "LEMONADE_LOG_LEVEL", value_enum, default_value = "info")]
    log_level: LogLevel,
    /// Context size for loaded models [default: 4096; embedding models at least 8192].
    #[arg(long, env = "LEMONADE_CTX_SIZE")]
    ctx_size: Option<u32>,
    /// llama.cpp backend to run models with.
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
    /// three set llm, embedding and reranking (other types get 1).
    #[arg(long, env = "LEMONADE_MAX_LOADED_MODELS", num_args = 1..=3, value_delimiter = ' ',
          default_value = "1", allow_negative_numbers = true)]
    max_loaded_models: Vec<i64>,
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
}

fn limits(values: &[i64]) -> anyhow::Result<Limits> {
    use api_types::ModelType;
    if let Some(bad) = values.iter().find(|v| **v != -1 && **v < 1) {
        anyhow::bail!("--max-loaded-models must be -1 (unlimited) or at least 1, got {bad}");
    }
    if let [n] = values {
        return Ok(Limits::uniform(*n));
    }
    let mut l = Limits::uniform(1);
    for (t, v) in [ModelType::Llm, ModelType::Embedding, ModelType::Reranking].into_iter().zip(values) {
        l.0.insert(t, *v);
    }
    Ok(l)
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

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let backend = match args.llamacpp {
        LlamaBackend::Cpu => "cpu",
        LlamaBackend::Vulkan => "vulkan",
        LlamaBackend::Rocm => "rocm",
        LlamaBackend::Metal => "metal",
    };
    if let Some(a) = &args.llamacpp_args {
        let tokens = backends::llamacpp::tokenize(a)?;
        backends::llamacpp::validate_user_args(&tokens).context("--llamacpp-args")?;
    }
    let mut cfg = server::Config::new(cache_dir(), registry::hf_cache::cache_root_from_env(|k| std::env::var(k).ok()));
    cfg.host = args.host.clone();
    cfg.port = args.port;
    cfg.extra_models_dir = args.extra_models_dir;
    cfg.ctx_size = args.ctx_size;
    cfg.llamacpp_backend = backend.into();
    cfg.llamacpp_args = args.llamacpp_args.filter(|a| !a.trim().is_empty());
    cfg.max_loaded_models = limits(&args.max_loaded_models)?;
    cfg.disable_filtering = truthy("LEMONADE_DISABLE_MODEL_FILTERING");
    cfg.ready_timeout = Duration::from_secs(args.load_timeout);
    cfg.auto_load = !args.no_auto_load;
    cfg.stop_grace = Duration::from_secs(args.stop_timeout);
    cfg.pull_timeout = Duration::from_secs(args.pull_timeout);
    cfg.watchdog_interval = (args.watchdog_interval_ms > 0).then(|| Duration::from_millis(args.watchdog_interval_ms));

    let rt = server::runtime(cfg)?;
    let listeners = server::bind(&args.host, args.port).await?;
    server::serve(rt, listeners, shutdown_signal()).await
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

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Serve(args) => args,
        client => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
            let r = rt.block_on(async {
                match client {
                    Command::Pull(a) => client::pull(a, cli.json).await,
                    Command::Delete { model, target } => client::delete(model, target, cli.json).await,
                    Command::List { target } => client::list(target, cli.json).await,
                    Command::Serve(_) => unreachable!(),
                }
            });
            return match r {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e:#}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
    };
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| args.log_level.filter().to_string());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(serve(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            std::process::ExitCode::FAILURE
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
