//! The web page's routes (`/`, its ES modules, `/style.css`: content types, caching, no API key) and
//! the calculator's `/v1/plan`: its numbers equal a direct `sim` run's, and bad sizes are 400s
//! naming the field.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use server::ServerConfig;

use crate::support::{TestServer, runtime, small_config, text_of};

#[test]
fn the_page_and_its_assets_are_served_with_their_types_and_without_a_key() {
    // An API key guards /v1, not the page.
    let config = ServerConfig { api_key: Some("sekret".into()), ..ServerConfig::default() };
    let srv = TestServer::new(small_config(), &config);
    runtime().block_on(async {
        for (path, ty, needle) in [
            ("/", "text/html; charset=utf-8", "<title>PagedAttention engine</title>"),
            ("/app.js", "text/javascript; charset=utf-8", "import { initKvMap } from \"/kv_map.js\""),
            ("/shared.js", "text/javascript; charset=utf-8", "export async function readSse"),
            ("/chat.js", "text/javascript; charset=utf-8", "/v1/chat/completions"),
            ("/kv_map.js", "text/javascript; charset=utf-8", "/v1/kv_map/stream"),
            ("/calculator.js", "text/javascript; charset=utf-8", "/v1/plan"),
            ("/style.css", "text/css; charset=utf-8", "--owned"),
        ] {
            let resp =
                srv.send(Request::get(path).body(Body::empty()).unwrap_or_else(|e| panic!("{e}"))).await;
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            let h = resp.headers().clone();
            assert_eq!(h[header::CONTENT_TYPE], ty, "{path}");
            assert_eq!(h[header::CACHE_CONTROL], "no-cache", "{path}");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
            let etag = h[header::ETAG].to_str().unwrap_or_else(|e| panic!("{e}")).to_owned();
            let body = text_of(resp).await;
            assert!(body.contains(needle), "{path} lacks {needle:?}");
            // Revalidation with the ETag is a 304 without a body.
            let again = Request::get(path).header(header::IF_NONE_MATCH, &etag).body(Body::empty());
            let resp = srv.send(again.unwrap_or_else(|e| panic!("{e}"))).await;
            assert_eq!(resp.status(), StatusCode::NOT_MODIFIED, "{path}");
            assert!(text_of(resp).await.is_empty());
        }
        let resp = srv.send(Request::get("/").body(Body::empty()).unwrap_or_else(|e| panic!("{e}"))).await;
        let csp = resp.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap_or_default().to_owned();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe"), "{csp}");
        // The API behind it still wants the key.
        let (status, _) = srv.get("/v1/plan").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = srv.get("/v1/models").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    });
}

#[test]
fn the_page_references_only_its_own_assets() {
    let html = server::web::INDEX.body;
    for asset in server::web::ASSETS {
        if asset.path != "/" {
            assert!(html.contains(&format!("\"{}\"", asset.path)), "index.html does not load {}", asset.path);
        }
    }
    for body in server::web::ASSETS.map(|a| a.body) {
        assert!(!body.contains("http://") || body.contains("http://www.w3.org/2000/svg"), "no external URL");
        assert!(!body.contains("https://"), "no external URL");
    }
}

/// What `cargo xtask plan --model llama2-7b --hardware a100-40gb --num-requests 200 --rate inf`
/// computes, called directly.
fn direct_llama2_plan() -> (usize, sim::SimSetup, sim::Comparison) {
    let model = sim::ModelShape::LLAMA2_7B;
    let hw = sim::Hardware::A100_40GB;
    let kv_tokens = model.kv_token_slots(hw.memory_bytes * 0.9 - model.weight_bytes());
    let setup = sim::SimSetup {
        capacity_tokens: kv_tokens,
        block_size: 16,
        max_model_len: 2048,
        max_num_seqs: 256,
        max_num_batched_tokens: 2048,
        watermark: 0.01,
        preemption: engine::PreemptionMode::Recompute,
        swap_tokens: 0,
        baseline_placement: sim::Placement::Buddy,
        kv_groups: sim::KvGroups::of(&model),
    };
    let trace = sim::Trace::synthetic(sim::TraceShape::SHAREGPT, 200, f64::INFINITY, 2048, 0);
    let result =
        sim::compare(&trace, &setup, &sim::CostModel::new(model, hw)).unwrap_or_else(|e| panic!("{e}"));
    (model.kv_bytes_per_token(), setup, result)
}

