//! Speech to text through lemonade on the real whisper-server (built by `cargo xtask setup`) with
//! a real Whisper (tiny.en), on speech that espeak-ng makes here from known sentences.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use test_support::hub::{HubDouble, Knobs};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

/// A WAV of espeak-ng speaking `text` (22.05 kHz mono, 16-bit).
fn speak(dir: &Path, name: &str, text: &str) -> PathBuf {
    let wav = dir.join(name);
    let out = Command::new("espeak-ng").args(["-s", "140", "-w"]).arg(&wav).arg(text).output();
    let out = out.expect("espeak-ng runs (cargo xtask setup installs it)");
    assert!(out.status.success(), "espeak-ng: {}", String::from_utf8_lossy(&out.stderr));
    wav
}

/// A multipart transcription request with `fields` and the file `bytes`.
async fn transcribe(l: &Lemonade, fields: &[(&str, &str)], file: Option<(&str, Vec<u8>)>) -> (u16, String) {
    let mut form = reqwest::multipart::Form::new();
    for (k, v) in fields {
        form = form.text(k.to_string(), v.to_string());
    }
    if let Some((name, bytes)) = file {
        form = form.part("file", reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()));
    }
    let r = l.http.post(l.url("/api/v1/audio/transcriptions")).multipart(form).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn error_message(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    v["error"]["message"].as_str().unwrap_or_else(|| panic!("not OpenAI's error shape: {v}")).to_string()
}

#[tokio::test]
async fn real_whisper_server_the_openai_sdk_transcribes_speech_beside_a_loaded_llm() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_whisper(), &[], &[]).await;
    let (s, v) = l.chat(SMOL).await;
    assert_eq!(s, 200, "{v}");
    let wav = speak(l.sandbox.dir.path(), "sentence.wav", SENTENCE);
    let (base, wav) = (l.url(""), wav.display().to_string());
    py_checks("audio_client.py", &[&base, WHISPER, &wav, SENTENCE, SMOL]).await;
    // Separate type slots: the LLM stayed loaded beside the transcription model.
    let (_, h) = l.get("/api/v1/health").await;
    let mut loaded = loaded_names(&h);
    loaded.sort();
    assert_eq!(loaded, [SMOL, WHISPER], "{h}");
    let whisper = h["all_models_loaded"].as_array().unwrap().iter().find(|m| m["model_name"] == WHISPER).unwrap();
    assert_eq!((whisper["type"].as_str(), whisper["recipe"].as_str()), (Some("audio"), Some("whispercpp")), "{h}");
}

#[tokio::test]
async fn real_whisper_server_bad_uploads_get_a_clear_4xx_and_load_nothing() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_whisper(), &[], &[]).await;
    let wav = std::fs::read(speak(l.sandbox.dir.path(), "s.wav", SENTENCE)).unwrap();

    let (s, v) = l.post("/api/v1/audio/transcriptions", &json!({"model": WHISPER, "file": "x"})).await;
    assert_eq!((s, v["error"]["message"].as_str()), (400, Some("Request must be multipart/form-data")), "{v}");
    let (s, b) = transcribe(&l, &[("model", WHISPER)], None).await;
    assert_eq!((s, error_message(&b)), (400, "Missing 'file' field in request".into()));
    let (s, b) = transcribe(&l, &[], Some(("s.wav", wav.clone()))).await;
    assert_eq!((s, error_message(&b)), (400, "Missing 'model' field in request".into()));
    let (s, b) = transcribe(&l, &[("model", WHISPER)], Some(("cat.png", b"\x89PNG\r\n\x1a\n0000".to_vec()))).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(
        error_message(&b),
        "The uploaded file 'cat.png' is not audio lemonade can transcribe: expected WAV, MP3, FLAC or Ogg Vorbis"
    );
    let (s, b) = transcribe(&l, &[("model", WHISPER)], Some(("empty.wav", vec![]))).await;
    assert_eq!(s, 400, "an empty file: {b}");
    let (s, b) = transcribe(&l, &[("model", WHISPER), ("response_format", "mp3")], Some(("s.wav", wav.clone()))).await;
    assert_eq!(s, 400, "{b}");
    assert!(error_message(&b).starts_with("Unsupported response_format 'mp3': expected one of json, text"), "{b}");
    let (s, b) = transcribe(&l, &[("model", WHISPER), ("temperature", "hot")], Some(("s.wav", wav.clone()))).await;
    assert_eq!((s, error_message(&b).contains("'temperature'")), (400, true), "{b}");
    let (s, b) = transcribe(&l, &[("model", GEMMA)], Some(("s.wav", wav.clone()))).await;
    assert_eq!(s, 400, "{b}");
    assert!(error_message(&b).contains("is an llm model; audio/transcriptions needs an audio model"), "{b}");
    let (s, b) = transcribe(&l, &[("model", "user.Nope")], Some(("s.wav", wav.clone()))).await;
    assert_eq!(s, 404, "{b}");

    // 200 MB: a JSON 413 once the body limit (64 MiB) is passed, not a dropped connection.
    let chunk = bytes::Bytes::from(vec![b'a'; 1 << 20]);
    let body = futures_util::stream::iter((0..200).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
    let r = l
        .http
        .post(l.url("/api/v1/audio/transcriptions"))
        .header("content-type", "multipart/form-data; boundary=xyz")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    let b = r.text().await.unwrap();
    assert_eq!(s, 413, "{b}");
    assert!(error_message(&b).contains("larger than the limit"), "{b}");

    // Nothing above loaded a model, and the server still transcribes.
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"], json!([]), "{h}");
    let (s, b) = transcribe(&l, &[("model", WHISPER), ("response_format", "text")], Some(("s.wav", wav))).await;
    assert_eq!(s, 200, "{b}");
    assert!(b.to_lowercase().contains("models"), "{b}");
}

