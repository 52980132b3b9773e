//! The Hugging Face Hub client, on top of the general [`Downloader`].
//!
//! Files are written in huggingface_hub's cache layout, so caches are shared with Python
//! tools: the bytes go to `blobs/<etag>.incomplete` (huggingface_hub's own partial name, so
//! either tool resumes the other's download), are verified (size, and sha256 for LFS files)
//! while they stream, then renamed to `blobs/<etag>`; `snapshots/<commit>/<path>` is a relative
//! symlink to the blob and `refs/main` holds the commit.

use std::path::{Path, PathBuf};
use std::time::Duration;

use registry::checkpoint::repo_folder_name;
use registry::plan::RepoFile;

use crate::download::{io, Downloader, Target};
pub use crate::download::{sha256_file, DownloadError as HubError, RetryPolicy};

#[derive(Debug, Clone)]
pub struct Hub {
    downloader: Downloader,
    /// `HF_ENDPOINT`, default https://huggingface.co.
    pub endpoint: String,
}

impl Hub {
    pub fn new(endpoint: &str, token: Option<String>) -> Hub {
        Hub { downloader: Downloader::new(token), endpoint: endpoint.trim_end_matches('/').to_string() }
    }

    /// The retry policy of every download.
    pub fn policy_mut(&mut self) -> &mut RetryPolicy {
        &mut self.downloader.policy
    }

    /// Tells `f` the length of every chunk a download receives.
    pub fn on_received(mut self, f: impl Fn(u64) + Send + Sync + 'static) -> Hub {
        self.downloader.on_received = crate::download::OnReceived::new(f);
        self
    }

    /// Its requests answered by `answer`, in memory (the simulation's Hub).
    pub fn in_memory(mut self, answer: Option<crate::download::InMemory>) -> Hub {
        self.downloader.in_memory = answer;
        self
    }

    /// From `HF_ENDPOINT` and `HF_TOKEN`.
    pub fn from_env() -> Hub {
        let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
        Hub::new(&endpoint, std::env::var("HF_TOKEN").ok())
    }

    fn get(&self, url: &str) -> reqwest::RequestBuilder {
        self.downloader.get(url)
    }

    async fn json(&self, url: &str) -> Result<serde_json::Value, HubError> {
        let resp = self
            .downloader
            .send(self.get(url).timeout(Duration::from_secs(60)))
            .await
            .map_err(|e| HubError::GaveUp { url: url.into(), message: e.to_string(), attempts: 1 })?;
        if !resp.status().is_success() {
            return Err(HubError::Status { url: url.into(), status: resp.status().as_u16() });
        }
        resp.json().await.map_err(|e| HubError::Protocol { url: url.into(), message: e.to_string() })
    }

    /// The commit `rev` of `repo` points to now.
    pub async fn commit(&self, repo: &str, rev: &str) -> Result<String, HubError> {
        let info_url = format!("{}/api/models/{repo}/revision/{rev}", self.endpoint);
        let info = match self.json(&info_url).await {
            Ok(v) => v,
            // Older endpoints (and the test double) only know /api/models/{repo}.
            Err(HubError::Status { status: 404, .. }) => {
                self.json(&format!("{}/api/models/{repo}", self.endpoint)).await?
            }
            Err(e) => return Err(e),
        };
        Ok(info["sha"].as_str().unwrap_or(rev).to_string())
    }

    /// The commit `rev` points to, and every file of the repo at it (recursive, with sizes and
    /// LFS sha256s).
    pub async fn list(&self, repo: &str, rev: &str) -> Result<(String, Vec<RepoFile>), HubError> {
        let commit = self.commit(repo, rev).await?;
        let tree_url = format!("{}/api/models/{repo}/tree/{commit}?recursive=true", self.endpoint);
        let tree = self.json(&tree_url).await?;
        let entries = tree
            .as_array()
            .ok_or_else(|| HubError::Protocol { url: tree_url.clone(), message: "not a list".into() })?;
        let files = entries
            .iter()
            .filter(|e| e["type"] == "file")
            .filter_map(|e| {
                let lfs = e.get("lfs").filter(|l| l.is_object());
                Some(RepoFile {
                    path: e["path"].as_str()?.to_string(),
                    size: lfs.and_then(|l| l["size"].as_u64()).or_else(|| e["size"].as_u64()),
                    sha256: lfs.and_then(|l| l["oid"].as_str()).map(str::to_string),
                    blob: lfs.and_then(|l| l["oid"].as_str()).or_else(|| e["oid"].as_str()).map(str::to_string),
                })
            })
            .collect();
        Ok((commit, files))
    }

