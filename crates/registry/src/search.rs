//! A Hub search result as Lemonade v11's `GET /v1/registry/search` shows it.

use api_types::SearchResult;
use serde_json::Value;

/// One entry of the Hub's `/api/models` listing (`id`, `downloads`, `likes`, `tags`,
/// `pipeline_tag`); None without an `id`.
pub fn result(v: &Value) -> Option<SearchResult> {
    let id = v["id"].as_str().or_else(|| v["modelId"].as_str())?;
    let tags: Vec<String> = v["tags"]
        .as_array()
        .map(|t| t.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let has_gguf = tags.iter().any(|t| t.eq_ignore_ascii_case("gguf")) || id.to_ascii_lowercase().contains("gguf");
    let task = v["pipeline_tag"].as_str().map(str::to_string);
    Some(SearchResult {
        repository_id: id.to_string(),
        display_name: id.rsplit('/').next().unwrap_or(id).to_string(),
        source: "huggingface".into(),
        repository_type: "model".into(),
        description: v["description"].as_str().map_or_else(|| task.clone().unwrap_or_default(), str::to_string),
        tags,
        task,
        downloads: v["downloads"].as_u64().unwrap_or(0),
        likes: v["likes"].as_u64().unwrap_or(0),
        has_gguf,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hub_entries_become_results() {
        let r = result(&json!({"id": "unsloth/Qwen3-8B-GGUF", "downloads": 5, "likes": 2, "tags": ["gguf", "chat"],
                               "pipeline_tag": "text-generation"}))
        .unwrap();
        assert_eq!(
            (r.display_name.as_str(), r.has_gguf, r.task.as_deref()),
            ("Qwen3-8B-GGUF", true, Some("text-generation"))
        );
        assert_eq!((r.downloads, r.likes, r.source.as_str()), (5, 2, "huggingface"));
        assert!(result(&json!({"downloads": 1})).is_none());
        assert!(!result(&json!({"id": "org/safetensors-model"})).unwrap().has_gguf);
    }
}
