//! The whisper.cpp adapter: `whisper-server` for a ggml Whisper model (reference §7.4:
//! `whisper-server -m <model .bin> --port <P>`), and what lemonade checks before it forwards a
//! transcription: the upload is audio whisper-server can decode, and the answer format is one
//! it writes. Pure: no processes, no file system.

use std::path::Path;

/// The whisper.cpp adapter: `whisper-server`, told its port (it cannot bind port 0 and report
/// the port it got).
pub struct WhisperCpp;

/// whisper-server's transcription endpoint (multipart, OpenAI's field names).
pub const INFERENCE_PATH: &str = "/inference";

/// The paths whisper-server serves.
pub const SERVED_PATHS: &[&str] = &[INFERENCE_PATH];

impl crate::Adapter for WhisperCpp {
    fn needs_port(&self) -> bool {
        true
    }

    fn launch(&self, input: &crate::LaunchInput) -> Result<crate::Launch, crate::BackendError> {
        let user = user_for(input.options.whispercpp_args.as_deref().unwrap_or_default(), input.caps)?;
        crate::Launch::on_port(crate::Recipe::WhisperCpp, input, "/health", SERVED_PATHS, |port| {
            let mut a = command_line(input.main_path, port);
            a.extend(user);
            a
        })
    }
}

/// The flags lemonade gives whisper-server itself.
pub const RESERVED_FLAGS: &[&str] = &["-m", "--model", "--host", "--port"];

/// A refused `whispercpp_args`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhisperArgsError {
    #[error(
        "Invalid custom whisper-server arguments: argument '{0}' is managed by lemonade and cannot be overridden. \
         Reserved arguments: -m, --model, --host, --port"
    )]
    Reserved(String),
    #[error("Invalid custom whisper-server arguments: unterminated quote in: {0}")]
    UnterminatedQuote(String),
    #[error(
        "Invalid custom whisper-server arguments: {backend} has no flag '{flag}' (not in its --help); nothing was started"
    )]
    Unsupported { flag: String, backend: String },
}

/// [`user_args`], each flag checked against the binary's `caps` when they are known.
pub fn user_for(args: &str, caps: Option<&crate::capabilities::Capabilities>) -> Result<Vec<String>, WhisperArgsError> {
    let user = user_args(args)?;
    match caps.and_then(|c| c.unknown_flag(&user).map(|f| (f, c))) {
        Some((flag, c)) => Err(WhisperArgsError::Unsupported { flag: flag.to_string(), backend: c.describe() }),
        None => Ok(user),
    }
}

/// `whispercpp_args` split into arguments (quotes group words), none of them a reserved flag.
pub fn user_args(args: &str) -> Result<Vec<String>, WhisperArgsError> {
    let tokens = crate::llamacpp::tokenize(args).map_err(|_| WhisperArgsError::UnterminatedQuote(args.into()))?;
    match crate::llamacpp::first_reserved(&tokens, RESERVED_FLAGS) {
        Some(f) => Err(WhisperArgsError::Reserved(f.to_string())),
        None => Ok(tokens),
    }
}

/// `whisper-server -m <model .bin> --host 127.0.0.1 --port <P>`.
pub fn command_line(model: &Path, port: u16) -> Vec<String> {
    vec![
        "-m".into(),
        model.display().to_string(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
    ]
}

/// The audio containers whisper-server decodes (miniaudio: WAV, MP3, FLAC; stb_vorbis: Ogg).
pub const AUDIO_FORMATS: &str = "WAV, MP3, FLAC or Ogg Vorbis";

/// The container of an upload, judged by its first bytes, if it is one whisper-server decodes.
pub fn audio_format(head: &[u8]) -> Option<&'static str> {
    let starts = |magic: &[u8]| head.starts_with(magic);
    if head.len() >= 12 && starts(b"RIFF") && &head[8..12] == b"WAVE" {
        Some("wav")
    } else if starts(b"fLaC") {
        Some("flac")
    } else if starts(b"OggS") {
        Some("ogg")
    } else if starts(b"ID3") || (head.len() >= 2 && head[0] == 0xFF && head[1] & 0xE0 == 0xE0) {
        Some("mp3")
    } else {
        None
    }
}

/// What a transcription upload asks for, once checked: the model, the answer's format.
#[derive(Debug, PartialEq)]
pub struct Upload<'a> {
    pub model: &'a str,
    pub format: api_types::TranscriptionFormat,
}

