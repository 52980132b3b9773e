//! Running server-owned download jobs (`crate::downloads` keeps their state): start or resume
//! one, its worker, and the controls.

use tokio::time::Instant;

use api_types::DownloadJob;
use registry::ModelInfo;
use tokio::sync::{mpsc, watch};

use crate::downloads::{apply, id_of, Job, Stop};
use crate::models::listed_name;
use crate::{Engine, EngineError, Result};

/// How a pull request is answered ([`pull`]).
#[derive(Debug)]
pub enum Pull {
    /// The model is downloaded (or was, and `do_not_upgrade` asked for nothing more), or a
    /// collection registered: its name.
    Done(String),
    /// A server-owned job was started (`stream: true, subscribe: false`): its snapshot.
    Job(Box<DownloadJob>),
    /// The download runs; its events, for as long as the receiver is held (`stream: true`).
    Events(mpsc::Receiver<crate::pulls::PullEvent>),
}

/// A pull as its request asks: the model resolved (a `user.*` one registered), then nothing
/// more (`do_not_upgrade` and already downloaded), a job, a download awaited, or its events.
/// A done pull and a job name the model by its listed id, as the listings do.
pub async fn pull(rt: &Engine, req: &api_types::PullRequest) -> Result<Pull> {
    // A collection's definition (or a registry-backed one named to refresh) is registered;
    // nothing is downloaded.
    if crate::router::is_collection_pull(rt, req) {
        return Ok(Pull::Done(crate::router::register(rt, req).await?));
    }
    let m = crate::pulls::resolve(rt, req).await?;
    Ok(match (req.stream == Some(true), req.subscribe) {
        _ if req.do_not_upgrade == Some(true) && m.downloaded => Pull::Done(listed_name(rt, &m.name)),
        (true, Some(false)) => Pull::Job(Box::new(with_model_id(rt, start(rt, m)))),
        (true, _) => Pull::Events(crate::pulls::pull_in_background(rt, m)),
        (false, _) => {
            crate::pulls::pull_now(rt, &m).await?;
            Pull::Done(listed_name(rt, &m.name))
        }
    })
}

/// Every download job, each with its model's listed id (`model_id`).
pub fn list(rt: &Engine) -> Vec<DownloadJob> {
    rt.downloads.list().into_iter().map(|j| with_model_id(rt, j)).collect()
}

fn with_model_id(rt: &Engine, mut j: DownloadJob) -> DownloadJob {
    j.model_id = listed_name(rt, &j.model_name);
    j
}

/// Starts (or resumes) `m`'s job; a running one is answered as it is. Returns the snapshot.
pub fn start(rt: &Engine, m: ModelInfo) -> DownloadJob {
    let d = &rt.downloads;
    let id = id_of(&m.name);
    let (tx, rx) = watch::channel(Stop::Run);
    let snap = {
        let mut jobs = d.jobs.lock();
        if let Some(j) = jobs.get(&id).filter(|j| j.stop.is_some()) {
            return j.snap.clone();
        }
        let mut snap = jobs.remove(&id).map(|j| j.snap).unwrap_or_default();
        // Done bytes are counted again by this run, from what is on disk.
        (snap.id, snap.kind, snap.model_name) = (id.clone(), "model".into(), m.name.clone());
        (snap.status, snap.running, snap.complete, snap.error) = ("downloading".into(), true, false, None);
        (snap.completed_files_bytes, snap.rate_bytes_per_s) = (0, 0);
        jobs.insert(id.clone(), Job { snap: snap.clone(), stop: Some(tx), task: None, completed_at: None });
        snap
    };
    d.save(true);
    let (me, job) = (rt.clone(), id.clone());
    let task = tokio::spawn(async move { run(me, m, job, rx).await });
    d.update(&id, |j| j.task = Some(task));
    snap
}

