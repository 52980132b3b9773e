//! Lemonade v11's MCP gateway (`POST /mcp`) through `lemonade serve`: the official `mcp` Python
//! client against real llama-server and whisper-server, then the JSON-RPC edges by hand.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

async fn rpc(l: &Lemonade, body: &str) -> (u16, String) {
    let r = l.http.post(l.url("/mcp")).header("content-type", "application/json").body(body.to_string());
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn real_backends_the_mcp_client_lists_tools_chats_and_transcribes() {
    let l = Lemonade::start_in(bin(), Sandbox::new().with_whisper(), &[], &[]).await;
    let wav = l.sandbox.dir.path().join("s.wav");
    let out = Command::new("espeak-ng").args(["-s", "140", "-w"]).arg(&wav).arg(SENTENCE).output().unwrap();
    assert!(out.status.success(), "espeak-ng: {}", String::from_utf8_lossy(&out.stderr));
    py_checks("mcp_client.py", &[&l.url(""), shown(SMOL), shown(WHISPER), wav.to_str().unwrap(), SENTENCE]).await;
    let mut loaded = loaded_names(&l.get("/api/v1/health").await.1);
    loaded.sort();
    assert_eq!(loaded, [SMOL, WHISPER], "the tools loaded the models on demand");
}

#[tokio::test]
async fn mcp_json_rpc_edges_answer_as_the_spec_says() {
    let l = Lemonade::start(bin(), &[]).await;
    let (s, v) = rpc(
        &l,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{}}}"#,
    )
    .await;
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(
        (s, v["id"].clone(), v["result"]["protocolVersion"].clone()),
        (200, json!(1), json!("2025-06-18")),
        "{v}"
    );
    // A notification alone: 202, no body.
    assert_eq!(rpc(&l, r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).await, (202, String::new()));
    // A batch: answers for the requests only, in order.
    let (s, v) = rpc(&l, r#"[{"jsonrpc":"2.0","id":"a","method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"resources/list"}]"#).await;
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(s, 200);
    assert_eq!(
        v,
        json!([{"jsonrpc": "2.0", "id": "a", "result": {}}, {"jsonrpc": "2.0", "id": 2, "error": {"code": -32601, "message": "Method not found: resources/list"}}])
    );
    // Not JSON, not JSON-RPC, an empty batch: 400 with the JSON-RPC code.
    for (body, code, id) in [
        ("{nope", -32700, Value::Null),
        (r#"{"id":1,"method":"ping"}"#, -32600, json!(1)),
        ("[]", -32600, Value::Null),
        ("7", -32600, Value::Null),
    ] {
        let (s, v) = rpc(&l, body).await;
        let v: Value = serde_json::from_str(&v).unwrap();
        assert_eq!((s, v["error"]["code"].clone(), v["id"].clone()), (400, json!(code), id), "{body}: {v}");
    }
    // Bad params of a known method, an unknown tool: JSON-RPC errors; a failing tool: isError.
    let (_, v) = rpc(&l, r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nope"}}"#).await;
    assert_eq!(serde_json::from_str::<Value>(&v).unwrap()["error"]["code"], -32602, "{v}");
    let (_, v) = rpc(
        &l,
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"lemonade_chat","arguments":{"model":"x"}}}"#,
    )
    .await;
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["result"], json!({"content": [{"type": "text", "text": "'messages' is required"}], "isError": true}));
    let (_, v) = rpc(&l, r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"lemonade_generate_image","arguments":{"model":"m","prompt":"p","output_path":"../../etc/x.png"}}}"#).await;
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["result"]["isError"], true, "{v}");
    // The path check refuses it, before any model is asked (there is no model "m"; the real
    // sd-server test below refuses it with a model that would draw).
    let told = v["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(told.contains("is outside the MCP image folder"), "{v}");
    let r = l.http.get(l.url("/mcp")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 405);
}

/// `lemonade_generate_image` on real sd-server: a PNG written under the MCP image folder
/// (`LEMONADE_MCP_IMAGE_DIR`) and its path answered, or the PNG inline as an image block.
#[tokio::test]
async fn real_sd_server_the_mcp_image_tool_writes_into_its_folder_or_answers_inline() {
    let images = tempfile::tempdir().unwrap();
    let dir = images.path().to_str().unwrap().to_string();
    let l = Lemonade::start_in(bin(), Sandbox::new().with_sd(), &[], &[("LEMONADE_MCP_IMAGE_DIR", &dir)]).await;
    let call = |args: Value| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "lemonade_generate_image", "arguments": args}})
            .to_string()
    };
    let args = json!({"model": SD, "prompt": "a lemon", "size": "256x256", "steps": 1, "output_path": "lemon.png"});
    let (s, v) = rpc(&l, &call(args)).await;
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!((s, v["result"]["isError"].clone()), (200, json!(false)), "{v}");
    let written = images.path().join("lemon.png");
    assert_eq!(v["result"]["content"][0]["text"], written.display().to_string(), "{v}");
    assert!(std::fs::read(&written).unwrap().starts_with(b"\x89PNG"), "a PNG in the folder");
    let (_, v) = rpc(&l, &call(json!({"model": SD, "prompt": "a lemon", "size": "256x256", "steps": 1}))).await;
    let v: Value = serde_json::from_str(&v).unwrap();
    let block = &v["result"]["content"][0];
    assert_eq!((block["type"].clone(), block["mimeType"].clone()), (json!("image"), json!("image/png")), "{v}");
    use base64::Engine as _;
    let png = base64::engine::general_purpose::STANDARD.decode(block["data"].as_str().unwrap()).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    // With a real model that would draw, the path check is what refuses a path outside the
    // folder (relative or absolute): nothing is written there.
    for out in [format!("{dir}/../escape.png"), "../../escape.png".to_string()] {
        let outside = json!({"model": SD, "prompt": "a lemon", "size": "256x256", "steps": 1, "output_path": out});
        let (_, v) = rpc(&l, &call(outside)).await;
        let v: Value = serde_json::from_str(&v).unwrap();
        assert_eq!(v["result"]["isError"], true, "{v}");
        let told = v["result"]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(told.contains("is outside the MCP image folder"), "{out}: {v}");
        assert!(!images.path().join("../escape.png").exists() && !images.path().join("../../escape.png").exists());
    }
}
