//! How lemonade treats a remote upstream (a vLLM, SGLang or lemonade node, a cloud provider)
//! as a good citizen, decided without I/O: its `Retry-After` backpressure, a circuit breaker
//! per upstream, and its in-flight bound. Time is passed in (ms on the caller's clock), as in
//! the scheduler, so every rule is tested without waiting.

use std::time::Duration;

/// `Retry-After` as an upstream sends it: seconds (`120`) or an HTTP date, given `now` (Unix
/// seconds). None when absent or unreadable; a date in the past is 0.
pub fn retry_after(value: Option<&str>, now_unix: u64) -> Option<Duration> {
    let v = value?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let at = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now_unix)))
}

/// What to do with an upstream's answer before anything reached the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Relay it (a success, or a 4xx about the request).
    Relay,
    /// Backpressure (429, or 503 with `Retry-After`): try again after the pause, which fits
    /// in what is left of the request's time.
    RetryAfter(Duration),
    /// Backpressure whose pause does not fit, or the attempts are spent: answer 503 with
    /// `Retry-After` (whole seconds, at least 1), never 502.
    Busy(u64),
    /// A transient failure (502, 504, a 503 without `Retry-After`): try again.
    Retry,
    /// The upstream failed: 502 naming it.
    Failed,
}

/// The longest `Retry-After` lemonade waits out itself before passing the backpressure on.
pub const MAX_RETRY_AFTER_WAIT: Duration = Duration::from_secs(5);

/// Decides on an upstream answer of `status` (with its `Retry-After`), on attempt `attempt`
/// of `attempts`, with `left` of the request's time.
pub fn judge(status: u16, retry_after: Option<Duration>, attempt: u32, attempts: u32, left: Duration) -> Answer {
    let more = attempt < attempts;
    match (status, retry_after) {
        (429, _) | (503, Some(_)) => {
            let pause = retry_after.unwrap_or(Duration::from_secs(1));
            if more && pause <= MAX_RETRY_AFTER_WAIT && pause < left {
                Answer::RetryAfter(pause)
            } else {
                Answer::Busy(pause.as_secs_f64().ceil().max(1.0) as u64)
            }
        }
        (502..=504, _) if more => Answer::Retry,
        (500..=599, _) => Answer::Failed,
        _ => Answer::Relay,
    }
}

/// A circuit breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Failures in a row that open it.
    pub failures: u32,
    /// How long it stays open before one request may probe the upstream (ms).
    pub open_ms: u64,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings { failures: 5, open_ms: 30_000 }
    }
}

/// Where a breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests go through; `failures` in a row so far.
    Closed { failures: u32 },
    /// Requests are refused until `until` (ms).
    Open { until: u64 },
    /// One request is probing the upstream; the others are refused until it answers.
    HalfOpen,
}

/// A per-upstream circuit breaker: open after `failures` consecutive failures, for `open_ms`;
/// then half-open, one probe at a time; the probe's success closes it, its failure opens it
/// again. A request refused while open never reaches the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breaker {
    pub settings: BreakerSettings,
    pub state: BreakerState,
    /// Times it opened.
    pub opened: u64,
}

impl Breaker {
    pub fn new(settings: BreakerSettings) -> Breaker {
        Breaker { settings, state: BreakerState::Closed { failures: 0 }, opened: 0 }
    }

    /// May a request go to the upstream at `now`? Err: refused, with the ms until it may
    /// try again (0: a probe is already out).
    pub fn admit(&mut self, now: u64) -> Result<(), u64> {
        match self.state {
            BreakerState::Closed { .. } => Ok(()),
            BreakerState::Open { until } if now >= until => {
                self.state = BreakerState::HalfOpen;
                Ok(())
            }
            BreakerState::Open { until } => Err(until - now),
            BreakerState::HalfOpen => Err(0),
        }
    }

    /// The upstream answered (anything but a failure: backpressure is an answer).
    pub fn success(&mut self) {
        self.state = BreakerState::Closed { failures: 0 };
    }

    /// The upstream failed (no connection, a timeout, a 5xx that is not backpressure).
    pub fn failure(&mut self, now: u64) {
        let failures = match self.state {
            BreakerState::Closed { failures } => failures + 1,
            BreakerState::HalfOpen => self.settings.failures,
            BreakerState::Open { .. } => return,
        };
        self.state = if failures >= self.settings.failures {
            self.opened += 1;
            BreakerState::Open { until: now + self.settings.open_ms }
        } else {
            BreakerState::Closed { failures }
        };
    }