#[test]
fn plan_matches_a_direct_simulation() {
    let srv = TestServer::default();
    let (kv_bytes, setup, want) = direct_llama2_plan();
    runtime().block_on(async {
        let (status, presets) = srv.get("/v1/plan").await;
        assert_eq!(status, StatusCode::OK);
        let presets: Value = serde_json::from_str(&presets).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> =
            presets["models"].as_array().into_iter().flatten().filter_map(|m| m["name"].as_str()).collect();
        assert_eq!(names, server::plan::model_presets(), "every preset of sim listed");
        assert_eq!(presets["hardware"].as_array().map(Vec::len), Some(2));

        let body = json!({"model": "llama2-7b", "hardware": "a100-40gb", "num_requests": 200});
        let got = srv.post_ok("/v1/plan", &body).await;
        assert_eq!(got["kv_bytes_per_token"], kv_bytes);
        assert_eq!(got["kv_bytes_per_token"], 2 * 32 * 32 * 128 * 2);
        assert_eq!(got["kv_tokens"], setup.usable_tokens());
        assert_eq!(got["num_blocks"], setup.num_blocks());
        assert_eq!(got["fit"]["contiguous_max_len"], setup.usable_tokens() / 2048);
        let systems = got["systems"].as_array().unwrap_or_else(|| panic!("{got}"));
        assert_eq!(systems.len(), 4);
        for (g, w) in systems.iter().zip(want.all()) {
            let w = serde_json::to_value(w).unwrap_or_else(|e| panic!("{e}"));
            let (Some(g), Some(w)) = (g.as_object(), w.as_object()) else { panic!("{g} {w}") };
            assert_eq!(g.keys().collect::<Vec<_>>(), w.keys().collect::<Vec<_>>());
            for (k, wv) in w {
                match (g[k].as_f64(), wv.as_f64()) {
                    // Floats went through text (the last digit may differ); the rest exactly.
                    (Some(a), Some(b)) if wv.is_f64() => {
                        assert!((a - b).abs() <= 1e-12 * b.abs(), "{k}: {a} vs {b}")
                    }
                    _ => assert_eq!(&g[k], wv, "{k}"),
                }
            }
        }
        assert!(!got["series"].as_array().is_some_and(Vec::is_empty));
        // Paged holds more sequences at once than contiguous max-length reservations.
        assert!(want.paged.mean_running > want.max.mean_running);
    });
}

#[test]
fn plan_custom_shapes_and_memory() {
    let srv = TestServer::default();
    runtime().block_on(async {
        let body = json!({"model": "llama2-7b", "layers": 16, "kv_heads": 8, "head_dim": 64, "dtype_bytes": 1,
                          "params": 1e9, "gpu_memory_gib": 8, "gpu_memory_utilization": 0.5,
                          "trace": "alpaca", "num_requests": 50, "block_size": 32});
        let got = srv.post_ok("/v1/plan", &body).await;
        assert_eq!(got["model"]["name"], "custom");
        let per_token = 2 * 16 * 8 * 64;
        assert_eq!(got["kv_bytes_per_token"], per_token);
        let budget = 8.0 * (1u64 << 30) as f64 * 0.5 - 1e9;
        let tokens = (budget / per_token as f64) as usize;
        assert_eq!(got["num_blocks"], tokens / 32);
        assert_eq!(got["trace"]["requests"], 50);
        // An int8 KV cache: a byte per element, 2-byte scales (a key's per 32 dims, a value's
        // per head).
        let int8 = srv.post_ok("/v1/plan", &json!({"model": "llama2-7b", "kv_cache_dtype": "int8"})).await;
        assert_eq!(int8["kv_bytes_per_token"], 32 * 32 * (128 + 8 + 128 + 2));
        assert_eq!(int8["model"]["kv_cache_dtype"], "int8");
    });
}

