//! `/v1/responses` on the real SmolLM2: a text answer equals the chat endpoint's for the same
//! turns (greedy), instructions included; the stream's typed events are numbered, ordered, and
//! their deltas make the final text; a forced tool call becomes a `function_call` item, and its
//! output sent back (through `previous_response_id`, or as input items) gets a text answer;
//! `text.format` json_schema constrains the text; `max_output_tokens` makes it `incomplete`;
//! stored responses are retrieved, `store: false` ones are not; unsupported fields, items and
//! tools are 400s and an unknown `previous_response_id` a 404. On the tiny model, the guards
//! every endpoint has: the API key, a full waiting queue's 429 at once, a client that leaves
//! mid-stream has its request aborted.

use axum::http::StatusCode;
use engine::EngineConfig;
use serde_json::{Value, json};
use server::ServerConfig;

use crate::support::{TestServer, post_request, runtime, small_config, smollm2_server, sse_events};

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"], "additionalProperties": false}})
}

/// The text of a response's message items.
fn output_text(r: &Value) -> String {
    let items = r["output"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        .collect()
}

async fn chat_text(server: &TestServer, messages: Value, max_tokens: u64) -> String {
    let body = json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0});
    let v = server.post_ok("/v1/chat/completions", &body).await;
    v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn text_answers_match_chat_and_stored_responses_continue() {
    smollm2_server().run_then_idle(async |server| {
        let r = server
            .post_ok(
                "/v1/responses",
                &json!({"input": "Name a color.", "instructions": "Answer in one word.",
                "max_output_tokens": 12, "temperature": 0}),
            )
            .await;
        assert_eq!(
            (r["object"].as_str(), r["status"].as_str()),
            (Some("response"), Some("completed")),
            "{r}"
        );
        assert!(r["id"].as_str().is_some_and(|id| id.starts_with("resp_")), "{r}");
        assert_eq!(r["output"][0]["type"], "message", "{r}");
        assert_eq!(r["output"][0]["content"][0]["type"], "output_text", "{r}");
        let messages = json!([{"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Name a color."}]);
        let want = chat_text(server, messages.clone(), 12).await;
        assert_eq!(output_text(&r), want, "{r}");
        let u = &r["usage"];
        assert_eq!(
            u["total_tokens"].as_u64(),
            Some(u["input_tokens"].as_u64().unwrap_or(0) + u["output_tokens"].as_u64().unwrap_or(0))
        );
        assert_eq!(r["instructions"], "Answer in one word.");

        // Stored: retrievable, and a later call continues the conversation (without the
        // instructions, which it does not inherit).
        let id = r["id"].as_str().unwrap_or_default();
        let (status, body) = server.get(&format!("/v1/responses/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap_or_default()["id"], r["id"]);
        let next = server
            .post_ok(
                "/v1/responses",
                &json!({"input": "And another?", "previous_response_id": id,
                "max_output_tokens": 10, "temperature": 0}),
            )
            .await;
        assert_eq!(next["previous_response_id"], r["id"]);
        let messages = json!([{"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": want}, {"role": "user", "content": "And another?"}]);
        assert_eq!(output_text(&next), chat_text(server, messages, 10).await, "{next}");

        // Not stored: a 404 to GET and as an earlier response.
        let unstored = server
            .post_ok("/v1/responses", &json!({"input": "Hi", "store": false, "max_output_tokens": 4}))
            .await;
        let unstored_id = unstored["id"].as_str().unwrap_or_default();
        assert_eq!(server.get(&format!("/v1/responses/{unstored_id}")).await.0, StatusCode::NOT_FOUND);
        let (status, e) = server
            .post_json("/v1/responses", &json!({"input": "x", "previous_response_id": unstored_id}))
            .await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (StatusCode::NOT_FOUND, Some("previous_response_id")),
            "{e}"
        );

        // The output limit: incomplete, with its reason.
        let short = server
            .post_ok("/v1/responses", &json!({"input": "Tell a long story.", "max_output_tokens": 3}))
            .await;
        assert_eq!(short["status"], "incomplete", "{short}");
        assert_eq!(short["incomplete_details"]["reason"], "max_output_tokens", "{short}");
        assert_eq!(short["usage"]["output_tokens"], 3, "{short}");
    });
}

#[test]
fn the_stream_is_numbered_typed_events_whose_deltas_make_the_text() {
    smollm2_server().run_then_idle(async |server| {
        let body =
            json!({"input": "Count to five.", "max_output_tokens": 16, "temperature": 0, "stream": true});
        let events: Vec<Value> =
            sse_events(server.send(post_request("/v1/responses", body.to_string())).await, usize::MAX)
                .await
                .iter()
                .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
                .collect();
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(
            kinds[..4],
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added"
            ],
            "{kinds:?}"
        );
        // The last event names the response's status (the answer may run into the limit).
        let last = &events[events.len() - 1]["response"];
        let end = if last["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
        assert_eq!(
            kinds[kinds.len() - 4..],
            ["response.output_text.done", "response.content_part.done", "response.output_item.done", end],
            "{kinds:?}"
        );
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"].as_u64(), Some(i as u64), "{e}");
        }
        let deltas: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .filter_map(|e| e["delta"].as_str())
            .collect();
        assert_eq!(output_text(last), deltas);
        assert!(kinds.iter().filter(|k| **k == "response.output_text.delta").count() > 1, "{kinds:?}");
        let whole = server
            .post_ok(
                "/v1/responses",
                &json!({"input": "Count to five.", "max_output_tokens": 16,
            "temperature": 0}),
            )
            .await;
        assert_eq!(output_text(&whole), deltas);
    });
}

