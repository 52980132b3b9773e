//! Which backends exist, which this machine can run, which version is pinned, and where its
//! release archive lives (pure: the hardware and the installed versions come in as values).
//!
//! The table and the pins follow Lemonade v9.4.1 (`backend_versions.json`, reference §2.13,
//! §7.1). `llamacpp:system` is ours: an existing `llama-server` on `PATH`, never downloaded.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::Recipe;

/// v9.4.1's pins (llama.cpp moved to b9093, the oldest build the tests run), used unless
/// `<cache>/backend_versions.json` exists.
pub const DEFAULT_PINS: &str = include_str!("backend_versions.json");

/// Where release archives are downloaded from, unless `LEMONADE_RELEASES_URL` says otherwise.
pub const DEFAULT_RELEASES_URL: &str = "https://github.com";

/// What the machine has, as far as backends care.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hardware {
    /// `linux`, `windows` or `macos`.
    pub os: String,
    /// `x86_64` or `arm64`.
    pub cpu_family: String,
    /// gfx family of an AMD integrated GPU (`gfx1150`, `gfx1151`, …), if any.
    pub amd_igpu: Option<String>,
    /// gfx families of AMD discrete GPUs (`gfx110X`, `gfx120X`, …).
    pub amd_dgpus: Vec<String>,
    pub nvidia_gpus: usize,
    /// An XDNA 2 NPU is present.
    pub xdna2_npu: bool,
}

impl Hardware {
    /// This build's OS and architecture, with no GPU or NPU.
    pub fn this_platform() -> Hardware {
        Hardware {
            os: std::env::consts::OS.into(),
            cpu_family: if cfg!(target_arch = "aarch64") { "arm64" } else { std::env::consts::ARCH }.into(),
            ..Hardware::default()
        }
    }
}

/// A recipe's backends in preference order (v9's table, plus `llamacpp:system`).
pub fn recipes() -> impl Iterator<Item = (Recipe, &'static [&'static str])> {
    Recipe::ALL.into_iter().map(|r| (r, r.backends()))
}

/// Why a backend cannot run on this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("Requires {}", os_names(.0))]
    Os(&'static [&'static str]),
    #[error("Requires AMD XDNA 2 AMD NPU")]
    NoNpu,
    #[error("Requires an x86_64 CPU or an AMD GPU")]
    NoCpuOrAmdGpu,
    #[error("Requires AMD ROCm-capable GPU (gfx1150, gfx1151, gfx110X or gfx120X)")]
    NoRocmGpu,
    #[error("Requires x86_64 CPU")]
    NotX86,
    #[error("Unknown backend {recipe}:{backend}")]
    Unknown { recipe: String, backend: String },
}

fn os_names(oses: &[&str]) -> String {
    let name = |os: &str| match os {
        "windows" => "Windows",
        "macos" => "macOS",
        _ => "Linux",
    };
    oses.iter().map(|o| name(o)).collect::<Vec<_>>().join(" or ")
}

