//! The simulated remote provider `up` (an OpenAI-compatible upstream, or another lemonade
//! node): it lists the model `r1`, answers its chat requests in memory with numbered tokens
//! as the simulated backend does, pushes back now and then (429 with `Retry-After`), and goes
//! down when the driver says (its requests then fail: 500s, refused and dropped connections).
//! It has no `/metrics`, so a spillover place always has room by its signals.

use std::sync::Arc;
use std::time::Duration;

use engine::launcher::Unanswered;
use engine::remote::InMemory;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::rng::Rng;

/// The provider's name, its base and its one model.
pub const PROVIDER: &str = "up";
pub const BASE: &str = "http://up.sim/v1";
pub const MODEL: &str = "r1";

/// The upstream's state: up or down, and what it answered.
pub struct Upstream {
    inner: Mutex<State>,
}

struct State {
    rng: Rng,
    down: bool,
    /// Chat requests that reached it.
    reached: u64,
}

impl Upstream {
    pub fn new(seed: u64) -> Arc<Upstream> {
        Arc::new(Upstream { inner: Mutex::new(State { rng: Rng::new(seed ^ 0x7570), down: false, reached: 0 }) })
    }

    pub fn set_down(&self, down: bool) {
        self.inner.lock().down = down;
    }

    pub fn reached(&self) -> u64 {
        self.inner.lock().reached
    }

    /// How it answers, for the remote providers of the engine.
    pub fn answerer(self: &Arc<Self>) -> InMemory {
        let me = self.clone();
        Arc::new(move |req: &reqwest::Request| me.answer(req))
    }

    fn answer(&self, req: &reqwest::Request) -> engine::launcher::Exchange {
        let path = req.url().path().to_string();
        let body: Value =
            req.body().and_then(|b| b.as_bytes()).and_then(|b| serde_json::from_slice(b).ok()).unwrap_or_default();
        enum Then {
            Json(u16, Value, Option<&'static str>),
            Fail(Unanswered),
            Chat(Duration),
        }
        let then = {
            let mut s = self.inner.lock();
            if path.ends_with("/models") {
                Then::Json(200, json!({"object": "list", "data": [{"id": MODEL, "object": "model"}]}), None)
            } else if path.ends_with("/metrics") {
                Then::Json(404, json!({"error": "no metrics"}), None)
            } else {
                s.reached += 1;
                let roll = s.rng.range(0, 100);
                let latency = Duration::from_millis(s.rng.range(0, 300));
                match (s.down, roll) {
                    (true, 0..=49) => Then::Json(500, json!({"error": "upstream down"}), None),
                    (true, 50..=74) => Then::Fail(Unanswered::Exited),
                    (true, _) => Then::Fail(Unanswered::Closed),
                    (false, 0..=9) => Then::Json(429, json!({"error": "slow down"}), Some("1")),
                    (false, _) => Then::Chat(latency),
                }
            }
        };
        let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let ask: crate::backend::SimAsk =
            body.get("sim").and_then(|s| serde_json::from_value(s.clone()).ok()).unwrap_or_default();
        Box::pin(async move {
            let (status, content_type, body, retry_after) = match then {
                Then::Fail(u) => return Err(u),
                Then::Json(status, v, retry_after) => {
                    (status, "application/json", reqwest::Body::from(v.to_string()), retry_after)
                }
                Then::Chat(latency) => {
                    tokio::time::sleep(latency).await;
                    let tokens: Vec<String> = (0..ask.tokens).map(|i| format!("t{i}")).collect();
                    if stream {
                        let mut text = String::new();
                        for (i, t) in tokens.iter().enumerate() {
                            let d = json!({"model": MODEL, "n": i, "choices": [{"index": 0, "delta": {"content": format!("{t} ")}}]});
                            text.push_str(&format!("data: {d}\n\n"));
                        }
                        text.push_str("data: [DONE]\n\n");
                        (200, "text/event-stream", reqwest::Body::from(text), None)
                    } else {
                        let v = json!({"model": MODEL, "tokens": ask.tokens,
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": tokens.join(" ")}, "finish_reason": "stop"}]});
                        (200, "application/json", reqwest::Body::from(v.to_string()), None)
                    }
                }
            };
            let mut resp = http::Response::builder().status(status).header(http::header::CONTENT_TYPE, content_type);
            if let Some(secs) = retry_after {
                resp = resp.header(http::header::RETRY_AFTER, secs);
            }
            Ok(reqwest::Response::from(resp.body(body).expect("a response of constant parts")))
        })
    }
}
