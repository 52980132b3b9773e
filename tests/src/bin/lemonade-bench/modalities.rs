//! The other modalities against their backends direct, side by side in one run: transcription,
//! image generation and speech through lemonade against the same whisper-server, sd-server and
//! koko reached at the `backend_url` lemonade reports.

use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};
use test_support::{Lemonade, Sandbox, SD, WHISPER};

use crate::median;

/// Speech espeak-ng makes from a fixed passage, and its length in seconds.
pub fn espeak_passage(dir: &Path) -> anyhow::Result<(Vec<u8>, f64)> {
    let text = "Lemonade serves many models on one port. It pulls them from the hub, runs each one in \
                its own backend, and forwards every request as a byte pipe, so a client never waits \
                on the server itself.";
    let wav = dir.join("passage.wav");
    let ok = std::process::Command::new("espeak-ng").args(["-s", "150", "-w"]).arg(&wav).arg(text).status()?;
    anyhow::ensure!(ok.success(), "espeak-ng failed");
    let bytes = std::fs::read(&wav)?;
    // 16-bit mono PCM: the data after the 44-byte header, at the rate in bytes 24..28.
    let rate = u32::from_le_bytes(bytes[24..28].try_into()?) as f64;
    Ok((bytes.clone(), (bytes.len() - 44) as f64 / 2.0 / rate))
}

async fn post_form(http: &reqwest::Client, url: &str, wav: &[u8], model: Option<&str>) -> anyhow::Result<f64> {
    let mut form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(wav.to_vec()).file_name("passage.wav"))
        .text("response_format", "json");
    if let Some(m) = model {
        form = form.text("model", m.to_string());
    }
    let t = Instant::now();
    let resp = http.post(url).multipart(form).send().await?;
    let status = resp.status();
    let body: Value = resp.json().await?;
    anyhow::ensure!(status.is_success() && body["text"].is_string(), "{url}: {status} {body}");
    Ok(t.elapsed().as_secs_f64())
}

/// Real-time factor (processing time ÷ audio length) through lemonade and direct.
pub async fn transcription(bin: &Path) -> anyhow::Result<Value> {
    const REPS: usize = 16;
    let l = Lemonade::start_in(bin, Sandbox::new().with_whisper(), &["--log-level", "info"], &[]).await;
    let (wav, seconds) = espeak_passage(l.sandbox.dir.path())?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let via = l.url("/api/v1/audio/transcriptions");
    post_form(&http, &via, &wav, Some(WHISPER)).await?;
    let (_, health) = l.get("/api/v1/health").await;
    let backend = health["all_models_loaded"][0]["backend_url"].as_str().unwrap_or_default();
    let direct = format!("{}/inference", backend.trim_end_matches("/v1"));
    post_form(&http, &direct, &wav, None).await?;
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for rep in 0..REPS {
        for lemonade in [rep % 2 == 0, rep % 2 != 0] {
            if lemonade {
                p.push(post_form(&http, &via, &wav, Some(WHISPER)).await? / seconds);
            } else {
                d.push(post_form(&http, &direct, &wav, None).await? / seconds);
            }
        }
    }
    let ratio = median(p.iter().zip(&d).map(|(p, d)| p / d).collect());
    let added_ms = median(p.iter().zip(&d).map(|(p, d)| (p - d) * seconds * 1e3).collect());
    let (dr, pr) = (median(d), median(p));
    println!("\nTranscription, Whisper tiny.en on whisper-server, {seconds:.1} s of speech, {REPS} reps (medians)\n");
    println!("| path | real-time factor |");
    println!("|---|---:|");
    println!("| direct whisper-server (/inference) | {dr:.3} |");
    println!("| through lemonade (/api/v1/audio/transcriptions) | {pr:.3} |");
    println!("| lemonade / direct (paired median) | ×{ratio:.3} ({added_ms:+.0} ms a request) |");
    Ok(
        json!({"reps": REPS, "audio_seconds": seconds, "direct_rtf": dr, "lemonade_rtf": pr, "ratio": ratio, "added_ms": added_ms}),
    )
}

