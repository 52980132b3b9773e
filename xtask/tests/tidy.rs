//! Tidy checks (as rust-analyzer's): the shape of the workspace, enforced by `cargo test`.
//!
//! * The pure crates (api-types, registry, scheduler, backends) depend on no async runtime,
//!   HTTP client or server (read from `cargo metadata`), and their sources touch no file,
//!   socket, process or environment variable.
//! * The server has no process-wide mutable statics, and its handlers stay short.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const PURE: [&str; 5] =
    ["lemonade-api-types", "lemonade-registry", "lemonade-scheduler", "lemonade-backends", "lemonade-dialects"];
const FORBIDDEN_DEPS: [&str; 5] = ["tokio", "reqwest", "hyper", "mio", "socket2"];
/// What a pure crate's source must not mention (outside comments).
const FORBIDDEN_SOURCE: [&str; 10] = [
    "std::fs",
    "fs::",
    "File::",
    "OpenOptions",
    "std::net",
    "std::process",
    "env::var",
    "tokio",
    "reqwest",
    "std::io::stdin",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Package name → the names of its normal (non-dev, non-build) dependencies, resolved.
fn normal_deps(meta: &serde_json::Value) -> (BTreeMap<String, String>, BTreeMap<String, Vec<String>>) {
    let names: BTreeMap<String, String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap().to_string(), p["name"].as_str().unwrap().to_string()))
        .collect();
    let mut deps = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let id = node["id"].as_str().unwrap().to_string();
        let normal: Vec<String> = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["dep_kinds"].as_array().unwrap().iter().any(|k| k["kind"].is_null()))
            .map(|d| d["pkg"].as_str().unwrap().to_string())
            .collect();
        deps.insert(id, normal);
    }
    (names, deps)
}

#[test]
fn pure_crates_depend_on_no_runtime_or_network_stack() {
    let meta = metadata();
    let (names, deps) = normal_deps(&meta);
    for pure in PURE {
        let start = names.iter().find(|(_, n)| *n == pure).map(|(id, _)| id.clone()).expect(pure);
        let mut seen = BTreeSet::new();
        let mut stack = vec![(start, vec![pure.to_string()])];
        while let Some((id, path)) = stack.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            let name = &names[&id];
            assert!(
                !FORBIDDEN_DEPS.contains(&name.as_str()),
                "{pure} depends on {name} (through {}): a pure crate must not",
                path.join(" → ")
            );
            for d in &deps[&id] {
                let mut p = path.clone();
                p.push(names[d].clone());
                stack.push((d.clone(), p));
            }
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file, without comments (line comments; doc comments are line comments).
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.split("//").next().unwrap_or("")))
        .filter(|(_, l)| !l.trim().is_empty())
}

#[test]
fn pure_crates_do_no_io() {
    let dirs = ["api-types", "registry", "scheduler", "backends", "dialects"];
    let mut bad = Vec::new();
    for d in dirs {
        let mut files = Vec::new();
        rust_files(&root().join("crates").join(d).join("src"), &mut files);
        assert!(!files.is_empty(), "no sources under crates/{d}");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            // Test-only files (declared under `#[cfg(test)]`) may read their scale from the
            // environment (SCHEDULER_SIM_SEEDS); nothing else.
            let test_file = f.file_name().is_some_and(|n| n.to_string_lossy().ends_with("tests.rs"));
            for (n, line) in code_lines(&text) {
                for word in FORBIDDEN_SOURCE {
                    if line.contains(word) && !(test_file && word == "env::var") {
                        bad.push(format!("{}:{n}: `{word}` in `{}`", f.display(), line.trim()));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "I/O in a pure crate (move it to crates/host):\n{}", bad.join("\n"));
}

#[test]
fn the_server_has_no_process_wide_mutable_statics() {
    let mut files = Vec::new();
    rust_files(&root().join("crates/server/src"), &mut files);
    let mut bad = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in code_lines(&text) {
            let t = line.trim_start();
            if t.starts_with("static ") || t.starts_with("pub static ") || t.starts_with("static mut") {
                bad.push(format!("{}:{n}: {}", f.display(), t));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "process-wide statics in the server (keep state in Runtime or Config):\n{}",
        bad.join("\n")
    );
}

/// Handlers (the `pub async fn`s of crates/server/src/api) stay at 30 lines or fewer,
/// signature and closing brace included; domain work belongs in the layers below.
#[test]
fn handlers_are_short() {
    let mut files = Vec::new();
    rust_files(&root().join("crates/server/src/api"), &mut files);
    let mut long = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i].starts_with("pub async fn ") {
                let start = i;
                while i < lines.len() && lines[i] != "}" {
                    i += 1;
                }
                let len = i - start + 1;
                if len > 30 {
                    let name = lines[start].trim_start_matches("pub async fn ").split('(').next().unwrap_or("");
                    long.push(format!("{}:{}: {name} has {len} lines", f.display(), start + 1));
                }
            }
            i += 1;
        }
    }
    assert!(long.is_empty(), "handlers over 30 lines:\n{}", long.join("\n"));
}

/// The server's modules form layers: no module imports (through `crate::…`) a module that
/// imports it back, directly or through others. `api` counts as one module.
#[test]
fn server_modules_do_not_import_in_a_circle() {
    let src = root().join("crates/server/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let module_of = |f: &Path| -> String {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().to_string();
        first.trim_end_matches(".rs").to_string()
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let m = module_of(f);
        let text = std::fs::read_to_string(f).unwrap();
        // Imports in test modules do not count: tests may reach anywhere.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (_, line) in code_lines(code) {
            for part in line.split("crate::").skip(1) {
                let target: String = part.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                let target = if target == "api" { "api".to_string() } else { target };
                let is_module = files.iter().any(|g| module_of(g) == target);
                if is_module && target != m && target != "lib" {
                    edges.entry(m.clone()).or_default().insert(target);
                }
            }
            // `use crate::{a, b}` groups.
            if let Some(group) = line.split("crate::{").nth(1) {
                for name in group.split(['}', ',']).map(|s| s.trim().split("::").next().unwrap_or("").to_string()) {
                    if files.iter().any(|g| module_of(g) == name) && name != m {
                        edges.entry(m.clone()).or_default().insert(name);
                    }
                }
            }
        }
    }
    // Depth-first search for a cycle.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(cycle) = visit(n, &edges, &mut Vec::new(), &mut done) {
            panic!("server modules import in a circle: {}\nall imports: {edges:#?}", cycle.join(" → "));
        }
    }
}