/// Whether `recipe:backend` can run here: `Ok(devices)` or `Err(why not)`.
pub fn support(hw: &Hardware, recipe: &str, backend: &str) -> Result<Vec<&'static str>, Unsupported> {
    let requires_os = |oses: &'static [&'static str]| -> Result<(), Unsupported> {
        if oses.contains(&hw.os.as_str()) {
            Ok(())
        } else {
            Err(Unsupported::Os(oses))
        }
    };
    let x86 = hw.cpu_family == "x86_64";
    let igpu = hw.amd_igpu.as_deref();
    let rocm_igpu =
        |linux_1150: bool| igpu.is_some_and(|f| f == "gfx1151" || (f == "gfx1150" && (linux_1150 || hw.os != "linux")));
    let rocm_dgpu = hw.amd_dgpus.iter().any(|f| f == "gfx110X" || f == "gfx120X");
    // FastFlowLM runs on Linux too (the upstream `amdxdna` driver), as in Lemonade v11.
    let npu_on = |oses: &'static [&'static str]| -> Result<Vec<&'static str>, Unsupported> {
        requires_os(oses)?;
        if hw.xdna2_npu {
            Ok(vec!["amd_npu"])
        } else {
            Err(Unsupported::NoNpu)
        }
    };
    let with_gpus = |mut d: Vec<&'static str>, igpu_ok: bool, dgpu_ok: bool| {
        if igpu_ok {
            d.push("amd_igpu");
        }
        if dgpu_ok {
            d.push("amd_dgpu");
        }
        d
    };
    match (recipe, backend) {
        ("llamacpp", "metal") => {
            requires_os(&["macos"])?;
            Ok(vec!["metal"])
        }
        ("llamacpp", "vulkan") => {
            requires_os(&["windows", "linux"])?;
            let d = with_gpus(if x86 { vec!["cpu"] } else { vec![] }, igpu.is_some(), !hw.amd_dgpus.is_empty());
            if d.is_empty() {
                Err(Unsupported::NoCpuOrAmdGpu)
            } else {
                Ok(d)
            }
        }
        ("llamacpp", "rocm") | ("sd-cpp", "rocm") => {
            requires_os(&["windows", "linux"])?;
            let d = with_gpus(vec![], rocm_igpu(recipe == "sd-cpp"), rocm_dgpu);
            if d.is_empty() {
                Err(Unsupported::NoRocmGpu)
            } else {
                Ok(d)
            }
        }
        ("llamacpp", "cpu") => {
            requires_os(&["windows", "linux"])?;
            if x86 {
                Ok(vec!["cpu"])
            } else {
                Err(Unsupported::NotX86)
            }
        }
        ("llamacpp", "system") => Ok(vec!["cpu"]),
        ("flm", "npu") => npu_on(&["windows", "linux"]),
        ("whispercpp", "npu") | ("ryzenai-llm", "npu") => npu_on(&["windows"]),
        ("whispercpp", "cpu") => {
            requires_os(&["windows", "linux"])?;
            Ok(vec!["cpu"])
        }
        ("whispercpp", "vulkan") => {
            requires_os(&["linux"])?;
            Ok(vec!["cpu"])
        }
        ("kokoro", "cpu") | ("sd-cpp", "cpu") => Ok(vec!["cpu"]),
        _ => Err(Unsupported::Unknown { recipe: recipe.to_string(), backend: backend.to_string() }),
    }
}

/// Why a backend cannot be installed; each names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallPlanError {
    #[error("Unknown recipe: {0}. Recipes: {recipes}", recipes = Recipe::ALL.map(Recipe::as_str).join(", "))]
    UnknownRecipe(String),
    #[error("Unknown backend '{backend}' for {recipe}. Backends: {}", .recipe.backends().join(", "))]
    UnknownBackend { recipe: Recipe, backend: String },
    #[error("{0}")]
    NotInstallable(String),
}

/// What installing `recipe:backend` means here: the checked names, where it goes, the pinned
/// version and its archive.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallPlan {
    pub recipe: Recipe,
    pub backend: String,
    pub dir: &'static str,
    pub exe: &'static str,
    pub version: String,
    pub asset: Asset,
    pub sha256: Option<String>,
}

/// A known recipe and one of its backends.
pub fn known(recipe: &str, backend: &str) -> Result<Recipe, InstallPlanError> {
    let r = Recipe::parse(recipe).ok_or_else(|| InstallPlanError::UnknownRecipe(recipe.to_string()))?;
    if !r.backends().contains(&backend) {
        return Err(InstallPlanError::UnknownBackend { recipe: r, backend: backend.to_string() });
    }
    Ok(r)
}

