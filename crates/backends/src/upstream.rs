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

/// One request's attempts at a remote provider, sans-IO: the caller sends, reports each outcome with the time elapsed since the first attempt, waits when
/// told [`Next::Wait`] and stops at [`Next::Done`]. A refused connection, a 502/504 or a 503
/// without `Retry-After` is tried again (nothing reached the client yet) after a back-off of
/// `200 << attempt` ms; backpressure (429, 503 with `Retry-After`) is waited out when the pause
/// is short ([`judge`]). No wait runs past the request's `timeout`.
#[derive(Debug, Clone)]
pub struct Retry {
    attempt: u32,
    attempts: u32,
    timeout: Duration,
}

/// What an attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The connection was refused (nothing was sent).
    Refused,
    /// The upstream answered `status`, with its `Retry-After` read.
    Answered { status: u16, retry_after: Option<Duration> },
}

/// What the caller does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Wait this long, then send again.
    Wait(Duration),
    /// Stop: the last answer is relayed, or the request failed ([`Done`]).
    Done(Done),
}

/// How the attempts ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// Relay the last answer (a success, or a 4xx about the request).
    Relay,
    /// The upstream failed (a 5xx, or the connection refused on the last attempt): 502
    /// naming it.
    Failed,
    /// Its backpressure passed on: 503 with `Retry-After` (seconds).
    Busy(u64),
}

impl Retry {
    /// `attempts` tries (the first counted) within `timeout`.
    pub fn new(attempts: u32, timeout: Duration) -> Retry {
        Retry { attempt: 1, attempts: attempts.max(1), timeout }
    }

    /// The attempt now being made (from 1).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// What is left of the request's time after `elapsed`.
    pub fn left(&self, elapsed: Duration) -> Duration {
        self.timeout.saturating_sub(elapsed)
    }

    /// The current attempt came to `outcome`, `elapsed` after the first began.
    pub fn on(&mut self, outcome: Outcome, elapsed: Duration) -> Next {
        let left = self.left(elapsed);
        let backoff = || Duration::from_millis(200 << self.attempt).min(left);
        let next = match outcome {
            Outcome::Refused if self.attempt < self.attempts => Next::Wait(backoff()),
            Outcome::Refused => Next::Done(Done::Failed),
            Outcome::Answered { status, retry_after } => {
                match judge(status, retry_after, self.attempt, self.attempts, left) {
                    Answer::Relay => Next::Done(Done::Relay),
                    Answer::Failed => Next::Done(Done::Failed),
                    Answer::Busy(secs) => Next::Done(Done::Busy(secs)),
                    Answer::Retry => Next::Wait(backoff()),
                    Answer::RetryAfter(wait) => Next::Wait(wait.min(left)),
                }
            }
        };
        if matches!(next, Next::Wait(_)) {
            self.attempt += 1;
        }
        next
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

/// What an upstream's `/metrics` says of one of its models: the three signals routers and
/// inference gateways read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Signals {
    pub waiting: f64,
    pub running: f64,
    /// KV-cache use, 0 to 1 (None: not exported).
    pub kv: Option<f64>,
}

/// The names the three signals go by: vLLM's and SGLang's (label `model_name`), lemonade's
/// (label `model`): (waiting, running, KV-cache use, the model label).
const NAMES: [(&str, &str, &str, &str); 3] = [
    ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "model_name"),
    ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "model_name"),
    ("lemonade_queue_depth", "lemonade_requests_in_flight", "lemonade_kv_cache_usage_ratio", "model"),
];

/// Where an upstream's metrics are: its API base without the `/v1` (or `/api/v1`) path.
pub fn metrics_url(base: &str) -> String {
    let root = base.trim_end_matches('/');
    let root = root.strip_suffix("/api/v1").or_else(|| root.strip_suffix("/v1")).unwrap_or(root);
    format!("{root}/metrics")
}

/// `model`'s signals in a Prometheus text exposition under vLLM's, SGLang's or lemonade's
/// names (the first of them that has `model`'s waiting and running); None when it has none.
pub fn parse_signals(text: &str, model: &str) -> Option<Signals> {
    let value = |name: &str, label: &str| -> Option<f64> {
        text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, v) = match rest.strip_prefix('{') {
                Some(r) => r.split_once('}')?,
                None => return None,
            };
            let wanted = format!("{label}=\"{model}\"");
            let ok = labels.split(',').any(|kv| kv.trim() == wanted);
            ok.then(|| v.split_whitespace().next()?.parse::<f64>().ok()).flatten()
        })
    };
    NAMES.iter().find_map(|(w, r, kv, label)| {
        Some(Signals { waiting: value(w, label)?, running: value(r, label)?, kv: value(kv, label) })
    })
}

/// The KV-cache use above which an upstream counts as full.
pub const KV_FULL: f64 = 0.9;

