//! Tool calling on the real SmolLM2 (Q4_1 GGUF): a named `tool_choice` and `required` give
//! `tool_calls` whose arguments validate against the tool's schema (whole and streamed as
//! `tool_calls` deltas), `finish_reason` is `tool_calls`, a `tool` message with the result is
//! accepted and answered, and `tool_choice` naming no tool is a 400.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::{runtime, smollm2_server};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "description": "Adds two integers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

/// The call's arguments checked against its tool's schema by hand.
fn check_call(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {call}"));
    match call["function"]["name"].as_str() {
        Some("get_weather") => {
            assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 40), "{args}");
            assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or("")), "{args}");
            assert_eq!(args.as_object().map(|o| o.len()), Some(2), "{args}");
        }
        Some("add") => assert!(args["a"].is_i64() && args["b"].is_i64(), "{args}"),
        other => panic!("unknown tool {other:?}"),
    }
}

#[test]
fn forced_tool_calls_of_the_real_model_validate() {
    let server = smollm2_server();
    let rt = runtime();
    rt.block_on(async {
        let messages = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let body = json!({"messages": messages, "tools": tools(), "tool_choice": named, "max_tokens": 60, "temperature": 0});
        let v = server.post_ok("/v1/chat/completions", &body).await;
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather", "{v}");
        check_call(call);

        let body = json!({"messages": [{"role": "user", "content": "Add 2 and 3."}], "tools": tools(),
            "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 80, "temperature": 0});
        let v = server.post_ok("/v1/chat/completions", &body).await;
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
        assert_eq!(calls.len(), 1, "{v}");
        check_call(&calls[0]);

        // Streamed: one tool_calls delta per call, with its index, then the finish.
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let chunks = server.stream_chunks("/v1/chat/completions", &streamed).await;
        let deltas: Vec<&Value> = chunks.iter().filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array()).collect();
        assert_eq!(deltas.len(), 1, "{chunks:?}");
        let call = &deltas[0]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(call["index"], 0, "{call}");
        check_call(call);
        assert_eq!(deltas[0]["choices"][0]["finish_reason"], "tool_calls");

        // The result goes back as a tool message; the answer is text. (SmolLM2's template
        // concatenates every message's content, so the assistant turn's is "" rather than null.)
        let call = calls[0].clone();
        let round = json!({"messages": [
            {"role": "user", "content": "Add 2 and 3."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "5"}
        ], "tools": tools(), "tool_choice": "none", "max_tokens": 20, "temperature": 0});
        let v = server.post_ok("/v1/chat/completions", &round).await;
        assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
        assert!(v["choices"][0]["message"]["tool_calls"].is_null(), "{v}");

        let bad = json!({"messages": messages, "tools": tools(),
            "tool_choice": {"type": "function", "function": {"name": "launch"}}});
        let (status, v) = server.post_json("/v1/chat/completions", &bad).await;
        assert_eq!((status, v["error"]["param"].clone()), (StatusCode::BAD_REQUEST, json!("tool_choice")), "{v}");
        server.wait_idle().await;
    });
}
