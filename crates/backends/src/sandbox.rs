//! What a backend process may touch: the confinement policy lemonade asks the kernel to hold
//! it to (host applies it with Landlock between fork and exec). Decided here, from the launch
//! alone: no file is opened, no path resolved.
//!
//! A backend parses untrusted model files and untrusted prompts in native code; a bug there
//! must not reach the user's keys, their other files, the other models or the network:
//! * it reads (and executes) the system's libraries, its own install folder and the model
//!   files its command line names (in the Hugging Face cache: that repository's folder, whose
//!   snapshots link into its blobs), nothing else of `$HOME`;
//! * it writes only its scratch folder (its `TMPDIR`) and its slot-save folder;
//! * it opens only the device nodes a GPU or NPU runtime needs, never a disk;
//! * it binds TCP only on its own port (or the ephemeral one the kernel picks for `--port 0`)
//!   and connects only to the RPC workers it was given;
//! * it cannot signal, trace or read the memory of processes outside its sandbox (lemonade
//!   among them), nor reach abstract UNIX sockets made outside it; it reads no process's
//!   folder in `/proc` (another's `environ` would hold lemonade's keys).

use std::path::{Path, PathBuf};

/// How hard lemonade confines its backends (`--sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every rule is enforced, or the backend does not start.
    Strict,
    /// What the kernel supports is enforced; what it lacks is named in a warning and in the
    /// backend's status.
    BestEffort,
    /// Backends run with all of the user's rights.
    Off,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "strict" => Some(Mode::Strict),
            "best-effort" | "best_effort" => Some(Mode::BestEffort),
            "off" => Some(Mode::Off),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Strict => "strict",
            Mode::BestEffort => "best-effort",
            Mode::Off => "off",
        }
    }
}

/// The Landlock ABI each part of the policy needs.
pub const ABI_FILESYSTEM: u32 = 1;
/// Truncation rights (ABI 3) and device ioctls (ABI 5) complete the file rules.
pub const ABI_FILESYSTEM_FULL: u32 = 5;
pub const ABI_NETWORK: u32 = 4;
pub const ABI_SCOPES: u32 = 6;

/// What a kernel of Landlock ABI `abi` (0: none) cannot enforce of the policy, in words; empty
/// when it enforces all of it.
pub fn missing(abi: u32) -> Vec<String> {
    let mut out = Vec::new();
    if abi < ABI_FILESYSTEM {
        out.push("Landlock (Linux 5.13+, with landlock in the lsm= boot list): backends can read and write every file the user can".to_string());
    } else if abi < ABI_FILESYSTEM_FULL {
        out.push(format!("Landlock ABI {ABI_FILESYSTEM_FULL} (Linux 6.10+): truncation and device ioctl rules"));
    }
    if abi < ABI_NETWORK {
        out.push(format!(
            "Landlock ABI {ABI_NETWORK} (Linux 6.7+): TCP bind and connect rules, so backends can reach the network"
        ));
    }
    if abi < ABI_SCOPES {
        out.push(format!("Landlock ABI {ABI_SCOPES} (Linux 6.12+): signal and abstract UNIX socket scoping"));
    }
    out
}

/// The confinement of one backend process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Read and execute beneath these (files or folders); a missing one is skipped.
    pub read: Vec<PathBuf>,
    /// Read, write, create and remove beneath these.
    pub write: Vec<PathBuf>,
    /// Device nodes (or folders of them) opened read-write, with ioctls.
    pub devices: Vec<PathBuf>,
    /// TCP ports it may bind; 0 stands for the ephemeral port the kernel picks.
    pub bind: Vec<u16>,
    /// TCP ports it may connect to.
    pub connect: Vec<u16>,
    /// Its scratch folder, which it writes and gets as its `TMPDIR`.
    pub scratch: Option<PathBuf>,
}

