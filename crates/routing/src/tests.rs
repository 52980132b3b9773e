use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::classifiers::*;
use crate::*;

fn decided(o: Outcome) -> api_types::RouteDecision {
    match o {
        Outcome::Decided(d) => d,
        Outcome::Needs(c) => panic!("needs classifier {c}"),
    }
}

fn chat(text: &str) -> Features {
    Features::of_request(&json!({"messages": [{"role": "user", "content": text}]}))
}

/// The example of v11's docs/dev/router-policy.md.
fn doc_policy() -> Value {
    json!({
      "version": "1", "model_name": "user.My-Router", "recipe": "collection.router",
      "components": ["Small-GGUF", "Big-GGUF"],
      "routing": {
        "candidates": ["Small-GGUF", "Big-GGUF"], "default_model": "Small-GGUF",
        "rules": [
          {"id": "sensitive-stays-local", "match": {"metadata": {"key": "consent", "equals": "denied"}},
           "route_to": "Small-GGUF", "outputs": {"reason": "privacy"}},
          {"id": "coding-or-long-to-big", "match": {"any": [{"keywords_any": ["def ", "function", "stack trace"]}, {"min_chars": 4000}]},
           "route_to": "Big-GGUF"}
        ]
      }
    })
}

#[test]
fn the_documented_policy_routes_first_match_with_its_trace() {
    let p = Policy::parse(&doc_policy()).unwrap();
    let none = BTreeMap::new();
    let d = decided(decide(&p, &chat("Write a FUNCTION that sorts"), &none, true));
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        json!({"version": "1", "route_to": "Big-GGUF", "matched_rule": "coding-or-long-to-big", "default_used": false,
               "outputs": {}, "trace": [{"condition": "metadata", "result": false}, {"condition": "keywords_any", "result": true}]})
    );
    let mut f = chat("def main(): stack trace");
    f.metadata.insert("consent".into(), "denied".into());
    let d = decided(decide(&p, &f, &none, false));
    assert_eq!(
        (d.matched_rule.as_str(), d.outputs["reason"].as_str(), d.trace.len()),
        ("sensitive-stays-local", Some("privacy"), 0)
    );
    let d = decided(decide(&p, &chat("hello"), &none, true));
    assert_eq!((d.route_to.as_str(), d.matched_rule.as_str(), d.default_used), ("Small-GGUF", "", true));
    let long = "x".repeat(4000);
    assert_eq!(decided(decide(&p, &chat(&long), &none, false)).route_to, "Big-GGUF");
}

fn with_routing(routing: Value) -> Value {
    json!({"version": "1", "recipe": "collection.router", "components": ["A", "B", "E"], "routing": routing})
}

