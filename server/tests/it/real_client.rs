//! The server on the real SmolLM2 model over a real socket (127.0.0.1), driven by the official
//! `openai` Python package (`tests/openai_client.py`: chat and completions, streaming and
//! not, `n=2`, logprobs, stop, seeds, greedy text equal to the in-process engine's, errors,
//! a 64-stream load test with disconnects, a burst past `max_waiting`; `tests/openai_structured.py`:
//! `parse` with a pydantic model, 80 concurrent `json_schema` requests validated with
//! `jsonschema`, a tool round trip whole and through the client's stream helper) and by `curl
//! --no-buffer`, which must see SSE chunks before the request ends.
//!
//! Needs the model (`cargo xtask fetch-model`) and the `openai` and `jsonschema` packages in
//! `target/venv-openai` (`cargo xtask test` installs them).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use engine::{ChatMessage, Engine, EngineConfig, EngineHandle, Prompt, SamplingParams};
use server::{AppState, ServerConfig};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> PathBuf {
    let py = workspace_root().join("target/venv-openai/bin/python");
    assert!(
        py.exists(),
        "{} not found: `cargo xtask test` creates it (python3 -m venv target/venv-openai && \
         target/venv-openai/bin/pip install openai jsonschema)",
        py.display()
    );
    py
}

