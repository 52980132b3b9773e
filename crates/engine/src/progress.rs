//! What a download reports as it goes: typed [`PullEvent`]s, Lemonade's event for each
//! ([`PullEvent::lemonade`]; the server writes it as SSE, Ollama's NDJSON is
//! `ollama::pull_status`), and the throttled progress callback that sends them.

use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::mpsc;

/// What a download (of a model, or of a backend's release) reports, in order: `Progress` of
/// each file (the first, then at most every [`PROGRESS_EVERY`], and the last), `FileDone` as
/// each file is complete, then one `Complete` or one `Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullEvent {
    /// `done` bytes of file `index` (1-based) of `total` (`size`: its size, when known).
    Progress { file: String, index: usize, total: usize, done: u64, size: Option<u64> },
    /// File `index` of `total` is downloaded and verified.
    FileDone { file: String, index: usize, total: usize, bytes: u64 },
    /// Everything is there (for a model: the catalogue already counts it downloaded).
    Complete { file: String, index: usize, total: usize, bytes: u64 },
    /// The download failed; what was downloaded is kept and the next pull resumes it.
    Error(String),
}

impl PullEvent {
    /// This event as Lemonade's `(event, JSON data)`: `progress` and `complete` carry a
    /// [`api_types::PullProgress`], `error` carries `{"error": message}`; a finished file has
    /// no event of its own (its last `progress` says it).
    pub fn lemonade(&self) -> Option<(&'static str, String)> {
        let progress = |file: &str, index: usize, total: usize, done: u64, size: u64, percent: u64| {
            let p = api_types::PullProgress {
                file: file.to_string(),
                file_index: index,
                total_files: total,
                bytes_downloaded: done,
                bytes_total: size,
                percent,
            };
            serde_json::to_string(&p).unwrap_or_default()
        };
        Some(match self {
            PullEvent::Progress { file, index, total, done, size } => {
                let size = size.unwrap_or(0);
                ("progress", progress(file, *index, *total, *done, size, (done * 100).checked_div(size).unwrap_or(0)))
            }
            PullEvent::Complete { file, index, total, bytes } => {
                ("complete", progress(file, *index, *total, *bytes, *bytes, 100))
            }
            PullEvent::Error(e) => ("error", serde_json::json!({"error": e}).to_string()),
            PullEvent::FileDone { .. } => return None,
        })
    }
}

/// Progress of one file is reported at most this often (plus the first and the last).
pub const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// A progress callback for file `index` of `total` that sends [`PullEvent::Progress`] to `tx`
/// at most every [`PROGRESS_EVERY`] (plus the last, and a count that went back); it returns false, cancelling the
/// download, once the receiver is gone.
pub fn progress_reporter(
    tx: mpsc::Sender<PullEvent>,
    file: String,
    index: usize,
    total: usize,
) -> impl FnMut(u64, Option<u64>) -> bool + Send {
    let mut last = None::<(Instant, u64)>;
    move |done, size| {
        if tx.is_closed() {
            return false;
        }
        // The last count, a count that went back (the file started over) and each one after
        // [`PROGRESS_EVERY`] are sent.
        let finished = size.is_some_and(|s| done >= s);
        if last.is_some_and(|(t, before)| t.elapsed() < PROGRESS_EVERY && done >= before) && !finished {
            return true;
        }
        last = Some((Instant::now(), done));
        let ev = PullEvent::Progress { file: file.clone(), index, total, done, size };
        tx.try_send(ev).is_ok() || !tx.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts within [`PROGRESS_EVERY`] of the last one sent are held back, unless the file
    /// started over (a server ignored the range): a count that went back is sent at once, so
    /// a job stopped then counts no byte the restart truncated.
    #[tokio::test(start_paused = true)]
    async fn a_count_that_went_back_is_sent_at_once() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut report = progress_reporter(tx, "m.gguf".into(), 1, 1);
        let mut sent = |done| {
            assert!(report(done, Some(100)));
            match rx.try_recv() {
                Ok(PullEvent::Progress { done, .. }) => Some(done),
                _ => None,
            }
        };
        assert_eq!(sent(40), Some(40));
        assert_eq!(sent(60), None, "held back: within PROGRESS_EVERY");
        assert_eq!(sent(0), Some(0), "the file started over");
        tokio::time::advance(PROGRESS_EVERY).await;
        assert_eq!(sent(10), Some(10));
        assert_eq!(sent(100), Some(100), "the last count");
    }
}
