//! What a policy reads of a request (v11's `RouteContext`): the text of the latest user turn
//! (chat `messages`, a completion's `prompt`, a Responses `input`), whether it carries tools or
//! images, and its OpenAI `metadata` (string values).

use std::collections::BTreeMap;

use serde_json::Value;

/// A request's routing features.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Features {
    pub input: String,
    pub has_tools: bool,
    pub has_images: bool,
    pub metadata: BTreeMap<String, String>,
}

/// The text parts of a message `content` (a string, or typed parts `text` / `input_text`),
/// joined by newlines.
pub(crate) fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| matches!(p["type"].as_str(), Some("text" | "input_text")))
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn has_image(content: &Value) -> bool {
    content
        .as_array()
        .is_some_and(|parts| parts.iter().any(|p| matches!(p["type"].as_str(), Some("image_url" | "input_image"))))
}

/// The last item of `items` with role `user`, as text.
fn last_user(items: &[Value]) -> Option<String> {
    items.iter().rev().find(|m| m["role"] == "user").map(|m| text_of(&m["content"]))
}

impl Features {
    /// The features of an OpenAI-shaped request body (chat completions, completions, responses).
    pub fn of_request(body: &Value) -> Features {
        let mut f =
            Features { has_tools: body["tools"].as_array().is_some_and(|t| !t.is_empty()), ..Features::default() };
        if let Some(messages) = body["messages"].as_array() {
            f.has_images = messages.iter().any(|m| has_image(&m["content"]));
            f.input = last_user(messages).unwrap_or_default();
        } else if let Some(prompt) = body.get("prompt") {
            f.input = match prompt {
                Value::String(s) => s.clone(),
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"),
                _ => String::new(),
            };
        } else if let Some(input) = body.get("input") {
            match input {
                Value::String(s) => f.input = s.clone(),
                Value::Array(items) => {
                    f.has_images =
                        items.iter().any(|i| has_image(i.get("content").unwrap_or(&Value::Array(vec![i.clone()]))));
                    f.input = last_user(items).unwrap_or_else(|| {
                        items
                            .iter()
                            .filter_map(|i| match i {
                                Value::String(s) => Some(s.clone()),
                                Value::Object(o) if !o.contains_key("role") => {
                                    let c = o.get("content").cloned().unwrap_or_else(|| Value::Array(vec![i.clone()]));
                                    Some(text_of(&c)).filter(|t| !t.is_empty())
                                }
                                _ => None,
                            })
                            .collect::<Vec<_>>()
                            .join("\n")
                    });
                }
                _ => {}
            }
        }
        if let Some(m) = body["metadata"].as_object() {
            f.metadata = m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect();
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_latest_user_turn_tools_images_and_metadata() {
        let chat = json!({"messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "here"}]}],
            "tools": [{"type": "function"}], "metadata": {"consent": "denied", "n": 3}});
        let f = Features::of_request(&chat);
        assert_eq!(
            f,
            Features {
                input: "look\nhere".into(),
                has_tools: true,
                has_images: true,
                metadata: [("consent".to_string(), "denied".to_string())].into()
            }
        );
        assert_eq!(Features::of_request(&json!({"prompt": ["a", "b"]})).input, "a\nb");
        assert_eq!(Features::of_request(&json!({"input": "typed"})).input, "typed");
        let responses = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "x"}]}]});
        let f = Features::of_request(&responses);
        assert_eq!((f.input.as_str(), f.has_images, f.has_tools), ("hi", true, false));
        let bare = json!({"input": ["one", {"type": "input_text", "text": "two"}]});
        assert_eq!(Features::of_request(&bare).input, "one\ntwo");
        assert_eq!(Features::of_request(&json!({"tools": []})), Features::default());
    }
}
