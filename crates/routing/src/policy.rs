//! A `collection.router` definition, parsed and checked as Lemonade v11 checks it (its
//! `route_policy.schema.json`): every refusal names the field (`routing.rules[1].match.regex`).

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;
use serde_json::{json, Map, Value};

use crate::{MAX_DEPTH, MAX_REGEX_SIZE, ROUTER_RECIPE, VERSION};

/// A refused policy: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct PolicyError {
    pub path: String,
    pub message: String,
}

fn err<T>(path: &str, message: impl Into<String>) -> Result<T, PolicyError> {
    Err(PolicyError { path: path.to_string(), message: message.into() })
}

/// What a classifier computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassifierKind {
    /// Cosine similarity of the input to each concept's phrases, through an embedding model.
    SemanticSimilarity,
    /// `{label: score}` from a model asked to classify.
    Classifier,
    /// An LLM picks one label (score 1).
    Llm,
}

/// What a failed classifier makes its conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    MatchFalse,
    MatchTrue,
}

/// A model-backed classifier of `routing.classifiers`.
#[derive(Debug, Clone)]
pub struct Classifier {
    pub id: String,
    pub kind: ClassifierKind,
    pub model: String,
    pub prompt: Option<String>,
    /// Its output labels (a semantic classifier's are its concepts).
    pub labels: Vec<String>,
    pub default_label: Option<String>,
    pub reference_phrases: BTreeMap<String, Vec<String>>,
    pub on_error: OnError,
}

/// A `metadata` comparator.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaCmp {
    Equals(String),
    Any(Vec<String>),
    Exists(bool),
}

/// A match expression.
#[derive(Debug, Clone)]
pub enum Cond {
    Any(Vec<Cond>),
    All(Vec<Cond>),
    Not(Box<Cond>),
    /// Lowercased (ASCII) keywords.
    KeywordsAny(Vec<String>),
    KeywordsAll(Vec<String>),
    /// A pattern, and its index in [`Policy::regexes`].
    Regex(Regex, usize),
    MinChars(u64),
    MaxChars(u64),
    HasTools(bool),
    HasImages(bool),
    Metadata {
        key: String,
        cmp: MetaCmp,
    },
    /// A classifier's score for `label` (its default label, else its best) within
    /// `[min, max]`.
    Band {
        classifier: String,
        label: Option<String>,
        min: Option<f64>,
        max: Option<f64>,
    },
}

/// One rule: when `cond` holds, `route_to`.
#[derive(Debug, Clone)]
pub struct Rule {
    pub id: String,
    pub cond: Cond,
    pub route_to: String,
    pub outputs: Map<String, Value>,
}

/// A parsed, checked policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub components: Vec<String>,
    pub candidates: Vec<String>,
    pub default_model: String,
    pub classifiers: Vec<Classifier>,
    pub rules: Vec<Rule>,
    /// `routing` as evaluated: a `router` block written out as its classifier and rules.
    pub normalized: Value,
    /// Every rule's patterns as one set, matched in one pass over the input (5,000 patterns
    /// on 1 MiB: one scan, not 5,000); None when the set would exceed the size limit (each
    /// pattern is then matched on its own).
    pub regexes: Option<regex::RegexSet>,
}

/// Numbers the patterns of `c` in order from `patterns.len()`, collecting them.
fn number_regexes(c: &mut Cond, patterns: &mut Vec<String>) {
    match c {
        Cond::Any(parts) | Cond::All(parts) => parts.iter_mut().for_each(|p| number_regexes(p, patterns)),
        Cond::Not(p) => number_regexes(p, patterns),
        Cond::Regex(r, i) => {
            *i = patterns.len();
            patterns.push(r.as_str().to_string());
        }
        _ => {}
    }
}

/// The classifier id a `routing.router` block becomes.
pub const ROUTER_CLASSIFIER: &str = "__router";

fn strings(v: &Value, path: &str, non_empty: bool) -> Result<Vec<String>, PolicyError> {
    let Some(a) = v.as_array() else { return err(path, format!("must be an array of strings, got {v}")) };
    if non_empty && a.is_empty() {
        return err(path, "must not be empty");
    }
    a.iter()
        .enumerate()
        .map(|(i, s)| match s.as_str() {
            Some(s) if !s.is_empty() || !non_empty => Ok(s.to_string()),
            Some(_) => err(&format!("{path}[{i}]"), "must not be empty"),
            None => err(&format!("{path}[{i}]"), format!("must be a string, got {s}")),
        })
        .collect()
}

fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, PolicyError> {
    v.as_object().map_or_else(|| err(path, format!("must be an object, got {v}")), Ok)
}

fn only(m: &Map<String, Value>, path: &str, known: &[&str]) -> Result<(), PolicyError> {
    match m.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => err(&format!("{path}.{k}"), format!("unknown field (known: {})", known.join(", "))),
        None => Ok(()),
    }
}

fn string(m: &Map<String, Value>, key: &str, path: &str) -> Result<Option<String>, PolicyError> {
    match m.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => err(&format!("{path}.{key}"), format!("must be a string, got {v}")),
    }
}

fn required(m: &Map<String, Value>, key: &str, path: &str) -> Result<String, PolicyError> {
    match string(m, key, path)? {
        Some(s) if !s.is_empty() => Ok(s),
        Some(_) => err(&format!("{path}.{key}"), "must not be empty"),
        None => err(&format!("{path}.{key}"), "is required"),
    }
}

impl Policy {
    /// Parses and checks a whole `collection.router` definition (`version`, `recipe`,
    /// `components`, `routing`; `model_name` is allowed and not read here). Every model the
    /// policy names must be one of `components`.
    pub fn parse(def: &Value) -> Result<Policy, PolicyError> {
        let top = object(def, "policy")?;
        only(top, "policy", &["version", "model", "model_name", "recipe", "components", "models", "routing"])?;
        if top.contains_key("models") {
            return err(
                "models",
                "inline component definitions are not supported: pull or register each component, then list its name in components",
            );
        }
        match top.get("version") {
            Some(Value::String(v)) if v == VERSION => {}
            Some(v) => {
                return err("version", format!("must be \"{VERSION}\" (the policy version this server reads), got {v}"))
            }
            None => return err("version", format!("is required (\"{VERSION}\")")),
        }
        match string(top, "recipe", "policy")?.as_deref() {
            Some(ROUTER_RECIPE) => {}
            Some(r) => return err("recipe", format!("must be \"{ROUTER_RECIPE}\", got \"{r}\"")),
            None => return err("recipe", format!("is required (\"{ROUTER_RECIPE}\")")),
        }
        let components = components(top.get("components"))?;
        let routing = object(top.get("routing").unwrap_or(&Value::Null), "routing")?;
        Self::parse_routing(routing, components)
    }

    fn parse_routing(r: &Map<String, Value>, components: Vec<String>) -> Result<Policy, PolicyError> {
        only(r, "routing", &["candidates", "default_model", "router", "classifiers", "rules"])?;
        let candidates = strings(r.get("candidates").unwrap_or(&Value::Null), "routing.candidates", true)?;
        let declared: BTreeSet<&str> = components.iter().map(String::as_str).collect();
        let mut seen = BTreeSet::new();
        for (i, c) in candidates.iter().enumerate() {
            if !declared.contains(c.as_str()) {
                return err(&format!("routing.candidates[{i}]"), format!("'{c}' is not one of components"));
            }
            if !seen.insert(c.as_str()) {
                return err(&format!("routing.candidates[{i}]"), format!("'{c}' is listed twice"));
            }
        }
        let default_model = required(r, "default_model", "routing")?;
        if !seen.contains(default_model.as_str()) {
            return err("routing.default_model", format!("'{default_model}' is not one of candidates"));
        }
        let (classifiers, rule_values, normalized) = match r.get("router") {
            Some(router) => {
                if r.contains_key("rules") || r.contains_key("classifiers") {
                    return err("routing.router", "is exclusive with routing.rules and routing.classifiers");
                }
                desugar(router, &candidates, r)?
            }
            None => {
                let rules = r.get("rules").ok_or_else(|| PolicyError {
                    path: "routing.rules".into(),
                    message: "is required (or a routing.router block)".into(),
                })?;
                let cls = r.get("classifiers").cloned().unwrap_or(Value::Array(Vec::new()));
                (cls, rules.clone(), Value::Object(r.clone()))
            }
        };
        let classifiers = parse_classifiers(&classifiers, &declared)?;
        let Some(rule_values) = rule_values.as_array() else {
            return err("routing.rules", format!("must be an array of rules, got {rule_values}"));
        };
        let mut rules = Vec::new();
        let mut ids = BTreeSet::new();
        for (i, v) in rule_values.iter().enumerate() {
            let rule = parse_rule(v, &format!("routing.rules[{i}]"), &seen, &classifiers)?;
            if !ids.insert(rule.id.clone()) {
                return err(&format!("routing.rules[{i}].id"), format!("'{}' is used by an earlier rule", rule.id));
            }
            rules.push(rule);
        }
        let mut patterns = Vec::new();
        for rule in &mut rules {
            number_regexes(&mut rule.cond, &mut patterns);
        }
        let regexes = (!patterns.is_empty())
            .then(|| {
                regex::RegexSetBuilder::new(&patterns)
                    .size_limit(MAX_REGEX_SIZE * 16)
                    .dfa_size_limit(MAX_REGEX_SIZE * 16)
                    .nest_limit(MAX_DEPTH as u32 * 4)
                    .build()
                    .ok()
            })
            .flatten();
        Ok(Policy { components, candidates, default_model, classifiers, rules, normalized, regexes })
    }

