//! The interactive chat of `lemonade run`: a prompt with line editing and input history
//! (rustyline), the conversation kept as context for each turn, answers streamed as they are
//! generated. Ctrl-C stops the answer being generated (the connection is closed, so the server
//! cancels it), not the program; `/exit`, `/bye` or Ctrl-D end the chat.

use std::io::Write;

use anyhow::{Context, Result};
use api_types::{ChatCompletionRequest, ChatMessage};
use futures_util::{FutureExt, StreamExt};
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};

use crate::client::{error_text, Target};

const HELP: &str = "Type a message and press Enter. Commands: /exit or /bye (or Ctrl-D) to quit, /clear to forget \
the conversation, /help for this text. Ctrl-C stops an answer.";

enum Input {
    Line(String),
    Interrupted,
    Eof,
}

fn read_line(editor: &mut rustyline::DefaultEditor) -> Input {
    match editor.readline(">>> ") {
        Ok(l) => {
            let _ = editor.add_history_entry(l.as_str());
            Input::Line(l)
        }
        Err(rustyline::error::ReadlineError::Interrupted) => Input::Interrupted,
        Err(_) => Input::Eof,
    }
}

pub async fn run(t: &Target, model: &str, max_tokens: Option<u32>) -> Result<()> {
    // Registered before the first answer, so Ctrl-C never kills the process from now on.
    let mut sigint = signal(SignalKind::interrupt()).context("cannot handle Ctrl-C")?;
    let editor = rustyline::DefaultEditor::new().context("cannot open the terminal")?;
    let editor = std::sync::Arc::new(parking_lot::Mutex::new(editor));
    println!("Chatting with {model}. {HELP}");
    let mut history: Vec<ChatMessage> = Vec::new();
    loop {
        let ed = editor.clone();
        let input = tokio::task::spawn_blocking(move || read_line(&mut ed.lock())).await.unwrap_or(Input::Eof);
        let line = match input {
            Input::Eof => break,
            Input::Interrupted => {
                println!("(Use /exit or Ctrl-D to quit)");
                continue;
            }
            Input::Line(l) => l.trim().to_string(),
        };
        match line.as_str() {
            "" => continue,
            "/exit" | "/bye" | "/quit" => break,
            "/clear" => {
                history.clear();
                println!("(conversation cleared)");
                continue;
            }
            "/help" | "/?" => {
                println!("{HELP}");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::text("user", line));
        // A Ctrl-C typed while at the prompt must not stop the next answer.
        while sigint.recv().now_or_never().is_some() {}
        let (answer, stopped) = tokio::select! {
            r = stream_answer(t, model, &history, max_tokens) => match r {
                Ok(a) => (a, false),
                Err(e) => {
                    println!();
                    eprintln!("Error: {e:#}");
                    history.pop();
                    continue;
                }
            },
            _ = sigint.recv() => (None, true),
        };
        if stopped {
            println!("\n[generation stopped]");
            // The partial answer was printed; the turn is dropped from the context.
            history.pop();
            continue;
        }
        println!();
        history.push(ChatMessage::text("assistant", answer.unwrap_or_default()));
    }
    Ok(())
}

/// Streams one answer to stdout; returns its text.
async fn stream_answer(
    t: &Target,
    model: &str,
    history: &[ChatMessage],
    max_tokens: Option<u32>,
) -> Result<Option<String>> {
    let body = ChatCompletionRequest {
        model: Some(model.to_string()),
        messages: history.to_vec(),
        stream: Some(true),
        max_tokens: max_tokens.map(u64::from),
        ..Default::default()
    };
    let r = t.client(None).post_stream("/chat/completions", &body).await?;
    let mut stream = r.bytes_stream();
    let mut buf = String::new();
    let mut text = String::new();
    let mut stdout = std::io::stdout();
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find('\n') {
            let line: String = buf.drain(..end + 1).collect();
            let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else { continue };
            if data == "[DONE]" {
                return Ok(Some(text));
            }
            let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
            if v.get("error").is_some() {
                anyhow::bail!("{}", error_text(&v));
            }
            if let Some(piece) = v["choices"][0]["delta"]["content"].as_str() {
                text.push_str(piece);
                print!("{piece}");
                let _ = stdout.flush();
            }
        }
    }
    Ok(Some(text))
}
