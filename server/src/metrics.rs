//! `GET /metrics`: Prometheus text through the `prometheus` crate, under the names and meanings
//! of vLLM's V1 engine (`vllm/v1/metrics/loggers.py`), so its dashboards read this server too;
//! names V1 dropped (`num_requests_swapped`, the prefix hit-rate gauge,
//! `time_per_output_token_seconds`) are not exported. Gauges and token counters come from what
//! the engine published after its last step (a scrape never waits for a step), and so does the
//! histogram of tokens per step; the per-request histograms are fed by the handlers as outputs
//! arrive.

use engine::{FinishReason, LiveMetrics, RequestOutput, STEP_TOKEN_BUCKETS};
use prometheus::proto::{Bucket, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// Every metric this server exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    model_name: String,
    running: IntGauge,
    waiting: IntGauge,
    kv_usage: Gauge,
    prefix_queries: IntCounter,
    prefix_hits: IntCounter,
    preemptions: IntCounter,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    spec_drafts: IntCounter,
    spec_draft_tokens: IntCounter,
    spec_accepted_tokens: IntCounter,
    /// Accepted draft tokens by position (`position` label, 0-based).
    spec_accepted_per_pos: IntCounterVec,
    /// Finished samples by `finished_reason` (`stop`, `length`; a client's abort is not a success).
    success: IntCounterVec,
    request_prompt_tokens: Histogram,
    request_generation_tokens: Histogram,
    ttft: Histogram,
    inter_token: Histogram,
    request_tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    inference: Histogram,
    prefill: Histogram,
    decode: Histogram,
}

/// vLLM's bucket edges (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
const TOKEN_LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];

/// The `finished_reason` values vLLM labels successes with (the label sets exist from the start).
const FINISHED_REASONS: [&str; 3] = ["stop", "length", "abort"];

/// The `endpoint` label of successes: which API served the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    ChatCompletions,
    Embeddings,
    Responses,
    Messages,
}

impl Api {
    const ALL: [Api; 5] =
        [Api::Completions, Api::ChatCompletions, Api::Embeddings, Api::Responses, Api::Messages];

    /// The label value: the route's last part (`/v1/chat/completions` → `chat_completions`).
    pub fn label(self) -> &'static str {
        match self {
            Api::Completions => "completions",
            Api::ChatCompletions => "chat_completions",
            Api::Embeddings => "embeddings",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }
}

/// vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, … up to `max`.
fn one_two_five_buckets(max: usize) -> Vec<f64> {
    let mut edges = Vec::new();
    let mut scale = 1usize;
    'outer: loop {
        for m in [1usize, 2, 5] {
            match m.checked_mul(scale) {
                Some(v) if v <= max => edges.push(v as f64),
                _ => break 'outer,
            }
        }
        match scale.checked_mul(10) {
            Some(s) => scale = s,
            None => break,
        }
    }
    edges
}

impl Metrics {
    pub fn new(model_name: &str, max_model_len: usize) -> Result<Self, prometheus::Error> {
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
        let success = registered(
            &registry,
            IntCounterVec::new(
                opts("vllm:request_success_total", "Count of successfully processed requests."),
                &["endpoint", "finished_reason"],
            )?,
        )?;
        for api in Api::ALL {
            for reason in FINISHED_REASONS {
                success.with_label_values(&[api.label(), reason]);
            }
        }
        let token_counts = one_two_five_buckets(max_model_len.max(1));
        let request_latency = |name: &str, help: &str| histogram(name, help, REQUEST_LATENCY_BUCKETS);
        Ok(Self {
            running: int_gauge(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
            )?,
            waiting: int_gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")?,
            kv_usage: gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")?,
            prefix_queries: counter(
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            )?,
            prefix_hits: counter(
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            )?,
            preemptions: counter(
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
            )?,
            prompt_tokens: counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")?,
            generation_tokens: counter(
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
            )?,
            spec_drafts: counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.")?,
            spec_draft_tokens: counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.")?,
            spec_accepted_tokens: counter(
                "vllm:spec_decode_num_accepted_tokens_total",
                "Number of accepted tokens.",
            )?,
            spec_accepted_per_pos: registered(
                &registry,
                IntCounterVec::new(
                    opts(
                        "vllm:spec_decode_num_accepted_tokens_per_pos",
                        "Accepted tokens per draft position.",
                    ),
                    &["position"],
                )?,
            )?,
            success,
            request_prompt_tokens: histogram(
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                &token_counts,
            )?,
            request_generation_tokens: histogram(
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                &token_counts,
            )?,
            ttft: histogram(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            )?,
            inter_token: histogram(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                TOKEN_LATENCY_BUCKETS,
            )?,
            request_tpot: histogram(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                TOKEN_LATENCY_BUCKETS,
            )?,
            e2e: request_latency(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
            )?,
            queue: request_latency(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
            )?,
            inference: request_latency(
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
            )?,
            prefill: request_latency(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
            )?,
            decode: request_latency(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
            )?,
            model_name: model_name.to_owned(),
            registry: registry.clone(),
        })
    }