    /// The classifier `id`.
    pub fn classifier(&self, id: &str) -> Option<&Classifier> {
        self.classifiers.iter().find(|c| c.id == id)
    }
}

/// A collection's `components`: a non-empty list of model names (inline definitions refused).
pub fn components(v: Option<&Value>) -> Result<Vec<String>, PolicyError> {
    let Some(v) = v else { return err("components", "is required: the registered models this policy may use") };
    if let Some(a) = v.as_array() {
        if let Some(i) = a.iter().position(Value::is_object) {
            return err(
                &format!("components[{i}]"),
                "inline component definitions are not supported: pull or register the model, then list its name",
            );
        }
    }
    let c = strings(v, "components", true)?;
    Ok(c)
}

/// `routing.router` as one `llm` classifier whose labels are the candidates, and a rule per
/// candidate (`__route_<i>`: that label scores at least 0.5 → that candidate).
fn desugar(
    router: &Value,
    candidates: &[String],
    r: &Map<String, Value>,
) -> Result<(Value, Value, Value), PolicyError> {
    let m = object(router, "routing.router")?;
    only(m, "routing.router", &["type", "model", "prompt"])?;
    match string(m, "type", "routing.router")?.as_deref() {
        Some("llm") => {}
        Some(t) => return err("routing.router.type", format!("must be \"llm\", got \"{t}\"")),
        None => return err("routing.router.type", "is required (\"llm\")"),
    }
    let model = required(m, "model", "routing.router")?;
    let prompt = required(m, "prompt", "routing.router")?;
    let classifiers =
        json!([{"id": ROUTER_CLASSIFIER, "type": "llm", "model": model, "prompt": prompt, "labels": candidates}]);
    let rules: Vec<Value> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"id": format!("__route_{i}"), "match": {"classifier": ROUTER_CLASSIFIER, "label": c, "min_score": 0.5}, "route_to": c})
        })
        .collect();
    let mut normalized = r.clone();
    normalized.remove("router");
    normalized.insert("classifiers".into(), classifiers.clone());
    normalized.insert("rules".into(), Value::Array(rules.clone()));
    Ok((classifiers, Value::Array(rules), Value::Object(normalized)))
}

const PRESETS: &[&str] =
    &["pii_detection", "prompt_safety", "language_detection", "domain_classification", "complexity", "sentiment"];

fn parse_classifiers(v: &Value, components: &BTreeSet<&str>) -> Result<Vec<Classifier>, PolicyError> {
    let Some(a) = v.as_array() else { return err("routing.classifiers", format!("must be an array, got {v}")) };
    let mut out: Vec<Classifier> = Vec::new();
    for (i, c) in a.iter().enumerate() {
        let path = format!("routing.classifiers[{i}]");
        let c = parse_classifier(c, &path, components)?;
        if out.iter().any(|o| o.id == c.id) {
            return err(&format!("{path}.id"), format!("'{}' is used by an earlier classifier", c.id));
        }
        out.push(c);
    }
    Ok(out)
}

