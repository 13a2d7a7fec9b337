//! `POST /v1/embeddings` on the tiny model: the response's shape, base64 the same floats, the
//! in-process engine's vectors, and the same guards as completions: the API key, 400s naming the
//! field, a full waiting queue's 429 at once, a client that goes away frees what its inputs held.

use axum::http::StatusCode;
use base64::Engine as _;
use engine::{EngineConfig, PoolingParams, Prompt};
use serde_json::{Value, json};
use server::ServerConfig;

use crate::support::{TestServer, runtime, small_config};

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().into_iter().flatten().filter_map(Value::as_f64).map(|x| x as f32).collect()
}

#[test]
fn embeddings_answer_in_openais_shape_with_the_engines_vectors() {
    let srv = TestServer::default();
    let texts = ["hello there", "a second input"];
    let mut engine = srv.engine(small_config());
    let prompts: Vec<Prompt> = texts.iter().map(|&t| Prompt::from(t)).collect();
    let want = engine.embed(prompts, PoolingParams::default()).unwrap_or_else(|e| panic!("{e}"));
    srv.run_then_idle(async |srv| {
        let v = srv.post_ok("/v1/embeddings", &json!({"input": texts, "model": "tiny"})).await;
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], "tiny");
        assert!(v["id"].as_str().is_some_and(|id| id.starts_with("embd-")), "{v}");
        let data = v["data"].as_array().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(data.len(), 2);
        for (i, (d, want)) in data.iter().zip(&want).enumerate() {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            let want = want.as_ref().unwrap_or_else(|e| panic!("{e}"));
            let got = floats(&d["embedding"]);
            assert_eq!(got.len(), want.len());
            let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
            assert!(worst < 1e-5, "input {i}: off by {worst}");
        }
        assert!(v["usage"]["prompt_tokens"].as_u64().is_some_and(|n| n >= 4), "{v}");
        assert_eq!(v["usage"]["prompt_tokens"], v["usage"]["total_tokens"]);
        // base64: the same floats, little-endian.
        let b = srv.post_ok("/v1/embeddings", &json!({"input": texts[0], "encoding_format": "base64"})).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b["data"][0]["embedding"].as_str().unwrap_or_else(|| panic!("{b}")))
            .unwrap_or_else(|e| panic!("{e}"));
        let decoded: Vec<f32> =
            bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let worst = decoded
            .iter()
            .zip(&floats(&data[0]["embedding"]))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            decoded.len() == want[0].as_ref().map_or(0, Vec::len) && worst < 1e-5,
            "base64 off by {worst}"
        );
        // `dimensions` and `normalize`.
        let cut = srv.post_ok("/v1/embeddings", &json!({"input": texts[0], "dimensions": 4})).await;
        let cut = floats(&cut["data"][0]["embedding"]);
        let norm = cut.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(cut.len() == 4 && (norm - 1.0).abs() < 1e-5, "{cut:?}");
        let raw = srv.post_ok("/v1/embeddings", &json!({"input": [[1, 2, 3]], "normalize": false})).await;
        let raw = floats(&raw["data"][0]["embedding"]);
        assert!((raw.iter().map(|x| x * x).sum::<f32>().sqrt() - 1.0).abs() > 1e-3, "normalised anyway");
    });
}

#[test]
fn bad_embedding_requests_are_400s_naming_the_field_and_the_key_guards_them() {
    let config = ServerConfig { api_key: Some("sesame".into()), ..ServerConfig::default() };
    let srv = TestServer::new(small_config(), &config);
    runtime().block_on(async {
        let (status, _) = srv.post_json("/v1/embeddings", &json!({"input": "x"})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    });
    let srv = TestServer::default();
    srv.run_then_idle(async |srv| {
        for (body, param) in [
            (json!({"input": "x", "dimensions": 100_000}), Some("dimensions")),
            (json!({"input": "x", "dimensions": 0}), Some("dimensions")),
            (json!({"input": "x", "dimensions": -3}), Some("dimensions")),
            (json!({"input": []}), Some("input")),
            (json!({"input": [[1, 2], [999_999]]}), Some("prompt")),
            (json!({"input": "x", "temperature": 0.5}), None),
            (json!({"input": "x", "encoding_format": "int8"}), None),
        ] {
            let (status, v) = srv.post_json("/v1/embeddings", &body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
            if let Some(param) = param {
                assert_eq!(v["error"]["param"], param, "{body}: {v}");
            }
        }
        let (status, _) = srv.post_json("/v1/embeddings", &json!({"input": "x", "model": "other"})).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        // The server keeps serving.
        srv.post_ok("/v1/embeddings", &json!({"input": "x"})).await;
    });
}

#[test]
fn a_full_queue_is_a_429_at_once() {
    // One sequence runs at a time and two may wait; a long completion holds the one slot.
    let engine_config = EngineConfig { max_num_seqs: 1, max_waiting: 2, ..small_config() };
    let srv = TestServer::new(engine_config, &ServerConfig::default());
    runtime().block_on(async {
        let long = json!({"prompt": "hello", "max_tokens": 400, "ignore_eos": true, "stream": true});
        let held = srv.send(crate::support::post_request("/v1/completions", long.to_string())).await;
        assert_eq!(held.status(), StatusCode::OK);
        // Four inputs cannot all wait: the call is refused at once, and none of them stays.
        let (status, v) = srv.post_json("/v1/embeddings", &json!({"input": ["a", "b", "c", "d"]})).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("waiting queue")), "{v}");
        drop(held);
        srv.wait_idle().await;
        // The refused call's first inputs give their places back when the engine thread reads
        // their aborts (after the metrics may already read idle): then two inputs fit again.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let body = json!({"input": ["f", "g"]});
        while srv.post_json("/v1/embeddings", &body).await.0 == StatusCode::TOO_MANY_REQUESTS {
            assert!(std::time::Instant::now() < deadline, "the waiting places were never given back");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        srv.post_ok("/v1/embeddings", &body).await;
        srv.post_ok("/v1/completions", &json!({"prompt": "x", "max_tokens": 2})).await;
        srv.wait_idle().await;
    });
}

#[test]
fn a_client_that_leaves_mid_call_frees_what_its_inputs_held() {
    // 64 inputs of 400 tokens, 16 tokens a step: 1600 steps.
    let engine_config = EngineConfig { max_num_batched_tokens: 16, ..small_config() };
    let srv = TestServer::new(engine_config, &ServerConfig::default());
    runtime().block_on(async {
        let inputs: Vec<Vec<u32>> = (0..64u32).map(|i| vec![3 + i % 60; 400]).collect();
        let call =
            srv.send(crate::support::post_request("/v1/embeddings", json!({"input": inputs}).to_string()));
        let gone = tokio::time::timeout(std::time::Duration::from_millis(30), call).await;
        assert!(gone.is_err(), "64 inputs of 400 tokens were embedded within 30 ms");
        // The handler and its streams were dropped: the engine aborts every input, long before
        // it would have computed them all.
        let metrics = srv.wait_idle().await;
        let prompt_tokens: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("vllm:prompt_tokens_total{model_name=\"tiny\"} "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no prompt token count in\n{metrics}"));
        assert!(
            prompt_tokens < (64 * 400) as f64,
            "{prompt_tokens} prompt tokens computed: nothing was aborted"
        );
        srv.post_ok("/v1/embeddings", &json!({"input": "still serving"})).await;
    });
}