/// What every backend reads: the dynamic loader's and the C library's files, the system's
/// libraries and tools (a launcher script's `/bin/sh`), the GPU runtimes' installs, and the
/// kernel's views of the CPU, memory and devices (a few files of `/proc`, never the processes'
/// folders).
pub const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/opt/rocm",
    "/opt/amdgpu",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/os-release",
    "/etc/alternatives",
    "/etc/vulkan",
    "/etc/OpenCL",
    "/etc/glvnd",
    // The kernel's views of the machine, never `/proc` whole: Landlock does not refuse a
    // read of another process's /proc/<pid>/environ (measured: it refuses ptrace and /mem, not
    // environ), which would hand a backend lemonade's keys.
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/filesystems",
    "/proc/sys/kernel",
    "/proc/sys/vm",
    "/proc/driver",
    "/sys",
];

/// The device nodes a backend may open: the usual character devices, and those of the GPU and
/// NPU runtimes (DRM render nodes, ROCm's KFD, NVIDIA's nodes, the accel NPUs). Never a disk.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/dri",
    "/dev/kfd",
    "/dev/accel",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps",
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidia2",
    "/dev/nvidia3",
    "/dev/nvidia4",
    "/dev/nvidia5",
    "/dev/nvidia6",
    "/dev/nvidia7",
];

/// What a backend started as `program` may touch: the system's files, `program`'s folder
/// (`runtime` adds what its interpreter needs, e.g. a venv's Python), the `models` it serves
/// (see [`readable_root`]); its `scratch` folder and other `writes` (its slot-save folder) to
/// write; `port` to bind
/// (None: the ephemeral port of `--port 0`); `workers` to connect to.
///
/// Only lemonade's own paths are granted: a path in a client's `llamacpp_args` (a
/// `--chat-template-file`, a `--slot-save-path`) is not, so a load request cannot open the
/// user's files to a backend.
pub fn policy(
    program: &Path,
    runtime: &[PathBuf],
    models: &[&Path],
    (scratch, writes): (&Path, &[PathBuf]),
    port: Option<u16>,
    workers: &[u16],
) -> Policy {
    let mut p = Policy {
        read: SYSTEM_READ.iter().map(PathBuf::from).collect(),
        devices: DEVICES.iter().map(PathBuf::from).collect(),
        write: std::iter::once(scratch.to_path_buf()).chain(writes.iter().cloned()).collect(),
        bind: vec![port.unwrap_or(0)],
        connect: workers.to_vec(),
        scratch: Some(scratch.to_path_buf()),
    };
    if let Some(dir) = program.parent().filter(|d| !d.as_os_str().is_empty()) {
        p.read.push(dir.to_path_buf());
    }
    p.read.extend(runtime.iter().cloned());
    p.read.extend(models.iter().filter(|m| m.is_absolute()).map(|m| readable_root(m)));
    p.read.sort();
    p.read.dedup();
    p.write.sort();
    p.write.dedup();
    p.connect.sort_unstable();
    p.connect.dedup();
    p
}

