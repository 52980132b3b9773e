//! A small typed async client of lemonade's HTTP API: every request and answer is a type from
//! `lemonade-api-types`. The `lemonade` CLI uses it for every command but `serve`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lemonade_client::ClientError> {
//! use lemonade_client::Client;
//! let c = Client::new("http://127.0.0.1:8000", None);
//! let health = c.health().await?;
//! println!("{} models loaded", health.all_models_loaded.len());
//! # Ok(()) }
//! ```
//!
//! It lives in its own crate, not behind a feature of api-types, so that api-types stays free
//! of any HTTP stack whatever features a build turns on.

use std::time::Duration;

use api_types::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No lemonade answered at the address.
    #[error("Lemonade Server is not running on {base} (start it with `lemonade serve`)")]
    Unreachable { base: String, source: reqwest::Error },
    /// The server answered with an error status; `message` is its error text.
    #[error("{message} (HTTP {status})")]
    Api { status: u16, message: String, body: serde_json::Value },
    /// The answer was not what the endpoint documents.
    #[error("unexpected answer from {path}: {message}")]
    Decode { path: String, message: String },
    #[error("{0}")]
    Http(#[from] reqwest::Error),
}

/// A lemonade server at `base` (`http://host:port`), with an optional API key.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    api_key: Option<String>,
    http: reqwest::Client,
    timeout: Option<Duration>,
}

impl Client {
    pub fn new(base: &str, api_key: Option<String>) -> Client {
        let http =
            reqwest::Client::builder().no_proxy().connect_timeout(Duration::from_secs(5)).build().expect("HTTP client");
        Client {
            base: base.trim_end_matches('/').to_string(),
            api_key: api_key.filter(|k| !k.is_empty()),
            http,
            timeout: None,
        }
    }

