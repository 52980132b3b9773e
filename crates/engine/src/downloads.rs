//! Server-owned download jobs (Lemonade v11's `POST /v1/pull` with `subscribe: false`,
//! `GET /v1/downloads`, `POST /v1/downloads/control`): their state; `crate::jobs` runs them. A job's download outlives the request
//! that started it; pausing or cancelling stops it at once and keeps its partial files, so a
//! resume continues with `Range`. The jobs are kept in `<cache>/downloads.json` on every
//! change of state (and every few seconds of progress): after a restart an unfinished job is
//! listed as paused.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use api_types::DownloadJob;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::progress::PullEvent;

/// The file, in lemonade's cache dir.
pub const DOWNLOADS_FILE: &str = "downloads.json";
/// A completed job stays listed this long, so clients see it complete.
pub const COMPLETED_KEPT: Duration = Duration::from_secs(60);
/// Progress is written to the file at most this often (state changes at once).
const SAVE_EVERY: Duration = Duration::from_secs(2);

/// What stops a running job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Run,
    Pause,
    Cancel,
}

pub(crate) struct Job {
    pub(crate) snap: DownloadJob,
    /// Set while its worker runs.
    pub(crate) stop: Option<watch::Sender<Stop>>,
    /// Its worker, while it runs (a shutdown waits for it to save the job paused).
    pub(crate) task: Option<tokio::task::JoinHandle<()>>,
    pub(crate) completed_at: Option<Instant>,
}

/// Every job, by id.
pub struct Downloads {
    path: PathBuf,
    pub(crate) jobs: Mutex<BTreeMap<String, Job>>,
    saved: Mutex<Option<Instant>>,
}

pub(crate) fn id_of(model: &str) -> String {
    format!("model:{model}")
}

impl Downloads {
    /// The jobs kept in `<cache_dir>/downloads.json`; one that was running when lemonade
    /// stopped is paused now. An unreadable file is logged and left alone (never rewritten
    /// until a job changes).
    pub fn open(cache_dir: &std::path::Path) -> Downloads {
        let path = cache_dir.join(DOWNLOADS_FILE);
        let kept: BTreeMap<String, DownloadJob> = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::error!(path = %path.display(), error = %e, "download jobs not read");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        let jobs = kept
            .into_iter()
            .filter(|(_, j)| j.status != "completed")
            .map(|(id, mut snap)| {
                snap.running = false;
                snap.rate_bytes_per_s = 0;
                if snap.status == "downloading" {
                    snap.status = "paused".into();
                }
                (id, Job { snap, stop: None, task: None, completed_at: None })
            })
            .collect();
        Downloads { path, jobs: Mutex::new(jobs), saved: Mutex::new(None) }
    }

    /// Every job, oldest id first; completed ones only for [`COMPLETED_KEPT`].
    pub fn list(&self) -> Vec<DownloadJob> {
        let mut jobs = self.jobs.lock();
        jobs.retain(|_, j| j.completed_at.is_none_or(|t| t.elapsed() < COMPLETED_KEPT));
        jobs.values().map(|j| j.snap.clone()).collect()
    }

    pub fn get(&self, id: &str) -> Option<DownloadJob> {
        self.jobs.lock().get(id).map(|j| j.snap.clone())
    }

    pub(crate) fn save(&self, force: bool) {
        {
            let mut last = self.saved.lock();
            if !force && last.is_some_and(|t| t.elapsed() < SAVE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let all: BTreeMap<String, DownloadJob> =
            self.jobs.lock().iter().map(|(id, j)| (id.clone(), j.snap.clone())).collect();
        let bytes = serde_json::to_vec_pretty(&all).expect("jobs serialize");
        if let Err(e) = host::files::write_atomic(&self.path, &bytes) {
            tracing::warn!(path = %self.path.display(), error = %e, "download jobs not saved");
        }
    }

    /// Resolves once every job's worker has ended (at shutdown each pauses itself and is
    /// saved so: `crate::jobs`).
    pub async fn stopped(&self) {
        let tasks: Vec<_> = self.jobs.lock().values_mut().filter_map(|j| j.task.take()).collect();
        for t in tasks {
            let _ = t.await;
        }
    }

    pub(crate) fn update(&self, id: &str, f: impl FnOnce(&mut Job)) {
        if let Some(j) = self.jobs.lock().get_mut(id) {
            f(j);
        }
    }
}

/// Folds one event of the download into the job's snapshot.
pub(crate) fn apply(s: &mut DownloadJob, ev: &PullEvent, started: Instant, run_start: u64) {
    match ev {
        PullEvent::Progress { file, index, total, done, size } => {
            if *index != s.file_index {
                s.bytes_previously_downloaded = *done;
            }
            (s.file, s.file_index, s.total_files) = (file.clone(), *index, *total);
            (s.bytes_downloaded, s.bytes_total) = (*done, size.unwrap_or(0));
        }
        PullEvent::FileDone { file, index, total, bytes } => {
            (s.file, s.file_index, s.total_files) = (file.clone(), *index, *total);
            s.completed_files_bytes += bytes;
            (s.bytes_downloaded, s.bytes_total) = (0, 0);
        }
        PullEvent::Complete { .. } | PullEvent::Error(_) => {}
    }
    s.cumulative_bytes_downloaded = s.completed_files_bytes + s.bytes_downloaded;
    s.overall_bytes_downloaded = s.cumulative_bytes_downloaded;
    s.total_download_size = s.total_download_size.max(s.completed_files_bytes + s.bytes_total);
    s.percent = (s.cumulative_bytes_downloaded * 100).checked_div(s.total_download_size).unwrap_or(0).min(100);
    let secs = started.elapsed().as_secs_f64();
    if secs > 0.0 {
        s.rate_bytes_per_s = (s.cumulative_bytes_downloaded.saturating_sub(run_start) as f64 / secs) as u64;
    }
}

impl std::fmt::Debug for Downloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Downloads").field("path", &self.path).finish()
    }
}
