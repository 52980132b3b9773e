//! The simulated backend: how a fake process answers a chat request in memory. The client
//! says in the request body's `"sim"` object ([`SimAsk`]) how many tokens it wants, how slow
//! the prefill and each token are, and whether the process crashes or hangs before a token;
//! the answer names the model whose process gave it and numbers its tokens, so the checks can
//! tell where an answer came from and whether a stream lost or repeated anything.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use engine::fake::{Answerer, FakeProcess};
use engine::launcher::{Exchange, Unanswered};
use futures_util::{Stream, StreamExt};
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

/// The answerer the fake launcher's processes use.
pub fn answerer() -> Answerer {
    Arc::new(answer)
}

type Chunk = Result<Bytes, std::io::Error>;

fn answer(process: &FakeProcess, req: &reqwest::Request) -> Exchange {
    let body: Value =
        req.body().and_then(|b| b.as_bytes()).and_then(|b| serde_json::from_slice(b).ok()).unwrap_or_default();
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
