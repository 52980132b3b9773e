//! The one route table: the router and the OpenAPI document are both built from it, so a
//! route cannot be served undocumented or documented unserved (a test compares the two).

use axum::routing::{any, delete, get, post, MethodRouter};
use axum::Router;

use crate::api::{
    admin, anthropic, audio, explain, images, install, internal, lifecycle, logs, mcp, metrics, native, ollama, openai,
    options, pull, router, system,
};
use crate::state::AppState;
use crate::webui;

/// The API route prefixes; every API endpoint answers identically under each.
pub const PREFIXES: [&str; 4] = ["/api/v0", "/api/v1", "/v0", "/v1"];

/// llama-server's own routes, forwarded to the model's backend under every prefix and at the
/// root: POST ones, then GET ones (`backends::llamacpp`'s list).
pub use backends::llamacpp::{NATIVE_GET, NATIVE_POST};

/// A POST route; other methods get a JSON 405 naming POST.
fn post_only<H: axum::handler::Handler<T, AppState>, T: 'static>(h: H) -> MethodRouter<AppState> {
    post(h).fallback(native::method_not_allowed("POST"))
}

/// A GET (and HEAD) route; other methods get a JSON 405 naming GET.
fn get_only<H: axum::handler::Handler<T, AppState>, T: 'static>(h: H) -> MethodRouter<AppState> {
    get(h).fallback(native::method_not_allowed("GET"))
}

/// A DELETE route; other methods get a JSON 405 naming DELETE.
fn delete_only<H: axum::handler::Handler<T, AppState>, T: 'static>(h: H) -> MethodRouter<AppState> {
    delete(h).fallback(native::method_not_allowed("DELETE"))
}

/// `/models/{*id}`: GET a model (or `{id}/options`); POST and DELETE `{id}/options`.
fn model_paths<H: axum::handler::Handler<T, AppState>, T: 'static>(h: H) -> MethodRouter<AppState> {
    get(h)
        .post(options::post_model_path)
        .delete(options::delete_model_path)
        .fallback(native::method_not_allowed("GET, POST, DELETE"))
}

/// Every method.
fn any_method<H: axum::handler::Handler<T, AppState>, T: 'static>(h: H) -> MethodRouter<AppState> {
    any(h)
}

/// A POST handler on a path whose GET route (listed before it) answers other methods.
fn post_also<H: axum::handler::Handler<T, AppState>, T: 'static>(h: H) -> MethodRouter<AppState> {
    post(h)
}

macro_rules! route_table {
    (documented { $($method:ident $path:literal => $($handler:ident)::+;)* }
     aliases { $($amethod:ident $apath:literal => $($ahandler:ident)::+;)* }
     root { $($rmethod:ident $rpath:literal => $($rhandler:ident)::+;)* }
     root_aliases { $($ramethod:ident $rapath:literal => $($rahandler:ident)::+;)* }) => {
        /// Every API route under one prefix: (method, path); aliases last.
        pub const API_ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path),)* $((stringify!($amethod), $apath)),*];
        /// The documented routes at the root of the port (the Ollama API).
        pub const ROOT_ROUTES: &[(&str, &str)] = &[$((stringify!($rmethod), $rpath)),*];

        /// The API routes (nested under each of [`PREFIXES`]).
        pub fn api_router() -> Router<AppState> {
            Router::new()$(.route($path, $method($($handler)::+)))*$(.route($apath, $amethod($($ahandler)::+)))*
        }

        /// The routes at the root.
        pub fn root_router() -> Router<AppState> {
            Router::new()$(.route($rpath, $rmethod($($rhandler)::+)))*$(.route($rapath, $ramethod($($rahandler)::+)))*
        }

        /// The documentation of the API routes, from the same table.
        #[derive(utoipa::OpenApi)]
        #[openapi(paths($($($handler)::+),*, $($($rhandler)::+),*, lifecycle::live, lifecycle::root_health, lifecycle::get_load, native::native_post, native::native_get,
            options::get_options, options::save_options, options::reset_options, options::files))]
        pub struct RoutePaths;
    };
}

