//! Remote OpenAI-compatible providers (recipe `cloud`), the pure part: names, the API base,
//! the key's environment variable, what a discovered model is served as, and the rewrite of a
//! request's model id. Discovery and forwarding (network) live in `host` and `server`.

use api_types::ModelType;
use serde_json::Value;

/// The recipe remote models are listed under.
pub const RECIPE: &str = "cloud";

/// Prefixes of local model names; no provider may take them.
const RESERVED: &[&str] = &["user", "extra"];

/// Why a provider's name or URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloudError {
    #[error("Provider name '{0}' is invalid: use 1 to 32 lowercase letters, digits, '_' or '-' ([a-z0-9_-]+, no '.'), not 'user' or 'extra'")]
    BadName(String),
    #[error("Base URL '{0}' is invalid: give http:// or https:// with a host, e.g. http://10.0.0.5:8000/v1")]
    BadUrl(String),
    #[error(
        "auth_header_name '{0}' is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, 1 to 64 of them)"
    )]
    BadAuthHeader(String),
    #[error("auth_header_prefix holds a control character or is longer than 64 characters")]
    BadAuthPrefix,
    #[error(
        "Base URL '{0}' points at {1}, which no model server answers on: link-local addresses (169.254.0.0/16, fe80::/10) hold cloud metadata services, and an unspecified address (0.0.0.0, ::) reaches this machine by accident"
    )]
    Unreachable(String, String),
}

/// Why lemonade never connects to `ip` for a provider: link-local (a cloud's metadata service
/// at 169.254.169.254, fe80::/10) or unspecified (0.0.0.0, ::), also as an IPv4-mapped IPv6
/// address (`::ffff:169.254.169.254`). Loopback and private addresses are a user's own engines
/// (vLLM on localhost, a box on the LAN), named by the admin who installs the provider.
pub fn forbidden_address(ip: core::net::IpAddr) -> Option<&'static str> {
    use core::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Some("an unspecified address"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("an unspecified address"),
        IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => Some("a link-local address"),
        _ => None,
    }
}

/// `url`'s host, when it is an IP address literal that [`forbidden_address`] refuses: an error
/// naming it. A host name is checked when it is resolved, at each connection.
pub fn check_base_address(url: &str) -> Result<(), CloudError> {
    match host_of(url).parse::<core::net::IpAddr>().ok().and_then(forbidden_address) {
        Some(why) => Err(CloudError::Unreachable(url.to_string(), why.to_string())),
        None => Ok(()),
    }
}

/// The header a key goes in by default, and the text before it.
pub const AUTH_HEADER: &str = "Authorization";
pub const AUTH_PREFIX: &str = "Bearer ";

/// Checks Lemonade v11's `auth_header_name` (an RFC 9110 token) and `auth_header_prefix` (no
/// control character, so no header can be injected).
pub fn check_auth_header(name: Option<&str>, prefix: Option<&str>) -> Result<(), CloudError> {
    if let Some(n) = name {
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if !(1..=64).contains(&n.len()) || !n.bytes().all(token) {
            return Err(CloudError::BadAuthHeader(n.chars().take(64).collect()));
        }
    }
    if prefix.is_some_and(|p| p.chars().count() > 64 || p.chars().any(char::is_control)) {
        return Err(CloudError::BadAuthPrefix);
    }
    Ok(())
}

/// A provider's name: 1–32 of `[a-z0-9_-]`, not a local prefix (as v11: `Fireworks` and
/// `fireworks` would name one key variable but two providers). Its models are `<name>.<id>`,
/// so the name holds no '.'.
pub fn check_name(name: &str) -> Result<(), CloudError> {
    let ok = (1..=32).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && !RESERVED.iter().any(|r| r.eq_ignore_ascii_case(name));
    if ok {
        Ok(())
    } else {
        Err(CloudError::BadName(name.to_string()))
    }
}

