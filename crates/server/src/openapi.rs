//! The OpenAPI document: the routes and their request types from the route table's
//! `#[utoipa::path]`s and api-types, each operation's description and answers from
//! docs/API.md (the API reference a reader browses). Served at `/api/v1/openapi.json` (Swagger
//! UI at `/docs`); a copy is checked in as docs/openapi.json and a test fails when it drifts
//! (`cargo xtask openapi` rewrites it).

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Ref, Schema};
use utoipa::openapi::RefOr;
use utoipa::OpenApi;

use api_types::*;

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
    // The types docs/API.md names as answers (a test checks that every `$ref` resolves).
    components(
        schemas(AdminModel, AdminModels, AliasList, AliasResponse, AnthropicError, ChatCompletionResponse,
            CheckUpdates, ClassifyResponse, CleanupCacheResponse, CloudAuth, ConfigSetResponse, CountTokensResponse,
            DownloadJob, EmbeddingResponse, ErrorResponse, LemonadeError, GpuMemory, Health, ImagesResponse, InstallResponse, Live,
            LoadResponse, LogLevelResponse, MessagesResponse, Model, ModelFiles, ModelList, ModelOptions, NodeLoad,
            OllamaChatResponse, OllamaEmbedResponse, OllamaEmbeddingsResponse, OllamaError, OllamaGenerateResponse,
            OllamaPs, OllamaPullStatus, OllamaShow, OllamaTags, OllamaVersion, Params, PinResponse,
            PromptCacheCleared, PullVariants, RegisterResponse, RerankResponse, RoutingValidateResponse,
            SchedulerPlan, SchedulerState, SearchResults, Stats, StatusResponse, SystemInfo, SystemStats,
            TranscriptionResponse, UnloadResponse, UpstreamList),
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

/// docs/API.md: a `### METHOD /path` section per operation, its description, then its answers.
const REFERENCE: &str = include_str!("../../../docs/API.md");

/// The document: the title and tags here, the paths from the route table, each operation's
/// description and answers from [`REFERENCE`].
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.merge(RoutePaths::openapi());
    for section in sections() {
        if let Some(op) = operation(&mut doc, section.method, section.path) {
            if !section.description.is_empty() {
                op.description = Some(section.description.clone());
            }
            for (status, answer) in &section.answers {
                op.responses.responses.insert(status.to_string(), RefOr::T(answer.clone()));
            }
        }
    }
    doc
}

/// One operation's section of docs/API.md.
pub struct Section {
    pub method: &'static str,
    pub path: &'static str,
    pub description: String,
    pub answers: Vec<(&'static str, Response)>,
}

/// The sections of docs/API.md, in its order.
pub fn sections() -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    let mut prose: Vec<&str> = Vec::new();
    for line in REFERENCE.lines() {
        if let Some((method, path)) = line.strip_prefix("### ").and_then(|h| h.split_once(' ')) {
            out.push(Section { method, path, description: String::new(), answers: Vec::new() });
            prose.clear();
        } else if let (Some(s), Some(answer)) = (out.last_mut(), line.strip_prefix("- ").and_then(answer)) {
            s.answers.push(answer);
        } else if let Some(s) = out.last_mut().filter(|s| s.answers.is_empty() && !line.is_empty()) {
            // A paragraph's lines, joined as they were split: at single spaces.
            prose.push(line);
            s.description = prose.join(" ");
        }
    }
    out
}

/// An answer line: ``200 `Body`: meaning``, ``200 `[Body]`: …``, ``200 (audio/wav): …`` or
/// ``200: …``.
fn answer(line: &'static str) -> Option<(&'static str, Response)> {
    let (head, meaning) = line.split_once(": ")?;
    let (status, rest) = head.split_once(' ').unwrap_or((head, ""));
    if status.len() != 3 || !status.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut r = ResponseBuilder::new().description(meaning);
    if let Some(media) = rest.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
        r = r.content(media, ContentBuilder::new().build());
    } else if let Some(body) = rest.strip_prefix('`').and_then(|r| r.strip_suffix('`')) {
        let schema: RefOr<Schema> = match body.strip_prefix('[').and_then(|b| b.strip_suffix(']')) {
            Some(item) => ArrayBuilder::new().items(Ref::from_schema_name(item)).into(),
            None if body == "Object" => ObjectBuilder::new().into(),
            None => Ref::from_schema_name(body).into(),
        };
        r = r.content("application/json", ContentBuilder::new().schema(Some(schema)).build());
    }
    Some((status, r.build()))
}

/// The operation `method path` of `doc`, if the route table documents it.
pub fn operation<'a>(
    doc: &'a mut utoipa::openapi::OpenApi,
    method: &str,
    path: &str,
) -> Option<&'a mut utoipa::openapi::path::Operation> {
    let item = doc.paths.paths.get_mut(path)?;
    match method {
        "GET" => item.get.as_mut(),
        "POST" => item.post.as_mut(),
        "DELETE" => item.delete.as_mut(),
        "PUT" => item.put.as_mut(),
        _ => None,
    }
}

/// The document as pretty JSON with a trailing newline (the checked-in form).
pub fn document_json() -> String {
    let mut s = document().to_pretty_json().expect("OpenAPI document serializes");
    s.push('\n');
    s
}
