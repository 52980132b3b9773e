//! The decision: rules top to bottom, the first whose condition holds routes the request;
//! none falls open to `default_model`. `any` stops at its first true part, `all` at its first
//! false one; a classifier is asked for (once per request) only when a condition reaches it.

use std::collections::BTreeMap;

use api_types::{RouteDecision, RouteTraceEntry};

use crate::policy::{Classifier, Cond, MetaCmp, OnError, Policy};
use crate::{Features, MAX_INPUT, VERSION};

/// A classifier's answer: label scores in `[0, 1]` (an LLM's choice scores 1), or a failure
/// (`ok: false`: its conditions take the classifier's `on_error`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Score {
    pub ok: bool,
    pub labels: BTreeMap<String, f64>,
    pub rationale: Option<String>,
}

impl Score {
    /// A classifier that could not be evaluated.
    pub fn failed() -> Score {
        Score::default()
    }

    /// A classifier's label scores.
    pub fn of(labels: BTreeMap<String, f64>) -> Score {
        Score { ok: true, labels, rationale: None }
    }
}

/// What [`decide`] needs or found.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Decided(RouteDecision),
    /// The scores of this classifier are needed: compute them, add them, decide again.
    Needs(String),
}

/// A classifier whose scores the evaluation reached and does not have.
struct Needs {
    classifier: String,
}

struct Eval<'a> {
    policy: &'a Policy,
    features: &'a Features,
    scores: &'a BTreeMap<String, Score>,
    /// The input as text conditions read it (capped), ASCII-lowercased for keywords.
    capped: &'a str,
    lower: Option<String>,
    /// Which of the policy's patterns match the input, found once when a rule first asks.
    matched: Option<regex::SetMatches>,
    trace: Option<Vec<RouteTraceEntry>>,
}

/// Decides where `features` go under `policy`, given the classifier `scores` computed so far;
/// with `want_trace` the decision lists each condition evaluated.
pub fn decide(policy: &Policy, features: &Features, scores: &BTreeMap<String, Score>, want_trace: bool) -> Outcome {
    let mut end = features.input.len().min(MAX_INPUT);
    while !features.input.is_char_boundary(end) {
        end -= 1;
    }
    let mut e = Eval {
        policy,
        features,
        scores,
        capped: &features.input[..end],
        lower: None,
        matched: None,
        trace: want_trace.then(Vec::new),
    };
    for rule in &policy.rules {
        match e.eval(&rule.cond) {
            Err(Needs { classifier }) => return Outcome::Needs(classifier),
            Ok(true) => {
                return Outcome::Decided(decision(&rule.route_to, &rule.id, false, rule.outputs.clone(), e.trace));
            }
            Ok(false) => {}
        }
    }
    Outcome::Decided(decision(&policy.default_model, "", true, Default::default(), e.trace))
}

fn decision(
    to: &str,
    rule: &str,
    default_used: bool,
    outputs: serde_json::Map<String, serde_json::Value>,
    trace: Option<Vec<RouteTraceEntry>>,
) -> RouteDecision {
    RouteDecision {
        version: VERSION.into(),
        route_to: to.into(),
        matched_rule: rule.into(),
        default_used,
        outputs,
        trace: trace.unwrap_or_default(),
    }
}

impl Eval<'_> {
    /// Whether pattern `i` (`r`) matches: from the policy's set, matched once over the input;
    /// `r` alone when there is no set.
    fn regex(&mut self, r: &regex::Regex, i: usize) -> bool {
        let Some(set) = &self.policy.regexes else { return r.is_match(self.capped) };
        let capped = self.capped;
        self.matched.get_or_insert_with(|| set.matches(capped)).matched(i)
    }

    fn eval(&mut self, c: &Cond) -> Result<bool, Needs> {
        let (name, result) = match c {
            Cond::Any(parts) => {
                for p in parts {
                    if self.eval(p)? {
                        return Ok(true);
                    }
                }
                return Ok(false);
            }
            Cond::All(parts) => {
                for p in parts {
                    if !self.eval(p)? {
                        return Ok(false);
                    }
                }
                return Ok(true);
            }
            Cond::Not(p) => return Ok(!self.eval(p)?),
            Cond::Band { classifier, label, min, max } => return self.band(classifier, label.as_deref(), *min, *max),
            Cond::KeywordsAny(k) => ("keywords_any", k.iter().any(|k| self.lower().contains(k.as_str()))),
            Cond::KeywordsAll(k) => ("keywords_all", k.iter().all(|k| self.lower().contains(k.as_str()))),
            Cond::Regex(r, i) => ("regex", self.regex(r, *i)),
            Cond::MinChars(n) => ("min_chars", self.features.input.len() as u64 >= *n),
            Cond::MaxChars(n) => ("max_chars", self.features.input.len() as u64 <= *n),
            Cond::HasTools(b) => ("has_tools", self.features.has_tools == *b),
            Cond::HasImages(b) => ("has_images", self.features.has_images == *b),
            Cond::Metadata { key, cmp } => ("metadata", metadata(self.features.metadata.get(key), cmp)),
        };
        self.push(RouteTraceEntry { condition: name.into(), result, score: None, label: None, rationale: None });
        Ok(result)
    }

    fn lower(&mut self) -> &str {
        let capped = self.capped;
        self.lower.get_or_insert_with(|| capped.to_ascii_lowercase())
    }

    fn push(&mut self, entry: RouteTraceEntry) {
        if let Some(t) = &mut self.trace {
            t.push(entry);
        }
    }

    fn band(&mut self, id: &str, label: Option<&str>, min: Option<f64>, max: Option<f64>) -> Result<bool, Needs> {
        let c: &Classifier = self.policy.classifier(id).expect("checked when parsed");
        let Some(score) = self.scores.get(id) else { return Err(Needs { classifier: id.to_string() }) };
        let label = label.or(c.default_label.as_deref());
        let (result, value) = if score.ok {
            let v = match label {
                Some(l) => score.labels.get(l).copied().unwrap_or(0.0),
                None => score.labels.values().copied().fold(0.0, f64::max),
            };
            (min.is_none_or(|m| v >= m) && max.is_none_or(|m| v <= m), Some(v))
        } else {
            (c.on_error == OnError::MatchTrue, None)
        };
        // The rationale explains the label the classifier chose: not on a test of another.
        let rationale = score.rationale.clone().filter(|_| label.is_none_or(|l| score.labels.contains_key(l)));
        self.push(RouteTraceEntry {
            condition: format!("classifier:{id}"),
            result,
            score: value,
            label: label.map(str::to_string),
            rationale,
        });
        Ok(result)
    }
}

/// v11's metadata test: a missing, empty or blank value is absent; `equals` compares the raw
/// value; `any` the comma-separated tokens.
fn metadata(value: Option<&String>, cmp: &MetaCmp) -> bool {
    let present = value.filter(|v| !v.trim().is_empty());
    match cmp {
        MetaCmp::Exists(want) => present.is_some() == *want,
        MetaCmp::Equals(s) => present.is_some_and(|v| v == s),
        MetaCmp::Any(list) => present.is_some_and(|v| v.split(',').map(str::trim).any(|t| list.iter().any(|l| l == t))),
    }
}
