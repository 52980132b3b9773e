//! The Ryzen AI adapter: `ryzenai-server` (an OpenAI-compatible server for ONNX models on the
//! AMD NPU), as Lemonade v9 runs it (reference §7.4). Pure: no processes, no file system.

use std::path::Path;

/// The Ryzen AI adapter: `ryzenai-server`, told its port.
pub struct RyzenAi;

impl crate::Adapter for RyzenAi {
    fn needs_port(&self) -> bool {
        true
    }

    fn launch(&self, input: &crate::LaunchInput) -> Result<crate::Launch, crate::BackendError> {
        crate::Launch::on_port(crate::Recipe::RyzenAiLlm, input, "/health", SERVED_PATHS, |port| {
            command_line(input.main_path, port, crate::ctx_size(input.options))
        })
    }
}

/// The OpenAI paths ryzenai-server serves.
pub const SERVED_PATHS: &[&str] = &["/v1/chat/completions", "/v1/completions", "/v1/responses"];

/// `ryzenai-server -m <model dir> --port <P> --ctx-size <N>`. The model directory is the one
/// holding `genai_config.json`. ryzenai-server cannot bind port 0 and report it, so the port is
/// chosen by the caller.
pub fn command_line(model_dir: &Path, port: u16, ctx_size: u32) -> Vec<String> {
    vec![
        "-m".into(),
        model_dir.display().to_string(),
        "--port".into(),
        port.to_string(),
        "--ctx-size".into(),
        ctx_size.to_string(),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn command_line() {
        insta::assert_snapshot!(super::command_line("/hub/models--amd--x/snapshots/abc".as_ref(), 8123, 4096).join(" "));
    }
}
