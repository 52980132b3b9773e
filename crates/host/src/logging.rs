//! The process's log: tracing to stderr plus an in-memory tail (which the server's
//! `logs/stream` serves), with a filter that `log-level` changes at run time, and the spans'
//! OpenTelemetry export.
//!
//! Lemonade's levels map to tracing filters (critical and error → error; warning → warn;
//! info also shows backend warnings; debug shows backend output; trace shows everything,
//! prompts included). `RUST_LOG`, when set, replaces the mapping at start-up.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::broadcast;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Layer};

/// The target of the spans exported over OpenTelemetry (requests, loads, pulls).
pub const SPANS: &str = "lemonade::spans";

/// Lines kept for a new `logs/stream` client.
pub const TAIL_LINES: usize = 2000;

pub const LEVELS: [&str; 6] = ["critical", "error", "warning", "info", "debug", "trace"];

/// A lemonade level as a tracing filter.
pub fn filter_for(level: &str) -> Option<&'static str> {
    Some(match level {
        "critical" | "error" => "error",
        "warning" => "warn",
        "info" => "info,backend=warn",
        "debug" => "debug,backend=debug,hyper=info,reqwest=info,h2=info",
        "trace" => "trace",
        _ => return None,
    })
}

/// What the log could not do.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("unknown level '{0}'")]
    UnknownLevel(String),
    #[error("the log filter could not be changed: {0}")]
    Reload(String),
    #[error("telemetry flush failed: {0}")]
    Flush(String),
}

/// Replaces the active filter (a tracing-subscriber reload handle, type-erased).
type Reload = Box<dyn Fn(&str) -> Result<(), LogError> + Send + Sync>;

pub struct LogHub {
    /// The kept lines with their sequence numbers (shared: a reader clones pointers, not text).
    tail: Mutex<Tail>,
    tx: broadcast::Sender<Arc<str>>,
    level: Mutex<String>,
    reload: Reload,
    /// The OpenTelemetry exporter, when one is configured (`--otlp-endpoint`).
    telemetry: Mutex<Option<opentelemetry_sdk::trace::SdkTracerProvider>>,
}

struct Tail {
    /// Sequence number of `lines[0]`.
    first: u64,
    lines: VecDeque<Arc<str>>,
}

impl std::fmt::Debug for LogHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogHub").field("level", &self.level()).finish()
    }
}

impl LogHub {
    fn push(&self, line: String) {
        let line: Arc<str> = line.into();
        let mut tail = self.tail.lock();
        if tail.lines.len() == TAIL_LINES {
            tail.lines.pop_front();
            tail.first += 1;
        }
        tail.lines.push_back(line.clone());
        // Sent under the lock, so a subscriber sees each line once: in the tail or live.
        let _ = self.tx.send(line);
    }

    /// The sequence number where the kept lines start, where live lines start, and a receiver
    /// for every later line (no gap, no duplicate).
    pub fn subscribe(&self) -> (u64, u64, broadcast::Receiver<Arc<str>>) {
        let tail = self.tail.lock();
        (tail.first, tail.first + tail.lines.len() as u64, self.tx.subscribe())
    }

    /// Up to `max` kept lines from sequence number `from` (below `end`); lines that left the
    /// tail meanwhile are skipped.
    pub fn past(&self, from: u64, end: u64, max: usize) -> (u64, Vec<Arc<str>>) {
        let tail = self.tail.lock();
        let from = from.max(tail.first);
        let skip = (from - tail.first) as usize;
        let take = ((end.saturating_sub(from)) as usize).min(max);
        let lines: Vec<Arc<str>> = tail.lines.iter().skip(skip).take(take).cloned().collect();
        (from + lines.len() as u64, lines)
    }

    /// The kept lines after sequence number `after` (1-based, as [`entry`] numbers them; None:
    /// every kept line), and a receiver of every later line, whose first has number `next`.
    pub fn entries_after(&self, after: Option<u64>) -> (Vec<api_types::LogEntry>, u64, broadcast::Receiver<Arc<str>>) {
        let (first, end, rx) = self.subscribe();
        let from = after.map_or(first, |a| a.max(first));
        let (_, lines) = self.past(from, end, TAIL_LINES);
        let entries = lines.iter().enumerate().map(|(i, l)| entry(from + i as u64 + 1, l)).collect();
        (entries, end + 1, rx)
    }

    /// Sends every finished span not sent yet (`POST /internal/telemetry/flush`); false when
    /// no exporter is configured.
    pub fn flush_telemetry(&self) -> Result<bool, LogError> {
        let Some(p) = self.telemetry.lock().clone() else { return Ok(false) };
        p.force_flush().map_err(|e| LogError::Flush(e.to_string()))?;
        Ok(true)
    }

    /// Whether spans are exported.
    pub fn telemetry_enabled(&self) -> bool {
        self.telemetry.lock().is_some()
    }

    /// Flushes and stops the exporter (at exit).
    pub fn shutdown_telemetry(&self) {
        if let Some(p) = self.telemetry.lock().take() {
            let _ = p.shutdown();
        }
    }

