//! Client subcommands: thin over the server's HTTP API. Every command prints a human table or
//! message, or with `--json` one JSON document on stdout; errors go to stderr and exit 1.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use api_types::{
    DeleteRequest, DownloadControl, DownloadJob, Health, InstallRequest, LoadRequest, ModelList, PinRequest,
    PullProgress, PullRequest, SystemInfo, UnloadRequest,
};
pub use client::error_text;
use client::Client;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// Where the server is and how to authenticate (global flags).
#[derive(Clone, Debug)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
}

impl Target {
    /// The typed client of this server; `timeout` bounds each call (None: loads and pulls may
    /// take long).
    pub fn client(&self, timeout: Option<Duration>) -> Client {
        let c = Client::new(&format!("http://{}:{}", self.host, self.port), self.api_key.clone());
        match timeout {
            Some(t) => c.with_timeout(t),
            None => c,
        }
    }

    /// The server's health document, if a lemonade answers within `timeout`.
    pub async fn health(&self, timeout: Duration) -> Option<Health> {
        self.client(Some(timeout)).health().await.ok().filter(|h| h.status == "ok")
    }
}

/// `v` as JSON for `--json` output.
fn json_of(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Prints `v` when `--json`, else `text`.
fn out(json_out: bool, v: &Value, text: impl FnOnce() -> String) {
    if json_out {
        println!("{v}");
    } else {
        println!("{}", text());
    }
}

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// Model name: a catalogue model, or `user.<name>` to register one with --checkpoint and --recipe.
    pub model: String,
    /// `org/repo:VARIANT` on Hugging Face (registers a user.* model).
    #[arg(long)]
    pub checkpoint: Option<String>,
    /// Backend recipe of a registered model.
    #[arg(long, value_parser = ["llamacpp", "flm", "ryzenai-llm", "whispercpp", "sd-cpp", "kokoro", "collection.omni"])]
    pub recipe: Option<String>,
    /// An omni collection's models (with `--recipe collection.omni`): registered names, the
    /// planner (a chat model) first.
    #[arg(long, num_args = 1..)]
    pub components: Vec<String>,
    /// Label the model as a reasoning model.
    #[arg(long)]
    pub reasoning: bool,
    /// Label the model as a vision model.
    #[arg(long)]
    pub vision: bool,
    /// Label the model as an embedding model.
    #[arg(long)]
    pub embedding: bool,
    /// Label the model as a reranking model.
    #[arg(long)]
    pub reranking: bool,
    /// mmproj file name in the checkpoint's repository.
    #[arg(long)]
    pub mmproj: Option<String>,
    /// Start a server-owned download job and return at once (`lemonade downloads` follows
    /// it); without it the pull shows its progress and Ctrl+C cancels it.
    #[arg(long)]
    pub background: bool,
}

/// Renders a pull-style SSE stream (`progress`, `complete`, `error`) as a progress bar.
/// Returns the `complete` event's data.
async fn progress_stream(r: reqwest::Response, json_out: bool, what: &str) -> Result<PullProgress> {
    let bar = indicatif::ProgressBar::new(0);
    if json_out {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg}\n  [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .expect("template")
            .progress_chars("=> "),
    );
    let mut stream = r.bytes_stream();
    let mut buf = String::new();
    let mut current = 0u64;
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let kind = event.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("");
            let data = event.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("null");
            let progress = || serde_json::from_str::<PullProgress>(data).context("a progress event of another shape");
            match kind {
                "progress" => {
                    let p = progress()?;
                    if p.file_index as u64 != current {
                        current = p.file_index as u64;
                        bar.set_length(p.bytes_total);
                        bar.reset();
                        bar.set_message(format!("[{}/{}] {}", p.file_index, p.total_files, p.file));
                    }
                    if p.bytes_total > 0 {
                        bar.set_length(p.bytes_total);
                    }
                    bar.set_position(p.bytes_downloaded);
                }
                "complete" => {
                    bar.finish_and_clear();
                    return progress();
                }
                "error" => {
                    bar.abandon();
                    bail!("Error {what}: {}", error_text(&serde_json::from_str(data).unwrap_or(Value::Null)));
                }
                _ => {}
            }
        }
    }
    bar.abandon();
    bail!("{what} ended without success confirmation")
}

