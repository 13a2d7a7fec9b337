//! What clients and tools pointed at a vLLM server rely on, in how requests are served, over
//! the real SmolLM2: a chat stream's role chunk comes with the first token (keep-alive comments
//! before it while the request waits), `prompt_tokens_details.cached_tokens` counts the prefix
//! cache's hits per `cache_salt`, `priority` orders waiting requests, `chat_template_kwargs`
//! and `--chat-template` reach the template, vLLM V1's metrics count what happened, and
//! `--tool-call-parser` picks the call format read.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use engine::{EngineConfig, Policy};
use futures_util::StreamExt;
use serde_json::{Value, json};
use server::{ServerConfig, ToolCallParser};

use crate::support::{TestServer, runtime, smollm2_config, smollm2_server, smollm2_server_with};

fn post(path: &str, body: &Value) -> Request<Body> {
    crate::support::post_request(path, body.to_string())
}

/// Every event of an SSE body as sent (`:` keep-alive comments included), until `[DONE]`.
async fn raw_events(resp: axum::response::Response) -> Vec<String> {
    crate::support::raw_sse_events(resp, |seen| seen.last().is_some_and(|e| e.contains("data: [DONE]"))).await
}

/// A chat stream queued behind a running request (one sequence at a time): its events.
async fn queued_chat_stream(srv: &TestServer) -> Vec<String> {
    let long = json!({"prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": true, "stream": true});
    let mut running = srv.send(post("/v1/completions", &long)).await.into_body().into_data_stream();
    // Its first chunk: it runs, so the next request waits.
    running.next().await;
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": true});
    let queued = tokio::spawn(raw_events(srv.send(post("/v1/chat/completions", &chat)).await));
    while running.next().await.is_some() {}
    queued.await.unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_queued_chat_stream_keeps_alive_and_sends_its_role_with_the_first_token() {
    let engine = EngineConfig { max_num_seqs: 1, ..smollm2_config() };
    let config = ServerConfig { sse_keep_alive: Some(Duration::from_millis(20)), ..ServerConfig::default() };
    let srv = smollm2_server_with(engine.clone(), &config);
    runtime().block_on(async {
        let events = queued_chat_stream(&srv).await;
        let first =
            events.iter().position(|e| e.starts_with("data:")).unwrap_or_else(|| panic!("{events:?}"));
        // Comments only while it waited: no chunk before its first token.
        assert!(first > 0 && events[..first].iter().all(|e| e.starts_with(':')), "{events:?}");
        let data: Vec<Value> = events[first..]
            .iter()
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap_or_else(|err| panic!("{err}: {d}")))
            .collect();
        assert_eq!(data[0]["choices"][0]["delta"]["role"], "assistant", "{data:?}");
        assert!(data[1]["choices"][0]["delta"]["content"].is_string(), "{data:?}");
        assert_eq!(data.iter().filter(|c| c["choices"][0]["delta"]["role"].is_string()).count(), 1);
    });
    let quiet = ServerConfig { sse_keep_alive: None, ..ServerConfig::default() };
    let srv = smollm2_server_with(engine, &quiet);
    runtime().block_on(async {
        let events = queued_chat_stream(&srv).await;
        assert!(events.iter().all(|e| e.starts_with("data:")), "{events:?}");
    });
}

#[test]
fn cached_tokens_count_prefix_hits_within_a_cache_salt() {
    let srv = smollm2_server();
    let system = "You are a careful assistant. ".repeat(12);
    let ask = |salt: Option<&str>, stream: bool| {
        let mut body = json!({"messages": [{"role": "system", "content": system},
            {"role": "user", "content": "Name a colour."}], "max_tokens": 2, "temperature": 0});
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        if stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    };
    runtime().block_on(async {
        let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
        let (_, first) = srv.post_json("/v1/chat/completions", &ask(None, false)).await;
        assert_eq!(cached(&first), Some(0), "{first}");
        let (_, again) = srv.post_json("/v1/chat/completions", &ask(None, false)).await;
        let prompt = again["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        let hit = cached(&again).unwrap_or(0);
        assert!(hit >= 64 && hit < prompt && hit % 16 == 0, "{hit} of {prompt}: {again}");
        // Another tenant's salt shares nothing, until it has asked once itself.
        let (_, salted) = srv.post_json("/v1/chat/completions", &ask(Some("tenant-b"), false)).await;
        assert_eq!(cached(&salted), Some(0), "{salted}");
        let resp = srv.send(post("/v1/chat/completions", &ask(Some("tenant-b"), true))).await;
        let events = crate::support::sse_events(resp, usize::MAX).await;
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cached(&usage), Some(hit), "{usage}");
        let (status, v) = srv.post_json("/v1/chat/completions", &ask(Some(""), false)).await;
        assert_eq!((status, v["error"]["param"].clone()), (StatusCode::BAD_REQUEST, json!("cache_salt")));
    });
}