    /// Records one output of a request `api` served: its inter-token latency, its samples that
    /// finished, and on its final output the per-request histograms. A request a client aborted
    /// is no success and adds no latency.
    pub fn observe(&self, out: &RequestOutput, api: Api) {
        let aborted = out.outputs.iter().any(|c| c.finish_reason == Some(FinishReason::Abort));
        if aborted {
            return;
        }
        if let Some(gap) = out.timing.inter_token_latency {
            self.inter_token.observe(gap.as_secs_f64());
        }
        for reason in out.outputs.iter().filter_map(|c| c.finish_reason.as_ref()) {
            self.success.with_label_values(&[api.label(), reason.as_str()]).inc();
        }
        if out.finished {
            self.observe_final(out);
        }
    }

    fn observe_final(&self, out: &RequestOutput) {
        self.request_prompt_tokens.observe(out.prompt_tokens as f64);
        self.request_generation_tokens.observe(out.completion_tokens as f64);
        let t = &out.timing;
        let (Some(ttft), Some(latency)) = (t.time_to_first_token, t.latency) else {
            return;
        };
        self.ttft.observe(ttft.as_secs_f64());
        self.e2e.observe(latency.as_secs_f64());
        if let Some(queued) = t.queue_time {
            self.queue.observe(queued.as_secs_f64());
            self.inference.observe(latency.saturating_sub(queued).as_secs_f64());
            self.prefill.observe(ttft.saturating_sub(queued).as_secs_f64());
        }
        self.decode.observe(latency.saturating_sub(ttft).as_secs_f64());
        let longest = out.outputs.iter().map(|c| c.num_generated).max().unwrap_or(0);
        if longest > 1 {
            self.request_tpot.observe(latency.saturating_sub(ttft).as_secs_f64() / (longest - 1) as f64);
        }
    }

    /// The Prometheus text of every metric, the gauges and counters brought up to `snap`.
    pub fn render(&self, snap: &LiveMetrics) -> String {
        self.render_with_loras(snap, None)
    }