/// `lemonade pull`: streams the server's progress events into a progress bar.
pub async fn pull(t: &Target, a: PullArgs, json_out: bool) -> Result<()> {
    let flag = |on: bool| on.then_some(true);
    let body = PullRequest {
        model: Some(a.model.clone()),
        checkpoint: a.checkpoint,
        recipe: a.recipe,
        mmproj: a.mmproj,
        reasoning: flag(a.reasoning),
        vision: flag(a.vision),
        embedding: flag(a.embedding),
        reranking: flag(a.reranking),
        stream: Some(true),
        subscribe: a.background.then_some(false),
        ..Default::default()
    };
    if !a.components.is_empty() {
        let body = PullRequest { components: Some(json!(a.components)), stream: None, ..body };
        let _: api_types::StatusResponse = t.client(None).post("/pull", &body).await.context("Error pulling model")?;
        out(json_out, &json!({"status": "success", "model_name": a.model}), || {
            format!("Collection registered: {}", a.model)
        });
        return Ok(());
    }
    if a.background {
        let job: DownloadJob = t.client(None).post("/pull", &body).await.context("Error pulling model")?;
        out(json_out, &json_of(&job), || {
            format!("Downloading {} in the server ({}); see `lemonade downloads`", job.model_name, job.id)
        });
        return Ok(());
    }
    let r = t.client(None).post_stream("/pull", &body).await.context("Error pulling model")?;
    progress_stream(r, json_out, "pulling model").await?;
    out(json_out, &json!({"status": "success", "model_name": a.model}), || {
        format!("Model pulled successfully: {}", a.model)
    });
    Ok(())
}

/// `lemonade delete`.
pub async fn delete(t: &Target, model: String, json_out: bool) -> Result<()> {
    let req = DeleteRequest { model: Some(model.clone()), ..Default::default() };
    let v = t.client(None).delete(&req).await.context("Error deleting model")?;
    out(json_out, &json_of(&v), || format!("Model deleted successfully: {model}"));
    Ok(())
}

/// `lemonade list`: every model of the catalogue usable here, as a table.
pub async fn list(t: &Target, json_out: bool) -> Result<()> {
    let v: ModelList = t.client(Some(Duration::from_secs(30))).models(true).await?;
    out(json_out, &json_of(&v), || {
        let mut s = format!("{:<44} {:<11} {:<10} {:>8}  Labels\n", "Model Name", "Downloaded", "Recipe", "Size");
        s += &"-".repeat(100);
        for m in &v.data {
            let size = m.size.map(|s| format!("{s:.2} GB")).unwrap_or_default();
            s += &format!(
                "\n{:<44} {:<11} {:<10} {:>8}  {}",
                m.id,
                if m.downloaded { "Yes" } else { "No" },
                m.recipe,
                size,
                m.labels.join(", ")
            );
        }
        s + "\n" + &"-".repeat(100)
    });
    Ok(())
}

/// Load settings shared by `load` and `run`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LoadArgs {
    /// Context size for this load; -1 or auto: the largest the model was trained for that fits.
    #[arg(long, allow_hyphen_values = true)]
    pub ctx_size: Option<api_types::CtxSize>,
    /// llama.cpp: requests served at once, each with --ctx-size of context of its own.
    #[arg(long)]
    pub parallel: Option<u32>,
    /// Where it runs: auto, a device from system-info's compute_devices (gpu1, npu0), or
    /// several to split it over (gpu0,gpu1).
    #[arg(long)]
    pub device: Option<String>,
    /// llama.cpp: speculative decoding with this catalogue model as the draft (same vocabulary).
    #[arg(long)]
    pub draft_model: Option<String>,
    /// FastFlowLM: extra `flm serve` flags (Lemonade v11's safe list: --pmode turbo, …).
    #[arg(long, allow_hyphen_values = true)]
    pub flm_args: Option<String>,
    /// llama.cpp backend for this load.
    #[arg(long, value_parser = ["cpu", "vulkan", "rocm", "metal", "system"])]
    pub llamacpp: Option<String>,
    /// Extra llama-server arguments for this load.
    #[arg(long, allow_hyphen_values = true)]
    pub llamacpp_args: Option<String>,
    /// llama.cpp RPC workers for this load, comma-separated host:port of each rpc-server
    /// (run them only on a private network: rpc-server has no authentication).
    #[arg(long, value_delimiter = ',', value_name = "HOST:PORT")]
    pub rpc_servers: Option<Vec<String>>,
    /// Extra whisper-server arguments for this load.
    #[arg(long, allow_hyphen_values = true)]
    pub whispercpp_args: Option<String>,
    /// Merge the model's --llamacpp-args / --whispercpp-args with the server's (true, the
    /// default) or replace them (false).
    #[arg(long)]
    pub merge_args: Option<bool>,
    /// Save these settings as the model's defaults (recipe_options.json).
    #[arg(long)]
    pub save_options: bool,
    /// Pin it: never evicted nor unloaded for idleness until unpinned or unloaded.
    #[arg(long)]
    pub pin: bool,
    /// Unload it after this many seconds without a request (0 = never), instead of the
    /// server's --idle-timeout.
    #[arg(long)]
    pub idle_timeout: Option<u64>,
}