    pub fn level(&self) -> String {
        self.level.lock().clone()
    }

    pub fn set_level(&self, level: &str) -> Result<(), LogError> {
        let filter = filter_for(level).ok_or_else(|| LogError::UnknownLevel(level.to_string()))?;
        (self.reload)(filter)?;
        *self.level.lock() = level.to_string();
        Ok(())
    }
}

/// Feeds formatted events (no colours) into the hub, one entry per event.
#[derive(Clone)]
struct HubWriter(Arc<LogHub>);

impl Write for HubWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf).trim_end_matches('\n').to_string();
        self.0.push(line);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the global subscriber: stderr plus the hub, filtered by `level` (or `RUST_LOG`);
/// with `otlp` (an OTLP/HTTP endpoint, e.g. `http://127.0.0.1:4318`), the [`SPANS`] spans are
/// exported there too, batched. Without it no span of that target is ever created.
pub fn init(level: &str, otlp: Option<&str>) -> Arc<LogHub> {
    let initial = std::env::var("RUST_LOG").ok().unwrap_or_else(|| filter_for(level).unwrap_or("info").to_string());
    let (filter, handle) = reload::Layer::new(EnvFilter::new(initial));
    let (tx, _) = broadcast::channel(1024);
    let hub = Arc::new(LogHub {
        tail: Mutex::new(Tail { first: 0, lines: VecDeque::with_capacity(TAIL_LINES) }),
        tx,
        level: Mutex::new(level.to_string()),
        reload: Box::new(move |f: &str| handle.reload(EnvFilter::new(f)).map_err(|e| LogError::Reload(e.to_string()))),
        telemetry: Mutex::new(None),
    });
    let w = HubWriter(hub.clone());
    let logs = fmt::layer()
        .with_writer(std::io::stderr)
        .and_then(fmt::layer().with_ansi(false).with_writer(move || w.clone()))
        .with_filter(filter);
    let provider = otlp.and_then(|ep| match exporter(ep) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("OpenTelemetry export to {ep} is off: {e}");
            None
        }
    });
    let otel = provider.as_ref().map(|p| {
        use opentelemetry::trace::TracerProvider as _;
        let targets = tracing_subscriber::filter::Targets::new().with_target(SPANS, tracing::Level::DEBUG);
        tracing_opentelemetry::layer().with_tracer(p.tracer("lemonade")).with_filter(targets)
    });
    *hub.telemetry.lock() = provider;
    tracing_subscriber::registry().with(logs).with(otel).init();
    hub
}

/// A batching OTLP/HTTP (protobuf) span exporter to `endpoint`'s `/v1/traces`.
fn exporter(
    endpoint: &str,
) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    use opentelemetry_otlp::WithExportConfig;
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().with_endpoint(url).build()?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name("lemonade").build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// A formatted line (`2026-11-25T10:00:00.000Z  INFO lemonade_engine::x: text`) as a v11 log
/// entry: its timestamp, severity and tag (the module) read from it.
pub fn entry(seq: u64, line: &str) -> api_types::LogEntry {
    let mut parts = line.split_whitespace();
    let timestamp = parts.next().unwrap_or_default().to_string();
    let severity = match parts.next().unwrap_or_default() {
        "TRACE" => "Trace",
        "DEBUG" => "Debug",
        "WARN" => "Warning",
        "ERROR" => "Error",
        _ => "Info",
    };
    let tag = parts.next().unwrap_or_default().trim_end_matches(':').to_string();
    api_types::LogEntry { seq, timestamp, severity: severity.into(), tag, line: line.trim_end().to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_maps_to_a_filter() {
        for l in LEVELS {
            assert!(filter_for(l).is_some(), "{l}");
        }
        assert_eq!(filter_for("verbose"), None);
    }

    #[test]
    fn readers_page_through_the_tail_without_gaps_or_duplicates() {
        let (tx, _) = broadcast::channel(16);
        let hub = LogHub {
            tail: Mutex::new(Tail { first: 0, lines: VecDeque::new() }),
            tx,
            level: Mutex::new("info".into()),
            reload: Box::new(|_| Ok(())),
            telemetry: Mutex::new(None),
        };
        for i in 0..TAIL_LINES + 5 {
            hub.push(format!("line {i}"));
        }
        let (first, end, mut rx) = hub.subscribe();
        assert_eq!((first, end), (5, TAIL_LINES as u64 + 5));
        // A live line arrives (and pushes the oldest kept line out): the reader skips the
        // line that left, and gets the live line only from the live channel.
        hub.push("live".into());
        let (next, page) = hub.past(first, end, 3);
        let page: Vec<String> = page.iter().map(|l| l.to_string()).collect();
        assert_eq!((next, page), (9, vec!["line 6".to_string(), "line 7".into(), "line 8".into()]));
        let (next, page) = hub.past(end - 1, end, 32);
        assert_eq!((next, page.len()), (end, 1), "the live line is not replayed");
        assert_eq!(&*rx.try_recv().unwrap(), "live");
        let (next, page) = hub.past(0, end, 1);
        assert_eq!((next, &*page[0]), (7, "line 6"));
    }
}