/// Checks a transcription's form before any model loads: a file that is audio whisper-server
/// reads, a model, a known `response_format` and a `temperature` from 0 to 1.
pub fn upload(form: &api_types::form::Form) -> Result<Upload<'_>, api_types::form::BadField> {
    use api_types::form::BadField;
    use api_types::TranscriptionFormat as F;
    let file = form.get("file").filter(|p| p.file_name.is_some() || !p.data.is_empty());
    let file = file.ok_or_else(|| BadField::new("Missing 'file' field in request", "file"))?;
    let model = form.required("model")?;
    if audio_format(&file.data).is_none() {
        let named = file.file_name.as_deref().map(|n| format!(" '{n}'")).unwrap_or_default();
        let msg = format!("The uploaded file{named} is not audio lemonade can transcribe: expected {AUDIO_FORMATS}");
        return Err(BadField::new(msg, "file"));
    }
    let format = match form.text("response_format")? {
        None | Some("") => F::Json,
        Some(f) => F::parse(f).ok_or_else(|| {
            let all = F::ALL.map(F::as_str).join(", ");
            BadField::new(format!("Unsupported response_format '{f}': expected one of {all}"), "response_format")
        })?,
    };
    if let Some(t) = form.text("temperature")?.filter(|t| !t.is_empty()) {
        if !t.trim().parse::<f32>().is_ok_and(|t| (0.0..=1.0).contains(&t)) {
            let msg = format!("Invalid value for 'temperature': expected a number from 0 to 1, got '{t}'");
            return Err(BadField::new(msg, "temperature"));
        }
    }
    Ok(Upload { model, format })
}

/// The form fields whisper-server does not get from the client as they are: lemonade's
/// `model`, and the two it sets itself (the format made explicit, `translate`).
pub const FIELDS_SET_HERE: &[&str] = &["model", "response_format", "translate"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_flags_are_checked_against_the_real_whisper_server_help() {
        let help = include_str!("../testdata/whisper-server-1.8.5.help");
        let caps =
            crate::capabilities::Capabilities::parse("whisper-server", help, "pywhispercpp-1.5.1-cpu-avx2").unwrap();
        assert!(caps.has("-t") && caps.has("--threads") && caps.has("-d") && caps.has("--duration"));
        assert_eq!(user_for("-t 2 --beam-size 3 -nt", Some(&caps)).unwrap(), ["-t", "2", "--beam-size", "3", "-nt"]);
        let e = user_for("-t 2 --no-such-flag", Some(&caps)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Invalid custom whisper-server arguments: whisper-server pywhispercpp-1.5.1-cpu-avx2 has no flag \
             '--no-such-flag' (not in its --help); nothing was started"
        );
        assert_eq!(user_for("--no-such-flag", None).unwrap(), ["--no-such-flag"], "unknown binary: not checked");
    }

    #[test]
    fn command_line_names_the_model_and_the_port() {
        assert_eq!(
            command_line(Path::new("/hub/ggml-tiny.en.bin"), 8123).join(" "),
            "-m /hub/ggml-tiny.en.bin --host 127.0.0.1 --port 8123"
        );
    }

    #[test]
    fn user_args_are_split_and_reserved_flags_refused() {
        assert_eq!(user_args("-t 2 --prompt 'hello there'").unwrap(), vec!["-t", "2", "--prompt", "hello there"]);
        assert_eq!(user_args("--port=9").unwrap_err(), WhisperArgsError::Reserved("--port".into()));
        assert_eq!(user_args("-m x.bin").unwrap_err(), WhisperArgsError::Reserved("-m".into()));
        assert!(matches!(user_args("'open"), Err(WhisperArgsError::UnterminatedQuote(_))));
    }

    #[test]
    fn audio_is_told_from_its_first_bytes() {
        assert_eq!(audio_format(b"RIFF\x24\x78\x02\x00WAVEfmt "), Some("wav"));
        assert_eq!(audio_format(b"RIFF\x24\x78\x02\x00AVI LIST"), None);
        assert_eq!(audio_format(b"fLaC\0\0\0\x22"), Some("flac"));
        assert_eq!(audio_format(b"OggS\0\x02"), Some("ogg"));
        assert_eq!(audio_format(b"ID3\x04\0\0"), Some("mp3"));
        assert_eq!(audio_format(&[0xFF, 0xFB, 0x90, 0x64]), Some("mp3"));
        assert_eq!(audio_format(b"\x89PNG\r\n\x1a\n"), None);
        assert_eq!(audio_format(b"hello, world"), None);
        assert_eq!(audio_format(b""), None);
    }

    #[test]
    fn an_upload_is_checked_field_by_field_before_any_model_loads() {
        use api_types::TranscriptionFormat as F;
        let wav: &[u8] = b"RIFF\0\0\0\0WAVEfmt ";
        let ok = api_types::form::Form::of(&[
            ("file", Some("a.wav"), wav),
            ("model", None, b"w"),
            ("response_format", None, b"srt"),
        ]);
        assert_eq!(upload(&ok), Ok(Upload { model: "w", format: F::Srt }));
        let refused = |f: &[(&str, Option<&str>, &[u8])]| upload(&api_types::form::Form::of(f)).unwrap_err();
        assert_eq!(refused(&[("model", None, b"w")]).field, "file");
        assert_eq!(refused(&[("file", Some("a.wav"), wav)]).field, "model");
        let e = refused(&[("file", Some("notes.txt"), b"hello"), ("model", None, b"w")]);
        assert!(e.message.contains("'notes.txt' is not audio") && e.field == "file", "{e:?}");
        let e = refused(&[("file", None, wav), ("model", None, b"w"), ("response_format", None, b"mp3")]);
        assert!(e.message.starts_with("Unsupported response_format 'mp3'"), "{e:?}");
        let e = refused(&[("file", None, wav), ("model", None, b"w"), ("temperature", None, b"2")]);
        assert_eq!(e.field, "temperature");
    }
}
