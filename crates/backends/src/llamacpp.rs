//! The llama.cpp adapter: the `llama-server` command line for a model (reference §7.3).
//! Pure: no processes, no file system.

use std::path::PathBuf;

use api_types::{LoadOptions, ModelType};

use crate::capabilities::Capabilities;

/// llama-server's own endpoints lemonade forwards: POST ones, then GET ones.
pub const NATIVE_POST: [&str; 5] = ["/completion", "/tokenize", "/detokenize", "/apply-template", "/infill"];
pub const NATIVE_GET: [&str; 3] = ["/props", "/slots", "/metrics"];

/// Flags lemonade manages itself; `llamacpp_args` may not set them.
pub const RESERVED_FLAGS: &[&str] = &[
    "-m",
    "--model",
    "--ctx-size",
    "-c",
    "--port",
    "--host",
    "--jinja",
    "--no-jinja",
    "--mmproj",
    "-mm",
    "-mmu",
    "--mmproj-url",
    "--no-mmproj",
    "--mmproj-auto",
    "--no-mmproj-auto",
    "--mmproj-offload",
    "--no-mmproj-offload",
    "--embeddings",
    "--embedding",
    "--reranking",
    "--rerank",
    "-ngl",
    "--gpu-layers",
    "--n-gpu-layers",
    "-a",
    "--alias",
    "--rpc",
    "-cram",
    "--cache-ram",
];

/// The flags lemonade writes only where the binary has them: defaults a llama.cpp without them
/// runs well without (it has its own defaults, or lacks the feature).
const OPTIONAL_FLAGS: &[&str] =
    &["--context-shift", "--keep", "--reasoning-format", "--no-webui", "--metrics", "--cache-ram"];

/// The oldest llama.cpp lemonade supports and tests (docs/COMPATIBILITY.md).
pub const OLDEST_BUILD: u32 = 9093;

/// The API paths llama-server serves: OpenAI's under `/v1`, llama.cpp's own at the root.
pub const SERVED_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/rerank",
    "/completion",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/infill",
    "/props",
    "/slots",
    "/metrics",
];

/// The llama.cpp adapter: `llama-server`, which binds port 0 and prints the port it got.
pub struct LlamaCpp;

impl crate::Adapter for LlamaCpp {
    fn launch(&self, input: &crate::LaunchInput) -> Result<crate::Launch, crate::BackendError> {
        let recipe = crate::Recipe::LlamaCpp;
        let caps = input.caps;
        let mut args = command_line(
            &LlamaServerConfig {
                model_path: input.main_path.to_path_buf(),
                mmproj_path: input.mmproj_path.map(std::path::Path::to_path_buf),
                model_type: input.model_type,
                ctx_size: crate::ctx_size(input.options),
                parallel: input.options.parallel,
                backend: crate::backend_of(recipe, input.options),
                user_args: input.options.llamacpp_args.clone().unwrap_or_default(),
                amd_igpu: input.hardware.amd_igpu.is_some(),
                alias: input.name.to_string(),
                rpc: crate::rpc::workers(input.options),
                draft: input.draft_path.map(std::path::Path::to_path_buf),
                cache_ram_mib: input.options.cache_ram,
            },
            caps,
        )?;
        if offloads(&crate::backend_of(recipe, input.options)) {
            args.extend(crate::devices::llama_split_args(input.devices));
        }
        // Newer llama.cpp drafts only when told the kind of speculation (`--spec-type
        // draft-simple`); older ones draft with `-md` alone, and refuse that value. As a variable
        // (which a flag in `llamacpp_args` still overrides), set where the binary takes it.
        let drafts = caps.is_none_or(|c| c.takes("--spec-type", "draft-simple"));
        let env = match input.draft_path {
            Some(_) if drafts => vec![("LLAMA_ARG_SPEC_TYPE".to_string(), "draft-simple".to_string())],
            _ => vec![],
        };
        Ok(crate::Launch {
            args,
            env,
            readiness: crate::Readiness::ListeningLine,
            health_path: "/health",
            served_paths: SERVED_PATHS,
        })
    }
}

/// KV-cache types llama-server accepts for `--cache-type-k` / `--cache-type-v`.
pub const CACHE_TYPES: &[&str] = &["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"];

/// The runtime admin API's overrides as llama-server flags (`--flash-attn`, `--cache-type-k`,
/// `--cache-type-v`); an invalid value is an error naming the field.
pub fn override_args(
    flash_attn: Option<&str>,
    type_k: Option<&str>,
    type_v: Option<&str>,
) -> Result<Vec<String>, crate::BackendError> {
    let invalid = crate::BackendError::InvalidOverride;
    let mut args = Vec::new();
    if let Some(fa) = flash_attn {
        if !["on", "off", "auto"].contains(&fa) {
            return Err(invalid(format!("gguf_flash_attn must be on, off or auto, got '{fa}'")));
        }
        args.push(format!("--flash-attn {fa}"));
    }
    for (field, flag, v) in [("gguf_type_k", "--cache-type-k", type_k), ("gguf_type_v", "--cache-type-v", type_v)] {
        if let Some(t) = v {
            if !CACHE_TYPES.contains(&t) {
                return Err(invalid(format!("{field} must be one of {}, got '{t}'", CACHE_TYPES.join(", "))));
            }
            args.push(format!("{flag} {t}"));
        }
    }
    Ok(args)
}

