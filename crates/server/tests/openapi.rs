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

/// docs/API.md and the route table agree: every documented operation has its section there,
/// with at least one answer, and every section names an operation the table documents.
#[test]
fn api_reference_has_a_section_for_every_operation_and_none_other() {
    use lemonade_server::openapi::{document, operation, sections};
    let mut doc = document();
    let sections = sections();
    let mut unknown = Vec::new();
    for s in &sections {
        if operation(&mut doc, s.method, s.path).is_none() {
            unknown.push(format!("{} {}", s.method, s.path));
        }
        assert!(!s.answers.is_empty(), "docs/API.md: {} {} lists no answer", s.method, s.path);
    }
    assert!(unknown.is_empty(), "docs/API.md has sections for routes the table does not document: {unknown:?}");
    let mut missing = Vec::new();
    for (path, item) in &doc.paths.paths {
        let ops = [("GET", &item.get), ("POST", &item.post), ("DELETE", &item.delete), ("PUT", &item.put)];
        for (method, op) in ops {
            if op.is_some() && !sections.iter().any(|s| s.method == method && s.path == path) {
                missing.push(format!("{method} {path}"));
            }
        }
    }
    assert!(missing.is_empty(), "routes with no section in docs/API.md: {missing:?}");
    assert!(sections.len() > 80, "{} sections", sections.len());
}

/// Every `$ref` in the document names a schema it holds (an answer type docs/API.md names
/// must be listed in the document's components).
#[test]
fn every_reference_in_the_document_resolves() {
    let doc: serde_json::Value = serde_json::from_str(&lemonade_server::openapi::document_json()).unwrap();
    fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(r) = m.get("$ref").and_then(|r| r.as_str()) {
                    out.push(r.to_string());
                }
                m.values().for_each(|v| refs(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 100, "{} references", all.len());
    for r in all {
        let name = r.strip_prefix("#/components/schemas/").unwrap_or_else(|| panic!("not a schema reference: {r}"));
        assert!(doc["components"]["schemas"][name].is_object(), "{r} does not resolve");
    }
}
