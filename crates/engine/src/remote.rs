//! Remote OpenAI-compatible providers (recipe `cloud`): the registered providers, their
//! discovered models, the keys held in memory, and the route of a `<provider>.<id>` request.
//! Forwarding is the server's proxy (the same byte pipe as for local backends).
//!
//! Invariants: a key lives only in this process's memory (or its environment); the providers'
//! file holds names and URLs. A provider that fails discovery keeps its last model list and is
//! shown `down`. Remote models take no slot: they never reach the scheduler.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use api_types::{Model, Probe, Upstream, UpstreamBreaker};
use backends::cloud::{self, Discovered};
use backends::upstream::{Breaker, BreakerSettings};
use parking_lot::{Mutex, RwLock};

use crate::error::{EngineError, Result, UpstreamFailure};

/// One provider.
pub struct Provider {
    pub name: String,
    /// Its OpenAI API base (`http://host:8000/v1`).
    pub base: String,
    /// The URL it was registered with (saved as given).
    url: String,
    /// A key given to this process (install or auth); else the environment's.
    key: RwLock<Option<String>>,
    seen: RwLock<Seen>,
    /// Lemonade v11's `allow_insecure_http`: a key may go over plain `http://` to another host.
    insecure_ok: std::sync::atomic::AtomicBool,
    /// A Lemonade v11 cloud provider (`backend: "cloud"`): no key, no call (its models are not
    /// listed, a request answers the missing-key error).
    keyed: std::sync::atomic::AtomicBool,
    /// The header its key goes in and the prefix (None: `Authorization`, `Bearer `), and its
    /// in-flight bound, as saved.
    reach: RwLock<Reach>,
    /// Requests sent to it and not answered to the end.
    in_flight: Arc<std::sync::atomic::AtomicU32>,
    breaker: Mutex<Breaker>,
    /// The breaker's clock (ms since this).
    epoch: Instant,
}

pub use api_types::Reach;

/// What `install` may set besides the URL and key; None keeps what the provider had (a
/// `max_in_flight` of 0 removes the bound).
#[derive(Debug, Clone, Default)]
pub struct InstallOptions {
    pub allow_insecure_http: Option<bool>,
    /// Registered as a v11 cloud provider (see `Provider::keyed`).
    pub keyed: bool,
    pub reach: Reach,
}

/// A request admitted to a provider: counted in flight until dropped. Its outcome goes to the
/// breaker ([`Admitted::succeeded`], [`Admitted::failed`]); dropped without one (the client
/// left), a half-open breaker lets the next request probe.
pub struct Admitted {
    provider: Arc<Provider>,
    told: std::sync::atomic::AtomicBool,
}

impl Admitted {
    /// The upstream answered (backpressure included).
    pub fn succeeded(&self) {
        self.told.store(true, std::sync::atomic::Ordering::SeqCst);
        self.provider.breaker.lock().success();
    }

