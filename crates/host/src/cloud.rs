//! Remote providers' I/O: the file that remembers them (name and base URL only: a key is never
//! written), and discovery of their models over HTTP.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use api_types::Reach;
use backends::cloud::Discovered;
use serde::{Deserialize, Serialize};

use crate::HostError;

/// `<cache>/cloud_providers.json`: `{name: {"base_url": …}}`.
pub const PROVIDERS_FILE: &str = "cloud_providers.json";

/// What is saved of a provider. There is deliberately no key field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    pub base_url: String,
    /// Its last discovered models, so a restarted server lists them while it is down.
    #[serde(default)]
    pub models: Vec<Discovered>,
    /// Lemonade v11's opt-in to send a key over plain `http://` beyond this machine.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_insecure_http: bool,
    /// A Lemonade v11 cloud provider: its models are listed, and requests sent, only with a
    /// key (lemonade's own remote engines, a local vLLM, need none).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keyed: bool,
    /// How it is reached besides its URL and key.
    #[serde(flatten)]
    pub reach: Reach,
}

/// The saved providers (none: empty). A damaged file is an error naming it.
pub fn load(cache_dir: &Path) -> Result<BTreeMap<String, Saved>, HostError> {
    let path = cache_dir.join(PROVIDERS_FILE);
    match crate::files::read_if_exists(&path)? {
        None => Ok(BTreeMap::new()),
        Some(b) => serde_json::from_slice(&b).map_err(|source| {
            HostError::Registry(registry::RegistryError::Json { path: path.display().to_string(), source })
        }),
    }
}

/// Saves (or with None forgets) one provider, atomically.
pub fn save(cache_dir: &Path, name: &str, saved: Option<&Saved>) -> Result<(), HostError> {
    crate::files::update_json_map(&cache_dir.join(PROVIDERS_FILE), name, saved.cloned())
}

/// Reads `<base>/models` with the key as a bearer token, the request sent by `send` (over
/// HTTP, or in memory in the simulation); an error says what failed (never the key).
pub async fn discover<Sent>(
    http: &reqwest::Client,
    base: &str,
    auth: Option<(&str, &str)>,
    timeout: Duration,
    send: impl FnOnce(reqwest::RequestBuilder) -> Sent,
) -> Result<Vec<Discovered>, String>
where
    Sent: std::future::Future<Output = Result<reqwest::Response, String>>,
{
    let mut req = http.get(format!("{base}/models")).timeout(timeout);
    if let Some((name, value)) = auth {
        req = req.header(name, value);
    }
    let resp = send(req).await?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("GET {base}/models answered {status}"));
    }
    let v: serde_json::Value =
        resp.json().await.map_err(|e| format!("GET {base}/models: {}", describe(&e, timeout)))?;
    backends::cloud::parse_models(&v).ok_or_else(|| format!("GET {base}/models is not an OpenAI model list"))
}

/// A transport error in words, its causes included (reqwest's own text stops at "error sending
/// request").
pub fn describe(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("no answer within {} s", timeout.as_secs_f64());
    }
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_are_saved_without_keys_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
        save(dir.path(), "vllm", Some(&Saved { base_url: "http://10.0.0.5:8000/v1".into(), ..Default::default() }))
            .unwrap();
        save(
            dir.path(),
            "peer",
            Some(&Saved { base_url: "http://127.0.0.1:8001/api/v1".into(), ..Default::default() }),
        )
        .unwrap();
        save(dir.path(), "peer", None).unwrap();
        let got = load(dir.path()).unwrap();
        assert_eq!(got.keys().collect::<Vec<_>>(), ["vllm"]);
        let text = std::fs::read_to_string(dir.path().join(PROVIDERS_FILE)).unwrap();
        assert!(!text.contains("key"), "{text}");
        std::fs::write(dir.path().join(PROVIDERS_FILE), b"[1]").unwrap();
        assert!(load(dir.path()).unwrap_err().to_string().contains(PROVIDERS_FILE));
    }
}
