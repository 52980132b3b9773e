//! The catalogue: the sole owner of the model registry. Every change to what is registered
//! (a `user.*` registration, saved options, a deletion) and every rescan goes through it, one
//! at a time, so a rescan can never publish an older picture of the disk over a newer one.
//!
//! Invariant: the published registry only moves forward. A reload scans and publishes while it
//! holds the one writer lock, and a mutation writes its file and rescans under that same lock;
//! readers take the published `Arc<Registry>` without waiting.
//!
//! The first scan can run after the server listens ([`Catalogue::start`]): lemonade's own files
//! are checked at once (a damaged one still stops the start), the model files are scanned in
//! the background, and whoever needs the registry before that awaits it
//! ([`Catalogue::scanned`]; the server holds every request there). `registry()` never blocks:
//! before the first scan it is the empty registry. GGUF headers are kept
//! by (path, size, mtime), so a rescan reads only the files that changed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use host::catalogue::{CatalogueConfig, HeaderCache};
use registry::{CatalogueEntry, ModelInfo, Registry, USER_PREFIX};
use serde_json::{Map, Value};

use crate::error::{EngineError, Result};

/// Reads the registry from disk (the real one is `host::catalogue::load`; tests inject theirs).
pub type Scanner = Box<dyn Fn(&CatalogueConfig) -> Result<Registry, host::HostError> + Send + Sync>;

pub struct Catalogue {
    /// Where to scan; the extra models dir changes at run time (`POST /internal/set`).
    cfg: RwLock<CatalogueConfig>,
    scan: Scanner,
    current: RwLock<Arc<Registry>>,
    /// Held while a scan runs and until it is published; mutations hold it around their write.
    writer: Mutex<()>,
    /// How many scans were published (the first, at start, is 1).
    generation: AtomicU64,
    /// Whether the first scan has been published; waiters await `ready`.
    scanned: AtomicBool,
    ready: tokio::sync::watch::Sender<bool>,
    /// The real scanner's header facts (None for an injected scanner).
    headers: Option<Arc<HeaderCache>>,
}

impl Catalogue {
    /// Scans the disk now, with the real scanner.
    pub fn load(cfg: CatalogueConfig) -> Result<Catalogue> {
        let (scan, headers) = real_scanner();
        let c = Catalogue::unscanned(cfg, scan, Some(headers));
        c.first_scan()?;
        Ok(c)
    }

    /// A catalogue whose scans are `scan`'s (the first one now).
    pub fn with_scanner(cfg: CatalogueConfig, scan: Scanner) -> Result<Catalogue> {
        let c = Catalogue::unscanned(cfg, scan, None);
        c.first_scan()?;
        Ok(c)
    }

    /// The real catalogue with its first scan running in the background: lemonade's own files
    /// are checked now (a damaged one is an error here), the model files after this returns.
    pub fn start(cfg: CatalogueConfig) -> Result<Arc<Catalogue>> {
        host::catalogue::check_files(&cfg)?;
        let (scan, headers) = real_scanner();
        Catalogue::start_with(Catalogue::unscanned(cfg, scan, Some(headers)))
    }

    fn start_with(c: Catalogue) -> Result<Arc<Catalogue>> {
        let c = Arc::new(c);
        let bg = c.clone();
        std::thread::Builder::new()
            .name("catalogue-scan".into())
            .spawn(move || {
                if let Err(e) = bg.first_scan() {
                    // Nothing waits forever: the catalogue is empty until a rescan succeeds.
                    tracing::error!(error = %e, "cannot read the model catalogue");
                    bg.mark_scanned();
                }
            })
            .map_err(|e| EngineError::Internal(format!("cannot start the catalogue scan: {e}")))?;
        Ok(c)
    }

    fn unscanned(cfg: CatalogueConfig, scan: Scanner, headers: Option<Arc<HeaderCache>>) -> Catalogue {
        Catalogue {
            cfg: RwLock::new(cfg),
            scan,
            current: RwLock::new(Arc::new(Registry::default())),
            writer: Mutex::new(()),
            generation: AtomicU64::new(0),
            scanned: AtomicBool::new(false),
            ready: tokio::sync::watch::channel(false).0,
            headers,
        }
    }

