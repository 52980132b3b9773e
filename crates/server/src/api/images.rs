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
    checked(r.n, r.size.as_deref(), r.response_format.as_deref(), &sd)?;
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

/// The checks every image request shares.
fn checked(n: Option<u32>, size: Option<&str>, format: Option<&str>, sd: &SdParameters) -> Result<(), ApiError> {
    if let Some(n) = n.filter(|n| !(1..=10).contains(n)) {
        return Err(ApiError::bad_request(format!("Invalid value for 'n': expected 1 to 10, got {n}"), Some("n")));
    }
    if let Some(size) = size {
        sdcpp::parse_size(size).map_err(|e| ApiError::bad_request(e.to_string(), Some("size")))?;
    }
    if let Some(f) = format.filter(|f| *f != "b64_json") {
        let msg = format!(
            "Unsupported response_format '{f}': lemonade answers b64_json only (it keeps no images to link to)"
        );
        return Err(ApiError::bad_request(msg, Some("response_format")));
    }
    sd.validate().map_err(|(msg, field)| ApiError::bad_request(msg, Some(field)))
}

/// A form field parsed as `T`, or a 400 naming it.
fn field<T: std::str::FromStr>(form: &Form, name: &str) -> Result<Option<T>, ApiError> {
    match form.text(name)?.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ApiError::bad_request(format!("Invalid value for '{name}': '{v}' is not a valid number"), Some(name))
        }),
    }
}

/// An edit or a variation: the form checked, then sent on to sd-server's edit route.
async fn redraw(rt: &AppState, edge: &Edge, form: Form, endpoint: Endpoint) -> Result<Response, ApiError> {
    let variation = endpoint == Endpoint::ImageVariations;
    let images = uploaded_images(&form)?;
    let model = form.text("model")?.filter(|m| !m.is_empty());
    let model = model.ok_or_else(|| ApiError::bad_request("Missing 'model' field in request", Some("model")))?;
    let prompt = if variation { " " } else { form.text("prompt")?.unwrap_or_default() };
    if prompt.trim().is_empty() && !variation {
        return Err(ApiError::bad_request("Missing 'prompt' field in request", Some("prompt")));
    }
    let sd = SdParameters {
        steps: field(&form, "steps")?,
        cfg_scale: field(&form, "cfg_scale")?,
        seed: field(&form, "seed")?,
        sampler: form.text("sampler")?.map(str::to_string),
    };
    let n: Option<u32> = field(&form, "n")?;
    let size = form.text("size")?.filter(|s| !s.is_empty());
    checked(n, size, form.text("response_format")?, &sd)?;
    let lease = rt.engine.lease(edge.request(model, endpoint)).await?;
    let mut upstream = reqwest::multipart::Form::new().text("prompt", sd.prompt_with(prompt));
    for p in images.iter().copied().chain(if variation { None } else { form.get("mask") }) {
        upstream = upstream.part(if p.name == "mask" { "mask" } else { "image[]" }, upload(p));
    }
    for (k, v) in [("n", n.map(|n| n.to_string())), ("size", size.map(str::to_string))] {
        if let Some(v) = v {
            upstream = upstream.text(k, v);
        }
    }
    proxy::forward_form(lease, sdcpp::EDITS_PATH, upstream.text("output_format", "png"), "application/json").await
}

/// The form's images (`image` or `image[]`), each an image sd-server reads, as is the mask.
fn uploaded_images(form: &Form) -> Result<Vec<&crate::extract::Part>, ApiError> {
    let images: Vec<_> = form.parts.iter().filter(|p| p.name == "image" || p.name == "image[]").collect();
    if images.is_empty() {
        return Err(ApiError::bad_request("Missing 'image' field in request", Some("image")));
    }
    for p in images.iter().copied().chain(form.get("mask")) {
        if sdcpp::image_format(&p.data).is_none() {
            let name = p.file_name.as_deref().map(|n| format!(" '{n}'")).unwrap_or_default();
            let msg = format!("The uploaded file{name} is not an image: expected PNG, JPEG, WebP, BMP or GIF");
            return Err(ApiError::bad_request(msg, Some(&p.name)));
        }
    }
    Ok(images)
}

/// An uploaded file as a part of the form sent on.
fn upload(p: &crate::extract::Part) -> reqwest::multipart::Part {
    let part = reqwest::multipart::Part::stream_with_length(reqwest::Body::from(p.data.clone()), p.data.len() as u64);
    part.file_name(p.file_name.clone().unwrap_or_else(|| "image".into()))
}
