//! The image endpoints: generation, edits and variations (OpenAI's shapes plus Lemonade's sd
//! parameters), served by a model's sd-server.

use api_types::{ImageEditRequest, ImageGenerationRequest, SdParameters};
use axum::extract::State;
use axum::response::Response;
use backends::sdcpp::{self, SdParams};
use bytes::Bytes;
use http::Method;
use serde_json::json;

use crate::error::ApiError;
use crate::extract::{Form, JsonBody};
use crate::propagate::Edge;
use crate::proxy;
use crate::state::AppState;
use axum::Extension;
use engine::lease::Endpoint;

/// Image generation (OpenAI): PNGs from a prompt.
#[utoipa::path(post, path = "/api/v1/images/generations", tag = "OpenAI", request_body = ImageGenerationRequest)]
pub async fn generations(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    body: JsonBody<ImageGenerationRequest>,
) -> Result<Response, ApiError> {
    let r = body.value;
    let sd = SdParameters { steps: r.steps, cfg_scale: r.cfg_scale, seed: r.seed, sampler: r.sampler.clone() };
    sdcpp::checked(r.n, r.size.as_deref(), r.response_format.as_deref(), &sd)?;
    if r.prompt.trim().is_empty() {
        return Err(ApiError::bad_request("'prompt' must not be empty", Some("prompt")));
    }
    let mut upstream = json!({"prompt": sd.prompt_with(&r.prompt), "n": r.n.unwrap_or(1), "output_format": "png"});
    if let Some(size) = r.size {
        upstream["size"] = json!(size);
    }
    let lease = rt.engine.lease(edge.request(&r.model, Endpoint::ImageGenerations)).await?;
    let body = Bytes::from(serde_json::to_vec(&upstream)?);
    proxy::forward(lease, Method::POST, sdcpp::GENERATIONS_PATH, Some(body), false).await
}

/// Image edit (OpenAI): a source image (and an optional mask) redrawn after a prompt.
#[utoipa::path(
    post,
    path = "/api/v1/images/edits",
    tag = "OpenAI",
    request_body(content = ImageEditRequest, content_type = "multipart/form-data")
)]
pub async fn edits(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    form: Form,
) -> Result<Response, ApiError> {
    redraw(&rt, &edge, form, Endpoint::ImageEdits).await
}

/// Image variation (OpenAI): the source image redrawn with no prompt.
#[utoipa::path(
    post,
    path = "/api/v1/images/variations",
    tag = "OpenAI",
    request_body(content = ImageEditRequest, content_type = "multipart/form-data")
)]
pub async fn variations(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    form: Form,
) -> Result<Response, ApiError> {
    redraw(&rt, &edge, form, Endpoint::ImageVariations).await
}

/// An edit or a variation: the form checked, then sent on to sd-server's edit route.
async fn redraw(rt: &AppState, edge: &Edge, Form(form): Form, endpoint: Endpoint) -> Result<Response, ApiError> {
    let r = sdcpp::redraw(&form, endpoint == Endpoint::ImageVariations)?;
    let lease = rt.engine.lease(edge.request(r.model, endpoint)).await?;
    let mut upstream = reqwest::multipart::Form::new().text("prompt", r.prompt);
    for p in r.images {
        upstream = upstream.part("image[]", proxy::upload(p, Some("image")));
    }
    if let Some(mask) = r.mask {
        upstream = upstream.part("mask", proxy::upload(mask, Some("image")));
    }
    for (k, v) in [("n", r.n.map(|n| n.to_string())), ("size", r.size.map(str::to_string))] {
        if let Some(v) = v {
            upstream = upstream.text(k, v);
        }
    }
    proxy::forward_form(lease, sdcpp::EDITS_PATH, upstream.text("output_format", "png"), "application/json").await
}
