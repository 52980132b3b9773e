//! Omni collections (Lemonade v11's `collection.omni`): which component plans (the first chat
//! model) and which runs each tool (the first whose labels the tool needs). The tool loop is
//! the server's; its prompts and bounds are `routing::omni`'s.

use api_types::ModelType;
use registry::Registry;
use routing::omni::{Tool, ToolFormat};
use serde_json::Value;

use crate::Engine;

/// The name `tool_format` is stored and shown under.
pub fn format_name(f: ToolFormat) -> &'static str {
    match f {
        ToolFormat::Native => "native",
        ToolFormat::Json => "json",
    }
}

/// The planner: the first component that is a chat model (local or a remote provider's).
pub fn planner(rt: &Engine, components: &[String]) -> Option<String> {
    let reg = rt.catalogue.registry();
    components
        .iter()
        .find(|c| reg.get(c).map_or_else(|_| rt.remotes.model(c).is_some(), |i| i.model_type == ModelType::Llm))
        .cloned()
}

/// A component's labels, with the ones its type implies (`image`, `tts`, `transcription`).
fn labels(reg: &Registry, component: &str) -> Vec<String> {
    let Ok(info) = reg.get(component) else { return vec!["chat".into()] };
    let mut l = info.labels.clone();
    l.push(
        match info.model_type {
            ModelType::Image => "image",
            ModelType::Tts => "tts",
            ModelType::Audio => "transcription",
            ModelType::Llm => "chat",
            ModelType::Embedding | ModelType::Reranking => "embeddings",
        }
        .into(),
    );
    l
}

/// The tools `components` offer, each with the component that runs it.
pub fn tools(rt: &Engine, components: &[String]) -> Vec<(&'static Tool, String)> {
    let reg = rt.catalogue.registry();
    let labelled: Vec<(String, Vec<String>)> = components.iter().map(|c| (c.clone(), labels(&reg, c))).collect();
    routing::omni::offered(&labelled)
}

/// The tools as `/models/{id}` lists them: each function definition with its `component`.
pub fn listed_tools(rt: &Engine, components: &[String]) -> Vec<Value> {
    tools(rt, components)
        .into_iter()
        .map(|(t, c)| {
            let mut f = t.function.clone();
            f["component"] = c.into();
            f
        })
        .collect()
}