pub const DEFAULT_CTX_SIZE: u32 = 4096;
/// Embedding models get at least this context (as Lemonade v9).
pub const MIN_EMBEDDING_CTX_SIZE: u32 = 8192;

/// What the command line is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaServerConfig {
    pub model_path: PathBuf,
    pub mmproj_path: Option<PathBuf>,
    pub model_type: ModelType,
    pub ctx_size: u32,
    /// `parallel`: that many slots, each with `ctx_size` of context of its own.
    pub parallel: Option<u32>,
    /// `cpu`, `vulkan`, `rocm` or `metal`.
    pub backend: String,
    /// The user's extra arguments (`llamacpp_args`), as one string.
    pub user_args: String,
    /// The host has an AMD iGPU (then mmap is off by default, as v9).
    pub amd_igpu: bool,
    /// The model name clients use (`--alias`): llama-server reports it as `model` in every
    /// answer, instead of the GGUF's path.
    pub alias: String,
    /// llama.cpp RPC workers (`host:port`), given to `--rpc`.
    pub rpc: Vec<String>,
    /// The draft model's file (speculative decoding: `-md`, offloaded as the model is).
    pub draft: Option<PathBuf>,
    /// The host-memory prompt cache lemonade gives it (`--cache-ram`, MiB; 0: none), counted
    /// in its memory estimate. None: llama-server's own default.
    pub cache_ram_mib: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error(
        "Invalid custom llama-server arguments: argument '{flag}' is managed by lemonade and cannot be overridden. \
         Reserved arguments: {reserved}"
    )]
    Reserved { flag: String, reserved: String },
    #[error("Invalid custom llama-server arguments: unterminated quote in: {0}")]
    UnterminatedQuote(String),
    /// A user's flag the binary does not list in its `--help`.
    #[error(
        "Invalid custom llama-server arguments: {backend} has no flag '{flag}' (not in its --help); nothing was started"
    )]
    Unsupported { flag: String, backend: String },
    /// A flag this load needs that the binary lacks: too old a llama.cpp, or one built
    /// without the feature (`--rpc` needs `GGML_RPC`).
    #[error(
        "{backend} has no '{flag}', which this load needs: it is older than lemonade supports (llama.cpp b{oldest} and later) or was built without that feature",
        oldest = OLDEST_BUILD
    )]
    Lacks { flag: String, backend: String },
}

/// Splits `llamacpp_args` on whitespace; single or double quotes group words and are removed.
pub fn tokenize(args: &str) -> Result<Vec<String>, ArgsError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_token = false;
    let mut quote: Option<char> = None;
    for c in args.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_token = true;
            }
            None if c.is_whitespace() => {
                if in_token {
                    out.push(std::mem::take(&mut cur));
                    in_token = false;
                }
            }
            None => {
                cur.push(c);
                in_token = true;
            }
        }
    }
    if quote.is_some() {
        return Err(ArgsError::UnterminatedQuote(args.to_string()));
    }
    if in_token {
        out.push(cur);
    }
    Ok(out)
}

/// The flag part of a token: `--keep=4` → `--keep`.
pub(crate) fn flag_of(token: &str) -> &str {
    if token.starts_with('-') {
        token.split_once('=').map_or(token, |(f, _)| f)
    } else {
        token
    }
}

/// Checks user arguments against the reserved list; the first offending flag is named.
pub fn validate_user_args(tokens: &[String]) -> Result<(), ArgsError> {
    match first_reserved(tokens, RESERVED_FLAGS) {
        Some(f) => {
            let mut reserved: Vec<&str> = RESERVED_FLAGS.to_vec();
            reserved.sort_unstable();
            Err(ArgsError::Reserved { flag: f.to_string(), reserved: reserved.join(", ") })
        }
        None => Ok(()),
    }
}

/// The first of `tokens` whose flag is one of `reserved` (any backend's user arguments).
pub(crate) fn first_reserved<'a>(tokens: &'a [String], reserved: &[&str]) -> Option<&'a str> {
    tokens.iter().map(|t| flag_of(t)).find(|f| reserved.contains(f))
}

fn user_sets(tokens: &[String], flags: &[&str]) -> bool {
    tokens.iter().any(|t| flags.contains(&flag_of(t)))
}

