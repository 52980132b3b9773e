//! What a backend binary supports, read from its own `--help` and `--version` (pure: the texts
//! come in as values; `host` runs the binary once per path, size and mtime and caches this).
//!
//! llama.cpp adds and renames flags from one build to the next (`--no-mmap` became
//! `--load-mode none`; `--kv-unified-per-slot` is new), and a flag a build lacks is a child that
//! dies with `error: invalid argument`. So the adapters build the command line for the
//! [`Capabilities`] of the binary that will run it, and a user's extra arguments are checked
//! against them before anything is spawned.

use std::collections::BTreeMap;

/// The flags a backend binary lists in its `--help`, and its version.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// The program's name (`llama-server`).
    pub program: String,
    /// Its version as it reports it (`b11434 (515e8551)`), or as installed (`version.txt`).
    pub version: Option<String>,
    /// llama.cpp's build number (`11434`), when it reports one other than 0.
    pub build: Option<u32>,
    /// Every flag spelling (`-cram`, `--cache-ram`, `--no-kv-unified`) → its value hint (`N`,
    /// `[none|ngram-cache|…]`; empty for a switch).
    flags: BTreeMap<String, String>,
}

impl Capabilities {
    /// Reads `help` (the program's `--help`) and `version` (its `--version`, or the installed
    /// version's marker). None when the help lists no flag (not a help text: the binary is then
    /// treated as the newest lemonade knows, and nothing is checked).
    pub fn parse(program: &str, help: &str, version: &str) -> Option<Capabilities> {
        let mut flags = BTreeMap::new();
        for line in help.lines() {
            // A flag line starts at the margin (llama.cpp) or a few spaces in (whisper.cpp,
            // stable-diffusion.cpp); descriptions are indented further.
            let indent = line.len() - line.trim_start().len();
            if indent > 4 || !line.trim_start().starts_with('-') {
                continue;
            }
            read_flag_line(line.trim(), &mut flags);
        }
        if flags.is_empty() {
            return None;
        }
        let (version, build) = read_version(version);
        Some(Capabilities { program: program.to_string(), version, build, flags })
    }

    /// Whether the binary takes `flag` (any of its spellings).
    pub fn has(&self, flag: &str) -> bool {
        self.flags.contains_key(flag)
    }

    /// Whether `flag` exists and, where its help lists the values it takes (`[a|b|c]`),
    /// `value` is one of them.
    pub fn takes(&self, flag: &str, value: &str) -> bool {
        match self.flags.get(flag) {
            None => false,
            Some(hint) if hint.contains(['|', ',']) => hint
                .trim_matches(|c| matches!(c, '[' | ']' | '{' | '}' | '<' | '>'))
                .split(['|', ','])
                .any(|v| v == value),
            Some(_) => true,
        }
    }

    /// `llama-server b11434`, `whisper-server pywhispercpp-1.5.1-cpu-avx2`, or the bare name.
    pub fn describe(&self) -> String {
        match (&self.build, &self.version) {
            (Some(b), _) => format!("{} b{b}", self.program),
            (None, Some(v)) => format!("{} {v}", self.program),
            (None, None) => self.program.clone(),
        }
    }

    /// The first of `tokens` (a command line's arguments) that looks like a flag and is none of
    /// this binary's. Values (`-1`, `-0.5`, a lone `-`) are not flags.
    pub fn unknown_flag<'a>(&self, tokens: &'a [String]) -> Option<&'a str> {
        tokens.iter().map(|t| crate::llamacpp::flag_of(t)).find(|f| is_flag(f) && !self.has(f))
    }
}

/// Whether a token is a flag (`-x`, `--name`) rather than a value (`-1`, `-.5`, `-`).
pub fn is_flag(token: &str) -> bool {
    let mut c = token.chars();
    c.next() == Some('-') && c.next().is_some_and(|n| n == '-' || n.is_ascii_alphabetic())
}

/// One help line's flags and value hints: `-cram, --cache-ram N   set the …`,
/// `-kvu,  --kv-unified, -no-kvu, --no-kv-unified`, `  -t N,      --threads N    [4  ] …`.
/// Flags follow each other after a comma; a hint (no lowercase letter, or bracketed) follows a
/// flag; the first other word starts the description.
fn read_flag_line(line: &str, flags: &mut BTreeMap<String, String>) {
    let mut names: Vec<String> = Vec::new();
    let mut hint = String::new();
    for word in line.split_whitespace() {
        let bare = word.trim_end_matches(',');
        if is_flag(bare) {
            let name = bare.split_once('=').map_or(bare, |(f, _)| f);
            names.push(name.to_string());
        } else if !names.is_empty() && is_hint(bare) {
            if hint.is_empty() {
                hint = bare.to_string();
            }
        } else {
            break;
        }
    }
    for n in names {
        flags.entry(n).or_insert_with(|| hint.clone());
    }
}