/// The OpenAI API base of a provider (what an OpenAI SDK takes as `base_url`), without a
/// trailing '/': a URL with no path gets `/v1` (vLLM, SGLang, TGI and llama-server serve it
/// there); one with a path is kept (`http://host:8000/api/v1` for another lemonade).
pub fn api_base(url: &str) -> Result<String, CloudError> {
    let bad = || CloudError::BadUrl(url.to_string());
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")).ok_or_else(bad)?;
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let clean = |c: char| c.is_ascii_alphanumeric() || "-._~:[]%".contains(c);
    if host.is_empty() || host.starts_with(':') || !host.chars().all(clean) || url.contains(['?', '#', ' ']) {
        return Err(bad());
    }
    let path = path.trim_end_matches('/');
    let scheme_len = url.len() - rest.len();
    let base = format!("{}{authority}", &url[..scheme_len]);
    Ok(if path.is_empty() { format!("{base}/v1") } else { format!("{base}/{path}") })
}

/// Where a request for `path` (one of lemonade's backend paths, `/v1/...` or a llama.cpp
/// native path such as `/tokenize`) goes on a provider whose API base is `base`.
pub fn upstream_url(base: &str, path: &str) -> String {
    match path.strip_prefix("/v1/") {
        Some(rest) => format!("{base}/{rest}"),
        // Native paths live beside the OpenAI base, not under it.
        None => format!("{}{path}", base.strip_suffix("/v1").unwrap_or(base)),
    }
}

/// A URL's host: no scheme, user, port or path; an IPv6 literal without its brackets.
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    }
}

/// Whether an API base's host is this machine (`localhost`, `127.x`, `::1`): a key sent there
/// over plain HTTP never crosses a network.
pub fn is_loopback_base(base: &str) -> bool {
    let host = host_of(base);
    host.eq_ignore_ascii_case("localhost") || host.parse::<core::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `LEMONADE_<NAME>_API_KEY`: the name upper-cased, '-' as '_'.
pub fn key_variable(name: &str) -> String {
    format!("LEMONADE_{}_API_KEY", name.to_ascii_uppercase().replace('-', "_"))
}

/// `<provider>.<id>` → (provider, id), split at the first '.'.
pub fn split(name: &str) -> Option<(&str, &str)> {
    name.split_once('.').filter(|(p, id)| !p.is_empty() && !id.is_empty())
}

/// What a discovered model is served as: the upstream's labels when it gives them (another
/// lemonade does), else a guess from its id. The guess only labels the listing: requests of
/// every kind go to the upstream, which answers for itself.
pub fn model_type(id: &str, labels: &[String]) -> ModelType {
    let has = |l: &str| labels.iter().any(|x| x == l);
    if has("embeddings") {
        return ModelType::Embedding;
    }
    if has("reranking") {
        return ModelType::Reranking;
    }
    let id = id.to_ascii_lowercase();
    if id.contains("rerank") {
        ModelType::Reranking
    } else if ["embed", "minilm", "bge-", "e5-", "gte-"].iter().any(|k| id.contains(k)) {
        ModelType::Embedding
    } else if id.contains("whisper") {
        ModelType::Audio
    } else {
        ModelType::Llm
    }
}

/// A model an upstream's `/v1/models` lists: its id and labels (lemonade's extension).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Discovered {
    pub id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

/// Reads an OpenAI `/v1/models` answer (`data[].id`, and `labels` when given). Ids are kept in
/// the upstream's order, once each.
pub fn parse_models(v: &Value) -> Option<Vec<Discovered>> {
    let mut out: Vec<Discovered> = Vec::new();
    for m in v.get("data")?.as_array()? {
        let Some(id) = m.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()) else { continue };
        if out.iter().any(|d| d.id == id) {
            continue;
        }
        let mut labels: Vec<String> = m
            .get("labels")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        // Another lemonade says each model's `type`: kept as the label that means it.
        let label = match m.get("type").and_then(Value::as_str) {
            Some("embedding") => Some("embeddings"),
            Some("reranking") => Some("reranking"),
            _ => None,
        };
        if let Some(l) = label.filter(|l| !labels.iter().any(|x| x == l)) {
            labels.push(l.to_string());
        }
        out.push(Discovered { id: id.to_string(), labels });
    }
    Some(out)
}

