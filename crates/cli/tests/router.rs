//! Lemonade v11's router collections (`collection.router`) through `lemonade serve` on real
//! llama-server: SmolLM2 and Gemma 3 270M as candidates, all-MiniLM-L6-v2 for
//! `semantic_similarity`, SmolLM2 as the LLM-as-router. Each test asserts which model answered
//! (the answer's `model`, and the backend that served it), the `x-lemonade-route` header and
//! the trace.

use std::path::Path;

use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

fn policy() -> Value {
    json!({
        "model": "user.Route", "recipe": "collection.router", "version": "1",
        "components": [SMOL, GEMMA, MINILM],
        "routing": {
            "candidates": [SMOL, GEMMA], "default_model": SMOL,
            "classifiers": [{"id": "topic", "type": "semantic_similarity", "model": MINILM,
                             "reference_phrases": {"cooking": ["a recipe for soup", "how to bake bread", "cooking dinner in the kitchen"]}}],
            "rules": [
                {"id": "private", "match": {"metadata": {"key": "consent", "equals": "denied"}}, "route_to": SMOL, "outputs": {"reason": "privacy"}},
                {"id": "code", "match": {"keywords_any": ["def ", "function"]}, "route_to": GEMMA},
                {"id": "ticket", "match": {"regex": "TICKET-[0-9]+"}, "route_to": GEMMA},
                {"id": "long", "match": {"min_chars": 300}, "route_to": GEMMA},
                {"id": "tools", "match": {"has_tools": true}, "route_to": SMOL},
                {"id": "tier", "match": {"metadata": {"key": "tier", "any": ["gold", "platinum"]}}, "route_to": GEMMA},
                {"id": "team", "match": {"metadata": {"key": "team", "exists": true}}, "route_to": SMOL},
                {"id": "quick", "match": {"all": [{"keywords_all": ["quick", "brown"]}, {"max_chars": 24}, {"has_images": false}]}, "route_to": GEMMA},
                {"id": "cooking", "match": {"classifier": "topic", "label": "cooking", "min_score": 0.5}, "route_to": GEMMA}
            ]
        }
    })
}