    fn first_scan(&self) -> Result<()> {
        let t = Instant::now();
        let r = self.reload_now();
        if r.is_ok() {
            let reads = self.headers.as_ref().map_or(0, |h| h.reads());
            let models = self.current.read().models().count();
            let ms = t.elapsed().as_millis() as u64;
            tracing::info!(models, ms, gguf_headers_read = reads, "model catalogue scanned");
            self.mark_scanned();
        }
        r
    }

    fn mark_scanned(&self) {
        self.scanned.store(true, Ordering::SeqCst);
        self.ready.send_replace(true);
    }

    /// Resolves once the first scan is published (at once afterwards).
    pub async fn scanned(&self) {
        if self.scanned.load(Ordering::SeqCst) {
            return;
        }
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// GGUF headers read from disk so far (None: an injected scanner).
    pub fn header_reads(&self) -> Option<u64> {
        self.headers.as_ref().map(|h| h.reads())
    }

    pub fn config(&self) -> CatalogueConfig {
        self.cfg.read().clone()
    }

    fn cache_dir(&self) -> std::path::PathBuf {
        self.cfg.read().cache_dir.clone()
    }

    /// Runs `f` (a mutation: a file write and a rescan under the writer lock) off the async
    /// threads. Every mutation the engine calls from async code goes through here, so a slow
    /// disk or a long rescan never stalls a runtime thread.
    async fn off_thread<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Catalogue) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let me = self.clone();
        host::offload::offload(move || f(&me))
            .await
            .map_err(|e| EngineError::Internal(format!("a catalogue change did not run: {e}")))?
    }

    /// Scans `dir` as the extra models dir from now on (None: none), and publishes the scan
    /// before it returns.
    pub async fn set_extra_models_dir(self: &Arc<Self>, dir: Option<std::path::PathBuf>) -> Result<()> {
        self.off_thread(move |c| c.set_extra_models_dir_now(dir)).await
    }

    fn set_extra_models_dir_now(&self, dir: Option<std::path::PathBuf>) -> Result<()> {
        let _one = self.writer.lock();
        self.cfg.write().extra_models_dir = dir;
        self.rescan()
    }

    /// The registry as last published, at once (empty before the first scan: await
    /// [`Catalogue::scanned`] first where that matters).
    pub fn registry(&self) -> Arc<Registry> {
        self.current.read().clone()
    }

    /// How many scans have been published.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The model `name`, as last published.
    pub fn get(&self, name: &str) -> Result<ModelInfo> {
        Ok(self.registry().get(name)?.clone())
    }

    /// Reads the disk again (after files changed) and publishes what it found.
    pub async fn reload(self: &Arc<Self>) -> Result<()> {
        #[cfg(feature = "testing")]
        if crate::mutation::on(crate::mutation::Mutation::ReloadPublishedUnlocked) {
            return self.reload_unlocked().await;
        }
        self.off_thread(|c| c.reload_now()).await
    }

    /// The past bug: a scan outside the writer lock, published when it finished (a slow disk:
    /// 50 ms), over whatever was published meanwhile.
    #[cfg(feature = "testing")]
    async fn reload_unlocked(self: &Arc<Self>) -> Result<()> {
        let reg = self.off_thread(|c| (c.scan)(&c.config()).map_err(EngineError::from)).await?;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        *self.current.write() = Arc::new(reg);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn reload_now(&self) -> Result<()> {
        let _one = self.writer.lock();
        self.rescan()
    }

    /// Scans and publishes; the caller holds `writer`.
    fn rescan(&self) -> Result<()> {
        let (t, reads) = (Instant::now(), self.header_reads());
        let cfg = self.config();
        let reg = (self.scan)(&cfg)?;
        let models = reg.models().count();
        *self.current.write() = Arc::new(reg);
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let read = self.header_reads().zip(reads).map(|(now, before)| now - before);
        let us = t.elapsed().as_micros() as u64;
        tracing::debug!(generation, models, us, gguf_headers_read = ?read, "model catalogue rescanned");
        Ok(())
    }

    /// `change` (a write to lemonade's files), then a rescan, as one step: no other change or
    /// scan runs in between.
    fn mutate(&self, change: impl FnOnce() -> Result<(), host::HostError>) -> Result<()> {
        let _one = self.writer.lock();
        change()?;
        self.rescan()
    }

    /// Registers (or re-registers) the `user.*` model `name` with `entry`; returns it as the
    /// catalogue now sees it.
    pub async fn register(self: &Arc<Self>, name: &str, entry: &CatalogueEntry) -> Result<ModelInfo> {
        let (name, entry) = (name.to_string(), entry.clone());
        self.off_thread(move |c| c.register_now(&name, &entry)).await
    }

    fn register_now(&self, name: &str, entry: &CatalogueEntry) -> Result<ModelInfo> {
        self.save_user(name, entry)?;
        self.get(name)
    }

    /// Writes `user.*` `name`'s entry to `user_models.json` and rescans.
    fn save_user(&self, name: &str, entry: &CatalogueEntry) -> Result<()> {
        let key = name
            .strip_prefix(USER_PREFIX)
            .ok_or_else(|| EngineError::invalid(format!("'{name}' is not a user.* model"), Some("model")))?;
        self.mutate(|| host::files::save_user_model(&self.cache_dir(), key, Some(entry)))
    }

    /// Registers (or replaces) the collection `name` with `entry`.
    pub async fn register_collection(self: &Arc<Self>, name: &str, entry: &CatalogueEntry) -> Result<()> {
        let (name, entry) = (name.to_string(), entry.clone());
        self.off_thread(move |c| c.register_collection_now(&name, &entry)).await
    }

    fn register_collection_now(&self, name: &str, entry: &CatalogueEntry) -> Result<()> {
        self.save_user(name, entry)?;
        match self.registry().collection(name) {
            Some(_) => Ok(()),
            None => Err(EngineError::Internal(format!("collection '{name}' was saved but does not read back"))),
        }
    }

    /// Forgets a `user.*` registration (its files are the caller's to remove).
    pub async fn unregister(self: &Arc<Self>, name: &str) -> Result<()> {
        let name = name.to_string();
        self.off_thread(move |c| c.unregister_now(&name)).await
    }

    fn unregister_now(&self, name: &str) -> Result<()> {
        let Some(key) = name.strip_prefix(USER_PREFIX) else { return self.reload_now() };
        self.mutate(|| host::files::save_user_model(&self.cache_dir(), key, None))
    }

    /// Points `alias` at `target` (None: removes it), a parameter variant when `params` is given.
    /// An alias may not take a model's name, nor a reserved prefix; its target need not exist
    /// yet. Returns whether the alias existed.
    pub async fn set_alias(
        self: &Arc<Self>,
        alias: &str,
        target: Option<&str>,
        params: Option<&api_types::AliasParams>,
    ) -> Result<bool> {
        let (alias, target, params) = (alias.to_string(), target.map(str::to_string), params.cloned());
        self.off_thread(move |c| c.set_alias_now(&alias, target.as_deref(), params.as_ref())).await
    }

    fn set_alias_now(
        &self,
        alias: &str,
        target: Option<&str>,
        params: Option<&api_types::AliasParams>,
    ) -> Result<bool> {
        let _one = self.writer.lock();
        let reg = self.current.read().clone();
        let existed = reg.aliases().any(|(a, _)| a == alias);
        if let Some(t) = target {
            registry::validate_alias(alias).map_err(|e| EngineError::invalid(e.to_string(), Some("alias")))?;
            if reg.is_model_name(alias) {
                return Err(EngineError::invalid_code(
                    format!("'{alias}' is the name of a model; an alias cannot take it"),
                    "alias",
                    "alias_conflict",
                ));
            }
            if t.trim().is_empty() || t.chars().any(char::is_control) {
                return Err(EngineError::invalid("target must name a model", Some("target")));
            }
        } else if !existed {
            return Ok(false);
        }
        host::files::save_alias_params(&self.cache_dir(), alias, params.filter(|_| target.is_some()))?;
        host::files::save_alias(&self.cache_dir(), alias, target)?;
        self.rescan()?;
        Ok(existed)
    }

    /// Replaces `name`'s entry in `recipe_options.json` with what `change` makes of it as
    /// written (None: removes it). Read, change and write are one step: two changes never
    /// lose each other's keys.
    pub async fn update_options(
        self: &Arc<Self>,
        name: &str,
        change: impl FnOnce(Map<String, Value>) -> Option<Map<String, Value>> + Send + 'static,
    ) -> Result<()> {
        let name = name.to_string();
        self.off_thread(move |c| c.update_options_now(&name, change)).await
    }

    fn update_options_now(
        &self,
        name: &str,
        change: impl FnOnce(Map<String, Value>) -> Option<Map<String, Value>>,
    ) -> Result<()> {
        self.mutate(|| {
            let entry = change(self.current.read().saved_entry(name));
            host::files::save_recipe_options(&self.cache_dir(), name, entry.as_ref())
        })
    }
}

