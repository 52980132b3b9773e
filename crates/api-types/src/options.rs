//! Load options, typed: what `/load`, `recipe_options.json`, the catalogue's `image_defaults`
//! and the server's flags say about how a model's backend runs.
//!
//! They are parsed once where they enter ([`LoadOptions::from_map`] for a request or a file,
//! the typed fields of `LoadRequest`); everything below reads fields, never a string key.
//! On the wire they are the v9 `recipe_options` object: only options set at some level of
//! the precedence chain appear, and "unset" values (`-1`, `""`) read as absent.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A load option's key was given a value of the wrong type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    /// The option's wire name (`ctx_size`, …).
    pub key: &'static str,
    pub message: String,
}

impl std::fmt::Display for OptionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Invalid value for '{}': {}", self.key, self.message)
    }
}

impl std::error::Error for OptionError {}

macro_rules! load_options {
    ($( $(#[$doc:meta])* $field:ident: $ty:ty = $key:ident $wire:literal, )*) => {
        /// Per-model load options; `None`: not set at this level (a default applies when read).
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(try_from = "Map<String, Value>")]
        pub struct LoadOptions {
            $( $(#[$doc])* #[serde(rename = $wire, skip_serializing_if = "Option::is_none")]
               pub $field: Option<$ty>, )*
        }

        /// The name of one load option, as recipes list the options they take.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum OptionKey { $( $key, )* }

        impl OptionKey {
            pub const ALL: &'static [OptionKey] = &[$( OptionKey::$key, )*];

            /// The wire name (`ctx_size`, `sd-cpp_backend`, …).
            pub fn as_str(self) -> &'static str {
                match self { $( OptionKey::$key => $wire, )* }
            }
        }

        impl LoadOptions {
            /// Every option `over` sets replaces this one's.
            pub fn overlay(&mut self, over: &LoadOptions) {
                $( if over.$field.is_some() { self.$field = over.$field.clone(); } )*
            }

            /// These options with only `keys` kept (a recipe's own).
            pub fn keep(mut self, keys: &[OptionKey]) -> LoadOptions {
                $( if !keys.contains(&OptionKey::$key) { self.$field = None; } )*
                self
            }

            /// These options without the values equal to `defaults`' (but for `except`): the
            /// canonical form, so that an option spelled out at its default and one left unset
            /// compare equal.
            pub fn without_defaults(mut self, defaults: &LoadOptions, except: &[OptionKey]) -> LoadOptions {
                $( if !except.contains(&OptionKey::$key) && defaults.$field.is_some() && self.$field == defaults.$field {
                    self.$field = None;
                } )*
                self
            }

            /// These options without `keys`.
            pub fn clear(mut self, keys: &[OptionKey]) -> LoadOptions {
                $( if keys.contains(&OptionKey::$key) { self.$field = None; } )*
                self
            }

            /// The keys that are set.
            pub fn keys(&self) -> Vec<OptionKey> {
                let mut k = Vec::new();
                $( if self.$field.is_some() { k.push(OptionKey::$key); } )*
                k
            }

            /// Sets the option named `key` from a JSON value; `Ok(false)`: no such option.
            fn set(&mut self, key: &str, v: Value) -> Result<bool, OptionError> {
                match key {
                    $( $wire => {
                        let parsed = serde_json::from_value(v)
                            .map_err(|e| OptionError { key: $wire, message: e.to_string() })?;
                        self.$field = Some(parsed);
                        Ok(true)
                    } )*
                    _ => Ok(false),
                }
            }
        }
    };
}

load_options! {
    /// Context size in tokens (llama.cpp, FLM, Ryzen AI), or `-1`: sized automatically.
    ctx_size: CtxSize = CtxSize "ctx_size",
    /// llama.cpp: requests the model serves at once, each in a slot with its own `ctx_size`
    /// of context (the KV cache holds `ctx_size × parallel` cells). Unset: llama-server's 4
    /// slots sharing one `ctx_size`.
    parallel: u32 = Parallel "parallel",
    /// Where the model runs: `auto` (the device where it fits with the fewest evictions), a
    /// device (`gpu1`, `npu0`: see `/api/v1/system-info`'s `compute_devices`), or several to
    /// split it over (`gpu0,gpu1`).
    device: String = Device "device",
    /// llama.cpp: speculative decoding with this catalogue model as the draft (its vocabulary
    /// must match the model's; llama-server's `-md`).
    draft_model: String = DraftModel "draft_model",
    /// llama.cpp: the host-memory prompt cache llama-server keeps (`--cache-ram`), in MiB;
    /// 0 turns it off. Counted in the model's memory estimate. Unset: the size of the model's
    /// KV cache (one more context's worth of prompts), never llama.cpp's own 8 GiB.
    cache_ram: u64 = CacheRam "cache_ram",
    /// `cpu`, `vulkan`, `rocm`, `metal` or `system`.
    llamacpp_backend: String = LlamacppBackend "llamacpp_backend",
    /// Extra llama-server arguments (flags lemonade manages are refused when given).
    llamacpp_args: String = LlamacppArgs "llamacpp_args",
    /// llama.cpp RPC workers (`host:port`); an empty list clears saved ones.
    rpc_servers: Vec<String> = RpcServers "rpc_servers",
    /// FastFlowLM: extra `flm serve` flags, Lemonade v11.7's safe list only (`--pmode`,
    /// `--prefill-chunk-len`, `--img-pre-resize`, `--socket`, `--q-len`, `--preemption`).
    flm_args: String = FlmArgs "flm_args",
    /// whisper.cpp's backend.
    whispercpp_backend: String = WhispercppBackend "whispercpp_backend",
    /// Extra whisper-server arguments (`-m`, `--model`, `--host`, `--port` are refused).
    whispercpp_args: String = WhispercppArgs "whispercpp_args",
    /// Whether a model's `*_args` are merged with the server's (default, as Lemonade v11: the
    /// model's flags win, the server's others are kept) or replace them (`false`).
    merge_args: bool = MergeArgs "merge_args",
    /// sd.cpp's backend.
    sdcpp_backend: String = SdcppBackend "sd-cpp_backend",
    /// Image defaults of an sd.cpp model: sampling steps.
    steps: u32 = Steps "steps",
    /// Image defaults: classifier-free guidance scale.
    cfg_scale: f64 = CfgScale "cfg_scale",
    /// Image defaults: width in pixels.
    width: u32 = Width "width",
    /// Image defaults: height in pixels.
    height: u32 = Height "height",
    /// Image defaults: sd-server's sampler (`euler`, `euler_a`, `dpm++2m`, …).
    sampling_method: String = SamplingMethod "sampling_method",
    /// Image defaults: the flow shift of flow models (SD3.x, FLUX, Wan); unset: sd.cpp's own.
    flow_shift: f64 = FlowShift "flow_shift",
    /// Extra sd-server arguments (`-m`, `--model`, `--listen-ip`, `--listen-port` and the ones
    /// lemonade sets from the options above are refused).
    sdcpp_args: String = SdcppArgs "sdcpp_args",
    /// Seconds without a request before the model is unloaded (0 = never). Saved beside the
    /// recipe's options but no recipe's own: it never restarts a backend.
    idle_timeout: u64 = IdleTimeout "idle_timeout",
    /// Requests the model serves at once (1 to 1024); the rest wait in lemonade's queue.
    /// Unset: `--max-concurrent`, else the backend's slots. Like `idle_timeout`, saved beside
    /// the recipe's options and never a restart.
    max_concurrent: u32 = MaxConcurrent "max_concurrent",
    /// The model's priority (-10 to 10, default 0): among models waiting to load, a higher one
    /// loads first. Never a restart.
    priority: i32 = Priority "priority",
    /// Where a request goes when this model is saturated (its requests in flight at its
    /// limit, or some already waiting): remote models (`<provider>.<id>`), tried in order,
    /// the first with capacity by the signals its `/metrics` shows. Never a restart.
    spillover: Vec<String> = Spillover "spillover",
}

impl OptionKey {
    /// The options every model takes whatever its recipe: how the scheduler treats it, never
    /// how its backend starts (a change never restarts it).
    pub const SCHEDULING: [OptionKey; 4] =
        [OptionKey::IdleTimeout, OptionKey::MaxConcurrent, OptionKey::Priority, OptionKey::Spillover];
}

/// A context size: a number of tokens, or `-1` on the wire: the largest context the model
/// was trained for that fits the memory there is (as Lemonade v11's `ctx_size: -1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtxSize {
    Auto,
    Tokens(u32),
}

