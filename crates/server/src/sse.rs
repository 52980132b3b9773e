//! Server-sent events: progress of pulls and installs, and SSE responses that end when
//! shutdown begins.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_types::PullProgress;
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{header, HeaderValue};
use tokio::sync::mpsc;

use crate::runtime::Runtime;

/// Progress events per file are sent at most this often (plus the first and the last).
pub const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// The sending half of an SSE response: `(event, data)` pairs.
pub type Events = mpsc::Sender<(&'static str, String)>;

/// `progress` events for one file of `total` (number `index`) into `tx`, at most every
/// [`PROGRESS_EVERY`] (plus the last); returns false, cancelling the download, once the client
/// is gone.
pub fn progress_events(
    tx: Events,
    file: String,
    index: usize,
    total: usize,
) -> impl FnMut(u64, Option<u64>) -> bool + Send {
    let mut last = None::<Instant>;
    move |done, size| {
        if tx.is_closed() {
            return false;
        }
        let finished = size.is_some_and(|s| done >= s);
        if last.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) && !finished {
            return true;
        }
        last = Some(Instant::now());
        let bytes_total = size.unwrap_or(0);
        let ev = PullProgress {
            file: file.clone(),
            file_index: index,
            total_files: total,
            bytes_downloaded: done,
            bytes_total,
            percent: (done * 100).checked_div(bytes_total).unwrap_or(0),
        };
        tx.try_send(("progress", serde_json::to_string(&ev).unwrap_or_default())).is_ok() || !tx.is_closed()
    }
}

/// An SSE response of `(event, data)` pairs, ending when every sender is gone. Cut short by
/// shutdown, it ends with an `error` event saying so (what was downloaded is kept and resumed).
pub fn events(rt: &Arc<Runtime>, mut rx: mpsc::Receiver<(&'static str, String)>) -> Response {
    use futures_util::StreamExt;
    let frame = |event: &str, data: &str| Ok::<_, Infallible>(Bytes::from(format!("event: {event}\ndata: {data}\n\n")));
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(|(e, d)| frame(e, &d))));
    let rt2 = rt.clone();
    let last = futures_util::stream::once(async move {
        let msg = "lemonade is shutting down; what was downloaded is kept and the next request resumes it";
        rt2.is_closing().then(|| frame("error", &serde_json::json!({"error": msg}).to_string()))
    })
    .filter_map(std::future::ready);
    headers(Response::new(Body::from_stream(body.take_until(rt.closed()).chain(last))))
}

/// `body` as an SSE response (no caching, no proxy buffering) that also ends when the server
/// shuts down.
pub fn response(
    rt: &Runtime,
    body: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    headers(Response::new(until_shutdown(rt, body)))
}

/// A streamed body that ends when the server shuts down, so an open stream (SSE, NDJSON) does
/// not hold the shutdown up.
pub fn until_shutdown(
    rt: &Runtime,
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

/// The last event of a progress stream: `complete` (file `index` of `total`, with its bytes),
/// or `error`.
pub async fn finish(tx: &Events, file: &str, index: usize, total: usize, result: Result<u64, String>) {
    let event = match result {
        Ok(bytes) => {
            let done = PullProgress {
                file: file.to_string(),
                file_index: index,
                total_files: total,
                bytes_downloaded: bytes,
                bytes_total: bytes,
                percent: 100,
            };
            ("complete", serde_json::to_string(&done).unwrap_or_default())
        }
        Err(e) => ("error", serde_json::json!({"error": e}).to_string()),
    };
    let _ = tx.send(event).await;
}
