//! `--reasoning-parser` on the real model, its answers forced (`guided_choice`) to scripted texts:
//! the `<think>` span comes back as `reasoning_content`, whole and streamed (the deltas add up to
//! the same two parts, no tag in either), beside tool calls too; without a parser it is content.
//! On `/v1/responses` the span is a `reasoning` item ahead of the message, whole and streamed.

use serde_json::{Value, json};
use server::{ReasoningParser, ServerConfig, StructuredOutputsConfig, ToolCallParser};

use crate::support::{TestServer, runtime, smollm2_config, smollm2_server_with};

/// A server whose constraints cover the reasoning too (`enable_in_reasoning`), so that a
/// `guided_choice` scripts the whole answer, reasoning included.
fn server(parser: Option<ReasoningParser>) -> TestServer {
    let structured_outputs = StructuredOutputsConfig { enable_in_reasoning: true, ..Default::default() };
    let config = ServerConfig { reasoning_parser: parser, structured_outputs, ..ServerConfig::default() };
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
        structured_outputs: StructuredOutputsConfig { enable_in_reasoning: true, ..Default::default() },
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

#[test]
fn responses_put_the_think_span_in_a_reasoning_item_whole_and_streamed() {
    let srv = server(Some(ReasoningParser::Qwen3));
    runtime().block_on(async {
        let answer = "<think>Paris is the capital of France.</think>\n\nIn France.";
        let body = json!({"input": "Where is Paris?", "guided_choice": [answer], "max_output_tokens": 48});
        let r = srv.post_ok("/v1/responses", &body).await;
        let kinds: Vec<&str> =
            r["output"].as_array().into_iter().flatten().filter_map(|i| i["type"].as_str()).collect();
        assert_eq!(kinds, ["reasoning", "message"], "{r}");
        assert_eq!(r["output"][0]["content"][0]["text"], "Paris is the capital of France.", "{r}");
        assert_eq!(r["output"][1]["content"][0]["text"], "\n\nIn France.", "{r}");

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let events: Vec<Value> = crate::support::sse_events(
            srv.send(crate::support::post_request("/v1/responses", streamed.to_string())).await,
            usize::MAX,
        )
        .await
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_default())
        .collect();
        let joined = |kind: &str| -> String {
            events.iter().filter(|e| e["type"] == kind).filter_map(|e| e["delta"].as_str()).collect()
        };
        assert_eq!(joined("response.reasoning_text.delta"), "Paris is the capital of France.");
        assert_eq!(joined("response.output_text.delta"), "\n\nIn France.");
        let added: Vec<(&str, u64)> = events
            .iter()
            .filter(|e| e["type"] == "response.output_item.added")
            .map(|e| (e["item"]["type"].as_str().unwrap_or(""), e["output_index"].as_u64().unwrap_or(9)))
            .collect();
        assert_eq!(added, [("reasoning", 0), ("message", 1)], "{events:?}");
        let last = &events[events.len() - 1];
        // The same items as the whole answer's (their ids aside: another call).
        let texts = |r: &Value| -> Vec<(String, String)> {
            let items = r["output"].as_array().cloned().unwrap_or_default();
            items.iter().map(|i| (i["type"].to_string(), i["content"][0]["text"].to_string())).collect()
        };
        assert_eq!(last["type"], "response.completed");
        assert_eq!(texts(&last["response"]), texts(&r));

        // An answer without thinking is one message.
        let plain =
            json!({"input": "Where is Paris?", "guided_choice": ["In France."], "max_output_tokens": 16});
        let r = srv.post_ok("/v1/responses", &plain).await;
        assert_eq!(
            (r["output"].as_array().map(Vec::len), r["output"][0]["type"].as_str()),
            (Some(1), Some("message")),
            "{r}"
        );
    });
}

/// vLLM's default: the reasoning is free and the constraint starts after it. Under deepseek_r1
/// (reasoning from the first token) a schema leaves a short answer's tokens exactly as an
/// unconstrained request's, all of them reasoning; under qwen3 an answer that does not open a
/// span is held to the choices from its first token.
#[test]
fn a_constraint_applies_to_the_answer_after_the_reasoning() {
    let by_default = |parser| {
        let config = ServerConfig { reasoning_parser: Some(parser), ..ServerConfig::default() };
        smollm2_server_with(smollm2_config(), &config)
    };
    let ask = |extra: Value| {
        let mut body = json!({
            "messages": [{"role": "user", "content": "Which city is the capital of France?"}],
            "max_tokens": 6, "temperature": 0
        });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        body
    };
    let schema = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "city",
        "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}});
    let srv = by_default(ReasoningParser::DeepseekR1);
    runtime().block_on(async {
        let free = srv.post_ok("/v1/chat/completions", &ask(json!({}))).await;
        let guided = srv.post_ok("/v1/chat/completions", &ask(schema.clone())).await;
        assert_eq!(free["choices"][0]["finish_reason"], "length", "{free}");
        let (f, g) = (&free["choices"][0]["message"], &guided["choices"][0]["message"]);
        assert_eq!(g["reasoning_content"], f["reasoning_content"], "{guided} vs {free}");
        assert!(g["reasoning_content"].as_str().is_some_and(|r| !r.is_empty()), "{guided}");
        assert!(g["content"].is_null(), "{guided}");
    });
    let srv = by_default(ReasoningParser::Qwen3);
    runtime().block_on(async {
        let choices = json!({"guided_choice": ["In France.", "In Spain."], "max_tokens": 16});
        for (reasoning, content) in both_ways(&srv, &ask(choices)).await {
            assert!(reasoning.is_null(), "{reasoning}");
            assert!(content == "In France." || content == "In Spain.", "{content}");
        }
    });
}
