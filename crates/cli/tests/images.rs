//! Image generation through lemonade on the real sd-server (built by `cargo xtask setup`). No
//! package ships Stable Diffusion weights, so the model is RANDOM weights in the SDXS-512
//! architecture: the backend really runs, the PNGs are real, the pictures are noise.

use std::path::Path;

use serde_json::{json, Value};
use test_support::hub::{HubDouble, Knobs};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

/// Width and height from a PNG's IHDR.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&png[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap());
    (be(&png[16..20]), be(&png[20..24]))
}

async fn generate(l: &Lemonade, model: &str, size: &str) -> (u16, Value) {
    let body = json!({"model": model, "prompt": "a lemon", "size": size, "steps": 1, "seed": 1});
    l.post("/api/v1/images/generations", &body).await
}

fn first_png(v: &Value) -> Vec<u8> {
    use base64::Engine;
    let b64 = v["data"][0]["b64_json"].as_str().unwrap_or_else(|| panic!("no image: {v}"));
    base64::engine::general_purpose::STANDARD.decode(b64).unwrap()
}

#[tokio::test]
async fn real_sd_server_the_openai_sdk_generates_edits_and_varies_images_beside_a_loaded_llm() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_sd(), &[], &[]).await;
    let (s, v) = l.chat(SMOL).await;
    assert_eq!(s, 200, "{v}");
    let base = l.url("");
    py_checks("images_client.py", &[&base, SD, SMOL]).await;
    let (_, h) = l.get("/api/v1/health").await;
    let mut loaded = loaded_names(&h);
    loaded.sort();
    assert_eq!(loaded, [SD, SMOL], "separate type slots: {h}");
    let sd = h["all_models_loaded"].as_array().unwrap().iter().find(|m| m["model_name"] == SD).unwrap();
    assert_eq!((sd["type"].as_str(), sd["recipe"].as_str()), (Some("image"), Some("sd-cpp")), "{h}");
    // The model's image_defaults became the server's defaults (1 step, 256x256).
    assert!(l.log().contains("--steps\", \"1\""), "sd-server started with the model's steps");
}

#[tokio::test]
async fn real_sd_server_bad_image_requests_get_a_clear_4xx_and_load_nothing() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_sd(), &[], &[]).await;
    for (body, needle, status) in [
        (json!({"model": SD}), "Missing required field 'prompt'", 400),
        (json!({"prompt": "x"}), "Missing required field 'model'", 400),
        (json!({"model": SD, "prompt": "x", "size": "257x256"}), "Unsupported size '257x256'", 400),
        (json!({"model": SD, "prompt": "x", "size": "big"}), "Unsupported size 'big'", 400),
        (json!({"model": SD, "prompt": "x", "steps": 0}), "'steps': expected 1 to 150", 400),
        (json!({"model": SD, "prompt": "x", "cfg_scale": -1}), "'cfg_scale': expected 0 to 30", 400),
        (json!({"model": SD, "prompt": "x", "steps": "many"}), "Invalid value for 'steps'", 400),
        (json!({"model": GEMMA, "prompt": "x"}), "images/generations needs an image model", 400),
        (json!({"model": WHISPER, "prompt": "x"}), "not found", 404),
    ] {
        let (s, v) = l.post("/api/v1/images/generations", &body).await;
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(s, status, "{body}: {v}");
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    // Edits: not multipart, no image, a file that is not an image, no prompt.
    let (s, v) = l.post("/api/v1/images/edits", &json!({"model": SD, "prompt": "x"})).await;
    assert_eq!((s, v["error"]["message"].as_str()), (400, Some("Request must be multipart/form-data")));
    let edit = |form: reqwest::multipart::Form| l.http.post(l.url("/api/v1/images/edits")).multipart(form).send();
    let r = edit(reqwest::multipart::Form::new().text("model", SD).text("prompt", "x")).await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("Missing 'image' field"));
    let wav = reqwest::multipart::Part::bytes(b"RIFF\0\0\0\0WAVEfmt ".to_vec()).file_name("a.wav");
    let r =
        edit(reqwest::multipart::Form::new().text("model", SD).text("prompt", "x").part("image", wav)).await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("'a.wav' is not an image"));
    let png = reqwest::multipart::Part::bytes(b"\x89PNG\r\n\x1a\n0000".to_vec()).file_name("a.png");
    let r = edit(reqwest::multipart::Form::new().text("model", SD).part("image", png)).await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("Missing 'prompt' field"));
    // 200 MB: a JSON 413.
    let chunk = bytes::Bytes::from(vec![b'a'; 1 << 20]);
    let body = futures_util::stream::iter((0..200).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
    let r = l
        .http
        .post(l.url("/api/v1/images/edits"))
        .header("content-type", "multipart/form-data; boundary=xyz")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"], json!([]), "{h}");
}

