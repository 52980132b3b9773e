//! Collections (Lemonade v11's `collection.router`): registering one from a pull, listing
//! them, and deciding per request which candidate answers. The policy and the decision are
//! the `routing` crate's (pure); this module runs the model-backed classifiers the decision
//! asks for, as requests to their models (loaded as for any request), and keeps no state of
//! its own: a collection lives in `user_models.json` like any `user.*` model.

use std::collections::BTreeMap;

use api_types::{
    Model, ModelType, PullRequest, RegisterRequest, RouteDecision, RoutingValidateRequest, RoutingValidateResponse,
};
use registry::{CatalogueEntry, Collection, USER_PREFIX};
use routing::{classifiers, Classifier, ClassifierKind, Features, Outcome, Policy, Score};
use serde_json::{Map, Value};

use crate::error::{EngineError, Result};
use crate::lease::Endpoint;
use crate::Engine;

/// Whether a pull body defines a collection (`recipe: "collection.*"`), or names a
/// registry-backed one to refresh.
pub(crate) fn is_collection_pull(rt: &Engine, req: &PullRequest) -> bool {
    req.recipe.as_deref().is_some_and(|r| r.starts_with("collection.")) || refreshed(rt, req).is_some()
}

/// The registry-backed collection a bare pull (`{"model_name": X}`) names: (recipe, repository).
fn refreshed(rt: &Engine, req: &PullRequest) -> Option<(String, String)> {
    if req.recipe.is_some() || req.components.is_some() {
        return None;
    }
    let name = req.model.as_deref().or(req.model_name.as_deref())?;
    let reg = rt.catalogue.registry();
    let c = reg.collection(name)?;
    Some((c.recipe.clone(), c.pointer.clone()?))
}

/// The repository a collection pull points at (`checkpoints.main` or `checkpoint`), when it
/// names no components (v11's registry-backed collection).
fn pointer(req: &PullRequest) -> Option<String> {
    let main = req.checkpoints.as_ref().and_then(|c| c.get("main")).or(req.checkpoint.as_ref());
    main.filter(|p| !p.is_empty() && req.components.is_none()).cloned()
}

fn policy_error(e: routing::PolicyError) -> EngineError {
    EngineError::invalid_code(format!("Invalid routing policy: {e}"), &e.path, "invalid_routing_policy")
}

/// `POST /pull` of a collection definition: checked as v11 checks it (a `user.` name, the
/// policy, each component a registered model or a remote provider's, none of them a collection
/// or the collection itself), then registered; nothing is downloaded. Re-pulling replaces it.
pub async fn register(rt: &Engine, req: &PullRequest) -> Result<String> {
    let name = req.model.clone().or_else(|| req.model_name.clone()).filter(|n| !n.is_empty());
    let name = name.ok_or_else(|| EngineError::invalid("Missing required field 'model'", Some("model")))?;
    if !name.starts_with(USER_PREFIX) {
        return Err(EngineError::invalid(
            format!(
                "A collection's name must include the `user.` prefix, for example `user.My-Router`. Received: {name}"
            ),
            Some("model"),
        ));
    }
    registry::validate_user_name(&name).map_err(|e| EngineError::invalid(e.to_string(), Some("model")))?;
    let repo = refreshed(rt, req).map(|(_, repo)| repo).or_else(|| pointer(req));
    if let Some(repo) = repo {
        // The manifest is the definition; only the pointer is saved.
        let m = crate::pulls::collection_manifest(rt, &repo).await?;
        let mut def: PullRequest = serde_json::from_value(m).map_err(|e| {
            EngineError::invalid(format!("Invalid collection manifest for '{repo}': {e}"), Some("checkpoint"))
        })?;
        if let Some(r) = req.recipe.as_ref().filter(|r| def.recipe.as_ref() != Some(*r)) {
            return Err(EngineError::invalid(
                format!("'{repo}' defines a {}, not a {r}", def.recipe.unwrap_or_default()),
                Some("recipe"),
            ));
        }
        (def.model, def.model_name, def.checkpoint, def.checkpoints) = (None, Some(name.clone()), None, None);
        return define(rt, &name, &def, Some(&repo)).await;
    }
    define(rt, &name, req, None).await
}