/// Whether `backend` runs the model's layers on a GPU: lemonade passes `-ngl 99` to every
/// backend but `cpu` (and users may not override it).
pub fn offloads(backend: &str) -> bool {
    backend != "cpu"
}

/// The `llama-server` arguments (without the program), listening on 127.0.0.1 with an
/// OS-chosen port (`--port 0`; the real port is read from the child's log), for a binary with
/// `caps` (None: not known, built for the newest llama.cpp lemonade knows). The user's
/// arguments are translated to the binary's spelling ([`user_for`]) and checked against it.
pub fn command_line(cfg: &LlamaServerConfig, caps: Option<&Capabilities>) -> Result<Vec<String>, ArgsError> {
    let user = user_for(&cfg.user_args, caps)?;
    let has = |f: &str| caps.is_none_or(|c| c.has(f));
    let cpu = !offloads(&cfg.backend);
    let ctx =
        if cfg.model_type == ModelType::Embedding { cfg.ctx_size.max(MIN_EMBEDDING_CTX_SIZE) } else { cfg.ctx_size };

    let mut a: Vec<String> = Vec::new();
    let mut push = |s: &str| a.push(s.to_string());
    push("-m");
    push(&cfg.model_path.display().to_string());
    // `parallel` slots of `ctx` each: the KV pool holds them all, and llama.cpp limits each
    // slot to its share (`--kv-unified-per-slot`), so one request cannot starve the others. A
    // llama.cpp without that flag splits a context given with `--parallel` into one KV cache
    // per slot, of `ctx` each: the same cells, the same limit.
    push("--ctx-size");
    push(&(u64::from(ctx) * u64::from(cfg.parallel.unwrap_or(1))).to_string());
    if let Some(n) = cfg.parallel {
        push("--parallel");
        push(&n.to_string());
        if has("--kv-unified-per-slot") {
            push("--kv-unified-per-slot");
            push(&ctx.to_string());
        }
    }
    push("--host");
    push("127.0.0.1");
    push("--port");
    push("0");
    push("--jinja");
    push("--alias");
    push(&cfg.alias);
    if let Some(mm) = &cfg.mmproj_path {
        push("--mmproj");
        push(&mm.display().to_string());
        if cpu {
            push("--no-mmproj-offload");
        }
    }
    // Overridable defaults: left out when the user sets the flag or its opposite, or when the
    // binary lacks it.
    if matches!(cfg.backend.as_str(), "vulkan" | "rocm")
        && !user_sets(&user, &["--context-shift", "--no-context-shift"])
    {
        push("--context-shift");
    }
    if !user_sets(&user, &["--keep"]) {
        push("--keep");
        push("16");
    }
    if !user_sets(&user, &["--reasoning-format"]) {
        push("--reasoning-format");
        push("auto");
    }
    if !user_sets(&user, &["--no-webui", "--webui", "--no-ui", "--ui"]) {
        push("--no-webui");
    }
    if !user_sets(&user, &["--metrics"]) {
        push("--metrics");
    }
    // v9's `--no-mmap` on AMD iGPU hosts, in the binary's spelling (`--load-mode none` since
    // llama.cpp replaced the flag).
    if cfg.amd_igpu && !user_sets(&user, &["--load-mode", "-lm", "--no-mmap", "--mmap"]) {
        if caps.is_none_or(|c| c.has("--load-mode")) {
            push("--load-mode");
            push("none");
        } else {
            push("--no-mmap");
        }
    }
    if let Some(mib) = cfg.cache_ram_mib {
        push("--cache-ram");
        push(&mib.to_string());
    }
    match cfg.model_type {
        ModelType::Embedding => push("--embeddings"),
        ModelType::Reranking => push("--reranking"),
        _ => {}
    }
    // With RPC workers the layers go to them: every layer is offloaded, whatever the backend.
    let ngl = if cpu && cfg.rpc.is_empty() { "0" } else { "99" };
    push("-ngl");
    push(ngl);
    if let Some(d) = &cfg.draft {
        // The draft's layers go where the model's go; how many tokens it drafts a step is
        // llama-server's default (its flags for that were renamed across versions:
        // `llamacpp_args` can set them).
        push("-md");
        push(&d.display().to_string());
        push("-ngld");
        push(ngl);
    }
    if !cfg.rpc.is_empty() {
        push("--rpc");
        push(&cfg.rpc.join(","));
    }
    if let Some(c) = caps {
        a = fit_own(a, c)?;
    }
    a.extend(user);
    Ok(a)
}

