//! Where a checkpoint comes from (Lemonade v11's `source`): Hugging Face, the one registry
//! lemonade pulls from, or ModelScope, which v11 also pulls from and lemonade names so its URLs
//! and its name are refused plainly. A checkpoint may be a provider URL
//! (`https://huggingface.co/owner/repo`), which names its registry; a `source` given beside
//! it must agree.

/// A model registry a checkpoint can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    HuggingFace,
    ModelScope,
}

impl Registry {
    /// v11's name (`huggingface`, `modelscope`).
    pub fn as_str(self) -> &'static str {
        match self {
            Registry::HuggingFace => "huggingface",
            Registry::ModelScope => "modelscope",
        }
    }

    /// As a person writes it.
    pub fn label(self) -> &'static str {
        match self {
            Registry::HuggingFace => "Hugging Face",
            Registry::ModelScope => "ModelScope",
        }
    }

    /// A `source` value: v11's names and short forms, any case.
    pub fn parse(s: &str) -> Option<Registry> {
        match s.trim().to_ascii_lowercase().as_str() {
            "huggingface" | "hf" => Some(Registry::HuggingFace),
            "modelscope" | "ms" => Some(Registry::ModelScope),
            _ => None,
        }
    }
}

/// A refused checkpoint or source, in v11's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("Unsupported model source '{0}': use huggingface")]
    Unsupported(String),
    #[error("checkpoint URL uses {url} but source was set to '{given}'")]
    Conflict { url: &'static str, given: String },
    #[error("lemonade pulls from Hugging Face only, not from {}", .0.label())]
    NotPulled(Registry),
}

/// A provider URL's registry and its `owner/repo` (the rest of its path dropped), or None
/// for a checkpoint that is not a URL.
pub fn from_url(checkpoint: &str) -> Option<(Registry, String)> {
    let rest = checkpoint.trim().strip_prefix("https://").or_else(|| checkpoint.trim().strip_prefix("http://"))?;
    let rest = rest.strip_prefix("www.").unwrap_or(rest);
    let (registry, path) = if let Some(p) = rest.strip_prefix("huggingface.co/").or_else(|| rest.strip_prefix("hf.co/"))
    {
        (Registry::HuggingFace, p)
    } else if let Some(p) =
        rest.strip_prefix("modelscope.cn/models/").or_else(|| rest.strip_prefix("www.modelscope.cn/models/"))
    {
        (Registry::ModelScope, p)
    } else {
        return None;
    };
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    let (owner, repo) = (parts.next()?, parts.next()?);
    Some((registry, format!("{owner}/{repo}")))
}

/// `checkpoint` (an `owner/repo[:variant]`, or a provider URL) and the `source` given: the
/// checkpoint as `owner/repo[:variant]` and the registry it names. The source is checked
/// first (an unknown one is refused before anything else), then against the URL's registry;
/// a registry lemonade does not pull from is refused last.
pub fn resolve(checkpoint: &str, source: Option<&str>) -> Result<(String, Registry), SourceError> {
    let given = match source.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => Some((Registry::parse(s).ok_or_else(|| SourceError::Unsupported(s.to_string()))?, s)),
        None => None,
    };
    let (checkpoint, registry) = match from_url(checkpoint) {
        Some((url, repo)) => {
            if let Some((_, raw)) = given.filter(|(g, _)| *g != url) {
                return Err(SourceError::Conflict { url: url.as_str(), given: raw.to_string() });
            }
            (repo, url)
        }
        None => (checkpoint.trim().to_string(), given.map_or(Registry::HuggingFace, |(g, _)| g)),
    };
    match registry {
        Registry::HuggingFace => Ok((checkpoint, registry)),
        other => Err(SourceError::NotPulled(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_its_registry_and_a_source_must_agree() {
        let hf = Registry::HuggingFace;
        assert_eq!(resolve("owner/repo:Q4_0", None), Ok(("owner/repo:Q4_0".into(), hf)));
        assert_eq!(resolve("https://huggingface.co/owner/repo", None), Ok(("owner/repo".into(), hf)));
        assert_eq!(resolve("https://huggingface.co/owner/repo/tree/main", Some("HF")), Ok(("owner/repo".into(), hf)));
        assert_eq!(
            resolve("https://huggingface.co/owner/repo", Some("modelscope")).unwrap_err().to_string(),
            "checkpoint URL uses huggingface but source was set to 'modelscope'"
        );
        assert_eq!(
            resolve("https://modelscope.cn/models/owner/repo", Some("huggingface")),
            Err(SourceError::Conflict { url: "modelscope", given: "huggingface".into() })
        );
        assert!(resolve("https://huggingface.co/owner/repo", Some("nexus"))
            .unwrap_err()
            .to_string()
            .starts_with("Unsupported model source 'nexus'"));
        assert_eq!(resolve("owner/repo", Some("ms")), Err(SourceError::NotPulled(Registry::ModelScope)));
        assert_eq!(from_url("https://example.com/owner/repo"), None);
        assert_eq!(from_url("https://huggingface.co/owner"), None);
    }
}