impl Serialize for CtxSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CtxSize::Auto => s.serialize_i64(-1),
            CtxSize::Tokens(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for CtxSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<CtxSize, D::Error> {
        match i64::deserialize(d)? {
            -1 => Ok(CtxSize::Auto),
            n if (1..=i64::from(u32::MAX)).contains(&n) => Ok(CtxSize::Tokens(n as u32)),
            n => Err(serde::de::Error::custom(format!(
                "expected a positive number of tokens or -1 (automatic), got {n}"
            ))),
        }
    }
}

impl std::str::FromStr for CtxSize {
    type Err = OptionError;
    /// `-1` or `auto`, or a positive number of tokens (a command line's `--ctx-size`).
    fn from_str(s: &str) -> Result<CtxSize, OptionError> {
        match s {
            "-1" | "auto" => Ok(CtxSize::Auto),
            _ => match s.parse::<u32>() {
                Ok(n) if n > 0 => Ok(CtxSize::Tokens(n)),
                _ => Err(OptionError {
                    key: "ctx_size",
                    message: format!("expected a positive number of tokens, or -1 or auto (automatic), got '{s}'"),
                }),
            },
        }
    }
}

/// In files, `null` and `""` mean "not set" (v9 wrote `""` for an unset option).
fn is_unset(v: &Value) -> bool {
    v.as_str() == Some("") || v.is_null()
}

