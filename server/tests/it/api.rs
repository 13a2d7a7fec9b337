//! The endpoints as a client sees them: completions and chat, JSON and SSE, `n`, logprobs,
//! stop strings and seeds; the answers equal the in-process engine's; a stream dropped
//! mid-way frees its request's blocks; the small routes and `/metrics`.

use axum::http::StatusCode;
use engine::{ChatMessage, Prompt, SamplingParams};
use serde_json::{Value, json};

use crate::support::{TestServer, runtime, small_config, sse_events};

#[test]
fn greedy_chat_equals_the_in_process_engine() {
    let srv = TestServer::default();
    let messages = vec![ChatMessage::new("user", "hello world")];
    let want = srv
        .engine(small_config())
        .generate(
            vec![Prompt::Chat(messages)],
            &SamplingParams { ignore_eos: true, ..SamplingParams::greedy(10) },
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0)
        .unwrap_or_else(|e| panic!("{e}"));
    runtime().block_on(async {
        let body = json!({
            "model": "tiny", "messages": [{"role": "user", "content": "hello world"}],
            "max_tokens": 10, "temperature": 0, "ignore_eos": true
        });
        let v = srv.post_ok("/v1/chat/completions", &body).await;
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], "tiny");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], want.completions[0].text.as_str());
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], 10);
        assert_eq!(v["usage"]["prompt_tokens"], want.prompt_tokens);
        assert_eq!(v["usage"]["total_tokens"], want.prompt_tokens + 10);
        srv.wait_idle().await;
    });
}

#[test]
fn completions_take_prompt_lists_n_and_logprobs() {
    let srv = TestServer::default();
    runtime().block_on(async {
        let body = json!({
            "prompt": ["hello", "hi there"], "max_tokens": 5, "n": 2, "temperature": 1.0,
            "seed": 7, "logprobs": 2, "ignore_eos": true
        });
        let v = srv.post_ok("/v1/completions", &body).await;
        assert_eq!(v["object"], "text_completion");
        let choices = v["choices"].as_array().cloned().unwrap_or_default();
        assert_eq!(choices.len(), 4, "2 prompts x n=2");
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i);
            let lp = &c["logprobs"];
            assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(5), "{c}");
            assert_eq!(lp["token_logprobs"].as_array().map(Vec::len), Some(5));
            assert!(lp["top_logprobs"][0].as_object().is_some_and(|m| (1..=2).contains(&m.len())), "{lp}");
            let offsets: Vec<u64> =
                lp["text_offset"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
            assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets.first() == Some(&0));
        }
        assert_eq!(v["usage"]["completion_tokens"], 20);
        // The same seed gives the same text again.
        let (_, again) = srv.post_json("/v1/completions", &body).await;
        for i in 0..4 {
            assert_eq!(again["choices"][i]["text"], v["choices"][i]["text"]);
        }
        srv.wait_idle().await;
    });
}

#[test]
fn a_stop_string_ends_the_text_before_it() {
    let srv = TestServer::default();
    runtime().block_on(async {
        let base = json!({"prompt": "hello", "max_tokens": 24, "temperature": 0, "ignore_eos": true});
        let (_, free) = srv.post_json("/v1/completions", &base).await;
        let text = free["choices"][0]["text"].as_str().unwrap_or_default().to_owned();
        // Stop at the text's third character (whatever the tiny model wrote).
        let Some(stop) = text.chars().nth(2).map(String::from) else { panic!("short text {text:?}") };
        let mut body = base.clone();
        body["stop"] = json!([stop.clone()]);
        let v = srv.post_ok("/v1/completions", &body).await;
        let cut = v["choices"][0]["text"].as_str().unwrap_or_default();
        assert_eq!(cut, &text[..text.find(&stop).unwrap_or(0)]);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    });
}

