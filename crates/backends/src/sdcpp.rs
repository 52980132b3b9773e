//! The stable-diffusion.cpp adapter: `sd-server` for an image model (reference §7.4: started
//! with `--listen-port <P>` and its model arguments), and what lemonade decides about an image
//! request before forwarding it: the size, and the sd parameters (steps, cfg_scale, seed,
//! sampler) that sd-server reads from a `<sd_cpp_extra_args>` block in the prompt. Pure: no
//! processes, no file system.

use std::path::Path;

use api_types::{LoadOptions, SdParameters};
use serde_json::{json, Value};

/// The stable-diffusion.cpp adapter: `sd-server`, told its port.
pub struct SdCpp;

/// sd-server's OpenAI-compatible routes.
pub const GENERATIONS_PATH: &str = "/v1/images/generations";
pub const EDITS_PATH: &str = "/v1/images/edits";
pub const SERVED_PATHS: &[&str] = &[GENERATIONS_PATH, EDITS_PATH];

/// v9's built-in defaults for an sd-cpp model without `image_defaults` (reference §2.9).
pub const DEFAULT_STEPS: u32 = 20;
pub const DEFAULT_CFG_SCALE: f64 = 7.0;
pub const DEFAULT_SIZE: u32 = 512;

impl crate::Adapter for SdCpp {
    fn needs_port(&self) -> bool {
        true
    }

    fn launch(&self, input: &crate::LaunchInput) -> Result<crate::Launch, crate::BackendError> {
        // sd-server loads the model before it listens, so its index answering means ready.
        crate::Launch::on_port(crate::Recipe::SdCpp, input, "/", SERVED_PATHS, |port| {
            command_line(input.main_path, port, input.options)
        })
    }
}

/// The flags lemonade gives sd-server itself (from the model and its options).
pub const RESERVED_FLAGS: &[&str] = &[
    "-m",
    "--model",
    "-l",
    "--listen-ip",
    "--listen-port",
    "--steps",
    "--cfg-scale",
    "-W",
    "--width",
    "-H",
    "--height",
    "--sampling-method",
    "--flow-shift",
];

/// A refused `sdcpp_args`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SdArgsError {
    #[error(
        "Invalid custom sd-server arguments: argument '{0}' is managed by lemonade and cannot be overridden. \
         Reserved arguments: -m, --model, -l, --listen-ip, --listen-port, --steps, --cfg-scale, -W, --width, -H, \
         --height, --sampling-method, --flow-shift"
    )]
    Reserved(String),
    #[error("Invalid custom sd-server arguments: unterminated quote in: {0}")]
    UnterminatedQuote(String),
}

/// `sdcpp_args` split into arguments (quotes group words), none of them a flag lemonade sets.
pub fn user_args(args: &str) -> Result<Vec<String>, SdArgsError> {
    let tokens = crate::llamacpp::tokenize(args).map_err(|_| SdArgsError::UnterminatedQuote(args.into()))?;
    match crate::llamacpp::first_reserved(&tokens, RESERVED_FLAGS) {
        Some(f) => Err(SdArgsError::Reserved(f.to_string())),
        None => Ok(tokens),
    }
}

/// `sd-server -m <model> --listen-ip 127.0.0.1 --listen-port <P> --steps N --cfg-scale X -W w
/// -H h [--sampling-method S] [--flow-shift F] [sdcpp_args…]`: the model's options (its
/// `image_defaults` under the saved ones) become the server's defaults, which each request may
/// override.
pub fn command_line(model: &Path, port: u16, options: &LoadOptions) -> Vec<String> {
    let mut args = base_command(model, port, options);
    if let Some(m) = &options.sampling_method {
        args.extend(["--sampling-method".to_string(), m.clone()]);
    }
    if let Some(f) = options.flow_shift {
        args.extend(["--flow-shift".to_string(), f.to_string()]);
    }
    args.extend(options.sdcpp_args.as_deref().and_then(|a| user_args(a).ok()).unwrap_or_default());
    args
}

fn base_command(model: &Path, port: u16, options: &LoadOptions) -> Vec<String> {
    let cfg = options.cfg_scale.unwrap_or(DEFAULT_CFG_SCALE);
    vec![
        "-m".into(),
        model.display().to_string(),
        "--listen-ip".into(),
        "127.0.0.1".into(),
        "--listen-port".into(),
        port.to_string(),
        "--steps".into(),
        options.steps.unwrap_or(DEFAULT_STEPS).to_string(),
        "--cfg-scale".into(),
        cfg.to_string(),
        "-W".into(),
        options.width.unwrap_or(DEFAULT_SIZE).to_string(),
        "-H".into(),
        options.height.unwrap_or(DEFAULT_SIZE).to_string(),
    ]
}