/// Decides the install of `recipe:backend` on `hw` with `pins`.
pub fn plan_install(hw: &Hardware, pins: &Pins, recipe: &str, backend: &str) -> Result<InstallPlan, InstallPlanError> {
    let r = known(recipe, backend)?;
    let (dir, exe) = r.dir_and_exe();
    let unsupported = InstallPlanError::NotInstallable;
    if let Err(why) = support(hw, recipe, backend) {
        return Err(unsupported(format!("{recipe}:{backend} cannot run on this machine: {why}")));
    }
    if backend == "system" {
        return Err(unsupported(format!(
            "{recipe}:system is the {exe} found on PATH; install llama.cpp with your package manager instead"
        )));
    }
    if !r.runnable() {
        return Err(unsupported(format!("This lemonade does not run {recipe} models yet")));
    }
    if built_from_source(hw, recipe) {
        return Err(unsupported(format!(
            "{recipe}:{backend} has no release archive for this platform; set {} to a binary built from source (cargo xtask setup builds one)",
            override_var(dir, backend)
        )));
    }
    let version = pins
        .version(recipe, backend)
        .ok_or_else(|| unsupported(format!("No version of {recipe}:{backend} is pinned")))?
        .to_string();
    let asset = asset(hw, recipe, backend, &version)
        .ok_or_else(|| unsupported(format!("{recipe}:{backend} has no release archive for this platform")))?;
    let sha256 = pins.sha256(&asset.filename).map(str::to_string);
    Ok(InstallPlan { recipe: r, backend: backend.into(), dir, exe, version, asset, sha256 })
}

/// The GitHub repository whose releases a recipe's backend comes from, where it has one.
pub fn release_repo(recipe: Recipe, backend: &str) -> Option<&'static str> {
    Some(match (recipe, backend) {
        (Recipe::LlamaCpp, "rocm") => "lemonade-sdk/llamacpp-rocm",
        (Recipe::LlamaCpp, "system") => return None,
        (Recipe::LlamaCpp, _) => "ggml-org/llama.cpp",
        (Recipe::WhisperCpp, _) => "ggml-org/whisper.cpp",
        (Recipe::SdCpp, _) => "leejet/stable-diffusion.cpp",
        (Recipe::Flm, _) => "ROCm/FastFlowLM",
        _ => return None,
    })
}

/// The release page of `recipe:backend` at `version` (any platform), where one exists.
pub fn release_url(recipe: Recipe, backend: &str, version: &str) -> Option<String> {
    let repo = release_repo(recipe, backend)?;
    (!version.is_empty()).then(|| format!("https://github.com/{repo}/releases/tag/{version}"))
}

/// A downloadable release archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Asset {
    /// `owner/name` on GitHub (or the same path on a mirror).
    pub repo: String,
    pub version: String,
    pub filename: String,
}

impl Asset {
    /// `<base>/<repo>/releases/download/<version>/<filename>`.
    pub fn url(&self, base: &str) -> String {
        format!("{}/{}/releases/download/{}/{}", base.trim_end_matches('/'), self.repo, self.version, self.filename)
    }
    pub fn release_url(&self) -> String {
        format!("https://github.com/{}/releases/tag/{}", self.repo, self.version)
    }
}

/// The release archive of `recipe:backend` at `version` for this machine, when lemonade knows
/// how to install it (llama.cpp's Linux and Windows builds; other recipes are not runnable yet).
pub fn asset(hw: &Hardware, recipe: &str, backend: &str, version: &str) -> Option<Asset> {
    let win = hw.os == "windows";
    let (repo, filename) = match (recipe, backend, hw.os.as_str()) {
        ("llamacpp", "cpu", "linux" | "windows") => (
            "ggml-org/llama.cpp",
            if win {
                format!("llama-{version}-bin-win-cpu-x64.zip")
            } else {
                format!("llama-{version}-bin-ubuntu-x64.tar.gz")
            },
        ),
        ("llamacpp", "vulkan", "linux" | "windows") => (
            "ggml-org/llama.cpp",
            if win {
                format!("llama-{version}-bin-win-vulkan-x64.zip")
            } else {
                format!("llama-{version}-bin-ubuntu-vulkan-x64.tar.gz")
            },
        ),
        ("llamacpp", "metal", "macos") => ("ggml-org/llama.cpp", format!("llama-{version}-bin-macos-arm64.tar.gz")),
        // FLM's own release assets (v11.7): bare version numbers.
        ("flm", "npu", "linux" | "windows") => {
            let bare = version.trim_start_matches('v');
            (
                "ROCm/FastFlowLM",
                if win {
                    format!("fastflowlm_{bare}_windows_amd64.zip")
                } else {
                    format!("fastflowlm_{bare}_linux.tar.gz")
                },
            )
        }
        // whisper.cpp publishes Windows builds only; elsewhere whisper-server is built from
        // source (`cargo xtask setup` does) and named by LEMONADE_WHISPERCPP_CPU_BIN.
        ("whispercpp", "cpu", "windows") => ("ggml-org/whisper.cpp", "whisper-bin-x64.zip".to_string()),
        ("llamacpp", "rocm", "linux" | "windows") => {
            let family = hw.amd_igpu.clone().or_else(|| hw.amd_dgpus.first().cloned())?;
            (
                "lemonade-sdk/llamacpp-rocm",
                format!("llama-{version}-{}-rocm-{family}-x64.zip", if win { "windows" } else { "ubuntu" }),
            )
        }
        _ => return None,
    };
    Some(Asset { repo: repo.into(), version: version.into(), filename })
}