/// Checks and saves the collection `name` that `req` defines; with `pointer`, only it is saved
/// (the manifest of that repository stays the definition).
async fn define(rt: &Engine, name: &str, req: &PullRequest, pointer: Option<&str>) -> Result<String> {
    let name = name.to_string();
    let recipe = req.recipe.clone().unwrap_or_default();
    let (components, omni) = match recipe.as_str() {
        routing::ROUTER_RECIPE => (Policy::parse(&definition(req, &recipe)).map_err(policy_error)?.components, None),
        routing::OMNI_RECIPE => {
            let bad = |e: routing::PolicyError| {
                EngineError::invalid_code(format!("Invalid omni collection: {e}"), &e.path, "invalid_collection")
            };
            if req.routing.is_some() {
                return Err(EngineError::invalid("Only a collection.router has a routing policy", Some("routing")));
            }
            let components = routing::components(req.components.as_ref()).map_err(bad)?;
            let o = routing::omni::Omni::parse(req.system_prompt.as_ref(), req.tool_format.as_ref()).map_err(bad)?;
            (components, Some(o))
        }
        _ => {
            return Err(EngineError::invalid(
                format!(
                    "The '{recipe}' recipe is not a collection this lemonade build has ({}, {})",
                    routing::ROUTER_RECIPE,
                    routing::OMNI_RECIPE
                ),
                Some("recipe"),
            ))
        }
    };
    not_itself(&name, &components)?;
    let defs = match &req.models {
        Some(models) => embedded(models, &components)?,
        None => Vec::new(),
    };
    check_components(rt, &components, &defs)?;
    register_embedded(rt, defs).await?;
    if omni.is_some() && crate::omni::planner(rt, &components).is_none() {
        return Err(EngineError::invalid(
            "An omni collection needs a chat model among its components (the planner that calls the tools)",
            Some("components"),
        ));
    }
    let entry = match pointer {
        Some(repo) => CatalogueEntry {
            recipe,
            checkpoint: repo.to_string(),
            labels: vec!["collection".into()],
            ..Default::default()
        },
        None => CatalogueEntry {
            recipe,
            components,
            routing: req.routing.clone().filter(|_| omni.is_none()),
            system_prompt: omni.as_ref().and_then(|o| o.system_prompt.clone()),
            tool_format: omni.map(|o| o.tool_format.name().into()),
            labels: vec!["collection".into()],
            ..Default::default()
        },
    };
    rt.catalogue.register_collection(&name, &entry).await?;
    Ok(name)
}

/// The definition `Policy::parse` reads from a pull body.
fn definition(req: &PullRequest, recipe: &str) -> Value {
    let mut def = Map::new();
    def.insert("recipe".into(), recipe.into());
    for (k, v) in [("version", &req.version), ("components", &req.components), ("routing", &req.routing)] {
        if let Some(v) = v {
            def.insert(k.into(), v.clone());
        }
    }
    Value::Object(def)
}

/// Each component a registered model, a remote provider's or defined in `defs`, and none of
/// them a collection. Checked before anything is saved.
fn check_components(rt: &Engine, components: &[String], defs: &[(usize, RegisterRequest)]) -> Result<()> {
    let reg = rt.catalogue.registry();
    let defined = |c: &str| defs.iter().any(|(_, d)| d.model_name == c);
    for (i, c) in components.iter().enumerate() {
        let param = format!("components[{i}]");
        if reg.collection(c).is_some() {
            return Err(nested(c, &param));
        }
        if reg.get(c).is_err() && rt.remotes.model(c).is_none() && !defined(c) {
            return Err(EngineError::invalid_code(
                format!("Component '{c}' is not registered and has no matching definition in 'models': pull or register it first, or define it there"),
                &param,
                "model_not_found",
            ));
        }
    }
    Ok(())
}

