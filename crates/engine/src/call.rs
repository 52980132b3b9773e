//! The client half of forwarding, and the one in-process model call.
//!
//! [`Lease`]'s methods send a request to what the lease holds: a local backend (the prompt
//! cache consulted first, the forwarded headers added) or a remote provider (its key in its
//! auth header, its answers judged by `backends::upstream::Retry`, a sans-IO machine this
//! module drives, waiting what it says within `--remote-timeout`). They read answers back,
//! turn failures into [`EngineError`]s that say what happened, and record usage into the
//! model's stats and lemonade's metrics. The server's proxy uses them and stays a byte pipe.
//!
//! [`call`] is the in-process model call: a lease from [`Engine::lease`], the request sent, the
//! whole answer read and its usage recorded. Everything that composes model calls (the omni
//! loop, MCP tools, routing classifiers, `/classify`) uses it; nothing calls an HTTP handler.

use std::time::Duration;
use tokio::time::Instant;

use api_types::Stats;
use backends::upstream::{retry_after, Done, Next, Outcome, Retry};
use dialects::Counts;
use serde_json::Value;

pub use reqwest::multipart::{Form, Part};
pub use reqwest::Method;

use crate::error::{BackendLoss, EngineError, Result, UpstreamFailure};
use crate::lease::LeaseRequest;
use crate::lifecycle::{Lease, Target};
use crate::remote::Route;
use crate::Engine;

/// Attempts at a remote provider, counting the first.
pub const REMOTE_ATTEMPTS: u32 = 3;

/// How long a transport failure waits to learn whether the backend died (its exit is
/// recorded by a watcher task a moment after the connection breaks).
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// A whole answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: bytes::Bytes,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> Result<Value> {
        serde_json::from_slice(&self.body)
            .map_err(|e| EngineError::BadAnswer { what: format!("The backend answered with invalid JSON: {e}") })
    }
}

/// What an in-process call sends.
pub enum Payload {
    Json(Value),
    Form(Form),
}

/// Calls `req`'s model in process: leased as a client's request would be, the whole answer
/// read, its usage recorded. A backend's error answer is [`EngineError::Backend`].
pub async fn call(rt: &Engine, req: LeaseRequest, payload: Payload) -> Result<Answer> {
    let path = req.endpoint.path();
    let lease = rt.lease(req).await?;
    let answer = match payload {
        Payload::Json(v) => {
            let body = bytes::Bytes::from(serde_json::to_vec(&v).map_err(|e| EngineError::Internal(e.to_string()))?);
            lease.fetch(Method::POST, path, Some(body)).await?
        }
        Payload::Form(form) => {
            let resp = lease.send_form(path, form).await?;
            lease.whole(resp).await?
        }
    };
    if answer.content_type.as_deref().is_some_and(|c| c.contains("json")) {
        if let Ok(v) = serde_json::from_slice::<Value>(&answer.body) {
            lease.record_usage(&v, true);
        }
    }
    Ok(answer)
}