/// Lemonade's own arguments `a` for a binary with `c`: an optional default it lacks is left
/// out (with its value); a needed flag it lacks means too old a llama.cpp.
fn fit_own(a: Vec<String>, c: &Capabilities) -> Result<Vec<String>, ArgsError> {
    let mut out = Vec::with_capacity(a.len());
    let mut it = a.into_iter().peekable();
    while let Some(t) = it.next() {
        if !crate::capabilities::is_flag(&t) || c.has(&t) {
            out.push(t);
            continue;
        }
        if !OPTIONAL_FLAGS.contains(&t.as_str()) {
            return Err(ArgsError::Lacks { flag: t, backend: c.describe() });
        }
        // Its value goes with it.
        if it.peek().is_some_and(|v| !crate::capabilities::is_flag(v)) {
            it.next();
        }
    }
    Ok(out)
}

/// The user's `llamacpp_args` as arguments for a binary with `caps`: reserved flags refused;
/// the loading-mode flags translated between the two spellings llama.cpp has had (`--no-mmap` /
/// `--mmap` and `--load-mode none|mmap`), so a v9 or v11 user's `--no-mmap` loads on a new
/// llama.cpp and `--load-mode none` on an old one; then every flag checked against the binary.
pub fn user_for(args: &str, caps: Option<&Capabilities>) -> Result<Vec<String>, ArgsError> {
    let user = tokenize(args)?;
    validate_user_args(&user)?;
    let Some(c) = caps else { return Ok(user) };
    let mut out = Vec::with_capacity(user.len());
    let mut it = user.into_iter();
    while let Some(t) = it.next() {
        let flag = flag_of(&t).to_string();
        match flag.as_str() {
            "--no-mmap" | "--mmap" if !c.has(&flag) && c.has("--load-mode") => {
                out.push("--load-mode".to_string());
                out.push(if flag == "--no-mmap" { "none" } else { "mmap" }.to_string());
            }
            "--load-mode" | "-lm" if !c.has(&flag) && c.has("--no-mmap") => {
                let value = match t.split_once('=') {
                    Some((_, v)) => Some(v.to_string()),
                    None => it.next(),
                };
                match value.as_deref() {
                    Some("none") => out.push("--no-mmap".into()),
                    Some("mmap") | Some("auto") => out.push("--mmap".into()),
                    _ => {
                        return Err(ArgsError::Unsupported {
                            flag: format!("{flag} {}", value.unwrap_or_default()),
                            backend: c.describe(),
                        })
                    }
                }
            }
            _ => out.push(t),
        }
    }
    match c.unknown_flag(&out) {
        Some(f) => Err(ArgsError::Unsupported { flag: f.to_string(), backend: c.describe() }),
        None => Ok(out),
    }
}

/// llama-server's native sampling and slot fields that reach it in a request body, with the
/// range each must hold (inclusive). Outside it, llama.cpp has read or written out of bounds
/// (a negative `n_discard`, CVE-2026-21869); lemonade refuses them at its edge.
pub const NATIVE_RANGES: &[(&str, i64, i64)] = &[
    ("n_predict", -2, 1 << 24),
    ("n_keep", -1, 1 << 24),
    ("n_discard", 0, 1 << 24),
    ("n_probs", 0, 100),
    ("n_indent", 0, 1 << 16),
    ("id_slot", -1, 1 << 16),
    ("n_cmpl", 1, 1 << 10),
];

/// A chat request as llama-server reads it: `enable_thinking: false` puts `/no_think\n`
/// before the last user message whose content is a string, and `max_completion_tokens`
/// becomes `max_tokens` when that is absent. False: nothing changed (the client's bytes go on
/// as they came).
pub fn adapt_chat(req: &mut api_types::ChatCompletionRequest) -> bool {
    let mut changed = false;
    if req.enable_thinking == Some(false) {
        let last_user = req
            .messages
            .iter_mut()
            .rev()
            .find(|m| m.role == "user" && m.content.as_ref().is_some_and(|c| c.is_string()));
        if let Some(serde_json::Value::String(s)) = last_user.and_then(|m| m.content.as_mut()) {
            s.insert_str(0, "/no_think\n");
            changed = true;
        }
    }
    if req.max_tokens.is_none() && req.max_completion_tokens.is_some() {
        req.max_tokens = req.max_completion_tokens;
        changed = true;
    }
    changed
}

/// A completion request as llama-server reads it: `max_completion_tokens` becomes
/// `max_tokens` when that is absent. False: nothing changed.
pub fn adapt_completion(req: &mut api_types::CompletionRequest) -> bool {
    let adapt = req.max_tokens.is_none() && req.max_completion_tokens.is_some();
    if adapt {
        req.max_tokens = req.max_completion_tokens;
    }
    adapt
}

