//! LoRA adapters through the API, over the tiny Llama and its PEFT adapters
//! (`model/tests/data/lora/llama/`): `model` names an adapter on every endpoint and its answer is
//! the in-process engine's under that adapter; `/v1/models` lists the adapters with their
//! `parent`; the runtime load and unload endpoints answer as vLLM's, only when allowed and behind
//! the API key; unknown names are 404s.

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use engine::{
    Engine, EngineConfig, KvCacheSize, LoraConfig, LoraRequest, Prompt, RequestOptions, SamplingParams,
};
use serde_json::{Value, json};
use server::ServerConfig;

use crate::support::{TestServer, post_request, text_of};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/data")
}

fn adapter(name: &str) -> PathBuf {
    data().join("lora/llama").join(name)
}

fn config(chat_template: PathBuf) -> EngineConfig {
    EngineConfig {
        chat_template: Some(chat_template),
        kv_cache: KvCacheSize::Blocks(64),
        log_interval: std::time::Duration::ZERO,
        served_model_name: Some("base".into()),
        lora: Some(LoraConfig { max_loras: 2, max_lora_rank: 16, max_cpu_loras: Some(4) }),
        ..EngineConfig::default()
    }
}

fn engine_with(adapters: &[&str]) -> Engine {
    // The tiny Llama has no chat template; chat, Responses and Messages need one (read at start).
    let dir = tempfile::tempdir().expect("tempdir");
    let template = dir.path().join("chat.jinja");
    std::fs::write(&template, "{% for m in messages %}{{ m['content'] }}\n{% endfor %}").expect("template");
    let engine =
        Engine::new(&data().join("families/llama"), config(template)).unwrap_or_else(|e| panic!("{e}"));
    for name in adapters {
        engine.loras().load(name, &adapter(name)).unwrap_or_else(|e| panic!("{e}"));
    }
    engine
}

const PROMPT: [u32; 5] = [1, 300, 17, 42, 99];

/// The in-process engine's greedy text for [`PROMPT`] under `adapter`.
fn in_process(adapter: Option<&str>) -> String {
    let mut engine = engine_with(&[]);
    let mut options = RequestOptions::default();
    if let Some(name) = adapter {
        options = options.with_lora(LoraRequest::at(name, self::adapter(name)));
    }
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    engine.add_request_with_options("x", Prompt::Tokens(PROMPT.to_vec()), params, options).expect("add");
    let mut text = String::new();
    while engine.has_unfinished() {
        for out in engine.step().expect("step") {
            text.push_str(out.text_of(0));
        }
    }
    text
}