#[test]
fn plan_refuses_bad_sizes_with_400s_naming_the_field() {
    let srv = TestServer::default();
    runtime().block_on(async {
        for (body, param, words) in [
            (json!({"model": "gpt-9"}), "model", "unknown model"),
            (json!({"hardware": "tpu"}), "hardware", "unknown hardware"),
            (json!({"num_requests": 1_000_000}), "num_requests", "between 1 and"),
            (json!({"num_requests": 0}), "num_requests", "between 1 and"),
            (json!({"layers": 0}), "layers", "between 1 and"),
            (json!({"head_dim": 1_000_000}), "head_dim", "between 1 and"),
            (json!({"max_model_len": 10_000_000}), "max_model_len", "between 2 and"),
            (json!({"dtype_bytes": 3}), "dtype_bytes", "1, 2 or 4"),
            (json!({"kv_cache_dtype": "int4"}), "kv_cache_dtype", "unknown kv_cache_dtype"),
            (json!({"params": -1.0}), "params", "between"),
            (json!({"gpu_memory_gib": 1e300}), "gpu_memory_gib", "between"),
            (json!({"model": "opt-13b", "gpu_memory_gib": 8}), "gpu_memory_gib", "do not fit"),
            (json!({"kv_memory_gib": 1e-9}), "block_size", "not even one block"),
            (json!({"model": "smollm2-135m", "hardware": "h200", "block_size": 1}), "block_size", "at most"),
            (json!({"max_num_batched_tokens": 100}), "max_num_batched_tokens", "at least max_model_len"),
            (json!({"rate": 0}), "rate", "between"),
            (json!({"preemption": "never"}), "preemption", "unknown preemption"),
        ] {
            let (status, got) = srv.post_json("/v1/plan", &body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {got}");
            assert_eq!(got["error"]["param"], param, "{body}: {got}");
            assert_eq!(got["error"]["type"], "invalid_request_error", "{body}: {got}");
            let msg = got["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains(words), "{body}: {msg}");
        }
        // Not a number where a size goes, an unknown field, a size past usize: 400s too.
        for raw in [r#"{"layers": "many"}"#, r#"{"layerz": 3}"#, r#"{"layers": 1e30}"#, "not json"] {
            let (status, got) = srv.post_raw("/v1/plan", raw).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{raw}: {got}");
        }
    });
}

#[test]
fn the_largest_plans_allowed_stay_short() {
    let srv = TestServer::default();
    let (max_req, max_len) = (server::plan::MAX_REQUESTS, server::plan::MAX_MODEL_LEN);
    runtime().block_on(async {
        // Corners within the bounds: the most requests at the longest context, arriving slowly
        // (one at a time: the most steps); all at once into a pool that holds about one
        // (preemption by recompute, then by swap); the most blocks and sequences per batch.
        for body in [
            json!({"model": "llama2-7b", "hardware": "h200", "num_requests": max_req, "max_model_len": max_len, "rate": 0.001}),
            json!({"model": "llama2-7b", "kv_memory_gib": 1.0, "num_requests": max_req, "max_model_len": 2048, "max_num_seqs": 2048}),
            json!({"model": "llama2-7b", "kv_memory_gib": 1.0, "num_requests": max_req, "max_model_len": 2048, "preemption": "swap", "swap_gib": 1.0}),
            json!({"model": "smollm2-135m", "kv_memory_gib": 22.0, "block_size": 1, "num_requests": max_req, "max_model_len": max_len, "max_num_seqs": 2048, "max_num_batched_tokens": 65_536}),
        ] {
            let t = std::time::Instant::now();
            let (status, got) = srv.post_json("/v1/plan", &body).await;
            assert_eq!(status, StatusCode::OK, "{body}: {got}");
            assert!(t.elapsed() < std::time::Duration::from_secs(20), "{body}: {:?}", t.elapsed());
        }
    });
}
