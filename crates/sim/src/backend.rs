//! The simulated backend: how a fake process answers a chat request in memory. The client
//! says in the request body's `"sim"` object ([`SimAsk`]) how many tokens it wants, how slow
//! the prefill and each token are, and whether the process crashes or hangs before a token;
//! the answer names the model whose process gave it and numbers its tokens, so the checks can
//! tell where an answer came from and whether a stream lost or repeated anything.
//!
//! For the prompt cache it is a llama-server too: its one slot holds the tokens of the last
//! prompt it answered (`/slots`), it renders and tokenizes prompts (`/apply-template`,
//! `/tokenize`: a word is a token), saves its slot as llama-server does (a slot file: the
//! header, the tokens, then the state, which here names the model file and the options it was
//! made with), and restores a saved slot, judging as it does whether the state is its own
//! ([`Slots`], the `cache_own_state` invariant).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use engine::fake::{Answerer, FakeProcess};
use engine::launcher::{Exchange, Process, Unanswered};
use futures_util::{Stream, StreamExt};
use parking_lot::Mutex;
use serde_json::{json, Value};

/// What a simulated client asks the in-memory backend for (the request body's `"sim"`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SimAsk {
    /// Tokens to answer, numbered `t0 t1 …`.
    pub tokens: u32,
    /// Time before the first token (prefill), and between tokens.
    pub prefill_ms: u64,
    pub token_ms: u64,
    /// The process crashes (exit code 1) before this token.
    pub crash_at: Option<u32>,
    /// The process stops answering before this token, until the client or the process goes.
    pub hang_at: Option<u32>,
}

/// Every process's slot, and what the restores found.
#[derive(Default)]
pub struct Slots {
    /// The tokens each process's slot holds (by its address).
    held: Mutex<HashMap<String, Vec<i32>>>,
    /// Restores judged, and those that gave a process another model's or option set's state.
    pub restores: std::sync::atomic::AtomicU64,
    wrong: Mutex<Vec<String>>,
}

impl Slots {
    /// Restores of another's state (taken: each is reported once).
    pub fn take_wrong(&self) -> Vec<String> {
        std::mem::take(&mut self.wrong.lock())
    }
}

/// The answerer the fake launcher's processes use.
pub fn answerer(slots: Arc<Slots>) -> Answerer {
    Arc::new(move |p: &FakeProcess, req: &reqwest::Request| answer(&slots, p, req))
}

type Chunk = Result<Bytes, std::io::Error>;

/// A word is a token: its id, from its letters.
fn tokenize(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .map(|w| w.bytes().fold(7i32, |h, b| h.wrapping_mul(31).wrapping_add(b as i32)) & 0xffff)
        .collect()
}

