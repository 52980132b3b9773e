//! The lemonade HTTP server: axum routes over the model [`runtime`], forwarding to backends
//! through the [`proxy`]. See docs/ARCHITECTURE.md for the map.

pub mod access;
pub mod admin;
pub mod config;
pub mod error;
pub mod extract;
pub mod install;
pub mod logging;
pub mod openapi;
pub mod proxy;
pub mod pull;
pub mod routes;
pub mod runtime;
pub mod system_info;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use registry::{Registry, RegistryConfig};
use tokio::net::TcpListener;
use utoipa_swagger_ui::SwaggerUi;

pub use config::Config;
use routes::*;
pub use runtime::Runtime;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The API route prefixes; every API endpoint answers identically under each.
pub const PREFIXES: [&str; 4] = ["/api/v0", "/api/v1", "/v0", "/v1"];

static BODY_LIMIT: AtomicUsize = AtomicUsize::new(64 << 20);

/// The request body limit in force (for error messages).
pub fn body_limit() -> usize {
    BODY_LIMIT.load(Ordering::Relaxed)
}

/// A POST route; other methods get a JSON 405 naming POST.
fn post_only<H: axum::handler::Handler<T, AppState>, T: 'static>(h: H) -> MethodRouter<AppState> {
    post(h).fallback(method_not_allowed("POST"))
}

/// A GET (and HEAD) route; other methods get a JSON 405 naming GET.
fn get_only<H: axum::handler::Handler<T, AppState>, T: 'static>(h: H) -> MethodRouter<AppState> {
    get(h).fallback(method_not_allowed("GET"))
}

/// llama-server's own routes, forwarded to the model's backend under every prefix and at the
/// root: POST ones, then GET ones.
pub(crate) const NATIVE_POST: [&str; 5] = ["/completion", "/tokenize", "/detokenize", "/apply-template", "/infill"];
pub(crate) const NATIVE_GET: [&str; 3] = ["/props", "/slots", "/metrics"];

/// The application router.
pub fn app(rt: Arc<Runtime>) -> Router {
    BODY_LIMIT.store(rt.cfg.body_limit, Ordering::Relaxed);
    let mut native = Router::new();
    for path in NATIVE_POST {
        native = native.route(path, post_only(native_post));
    }
    for path in NATIVE_GET {
        native = native.route(path, get_only(native_get));
    }
    let api = Router::new()
        .route("/chat/completions", post_only(chat_completions))
        .route("/completions", post_only(completions))
        .route("/responses", post_only(responses))
        .route("/embeddings", post_only(embeddings))
        .route("/reranking", post_only(reranking))
        .route("/rerank", post_only(reranking))
        .route("/models", get_only(list_models))
        .route("/models/{*id}", get_only(get_model))
        .route("/health", get_only(health))
        .route("/stats", get_only(stats))
        .route("/load", post_only(load))
        .route("/unload", post_only(unload))
        .route("/pull", post_only(pull::pull))
        .route("/delete", post_only(pull::delete))
        .route("/install", post_only(install::install_route))
        .route("/uninstall", post_only(install::uninstall_route))
        .route("/system-info", get_only(system_info::system_info))
        .route("/system-stats", get_only(system_info::system_stats))
        .route("/log-level", post_only(logging::set_level))
        .route("/logs/stream", get_only(logging::stream))
        .route("/admin/models", get_only(admin::models))
        .route("/admin/models/{model_name}/load", post_only(admin::load))
        .route("/admin/models/{model_name}/unload", post_only(admin::unload))
        .route("/admin/gpu-memory", get_only(admin::gpu_memory))
        .merge(native.clone());
    let mut router = Router::new();
    for prefix in PREFIXES {
        router = router.nest(prefix, api.clone());
    }
    router
        .merge(native)
        .route("/live", get_only(live))
        .merge(SwaggerUi::new("/docs").url("/api/v1/openapi.json", openapi::document()))
        .fallback(unknown_path)
        .layer(DefaultBodyLimit::max(rt.cfg.body_limit))
        .layer(axum::middleware::from_fn_with_state(Arc::new(rt.cfg.access.clone()), access::layer))
        .with_state(rt)
}

/// Where the registry reads from, for `cfg`.
pub fn registry_config(cfg: &Config) -> RegistryConfig {
    RegistryConfig {
        cache_dir: cfg.cache_dir.clone(),
        hf_cache: cfg.hf_cache.clone(),
        extra_models_dir: cfg.extra_models_dir.clone(),
        physical_memory_gb: physical_memory_gb(),
        disable_filtering: cfg.disable_filtering,
    }
}

/// Builds the registry and runtime from `cfg`.
pub fn runtime(cfg: Config) -> anyhow::Result<Arc<Runtime>> {
    let registry = Registry::load(&registry_config(&cfg)).context("cannot read the model catalogue")?;
    Ok(Runtime::new(cfg, registry))
}

/// Binds every address `host` resolves to on `port`; at least one must succeed.
pub async fn bind(host: &str, port: u16) -> anyhow::Result<Vec<TcpListener>> {
    let addrs: Vec<SocketAddr> =
        tokio::net::lookup_host((host, port)).await.with_context(|| format!("cannot resolve host '{host}'"))?.collect();
    let mut listeners = Vec::new();
    let mut last_err = None;
    for addr in addrs {
        match TcpListener::bind(addr).await {
            Ok(l) => listeners.push(l),
            Err(e) => last_err = Some(anyhow::Error::new(e).context(format!("cannot listen on {addr}"))),
        }
    }
    match (listeners.is_empty(), last_err) {
        (true, Some(e)) => Err(e),
        (true, None) => anyhow::bail!("host '{host}' resolved to no address"),
        _ => Ok(listeners),
    }
}

/// Serves until `shutdown` resolves, then stops every backend and returns.
pub async fn serve(
    rt: Arc<Runtime>,
    listeners: Vec<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use axum::serve::ListenerExt;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let app = app(rt.clone());
    let mut servers = tokio::task::JoinSet::new();
    for l in listeners {
        let addr = l.local_addr()?;
        if !addr.ip().is_loopback() && rt.cfg.access.api_key.is_none() {
            tracing::warn!(
                "listening on {addr}, which other machines can reach, with no API key: anyone on the network can use \
                 and manage this server. Set LEMONADE_API_KEY, or use --host 127.0.0.1"
            );
        }
        tracing::info!("lemonade {VERSION} listening on http://{addr}");
        let mut rx = stop_rx.clone();
        let srv = axum::serve(
            l.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            }),
            // `into_make_service`: each connection gets a clone of the router (an `Arc`).
            // Serving the `Router` itself would rebuild every route for every connection
            // (axum calls `with_state(())` per connection): 126 KiB per connection measured.
            app.clone().into_make_service(),
        )
        .with_graceful_shutdown(async move {
            let _ = rx.wait_for(|s| *s).await;
        });
        servers.spawn(async move { srv.await });
    }
    // Once shutdown starts, stopping the backends ends open streams, so connections drain.
    let mut rx = stop_rx.clone();
    let _ = rx.wait_for(|s| *s).await;
    tracing::info!("shutting down: stopping backends");
    rt.shutdown().await;
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(r) = servers.join_next().await {
            if let Ok(Err(e)) = r {
                tracing::warn!(error = %e, "listener ended with an error");
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("connections still open after 10 s; exiting anyway");
    }
    Ok(())
}

/// Total RAM in GB from /proc/meminfo (Linux), for the catalogue's size filter.
fn physical_memory_gb() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: f64 = s.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0 / 1024.0)
}
