//! The lemonade HTTP server: axum routes over the [`engine`] (the application), forwarding to
//! backends through the [`proxy`]. It speaks HTTP only. See docs/ARCHITECTURE.md for the map.

pub mod access;
pub mod api;
pub mod error;
pub mod extract;
pub mod metrics;
pub mod openapi;
pub mod propagate;
pub mod proxy;
pub mod routes;
pub mod sse;
pub mod state;
pub mod waiting;
pub mod webui;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::Router;
use tokio::net::TcpListener;
use utoipa_swagger_ui::SwaggerUi;

pub use engine::{Config, Engine};
pub use routes::PREFIXES;
pub use state::{AppState, Http};

pub use engine::VERSION;

/// The application: the route table, Swagger UI, the body limit and access control.
pub fn app(state: AppState) -> Router {
    let access = state.http.access.clone();
    app_with(state, access)
}

fn app_with(state: AppState, access: access::Access) -> Router {
    routes::router()
        .merge(SwaggerUi::new("/docs").url("/api/v1/openapi.json", openapi::document()))
        .layer(DefaultBodyLimit::max(state.http.body_limit))
        .layer(axum::middleware::from_fn_with_state(propagate::Names::new(state.engine.cfg()), propagate::layer))
        .layer(axum::middleware::from_fn_with_state(state.engine.catalogue().clone(), scanned))
        .layer(axum::middleware::from_fn_with_state(Arc::new(access), access::layer))
        // Outermost, so refusals by access control are counted too.
        .layer(axum::middleware::from_fn_with_state(state.engine.metrics().clone(), metrics::layer))
        .with_state(state)
}

/// Holds a request until the catalogue's first scan is published (lemonade listens before it
/// ends); `/live` answers at once.
async fn scanned(
    axum::extract::State(c): axum::extract::State<Arc<engine::Catalogue>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if req.uri().path() != "/live" {
        c.scanned().await;
    }
    next.run(req).await
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
    rt: AppState,
    listeners: Vec<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use axum::serve::ListenerExt;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let asked = rt.http.shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown => {}
            _ = asked.notified() => tracing::info!("shutdown asked for (POST /internal/shutdown)"),
        }
        let _ = stop_tx.send(true);
    });
    // Only loopback names are served when every listener is a loopback one (DNS rebinding).
    let mut access = rt.http.access.clone();
    access.loopback_only = listeners.iter().all(|l| l.local_addr().is_ok_and(|a| a.ip().is_loopback()));
    let keyless = access.api_key.is_none() && access.admin_key.is_none();
    if access.allowed_origins == access::Origins::Any && keyless {
        tracing::warn!(
            "LEMONADE_ALLOWED_ORIGINS=* with no API key: any web page you visit can use and manage this server. \
             Set LEMONADE_API_KEY, or list the origins that need access"
        );
    }
    let app = app_with(rt.clone(), access);
    let mut servers = tokio::task::JoinSet::new();
    for l in listeners {
        let addr = l.local_addr()?;
        if !addr.ip().is_loopback() && keyless {
            tracing::warn!(
                "listening on {addr}, which other machines can reach, with no API key: anyone on the network can use \
                 and manage this server. Set LEMONADE_API_KEY (and LEMONADE_ADMIN_API_KEY), or use --host 127.0.0.1"
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
    rt.engine.shutdown().await;
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