/// The absolute paths in the operator's own backend arguments (`--llamacpp-args` or
/// `config.json`'s, e.g. `--chat-template-file /path/t.jinja`): the files the operator gave
/// every backend, which it may read (each file itself, not its folder). A client's
/// `llamacpp_args` (a `/load` or saved options) grants nothing.
pub fn operator_files(args: &[&str]) -> Vec<PathBuf> {
    let tokens = args.iter().filter_map(|a| crate::llamacpp::tokenize(a).ok()).flatten();
    tokens
        .map(|t| t.split_once('=').filter(|(f, _)| f.starts_with('-')).map_or(t.clone(), |(_, v)| v.to_string()))
        .filter(|t| t.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// What a short run of a backend binary may touch (its `--help` and `--version`, an install's
/// check that it starts): the system's files and its own install to read, nothing to write,
/// no TCP port to bind or connect to.
pub fn probe_policy(program: &Path, runtime: &[PathBuf]) -> Policy {
    let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    read.extend(program.parent().filter(|d| !d.as_os_str().is_empty()).map(Path::to_path_buf));
    read.extend(runtime.iter().cloned());
    Policy { read, devices: DEVICES.iter().map(PathBuf::from).collect(), ..Policy::default() }
}

/// The folder a backend may read for a model file at `path`: in the Hugging Face cache, its
/// repository's folder (`models--org--name`, whose snapshots are links into its blobs, so
/// the file alone would not do); elsewhere the file's own folder (a GGUF beside its mmproj, a
/// Kokoro index beside its voices).
pub fn readable_root(path: &Path) -> PathBuf {
    for a in path.ancestors() {
        if a.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("models--")) {
            return a.to_path_buf();
        }
    }
    match path.extension() {
        Some(_) => path.parent().unwrap_or(path).to_path_buf(),
        None => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_llama_server_reads_its_repos_and_writes_its_scratch_and_slot_folders_only() {
        let hub = "/home/u/.cache/huggingface/hub";
        let chat = format!("{hub}/models--org--chat/snapshots/abc/chat.gguf");
        let mmproj = format!("{hub}/models--org--chat/snapshots/abc/mm.gguf");
        let draft = format!("{hub}/models--org--draft/snapshots/d/draft.gguf");
        let models = [Path::new(&chat), Path::new(&mmproj), Path::new(&draft)];
        let writes = [PathBuf::from("/home/u/.cache/lemonade/prompt-cache/x")];
        let program = Path::new("/home/u/.cache/lemonade/bin/llamacpp/cpu/llama-server");
        let scratch = Path::new("/home/u/.cache/lemonade/run/chat");
        let p = policy(program, &[], &models, (scratch, &writes), None, &[50052, 50052]);
        assert_eq!(p.scratch.as_deref(), Some(scratch));
        let home: Vec<_> = p.read.iter().filter(|r| r.starts_with("/home")).collect();
        assert_eq!(
            home,
            [
                Path::new("/home/u/.cache/huggingface/hub/models--org--chat"),
                Path::new("/home/u/.cache/huggingface/hub/models--org--draft"),
                Path::new("/home/u/.cache/lemonade/bin/llamacpp/cpu"),
            ]
        );
        assert_eq!(
            p.write,
            [Path::new("/home/u/.cache/lemonade/prompt-cache/x"), Path::new("/home/u/.cache/lemonade/run/chat")]
        );
        assert_eq!((p.bind, p.connect), (vec![0], vec![50052]));
        assert!(!p
            .devices
            .iter()
            .any(|d| d.starts_with("/dev/sd") || d.starts_with("/dev/nvme") || *d == Path::new("/dev")));
        for never in ["/", "/home", "/etc", "/proc", "/dev", "/tmp"] {
            assert!(!p.read.contains(&PathBuf::from(never)) && !p.write.contains(&PathBuf::from(never)), "{never}");
        }
    }

    #[test]
    fn a_model_outside_the_hub_cache_is_read_from_its_own_folder() {
        assert_eq!(readable_root(Path::new("/models/extra/a.gguf")), Path::new("/models/extra"));
        assert_eq!(readable_root(Path::new("/models/kokoro")), Path::new("/models/kokoro"));
        let p = policy(
            Path::new("/opt/koko/koko"),
            &[],
            &[Path::new("/m/k/index.json")],
            (Path::new("/s"), &[]),
            Some(9),
            &[],
        );
        assert!(p.read.contains(&PathBuf::from("/m/k")) && p.read.contains(&PathBuf::from("/opt/koko")));
        assert_eq!(p.bind, [9]);
    }

    #[test]
    fn the_operators_files_are_read_as_files() {
        let got = operator_files(&["--chat-template-file /t/chat.jinja --threads 2", "--lora=/l/a.gguf", "'"]);
        assert_eq!(got, [PathBuf::from("/t/chat.jinja"), PathBuf::from("/l/a.gguf")]);
    }

    #[test]
    fn modes_parse_and_what_a_kernel_lacks_is_named() {
        assert_eq!(Mode::parse("Best-Effort"), Some(Mode::BestEffort));
        assert_eq!(Mode::parse("strict").map(Mode::as_str), Some("strict"));
        assert_eq!(Mode::parse("on"), None);
        assert!(missing(7).is_empty());
        assert!(missing(6).is_empty());
        let m = missing(3);
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(m[1].contains("TCP bind and connect"));
        assert!(missing(0)[0].contains("every file the user can"));
    }
}
