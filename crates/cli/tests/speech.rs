//! Text to speech through lemonade on its Kokoro backend (`koko`: kokoro-onnx on ONNX Runtime,
//! installed by `cargo xtask setup`) with the real Kokoro-82M, checked by ear with Whisper.

use std::path::Path;

use serde_json::{json, Value};
use test_support::hub::{HubDouble, Knobs};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

const VOICE: &str = "jf_alpha";

#[tokio::test]
async fn real_kokoro_the_openai_sdk_speaks_and_whisper_hears_it_beside_a_loaded_llm() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_kokoro().with_whisper(), &[], &[]).await;
    let (s, v) = l.chat(SMOL).await;
    assert_eq!(s, 200, "{v}");
    let base = l.url("");
    py_checks("speech_client.py", &[&base, KOKORO, VOICE, WHISPER, SENTENCE, SMOL]).await;
    // Three type slots, three models.
    let (_, h) = l.get("/api/v1/health").await;
    let mut loaded = loaded_names(&h);
    loaded.sort();
    assert_eq!(loaded, [KOKORO, SMOL, WHISPER], "{h}");
    let k = h["all_models_loaded"].as_array().unwrap().iter().find(|m| m["model_name"] == KOKORO).unwrap();
    assert_eq!((k["type"].as_str(), k["recipe"].as_str()), (Some("tts"), Some("kokoro")), "{h}");
}

async fn speak(l: &Lemonade, body: Value) -> reqwest::Response {
    l.http.post(l.url("/api/v1/audio/speech")).json(&body).send().await.unwrap()
}

#[tokio::test]
async fn real_kokoro_bad_speech_requests_get_a_clear_4xx_and_a_killed_backend_is_reloaded() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_kokoro(), &[], &[]).await;
    for (body, needle) in [
        (json!({"model": KOKORO}), "Missing required field 'input'"),
        (json!({"model": KOKORO, "input": ""}), "'input' must not be empty"),
        (json!({"model": KOKORO, "input": "Hi.", "response_format": "opus"}), "Unsupported response_format 'opus'"),
        (json!({"model": KOKORO, "input": "Hi.", "speed": 0.1}), "'speed': expected 0.5 to 2.0"),
        (json!({"model": KOKORO, "input": "Hi.", "speed": "fast"}), "Invalid value for 'speed'"),
        (json!({"model": GEMMA, "input": "Hi."}), "audio/speech needs a tts model"),
    ] {
        let (s, v) = l.post("/api/v1/audio/speech", &body).await;
        assert_eq!(s, 400, "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap_or_default().contains(needle), "{body}: {v}");
    }
    let (_, h) = l.get("/api/v1/health").await;
    assert_eq!(h["all_models_loaded"], json!([]), "nothing above loaded a model: {h}");
    // An unknown voice is the backend's to judge: its 400 comes back in OpenAI's shape.
    let r = speak(&l, json!({"model": KOKORO, "input": "Hi.", "voice": "af_heart"})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("unknown voice 'af_heart': this model has jf_alpha"),
        "{v}"
    );

    // Killed mid-request: before koko answers, a 502 naming the exit; once the audio streams,
    // the answer is cut (an error for the client, not a WAV that merely ends). Then the next
    // request reloads the model and is whole.
    let first = child_pids(l.pid());
    assert_eq!(first.len(), 1, "{first:?}");
    let long = (0..12).map(|_| SENTENCE).collect::<Vec<_>>().join(" ");
    let request = async {
        let r = speak(&l, json!({"model": KOKORO, "input": long, "voice": VOICE})).await;
        (r.status().as_u16(), r.bytes().await)
    };
    let ((status, body), ()) = tokio::join!(request, l.kill_when_in_flight(KOKORO, first[0]));
    match status {
        200 => assert!(body.is_err(), "a cut stream is an error, got {} bytes", body.map(|b| b.len()).unwrap_or(0)),
        502 => {
            let v: Value = serde_json::from_slice(&body.unwrap()).unwrap();
            assert!(
                v["error"]["message"].as_str().unwrap().contains(&format!("The backend of model '{KOKORO}' exited")),
                "{v}"
            );
        }
        other => panic!("{other}: {body:?}"),
    }
    // A cut stream reaches the client as the connection breaks, which can be a moment before
    // lemonade has reaped the process; the next request is the one after lemonade knows.
    let unloaded = wait_for(std::time::Duration::from_secs(10), || async {
        let (_, h) = l.get("/api/v1/health").await;
        (!loaded_names(&h).iter().any(|n| n == KOKORO)).then_some(())
    })
    .await;
    assert!(unloaded.is_some(), "the crash was never noticed");
    let r = speak(&l, json!({"model": KOKORO, "input": SENTENCE, "voice": VOICE, "response_format": "pcm"})).await;
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.unwrap().len() > 24_000, "at least half a second of speech");
    let now = child_pids(l.pid());
    assert!(now.len() == 1 && now != first, "a new backend: {now:?} (was {first:?})");
}

#[tokio::test]
async fn real_kokoro_cli_pulls_lists_and_deletes_speech_models() {
    let tmp = tempfile::tempdir().unwrap();
    // The catalogue's kokoro-v1 (the whole mikkoph/kokoro-onnx repository), played by the
    // provisioned files, and the same files for a user.* registration.
    kokoro_repo(&tmp.path().join("mikkoph/kokoro-onnx"));
    kokoro_repo(&tmp.path().join(KOKORO_REPO));
    let double = HubDouble::start(tmp.path(), Knobs::default()).await;
    let l = Lemonade::start_in(bin(), Sandbox::empty(), &[], &[("HF_ENDPOINT", &double.url)]).await;
    let (code, out, err) = l.cli(&["pull", "kokoro-v1"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = l.cli(&["pull", "user.Voice", "--checkpoint", KOKORO_REPO, "--recipe", "kokoro"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (_, out, _) = l.cli(&["list", "--json"]).await;
    let list: Value = serde_json::from_str(&out).unwrap();
    for name in ["kokoro-v1", "Voice"] {
        let m = list["data"].as_array().unwrap().iter().find(|m| m["id"] == name);
        let m = m.unwrap_or_else(|| panic!("{name}: {out}"));
        assert_eq!((m["downloaded"].as_bool(), m["recipe"].as_str()), (Some(true), Some("kokoro")), "{m}");
        assert!(m["labels"].as_array().unwrap().contains(&json!("tts")), "{m}");
    }
    let r = speak(&l, json!({"model": "user.Voice", "input": SENTENCE, "voice": VOICE})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(&r.bytes().await.unwrap()[..4], b"RIFF");
    for name in ["kokoro-v1", "Voice"] {
        let (code, out, err) = l.cli(&["delete", name]).await;
        assert_eq!(code, 0, "{name}: {out}{err}");
    }
    let (_, out, _) = l.cli(&["list", "--json"]).await;
    let list: Value = serde_json::from_str(&out).unwrap();
    assert!(list["data"].as_array().unwrap().iter().all(|m| m["downloaded"] != true), "{out}");
}
