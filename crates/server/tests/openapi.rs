//! The OpenAPI document checked in as docs/openapi.json must match the code.
//! `cargo xtask openapi` (LEMONADE_UPDATE_OPENAPI=1) rewrites it.

use std::path::PathBuf;

#[test]
fn checked_in_openapi_matches_the_code() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    let now = lemonade_server::openapi::document_json();
    if std::env::var_os("LEMONADE_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &now).unwrap();
        return;
    }
    let saved = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(saved == now, "docs/openapi.json is stale: run `cargo xtask openapi` and commit the result");
}

#[test]
fn document_describes_every_endpoint_and_error() {
    let doc: serde_json::Value = serde_json::from_str(&lemonade_server::openapi::document_json()).unwrap();
    for p in [
        "/api/v1/chat/completions",
        "/api/v1/completions",
        "/api/v1/responses",
        "/api/v1/embeddings",
        "/api/v1/reranking",
        "/api/v1/models",
        "/api/v1/models/{id}",
        "/api/v1/health",
        "/api/v1/stats",
        "/live",
        "/tokenize",
        "/slots",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} missing");
    }
    let chat = &doc["paths"]["/api/v1/chat/completions"]["post"]["responses"];
    for code in ["200", "400", "404", "413", "500", "502"] {
        assert!(chat[code].is_object(), "chat/completions lacks a {code} response");
    }
    assert!(doc["components"]["schemas"]["ErrorResponse"].is_object());
}
