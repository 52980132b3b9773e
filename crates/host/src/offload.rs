//! Blocking work (file writes, rescans, hashing) run off the async threads, on tokio's blocking
//! pool, and the wall clock where what it says decides something ([`unix_ms`]). Every such call of the engine and of host's downloader goes through [`offload`], so
//! that the engine's simulation (crates/sim) can run it on the calling thread instead: a seed's
//! run must not depend on how fast another thread ran. The switch exists only with host's
//! `faults` feature (the simulation's); the release binary always offloads.

/// Why offloaded work gave no result: it panicked, or the runtime was shutting down.
#[derive(Debug, thiserror::Error)]
#[error("the blocking work did not finish: {0}")]
pub struct NotDone(#[from] tokio::task::JoinError);

/// Runs `f` on tokio's blocking pool (in the simulation, here and now) and returns its result.
pub async fn offload<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, NotDone> {
    if inline() {
        return Ok(f());
    }
    Ok(tokio::task::spawn_blocking(f).await?)
}

/// [`offload`] for file work: its failure and the work's not finishing are one `io::Error`.
pub async fn offload_io<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    offload(f).await.unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// Whether blocking work runs on the calling thread (the simulation's runtime thread).
pub fn inline() -> bool {
    #[cfg(feature = "faults")]
    return INLINE.with(|c| c.get());
    #[cfg(not(feature = "faults"))]
    false
}

#[cfg(feature = "faults")]
thread_local! {
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs blocking work on this thread from now on (`true`), as the simulation's single-threaded
/// runtime needs, or offloads it again.
#[cfg(feature = "faults")]
pub fn run_inline(on: bool) {
    INLINE.with(|c| c.set(on));
}

/// Milliseconds since the Unix epoch: the wall clock, or in the simulation the simulated one
/// (a run's start plus tokio's paused time), so that what is named and ordered by the time (the
/// prompt cache's files) replays.
pub fn unix_ms() -> u64 {
    #[cfg(feature = "faults")]
    if let Some((start, at)) = SIMULATED.with(|c| c.get()) {
        return at + start.elapsed().as_millis() as u64;
    }
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(feature = "faults")]
thread_local! {
    static SIMULATED: std::cell::Cell<Option<(tokio::time::Instant, u64)>> = const { std::cell::Cell::new(None) };
}

/// [`unix_ms`] reads `at` now, and tokio's clock from here on (None: the wall clock again).
#[cfg(feature = "faults")]
pub fn simulate_clock(at: Option<u64>) {
    SIMULATED.with(|c| c.set(at.map(|ms| (tokio::time::Instant::now(), ms))));
}