/// The samplers sd-server knows (`--sampling-method`).
pub const SAMPLERS: &[&str] = &[
    "euler",
    "euler_a",
    "heun",
    "dpm2",
    "dpm++2s_a",
    "dpm++2m",
    "dpm++2mv2",
    "ipndm",
    "ipndm_v",
    "lcm",
    "ddim_trailing",
    "tcd",
];

/// Sides a requested image may have: multiples of 64 from 64 to 2048 (the UNet's latent is
/// 1/8 of the image and is halved three times).
pub const MIN_SIDE: u32 = 64;
pub const MAX_SIDE: u32 = 2048;

/// A requested image size sd-server cannot draw.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Unsupported size '{size}': expected WIDTHxHEIGHT with each side a multiple of 64 from {MIN_SIDE} to {MAX_SIDE} (e.g. 512x512)"
)]
pub struct BadSize {
    pub size: String,
}

/// `WIDTHxHEIGHT` as numbers, or why not.
pub fn parse_size(size: &str) -> Result<(u32, u32), BadSize> {
    let bad = || BadSize { size: size.to_string() };
    let (w, h) = size.split_once('x').ok_or_else(bad)?;
    let side = |s: &str| s.parse::<u32>().ok().filter(|v| (MIN_SIDE..=MAX_SIDE).contains(v) && v % 64 == 0);
    match (side(w), side(h)) {
        (Some(w), Some(h)) => Ok((w, h)),
        _ => Err(bad()),
    }
}

/// The sd parameters of a request (api-types' [`SdParameters`]), checked, and written into its
/// prompt the way sd-server reads them.
pub trait SdParams {
    /// Checks the values; the error names the field.
    fn validate(&self) -> Result<(), (String, &'static str)>;
    /// `prompt` with the parameters appended as sd-server's `<sd_cpp_extra_args>` block (the
    /// prompt unchanged when none is set).
    fn prompt_with(&self, prompt: &str) -> String;
}

impl SdParams for SdParameters {
    fn validate(&self) -> Result<(), (String, &'static str)> {
        if let Some(s) = self.steps.filter(|s| !(1..=150).contains(s)) {
            return Err((format!("Invalid value for 'steps': expected 1 to 150, got {s}"), "steps"));
        }
        if let Some(c) = self.cfg_scale.filter(|c| !(0.0..=30.0).contains(c)) {
            return Err((format!("Invalid value for 'cfg_scale': expected 0 to 30, got {c}"), "cfg_scale"));
        }
        if let Some(s) = self.sampler.as_deref().filter(|s| !SAMPLERS.contains(s)) {
            return Err((format!("Unknown sampler '{s}': expected one of {}", SAMPLERS.join(", ")), "sampler"));
        }
        Ok(())
    }

    fn prompt_with(&self, prompt: &str) -> String {
        let mut sample = serde_json::Map::new();
        if let Some(s) = self.steps {
            sample.insert("sample_steps".into(), json!(s));
        }
        if let Some(m) = &self.sampler {
            sample.insert("sample_method".into(), json!(m));
        }
        if let Some(c) = self.cfg_scale {
            sample.insert("guidance".into(), json!({"txt_cfg": c}));
        }
        let mut args = serde_json::Map::new();
        if let Some(seed) = self.seed {
            args.insert("seed".into(), json!(seed));
        }
        if !sample.is_empty() {
            args.insert("sample_params".into(), Value::Object(sample));
        }
        if args.is_empty() {
            return prompt.to_string();
        }
        format!("{prompt}<sd_cpp_extra_args>{}</sd_cpp_extra_args>", Value::Object(args))
    }
}

/// The image containers sd-server reads (stb_image): PNG, JPEG, BMP, GIF (first frame), WebP.
pub fn image_format(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("png")
    } else if head.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("jpeg")
    } else if head.starts_with(b"BM") && head.len() > 14 {
        Some("bmp")
    } else if head.starts_with(b"GIF8") {
        Some("gif")
    } else if head.len() >= 12 && head.starts_with(b"RIFF") && &head[8..12] == b"WEBP" {
        Some("webp")
    } else {
        None
    }
}

