//! Client subcommands: thin over the server's HTTP API.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use serde_json::{json, Value};

/// Where the server is (`--host`, `--port`, with `LEMONADE_*` fallbacks).
#[derive(clap::Args, Clone)]
pub struct Target {
    /// Host of the running server.
    #[arg(long, env = "LEMONADE_HOST", default_value = "localhost")]
    pub host: String,
    /// Port of the running server.
    #[arg(long, env = "LEMONADE_PORT", default_value_t = 8000)]
    pub port: u16,
}

impl Target {
    fn url(&self, path: &str) -> String {
        format!("http://{}:{}/api/v1{path}", self.host, self.port)
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().connect_timeout(Duration::from_secs(5)).build().expect("client")
}

/// The server's error message, from an OpenAI-style or flat error body.
fn error_text(v: &Value) -> String {
    v["error"]["message"].as_str().or_else(|| v["error"].as_str()).map(str::to_string).unwrap_or_else(|| v.to_string())
}

async fn post(t: &Target, path: &str, body: &Value) -> Result<Value> {
    let r = http()
        .post(t.url(path))
        .json(body)
        .send()
        .await
        .with_context(|| format!("cannot reach lemonade at {}", t.url("")))?;
    let ok = r.status().is_success();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    if !ok {
        bail!("{}", error_text(&v));
    }
    Ok(v)
}

#[derive(clap::Args)]
pub struct PullArgs {
    /// Model name: a catalogue model, or `user.<name>` to register one with --checkpoint and --recipe.
    pub model: String,
    /// `org/repo:VARIANT` on Hugging Face (registers a user.* model).
    #[arg(long)]
    pub checkpoint: Option<String>,
    /// Backend recipe of a registered model.
    #[arg(long, value_parser = ["llamacpp", "flm", "ryzenai-llm", "whispercpp", "sd-cpp"])]
    pub recipe: Option<String>,
    /// Label the model as a reasoning model.
    #[arg(long)]
    pub reasoning: bool,
    /// Label the model as a vision model.
    #[arg(long)]
    pub vision: bool,
    /// Label the model as an embedding model.
    #[arg(long)]
    pub embedding: bool,
    /// Label the model as a reranking model.
    #[arg(long)]
    pub reranking: bool,
    /// mmproj file name in the checkpoint's repository.
    #[arg(long)]
    pub mmproj: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

/// `lemonade pull`: streams the server's progress events into a progress bar.
pub async fn pull(a: PullArgs, json_out: bool) -> Result<()> {
    let mut body = json!({"model": a.model, "stream": true});
    for (k, v) in [("checkpoint", &a.checkpoint), ("recipe", &a.recipe), ("mmproj", &a.mmproj)] {
        if let Some(v) = v {
            body[k] = json!(v);
        }
    }
    for (k, on) in
        [("reasoning", a.reasoning), ("vision", a.vision), ("embedding", a.embedding), ("reranking", a.reranking)]
    {
        if on {
            body[k] = json!(true);
        }
    }
    let r = http()
        .post(a.target.url("/pull"))
        .json(&body)
        .send()
        .await
        .with_context(|| format!("cannot reach lemonade at {}", a.target.url("")))?;
    if !r.status().is_success() {
        let v: Value = r.json().await.unwrap_or(Value::Null);
        bail!("Error pulling model: {}", error_text(&v));
    }
    let bar = indicatif::ProgressBar::new(0);
    if json_out {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg}\n  [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .expect("template")
            .progress_chars("=> "),
    );
    let mut stream = r.bytes_stream();
    let mut buf = String::new();
    let mut current = 0u64;
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let kind = event.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("");
            let data: Value = event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or(Value::Null);
            match kind {
                "progress" => {
                    let idx = data["file_index"].as_u64().unwrap_or(0);
                    if idx != current {
                        current = idx;
                        bar.set_length(data["bytes_total"].as_u64().unwrap_or(0));
                        bar.reset();
                        bar.set_message(format!(
                            "[{idx}/{}] {}",
                            data["total_files"],
                            data["file"].as_str().unwrap_or("")
                        ));
                    }
                    bar.set_position(data["bytes_downloaded"].as_u64().unwrap_or(0));
                }
                "complete" => {
                    bar.finish_and_clear();
                    if json_out {
                        println!("{}", json!({"status": "success", "model_name": a.model}));
                    } else {
                        println!("Model pulled successfully: {}", a.model);
                    }
                    return Ok(());
                }
                "error" => {
                    bar.abandon();
                    bail!("Error pulling model: {}", error_text(&data));
                }
                _ => {}
            }
        }
    }
    bar.abandon();
    bail!("Pull completed without success confirmation")
}

/// `lemonade delete`.
pub async fn delete(model: String, t: Target, json_out: bool) -> Result<()> {
    let v = post(&t, "/delete", &json!({"model": model})).await.context("Error deleting model")?;
    if json_out {
        println!("{v}");
    } else {
        println!("Model deleted successfully: {model}");
    }
    Ok(())
}

/// `lemonade list`: every model of the catalogue usable here, as a table.
pub async fn list(t: Target, json_out: bool) -> Result<()> {
    let r = http()
        .get(t.url("/models?show_all=true"))
        .send()
        .await
        .with_context(|| format!("cannot reach lemonade at {}", t.url("")))?;
    let v: Value = r.json().await?;
    if json_out {
        println!("{v}");
        return Ok(());
    }
    println!("{:<44} {:<11} {:<10} {:>8}  Labels", "Model Name", "Downloaded", "Recipe", "Size");
    println!("{}", "-".repeat(100));
    for m in v["data"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let size = m["size"].as_f64().map(|s| format!("{s:.2} GB")).unwrap_or_default();
        let labels: Vec<&str> =
            m["labels"].as_array().map(|l| l.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        println!(
            "{:<44} {:<11} {:<10} {:>8}  {}",
            m["id"].as_str().unwrap_or(""),
            if m["downloaded"] == true { "Yes" } else { "No" },
            m["recipe"].as_str().unwrap_or(""),
            size,
            labels.join(", ")
        );
    }
    println!("{}", "-".repeat(100));
    Ok(())
}