#[test]
fn bad_policies_are_refused_naming_the_field() {
    let ok_rules = json!([{"id": "r", "match": {"min_chars": 1}, "route_to": "B"}]);
    let r = |extra: Value| {
        let mut base = json!({"candidates": ["A", "B"], "default_model": "A", "rules": ok_rules});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        with_routing(base)
    };
    let cases: Vec<(Value, &str)> = vec![
        (json!([]), "policy"),
        (json!({"recipe": "collection.router", "components": ["A"], "routing": {}}), "version"),
        (json!({"version": "2", "recipe": "collection.router"}), "version"),
        (json!({"version": "1", "recipe": "collection.omni"}), "recipe"),
        (json!({"version": "1", "recipe": "collection.router", "routing": {}}), "components"),
        (json!({"version": "1", "recipe": "collection.router", "components": [], "routing": {}}), "components"),
        (json!({"version": "1", "recipe": "collection.router", "components": [{"checkpoint": "x"}]}), "components[0]"),
        (json!({"version": "1", "recipe": "collection.router", "components": ["A"], "models": []}), "models"),
        (json!({"version": "1", "recipe": "collection.router", "components": ["A"], "extra": 1}), "policy.extra"),
        (r(json!({"candidates": ["A", "Z"]})), "routing.candidates[1]"),
        (r(json!({"candidates": ["A", "A"]})), "routing.candidates[1]"),
        (r(json!({"default_model": "E"})), "routing.default_model"),
        (r(json!({"typo": 1})), "routing.typo"),
        (with_routing(json!({"candidates": ["A"], "default_model": "A"})), "routing.rules"),
        (r(json!({"router": {"type": "llm", "model": "E", "prompt": "p"}})), "routing.router"),
        (r(json!({"rules": [{"id": "bad id", "match": {"min_chars": 1}, "route_to": "A"}]})), "routing.rules[0].id"),
        (r(json!({"rules": [{"id": "a", "match": {"min_chars": 1}, "route_to": "E"}]})), "routing.rules[0].route_to"),
        (r(json!({"rules": [{"id": "a", "match": {}, "route_to": "A"}]})), "routing.rules[0].match"),
        (r(json!({"rules": [{"id": "a", "match": {"nope": 1}, "route_to": "A"}]})), "routing.rules[0].match.nope"),
        (
            r(json!({"rules": [{"id": "a", "match": {"regex": "(?<=x)y"}, "route_to": "A"}]})),
            "routing.rules[0].match.regex",
        ),
        (r(json!({"rules": [{"id": "a", "match": {"regex": ""}, "route_to": "A"}]})), "routing.rules[0].match.regex"),
        (
            r(json!({"rules": [{"id": "a", "match": {"min_chars": -1}, "route_to": "A"}]})),
            "routing.rules[0].match.min_chars",
        ),
        (
            r(json!({"rules": [{"id": "a", "match": {"any": [{"has_tools": "yes"}]}, "route_to": "A"}]})),
            "routing.rules[0].match.any[0].has_tools",
        ),
        (
            r(
                json!({"rules": [{"id": "a", "match": {"metadata": {"key": "k", "equals": "x", "exists": true}}, "route_to": "A"}]}),
            ),
            "routing.rules[0].match.metadata",
        ),
        (
            r(json!({"rules": [{"id": "a", "match": {"classifier": "nope"}, "route_to": "A"}]})),
            "routing.rules[0].match.classifier",
        ),
        (r(json!({"rules": [{"id": "a", "match": {"label": "x"}, "route_to": "A"}]})), "routing.rules[0].match.label"),
        (
            r(
                json!({"rules": [{"id": "a", "match": {"min_chars": 1}, "route_to": "A"}, {"id": "a", "match": {"min_chars": 1}, "route_to": "A"}]}),
            ),
            "routing.rules[1].id",
        ),
        (
            r(json!({"classifiers": [{"id": "c", "type": "llm", "model": "Z", "prompt": "p", "labels": ["x"]}]})),
            "routing.classifiers[0].model",
        ),
        (
            r(json!({"classifiers": [{"id": "c", "type": "llm", "model": "E", "labels": ["x"]}]})),
            "routing.classifiers[0].prompt",
        ),
        (r(json!({"classifiers": [{"id": "c", "type": "sentiment", "model": "E"}]})), "routing.classifiers[0].type"),
        (
            r(json!({"classifiers": [{"id": "c", "type": "semantic_similarity", "model": "E"}]})),
            "routing.classifiers[0].reference_phrases",
        ),
        (
            r(
                json!({"classifiers": [{"id": "c", "type": "semantic_similarity", "model": "E", "reference_phrases": {"k": []}}]}),
            ),
            "routing.classifiers[0].reference_phrases.k",
        ),
        (
            r(json!({"classifiers": [{"id": "c", "type": "classifier", "model": "E", "on_error": "explode"}]})),
            "routing.classifiers[0].on_error",
        ),
        (
            r(json!({"classifiers": [{"id": "c", "type": "llm", "model": "E", "prompt": "p", "labels": ["x"]}],
                  "rules": [{"id": "a", "match": {"classifier": "c", "label": "y"}, "route_to": "A"}]})),
            "routing.rules[0].match.label",
        ),
        (
            r(json!({"classifiers": [{"id": "c", "type": "llm", "model": "E", "prompt": "p", "labels": ["x"]}],
                  "rules": [{"id": "a", "match": {"classifier": "c", "min_score": 0.9, "max_score": 0.1}, "route_to": "A"}]})),
            "routing.rules[0].match.min_score",
        ),
    ];
    for (policy, path) in cases {
        let e = Policy::parse(&policy).expect_err(&policy.to_string());
        assert_eq!(e.path, path, "{policy}: {e}");
    }
    let mut deep = json!({"min_chars": 0});
    for _ in 0..40 {
        deep = json!({"not": deep});
    }
    let e = Policy::parse(&r(json!({"rules": [{"id": "a", "match": deep, "route_to": "A"}]}))).unwrap_err();
    assert!(e.message.contains("deeper than 32"), "{e}");
    let huge = "(a{1000}){1000}";
    let e = Policy::parse(&r(json!({"rules": [{"id": "a", "match": {"regex": huge}, "route_to": "A"}]}))).unwrap_err();
    assert_eq!(e.path, "routing.rules[0].match.regex", "{e}");
}