/// The checks every image request shares: `n` from 1 to 10, a size sd-server makes, b64_json
/// answers only, and the sd parameters in range.
pub fn checked(
    n: Option<u32>,
    size: Option<&str>,
    format: Option<&str>,
    sd: &SdParameters,
) -> Result<(), api_types::form::BadField> {
    use api_types::form::BadField;
    if let Some(n) = n.filter(|n| !(1..=10).contains(n)) {
        return Err(BadField::new(format!("Invalid value for 'n': expected 1 to 10, got {n}"), "n"));
    }
    if let Some(size) = size {
        parse_size(size).map_err(|e| BadField::new(e.to_string(), "size"))?;
    }
    if let Some(f) = format.filter(|f| *f != "b64_json") {
        let msg = format!(
            "Unsupported response_format '{f}': lemonade answers b64_json only (it keeps no images to link to)"
        );
        return Err(BadField::new(msg, "response_format"));
    }
    sd.validate().map_err(|(msg, field)| BadField::new(msg, field))
}

/// An edit or a variation, its form checked: what sd-server's edit route is sent.
#[derive(Debug)]
pub struct Redraw<'a> {
    pub model: &'a str,
    /// The prompt with the sd parameters in it (a space for a variation).
    pub prompt: String,
    pub n: Option<u32>,
    pub size: Option<&'a str>,
    /// The source images (`image` or `image[]`), then the mask (an edit's, if any).
    pub images: Vec<&'a api_types::form::Part>,
    pub mask: Option<&'a api_types::form::Part>,
}

