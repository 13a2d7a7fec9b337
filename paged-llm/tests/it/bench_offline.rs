//! `paged-llm bench latency` and `bench throughput` on the tiny model: what they report is
//! what they ran.

use crate::support::paged_llm;

/// Runs `paged-llm bench ARGS --json` on a fresh tiny model; its JSON.
fn bench_json(args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    model::testing::write_tiny_llama(dir.path(), 7);
    let out = paged_llm()
        .arg("bench")
        .args(args)
        .arg("--model")
        .arg(dir.path())
        .args(["--num-kv-blocks", "64", "--max-model-len", "128", "--json"])
        .output()
        .unwrap_or_else(|e| panic!("paged-llm bench: {e}"));
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn bench_latency_times_each_round_and_reports_their_percentiles() {
    let r = bench_json(&[
        "latency",
        "--batch-size",
        "3",
        "--input-len",
        "8",
        "--output-len",
        "5",
        "--num-iters-warmup",
        "1",
        "--num-iters",
        "3",
    ]);
    let rounds: Vec<f64> =
        r["latencies"].as_array().map(|a| a.iter().filter_map(|v| v.as_f64()).collect()).unwrap_or_default();
    assert_eq!(rounds.len(), 3, "{r}");
    assert!(rounds.iter().all(|s| *s > 0.0), "{r}");
    let mean = rounds.iter().sum::<f64>() / 3.0;
    assert!((r["avg_latency"].as_f64().unwrap_or(0.0) - mean).abs() < 1e-9, "{r}");
    let p = |q: &str| r["percentiles"][q].as_f64().unwrap_or(f64::NAN);
    assert!(p("10") <= p("50") && p("50") <= p("99"), "{r}");
    assert_eq!(r["batch_size"], 3);
}

#[test]
fn bench_throughput_counts_every_requested_token() {
    let r = bench_json(&["throughput", "--num-prompts", "5", "--input-len", "6", "--output-len", "7"]);
    assert_eq!(r["requests"], 5, "{r}");
    assert_eq!(r["output_tokens"], 35, "{r}");
    assert_eq!(r["prompt_tokens"], 30, "{r}");
    assert!(r["output_tokens_per_s"].as_f64().is_some_and(|v| v > 0.0), "{r}");
}