fn parse_classifier(v: &Value, path: &str, components: &BTreeSet<&str>) -> Result<Classifier, PolicyError> {
    let m = object(v, path)?;
    only(m, path, &["id", "type", "model", "prompt", "labels", "default_label", "reference_phrases", "on_error"])?;
    let id = required(m, "id", path)?;
    let kind = match required(m, "type", path)?.as_str() {
        "semantic_similarity" => ClassifierKind::SemanticSimilarity,
        "classifier" => ClassifierKind::Classifier,
        "llm" => ClassifierKind::Llm,
        t if PRESETS.contains(&t) => {
            return err(
                &format!("{path}.type"),
                format!("'{t}' is a reserved preset not available yet; use \"classifier\""),
            )
        }
        t => return err(&format!("{path}.type"), format!("must be semantic_similarity, classifier or llm, got '{t}'")),
    };
    let model = required(m, "model", path)?;
    if !components.contains(model.as_str()) {
        return err(&format!("{path}.model"), format!("'{model}' is not one of components"));
    }
    let prompt = string(m, "prompt", path)?;
    let labels = match m.get("labels") {
        Some(l) => strings(l, &format!("{path}.labels"), kind == ClassifierKind::Llm)?,
        None => Vec::new(),
    };
    let on_error = match string(m, "on_error", path)?.as_deref() {
        None | Some("match_false") => OnError::MatchFalse,
        Some("match_true") => OnError::MatchTrue,
        Some(o) => return err(&format!("{path}.on_error"), format!("must be match_true or match_false, got '{o}'")),
    };
    let mut reference_phrases = BTreeMap::new();
    let mut labels = labels;
    match kind {
        ClassifierKind::SemanticSimilarity => {
            if m.contains_key("labels") {
                return err(
                    &format!("{path}.labels"),
                    "a semantic_similarity classifier's labels are its reference_phrases' concepts",
                );
            }
            let rp = m.get("reference_phrases").ok_or_else(|| PolicyError {
                path: format!("{path}.reference_phrases"),
                message: "is required for semantic_similarity".into(),
            })?;
            let rp = object(rp, &format!("{path}.reference_phrases"))?;
            if rp.is_empty() {
                return err(&format!("{path}.reference_phrases"), "must name at least one concept");
            }
            for (concept, phrases) in rp {
                let p = strings(phrases, &format!("{path}.reference_phrases.{concept}"), true)?;
                reference_phrases.insert(concept.clone(), p);
            }
            labels = reference_phrases.keys().cloned().collect();
        }
        ClassifierKind::Llm if labels.is_empty() => return err(&format!("{path}.labels"), "is required for llm"),
        ClassifierKind::Llm if prompt.as_deref().is_none_or(str::is_empty) => {
            return err(&format!("{path}.prompt"), "is required for llm")
        }
        _ => {}
    }
    let default_label = string(m, "default_label", path)?;
    if let Some(d) = &default_label {
        if !labels.is_empty() && !labels.contains(d) {
            return err(&format!("{path}.default_label"), format!("'{d}' is not one of its labels"));
        }
    }
    Ok(Classifier { id, kind, model, prompt, labels, default_label, reference_phrases, on_error })
}

fn parse_rule(
    v: &Value,
    path: &str,
    candidates: &BTreeSet<&str>,
    classifiers: &[Classifier],
) -> Result<Rule, PolicyError> {
    let m = object(v, path)?;
    only(m, path, &["id", "match", "route_to", "outputs"])?;
    let id = required(m, "id", path)?;
    if !id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return err(&format!("{path}.id"), format!("'{id}' may hold only letters, digits, '.', '_' and '-'"));
    }
    let route_to = required(m, "route_to", path)?;
    if !candidates.contains(route_to.as_str()) {
        return err(&format!("{path}.route_to"), format!("'{route_to}' is not one of candidates"));
    }
    let outputs = match m.get("outputs") {
        None => Map::new(),
        Some(o) => object(o, &format!("{path}.outputs"))?.clone(),
    };
    let cond = parse_match(m.get("match").unwrap_or(&Value::Null), &format!("{path}.match"), classifiers, 0)?;
    Ok(Rule { id, cond, route_to, outputs })
}

const LEAVES: &[&str] = &[
    "any",
    "all",
    "not",
    "classifier",
    "label",
    "min_score",
    "max_score",
    "keywords_any",
    "keywords_all",
    "regex",
    "min_chars",
    "max_chars",
    "has_tools",
    "has_images",
    "metadata",
];

