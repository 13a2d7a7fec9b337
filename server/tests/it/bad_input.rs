//! Bad requests get OpenAI-shaped errors with the right status (400, 401, 404, 429) and the
//! server keeps serving: each field's invalid values, malformed and oversized bodies, an
//! unknown model, a missing API key, a full waiting queue.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use engine::EngineConfig;
use serde_json::{Value, json};
use server::ServerConfig;

use crate::support::{TestServer, json_of, runtime, small_config};

fn assert_error(status: StatusCode, v: &Value, want: StatusCode, param: Option<&str>) {
    assert_eq!(status, want, "{v}");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert_eq!(e["code"], want.as_u16(), "{v}");
    if let Some(param) = param {
        assert_eq!(e["param"], param, "{v}");
    }
}

#[test]
fn each_invalid_field_is_a_400_naming_it() {
    let srv = TestServer::default();
    runtime().block_on(async {
        let long_prompt: Vec<u32> = vec![104; 600];
        for (path, body, param) in [
            ("/v1/completions", json!({"prompt": "x", "max_tokens": -1}), Some("max_tokens")),
            ("/v1/completions", json!({"prompt": "x", "temperature": -1}), Some("temperature")),
            ("/v1/completions", json!({"prompt": "x", "top_p": 0}), Some("top_p")),
            ("/v1/completions", json!({"prompt": "x", "top_p": 1.5}), Some("top_p")),
            ("/v1/completions", json!({"prompt": "x", "n": 0}), Some("n")),
            ("/v1/completions", json!({"prompt": "x", "top_k": -5}), Some("top_k")),
            ("/v1/completions", json!({"prompt": "x", "min_p": 2}), Some("min_p")),
            ("/v1/completions", json!({"prompt": "x", "frequency_penalty": 9}), Some("frequency_penalty")),
            ("/v1/completions", json!({"prompt": "x", "logprobs": 100}), Some("logprobs")),
            ("/v1/completions", json!({"prompt": long_prompt, "max_tokens": 4}), Some("max_tokens")),
            ("/v1/completions", json!({"prompt": [1, 99999]}), Some("prompt")),
            ("/v1/completions", json!({"prompt": []}), Some("prompt")),
            ("/v1/chat/completions", json!({"messages": []}), Some("messages")),
            (
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}),
                Some("max_tokens"),
            ),
            ("/v1/completions", json!({"prompt": "x", "max_tokens": "ten"}), None),
            ("/v1/completions", json!({"max_tokens": 3}), None),
        ] {
            let (status, v) = srv.post_json(path, &body).await;
            assert_error(status, &v, StatusCode::BAD_REQUEST, param);
        }
        for raw in ["{not json", "", "[1, 2]", "{\"prompt\": \"x\", \"n\": 1.5}"] {
            let (status, v) = srv.post_raw("/v1/completions", raw.to_owned()).await;
            assert_error(status, &v, StatusCode::BAD_REQUEST, None);
        }
        // A 10 MB body.
        let huge = json!({"prompt": "a".repeat(10 << 20)}).to_string();
        let (status, v) = srv.post_raw("/v1/completions", huge).await;
        assert_error(status, &v, StatusCode::BAD_REQUEST, None);
        let (status, v) = srv.post_json("/v1/completions", &json!({"model": "gpt-9", "prompt": "x"})).await;
        assert_error(status, &v, StatusCode::NOT_FOUND, Some("model"));
        // Still serving, with nothing leaked.
        srv.post_ok("/v1/completions", &json!({"prompt": "hello", "max_tokens": 3})).await;
        srv.wait_idle().await;
    });
}

#[test]
fn the_api_key_guards_v1_only() {
    let config = ServerConfig { api_key: Some("sesame".into()), ..ServerConfig::default() };
    let srv = TestServer::new(small_config(), &config);
    runtime().block_on(async {
        let body = json!({"prompt": "x", "max_tokens": 1}).to_string();
        for auth in [None, Some("Bearer wrong"), Some("sesame"), Some("Basic sesame")] {
            let mut req = Request::post("/v1/completions").header("content-type", "application/json");
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let resp = srv.send(req.body(Body::from(body.clone())).unwrap_or_else(|e| panic!("{e}"))).await;
            let status = resp.status();
            assert_error(status, &json_of(resp).await, StatusCode::UNAUTHORIZED, None);
        }
        let req = Request::post("/v1/completions")
            .header("content-type", "application/json")
            .header("authorization", "Bearer sesame")
            .body(Body::from(body))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(srv.send(req).await.status(), StatusCode::OK);
        assert_eq!(srv.get("/health").await.0, StatusCode::OK);
        assert_eq!(srv.get("/metrics").await.0, StatusCode::OK);
    });
}

#[test]
fn a_full_waiting_queue_answers_429_at_once() {
    // One sequence runs at a time and two may wait: of four long requests held open, at most
    // three are admitted, so at least one is refused, at once.
    let engine_config = EngineConfig { max_num_seqs: 1, max_waiting: 2, ..small_config() };
    let srv = TestServer::new(engine_config, &ServerConfig::default());
    runtime().block_on(async {
        let body =
            json!({"prompt": "hello", "max_tokens": 300, "ignore_eos": true, "stream": true}).to_string();
        let mut held = Vec::new();
        for _ in 0..4 {
            let req = crate::support::post_request("/v1/completions", body.clone());
            held.push(srv.send(req).await);
        }
        let statuses: Vec<StatusCode> = held.iter().map(|r| r.status()).collect();
        assert!(
            statuses.iter().all(|s| [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS].contains(s)),
            "{statuses:?}"
        );
        assert!(statuses.contains(&StatusCode::TOO_MANY_REQUESTS), "{statuses:?}");
        for r in held {
            if r.status() == StatusCode::TOO_MANY_REQUESTS {
                assert_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    &json_of(r).await,
                    StatusCode::TOO_MANY_REQUESTS,
                    None,
                );
            }
        }
        // Every stream dropped: nothing runs, nothing waits, no block is held.
        srv.wait_idle().await;
    });
}