#[test]
fn priority_orders_waiting_requests_and_needs_the_priority_policy() {
    let fcfs = smollm2_server();
    runtime().block_on(async {
        let body = json!({"prompt": "Hi", "max_tokens": 1, "priority": 3});
        let (status, v) = fcfs.post_json("/v1/completions", &body).await;
        assert_eq!(
            (status, v["error"]["param"].clone()),
            (StatusCode::BAD_REQUEST, json!("priority")),
            "{v}"
        );
        let (status, _) =
            fcfs.post_json("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1, "priority": 0})).await;
        assert_eq!(status, StatusCode::OK);
    });
    let engine = EngineConfig { max_num_seqs: 1, policy: Policy::Priority, ..smollm2_config() };
    let srv = std::sync::Arc::new(smollm2_server_with(engine, &ServerConfig::default()));
    runtime().block_on(async {
        let long =
            json!({"prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": true, "stream": true});
        let mut running = srv.send(post("/v1/completions", &long)).await.into_body().into_data_stream();
        running.next().await;
        // Both wait behind it; the later one has the more urgent priority and runs first.
        let mut finished = Vec::new();
        for (name, priority) in [("late-urgent", 1), ("early-lax", 5)].into_iter().rev() {
            let srv = srv.clone();
            finished.push(tokio::spawn(async move {
                let body =
                    json!({"prompt": "Hello", "max_tokens": 4, "ignore_eos": true, "priority": priority});
                srv.post_ok("/v1/completions", &body).await;
                (Instant::now(), name)
            }));
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        while running.next().await.is_some() {}
        let mut order = Vec::new();
        for f in finished {
            order.push(f.await.unwrap_or_else(|e| panic!("{e}")));
        }
        order.sort();
        assert_eq!(order.iter().map(|(_, n)| *n).collect::<Vec<_>>(), ["late-urgent", "early-lax"]);
    });
}

#[test]
fn chat_template_kwargs_and_the_chat_template_file_reach_the_template() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("thinking.jinja");
    let template = "{% if enable_thinking %}<think>{% endif %}{% for m in messages %}{{ m.role }}: \
                    {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    std::fs::write(&file, template).unwrap_or_else(|e| panic!("{e}"));
    let engine = EngineConfig { chat_template: Some(file.clone()), ..smollm2_config() };
    let srv = smollm2_server_with(engine, &ServerConfig::default());
    runtime().block_on(async {
        let messages = json!([{"role": "user", "content": "Hi"}]);
        let mut texts = Vec::new();
        for kwargs in [json!({"enable_thinking": true}), json!({"enable_thinking": false})] {
            let (_, t) = srv
                .post_json("/tokenize", &json!({"messages": messages, "chat_template_kwargs": kwargs}))
                .await;
            let (_, d) = srv.post_json("/detokenize", &json!({"tokens": t["tokens"]})).await;
            texts.push(d["prompt"].as_str().unwrap_or_default().to_owned());
            let body = json!({"messages": messages, "chat_template_kwargs": kwargs, "max_tokens": 1});
            let v = srv.post_ok("/v1/chat/completions", &body).await;
            assert_eq!(v["usage"]["prompt_tokens"], t["count"], "{v}");
        }
        assert_eq!(texts, ["<think>user: Hi\nassistant:", "user: Hi\nassistant:"]);
    });
    // A file that is missing or does not compile stops the start, naming the file.
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for m in %}").unwrap_or_else(|e| panic!("{e}"));
    for path in [dir.path().join("missing.jinja"), broken] {
        let engine = EngineConfig { chat_template: Some(path.clone()), ..smollm2_config() };
        let err = engine::Engine::new(&model::testing::smollm2_gguf(), engine).err().map(|e| e.to_string());
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        assert!(err.as_ref().is_some_and(|e| e.contains(&name)), "{err:?}");
    }
}