fn parse_match(v: &Value, path: &str, classifiers: &[Classifier], depth: usize) -> Result<Cond, PolicyError> {
    if depth >= MAX_DEPTH {
        return err(path, format!("nests deeper than {MAX_DEPTH} levels"));
    }
    let m = object(v, path)?;
    if m.is_empty() {
        return err(path, "must hold at least one condition");
    }
    only(m, path, LEAVES)?;
    let mut parts = Vec::new();
    let sub = |k: &str| format!("{path}.{k}");
    let list = |k: &str, a: &Value| -> Result<Vec<Cond>, PolicyError> {
        let Some(items) = a.as_array() else { return err(&sub(k), format!("must be an array of conditions, got {a}")) };
        items
            .iter()
            .enumerate()
            .map(|(i, c)| parse_match(c, &format!("{path}.{k}[{i}]"), classifiers, depth + 1))
            .collect()
    };
    for (k, val) in m {
        let c = match k.as_str() {
            "any" => Cond::Any(list(k, val)?),
            "all" => Cond::All(list(k, val)?),
            "not" => Cond::Not(Box::new(parse_match(val, &sub(k), classifiers, depth + 1)?)),
            "keywords_any" => Cond::KeywordsAny(keywords(val, &sub(k))?),
            "keywords_all" => Cond::KeywordsAll(keywords(val, &sub(k))?),
            "regex" => Cond::Regex(regex(val, &sub(k))?, 0),
            "min_chars" => Cond::MinChars(count(val, &sub(k))?),
            "max_chars" => Cond::MaxChars(count(val, &sub(k))?),
            "has_tools" => Cond::HasTools(boolean(val, &sub(k))?),
            "has_images" => Cond::HasImages(boolean(val, &sub(k))?),
            "metadata" => metadata(val, &sub(k))?,
            "classifier" => band(m, path, classifiers)?,
            "label" | "min_score" | "max_score" if !m.contains_key("classifier") => {
                return err(&sub(k), "needs a classifier in the same condition")
            }
            _ => continue,
        };
        parts.push(c);
    }
    Ok(if parts.len() == 1 { parts.remove(0) } else { Cond::All(parts) })
}

fn keywords(v: &Value, path: &str) -> Result<Vec<String>, PolicyError> {
    Ok(strings(v, path, true)?.into_iter().map(|k| k.to_ascii_lowercase()).collect())
}

fn regex(v: &Value, path: &str) -> Result<Regex, PolicyError> {
    let Some(p) = v.as_str() else { return err(path, format!("must be a string, got {v}")) };
    if p.is_empty() {
        return err(path, "must not be empty (an always-matching rule omits the condition)");
    }
    regex::RegexBuilder::new(p)
        .size_limit(MAX_REGEX_SIZE)
        .dfa_size_limit(MAX_REGEX_SIZE)
        .nest_limit(MAX_DEPTH as u32 * 4)
        .build()
        .or_else(|e| err(path, format!("is not a pattern this server matches: {e}")))
}

fn count(v: &Value, path: &str) -> Result<u64, PolicyError> {
    v.as_u64().map_or_else(|| err(path, format!("must be a whole number ≥ 0, got {v}")), Ok)
}

fn boolean(v: &Value, path: &str) -> Result<bool, PolicyError> {
    v.as_bool().map_or_else(|| err(path, format!("must be true or false, got {v}")), Ok)
}

fn metadata(v: &Value, path: &str) -> Result<Cond, PolicyError> {
    let m = object(v, path)?;
    only(m, path, &["key", "equals", "any", "exists"])?;
    let key = required(m, "key", path)?;
    let given: Vec<&str> = ["equals", "any", "exists"].into_iter().filter(|k| m.contains_key(*k)).collect();
    let cmp = match given.as_slice() {
        ["equals"] => MetaCmp::Equals(string(m, "equals", path)?.unwrap_or_default()),
        ["any"] => MetaCmp::Any(strings(&m["any"], &format!("{path}.any"), true)?),
        ["exists"] => MetaCmp::Exists(boolean(&m["exists"], &format!("{path}.exists"))?),
        _ => return err(path, "needs exactly one of equals, any or exists"),
    };
    Ok(Cond::Metadata { key, cmp })
}

fn band(m: &Map<String, Value>, path: &str, classifiers: &[Classifier]) -> Result<Cond, PolicyError> {
    let id = required(m, "classifier", path)?;
    let Some(c) = classifiers.iter().find(|c| c.id == id) else {
        return err(&format!("{path}.classifier"), format!("'{id}' is not declared in routing.classifiers"));
    };
    let label = string(m, "label", path)?;
    if let Some(l) = &label {
        if !c.labels.is_empty() && !c.labels.contains(l) {
            return err(
                &format!("{path}.label"),
                format!("'{l}' is not a label of classifier '{id}' ({})", c.labels.join(", ")),
            );
        }
    }
    let score = |k: &str| -> Result<Option<f64>, PolicyError> {
        match m.get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(s) if (0.0..=1.0).contains(&s) => Ok(Some(s)),
                _ => err(&format!("{path}.{k}"), format!("must be a number from 0 to 1, got {v}")),
            },
        }
    };
    let (min, max) = (score("min_score")?, score("max_score")?);
    if let (Some(a), Some(b)) = (min, max) {
        if a > b {
            return err(&format!("{path}.min_score"), "exceeds max_score");
        }
    }
    let min = if min.is_none() && max.is_none() { Some(0.5) } else { min };
    Ok(Cond::Band { classifier: id, label, min, max })
}
