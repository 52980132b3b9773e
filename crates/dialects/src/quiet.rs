//! A streamed answer that has gone quiet: when the client gets a keep-alive (an SSE comment,
//! an Ollama empty chunk: the relay's `keepalive`) and when the stream is cut as stalled.
//! Sans-IO: the proxy tells it when bytes come and asks it, with the time since the stream
//! began, how long to wait and what to do when nothing came.

use std::time::Duration;

/// How long a request may wait before its answer starts as a stream kept alive (an answer
/// within it keeps the backend's status, an error included).
pub const PATIENCE: Duration = Duration::from_millis(250);
/// How often a quiet stream gets a keep-alive.
pub const EVERY: Duration = Duration::from_secs(1);

/// A quiet stream's state: the limit of its silence (None: no limit, as a remote provider's
/// wait for its headers, which its own timeout bounds), when its last byte came, and how many
/// chunks came.
#[derive(Debug, Clone)]
pub struct Quiet {
    limit: Option<Duration>,
    last: Duration,
    chunks: u32,
    /// A keep-alive is due at once (a prefill's first: the client sees the stream begin).
    due: bool,
}

/// What to do when nothing came in the time [`Quiet::wait`] gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Idle {
    /// Keep the connection alive, saying what the backend is doing (`prefill 12 s`).
    KeepAlive(String),
    /// Quiet for its limit: cut the stream as stalled.
    Cut,
}

impl Quiet {
    /// A stream that began at `now` (since any fixed instant), silent at most `limit`.
    pub fn new(limit: Option<Duration>, now: Duration) -> Quiet {
        Quiet { limit, last: now, chunks: 0, due: false }
    }

    /// A stream whose backend has not answered by `now` (its prompt is prefilling): its first
    /// keep-alive goes at once.
    pub fn prefill(limit: Option<Duration>, now: Duration) -> Quiet {
        Quiet { due: true, ..Quiet::new(limit, now) }
    }

    /// The backend answered (its headers came) at `now`, its silence bounded by `limit` from
    /// now on; the chunks still to come tell prefill from generation.
    pub fn answered(&mut self, limit: Duration, now: Duration) {
        (self.limit, self.last) = (Some(limit), now);
    }

    /// A chunk came at `now`.
    pub fn chunk(&mut self, now: Duration) {
        self.chunks += 1;
        self.last = now;
    }

    /// How long to wait from `now` for the next byte before asking [`Quiet::idle`]: the
    /// keep-alive period, or less when the limit comes sooner.
    pub fn wait(&self, now: Duration) -> Duration {
        if self.due {
            return Duration::ZERO;
        }
        let quiet = now.saturating_sub(self.last);
        self.limit.map_or(EVERY, |l| EVERY.min(l.saturating_sub(quiet)))
    }

    /// Nothing came by `now`: cut at the limit, else a keep-alive saying what the backend is
    /// at (llama-server's first chunk is empty, so up to one chunk it is still prefilling).
    pub fn idle(&mut self, now: Duration) -> Idle {
        self.due = false;
        let quiet = now.saturating_sub(self.last);
        if self.limit.is_some_and(|l| quiet >= l) {
            return Idle::Cut;
        }
        let doing = if self.chunks <= 1 { "prefill" } else { "generating" };
        Idle::KeepAlive(format!("{doing} {} s", quiet.as_secs()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_quiet_stream_is_kept_alive_until_its_limit_then_cut() {
        let mut q = Quiet::prefill(Some(s(3)), s(10));
        assert_eq!(q.wait(s(10)), Duration::ZERO, "a prefill's first keep-alive goes at once");
        assert_eq!(q.idle(s(10)), Idle::KeepAlive("prefill 0 s".into()));
        assert_eq!((q.wait(s(10)), q.idle(s(11))), (EVERY, Idle::KeepAlive("prefill 1 s".into())));
        assert_eq!(q.wait(s(12)), s(1));
        assert_eq!(q.wait(Duration::from_millis(12_500)), Duration::from_millis(500), "the limit comes sooner");
        assert_eq!(q.idle(s(13)), Idle::Cut);
        // Answered: the limit counts from the headers; a chunk or two, then generation.
        q.answered(s(5), s(13));
        q.chunk(s(14));
        assert_eq!(q.idle(s(16)), Idle::KeepAlive("prefill 2 s".into()), "llama-server's first chunk is empty");
        q.chunk(s(16));
        assert_eq!(q.idle(s(18)), Idle::KeepAlive("generating 2 s".into()));
        assert_eq!(q.idle(s(21)), Idle::Cut);
        // No limit: kept alive for ever.
        let mut q = Quiet::new(None, s(0));
        assert_eq!((q.wait(s(100)), q.idle(s(100))), (EVERY, Idle::KeepAlive("prefill 100 s".into())));
    }
}
