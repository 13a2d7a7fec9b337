//! What clients and tools pointed at a vLLM server rely on, at the HTTP level, over the real
//! SmolLM2: `null` for every optional field, vLLM's context-overflow words, `X-Request-Id`
//! honoured and echoed with ids unique across restarts, CORS only when asked for,
//! `Retry-After` on 429, unknown fields logged once and ignored while known but unimplemented
//! ones are refused, and tokenization kept off the async workers.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use engine::EngineConfig;
use serde_json::{Value, json};
use server::ServerConfig;
use tower::ServiceExt;

use crate::support::{TestServer, json_of, runtime, smollm2_config, smollm2_server, smollm2_server_with};

fn post(path: &str, body: &Value) -> Request<Body> {
    crate::support::post_request(path, body.to_string())
}

fn with_header(mut req: Request<Body>, name: &'static str, value: &str) -> Request<Body> {
    req.headers_mut().insert(name, value.parse().unwrap_or_else(|e| panic!("{e}")));
    req
}

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0})
}

/// The optional fields of a chat request (beside `max_completion_tokens`).
const CHAT_NULLS: &[&str] = &[
    "model",
    "max_tokens",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "n",
    "stop",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
    "json_schema",
    "logit_bias",
    "priority",
    "cache_salt",
    "request_id",
    "chat_template_kwargs",
    "documents",
    "use_beam_search",
    "chat_template",
];

/// The optional fields of a completions request (its `max_tokens` defaults to 16).
const COMPLETION_NULLS: &[&str] = &[
    "model",
    "max_tokens",
    "logprobs",
    "echo",
    "best_of",
    "suffix",
    "stream",
    "stream_options",
    "n",
    "stop",
    "temperature",
    "top_p",
    "seed",
    "logit_bias",
    "priority",
    "cache_salt",
    "user",
    "min_tokens",
    "ignore_eos",
];

#[test]
fn every_optional_field_takes_null() {
    let srv = smollm2_server();
    runtime().block_on(async {
        // Every optional field null; the one length limit set keeps the answer short.
        let mut body = json!({"messages": [{"role": "user", "content": "Hi", "name": null,
            "tool_calls": null, "tool_call_id": null}], "max_completion_tokens": 3});
        for field in CHAT_NULLS {
            body[*field] = Value::Null;
        }
        let v = srv.post_ok("/v1/chat/completions", &body).await;
        assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
        let streamed = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "stream": true, "stream_options": {"include_usage": null}});
        assert_eq!(srv.send(post("/v1/chat/completions", &streamed)).await.status(), StatusCode::OK);
        let mut completion = json!({"prompt": "Hi"});
        for field in COMPLETION_NULLS {
            completion[*field] = Value::Null;
        }
        srv.post_ok("/v1/completions", &completion).await;
        srv.wait_idle().await;
    });
}