impl LoadArgs {
    pub fn body(&self, model: &str) -> LoadRequest {
        LoadRequest {
            model_name: model.to_string(),
            ctx_size: self.ctx_size.map(Some),
            parallel: self.parallel.map(Some),
            device: self.device.clone().map(Some),
            draft_model: self.draft_model.clone().map(Some),
            flm_args: self.flm_args.clone().map(Some),
            llamacpp_backend: self.llamacpp.clone().map(Some),
            llamacpp_args: self.llamacpp_args.clone().map(Some),
            rpc_servers: self.rpc_servers.clone().map(Some),
            whispercpp_args: self.whispercpp_args.clone().map(Some),
            merge_args: self.merge_args.map(Some),
            save_options: self.save_options.then_some(true),
            pinned: self.pin.then_some(true),
            idle_timeout: self.idle_timeout.map(Some),
            ..LoadRequest::default()
        }
    }
}

/// `lemonade load`.
pub async fn load(t: &Target, model: &str, a: &LoadArgs, json_out: bool) -> Result<()> {
    let v = t.client(None).load(&a.body(model)).await.context("Failed to load model")?;
    out(json_out, &json_of(&v), || format!("Model loaded successfully: {model}"));
    Ok(())
}

/// `lemonade unload [MODEL]`.
pub async fn unload(t: &Target, model: Option<String>, json_out: bool) -> Result<()> {
    let body = UnloadRequest { model_name: model.clone(), ..Default::default() };
    let v = t.client(None).unload(&body).await.context("Failed to unload")?;
    out(json_out, &json_of(&v), || match &model {
        Some(m) => format!("Model unloaded successfully: {m}"),
        None => "All models unloaded.".into(),
    });
    Ok(())
}

/// `lemonade pin` / `lemonade unpin`.
pub async fn pin(t: &Target, model: String, pinned: bool, json_out: bool) -> Result<()> {
    let body = PinRequest { model_name: model.clone(), pinned: Some(pinned) };
    let v = t.client(None).pin(&body).await.context(if pinned { "Failed to pin" } else { "Failed to unpin" })?;
    out(json_out, &json_of(&v), || {
        if pinned {
            format!("Pinned {model}: it stays loaded until unpinned or unloaded.")
        } else {
            format!("Unpinned {model}.")
        }
    });
    Ok(())
}

/// `lemonade cleanup-cache --prompt-cache`: empties the server's prompt cache.
pub async fn clear_prompt_cache(t: &Target, json_out: bool) -> Result<()> {
    let v = t.client(None).clear_prompt_cache().await.context("Failed to empty the prompt cache")?;
    out(json_out, &json_of(&v), || {
        format!("Removed {} saved prompts ({:.1} MB).", v.files_removed, v.bytes_freed as f64 / 1e6)
    });
    Ok(())
}

/// `lemonade status`: exit 0 when a server answers, 1 otherwise.
pub async fn status(t: &Target, pid: Option<u32>, json_out: bool) -> Result<bool> {
    let health = t.health(Duration::from_secs(3)).await;
    let loaded: Vec<Value> = health
        .iter()
        .flat_map(|h| &h.all_models_loaded)
        .map(|m| json!({"model_name": m.model_name, "type": m.model_type, "recipe": m.recipe, "device": m.device}))
        .collect();
    let running = health.is_some();
    let v = json!({
        "running": running,
        "host": t.host,
        "port": t.port,
        "pid": pid,
        "version": health.as_ref().map(|h| h.version.clone()),
        "loaded_models": loaded,
    });
    out(json_out, &v, || match (&health, pid) {
        (Some(_), _) => {
            let mut s = format!("Server is running on port {}", t.port);
            if let Some(p) = pid {
                s += &format!(" (pid {p})");
            }
            if loaded.is_empty() {
                s += "\nNo models loaded.";
            } else {
                s += "\nLoaded models:";
                for m in &loaded {
                    s += &format!(
                        "\n  {} ({}, {})",
                        m["model_name"].as_str().unwrap_or(""),
                        m["type"].as_str().unwrap_or(""),
                        m["recipe"].as_str().unwrap_or("")
                    );
                }
            }
            s
        }
        (None, Some(p)) => format!("Server (pid {p}) is not answering on port {}", t.port),
        (None, None) => "Server is not running".into(),
    });
    Ok(running)
}

