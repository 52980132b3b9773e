//! Lemonade v11's omni collections (`collection.omni`) through `lemonade serve`: the server
//! runs the tool loop, on real sd-server and Kokoro. The planners here are the real small
//! models that ship in packages (no provisioned model calls tools through its chat template,
//! so they plan with `tool_format: "json"`), and a scripted planner (the fake backend) for the
//! loop's edges: native tool calls, a client's own tools, a component that fails, a planner
//! that repeats itself.

use std::path::Path;

use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

/// A few-shot prompt: a 135M or 270M planner needs examples of the JSON it must write.
const FEW_SHOT: &str = "You are a helpful assistant with these tools:\n{tool_list}{tool_guidance}\n\nExamples:\n\
User: Draw a cat.\nAssistant: {\"tool\": \"generate_image\", \"with\": {\"prompt\": \"a cat\"}}\n\
User: Say good night.\nAssistant: {\"tool\": \"text_to_speech\", \"with\": {\"input\": \"Good night\"}}\n\
User: Tool result of generate_image: {\"status\": \"ok\"}\nAssistant: {\"response\": \"I drew a cat.\"}";

fn omni(name: &str, components: &[&str], extra: Value) -> Value {
    let mut v = json!({"model": name, "recipe": "collection.omni", "components": components});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    v
}

/// The loop on real backends, each through the official openai SDK, whole and streamed: "draw
/// a lemon and say what you drew" answers with a PNG from sd-server and text; "say hello" with
/// a WAV from Kokoro. Gemma 3 270M plans the first and SmolLM2-135M the second: each of these
/// tiny models picks one tool for nearly every request (Gemma generate_image, SmolLM2
/// text_to_speech), so this proves the loop runs a real planner's call on real components, not
/// that the planner chose by content (the scripted tests below prove what the loop does with a
/// choice).
#[tokio::test]
async fn real_backends_omni_loop_runs_each_biased_planners_tool_through_the_openai_sdk() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_sd().with_kokoro(), &["--max-loaded-models", "4"], &[]).await;
    let settings = json!({"tool_format": "json", "system_prompt": FEW_SHOT});
    for (name, planner) in [("user.Omni-Draw", GEMMA), ("user.Omni-Speak", SMOL)] {
        let (s, v) = l.post("/api/v1/pull", &omni(name, &[planner, SD, KOKORO], settings.clone())).await;
        assert_eq!((s, v["model_name"].clone()), (200, json!(name)), "{v}");
    }
    let (_, m) = l.get("/api/v1/models/user.Omni-Draw").await;
    let tools: Vec<(Value, Value)> =
        m["omni_tools"].as_array().unwrap().iter().map(|t| (t["name"].clone(), t["component"].clone())).collect();
    assert_eq!(tools, [(json!("generate_image"), json!(SD)), (json!("text_to_speech"), json!(KOKORO))], "{m}");
    assert_eq!((m["tool_format"].clone(), m["labels"].clone()), (json!("json"), json!(["collection", "omni"])));
    let base = l.url("");
    let out = py_checks(
        "omni_client.py",
        &[&base, "user.Omni-Draw", "Draw a lemon and say what you drew.", "image", "generate_image", SD, "lemon"],
    )
    .await;
    eprintln!("draw: {out}");
    let out = py_checks(
        "omni_client.py",
        &[&base, "user.Omni-Speak", "Say hello.", "audio", "text_to_speech", KOKORO, "hello"],
    )
    .await;
    eprintln!("speak: {out}");
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
}

