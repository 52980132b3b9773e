//! The image endpoints: generation (JSON), edits and variations (multipart), as OpenAI's, with
//! the stable-diffusion parameters Lemonade passes.

use serde::{Deserialize, Serialize};

use crate::Extra;

/// `POST /v1/images/generations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"model": "SD-Turbo", "prompt": "a glass of lemonade", "size": "512x512", "steps": 4})))]
pub struct ImageGenerationRequest {
    /// An image model (type `image`).
    pub model: String,
    pub prompt: String,
    /// How many images, 1 to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// `WIDTHxHEIGHT`, each side a multiple of 64 from 64 to 2048; the model's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Only `b64_json` (lemonade keeps no images to link to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<String>,
    /// Sampling steps, 1 to 150 (the model's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// Classifier-free guidance scale, 0 to 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cfg_scale: Option<f64>,
    /// The seed; random when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// The sampler (see [`SdParameters::sampler`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler: Option<String>,
    /// Other OpenAI fields (`quality`, `style`, `user`, …) are accepted and ignored.
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub extra: Extra,
}

/// The stable-diffusion parameters a request may set over the model's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SdParameters {
    /// Sampling steps, 1 to 150.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// Classifier-free guidance scale, 0 to 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cfg_scale: Option<f64>,
    /// The seed; random when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// The sampler: euler, euler_a, heun, dpm2, dpm++2s_a, dpm++2m, dpm++2mv2, ipndm, ipndm_v,
    /// lcm, ddim_trailing or tcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler: Option<String>,
}

/// `POST /v1/images/edits` (multipart/form-data): an image (`image` or `image[]`), an
/// optional `mask`, and these fields. `/v1/images/variations` takes the same form without
/// `prompt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageEditRequest {
    /// The source image: PNG, JPEG, WebP, BMP or GIF.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = Binary))]
    #[serde(skip)]
    pub image: Vec<u8>,
    /// Where to paint (white) and keep (black), for an edit.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = Binary))]
    #[serde(skip)]
    pub mask: Option<Vec<u8>>,
    pub model: String,
    /// Required for an edit; not read for a variation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<String>,
    #[serde(flatten)]
    pub sd: SdParameters,
}

/// The answer of every image endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImagesResponse {
    pub created: i64,
    pub data: Vec<ImageData>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageData {
    /// The PNG, base64-encoded.
    pub b64_json: String,
}