/// Checks an edit's (or a variation's) form before any model loads: at least one image, each
/// (and the mask) an image sd-server reads, a model, a prompt unless a variation, and the
/// checks every image request shares.
pub fn redraw(form: &api_types::form::Form, variation: bool) -> Result<Redraw<'_>, api_types::form::BadField> {
    use api_types::form::BadField;
    let images: Vec<_> = form.parts.iter().filter(|p| p.name == "image" || p.name == "image[]").collect();
    if images.is_empty() {
        return Err(BadField::new("Missing 'image' field in request", "image"));
    }
    let mask = if variation { None } else { form.get("mask") };
    for p in images.iter().copied().chain(form.get("mask")) {
        if image_format(&p.data).is_none() {
            let name = p.file_name.as_deref().map(|n| format!(" '{n}'")).unwrap_or_default();
            let msg = format!("The uploaded file{name} is not an image: expected PNG, JPEG, WebP, BMP or GIF");
            return Err(BadField::new(msg, &p.name));
        }
    }
    let model = form.required("model")?;
    let prompt = if variation { " " } else { form.text("prompt")?.unwrap_or_default() };
    if prompt.trim().is_empty() && !variation {
        return Err(BadField::new("Missing 'prompt' field in request", "prompt"));
    }
    let sd = SdParameters {
        steps: form.number("steps")?,
        cfg_scale: form.number("cfg_scale")?,
        seed: form.number("seed")?,
        sampler: form.text("sampler")?.map(str::to_string),
    };
    let n: Option<u32> = form.number("n")?;
    let size = form.text("size")?.filter(|s| !s.is_empty());
    checked(n, size, form.text("response_format")?, &sd)?;
    Ok(Redraw { model, prompt: sd.prompt_with(prompt), n, size, images, mask })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_lemonade_writes_is_in_the_real_sd_server_help() {
        let help = include_str!("../testdata/sd-server-0.4.7.help");
        let caps = crate::capabilities::Capabilities::parse("sd-server", help, "").unwrap();
        let o = LoadOptions {
            steps: Some(4),
            cfg_scale: Some(1.5),
            width: Some(256),
            height: Some(320),
            ..Default::default()
        };
        let args = command_line(Path::new("/hub/sd.safetensors"), 9000, &o);
        assert_eq!(caps.unknown_flag(&args), None, "{}", args.join(" "));
        assert!(caps.has("--listen-port") && caps.has("-W") && !caps.has("--no-such"));
    }

    #[test]
    fn command_line_turns_the_options_into_server_defaults() {
        let mut o = LoadOptions::default();
        assert_eq!(
            command_line(Path::new("/hub/sd.safetensors"), 9000, &o).join(" "),
            "-m /hub/sd.safetensors --listen-ip 127.0.0.1 --listen-port 9000 --steps 20 --cfg-scale 7 -W 512 -H 512"
        );
        o = LoadOptions { steps: Some(4), cfg_scale: Some(1.5), width: Some(256), height: Some(320), ..o };
        let args = command_line(Path::new("/m"), 1, &o).join(" ");
        assert!(args.ends_with("--steps 4 --cfg-scale 1.5 -W 256 -H 320"), "{args}");
        // Lemonade v11's sampler, flow shift and extra arguments.
        o = LoadOptions {
            sampling_method: Some("euler".into()),
            flow_shift: Some(1.25),
            sdcpp_args: Some("--diffusion-fa --threads 2".into()),
            ..o
        };
        let args = command_line(Path::new("/m"), 1, &o).join(" ");
        assert!(
            args.ends_with("-H 320 --sampling-method euler --flow-shift 1.25 --diffusion-fa --threads 2"),
            "{args}"
        );
        let e = user_args("--steps 9").unwrap_err().to_string();
        assert!(e.contains("'--steps' is managed by lemonade"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256x256"), Ok((256, 256)));
        assert_eq!(parse_size("1024x576"), Ok((1024, 576)));
        for bad in ["256", "0x0", "100x100", "4096x4096", "axb", "256x", "-64x64", "256X256"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("Unsupported size '{bad}'")), "{e}");
        }
    }

    #[test]
    fn params_become_an_extra_args_block() {
        assert_eq!(SdParameters::default().prompt_with("a lemon"), "a lemon");
        let p = SdParameters { steps: Some(1), cfg_scale: Some(1.0), seed: Some(42), sampler: Some("euler".into()) };
        let out = p.prompt_with("a lemon");
        let block =
            out.strip_prefix("a lemon<sd_cpp_extra_args>").unwrap().strip_suffix("</sd_cpp_extra_args>").unwrap();
        let v: Value = serde_json::from_str(block).unwrap();
        assert_eq!(
            v,
            json!({"seed": 42, "sample_params": {"sample_steps": 1, "sample_method": "euler", "guidance": {"txt_cfg": 1.0}}})
        );
        assert!(p.validate().is_ok());
        let bad = SdParameters { sampler: Some("magic".into()), ..SdParameters::default() };
        assert_eq!(bad.validate().unwrap_err().1, "sampler");
        assert_eq!(SdParameters { steps: Some(0), ..SdParameters::default() }.validate().unwrap_err().1, "steps");
    }

    #[test]
    fn images_are_told_from_their_first_bytes() {
        assert_eq!(image_format(b"\x89PNG\r\n\x1a\n...."), Some("png"));
        assert_eq!(image_format(&[0xFF, 0xD8, 0xFF, 0xE0]), Some("jpeg"));
        assert_eq!(image_format(b"RIFF\0\0\0\0WEBPVP8 "), Some("webp"));
        assert_eq!(image_format(b"RIFF\0\0\0\0WAVEfmt "), None);
        assert_eq!(image_format(b"hello"), None);
    }

    fn form(fields: &[(&str, &[u8])]) -> api_types::form::Form {
        api_types::form::Form::of(&fields.iter().map(|(n, d)| (*n, None, *d)).collect::<Vec<_>>())
    }

    #[test]
    fn a_redraw_form_is_checked_and_its_prompt_carries_the_sd_parameters() {
        let png: &[u8] = b"\x89PNG\r\n\x1a\n....";
        let f = form(&[("image[]", png), ("mask", png), ("model", b"sd"), ("prompt", b"a cat"), ("steps", b"4")]);
        let r = redraw(&f, false).unwrap();
        assert_eq!((r.model, r.images.len(), r.mask.is_some()), ("sd", 1, true));
        assert!(
            r.prompt.starts_with("a cat<sd_cpp_extra_args>") && r.prompt.contains("\"sample_steps\":4"),
            "{}",
            r.prompt
        );
        let v = redraw(&f, true).unwrap();
        assert!(v.mask.is_none() && v.prompt.starts_with(' '), "a variation sends no mask and no prompt");
        let refused = |fields: &[(&str, &[u8])], variation| redraw(&form(fields), variation).unwrap_err().field;
        assert_eq!(refused(&[("model", b"sd")], true), "image");
        assert_eq!(refused(&[("image", b"text"), ("model", b"sd")], true), "image");
        assert_eq!(refused(&[("image", png), ("mask", b"text"), ("model", b"sd")], true), "mask");
        assert_eq!(refused(&[("image", png), ("model", b"sd")], false), "prompt");
        assert_eq!(refused(&[("image", png), ("model", b"sd"), ("n", b"11")], true), "n");
        assert_eq!(refused(&[("image", png), ("model", b"sd"), ("steps", b"x")], true), "steps");
        assert_eq!(refused(&[("image", png), ("model", b"sd"), ("response_format", b"url")], true), "response_format");
    }
}