/// Pinned versions (`{"<recipe>": {"<backend>": "<version>"}}`) and, optionally, the sha256 of
/// each archive (`{"sha256": {"<filename>": "<hex>"}}`), which an install then enforces.
#[derive(Debug, Clone, Default)]
pub struct Pins {
    versions: BTreeMap<String, BTreeMap<String, String>>,
    sha256: BTreeMap<String, String>,
}

impl Pins {
    pub fn parse(text: &str) -> Result<Pins, crate::BackendError> {
        let bad = crate::BackendError::Pins;
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let obj = v.as_object().ok_or_else(|| bad("backend versions must be a JSON object".into()))?;
        let mut pins = Pins::default();
        for (k, v) in obj {
            match (k.as_str(), v) {
                ("sha256", serde_json::Value::Object(m)) => {
                    for (file, h) in m {
                        let h = h.as_str().ok_or_else(|| bad(format!("sha256.{file} must be a string")))?;
                        pins.sha256.insert(file.clone(), h.to_ascii_lowercase());
                    }
                }
                (recipe, serde_json::Value::Object(m)) => {
                    let entry = pins.versions.entry(recipe.to_string()).or_default();
                    for (backend, ver) in m {
                        if let Some(s) = ver.as_str() {
                            entry.insert(backend.clone(), s.to_string());
                        }
                    }
                }
                _ => {} // comments and scalar settings
            }
        }
        Ok(pins)
    }

    pub fn version(&self, recipe: &str, backend: &str) -> Option<&str> {
        self.versions.get(recipe)?.get(backend).map(String::as_str)
    }

    pub fn sha256(&self, filename: &str) -> Option<&str> {
        self.sha256.get(filename).map(String::as_str)
    }
}

/// What is on disk for a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    Missing,
    /// In lemonade's managed directory, with the version from its `version.txt`.
    Managed(Option<String>),
    /// `LEMONADE_<DIR>_<BACKEND>_BIN` names an existing file.
    Override(String),
    /// Found on `PATH` (the `system` backend).
    System(String),
}

/// Whether `recipe`'s backend has no release archive lemonade can install here, so it is built
/// from source and named by its override variable: whisper.cpp publishes Windows builds only,
/// and the sd-cpp and kokoro backends are built by `cargo xtask setup`.
pub fn built_from_source(hw: &Hardware, recipe: &str) -> bool {
    matches!(recipe, "sd-cpp" | "kokoro") || (recipe == "whispercpp" && hw.os != "windows")
}

/// The environment variable that names a recipe's binary, overriding the managed install
/// (reference §7.1): `LEMONADE_<DIR>_<BACKEND>_BIN`, upper-cased, hyphens removed.
pub fn override_var(recipe_dir: &str, backend: &str) -> String {
    format!("LEMONADE_{}_{}_BIN", recipe_dir.replace('-', "").to_uppercase(), backend.replace('-', "").to_uppercase())
}

/// `state`, `message`, `action` as reference §2.13 words them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendState {
    pub state: &'static str,
    pub message: String,
    pub action: String,
    pub version: String,
}