/// Whether a place with these signals can take a request now: nothing waiting there and its
/// KV cache not full. Unknown signals (no `/metrics`, or none for the model) count as
/// capacity: the upstream's own answer (its backpressure) decides then.
pub fn has_capacity(s: Option<&Signals>) -> bool {
    s.is_none_or(|s| s.waiting < 1.0 && s.kv.is_none_or(|kv| kv < KV_FULL))
}

/// The signals in words, for the decision's reason.
pub fn describe(s: Option<&Signals>) -> String {
    match s {
        None => "no signals".into(),
        Some(s) => {
            let kv = s.kv.map(|k| format!(", KV cache {:.0}%", k * 100.0)).unwrap_or_default();
            format!("waiting {}, running {}{kv}", s.waiting, s.running)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_machine_backs_off_on_refusals_and_transient_failures_and_stops_at_its_attempts() {
        let ms = Duration::from_millis;
        let mut r = Retry::new(3, Duration::from_secs(10));
        assert_eq!(r.on(Outcome::Refused, ms(0)), Next::Wait(ms(400)));
        assert_eq!(r.attempt(), 2);
        let bad = Outcome::Answered { status: 502, retry_after: None };
        assert_eq!(r.on(bad, ms(500)), Next::Wait(ms(800)));
        // The third attempt is the last: a 502 then is the upstream's failure.
        assert_eq!(r.on(bad, ms(1400)), Next::Done(Done::Failed));
        let mut r = Retry::new(2, Duration::from_secs(10));
        assert_eq!(r.on(Outcome::Refused, ms(0)), Next::Wait(ms(400)));
        assert_eq!(r.on(Outcome::Refused, ms(500)), Next::Done(Done::Failed));
    }

    #[test]
    fn the_retry_machine_waits_out_short_backpressure_relays_answers_and_never_waits_past_its_time() {
        let ms = Duration::from_millis;
        let busy = |s| Outcome::Answered { status: 429, retry_after: Some(Duration::from_secs(s)) };
        let mut r = Retry::new(3, Duration::from_secs(10));
        assert_eq!(r.on(busy(2), ms(0)), Next::Wait(Duration::from_secs(2)));
        // Past the longest wait lemonade takes on itself: passed on as a 503.
        assert_eq!(r.on(busy(30), ms(2100)), Next::Done(Done::Busy(30)));
        let mut r = Retry::new(3, Duration::from_secs(1));
        assert_eq!(r.on(Outcome::Answered { status: 504, retry_after: None }, ms(900)), Next::Wait(ms(100)));
        let ok = Outcome::Answered { status: 200, retry_after: None };
        assert_eq!(r.on(ok, ms(950)), Next::Done(Done::Relay));
        assert_eq!(r.on(Outcome::Answered { status: 404, retry_after: None }, ms(0)), Next::Done(Done::Relay));
        assert_eq!(r.left(ms(1500)), Duration::ZERO);
    }

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

    #[test]
    fn signals_are_read_under_vllm_sglang_and_lemonade_names_for_the_model_asked() {
        let vllm = "# HELP vllm:num_requests_waiting x\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 3.0\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 8.0\n\
            vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 0.95\n";
        let s = parse_signals(vllm, "Qwen/Qwen3-8B").unwrap();
        assert_eq!(s, Signals { waiting: 3.0, running: 8.0, kv: Some(0.95) });
        assert!(!has_capacity(Some(&s)));
        assert_eq!(parse_signals(vllm, "other"), None);
        let sglang = "sglang:num_queue_reqs{model_name=\"m\"} 0\nsglang:num_running_reqs{model_name=\"m\"} 2\n";
        let s = parse_signals(sglang, "m").unwrap();
        assert_eq!((s.waiting, s.running, s.kv), (0.0, 2.0, None));
        assert!(has_capacity(Some(&s)));
        let lemonade = "lemonade_queue_depth{model=\"x.gguf\"} 0\nlemonade_requests_in_flight{model=\"x.gguf\"} 1\n\
            lemonade_kv_cache_usage_ratio{model=\"x.gguf\"} 0.5\n";
        assert_eq!(parse_signals(lemonade, "x.gguf"), Some(Signals { waiting: 0.0, running: 1.0, kv: Some(0.5) }));
        assert!(has_capacity(None), "no signals: its own answer decides");
        assert!(!has_capacity(Some(&Signals { waiting: 0.0, running: 1.0, kv: Some(0.93) })));
        assert_eq!(
            describe(Some(&Signals { waiting: 2.0, running: 1.0, kv: Some(0.5) })),
            "waiting 2, running 1, KV cache 50%"
        );
    }

    #[test]
    fn metrics_live_at_the_root_of_the_api_base() {
        assert_eq!(metrics_url("http://10.0.0.5:8000/v1"), "http://10.0.0.5:8000/metrics");
        assert_eq!(metrics_url("http://peer:8000/api/v1/"), "http://peer:8000/metrics");
        assert_eq!(metrics_url("https://gw.example/openai"), "https://gw.example/openai/metrics");
    }
}