/// `lemonade system-info`.
pub async fn system_info(t: &Target, verbose: bool, json_out: bool) -> Result<()> {
    let info: SystemInfo = t.client(Some(Duration::from_secs(60))).system_info(verbose).await?;
    let v = json_of(&info);
    out(json_out, &v, || {
        let mut s = String::new();
        for k in ["OS Version", "Processor", "Physical Memory"] {
            s += &format!("{k:<18}{}\n", v[k].as_str().unwrap_or(""));
        }
        s += "Devices:\n";
        if let Some(devs) = v["devices"].as_object() {
            const ORDER: [&str; 5] = ["cpu", "amd_igpu", "amd_dgpu", "nvidia_dgpu", "amd_npu"];
            let mut devs: Vec<_> = devs.iter().collect();
            devs.sort_by_key(|(k, _)| ORDER.iter().position(|o| o == k).unwrap_or(usize::MAX));
            for (kind, d) in devs {
                let list = match d {
                    Value::Array(a) => a.clone(),
                    Value::Object(_) => vec![d.clone()],
                    _ => continue,
                };
                for d in list {
                    let mut extra = Vec::new();
                    for f in ["cores", "threads", "vram_gb", "family", "driver_version"] {
                        if let Some(x) = d.get(f).filter(|x| !x.is_null() && *x != "") {
                            extra.push(format!(
                                "{f} {}",
                                x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string())
                            ));
                        }
                    }
                    s += &format!(
                        "  {kind:<12} {:<44} {:<14} {}\n",
                        d["name"].as_str().unwrap_or(""),
                        if d["available"] == true { "available" } else { "not available" },
                        extra.join(", ")
                    );
                }
            }
        }
        if let Some(d) = v.get("details") {
            s += &format!("Details:\n{}\n", serde_json::to_string_pretty(d).unwrap_or_default());
        }
        s + "\n" + &recipes_table(&v)
    });
    Ok(())
}

/// The recipe/backend table of a system-info document (v9's columns).
fn recipes_table(v: &Value) -> String {
    let line = "-".repeat(148);
    let mut s =
        format!("{:<20}{:<12}{:<16}{:<46}{}\n{line}\n", "Recipe", "Backend", "Status", "Message/Version", "Action");
    if let Some(recipes) = v["recipes"].as_object() {
        // In v9's preference order (the JSON object's keys come sorted).
        let order = |name: &str, list: &[&str]| list.iter().position(|x| *x == name).unwrap_or(usize::MAX);
        let recipe_names: Vec<&str> = backends::Recipe::ALL.iter().map(|r| r.as_str()).collect();
        let mut recipes: Vec<_> = recipes.iter().collect();
        recipes.sort_by_key(|(r, _)| order(r, &recipe_names));
        for (recipe, r) in recipes {
            let preferred = backends::Recipe::parse(recipe).map(backends::Recipe::backends).unwrap_or(&[]);
            if let Some(backends) = r["backends"].as_object() {
                let mut backends: Vec<_> = backends.iter().collect();
                backends.sort_by_key(|(b, _)| order(b, preferred));
                for (backend, b) in backends {
                    let state = b["state"].as_str().unwrap_or("");
                    let msg = match (state, b["message"].as_str().unwrap_or("")) {
                        ("installed", "") => b["version"].as_str().unwrap_or("").to_string(),
                        (_, m) => m.to_string(),
                    };
                    s += &format!(
                        "{recipe:<20}{backend:<12}{state:<16}{:<46}{}\n",
                        truncate(&msg, 45),
                        b["action"].as_str().unwrap_or("")
                    );
                }
            }
        }
    }
    s + &line
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}