#[test]
fn a_catastrophic_backtracking_pattern_matches_in_linear_time() {
    let p = Policy::parse(&with_routing(json!({"candidates": ["A", "B"], "default_model": "A",
        "rules": [{"id": "evil", "match": {"regex": "^(a+)+$"}, "route_to": "B"}]})))
    .unwrap();
    let input = format!("{}!", "a".repeat(100_000));
    let d = decided(decide(&p, &chat(&input), &BTreeMap::new(), false));
    assert!(d.default_used);
    assert_eq!(decided(decide(&p, &chat("aaaa"), &BTreeMap::new(), false)).matched_rule, "evil");
}

fn classified_policy(on_error: &str) -> Policy {
    Policy::parse(&with_routing(json!({
        "candidates": ["A", "B"], "default_model": "A",
        "classifiers": [
            {"id": "topic", "type": "semantic_similarity", "model": "E", "reference_phrases": {"coding": ["write a function", "fix this bug"], "food": ["a recipe"]}},
            {"id": "risk", "type": "llm", "model": "E", "prompt": "Pick SAFE or RISKY.", "labels": ["SAFE", "RISKY"], "on_error": on_error}
        ],
        "rules": [
            {"id": "tools-first", "match": {"has_tools": true}, "route_to": "A"},
            {"id": "risky", "match": {"all": [{"classifier": "risk", "label": "RISKY"}, {"not": {"keywords_any": ["harmless"]}}]}, "route_to": "A"},
            {"id": "coding", "match": {"classifier": "topic", "label": "coding", "min_score": 0.6}, "route_to": "B"}
        ]
    }))).unwrap()
}