fn is_hint(word: &str) -> bool {
    let list = word.contains('|') || word.trim_end_matches(',').contains(',');
    list || word.starts_with(['[', '{', '<']) || !word.chars().any(|c| c.is_ascii_lowercase())
}

/// llama.cpp's `version: 9093 (84e939a1d)` or `version: 0.6.0-dev (build 11434, commit
/// 515e85511)` → (the text after `version:`, the build number); build 0 (a build from a tree
/// without git) is no build number. Another text is kept as its first line.
fn read_version(text: &str) -> (Option<String>, Option<u32>) {
    for line in text.lines() {
        if let Some(rest) = line.trim().strip_prefix("version:") {
            let rest = rest.trim();
            let number = match rest.split_once("(build ") {
                Some((_, after)) => after.split(|c: char| !c.is_ascii_digit()).next(),
                None => rest.split_whitespace().next(),
            };
            let build = number.and_then(|n| n.parse::<u32>().ok()).filter(|n| *n > 0);
            return (Some(rest.to_string()), build);
        }
    }
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    (first.map(str::to_string), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELP: &str = "\
----- common params -----

-h,    --help, --usage                  print usage and exit
--version                               show version and build info
-cram, --cache-ram N                    set the maximum cache size in MiB (default: 8192, -1 - no
                                        limit, 0 - disable)
                                        - auto: mmap, unless --fake-in-description is set
-kvu,  --kv-unified, -no-kvu, --no-kv-unified
                                        use single unified KV buffer shared across all sequences
--spec-type [none|ngram-cache|ngram-simple]
                                        type of speculative decoding to use
--spec-other none,draft-simple,ngram-cache
                                        the same, as llama.cpp 11434 lists it
-lm,   --load-mode MODE                 model loading mode (default: auto)
";

    #[test]
    fn help_lines_give_every_spelling_and_hint() {
        let c = Capabilities::parse("llama-server", HELP, "version: 9093 (84e939a1d)\nbuilt with GNU").unwrap();
        assert_eq!((c.describe().as_str(), c.version.as_deref()), ("llama-server b9093", Some("9093 (84e939a1d)")));
        let new = "version: 0.6.0-dev (build 11434, commit 515e85511)\nbuilt with GNU 12.2.0 for Linux x86_64";
        let c = Capabilities::parse("llama-server", HELP, new).unwrap();
        for f in ["-h", "--help", "--usage", "--version", "-cram", "--cache-ram", "-kvu", "--no-kv-unified", "-lm"] {
            assert!(c.has(f), "{f}");
        }
        assert!(!c.has("--fake-in-description") && !c.has("-") && !c.has("N"));
        assert!(c.takes("--spec-type", "ngram-cache") && !c.takes("--spec-type", "draft-simple"));
        assert!(c.takes("--spec-other", "draft-simple") && !c.takes("--spec-other", "draft-eagle"));
        assert!(c.takes("--cache-ram", "512") && !c.takes("--nope", "1"));
        assert_eq!(c.describe(), "llama-server b11434");
        assert_eq!(c.version.as_deref(), Some("0.6.0-dev (build 11434, commit 515e85511)"));
        let args: Vec<String> = ["--cache-ram", "-1", "-lm=none", "--no-such", "-"].map(String::from).to_vec();
        assert_eq!(c.unknown_flag(&args), Some("--no-such"));
    }

    #[test]
    fn whisper_style_help_and_unknown_versions() {
        let help = "usage: whisper-server [options]\n\n  -h,        --help              [default] show this help\n  -t N,      --threads N         [4      ] number of threads\n  -nt,       --no-timestamps     [false  ] do not print timestamps\n";
        let c = Capabilities::parse("whisper-server", help, "pywhispercpp-1.5.1-cpu-avx2").unwrap();
        assert!(c.has("-t") && c.has("--threads") && c.has("-nt") && c.has("--no-timestamps"));
        assert_eq!(c.describe(), "whisper-server pywhispercpp-1.5.1-cpu-avx2");
        let c = Capabilities::parse("llama-server", HELP, "version: 0.6.0-dev (build 0, commit unknown)").unwrap();
        assert_eq!((c.build, c.describe().as_str()), (None, "llama-server 0.6.0-dev (build 0, commit unknown)"));
        assert_eq!(Capabilities::parse("x", "thread 'main' panicked", ""), None);
    }
}
