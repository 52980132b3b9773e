//! The model-backed classifiers' requests and the reading of their answers, as Lemonade v11
//! makes and reads them. Pure: the caller sends the requests (to the classifier's model, as
//! any request to it) and hands the answers back.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::policy::Classifier;
use crate::{Features, Score};

/// The most an `llm` classifier's reply may take (tokens): one small JSON object.
pub const LLM_MAX_TOKENS: u32 = 256;

/// The system prompt of an `llm` classifier: the author's prompt, then v11's fixed contract
/// (what the user message holds, the labels, the JSON reply).
pub fn llm_system_prompt(c: &Classifier) -> String {
    format!(
        "{}\n\nThe user message is a JSON object describing the request to route: {{\"text\": latest user turn only, \
         \"has_tools\": whether the request carries tools, \"has_images\": whether it carries images, \"chars\": byte \
         length of text, \"metadata\": caller routing hints}}. You must choose exactly one of these models: {}. Respond \
         with ONLY a JSON object of the form {{\"model\": \"<one of the listed names>\", \"rationale\": \"<one short \
         sentence>\"}} and no other text.",
        c.prompt.as_deref().unwrap_or_default(),
        c.labels.join(", ")
    )
}

/// The chat request an `llm` classifier sends its model: deterministic, a JSON reply, bounded,
/// thinking off (the template's switch, and v11's `/no_think` line before the user message for
/// models that read the soft switch).
pub fn llm_request(c: &Classifier, f: &Features) -> Value {
    let user = json!({"text": f.input, "has_tools": f.has_tools, "has_images": f.has_images,
                      "chars": f.input.len(), "metadata": f.metadata});
    json!({
        "model": c.model, "stream": false, "temperature": 0.0, "max_tokens": LLM_MAX_TOKENS,
        "response_format": {"type": "json_object"},
        "chat_template_kwargs": {"enable_thinking": false},
        "messages": [{"role": "system", "content": llm_system_prompt(c)}, {"role": "user", "content": format!("/no_think\n{user}")}],
    })
}

/// An `llm` classifier's reply: exactly `{"model": <one of labels>, "rationale": <text>}` (one
/// pair of ``` fences tolerated) scores that label 1; anything else scores nothing, so no
/// rule on it fires and the decision falls open (v11).
pub fn parse_llm_reply(reply: &str, labels: &[String]) -> Score {
    let mut text = reply.trim();
    if let Some(rest) = text.strip_prefix("```") {
        let (Some(nl), Some(close)) = (rest.find('\n'), rest.rfind("```")) else { return Score::of(BTreeMap::new()) };
        if close <= nl || !rest[close + 3..].trim().is_empty() {
            return Score::of(BTreeMap::new());
        }
        text = rest[nl + 1..close].trim();
    }
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text) else { return Score::of(BTreeMap::new()) };
    let (Some(model), Some(rationale)) =
        (o.get("model").and_then(Value::as_str), o.get("rationale").and_then(Value::as_str))
    else {
        return Score::of(BTreeMap::new());
    };
    let rationale = rationale.trim();
    match labels.iter().find(|l| l.as_str() == model.trim()) {
        Some(l) if o.len() == 2 && !rationale.is_empty() => {
            Score { ok: true, labels: [(l.clone(), 1.0)].into(), rationale: Some(rationale.to_string()) }
        }
        _ => Score::of(BTreeMap::new()),
    }
}

/// The chat request a `classifier` sends a model that is not an encoder (v11's
/// LLM-as-classifier). With declared labels the reply is held to exactly those keys, each a
/// whole percentage from 0 to 100 (a JSON schema the backend turns into a grammar: llama.cpp's
/// grammars bound integers, not fractions); [`parse_percent_scores`] reads it.
pub fn classifier_request(c: &Classifier, f: &Features) -> Value {
    let mut system = "Classify the user input. Return only JSON mapping label names to numeric scores.".to_string();
    let format = if c.labels.is_empty() {
        json!({"type": "json_object"})
    } else {
        system = format!(
            "Classify the user input: how likely is each label, as a percentage from 0 to 100. Labels: {}.",
            c.labels.join(", ")
        );
        let props: serde_json::Map<String, Value> =
            c.labels.iter().map(|l| (l.clone(), json!({"type": "integer", "minimum": 0, "maximum": 100}))).collect();
        json!({"type": "json_schema", "json_schema": {"name": "scores", "schema":
            {"type": "object", "properties": props, "required": c.labels, "additionalProperties": false}}})
    };
    json!({"model": c.model, "stream": false, "temperature": 0.0, "max_tokens": LLM_MAX_TOKENS,
           "response_format": format,
           "messages": [{"role": "system", "content": system}, {"role": "user", "content": f.input}]})
}

/// A classifier for `POST /classify` on a chat model: `labels` scored by `model`.
pub fn llm_classifier(model: &str, labels: Vec<String>) -> Classifier {
    Classifier {
        id: "classify".into(),
        kind: crate::ClassifierKind::Classifier,
        model: model.into(),
        prompt: None,
        labels,
        default_label: None,
        reference_phrases: Default::default(),
        on_error: crate::OnError::MatchFalse,
    }
}