route_table! {
    documented {
    post_only "/chat/completions" => openai::chat_completions;
    post_only "/completions" => openai::completions;
    post_only "/responses" => openai::responses;
    post_only "/embeddings" => openai::embeddings;
    post_only "/reranking" => openai::reranking;
    post_only "/audio/transcriptions" => audio::transcriptions;
    post_only "/audio/translations" => audio::translations;
    post_only "/audio/speech" => audio::speech;
    post_only "/images/generations" => images::generations;
    post_only "/images/edits" => images::edits;
    post_only "/images/variations" => images::variations;
    get_only "/models" => openai::list_models;
    model_paths "/models/{*id}" => openai::get_model;
    get_only "/health" => lifecycle::health;
    get_only "/stats" => lifecycle::stats;
    post_only "/load" => lifecycle::load;
    post_only "/unload" => lifecycle::unload;
    post_only "/pin" => lifecycle::pin;
    delete_only "/prompt-cache" => lifecycle::clear_prompt_cache;
    get_only "/params" => lifecycle::params;
    post_also "/params" => lifecycle::set_params;
    post_only "/pull" => pull::pull;
    post_only "/models/register" => pull::register;
    post_only "/models/check-updates" => pull::check_updates;
    get_only "/pull/variants" => pull::variants;
    post_only "/routing/validate" => router::validate;
    post_only "/classify" => router::classify;
    get_only "/scheduler" => explain::state;
    post_only "/scheduler/plan" => explain::plan;
    get_only "/scheduler/events" => explain::events;
    get_only "/registry/search" => pull::search;
    get_only "/downloads" => pull::downloads;
    post_only "/downloads/control" => pull::control;
    post_only "/delete" => pull::delete;
    post_only "/install" => install::install_route;
    post_only "/uninstall" => install::uninstall_route;
    get_only "/cloud" => install::cloud_list;
    post_only "/cloud/auth" => install::cloud_auth;
    delete_only "/cloud/auth/{provider}" => install::cloud_auth_clear;
    get_only "/system-info" => system::system_info;
    get_only "/system-stats" => system::system_stats;
    get_only "/log-level" => logs::get_level;
    post_also "/log-level" => logs::set_level;
    get_only "/logs/stream" => logs::stream;
    get_only "/admin/models" => admin::models;
    post_only "/admin/models/{model_name}/load" => admin::load;
    post_only "/admin/models/{model_name}/unload" => admin::unload;
    get_only "/admin/gpu-memory" => admin::gpu_memory;
    post_only "/messages" => anthropic::messages;
    post_only "/messages/count_tokens" => anthropic::count_tokens;
    }
    aliases {
        post_only "/rerank" => openai::reranking;
        post_only "/reranker" => openai::reranking;
    }
    root {
        get_only "/api/version" => ollama::version;
        get_only "/api/tags" => ollama::tags;
        get_only "/api/ps" => ollama::ps;
        post_only "/api/show" => ollama::show;
        post_only "/api/pull" => ollama::pull;
        delete_only "/api/delete" => ollama::delete;
        post_only "/api/chat" => ollama::chat;
        post_only "/api/generate" => ollama::generate;
        post_only "/api/embed" => ollama::embed;
        post_only "/api/embeddings" => ollama::embeddings;
        post_only "/api/create" => ollama::not_supported;
        get_only "/internal/aliases" => internal::aliases;
        post_also "/internal/aliases" => internal::set_alias;
        delete_only "/internal/aliases/{alias}" => internal::delete_alias;
        get_only "/internal/config" => internal::config;
        get_only "/internal/config/defaults" => internal::config_defaults;
        post_only "/internal/set" => internal::set;
        post_only "/internal/pin" => internal::pin;
        post_only "/internal/shutdown" => internal::shutdown;
        post_only "/internal/cleanup-cache" => internal::cleanup_cache;
        get_only "/logs/stream" => logs::ws_stream;
        post_only "/mcp" => mcp::mcp;
        post_only "/internal/telemetry/flush" => internal::telemetry_flush;
    }
    root_aliases {
        any_method "/api/copy" => ollama::not_supported;
        any_method "/api/push" => ollama::not_supported;
        any_method "/api/blobs/{digest}" => ollama::not_supported;
    }
}

