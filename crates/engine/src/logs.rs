//! The process's log as a feature: its level (read, and changed at once), its lines for a
//! stream (the kept tail, then each new line), and the telemetry flush. The hub itself (a
//! tracing layer keeping the last lines) is host's; the binary hands it to the engine
//! ([`Engine::with_logs`]). Without one (an embedded engine, tests) the level reads `info` and
//! streaming is refused.

use std::sync::Arc;
use std::time::Duration;

use host::logging::{filter_for, LogHub, LEVELS};
use tokio::sync::{broadcast, mpsc};

use crate::error::{EngineError, Result};
use crate::Engine;

/// A quiet line goes out after this long without a log line, so idle streams stay open.
pub const QUIET: Duration = Duration::from_secs(10);

/// The level the process logs at now.
pub fn level(rt: &Engine) -> String {
    rt.logs().map_or_else(|| "info".to_string(), |h| h.level())
}

/// Changes what the process logs, at once: `level` trimmed and lower-cased, one of
/// [`LEVELS`]; the level now in force is returned.
pub fn set_level(rt: &Engine, level: &str) -> Result<String> {
    let wanted = level.trim().to_ascii_lowercase();
    if filter_for(&wanted).is_none() {
        let msg = format!("Unknown log level '{level}'; use one of: {}", LEVELS.join(", "));
        return Err(EngineError::invalid(msg, Some("level")));
    }
    if let Some(h) = rt.logs() {
        h.set_level(&wanted).map_err(|e| EngineError::Internal(e.to_string()))?;
    }
    tracing::info!(level = %wanted, "log level changed");
    Ok(wanted)
}

/// The hub, for a stream of the log; refused when this process keeps none.
pub fn hub(rt: &Engine) -> Result<Arc<LogHub>> {
    rt.logs().cloned().ok_or_else(|| EngineError::invalid("Log streaming is not enabled in this process", None))
}

/// Sends the finished spans now: Some(true) when sent, Some(false) with no exporter, None
/// when this process keeps no log hub.
pub async fn flush_telemetry(rt: &Engine) -> Result<Option<bool>> {
    let Some(hub) = rt.logs().cloned() else { return Ok(None) };
    let sent = host::offload::offload(move || hub.flush_telemetry())
        .await
        .map_err(|e| EngineError::Internal(format!("telemetry flush failed: {e}")))?
        .map_err(|e| EngineError::Internal(e.to_string()))?;
    Ok(Some(sent))
}

/// What a log stream carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Tail {
    /// Kept lines, a few at a time.
    Past(Vec<Arc<str>>),
    /// A new line.
    Line(Arc<str>),
    /// A slow reader missed this many lines.
    Skipped(u64),
    /// No line for [`QUIET`].
    Quiet,
}

/// The kept lines, a few at a time (a slow reader holds a few lines, not a copy of the tail),
/// then each new line, with [`Tail::Quiet`] after [`QUIET`] without one. Ends when the
/// receiver is dropped.
pub fn tail(hub: &Arc<LogHub>) -> mpsc::Receiver<Tail> {
    let (mut next, end, mut rx) = hub.subscribe();
    let (tx, out) = mpsc::channel::<Tail>(16);
    let hub = hub.clone();
    tokio::spawn(async move {
        while next < end {
            let (after, lines) = hub.past(next, end, 32);
            if lines.is_empty() {
                break;
            }
            next = after;
            if tx.send(Tail::Past(lines)).await.is_err() {
                return;
            }
        }
        loop {
            let item = tokio::select! {
                r = rx.recv() => match r {
                    Ok(line) => Tail::Line(line),
                    Err(broadcast::error::RecvError::Lagged(n)) => Tail::Skipped(n),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tx.closed() => return,
                _ = tokio::time::sleep(QUIET) => Tail::Quiet,
            };
            if tx.send(item).await.is_err() {
                return;
            }
        }
    });
    out
}

/// `after_seq` of Lemonade v11's `logs.subscribe` message, or why the message is not one.
pub fn subscribe_after(text: &str) -> std::result::Result<Option<u64>, &'static str> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|_| "the message is not JSON")?;
    if v["type"] != "logs.subscribe" {
        return Err("send {\"type\": \"logs.subscribe\", \"after_seq\": null} first");
    }
    match &v["after_seq"] {
        serde_json::Value::Null => Ok(None),
        n => n.as_u64().map(Some).ok_or("after_seq must be a whole number or null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscribe_message_gives_its_start_and_anything_else_says_what_to_send() {
        assert_eq!(subscribe_after(r#"{"type": "logs.subscribe", "after_seq": null}"#), Ok(None));
        assert_eq!(subscribe_after(r#"{"type": "logs.subscribe", "after_seq": 41}"#), Ok(Some(41)));
        assert_eq!(subscribe_after("hello"), Err("the message is not JSON"));
        assert!(subscribe_after(r#"{"type": "other"}"#).unwrap_err().contains("logs.subscribe"));
        assert_eq!(
            subscribe_after(r#"{"type": "logs.subscribe", "after_seq": -1}"#),
            Err("after_seq must be a whole number or null")
        );
    }
}