    /// The upstream failed (unreachable, a timeout, a 5xx that is not backpressure).
    pub fn failed(&self) {
        self.told.store(true, std::sync::atomic::Ordering::SeqCst);
        let now = self.provider.now_ms();
        let mut b = self.provider.breaker.lock();
        let was_open = b.opened;
        b.failure(now);
        if b.opened > was_open {
            tracing::warn!(provider = %self.provider.name, failures = b.settings.failures, open_ms = b.settings.open_ms,
                "remote provider's circuit breaker opened");
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.provider.in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        if !self.told.load(std::sync::atomic::Ordering::SeqCst) {
            let now = self.provider.now_ms();
            self.provider.breaker.lock().abandoned(now);
        }
    }
}

#[derive(Default)]
struct Seen {
    models: Vec<Discovered>,
    probe: Option<Probe>,
}

/// Where a request for a remote model goes.
pub struct Route {
    pub provider: Arc<Provider>,
    /// The upstream's id (the name without `<provider>.`).
    pub id: String,
    /// The name the client used.
    pub name: String,
    /// The pooled client for remote providers, and how long one may take to answer.
    pub http: reqwest::Client,
    pub timeout: Duration,
    /// Its place among the provider's requests in flight, once admitted (see [`Provider::admit`]).
    pub admitted: Option<Admitted>,
    /// Where requests are answered in memory (the simulation's upstreams; None: over HTTP).
    pub in_memory: Option<InMemory>,
}

/// Answers requests to remote providers in memory, for the simulation (crates/sim): their
/// discovery, their metrics and their requests. lemonade itself has none.
pub type InMemory = Arc<dyn Fn(&reqwest::Request) -> crate::launcher::Exchange + Send + Sync>;

/// Why a request to a provider got no answer.
pub enum NotSent {
    Http(reqwest::Error),
    InMemory(crate::launcher::Unanswered),
}

impl NotSent {
    /// The connection was refused (nothing listens): worth another attempt.
    pub fn refused(&self) -> bool {
        match self {
            NotSent::Http(e) => e.is_connect(),
            NotSent::InMemory(u) => *u == crate::launcher::Unanswered::Exited,
        }
    }

    /// In words, its causes included.
    pub fn describe(&self, timeout: Duration) -> String {
        match self {
            NotSent::Http(e) => host::cloud::describe(e, timeout),
            NotSent::InMemory(u) => u.to_string(),
        }
    }
}

/// Sends `req` to a provider: over HTTP, or to `in_memory` where the simulation answers.
pub async fn send(
    in_memory: Option<&InMemory>,
    req: reqwest::RequestBuilder,
) -> std::result::Result<reqwest::Response, NotSent> {
    let Some(answer) = in_memory else { return req.send().await.map_err(NotSent::Http) };
    let req = req.build().map_err(NotSent::Http)?;
    answer(&req).await.map_err(NotSent::InMemory)
}

impl Route {
    /// The upstream answered (its backpressure included): it is shown up and its breaker told.
    pub fn answered(&self, took: Duration) {
        self.provider.record(true, took, None);
        if let Some(a) = &self.admitted {
            a.succeeded();
        }
    }

