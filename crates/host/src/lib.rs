//! Everything lemonade does to the OS and the network, and nothing else: no HTTP server, no
//! decisions that a pure crate can make.
//!
//! * [`download`]: a general resumable, verified HTTP downloader; [`hub`]: the Hugging Face
//!   client on top of it; [`hf_cache`]: the cache as huggingface_hub lays it out.
//! * [`files`]: lemonade's own files (atomic writes, one writer at a time);
//!   [`catalogue`]: builds the pure registry from the files and the cache.
//! * [`install`]: the backend install transaction (download, unpack, check, atomic swap).
//! * [`supervisor`]: runs a backend process; [`binary`]: where its executable comes from.
//! * [`hardware`]: what the machine has (sysinfo, NVML, sysfs).

pub mod binary;
pub mod capabilities;
pub mod catalogue;
pub mod cloud;
pub mod devices;
pub mod download;
pub mod files;
pub mod hardware;
pub mod hf_cache;
pub mod hub;
pub mod install;
pub mod logging;
pub mod net;
pub mod offload;
pub mod prompt_cache;
pub mod sandbox;
pub mod service;
pub mod supervisor;

pub use supervisor::{Backend, ExitInfo, StartError};

/// The errors of this crate's file work (downloads and processes have their own:
/// [`download::DownloadError`], [`supervisor::StartError`], [`install::InstallError`]).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error(transparent)]
    Registry(#[from] registry::RegistryError),
}

impl HostError {
    /// Whether the file work failed because the disk is full.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, HostError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC))
    }

    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> HostError + '_ {
        move |source| HostError::Io { path: path.display().to_string(), source }
    }
}