/// llama-server's own routes; at the root, `/metrics` is lemonade's (see [`router`]).
pub fn native_router(root: bool) -> Router<AppState> {
    let mut native = Router::new();
    for path in NATIVE_POST {
        native = native.route(path, post_only(native::native_post));
    }
    for path in NATIVE_GET.into_iter().filter(|p| !root || *p != "/metrics") {
        native = native.route(path, get_only(native::native_get));
    }
    native
}

/// Every route: the API under each prefix, llama-server's routes there and at the root, `/live`,
/// lemonade's Prometheus `/metrics` (a model's llama-server's with `?model=`), and the web UI
/// (`/`, `/ui/*`, and the page for a browser's navigation to any other UI path).
pub fn router() -> Router<AppState> {
    let api = api_router().merge(native_router(false));
    let mut router = Router::new();
    for prefix in PREFIXES {
        router = router.nest(prefix, api.clone());
    }
    router
        .merge(native_router(true))
        .merge(root_router())
        .route("/live", get_only(lifecycle::live))
        .route("/health", get_only(lifecycle::root_health))
        .route("/get_load", get_only(lifecycle::get_load))
        .route("/metrics", get_only(metrics::metrics))
        .route("/", get_only(webui::root))
        .route("/ui/{*file}", get_only(webui::asset))
        .fallback(webui::fallback)
        .layer(axum::Extension(webui::WebUi::load()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa::OpenApi;

    #[test]
    fn every_route_is_documented_and_every_documented_path_is_routed() {
        let doc = RoutePaths::openapi();
        let documented: Vec<(&str, String)> = doc
            .paths
            .paths
            .iter()
            .flat_map(|(path, item)| {
                let mut m = Vec::new();
                if item.get.is_some() {
                    m.push(("GET", path.clone()));
                }
                if item.post.is_some() {
                    m.push(("POST", path.clone()));
                }
                if item.delete.is_some() {
                    m.push(("DELETE", path.clone()));
                }
                m
            })
            .collect();
        // The HTTP method a route helper of the table serves.
        let http = |helper: &str| match helper {
            "get_only" | "model_paths" => "GET",
            "delete_only" => "DELETE",
            _ => "POST",
        };
        // The admin API is documented under /v1 (as its spec), the rest under /api/v1.
        let doc_path = |p: &str| if p.starts_with("/admin") { format!("/v1{p}") } else { format!("/api/v1{p}") };
        for (helper, path) in API_ROUTES {
            let method = http(helper);
            let want = doc_path(&path.replace("{*id}", "{id}"));
            let aliased = *path == "/rerank" || *path == "/reranker"; // documented as /reranking
            assert!(
                aliased || documented.iter().any(|(m, p)| *m == method && *p == want),
                "{method} {path} is routed but not documented as {want}"
            );
        }
        for (helper, path) in ROOT_ROUTES {
            let method = http(helper);
            assert!(documented.iter().any(|(m, p)| *m == method && p == path), "{method} {path} is not documented");
        }
        let routed = |m: &str, p: &str| {
            API_ROUTES.iter().any(|(h, rp)| http(h) == m && doc_path(&rp.replace("{*id}", "{id}")) == p)
                || ROOT_ROUTES.iter().any(|(h, rp)| http(h) == m && rp == &p)
                || (m == "GET" && ["/live", "/health", "/get_load"].contains(&p))
                || (p == "/api/v1/models/{id}/options" && ["GET", "POST", "DELETE"].contains(&m))
                || (p == "/api/v1/models/{id}/files" && m == "GET")
                || (m == "POST" && NATIVE_POST.contains(&p))
                || (m == "GET" && NATIVE_GET.contains(&p))
        };
        for (m, p) in &documented {
            assert!(routed(m, p), "{m} {p} is documented but not routed");
        }
    }
}