/// The first of `body`'s llama.cpp native fields that is not an integer in its range:
/// (message, field). A null stands for the default.
pub fn check_native(body: &serde_json::Map<String, serde_json::Value>) -> Result<(), (String, &'static str)> {
    for (field, lo, hi) in NATIVE_RANGES {
        match body.get(*field) {
            None | Some(serde_json::Value::Null) => {}
            Some(v) => match v.as_i64() {
                Some(n) if (*lo..=*hi).contains(&n) => {}
                Some(n) => return Err((format!("'{field}' must be from {lo} to {hi}, got {n}"), field)),
                None => return Err((format!("'{field}' must be an integer from {lo} to {hi}, got {v}"), field)),
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_fields_outside_their_range_are_refused_naming_them() {
        let body = |v: serde_json::Value| v.as_object().unwrap().clone();
        assert!(check_native(&body(
            serde_json::json!({"n_predict": -1, "n_keep": -1, "n_discard": 0, "id_slot": null})
        ))
        .is_ok());
        for (bad, field) in [
            (serde_json::json!({"n_discard": -5}), "n_discard"),
            (serde_json::json!({"n_probs": 1_000_000}), "n_probs"),
            (serde_json::json!({"id_slot": -7}), "id_slot"),
            (serde_json::json!({"n_keep": "all"}), "n_keep"),
            (serde_json::json!({"n_predict": 1.5}), "n_predict"),
            (serde_json::json!({"n_predict": -9_223_372_036_854_775_808i64}), "n_predict"),
        ] {
            let (msg, f) = check_native(&body(bad.clone())).unwrap_err();
            assert_eq!(f, field, "{bad}: {msg}");
            assert!(msg.starts_with(&format!("'{field}' must be")), "{msg}");
        }
    }

    fn cfg(model_type: ModelType, backend: &str, user_args: &str) -> LlamaServerConfig {
        LlamaServerConfig {
            model_path: "/models/m.gguf".into(),
            mmproj_path: None,
            model_type,
            ctx_size: DEFAULT_CTX_SIZE,
            parallel: None,
            backend: backend.into(),
            user_args: user_args.into(),
            amd_igpu: false,
            alias: "user.M".into(),
            rpc: vec![],
            draft: None,
            cache_ram_mib: None,
        }
    }

    #[test]
    fn a_draft_model_is_loaded_beside_and_offloaded_as_the_model() {
        let mut c = cfg(ModelType::Llm, "vulkan", "");
        c.draft = Some("/models/d.gguf".into());
        let l = command_line(&c, None).unwrap().join(" ");
        assert!(l.contains("-ngl 99 -md /models/d.gguf -ngld 99"), "{l}");
        c.backend = "cpu".into();
        assert!(command_line(&c, None).unwrap().join(" ").contains("-ngld 0"));
    }

    fn line(c: &LlamaServerConfig) -> String {
        command_line(c, None).unwrap().join(" ")
    }

    #[test]
    fn rpc_workers_take_every_layer() {
        let mut c = cfg(ModelType::Llm, "cpu", "");
        c.rpc = vec!["127.0.0.1:50052".into(), "10.0.0.2:50052".into()];
        let l = line(&c);
        assert!(l.contains("-ngl 99 --rpc 127.0.0.1:50052,10.0.0.2:50052"), "{l}");
        let e = command_line(&cfg(ModelType::Llm, "cpu", "--rpc 1.2.3.4:5"), None).unwrap_err();
        assert!(e.to_string().contains("'--rpc' is managed by lemonade"), "{e}");
    }

    #[test]
    fn llm_on_cpu() {
        insta::assert_snapshot!(line(&cfg(ModelType::Llm, "cpu", "")));
    }

    #[test]
    fn parallel_slots_each_get_the_context() {
        let mut c = cfg(ModelType::Llm, "cpu", "");
        (c.ctx_size, c.parallel) = (2048, Some(3));
        let l = line(&c);
        assert!(l.contains("--ctx-size 6144 ") && l.contains(" --parallel 3 --kv-unified-per-slot 2048 "), "{l}");
        let s = cache_settings(
            &LoadOptions { parallel: Some(3), ctx_size: Some(api_types::CtxSize::Tokens(2048)), ..Default::default() },
            ModelType::Llm,
        );
        assert_eq!((s.ctx_size, s.slots, s.kv_cells), (2048, 3, 6144));
        let shared =
            cache_settings(&LoadOptions { llamacpp_args: Some("-np 2".into()), ..Default::default() }, ModelType::Llm);
        assert_eq!(
            (shared.slots, shared.kv_cells),
            (2, u64::from(DEFAULT_CTX_SIZE)),
            "llama-server's own -np shares one context"
        );
    }

    #[test]
    fn llm_on_vulkan_with_mmproj_and_igpu() {
        let mut c = cfg(ModelType::Llm, "vulkan", "");
        c.mmproj_path = Some("/models/mmproj.gguf".into());
        c.amd_igpu = true;
        insta::assert_snapshot!(line(&c));
    }

    #[test]
    fn mmproj_on_cpu_is_not_offloaded() {
        let mut c = cfg(ModelType::Llm, "cpu", "");
        c.mmproj_path = Some("/models/mmproj.gguf".into());
        insta::assert_snapshot!(line(&c));
    }

    #[test]
    fn embedding_raises_ctx_and_adds_flag() {
        insta::assert_snapshot!(line(&cfg(ModelType::Embedding, "cpu", "")));
        let mut big = cfg(ModelType::Embedding, "cpu", "");
        big.ctx_size = 16384;
        assert!(line(&big).contains("--ctx-size 16384"));
    }

    #[test]
    fn reranking() {
        insta::assert_snapshot!(line(&cfg(ModelType::Reranking, "cpu", "")));
    }

    #[test]
    fn user_args_override_defaults_and_are_appended() {
        let c = cfg(
            ModelType::Llm,
            "vulkan",
            "--keep=4 --no-context-shift --webui -t 2 --reasoning-format none --slot-save-path '/tmp/my slots'",
        );
        insta::assert_snapshot!(line(&c));
    }

    #[test]
    fn reserved_flags_are_rejected_with_the_flag_named() {
        for (args, flag) in [
            ("--port 1", "--port"),
            ("-t 2 --ctx-size=99", "--ctx-size"),
            ("-ngl 5", "-ngl"),
            ("--host 0.0.0.0", "--host"),
        ] {
            let err = command_line(&cfg(ModelType::Llm, "cpu", args), None).unwrap_err();
            assert_eq!(err, ArgsError::Reserved { flag: flag.into(), reserved: err_reserved(&err) });
            let msg = err.to_string();
            assert!(msg.contains(&format!("argument '{flag}' is managed by lemonade")), "{msg}");
            assert!(msg.contains("Reserved arguments: --alias, --cache-ram, --ctx-size, --embedding"), "{msg}");
        }
    }

    fn err_reserved(e: &ArgsError) -> String {
        match e {
            ArgsError::Reserved { reserved, .. } => reserved.clone(),
            _ => unreachable!(),
        }
    }

    /// The two ends of the llama.cpp range lemonade supports, as their own `--help` and
    /// `--version` describe them (captured from the builds `cargo xtask setup` makes).
    fn ends() -> [(Capabilities, bool); 2] {
        let parse = |help, version| Capabilities::parse("llama-server", help, version).unwrap();
        [
            (
                parse(
                    include_str!("../testdata/llama-server-b11434.help"),
                    include_str!("../testdata/llama-server-b11434.version"),
                ),
                true,
            ),
            (
                parse(
                    include_str!("../testdata/llama-server-b9093.help"),
                    include_str!("../testdata/llama-server-b9093.version"),
                ),
                false,
            ),
        ]
    }

    #[test]
    fn every_command_line_fits_both_ends_of_the_supported_llama_cpp_range() {
        for (caps, newest) in ends() {
            let name = caps.describe();
            assert_eq!(name, if newest { "llama-server b11434" } else { "llama-server b9093" });
            let mut all = vec![];
            for backend in ["cpu", "vulkan"] {
                for t in [ModelType::Llm, ModelType::Embedding, ModelType::Reranking] {
                    all.push(cfg(t, backend, ""));
                }
            }
            let mut rich = cfg(ModelType::Llm, "vulkan", "--no-mmap -t 2");
            (rich.mmproj_path, rich.amd_igpu, rich.parallel, rich.cache_ram_mib) =
                (Some("/m/mmproj.gguf".into()), true, Some(2), Some(90));
            rich.draft = Some("/m/d.gguf".into());
            // The oldest build here is made without GGML_RPC: `--rpc` is refused, naming it.
            let mut rpc = rich.clone();
            rpc.rpc = vec!["127.0.0.1:50052".into()];
            match newest {
                true => all.push(rpc),
                false => assert_eq!(
                    command_line(&rpc, Some(&caps)).unwrap_err(),
                    ArgsError::Lacks { flag: "--rpc".into(), backend: name.clone() }
                ),
            }
            all.push(rich);
            let mut igpu = cfg(ModelType::Llm, "cpu", "");
            igpu.amd_igpu = true;
            all.push(igpu.clone());
            for c in &all {
                let args = command_line(c, Some(&caps)).unwrap();
                assert_eq!(caps.unknown_flag(&args), None, "{name}: {}", args.join(" "));
            }
            // v9's iGPU rule and a user's `--no-mmap` / `--load-mode none`, in each spelling.
            let line = |c: &LlamaServerConfig| command_line(c, Some(&caps)).unwrap().join(" ");
            assert_eq!(line(&igpu).contains("--load-mode none"), newest, "{name}");
            assert_eq!(line(&igpu).contains("--no-mmap"), !newest, "{name}");
            for user in ["--no-mmap", "--load-mode none", "-lm=none"] {
                let l = line(&cfg(ModelType::Llm, "cpu", user));
                let want = match newest {
                    true if user.starts_with("-lm") => user,
                    true => "--load-mode none",
                    false => "--no-mmap",
                };
                assert!(l.ends_with(want), "{name}, {user}: {l}");
            }
            // `parallel`: per-slot contexts where the flag exists, split contexts elsewhere.
            let mut par = cfg(ModelType::Llm, "cpu", "");
            (par.ctx_size, par.parallel) = (2048, Some(3));
            let l = line(&par);
            assert!(l.contains("--ctx-size 6144 ") && l.contains("--parallel 3"), "{l}");
            assert_eq!(l.contains("--kv-unified-per-slot 2048"), newest, "{name}: {l}");
            // An unknown flag: refused, naming it and the build.
            let e = command_line(&cfg(ModelType::Llm, "cpu", "-t 2 --no-such-flag=1"), Some(&caps)).unwrap_err();
            assert_eq!(e, ArgsError::Unsupported { flag: "--no-such-flag".into(), backend: name.clone() });
            assert!(e.to_string().contains(&format!("{name} has no flag '--no-such-flag'")), "{e}");
            // Speculative decoding's kind, set only where llama.cpp takes it.
            assert_eq!(caps.takes("--spec-type", "draft-simple"), newest, "{name}");
        }
    }

    #[test]
    fn a_llama_cpp_too_old_for_lemonade_is_named_and_optional_defaults_are_left_out() {
        let caps =
            Capabilities::parse("llama-server", "-m, --model FNAME   model\n--port N   port\n", "version: 5000 (abc)")
                .unwrap();
        let e = command_line(&cfg(ModelType::Llm, "cpu", ""), Some(&caps)).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("llama-server b5000 has no '--ctx-size'") && e.contains("b9093 and later"), "{e}");
        let help =
            "-m FNAME  x\n-c, --ctx-size N  x\n--host H  x\n--port N  x\n--jinja  x\n-a, --alias A  x\n-ngl N  x\n";
        let caps = Capabilities::parse("llama-server", help, "").unwrap();
        let mut c = cfg(ModelType::Llm, "cpu", "");
        c.cache_ram_mib = Some(64);
        let l = command_line(&c, Some(&caps)).unwrap().join(" ");
        assert!(
            !l.contains("--keep") && !l.contains("16") && !l.contains("--metrics") && !l.contains("--cache-ram"),
            "{l}"
        );
    }

    #[test]
    fn tokenizer_groups_quotes() {
        assert_eq!(tokenize("  -a 1 \"b c\" 'd e'f  ").unwrap(), ["-a", "1", "b c", "d ef"]);
        assert_eq!(tokenize("").unwrap(), Vec::<String>::new());
        assert_eq!(tokenize("''").unwrap(), [""]);
        assert!(matches!(tokenize("--x 'open"), Err(ArgsError::UnterminatedQuote(_))));
    }
}

/// What a llama-server's memory depends on besides its model: context, slots and KV cache
/// types, as `options` (and the `llamacpp_args` in them) set them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheSettings {
    /// The context one request may use (a slot's).
    pub ctx_size: u32,
    /// `--parallel` (llama-server's automatic value is 4).
    pub slots: u32,
    /// KV cells in all: `ctx_size × slots` with `parallel` (a slot's own context each), else
    /// `ctx_size` (llama-server's slots share one context).
    pub kv_cells: u64,
    pub cache_type_k: String,
    pub cache_type_v: String,
}

pub fn cache_settings(options: &LoadOptions, model_type: ModelType) -> CacheSettings {
    let ctx = crate::ctx_size(options);
    let ctx = if model_type == ModelType::Embedding { ctx.max(MIN_EMBEDDING_CTX_SIZE) } else { ctx };
    let tokens = options.llamacpp_args.as_deref().and_then(|a| tokenize(a).ok()).unwrap_or_default();
    let flag = |names: &[&str]| -> Option<String> {
        let mut it = tokens.iter();
        let mut found = None;
        while let Some(t) = it.next() {
            if names.contains(&t.as_str()) {
                found = it.next().cloned();
            } else if let Some((k, v)) = t.split_once('=') {
                if names.contains(&k) {
                    found = Some(v.to_string());
                }
            }
        }
        found
    };
    let slots = options
        .parallel
        .or_else(|| flag(&["-np", "--parallel"]).and_then(|n| n.parse::<u32>().ok()).filter(|n| *n > 0));
    CacheSettings {
        ctx_size: ctx,
        slots: slots.unwrap_or(4),
        kv_cells: u64::from(ctx) * u64::from(options.parallel.unwrap_or(1)),
        cache_type_k: flag(&["-ctk", "--cache-type-k"]).unwrap_or_else(|| "f16".into()),
        cache_type_v: flag(&["-ctv", "--cache-type-v"]).unwrap_or_else(|| "f16".into()),
    }
}

#[cfg(test)]
mod cache_settings_tests {
    use super::*;

    #[test]
    fn cache_settings_read_ctx_slots_and_cache_types_from_the_options() {
        let mut o = LoadOptions::default();
        let s = cache_settings(&o, ModelType::Llm);
        assert_eq!((s.ctx_size, s.slots, s.cache_type_k.as_str()), (DEFAULT_CTX_SIZE, 4, "f16"));
        o.ctx_size = Some(api_types::CtxSize::Tokens(2048));
        o.llamacpp_args = Some("-np 2 --cache-type-k=q8_0 -ctv q4_0".into());
        let s = cache_settings(&o, ModelType::Llm);
        assert_eq!((s.ctx_size, s.slots, s.cache_type_k.as_str(), s.cache_type_v.as_str()), (2048, 2, "q8_0", "q4_0"));
        assert_eq!(cache_settings(&o, ModelType::Embedding).ctx_size, MIN_EMBEDDING_CTX_SIZE);
    }
}

/// The share of a llama-server's KV cache its running requests hold (0 to 1), from its
/// `/slots` answer: the prompt and decoded tokens of each slot that is processing, over the
/// context of all slots. An idle slot's cells count as free (a new request may take them).
/// None when the answer is not a list of slots with a context.
pub fn kv_usage(slots: &serde_json::Value) -> Option<f64> {
    let slots = slots.as_array()?;
    let (mut used, mut cells) = (0u64, 0u64);
    for s in slots {
        let n_ctx = s.get("n_ctx")?.as_u64()?;
        cells += n_ctx;
        if s.get("is_processing").and_then(|p| p.as_bool()) == Some(true) {
            let prompt = s.get("n_prompt_tokens").and_then(|n| n.as_u64()).unwrap_or(0);
            let decoded = s
                .get("next_token")
                .and_then(|t| t.as_array().and_then(|a| a.first()).or(Some(t)))
                .and_then(|t| t.get("n_decoded"))
                .and_then(|n| n.as_u64())
                .unwrap_or(0);
            used += (prompt + decoded).min(n_ctx);
        }
    }
    (cells > 0).then(|| used as f64 / cells as f64)
}

#[cfg(test)]
mod kv_usage_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kv_usage_counts_the_tokens_of_processing_slots_over_all_cells() {
        let slots = json!([
            {"id": 0, "n_ctx": 1024, "is_processing": false},
            {"id": 1, "n_ctx": 1024, "is_processing": true, "n_prompt_tokens": 48,
             "next_token": [{"n_decoded": 208}]},
        ]);
        assert_eq!(kv_usage(&slots), Some(256.0 / 2048.0));
        // An older llama-server's `next_token` is an object; a slot never holds more than its context.
        let slots =
            json!([{"n_ctx": 100, "is_processing": true, "n_prompt_tokens": 90, "next_token": {"n_decoded": 50}}]);
        assert_eq!(kv_usage(&slots), Some(1.0));
        assert_eq!(kv_usage(&json!([])), None);
        assert_eq!(kv_usage(&json!({"error": "slots disabled"})), None);
        assert_eq!(kv_usage(&json!([{"id": 0}])), None);
    }
}