    /// The upstream failed this request: it is shown down with `why`. `counts` when its breaker
    /// counts the failure (unreachable, timed out, a 5xx), not when it refused our key.
    pub fn failed(&self, took: Duration, why: &str, counts: bool) {
        self.provider.record(false, took, Some(why.to_string()));
        if let (true, Some(a)) = (counts, &self.admitted) {
            a.failed();
        }
    }
}

impl Provider {
    fn new(name: &str, base: String, url: String, insecure: bool, reach: Reach, breaker: BreakerSettings) -> Provider {
        Provider {
            name: name.to_string(),
            base,
            url,
            key: RwLock::default(),
            seen: RwLock::default(),
            insecure_ok: insecure.into(),
            keyed: false.into(),
            reach: RwLock::new(reach),
            in_flight: Default::default(),
            breaker: Mutex::new(Breaker::new(breaker)),
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// What is saved of it, with `models`.
    fn saved(&self, models: Vec<Discovered>) -> host::cloud::Saved {
        let reach = self.reach.read().clone();
        host::cloud::Saved {
            base_url: self.url.clone(),
            models,
            allow_insecure_http: self.insecure_ok.load(std::sync::atomic::Ordering::Relaxed),
            keyed: self.is_keyed(),
            reach,
        }
    }

    /// A v11 cloud provider: no key, no call.
    pub fn is_keyed(&self) -> bool {
        self.keyed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a key may go to it over plain `http://` (v11's opt-in).
    pub fn insecure_ok(&self) -> bool {
        self.insecure_ok.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What to know about how it is reached (v11's words): plain `http://`, and a key sent
    /// over it.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.url.starts_with("http://") {
            w.push("Base URL uses http://; traffic to this provider is not encrypted.".to_string());
            if self.key().is_some() {
                w.push(
                    "An API key is configured for this http:// provider; lemonade will send it as a Bearer token over plaintext HTTP."
                        .to_string(),
                );
            }
        }
        w
    }

    /// The error a request to a keyed provider without a key answers (v11's missing
    /// credentials), naming the provider and how to give it a key.
    pub fn no_key(&self) -> EngineError {
        EngineError::NoKey { provider: self.name.clone(), variable: cloud::key_variable(&self.name) }
    }

    /// This provider's `failure`, as an error naming it.
    pub fn failure(&self, failure: UpstreamFailure) -> EngineError {
        EngineError::Upstream { provider: self.name.clone(), base: self.base.clone(), failure }
    }

    /// A request may go to it now: its breaker is not open and it is under its in-flight
    /// bound. Else a failure that says when to come back.
    pub fn admit(self: &Arc<Self>) -> Result<Admitted> {
        use std::sync::atomic::Ordering;
        if let Err(wait_ms) = self.breaker.lock().admit(self.now_ms()) {
            return Err(self.failure(UpstreamFailure::BreakerOpen { wait_ms }));
        }
        let max = self.reach.read().max_in_flight;
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst);
        let admitted = Admitted { provider: self.clone(), told: false.into() };
        if let Some(max) = max.filter(|m| n >= *m) {
            admitted.told.store(true, Ordering::SeqCst); // not the upstream's outcome
            drop(admitted);
            // A half-open probe that was refused here must not keep the breaker half-open.
            self.breaker.lock().abandoned(self.now_ms());
            return Err(self.failure(UpstreamFailure::AtBound { max }));
        }
        Ok(admitted)
    }

    /// The header and value its key is sent in (Lemonade v11's `auth_header_name`,
    /// `auth_header_prefix`).
    pub fn auth_header(&self, key: &str) -> (String, String) {
        let reach = self.reach.read();
        let name = reach.auth_header_name.clone().unwrap_or_else(|| cloud::AUTH_HEADER.into());
        let prefix = reach.auth_header_prefix.as_deref().unwrap_or(cloud::AUTH_PREFIX);
        (name, format!("{prefix}{key}"))
    }

    /// The key to send: the one held in memory, else `LEMONADE_<NAME>_API_KEY`.
    pub fn key(&self) -> Option<String> {
        let held = self.key.read().clone();
        held.or_else(|| self.env_key())
    }

    fn env_key(&self) -> Option<String> {
        std::env::var(cloud::key_variable(&self.name)).ok().filter(|k| !k.is_empty())
    }

    /// The key to send, unless it would cross the network in plain text (Lemonade v11's rule:
    /// a key goes to an `http://` base only with `allow_insecure_http`; a loopback host is this
    /// machine, so its key never crosses a network).
    pub fn sendable_key(&self) -> std::result::Result<Option<String>, EngineError> {
        let key = self.key();
        let plain = self.base.starts_with("http://") && !cloud::is_loopback_base(&self.base);
        if key.is_some() && plain && !self.insecure_ok.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(EngineError::Invalid {
                message: format!(
                    "Cloud provider '{}' uses http:// with an API key. Reinstall or re-authenticate with allow_insecure_http=true to opt in.",
                    self.name
                ),
                param: Some("model".into()),
                code: Some("insecure_http_requires_opt_in"),
            });
        }
        Ok(key)
    }

    /// Lemonade v11's auth state: whether `LEMONADE_<NAME>_API_KEY` is set, and whether a key
    /// is held in memory.
    pub fn auth_state(&self) -> (bool, bool) {
        (self.env_key().is_some(), self.key.read().is_some())
    }

    /// Records how a probe or a request went (a failed request marks it down until the next
    /// success).
    pub fn record(&self, ok: bool, took: Duration, error: Option<String>) {
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let probe = Probe { at, ok, ms: took.as_millis() as u64, error };
        self.seen.write().probe = Some(probe);
    }

    fn has(&self, id: &str) -> bool {
        self.seen.read().models.iter().any(|m| m.id == id)
    }

    pub fn view(&self) -> Upstream {
        let seen = self.seen.read();
        let held = self.key.read().is_some();
        let env = cloud::key_variable(&self.name);
        let api_key = if held {
            "memory"
        } else if std::env::var(&env).is_ok_and(|k| !k.is_empty()) {
            "env"
        } else {
            "none"
        };
        let reach = self.reach.read().clone();
        let breaker = self.breaker.lock().clone();
        let retry_in_ms = match breaker.state {
            backends::upstream::BreakerState::Open { until } => Some(until.saturating_sub(self.now_ms())),
            _ => None,
        };
        let failures = match breaker.state {
            backends::upstream::BreakerState::Closed { failures } => failures,
            _ => breaker.settings.failures,
        };
        Upstream {
            auth_header_name: reach.auth_header_name.unwrap_or_else(|| cloud::AUTH_HEADER.into()),
            auth_header_prefix: reach.auth_header_prefix.unwrap_or_else(|| cloud::AUTH_PREFIX.into()),
            max_in_flight: reach.max_in_flight,
            in_flight: self.in_flight.load(std::sync::atomic::Ordering::SeqCst),
            breaker: UpstreamBreaker {
                state: breaker.name().into(),
                failures,
                threshold: breaker.settings.failures,
                opened: breaker.opened,
                retry_in_ms,
            },
            name: self.name.clone(),
            base_url: self.base.clone(),
            state: match &seen.probe {
                None => "unknown",
                Some(p) if p.ok => "up",
                Some(_) => "down",
            }
            .into(),
            api_key: api_key.into(),
            api_key_env: env,
            last_probe: seen.probe.clone(),
            models: seen.models.iter().map(|m| format!("{}.{}", self.name, m.id)).collect(),
        }
    }

    /// Its models as `/api/v1/models` lists them.
    fn models(&self) -> Vec<Model> {
        let seen = self.seen.read();
        seen.models
            .iter()
            .map(|m| Model {
                id: format!("{}.{}", self.name, m.id),
                object: "model".into(),
                created: 1234567890,
                owned_by: self.name.clone(),
                checkpoint: m.id.clone(),
                checkpoints: [("main".to_string(), m.id.clone())].into(),
                recipe: cloud::RECIPE.into(),
                downloaded: true,
                suggested: false,
                labels: m.labels.clone(),
                recipe_options: Default::default(),
                size: None,
                model_type: Some(cloud::model_type(&m.id, &m.labels)),
                image_defaults: None,
                upstream: Some(self.name.clone()),
                context_length: None,
                update_available: None,
                parallel: None,
                slot_ctx_size: None,
                components: None,
                routing: None,
                system_prompt: None,
                tool_format: None,
                omni_tools: None,
                registry_source: None,
                version: None,
            })
            .collect()
    }
}

/// Every registered provider.
pub struct Remotes {
    providers: RwLock<BTreeMap<String, Arc<Provider>>>,
    cache_dir: PathBuf,
    http: reqwest::Client,
    /// The live configuration, for the remote timeout in force.
    live: Arc<crate::config::Live>,
    /// Each provider's circuit breaker's settings.
    breaker: BreakerSettings,
    /// Where providers answer in memory (the simulation; None: over HTTP).
    in_memory: RwLock<Option<InMemory>>,
    /// Remote models a client loaded (`POST /load`, as v11 loads a cloud model): one whose
    /// provider loses its key answers the missing-key error, not a 404.
    loaded: RwLock<std::collections::BTreeSet<String>>,
}

impl Remotes {
    /// The providers saved in `<cache>/cloud_providers.json` (keys come from the environment,
    /// or a later `auth`). A damaged file is logged and ignored, never overwritten silently.
    pub fn new(cache_dir: PathBuf, live: Arc<crate::config::Live>, breaker: BreakerSettings) -> Remotes {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(30))
            .redirect(host::net::same_origin_redirects())
            // A provider's name is resolved at each connection and its link-local and
            // unspecified addresses dropped: a name that turns to 169.254.169.254 (DNS
            // rebinding) is never connected to.
            .dns_resolver(std::sync::Arc::new(host::net::ProviderResolver))
            .build()
            .expect("reqwest client");
        let saved = host::cloud::load(&cache_dir).unwrap_or_else(|e| {
            tracing::error!(error = %e, "remote providers not read");
            BTreeMap::new()
        });
        let providers = saved
            .into_iter()
            .filter_map(|(name, s)| {
                let base = cloud::api_base(&s.base_url).ok()?;
                // A hand-edited header that would not be sent as written falls back to the default.
                let r = s.reach;
                let header_ok =
                    cloud::check_auth_header(r.auth_header_name.as_deref(), r.auth_header_prefix.as_deref()).is_ok();
                let reach = Reach {
                    auth_header_name: r.auth_header_name.filter(|_| header_ok),
                    auth_header_prefix: r.auth_header_prefix.filter(|_| header_ok),
                    max_in_flight: r.max_in_flight.filter(|n| *n > 0),
                };
                let p = Provider::new(&name, base, s.base_url, s.allow_insecure_http, reach, breaker);
                p.keyed.store(s.keyed, std::sync::atomic::Ordering::Relaxed);
                p.seen.write().models = s.models;
                Some((name, Arc::new(p)))
            })
            .collect();
        Remotes {
            providers: RwLock::new(providers),
            cache_dir,
            http,
            live,
            breaker,
            in_memory: RwLock::new(None),
            loaded: RwLock::default(),
        }
    }

    /// How long a provider may take to start answering (`remote_timeout`, live).
    pub fn timeout(&self) -> Duration {
        self.live.remote_timeout()
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Providers answer in memory from now on (the simulation's upstreams).
    #[cfg(feature = "testing")]
    pub fn answer_in_memory(&self, answer: InMemory) {
        *self.in_memory.write() = Some(answer);
    }

    /// Where providers answer in memory, if they do.
    pub fn in_memory(&self) -> Option<InMemory> {
        self.in_memory.read().clone()
    }

    fn get(&self, name: &str) -> Option<Arc<Provider>> {
        self.providers.read().get(name).cloned()
    }

    /// Every registered provider, by name.
    pub fn providers(&self) -> Vec<Arc<Provider>> {
        self.all()
    }

    fn all(&self) -> Vec<Arc<Provider>> {
        self.providers.read().values().cloned().collect()
    }

    /// Registers (or re-points) a provider, or with no URL changes a registered one's key; then
    /// discovers its models. The answer is its view after discovery (a provider that is down
    /// is registered all the same, and shown down).
    pub async fn install(&self, name: &str, base_url: Option<&str>, key: Option<String>) -> Result<Upstream> {
        self.install_with(name, base_url, key, InstallOptions::default()).await
    }

    /// [`Remotes::install`] with Lemonade v11's `allow_insecure_http`, `auth_header_name` and
    /// `auth_header_prefix`, and lemonade's `max_in_flight` (None: kept as they were).
    pub async fn install_with(
        &self,
        name: &str,
        base_url: Option<&str>,
        key: Option<String>,
        o: InstallOptions,
    ) -> Result<Upstream> {
        let bad = |e: cloud::CloudError, param: &str| EngineError::invalid(e.to_string(), Some(param));
        cloud::check_name(name).map_err(|e| bad(e, "backend"))?;
        let r = &o.reach;
        cloud::check_auth_header(r.auth_header_name.as_deref(), None).map_err(|e| bad(e, "auth_header_name"))?;
        cloud::check_auth_header(None, r.auth_header_prefix.as_deref()).map_err(|e| bad(e, "auth_header_prefix"))?;
        let key = key.filter(|k| !k.is_empty());
        let provider = match base_url {
            Some(url) => {
                let base = cloud::api_base(url).map_err(|e| bad(e, "base_url"))?;
                cloud::check_base_address(&base).map_err(|e| bad(e, "base_url"))?;
                let old = self.get(name);
                let insecure = o.allow_insecure_http.unwrap_or_else(|| {
                    old.as_ref().is_some_and(|p| p.insecure_ok.load(std::sync::atomic::Ordering::Relaxed))
                });
                let was = old.as_ref().map(|p| p.reach.read().clone()).unwrap_or_default();
                let reach = Reach {
                    auth_header_name: o.reach.auth_header_name.or(was.auth_header_name),
                    auth_header_prefix: o.reach.auth_header_prefix.or(was.auth_header_prefix),
                    max_in_flight: o.reach.max_in_flight.map_or(was.max_in_flight, |n| (n > 0).then_some(n)),
                };
                let old_key = old.and_then(|p| p.key.read().clone());
                let key = key.or(old_key);
                if o.keyed && key.is_some() && url.starts_with("http://") && !insecure {
                    return Err(insecure_http(name));
                }
                let p = Provider::new(name, base, url.to_string(), insecure, reach, self.breaker);
                p.keyed.store(o.keyed, std::sync::atomic::Ordering::Relaxed);
                *p.key.write() = key;
                host::cloud::save(&self.cache_dir, name, Some(&p.saved(vec![])))?;
                let p = Arc::new(p);
                self.providers.write().insert(name.to_string(), p.clone());
                tracing::info!(provider = %name, base = %p.base, "remote provider registered");
                p
            }
            None => {
                let p = self.get(name).ok_or_else(|| unknown(name))?;
                if key.is_none() {
                    return Err(EngineError::invalid(
                        "Give 'base_url' to register a provider, or 'api_key' to change its key",
                        Some("api_key"),
                    ));
                }
                *p.key.write() = key;
                tracing::info!(provider = %name, "remote provider's key changed (held in memory)");
                p
            }
        };
        self.discover(&provider).await;
        Ok(provider.view())
    }

    /// Notes that a client loaded the remote model `name` (v11's cloud load).
    pub fn mark_loaded(&self, name: &str) {
        self.loaded.write().insert(name.to_string());
    }

    /// Forgets a remote model's load; whether it was loaded.
    pub fn unload(&self, name: &str) -> bool {
        self.loaded.write().remove(name)
    }

    /// Forgets every remote model's load.
    pub fn unload_all(&self) {
        self.loaded.write().clear();
    }

    /// A registered provider.
    pub fn provider(&self, name: &str) -> Result<Arc<Provider>> {
        self.get(name)
            .ok_or_else(|| EngineError::Missing { what: crate::error::Thing::Provider, name: name.to_string() })
    }

    /// Lemonade v11's `POST /cloud/auth`: holds `key` for `name` in memory and rediscovers its
    /// models. 404 for an unknown provider; a 409 (`Conflict`) when `LEMONADE_<NAME>_API_KEY`
    /// is set, which wins and is kept.
    pub async fn auth(&self, name: &str, key: &str, allow_insecure_http: Option<bool>) -> Result<Arc<Provider>> {
        let p = self.provider(name)?;
        if p.env_key().is_some() {
            return Err(EngineError::KeyFromEnvironment { variable: cloud::key_variable(name) });
        }
        if p.is_keyed() && p.url.starts_with("http://") && !allow_insecure_http.unwrap_or_else(|| p.insecure_ok()) {
            return Err(insecure_http(name));
        }
        if let Some(ok) = allow_insecure_http {
            p.insecure_ok.store(ok, std::sync::atomic::Ordering::Relaxed);
            let models = p.seen.read().models.clone();
            host::cloud::save(&self.cache_dir, name, Some(&p.saved(models)))?;
        }
        *p.key.write() = Some(key.to_string());
        self.discover(&p).await;
        Ok(p)
    }

    /// Lemonade v11's `DELETE /cloud/auth/{provider}`: drops the key held in memory (whether
    /// there was one is returned); with no key in the environment either, its discovered
    /// models are dropped too (nothing can reach them).
    pub fn clear_auth(&self, name: &str) -> Result<(Arc<Provider>, bool)> {
        let p = self.provider(name)?;
        let cleared = p.key.write().take().is_some();
        if p.env_key().is_none() {
            p.seen.write().models.clear();
        }
        Ok((p, cleared))
    }

    /// How many models `name` offers now.
    pub fn model_count(p: &Provider) -> usize {
        p.seen.read().models.len()
    }

    /// Forgets a provider. Idempotent: an unknown one answers Ok(false).
    pub fn uninstall(&self, name: &str) -> Result<bool> {
        let gone = self.providers.write().remove(name).is_some();
        if gone {
            host::cloud::save(&self.cache_dir, name, None)?;
            tracing::info!(provider = %name, "remote provider removed");
        }
        Ok(gone)
    }

    /// Reads a provider's `/models`: its list on success; on failure the old list is kept and
    /// it is marked down.
    async fn discover(&self, p: &Provider) {
        let t = Instant::now();
        let key = match p.sendable_key() {
            Ok(None) if p.is_keyed() => {
                // v11: no key, no call; nothing is offered until one is given.
                p.seen.write().models.clear();
                return p.record(false, t.elapsed(), Some(p.no_key().to_string()));
            }
            Ok(k) => k,
            Err(e) => return p.record(false, t.elapsed(), Some(e.to_string())),
        };
        let auth = key.map(|k| p.auth_header(&k));
        let auth = auth.as_ref().map(|(n, v)| (n.as_str(), v.as_str()));
        let within = self.timeout().min(Duration::from_secs(10));
        let in_memory = self.in_memory();
        let sent = |req| async move { send(in_memory.as_ref(), req).await.map_err(|e| e.describe(within)) };
        match host::cloud::discover(&self.http, &p.base, auth, within, sent).await {
            Ok(models) => {
                let changed = {
                    let mut seen = p.seen.write();
                    let changed = seen.models != models;
                    seen.models = models.clone();
                    changed
                };
                p.record(true, t.elapsed(), None);
                // Kept on disk for a restart while it is down; written only when it changed.
                let still_registered = self.get(&p.name).is_some_and(|q| std::ptr::eq(&*q, p));
                if changed && still_registered {
                    if let Err(e) = host::cloud::save(&self.cache_dir, &p.name, Some(&p.saved(models))) {
                        tracing::warn!(provider = %p.name, error = %e, "remote provider's models not saved");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(provider = %p.name, error = %e, "remote provider discovery failed");
                p.record(false, t.elapsed(), Some(e));
            }
        }
    }

    /// Discovers every provider (at once, each bounded by its timeout).
    pub async fn refresh(&self) {
        let all = self.all();
        futures_util::future::join_all(all.iter().map(|p| self.discover(p))).await;
    }

    /// The route of `name` when it is `<provider>.<id>` of a registered provider. An id its
    /// last list lacks triggers one discovery; still absent, it is a 404 naming the provider.
    pub async fn route(&self, name: &str) -> Result<Option<Route>> {
        let Some((p, id)) = cloud::split(name) else { return Ok(None) };
        let Some(provider) = self.get(p) else { return Ok(None) };
        if provider.is_keyed() && provider.key().is_none() {
            // v11: a model loaded before the key went answers why it cannot run; any other
            // is not offered any more.
            if self.loaded.read().contains(name) {
                return Err(provider.no_key());
            }
            return Err(EngineError::Lookup(registry::LookupError::NotFound {
                name: name.to_string(),
                hint: provider.no_key().to_string(),
            }));
        }
        if provider.has(id) {
            return Ok(Some(self.route_to(provider, id, name)));
        }
        self.discover(&provider).await;
        let view = provider.view();
        if provider.has(id) {
            return Ok(Some(self.route_to(provider, id, name)));
        }
        // Unknown to a provider that is down: its failure, not a missing model.
        if let Some(probe) = view.last_probe.filter(|p| !p.ok) {
            let why = probe.error.unwrap_or_else(|| "its last probe failed".into());
            return Err(provider.failure(UpstreamFailure::Down { why }));
        }
        let offered = if view.models.is_empty() { "nothing".to_string() } else { view.models.join(", ") };
        Err(EngineError::Lookup(registry::LookupError::NotFound {
            name: name.to_string(),
            hint: format!("Upstream '{p}' ({}) does not list '{id}'; it offers: {offered}", provider.base),
        }))
    }

    fn route_to(&self, provider: Arc<Provider>, id: &str, name: &str) -> Route {
        let (http, timeout) = (self.http.clone(), self.timeout());
        let in_memory = self.in_memory();
        Route { provider, id: id.to_string(), name: name.to_string(), http, timeout, admitted: None, in_memory }
    }

    pub fn views(&self) -> Vec<Upstream> {
        self.all().iter().map(|p| p.view()).collect()
    }

    /// Every remote model, for `/api/v1/models`.
    pub fn models(&self) -> Vec<Model> {
        self.all().iter().flat_map(|p| p.models()).collect()
    }

    /// One remote model by its name, for `/api/v1/models/{id}`.
    pub fn model(&self, name: &str) -> Option<Model> {
        self.models().into_iter().find(|m| m.id == name)
    }
}

/// v11's refusal of a key for a plain `http://` provider without the opt-in.
fn insecure_http(name: &str) -> EngineError {
    EngineError::Invalid {
        message: format!(
            "Cloud provider '{name}' uses http://; sending an API key over plaintext HTTP needs allow_insecure_http=true"
        ),
        param: Some("allow_insecure_http".into()),
        code: Some("insecure_http_requires_opt_in"),
    }
}

fn unknown(name: &str) -> EngineError {
    EngineError::invalid_code(
        format!("No remote provider '{name}' is registered: lemonade cloud install {name} --base-url URL"),
        "backend",
        "provider_not_found",
    )
}

/// Refreshes every provider's models every `every`, for as long as `remotes` lives.
pub fn refresh_every(remotes: std::sync::Weak<Remotes>, every: Duration) {
    tokio::spawn(async move {
        loop {
            let Some(r) = remotes.upgrade() else { return };
            r.refresh().await;
            drop(r);
            tokio::time::sleep(every).await;
        }
    });
}

/// How old an upstream's scraped metrics may be before they are read again.
pub const SCRAPE_EVERY: Duration = Duration::from_secs(1);
/// How long reading them may take (a request waits that long at most).
pub const SCRAPE_TIMEOUT: Duration = Duration::from_millis(500);

/// When an upstream's metrics were read, and what they said (None: the read failed).
type Scrape = (Instant, Option<Arc<String>>);

/// The last metrics read from each upstream.
#[derive(Default)]
pub struct Scrapes {
    last: Mutex<HashMap<String, Scrape>>,
}

impl Scrapes {
    pub async fn text(
        &self,
        http: &reqwest::Client,
        in_memory: Option<&InMemory>,
        p: &Provider,
    ) -> Option<Arc<String>> {
        if let Some((at, text)) = self.last.lock().get(&p.name) {
            if at.elapsed() < SCRAPE_EVERY {
                return text.clone();
            }
        }
        let url = backends::upstream::metrics_url(&p.base);
        let read = async {
            let r = send(in_memory, http.get(&url).timeout(SCRAPE_TIMEOUT)).await.ok()?.error_for_status().ok()?;
            r.text().await.ok().map(Arc::new)
        };
        let text = read.await;
        self.last.lock().insert(p.name.clone(), (Instant::now(), text.clone()));
        text
    }
}
