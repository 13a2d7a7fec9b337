//! `GET /metrics`: Prometheus text through the `prometheus` crate, under vLLM's metric names
//! and meanings (so its dashboards read this server too). Gauges and token counters come from
//! what the engine published after its last step (a scrape never waits for a step); the
//! latency histograms are fed by the handlers as requests finish.

use engine::{LiveMetrics, RequestOutput};
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry, TextEncoder,
};

/// Every metric this server exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    running: IntGauge,
    waiting: IntGauge,
    swapped: IntGauge,
    kv_usage: Gauge,
    prefix_hit_rate: Gauge,
    prefix_queries: IntCounter,
    prefix_hits: IntCounter,
    preemptions: IntCounter,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    requests_finished: IntCounter,
    ttft: Histogram,
    tpot: Histogram,
    e2e: Histogram,
}

/// vLLM's bucket edges (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
const E2E_BUCKETS: &[f64] =
    &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0];

impl Metrics {
    pub fn new(model_name: &str) -> Result<Self, prometheus::Error> {
        type Res<T> = Result<T, prometheus::Error>;
        let registry = Registry::new();
        let opts = |name: &str, help: &str| Opts::new(name, help).const_label("model_name", model_name);
        let int_gauge = |name: &str, help: &str| -> Res<IntGauge> {
            registered(&registry, IntGauge::with_opts(opts(name, help))?)
        };
        let gauge = |name: &str, help: &str| -> Res<Gauge> {
            registered(&registry, Gauge::with_opts(opts(name, help))?)
        };
        let counter = |name: &str, help: &str| -> Res<IntCounter> {
            registered(&registry, IntCounter::with_opts(opts(name, help))?)
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| -> Res<Histogram> {
            let o = HistogramOpts::new(name, help)
                .const_label("model_name", model_name)
                .buckets(buckets.to_vec());
            registered(&registry, Histogram::with_opts(o)?)
        };
        Ok(Self {
            running: int_gauge("vllm:num_requests_running", "Requests in the running batch.")?,
            waiting: int_gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")?,
            swapped: int_gauge("vllm:num_requests_swapped", "Requests swapped out to the host.")?,
            kv_usage: gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = every block in use).")?,
            prefix_hit_rate: gauge(
                "vllm:prefix_cache_hit_rate",
                "Prefix-cache hits / queried prompt tokens since start.",
            )?,
            prefix_queries: counter(
                "vllm:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
            )?,
            prefix_hits: counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.")?,
            preemptions: counter("vllm:num_preemptions_total", "Preemptions (recompute or swap).")?,
            prompt_tokens: counter("vllm:prompt_tokens_total", "Prefill tokens processed.")?,
            generation_tokens: counter("vllm:generation_tokens_total", "Generation tokens processed.")?,
            requests_finished: counter(
                "vllm:request_success_total",
                "Requests that finished (stop or length).",
            )?,
            ttft: histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)?,
            tpot: histogram(
                "vllm:time_per_output_token_seconds",
                "Time per output token after the first.",
                TPOT_BUCKETS,
            )?,
            e2e: histogram(
                "vllm:e2e_request_latency_seconds",
                "Arrival to finish of a request.",
                E2E_BUCKETS,
            )?,
            registry: registry.clone(),
        })
    }

    /// Records a request's final output in the latency histograms (normal finishes only).
    pub fn observe_final(&self, out: &RequestOutput) {
        if out.outputs.iter().any(|c| c.finish_reason == Some(engine::FinishReason::Abort)) {
            return;
        }
        self.requests_finished.inc();
        let (Some(ttft), Some(latency)) = (out.timing.time_to_first_token, out.timing.latency) else {
            return;
        };
        self.ttft.observe(ttft.as_secs_f64());
        self.e2e.observe(latency.as_secs_f64());
        let longest = out.outputs.iter().map(|c| c.num_generated).max().unwrap_or(0);
        if longest > 1 {
            self.tpot.observe(latency.saturating_sub(ttft).as_secs_f64() / (longest - 1) as f64);
        }
    }

    /// The Prometheus text of every metric, the gauges and counters brought up to `snap`.
    pub fn render(&self, snap: &LiveMetrics) -> String {
        let g = &snap.gauges;
        self.running.set(g.num_running as i64);
        self.waiting.set(g.num_waiting as i64);
        self.swapped.set(g.num_swapped as i64);
        self.kv_usage.set(g.kv_usage);
        self.prefix_hit_rate.set(snap.prefix_cache_hit_rate);
        // Counters only go up: add what the engine counted since the last scrape.
        let catch_up = |c: &IntCounter, total: u64| c.inc_by(total.saturating_sub(c.get()));
        catch_up(&self.prefix_queries, g.prefix_queries);
        catch_up(&self.prefix_hits, g.prefix_hits);
        catch_up(&self.preemptions, g.num_preemptions);
        catch_up(&self.prompt_tokens, snap.prompt_tokens);
        catch_up(&self.generation_tokens, snap.generation_tokens);
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for these metric types.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Registers `metric` in `registry` and hands it back.
fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> Result<M, prometheus::Error> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}
