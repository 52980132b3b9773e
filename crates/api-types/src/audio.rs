//! The audio endpoints: transcription and translation (multipart, as OpenAI's).

use serde::{Deserialize, Serialize};

/// `POST /v1/audio/transcriptions` and `/v1/audio/translations`: a `multipart/form-data` body
/// with these fields. Other fields (whisper-server's own, such as `offset_t` or `beam_size`)
/// are passed through.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TranscriptionRequest {
    /// The audio, as a file part: WAV, MP3, FLAC or Ogg Vorbis.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = Binary))]
    #[serde(skip)]
    pub file: Vec<u8>,
    /// A transcription model (type `audio`, e.g. `Whisper-Tiny`).
    pub model: String,
    /// The spoken language (ISO-639-1, e.g. `en`); detected when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Text that guides the style or continues a previous segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<TranscriptionFormat>,
    /// Sampling temperature, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
}

/// The answer formats of a transcription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TranscriptionFormat {
    /// `{"text": …}` (the default).
    Json,
    /// The text alone, `text/plain`.
    Text,
    /// SubRip subtitles.
    Srt,
    /// The text with its language, duration and timed segments.
    VerboseJson,
    /// WebVTT subtitles.
    Vtt,
}

impl TranscriptionFormat {
    pub const ALL: [TranscriptionFormat; 5] = [
        TranscriptionFormat::Json,
        TranscriptionFormat::Text,
        TranscriptionFormat::Srt,
        TranscriptionFormat::VerboseJson,
        TranscriptionFormat::Vtt,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TranscriptionFormat::Json => "json",
            TranscriptionFormat::Text => "text",
            TranscriptionFormat::Srt => "srt",
            TranscriptionFormat::VerboseJson => "verbose_json",
            TranscriptionFormat::Vtt => "vtt",
        }
    }

    pub fn parse(s: &str) -> Option<TranscriptionFormat> {
        TranscriptionFormat::ALL.into_iter().find(|f| f.as_str() == s)
    }

    /// The content type of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            TranscriptionFormat::Text => "text/plain; charset=utf-8",
            TranscriptionFormat::Srt => "application/x-subrip",
            TranscriptionFormat::Vtt => "text/vtt",
            TranscriptionFormat::Json | TranscriptionFormat::VerboseJson => "application/json",
        }
    }
}

/// The `json` answer of a transcription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TranscriptionResponse {
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_round_trip() {
        for f in TranscriptionFormat::ALL {
            assert_eq!(TranscriptionFormat::parse(f.as_str()), Some(f));
            assert_eq!(serde_json::to_value(f).unwrap(), f.as_str());
        }
        assert_eq!(TranscriptionFormat::parse("mp3"), None);
        assert_eq!(TranscriptionFormat::Text.content_type(), "text/plain; charset=utf-8");
    }
}

/// `POST /v1/audio/speech`: text to speech. The audio is streamed as it is made. Other
/// OpenAI fields (`instructions`, `stream_format`, …) are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "kokoro-v1", "input": "Hello from lemonade.", "voice": "jf_alpha", "response_format": "wav"})))]
pub struct SpeechRequest {
    /// A speech model (type `tts`).
    pub model: String,
    /// The text to speak.
    pub input: String,
    /// One of the model's voices; its first when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voice: Option<String>,
    /// `wav` (default; streamed with open-ended sizes, as OpenAI's) or `pcm` (16-bit mono,
    /// 24 kHz). OpenAI's mp3, opus, aac and flac are refused with a 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<String>,
    /// 0.5 to 2.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<f64>,
}