impl LoadOptions {
    /// Parses an options object: unknown keys are skipped, "unset" values (`-1`, `""`,
    /// `null`) read as absent, and a known key with a value of the wrong type is an error
    /// naming it.
    pub fn from_map(m: &Map<String, Value>) -> Result<LoadOptions, OptionError> {
        let mut o = LoadOptions::default();
        for (k, v) in m.iter().filter(|(_, v)| !is_unset(v)) {
            o.set(k, v.clone())?;
        }
        Ok(o)
    }

    /// As [`LoadOptions::from_map`], but a key with a value of the wrong type is dropped
    /// (with the others kept) and returned beside the options: for files written by hand.
    pub fn from_map_lossy(m: &Map<String, Value>) -> (LoadOptions, Vec<OptionError>) {
        let mut o = LoadOptions::default();
        let mut bad = Vec::new();
        for (k, v) in m.iter().filter(|(_, v)| !is_unset(v)) {
            if let Err(e) = o.set(k, v.clone()) {
                bad.push(e);
            }
        }
        (o, bad)
    }

    /// The options as a JSON object (only the set ones).
    pub fn to_map(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        }
    }

    /// Whether no option is set.
    pub fn is_empty(&self) -> bool {
        self.keys().is_empty()
    }
}

/// The options of a request, three-state as Lemonade v11's `/load`: an absent key keeps the
/// saved value, `null` ignores it (falls through to the layers below), a value overrides it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OptionsPatch {
    pub set: LoadOptions,
    pub cleared: Vec<OptionKey>,
    /// Keys that name no load option.
    pub unknown: Vec<String>,
}

impl OptionsPatch {
    /// Parses a request's options object; `skip` lists keys that belong to the request, not
    /// to the options (`model_name`, `dry_run`, …). A value of the wrong type names its key.
    pub fn from_map(m: &Map<String, Value>, skip: &[&str]) -> Result<OptionsPatch, OptionError> {
        let mut p = OptionsPatch::default();
        for (k, v) in m.iter().filter(|(k, _)| !skip.contains(&k.as_str())) {
            match OptionKey::ALL.iter().find(|o| o.as_str() == k) {
                Some(key) if v.is_null() => p.cleared.push(*key),
                Some(_) => {
                    p.set.set(k, v.clone())?;
                }
                None => p.unknown.push(k.clone()),
            }
        }
        Ok(p)
    }

    /// `saved` with this patch applied: values replace, `null` removes.
    pub fn apply_to(&self, saved: &LoadOptions) -> LoadOptions {
        let mut o = saved.clone();
        o.overlay(&self.set);
        o.clear(&self.cleared)
    }
}

