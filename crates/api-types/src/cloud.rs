//! Remote OpenAI-compatible providers (recipe `cloud`): `GET /api/v1/cloud`, and their part of
//! `health` and the admin API.

use serde::{Deserialize, Serialize};

/// How a remote provider is reached besides its URL and key: the header its key goes in and
/// the text before the key (Lemonade v11's `auth_header_name`, `auth_header_prefix`; None:
/// `Authorization`, `Bearer `), and the requests it is sent at once (None: no bound). The
/// `install` body carries it, and the providers' file keeps it (flattened in both).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Reach {
    /// Lemonade v11: the header the key is sent in (default `Authorization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_header_name: Option<String>,
    /// Lemonade v11: the text before the key (default `Bearer `; `""` for a bare key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_header_prefix: Option<String>,
    /// Requests sent to the provider at once; more are refused with 503 and `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
}

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
    /// The header its key is sent in, and the text before the key (Lemonade v11).
    #[serde(default = "default_auth_header")]
    pub auth_header_name: String,
    #[serde(default = "default_auth_prefix")]
    pub auth_header_prefix: String,
    /// Requests sent to it now, and its bound (None: none).
    #[serde(default)]
    pub in_flight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// Its circuit breaker.
    #[serde(default)]
    pub breaker: UpstreamBreaker,
}

fn default_auth_header() -> String {
    "Authorization".into()
}

fn default_auth_prefix() -> String {
    "Bearer ".into()
}

/// An upstream's circuit breaker: `closed` (requests go), `open` (refused with 503 and
/// `Retry-After` until `retry_in_ms` has passed), `half-open` (one request probes it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpstreamBreaker {
    pub state: String,
    /// Failures in a row now, and how many open it.
    pub failures: u32,
    pub threshold: u32,
    /// Times it has opened since lemonade started.
    pub opened: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<u64>,
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
