//! Server-sent events: progress of pulls and installs, and SSE responses that end when
//! shutdown begins.

use std::convert::Infallible;
use std::sync::Arc;

use api_types::PullProgress;
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use engine::lifecycle::Lifecycle;
use engine::pulls::PullEvent;
use http::{header, HeaderValue};
use tokio::sync::mpsc;

/// One pull or install event as SSE's `(event, data)`: `progress` and `complete` carry a
/// [`PullProgress`], `error` carries `{"error": message}`; a finished file has no event of its
/// own (its last `progress` says it).
pub fn frame(ev: &PullEvent) -> Option<(&'static str, String)> {
    let progress = |file: &str, index: usize, total: usize, done: u64, size: u64, percent: u64| PullProgress {
        file: file.to_string(),
        file_index: index,
        total_files: total,
        bytes_downloaded: done,
        bytes_total: size,
        percent,
    };
    Some(match ev {
        PullEvent::Progress { file, index, total, done, size } => {
            let size = size.unwrap_or(0);
            let p = progress(file, *index, *total, *done, size, (done * 100).checked_div(size).unwrap_or(0));
            ("progress", serde_json::to_string(&p).unwrap_or_default())
        }
        PullEvent::Complete { file, index, total, bytes } => {
            let p = progress(file, *index, *total, *bytes, *bytes, 100);
            ("complete", serde_json::to_string(&p).unwrap_or_default())
        }
        PullEvent::Error(e) => ("error", serde_json::json!({"error": e}).to_string()),
        PullEvent::FileDone { .. } => return None,
    })
}

/// Pull or install events as an SSE response, ending when every sender is gone. Cut short by
/// shutdown, it ends with an `error` event saying so (what was downloaded is kept and resumed).
/// Dropping the response (a client that leaves) drops `rx`, which cancels the download.
pub fn events(rt: &Arc<Lifecycle>, mut rx: mpsc::Receiver<PullEvent>) -> Response {
    use futures_util::StreamExt;
    let sse = |event: &str, data: &str| Ok::<_, Infallible>(Bytes::from(format!("event: {event}\ndata: {data}\n\n")));
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .filter_map(|ev| std::future::ready(frame(&ev)))
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
    use futures_util::StreamExt;
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
