//! The FastFlowLM adapter: `flm serve` on the AMD NPU, as Lemonade v11.7 runs it on Windows and
//! Linux (its `src/cpp/server/backends/fastflowlm/`). Pure: the command lines, the readiness
//! rule and v11's safe `flm_args`; host runs them.
//!
//! A load runs `flm validate --json` (the NPU and its driver are usable), then
//! `flm pull <checkpoint>` (FLM keeps its own models: a checkpoint is a tag such as
//! `gemma3:1b`, not a file), then `flm serve`, told its port; FLM has no health endpoint, so
//! readiness is `/api/tags` answering. Requests are forwarded with `model` set to the
//! checkpoint, which FLM serves under.

/// The FLM adapter.
pub struct Flm;

/// The OpenAI paths `flm serve` answers.
pub const SERVED_PATHS: &[&str] = &["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

/// Where v11 sends users whose `flm validate` fails.
pub const DRIVER_INSTALL_URL: &str = "https://lemonade-server.ai/driver_install.html";

impl crate::Adapter for Flm {
    fn needs_port(&self) -> bool {
        true
    }

    fn launch(&self, input: &crate::LaunchInput) -> Result<crate::Launch, crate::BackendError> {
        let ctx = crate::ctx_size(input.options);
        let extra = resolve_args(input.options.flm_args.as_deref().unwrap_or(""), ctx)?;
        crate::Launch::on_port(crate::Recipe::Flm, input, "/api/tags", SERVED_PATHS, |port| {
            serve_args(input.checkpoint, input.model_type, ctx, port, &extra)
        })
    }
}

/// `flm serve …`: a chat model by its checkpoint with `--ctx-len`; an embedding model as
/// `--embed 1`, a transcription model as `--asr 1`; then `flm_args` and `--quiet`.
pub fn serve_args(
    checkpoint: &str,
    model_type: api_types::ModelType,
    ctx_size: u32,
    port: u16,
    extra: &[String],
) -> Vec<String> {
    let mut a: Vec<String> = vec!["serve".into()];
    match model_type {
        api_types::ModelType::Audio => a.extend(["--asr".into(), "1".into()]),
        api_types::ModelType::Embedding => a.extend(["--embed".into(), "1".into()]),
        _ => a.extend([checkpoint.to_string(), "--ctx-len".into(), ctx_size.to_string()]),
    }
    a.extend(["--port".into(), port.to_string(), "--host".into(), "127.0.0.1".into()]);
    a.extend(extra.iter().cloned());
    a.push("--quiet".into());
    a
}

/// `flm validate --json`: whether the NPU and its driver can run FLM.
pub fn validate_args() -> Vec<String> {
    vec!["validate".into(), "--json".into()]
}

/// `flm pull <checkpoint>` (no `--force`: an installed model is kept as it is).
pub fn pull_args(checkpoint: &str) -> Vec<String> {
    vec!["pull".into(), checkpoint.to_string()]
}

/// A refused `flm_args`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlmArgsError(pub String);

const MAX_ARGS_LEN: usize = 4096;
const MAX_TOKENS: usize = 12;

/// v11.7's safe `flm_args`: unquoted `--flag value` pairs, each flag once, only `--pmode`
/// (default, powersaver, balanced, performance, turbo), `--prefill-chunk-len` (-1 or 1 to
/// ctx_size), `--img-pre-resize` (0 to 4), `--socket` and `--q-len` (1 to 1024),
/// `--preemption` (0, 1, false, true); values come back canonical.
pub fn resolve_args(args: &str, ctx_size: u32) -> Result<Vec<String>, FlmArgsError> {
    let bad = |m: String| Err(FlmArgsError(m));
    if args.len() > MAX_ARGS_LEN {
        return bad("flm_args exceeds the maximum supported length".into());
    }
    if args.chars().any(|c| c == '\'' || c == '"' || c.is_control()) {
        return bad("flm_args accepts only unquoted, space-separated flag/value pairs".into());
    }
    let tokens: Vec<&str> = args.split(' ').filter(|t| !t.is_empty()).collect();
    if tokens.len() > MAX_TOKENS {
        return bad("flm_args contains too many arguments".into());
    }
    let mut out: Vec<String> = Vec::new();
    for pair in tokens.chunks(2) {
        let flag = pair[0];
        if !flag.starts_with("--") {
            return bad(format!("flm_args expects canonical long flags beginning with '--': {flag}"));
        }
        if flag.contains('=') {
            return bad(format!("flm_args requires '--flag value' syntax instead of '--flag=value': {flag}"));
        }
        if out.iter().step_by(2).any(|f| f == flag) {
            return bad(format!("flm_args contains a duplicate flag: {flag}"));
        }
        let Some(value) = pair.get(1) else { return bad(format!("flm_args flag requires a value: {flag}")) };
        out.push(flag.to_string());
        out.push(value_of(flag, value, ctx_size)?);
    }
    Ok(out)
}

fn value_of(flag: &str, v: &str, ctx: u32) -> Result<String, FlmArgsError> {
    let int = || v.parse::<i64>().map_err(|_| FlmArgsError(format!("{flag} requires an integer value")));
    let bad = |m: &str| Err(FlmArgsError(m.to_string()));
    match flag {
        "--pmode" if ["default", "powersaver", "balanced", "performance", "turbo"].contains(&v) => Ok(v.into()),
        "--pmode" => bad("--pmode must be one of: default, powersaver, balanced, performance, turbo"),
        "--prefill-chunk-len" => match int()? {
            n if n != -1 && n < 1 => bad("--prefill-chunk-len must be -1 or a positive integer"),
            n if n > 0 && ctx > 0 && n > i64::from(ctx) => bad("--prefill-chunk-len cannot exceed ctx_size"),
            n => Ok(n.to_string()),
        },
        "--img-pre-resize" => match int()? {
            n @ 0..=4 => Ok(n.to_string()),
            _ => bad("--img-pre-resize must be between 0 and 4"),
        },
        "--socket" | "--q-len" => match int()? {
            n @ 1..=1024 => Ok(n.to_string()),
            _ => Err(FlmArgsError(format!("{flag} must be between 1 and 1024"))),
        },
        "--preemption" => match v {
            "1" | "true" => Ok("1".into()),
            "0" | "false" => Ok("0".into()),
            _ => bad("--preemption must be one of: 0, 1, false, true"),
        },
        _ => Err(FlmArgsError(format!("flm_args flag is not allowed: {flag}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::ModelType;

    #[test]
    fn serve_lines_follow_v11() {
        let extra = vec!["--pmode".to_string(), "turbo".into()];
        assert_eq!(
            serve_args("gemma3:1b", ModelType::Llm, 4096, 8123, &extra).join(" "),
            "serve gemma3:1b --ctx-len 4096 --port 8123 --host 127.0.0.1 --pmode turbo --quiet"
        );
        assert_eq!(
            serve_args("embed-gemma:300m", ModelType::Embedding, 4096, 1, &[]).join(" "),
            "serve --embed 1 --port 1 --host 127.0.0.1 --quiet"
        );
        assert_eq!(serve_args("whisper-v3:turbo", ModelType::Audio, 4096, 1, &[])[1..3], ["--asr", "1"]);
        assert_eq!(pull_args("gemma3:1b"), ["pull", "gemma3:1b"]);
    }

    #[test]
    fn only_the_safe_flags_pass_and_values_come_back_canonical() {
        assert_eq!(resolve_args("", 4096).unwrap(), Vec::<String>::new());
        assert_eq!(
            resolve_args("--pmode balanced  --preemption true --q-len 8", 4096).unwrap(),
            ["--pmode", "balanced", "--preemption", "1", "--q-len", "8"]
        );
        for (args, why) in [
            ("--pmode fast", "--pmode must be one of"),
            ("--prefill-chunk-len 8192", "cannot exceed ctx_size"),
            ("--prefill-chunk-len 0", "-1 or a positive"),
            ("--img-pre-resize 5", "between 0 and 4"),
            ("--socket 0", "between 1 and 1024"),
            ("--q-len x", "integer value"),
            ("--pmode turbo --pmode turbo", "duplicate flag"),
            ("--pmode", "requires a value"),
            ("-p turbo", "canonical long flags"),
            ("--pmode=turbo", "'--flag value' syntax"),
            ("--host 0.0.0.0", "not allowed: --host"),
            ("--port 1", "not allowed: --port"),
            ("--pmode 'turbo'", "unquoted"),
            ("--q-len 1 --q-len 2 --a 1 --b 2 --c 3 --d 4 --e 5", "too many"),
        ] {
            let e = resolve_args(args, 4096).unwrap_err().0;
            assert!(e.contains(why), "{args}: {e}");
        }
    }
}
