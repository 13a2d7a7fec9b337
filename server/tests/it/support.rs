//! The server over the tiny random model, driven in-process through the router (`tower`'s
//! `oneshot`): JSON and SSE helpers.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use engine::{Engine, EngineConfig, EngineHandle};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use server::{AppState, ServerConfig};
use tower::ServiceExt;

pub struct TestServer {
    pub app: axum::Router,
    /// Keeps the model folder alive.
    _dir: tempfile::TempDir,
}

/// A server over the real SmolLM2 (fetched by `cargo xtask fetch-model`), 256 KV blocks.
pub fn smollm2_server() -> TestServer {
    smollm2_server_with(smollm2_config(), &ServerConfig::default())
}

/// [`smollm2_server`]'s engine settings, for tests that change some.
pub fn smollm2_config() -> EngineConfig {
    EngineConfig {
        kv_cache: engine::KvCacheSize::Blocks(256),
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// The real SmolLM2 under other engine or server settings.
pub fn smollm2_server_with(engine_config: EngineConfig, config: &ServerConfig) -> TestServer {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    TestServer::over(engine::Engine::new(&gguf, engine_config).unwrap_or_else(|e| panic!("{e}")), config)
}

pub fn small_config() -> EngineConfig {
    EngineConfig {
        kv_cache: engine::KvCacheSize::Blocks(64),
        max_model_len: Some(512),
        max_num_batched_tokens: 512,
        log_interval: std::time::Duration::ZERO,
        served_model_name: Some("tiny".into()),
        ..EngineConfig::default()
    }
}

impl TestServer {
    pub fn new(engine_config: EngineConfig, config: &ServerConfig) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        model::testing::write_tiny_llama(dir.path(), 42);
        let engine = Engine::new(dir.path(), engine_config).unwrap_or_else(|e| panic!("{e}"));
        let handle = EngineHandle::spawn(engine).unwrap_or_else(|e| panic!("{e}"));
        let state = Arc::new(AppState::new(handle, config).unwrap_or_else(|e| panic!("{e}")));
        Self { app: server::router(state, config), _dir: dir }
    }

    /// The server over an engine built elsewhere (the real model, say).
    pub fn over(engine: Engine, config: &ServerConfig) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let handle = EngineHandle::spawn(engine).unwrap_or_else(|e| panic!("{e}"));
        let state = Arc::new(AppState::new(handle, config).unwrap_or_else(|e| panic!("{e}")));
        Self { app: server::router(state, config), _dir: dir }
    }

    pub fn default() -> Self {
        Self::new(small_config(), &ServerConfig::default())
    }

    /// A fresh engine over the same tiny model, for in-process comparisons.
    pub fn engine(&self, config: EngineConfig) -> Engine {
        Engine::new(self._dir.path(), config).unwrap_or_else(|e| panic!("{e}"))
    }

    pub async fn send(&self, req: Request<Body>) -> axum::response::Response {
        self.app.clone().oneshot(req).await.unwrap_or_else(|e| match e {})
    }

    /// POSTs a JSON body; returns the status and the parsed JSON answer.
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> (StatusCode, serde_json::Value) {
        self.post_raw(path, body.to_string()).await
    }

    /// POSTs a JSON body that must succeed; returns the parsed answer.
    pub async fn post_ok(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let (status, answer) = self.post_json(path, body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<Body>) -> (StatusCode, serde_json::Value) {
        let resp = self.send(post_request(path, body)).await;
        let status = resp.status();
        (status, json_of(resp).await)
    }

    /// POSTs a streaming JSON body; returns its SSE chunks before `[DONE]`, parsed.
    pub async fn stream_chunks(&self, path: &str, body: &serde_json::Value) -> Vec<serde_json::Value> {
        let events = sse_events(self.send(post_request(path, body.to_string())).await, usize::MAX).await;
        events
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
            .collect()
    }

    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        let resp = self.send(Request::get(path).body(Body::empty()).unwrap_or_else(|e| panic!("{e}"))).await;
        let status = resp.status();
        (status, text_of(resp).await)
    }

    /// Polls `/metrics` until nothing runs or waits and the KV cache is empty again. The
    /// deadline is generous because CI runs many engines at once on two cores.
    pub async fn wait_idle(&self) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            let (_, text) = self.get("/metrics").await;
            let zero = |name: &str| text.lines().any(|l| l.starts_with(name) && l.trim_end().ends_with(" 0"));
            if zero("vllm:num_requests_running")
                && zero("vllm:num_requests_waiting")
                && zero("vllm:kv_cache_usage_perc")
            {
                return text;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("the engine never became idle");
    }

    /// Runs `test` against this server on a fresh runtime, then [`wait_idle`](Self::wait_idle):
    /// every request the test made has released what it held.
    pub fn run_then_idle(&self, test: impl AsyncFnOnce(&Self)) {
        runtime().block_on(async {
            test(self).await;
            self.wait_idle().await;
        });
    }
}

/// A POST of `body` to `path` as `application/json`.
pub fn post_request(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap_or_else(|e| panic!("{e}"))
}

pub async fn text_of(resp: axum::response::Response) -> String {
    let bytes = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub async fn json_of(resp: axum::response::Response) -> serde_json::Value {
    let text = text_of(resp).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The `data:` payloads of an SSE body, in order, as they arrive; stops after `limit` events
/// (dropping the body there, as a client that goes away would).
pub async fn sse_events(resp: axum::response::Response, limit: usize) -> Vec<String> {
    let data = |event: &String| {
        event.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect::<Vec<_>>()
    };
    let mut events = Vec::new();
    for event in raw_sse_events(resp, |seen| seen.iter().map(|e| data(e).len()).sum::<usize>() >= limit).await
    {
        events.extend(data(&event));
    }
    events
}

/// Every event of an SSE body as sent (`:` keep-alive comments included), until `done` says
/// the events so far are enough or the body ends.
pub async fn raw_sse_events(resp: axum::response::Response, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let mut body = resp.into_body().into_data_stream();
    let (mut events, mut buf) = (Vec::new(), String::new());
    while let Some(chunk) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.unwrap_or_else(|e| panic!("{e}"))));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            events.push(event.trim_end().to_owned());
            if done(&events) {
                return events;
            }
        }
    }
    events
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}