/// No component is the collection `name` itself, by any spelling of its name.
fn not_itself(name: &str, components: &[String]) -> Result<()> {
    let bare = name.strip_prefix(USER_PREFIX).unwrap_or(name);
    match components.iter().position(|c| c == name || c == bare) {
        Some(i) => Err(EngineError::invalid(
            format!("Collection cannot reference itself: '{}'", components[i]),
            Some(&format!("components[{i}]")),
        )),
        None => Ok(()),
    }
}

fn nested(c: &str, param: &str) -> EngineError {
    EngineError::invalid(
        format!("Collection components must be regular models, not collections: '{c}' is a collection (collections cannot be nested)"),
        Some(param),
    )
}

/// A collection file's embedded component definitions (`models`, as `lemonade export` writes
/// them), checked before anything is saved: each names one of `components` (bare or `user.`),
/// has a recipe and a checkpoint, and is no collection. Returned with their index in `models`.
fn embedded(models: &Value, components: &[String]) -> Result<Vec<(usize, RegisterRequest)>> {
    let Some(items) = models.as_array() else {
        return Err(EngineError::invalid("'models' must be an array of model definitions", Some("models")));
    };
    let mut defs = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("models[{i}]");
        let def: RegisterRequest = serde_json::from_value(item.clone())
            .map_err(|e| EngineError::invalid(format!("Invalid model definition: {e}"), Some(&param)))?;
        if !components.contains(&def.model_name) {
            return Err(EngineError::invalid(format!("'{}' is not one of components", def.model_name), Some(&param)));
        }
        if def.recipe.starts_with("collection.") {
            return Err(nested(&def.model_name, &param));
        }
        let checkpoint = !def.checkpoint.as_deref().unwrap_or_default().is_empty()
            || def.checkpoints.as_ref().and_then(|c| c.get("main")).is_some_and(|m| !m.is_empty());
        if def.recipe.is_empty() || !checkpoint {
            return Err(EngineError::invalid(
                format!(
                    "Incomplete definition for component '{}' in 'models': it needs a recipe and a checkpoint",
                    def.model_name
                ),
                Some(&param),
            ));
        }
        defs.push((i, def));
    }
    Ok(defs)
}

/// Registers (downloading nothing) each embedded definition not registered here yet, a bare
/// name as `user.<name>`; a component already registered keeps its own definition.
async fn register_embedded(rt: &Engine, defs: Vec<(usize, RegisterRequest)>) -> Result<()> {
    for (i, mut def) in defs {
        if rt.catalogue.registry().get(&def.model_name).is_ok() {
            tracing::debug!(model = %def.model_name, "collection import: the component is registered; its own definition is kept");
            continue;
        }
        if !def.model_name.starts_with(USER_PREFIX) {
            def.model_name = format!("{USER_PREFIX}{}", def.model_name);
        }
        crate::pulls::register(rt, &def).await.map_err(|e| match e {
            EngineError::Invalid { message, .. } => EngineError::invalid(message, Some(&format!("models[{i}]"))),
            e => e,
        })?;
    }
    Ok(())
}

/// Whether every component of `c` can answer here: a downloaded local model or a remote one.
fn ready(rt: &Engine, reg: &registry::Registry, c: &Collection) -> bool {
    // A registry-backed collection not pulled yet has no components: not ready.
    !c.components.is_empty()
        && c.components.iter().all(|m| reg.get(m).map_or_else(|_| rt.remotes.model(m).is_some(), |i| i.downloaded))
}

/// The collections as `/models` lists them: those whose components are all here (every one
/// with `show_all`).
pub fn listed(rt: &Engine, show_all: bool) -> Vec<Model> {
    let reg = rt.catalogue.registry();
    reg.collections().map(|c| view(rt, c, ready(rt, &reg, c))).filter(|m| show_all || m.downloaded).collect()
}

/// The API view of a collection.
pub fn model(rt: &Engine, c: &Collection) -> Model {
    view(rt, c, ready(rt, &rt.catalogue.registry(), c))
}