    /// [`Self::render`] with vLLM's `vllm:lora_requests_info` when LoRA is enabled: `max_loras`
    /// and the registered adapters' request counts.
    pub fn render_with_loras(
        &self,
        snap: &LiveMetrics,
        loras: Option<(usize, &[engine::LoraInfo])>,
    ) -> String {
        let g = &snap.gauges;
        self.running.set(g.num_running as i64);
        self.waiting.set(g.num_waiting as i64);
        self.kv_usage.set(g.kv_usage);
        // Counters only go up: add what the engine counted since the last scrape.
        let catch_up = |c: &IntCounter, total: u64| c.inc_by(total.saturating_sub(c.get()));
        catch_up(&self.prefix_queries, g.prefix_queries);
        catch_up(&self.prefix_hits, g.prefix_hits);
        catch_up(&self.preemptions, g.num_preemptions);
        catch_up(&self.prompt_tokens, snap.prompt_tokens);
        catch_up(&self.generation_tokens, snap.generation_tokens);
        let spec = &snap.spec_decode;
        catch_up(&self.spec_drafts, spec.num_drafts);
        catch_up(&self.spec_draft_tokens, spec.num_draft_tokens);
        catch_up(&self.spec_accepted_tokens, spec.num_accepted_tokens);
        for (pos, &n) in spec.num_accepted_tokens_per_pos.iter().enumerate().filter(|&(_, &n)| n > 0) {
            catch_up(&self.spec_accepted_per_pos.with_label_values(&[&pos.to_string()]), n);
        }
        let mut families = self.registry.gather();
        families.push(self.step_tokens_family(snap));
        if let Some((max_loras, loras)) = loras {
            families.push(self.lora_info_family(max_loras, loras));
        }
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for these metric types.
        let _ = TextEncoder::new().encode(&families, &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }

    /// `vllm:lora_requests_info`, as vLLM writes it: one series whose labels name the adapters
    /// with running and with waiting requests (comma-separated) and `max_lora`, its value the
    /// time of the reading.
    fn lora_info_family(&self, max_loras: usize, loras: &[engine::LoraInfo]) -> MetricFamily {
        let names = |with: fn(&engine::LoraInfo) -> usize| {
            loras.iter().filter(|l| with(l) > 0).map(|l| l.name.as_str()).collect::<Vec<_>>().join(",")
        };
        let labels = [
            ("max_lora", max_loras.to_string()),
            ("model_name", self.model_name.clone()),
            ("running_lora_adapters", names(|l| l.running)),
            ("waiting_lora_adapters", names(|l| l.waiting)),
        ];
        let mut gauge = prometheus::proto::Gauge::default();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        gauge.set_value(now.map_or(0.0, |d| d.as_secs_f64()));
        let (name, help) = ("vllm:lora_requests_info", "Running stats on lora requests.");
        one_series(name, help, MetricType::GAUGE, &labels, |m| m.set_gauge(gauge))
    }

    /// `vllm:iteration_tokens_total`: the engine's own counts of tokens per step, as a histogram
    /// (the engine counts every step; a handler sees none of them).
    fn step_tokens_family(&self, snap: &LiveMetrics) -> MetricFamily {
        let steps = &snap.step_tokens;
        let mut cumulative = 0;
        let buckets = STEP_TOKEN_BUCKETS
            .iter()
            .zip(steps.counts)
            .map(|(&edge, count)| {
                cumulative += count;
                let mut b = Bucket::default();
                b.set_upper_bound(edge as f64);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        let mut h = prometheus::proto::Histogram::default();
        h.set_sample_count(steps.count());
        h.set_sample_sum(steps.sum as f64);
        h.set_bucket(buckets);
        let (name, help) = ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.");
        let labels = [("model_name", self.model_name.clone())];
        one_series(name, help, MetricType::HISTOGRAM, &labels, |m| m.set_histogram(h))
    }
}

/// A metric family of one series with `labels`, its value set by `fill` (for figures the engine
/// counts itself, outside the registry).
fn one_series(
    name: &str,
    help: &str,
    kind: MetricType,
    labels: &[(&str, String)],
    fill: impl FnOnce(&mut Metric),
) -> MetricFamily {
    let mut metric = Metric::default();
    let pair = |(name, value): &(&str, String)| {
        let mut label = LabelPair::default();
        label.set_name((*name).into());
        label.set_value(value.clone());
        label
    };
    metric.set_label(labels.iter().map(pair).collect());
    fill(&mut metric);
    let mut family = MetricFamily::default();
    family.set_name(name.into());
    family.set_help(help.into());
    family.set_field_type(kind);
    family.set_metric(vec![metric]);
    family
}

/// Registers `metric` in `registry` and hands it back.
fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> Result<M, prometheus::Error> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_count_buckets_are_vllms() {
        assert_eq!(one_two_five_buckets(100), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(one_two_five_buckets(1), vec![1.0]);
        assert_eq!(one_two_five_buckets(usize::MAX).len(), 3 * 19 + 1);
    }

    /// The engine's draft counters reach vLLM's names, counters only going up, and each accepted
    /// position gets its `position` label.
    #[test]
    fn spec_decode_counters_render_under_vllms_names() -> Result<(), prometheus::Error> {
        let metrics = Metrics::new("m", 512)?;
        let mut snap = LiveMetrics::default();
        snap.spec_decode.record(4, 2);
        snap.spec_decode.record(4, 0);
        let text = metrics.render(&snap);
        for line in [
            "vllm:spec_decode_num_drafts_total{model_name=\"m\"} 2",
            "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} 8",
            "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 2",
            "vllm:spec_decode_num_accepted_tokens_per_pos{model_name=\"m\",position=\"1\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        Ok(())
    }
}