#[test]
fn model_backed_conditions_ask_for_scores_only_when_reached() {
    let p = classified_policy("match_false");
    let mut f = chat("fix my code");
    f.has_tools = true;
    let mut scores = BTreeMap::new();
    assert_eq!(decided(decide(&p, &f, &scores, false)).matched_rule, "tools-first", "no classifier asked for");
    let f = chat("fix my code");
    assert_eq!(decide(&p, &f, &scores, false), Outcome::Needs("risk".into()));
    let reply = parse_llm_reply(r#"{"model": "SAFE", "rationale": "benign"}"#, &p.classifier("risk").unwrap().labels);
    scores.insert("risk".into(), reply);
    assert_eq!(decide(&p, &f, &scores, false), Outcome::Needs("topic".into()));
    scores.insert("topic".into(), Score::of([("coding".to_string(), 0.71), ("food".to_string(), 0.1)].into()));
    let d = decided(decide(&p, &f, &scores, true));
    assert_eq!(d.matched_rule, "coding");
    let t = serde_json::to_value(&d.trace).unwrap();
    assert_eq!(
        t,
        json!([{"condition": "has_tools", "result": false},
               {"condition": "classifier:risk", "result": false, "score": 0.0, "label": "RISKY"},
               {"condition": "classifier:topic", "result": true, "score": 0.71, "label": "coding"}])
    );
    // A failed classifier takes on_error: match_false falls through, match_true matches.
    scores.insert("risk".into(), Score::failed());
    assert_eq!(decided(decide(&p, &f, &scores, false)).matched_rule, "coding");
    let closed = classified_policy("match_true");
    assert_eq!(decided(decide(&closed, &f, &scores, false)).matched_rule, "risky");
}

#[test]
fn the_llm_router_block_desugars_to_a_classifier_and_identity_rules() {
    let p = Policy::parse(&with_routing(json!({"candidates": ["A", "B"], "default_model": "A",
        "router": {"type": "llm", "model": "E", "prompt": "Use B for code."}})))
    .unwrap();
    assert_eq!(
        p.normalized["rules"][1],
        json!({"id": "__route_1", "match": {"classifier": "__router", "label": "B", "min_score": 0.5}, "route_to": "B"})
    );
    assert!(p.normalized.get("router").is_none());
    let c = p.classifier("__router").unwrap();
    let req = llm_request(c, &chat("fix this"));
    assert_eq!((req["model"].as_str(), req["temperature"].as_f64()), (Some("E"), Some(0.0)));
    let system = req["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.starts_with("Use B for code.\n\n") && system.contains("choose exactly one of these models: A, B."),
        "{system}"
    );
    let content = req["messages"][1]["content"].as_str().unwrap();
    let user: Value = serde_json::from_str(content.strip_prefix("/no_think\n").expect("v11's soft switch")).unwrap();
    assert_eq!(user, json!({"text": "fix this", "has_tools": false, "has_images": false, "chars": 8, "metadata": {}}));
    let mut scores = BTreeMap::new();
    scores.insert(
        "__router".into(),
        parse_llm_reply("```json\n{\"model\": \"B\", \"rationale\": \"code\"}\n```", &c.labels),
    );
    let d = decided(decide(&p, &chat("fix this"), &scores, true));
    assert_eq!((d.route_to.as_str(), d.matched_rule.as_str()), ("B", "__route_1"));
    assert_eq!(d.trace[1].rationale.as_deref(), Some("code"), "the rationale on the chosen label only");
    assert_eq!(d.trace[0].rationale, None);
}

#[test]
fn llm_replies_are_read_strictly_and_fail_open() {
    let labels = vec!["A".to_string(), "B".to_string()];
    let chosen = |r: &str| parse_llm_reply(r, &labels).labels.keys().cloned().collect::<Vec<_>>();
    assert_eq!(chosen(r#"{"model": "B", "rationale": "x"}"#), ["B"]);
    assert_eq!(chosen(r#" {"model": " A ", "rationale": "x"} "#), ["A"]);
    for bad in [
        "B",
        r#"{"model": "C", "rationale": "x"}"#,
        r#"{"model": "B"}"#,
        r#"{"model": "B", "rationale": ""}"#,
        r#"{"model": "B", "rationale": "x", "extra": 1}"#,
        "```\n{\"model\": \"B\", \"rationale\": \"x\"}\n``` trailing",
        "Sure! {\"model\": \"B\", \"rationale\": \"x\"}",
    ] {
        assert!(chosen(bad).is_empty(), "{bad}");
        assert!(parse_llm_reply(bad, &labels).ok, "a malformed reply is not a failure: it falls open");
    }
}

#[test]
fn classifier_answers_and_embeddings_are_read() {
    let reply = json!({"choices": [{"message": {"content": "{\"spam\": 0.9, \"ham\": 0.1}"}}]});
    assert_eq!(parse_scores(&reply).labels["spam"], 0.9);
    assert_eq!(parse_scores(&json!({"labels": {"x": 0.2}})).labels["x"], 0.2);
    assert_eq!(parse_scores(&json!([{"label": "y", "score": 1.0}])).labels["y"], 1.0);
    assert!(!parse_scores(&json!({"labels": {"x": 7}})).ok, "out of range");
    assert!(!parse_scores(&json!({"choices": [{"message": {"content": "no idea"}}]})).ok);
    let p = classified_policy("match_false");
    let c = p.classifier("topic").unwrap();
    assert_eq!(semantic_request(c, &chat("q"))["input"], json!(["q", "write a function", "fix this bug", "a recipe"]));
    let answer = json!({"data": [
        {"index": 0, "embedding": [1.0, 0.0]}, {"index": 1, "embedding": [0.0, 1.0]},
        {"index": 2, "embedding": [1.0, 1.0]}, {"index": 3, "embedding": [-1.0, 0.0]}]});
    let s = semantic_scores(c, &answer);
    assert!((s.labels["coding"] - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-6, "{s:?}");
    assert_eq!(s.labels["food"], 0.0, "a negative cosine counts as 0");
    assert!(!semantic_scores(c, &json!({"data": []})).ok);
    assert_eq!(embedding(&answer), Some(vec![1.0, 0.0]));
    let c = llm_classifier("m", vec!["spam".into(), "ham".into()]);
    let req = classifier_request(&c, &chat("buy now"));
    assert_eq!(req["response_format"]["json_schema"]["schema"]["required"], json!(["spam", "ham"]));
    let reply = |t: &str| json!({"choices": [{"message": {"content": t}}]});
    assert_eq!(parse_percent_scores(&c, &reply(r#"{"spam": 90, "ham": 5}"#)).labels["spam"], 0.9);
    assert!(!parse_percent_scores(&c, &reply(r#"{"spam": 900, "ham": 5}"#)).ok);
    assert!(!parse_percent_scores(&c, &reply(r#"{"spam": 90}"#)).ok);
}

// Properties over random deterministic conditions and inputs.

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::collection::vec("[ab]{1,2}", 1..3).prop_map(|k| json!({"keywords_any": k})),
        prop::collection::vec("[ab]{1,2}", 1..3).prop_map(|k| json!({"keywords_all": k})),
        "[ab]{1,3}".prop_map(|r| json!({"regex": r})),
        (0u64..8).prop_map(|n| json!({"min_chars": n})),
        (0u64..8).prop_map(|n| json!({"max_chars": n})),
        any::<bool>().prop_map(|b| json!({"has_tools": b})),
        prop::sample::select(vec!["x", "y", "x,y"]).prop_map(|v| json!({"metadata": {"key": "k", "any": [v]}})),
        any::<bool>().prop_map(|b| json!({"metadata": {"key": "k", "exists": b}})),
    ]
}

fn expr() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 24, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"any": v})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"all": v})),
            inner.prop_map(|v| json!({"not": v})),
        ]
    })
}

fn features() -> impl Strategy<Value = Features> {
    ("[abAB ]{0,8}", any::<bool>(), prop::option::of(prop::sample::select(vec!["x", "y", "", " ", "x,y"]))).prop_map(
        |(input, has_tools, meta)| Features {
            input,
            has_tools,
            has_images: false,
            metadata: meta.map(|m| [("k".to_string(), m.to_string())].into()).unwrap_or_default(),
        },
    )
}

/// Whether `m` alone routes `f` (a one-rule policy).
fn holds(m: &Value, f: &Features) -> bool {
    let p = Policy::parse(&with_routing(json!({"candidates": ["A", "B"], "default_model": "A",
        "rules": [{"id": "r", "match": m, "route_to": "B"}]})))
    .unwrap();
    !decided(decide(&p, f, &BTreeMap::new(), false)).default_used
}

proptest! {
    #[test]
    fn any_all_and_not_compose(a in expr(), b in expr(), f in features()) {
        let (ha, hb) = (holds(&a, &f), holds(&b, &f));
        prop_assert_eq!(holds(&json!({"any": [a.clone(), b.clone()]}), &f), ha || hb);
        prop_assert_eq!(holds(&json!({"all": [a.clone(), b.clone()]}), &f), ha && hb);
        prop_assert_eq!(holds(&json!({"not": a.clone()}), &f), !ha);
        // A leaf object with several keys is an implicit `all`.
        if let (Some(x), Some(y)) = (a.as_object(), b.as_object()) {
            if x.keys().all(|k| !y.contains_key(k)) {
                let mut both = x.clone();
                both.extend(y.clone());
                prop_assert_eq!(holds(&Value::Object(both), &f), ha && hb);
            }
        }
    }

    #[test]
    fn first_match_wins_the_default_falls_open_and_decisions_repeat(
        rules in prop::collection::vec(expr(), 0..5), f in features()
    ) {
        let rule_values: Vec<Value> = rules.iter().enumerate()
            .map(|(i, m)| json!({"id": format!("r{i}"), "match": m, "route_to": if i % 2 == 0 { "B" } else { "A" }}))
            .collect();
        let p = Policy::parse(&with_routing(json!({"candidates": ["A", "B"], "default_model": "A", "rules": rule_values}))).unwrap();
        let d = decided(decide(&p, &f, &BTreeMap::new(), true));
        match rules.iter().position(|m| holds(m, &f)) {
            Some(i) => {
                prop_assert_eq!(d.matched_rule.clone(), format!("r{i}"));
                prop_assert!(!d.default_used);
            }
            None => {
                prop_assert!(d.default_used);
                prop_assert_eq!(d.route_to.as_str(), "A");
                prop_assert_eq!(d.matched_rule.as_str(), "");
            }
        }
        prop_assert_eq!(decided(decide(&p, &f, &BTreeMap::new(), true)), d);
    }

    #[test]
    fn any_llm_reply_is_a_label_or_falls_open(reply in ".{0,80}") {
        let labels = vec!["A".to_string(), "B".to_string()];
        let s = parse_llm_reply(&reply, &labels);
        prop_assert!(s.ok);
        prop_assert!(s.labels.len() <= 1 && s.labels.keys().all(|l| labels.contains(l)));
    }

    #[test]
    fn hostile_policies_are_refused_or_parsed_never_a_panic(v in any_json(4)) {
        let _ = Policy::parse(&v);
        let _ = Policy::parse(&with_routing(json!({"candidates": ["A"], "default_model": "A", "rules": [{"id": "r", "match": v, "route_to": "A"}]})));
    }
}

fn any_json(depth: u32) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z_()*+.\\[\\]]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(depth, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "any",
                    "all",
                    "not",
                    "regex",
                    "min_chars",
                    "metadata",
                    "key",
                    "classifier",
                    "routing",
                    "version"
                ])
                .prop_map(String::from),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

mod omni_loop {
    use serde_json::{json, Value};

    use crate::omni::*;

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_table_reads_and_each_tool_has_a_function_and_labels() {
        let t = table();
        let names: Vec<&str> = t.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["generate_image", "edit_image", "text_to_speech", "transcribe_audio", "analyze_image"]);
        assert!(t.tools.iter().all(|t| !t.requires.is_empty() && t.function["parameters"]["type"] == "object"));
        assert!(t.system_prompt.contains("{tool_list}") && t.system_prompt.contains("{tool_guidance}"));
    }

    #[test]
    fn components_offer_the_tools_their_labels_name() {
        let c = vec![
            ("LLM".to_string(), labels(&["chat"])),
            ("SD".to_string(), labels(&["image"])),
            ("Kokoro".to_string(), labels(&["tts"])),
        ];
        let o: Vec<(String, String)> = offered(&c).into_iter().map(|(t, m)| (t.name.clone(), m)).collect();
        assert_eq!(o, [("generate_image".into(), "SD".into()), ("text_to_speech".into(), "Kokoro".into())]);
    }

    #[test]
    fn the_system_prompt_lists_the_tools_and_a_json_planner_gets_the_contract() {
        let tools: Vec<&Tool> = table().tools.iter().filter(|t| t.name == "edit_image").collect();
        let native = Omni { system_prompt: None, tool_format: ToolFormat::Native };
        let s = system_prompt(&native, &tools);
        assert!(s.contains("- edit_image: Change the most recent image") && s.contains("call edit_image"), "{s}");
        assert!(!s.contains("{tool_list}") && !s.contains("\"with\""));
        let custom =
            Omni { system_prompt: Some("T:{tool_list}|G:{tool_guidance}".into()), tool_format: ToolFormat::Json };
        let s = system_prompt(&custom, &[]);
        assert!(s.starts_with("T:|G:") && s.contains("{\"tool\": \"<tool name>\", \"with\""), "{s}");
    }

    #[test]
    fn settings_are_checked_and_name_the_field() {
        let e = Omni::parse(Some(&json!("no placeholders")), None).unwrap_err();
        assert_eq!(e.path, "system_prompt");
        let e = Omni::parse(None, Some(&json!("xml"))).unwrap_err();
        assert_eq!(e.path, "tool_format");
        assert_eq!(Omni::parse(None, Some(&json!("json"))).unwrap().tool_format, ToolFormat::Json);
        assert_eq!(Omni::parse(None, None).unwrap().tool_format, ToolFormat::Native);
    }

    #[test]
    fn a_native_request_offers_tools_and_a_last_round_refuses_them() {
        let tools: Vec<&Tool> = table().tools.iter().take(1).collect();
        let body = json!({"temperature": 0.0, "tools": [{"type": "function", "function": {"name": "mine"}}], "n": 3});
        let r = planner_request("P", &[], &tools, &body, ToolFormat::Native, false);
        assert_eq!((r["tool_choice"].clone(), r["tools"].as_array().unwrap().len()), (json!("auto"), 2));
        assert_eq!((r["temperature"].clone(), r.get("n"), r["stream"].clone()), (json!(0.0), None, json!(false)));
        let r = planner_request("P", &[], &tools, &body, ToolFormat::Native, true);
        assert_eq!(r["tool_choice"], "none");
        let r = planner_request("P", &[], &tools, &json!({}), ToolFormat::Json, true);
        assert_eq!(r["response_format"]["json_schema"]["schema"]["required"], json!(["response"]));
        assert_eq!(r["max_tokens"], JSON_MAX_TOKENS);
    }

    #[test]
    fn replies_read_as_calls_or_text() {
        let native = json!({"choices": [{"message": {"content": "", "tool_calls": [
            {"id": "a", "function": {"name": "generate_image", "arguments": "{\"prompt\": \"a lemon\"}"}},
            {"function": {"name": "text_to_speech", "arguments": "not json"}}]}}]});
        let Step::Calls { calls, .. } = parse_step(&native, ToolFormat::Native, 0) else { panic!() };
        assert_eq!(calls[0].arguments.as_ref().unwrap()["prompt"], "a lemon");
        assert_eq!((calls[1].id.as_str(), calls[1].arguments.clone()), ("call_0_1", Err(Failure("not json".into()))));
        let text = json!({"choices": [{"message": {"content": "hi"}}]});
        assert_eq!(parse_step(&text, ToolFormat::Native, 0), Step::Text("hi".into()));
        let j = |c: &str| json!({"choices": [{"message": {"content": c}}]});
        let call = parse_step(&j(r#"{"tool": "text_to_speech", "with": {"input": "Hello"}}"#), ToolFormat::Json, 2);
        let Step::Calls { calls, .. } = call else { panic!() };
        assert_eq!((calls[0].name.as_str(), calls[0].id.as_str()), ("text_to_speech", "call_2_0"));
        assert_eq!(parse_step(&j(r#"{"response": "Done."}"#), ToolFormat::Json, 0), Step::Text("Done.".into()));
        assert_eq!(
            parse_step(&j("{\"resp"), ToolFormat::Json, 0),
            Step::Text("{\"resp".into()),
            "an unreadable reply is the answer"
        );
        assert_eq!(
            parse_step(&j("{\"response\": \"I am sor"), ToolFormat::Json, 0),
            Step::Text("I am sor".into()),
            "a cut-off answer"
        );
    }

    #[test]
    fn the_guard_skips_repeats_and_ends_the_loop() {
        let call = |p: &str| Call {
            id: "x".into(),
            name: "generate_image".into(),
            arguments: Ok(json!({"prompt": p}).as_object().unwrap().clone()),
        };
        let mut g = Guard::default();
        assert_eq!(g.round(&[call("a")]), [true]);
        assert!(!g.text_only());
        assert_eq!(g.round(&[call("a"), call("b")]), [false, true]);
        assert!(!g.text_only());
        assert_eq!(g.round(&[call("b")]), [false]);
        assert!(g.text_only(), "a round with nothing new asks for the answer");
        let mut g = Guard::default();
        for p in ["1", "2", "3"] {
            g.round(&[call(p)]);
        }
        assert!(g.text_only(), "the last round answers in text");
    }

    #[test]
    fn the_conversation_grows_in_the_planners_format() {
        let c = Call {
            id: "c1".into(),
            name: "text_to_speech".into(),
            arguments: Ok(json!({"input": "hi"}).as_object().unwrap().clone()),
        };
        let mut m = vec![];
        after_calls(&mut m, ToolFormat::Native, "", std::slice::from_ref(&c), &[tool_ok(json!({"audio": "played"}))]);
        assert_eq!(
            (m[0]["tool_calls"][0]["function"]["arguments"].clone(), m[1]["role"].clone()),
            (json!("{\"input\":\"hi\"}"), json!("tool"))
        );
        assert_eq!(
            serde_json::from_str::<Value>(m[1]["content"].as_str().unwrap()).unwrap(),
            json!({"status": "ok", "audio": "played"})
        );
        let mut m = vec![];
        after_calls(&mut m, ToolFormat::Json, "", &[c], &[tool_error("boom")]);
        assert_eq!(m[1]["role"], "user");
        assert!(m[1]["content"].as_str().unwrap().contains("\"error\":\"boom\""));
    }

    #[test]
    fn the_latest_media_is_found() {
        let m = vec![
            json!({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "QUFB", "format": "wav"}}]}),
            json!({"role": "assistant", "content": format!("Here.\n\n{}", image_markdown("UE5H"))}),
            json!({"role": "user", "content": "make it red"}),
        ];
        assert_eq!(latest_image(&m).as_deref(), Some("UE5H"));
        assert_eq!(latest_audio(&m), Some(("wav".into(), "QUFB".into())));
        assert_eq!(latest_image(&m[..1]), None);
        assert_eq!(audio_tag("audio/wav", "QUFB"), "<audio>data:audio/wav;base64,QUFB</audio>");
    }

    #[test]
    fn an_answer_splits_into_text_and_media() {
        let content = format!("I drew it.\n\n{}\n\n{}", image_markdown("UE5H"), audio_tag("audio/wav", "UklG"));
        let (text, media) = split_media(&content);
        assert_eq!(text, "I drew it.");
        let got: Vec<(&str, &str)> = media.iter().map(|m| (m.mime.as_str(), m.base64.as_str())).collect();
        assert_eq!(got, [("image/png", "UE5H"), ("audio/wav", "UklG")]);
        assert_eq!(split_media("<audio>data:broken"), ("<audio>data:broken".to_string(), vec![]));
    }

    #[test]
    fn the_planner_reads_placeholders_not_media() {
        let client = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "hear this"}, {"type": "input_audio", "input_audio": {"data": "QUFB"}}]}),
            json!({"role": "assistant", "content": format!("Here.\n\n{}", image_markdown("UE5H"))}),
        ];
        let m = planner_messages("S", &client);
        assert_eq!(m[1]["content"][1], json!({"type": "text", "text": "[the user sent audio]"}));
        assert_eq!(m[2]["content"], "Here.\n[an image was shown]");
        assert_eq!(latest_image(&client).as_deref(), Some("UE5H"), "the tools still find it in the client's messages");
    }

    #[test]
    fn a_streamed_wav_gets_its_sizes() {
        let mut wav = b"RIFF\xff\xff\xff\xffWAVEfmt \x04\x00\x00\x00abcddata\xff\xff\xff\xff0123456789".to_vec();
        seal_wav(&mut wav);
        assert_eq!(&wav[4..8], &(wav.len() as u32 - 8).to_le_bytes());
        assert_eq!(&wav[28..32], &10u32.to_le_bytes());
        let mut other = b"ID3 not a wav".to_vec();
        seal_wav(&mut other);
        assert_eq!(other, b"ID3 not a wav");
    }

    proptest::proptest! {
        /// Whatever a planner writes (any text, in either format), it reads as calls or text,
        /// never a panic; and whatever it keeps calling, the loop asks for the answer within
        /// MAX_ROUNDS rounds.
        #[test]
        fn any_reply_reads_and_any_planner_is_stopped(
            text in "\\PC{0,80}",
            names in proptest::collection::vec("[a-z_]{1,12}", 1..12),
            args in proptest::collection::vec(0u8..3, 1..12),
        ) {
            for f in [ToolFormat::Native, ToolFormat::Json] {
                let _ = parse_step(&json!({"choices": [{"message": {"content": text}}]}), f, 0);
                let _ = parse_step(&json!({"choices": [{"message": {"content": format!("{{\"tool\": \"x\", \"with\": {text}")}}]}), f, 0);
            }
            let mut g = Guard::default();
            let mut asked_for_text = None;
            for (i, (n, a)) in names.iter().zip(args.iter().cycle()).enumerate() {
                if g.text_only() {
                    asked_for_text = Some(i);
                    break;
                }
                g.round(&[Call { id: "x".into(), name: n.clone(), arguments: Ok(json!({"a": a}).as_object().unwrap().clone()) }]);
            }
            proptest::prop_assert!(asked_for_text.unwrap_or(names.len()) < MAX_ROUNDS);
        }
    }
}