    /// Repositories whose id matches `query` (the Hub's `/api/models?search=`), most downloaded
    /// first, at most `limit`, GGUF ones only when `gguf`; with the total count the Hub reports
    /// (its `X-Total-Count`, else the number returned).
    pub async fn search(&self, query: &str, limit: u32, gguf: bool) -> Result<(u64, Vec<serde_json::Value>), HubError> {
        let mut url = reqwest::Url::parse(&format!("{}/api/models", self.endpoint))
            .map_err(|e| HubError::Protocol { url: self.endpoint.clone(), message: e.to_string() })?;
        url.query_pairs_mut()
            .append_pair("search", query)
            .append_pair("limit", &limit.to_string())
            .append_pair("sort", "downloads")
            .append_pair("direction", "-1");
        if gguf {
            url.query_pairs_mut().append_pair("filter", "gguf");
        }
        let url = url.to_string();
        let resp = self
            .downloader
            .send(self.get(&url).timeout(Duration::from_secs(30)))
            .await
            .map_err(|e| HubError::GaveUp { url: url.clone(), message: e.to_string(), attempts: 1 })?;
        if !resp.status().is_success() {
            return Err(HubError::Status { url, status: resp.status().as_u16() });
        }
        let total = resp.headers().get("x-total-count").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let list: Vec<serde_json::Value> =
            resp.json().await.map_err(|e| HubError::Protocol { url: url.clone(), message: e.to_string() })?;
        Ok((total.unwrap_or(list.len() as u64), list))
    }

    pub fn resolve_url(&self, repo: &str, rev: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{rev}/{path}", self.endpoint)
    }

    /// Downloads one file into the cache (see [`Download`]). `progress(done, total)` is called
    /// as bytes arrive; returning false cancels (the partial file stays for a later resume).
    /// Returns the snapshot path.
    pub async fn download(
        &self,
        hf_cache: &Path,
        job: &Download<'_>,
        progress: &mut (dyn FnMut(u64, Option<u64>) -> bool + Send),
    ) -> Result<PathBuf, HubError> {
        let Download { repo, commit, file, dest_repo, dest } = *job;
        let repo_dir = hf_cache.join(repo_folder_name(dest_repo));
        let blob_name = file.blob.clone().unwrap_or_else(|| format!("{commit}-{}", dest.replace('/', "--")));
        let blobs = repo_dir.join("blobs");
        let blob = blobs.join(&blob_name);
        let (dir, at, size) = (blobs.clone(), blob.clone(), file.size);
        let there = move || -> std::io::Result<bool> {
            std::fs::create_dir_all(&dir)?;
            Ok(std::fs::metadata(&at).is_ok_and(|m| size.is_none_or(|s| m.len() == s)))
        };
        let done = crate::offload::offload_io(there).await.map_err(io(&blobs))?;
        if !done {
            let url = self.resolve_url(repo, commit, &file.path);
            let target = Target { name: file.path.clone(), size: file.size, sha256: file.sha256.clone() };
            self.downloader.fetch(&url, &blob, &target, progress).await?;
        } else {
            progress(file.size.unwrap_or(0), file.size);
        }
        let link = link_snapshot(&repo_dir, commit, dest, &blob_name)?;
        write_ref(&repo_dir, commit)?;
        Ok(link)
    }
}

/// One file to fetch: `file` of `repo` at `commit`, stored under `dest_repo` (the model's main
/// repo; secondary files live in its snapshot too) as `dest`.
#[derive(Debug, Clone, Copy)]
pub struct Download<'a> {
    pub repo: &'a str,
    pub commit: &'a str,
    pub file: &'a RepoFile,
    pub dest_repo: &'a str,
    pub dest: &'a str,
}

/// `snapshots/<commit>/<dest>` → `../../blobs/<blob>` (one more `..` per folder level).
fn link_snapshot(repo_dir: &Path, commit: &str, dest: &str, blob: &str) -> Result<PathBuf, HubError> {
    let link = repo_dir.join("snapshots").join(commit).join(dest);
    let parent = link.parent().expect("has parent");
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let depth = dest.matches('/').count() + 2;
    let target = PathBuf::from("../".repeat(depth)).join("blobs").join(blob);
    match std::fs::symlink_metadata(&link) {
        Ok(_) if std::fs::read_link(&link).is_ok_and(|t| t == target) => return Ok(link),
        Ok(_) => std::fs::remove_file(&link).map_err(io(&link))?,
        Err(_) => {}
    }
    std::os::unix::fs::symlink(&target, &link).map_err(io(&link))?;
    Ok(link)
}

fn write_ref(repo_dir: &Path, commit: &str) -> Result<(), HubError> {
    let path = repo_dir.join("refs").join("main");
    crate::files::write_atomic(&path, commit.as_bytes()).map_err(io(&path))
}
