//! The audio endpoints: transcription and translation (OpenAI's multipart shape), served by a
//! model's whisper-server.

use api_types::{SpeechRequest, TranscriptionRequest};
use axum::extract::State;
use axum::response::Response;
use backends::whispercpp;

use crate::error::ApiError;
use crate::extract::{Form, JsonBody};
use crate::propagate::Edge;
use crate::proxy;
use crate::state::AppState;
use axum::Extension;
use engine::lease::Endpoint;

/// Text to speech (OpenAI), streamed as it is made.
#[utoipa::path(post, path = "/api/v1/audio/speech", tag = "OpenAI", request_body = SpeechRequest)]
pub async fn speech(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: JsonBody<SpeechRequest>,
) -> Result<Response, ApiError> {
    let r = body.value;
    backends::kokoro::check(&r.input, r.response_format.as_deref(), r.speed)
        .map_err(|(msg, field)| ApiError::bad_request(msg, Some(field)))?;
    let lease = rt.engine.lease(edge.request(&r.model, Endpoint::Speech)).await?;
    let upstream = serde_json::json!({"input": r.input, "voice": r.voice, "response_format": r.response_format, "speed": r.speed.unwrap_or(1.0)});
    proxy::forward_bytes(lease, backends::kokoro::SPEECH_PATH, bytes::Bytes::from(serde_json::to_vec(&upstream)?)).await
}

/// Transcription (OpenAI): the speech in an audio file as text.
#[utoipa::path(
    post,
    path = "/api/v1/audio/transcriptions",
    tag = "OpenAI",
    request_body(content = TranscriptionRequest, content_type = "multipart/form-data")
)]
pub async fn transcriptions(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    form: Form,
) -> Result<Response, ApiError> {
    transcribe(&rt, &edge, form, false).await
}

/// Translation (OpenAI): the speech in an audio file as English text.
#[utoipa::path(
    post,
    path = "/api/v1/audio/translations",
    tag = "OpenAI",
    request_body(content = TranscriptionRequest, content_type = "multipart/form-data")
)]
pub async fn translations(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    form: Form,
) -> Result<Response, ApiError> {
    transcribe(&rt, &edge, form, true).await
}

/// Checks the form, takes a lease on the model and forwards the form to its whisper-server:
/// every field but those [`whispercpp::FIELDS_SET_HERE`], the format made explicit, and
/// `translate` for a translation.
async fn transcribe(rt: &AppState, edge: &Edge, Form(form): Form, translate: bool) -> Result<Response, ApiError> {
    let up = whispercpp::upload(&form)?;
    let lease = rt.engine.lease(edge.request(up.model, Endpoint::Transcriptions)).await?;
    let mut out = reqwest::multipart::Form::new();
    for p in form.parts.iter().filter(|p| !whispercpp::FIELDS_SET_HERE.contains(&p.name.as_str())) {
        out = out.part(p.name.clone(), proxy::upload(p, None));
    }
    let out = out.text("response_format", up.format.as_str()).text("translate", translate.to_string());
    proxy::forward_form(lease, whispercpp::INFERENCE_PATH, out, up.format.content_type()).await
}
