//! Backend release archives for the release double: a real llama-server packed the way
//! llama.cpp's GitHub releases pack it (`llama-<v>-bin-ubuntu-x64.tar.gz` with a top folder).

use std::io::Write;
use std::path::{Path, PathBuf};

pub const ASSET_REPO: &str = "ggml-org/llama.cpp";

pub fn asset_name(version: &str) -> String {
    format!("llama-{version}-bin-ubuntu-x64.tar.gz")
}

/// Writes `<root>/ggml-org/llama.cpp/releases/download/<v>/<asset>` holding
/// `llama-<v>/llama-server` (the provisioned build) then `llama-<v>/pad.bin` (`pad` zero bytes,
/// so extracting takes a while), and returns (archive path, sha256).
pub fn write_archive(root: &Path, version: &str, pad: u64) -> (PathBuf, String) {
    let dir = root.join(ASSET_REPO).join("releases/download").join(version);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(asset_name(version));
    let f = std::fs::File::create(&path).unwrap();
    let gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    let mut ar = tar::Builder::new(gz);
    let top = format!("llama-{version}");
    ar.append_path_with_name(crate::llama_server(), format!("{top}/llama-server")).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(pad);
    h.set_mode(0o644);
    h.set_cksum();
    ar.append_data(&mut h, format!("{top}/pad.bin"), std::io::Read::take(std::io::repeat(0), pad)).unwrap();
    let mut gz = ar.into_inner().unwrap();
    gz.flush().unwrap();
    gz.finish().unwrap().sync_all().unwrap();
    let sha = host::download::sha256_file(&path).unwrap();
    (path, sha)
}

/// Pins `llamacpp:cpu` to `version` (with `sha256` when given) in the sandbox's cache.
pub fn pin(cache: &Path, version: &str, sha256: Option<&str>) {
    let mut v = serde_json::json!({"llamacpp": {"cpu": version}});
    if let Some(h) = sha256 {
        v["sha256"] = serde_json::json!({ asset_name(version): h });
    }
    std::fs::create_dir_all(cache).unwrap();
    std::fs::write(cache.join("backend_versions.json"), v.to_string()).unwrap();
}

/// An existing managed install of `llamacpp:cpu` at `version` (a copy of the provisioned build).
pub fn install_old(cache: &Path, version: &str) -> PathBuf {
    let dir = cache.join("bin/llamacpp/cpu");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(crate::llama_server(), dir.join("llama-server")).unwrap();
    std::fs::write(dir.join("version.txt"), format!("{version}\n")).unwrap();
    dir
}