/// The request body with its top-level `model` set to the upstream's id. A body that is not a
/// JSON object (a form, or none) is returned unchanged.
pub fn rewrite_model(body: &[u8], id: &str) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    v.as_object_mut()?.insert("model".into(), Value::String(id.to_string()));
    serde_json::to_vec(&v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_and_unspecified_addresses_are_refused_in_every_spelling_and_loopback_is_not() {
        for url in [
            "http://169.254.169.254/latest",
            "http://169.254.169.254:80/v1",
            "http://0.0.0.0:8000",
            "http://[::]:8000/v1",
            "http://[::ffff:169.254.169.254]/v1",
            "http://[::ffff:0.0.0.0]:80",
            "http://[fe80::1]:8000",
            "http://user@169.254.169.254/v1",
        ] {
            let e = check_base_address(url).unwrap_err();
            assert!(matches!(e, CloudError::Unreachable(..)), "{url}: {e}");
        }
        for url in [
            "http://127.0.0.1:8000",
            "http://[::1]:1",
            "http://[::ffff:127.0.0.1]:80",
            "http://10.0.0.5:8000/v1",
            "https://api.example.com/v1",
            "http://localhost:9",
        ] {
            assert!(check_base_address(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn loopback_bases_are_this_machine() {
        for b in ["http://127.0.0.1:8000/v1", "http://localhost/v1", "http://[::1]:9/v1", "http://127.9.9.9/v1"] {
            assert!(is_loopback_base(b), "{b}");
        }
        for b in [
            "http://10.0.0.5:8000/v1",
            "http://localhost.evil.example/v1",
            "https://api.example.com/v1",
            "http://user@evil:1/v1",
        ] {
            assert!(!is_loopback_base(b), "{b}");
        }
    }

    #[test]
    fn names() {
        for ok in ["vllm", "node-2", "a_b9"] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a.b", "user", "Extra", "Fireworks", "x y", "é", &"n".repeat(33), "../x"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(key_variable("node-2"), "LEMONADE_NODE_2_API_KEY");
        assert_eq!(split("vllm.meta/llama-3.1:8b"), Some(("vllm", "meta/llama-3.1:8b")));
        assert_eq!(split("vllm."), None);
        assert_eq!(split("nodot"), None);
    }

    #[test]
    fn bases_and_urls() {
        assert_eq!(api_base("http://127.0.0.1:8080").unwrap(), "http://127.0.0.1:8080/v1");
        assert_eq!(api_base("http://127.0.0.1:8080/").unwrap(), "http://127.0.0.1:8080/v1");
        assert_eq!(api_base("https://api.example.com/v1/").unwrap(), "https://api.example.com/v1");
        assert_eq!(api_base("http://[::1]:9000/api/v1").unwrap(), "http://[::1]:9000/api/v1");
        for bad in ["ftp://x", "http://", "http://:80", "x", "http://h/a?b", "http://h o"] {
            assert!(api_base(bad).is_err(), "{bad}");
        }
        let b = "http://h:1/v1";
        assert_eq!(upstream_url(b, "/v1/chat/completions"), "http://h:1/v1/chat/completions");
        assert_eq!(upstream_url(b, "/tokenize"), "http://h:1/tokenize");
        assert_eq!(upstream_url("http://h:1/api/v1", "/v1/embeddings"), "http://h:1/api/v1/embeddings");
    }

    #[test]
    fn types_and_discovery() {
        let v = serde_json::json!({"data": [
            {"id": "Qwen3-8B"}, {"id": "nomic-embed-text"}, {"id": "bge-reranker-v2"},
            {"id": "x", "labels": ["embeddings"]}, {"id": "Qwen3-8B"}, {"id": ""}, {"nothing": 1},
            {"id": "peer-model", "type": "reranking"}
        ]});
        let d = parse_models(&v).unwrap();
        let types: Vec<_> = d.iter().map(|m| model_type(&m.id, &m.labels)).collect();
        use ModelType::*;
        assert_eq!(types, [Llm, Embedding, Reranking, Embedding, Reranking]);
        assert_eq!(parse_models(&serde_json::json!({"object": "list"})), None);
    }

    #[test]
    fn model_rewrite() {
        let out = rewrite_model(br#"{"model":"vllm.m","stream":true}"#, "m").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!((v["model"].as_str(), v["stream"].as_bool()), (Some("m"), Some(true)));
        assert_eq!(rewrite_model(b"not json", "m"), None);
        assert_eq!(rewrite_model(b"[1]", "m"), None);
    }
}