/// Image generation time through lemonade against the same sd-server direct, with the body
/// lemonade sends it (the sd parameters in an extra-args block).
pub async fn images(bin: &Path) -> anyhow::Result<Value> {
    const REPS: usize = 6;
    let l = Lemonade::start_in(bin, Sandbox::new().with_sd(), &["--log-level", "info"], &[]).await;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let prompt = "a glass of lemonade on a table";
    let via = (
        l.url("/api/v1/images/generations"),
        json!({"model": SD, "prompt": prompt, "size": "256x256", "steps": 1, "seed": 3}),
    );
    let post = |url: String, body: Value| {
        let http = http.clone();
        async move {
            let t = Instant::now();
            let resp = http.post(&url).json(&body).send().await?;
            let status = resp.status();
            let v: Value = resp.json().await?;
            anyhow::ensure!(status.is_success() && v["data"][0]["b64_json"].is_string(), "{url}: {status}");
            Ok::<f64, anyhow::Error>(t.elapsed().as_secs_f64())
        }
    };
    post(via.0.clone(), via.1.clone()).await?;
    let (_, health) = l.get("/api/v1/health").await;
    let backend = health["all_models_loaded"][0]["backend_url"].as_str().unwrap_or_default().to_string();
    use backends::sdcpp::SdParams;
    let params = api_types::SdParameters { steps: Some(1), seed: Some(3), ..Default::default() };
    let direct = (
        format!("{backend}/images/generations"),
        json!({"prompt": params.prompt_with(prompt), "n": 1, "size": "256x256", "output_format": "png"}),
    );
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for rep in 0..REPS {
        for lemonade in [rep % 2 == 0, rep % 2 != 0] {
            if lemonade {
                p.push(post(via.0.clone(), via.1.clone()).await?);
            } else {
                d.push(post(direct.0.clone(), direct.1.clone()).await?);
            }
        }
    }
    let ratio = median(p.iter().zip(&d).map(|(p, d)| p / d).collect());
    let added_ms = median(p.iter().zip(&d).map(|(p, d)| (p - d) * 1e3).collect());
    let (ds, ps) = (median(d), median(p));
    println!("\nImage generation, SDXS-512 (random weights) on sd-server, 256x256, 1 step, {REPS} reps (medians)\n");
    println!("| path | seconds per image |");
    println!("|---|---:|");
    println!("| direct sd-server (/v1/images/generations) | {ds:.2} |");
    println!("| through lemonade (/api/v1/images/generations) | {ps:.2} |");
    println!("| lemonade / direct (paired median) | ×{ratio:.3} ({added_ms:+.0} ms an image) |");
    Ok(json!({"reps": REPS, "direct_s": ds, "lemonade_s": ps, "ratio": ratio, "added_ms": added_ms}))
}

/// Time to the first audio byte and to the whole answer, for a three-sentence text spoken by
/// Kokoro, through lemonade against the same koko direct.
pub async fn speech(bin: &Path) -> anyhow::Result<Value> {
    use futures_util::StreamExt;
    const REPS: usize = 6;
    let l = Lemonade::start_in(bin, Sandbox::new().with_kokoro(), &["--log-level", "info"], &[]).await;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let text = "Lemonade serves many models on one port. It pulls them from the hub. It forwards every request.";
    let once = |url: String, model: Option<&'static str>| {
        let http = http.clone();
        async move {
            let mut body = json!({"input": text, "voice": "jf_alpha", "response_format": "pcm"});
            if let Some(m) = model {
                body["model"] = json!(m);
            }
            let t = Instant::now();
            let resp = http.post(&url).json(&body).send().await?;
            anyhow::ensure!(resp.status().is_success(), "{url}: {}", resp.status());
            let mut stream = resp.bytes_stream();
            let (mut first, mut bytes) = (None, 0usize);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                if !chunk.is_empty() {
                    first.get_or_insert_with(|| t.elapsed().as_secs_f64());
                    bytes += chunk.len();
                }
            }
            anyhow::ensure!(bytes > 48_000, "{url}: {bytes} bytes");
            Ok::<(f64, f64), anyhow::Error>((first.unwrap_or_default(), t.elapsed().as_secs_f64()))
        }
    };
    let via = l.url("/api/v1/audio/speech");
    once(via.clone(), Some(test_support::KOKORO)).await?;
    let (_, health) = l.get("/api/v1/health").await;
    let backend = health["all_models_loaded"][0]["backend_url"].as_str().unwrap_or_default().to_string();
    let direct = format!("{backend}/audio/speech");
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for rep in 0..REPS {
        for lemonade in [rep % 2 == 0, rep % 2 != 0] {
            if lemonade {
                p.push(once(via.clone(), Some(test_support::KOKORO)).await?);
            } else {
                d.push(once(direct.clone(), None).await?);
            }
        }
    }
    let first_ratio = median(p.iter().zip(&d).map(|(p, d)| p.0 / d.0).collect());
    let added_ms = median(p.iter().zip(&d).map(|(p, d)| (p.0 - d.0) * 1e3).collect());
    let (df, pf) = (median(d.iter().map(|x| x.0).collect()), median(p.iter().map(|x| x.0).collect()));
    let (dt, pt) = (median(d.iter().map(|x| x.1).collect()), median(p.iter().map(|x| x.1).collect()));
    println!("\nSpeech, Kokoro-82M int8 on koko (ONNX Runtime), three sentences as pcm, {REPS} reps (medians)\n");
    println!("| path | first audio byte (s) | whole answer (s) |");
    println!("|---|---:|---:|");
    println!("| direct koko (/v1/audio/speech) | {df:.3} | {dt:.2} |");
    println!("| through lemonade (/api/v1/audio/speech) | {pf:.3} | {pt:.2} |");
    println!("| lemonade vs direct (paired medians) | {added_ms:+.1} ms, ×{first_ratio:.3} | |");
    Ok(
        json!({"reps": REPS, "direct": {"first_byte_s": df, "total_s": dt}, "lemonade": {"first_byte_s": pf, "total_s": pt},
              "added_first_byte_ms": added_ms, "first_byte_ratio": first_ratio}),
    )
}