#[tokio::test]
async fn real_sd_server_killed_mid_generation_gives_502_and_the_next_request_reloads_it() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_sd(), &[], &[]).await;
    let (s, v) = generate(&l, SD, "256x256").await;
    assert_eq!(s, 200, "{v}");
    let first = child_pids(l.pid());
    assert_eq!(first.len(), 1, "{first:?}");
    let request = generate(&l, SD, "512x512");
    let killer = l.kill_when_in_flight(SD, first[0]);
    let ((s, v), ()) = tokio::join!(request, killer);
    assert_eq!(s, 502, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains(&format!("The backend of model '{SD}' exited")), "{v}");
    let (s, v) = generate(&l, SD, "320x256").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(png_size(&first_png(&v)), (320, 256));
    let now = child_pids(l.pid());
    assert!(now.len() == 1 && now != first, "a new backend: {now:?} (was {first:?})");
}

#[tokio::test]
async fn real_sd_server_cli_pulls_lists_and_deletes_image_models() {
    let tmp = tempfile::tempdir().unwrap();
    // The catalogue's SD-Turbo (stabilityai/sd-turbo:sd_turbo.safetensors), played by the random
    // SDXS-512's bytes, and the same bytes under their own name for a user.* registration.
    for (repo, file) in [
        ("stabilityai/sd-turbo", "sd_turbo.safetensors"),
        ("lemonade-dev/sdxs-512-random", "sdxs-512-random-F16.safetensors"),
    ] {
        std::fs::create_dir_all(tmp.path().join(repo)).unwrap();
        std::os::unix::fs::symlink(model(SD_FILE), tmp.path().join(repo).join(file)).unwrap();
    }
    let double = HubDouble::start(tmp.path(), Knobs::default()).await;
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[("HF_ENDPOINT", &double.url)]).await;
    let (code, out, err) = l.cli(&["pull", "SD-Turbo"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let ckpt = "lemonade-dev/sdxs-512-random:sdxs-512-random-F16.safetensors";
    let (code, out, err) = l.cli(&["pull", "user.Noise", "--checkpoint", ckpt, "--recipe", "sd-cpp"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (_, out, _) = l.cli(&["list", "--json"]).await;
    let list: Value = serde_json::from_str(&out).unwrap();
    for name in ["SD-Turbo", "Noise"] {
        let m = list["data"].as_array().unwrap().iter().find(|m| m["id"] == name);
        let m = m.unwrap_or_else(|| panic!("{name}: {out}"));
        assert_eq!((m["downloaded"].as_bool(), m["recipe"].as_str()), (Some(true), Some("sd-cpp")), "{m}");
        assert!(m["labels"].as_array().unwrap().contains(&json!("image")), "{m}");
    }
    // The catalogue entry's image_defaults (512x512) size the answer when the request does not.
    let (s, v) = l.post("/api/v1/images/generations", &json!({"model": "SD-Turbo", "prompt": "x", "steps": 1})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(png_size(&first_png(&v)), (512, 512));
    // Lemonade v11's import: the image defaults are saved as the model's options, the
    // request's options over them, and sd-server starts with them.
    let pull = json!({"model_name": "user.Merged", "checkpoint": ckpt, "recipe": "sd-cpp", "stream": false,
        "image_defaults": {"steps": 1, "cfg_scale": 1.5, "width": 256, "height": 320, "sampling_method": "euler", "flow_shift": 1.25},
        "recipe_options": {"sd-cpp_backend": "cpu", "sdcpp_args": "--threads 2", "height": 256}});
    let (s, v) = l.post("/api/v1/pull", &pull).await;
    assert_eq!(s, 200, "{v}");
    let (_, m) = l.get("/api/v1/models/user.Merged").await;
    assert_eq!(
        m["recipe_options"],
        json!({"steps": 1, "cfg_scale": 1.5, "width": 256, "height": 256, "sampling_method": "euler",
               "flow_shift": 1.25, "sd-cpp_backend": "cpu", "sdcpp_args": "--threads 2"}),
        "{m}"
    );
    let (s, v) = l.post("/api/v1/images/generations", &json!({"model": "user.Merged", "prompt": "x"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(png_size(&first_png(&v)), (256, 256), "the saved defaults size the image");
    let (_, h) = l.get("/api/v1/health").await;
    let entry = h["all_models_loaded"].as_array().unwrap().iter().find(|m| m["model_name"] == "user.Merged").cloned();
    let command = entry.map(|e| {
        e["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect::<Vec<_>>().join(" ")
    });
    assert!(
        command.as_deref().is_some_and(|c| c.ends_with("--sampling-method euler --flow-shift 1.25 --threads 2")),
        "{command:?}"
    );
    let (s, e) = l.post("/api/v1/models/user.Merged/options", &json!({"sdcpp_args": "--listen-port 1"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("sdcpp_args")), "{e}");
    let (s, e) = l.post("/api/v1/models/user.Merged/options", &json!({"sampling_method": "nope"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("sampling_method")), "{e}");
    assert_eq!(l.cli(&["delete", "user.Merged"]).await.0, 0);
    for name in ["SD-Turbo", "Noise"] {
        let (code, out, err) = l.cli(&["delete", name]).await;
        assert_eq!(code, 0, "{name}: {out}{err}");
    }
    let (_, out, _) = l.cli(&["list", "--json"]).await;
    let list: Value = serde_json::from_str(&out).unwrap();
    assert!(list["data"].as_array().unwrap().iter().all(|m| m["downloaded"] != true), "{out}");
}