#[test]
fn metrics_count_what_happened_under_vllms_names() {
    let srv = smollm2_server();
    runtime().block_on(async {
        let body = json!({"prompt": "Hi", "max_tokens": 3, "n": 2, "ignore_eos": true, "temperature": 1});
        assert_eq!(srv.post_json("/v1/completions", &body).await.0, StatusCode::OK);
        let metrics = srv.wait_idle().await;
        let value = |series: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
        };
        let model = "model_name=\"SmolLM2-135M-Instruct.Q4_1\"";
        let success = |api: &str, reason: &str| {
            format!("vllm:request_success_total{{endpoint=\"{api}\",finished_reason=\"{reason}\",{model}}}")
        };
        assert_eq!(value(&success("completions", "length")), 2.0);
        assert_eq!(value(&success("completions", "stop")), 0.0);
        for one in ["request_queue_time_seconds", "request_prompt_tokens", "request_generation_tokens"] {
            assert_eq!(value(&format!("vllm:{one}_count{{{model}}}")), 1.0, "{one}");
        }
        assert_eq!(value(&format!("vllm:request_generation_tokens_sum{{{model}}}")), 6.0);
        // Three steps with tokens: two gaps between them.
        assert_eq!(value(&format!("vllm:inter_token_latency_seconds_count{{{model}}}")), 2.0);
        assert!(value(&format!("vllm:iteration_tokens_total_count{{{model}}}")) >= 3.0);
        assert_eq!(
            value(&format!("vllm:iteration_tokens_total_sum{{{model}}}")),
            value(&format!("vllm:prompt_tokens_total{{{model}}}")) + 6.0
        );

        // Each endpoint's successes under its own label.
        let one = json!({"max_tokens": 2, "max_output_tokens": 2, "ignore_eos": true, "input": "Hi",
            "messages": [{"role": "user", "content": "Hi"}]});
        for (path, drop_field) in
            [("/v1/chat/completions", "input"), ("/v1/responses", "messages"), ("/v1/messages", "input")]
        {
            let mut body = one.clone();
            if let Some(o) = body.as_object_mut() {
                o.remove(drop_field);
                o.remove(if path == "/v1/responses" { "max_tokens" } else { "max_output_tokens" });
            }
            assert_eq!(srv.post_json(path, &body).await.0, StatusCode::OK, "{path}");
        }
        let metrics = srv.wait_idle().await;
        let value = |series: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        for api in ["chat_completions", "responses", "messages"] {
            assert_eq!(value(&success(api, "length")), 1.0, "{api}\n{metrics}");
        }
        assert_eq!(value(&success("completions", "length")), 2.0);
    });
}

#[test]
fn the_tool_call_parser_flag_picks_the_format_read() {
    // The output is forced to a Hermes call whatever the model would write.
    let hermes = r#"<tool_call>{"name": "now", "arguments": {}}</tool_call>"#;
    let body = json!({
        "messages": [{"role": "user", "content": "What time is it?"}],
        "tools": [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}],
        "guided_choice": [hermes], "max_tokens": 40
    });
    for (parser, calls) in [(ToolCallParser::Hermes, true), (ToolCallParser::Mistral, false)] {
        let config = ServerConfig { tool_call_parser: parser, ..ServerConfig::default() };
        let srv = smollm2_server_with(smollm2_config(), &config);
        runtime().block_on(async {
            let v = srv.post_ok("/v1/chat/completions", &body).await;
            let choice = &v["choices"][0];
            if calls {
                assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "now", "{parser:?}: {v}");
                assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
            } else {
                assert!(choice["message"]["tool_calls"].is_null(), "{parser:?}: {v}");
                assert_eq!(choice["message"]["content"], hermes, "{v}");
            }
        });
    }
}