fn completion(model: &str) -> Value {
    json!({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": true})
}

#[test]
fn model_names_an_adapter_on_every_endpoint() {
    let want: Vec<String> = [None, Some("sql"), Some("chat")].map(in_process).to_vec();
    assert_ne!(want[0], want[1], "the adapter changes the answer");
    let srv = TestServer::over(engine_with(&["sql", "chat"]), &ServerConfig::default());
    srv.run_then_idle(async |srv| {
        for (model, want) in ["base", "sql", "chat"].iter().zip(&want) {
            let v = srv.post_ok("/v1/completions", &completion(model)).await;
            assert_eq!(v["model"], *model, "{v}");
            assert_eq!(v["choices"][0]["text"], *want, "{model}");
            // Streamed, the same text.
            let mut body = completion(model);
            body["stream"] = true.into();
            let chunks = srv.stream_chunks("/v1/completions", &body).await;
            let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
            assert_eq!(text, *want, "{model} streamed");
        }
        // Chat, Responses, Messages and embeddings take the adapter's name too.
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let chat = srv
            .post_ok("/v1/chat/completions", &json!({"model": "sql", "messages": msgs, "max_tokens": 2}))
            .await;
        assert_eq!(chat["model"], "sql");
        let resp = srv
            .post_ok("/v1/responses", &json!({"model": "chat", "input": "hi", "max_output_tokens": 2}))
            .await;
        assert_eq!(resp["model"], "chat");
        let msg =
            srv.post_ok("/v1/messages", &json!({"model": "sql", "messages": msgs, "max_tokens": 2})).await;
        assert_eq!(msg["model"], "sql");
        let emb = srv.post_ok("/v1/embeddings", &json!({"model": "sql", "input": "hi"})).await;
        assert_eq!(emb["model"], "sql");
        let base = srv.post_ok("/v1/embeddings", &json!({"model": "base", "input": "hi"})).await;
        assert_ne!(emb["data"][0]["embedding"], base["data"][0]["embedding"], "the adapter's hidden states");
        // Any other name is a 404 naming `model`.
        let (status, err) = srv.post_json("/v1/completions", &completion("nope")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
        assert_eq!(err["error"]["param"], "model");
        let (_, metrics) = srv.get("/metrics").await;
        let info = r#"vllm:lora_requests_info{max_lora="2",model_name="base",running_lora_adapters="",waiting_lora_adapters=""}"#;
        assert!(metrics.contains(info), "{metrics}");
    });
}

#[test]
fn models_lists_the_adapters_under_their_parent() {
    let srv = TestServer::over(engine_with(&["sql", "chat"]), &ServerConfig::default());
    crate::support::runtime().block_on(async {
        let (status, text) = srv.get("/v1/models").await;
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_str(&text).expect("json");
        let cards = v["data"].as_array().expect("data");
        let ids: Vec<&str> = cards.iter().filter_map(|c| c["id"].as_str()).collect();
        assert_eq!(ids, ["base", "chat", "sql"]);
        assert_eq!(cards[0]["parent"], Value::Null);
        for card in &cards[1..] {
            assert_eq!(card["parent"], "base");
            assert!(
                card["root"].as_str().is_some_and(|r| r.ends_with(card["id"].as_str().unwrap_or("?"))),
                "{card}"
            );
        }
    });
}

async fn post_text(srv: &TestServer, path: &str, body: &Value) -> (StatusCode, String) {
    let resp = srv.send(post_request(path, body.to_string())).await;
    (resp.status(), text_of(resp).await)
}

#[test]
fn adapters_load_and_unload_at_run_time_when_allowed() {
    let off = TestServer::over(engine_with(&[]), &ServerConfig::default());
    crate::support::runtime().block_on(async {
        let load = json!({"lora_name": "sql", "lora_path": adapter("sql")});
        let (status, text) = post_text(&off, "/v1/load_lora_adapter", &load).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(text.contains("--allow-runtime-lora-updating"), "{text}");
    });
    let config = ServerConfig {
        allow_runtime_lora_updating: true,
        api_key: Some("k".into()),
        ..ServerConfig::default()
    };
    let srv = TestServer::over(engine_with(&[]), &config);
    crate::support::runtime().block_on(async {
        let load = json!({"lora_name": "sql", "lora_path": adapter("sql")});
        let (status, _) = post_text(&srv, "/v1/load_lora_adapter", &load).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "behind the API key");
        let authed = |path: &str, body: &Value| {
            let mut req = post_request(path, body.to_string());
            req.headers_mut().insert("authorization", "Bearer k".parse().expect("header"));
            req
        };
        let send = async |path: &str, body: &Value| {
            let resp = srv.send(authed(path, body)).await;
            (resp.status(), text_of(resp).await)
        };
        let (status, text) = send("/v1/load_lora_adapter", &load).await;
        assert_eq!(
            (status, text.as_str()),
            (StatusCode::OK, "Success: LoRA adapter 'sql' added successfully.")
        );
        let (status, text) = send("/v1/load_lora_adapter", &load).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("already loaded"), "{text}");
        let (status, text) = send("/v1/completions", &completion("sql")).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let (status, text) = send("/v1/unload_lora_adapter", &json!({"lora_name": "sql"})).await;
        assert_eq!(
            (status, text.as_str()),
            (StatusCode::OK, "Success: LoRA adapter 'sql' removed successfully.")
        );
        let (status, _) = send("/v1/completions", &completion("sql")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "unloaded");
        let (status, _) = send("/v1/unload_lora_adapter", &json!({"lora_name": "sql"})).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        // A folder that holds no adapter, or one of another base model: 400 naming the file.
        for path in [data().join("families/llama"), data().join("lora/qwen2/sql")] {
            let (status, text) =
                send("/v1/load_lora_adapter", &json!({"lora_name": "x", "lora_path": path})).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
            assert!(text.contains("adapter_config.json") || text.contains("has shape"), "{text}");
        }
        let (status, _) = send("/v1/load_lora_adapter", &json!({"lora_name": "x"})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "lora_path missing");
    });
}