fn recipe_backend(s: &str, flag: &str) -> Result<(String, String)> {
    match s.split_once(':') {
        Some((r, b)) if !r.is_empty() && !b.is_empty() => Ok((r.into(), b.into())),
        _ => bail!("{flag} requires format 'recipe:backend' (e.g. llamacpp:cpu), got '{s}'"),
    }
}

/// `lemonade recipes`: the backend table, or install/uninstall one.
pub async fn recipes(t: &Target, install: Option<String>, uninstall: Option<String>, json_out: bool) -> Result<()> {
    if let Some(spec) = install {
        let (recipe, backend) = recipe_backend(&spec, "--install")?;
        let req = InstallRequest {
            recipe: Some(recipe.clone()),
            backend: Some(backend.clone()),
            stream: Some(true),
            ..Default::default()
        };
        let r = t.client(None).post_stream("/install", &req).await.context("Error installing backend")?;
        let done = progress_stream(r, json_out, "installing backend").await?;
        let v = json!({"status": "success", "recipe": recipe, "backend": backend, "bytes": done.bytes_downloaded});
        out(json_out, &v, || format!("Backend installed successfully: {recipe}:{backend}"));
        return Ok(());
    }
    if let Some(spec) = uninstall {
        let (recipe, backend) = recipe_backend(&spec, "--uninstall")?;
        let req = InstallRequest { recipe: Some(recipe.clone()), backend: Some(backend.clone()), ..Default::default() };
        let v = t.client(None).uninstall(&req).await.context("Error uninstalling backend")?;
        out(json_out, &json_of(&v), || match v.message {
            Some(m) => m,
            None => format!("Backend uninstalled successfully: {recipe}:{backend}"),
        });
        return Ok(());
    }
    let v = json_of(&t.client(Some(Duration::from_secs(60))).system_info(false).await?);
    out(json_out, &v["recipes"], || recipes_table(&v));
    Ok(())
}

/// `lemonade cloud …`.
#[derive(clap::Subcommand)]
pub enum CloudAction {
    /// Register a provider (or point it elsewhere) and list its models. Its key is held by
    /// the running server only, never written to disk; `LEMONADE_<NAME>_API_KEY` in the
    /// server's environment works too.
    Install {
        /// Its name: its models become `<NAME>.<id>`.
        name: String,
        /// Its OpenAI API base, e.g. http://10.0.0.5:8000/v1 (a bare host:port gets /v1).
        #[arg(long)]
        base_url: String,
        /// Its API key (or `-` to read it from standard input, which keeps it out of the shell
        /// history).
        #[arg(long)]
        api_key: Option<String>,
    },
    /// The providers: state, last probe, where the key comes from, models.
    List {
        /// Probe every provider first.
        #[arg(long)]
        refresh: bool,
    },
    /// Forget a provider (its models disappear).
    Uninstall {
        /// The provider's name.
        name: String,
    },
    /// Give a registered provider a new key (held in memory by the running server).
    Auth {
        /// The provider's name.
        name: String,
        /// The key, or `-` (the default) to read it from standard input.
        #[arg(long, default_value = "-")]
        api_key: String,
    },
}

/// `-` → one line of standard input.
fn key_from(arg: Option<String>) -> Result<Option<String>> {
    match arg.as_deref() {
        Some("-") => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).context("reading the API key from standard input")?;
            Ok(Some(line.trim().to_string()).filter(|k| !k.is_empty()))
        }
        _ => Ok(arg),
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum DownloadAction {
    /// Stop a job's transfer; its partial files stay for `resume`.
    Pause {
        /// The model being downloaded.
        model: String,
    },
    /// Start a paused or cancelled job again, from the bytes on disk.
    Resume {
        /// The model being downloaded.
        model: String,
    },
    /// Stop a job for good (its partial files stay for a later pull).
    Cancel {
        /// The model being downloaded.
        model: String,
    },
    /// Forget a stopped job.
    Remove {
        /// The model of the job.
        model: String,
    },
}