#[cfg(test)]
mod adapt_tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn a_chat_request_is_adapted_for_llama_server() {
        let raw = br#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"b"}]}],"enable_thinking":false,"max_completion_tokens":5,"top_k":3}"#;
        let mut req: api_types::ChatCompletionRequest = serde_json::from_slice(raw).unwrap();
        assert!(adapt_chat(&mut req));
        let v: Value = serde_json::to_value(&req).unwrap();
        // The last user message with string content is the first one (the second is an array).
        assert_eq!(v["messages"][0]["content"], "/no_think\na");
        assert_eq!(v["messages"][1]["content"][0]["text"], "b");
        assert_eq!((v["max_tokens"].as_u64(), v["max_completion_tokens"].as_u64()), (Some(5), Some(5)));
        assert_eq!((v["top_k"].as_u64(), v["enable_thinking"].as_bool()), (Some(3), Some(false)));
    }

    #[test]
    fn a_request_that_needs_nothing_is_left_as_it_came() {
        let raw = br#"{"model":"m",  "messages":[{"role":"user","content":"a"}], "max_tokens": 3}"#;
        let mut req: api_types::ChatCompletionRequest = serde_json::from_slice(raw).unwrap();
        assert!(!adapt_chat(&mut req), "the client's bytes go on unchanged");
        let mut c: api_types::CompletionRequest =
            serde_json::from_slice(br#"{"model":"m","prompt":"p","max_completion_tokens":4}"#).unwrap();
        assert!(adapt_completion(&mut c));
        assert_eq!(c.max_tokens, Some(4));
        assert!(!adapt_completion(&mut c), "max_tokens is there now");
    }
}