impl Lease {
    /// Sends a request to the lease's backend or provider. `stream`: its answer is streamed.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<bytes::Bytes>,
        stream: bool,
    ) -> Result<reqwest::Response> {
        let body = match self.upstream_model() {
            Some(id) => body.map(|b| backends::cloud::rewrite_model(&b, id).map(bytes::Bytes::from).unwrap_or(b)),
            None => body,
        };
        if let Target::Remote(route) = &self.target {
            return self.send_remote(route, method, path_and_query, body).await;
        }
        if let Some(b) = &body {
            self.before_forward(path_and_query, b).await;
        }
        let mut req = self.with_forwarded(self.http().request(method, self.url(path_and_query)));
        if stream {
            // llama-server closes the connection after a streamed response although it
            // advertised keep-alive; a pooled connection reused before its FIN arrives fails
            // the next request.
            req = req.header(reqwest::header::CONNECTION, "close");
        }
        if let Some(b) = body {
            req = req.header(reqwest::header::CONTENT_TYPE, "application/json").body(b);
        }
        self.exchange(req).await
    }

    /// Sends a built request to the lease's local backend: over HTTP, or in memory where the
    /// process answers there ([`crate::launcher::Process::exchange`]).
    async fn exchange(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let (client, req) = req.build_split();
        let req = req.map_err(|e| EngineError::Internal(format!("cannot build the backend request: {e}")))?;
        if let Some(model) = self.local() {
            if let Some(answer) = model.backend.exchange(&req) {
                return match answer.await {
                    Ok(r) => Ok(r),
                    Err(why) => Err(backend_lost(model, why.to_string()).await),
                };
            }
        }
        match client.execute(req).await {
            Ok(r) => Ok(r),
            Err(e) => Err(self.transport_failed(&e).await),
        }
    }

    /// Sends a multipart form (a transcription, an image edit) to the lease's local backend.
    pub async fn send_form(&self, path: &str, form: Form) -> Result<reqwest::Response> {
        // Only local backends get forms (no audio or image request is leased to a remote).
        let req = self.with_forwarded(self.http().post(self.url(path))).multipart(form);
        self.exchange(req).await
    }

    fn with_forwarded(&self, mut req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        for (n, v) in self.forwarded.iter() {
            req = req.header(n.as_str(), v.as_str());
        }
        req
    }

    /// [`Lease::send`] to a remote provider (the model id already the upstream's): its key in
    /// its auth header, the forwarded headers, the attempts [`Retry`] decides, an answer's
    /// headers awaited for `--remote-timeout`. Its backpressure, when it is not waited out, is
    /// [`EngineError::UpstreamBusy`] with its `Retry-After`, never a failure.
    async fn send_remote(
        &self,
        route: &Route,
        method: Method,
        path_and_query: &str,
        body: Option<bytes::Bytes>,
    ) -> Result<reqwest::Response> {
        let url = self.url(path_and_query);
        let auth = route.provider.sendable_key()?.map(|k| route.provider.auth_header(&k));
        let started = Instant::now();
        let mut retry = Retry::new(REMOTE_ATTEMPTS, self.remote_timeout());
        loop {
            let mut req = self.with_forwarded(self.http().request(method.clone(), &url));
            if let Some((name, value)) = &auth {
                req = req.header(name.as_str(), value.as_str());
            }
            if let Some(b) = &body {
                req = req.header(reqwest::header::CONTENT_TYPE, "application/json").body(b.clone());
            }
            let sent = crate::remote::send(route.in_memory.as_ref(), req);
            let timeout = self.remote_timeout();
            let (outcome, answer) = match tokio::time::timeout(retry.left(started.elapsed()), sent).await {
                Err(_) => return Err(self.remote_timed_out(route)),
                Ok(Err(e)) if e.refused() => (Outcome::Refused, Err(e.describe(timeout))),
                Ok(Err(e)) => return Err(remote_failed(route, e.describe(timeout))),
                Ok(Ok(r)) => {
                    let header = r.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok());
                    let now =
                        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                    (Outcome::Answered { status: r.status().as_u16(), retry_after: retry_after(header, now) }, Ok(r))
                }
            };
            let attempt = retry.attempt();
            let done = match retry.on(outcome, started.elapsed()) {
                Next::Wait(wait) => {
                    tracing::warn!(provider = %route.provider.name, attempt, wait_ms = wait.as_millis() as u64, "remote provider failed or busy; trying again");
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Next::Done(done) => done,
            };
            let r = answer.map_err(|why| remote_failed(route, why))?;
            return match done {
                Done::Relay => {
                    route.answered(started.elapsed());
                    Ok(r)
                }
                // The upstream's own failure: [`Lease::error_of`] makes it a failure naming it.
                Done::Failed => Ok(r),
                Done::Busy(secs) => {
                    route.answered(started.elapsed());
                    tracing::info!(provider = %route.provider.name, retry_after = secs, "remote provider busy; passed on as 503");
                    let status = r.status().to_string();
                    Err(route.provider.failure(UpstreamFailure::Busy { status, retry_after: secs }))
                }
            };
        }
    }

    /// A remote provider that gave no answer within `--remote-timeout` (also mid-stream).
    pub fn remote_timed_out(&self, route: &Route) -> EngineError {
        let t = self.remote_timeout();
        let e = route.provider.failure(UpstreamFailure::TimedOut { secs: t.as_secs_f64() });
        route.failed(t, &e.to_string(), true);
        e
    }

    /// A transport failure (before or during an answer), said as what happened: the backend
    /// exited, was killed as wedged, or failed; a remote provider failed.
    pub async fn transport_failed(&self, e: &reqwest::Error) -> EngineError {
        match &self.target {
            Target::Local { model, .. } => backend_lost(model, e.to_string()).await,
            Target::Remote(route) => remote_failed(route, host::cloud::describe(e, self.remote_timeout())),
        }
    }

    /// An answer's body (a remote one within `--remote-timeout`).
    pub async fn read_body(&self, resp: reqwest::Response) -> Result<bytes::Bytes> {
        if let Target::Remote(route) = &self.target {
            return match tokio::time::timeout(self.remote_timeout(), resp.bytes()).await {
                Ok(Ok(b)) => Ok(b),
                Ok(Err(e)) => Err(remote_failed(route, host::cloud::describe(&e, self.remote_timeout()))),
                Err(_) => Err(self.remote_timed_out(route)),
            };
        }
        match resp.bytes().await {
            Ok(b) => Ok(b),
            Err(e) => Err(self.transport_failed(&e).await),
        }
    }

    /// The backend's error answer: [`EngineError::Backend`] with its status and body kept; a
    /// remote provider's 5xx, or its refusal of our key, is its failure
    /// ([`EngineError::UpstreamFailed`]). Its other 4xx are about the request and pass through.
    pub async fn error_of(&self, resp: reqwest::Response) -> EngineError {
        let (status, shown) = (resp.status().as_u16(), resp.status().to_string());
        let content_type = content_type(&resp);
        let body = match self.read_body(resp).await {
            Ok(body) => body,
            Err(e) => return e,
        };
        match &self.target {
            Target::Remote(route) if status >= 500 || matches!(status, 401 | 403) => {
                let excerpt: String = String::from_utf8_lossy(&body).chars().take(300).collect();
                let e = route.provider.failure(UpstreamFailure::Answered {
                    status: shown,
                    excerpt,
                    key_refused: status < 500,
                });
                route.failed(Duration::ZERO, &e.to_string(), status >= 500);
                e
            }
            _ => EngineError::Backend { status, body, content_type },
        }
    }

    /// A successful answer read whole; an error answer as [`Lease::error_of`].
    pub async fn whole(&self, resp: reqwest::Response) -> Result<Answer> {
        if !resp.status().is_success() {
            return Err(self.error_of(resp).await);
        }
        let (status, content_type) = (resp.status().as_u16(), content_type(&resp));
        let body = self.echo_requested_id(self.read_body(resp).await?);
        Ok(Answer { status, content_type, body })
    }

    /// Sends a request and reads its whole answer.
    pub async fn fetch(&self, method: Method, path_and_query: &str, body: Option<bytes::Bytes>) -> Result<Answer> {
        let resp = self.send(method, path_and_query, body, false).await?;
        self.whole(resp).await
    }

    /// A remote model's answer names the id the client asked for (`<provider>.<id>`), not the
    /// upstream's own, as a local model's answer names its model (llama-server's `--alias`).
    pub fn echo_requested_id(&self, bytes: bytes::Bytes) -> bytes::Bytes {
        match &self.target {
            Target::Remote(r) => {
                dialects::echo::echo_model(&bytes, &r.id, &r.name).map(bytes::Bytes::from).unwrap_or(bytes)
            }
            Target::Local { .. } => bytes,
        }
    }

    /// Records a stream's usage: the last `data:` line of its `tail` with usage or timings (a
    /// Responses API event nests it in `response`).
    pub fn record_stream_tail(&self, tail: &[u8]) {
        let text = String::from_utf8_lossy(tail);
        let last = text
            .lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .filter(|d| d.contains("\"timings\"") || d.contains("\"usage\""))
            .find_map(|d| serde_json::from_str::<Value>(d.trim()).ok());
        if let Some(v) = last {
            let v = v.get("response").filter(|r| r.get("usage").is_some()).cloned().unwrap_or(v);
            self.record_usage(&v, false);
        }
    }

    /// Records an answer's usage/timings `v` into the model's `/stats` and the metrics. A whole
    /// answer's time to first token is the wait for the model plus the prompt's time.
    pub fn record_usage(&self, v: &Value, non_streaming: bool) {
        if let Some(model) = self.local() {
            apply_usage(&mut model.stats.lock(), v, non_streaming);
        }
        self.metrics().usage(self.name(), &Counts::of(v), non_streaming.then_some(self.waited));
    }
}