/// The loop's edges with a scripted planner (the fake backend answers its `replies` in turn)
/// and real sd-server and Kokoro as tools: a component that fails tells the planner and the
/// request goes on; a call repeated is not run again and the next round must answer; a call
/// of the client's own tool goes back to the client; the answer streams with the medium first.
#[tokio::test]
async fn scripted_planner_omni_loop_survives_failing_tools_repeats_and_client_tools() {
    let lemon = json!({"replies": [
        {"content": "", "tool_calls": [call("a", "generate_image", json!({"prompt": "a lemon", "size": "huge"}))]},
        {"content": "", "tool_calls": [call("b", "text_to_speech", json!({"input": "Here is a lemon."}))]},
        {"content": "", "tool_calls": [call("c", "text_to_speech", json!({"input": "Here is a lemon."}))]},
        {"content": "Done. Last tool said: {last}"}
    ]});
    let weather = json!({"replies": [{"content": "Let me look.", "tool_calls": [call("w", "get_weather", json!({"city": "Paris"}))]}]});
    let hello = json!({"replies": [
        {"content": "", "tool_calls": [call("h", "text_to_speech", json!({"input": "Hello."}))]},
        {"content": "I said hello."}
    ]});
    let fake = fake_llama_server();
    let sandbox = fake_sandbox(&[("planner", None, lemon), ("weather", None, weather), ("hello", None, hello)])
        .with_sd()
        .with_kokoro();
    let images = tempfile::tempdir().unwrap();
    let env = [
        ("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap()),
        ("LEMONADE_MCP_IMAGE_DIR", images.path().to_str().unwrap()),
    ];
    let l = Lemonade::start_in(bin(), sandbox, &["--max-loaded-models", "4"], &env).await;
    let (planner, weather) = ("extra.planner", "extra.weather");
    for (name, p) in [("user.Lemon", planner), ("user.Weather", weather), ("user.Hello", "extra.hello")] {
        let (s, v) = l.post("/api/v1/pull", &omni(name, &[p, SD, KOKORO], json!({}))).await;
        assert_eq!(s, 200, "{v}");
    }
    let ask = |model: &str, stream: bool| json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "Draw a lemon"}]});
    let (s, v) = l.post("/api/v1/chat/completions", &ask("user.Lemon", false)).await;
    assert_eq!(
        (s, v["model"].clone(), v["choices"][0]["finish_reason"].clone()),
        (200, json!("user.Lemon"), json!("stop")),
        "{v}"
    );
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        content.starts_with("Done. Last tool said: {\"error\":\"already done"),
        "the repeat was refused and told: {content}"
    );
    assert_eq!(
        content.matches("<audio>data:audio/wav;base64,UklG").count(),
        1,
        "one WAV from Kokoro: {}",
        &content[..200.min(content.len())]
    );
    assert!(!content.contains("data:image/png"), "the failed image made none");
    let trace = &v["x_lemonade_omni"];
    assert_eq!((trace["planner"].clone(), trace["tool_format"].clone()), (json!(planner), json!("native")));
    let calls = trace["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "the repeat did not run: {trace}");
    assert_eq!((calls[0]["name"].clone(), calls[0]["component"].clone()), (json!("generate_image"), json!(SD)));
    assert!(calls[0]["error"].as_str().is_some_and(|e| e.contains("size")), "sd-server's refusal, named: {trace}");
    assert_eq!((calls[1]["name"].clone(), calls[1]["error"].clone()), (json!("text_to_speech"), Value::Null));

    // Streamed: the medium as a delta the moment its tool finished, then the text, then the
    // finish with the trace, then [DONE].
    let r = l.http.post(l.url("/api/v1/chat/completions")).json(&ask("user.Lemon", true)).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"));
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(&e[6..]).unwrap()).collect();
    let deltas: Vec<String> =
        chunks.iter().map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap_or("").to_string()).collect();
    let audio = deltas.iter().position(|d| d.contains("<audio>")).expect("a medium delta");
    let done = deltas.iter().position(|d| d.starts_with("Done.")).expect("the text delta");
    assert!(audio < done, "the medium came first: {deltas:?}");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["x_lemonade_omni"]["tool_calls"].as_array().unwrap().len(), 2);

    // The loop runs what the planner chose and nothing else: a planner that only speaks for
    // "Say hello" draws nothing (sd-server is a component, and is never called), and the
    // streamed medium precedes the text.
    let hi = json!({"model": "user.Hello", "stream": true, "messages": [{"role": "user", "content": "Say hello"}]});
    let text = l.http.post(l.url("/api/v1/chat/completions")).json(&hi).send().await.unwrap().text().await.unwrap();
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: ").filter(|d| *d != "[DONE]"))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let deltas: Vec<&str> = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    let audio = deltas.iter().position(|d| d.contains("<audio>data:audio/wav;base64,")).expect("a WAV delta");
    let said = deltas.iter().position(|d| d.contains("I said hello.")).expect("the text delta");
    assert!(audio < said, "the medium came first: {deltas:?}");
    assert!(!text.contains("data:image/png"), "no image was drawn for a prompt that asks none");
    let trace = &chunks.last().unwrap()["x_lemonade_omni"];
    let names: Vec<&str> = trace["tool_calls"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["text_to_speech"], "{trace}");

    // The client's own tool goes back to it, with the planner's text.
    let mut body = ask("user.Weather", false);
    body["tools"] =
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let (s, v) = l.post("/api/v1/chat/completions", &body).await;
    let m = &v["choices"][0];
    assert_eq!((s, m["finish_reason"].clone()), (200, json!("tool_calls")), "{v}");
    assert_eq!(
        (m["message"]["content"].clone(), m["message"]["tool_calls"][0]["function"]["name"].clone()),
        (json!("Let me look."), json!("get_weather"))
    );
    assert_eq!(m["message"]["tool_calls"][0]["id"], "w");

    // MCP's lemonade_omni: the text and the medium, inline or as a file in the image folder.
    let rpc = |args: Value| json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "lemonade_omni", "arguments": args}});
    let msgs = json!([{"role": "user", "content": "Draw a lemon"}]);
    let (_, v) = l.post("/mcp", &rpc(json!({"model": "user.Lemon", "messages": msgs}))).await;
    let blocks = v["result"]["content"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert!(blocks[0]["text"].as_str().unwrap().starts_with("Done."), "{v}");
    assert_eq!((blocks[1]["type"].clone(), blocks[1]["mimeType"].clone()), (json!("audio"), json!("audio/wav")));
    let (_, v) = l.post("/mcp", &rpc(json!({"model": "user.Lemon", "messages": msgs, "output_dir": "omni"}))).await;
    let path = v["result"]["content"][1]["text"].as_str().unwrap_or_else(|| panic!("{v}")).to_string();
    assert!(path.starts_with(images.path().join("omni").to_str().unwrap()) && path.ends_with(".wav"), "{path}");
    assert!(std::fs::read(&path).unwrap().starts_with(b"RIFF"));
    let (_, v) = l.post("/mcp", &rpc(json!({"model": planner, "messages": msgs}))).await;
    assert_eq!(v["result"]["isError"], true, "a plain LLM is refused with a hint: {v}");
    assert!(v["result"]["content"][0]["text"].as_str().unwrap().contains("lemonade_chat"));

    // Loading an omni model loads every component (v11); other endpoints are refused by name.
    let (s, _) = l.post("/api/v1/load", &json!({"model_name": "user.Lemon"})).await;
    assert_eq!(s, 200);
    let mut names = loaded_names(&l.get("/api/v1/health").await.1);
    names.sort();
    assert!([planner, SD, KOKORO].iter().all(|m| names.contains(&m.to_string())), "{names:?}");
    let (s, v) = l.post("/api/v1/completions", &json!({"model": "user.Lemon", "prompt": "hi"})).await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("omni collection: it answers /v1/chat/completions only"),
        "{v}"
    );
    let (s, _) =
        l.post("/api/chat", &json!({"model": "user.Lemon", "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(s, 400);
}

/// A bad omni definition is a 400 naming the field; nothing is registered.
#[tokio::test]
async fn omni_definitions_are_checked_field_by_field() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_sd().with_kokoro(), &[], &[]).await;
    let cases = [
        (omni("user.O", &[SD, KOKORO], json!({})), "components", "needs a chat model"),
        (omni("user.O", &[SMOL, "user.Nope"], json!({})), "components[1]", "is not registered"),
        (omni("user.O", &[SMOL], json!({"system_prompt": "no placeholders"})), "system_prompt", "{tool_list}"),
        (omni("user.O", &[SMOL], json!({"tool_format": "xml"})), "tool_format", "\"native\" or \"json\""),
        (omni("user.O", &[SMOL], json!({"routing": {}})), "routing", "Only a collection.router"),
        (omni("user.O", &[], json!({})), "components", "must not be empty"),
        (omni("O", &[SMOL], json!({})), "model", "user."),
    ];
    for (body, param, words) in cases {
        let (s, v) = l.post("/api/v1/pull", &body).await;
        assert_eq!((s, v["param"].clone()), (400, json!(param)), "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(words), "{body}: {v}");
    }
    let (s, _) = l.get("/api/v1/models/user.O").await;
    assert_eq!(s, 404);
    let (s, v) = l.post("/api/v1/pull", &omni("user.O", &[SMOL, SD], json!({"tool_format": "json"}))).await;
    assert_eq!(s, 200, "{v}");
    // Export and import round-trip it (its settings included).
    let file = l.sandbox.dir.path().join("O.json");
    let (code, _, err) = l.cli(&["export", "user.O", "-o", file.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{err}");
    let exported: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(
        (exported["recipe"].clone(), exported["tool_format"].clone()),
        (json!("collection.omni"), json!("json")),
        "{exported}"
    );
    assert_eq!(l.post("/api/v1/delete", &json!({"model_name": "user.O"})).await.0, 200);
    let (code, _, err) = l.cli(&["import", file.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{err}");
    let (_, m) = l.get("/api/v1/models/user.O").await;
    assert_eq!(
        (m["tool_format"].clone(), m["components"].clone()),
        (json!("json"), json!([shown(SMOL), shown(SD)])),
        "{m}"
    );
    // v11's CLI form.
    let (code, out, err) =
        l.cli(&["pull", "user.Kit", "--recipe", "collection.omni", "--components", SMOL, KOKORO]).await;
    assert_eq!((code, out.trim()), (0, "Collection registered: user.Kit"), "{err}");
    let (_, m) = l.get("/api/v1/models/user.Kit").await;
    assert_eq!(
        (m["components"].clone(), m["omni_tools"][0]["name"].clone()),
        (json!([shown(SMOL), shown(KOKORO)]), json!("text_to_speech")),
        "{m}"
    );
    let (code, _, err) = l.cli(&["pull", "user.Bad", "--recipe", "collection.omni", "--components", SD]).await;
    assert!(code == 1 && err.contains("needs a chat model"), "{err}");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("user_models.json")).unwrap()).unwrap();
    assert_eq!(
        saved["O"],
        json!({"recipe": "collection.omni", "components": [SMOL, SD], "tool_format": "json", "labels": ["collection"]})
    );
}

/// Server-side `transcribe_audio` (v11 leaves it to the client): the audio the user sent (an
/// `input_audio` part) goes to real whisper-server, the planner (scripted) gets the words back
/// and answers with them; a request with no audio gets a tool error, not a failed request.
#[tokio::test]
async fn scripted_planner_omni_transcribes_the_audio_the_user_sent_on_real_whisper() {
    let ears = json!({"replies": [
        {"content": "", "tool_calls": [call("t", "transcribe_audio", json!({"language": "en"}))]},
        {"content": "Heard: {last}"}
    ]});
    let fake = fake_llama_server();
    let sandbox = fake_sandbox(&[("ears", None, ears)]).with_whisper();
    let l = Lemonade::start_in(bin(), sandbox, &[], &[("LEMONADE_LLAMACPP_CPU_BIN", fake.to_str().unwrap())]).await;
    let (s, v) = l.post("/api/v1/pull", &omni("user.Ears", &["extra.ears", WHISPER], json!({}))).await;
    assert_eq!(s, 200, "{v}");
    let (_, m) = l.get("/api/v1/models/user.Ears").await;
    assert_eq!(m["omni_tools"][0]["name"], "transcribe_audio", "{m}");
    let wav = l.sandbox.dir.path().join("s.wav");
    let out =
        std::process::Command::new("espeak-ng").args(["-s", "140", "-w"]).arg(&wav).arg(SENTENCE).output().unwrap();
    assert!(out.status.success(), "espeak-ng: {}", String::from_utf8_lossy(&out.stderr));
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&wav).unwrap());
    let body = json!({"model": "user.Ears", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What does this say?"},
        {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}]});
    let (s, v) = l.post("/api/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{v}");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap().to_lowercase();
    assert!(content.starts_with("heard: {\"status\":\"ok\",\"text\":"), "{content}");
    assert!(
        content.contains("lemonade") && content.contains("one port"),
        "whisper's words reached the planner: {content}"
    );
    assert_eq!(v["x_lemonade_omni"]["tool_calls"][0]["component"], WHISPER);
    let no_audio = json!({"model": "user.Ears", "messages": [{"role": "user", "content": "What does this say?"}]});
    let (s, v) = l.post("/api/v1/chat/completions", &no_audio).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["x_lemonade_omni"]["tool_calls"][0]["error"].as_str().unwrap().contains("no audio"), "{v}");
}