#[test]
fn many_patterns_are_matched_in_one_pass_and_decide_as_each_alone_would() {
    let rules: Vec<Value> = (0..5000)
        .map(|i| {
            json!({"id": format!("r{i}"), "match": {"any": [{"regex": format!("x{i}y")}, {"not": {"regex": "^$"}}]},
                        "route_to": if i == 4321 { "B" } else { "A" }})
        })
        .collect();
    let mut v = doc_policy();
    v["routing"]["rules"] = Value::Array(rules);
    v["routing"]["candidates"] = json!(["A", "B"]);
    v["routing"]["default_model"] = json!("A");
    v["components"] = json!(["A", "B"]);
    let p = Policy::parse(&v).unwrap();
    assert!(p.regexes.as_ref().is_some_and(|s| s.len() == 10_000), "one set of every pattern");
    // Only the `not ^$` of rule 0 can decide here: the set says which patterns match, in order.
    let none = BTreeMap::new();
    let d = decided(decide(&p, &chat(&format!("{} x4321y", "a".repeat(1 << 20))), &none, false));
    assert_eq!(d.matched_rule, "r0");
    // Without the set, each pattern alone: the same decision.
    let alone = Policy { regexes: None, ..p.clone() };
    let d2 = decided(decide(&alone, &chat(&format!("{} x4321y", "a".repeat(1 << 20))), &none, false));
    assert_eq!(d, d2);
    // A rule deep in the list, found by its own pattern.
    let rules: Vec<Value> = (0..5000)
        .map(|i| json!({"id": format!("r{i}"), "match": {"regex": format!("x{i}y")}, "route_to": "B"}))
        .collect();
    v["routing"]["rules"] = Value::Array(rules);
    let p = Policy::parse(&v).unwrap();
    // (Text conditions read the first MiB: the pattern sits within it.)
    let d = decided(decide(&p, &chat(&format!("{} x4321y", "a".repeat(1 << 19))), &none, true));
    assert_eq!((d.matched_rule.as_str(), d.route_to.as_str(), d.trace.len()), ("r4321", "B", 4322));
}