impl TryFrom<Map<String, Value>> for LoadOptions {
    type Error = OptionError;
    fn try_from(m: Map<String, Value>) -> Result<LoadOptions, OptionError> {
        LoadOptions::from_map(&m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn round_trips_through_the_v9_object() {
        let v = json!({"ctx_size": 2048, "parallel": 2, "device": "gpu0,gpu1", "llamacpp_backend": "vulkan", "llamacpp_args": "-t 2",
            "rpc_servers": ["10.0.0.2:50052"], "sd-cpp_backend": "cpu", "steps": 4, "cfg_scale": 1.5,
            "width": 256, "height": 320, "sampling_method": "euler", "flow_shift": 1.25, "sdcpp_args": "-t 2",
            "whispercpp_backend": "cpu", "whispercpp_args": "-t 2",
            "merge_args": false, "idle_timeout": 30, "flm_args": "--pmode turbo", "draft_model": "d", "cache_ram": 64,
            "max_concurrent": 2, "priority": 3, "spillover": ["vllm.m"]});
        let o = LoadOptions::from_map(&map(v.clone())).unwrap();
        assert_eq!(o.sdcpp_backend.as_deref(), Some("cpu"));
        assert_eq!(o.rpc_servers, Some(vec!["10.0.0.2:50052".to_string()]));
        assert_eq!(Value::Object(o.to_map()), v);
        assert_eq!(serde_json::from_value::<LoadOptions>(v.clone()).unwrap(), o);
        assert_eq!(o.keys().len(), OptionKey::ALL.len(), "every key is in the example");
        // `/load` takes every option: its patch sets each one.
        let mut body = map(v);
        body.insert("model_name".into(), "m".into());
        let load: crate::LoadRequest = serde_json::from_value(Value::Object(body)).unwrap();
        assert_eq!(load.patch().set, o, "a LoadRequest field for every option");
    }

    #[test]
    fn unset_values_read_as_absent_and_unknown_keys_are_skipped() {
        let o = LoadOptions::from_map(&map(json!({"llamacpp_args": "", "x": 1, "steps": null}))).unwrap();
        assert!(o.is_empty(), "{o:?}");
        assert_eq!(Value::Object(o.to_map()), json!({}));
    }

    #[test]
    fn ctx_size_is_a_positive_count_or_minus_one_for_automatic() {
        let o = LoadOptions::from_map(&map(json!({"ctx_size": -1}))).unwrap();
        assert_eq!(o.ctx_size, Some(CtxSize::Auto));
        assert_eq!(Value::Object(o.to_map()), json!({"ctx_size": -1}));
        for bad in [json!(0), json!(-2), json!(1u64 << 33), json!(1.5), json!("8192")] {
            let e = LoadOptions::from_map(&map(json!({"ctx_size": bad.clone()}))).unwrap_err();
            assert_eq!(e.key, "ctx_size", "{bad}");
        }
    }

    #[test]
    fn a_patch_sets_clears_and_lists_unknown_keys() {
        let body = map(json!({"model_name": "m", "ctx_size": 2048, "llamacpp_args": null, "llamacpp_argz": "-t 1"}));
        let p = OptionsPatch::from_map(&body, &["model_name"]).unwrap();
        assert_eq!(p.set.ctx_size, Some(CtxSize::Tokens(2048)));
        assert_eq!(p.cleared, vec![OptionKey::LlamacppArgs]);
        assert_eq!(p.unknown, vec!["llamacpp_argz".to_string()]);
        let saved = LoadOptions { llamacpp_args: Some("-t 2".into()), steps: Some(3), ..Default::default() };
        let after = p.apply_to(&saved);
        assert_eq!((after.ctx_size, after.llamacpp_args, after.steps), (Some(CtxSize::Tokens(2048)), None, Some(3)));
        assert_eq!(OptionsPatch::from_map(&map(json!({"steps": "many"})), &[]).unwrap_err().key, "steps");
    }

    #[test]
    fn a_wrong_type_names_the_key_strictly_and_is_dropped_lossily() {
        let m = map(json!({"ctx_size": "big", "steps": 3}));
        let e = LoadOptions::from_map(&m).unwrap_err();
        assert_eq!(e.key, "ctx_size");
        assert!(e.to_string().starts_with("Invalid value for 'ctx_size': invalid type: string"), "{e}");
        let (o, bad) = LoadOptions::from_map_lossy(&m);
        assert_eq!((o.ctx_size, o.steps, bad.len()), (None, Some(3), 1));
        assert!(serde_json::from_value::<LoadOptions>(Value::Object(m)).is_err());
    }

    #[test]
    fn overlay_replaces_what_is_set_and_keep_filters_by_key() {
        let tokens = |n| Some(CtxSize::Tokens(n));
        let mut base = LoadOptions { ctx_size: tokens(4096), llamacpp_args: Some("-t 1".into()), ..Default::default() };
        base.overlay(&LoadOptions { ctx_size: tokens(8192), steps: Some(2), ..Default::default() });
        assert_eq!((base.ctx_size, base.llamacpp_args.as_deref(), base.steps), (tokens(8192), Some("-t 1"), Some(2)));
        let kept = base.keep(&[OptionKey::CtxSize, OptionKey::Steps]);
        assert_eq!(kept.keys(), vec![OptionKey::CtxSize, OptionKey::Steps]);
        assert_eq!(OptionKey::SdcppBackend.as_str(), "sd-cpp_backend");
    }
}