fn view(rt: &Engine, c: &Collection, downloaded: bool) -> Model {
    let omni = c.omni();
    Model {
        id: c.name.clone(),
        object: "model".into(),
        created: 0,
        owned_by: "lemonade".into(),
        checkpoint: String::new(),
        checkpoints: BTreeMap::new(),
        recipe: c.recipe.clone(),
        downloaded,
        suggested: true,
        labels: vec!["collection".into(), if omni.is_some() { "omni" } else { "router" }.into()],
        recipe_options: Default::default(),
        size: None,
        model_type: Some(ModelType::Llm),
        image_defaults: None,
        upstream: None,
        context_length: None,
        update_available: None,
        parallel: None,
        slot_ctx_size: None,
        // An omni collection's components as the listings show them (v11); a router's as its
        // policy names them, since its candidates are matched by name.
        components: Some(match omni {
            Some(_) => {
                let (reg, v9) = (rt.catalogue.registry(), rt.cfg.live.v9_names());
                let listed = |m: &String| reg.get(m).map_or_else(|_| m.clone(), |i| reg.listed_id(i, v9));
                c.components.iter().map(listed).collect()
            }
            None => c.components.clone(),
        }),
        routing: Some(c.routing.clone()).filter(|_| omni.is_none()),
        system_prompt: omni.and_then(|o| o.system_prompt.clone()),
        tool_format: omni.map(|o| o.tool_format.name().into()),
        omni_tools: omni.map(|_| crate::omni::listed_tools(rt, &c.components)),
        registry_source: None,
        version: Some("1".into()),
    }
}

/// Where a request naming `model` at `endpoint` goes, once a parameter variant's fields are
/// applied: the model itself, a router collection's candidate (the body's `model` rewritten,
/// with the decision), or an omni collection's tool loop (chat completions only). `B`: the
/// body, as bytes (a client's request, forwarded as it came) or as JSON (a translated one).
pub enum Resolved<B> {
    Model {
        model: String,
        body: B,
        /// A router collection's decision, and whether the request asked for its trace.
        routed: Option<(RouteDecision, bool)>,
    },
    Omni {
        collection: Collection,
        omni: routing::omni::Omni,
        body: B,
    },
}

/// [`resolve_value`] for a body as it came: parsed only when `model` is a variant or a
/// collection (a plain model's request is forwarded untouched).
pub async fn resolve(
    rt: &Engine,
    model: &str,
    endpoint: Endpoint,
    body: bytes::Bytes,
) -> Result<Resolved<bytes::Bytes>> {
    let plain = {
        let reg = rt.catalogue.registry();
        reg.variant(model).is_none() && reg.collection(model).is_none()
    };
    if plain {
        return Ok(Resolved::Model { model: model.to_string(), body, routed: None });
    }
    let bad = |e: serde_json::Error| EngineError::invalid(format!("Invalid JSON body: {e}"), None);
    let v: Value = serde_json::from_slice(&body).map_err(bad)?;
    let bytes = |v: Value| serde_json::to_vec(&v).map(bytes::Bytes::from).map_err(bad);
    Ok(match resolve_value(rt, model, endpoint, v).await {
        Resolved::Model { model, body, routed } => Resolved::Model { model, body: bytes(body)?, routed },
        Resolved::Omni { collection, omni, body } => Resolved::Omni { collection, omni, body: bytes(body)? },
    })
}

/// For the dialects that translate a request first (Ollama, Anthropic: no omni loop there):
/// the model that answers the OpenAI-shaped `body` (rewritten for it) and a router
/// collection's decision.
pub async fn route_value(
    rt: &Engine,
    model: &str,
    endpoint: Endpoint,
    body: Value,
) -> (String, Value, Option<RouteDecision>) {
    match resolve_value(rt, model, endpoint, body).await {
        Resolved::Model { model, body, routed } => (model, body, routed.map(|(d, _)| d)),
        // Refused when it is leased: an omni collection answers chat completions only.
        Resolved::Omni { body, .. } => (model.to_string(), body, None),
    }
}

