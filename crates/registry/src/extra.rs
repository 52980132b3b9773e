//! The extra models dir's GGUFs as models, named as current Lemonade (v11) names them:
//!
//! - a file directly in the dir is `extra.<stem>` (`Qwen3-4B-Q4_K_M.gguf` → `extra.Qwen3-4B-Q4_K_M`);
//! - a subfolder whose model files are two or more quantizations (each file, or each series
//!   of shards, names one: `…-Q4_K_M.gguf`, `…-Q8_0-00001-of-00002.gguf`) is one model per
//!   quantization, named by the first file's stem without its shard counter;
//! - any other subfolder (one model, its shards) is one model named by the folder, its
//!   checkpoint the folder;
//! - an mmproj file is no model: the first of a folder's (alphabetically) is every model's
//!   projector there;
//! - a name already taken is qualified by its folder (`extra.<folder>-<name>`, then `-2`, …), so
//!   identical file names in two folders stay two models.
//!
//! Lemonade v9 named a root file by its file name (`extra.<name>.gguf`) and a folder always by
//! itself; [`ExtraScan::renamed`] maps those names to these: they still mean the model in a
//! request (a split folder's name, bare or `extra.`, means its first quantization, as v11
//! keeps it), without being listed, and saved options and aliases follow the model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The prefix of an extra model's name.
pub const EXTRA_PREFIX: &str = "extra.";

/// A `*.gguf` file found under the extra models dir, with its size in bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ExtraFile {
    pub path: PathBuf,
    pub bytes: u64,
}

/// One model of the extra models dir.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// Its full name (`extra.X`).
    pub id: String,
    /// What the API shows as its checkpoint: the file, or the folder of a one-model folder.
    pub checkpoint: PathBuf,
    /// The file llama-server loads (the first shard).
    pub main: PathBuf,
    /// Its projector.
    pub mmproj: Option<PathBuf>,
    /// Its files' bytes (every shard; a one-model folder's every file).
    pub bytes: u64,
}

/// What the extra models dir holds, as models.
#[derive(Debug, Default)]
pub struct ExtraScan {
    pub models: Vec<Found>,
    /// Lemonade v9's name of a model → its name now, where they differ.
    pub renamed: Vec<(String, String)>,
}

/// Scans `found` (every `*.gguf` under `dir`, any case, recursively) into models.
pub fn scan(dir: &Path, mut found: Vec<ExtraFile>) -> ExtraScan {
    found.sort();
    let mut out = ExtraScan::default();
    let mut groups: BTreeMap<PathBuf, Vec<ExtraFile>> = BTreeMap::new();
    for f in found {
        let parent = f.path.parent().map(Path::to_path_buf).unwrap_or_default();
        if parent != dir {
            groups.entry(parent).or_default().push(f);
            continue;
        }
        let name = file_name(&f.path);
        if is_mmproj(&name) {
            continue;
        }
        let m =
            Found { id: String::new(), checkpoint: f.path.clone(), main: f.path.clone(), mmproj: None, bytes: f.bytes };
        let id = out.add(stem(&name), dir, m);
        out.rename(format!("{EXTRA_PREFIX}{name}"), id);
    }
    for (folder, group) in groups {
        out.folder(&folder, &group);
    }
    out
}

impl ExtraScan {
    /// Adds `info` as `extra.<base>`, or qualified by `folder` when that name is taken; returns
    /// the full name given.
    fn add(&mut self, base: &str, folder: &Path, mut m: Found) -> String {
        let taken = |id: &str| self.models.iter().any(|f| f.id == id);
        let mut id = format!("{EXTRA_PREFIX}{base}");
        if taken(&id) {
            let qualified = format!("{EXTRA_PREFIX}{}-{base}", file_name(folder));
            id = qualified.clone();
            let mut n = 2;
            while taken(&id) {
                id = format!("{qualified}-{n}");
                n += 1;
            }
        }
        m.id = id.clone();
        self.models.push(m);
        id
    }

    fn rename(&mut self, old: String, new: String) {
        if old != new {
            self.renamed.push((old, new));
        }
    }

