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
    /// Context size in tokens (llama.cpp, FLM, Ryzen AI).
    ctx_size: u32 = CtxSize "ctx_size",
    /// `cpu`, `vulkan`, `rocm`, `metal` or `system`.
    llamacpp_backend: String = LlamacppBackend "llamacpp_backend",
    /// Extra llama-server arguments (flags lemonade manages are refused when given).
    llamacpp_args: String = LlamacppArgs "llamacpp_args",
    /// llama.cpp RPC workers (`host:port`); an empty list clears saved ones.
    rpc_servers: Vec<String> = RpcServers "rpc_servers",
    /// whisper.cpp's backend.
    whispercpp_backend: String = WhispercppBackend "whispercpp_backend",
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
    /// Seconds without a request before the model is unloaded (0 = never). Saved beside the
    /// recipe's options but no recipe's own: it never restarts a backend.
    idle_timeout: u64 = IdleTimeout "idle_timeout",
}

/// `-1` and `""` mean "not set" in v9's files and requests.
fn is_unset(v: &Value) -> bool {
    v.as_i64() == Some(-1) || v.as_str() == Some("") || v.is_null()
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
        let v = json!({"ctx_size": 2048, "llamacpp_backend": "vulkan", "llamacpp_args": "-np 2",
            "rpc_servers": ["10.0.0.2:50052"], "sd-cpp_backend": "cpu", "steps": 4, "cfg_scale": 1.5,
            "width": 256, "height": 320, "whispercpp_backend": "cpu", "idle_timeout": 30});
        let o = LoadOptions::from_map(&map(v.clone())).unwrap();
        assert_eq!(o.sdcpp_backend.as_deref(), Some("cpu"));
        assert_eq!(o.rpc_servers, Some(vec!["10.0.0.2:50052".to_string()]));
        assert_eq!(Value::Object(o.to_map()), v);
        assert_eq!(serde_json::from_value::<LoadOptions>(v.clone()).unwrap(), o);
        assert_eq!(o.keys().len(), OptionKey::ALL.len(), "every key is in the example");
    }

    #[test]
    fn unset_values_read_as_absent_and_unknown_keys_are_skipped() {
        let o =
            LoadOptions::from_map(&map(json!({"ctx_size": -1, "llamacpp_args": "", "x": 1, "steps": null}))).unwrap();
        assert!(o.is_empty(), "{o:?}");
        assert_eq!(Value::Object(o.to_map()), json!({}));
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
        let mut base = LoadOptions { ctx_size: Some(4096), llamacpp_args: Some("-t 1".into()), ..Default::default() };
        base.overlay(&LoadOptions { ctx_size: Some(8192), steps: Some(2), ..Default::default() });
        assert_eq!((base.ctx_size, base.llamacpp_args.as_deref(), base.steps), (Some(8192), Some("-t 1"), Some(2)));
        let kept = base.keep(&[OptionKey::CtxSize, OptionKey::Steps]);
        assert_eq!(kept.keys(), vec![OptionKey::CtxSize, OptionKey::Steps]);
        assert_eq!(OptionKey::SdcppBackend.as_str(), "sd-cpp_backend");
    }
}
