//! Anthropic's `/v1/messages` on the real SmolLM2: a text answer equals the chat endpoint's
//! for the same turns (greedy), with `end_turn`, `stop_sequence` (and which) or `max_tokens`;
//! the stream's events in Anthropic's order whose deltas make the text; a forced tool call is a
//! `tool_use` block with an `input` object and `stop_reason: tool_use`, its `tool_result` gets
//! a text answer. With a reasoning parser and `thinking` enabled, the reasoning is a `thinking`
//! block ahead of the text, whole and streamed (left out when not asked for; without a parser
//! asking is a 400). On the tiny model: errors in Anthropic's shape, `x-api-key` and Bearer keys,
//! a full queue's 429 and a leaving client's abort.

use axum::http::StatusCode;
use engine::EngineConfig;
use serde_json::{Value, json};
use server::{ReasoningParser, ServerConfig, StructuredOutputsConfig};

use crate::support::{
    TestServer, post_request, runtime, small_config, smollm2_config, smollm2_server, smollm2_server_with,
    sse_events,
};

fn text(m: &Value) -> String {
    let blocks = m["content"].as_array().cloned().unwrap_or_default();
    blocks
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn text_answers_match_chat_with_their_stop_reasons() {
    smollm2_server().run_then_idle(async |server| {
        let body = json!({"system": "Answer briefly.", "max_tokens": 40, "temperature": 0, "stop_sequences": ["."],
            "messages": [{"role": "user", "content": "Name a river."}]});
        let m = server.post_ok("/v1/messages", &body).await;
        assert_eq!((m["type"].as_str(), m["role"].as_str()), (Some("message"), Some("assistant")), "{m}");
        assert!(m["id"].as_str().is_some_and(|id| id.starts_with("msg_")), "{m}");
        let chat = json!({"max_tokens": 40, "temperature": 0, "stop": ["."], "messages": [
            {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a river."}]});
        let c = server.post_ok("/v1/chat/completions", &chat).await;
        assert_eq!(text(&m), c["choices"][0]["message"]["content"].as_str().unwrap_or_default(), "{m}");
        assert_eq!(m["usage"]["input_tokens"], c["usage"]["prompt_tokens"], "{m}");
        assert_eq!(m["usage"]["output_tokens"], c["usage"]["completion_tokens"], "{m}");
        if c["choices"][0]["finish_reason"] == "stop" {
            assert_eq!((m["stop_reason"].as_str(), m["stop_sequence"].as_str()), (Some("stop_sequence"), Some(".")), "{m}");
        }
        let short = server
            .post_ok("/v1/messages", &json!({"max_tokens": 2, "messages": [{"role": "user", "content": "Tell a story."}]}))
            .await;
        assert_eq!((short["stop_reason"].as_str(), short["usage"]["output_tokens"].as_u64()), (Some("max_tokens"), Some(2)));

        // Streamed: Anthropic's order, the deltas making the whole answer.
        let stream = json!({"system": "Answer briefly.", "max_tokens": 40, "temperature": 0, "stop_sequences": ["."],
            "stream": true, "messages": [{"role": "user", "content": "Name a river."}]});
        let events: Vec<Value> = sse_events(server.send(post_request("/v1/messages", stream.to_string())).await, usize::MAX)
            .await
            .iter()
            .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
            .collect();
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(kinds[..2], ["message_start", "content_block_start"], "{kinds:?}");
        assert_eq!(kinds[kinds.len() - 3..], ["content_block_stop", "message_delta", "message_stop"], "{kinds:?}");
        let deltas: String = events
            .iter()
            .filter(|e| e["type"] == "content_block_delta")
            .filter_map(|e| e["delta"]["text"].as_str())
            .collect();
        assert_eq!(deltas, text(&m));
        assert_eq!(events[kinds.len() - 2]["delta"]["stop_reason"], m["stop_reason"]);
    });
}

#[test]
fn a_tool_round_trip_in_blocks() {
    smollm2_server().run_then_idle(async |server| {
        let tools = json!([{"name": "get_weather", "description": "Current weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                "required": ["city"], "additionalProperties": false}}]);
        let question = json!({"role": "user", "content": "What is the weather in Paris?"});
        let ask = json!({"max_tokens": 60, "temperature": 0, "tools": tools, "tool_choice": {"type": "any"},
            "messages": [question]});
        let m = server.post_ok("/v1/messages", &ask).await;
        assert_eq!(m["stop_reason"], "tool_use", "{m}");
        let call = m["content"].as_array().and_then(|c| c.iter().find(|b| b["type"] == "tool_use")).cloned();
        let call = call.unwrap_or_else(|| panic!("no tool_use block: {m}"));
        assert_eq!(call["name"], "get_weather");
        assert!(call["input"]["city"].as_str().is_some_and(|c| c.chars().count() <= 30), "{call}");

        let answer = server
            .post_ok("/v1/messages", &json!({"max_tokens": 20, "temperature": 0, "tools": tools, "messages": [
                question, {"role": "assistant", "content": m["content"]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny, 18 C"}]}]}))
            .await;
        assert!(!text(&answer).is_empty() && answer["content"][0]["type"] == "text", "{answer}");

        // Streamed: the tool_use block, its input in one input_json_delta.
        let stream = json!({"max_tokens": 60, "temperature": 0, "tools": tools, "stream": true,
            "tool_choice": {"type": "tool", "name": "get_weather"}, "messages": [question]});
        let events: Vec<Value> = sse_events(server.send(post_request("/v1/messages", stream.to_string())).await, usize::MAX)
            .await
            .iter()
            .map(|e| serde_json::from_str(e).unwrap_or_default())
            .collect();
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(kinds, ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop"], "{events:?}");
        assert_eq!(events[1]["content_block"]["type"], "tool_use");
        let partial = events[2]["delta"]["partial_json"].as_str().unwrap_or_default();
        assert!(serde_json::from_str::<Value>(partial).is_ok_and(|i| i["city"].is_string()), "{partial}");
    });
}

#[test]
fn errors_keys_the_queue_and_a_leaving_client_in_anthropics_terms() {
    let config = ServerConfig { api_key: Some("sesame".into()), ..ServerConfig::default() };
    let srv = TestServer::new(small_config(), &config);
    runtime().block_on(async {
        let body = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]});
        let (status, e) = srv.post_json("/v1/messages", &body).await;
        assert_eq!(
            (status, e["type"].as_str(), e["error"]["type"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("error"), Some("authentication_error")),
            "{e}"
        );
        for (name, value) in [("x-api-key", "sesame"), ("authorization", "Bearer sesame")] {
            let req = axum::http::Request::post("/v1/messages")
                .header("content-type", "application/json")
                .header(name, value)
                .body(axum::body::Body::from(body.to_string()))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(srv.send(req).await.status(), StatusCode::OK, "{name}");
        }
    });

    let engine_config = EngineConfig { max_num_seqs: 1, max_waiting: 1, ..small_config() };
    let srv = TestServer::new(engine_config, &ServerConfig::default());
    runtime().block_on(async {
        for (body, needle) in [
            (json!({"messages": [{"role": "user", "content": "x"}]}), "max_tokens"),
            (json!({"max_tokens": 2, "messages": []}), "messages"),
            (json!({"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "image"}]}]}), "image"),
            (json!({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled"}}), "thinking"),
            (json!({"max_tokens": "two", "messages": []}), "max_tokens"),
        ] {
            let (status, e) = srv.post_json("/v1/messages", &body).await;
            assert_eq!((status, e["error"]["type"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_request_error")), "{body}: {e}");
            assert!(e["error"]["message"].as_str().is_some_and(|m| m.contains(needle)), "{body}: {e}");
        }
        let long = json!({"max_tokens": 400, "ignore_eos": true, "stream": true,
            "messages": [{"role": "user", "content": "hello"}]});
        let running = srv.send(post_request("/v1/messages", long.to_string())).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !srv.get("/metrics").await.1.lines().any(|l| {
            l.starts_with("vllm:num_requests_running") && l.trim_end().ends_with(" 1")
        }) {
            assert!(std::time::Instant::now() < deadline, "the first call never ran");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let waiting = srv.send(post_request("/v1/messages", long.to_string())).await;
        let (status, e) = srv.post_json("/v1/messages", &json!({"max_tokens": 2,
            "messages": [{"role": "user", "content": "x"}]})).await;
        assert_eq!((status, e["error"]["type"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("rate_limit_error")), "{e}");
        drop((running, waiting));
        srv.wait_idle().await;
        let resp = srv.send(post_request("/v1/messages", long.to_string())).await;
        assert_eq!(sse_events(resp, 4).await.len(), 4);
        srv.wait_idle().await;
    });
}

/// The answer is scripted with `guided_choice` over the whole text (`enable_in_reasoning`).
#[test]
fn thinking_blocks_carry_the_reasoning_whole_and_streamed() {
    let config = ServerConfig {
        reasoning_parser: Some(ReasoningParser::Qwen3),
        structured_outputs: StructuredOutputsConfig { enable_in_reasoning: true, ..Default::default() },
        ..ServerConfig::default()
    };
    let answer = "<think>Paris is the capital.</think>\n\nIn France.";
    let body = |thinking: Value, stream: bool| {
        json!({"max_tokens": 2048, "temperature": 0, "guided_choice": [answer], "thinking": thinking,
            "stream": stream, "messages": [{"role": "user", "content": "Where is Paris?"}]})
    };
    let enabled = json!({"type": "enabled", "budget_tokens": 1024});
    smollm2_server_with(smollm2_config(), &config).run_then_idle(async |server| {
        let m = server.post_ok("/v1/messages", &body(enabled.clone(), false)).await;
        let blocks = m["content"].as_array().cloned().unwrap_or_default();
        let kinds: Vec<&str> = blocks.iter().filter_map(|b| b["type"].as_str()).collect();
        assert_eq!(kinds, ["thinking", "text"], "{m}");
        assert_eq!(blocks[0]["thinking"], "Paris is the capital.", "{m}");
        assert_eq!(blocks[0]["signature"], "", "{m}");
        assert_eq!(text(&m), "\n\nIn France.", "{m}");
        // Not asked for: the reasoning is left out, never text.
        let m = server.post_ok("/v1/messages", &body(json!({"type": "disabled"}), false)).await;
        assert_eq!(m["content"], json!([{"type": "text", "text": "\n\nIn France."}]), "{m}");

        let raw = sse_events(
            server.send(post_request("/v1/messages", body(enabled, true).to_string())).await,
            usize::MAX,
        );
        let events: Vec<Value> =
            raw.await.iter().map(|e| serde_json::from_str(e).unwrap_or_default()).collect();
        // Each block starts, takes its deltas and stops before the next starts.
        let mut order = Vec::new();
        let (mut thinking, mut text) = (String::new(), String::new());
        for e in &events {
            let i = e["index"].as_u64();
            match e["type"].as_str() {
                Some("content_block_start") => {
                    order.push(format!("start {} {}", i.unwrap_or(9), e["content_block"]["type"]))
                }
                Some("content_block_stop") => order.push(format!("stop {}", i.unwrap_or(9))),
                Some("content_block_delta") => match e["delta"]["type"].as_str() {
                    Some("thinking_delta") if i == Some(0) => {
                        thinking.push_str(e["delta"]["thinking"].as_str().unwrap_or(""))
                    }
                    Some("text_delta") if i == Some(1) => {
                        text.push_str(e["delta"]["text"].as_str().unwrap_or(""))
                    }
                    _ => panic!("a stray delta: {e}"),
                },
                _ => {}
            }
        }
        assert_eq!(order, ["start 0 \"thinking\"", "stop 0", "start 1 \"text\"", "stop 1"], "{events:?}");
        assert_eq!((thinking.as_str(), text.as_str()), ("Paris is the capital.", "\n\nIn France."));
    });
    smollm2_server().run_then_idle(async |server| {
        let r = server
            .send(post_request(
                "/v1/messages",
                body(json!({"type": "enabled", "budget_tokens": 1024}), false).to_string(),
            ))
            .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    });
}
