//! Tidy checks (as rust-analyzer's): the shape of the workspace, enforced by `cargo test`.
//!
//! * The pure crates (api-types, registry, scheduler, backends) depend on no async runtime,
//!   HTTP client or server (read from `cargo metadata`), and their sources touch no file,
//!   socket, process or environment variable.
//! * The engine knows nothing of HTTP; `ApiError` lives only in the server.
//! * The server has no process-wide mutable statics, and every function of its handlers'
//!   modules stays short.
//! * No crate's modules import each other in a circle (server, engine, registry), with no
//!   module exempt.
//! * string errors (`Result<_, String>`, an error over one `String`) only in the named
//!   allow-list of at most five; no lock-poison idiom anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const PURE: [&str; 6] = [
    "lemonade-api-types",
    "lemonade-registry",
    "lemonade-scheduler",
    "lemonade-backends",
    "lemonade-dialects",
    "lemonade-routing",
];
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

/// A file's code without its `#[cfg(test)]` items (an inline test module, a test-only
/// function or `use`), each replaced by blank lines so line numbers stay true; the code after
/// a test module is read like the rest.
fn without_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        // The item ends at its first `;` before any `{`, or at the `}` matching its first `{`.
        let semi = item.find(';');
        let brace = item.find('{');
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (Some(s), None) => s + 1,
            (_, Some(b)) => closing_brace(item, b).map_or(item.len(), |e| e + 1),
            (None, None) => item.len(),
        };
        out.push_str(&"\n".repeat(item[..end].matches('\n').count()));
        rest = &item[end..];
    }
    out.push_str(rest);
    out
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
    let dirs = ["api-types", "registry", "scheduler", "backends", "dialects", "routing"];
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
        // A `task_local!` static is one request's, not the process's: allowed.
        let mut task_local = false;
        for (n, line) in code_lines(&text) {
            let t = line.trim_start();
            if t.contains("task_local!") {
                task_local = true;
            } else if task_local && t.starts_with('}') {
                task_local = false;
            }
            if task_local {
                continue;
            }
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

/// Every function in crates/server/src/api (handlers and their helpers, public or not) is 30
/// lines or fewer, signature and closing brace included; domain work belongs in the engine.
#[test]
fn every_function_of_the_handlers_is_short() {
    let mut files = Vec::new();
    rust_files(&root().join("crates/server/src/api"), &mut files);
    let mut long = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // Test modules are not handlers.
        let code = without_tests(&text);
        let lines: Vec<&str> = code.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let t = lines[i].trim_start();
            let indent = lines[i].len() - t.len();
            let is_fn = ["fn ", "pub fn ", "async fn ", "pub async fn ", "pub(crate) fn ", "pub(crate) async fn "]
                .iter()
                .any(|p| t.starts_with(p));
            if is_fn && !t.ends_with(';') {
                let start = i;
                let close = format!("{}}}", " ".repeat(indent));
                while i < lines.len() && lines[i] != close {
                    i += 1;
                }
                let len = i - start + 1;
                if len > 30 {
                    let name = t.split("fn ").nth(1).unwrap_or("").split(['(', '<']).next().unwrap_or("");
                    long.push(format!("{}:{}: {name} has {len} lines", f.display(), start + 1));
                }
            }
            i += 1;
        }
    }
    assert!(long.is_empty(), "functions over 30 lines in the handlers' modules:\n{}", long.join("\n"));
}