    /// The same client, with an overall time limit on each call (none by default: loads and
    /// pulls may take long).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = Some(timeout);
        self
    }

    /// `http://host:port/api/v1<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_to(method, self.url(path))
    }

    fn request_to(&self, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, url);
        if let Some(k) = &self.api_key {
            r = r.bearer_auth(k);
        }
        if let Some(t) = self.timeout {
            r = r.timeout(t);
        }
        r
    }

    async fn send(&self, r: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        r.send().await.map_err(|source| match source.is_connect() {
            true => ClientError::Unreachable { base: self.base.clone(), source },
            false => ClientError::Http(source),
        })
    }

    async fn answer<R: DeserializeOwned>(path: &str, r: reqwest::Response) -> Result<R, ClientError> {
        let status = r.status();
        let text = r.text().await?;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        if !status.is_success() {
            return Err(ClientError::Api { status: status.as_u16(), message: error_text(&v), body: v });
        }
        serde_json::from_value(v).map_err(|e| ClientError::Decode { path: path.to_string(), message: e.to_string() })
    }

    /// GET `path` (under `/api/v1`) as `R`.
    pub async fn get<R: DeserializeOwned>(&self, path: &str) -> Result<R, ClientError> {
        let r = self.send(self.request(reqwest::Method::GET, path)).await?;
        Self::answer(path, r).await
    }

    /// POST `body` as JSON to `path` (under `/api/v1`), answer as `R`.
    pub async fn post<B: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<R, ClientError> {
        let r = self.send(self.request(reqwest::Method::POST, path).json(body)).await?;
        Self::answer(path, r).await
    }

    /// POST `body` and return the streaming answer (SSE) once its status is a success.
    pub async fn post_stream<B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<reqwest::Response, ClientError> {
        let r = self.send(self.request(reqwest::Method::POST, path).json(body)).await?;
        if !r.status().is_success() {
            return Err(Self::answer::<serde_json::Value>(path, r).await.unwrap_err());
        }
        Ok(r)
    }

    /// DELETE `path` (under `/api/v1`), answer as `R`.
    pub async fn delete_path<R: DeserializeOwned>(&self, path: &str) -> Result<R, ClientError> {
        let r = self.send(self.request(reqwest::Method::DELETE, path)).await?;
        Self::answer(path, r).await
    }

    /// GET `path` at the root of the port (`/internal/*`) as `R`.
    async fn get_root<R: DeserializeOwned>(&self, path: &str) -> Result<R, ClientError> {
        let r = self.send(self.request_to(reqwest::Method::GET, format!("{}{path}", self.base))).await?;
        Self::answer(path, r).await
    }

    /// POST `body` as JSON to `path` at the root of the port (`/internal/*`), answer as `R`.
    async fn post_root<B: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<R, ClientError> {
        let r = self.send(self.request_to(reqwest::Method::POST, format!("{}{path}", self.base)).json(body)).await?;
        Self::answer(path, r).await
    }

    /// `GET /internal/config`: every configuration key with its value in force.
    pub async fn config(&self) -> Result<serde_json::Map<String, serde_json::Value>, ClientError> {
        self.get_root("/internal/config").await
    }

    /// `POST /internal/set`.
    pub async fn set_config(
        &self,
        values: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<ConfigSetResponse, ClientError> {
        self.post_root("/internal/set", values).await
    }

    /// `POST /internal/cleanup-cache`: the orphaned cache files, removed unless `dry_run`.
    pub async fn cleanup_cache(&self, dry_run: bool) -> Result<CleanupCacheResponse, ClientError> {
        self.post_root("/internal/cleanup-cache", &CleanupCacheRequest { dry_run: Some(dry_run) }).await
    }

    /// `GET /internal/aliases`.
    pub async fn aliases(&self) -> Result<AliasList, ClientError> {
        self.get_root("/internal/aliases").await
    }

    /// `POST /internal/aliases`: points `alias` at `target`.
    pub async fn set_alias(
        &self,
        alias: &str,
        target: &str,
        variant: Option<(serde_json::Map<String, serde_json::Value>, Vec<String>)>,
    ) -> Result<AliasResponse, ClientError> {
        let (params, strip) = variant.map_or((None, None), |(p, s)| (Some(p), Some(s)));
        let body = AliasRequest {
            alias: Some(alias.into()),
            target: Some(target.into()),
            params,
            strip,
            ..Default::default()
        };
        self.post_root("/internal/aliases", &body).await
    }

    /// `DELETE /internal/aliases/{alias}`.
    pub async fn remove_alias(&self, alias: &str) -> Result<AliasResponse, ClientError> {
        let path = format!("/internal/aliases/{}", encode_segment(alias));
        let r = self.send(self.request_to(reqwest::Method::DELETE, format!("{}{path}", self.base))).await?;
        Self::answer(&path, r).await
    }

    /// Empties the prompt cache.
    pub async fn clear_prompt_cache(&self) -> Result<PromptCacheCleared, ClientError> {
        self.delete_path("/prompt-cache").await
    }

    pub async fn health(&self) -> Result<Health, ClientError> {
        self.get("/health").await
    }

    pub async fn stats(&self) -> Result<Stats, ClientError> {
        self.get("/stats").await
    }

    /// Downloaded models, or with `show_all` the whole catalogue.
    pub async fn models(&self, show_all: bool) -> Result<ModelList, ClientError> {
        self.get(if show_all { "/models?show_all=true" } else { "/models" }).await
    }

    pub async fn load(&self, req: &LoadRequest) -> Result<LoadResponse, ClientError> {
        self.post("/load", req).await
    }

    pub async fn unload(&self, req: &UnloadRequest) -> Result<UnloadResponse, ClientError> {
        self.post("/unload", req).await
    }

    pub async fn pin(&self, req: &PinRequest) -> Result<PinResponse, ClientError> {
        self.post("/pin", req).await
    }

    /// A pull without progress (for progress, `post_stream("/pull", …)` with `stream: true`).
    pub async fn pull(&self, req: &PullRequest) -> Result<StatusResponse, ClientError> {
        self.post("/pull", req).await
    }

    pub async fn delete(&self, req: &DeleteRequest) -> Result<StatusResponse, ClientError> {
        self.post("/delete", req).await
    }

    pub async fn install(&self, req: &InstallRequest) -> Result<InstallResponse, ClientError> {
        self.post("/install", req).await
    }

    pub async fn uninstall(&self, req: &InstallRequest) -> Result<InstallResponse, ClientError> {
        self.post("/uninstall", req).await
    }

    /// `GET /cloud`: remote providers (`refresh`: probe them first).
    pub async fn cloud(&self, refresh: bool) -> Result<UpstreamList, ClientError> {
        self.get(if refresh { "/cloud?refresh=true" } else { "/cloud" }).await
    }

    pub async fn system_info(&self, verbose: bool) -> Result<SystemInfo, ClientError> {
        self.get(if verbose { "/system-info?verbose=true" } else { "/system-info" }).await
    }

    pub async fn system_stats(&self) -> Result<SystemStats, ClientError> {
        self.get("/system-stats").await
    }

    pub async fn set_log_level(&self, level: &str) -> Result<LogLevelResponse, ClientError> {
        self.post("/log-level", &LogLevelRequest { level: level.to_string() }).await
    }

    pub async fn chat(&self, req: &ChatCompletionRequest) -> Result<ChatCompletionResponse, ClientError> {
        self.post("/chat/completions", req).await
    }

    pub async fn embeddings(&self, req: &EmbeddingRequest) -> Result<EmbeddingResponse, ClientError> {
        self.post("/embeddings", req).await
    }
}

/// `s` as one URL path segment: every byte but the unreserved ones (RFC 3986) percent-encoded.
fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// The server's error message, from an OpenAI-style or flat error body.
pub fn error_text(v: &serde_json::Value) -> String {
    v["error"]["message"]
        .as_str()
        .or_else(|| v["error"].as_str())
        .or_else(|| v.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}
