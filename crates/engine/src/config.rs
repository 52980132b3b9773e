//! The engine's settings, resolved from CLI flags and `LEMONADE_*` variables by the CLI (the
//! HTTP layer's own, such as access rules and the body limit, are the server's).

use std::path::PathBuf;
use std::time::Duration;

use scheduler::{Limits, Settings};

/// `--max-queue`'s default.
pub const DEFAULT_MAX_QUEUE: usize = 256;
/// `--swap-hold-ms`'s default.
pub const DEFAULT_SWAP_HOLD_MS: u64 = 2_000;

#[derive(Debug, Clone)]
pub struct Config {
    /// Lemonade's cache dir: `user_models.json`, `recipe_options.json`, `bin/`.
    pub cache_dir: PathBuf,
    /// Hugging Face hub cache root.
    pub hf_cache: PathBuf,
    pub extra_models_dir: Option<PathBuf>,
    /// `--ctx-size`, when given (else the built-in 4096 applies).
    pub ctx_size: Option<api_types::CtxSize>,
    /// `--llamacpp`: the llama.cpp backend (`cpu`, `vulkan`, `rocm`, `metal`).
    pub llamacpp_backend: String,
    /// `--llamacpp-args`, when given.
    pub llamacpp_args: Option<String>,
    /// Slot limits, idle timeout, queue bound, memory budget and anti-thrash hold: what the
    /// scheduler starts with (every field set; `POST /api/v1/params` changes them later).
    pub scheduler: Settings,
    /// Inference on a model that is not loaded loads it (else the request is rejected).
    pub auto_load: bool,
    pub disable_filtering: bool,
    /// How long a backend may take to load a model.
    pub ready_timeout: Duration,
    /// Grace period between SIGTERM and SIGKILL when a backend is stopped.
    pub stop_grace: Duration,
    /// How often loaded backends are probed; 3 failed probes in a row kill a wedged one.
    pub watchdog_interval: Option<Duration>,
    /// How long an automatic pull (inference or `/load` on a model not downloaded) may take.
    pub pull_timeout: Duration,
    /// Requests a model serves at once (None: its backend's parallel slots).
    pub max_concurrent: Option<u32>,
    /// Models loaded (and pulled if needed) at start.
    pub preload: Vec<String>,
    /// The crash back-off's first pause, and how long a backend must run before its crashes
    /// stop counting towards it.
    pub crash_backoff: (Duration, Duration),
    /// Bytes the prompt cache may take on disk (`--prompt-cache-size`); 0 turns it off.
    pub prompt_cache_size: u64,
    /// How long a remote provider may take to start answering (headers, then between chunks).
    pub remote_timeout: Duration,
    /// How often remote providers' model lists are refreshed (None: only on demand).
    pub remote_refresh: Option<Duration>,
    /// The Hugging Face endpoint to pull from (None: `HF_ENDPOINT`, else huggingface.co).
    pub hub_endpoint: Option<String>,
}

impl Config {
    /// `text` (an error an API client will read) without this machine's paths: the caches, the
    /// extra models dir and the home directory become placeholders. The server log keeps them.
    pub fn redact(&self, text: &str, home: Option<&str>) -> String {
        let mut paths: Vec<(String, &str)> = vec![
            (self.hf_cache.display().to_string(), "<hf-cache>"),
            (self.cache_dir.display().to_string(), "<lemonade-cache>"),
        ];
        if let Some(d) = &self.extra_models_dir {
            paths.push((d.display().to_string(), "<extra-models-dir>"));
        }
        if let Some(h) = home {
            paths.push((h.trim_end_matches('/').to_string(), "~"));
        }
        // Longest first, so a cache inside the home directory keeps its own name.
        paths.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        paths.iter().filter(|(p, _)| p.len() > 1).fold(text.to_string(), |t, (p, label)| t.replace(p.as_str(), label))
    }

    /// [`Config::redact`] with this process's `$HOME`: the text an API client may read.
    pub fn redact_here(&self, text: &str) -> String {
        self.redact(text, std::env::var("HOME").ok().as_deref())
    }

    /// Defaults for tests and embedding; the CLI fills every field from flags/env.
    pub fn new(cache_dir: PathBuf, hf_cache: PathBuf) -> Config {
        Config {
            cache_dir,
            hf_cache,
            extra_models_dir: None,
            ctx_size: None,
            llamacpp_backend: "cpu".into(),
            llamacpp_args: None,
            scheduler: Settings {
                limits: Some(Limits::uniform(1)),
                idle_timeout_ms: Some(None),
                max_queue: Some(Some(DEFAULT_MAX_QUEUE)),
                memory_budget: Some(None),
                vram_budget: Some(None),
                swap_hold_ms: Some(DEFAULT_SWAP_HOLD_MS),
            },
            auto_load: true,
            disable_filtering: false,
            ready_timeout: Duration::from_secs(600),
            stop_grace: Duration::from_secs(5),
            watchdog_interval: Some(Duration::from_secs(5)),
            pull_timeout: Duration::from_secs(3600),
            max_concurrent: None,
            preload: Vec::new(),
            crash_backoff: (
                Duration::from_millis(scheduler::machine::CRASH_BACKOFF_MS),
                Duration::from_millis(scheduler::machine::CRASH_RESET_MS),
            ),
            prompt_cache_size: 4 << 30,
            remote_timeout: Duration::from_secs(300),
            remote_refresh: Some(Duration::from_secs(60)),
            hub_endpoint: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_for_clients_carry_no_local_paths() {
        let mut cfg = Config::new("/home/u/.cache/lemonade".into(), "/home/u/.cache/huggingface/hub".into());
        cfg.extra_models_dir = Some("/data/models".into());
        let text = "llama_model_load: failed to load /home/u/.cache/huggingface/hub/models--a--b/x.gguf; \
                    see /home/u/.cache/lemonade/logs and /data/models/y.gguf, or /home/u/notes";
        assert_eq!(
            cfg.redact(text, Some("/home/u")),
            "llama_model_load: failed to load <hf-cache>/models--a--b/x.gguf; \
                    see <lemonade-cache>/logs and <extra-models-dir>/y.gguf, or ~/notes"
        );
        assert_eq!(cfg.redact("no paths here", Some("/")), "no paths here", "a root home is left alone");
    }
}