/// Resolves an OpenAI-shaped request `body` naming `model` for `endpoint` (see [`Resolved`]).
pub async fn resolve_value(rt: &Engine, model: &str, endpoint: Endpoint, mut body: Value) -> Resolved<Value> {
    let reg = rt.catalogue.registry();
    reg.apply_variant(model, &mut body);
    let chat = endpoint.accepts() == [ModelType::Llm];
    let Some(c) = reg.collection(model).filter(|_| chat) else {
        return Resolved::Model { model: model.to_string(), body, routed: None };
    };
    let Some(policy) = c.policy() else {
        return match c.omni() {
            Some(omni) if endpoint == Endpoint::ChatCompletions => {
                Resolved::Omni { collection: c.clone(), omni: omni.clone(), body }
            }
            _ => Resolved::Model { model: model.to_string(), body, routed: None },
        };
    };
    let want_trace = body.get("route_trace").and_then(Value::as_bool).unwrap_or(false);
    if let Some(o) = body.as_object_mut() {
        o.remove("route_trace");
    }
    let decision = decide_request(rt, policy, &body, want_trace).await;
    if let Some(k) = routing::conversations::fingerprint(&c.name, &body) {
        if rt.conversations.lock().observe(k, &decision.route_to) {
            rt.metrics.routing_switch();
        }
    }
    body["model"] = Value::from(decision.route_to.clone());
    tracing::debug!(collection = %c.name, route_to = %decision.route_to, rule = %decision.matched_rule, "routed");
    Resolved::Model { model: decision.route_to.clone(), body, routed: Some((decision, want_trace)) }
}

/// The decision for an OpenAI-shaped request `body` under a router collection's `policy`.
pub async fn decide_request(rt: &Engine, policy: &Policy, body: &Value, want_trace: bool) -> RouteDecision {
    decide(rt, policy, &Features::of_request(body), want_trace).await
}

/// The decision for a request's `features` under `policy`: each classifier a rule reaches is
/// run once (a failure is its `on_error`, never the request's), then the first match wins.
pub async fn decide(rt: &Engine, policy: &Policy, features: &Features, want_trace: bool) -> RouteDecision {
    let mut scores = BTreeMap::new();
    loop {
        match routing::decide(policy, features, &scores, want_trace) {
            Outcome::Decided(d) => {
                rt.metrics.routing_decision(&d.route_to, &d.matched_rule);
                return d;
            }
            Outcome::Needs(id) => {
                let c = policy.classifier(&id).expect("decide asks for declared classifiers");
                let s = score(rt, c, features).await;
                scores.insert(id, s);
            }
        }
    }
}

async fn score(rt: &Engine, c: &Classifier, f: &Features) -> Score {
    let result = match c.kind {
        ClassifierKind::Llm => call(rt, &c.model, Endpoint::ChatCompletions, &classifiers::llm_request(c, f))
            .await
            .map(|v| classifiers::parse_llm_reply(classifiers::chat_text(&v).unwrap_or_default(), &c.labels)),
        ClassifierKind::Classifier => {
            call(rt, &c.model, Endpoint::ChatCompletions, &classifiers::classifier_request(c, f))
                .await
                .map(|v| classifiers::parse_percent_scores(c, &v))
        }
        ClassifierKind::SemanticSimilarity => {
            call(rt, &c.model, Endpoint::Embeddings, &classifiers::semantic_request(c, f))
                .await
                .map(|v| classifiers::semantic_scores(c, &v))
        }
    };
    result.unwrap_or_else(|e| {
        tracing::warn!(classifier = %c.id, model = %c.model, error = %e, "routing classifier failed; its on_error applies");
        Score::failed()
    })
}