/// POSTs `body` to `path`; the status, the route header and the JSON answer.
async fn routed(l: &Lemonade, path: &str, body: Value) -> (u16, String, Value) {
    let r = l.http.post(l.url(path)).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let header = r.headers().get("x-lemonade-route").map(|h| h.to_str().unwrap().to_string()).unwrap_or_default();
    let text = r.text().await.unwrap();
    (status, header, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn ask(text: &str) -> Value {
    json!({"model": "user.Route", "messages": [{"role": "user", "content": text}], "max_tokens": 3, "temperature": 0})
}

#[tokio::test]
async fn real_llama_server_router_collection_routes_each_request_and_says_why() {
    let l = Lemonade::start(bin(), &["--max-loaded-models", "2"]).await;
    let (s, v) = l.post("/api/v1/pull", &policy()).await;
    assert_eq!((s, v.clone()), (200, json!({"status": "success", "model_name": "user.Route"})), "{v}");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("user_models.json")).unwrap()).unwrap();
    assert_eq!(
        (saved["Route"]["recipe"].clone(), saved["Route"]["components"][2].clone()),
        (json!("collection.router"), json!(MINILM))
    );
    let (_, m) = l.get("/api/v1/models/user.Route").await;
    assert_eq!(
        (m["recipe"].clone(), m["downloaded"].clone(), m["components"].clone()),
        // A router's components as its policy names them (its candidates are matched by name).
        (json!("collection.router"), json!(true), json!([SMOL, GEMMA, MINILM])),
        "{m}"
    );
    let listed = l.get("/api/v1/models").await.1;
    assert!(
        listed["data"].as_array().unwrap().iter().any(|m| m["id"] == "user.Route"),
        "listed once its components are here"
    );
    // Loading a router collection loads nothing.
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": "user.Route"})).await;
    assert_eq!((s, v["recipe"].clone()), (200, json!("collection.router")));
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty());

    // Deterministic rules: the chosen model answers, the header names the rule.
    let (s, h, v) = routed(&l, "/api/v1/chat/completions", ask("Write a function that adds two numbers")).await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "code", Some(GEMMA)), "{v}");
    // The decision is always in the answer (as v11.7), its trace only when asked for.
    assert_eq!(v["x_lemonade_route"]["matched_rule"], "code", "{v}");
    assert!(v["x_lemonade_route"].get("trace").is_none(), "no trace unless asked: {v}");
    let mut private = ask("Write a function, please");
    private["metadata"] = json!({"consent": "denied"});
    private["route_trace"] = json!(true);
    let (s, h, v) = routed(&l, "/v1/chat/completions", private).await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "private", Some(SMOL)), "first match wins: {v}");
    assert_eq!(
        v["x_lemonade_route"],
        json!({"version": "1", "route_to": SMOL, "matched_rule": "private", "default_used": false, "outputs": {"reason": "privacy"},
               "trace": [{"condition": "metadata", "result": true}]})
    );
    let (s, h, v) = routed(
        &l,
        "/api/v1/completions",
        json!({"model": "user.Route", "prompt": "Status of TICKET-42:", "max_tokens": 3}),
    )
    .await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "ticket", Some(GEMMA)), "{v}");
    let long = "Tell me about the sea. ".repeat(15);
    let (s, h, v) = routed(&l, "/api/v1/chat/completions", ask(&long)).await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "long", Some(GEMMA)), "{v}");
    let mut tools = ask("What is the weather?");
    tools["tools"] = json!([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]);
    let (s, h, _) = routed(&l, "/api/v1/chat/completions", tools).await;
    assert_eq!((s, h.as_str()), (200, "tools"));
    let (s, h, v) =
        routed(&l, "/v1/responses", json!({"model": "user.Route", "input": "def add(a, b):", "max_output_tokens": 3}))
            .await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "code", Some(GEMMA)), "{v}");
    // metadata `any` (comma tokens) and `exists`, keywords_all with max_chars and has_images.
    let mut gold = ask("Hello");
    gold["metadata"] = json!({"tier": "silver, platinum"});
    let (s, h, v) = routed(&l, "/api/v1/chat/completions", gold).await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "tier", Some(GEMMA)), "{v}");
    let mut team = ask("Hello");
    team["metadata"] = json!({"team": "core"});
    assert_eq!(routed(&l, "/api/v1/chat/completions", team).await.1, "team");
    let mut blank = ask("Hello");
    blank["metadata"] = json!({"team": "  "});
    assert_eq!(routed(&l, "/api/v1/chat/completions", blank).await.1, "default", "a blank value is absent");
    let (s, h, v) = routed(&l, "/api/v1/chat/completions", ask("The quick brown fox")).await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "quick", Some(GEMMA)), "{v}");
    let (_, h, _) = routed(&l, "/api/v1/chat/completions", ask("The quick brown fox jumps over")).await;
    assert_eq!(h, "default", "over max_chars");
    // Completions and responses streamed: the header, and the decision in the first event.
    for (path, body, rule) in [
        (
            "/api/v1/completions",
            json!({"model": "user.Route", "prompt": "TICKET-5 is", "max_tokens": 3, "stream": true, "route_trace": true}),
            "ticket",
        ),
        (
            "/v1/responses",
            json!({"model": "user.Route", "input": "def f():", "max_output_tokens": 3, "stream": true, "route_trace": true}),
            "code",
        ),
    ] {
        let (s, h, v) = routed(&l, path, body).await;
        let text = v.as_str().unwrap_or_default().to_string();
        assert_eq!((s, h.as_str()), (200, rule), "{path}: {text}");
        let first = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
        let first: Value = serde_json::from_str(first).unwrap();
        assert_eq!(first["x_lemonade_route"]["route_to"], GEMMA, "{path}: {text}");
    }

    // semantic_similarity through the embedding model; below its band, the default.
    let mut soup = ask("Give me a recipe for tomato soup");
    soup["route_trace"] = json!(true);
    let (s, h, v) = routed(&l, "/api/v1/chat/completions", soup).await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "cooking", Some(GEMMA)), "{v}");
    let last = v["x_lemonade_route"]["trace"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["condition"].clone(), last["label"].clone(), last["result"].clone()),
        (json!("classifier:topic"), json!("cooking"), json!(true))
    );
    assert!(last["score"].as_f64().unwrap() >= 0.5, "{last}");
    let mut hi = ask("Say hello to my friend");
    hi["route_trace"] = json!(true);
    let (s, h, v) = routed(&l, "/api/v1/chat/completions", hi).await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "default", Some(SMOL)), "{v}");
    let d = &v["x_lemonade_route"];
    assert_eq!((d["default_used"].clone(), d["matched_rule"].clone()), (json!(true), json!("")));
    assert!(d["trace"].as_array().unwrap().last().unwrap()["score"].as_f64().unwrap() < 0.5, "{d}");

    // Streamed: the header, and the decision in the first event only.
    let mut streamed = ask("Write a function in Rust");
    streamed["stream"] = json!(true);
    streamed["route_trace"] = json!(true);
    let (s, h, v) = routed(&l, "/api/v1/chat/completions", streamed).await;
    let text = v.as_str().unwrap_or_default().to_string();
    assert_eq!((s, h.as_str()), (200, "code"), "{text}");
    let events: Vec<Value> =
        text.lines().filter_map(|l| l.strip_prefix("data: ")).filter_map(|d| serde_json::from_str(d).ok()).collect();
    assert!(events.len() >= 2 && text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(events[0]["x_lemonade_route"]["route_to"], GEMMA, "{text}");
    assert_eq!(events[0]["model"], GEMMA);
    assert!(events[1..].iter().all(|e| e.get("x_lemonade_route").is_none()));

    // Ollama and Anthropic: routed the same way, answered as the chosen model.
    let ollama = json!({"model": "user.Route", "messages": [{"role": "user", "content": "Write a function"}], "stream": false,
                        "options": {"num_predict": 2}, "route_trace": true});
    let (s, h, v) = routed(&l, "/api/chat", ollama).await;
    assert_eq!((s, h.as_str()), (200, "code"), "{v}");
    assert!(v["model"].as_str().unwrap().starts_with(GEMMA), "{v}");
    assert_eq!(v["x_lemonade_route"]["matched_rule"], "code", "{v}");
    let generate = json!({"model": "user.Route:latest", "prompt": "Say hi", "stream": true, "options": {"num_predict": 2},
                          "route_trace": true});
    let (s, h, v) = routed(&l, "/api/generate", generate).await;
    // (One line parses as JSON on its own: a first token that ends the answer leaves only the
    // closing line.)
    let lines = match &v {
        Value::String(text) => text.clone(),
        one => one.to_string(),
    };
    assert_eq!((s, h.as_str()), (200, "default"), "{lines}");
    let lines: Vec<Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines[0]["model"].as_str().unwrap().starts_with(SMOL), "{lines:?}");
    assert_eq!(lines[0]["x_lemonade_route"]["default_used"], true, "the first NDJSON line: {lines:?}");
    assert!(lines[1..].iter().all(|l| l.get("x_lemonade_route").is_none()));
    let anthropic = json!({"model": "user.Route", "max_tokens": 2, "messages": [{"role": "user", "content": "Status of TICKET-9"}]});
    let (s, h, v) = routed(&l, "/v1/messages", anthropic.clone()).await;
    assert_eq!((s, h.as_str(), v["model"].as_str()), (200, "ticket", Some(GEMMA)), "{v}");
    assert!(v["x_lemonade_route"].get("trace").is_none(), "the trace only when asked: {v}");
    let mut streamed = anthropic;
    streamed["stream"] = json!(true);
    streamed["route_trace"] = json!(true);
    let (s, h, v) = routed(&l, "/v1/messages", streamed).await;
    let events = v.as_str().unwrap_or_default().to_string();
    assert_eq!((s, h.as_str()), (200, "ticket"), "{events}");
    assert!(
        events.starts_with("event: message_start") && events.contains(&format!("\"model\":\"{GEMMA}\"")),
        "{events}"
    );
    let start: Value = serde_json::from_str(events.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(start["x_lemonade_route"]["matched_rule"], "ticket", "{events}");
    assert_eq!(events.matches("x_lemonade_route").count(), 1, "{events}");
    let tags = l.get("/api/tags").await.1;
    assert!(tags["models"].as_array().unwrap().iter().any(|m| m["name"] == "user.Route:latest"), "{tags}");

    // No thrash: small and big requests alternate, both candidates stay loaded in one backend each.
    let pids = child_pids(l.pid());
    for i in 0..4 {
        let q = if i % 2 == 0 { ask("Hi there") } else { ask("Write a function") };
        assert_eq!(routed(&l, "/api/v1/chat/completions", q).await.0, 200);
    }
    let loaded = loaded_names(&l.get("/api/v1/health").await.1);
    assert!(loaded.contains(&SMOL.to_string()) && loaded.contains(&GEMMA.to_string()), "{loaded:?}");
    assert_eq!(child_pids(l.pid()), pids, "no backend was restarted");
    let metrics = l.http.get(l.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("routing_decisions_by_route_total{route_to=\"extra.gemma-3-270m-Q4_K_M\",rule=\"code\"}"),
        "{metrics}"
    );

    // Export and import round-trip it; an import registers a component it embeds.
    let file = l.sandbox.dir.path().join("Route.json");
    let (code, _, err) = l.cli(&["export", "user.Route", "--output", file.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{err}");
    let exported: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(
        (
            exported["model_name"].clone(),
            exported["recipe"].clone(),
            exported["routing"].clone(),
            exported["components"].clone()
        ),
        (json!("user.Route"), json!("collection.router"), policy()["routing"].clone(), json!([SMOL, GEMMA, MINILM]))
    );
    assert_eq!(exported["models"][0]["model_name"], SMOL, "user. components are embedded: {exported}");
    assert_eq!(exported["models"].as_array().unwrap().len(), 1, "extra. models cannot be registered by an import");
    assert_eq!(l.post("/api/v1/delete", &json!({"model": "user.Route"})).await.0, 200);
    let (code, out, err) = l.cli(&["import", file.to_str().unwrap()]).await;
    assert_eq!((code, out.trim()), (0, "Model imported successfully: user.Route"), "{err}");
    assert_eq!(routed(&l, "/api/v1/chat/completions", ask("Write a function")).await.1, "code");
    let mut twin = exported.clone();
    twin["model_name"] = json!("user.Route2");
    twin["components"].as_array_mut().unwrap().push(json!("user.Smol-Twin"));
    twin["models"].as_array_mut().unwrap().push(json!({"model_name": "user.Smol-Twin", "recipe": "llamacpp",
        "checkpoint": "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1", "labels": ["custom"]}));
    let (s, v) = l.post("/api/v1/pull", &twin).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        l.get("/api/v1/models/user.Smol-Twin").await.1["downloaded"],
        true,
        "registered from its embedded definition"
    );

    // It survives a restart; delete removes only the collection.
    let sandbox = l.kill_keeping_sandbox();
    let l = Lemonade::start_in(bin(), sandbox, &[], &[]).await;
    let (s, h, _) = routed(&l, "/api/v1/chat/completions", ask("Write a function")).await;
    assert_eq!((s, h.as_str()), (200, "code"));
    let (s, v) = l.post("/api/v1/delete", &json!({"model": "user.Route"})).await;
    assert_eq!((s, v["message"].clone()), (200, json!("Deleted model: user.Route")));
    assert_eq!(l.get("/api/v1/models/user.Route").await.0, 404);
    assert_eq!(l.get(&format!("/api/v1/models/{SMOL}")).await.1["downloaded"], true, "components stay");
}

#[tokio::test]
async fn bad_collections_are_refused_naming_the_field() {
    let l = Lemonade::start(bin(), &[]).await;
    let with = |f: &dyn Fn(&mut Value)| {
        let mut p = policy();
        f(&mut p);
        p
    };
    let cases: Vec<(Value, &str)> = vec![
        (with(&|p| p["model"] = json!("Route")), "model"),
        (with(&|p| p["recipe"] = json!("collection.other")), "recipe"),
        (with(&|p| p["recipe"] = json!("collection.omni")), "routing"),
        (
            with(&|p| {
                p.as_object_mut().unwrap().remove("components");
            }),
            "components",
        ),
        (with(&|p| p["components"] = json!([])), "components"),
        (with(&|p| p["components"][0] = json!({"checkpoint": "x/y:Q4_0"})), "components[0]"),
        (with(&|p| p["components"].as_array_mut().unwrap().push(json!("user.Nope"))), "components[3]"),
        (with(&|p| p["components"].as_array_mut().unwrap().push(json!("user.Route"))), "components[3]"),
        (with(&|p| p["version"] = json!("2")), "version"),
        (with(&|p| p["routing"]["rules"][2]["match"]["regex"] = json!("(?<=a)b")), "routing.rules[2].match.regex"),
        (with(&|p| p["routing"]["router"] = json!({"type": "llm", "model": SMOL, "prompt": "p"})), "routing.router"),
        (with(&|p| p["routing"]["rules"][0]["route_to"] = json!(MINILM)), "routing.rules[0].route_to"),
    ];
    for (body, param) in cases {
        let (s, e) = l.post("/api/v1/pull", &body).await;
        assert_eq!((s, e["param"].as_str()), (400, Some(param)), "{body}: {e}");
    }
    assert!(
        !l.sandbox.cache().join("user_models.json").exists()
            || !std::fs::read_to_string(l.sandbox.cache().join("user_models.json")).unwrap().contains("Route"),
        "nothing registered"
    );
    // A nested collection.
    assert_eq!(l.post("/api/v1/pull", &policy()).await.0, 200);
    let mut nested = policy();
    nested["model"] = json!("user.Outer");
    nested["components"].as_array_mut().unwrap().push(json!("user.Route"));
    let (s, e) = l.post("/api/v1/pull", &nested).await;
    assert_eq!((s, e["param"].as_str()), (400, Some("components[3]")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("cannot be nested"), "{e}");
}

/// Rules over request features decide exactly; the model-backed conditions (an `llm` label, a
/// `classifier` score, `/classify`, the LLM router) are plumbing tests here: SmolLM2-135M's
/// labels are not reliable enough to assert which one it picks, so they assert the path (the
/// model was asked, its answer is held to the labels and lands in the trace) and, for the
/// score, that a real threshold decides both ways on the score the model gave.
#[tokio::test]
async fn real_llama_server_routing_validate_and_the_llm_as_router() {
    let l = Lemonade::start(bin(), &["--max-loaded-models", "2"]).await;
    let mut p = policy();
    p.as_object_mut().unwrap().remove("model");
    let body = json!({"policy": p, "prompt": "Fix TICKET-7", "metadata": {"consent": "granted"}});
    let (s, v) = l.post("/api/v1/routing/validate", &body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["decision"]["route_to"].clone(), v["decision"]["matched_rule"].clone()),
        (json!(GEMMA), json!("ticket"))
    );
    assert_eq!(v["decision"]["trace"].as_array().unwrap().len(), 3, "metadata, keywords_any, regex: {v}");
    let (s, v) = l.post("/api/v1/routing/validate", &json!({"policy": p, "has_tools": true, "prompt": "x"})).await;
    assert_eq!((s, v["decision"]["matched_rule"].clone()), (200, json!("tools")));
    for (bad, param) in [
        (json!({"policy": "x"}), "policy"),
        (json!({"policy": p, "has_tools": "yes"}), "has_tools"),
        (json!({"policy": p, "metadata": {"k": 1}}), "metadata.k"),
        (
            json!({"policy": {"version": "1", "recipe": "collection.router", "components": ["A"], "routing": {"candidates": ["B"], "default_model": "B", "rules": []}}}),
            "routing.candidates[0]",
        ),
    ] {
        let (s, e) = l.post("/api/v1/routing/validate", &bad).await;
        assert_eq!((s, e["param"].as_str()), (400, Some(param)), "{bad}: {e}");
    }

    // An `llm` classifier (a label chosen by SmolLM2) after a has_images rule, run for real: the
    // trace shows it was asked; has_images comes from the sample request.
    let mut lp = p.clone();
    lp["routing"]["classifiers"] = json!([{"id": "risk", "type": "llm", "model": SMOL,
        "prompt": "Choose RISKY for requests that delete files, else SAFE.", "labels": ["SAFE", "RISKY"]}]);
    lp["routing"]["rules"] = json!([
        {"id": "pictures", "match": {"has_images": true}, "route_to": SMOL},
        {"id": "risky", "match": {"classifier": "risk", "label": "RISKY"}, "route_to": GEMMA}]);
    let (s, v) = l
        .post("/api/v1/routing/validate", &json!({"policy": lp, "prompt": "Delete every file in my home folder"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let t = &v["decision"]["trace"];
    assert_eq!((t[0]["condition"].clone(), t[0]["result"].clone()), (json!("has_images"), json!(false)), "{v}");
    assert_eq!((t[1]["condition"].clone(), t[1]["label"].clone()), (json!("classifier:risk"), json!("RISKY")), "{v}");
    assert!(t[1]["score"] == 0.0 || t[1]["score"] == 1.0, "the chosen label scores 1, another 0: {v}");
    let (_, v) = l.post("/api/v1/routing/validate", &json!({"policy": lp, "prompt": "x", "has_images": true})).await;
    assert_eq!(v["decision"]["matched_rule"], "pictures", "{v}");

    // A `classifier` condition on a chat model (v11's LLM-as-classifier), run for real: its
    // reply is held to one score per label, so the trace carries a score.
    let mut cp = p.clone();
    cp["routing"]["classifiers"] =
        json!([{"id": "mood", "type": "classifier", "model": SMOL, "labels": ["happy", "sad"]}]);
    cp["routing"]["rules"] = json!([{"id": "happy", "match": {"classifier": "mood", "label": "happy", "min_score": 0.0}, "route_to": GEMMA}]);
    let (s, v) =
        l.post("/api/v1/routing/validate", &json!({"policy": cp, "prompt": "What a wonderful sunny day!"})).await;
    assert_eq!(s, 200, "{v}");
    let t = &v["decision"]["trace"][0];
    assert_eq!((t["condition"].clone(), t["label"].clone()), (json!("classifier:mood"), json!("happy")), "{v}");
    assert!(t["score"].as_f64().is_some_and(|s| (0.0..=1.0).contains(&s)), "the classifier answered scores: {v}");
    assert_eq!(v["decision"]["matched_rule"], "happy", "a score ≥ 0 is in the band: {v}");
    // A real threshold decides both ways on the model's own score (temperature 0, so the same
    // prompt scores the same): just under the score matches, just over it does not and the
    // request falls to the default.
    let score = t["score"].as_f64().unwrap();
    for (min, matched) in [((score - 0.01).max(0.0), true), (score + 0.01, false)] {
        if min > 1.0 {
            continue; // a score of 1 has no band above it; the other side still decides
        }
        cp["routing"]["rules"][0]["match"]["min_score"] = json!(min);
        let (s, v) =
            l.post("/api/v1/routing/validate", &json!({"policy": cp, "prompt": "What a wonderful sunny day!"})).await;
        assert_eq!(s, 200, "{v}");
        let rule = v["decision"]["matched_rule"].as_str();
        assert_eq!(rule == Some("happy"), matched, "min_score {min} against the score {score}: {v}");
        assert_eq!(v["decision"]["trace"][0]["score"].as_f64(), Some(score), "the same score again: {v}");
    }

    // POST /classify: the same path, as an endpoint.
    let body =
        json!({"model": SMOL, "input": "I love this film, it is wonderful.", "labels": ["positive", "negative"]});
    let (s, v) = l.post("/api/v1/classify", &body).await;
    assert_eq!((s, v["object"].clone(), v["model"].clone()), (200, json!("classification"), json!(SMOL)), "{v}");
    let scores = v["labels"].as_object().unwrap();
    assert_eq!(scores.keys().collect::<Vec<_>>(), ["negative", "positive"], "{v}");
    assert!(scores.values().all(|s| s.as_f64().is_some_and(|s| (0.0..=1.0).contains(&s))), "{v}");
    let best = scores.iter().max_by(|a, b| a.1.as_f64().unwrap().total_cmp(&b.1.as_f64().unwrap())).unwrap().0.clone();
    let (s, v) = l.post("/v1/classify", &json!({"model": SMOL, "text": "I love this film, it is wonderful.", "labels": ["positive", "negative"], "top_k": 1})).await;
    assert_eq!((s, v["labels"].as_object().unwrap().keys().cloned().collect::<Vec<_>>()), (200, vec![best]), "{v}");
    for (bad, param) in [
        (json!({"model": SMOL, "labels": ["a"]}), "input"),
        (json!({"model": SMOL, "input": "x"}), "labels"),
        (json!({"input": "x", "labels": ["a"]}), "model"),
        (json!({"model": SMOL, "input": "x", "labels": ["a"], "top_k": 0}), "top_k"),
        // A label twice is the client's error, not the model's: once a 502 "no score for each label".
        (json!({"model": SMOL, "input": "x", "labels": ["a", "a"]}), "labels"),
        (
            json!({"model": SMOL, "input": "x", "labels": (0..65).map(|i| format!("l{i}")).collect::<Vec<_>>()}),
            "labels",
        ),
    ] {
        let (s, e) = l.post("/api/v1/classify", &bad).await;
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some(param)), "{bad}: {e}");
    }
    let (_, e) = l.post("/api/v1/classify", &json!({"model": SMOL, "input": "x", "labels": ["a", "b", "a"]})).await;
    assert_eq!(e["error"]["message"], "'labels' lists 'a' more than once", "{e}");

    // routing.router: SmolLM2 picks the candidate; whatever it says, the decision is a candidate
    // and the trace shows its classifier (a malformed reply falls open to the default).
    let router = json!({
        "model": "user.LlmRoute", "recipe": "collection.router", "version": "1", "components": [SMOL, GEMMA],
        "routing": {"candidates": [SMOL, GEMMA], "default_model": SMOL,
                    "router": {"type": "llm", "model": SMOL, "prompt": format!("Use {GEMMA} for programming questions and {SMOL} for everything else.")}}
    });
    assert_eq!(l.post("/api/v1/pull", &router).await.0, 200);
    let mut q = json!({"model": "user.LlmRoute", "messages": [{"role": "user", "content": "How do I reverse a list in Python?"}], "max_tokens": 3, "route_trace": true});
    let (s, h, v) = routed(&l, "/api/v1/chat/completions", q.clone()).await;
    assert_eq!(s, 200, "{v}");
    let d = &v["x_lemonade_route"];
    assert_eq!(d["trace"][0]["condition"], "classifier:__router", "{d}");
    assert!([SMOL, GEMMA].contains(&d["route_to"].as_str().unwrap()), "{d}");
    assert_eq!(v["model"], d["route_to"], "the chosen candidate answered");
    assert!(h == "default" || h.starts_with("__route_"), "{h}");
    // The same request decides the same way (temperature 0).
    q["route_trace"] = json!(false);
    assert_eq!(routed(&l, "/api/v1/chat/completions", q).await.1, h);
}

/// Parameter variants (llama-swap's `setParamsByID`): an alias that forces request fields and
/// removes others, with no reload: it shares its target's backend.
#[tokio::test]
async fn real_llama_server_parameter_variants_force_fields_without_a_reload() {
    let l = Lemonade::start(bin(), &[]).await;
    let body = json!({"alias": "smol:short", "target": SMOL, "params": {"max_tokens": 1}, "strip": ["logprobs", "top_logprobs"]});
    let (s, v) = l.post("/internal/aliases", &body).await;
    assert_eq!((s, v["target"].clone()), (200, json!(SMOL)), "{v}");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("alias_params.json")).unwrap()).unwrap();
    assert_eq!(saved, json!({"smol:short": {"params": {"max_tokens": 1}, "strip": ["logprobs", "top_logprobs"]}}));
    let ask = |model: &str| {
        json!({"model": model, "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 6,
               "ignore_eos": true, "temperature": 0, "logprobs": true, "top_logprobs": 2})
    };
    let (s, base) = l.post("/api/v1/chat/completions", &ask(SMOL)).await;
    assert_eq!((s, base["usage"]["completion_tokens"].clone()), (200, json!(6)), "{base}");
    assert!(base["choices"][0]["logprobs"]["content"].is_array(), "{base}");
    let pids = child_pids(l.pid());
    let (s, v) = l.post("/api/v1/chat/completions", &ask("smol:short")).await;
    assert_eq!((s, v["usage"]["completion_tokens"].clone()), (200, json!(1)), "forced max_tokens: {v}");
    assert!(v["choices"][0]["logprobs"].is_null(), "logprobs stripped: {v}");
    assert_eq!(child_pids(l.pid()), pids, "the variant shares the base model's backend");
    assert_eq!(loaded_names(&l.get("/api/v1/health").await.1), [SMOL]);
    let ollama = json!({"model": "smol:short", "messages": [{"role": "user", "content": "Count to ten."}], "stream": false, "options": {"num_predict": 6}});
    let (s, v) = l.post("/api/chat", &ollama).await;
    assert_eq!((s, v["eval_count"].clone()), (200, json!(1)), "{v}");

    let (_, list) = l.get("/internal/aliases").await;
    assert_eq!(list["aliases"][0]["params"], json!({"max_tokens": 1}), "{list}");
    assert!(l.get("/api/v1/models").await.1["data"].as_array().unwrap().iter().any(|m| m["id"] == "smol:short"));
    for (bad, param) in [
        (json!({"alias": "x", "target": SMOL, "params": {"model": "other"}}), "params.model"),
        (json!({"alias": "x", "target": SMOL, "strip": ["messages"]}), "strip.messages"),
    ] {
        let (s, e) = l.post("/internal/aliases", &bad).await;
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some(param)), "{e}");
    }
    let (code, out, err) =
        l.cli(&["alias", "add", "smol:hot", SMOL, "--param", "temperature=1.5", "--strip", "top_p"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (_, list) = l.get("/internal/aliases").await;
    let hot = list["aliases"].as_array().unwrap().iter().find(|a| a["alias"] == "smol:hot").cloned().unwrap();
    assert_eq!((hot["params"].clone(), hot["strip"].clone()), (json!({"temperature": 1.5}), json!(["top_p"])));
    assert_eq!(l.delete("/internal/aliases/smol:short").await.0, 200);
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("alias_params.json")).unwrap()).unwrap();
    assert_eq!(
        saved,
        json!({"smol:hot": {"params": {"temperature": 1.5}, "strip": ["top_p"]}}),
        "removed with its alias"
    );
}