#[test]
fn a_tool_round_trip_through_items_and_previous_response_id() {
    smollm2_server().run_then_idle(async |server| {
        let ask = json!({"input": "What is the weather in Paris?", "tools": [weather_tool()],
            "tool_choice": "required", "max_output_tokens": 60, "temperature": 0});
        let r = server.post_ok("/v1/responses", &ask).await;
        let call = r["output"].as_array().and_then(|o| o.iter().find(|i| i["type"] == "function_call")).cloned();
        let call = call.unwrap_or_else(|| panic!("no function_call item: {r}"));
        assert_eq!(call["name"], "get_weather", "{r}");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap_or("")).unwrap_or_default();
        assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 30), "{call}");
        let call_id = call["call_id"].as_str().unwrap_or_default();

        // The result sent back after the stored response, and again as items of its own.
        let result = json!({"type": "function_call_output", "call_id": call_id, "output": "{\"sky\": \"sunny\"}"});
        let by_id = server
            .post_ok("/v1/responses", &json!({"previous_response_id": r["id"], "input": [result],
                "tools": [weather_tool()], "max_output_tokens": 20, "temperature": 0}))
            .await;
        assert_eq!(by_id["output"][0]["type"], "message", "{by_id}");
        let items = json!([{"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": call["arguments"]},
            result]);
        let by_items = server
            .post_ok("/v1/responses", &json!({"input": items, "tools": [weather_tool()], "max_output_tokens": 20,
                "temperature": 0}))
            .await;
        assert_eq!(output_text(&by_items), output_text(&by_id));

        // Streamed: the call's item, its arguments in a delta, done.
        let stream = json!({"input": "What is the weather in Paris?", "tools": [weather_tool()],
            "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 60,
            "temperature": 0, "stream": true});
        let events: Vec<Value> = sse_events(server.send(post_request("/v1/responses", stream.to_string())).await, usize::MAX)
            .await
            .iter()
            .map(|e| serde_json::from_str(e).unwrap_or_default())
            .collect();
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(kinds[2..], ["response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.done", "response.output_item.done", "response.completed"], "{kinds:?}");
        let delta = events[3]["delta"].as_str().unwrap_or_default();
        assert!(serde_json::from_str::<Value>(delta).is_ok_and(|a| a["city"].is_string()), "{delta}");
    });
}