    /// A request admitted as the probe went away without an answer (the client left).
    pub fn abandoned(&mut self, now: u64) {
        if self.state == BreakerState::HalfOpen {
            self.state = BreakerState::Open { until: now };
        }
    }

    /// `closed`, `open` or `half-open`, as `health` shows it.
    pub fn name(&self) -> &'static str {
        match self.state {
            BreakerState::Closed { .. } => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen => "half-open",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        assert_eq!(retry_after(Some("7"), 0), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(Some(" 0 "), 0), Some(Duration::ZERO));
        // Sun, 06 Nov 1994 08:49:37 GMT is 784111777.
        assert_eq!(retry_after(Some("Sun, 06 Nov 1994 08:49:37 GMT"), 784_111_770), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(Some("Sun, 06 Nov 1994 08:49:37 GMT"), 784_111_999), Some(Duration::ZERO));
        assert_eq!(retry_after(Some("soon"), 0), None);
        assert_eq!(retry_after(None, 0), None);
    }

    #[test]
    fn backpressure_is_waited_out_when_it_fits_else_passed_on_as_busy_never_failed() {
        let s = Duration::from_secs;
        assert_eq!(judge(429, Some(s(1)), 1, 3, s(300)), Answer::RetryAfter(s(1)));
        assert_eq!(judge(503, Some(s(2)), 1, 3, s(300)), Answer::RetryAfter(s(2)));
        assert_eq!(judge(429, None, 1, 3, s(300)), Answer::RetryAfter(s(1)));
        // Too long to wait, no time left, or no attempt left: 503 with the upstream's pause.
        assert_eq!(judge(429, Some(s(60)), 1, 3, s(300)), Answer::Busy(60));
        assert_eq!(judge(503, Some(s(2)), 1, 3, s(1)), Answer::Busy(2));
        assert_eq!(judge(503, Some(s(2)), 3, 3, s(300)), Answer::Busy(2));
        assert_eq!(judge(429, Some(Duration::ZERO), 3, 3, s(300)), Answer::Busy(1));
        // A 503 without Retry-After is a transient failure; 500 is the upstream's failure.
        assert_eq!(judge(503, None, 1, 3, s(300)), Answer::Retry);
        assert_eq!(judge(503, None, 3, 3, s(300)), Answer::Failed);
        assert_eq!(judge(500, None, 1, 3, s(300)), Answer::Failed);
        assert_eq!(judge(200, None, 1, 3, s(300)), Answer::Relay);
        assert_eq!(judge(400, Some(s(1)), 1, 3, s(300)), Answer::Relay);
    }

    #[test]
    fn the_breaker_opens_after_failures_in_a_row_probes_once_half_open_and_closes_on_success() {
        let mut b = Breaker::new(BreakerSettings { failures: 3, open_ms: 1000 });
        b.failure(0);
        b.failure(1);
        b.success(); // the count is of failures in a row
        b.failure(2);
        b.failure(3);
        assert_eq!(b.admit(4), Ok(()));
        b.failure(4);
        assert_eq!(b.state, BreakerState::Open { until: 1004 });
        assert_eq!((b.name(), b.opened), ("open", 1));
        assert_eq!(b.admit(500), Err(504));
        // Once the pause is over, one probe goes; the others wait for its answer.
        assert_eq!(b.admit(1004), Ok(()));
        assert_eq!(b.name(), "half-open");
        assert_eq!(b.admit(1005), Err(0));
        // The probe fails: open again at once, for the whole pause.
        b.failure(1100);
        assert_eq!(b.state, BreakerState::Open { until: 2100 });
        assert_eq!(b.opened, 2);
        assert_eq!(b.admit(2100), Ok(()));
        b.success();
        assert_eq!(b.state, BreakerState::Closed { failures: 0 });
        assert_eq!(b.admit(2101), Ok(()));
        // A probe whose client left lets the next request probe.
        let mut b = Breaker::new(BreakerSettings { failures: 1, open_ms: 10 });
        b.failure(0);
        assert_eq!(b.admit(10), Ok(()));
        b.abandoned(12);
        assert_eq!(b.admit(12), Ok(()));
    }
}
