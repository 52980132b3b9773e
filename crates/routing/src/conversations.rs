//! Route stability (Lemonade v11's `routing_switches_total`): which candidate each
//! conversation was last routed to, so a decision that changes it counts as a switch. A
//! conversation is known by its fingerprint: the system prompt and the first user message,
//! which stay the same as the conversation grows. Bounded: the oldest conversation is
//! forgotten first.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use serde_json::Value;

/// Conversations remembered, at most.
pub const REMEMBERED: usize = 4096;

/// The fingerprint of the conversation an OpenAI-shaped request `body` continues, under the
/// collection `collection`; None without a user message.
pub fn fingerprint(collection: &str, body: &Value) -> Option<u64> {
    let messages = body.get("messages")?.as_array()?;
    let text =
        |role: &str| messages.iter().find(|m| m["role"] == role).map(|m| crate::features::text_of(&m["content"]));
    let first_user = text("user")?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (collection, text("system").unwrap_or_default(), first_user).hash(&mut h);
    Some(h.finish())
}

/// The last route of each remembered conversation.
#[derive(Debug, Default)]
pub struct Conversations {
    last: HashMap<u64, String>,
    order: VecDeque<u64>,
}

impl Conversations {
    /// Records that conversation `key` was routed to `route_to`; true when it had been routed
    /// elsewhere before (a switch).
    pub fn observe(&mut self, key: u64, route_to: &str) -> bool {
        match self.last.insert(key, route_to.to_string()) {
            Some(before) => before != route_to,
            None => {
                self.order.push_back(key);
                if self.order.len() > REMEMBERED {
                    if let Some(old) = self.order.pop_front() {
                        self.last.remove(&old);
                    }
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_conversation_that_changes_route_is_a_switch_and_memory_is_bounded() {
        let turn = |n: usize| {
            let mut m = vec![json!({"role": "system", "content": "s"}), json!({"role": "user", "content": "first"})];
            for i in 0..n {
                m.push(json!({"role": "assistant", "content": format!("a{i}")}));
                m.push(json!({"role": "user", "content": format!("u{i}")}));
            }
            json!({"messages": m})
        };
        let k = fingerprint("c", &turn(0)).unwrap();
        assert_eq!(fingerprint("c", &turn(3)), Some(k), "the same conversation as it grows");
        assert_ne!(fingerprint("other", &turn(0)), Some(k));
        assert_eq!(fingerprint("c", &json!({"messages": []})), None);
        let mut c = Conversations::default();
        assert!(!c.observe(k, "A"));
        assert!(!c.observe(k, "A"));
        assert!(c.observe(k, "B"));
        for i in 0..REMEMBERED as u64 {
            c.observe(i + 1_000_000, "A");
        }
        assert!(c.last.len() <= REMEMBERED && !c.observe(k, "A"), "the oldest is forgotten");
    }
}
