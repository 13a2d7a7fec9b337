//! The result of `bench serve`: throughput and each latency's mean, median, standard deviation
//! and percentiles, as `vllm bench serve` prints and saves them.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{RequestResult, ServeBenchArgs};

/// One latency's summary, in milliseconds.
#[derive(Debug)]
struct Summary {
    mean: f64,
    median: f64,
    std: f64,
    percentiles: Vec<(f64, f64)>,
}

impl Summary {
    fn of(samples_s: &[f64], percentiles: &[f64]) -> Self {
        let mut ms: Vec<f64> = samples_s.iter().map(|s| s * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        if ms.is_empty() {
            return Self {
                mean: 0.0,
                median: 0.0,
                std: 0.0,
                percentiles: percentiles.iter().map(|&p| (p, 0.0)).collect(),
            };
        }
        let mean = ms.iter().sum::<f64>() / ms.len() as f64;
        let std = (ms.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / ms.len() as f64).sqrt();
        let at = |p: f64| percentile(&ms, p);
        Self { mean, median: at(50.0), std, percentiles: percentiles.iter().map(|&p| (p, at(p))).collect() }
    }
}

/// The `p`-th percentile of sorted values, linearly interpolated (numpy's default, as vLLM).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

#[derive(Debug)]
pub struct Report {
    pub completed: usize,
    failed: usize,
    duration_s: f64,
    total_input: usize,
    total_output: usize,
    request_rate: f64,
    max_concurrency: Option<usize>,
    /// (name, label, summary): ttft, tpot, itl, e2el.
    metrics: Vec<(&'static str, &'static str, Summary)>,
}

impl Report {
    pub fn new(args: &ServeBenchArgs, results: &[RequestResult], duration: Duration) -> Self {
        let ok: Vec<&RequestResult> = results.iter().filter(|r| r.ok).collect();
        let ttft: Vec<f64> = ok.iter().map(|r| r.ttft).collect();
        let tpot: Vec<f64> = ok
            .iter()
            .filter(|r| r.output_tokens > 1)
            .map(|r| (r.latency - r.ttft) / (r.output_tokens - 1) as f64)
            .collect();
        let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
        let e2el: Vec<f64> = ok.iter().map(|r| r.latency).collect();
        let p = &args.metric_percentiles;
        Self {
            completed: ok.len(),
            failed: results.len() - ok.len(),
            duration_s: duration.as_secs_f64(),
            total_input: ok.iter().map(|r| r.prompt_tokens).sum(),
            total_output: ok.iter().map(|r| r.output_tokens).sum(),
            request_rate: args.request_rate,
            max_concurrency: args.max_concurrency,
            metrics: vec![
                ("ttft", "Time to First Token", Summary::of(&ttft, p)),
                ("tpot", "Time per Output Token (excl. 1st token)", Summary::of(&tpot, p)),
                ("itl", "Inter-token Latency", Summary::of(&itl, p)),
                ("e2el", "End-to-end Latency", Summary::of(&e2el, p)),
            ],
        }
    }

    fn per_s(&self, n: usize) -> f64 {
        n as f64 / self.duration_s.max(f64::MIN_POSITIVE)
    }

    /// vLLM's result keys: `completed`, `request_throughput`, `mean_ttft_ms`, `p99_itl_ms`, ….
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        let rate = if self.request_rate.is_infinite() { json!("inf") } else { json!(self.request_rate) };
        for (key, value) in [
            ("completed", json!(self.completed)),
            ("failed", json!(self.failed)),
            ("duration", json!(self.duration_s)),
            ("request_rate", rate),
            ("max_concurrency", json!(self.max_concurrency)),
            ("total_input_tokens", json!(self.total_input)),
            ("total_output_tokens", json!(self.total_output)),
            ("request_throughput", json!(self.per_s(self.completed))),
            ("output_throughput", json!(self.per_s(self.total_output))),
            ("total_token_throughput", json!(self.per_s(self.total_input + self.total_output))),
        ] {
            out.insert(key.to_owned(), value);
        }
        for (name, _, s) in &self.metrics {
            out.insert(format!("mean_{name}_ms"), json!(s.mean));
            out.insert(format!("median_{name}_ms"), json!(s.median));
            out.insert(format!("std_{name}_ms"), json!(s.std));
            for (p, v) in &s.percentiles {
                out.insert(format!("p{}_{name}_ms", trim(*p)), json!(v));
            }
        }
        Value::Object(out)
    }

    pub fn print(&self) {
        let line = |label: &str, value: String| println!("{label:<40}{value:<10}");
        println!("{:=^50}", " Serving Benchmark Result ");
        line("Successful requests:", self.completed.to_string());
        line("Failed requests:", self.failed.to_string());
        let rate =
            if self.request_rate.is_infinite() { "inf".to_owned() } else { format!("{}", self.request_rate) };
        line("Request rate configured (RPS):", rate);
        if let Some(c) = self.max_concurrency {
            line("Maximum request concurrency:", c.to_string());
        }
        line("Benchmark duration (s):", format!("{:.2}", self.duration_s));
        line("Total input tokens:", self.total_input.to_string());
        line("Total generated tokens:", self.total_output.to_string());
        line("Request throughput (req/s):", format!("{:.2}", self.per_s(self.completed)));
        line("Output token throughput (tok/s):", format!("{:.2}", self.per_s(self.total_output)));
        line(
            "Total Token throughput (tok/s):",
            format!("{:.2}", self.per_s(self.total_input + self.total_output)),
        );
        for (name, label, s) in &self.metrics {
            let upper = name.to_uppercase();
            println!("{:-^50}", label);
            line(&format!("Mean {upper} (ms):"), format!("{:.2}", s.mean));
            line(&format!("Median {upper} (ms):"), format!("{:.2}", s.median));
            for (p, v) in &s.percentiles {
                line(&format!("P{} {upper} (ms):", trim(*p)), format!("{v:.2}"));
            }
        }
        println!("{}", "=".repeat(50));
    }
}

/// A percentile as vLLM names it: 99 → `99`, 99.9 → `99.9`.
fn trim(p: f64) -> String {
    if p.fract() == 0.0 { format!("{p:.0}") } else { format!("{p}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_as_numpy() {
        let sorted = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&sorted, 50.0), 2.5);
        assert_eq!(percentile(&sorted, 0.0), 1.0);
        assert_eq!(percentile(&sorted, 100.0), 4.0);
        assert!((percentile(&sorted, 90.0) - 3.7).abs() < 1e-12);
        let s = Summary::of(&[0.001, 0.003], &[50.0, 99.0]);
        assert_eq!((s.mean, s.median, s.std), (2.0, 2.0, 1.0));
    }
}