#[tokio::test]
async fn real_whisper_server_killed_mid_transcription_gives_502_and_the_next_request_reloads_it() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_whisper(), &[], &[]).await;
    let long = (0..12).map(|_| SENTENCE).collect::<Vec<_>>().join(" ");
    let wav = std::fs::read(speak(l.sandbox.dir.path(), "long.wav", &long)).unwrap();
    let short = std::fs::read(speak(l.sandbox.dir.path(), "short.wav", SENTENCE)).unwrap();
    let (s, b) = transcribe(&l, &[("model", WHISPER)], Some(("short.wav", short.clone()))).await;
    assert_eq!(s, 200, "{b}");
    let first_pids = child_pids(l.pid());
    assert_eq!(first_pids.len(), 1, "one backend: {first_pids:?}");

    let request = transcribe(&l, &[("model", WHISPER)], Some(("long.wav", wav)));
    let killer = l.kill_when_in_flight(WHISPER, first_pids[0]);
    let ((s, b), ()) = tokio::join!(request, killer);
    assert_eq!(s, 502, "{b}");
    assert!(error_message(&b).contains(&format!("The backend of model '{WHISPER}' exited")), "{b}");

    // The next request loads the model again and is answered.
    let (s, b) = transcribe(&l, &[("model", WHISPER), ("response_format", "text")], Some(("short.wav", short))).await;
    assert_eq!(s, 200, "{b}");
    assert!(b.to_lowercase().contains("port"), "{b}");
    let now = child_pids(l.pid());
    assert!(now.len() == 1 && now != first_pids, "a new backend: {now:?} (was {first_pids:?})");
}

#[tokio::test]
async fn real_whisper_server_a_second_audio_model_evicts_the_first_and_not_the_llm() {
    let s = Sandbox::new().with_whisper();
    let entry =
        json!({"checkpoint": "ggerganov/whisper.cpp:ggml-tiny.en.bin", "recipe": "whispercpp", "labels": ["audio"]});
    s.register("Whisper-Copy", entry);
    let l = Lemonade::start_in(bin(), s, &["--max-loaded-models", "1"], &[]).await;
    let wav = std::fs::read(speak(l.sandbox.dir.path(), "s.wav", SENTENCE)).unwrap();
    let (s, v) = l.chat(SMOL).await;
    assert_eq!(s, 200, "{v}");
    for model in [WHISPER, "user.Whisper-Copy"] {
        let (s, b) = transcribe(&l, &[("model", model)], Some(("s.wav", wav.clone()))).await;
        assert_eq!(s, 200, "{model}: {b}");
    }
    let (_, h) = l.get("/api/v1/health").await;
    let mut loaded = loaded_names(&h);
    loaded.sort();
    assert_eq!(loaded, [SMOL, "user.Whisper-Copy"], "the audio slot held one model: {h}");
    assert_eq!(h["max_models"]["audio"], 1, "{h}");
}