/// Lemonade v11's registry-backed collection: a pull that points at a repository (no
/// components) fetches its manifest from the Hub (a double on 127.0.0.1) into the Hugging Face
/// cache, registers the definitions it carries and saves only the pointer; a pull by name alone
/// refreshes it from the repository, and with the Hub out of reach (offline) the cached copy
/// is used. A built-in collection (v11's LMX-Omni-5.5B-Lite) is never a component.
#[tokio::test]
async fn a_registry_backed_collection_is_a_pointer_to_a_manifest_fetched_refreshed_and_cached() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("org/Kit");
    std::fs::create_dir_all(&repo).unwrap();
    let def = |name: &str| json!({"model_name": name, "recipe": "llamacpp", "checkpoint": "org/none:Q4_0"});
    let manifest = |components: &[&str]| {
        json!({"model_name": "Kit", "recipe": "collection.omni", "checkpoints": {"main": ""},
               "components": components, "models": components.iter().map(|c| def(c)).collect::<Vec<_>>()})
    };
    std::fs::write(repo.join("Kit.json"), manifest(&[SMOL]).to_string()).unwrap();
    let double = test_support::hub::HubDouble::start(tmp.path(), test_support::hub::Knobs::default()).await;
    let l = Lemonade::start_in(bin(), Sandbox::new().with_kokoro(), &[], &[("HF_ENDPOINT", &double.url)]).await;
    let pull = json!({"model_name": "user.Kit", "recipe": "collection.omni", "checkpoints": {"main": "org/Kit"}, "stream": false});
    let (s, v) = l.post("/api/v1/pull", &pull).await;
    assert_eq!(s, 200, "{v}");
    let components = |m: &Value| m["components"].clone();
    assert_eq!(components(&l.get("/api/v1/models/user.Kit").await.1), json!([shown(SMOL)]));
    let saved: Value =
        serde_json::from_slice(&std::fs::read(l.sandbox.cache().join("user_models.json")).unwrap()).unwrap();
    assert_eq!(
        saved["Kit"],
        json!({"checkpoint": "org/Kit", "recipe": "collection.omni", "labels": ["collection"]}),
        "only the pointer is saved"
    );
    // The repository changes (a new commit); a pull by name alone follows it.
    std::fs::remove_file(repo.join("Kit.json")).unwrap();
    std::fs::write(repo.join("Kit-2.json"), manifest(&[SMOL, KOKORO]).to_string()).unwrap();
    let commit = Some("c0ffee0000000000000000000000000000000002".to_string());
    double.set_knobs(test_support::hub::Knobs { commit, ..Default::default() });
    assert_eq!(l.post("/api/v1/pull", &json!({"model_name": "user.Kit", "stream": false})).await.0, 200);
    assert_eq!(components(&l.get("/api/v1/models/user.Kit").await.1), json!([shown(SMOL), shown(KOKORO)]));
    // Offline: no Hub call; the cached manifest still defines it.
    let asked = double.log().len();
    assert_eq!(l.post("/internal/set", &json!({"offline": true})).await.0, 200);
    assert_eq!(l.post("/api/v1/pull", &json!({"model_name": "user.Kit", "stream": false})).await.0, 200);
    assert_eq!(double.log().len(), asked, "offline: nothing asked of the Hub");
    assert_eq!(components(&l.get("/api/v1/models/user.Kit").await.1), json!([shown(SMOL), shown(KOKORO)]));
    // A repository that is not there and not cached: the Hub's answer, nothing saved.
    assert_eq!(l.post("/internal/set", &json!({"offline": false})).await.0, 200);
    let gone =
        json!({"model_name": "user.Gone", "recipe": "collection.omni", "checkpoint": "org/Gone", "stream": false});
    let (s, e) = l.post("/api/v1/pull", &gone).await;
    assert!(s >= 400, "{e}");
    assert_eq!(l.get("/api/v1/models/user.Gone").await.0, 404);
    // A built-in collection is a collection: never a component.
    let (s, e) = l.post("/api/v1/pull", &omni("user.Nest", &[SMOL, "LMX-Omni-5.5B-Lite"], json!({}))).await;
    assert_eq!(s, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("not collections"), "{e}");
}