/// Lemonade v11's routing-helper pool, through `lemonade serve` and real llama-servers at one
/// LLM slot: a router's `llm` model serves its classifier in the helper pool, so it and the
/// candidate stay loaded side by side (no swap per request, the same processes); asked for
/// directly it takes the standard slot back, and the idle candidate gives way.
#[tokio::test]
async fn real_llama_server_a_routing_helper_takes_no_slot_and_a_direct_request_takes_it_back() {
    let l = Lemonade::start(bin(), &["--max-loaded-models", "1"]).await;
    let router = json!({
        "model": "user.Helped", "recipe": "collection.router", "version": "1", "components": [SMOL, GEMMA],
        "routing": {"candidates": [GEMMA], "default_model": GEMMA,
                    "router": {"type": "llm", "model": SMOL, "prompt": format!("Always choose {GEMMA}.")}}
    });
    assert_eq!(l.post("/api/v1/pull", &router).await.0, 200);
    let ask = |m: &str| json!({"model": m, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2});
    let pools = |h: &Value| -> Vec<(String, String, u64)> {
        let mut v: Vec<(String, String, u64)> = (h["all_models_loaded"].as_array().unwrap().iter())
            .map(|m| {
                let name = m["model_name"].as_str().unwrap().to_string();
                (name, m["slot_pool"].as_str().unwrap().to_string(), m["pid"].as_u64().unwrap())
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(l.post("/api/v1/chat/completions", &ask("user.Helped")).await.0, 200);
    let first = pools(&l.get("/api/v1/health").await.1);
    let names: Vec<(&str, &str)> = first.iter().map(|(n, p, _)| (n.as_str(), p.as_str())).collect();
    assert_eq!(names, [(GEMMA, "standard/llm"), (SMOL, "routing_helper/llm")], "side by side at one slot");
    assert_eq!(l.post("/api/v1/chat/completions", &ask("user.Helped")).await.0, 200);
    assert_eq!(pools(&l.get("/api/v1/health").await.1), first, "the same processes: no swap");
    // Asked for directly, the router's model takes the standard slot; the idle candidate goes.
    assert_eq!(l.post("/api/v1/chat/completions", &ask(SMOL)).await.0, 200);
    let after = pools(&l.get("/api/v1/health").await.1);
    let smol_pid = first.iter().find(|(n, ..)| n == SMOL).unwrap().2;
    assert_eq!(after, [(SMOL.to_string(), "standard/llm".to_string(), smol_pid)], "the same process, standard");
}
