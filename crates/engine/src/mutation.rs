//! Bugs this project has had, put back on demand (testing builds only), so the simulation can
//! show it finds each (`cargo xtask sim --mutate NAME`). The release binary has no such switch:
//! every site is `#[cfg(feature = "testing")]`.

use std::cell::Cell;

/// A bug to put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// A request whose client hangs up while it waits for its model (a load) is not cancelled,
    /// and the grant nobody receives is not given back: the slot stays held by nobody (the
    /// leak as it was before the wait guard and the undelivered-grant release).
    HungUpWaitKept,
    /// `config.json` is written in place, not to a temp file renamed over it: a kill in the
    /// middle of the write leaves a torn file.
    ConfigWrittenInPlace,
    /// A start that finishes after shutdown began registers its backend, which then outlives
    /// the shutdown (found by the simulation and fixed; a regression seed of crates/sim).
    StartAfterShutdown,
    /// Spillover decides on the view as last published, without waiting for the owner to take
    /// the releases sent before the request: a client's next request, sent as its answer
    /// arrives, is spilled by the request that just ended (the race CI hit once in 20 runs).
    SpillWithoutSettle,
    /// A catalogue reload scans outside the writer lock and publishes its scan when it ends:
    /// two overlapping changes publish the older picture of the disk last (a registration
    /// that returned is gone from the registry until the next rescan).
    ReloadPublishedUnlocked,
    /// The prompt cache's key leaves out the load's options: a model loaded with another
    /// context size is given the state its other load saved.
    CacheKeyWithoutOptions,
}

thread_local! {
    static ON: Cell<Option<Mutation>> = const { Cell::new(None) };
}

/// Puts `m` back on this thread (the simulation's single-threaded runtime), or none.
pub fn set(m: Option<Mutation>) {
    ON.with(|c| c.set(m));
}

/// Whether `m` is put back on this thread.
pub fn on(m: Mutation) -> bool {
    ON.with(|c| c.get()) == Some(m)
}
