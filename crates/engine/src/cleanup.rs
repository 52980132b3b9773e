//! `POST /internal/cleanup-cache` (Lemonade v11): the orphaned files in the repositories of
//! lemonade's models in the Hugging Face cache. Lemonade v11 looks for files its downloader once
//! put in the wrong repository; lemonade's never did, so what it finds here is what a stopped
//! download leaves behind: partial blobs nothing will resume, and blobs no snapshot links to.
//! Repositories no model here uses are never looked at (the cache is shared with other tools);
//! a repository with a download running, or a job that may be resumed, is skipped.

use std::collections::BTreeMap;

use api_types::{CleanupCacheResponse, OrphanedFile, SkippedRepo};
use host::hf_cache::OrphanKind;
use registry::Checkpoint;

use crate::error::Result;
use crate::Engine;

/// Lists the orphans and, unless `dry_run`, removes them, each repository under its download
/// lock (a pull that starts meanwhile waits for the removal).
pub fn cleanup(rt: &Engine, dry_run: bool) -> Result<CleanupCacheResponse> {
    let reg = rt.catalogue.registry();
    let mut by_repo: BTreeMap<String, String> = BTreeMap::new();
    for m in reg.models().filter(|m| m.source != registry::Source::ExtraModelsDir) {
        by_repo.entry(Checkpoint::parse(&m.checkpoint).repo.to_string()).or_insert_with(|| m.name.clone());
    }
    let resumable = resumable_repos(rt);
    let mut out = CleanupCacheResponse { orphaned_files: Vec::new(), total_bytes: 0, dry_run, skipped: Vec::new() };
    for (repo, model) in by_repo {
        let skip = |reason: &str| SkippedRepo { repo: repo.clone(), reason: reason.into() };
        if let Some(job_model) = resumable.get(&repo) {
            out.skipped.push(skip(&format!("the download job of '{job_model}' keeps its partial files")));
            continue;
        }
        let lock = rt.locks.get(&format!("repo:{repo}"));
        let Ok(_guard) = lock.try_lock() else {
            out.skipped.push(skip("a download into it is running"));
            continue;
        };
        let found = host::hf_cache::orphans(&rt.cfg.hf_cache, &repo);
        if found.is_empty() {
            continue;
        }
        if !dry_run {
            host::hf_cache::remove_orphans(&rt.cfg.hf_cache, &found)?;
        }
        for o in found {
            tracing::info!(path = %o.path, bytes = o.size, dry_run, "orphaned cache file");
            out.total_bytes += o.size;
            let kind = match o.kind {
                OrphanKind::Incomplete => "incomplete",
                OrphanKind::Unreferenced => "unreferenced",
            };
            let file = OrphanedFile {
                path: o.path,
                size: o.size,
                model: model.clone(),
                kind: kind.into(),
                belongs_to: repo.clone(),
            };
            out.orphaned_files.push(file);
        }
    }
    Ok(out)
}

/// The repositories of models whose download job is listed and not complete (it may be
/// resumed: its partial files are its progress), with that model.
fn resumable_repos(rt: &Engine) -> BTreeMap<String, String> {
    rt.downloads
        .list()
        .into_iter()
        .filter(|j| !j.complete)
        .filter_map(|j| {
            let m = rt.catalogue.get(&j.model_name).ok()?;
            Some((Checkpoint::parse(&m.checkpoint).repo.to_string(), j.model_name))
        })
        .collect()
}
