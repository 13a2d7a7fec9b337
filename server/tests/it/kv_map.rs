//! `GET /v1/kv_map` and `GET /v1/kv_map/stream`: the documented JSON (a character per block,
//! tables, counters), owned blocks while a request runs and none after, and a stream whose rate
//! is bounded and that stops asking the engine once its client has gone.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::support::{TestServer, json_of, runtime, sse_events};

async fn kv_map(srv: &TestServer) -> Value {
    let (status, text) = srv.get("/v1/kv_map").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn device(v: &Value) -> &str {
    v["device"].as_str().unwrap_or_else(|| panic!("no device string: {v}"))
}

fn held(v: &Value) -> usize {
    device(v).chars().filter(|&c| c == 'o' || c == 's').count()
}

#[test]
fn the_map_shows_a_running_requests_blocks_and_none_after_it_finishes() {
    let srv = TestServer::default();
    runtime().block_on(async {
        let idle = kv_map(&srv).await;
        assert_eq!(idle["block_size"], 16);
        assert_eq!(device(&idle), ".".repeat(64), "64 free blocks");
        assert_eq!(idle["host"], "");
        assert_eq!(idle["tables"], json!([]));
        assert_eq!(idle["counters"]["num_running"], 0);

        // A long completion in the background; watch the map while it runs.
        let body = json!({"prompt": "hello there, this prompt is long enough", "max_tokens": 300, "ignore_eos": true});
        let req = crate::support::post_request("/v1/completions", body.to_string());
        let running = tokio::spawn(srv.app.clone().oneshot(req));
        let mut seen = None;
        // A deadline, not a count: CI runs many engines at once on two cores.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            let v = kv_map(&srv).await;
            if v["tables"].as_array().is_some_and(|t| !t.is_empty()) {
                seen = Some(v);
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let v = seen.unwrap_or_else(|| panic!("the running request never showed up"));
        let table = &v["tables"][0];
        assert!(table["id"].as_str().is_some_and(|id| !id.is_empty()), "{table}");
        assert_eq!((table["seq"].clone(), table["swapped"].clone()), (json!(0), json!(false)));
        let blocks: Vec<usize> =
            table["blocks"].as_array().into_iter().flatten().filter_map(Value::as_u64).map(|b| b as usize).collect();
        let tokens = table["tokens"].as_u64().unwrap_or(0) as usize;
        assert_eq!(blocks.len(), tokens.div_ceil(16), "{table}");
        for &b in &blocks {
            assert_eq!(device(&v).as_bytes()[b], b'o', "block {b} of the only request is owned");
        }
        assert_eq!(held(&v), blocks.len());
        assert_eq!(v["counters"]["num_running"], 1);
        assert_eq!(v["counters"]["device_blocks_used"], blocks.len());
        assert!(v["generation"].as_u64() > idle["generation"].as_u64());

        let resp = running.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| match e {});
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(json_of(resp).await["usage"]["completion_tokens"], 300);
        let after = kv_map(&srv).await;
        assert_eq!(held(&after), 0, "{after}");
        assert_eq!(after["tables"], json!([]));
        assert!(device(&after).contains('c'), "the prompt's full blocks stay cached: {after}");
        assert_eq!(after["counters"]["kv_usage"], 0.0);
    });
}

#[test]
fn the_stream_is_rate_bounded_and_stops_asking_when_the_client_goes() {
    let srv = TestServer::default();
    runtime().block_on(async {
        // 1 ms is clamped to the 50 ms floor: four events take at least three periods.
        let req = Request::get("/v1/kv_map/stream?interval_ms=1")
            .body(Body::empty())
            .unwrap_or_else(|e| panic!("{e}"));
        let start = Instant::now();
        let resp = srv.send(req).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers()["content-type"].to_str().is_ok_and(|c| c.starts_with("text/event-stream")));
        let events = sse_events(resp, 4).await; // drops the body: the client goes away
        let elapsed = start.elapsed();
        assert_eq!(events.len(), 4);
        assert!(elapsed >= Duration::from_millis(150), "4 events in {elapsed:?}: the rate is not bounded");
        let generations: Vec<u64> = events
            .iter()
            .map(|e| serde_json::from_str::<Value>(e).unwrap_or_else(|err| panic!("{err}: {e}")))
            .map(|v| {
                assert_eq!(device(&v).len(), 64);
                v["generation"].as_u64().unwrap_or(0)
            })
            .collect();
        assert!(generations.windows(2).all(|w| w[0] < w[1]), "{generations:?}");

        // Gone: nobody but us asks the engine for snapshots any more.
        let before = kv_map(&srv).await["generation"].as_u64().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = kv_map(&srv).await["generation"].as_u64().unwrap_or(0);
        assert_eq!(now, before + 1, "only this GET asked since the stream was dropped");
    });
}