#[test]
fn chat_streams_sse_chunks_then_usage_then_done() {
    let srv = TestServer::default();
    runtime().block_on(async {
        let body = json!({
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 6, "temperature": 0, "ignore_eos": true, "stream": true,
            "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 1
        });
        let req = crate::support::post_request("/v1/chat/completions", body.to_string());
        let resp = srv.send(req).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers()["content-type"].to_str().is_ok_and(|c| c.starts_with("text/event-stream")));
        let events = sse_events(resp, usize::MAX).await;
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
            .collect();
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let usage = chunks.last().map(|c| c["usage"].clone()).unwrap_or_default();
        assert_eq!(usage["completion_tokens"], 6);
        assert!(chunks.last().is_some_and(|c| c["choices"].as_array().is_some_and(Vec::is_empty)));
        let content: Vec<&Value> =
            chunks.iter().filter(|c| c["choices"][0]["delta"]["content"].is_string()).collect();
        let logprob_entries: usize = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
            .map(Vec::len)
            .sum();
        assert_eq!(logprob_entries, 6);
        assert!(content.len() >= 2, "role chunk plus content");
        let finishes: Vec<&Value> =
            chunks.iter().filter(|c| c["choices"][0]["finish_reason"].is_string()).collect();
        assert_eq!(finishes.len(), 1);
        assert_eq!(finishes[0]["choices"][0]["finish_reason"], "length");
        srv.wait_idle().await;
    });
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_blocks() {
    let srv = TestServer::default();
    runtime().block_on(async {
        let body = json!({"prompt": "hello", "max_tokens": 400, "ignore_eos": true, "stream": true});
        let req = crate::support::post_request("/v1/completions", body.to_string());
        let resp = srv.send(req).await;
        // Read two chunks, then go away (the body is dropped).
        let got = sse_events(resp, 2).await;
        assert_eq!(got.len(), 2);
        let metrics = srv.wait_idle().await;
        for endpoint in ["completions", "chat_completions", "embeddings", "responses", "messages"] {
            for reason in ["stop", "length", "abort"] {
                let line = format!(
                    "vllm:request_success_total{{endpoint=\"{endpoint}\",finished_reason=\"{reason}\",model_name=\"tiny\"}} 0"
                );
                assert!(metrics.contains(&line), "{line} missing from\n{metrics}");
            }
        }
        // The engine keeps serving.
        let (status, _) = srv.post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 2})).await;
        assert_eq!(status, StatusCode::OK);
    });
}

#[test]
fn models_health_tokenize_detokenize_and_metrics() {
    let srv = TestServer::default();
    runtime().block_on(async {
        let (status, models) = srv.get("/v1/models").await;
        assert_eq!(status, StatusCode::OK);
        let models: Value = serde_json::from_str(&models).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(models["data"][0]["id"], "tiny");
        // The web chat reads the served model's length from here.
        assert_eq!(models["data"][0]["max_model_len"], 512);
        assert_eq!(srv.get("/health").await.0, StatusCode::OK);

        let t = srv.post_ok("/tokenize", &json!({"prompt": "hello"})).await;
        let ids: Vec<u64> = t["tokens"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
        assert_eq!(t["count"], ids.len());
        let (_, raw) =
            srv.post_json("/tokenize", &json!({"prompt": "hello", "add_special_tokens": false})).await;
        let d = srv.post_ok("/detokenize", &json!({"tokens": raw["tokens"]})).await;
        assert_eq!(d["prompt"], "hello");
        let chat = srv.post_ok("/tokenize", &json!({"messages": [{"role": "user", "content": "hi"}]})).await;
        assert!(chat["count"].as_u64().is_some_and(|n| n > 2));

        let (_, _) = srv.post_json("/v1/completions", &json!({"prompt": "hello", "max_tokens": 3})).await;
        let metrics = srv.wait_idle().await;
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:num_preemptions_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_bucket",
            "vllm:request_time_per_output_token_seconds_bucket",
            "vllm:e2e_request_latency_seconds_count",
            "vllm:request_queue_time_seconds_count",
            "vllm:request_prefill_time_seconds_count",
            "vllm:request_decode_time_seconds_count",
            "vllm:request_inference_time_seconds_count",
            "vllm:request_prompt_tokens_bucket",
            "vllm:request_generation_tokens_bucket",
            "vllm:iteration_tokens_total_bucket",
        ] {
            assert!(metrics.contains(name), "{name} missing from\n{metrics}");
        }
        // Names vLLM's V1 engine no longer exports.
        for gone in
            ["vllm:num_requests_swapped", "vllm:prefix_cache_hit_rate", "vllm:time_per_output_token_seconds"]
        {
            assert!(!metrics.contains(gone), "{gone} still in\n{metrics}");
        }
        assert!(metrics.contains("vllm:generation_tokens_total{model_name=\"tiny\"} 3"), "{metrics}");
        // One request, two generated tokens after the first: two inter-token gaps.
        assert!(
            metrics.contains("vllm:inter_token_latency_seconds_count{model_name=\"tiny\"} 2"),
            "{metrics}"
        );
        assert!(metrics.contains("vllm:request_generation_tokens_sum{model_name=\"tiny\"} 3"), "{metrics}");
    });
}