/// A JSON request to `model` (loaded as for any request), its JSON answer.
/// A classifier's request to its model, as any in-process model call ([`crate::call`]).
/// A classifier's request to its model, as a routing helper (it takes no slot of its type).
async fn call(rt: &Engine, model: &str, endpoint: Endpoint, body: &Value) -> Result<Value> {
    let req = crate::lease::LeaseRequest { helper: true, ..crate::lease::LeaseRequest::new(model, endpoint) };
    crate::call::call(rt, req, crate::call::Payload::Json(body.clone())).await?.json()
}

/// `POST /routing/validate` (Lemonade v11): the policy checked (its components need not be
/// registered, but every model it names must be one of them) and, for the sample request,
/// the decision it makes (model-backed conditions run on their models), with its trace.
pub async fn validate(rt: &Engine, req: &RoutingValidateRequest) -> Result<RoutingValidateResponse> {
    if !req.policy.is_object() {
        return Err(EngineError::invalid("'policy' must be a JSON object", Some("policy")));
    }
    let policy = Policy::parse(&req.policy).map_err(policy_error)?;
    let prompt = req.prompt.clone().unwrap_or_default();
    let features = Features {
        input: prompt,
        has_tools: req.has_tools.unwrap_or(false),
        has_images: req.has_images.unwrap_or(false),
        metadata: req.metadata.clone().unwrap_or_default(),
    };
    let decision = decide(rt, &policy, &features, true).await;
    let mut normalized = req.policy.clone();
    normalized["routing"] = policy.normalized.clone();
    Ok(RoutingValidateResponse { decision, normalized_policy: normalized })
}

/// The most labels one `/classify` scores: each is a line of the model's prompt and of its
/// answer, so a few dozen already fill a small model's context.
pub const MAX_CLASSIFY_LABELS: usize = 64;

/// `POST /classify` (Lemonade v11) on a chat model: the request's `labels` scored by the model
/// (v11's LLM-as-classifier; there is no encoder classifier backend here). A reply without a
/// score in `[0, 1]` for each label is a 502 naming the model.
pub async fn classify(rt: &Engine, req: &api_types::ClassifyRequest) -> Result<api_types::ClassifyResponse> {
    let model = req.model.clone().filter(|m| !m.is_empty());
    let model = model.ok_or_else(|| EngineError::invalid("'model' is required", Some("model")))?;
    let input = req.input.clone().or_else(|| req.text.clone());
    let input = input.ok_or_else(|| EngineError::invalid("'input' (or 'text') is required", Some("input")))?;
    if req.top_k == Some(0) {
        return Err(EngineError::invalid("'top_k' must be a positive number", Some("top_k")));
    }
    let labels: Vec<String> = req.labels.clone().unwrap_or_default();
    if labels.is_empty() || labels.iter().any(|l| l.trim().is_empty()) {
        return Err(EngineError::invalid(
            "'labels' must list the labels to score: a chat model classifies into the labels given (no encoder classifier backend here)",
            Some("labels"),
        ));
    }
    if labels.len() > MAX_CLASSIFY_LABELS {
        return Err(EngineError::invalid(
            format!("'labels' lists {} labels; at most {MAX_CLASSIFY_LABELS} are scored in one request", labels.len()),
            Some("labels"),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = labels.iter().find(|l| !seen.insert(l.trim())) {
        return Err(EngineError::invalid(format!("'labels' lists '{twice}' more than once"), Some("labels")));
    }
    let c = classifiers::llm_classifier(&model, labels.clone());
    let f = Features { input, ..Features::default() };
    let answer = call(rt, &model, Endpoint::ChatCompletions, &classifiers::classifier_request(&c, &f)).await?;
    let score = classifiers::parse_percent_scores(&c, &answer);
    let mut scored: Vec<(String, f64)> = score.labels.into_iter().filter(|(l, _)| labels.contains(l)).collect();
    if !score.ok || scored.len() != labels.len() {
        return Err(EngineError::BadAnswer { what: format!("'{model}' answered no score from 0 to 1 for each label") });
    }
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.truncate(req.top_k.map_or(usize::MAX, |k| k as usize));
    Ok(api_types::ClassifyResponse { object: "classification".into(), model, labels: scored.into_iter().collect() })
}