/// The prompt a chat or completion request makes: its prompt, else its messages' contents.
fn prompt_of(body: &Value) -> String {
    if let Some(p) = body["prompt"].as_str() {
        return p.to_string();
    }
    let messages = body["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
    messages.iter().filter_map(|m| m["content"].as_str()).collect::<Vec<_>>().join(" ")
}

/// What a process's saved state is made with: its arguments but the save folder (the model
/// file, the options).
fn identity(process: &FakeProcess) -> String {
    let mut out = vec![];
    let mut args = process.args().iter();
    while let Some(a) = args.next() {
        if a == backends::prompt_cache::SAVE_PATH_ARG {
            args.next();
            continue;
        }
        out.push(a.as_str());
    }
    out.join(" ")
}

/// Where the process saves slots (`--slot-save-path`).
fn save_dir(process: &FakeProcess) -> Option<std::path::PathBuf> {
    let args = process.args();
    let at = args.iter().position(|a| a == backends::prompt_cache::SAVE_PATH_ARG)?;
    args.get(at + 1).map(std::path::PathBuf::from)
}

/// A slot file as llama-server writes it: its header, the tokens packed, then the state.
fn slot_file(tokens: &[i32], state: &[u8]) -> Vec<u8> {
    let mut v = backends::prompt_cache::slot_header(tokens);
    v.extend(state);
    v
}

fn json_answer(v: Value) -> Exchange {
    let resp = http::Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(reqwest::Body::from(v.to_string()))
        .expect("a response of constant parts");
    Box::pin(async move { Ok(reqwest::Response::from(resp)) })
}

/// The slot API and the prompt's tokens (None: a completion request).
fn slot_api(slots: &Slots, process: &FakeProcess, req: &reqwest::Request, body: &Value) -> Option<Exchange> {
    let path = req.url().path();
    let key = process.base_url();
    // (A fake process's address has a path of its own: its routes end the path.)
    if path.ends_with("/slots") {
        let n = slots.held.lock().get(&key).map_or(0, Vec::len);
        return Some(json_answer(json!([{"id": 0, "is_processing": process.working() > 0, "n_prompt_tokens": n}])));
    }
    if path.ends_with("/apply-template") {
        return Some(json_answer(json!({"prompt": prompt_of(body)})));
    }
    if path.ends_with("/tokenize") {
        return Some(json_answer(json!({"tokens": tokenize(body["content"].as_str().unwrap_or_default())})));
    }
    if !path.contains("/slots/") {
        return None;
    }
    let action = req.url().query_pairs().find(|(k, _)| k == "action").map(|(_, v)| v.to_string()).unwrap_or_default();
    let file = save_dir(process).zip(body["filename"].as_str()).map(|(d, f)| d.join(f));
    let Some(file) = file else {
        return Some(json_answer(json!({"error": "no save path"})));
    };
    let me = identity(process);
    match action.as_str() {
        "save" => {
            let tokens = slots.held.lock().get(&key).cloned().unwrap_or_default();
            let _ = std::fs::write(&file, slot_file(&tokens, me.as_bytes()));
            Some(json_answer(json!({"id_slot": 0, "n_saved": tokens.len()})))
        }
        "restore" => {
            let bytes = std::fs::read(&file).unwrap_or_default();
            let tokens = host::prompt_cache::read_tokens(&file).unwrap_or_default();
            let state = backends::prompt_cache::header_len(&bytes).and_then(|n| bytes.get(n..)).unwrap_or_default();
            slots.restores.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if state != me.as_bytes() {
                slots.wrong.lock().push(format!(
                    "{} ({me}) was given the state of {:?}",
                    process.model(),
                    String::from_utf8_lossy(state)
                ));
            }
            let n = tokens.len();
            slots.held.lock().insert(key, tokens);
            Some(json_answer(json!({"id_slot": 0, "n_restored": n})))
        }
        _ => Some(json_answer(json!({"error": "unknown action"}))),
    }
}

fn answer(slots: &Slots, process: &FakeProcess, req: &reqwest::Request) -> Exchange {
    let body: Value =
        req.body().and_then(|b| b.as_bytes()).and_then(|b| serde_json::from_slice(b).ok()).unwrap_or_default();
    if let Some(answered) = slot_api(slots, process, req, &body) {
        return answered;
    }
    // The slot holds this prompt once it is answered.
    slots.held.lock().insert(process.base_url(), tokenize(&prompt_of(&body)));
    let ask: SimAsk = body.get("sim").and_then(|s| serde_json::from_value(s.clone()).ok()).unwrap_or_default();
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    // The field a parameter variant forces, echoed so the checks see it arrived.
    let variant = body.get("sim_variant").cloned().unwrap_or(Value::Null);
    let (name, crasher, busy) = (process.model().to_string(), process.crasher(), process.busy());
    let mut gone = process.exits();
    Box::pin(async move {
        if gone.borrow().is_some() {
            return Err(Unanswered::Exited);
        }
        let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(1);
        let n = ask.tokens;
        let model = name.clone();
        let variant_whole = variant.clone();
        // The generation: it stops when the client is gone (its connection closed) or the process.
        let produce = async move {
            let _busy = busy;
            tokio::select! {
                biased;
                _ = tx.closed() => return,
                _ = gone.wait_for(|e| e.is_some()) => return,
                _ = tokio::time::sleep(Duration::from_millis(ask.prefill_ms)) => {}
            }
            for i in 0..n {
                if ask.crash_at == Some(i) {
                    return crasher.crash();
                }
                if ask.hang_at == Some(i) {
                    tokio::select! {
                        _ = tx.closed() => {}
                        _ = gone.wait_for(|e| e.is_some()) => {}
                    }
                    return;
                }
                let delta = json!({"model": model, "n": i, "variant": variant,
                    "choices": [{"index": 0, "delta": {"content": format!("t{i} ")}}]});
                tokio::select! {
                    biased;
                    _ = tx.closed() => return,
                    _ = gone.wait_for(|e| e.is_some()) => return,
                    _ = tokio::time::sleep(Duration::from_millis(ask.token_ms)) => {}
                }
                if tx.send(Ok(format!("data: {delta}\n\n").into())).await.is_err() {
                    return;
                }
            }
            let usage = json!({"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1});
            let last = json!({"model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage});
            let _ = tx.send(Ok(format!("data: {last}\n\ndata: [DONE]\n\n").into())).await;
        };
        tokio::spawn(produce);
        let chunks = futures_util::stream::unfold(rx, |mut rx| async move { Some((rx.recv().await?, rx)) });
        let (content_type, body) = if stream {
            ("text/event-stream", reqwest::Body::wrap_stream(until_done(chunks)))
        } else {
            let all: Vec<Chunk> = chunks.collect().await;
            let done = all.last().is_some_and(|c| c.as_ref().is_ok_and(|b| b.ends_with(b"[DONE]\n\n")));
            if !done {
                return Err(Unanswered::Closed);
            }
            let tokens: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
            let whole = json!({"model": name, "tokens": n, "variant": variant_whole,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": tokens.join(" ")}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}});
            ("application/json", reqwest::Body::from(whole.to_string()))
        };
        let resp = http::Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(body)
            .expect("a response of constant parts");
        Ok(reqwest::Response::from(resp))
    })
}

/// `chunks`, then a reset when they ended without `[DONE]`: a stream ends cleanly only with it,
/// and the process going away mid-answer is a connection reset, as with a real backend.
fn until_done(
    chunks: impl Stream<Item = Chunk> + Send + Sync + 'static,
) -> impl Stream<Item = Chunk> + Send + Sync + 'static {
    let reset = || std::io::Error::new(std::io::ErrorKind::ConnectionReset, "the backend closed the connection");
    futures_util::stream::unfold((Box::pin(chunks), false), move |(mut chunks, done)| async move {
        if done {
            return None;
        }
        match chunks.next().await {
            Some(Ok(b)) => {
                let end = b.ends_with(b"[DONE]\n\n");
                Some((Ok(b), (chunks, end)))
            }
            Some(Err(e)) => Some((Err(e), (chunks, true))),
            None => Some((Err(reset()), (chunks, true))),
        }
    })
}
