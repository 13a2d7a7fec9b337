//! `paged-llm bench serve` against `paged-llm serve` on the real default model: its report
//! agrees with the server's own Prometheus histograms.

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::support::{paged_llm, start};

/// `GET path` on the loopback server; the body.
fn get(port: u16, path: &str) -> String {
    let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect: {e}"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    sock.write_all(req.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let mut text = String::new();
    sock.read_to_string(&mut text).unwrap_or_else(|e| panic!("{e}"));
    text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// The value of the first sample of `name` (labels ignored) in a Prometheus text page.
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split(['{', ' ']).next() == Some(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{page}"))
}

#[test]
fn bench_serve_reports_latencies_that_agree_with_the_servers_histograms() {
    let model = model::testing::smollm2_gguf();
    assert!(model.exists(), "{} missing: run `cargo xtask fetch-model`", model.display());
    let (mut server, port) = start(&model, &["--max-model-len", "1024", "--kv-cache-gib", "0.25"]);
    let out = paged_llm()
        .args(["bench", "serve", "--base-url", &format!("http://127.0.0.1:{port}")])
        .args(["--num-prompts", "12", "--request-rate", "6", "--max-concurrency", "4"])
        .args(["--random-input-len", "240", "--random-output-len", "24", "--seed", "3"])
        .args(["--metric-percentiles", "50,90,99", "--json"])
        .output()
        .unwrap_or_else(|e| panic!("bench serve: {e}"));
    let page = get(port, "/metrics");
    let _ = server.kill();
    let _ = server.wait();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(r["completed"], 12, "{r}");
    assert_eq!(r["failed"], 0, "{r}");
    assert_eq!(r["total_output_tokens"], 12 * 24, "{r}");
    assert!(r["request_throughput"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    for metric in ["ttft", "tpot", "itl", "e2el"] {
        for p in ["50", "90", "99"] {
            let key = format!("p{p}_{metric}_ms");
            assert!(r[&key].as_f64().is_some_and(|v| v > 0.0), "{key}: {r}");
        }
        let (p50, p99) = (r[&format!("p50_{metric}_ms")].as_f64(), r[&format!("p99_{metric}_ms")].as_f64());
        assert!(p50 <= p99, "{metric}: {r}");
    }
    // The server's view: every request counted once, and each latency's mean within 10 % of
    // the client's (the client's include the loopback HTTP round trip).
    let mean = |name: &str| sample(&page, &format!("{name}_sum")) / sample(&page, &format!("{name}_count"));
    assert_eq!(sample(&page, "vllm:time_to_first_token_seconds_count"), 12.0, "{page}");
    assert_eq!(sample(&page, "vllm:request_time_per_output_token_seconds_count"), 12.0, "{page}");
    for (ours, theirs) in [
        ("mean_ttft_ms", "vllm:time_to_first_token_seconds"),
        ("mean_tpot_ms", "vllm:request_time_per_output_token_seconds"),
        ("mean_itl_ms", "vllm:inter_token_latency_seconds"),
        ("mean_e2el_ms", "vllm:e2e_request_latency_seconds"),
    ] {
        let client = r[ours].as_f64().unwrap_or(f64::NAN);
        let server = mean(theirs) * 1e3;
        let off = (client - server).abs() / server;
        assert!(
            off <= 0.10,
            "{ours} {client:.2} ms vs the server's {theirs} mean {server:.2} ms ({off:.3} apart)"
        );
    }
}