/// The modules of `src` (a crate's source folder) as a graph: module → the modules it uses.
/// A file's module is its first path component under `src` (`foo/x.rs` is `foo`), except that
/// each file of the server's handler folder is a module of its own (`api/x.rs` is `api/x`, and
/// `api/mod.rs` is `api`). Edges: `crate::m…` and `use crate::{m, …}` for a module `m`
/// (`crate::api::x` and `super::x` from a handler are `api/x`); `crate::Item` of an item the
/// crate root defines or re-exports is an edge to `lib`; and `lib.rs` itself uses `m` by `m::…`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let module_of = |f: &Path| -> String {
        let rel = f.strip_prefix(src).unwrap();
        let parts: Vec<String> =
            rel.components().map(|c| c.as_os_str().to_string_lossy().trim_end_matches(".rs").to_string()).collect();
        match parts.as_slice() {
            [dir, file] if dir == "api" && file != "mod" => format!("api/{file}"),
            [first, ..] => first.clone(),
            [] => unreachable!(),
        }
    };
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let m = module_of(f);
        let text = std::fs::read_to_string(f).unwrap();
        // Imports in test items do not count: tests may reach anywhere. A `use` over several
        // lines is read as one line.
        let code = joined_uses(&without_tests(&text));
        let mut add = |target: String| {
            if target != m && !target.is_empty() {
                edges.entry(m.clone()).or_default().insert(target);
            }
        };
        for (_, line) in code_lines(&code) {
            let mut paths: Vec<&str> = line.split("crate::").skip(1).collect();
            let group: Vec<String> = line
                .split("crate::{")
                .nth(1)
                .map(|g| g.split('}').next().unwrap_or("").split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default();
            paths.extend(group.iter().map(String::as_str));
            let mut targets: Vec<String> = Vec::new();
            for p in paths {
                let first = ident(p);
                if first == "api" {
                    // `api::x…` or `api::{x, y}`: each handler named, else the folder's mod.rs.
                    let rest = p["api".len()..].strip_prefix("::").unwrap_or("");
                    let named: Vec<String> = if let Some(g) = rest.strip_prefix('{') {
                        g.split('}').next().unwrap_or("").split(',').map(|s| ident(s.trim())).collect()
                    } else {
                        vec![ident(rest)]
                    };
                    let named: Vec<String> =
                        named.into_iter().map(|n| format!("api/{n}")).filter(|n| modules.contains(n)).collect();
                    if named.is_empty() {
                        targets.push("api".into());
                    }
                    targets.extend(named);
                } else {
                    targets.push(first);
                }
            }
            if m.starts_with("api/") {
                for p in line.split("super::").skip(1) {
                    let n = format!("api/{}", ident(p));
                    targets.push(if modules.contains(&n) { n } else { "api".into() });
                }
            }
            for t in targets.into_iter().filter(|t| !t.is_empty()) {
                add(if modules.contains(&t) { t } else { "lib".to_string() });
            }
            if m == "lib" && !line.trim_start().starts_with("pub mod ") && !line.trim_start().starts_with("mod ") {
                for word in line.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
                    if let Some(first) =
                        word.strip_suffix("::").or(word.split("::").next().filter(|_| word.contains("::")))
                    {
                        if modules.contains(first) && first != "lib" {
                            add(first.to_string());
                        }
                    }
                }
            }
        }
    }
    edges
}

/// `code` with each `use …;` that spans lines joined into one line (blank lines keep the
/// numbering).
fn joined_uses(code: &str) -> String {
    let mut out = Vec::new();
    let mut open: Option<String> = None;
    for line in code.lines() {
        match open.take() {
            Some(mut u) => {
                u.push(' ');
                u.push_str(line.trim());
                if line.contains(';') {
                    out.push(u);
                } else {
                    open = Some(u);
                }
                out.push(String::new());
            }
            None => {
                let t = line.trim_start();
                if (t.starts_with("use ") || t.starts_with("pub use ")) && !t.contains(';') {
                    open = Some(line.to_string());
                } else {
                    out.push(line.to_string());
                }
            }
        }
    }
    out.extend(open);
    out.join("\n")
}

/// The first circle in `edges`, if any.
fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
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
    edges.keys().find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

/// The server's (each handler file its own module), the engine's, the registry's and host's
/// modules form layers: no module imports one
/// that imports it back, directly or through others; the crate root (`lib`) is a module like
/// any other.
#[test]
fn no_crate_has_modules_that_import_in_a_circle() {
    for krate in ["server", "engine", "registry", "host"] {
        let edges = module_graph(&root().join("crates").join(krate).join("src"));
        assert!(edges.contains_key("lib"), "{krate}: the crate root's uses were not read: {edges:#?}");
        if let Some(c) = circle(&edges) {
            panic!("{krate}'s modules import in a circle: {}\nall imports: {edges:#?}", c.join(" → "));
        }
    }
    // The check can fail: a graph with a circle through the root is caught.
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("lib".into()).or_default().insert("pulls".into());
    g.entry("pulls".into()).or_default().insert("lib".into());
    assert_eq!(circle(&g), Some(vec!["lib".into(), "pulls".into(), "lib".into()]));
}