#[test]
fn a_context_overflow_is_a_400_in_vllms_words() {
    let srv = smollm2_server();
    runtime().block_on(async {
        let (_, models) = srv.get("/v1/models").await;
        let models: Value = serde_json::from_str(&models).unwrap_or_else(|e| panic!("{e}"));
        let max_len = models["data"][0]["max_model_len"].as_u64().unwrap_or(0);
        let messages = json!([{"role": "user", "content": "How long can you go on?"}]);
        let (_, t) = srv.post_json("/tokenize", &json!({"messages": messages})).await;
        let prompt = t["count"].as_u64().unwrap_or(0);
        let asked = 100_000;
        let (status, v) =
            srv.post_json("/v1/chat/completions", &json!({"messages": messages, "max_tokens": asked})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        let want = format!(
            "This model's maximum context length is {max_len} tokens. However, you requested {} tokens \
             ({prompt} in the messages, {asked} in the completion). Please reduce the length of the \
             messages or completion.",
            prompt + asked
        );
        assert_eq!(v["error"]["message"], want.as_str(), "{v}");
    });
}

#[test]
fn x_request_id_is_echoed_and_ids_differ_across_restarts() {
    let srv = smollm2_server();
    let other = TestServer::default();
    runtime().block_on(async {
        let req = with_header(post("/v1/chat/completions", &chat("Hi", 2)), "x-request-id", "trace-42");
        let resp = srv.send(req).await;
        assert_eq!(resp.headers()["x-request-id"], "trace-42");
        assert_eq!(json_of(resp).await["id"], "chatcmpl-trace-42");
        // Two calls with the same id at once: both served.
        let same = || {
            with_header(
                post("/v1/completions", &json!({"prompt": "a", "max_tokens": 2})),
                "x-request-id",
                "dup",
            )
        };
        let (a, b) = tokio::join!(srv.send(same()), srv.send(same()));
        assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
        assert_eq!(json_of(a).await["id"], "cmpl-dup");
        // Without one: a random id, echoed too; a fresh server does not repeat it.
        let mut ids = Vec::new();
        for s in [&srv, &srv, &other] {
            let resp = s.send(post("/v1/completions", &json!({"prompt": "a", "max_tokens": 1}))).await;
            let header = resp.headers()["x-request-id"].to_str().map(str::to_owned).unwrap_or_default();
            let id = json_of(resp).await["id"].as_str().unwrap_or_default().to_owned();
            assert_eq!(id, format!("cmpl-{header}"));
            let hex = header.len() == 32 && header.bytes().all(|b| b.is_ascii_hexdigit());
            assert!(hex, "{header}");
            ids.push(id);
        }
        assert!(ids[0] != ids[1] && ids[0] != ids[2] && ids[1] != ids[2], "{ids:?}");
        let long =
            with_header(post("/v1/completions", &json!({"prompt": "a"})), "x-request-id", &"x".repeat(200));
        let resp = srv.send(long).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(json_of(resp).await["error"]["param"], "X-Request-Id");
    });
}

#[test]
fn cors_headers_only_for_the_allowed_origins() {
    let preflight = |origin: &str| {
        Request::options("/v1/chat/completions")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization,content-type")
            .body(Body::empty())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let get = |origin: &str| {
        Request::get("/v1/models")
            .header("origin", origin)
            .body(Body::empty())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    const ALLOW: &str = "access-control-allow-origin";
    runtime().block_on(async {
        let plain = smollm2_server();
        assert!(plain.send(get("http://app.test")).await.headers().get(ALLOW).is_none());
        let config = ServerConfig {
            allowed_origins: Some(vec!["http://app.test".into()]),
            api_key: Some("k".into()),
            ..ServerConfig::default()
        };
        let listed = smollm2_server_with(smollm2_config(), &config);
        // The preflight carries no key and is answered anyway; the call itself still needs it.
        let resp = listed.send(preflight("http://app.test")).await;
        assert!(resp.status().is_success(), "{:?}", resp.status());
        assert_eq!(resp.headers()[ALLOW], "http://app.test");
        let resp = listed.send(get("http://app.test")).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(resp.headers()[ALLOW], "http://app.test");
        assert!(listed.send(get("http://evil.test")).await.headers().get(ALLOW).is_none());
        let any = ServerConfig { allowed_origins: Some(vec!["*".into()]), ..ServerConfig::default() };
        let any = smollm2_server_with(smollm2_config(), &any);
        assert_eq!(any.send(get("http://anywhere.test")).await.headers()[ALLOW], "*");
    });
}

#[test]
fn a_429_says_when_to_retry() {
    let engine = EngineConfig { max_num_seqs: 1, max_waiting: 1, ..smollm2_config() };
    let srv = smollm2_server_with(engine, &ServerConfig::default());
    runtime().block_on(async {
        let body = json!({"prompt": "Once", "max_tokens": 200, "ignore_eos": true, "stream": true});
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(srv.send(post("/v1/completions", &body)).await);
        }
        let refused: Vec<_> = held.iter().filter(|r| r.status() == StatusCode::TOO_MANY_REQUESTS).collect();
        assert!(!refused.is_empty(), "{:?}", held.iter().map(|r| r.status()).collect::<Vec<_>>());
        for r in refused {
            assert_eq!(r.headers()["retry-after"], "1");
        }
        assert!(
            held.iter()
                .filter(|r| r.status() == StatusCode::OK)
                .all(|r| r.headers().get("retry-after").is_none())
        );
        drop(held);
        srv.wait_idle().await;
    });
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn unknown_fields_are_logged_once_and_unimplemented_ones_refused() {
    let srv = smollm2_server();
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    // A runtime on this thread: the handler's checks log through this thread's subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        for _ in 0..2 {
            let mut body = chat("Hi", 1);
            body["x_conformance_field"] = json!({"any": "thing"});
            srv.post_ok("/v1/chat/completions", &body).await;
        }
        for (field, value) in [
            ("use_beam_search", json!(true)),
            ("bad_words", json!(["x"])),
            ("chat_template", json!("{{ messages }}")),
            ("add_generation_prompt", json!(false)),
        ] {
            let mut body = chat("Hi", 1);
            body[field] = value;
            let (status, v) = srv.post_json("/v1/chat/completions", &body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {v}");
            assert_eq!(v["error"]["param"], field, "{v}");
        }
        let mut noop = chat("Hi", 1);
        noop["use_beam_search"] = json!(false);
        noop["length_penalty"] = json!(1.0);
        assert_eq!(srv.post_json("/v1/chat/completions", &noop).await.0, StatusCode::OK);
    });
    let text = String::from_utf8_lossy(&log.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
        .into_owned();
    assert_eq!(text.matches("x_conformance_field").count(), 1, "{text}");
}

#[test]
fn tokenizing_a_large_request_leaves_the_async_worker_free() {
    let srv = smollm2_server();
    // One async worker: a handler that tokenized on it would hold `/health` until it finished.
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    let big = "The quick brown fox jumps over the lazy dog. ".repeat(30_000);
    let messages = json!([{"role": "user", "content": big}]);
    rt.block_on(async {
        for (path, body, want) in [
            ("/tokenize", json!({"messages": messages}), StatusCode::OK),
            ("/v1/chat/completions", json!({"messages": messages, "max_tokens": 1}), StatusCode::BAD_REQUEST),
        ] {
            let app = srv.app.clone();
            let task = tokio::spawn(app.oneshot(post(path, &body)));
            // Long enough for the body to be parsed and the work handed off.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let health = Request::get("/health").body(Body::empty()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(srv.send(health).await.status(), StatusCode::OK);
            assert!(!task.is_finished(), "{path}: /health waited for the tokenization");
            let resp = task.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| match e {});
            assert_eq!(resp.status(), want, "{path}");
        }
    });
}