fn config() -> EngineConfig {
    EngineConfig {
        kv_cache: engine::KvCacheSize::Blocks(1024),
        max_model_len: Some(2048),
        max_waiting: 32,
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// Greedy outputs of the in-process engine the client's answers must equal.
fn expected(dir: &std::path::Path) -> serde_json::Value {
    let mut engine = Engine::new(dir, config()).unwrap_or_else(|e| panic!("{e}"));
    let chat_prompt = "What is the capital of France?";
    // What the server gives a request that sets only `temperature` and `max_tokens`.
    let defaults = engine.default_sampling_params().clone();
    let mut greedy = |prompt: Prompt, max_tokens| {
        let params = SamplingParams { temperature: 0.0, max_tokens: Some(max_tokens), ..defaults.clone() };
        let mut out = engine.generate(vec![prompt], &params).unwrap_or_else(|e| panic!("{e}"));
        out.remove(0).unwrap_or_else(|e| panic!("{e}")).completions.remove(0).text
    };
    let chat = greedy(Prompt::Chat(vec![ChatMessage::new("user", chat_prompt)]), 24);
    let completion = greedy(Prompt::Text("The capital of France is".into()), 12);
    serde_json::json!({
        "chat_prompt": chat_prompt,
        "chat_greedy": chat,
        "completion_greedy": completion,
        "burst": 400,
    })
}

/// A server on 127.0.0.1 (an ephemeral port) over `engine`, running on `runtime` until dropped.
struct Loopback {
    base: String,
    handle: EngineHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    runtime: tokio::runtime::Runtime,
}

impl Loopback {
    fn serve(engine: Engine) -> Self {
        Self::serve_with(engine, ServerConfig::default())
    }

    fn serve_with(engine: Engine, server_config: ServerConfig) -> Self {
        let handle = EngineHandle::spawn(engine).unwrap_or_else(|e| panic!("{e}"));
        let state = Arc::new(AppState::new(handle.clone(), &server_config).unwrap_or_else(|e| panic!("{e}")));
        let runtime = crate::support::runtime();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let base = format!("http://{}", listener.local_addr().unwrap_or_else(|e| panic!("{e}")));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let served = runtime.spawn(async move {
            let stop = async {
                let _ = stop_rx.await;
            };
            server::serve(listener, state, &server_config, stop).await
        });
        Self { base, handle, stop: Some(stop_tx), served: Some(served), runtime }
    }

    /// Runs `script` (under `server/tests/`) with the venv's Python, the base URL and `args`;
    /// passes when it exits 0 having printed `all ok`.
    fn run_python(&self, script: &str, args: &[String]) {
        let python = python();
        let out = Command::new(&python)
            .arg(workspace_root().join("server/tests").join(script))
            .arg(&self.base)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        println!("{log}");
        assert!(out.status.success() && log.contains("all ok"), "{script} failed:\n{log}");
    }

    /// Stops the server and waits for it: a serving error fails the test.
    fn shut_down(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            self.runtime.block_on(served).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn the_openai_client_and_curl_against_the_real_model() {
    let dir = model::testing::smollm2_dir_for_tests();
    let want = expected(&dir);
    let server = Loopback::serve(Engine::new(&dir, config()).unwrap_or_else(|e| panic!("{e}")));
    curl_sees_chunks_before_the_end(&server.base);
    server.run_python("openai_client.py", &[want.to_string()]);
    server.shut_down();
}

/// Structured outputs and tools through the `openai` package, on the default model as users run
/// it (the Q4_1 GGUF), with room for the 80 requests it sends at once.
#[test]
fn structured_outputs_and_tools_through_the_openai_client() {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let config = EngineConfig { max_waiting: 256, ..config() };
    let server = Loopback::serve(Engine::new(&gguf, config).unwrap_or_else(|e| panic!("{e}")));
    let started = Instant::now();
    server.run_python("openai_structured.py", &[]);
    let m = server.handle.metrics().unwrap_or_else(|e| panic!("{e}"));
    let masks = m.guided_masks;
    println!(
        "openai_structured.py took {:?}: {} engine steps, {} prompt and {} generated tokens; {} masks in \
         {:.2} s ahead of sampling, {:.3} s outside the forward passes",
        started.elapsed(),
        m.steps,
        m.prompt_tokens,
        m.generation_tokens,
        masks.masks,
        masks.compute_s,
        masks.wait_s
    );
    assert!(
        masks.masks >= m.generation_tokens / 2,
        "the masks were not computed ahead of sampling: {masks:?}"
    );
    server.shut_down();
}

/// `/v1/embeddings` through the `openai` package (`tests/openai_embeddings.py`) on the default
/// model behind an API key: every input shape and encoding equal to the in-process engine's
/// vectors, `dimensions`, usage, and the errors.
#[test]
fn embeddings_through_the_openai_client() {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let texts = ["The capital of France is Paris.", "Paged attention keeps the KV cache in blocks.", "hi"];
    // Each call computes every prompt whole (no prefix-cache hit recomputing a last token over
    // bf16 cache entries), with f32 activations: the server's vectors, batched its own way, equal
    // these up to the kernels' batch variance (`close` in the script).
    let config = EngineConfig {
        decode_activations: engine::ActivationPrecision::F32,
        enable_prefix_caching: false,
        ..config()
    };
    let mut engine = Engine::new(&gguf, config).unwrap_or_else(|e| panic!("{e}"));
    let prompts: Vec<Prompt> = texts.iter().map(|&t| Prompt::from(t)).collect();
    let token_ids: Vec<Vec<u32>> =
        prompts.iter().map(|p| engine.tokenize("t", p.clone()).unwrap_or_else(|e| panic!("{e}"))).collect();
    let mut embed = |dimensions| {
        let params = engine::PoolingParams { dimensions, ..engine::PoolingParams::default() };
        let out = engine.embed(prompts.clone(), params).unwrap_or_else(|e| panic!("{e}"));
        out.into_iter().map(|v| v.unwrap_or_else(|e| panic!("{e}"))).collect::<Vec<Vec<f32>>>()
    };
    let (last, dim8) = (embed(None), embed(Some(8)));
    let want = serde_json::json!({
        "model": engine.model_name(),
        "texts": texts,
        "token_ids": token_ids,
        "token_counts": token_ids.iter().map(Vec::len).collect::<Vec<_>>(),
        "last_normalized": last,
        "dim8": dim8,
    });
    let key = "sk-embeddings-test";
    let config = ServerConfig { api_key: Some(key.into()), ..ServerConfig::default() };
    let server = Loopback::serve_with(engine, config);
    server.run_python("openai_embeddings.py", &[key.to_owned(), want.to_string()]);
    assert!(server.handle.kv_is_idle().unwrap_or_else(|e| panic!("{e}")), "blocks held after the calls");
    server.shut_down();
}

/// `curl --no-buffer` on a 96-token chat stream: its first chunk arrives well before its last.
fn curl_sees_chunks_before_the_end(base: &str) {
    let body = r#"{"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 96, "temperature": 0, "ignore_eos": true, "stream": true}"#;
    let start = Instant::now();
    let mut child = Command::new("curl")
        .args(["--no-buffer", "-sS", "-H", "Content-Type: application/json", "-d", body])
        .arg(format!("{base}/v1/chat/completions"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("curl: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("curl stdout"));
    let mut first = None;
    let mut events = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap_or_default();
        if line.starts_with("data: ") {
            first.get_or_insert_with(|| start.elapsed());
            events += 1;
        }
    }
    let total = start.elapsed();
    assert!(child.wait().is_ok_and(|s| s.success()), "curl failed");
    let first = first.unwrap_or_else(|| panic!("curl saw no SSE event"));
    assert!(events > 90, "{events} events");
    assert!(first * 4 < total, "first chunk after {first:?} of {total:?}: the stream was buffered");
}

/// `/v1/responses` through the `openai` package (`tests/openai_responses.py`) on the default
/// model as users run it: create, the stream helper, a tool round trip, a text format,
/// retrieve, and the refusals.
#[test]
fn responses_through_the_openai_client() {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let server = Loopback::serve(Engine::new(&gguf, config()).unwrap_or_else(|e| panic!("{e}")));
    server.run_python("openai_responses.py", &[]);
    assert!(server.handle.kv_is_idle().unwrap_or_else(|e| panic!("{e}")), "blocks held after the calls");
    server.shut_down();
}

/// `/v1/messages` through the `anthropic` package (`tests/anthropic_messages.py`) on the default
/// model behind an API key: create, the stream helper, a tool round trip, the error classes.
#[test]
fn messages_through_the_anthropic_client() {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let key = "sk-anthropic-test";
    let server_config = ServerConfig { api_key: Some(key.into()), ..ServerConfig::default() };
    let engine = Engine::new(&gguf, config()).unwrap_or_else(|e| panic!("{e}"));
    let server = Loopback::serve_with(engine, server_config);
    server.run_python("anthropic_messages.py", &[key.to_owned()]);
    assert!(server.handle.kv_is_idle().unwrap_or_else(|e| panic!("{e}")), "blocks held after the calls");
    server.shut_down();
}