#[tokio::test]
async fn real_whisper_server_cli_pulls_lists_and_deletes_whisper_models() {
    let tmp = tempfile::tempdir().unwrap();
    // The catalogue's Whisper-Tiny (ggerganov/whisper.cpp:ggml-tiny.bin), played by tiny.en's
    // bytes, and tiny.en under its own name for a user.* registration.
    let repo = tmp.path().join("ggerganov/whisper.cpp");
    std::fs::create_dir_all(&repo).unwrap();
    std::os::unix::fs::symlink(model(WHISPER_FILE), repo.join("ggml-tiny.bin")).unwrap();
    std::os::unix::fs::symlink(model(WHISPER_FILE), repo.join("ggml-tiny.en.bin")).unwrap();
    let double = HubDouble::start(tmp.path(), Knobs::default()).await;
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[("HF_ENDPOINT", &double.url)]).await;

    let (code, out, err) = l.cli(&["pull", "Whisper-Tiny"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let user =
        ["pull", "user.Tiny-En", "--checkpoint", "ggerganov/whisper.cpp:ggml-tiny.en.bin", "--recipe", "whispercpp"];
    let (code, out, err) = l.cli(&user).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = l.cli(&["list", "--json"]).await;
    assert_eq!(code, 0, "{out}");
    let list: Value = serde_json::from_str(&out).unwrap();
    for name in ["Whisper-Tiny", "Tiny-En"] {
        let m = list["data"].as_array().unwrap().iter().find(|m| m["id"] == name);
        let m = m.unwrap_or_else(|| panic!("{name}: {out}"));
        assert_eq!(m["downloaded"], true, "{m}");
        assert_eq!(m["recipe"], "whispercpp", "{m}");
    }
    let (_, v) = l.get("/api/v1/models/user.Tiny-En").await;
    assert!(v["labels"].as_array().unwrap().contains(&json!("audio")), "{v}");

    let wav = std::fs::read(speak(tmp.path(), "s.wav", SENTENCE)).unwrap();
    let (s, b) = transcribe(&l, &[("model", "Whisper-Tiny"), ("response_format", "text")], Some(("s.wav", wav))).await;
    assert_eq!(s, 200, "{b}");
    assert!(b.to_lowercase().contains("models"), "{b}");

    for name in ["Whisper-Tiny", "Tiny-En"] {
        let (code, out, err) = l.cli(&["delete", name]).await;
        assert_eq!(code, 0, "{name}: {out}{err}");
    }
    let (_, out, _) = l.cli(&["list", "--json"]).await;
    let list: Value = serde_json::from_str(&out).unwrap();
    assert!(list["data"].as_array().unwrap().iter().all(|m| m["downloaded"] != true), "{out}");
    let blobs = l.sandbox.hf_cache().join("models--ggerganov--whisper.cpp/blobs");
    assert_eq!(std::fs::read_dir(&blobs).map(|d| d.count()).unwrap_or(0), 0, "the files are gone");
}

/// Lemonade v11's `whispercpp_args`: given at `/load`, whisper-server runs with them (and still
/// transcribes); a flag lemonade manages is a 400 naming the option; they are in the model's
/// options and merge with the server's `whispercpp_args`.
#[tokio::test]
async fn real_whisper_server_runs_with_whispercpp_args() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_whisper(), &[], &[]).await;
    let (s, e) = l.post("/api/v1/load", &json!({"model_name": WHISPER, "whispercpp_args": "--port 9"})).await;
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("whispercpp_args")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("'--port' is managed by lemonade"), "{e}");
    assert!(loaded_names(&l.get("/api/v1/health").await.1).is_empty());

    assert_eq!(l.post("/internal/set", &json!({"whispercpp": {"args": "-t 2 --no-timestamps"}})).await.0, 200);
    let (s, v) = l.post("/api/v1/load", &json!({"model_name": WHISPER, "whispercpp_args": "-t 1"})).await;
    assert_eq!(s, 200, "{v}");
    let cmdline = std::fs::read_to_string(format!("/proc/{}/cmdline", child_pids(l.pid())[0])).unwrap();
    assert!(
        cmdline.ends_with("\u{0}-t\u{0}1\u{0}--no-timestamps\u{0}"),
        "the model's -t wins, the server's other flag is kept: {cmdline:?}"
    );
    let (_, o) = l.get(&format!("/api/v1/models/{WHISPER}/options")).await;
    assert_eq!(
        (o["effective"]["whispercpp_args"].clone(), o["defaults"]["merge_args"].clone()),
        (json!("-t 2 --no-timestamps"), json!(true)),
        "a load's options are not saved: {o}"
    );
    let wav = std::fs::read(speak(l.sandbox.dir.path(), "s.wav", SENTENCE)).unwrap();
    let (s, b) = transcribe(&l, &[("model", WHISPER)], Some(("s.wav", wav))).await;
    assert_eq!(s, 200, "{b}");
    assert!(b.to_lowercase().contains("lemonade"), "{b}");
}
