//! `--reasoning-parser` on the real model, its answers forced (`guided_choice`) to scripted texts:
//! the `<think>` span comes back as `reasoning_content`, whole and streamed (the deltas add up to
//! the same two parts, no tag in either), beside tool calls too; without a parser it is content.

use serde_json::{Value, json};
use server::{ReasoningParser, ServerConfig, ToolCallParser};

use crate::support::{TestServer, runtime, smollm2_config, smollm2_server_with};

fn server(parser: Option<ReasoningParser>) -> TestServer {
    let config = ServerConfig { reasoning_parser: parser, ..ServerConfig::default() };
    smollm2_server_with(smollm2_config(), &config)
}

fn forced(text: &str) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Where is Paris?"}],
        "guided_choice": [text], "max_tokens": 48, "temperature": 0
    })
}

/// The whole answer's (reasoning_content, content), then the streamed deltas' concatenations.
async fn both_ways(srv: &TestServer, body: &Value) -> [(Value, Value); 2] {
    let v = srv.post_ok("/v1/chat/completions", body).await;
    let message = &v["choices"][0]["message"];
    let whole = (message["reasoning_content"].clone(), message["content"].clone());
    let mut streamed = json!({"stream": true});
    if let (Some(s), Some(b)) = (streamed.as_object_mut(), body.as_object()) {
        s.extend(b.clone());
    }
    let chunks = srv.stream_chunks("/v1/chat/completions", &streamed).await;
    let (mut reasoning, mut content) = (None::<String>, None::<String>);
    for c in &chunks {
        let delta = &c["choices"][0]["delta"];
        if let Some(r) = delta["reasoning_content"].as_str() {
            reasoning.get_or_insert_default().push_str(r);
        }
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            content.get_or_insert_default().push_str(t);
        }
    }
    [whole, (json!(reasoning), json!(content))]
}

#[test]
fn qwen3s_think_span_is_reasoning_content_whole_and_streamed() {
    let srv = server(Some(ReasoningParser::Qwen3));
    runtime().block_on(async {
        let body = forced("<think>Paris is the capital of France.</think>\n\nIn France.");
        for (reasoning, content) in both_ways(&srv, &body).await {
            assert_eq!(reasoning, "Paris is the capital of France.");
            assert_eq!(content, "\n\nIn France.");
        }
        // An answer without thinking is all content.
        for (reasoning, content) in both_ways(&srv, &forced("In France.")).await {
            assert!(reasoning.is_null(), "{reasoning}");
            assert_eq!(content, "In France.");
        }
    });
}

#[test]
fn deepseek_r1_reasons_from_the_start_and_without_a_parser_all_is_content() {
    let text = "The user asks about Paris.</think>In France.";
    let srv = server(Some(ReasoningParser::DeepseekR1));
    runtime().block_on(async {
        for (reasoning, content) in both_ways(&srv, &forced(text)).await {
            assert_eq!(reasoning, "The user asks about Paris.");
            assert_eq!(content, "In France.");
        }
    });
    let plain = server(None);
    runtime().block_on(async {
        for (reasoning, content) in both_ways(&plain, &forced(text)).await {
            assert!(reasoning.is_null(), "{reasoning}");
            assert_eq!(content, text);
        }
    });
}

#[test]
fn reasoning_beside_a_tool_call() {
    let config = ServerConfig {
        reasoning_parser: Some(ReasoningParser::Qwen3),
        tool_call_parser: ToolCallParser::Hermes,
        ..ServerConfig::default()
    };
    let srv = smollm2_server_with(smollm2_config(), &config);
    let call = r#"<tool_call>{"name": "now", "arguments": {}}</tool_call>"#;
    let mut body = forced(&format!("<think>I need the time.</think>{call}"));
    body["tools"] =
        json!([{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]);
    runtime().block_on(async {
        let v = srv.post_ok("/v1/chat/completions", &body).await;
        let choice = &v["choices"][0];
        assert_eq!(choice["message"]["reasoning_content"], "I need the time.", "{v}");
        assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "now", "{v}");
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        body["stream"] = json!(true);
        let chunks = srv.stream_chunks("/v1/chat/completions", &body).await;
        let last = chunks.iter().rfind(|c| !c["choices"][0]["finish_reason"].is_null()).expect("a finish");
        assert_eq!(last["choices"][0]["delta"]["reasoning_content"], "I need the time.", "{last}");
        assert_eq!(last["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "now", "{last}");
    });
}