pub fn state(
    hw: &Hardware,
    pins: &Pins,
    recipe: &str,
    backend: &str,
    installed: &Installed,
) -> (Vec<&'static str>, BackendState) {
    let action = format!("lemonade recipes --install {recipe}:{backend}");
    let pinned = pins.version(recipe, backend).unwrap_or_default().to_string();
    let devices = match support(hw, recipe, backend) {
        Err(why) => {
            let message = why.to_string();
            return (vec![], BackendState { state: "unsupported", message, action: String::new(), version: pinned });
        }
        Ok(d) => d,
    };
    if !Recipe::parse(recipe).is_some_and(Recipe::runnable) {
        let message = format!("This lemonade does not run {recipe} models yet.");
        return (devices, BackendState { state: "unsupported", message, action: String::new(), version: pinned });
    }
    let s = match installed {
        Installed::Override(var) => BackendState {
            state: "installed",
            message: format!("Using the binary named by {var}."),
            action: String::new(),
            version: "override".into(),
        },
        Installed::System(path) => BackendState {
            state: "installed",
            message: format!("Using {path} from PATH."),
            action: String::new(),
            version: "system".into(),
        },
        Installed::Missing if backend == "system" => BackendState {
            state: "unsupported",
            message: "No llama-server on PATH.".into(),
            action: String::new(),
            version: String::new(),
        },
        Installed::Missing if built_from_source(hw, recipe) => {
            let (dir, _) = Recipe::parse(recipe).map(Recipe::dir_and_exe).unwrap_or_default();
            let var = override_var(dir, backend);
            BackendState {
                state: "unsupported",
                message: format!("{recipe}:{backend} has no release archive for this platform; set {var} to a binary built from source."),
                action: String::new(),
                version: pinned,
            }
        }
        Installed::Missing => BackendState {
            state: "installable",
            message: "Backend is supported but not installed.".into(),
            action,
            version: pinned,
        },
        // A source build has no release to update to: it is used as it is.
        Installed::Managed(v) if built_from_source(hw, recipe) => BackendState {
            state: "installed",
            message: "Built from source (cargo xtask setup builds it).".into(),
            action: String::new(),
            version: v.clone().unwrap_or_default(),
        },
        Installed::Managed(v) if v.as_deref() == Some(pinned.as_str()) => {
            BackendState { state: "installed", message: String::new(), action: String::new(), version: pinned }
        }
        Installed::Managed(v) => BackendState {
            state: "update_required",
            message: format!(
                "Backend update is required before use (installed {}, pinned {pinned}).",
                v.as_deref().unwrap_or("unknown")
            ),
            action,
            version: v.clone().unwrap_or_default(),
        },
    };
    (devices, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linux() -> Hardware {
        Hardware { os: "linux".into(), cpu_family: "x86_64".into(), ..Hardware::default() }
    }

    #[test]
    fn default_pins_parse() {
        let p = Pins::parse(DEFAULT_PINS).unwrap();
        assert_eq!(p.version("llamacpp", "cpu"), Some("b9093"));
        assert_eq!(p.version("llamacpp", "rocm"), Some("b1203"));
        assert_eq!(p.version("flm", "npu"), Some("v0.9.34"));
        assert_eq!(p.sha256("x"), None);
        let p = Pins::parse(r#"{"llamacpp":{"cpu":"b1"},"sha256":{"a.tar.gz":"ABC"}}"#).unwrap();
        assert_eq!(p.sha256("a.tar.gz"), Some("abc"));
        let err = Pins::parse("[1]").unwrap_err().to_string();
        assert_eq!(err, "backend versions: backend versions must be a JSON object");
    }

    #[test]
    fn assets_follow_upstream_names() {
        let a = asset(&linux(), "llamacpp", "cpu", "b9093").unwrap();
        assert_eq!(
            a.url("https://github.com/"),
            "https://github.com/ggml-org/llama.cpp/releases/download/b9093/llama-b9093-bin-ubuntu-x64.tar.gz"
        );
        assert_eq!(a.release_url(), "https://github.com/ggml-org/llama.cpp/releases/tag/b9093");
        let hw = Hardware { amd_igpu: Some("gfx1151".into()), ..linux() };
        assert_eq!(
            asset(&hw, "llamacpp", "rocm", "b1203").unwrap().filename,
            "llama-b1203-ubuntu-rocm-gfx1151-x64.zip"
        );
        assert_eq!(asset(&linux(), "llamacpp", "rocm", "b1203"), None);
        assert_eq!(asset(&linux(), "llamacpp", "system", "x"), None);
        assert_eq!(asset(&linux(), "whispercpp", "cpu", "v1"), None);
        let win = Hardware { os: "windows".into(), ..linux() };
        assert_eq!(
            asset(&win, "whispercpp", "cpu", "v1.8.2").unwrap().url("https://github.com/"),
            "https://github.com/ggml-org/whisper.cpp/releases/download/v1.8.2/whisper-bin-x64.zip"
        );
    }

    #[test]
    fn states() {
        let pins = Pins::parse(DEFAULT_PINS).unwrap();
        let hw = linux();
        let (d, s) = state(&hw, &pins, "llamacpp", "cpu", &Installed::Missing);
        assert_eq!(
            (d, s.state, s.action.as_str()),
            (vec!["cpu"], "installable", "lemonade recipes --install llamacpp:cpu")
        );
        let (_, s) = state(&hw, &pins, "llamacpp", "cpu", &Installed::Managed(Some("b9093".into())));
        assert_eq!((s.state, s.message.as_str()), ("installed", ""));
        let (_, s) = state(&hw, &pins, "llamacpp", "cpu", &Installed::Managed(Some("b1".into())));
        assert_eq!(s.state, "update_required");
        let (d, s) = state(&hw, &pins, "llamacpp", "metal", &Installed::Missing);
        assert_eq!((d.len(), s.state, s.message.as_str()), (0, "unsupported", "Requires macOS"));
        let (_, s) = state(&hw, &pins, "ryzenai-llm", "npu", &Installed::Missing);
        assert_eq!((s.state, s.message.as_str()), ("unsupported", "Requires Windows"));
        // FLM runs on Linux with an XDNA 2 NPU, from FLM's Linux release.
        let (_, s) = state(&hw, &pins, "flm", "npu", &Installed::Missing);
        assert_eq!((s.state, s.message.as_str()), ("unsupported", "Requires AMD XDNA 2 AMD NPU"));
        let npu = Hardware { xdna2_npu: true, ..linux() };
        let (d, s) = state(&npu, &pins, "flm", "npu", &Installed::Missing);
        assert_eq!((d, s.state), (vec!["amd_npu"], "installable"));
        let a = asset(&npu, "flm", "npu", "v0.9.34").unwrap();
        assert_eq!(
            a.url("https://github.com/"),
            "https://github.com/ROCm/FastFlowLM/releases/download/v0.9.34/fastflowlm_0.9.34_linux.tar.gz"
        );
        let (_, s) = state(&hw, &pins, "llamacpp", "rocm", &Installed::Missing);
        assert_eq!(s.state, "unsupported");
        let (_, s) = state(&hw, &pins, "whispercpp", "cpu", &Installed::Missing);
        assert_eq!(
            (s.state, s.message.as_str()),
            ("unsupported", "whispercpp:cpu has no release archive for this platform; set LEMONADE_WHISPERCPP_CPU_BIN to a binary built from source.")
        );
        let (_, s) = state(&hw, &pins, "whispercpp", "cpu", &Installed::Override("LEMONADE_WHISPERCPP_CPU_BIN".into()));
        assert_eq!(s.state, "installed");
        let built = Installed::Managed(Some("pywhispercpp-1.5.1-cpu-avx2".into()));
        let (_, s) = state(&hw, &pins, "whispercpp", "cpu", &built);
        assert_eq!((s.state, s.version.as_str()), ("installed", "pywhispercpp-1.5.1-cpu-avx2"));
        let win = Hardware { os: "windows".into(), ..linux() };
        let (_, s) = state(&win, &pins, "whispercpp", "cpu", &Installed::Missing);
        assert_eq!(s.state, "installable");
        let (_, s) = state(&hw, &pins, "llamacpp", "system", &Installed::Missing);
        assert_eq!(s.state, "unsupported");
        let (_, s) = state(&hw, &pins, "llamacpp", "system", &Installed::System("/usr/bin/llama-server".into()));
        assert_eq!((s.state, s.version.as_str()), ("installed", "system"));
        let win_npu = Hardware { os: "windows".into(), xdna2_npu: true, ..linux() };
        let (d, s) = state(&win_npu, &pins, "ryzenai-llm", "npu", &Installed::Missing);
        assert_eq!((d, s.state), (vec!["amd_npu"], "installable"));
    }
}