    /// One subfolder's files: one model per quantization when it holds several, else one.
    fn folder(&mut self, folder: &Path, group: &[ExtraFile]) {
        let folder_name = file_name(folder);
        let mmproj = group.iter().find(|f| is_mmproj(&file_name(&f.path)));
        let models: Vec<&ExtraFile> = group.iter().filter(|f| !is_mmproj(&file_name(&f.path))).collect();
        let Some(first) = models.first() else { return };
        let old = format!("{EXTRA_PREFIX}{folder_name}");
        match variants(&models) {
            Some(variants) => {
                for v in variants {
                    let bytes = v.iter().map(|f| f.bytes).sum();
                    let (checkpoint, main) = (v[0].path.clone(), v[0].path.clone());
                    let m =
                        Found { id: String::new(), checkpoint, main, mmproj: mmproj.map(|m| m.path.clone()), bytes };
                    let id = self.add(&visible_name(&file_name(&v[0].path), v.len() > 1), folder, m);
                    if v[0].path == first.path {
                        self.rename(old.clone(), id);
                    }
                }
            }
            None => {
                let bytes = group.iter().map(|f| f.bytes).sum();
                let (checkpoint, main) = (folder.to_path_buf(), first.path.clone());
                let m = Found { id: String::new(), checkpoint, main, mmproj: mmproj.map(|m| m.path.clone()), bytes };
                let id = self.add(&folder_name, folder, m);
                self.rename(old, id);
            }
        }
    }
}

/// A folder's model files as quantization variants (each a file or a series of shards,
/// sorted), best-known quantization first; None when the folder is one model: fewer than two
/// series, or a file that names no quantization.
fn variants<'a>(models: &[&'a ExtraFile]) -> Option<Vec<Vec<&'a ExtraFile>>> {
    let mut series: BTreeMap<String, (String, Vec<&ExtraFile>)> = BTreeMap::new();
    for f in models {
        let name = file_name(&f.path);
        let quant = quant_of(&name)?;
        if is_draft(&name) {
            return None;
        }
        let key = shard_base(&name).unwrap_or(&name).to_string();
        series.entry(key).or_insert_with(|| (quant, Vec::new())).1.push(f);
    }
    if series.len() < 2 {
        return None;
    }
    let mut out: Vec<(usize, String, Vec<&ExtraFile>)> = series
        .into_values()
        .map(|(q, v)| {
            let rank = FAVOURITES.iter().position(|f| *f == q).unwrap_or(FAVOURITES.len());
            (rank, visible_name(&file_name(&v[0].path), v.len() > 1), v)
        })
        .collect();
    out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    Some(out.into_iter().map(|(_, _, v)| v).collect())
}

/// The quantizations the catalogue uses most, first.
const FAVOURITES: [&str; 4] = ["Q4_K_M", "UD-Q4_K_XL", "Q8_0", "Q4_0"];

/// A file's (or folder's) name.
pub fn file_name(p: &Path) -> String {
    p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string()
}

fn is_mmproj(name: &str) -> bool {
    name.to_ascii_lowercase().contains("mmproj")
}

/// A speculative-decoding companion (`dflash-…`, `mtp-…`): no model of its own.
fn is_draft(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l.starts_with("dflash-") || l == "dflash.gguf" || l.starts_with("mtp-")
}

/// The file name without its last extension.
fn stem(name: &str) -> &str {
    name.rsplit_once('.').map_or(name, |(s, _)| s)
}

/// `x-00001-of-00003.gguf` (or `.`/`_` before the counter) → `x`.
fn shard_base(name: &str) -> Option<&str> {
    let lower = name.to_ascii_lowercase();
    let rest = lower.strip_suffix(".gguf")?;
    let (head, total) = rest.rsplit_once("-of-")?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(total) || head.len() < 7 || !digits(&head[head.len() - 5..]) {
        return None;
    }
    let sep = head.as_bytes()[head.len() - 6];
    (matches!(sep, b'-' | b'.' | b'_') && head.len() > 6).then(|| &name[..head.len() - 6])
}

/// The name a variant is listed by: its first file's stem, without the shard counter when it
/// is a series of shards.
fn visible_name(first: &str, sharded: bool) -> String {
    let s = stem(first);
    if sharded {
        for marker in ["-00001-of-", ".00001-of-", "_00001-of-"] {
            if let Some(i) = s.find(marker) {
                return s[..i].to_string();
            }
        }
    }
    s.to_string()
}