/// `lemonade downloads [pause|resume|cancel|remove MODEL]`: the server-owned download jobs.
pub async fn downloads(t: &Target, action: Option<DownloadAction>, json_out: bool) -> Result<()> {
    let c = t.client(None);
    let (model, act) = match action {
        None => {
            let jobs: Vec<DownloadJob> = c.get("/downloads").await.context("Error listing downloads")?;
            out(json_out, &json_of(&jobs), || {
                let mut s = format!("{:<44} {:<12} {:>5}  {:>12}", "Model", "State", "%", "Rate");
                for j in &jobs {
                    let rate = if j.running { format!("{}/s", bytes_text(j.rate_bytes_per_s)) } else { String::new() };
                    let err = j.error.as_deref().map(|e| format!("  {e}")).unwrap_or_default();
                    s += &format!("\n{:<44} {:<12} {:>4}%  {rate:>12}{err}", j.model_name, j.status, j.percent);
                }
                s
            });
            return Ok(());
        }
        Some(DownloadAction::Pause { model }) => (model, "pause"),
        Some(DownloadAction::Resume { model }) => (model, "resume"),
        Some(DownloadAction::Cancel { model }) => (model, "cancel"),
        Some(DownloadAction::Remove { model }) => (model, "remove"),
    };
    let body = DownloadControl { id: format!("model:{model}"), action: act.into() };
    let v: Value = c.post("/downloads/control", &body).await.with_context(|| format!("Error: {act} {model}"))?;
    out(json_out, &v, || format!("{model}: {act} done"));
    Ok(())
}