#[test]
fn a_json_schema_format_constrains_the_text() {
    smollm2_server().run_then_idle(async |server| {
        let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false});
        let r = server
            .post_ok("/v1/responses", &json!({"input": "A person as JSON.", "max_output_tokens": 60, "temperature": 0,
                "text": {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": true}}}))
            .await;
        let v: Value = serde_json::from_str(&output_text(&r)).unwrap_or_else(|e| panic!("{e}: {r}"));
        assert!(v["name"].is_string() && v["age"].is_i64(), "{v}");
        assert_eq!(r["text"]["format"]["type"], "json_schema");
    });
}

#[test]
fn unsupported_requests_are_400s_that_name_what() {
    smollm2_server().run_then_idle(async |server| {
        for (body, needle) in [
            (json!({"input": "x", "reasoning": {"effort": "low"}}), "reasoning"),
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}), "input_image"),
            (json!({"input": "x", "tools": [{"type": "web_search_preview"}]}), "web_search_preview"),
            (json!({"input": []}), "input"),
            (json!({"input": "x", "text": {"format": {"type": "yaml"}}}), "text.format"),
            (json!({"input": "x", "model": "another"}), "another"),
        ] {
            let (status, e) = server.post_json("/v1/responses", &body).await;
            assert!(status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND, "{body}: {status}");
            assert!(e["error"]["message"].as_str().is_some_and(|m| m.contains(needle)), "{body}: {e}");
        }
        let (status, _) = server.post_json("/v1/responses", &json!({"input": "x", "previous_response_id": "resp_nope"})).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(server.get("/v1/responses/resp_nope").await.0, StatusCode::NOT_FOUND);
    });
}

#[test]
fn the_key_a_full_queue_and_a_leaving_client_as_on_every_endpoint() {
    let config = ServerConfig { api_key: Some("sesame".into()), ..ServerConfig::default() };
    let srv = TestServer::new(small_config(), &config);
    runtime().block_on(async {
        assert_eq!(srv.post_json("/v1/responses", &json!({"input": "x"})).await.0, StatusCode::UNAUTHORIZED);
        assert_eq!(srv.get("/v1/responses/resp_x").await.0, StatusCode::UNAUTHORIZED);
    });

    // One sequence runs and one may wait: a third call is refused at once.
    let engine_config = EngineConfig { max_num_seqs: 1, max_waiting: 1, ..small_config() };
    let srv = TestServer::new(engine_config, &ServerConfig::default());
    runtime().block_on(async {
        let long = json!({"input": "hello", "max_output_tokens": 400, "ignore_eos": true, "stream": true});
        let running = srv.send(post_request("/v1/responses", long.to_string())).await;
        // Once it runs (not before: the queue counts it until it is scheduled), the next waits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !srv
            .get("/metrics")
            .await
            .1
            .lines()
            .any(|l| l.starts_with("vllm:num_requests_running") && l.trim_end().ends_with(" 1"))
        {
            assert!(std::time::Instant::now() < deadline, "the first call never ran");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let waiting = srv.send(post_request("/v1/responses", long.to_string())).await;
        assert_eq!((running.status(), waiting.status()), (StatusCode::OK, StatusCode::OK));
        let (status, v) =
            srv.post_json("/v1/responses", &json!({"input": "x", "max_output_tokens": 2})).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
        // Both streams dropped: their requests are aborted and everything is given back.
        drop((running, waiting));
        let metrics = srv.wait_idle().await;
        let generated: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("vllm:generation_tokens_total{model_name=\"tiny\"} "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no generation token count in\n{metrics}"));
        assert!(generated < 800.0, "{generated} tokens generated: the streams' requests ran on");
        // A client reading a few events, then leaving.
        let resp = srv.send(post_request("/v1/responses", long.to_string())).await;
        assert_eq!(sse_events(resp, 5).await.len(), 5);
        srv.wait_idle().await;
        srv.post_ok("/v1/responses", &json!({"input": "still serving", "max_output_tokens": 2})).await;
    });
}
