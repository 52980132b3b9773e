//! The Kokoro adapter: lemonade's `koko` (an OpenAI-compatible speech server over ONNX Runtime,
//! with the command line of Kokoros' `koko`; see docs/ARCHITECTURE.md), and what lemonade checks
//! of a speech request before forwarding it. Pure: no processes, no file system.

use std::path::Path;

/// The Kokoro adapter: `koko`, told its port.
pub struct Kokoro;

pub const SPEECH_PATH: &str = "/v1/audio/speech";
pub const SERVED_PATHS: &[&str] = &[SPEECH_PATH];

/// The formats koko writes (streamed), and their content types.
pub const RESPONSE_FORMATS: &[(&str, &str)] = &[("wav", "audio/wav"), ("pcm", "audio/pcm")];
/// OpenAI's other formats, which this backend does not encode.
pub const OTHER_OPENAI_FORMATS: &[&str] = &["mp3", "opus", "aac", "flac"];
/// Kokoro's speed range (OpenAI's is wider: 0.25 to 4).
pub const SPEED: std::ops::RangeInclusive<f64> = 0.5..=2.0;

impl crate::Adapter for Kokoro {
    fn needs_port(&self) -> bool {
        true
    }

    fn launch(&self, input: &crate::LaunchInput) -> Result<crate::Launch, crate::BackendError> {
        crate::Launch::on_port(crate::Recipe::Kokoro, input, "/health", SERVED_PATHS, |port| {
            command_line(input.main_path, port)
        })
    }
}

/// `koko --index <index.json> openai --ip 127.0.0.1 --port <P>`: the model's `index.json`
/// names its ONNX file and its voices (v9 reads the same file and passes `-m` and `-d`).
pub fn command_line(index: &Path, port: u16) -> Vec<String> {
    vec![
        "--index".into(),
        index.display().to_string(),
        "openai".into(),
        "--ip".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
    ]
}

/// Why a speech request cannot be served, naming the field, or Ok.
pub fn check(input: &str, format: Option<&str>, speed: Option<f64>) -> Result<(), (String, &'static str)> {
    if input.trim().is_empty() {
        return Err(("'input' must not be empty".into(), "input"));
    }
    if let Some(f) = format.filter(|f| !RESPONSE_FORMATS.iter().any(|(n, _)| n == f)) {
        let ours = RESPONSE_FORMATS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" and ");
        let why = if OTHER_OPENAI_FORMATS.contains(&f) { "this backend does not encode it" } else { "unknown format" };
        return Err((
            format!("Unsupported response_format '{f}' ({why}): Kokoro here streams {ours}"),
            "response_format",
        ));
    }
    if let Some(s) = speed.filter(|s| !SPEED.contains(s)) {
        return Err((format!("Invalid value for 'speed': expected 0.5 to 2.0, got {s}"), "speed"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_names_the_index_and_the_port() {
        assert_eq!(
            command_line(Path::new("/hub/index.json"), 8200).join(" "),
            "--index /hub/index.json openai --ip 127.0.0.1 --port 8200"
        );
    }

    #[test]
    fn speech_requests_are_checked() {
        assert!(check("Hello.", None, None).is_ok());
        assert!(check("Hello.", Some("pcm"), Some(1.5)).is_ok());
        assert_eq!(check("  ", None, None).unwrap_err().1, "input");
        let (msg, field) = check("Hi", Some("mp3"), None).unwrap_err();
        assert_eq!(field, "response_format");
        assert!(msg.contains("this backend does not encode it"), "{msg}");
        assert!(check("Hi", Some("ogg"), None).unwrap_err().0.contains("unknown format"));
        assert_eq!(check("Hi", None, Some(3.0)).unwrap_err().1, "speed");
    }
}