/// The quantization a file name names (upper case): a token such as `Q4_K_M`, `UD-Q4_K_XL`,
/// `IQ2_M`, `Q8_0`, `F16`, `BF16` or `MXFP4`, between separators (`-`, `.`, `_`, `/`).
pub fn quant_of(name: &str) -> Option<String> {
    let up = name.to_ascii_uppercase();
    let b = up.as_bytes();
    let sep = |i: usize| matches!(b.get(i), Some(b'-' | b'.' | b'_' | b'/'));
    for start in 0..b.len() {
        if start > 0 && !sep(start - 1) {
            continue;
        }
        let ends = quant_ends(&b[start..]);
        if let Some(len) = ends.into_iter().rev().find(|&l| start + l == b.len() || sep(start + l)) {
            return Some(up[start..start + len].to_string());
        }
    }
    None
}

/// Every length of a quantization token at the start of `s`, shortest first.
fn quant_ends(s: &[u8]) -> Vec<usize> {
    let ud = if s.starts_with(b"UD-") || s.starts_with(b"UD_") { 3 } else { 0 };
    let mut ends: Vec<usize> = Vec::new();
    for skip in if ud > 0 { vec![0, ud] } else { vec![0] } {
        let t = &s[skip..];
        let digits = |from: usize| t[from..].iter().take_while(|c| c.is_ascii_digit()).count();
        let mut push = |l: usize| ends.push(skip + l);
        let suffixes = |at: usize, opts: &[&str], push: &mut dyn FnMut(usize)| {
            push(at);
            for o in opts {
                if t[at..].starts_with(format!("_{o}").as_bytes()) {
                    push(at + 1 + o.len());
                }
            }
        };
        if t.starts_with(b"Q") && digits(1) > 0 {
            let at = 1 + digits(1);
            let mut bases = vec![at];
            if t[at..].starts_with(b"_") && t.get(at + 1).is_some_and(u8::is_ascii_digit) {
                bases.push(at + 2);
            }
            for base in bases.clone() {
                let mut k = vec![base];
                if t[base..].starts_with(b"_K") {
                    k.push(base + 2);
                }
                for at in k {
                    suffixes(at, &["M", "S", "L", "XL", "XXL"], &mut push);
                }
            }
        } else if t.starts_with(b"IQ") && digits(2) > 0 {
            suffixes(2 + digits(2), &["M", "S", "L", "XS", "XXS", "NL"], &mut push);
        } else if t.starts_with(b"MXFP") && digits(4) > 0 {
            suffixes(4 + digits(4), &["MOE"], &mut push);
        } else {
            for f in ["F16", "F32", "BF16"] {
                if t.starts_with(f.as_bytes()) {
                    push(f.len());
                }
            }
        }
    }
    ends.sort_unstable();
    ends.dedup();
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_tokens_are_found_between_separators() {
        for (name, q) in [
            ("Qwen3.6-35B-A3B-Q4_K_M.gguf", Some("Q4_K_M")),
            ("Qwen3.5-4B-UD-Q4_K_XL.gguf", Some("UD-Q4_K_XL")),
            ("Model-Q4_K_M-imatrix.gguf", Some("Q4_K_M")),
            ("Mixtral-8x7B-Instruct-Q8_0-00001-of-00002.gguf", Some("Q8_0")),
            ("gemma-3-270m-it-UD-IQ2_M.gguf", Some("UD-IQ2_M")),
            ("SmolLM2-135M-Instruct.Q4_1.gguf", Some("Q4_1")),
            ("model-bf16.gguf", Some("BF16")),
            ("gpt-oss-mxfp4.gguf", Some("MXFP4")),
            ("Llama-3-70B-Instruct-00001-of-00002.gguf", None),
            ("Vision-Model.gguf", None),
            ("QQ4.gguf", None),
        ] {
            assert_eq!(quant_of(name).as_deref(), q, "{name}");
        }
    }

    #[test]
    fn shard_counters_are_recognised() {
        assert_eq!(shard_base("M-Q8_0-00001-of-00002.gguf"), Some("M-Q8_0"));
        assert_eq!(shard_base("M.00002-of-00002.gguf"), Some("M"));
        assert_eq!(shard_base("M-Q8_0.gguf"), None);
        assert_eq!(shard_base("00001-of-00002.gguf"), None);
        assert_eq!(visible_name("M-Q8_0-00001-of-00002.gguf", true), "M-Q8_0");
        assert_eq!(visible_name("M-Q8_0.gguf", false), "M-Q8_0");
    }
}
