//! The image endpoints: generation, edits and variations (OpenAI's shapes plus Lemonade's sd
//! parameters), served by a model's sd-server.

use api_types::{ErrorResponse, ImageEditRequest, ImageGenerationRequest, ImagesResponse, SdParameters};
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
#[utoipa::path(post, path = "/api/v1/images/generations", tag = "OpenAI",
    description = "Also under /api/v0, /v0 and /v1. Loads the model on demand and asks its sd-server. The answer \
                   holds base64 PNGs (`b64_json`) of the requested `size`; `steps`, `cfg_scale`, `seed` and `sampler` \
                   override the model's defaults.",
    request_body = ImageGenerationRequest,
    responses(
        (status = 200, description = "The images", body = ImagesResponse),
        (status = 400, description = "An empty prompt, an unsupported size, n or response_format, a bad sd parameter, or a model that is not an image model", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 500, description = "The model failed to load", body = ErrorResponse),
        (status = 502, description = "The backend died or could not be reached", body = ErrorResponse),
    ))]
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
#[utoipa::path(post, path = "/api/v1/images/edits", tag = "OpenAI",
    description = "Also under /api/v0, /v0 and /v1. A multipart/form-data upload: `image` (or `image[]`), an optional \
                   `mask`, `prompt`, `model`, and optionally n, size and the sd parameters. sd-server redraws the image.",
    request_body(content = ImageEditRequest, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The images", body = ImagesResponse),
        (status = 400, description = "Not multipart, no image or model, a file that is not an image, an empty prompt, or a bad parameter", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 413, description = "Body larger than the limit", body = ErrorResponse),
        (status = 500, description = "The model failed to load", body = ErrorResponse),
        (status = 502, description = "The backend died or could not be reached", body = ErrorResponse),
    ))]
pub async fn edits(
    State(rt): State<AppState>,
    Extension(edge): Extension<Edge>,
    form: Form,
) -> Result<Response, ApiError> {
    redraw(&rt, &edge, form, Endpoint::ImageEdits).await
}

/// Image variation (OpenAI): the source image redrawn with no prompt.
#[utoipa::path(post, path = "/api/v1/images/variations", tag = "OpenAI",
    description = "Also under /api/v0, /v0 and /v1. As images/edits without `prompt` or `mask`: sd-server redraws \
                   the image from itself (image to image with an empty prompt).",
    request_body(content = ImageEditRequest, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The images", body = ImagesResponse),
        (status = 400, description = "As for images/edits", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 413, description = "Body larger than the limit", body = ErrorResponse),
        (status = 500, description = "The model failed to load", body = ErrorResponse),
        (status = 502, description = "The backend died or could not be reached", body = ErrorResponse),
    ))]
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