fn bytes_text(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n => format!("{:.1} KiB", n as f64 / 1024.0),
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum ConfigAction {
    /// Change keys: `lemonade config set ctx_size=8192 log_level=debug`.
    Set {
        /// key=value pairs.
        #[arg(required = true, value_name = "KEY=VALUE")]
        pairs: Vec<String>,
    },
}

/// `key=value` as a configuration entry: the value as JSON where it parses, else as text.
fn config_pair(pair: &str) -> Result<(String, Value)> {
    let (k, v) = pair.split_once('=').with_context(|| format!("'{pair}' is not key=value"))?;
    let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
    Ok((k.trim().to_string(), value))
}

/// `lemonade config [set key=value …]`.
pub async fn config(t: &Target, action: Option<ConfigAction>, json_out: bool) -> Result<()> {
    let c = t.client(None);
    match action {
        None => {
            let v = c.config().await.context("Error reading the configuration")?;
            out(json_out, &Value::Object(v.clone()), || {
                v.iter().map(|(k, v)| format!("{k:<20} {v}")).collect::<Vec<_>>().join("\n")
            });
        }
        Some(ConfigAction::Set { pairs }) => {
            let values = pairs.iter().map(|p| config_pair(p)).collect::<Result<serde_json::Map<_, _>>>()?;
            let v = c.set_config(&values).await.context("Error changing the configuration")?;
            out(json_out, &json_of(&v), || {
                v.updated.iter().map(|(k, v)| format!("{k} = {v}")).collect::<Vec<_>>().join("\n")
            });
        }
    }
    Ok(())
}

#[derive(clap::Subcommand, Debug)]
pub enum AliasAction {
    /// Point ALIAS at TARGET_MODEL (creating or repointing it).
    Add {
        /// The alias (not a model's name, nor starting with user., extra. or builtin.).
        alias: String,
        /// The model it means (need not be pulled yet).
        target_model: String,
        /// Make it a parameter variant: a request field forced through the alias, KEY=VALUE
        /// (VALUE is JSON where it parses, else text); repeatable.
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
        /// A request field removed through the alias; repeatable.
        #[arg(long = "strip", value_name = "KEY")]
        strip: Vec<String>,
    },
    /// The aliases, their targets, and whether each target is here and downloaded.
    List,
    /// Remove an alias.
    Remove {
        /// The alias to remove.
        alias: String,
    },
}

/// `lemonade check-updates`.
pub async fn check_updates(t: &Target, json_out: bool) -> Result<()> {
    let v: api_types::CheckUpdates = t
        .client(Some(Duration::from_secs(300)))
        .post("/models/check-updates", &serde_json::json!({}))
        .await
        .context("Error checking for updates")?;
    out(json_out, &json_of(&v), || match v.models.len() {
        0 => "Every downloaded model is up to date".into(),
        _ => format!("Updates available ({}): {}", v.updates_available, v.models.join(", ")),
    });
    Ok(())
}

/// `lemonade cleanup-cache [--dry-run]`.
pub async fn cleanup_cache(t: &Target, dry_run: bool, json_out: bool) -> Result<()> {
    let v =
        t.client(Some(Duration::from_secs(300))).cleanup_cache(dry_run).await.context("Error cleaning the cache")?;
    out(json_out, &json_of(&v), || {
        let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
        let mut s = String::new();
        for f in &v.orphaned_files {
            s.push_str(&format!("  {} ({:.1} MB, {}) [from {}]\n", f.path, mb(f.size), f.kind, f.model));
        }
        for k in &v.skipped {
            s.push_str(&format!("  skipped {}: {}\n", k.repo, k.reason));
        }
        let n = v.orphaned_files.len();
        s.push_str(&match (n, dry_run) {
            (0, _) => "No orphaned files found. Cache is clean.".to_string(),
            (_, true) => {
                format!("Would free {:.1} MB from {n} file(s). Run without --dry-run to delete.", mb(v.total_bytes))
            }
            (_, false) => format!("Freed {:.1} MB from {n} file(s).", mb(v.total_bytes)),
        });
        s
    });
    Ok(())
}

/// `lemonade alias add|list|remove`.
pub async fn alias(t: &Target, action: AliasAction, json_out: bool) -> Result<()> {
    let c = t.client(None);
    match action {
        AliasAction::Add { alias, target_model, params, strip } => {
            let mut forced = serde_json::Map::new();
            for p in &params {
                let (k, v) = p.split_once('=').with_context(|| format!("--param {p}: expected KEY=VALUE"))?;
                forced.insert(k.to_string(), serde_json::from_str(v).unwrap_or_else(|_| Value::from(v)));
            }
            let variant = (!params.is_empty() || !strip.is_empty()).then_some((forced, strip));
            let v = c.set_alias(&alias, &target_model, variant).await.context("Error setting the alias")?;
            out(json_out, &json_of(&v), || format!("Alias {alias} -> {target_model}"));
        }
        AliasAction::Remove { alias } => {
            let v = c.remove_alias(&alias).await.context("Error removing the alias")?;
            out(json_out, &json_of(&v), || format!("Alias removed: {alias}"));
        }
        AliasAction::List => {
            let v = c.aliases().await.context("Error listing aliases")?;
            out(json_out, &json_of(&v), || {
                let mut s = format!("{:<30} {:<40} {:<10} {}", "Alias", "Target", "Recipe", "Downloaded");
                for a in &v.aliases {
                    let recipe = a.recipe.as_deref().unwrap_or("-");
                    let down = if a.downloaded { "Yes" } else { "No" };
                    s.push_str(&format!("\n{:<30} {:<40} {recipe:<10} {down}", a.alias, a.target));
                }
                s
            });
        }
    }
    Ok(())
}

pub async fn cloud(t: &Target, action: CloudAction, json_out: bool) -> Result<()> {
    let install = |name: String, base_url: Option<String>, api_key: Option<String>| InstallRequest {
        recipe: Some("cloud".into()),
        backend: Some(name),
        base_url,
        api_key,
        ..Default::default()
    };
    let req = match action {
        CloudAction::List { refresh } => {
            let v = t.client(Some(Duration::from_secs(60))).cloud(refresh).await.context("Error listing providers")?;
            out(json_out, &json_of(&v), || upstreams_table(&v.upstreams));
            return Ok(());
        }
        CloudAction::Uninstall { name } => {
            let v = t
                .client(None)
                .uninstall(&install(name.clone(), None, None))
                .await
                .context("Error removing provider")?;
            out(json_out, &json_of(&v), || v.message.clone().unwrap_or_else(|| format!("Provider removed: {name}")));
            return Ok(());
        }
        CloudAction::Install { name, base_url, api_key } => install(name, Some(base_url), key_from(api_key)?),
        CloudAction::Auth { name, api_key } => install(name, None, key_from(Some(api_key))?),
    };
    let v = t.client(Some(Duration::from_secs(60))).install(&req).await.context("Error registering provider")?;
    out(json_out, &json_of(&v), || {
        let name = v.backend.clone();
        format!("Provider {name}: {}", v.message.clone().unwrap_or_default())
    });
    Ok(())
}

fn upstreams_table(ups: &[api_types::Upstream]) -> String {
    if ups.is_empty() {
        return "No remote providers. Add one: lemonade cloud install NAME --base-url URL [--api-key KEY]".into();
    }
    let mut s = format!("{:<16} {:<8} {:<8} {:<40} {}\n", "NAME", "STATE", "KEY", "BASE URL", "MODELS");
    for u in ups {
        let why = u.last_probe.as_ref().and_then(|p| p.error.clone()).map(|e| format!(" ({e})")).unwrap_or_default();
        let models = if u.models.is_empty() { "-".to_string() } else { u.models.join(", ") };
        s.push_str(&format!("{:<16} {:<8} {:<8} {:<40} {models}{why}\n", u.name, u.state, u.api_key, u.base_url));
    }
    s.trim_end().to_string()
}

/// A model's importable definition: what `POST /pull` registers it from.
/// `m`'s definition as an import registers it: under `user.<name>` (the listings show a
/// registered model by its bare name).
fn definition(m: &api_types::Model, name: &str) -> Value {
    let bare = name.strip_prefix("user.").unwrap_or(name);
    let mut d = json!({"model_name": format!("user.{bare}"), "recipe": m.recipe, "checkpoint": m.checkpoint, "labels": m.labels});
    if !m.checkpoints.is_empty() {
        d["checkpoints"] = json!(m.checkpoints);
    }
    d
}

/// `lemonade export MODEL`: a plain model's definition, or a collection's with its policy and
/// the definitions of its `user.` components (others cannot be registered by an import).
pub async fn export(t: &Target, model: &str, output: Option<&std::path::Path>) -> Result<()> {
    let c = t.client(None);
    let m: api_types::Model = c.get(&format!("/models/{model}")).await.context("Error exporting the model")?;
    let mut file = definition(&m, if model.starts_with("user.") { model } else { &m.id });
    if let Some(components) = &m.components {
        let name = if model.starts_with("user.") { model.to_string() } else { format!("user.{}", m.id) };
        file = json!({"model_name": name, "recipe": m.recipe, "version": "1", "components": components});
        for (k, v) in [
            ("routing", json!(m.routing)),
            ("system_prompt", json!(m.system_prompt)),
            ("tool_format", json!(m.tool_format)),
        ] {
            if !v.is_null() {
                file[k] = v;
            }
        }
        // A registered component (listed by its bare name) is written `user.X` with its
        // definition; built-in and extra ones by name.
        let (mut models, mut names) = (Vec::new(), Vec::new());
        for name in components {
            let user = if name.starts_with("user.") { name.clone() } else { format!("user.{name}") };
            match c.get::<api_types::Model>(&format!("/models/{user}")).await {
                Ok(cm) => {
                    models.push(definition(&cm, &user));
                    names.push(user);
                }
                Err(_) if !name.starts_with("user.") => names.push(name.clone()),
                Err(e) => return Err(e).with_context(|| format!("Error reading {name}")),
            }
        }
        file["components"] = json!(names);
        file["models"] = Value::Array(models);
    }
    let text = serde_json::to_string_pretty(&file)? + "\n";
    match output {
        Some(p) => std::fs::write(p, text).with_context(|| format!("Cannot write {}", p.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}

/// `lemonade import FILE`: registers what `lemonade export` wrote (`POST /pull`).
pub async fn import(t: &Target, file: &std::path::Path, json_out: bool) -> Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("Cannot read {}", file.display()))?;
    let body: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    let v: api_types::StatusResponse =
        t.client(Some(Duration::from_secs(3600))).post("/pull", &body).await.context("Error importing")?;
    out(json_out, &json_of(&v), || {
        format!("Model imported successfully: {}", v.model_name.clone().unwrap_or_default())
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_backend_specs() {
        assert_eq!(recipe_backend("llamacpp:cpu", "--install").unwrap(), ("llamacpp".into(), "cpu".into()));
        let e = recipe_backend("llamacpp", "--install").unwrap_err().to_string();
        assert!(e.contains("requires format 'recipe:backend'"), "{e}");
        assert!(recipe_backend(":cpu", "--uninstall").is_err());
    }

    #[test]
    fn recipes_table_shows_state_and_action() {
        let v = json!({"recipes": {"llamacpp": {"backends": {
            "cpu": {"state": "installable", "message": "Backend is supported but not installed.", "action": "lemonade recipes --install llamacpp:cpu", "version": "b8175"},
            "vulkan": {"state": "installed", "message": "", "action": "", "version": "b8175"}
        }}}});
        let t = recipes_table(&v);
        assert!(
            t.lines().any(|l| l.starts_with("llamacpp")
                && l.contains("installable")
                && l.ends_with("--install llamacpp:cpu")),
            "{t}"
        );
        assert!(t.lines().any(|l| l.contains("vulkan") && l.contains("installed") && l.contains("b8175")), "{t}");
        assert_eq!(t.lines().nth(1).unwrap().len(), 148);
    }
}