/// The engine is the application without HTTP: none of the HTTP server's crates among its
/// dependencies, none of its types in its sources.
#[test]
fn the_engine_knows_nothing_of_http() {
    // The engine's whole tree as a build of the engine alone resolves it (`cargo tree -p`), so
    // the server's features (api-types' `openapi`) do not count against it.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", "lemonade-engine", "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(root())
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    let names: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    for forbidden in ["axum", "axum-core", "utoipa", "utoipa-swagger-ui", "tower-http"] {
        assert!(
            !names.contains(forbidden),
            "lemonade-engine depends on {forbidden} (HTTP serving belongs to the server)"
        );
    }
    let mut files = Vec::new();
    rust_files(&root().join("crates/engine/src"), &mut files);
    let mut bad = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in code_lines(&text) {
            for word in ["axum", "utoipa", "ApiError", "StatusCode", "http::"] {
                if line.contains(word) {
                    bad.push(format!("{}:{n}: `{word}` in `{}`", f.display(), line.trim()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "HTTP in the engine:\n{}", bad.join("\n"));
}

/// `ApiError` (the HTTP error) is the server's alone: the layers below have their own errors.
#[test]
fn api_error_appears_only_in_the_server() {
    let mut files = Vec::new();
    for dir in ["crates", "tests/src", "xtask/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    let server = root().join("crates/server");
    let bad: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(&server))
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            // Comments too: the layers below do not even talk about it.
            let hit = text.lines().enumerate().find(|(_, l)| l.contains("ApiError"));
            hit.map(|(n, l)| format!("{}:{}: {}", f.display(), n + 1, l.trim()))
        })
        .collect();
    assert!(bad.is_empty(), "ApiError outside crates/server:\n{}", bad.join("\n"));
}

/// Where a string error is allowed in product code (a `Result<_, String>` in the named
/// function, or the named tuple struct over one `String` used as an error), and why: the string
/// is the whole answer (a message a client, a model or the log reads as it is), and nothing
/// branches on it. At most five, all kinds together.
const STRING_ERRORS: &[(&str, &str, &str)] = &[
    ("crates/host/src/cloud.rs", "discover", "a provider's last probe error, shown as is"),
    ("crates/routing/src/omni.rs", "Failure", "what the planner model is told of a failed tool"),
    ("crates/dialects/src/mcp.rs", "ToolError", "an MCP tool's error text, the client's to read"),
    ("crates/dialects/src/lib.rs", "BadRequest", "a 400's message from a dialect's translation"),
    ("crates/backends/src/flm.rs", "FlmArgsError", "a 400's message naming the flm_args token"),
];

/// The string errors of product code: `Result<_, String>` (by the function it is in) and
/// tuple structs over one `String` that are errors (a `thiserror` derive, or the error type of
/// a `Result`), each as (file, function or struct, line, text).
fn string_errors() -> Vec<(String, String, usize, String)> {
    let mut files = Vec::new();
    rust_files(&root().join("crates"), &mut files);
    let mut found = Vec::new();
    let mut newtypes = Vec::new();
    let mut error_types = BTreeSet::new();
    for f in files.iter().filter(|f| f.components().any(|c| c.as_os_str() == "src")) {
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        if rel.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let code = without_tests(&text);
        // The function the line is in (the last `fn name(` seen), for the allow-list.
        let mut within = String::new();
        let mut derives_error: u32 = 0;
        for (n, line) in code_lines(&code) {
            if let Some(name) = line.split("fn ").nth(1).map(|r| r.split(['(', '<']).next().unwrap_or("")) {
                if !line.contains("|") {
                    within = name.to_string();
                }
            }
            let t = line.trim_start();
            derives_error = if t.contains("thiserror::Error") { 3 } else { derives_error.saturating_sub(1) };
            if let Some(rest) = t.strip_prefix("pub struct ").or(t.strip_prefix("struct ")) {
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                let fields = rest[name.len()..].trim();
                if fields.starts_with("(pub String)") || fields.starts_with("(String)") {
                    newtypes.push((rel.clone(), name, n, line.trim().to_string(), derives_error > 0));
                }
            }
            let mut from = 0;
            while let Some(at) = line[from..].find("Result<") {
                let rest = &line[from + at..];
                let end = rest.find(['{', ';', '=']).unwrap_or(rest.len());
                if let Some(e) = rest[..end].rsplit(", ").next() {
                    error_types.insert(e.trim_end_matches(['>', ')', ' ']).to_string());
                }
                from += at + "Result<".len();
            }
            let Some(at) = line.find("Result<") else { continue };
            let rest = &line[at..];
            let end = rest.find(['{', ';', '=']).unwrap_or(rest.len());
            // A static or a type alias holding such a result is the function's that fills it.
            if rest[..end].contains(", String>") && !t.starts_with("static ") && !t.starts_with("type ") {
                found.push((rel.clone(), within.clone(), n, line.trim().to_string()));
            }
        }
    }
    for (rel, name, n, text, derives) in newtypes {
        if derives || error_types.contains(&name) {
            found.push((rel, name, n, text));
        }
    }
    found
}

/// No string error in product code (outside tests) but the allow-list above, and the list
/// holds at most five.
#[test]
fn string_errors_only_where_allowed() {
    assert!(STRING_ERRORS.len() <= 5, "at most five string errors may be allowed");
    let found = string_errors();
    let bad: Vec<String> = found
        .iter()
        .filter(|(file, name, ..)| !STRING_ERRORS.iter().any(|(f, n, _)| file == f && name == n))
        .map(|(file, _, n, text)| format!("{file}:{n}: {text}"))
        .collect();
    assert!(bad.is_empty(), "string errors outside the allow-list (give the error a type):\n{}", bad.join("\n"));
    // Each allowed one still exists (a stale entry would hide a new one under its name).
    for (f, n, _) in STRING_ERRORS {
        assert!(found.iter().any(|(file, name, ..)| file == f && name == n), "allow-list entry {f} {n} is stale");
    }
}

/// The engine's, the server's and host's locks are parking_lot's, which cannot be poisoned:
/// the idiom that ignored poisoning is gone everywhere.
#[test]
fn no_lock_poison_idiom() {
    let mut files = Vec::new();
    for dir in ["crates", "tests/src", "xtask/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    let idiom = ["unwrap_or_else(|e| e.into_", "inner())"].concat();
    let bad: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let hit = code_lines(&text).find(|(_, l)| l.contains(&idiom));
            hit.map(|(n, _)| format!("{}:{n}", f.display()))
        })
        .collect();
    assert!(bad.is_empty(), "lock-poison idiom (use parking_lot's locks):\n{}", bad.join("\n"));
}

/// Load options are typed (`api_types::LoadOptions`): below api-types, no code looks one up
/// by its wire name in a JSON map (`.get("ctx_size")`, `["steps"]`, `.insert("llamacpp_args"`),
/// and the untyped `RecipeOptions` map is gone. Tests may build maps by name.
#[test]
fn load_options_are_read_as_fields() {
    let mut files = Vec::new();
    rust_files(&root().join("crates"), &mut files);
    let mut bad = Vec::new();
    for f in files.iter().filter(|f| !f.starts_with(root().join("crates/api-types"))) {
        let text = std::fs::read_to_string(f).unwrap();
        if f.file_name().is_some_and(|n| n.to_string_lossy().ends_with("tests.rs"))
            || f.to_string_lossy().contains("/tests/")
        {
            continue;
        }
        for (n, line) in code_lines(&without_tests(&text)) {
            let by_name = api_types::OptionKey::ALL.iter().any(|k| {
                let w = k.as_str();
                [
                    format!(".get(\"{w}\")"),
                    format!("[\"{w}\"]"),
                    format!(".insert(\"{w}\""),
                    format!(".remove(\"{w}\")"),
                ]
                .iter()
                .any(|p| line.contains(p.as_str()))
            });
            if by_name || line.contains("RecipeOptions") {
                bad.push(format!("{}:{n}: {}", f.display(), line.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "a load option looked up by name (read LoadOptions' fields):\n{}", bad.join("\n"));
}

/// The index of the `}` that closes the `{` at `open` in `code` (literals are not parsed).
fn closing_brace(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `(start, end)` byte ranges of the bodies of the `async fn`s in `code` (braces matched;
/// string and char literals are not parsed, which the crates' code does not need).
fn async_fn_bodies(code: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("async fn ") {
        let start = from + at;
        let Some(open) = code[start..].find('{').map(|o| start + o) else { break };
        // A declaration without a body (a trait's) ends with `;` before any `{`.
        if code[start..open].contains(';') {
            from = start + 1;
            continue;
        }
        out.push((open, closing_brace(code, open).unwrap_or(code.len())));
        from = open + 1;
    }
    out
}

/// Whether the `std::fs` call at `at` in `body` runs off the async threads: inside a closure
/// given to `spawn_blocking` (the server's) or `offload` (the engine's and host's), directly or
/// by the name it was bound to.
fn off_the_async_threads(body: &str, at: usize) -> bool {
    // A closure without braces, given on the call's own line: `offload(move || std::fs::…)`.
    let line = &body[body[..at].rfind('\n').map_or(0, |n| n + 1)..at];
    if ["spawn_blocking(", "offload(", "offload_io("].iter().any(|f| line.contains(f)) {
        return true;
    }
    // The opening lines of the blocks around `at`, innermost last.
    let mut open: Vec<usize> = Vec::new();
    for (i, c) in body[..at].char_indices() {
        match c {
            '{' => open.push(i),
            '}' => {
                open.pop();
            }
            _ => {}
        }
    }
    open.iter().any(|&o| {
        let line_start = body[..o].rfind('\n').map_or(0, |n| n + 1);
        let line = &body[line_start..o];
        if ["spawn_blocking(", "offload(", "offload_io("].iter().any(|f| line.contains(f)) {
            return true;
        }
        let bound = line
            .trim_start()
            .strip_prefix("let ")
            .map(|r| r.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>());
        bound.is_some_and(|name| {
            line.contains('|')
                && ["spawn_blocking", "offload", "offload_io"].iter().any(|f| body.contains(&format!("{f}({name})")))
        })
    })
}

/// No `std::fs` call on the async threads of the engine and the server: file work in an
/// `async fn` goes through `host::offload` (the engine) or `spawn_blocking` (the server).
#[test]
fn no_std_fs_in_async_fns() {
    let mut bad = Vec::new();
    for krate in ["engine", "server"] {
        let mut files = Vec::new();
        rust_files(&root().join("crates").join(krate).join("src"), &mut files);
        for f in files {
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            if rel.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let code: String = without_tests(&text)
                .lines()
                .map(|l| if l.trim_start().starts_with("//") { "" } else { l })
                .collect::<Vec<_>>()
                .join("\n");
            for (start, end) in async_fn_bodies(&code) {
                let body = &code[start..end];
                for (at, _) in body.match_indices("std::fs::") {
                    if !off_the_async_threads(body, at) {
                        let line = code[..start + at].lines().count();
                        bad.push(format!("{rel}:{line}"));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "std::fs on an async thread (use host::offload):\n{}", bad.join("\n"));
    // The check can fail, and sees through a named closure handed to spawn_blocking.
    let code = "async fn f() {\n    let w = move || {\n        std::fs::read(\"a\")\n    };\n    spawn_blocking(w).await;\n    std::fs::read(\"b\");\n}";
    let (s, e) = async_fn_bodies(code)[0];
    let found: Vec<bool> =
        code[s..e].match_indices("std::fs::").map(|(at, _)| off_the_async_threads(&code[s..e], at)).collect();
    assert_eq!(found, [true, false]);
}

/// The layers docs/ARCHITECTURE.md states for `krate`: its line `- <krate>: a → {b, c} → d`
/// under "Module layers", each group a list of module names (`api/*`: every handler file).
fn documented_layers(krate: &str) -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let section =
        doc.split("### Module layers").nth(1).expect("docs/ARCHITECTURE.md has a '### Module layers' section");
    // A line and its continuations (indented lines after it).
    let mut text = String::new();
    let mut on = false;
    for line in section.lines() {
        if line.starts_with(&format!("- {krate}:")) {
            on = true;
            text.push_str(&line[krate.len() + 3..]);
        } else if on && line.starts_with("  ") && !line.trim_start().starts_with("- ") {
            text.push(' ');
            text.push_str(line.trim());
        } else if on {
            break;
        }
    }
    assert!(!text.is_empty(), "no '- {krate}:' line under '### Module layers'");
    text.split('→')
        .map(|g| {
            g.trim()
                .trim_end_matches('.')
                .trim_matches(['{', '}'])
                .split(',')
                .map(|m| m.trim().trim_matches('`').to_string())
                .filter(|m| !m.is_empty())
                .collect()
        })
        .collect()
}

/// Each layer's modules, by the longest import path below it (for a failure's message).
fn suggested_layers(edges: &BTreeMap<String, BTreeSet<String>>, modules: &BTreeSet<String>) -> String {
    fn depth(m: &str, e: &BTreeMap<String, BTreeSet<String>>, memo: &mut BTreeMap<String, usize>) -> usize {
        if let Some(d) = memo.get(m) {
            return *d;
        }
        memo.insert(m.to_string(), 0);
        let d = e.get(m).into_iter().flatten().map(|n| depth(n, e, memo) + 1).max().unwrap_or(0);
        memo.insert(m.to_string(), d);
        d
    }
    let mut memo = BTreeMap::new();
    let mut by: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for m in modules {
        by.entry(depth(m, edges, &mut memo)).or_default().push(m);
    }
    by.values().rev().map(|g| format!("{{{}}}", g.join(", "))).collect::<Vec<_>>().join(" → ")
}

/// docs/ARCHITECTURE.md's module layers for the server and the engine are true: every module
/// is named in one layer, and each imports only modules of its own layer or of layers to its
/// right.
#[test]
fn the_documented_layers_match_the_imports() {
    for krate in ["server", "engine"] {
        let edges = module_graph(&root().join("crates").join(krate).join("src"));
        let layers = documented_layers(krate);
        let mut modules: BTreeSet<String> = edges.keys().cloned().collect();
        modules.extend(edges.values().flatten().cloned());
        let mut files = Vec::new();
        rust_files(&root().join("crates").join(krate).join("src"), &mut files);
        let layer_of = |m: &str| -> Option<usize> {
            layers.iter().position(|g| {
                g.iter().any(|p| p == m || p.strip_suffix('*').is_some_and(|pre| m.starts_with(pre) && m != "api"))
            })
        };
        let unnamed: Vec<&String> = modules.iter().filter(|m| layer_of(m).is_none()).collect();
        let mut bad: Vec<String> = unnamed.iter().map(|m| format!("{m} is in no layer")).collect();
        for (from, tos) in &edges {
            for to in tos {
                if let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) {
                    if b < a {
                        bad.push(format!("{from} (layer {a}) imports {to} (layer {b})"));
                    }
                }
            }
        }
        assert!(
            bad.is_empty(),
            "{krate}: docs/ARCHITECTURE.md's layers are not the code's:\n{}\nthe imports give: {}",
            bad.join("\n"),
            suggested_layers(&edges, &modules)
        );
    }
}

/// docs/ARCHITECTURE.md's offload invariant: the engine and host run blocking work through
/// `host::offload` (which the simulation runs on its one thread), never `spawn_blocking` or
/// `tokio::fs` themselves; the downloader's writer thread, which the simulation replaces with
/// writes in place, is the one exception.
#[test]
fn blocking_work_goes_through_offload() {
    let mut bad = Vec::new();
    for krate in ["engine", "host"] {
        let mut files = Vec::new();
        rust_files(&root().join("crates").join(krate).join("src"), &mut files);
        for f in files {
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            if rel.ends_with("tests.rs") || rel.ends_with("host/src/offload.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            for (n, line) in code_lines(&without_tests(&text)) {
                let writer = rel.ends_with("host/src/download.rs")
                    && line.contains("spawn_blocking(move || -> std::io::Result<String>");
                if (line.contains("spawn_blocking(") || line.contains("tokio::fs::")) && !writer {
                    bad.push(format!("{rel}:{n}: {}", line.trim()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "blocking work not through host::offload:\n{}", bad.join("\n"));
}

/// docs/ARCHITECTURE.md's sim invariant: the simulation reads no real clock, sleeps for real
/// nowhere, opens no socket and runs nothing off its thread (main.rs, which times the whole
/// run, aside); and the engine's `testing` feature (the fake launcher, the mutations, the
/// simulated disk) is turned on by no crate the release binary is built from.
#[test]
fn the_simulation_is_deterministic_by_construction() {
    let mut bad = Vec::new();
    for file in ["lib.rs", "world.rs", "backend.rs", "rng.rs", "upstream.rs", "hub.rs"] {
        let path = root().join("crates/sim/src").join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in code_lines(&text) {
            for word in [
                "std::time::Instant",
                "SystemTime",
                "thread::sleep",
                "thread::spawn",
                "spawn_blocking",
                "TcpStream",
                "TcpListener",
                "UdpSocket",
                "rand::",
            ] {
                if line.contains(word) {
                    bad.push(format!("crates/sim/src/{file}:{n}: `{word}` in `{}`", line.trim()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "the simulation would not replay:\n{}", bad.join("\n"));
    for krate in ["server", "cli"] {
        let manifest = std::fs::read_to_string(root().join("crates").join(krate).join("Cargo.toml")).unwrap();
        let deps = manifest.split("[dev-dependencies]").next().unwrap_or_default();
        let engine_line = deps.lines().find(|l| l.trim_start().starts_with("engine")).unwrap_or_default();
        assert!(
            !engine_line.contains("testing"),
            "crates/{krate} turns on the engine's testing feature in its dependencies: {engine_line}"
        );
    }
}
