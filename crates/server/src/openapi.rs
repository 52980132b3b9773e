//! The OpenAPI document, derived from api-types and the handlers' `#[utoipa::path]`s.
//! Served at `/api/v1/openapi.json` (Swagger UI at `/docs`); a copy is checked in as
//! docs/openapi.json and a test fails when it drifts (`cargo xtask openapi` rewrites it).

use utoipa::OpenApi;

use crate::routes::RoutePaths;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "lemonade",
        description = "A local LLM server: OpenAI-compatible APIs for many models at once, each served by a managed \
                       llama-server process. Every API path is also served under /api/v0, /v0 and /v1. With \
                       LEMONADE_API_KEY set, every API path except health needs `Authorization: Bearer <key>` (else \
                       401 `{\"error\": \"Invalid or missing API key\"}`); with LEMONADE_ADMIN_API_KEY set, pull, \
                       delete, install, uninstall, load, unload, log-level and the admin load/unload need that key (the \
                       API key there is a 403 `admin_key_required`). Before routing, a browser `Origin` that is not \
                       allowed (loopback, the server's own, desktop-app schemes, LEMONADE_ALLOWED_ORIGINS) is a 403 \
                       `origin_not_allowed`, and on a loopback bind a `Host` that is not a loopback name (or in \
                       LEMONADE_ALLOWED_HOSTS) is a 403 `host_not_allowed`.",
        license(name = "Apache-2.0")
    ),
    tags(
        (name = "OpenAI", description = "OpenAI-compatible endpoints"),
        (name = "Lemonade", description = "Lemonade's own endpoints"),
        (name = "llama.cpp", description = "llama-server's own endpoints, routed per model"),
        (name = "System", description = "Hardware, backend states, usage, and the server log"),
        (name = "Admin", description = "Runtime admin API: live model state, load with overrides, unload, GPU memory. \
            Runtime states: unloaded, loading, loaded, unloading (no new requests; in-flight ones finish), failed (see last_error)."),
    )
)]
pub struct ApiDoc;

/// The document: the title and tags here, the paths from the route table.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.merge(RoutePaths::openapi());
    doc
}

/// The document as pretty JSON with a trailing newline (the checked-in form).
pub fn document_json() -> String {
    let mut s = document().to_pretty_json().expect("OpenAPI document serializes");
    s.push('\n');
    s
}