/// `host::catalogue::load_with` over a header cache that lives as long as the catalogue.
fn real_scanner() -> (Scanner, Arc<HeaderCache>) {
    let headers = Arc::new(HeaderCache::default());
    let h = headers.clone();
    (Box::new(move |cfg: &CatalogueConfig| host::catalogue::load_with(cfg, Some(&h))), headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn cfg() -> CatalogueConfig {
        CatalogueConfig {
            cache_dir: "/nonexistent/lemonade".into(),
            hf_cache: "/nonexistent/hub".into(),
            extra_models_dir: None,
            physical_memory_gb: None,
            disable_filtering: true,
        }
    }

    /// Two reloads that overlap: the first scan is slow and sees the disk as it was before the
    /// second began. Whatever the timing, the registry published last is the newer scan's.
    #[test]
    fn two_overlapping_reloads_publish_the_newer_scan_last() {
        // Each scan records which disk state ("generation of the files") it saw.
        let disk = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(Mutex::new(Vec::<u64>::new()));
        let (entered_tx, entered_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (entered_tx, go_rx) = (Mutex::new(entered_tx), Mutex::new(go_rx));
        let (d, s) = (disk.clone(), seen.clone());
        let scan: Scanner = Box::new(move |_| {
            let state = d.load(Ordering::SeqCst);
            s.lock().push(state);
            if state == 1 {
                // The first reload after the change: hold it here until told.
                let _ = entered_tx.lock().send(());
                let _ = go_rx.lock().recv_timeout(Duration::from_secs(10));
            }
            Ok(crate::testing::registry_with_user_model(&format!("disk-{state}")))
        });
        let cat = Arc::new(Catalogue::with_scanner(cfg(), scan).unwrap());
        disk.store(1, Ordering::SeqCst);
        let a = {
            let cat = cat.clone();
            std::thread::spawn(move || cat.reload_now().unwrap())
        };
        entered_rx.recv_timeout(Duration::from_secs(10)).expect("the first reload scans");
        // The disk changes again while the first scan runs; a second reload starts.
        disk.store(2, Ordering::SeqCst);
        let b = {
            let cat = cat.clone();
            std::thread::spawn(move || cat.reload_now().unwrap())
        };
        // The second reload must not scan while the first holds the writer: watched for 100 ms
        // (without the lock it scans at once, sees disk 2 and publishes before the first).
        let until = std::time::Instant::now() + Duration::from_millis(100);
        while std::time::Instant::now() < until {
            assert_eq!(*seen.lock(), vec![0, 1], "the second scan waits for the first to publish");
            std::thread::yield_now();
        }
        go_tx.send(()).unwrap();
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(*seen.lock(), vec![0, 1, 2]);
        let reg = cat.registry();
        assert!(reg.get("user.disk-2").is_ok(), "the newer scan is the one published");
        assert!(reg.get("user.disk-1").is_err());
        assert_eq!(cat.generation(), 3);
    }

    /// Started in the background, the catalogue makes `scanned()` wait for its first scan,
    /// while `registry()` never blocks: it answers the empty registry until the scan is
    /// published, then the scan.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn before_its_first_scan_the_catalogue_makes_awaiters_wait_and_readers_see_it_empty() {
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let go_rx = Mutex::new(go_rx);
        let scan: Scanner = Box::new(move |_| {
            let _ = go_rx.lock().recv_timeout(Duration::from_secs(10));
            Ok(crate::testing::registry_with_user_model("scanned"))
        });
        let cat = Catalogue::start_with(Catalogue::unscanned(cfg(), scan, None)).unwrap();
        let waiter = {
            let cat = cat.clone();
            tokio::spawn(async move { cat.scanned().await })
        };
        assert!(cat.registry().get("user.scanned").is_err(), "a reader is answered at once, before the scan");
        // Watched for 100 ms: the waiter gets no answer while the scan runs.
        let until = std::time::Instant::now() + Duration::from_millis(100);
        while std::time::Instant::now() < until {
            assert!(!waiter.is_finished(), "scanned() answered before the first scan");
            tokio::task::yield_now().await;
        }
        go_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
        assert!(cat.registry().get("user.scanned").is_ok(), "once scanned() resolves, readers see the scan");
        assert_eq!(cat.generation(), 1);
    }
}