fn content_type(resp: &reqwest::Response) -> Option<String> {
    resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// `model`'s backend connection failed (`why`): it exited, was killed as wedged, or failed
/// while running.
async fn backend_lost(model: &crate::lifecycle::Running, why: String) -> EngineError {
    let b = &model.backend;
    let exit = match b.exit_status() {
        Some(x) => Some(x),
        None => tokio::time::timeout(EXIT_GRACE, b.wait_exit()).await.ok(),
    };
    let wedged = model.wedged.load(std::sync::atomic::Ordering::SeqCst);
    let model = model.info.name.clone();
    EngineError::BackendLost(match exit {
        Some(exit) => BackendLoss::Exited { model, exit: exit.to_string(), wedged, log_tail: b.log_tail() },
        None => BackendLoss::Failed { model, error: why },
    })
}

fn remote_failed(route: &Route, why: String) -> EngineError {
    let e = route.provider.failure(UpstreamFailure::Failed { why });
    route.failed(Duration::ZERO, &e.to_string(), true);
    e
}

/// usage → input/output tokens; llama.cpp `timings` override and give TTFT and tokens/s.
pub fn apply_usage(s: &mut Stats, v: &Value, non_streaming: bool) {
    let u64_at = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64);
    let f64_at = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    if let Some(u) = v.get("usage") {
        let input = u64_at(u, "prompt_tokens").or_else(|| u64_at(u, "input_tokens"));
        let output = u64_at(u, "completion_tokens").or_else(|| u64_at(u, "output_tokens"));
        if let Some(i) = input {
            s.input_tokens = i;
            if non_streaming {
                s.prompt_tokens = i;
            }
        }
        if let Some(o) = output {
            s.output_tokens = o;
        }
    }
    let cached = Counts::of(v).cached_tokens;
    if let Some(n) = cached {
        s.cache_tokens = Some(n);
        s.cache_tokens_total += n;
    }
    if let Some(t) = v.get("timings") {
        if let Some(n) = u64_at(t, "prompt_n") {
            s.input_tokens = n;
            // The whole prompt is the processed part plus the part reused from the cache; a
            // stream has no `usage` unless asked, but its last chunk has these timings.
            if let Some(cached) = u64_at(t, "cache_n") {
                s.prompt_tokens = n + cached;
            }
        }
        if let Some(n) = u64_at(t, "predicted_n") {
            s.output_tokens = n;
        }
        if let Some(ms) = f64_at(t, "prompt_ms") {
            s.time_to_first_token = ms / 1000.0;
        }
        if let Some(tps) = f64_at(t, "predicted_per_second") {
            s.tokens_per_second = tps;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_override_usage() {
        let mut s = Stats::default();
        let v = serde_json::json!({"usage": {"prompt_tokens": 10, "completion_tokens": 5},
            "timings": {"prompt_n": 9, "predicted_n": 4, "prompt_ms": 25.0, "predicted_per_second": 80.5}});
        apply_usage(&mut s, &v, true);
        assert_eq!((s.input_tokens, s.output_tokens, s.prompt_tokens), (9, 4, 10));
        // The metrics count the whole prompt (usage's, as no cache_n says otherwise).
        let u = Counts::of(&v);
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.prompt_ms), (Some(10), Some(4), Some(25.0)));
        assert_eq!(s.time_to_first_token, 0.025);
        assert_eq!(s.tokens_per_second, 80.5);
        let mut s2 = Stats::default();
        apply_usage(&mut s2, &serde_json::json!({"usage": {"input_tokens": 3, "output_tokens": 2}}), false);
        assert_eq!((s2.input_tokens, s2.output_tokens, s2.prompt_tokens), (3, 2, 0));
        // A stream's final timings: processed plus cached tokens make the whole prompt.
        let last = serde_json::json!({"timings": {"prompt_n": 1, "cache_n": 35}});
        apply_usage(&mut s2, &last, false);
        assert_eq!((s2.input_tokens, s2.prompt_tokens), (1, 36));
        assert_eq!(Counts::of(&last).prompt_tokens, Some(36));
    }
}