/// The answer to [`classifier_request`] for `c`: with declared labels, each label's percentage
/// as a score (÷ 100); a label missing or out of range is a failure. Without labels, as
/// [`parse_scores`].
pub fn parse_percent_scores(c: &Classifier, v: &Value) -> Score {
    if c.labels.is_empty() {
        return parse_scores(v);
    }
    let Some(o) = chat_text(v).and_then(|t| serde_json::from_str::<Value>(t.trim()).ok()) else {
        return Score::failed();
    };
    let scores: Option<BTreeMap<String, f64>> = c
        .labels
        .iter()
        .map(|l| o[l].as_f64().filter(|p| (0.0..=100.0).contains(p)).map(|p| (l.clone(), p / 100.0)))
        .collect();
    scores.map_or_else(Score::failed, Score::of)
}

/// Label scores from a classifier's answer: `{label: score}`, `[{label, score}]`, or either
/// under `labels`/`scores`/`classification(s)`/`data`, in a chat reply's text or the body
/// itself. A score outside `[0, 1]` or no scores at all is a failure (its `on_error` applies).
pub fn parse_scores(v: &Value) -> Score {
    let from_text = chat_text(v).and_then(|t| serde_json::from_str::<Value>(t.trim()).ok());
    let payload = from_text.as_ref().unwrap_or(v);
    let scores = scores_in(payload);
    if scores.is_empty() || scores.values().any(|s| !(0.0..=1.0).contains(s)) {
        return Score::failed();
    }
    Score::of(scores)
}

fn scores_in(v: &Value) -> BTreeMap<String, f64> {
    let pairs = |a: &Vec<Value>| -> BTreeMap<String, f64> {
        a.iter().filter_map(|i| Some((i["label"].as_str()?.to_string(), i["score"].as_f64()?))).collect()
    };
    let object = |o: &serde_json::Map<String, Value>| -> BTreeMap<String, f64> {
        o.iter().filter_map(|(k, v)| Some((k.clone(), v.as_f64()?))).collect()
    };
    match v {
        Value::Array(a) => pairs(a),
        Value::Object(o) => {
            for k in ["labels", "scores", "classification", "classifications", "data"] {
                let found = match o.get(k) {
                    Some(Value::Object(m)) => object(m),
                    Some(Value::Array(a)) => pairs(a),
                    _ => BTreeMap::new(),
                };
                if !found.is_empty() {
                    return found;
                }
            }
            if let (Some(l), Some(s)) = (o.get("label").and_then(Value::as_str), o.get("score").and_then(Value::as_f64))
            {
                return [(l.to_string(), s)].into();
            }
            object(o)
        }
        _ => BTreeMap::new(),
    }
}

/// The text of a chat completion (or a completion).
pub fn chat_text(v: &Value) -> Option<&str> {
    let choice = &v["choices"][0];
    choice["message"]["content"].as_str().or_else(|| choice["text"].as_str())
}

/// The first embedding of an embeddings answer.
pub fn embedding(v: &Value) -> Option<Vec<f32>> {
    let e = v["data"][0]["embedding"].as_array()?;
    let out: Option<Vec<f32>> = e.iter().map(|x| x.as_f64().map(|f| f as f32)).collect();
    out.filter(|o| !o.is_empty())
}

/// The embeddings request of a `semantic_similarity` classifier: the input first, then every
/// reference phrase in order (concept by concept).
pub fn semantic_request(c: &Classifier, f: &Features) -> Value {
    let mut input = vec![f.input.clone()];
    input.extend(c.reference_phrases.values().flatten().cloned());
    json!({"model": c.model, "input": input})
}

/// Each concept's score: the largest cosine similarity of the input to one of its phrases
/// (below 0 counts as 0), from the answer to [`semantic_request`].
pub fn semantic_scores(c: &Classifier, answer: &Value) -> Score {
    let Some(data) = answer["data"].as_array() else { return Score::failed() };
    let mut vectors: Vec<(usize, Vec<f32>)> = Vec::new();
    for (i, d) in data.iter().enumerate() {
        let idx = d["index"].as_u64().map_or(i, |x| x as usize);
        let Some(v) = d["embedding"].as_array() else { return Score::failed() };
        vectors.push((idx, v.iter().filter_map(Value::as_f64).map(|x| x as f32).collect()));
    }
    vectors.sort_by_key(|(i, _)| *i);
    let total = 1 + c.reference_phrases.values().map(Vec::len).sum::<usize>();
    if vectors.len() != total {
        return Score::failed();
    }
    let input = &vectors[0].1;
    let mut next = 1;
    let mut labels = BTreeMap::new();
    for (concept, phrases) in &c.reference_phrases {
        let best = vectors[next..next + phrases.len()].iter().map(|(_, p)| cosine(input, p)).fold(0.0, f64::max);
        next += phrases.len();
        labels.insert(concept.clone(), best.clamp(0.0, 1.0));
    }
    Score::of(labels)
}

/// Cosine similarity (0 for a zero or mismatched vector).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}
