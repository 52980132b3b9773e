//! Server-sent events: progress of pulls and installs, and SSE responses that end when
//! shutdown begins, and the process log as it is written.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use engine::lifecycle::Lifecycle;
use engine::pulls::PullEvent;
use futures_util::StreamExt;
use http::{header, HeaderValue};
use tokio::sync::mpsc;

/// Pull or install events as an SSE response, ending when every sender is gone. Cut short by
/// shutdown, it ends with an `error` event saying so (what was downloaded is kept and resumed).
/// Dropping the response (a client that leaves) drops `rx`, which cancels the download.
pub fn events(rt: &Arc<Lifecycle>, mut rx: mpsc::Receiver<PullEvent>) -> Response {
    let sse = |event: &str, data: &str| Ok::<_, Infallible>(Bytes::from(format!("event: {event}\ndata: {data}\n\n")));
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .filter_map(|ev| std::future::ready(ev.lemonade()))
        .map(move |(e, d)| sse(e, &d));
    let rt2 = rt.clone();
    let last = futures_util::stream::once(async move {
        let msg = "lemonade is shutting down; what was downloaded is kept and the next request resumes it";
        rt2.is_closing().then(|| sse("error", &serde_json::json!({"error": msg}).to_string()))
    })
    .filter_map(std::future::ready);
    headers(Response::new(Body::from_stream(body.take_until(rt.closed()).chain(last))))
}

/// `body` as an SSE response (no caching, no proxy buffering) that also ends when the server
/// shuts down.
pub fn response(
    rt: &Lifecycle,
    body: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    headers(Response::new(until_shutdown(rt, body)))
}

/// A streamed body that ends when the server shuts down, so an open stream (SSE, NDJSON) does
/// not hold the shutdown up.
pub fn until_shutdown(
    rt: &Lifecycle,
    body: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Body {
    Body::from_stream(body.take_until(rt.closed()))
}

/// An SSE response's headers: no caching, no proxy buffering.
fn headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// The log as SSE bytes ([`engine::logs::tail`]): an event per line, a `: heartbeat` comment
/// after a quiet spell, a comment saying how many lines a slow reader skipped.
pub fn log_lines(
    hub: &Arc<host::logging::LogHub>,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    use engine::logs::Tail;
    let mut rx = engine::logs::tail(hub);
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)).map(|t| {
        Ok(match t {
            Tail::Past(lines) => Bytes::from(lines.iter().flat_map(|l| event(l)).collect::<Vec<u8>>()),
            Tail::Line(line) => event(&line),
            Tail::Skipped(n) => Bytes::from(format!(": {n} lines skipped (slow reader)\n\n")),
            Tail::Quiet => Bytes::from_static(b": heartbeat\n\n"),
        })
    })
}

fn event(line: &str) -> Bytes {
    let mut s = String::with_capacity(line.len() + 8);
    for l in line.split('\n') {
        s.push_str("data: ");
        s.push_str(l.trim_end_matches('\r'));
        s.push('\n');
    }
    s.push('\n');
    Bytes::from(s)
}

#[cfg(test)]
mod log_tests {
    #[test]
    fn a_multiline_log_entry_stays_one_event() {
        assert_eq!(&super::event("a\nb")[..], b"data: a\ndata: b\n\n");
    }
}