async fn run(rt: Engine, m: ModelInfo, id: String, mut stop: watch::Receiver<Stop>) {
    let (tx, mut events) = mpsc::channel(64);
    let started = Instant::now();
    let run_start = rt.downloads.get(&id).map_or(0, |s| s.cumulative_bytes_downloaded);
    // Boxed, so that dropping it below ends the download (and frees the repository's lock).
    let mut work = Box::pin(crate::pulls::download(&rt, &m, Some(&tx)));
    // A shutdown pauses the job (saved so, for the next start to list and resume).
    let mut closed = Box::pin(rt.lifecycle.closed());
    let outcome = loop {
        // A shutdown or a control first: the download itself also ends at shutdown (with an
        // error), and the job must be saved paused, not failed. Events left when it ends are
        // taken below.
        tokio::select! {
            biased;
            () = &mut closed => break Err(Stop::Pause),
            _ = stop.changed() => break Err(*stop.borrow()),
            r = &mut work => break Ok(r),
            Some(ev) = events.recv() => {
                rt.downloads.update(&id, |j| apply(&mut j.snap, &ev, started, run_start));
                rt.downloads.save(false);
            }
        }
    };
    // Dropping the download stops it at once; its partial file stays for a resume.
    drop(work);
    while let Ok(ev) = events.try_recv() {
        rt.downloads.update(&id, |j| apply(&mut j.snap, &ev, started, run_start));
    }
    // The failure, if the download (or the rescan after it) failed; else what stopped it.
    let (failed, stopped): (Option<String>, Stop) = match outcome {
        Ok(Ok(_)) => (rt.catalogue.reload().await.err().map(|e| e.to_string()), Stop::Run),
        Ok(Err(e)) => (Some(e.to_string()), Stop::Run),
        Err(s) => (None, s),
    };
    rt.downloads.update(&id, |j| {
        let s = &mut j.snap;
        (s.running, s.rate_bytes_per_s, j.stop) = (false, 0, None);
        match (failed, stopped) {
            (_, Stop::Pause) => s.status = "paused".into(),
            (_, Stop::Cancel) => s.status = "cancelled".into(),
            (None, Stop::Run) => {
                (s.status, s.complete, s.percent) = ("completed".into(), true, 100);
                j.completed_at = Some(Instant::now());
            }
            (Some(e), Stop::Run) => (s.status, s.error) = ("error".into(), Some(e)),
        }
    });
    rt.downloads.save(true);
    tracing::info!(job = %id, status = ?rt.downloads.get(&id).map(|s| s.status), "download job ended");
}

/// `POST /downloads/control`: `pause`, `cancel` (the worker stops at once; partial files
/// stay), `resume` (starts it again), `remove` (a stopped job leaves the list; a running one
/// is cancelled and stays until its worker stops). `None`: the job was removed (or was
/// already gone, with `remove`).
pub fn control(rt: &Engine, id: &str, action: &str) -> Result<Option<DownloadJob>> {
    let d = &rt.downloads;
    // `model:<name>` in any form the model is named by (its listed id, `user.X`).
    let canonical = match id.strip_prefix("model:").map(|n| rt.catalogue.registry().get(n).map(|m| m.name.clone())) {
        Some(Ok(name)) if d.get(id).is_none() => format!("model:{name}"),
        _ => id.to_string(),
    };
    let id = canonical.as_str();
    let known = d.get(id);
    let stop = |s: Stop| {
        if let Some(tx) = d.jobs.lock().get(id).and_then(|j| j.stop.clone()) {
            let _ = tx.send(s);
        }
    };
    match (action, known) {
        ("remove", None) => Ok(None),
        (_, None) => Err(EngineError::Missing { what: crate::error::Thing::DownloadJob, name: id.to_string() }),
        ("pause", Some(j)) => {
            stop(Stop::Pause);
            Ok(Some(j))
        }
        ("cancel", Some(j)) => {
            stop(Stop::Cancel);
            Ok(Some(j))
        }
        ("resume", Some(j)) => {
            let m = rt.catalogue.get(&j.model_name)?;
            Ok(Some(start(rt, m)))
        }
        ("remove", Some(j)) if j.running => {
            stop(Stop::Cancel);
            Ok(Some(j))
        }
        ("remove", Some(_)) => {
            d.jobs.lock().remove(id);
            d.save(true);
            Ok(None)
        }
        (other, _) => Err(EngineError::invalid(
            format!("Unknown action '{other}': use pause, resume, cancel or remove"),
            Some("action"),
        )),
    }
}
