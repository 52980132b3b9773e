//! Remote OpenAI-compatible providers (recipe `cloud`): `GET /api/v1/cloud`, and their part of
//! `health` and the admin API.

use serde::{Deserialize, Serialize};

/// One registered provider as the server sees it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Upstream {
    /// Its name; its models are `<name>.<id>`.
    pub name: String,
    /// Its OpenAI API base, e.g. `http://10.0.0.5:8000/v1`.
    pub base_url: String,
    /// `up` (the last probe answered), `down` (it failed) or `unknown` (not probed yet).
    pub state: String,
    /// Where its API key comes from: `memory` (given to this process, never written),
    /// `env` (`LEMONADE_<NAME>_API_KEY`) or `none`. The key itself is never shown.
    pub api_key: String,
    /// The environment variable that can hold its key.
    pub api_key_env: String,
    /// The last probe of its `/models` (discovery), or of a request that failed.
    pub last_probe: Option<Probe>,
    /// The models it offers, as lemonade names them (kept while it is down).
    pub models: Vec<String>,
}

/// One probe of an upstream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Probe {
    /// Unix time, seconds.
    pub at: u64,
    pub ok: bool,
    /// How long it took.
    pub ms: u64,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /api/v1/cloud`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpstreamList {
    pub upstreams: Vec<Upstream>,
}

/// Query of `GET /api/v1/cloud`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
pub struct CloudQuery {
    /// `true` probes every upstream (discovery) before answering.
    #[serde(default)]
    pub refresh: Option<String>,
}
