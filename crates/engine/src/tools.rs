//! The model calls that composed features make (the omni loop's tools, the MCP gateway's):
//! an image drawn, a transcription, each checked as the matching endpoint checks a client's
//! request and sent through [`crate::call`] in its backend's own shape. A failure is told as
//! the caller's tool reads it (the backend's own message when it gave one).

use api_types::SdParameters;
use backends::sdcpp::SdParams;
use base64::Engine as _;
use routing::omni::Failure;
use serde_json::{json, Value};

use crate::call::{call, Answer, Form, Part, Payload};
use crate::lease::{Endpoint, Forwarded, LeaseRequest};
use crate::Engine;

pub const B64: base64::engine::general_purpose::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A call to `model` at `endpoint`; its failure as a tool tells it.
pub async fn on(
    rt: &Engine,
    model: &str,
    endpoint: Endpoint,
    forwarded: &Forwarded,
    payload: Payload,
) -> Result<Answer, Failure> {
    let req = LeaseRequest::new(model, endpoint).forwarded(forwarded.clone());
    call(rt, req, payload).await.map_err(|e| Failure(e.told()))
}

/// What to draw.
#[derive(Debug, Default)]
pub struct Drawing<'a> {
    pub prompt: &'a str,
    pub n: Option<u32>,
    pub size: Option<&'a str>,
    pub sd: SdParameters,
}

/// The PNGs (base64) `model` draws for `d`, checked as images/generations checks a request.
pub async fn draw(rt: &Engine, model: &str, d: &Drawing<'_>, forwarded: &Forwarded) -> Result<Vec<String>, Failure> {
    backends::sdcpp::checked(d.n, d.size, None, &d.sd).map_err(|e| Failure(e.message))?;
    let mut req = json!({"prompt": d.sd.prompt_with(d.prompt), "n": d.n.unwrap_or(1), "output_format": "png"});
    if let Some(size) = d.size {
        req["size"] = size.into();
    }
    let answer = on(rt, model, Endpoint::ImageGenerations, forwarded, Payload::Json(req)).await?;
    images_of(&answer.body)
}

/// `source` (a PNG, base64) redrawn by `model` after `prompt`; the PNGs (base64).
pub async fn redraw(
    rt: &Engine,
    model: &str,
    prompt: &str,
    size: Option<&str>,
    source: &str,
    forwarded: &Forwarded,
) -> Result<Vec<String>, Failure> {
    let data = B64.decode(source).map_err(|e| Failure(format!("the image is not base64: {e}")))?;
    let mut form =
        Form::new().text("prompt", prompt.to_string()).part("image[]", Part::bytes(data).file_name("image.png"));
    if let Some(size) = size {
        backends::sdcpp::parse_size(size).map_err(|e| Failure(e.to_string()))?;
        form = form.text("size", size.to_string());
    }
    let answer =
        on(rt, model, Endpoint::ImageEdits, forwarded, Payload::Form(form.text("output_format", "png"))).await?;
    images_of(&answer.body)
}

fn images_of(body: &[u8]) -> Result<Vec<String>, Failure> {
    let v: Value = serde_json::from_slice(body).map_err(|e| Failure(e.to_string()))?;
    let images: Vec<String> =
        v["data"].as_array().into_iter().flatten().filter_map(|d| d["b64_json"].as_str().map(str::to_string)).collect();
    if images.is_empty() {
        return Err("the image model answered no image".into());
    }
    Ok(images)
}

/// What to transcribe: the audio file's name and bytes, its language, the answer's format
/// (`json` when none).
pub struct Hearing<'a> {
    pub file_name: String,
    pub data: Vec<u8>,
    pub language: Option<&'a str>,
    pub format: Option<&'a str>,
}

/// `model`'s transcription of `h`, its answer as whisper-server gave it; checked as
/// audio/transcriptions checks a request.
pub async fn transcribe(rt: &Engine, model: &str, h: Hearing<'_>, forwarded: &Forwarded) -> Result<Answer, Failure> {
    if backends::whispercpp::audio_format(&h.data).is_none() {
        let msg = format!(
            "'{}' is not audio lemonade can transcribe: expected {}",
            h.file_name,
            backends::whispercpp::AUDIO_FORMATS
        );
        return Err(Failure(msg));
    }
    let format = h.format.unwrap_or("json");
    if api_types::TranscriptionFormat::parse(format).is_none() {
        return Err(Failure(format!("Unsupported response_format '{format}'")));
    }
    let mut form = Form::new().part("file", Part::bytes(h.data).file_name(h.file_name));
    if let Some(lang) = h.language {
        form = form.text("language", lang.to_string());
    }
    let form = form.text("response_format", format.to_string()).text("translate", "false");
    on(rt, model, Endpoint::Transcriptions, forwarded, Payload::Form(form)).await
}
