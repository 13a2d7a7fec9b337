//! Engine metrics: counters and latency histograms gathered every step, a plain-data
//! snapshot for callers, and a `tracing` line per logging interval (vLLM's stat logger).
//!
//! Latencies go into fixed-size HDR histograms (microseconds, 3 significant digits, up to an
//! hour): memory and snapshot cost stay constant however long the engine runs.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::spec::MAX_SPECULATIVE_TOKENS;
use crate::structured::MaskTimes;

/// Percentiles of a latency sample, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct LatencyStats {
    pub count: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
}

impl LatencyStats {
    /// Percentiles of `samples_ms` (empty → all zero), through the same histogram the engine
    /// keeps; values are exact to 3 significant digits.
    pub fn from_samples(samples_ms: &[f64]) -> Self {
        let mut h = LatencyHistogram::new();
        for &ms in samples_ms {
            h.record(Duration::from_secs_f64(ms.max(0.0) / 1e3));
        }
        h.stats()
    }
}

/// A latency distribution of fixed size: microseconds from 1 µs to one hour at 3 significant
/// digits (longer values are clamped to the hour).
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    hist: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    const MAX_US: u64 = 3_600_000_000;

    pub fn new() -> Self {
        // Bounds are constants within the crate's limits: this cannot fail.
        let hist = Histogram::new_with_bounds(1, Self::MAX_US, 3).expect("constant, valid histogram bounds");
        Self { hist }
    }

    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).clamp(1, Self::MAX_US);
        self.hist.saturating_record(us);
    }

    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Count, mean and percentiles in milliseconds (all zero when empty).
    pub fn stats(&self) -> LatencyStats {
        if self.hist.is_empty() {
            return LatencyStats::default();
        }
        let ms = |us: u64| us as f64 / 1e3;
        LatencyStats {
            count: usize::try_from(self.hist.len()).unwrap_or(usize::MAX),
            mean_ms: self.hist.mean() / 1e3,
            p50_ms: ms(self.hist.value_at_quantile(0.5)),
            p90_ms: ms(self.hist.value_at_quantile(0.9)),
            p99_ms: ms(self.hist.value_at_quantile(0.99)),
        }
    }
}

/// Gauges read from the scheduler and block pool at snapshot time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Gauges {
    /// Fraction of device KV blocks in use.
    pub kv_usage: f64,
    /// Token states held by running sequences over the slots of the blocks in use (1 − internal
    /// fragmentation; a block shared by forked samples counts once per sample).
    pub kv_token_util: f64,
    pub num_running: usize,
    pub num_waiting: usize,
    pub num_swapped: usize,
    pub num_preemptions: u64,
    /// Prompt tokens looked up in the prefix cache, and how many were found.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
}

/// Tokens per engine step (prefill plus generated), counted into vLLM's
/// `iteration_tokens_total` buckets: fixed size, `Copy`, published with the gauges.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct StepTokens {
    /// Steps with at most `STEP_TOKEN_BUCKETS[i]` tokens (not cumulative); the last entry counts
    /// the steps past every edge.
    pub counts: [u64; STEP_TOKEN_BUCKETS.len() + 1],
    pub sum: u64,
}

/// vLLM's bucket edges of `iteration_tokens_total`.
pub const STEP_TOKEN_BUCKETS: [u64; 13] = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];

impl StepTokens {
    pub fn record(&mut self, tokens: u64) {
        let i =
            STEP_TOKEN_BUCKETS.iter().position(|&edge| tokens <= edge).unwrap_or(STEP_TOKEN_BUCKETS.len());
        self.counts[i] += 1;
        self.sum = self.sum.saturating_add(tokens);
    }

    /// Steps recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// The gauges and token counters, published by the engine thread after every step so that a
/// reader (a Prometheus scrape) never waits for a step: [`crate::EngineHandle::live_metrics`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct LiveMetrics {
    pub gauges: Gauges,
    pub prefix_cache_hit_rate: f64,
    pub steps: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Tokens of each step that ran a batch.
    pub step_tokens: StepTokens,
    pub spec_decode: SpecDecodeCounts,
}

/// Everything an operator wants to see about the engine at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct MetricsSnapshot {
    pub gauges: Gauges,
    /// `prefix_hits / prefix_queries` (0 when nothing was looked up).
    pub prefix_cache_hit_rate: f64,
    /// Highest KV usage seen so far.
    pub peak_kv_usage: f64,
    pub steps: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub requests_finished: u64,
    pub requests_aborted: u64,
    pub requests_rejected: u64,
    /// Since the engine started (or since `reset`).
    pub elapsed_s: f64,
    /// Prompt / generated tokens per second since start.
    pub prompt_throughput: f64,
    pub generation_throughput: f64,
    pub ttft: LatencyStats,
    pub tpot: LatencyStats,
    /// Arrival to finish of the requests that finished normally.
    pub e2e_latency: LatencyStats,
    /// The guided samples' token masks computed ahead of sampling.
    pub guided_masks: MaskTimes,
    /// Where the decode-only steps' time went, phase by phase.
    pub decode_steps: StepPhases,
    /// Speculative decoding's drafts and how many of their tokens were accepted.
    pub spec_decode: SpecDecodeCounts,
}

/// Speculative decoding's counters, as vLLM's `vllm:spec_decode_*` metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct SpecDecodeCounts {
    /// Drafts scored (one per drafted sequence and step).
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// Drafts whose token at each position was accepted.
    pub num_accepted_tokens_per_pos: [u64; MAX_SPECULATIVE_TOKENS],
}

impl SpecDecodeCounts {
    /// One draft of `drafted` tokens of which the first `accepted` were accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.num_drafts += 1;
        self.num_draft_tokens += drafted as u64;
        self.num_accepted_tokens += accepted as u64;
        let accepted = accepted.min(MAX_SPECULATIVE_TOKENS);
        self.num_accepted_tokens_per_pos[..accepted].iter_mut().for_each(|n| *n += 1);
    }
}

/// The time of steps that prefilled nothing, split by phase, summed over those steps: the
/// engine's share of a decode step beside the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct StepPhases {
    pub steps: u64,
    /// Choosing the step's work (`schedule_into`), seconds.
    pub schedule_s: f64,
    /// Block moves and block-table rows written for the runner, seconds.
    pub prepare_s: f64,
    /// The forward pass (greedy steps: with the argmax over the logits), seconds.
    pub forward_s: f64,
    /// Sampling from the logits, with the structured-output masks, seconds.
    pub sample_s: f64,
    /// Applying the tokens: stop checks, detokenization, the scheduler's update and the
    /// finished requests' outputs, seconds.
    pub update_s: f64,
    /// The context lengths of the steps' sequences, summed: the tokens of KV the steps' attention
    /// read.
    pub context_tokens: u64,
}

impl StepPhases {
    /// Every phase's seconds together.
    pub fn total_s(&self) -> f64 {
        self.schedule_s + self.prepare_s + self.forward_s + self.sample_s + self.update_s
    }
}

/// Accumulates metrics; the engine feeds it each step.
#[derive(Debug)]
pub struct MetricsCollector {
    started: Instant,
    interval: Duration,
    last_log: Instant,
    last_log_tokens: (u64, u64),
    steps: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    requests_finished: u64,
    requests_aborted: u64,
    requests_rejected: u64,
    peak_kv_usage: f64,
    step_tokens: StepTokens,
    ttft: LatencyHistogram,
    tpot: LatencyHistogram,
    e2e: LatencyHistogram,
    guided_masks: MaskTimes,
    decode_steps: StepPhases,
    spec_decode: SpecDecodeCounts,
}

impl MetricsCollector {
    /// `interval`: how often `step_done` logs a line (zero disables logging).
    pub fn new(interval: Duration) -> Self {
        let now = Instant::now();
        Self {
            started: now,
            interval,
            last_log: now,
            last_log_tokens: (0, 0),
            steps: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            requests_finished: 0,
            requests_aborted: 0,
            requests_rejected: 0,
            peak_kv_usage: 0.0,
            step_tokens: StepTokens::default(),
            ttft: LatencyHistogram::new(),
            tpot: LatencyHistogram::new(),
            e2e: LatencyHistogram::new(),
            guided_masks: MaskTimes::default(),
            decode_steps: StepPhases::default(),
            spec_decode: SpecDecodeCounts::default(),
        }
    }

    /// Clears counters and samples (gauges come from elsewhere); starts the clock again.
    pub fn reset(&mut self) {
        *self = Self::new(self.interval);
    }

    /// Where a step adds the times of the masks it computes.
    pub(crate) fn mask_times(&mut self) -> &mut MaskTimes {
        &mut self.guided_masks
    }

    /// A decode-only step's phases, to add to the sums.
    pub(crate) fn decode_step(&mut self, phases: StepPhases) {
        let d = &mut self.decode_steps;
        d.steps += 1;
        d.schedule_s += phases.schedule_s;
        d.prepare_s += phases.prepare_s;
        d.forward_s += phases.forward_s;
        d.sample_s += phases.sample_s;
        d.update_s += phases.update_s;
        d.context_tokens += phases.context_tokens;
    }

    /// One scored draft of `drafted` tokens, its first `accepted` accepted.
    pub fn record_draft(&mut self, drafted: usize, accepted: usize) {
        self.spec_decode.record(drafted, accepted);
    }

    pub fn record_rejected(&mut self) {
        self.requests_rejected += 1;
    }

    pub fn record_aborted(&mut self) {
        self.requests_aborted += 1;
    }

    /// A sequence group finished normally: its time to first token and its mean time per
    /// output token after the first (requests of one token contribute no TPOT).
    pub fn record_finished(&mut self, ttft: Option<Duration>, latency: Duration, generated: usize) {
        self.requests_finished += 1;
        self.e2e.record(latency);
        if let Some(ttft) = ttft {
            self.ttft.record(ttft);
            if generated > 1 {
                let decode = latency.saturating_sub(ttft);
                self.tpot.record(decode.div_f64((generated - 1) as f64));
            }
        }
    }

    /// One engine step ran: tokens it prefilled and generated; logs a line when due.
    pub fn step_done(&mut self, prompt_tokens: usize, generated: usize, gauges: &Gauges) {
        self.steps += 1;
        self.prompt_tokens += prompt_tokens as u64;
        self.generation_tokens += generated as u64;
        self.peak_kv_usage = self.peak_kv_usage.max(gauges.kv_usage);
        if prompt_tokens + generated > 0 {
            self.step_tokens.record((prompt_tokens + generated) as u64);
        }
        let now = Instant::now();
        let since = now.duration_since(self.last_log);
        if self.interval.is_zero() || since < self.interval {
            return;
        }
        let secs = since.as_secs_f64();
        let prompt_rate = (self.prompt_tokens - self.last_log_tokens.0) as f64 / secs;
        let gen_rate = (self.generation_tokens - self.last_log_tokens.1) as f64 / secs;
        tracing::info!(
            target: "engine::metrics",
            "prompt {prompt_rate:.1} tok/s, generation {gen_rate:.1} tok/s, running {}, waiting {}, swapped {}, \
             KV usage {:.1}%, prefix hit rate {:.1}%, preemptions {}",
            gauges.num_running,
            gauges.num_waiting,
            gauges.num_swapped,
            gauges.kv_usage * 100.0,
            hit_rate(gauges) * 100.0,
            gauges.num_preemptions,
        );
        self.last_log = now;
        self.last_log_tokens = (self.prompt_tokens, self.generation_tokens);
    }

    /// The cheap part of a snapshot (no latency statistics).
    pub fn live(&self, gauges: Gauges) -> LiveMetrics {
        LiveMetrics {
            gauges,
            prefix_cache_hit_rate: hit_rate(&gauges),
            steps: self.steps,
            prompt_tokens: self.prompt_tokens,
            generation_tokens: self.generation_tokens,
            step_tokens: self.step_tokens,
            spec_decode: self.spec_decode,
        }
    }

    pub fn snapshot(&self, gauges: Gauges) -> MetricsSnapshot {
        let elapsed_s = self.started.elapsed().as_secs_f64();
        let per_s = |n: u64| if elapsed_s > 0.0 { n as f64 / elapsed_s } else { 0.0 };
        MetricsSnapshot {
            gauges,
            prefix_cache_hit_rate: hit_rate(&gauges),
            peak_kv_usage: self.peak_kv_usage.max(gauges.kv_usage),
            steps: self.steps,
            prompt_tokens: self.prompt_tokens,
            generation_tokens: self.generation_tokens,
            requests_finished: self.requests_finished,
            requests_aborted: self.requests_aborted,
            requests_rejected: self.requests_rejected,
            elapsed_s,
            prompt_throughput: per_s(self.prompt_tokens),
            generation_throughput: per_s(self.generation_tokens),
            ttft: self.ttft.stats(),
            tpot: self.tpot.stats(),
            e2e_latency: self.e2e.stats(),
            guided_masks: self.guided_masks,
            decode_steps: self.decode_steps,
            spec_decode: self.spec_decode,
        }
    }
}

fn hit_rate(g: &Gauges) -> f64 {
    if g.prefix_queries == 0 { 0.0 } else { g.prefix_hits as f64 / g.prefix_queries as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within the histogram's 3 significant digits.
    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= b.abs() * 1e-3 + 1e-9
    }

    #[test]
    fn percentiles_use_nearest_rank_to_three_digits() {
        let s = LatencyStats::from_samples(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.count, 5);
        assert!(close(s.p50_ms, 3.0) && close(s.p90_ms, 5.0) && close(s.p99_ms, 5.0), "{s:?}");
        assert!(close(s.mean_ms, 3.0), "{s:?}");
        assert_eq!(LatencyStats::from_samples(&[]), LatencyStats::default());
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = LatencyStats::from_samples(&hundred);
        assert!(close(s.p50_ms, 50.0) && close(s.p90_ms, 90.0) && close(s.p99_ms, 99.0), "{s:?}");
    }

    #[test]
    fn histogram_size_does_not_grow_with_samples() {
        let mut h = LatencyHistogram::new();
        let before = h.hist.distinct_values();
        for i in 0..200_000u64 {
            h.record(Duration::from_micros(1 + i * 7919 % 5_000_000));
        }
        h.record(Duration::from_secs(100_000)); // past the hour: clamped, not an error
        assert_eq!(h.hist.distinct_values(), before);
        assert_eq!(h.len(), 200_001);
        let s = h.stats();
        assert!(s.p99_ms > 4_900.0 && s.p99_ms < 5_010.0, "{s:?}");
    }

    #[test]
    fn collector_counts_tokens_requests_and_latencies() {
        let mut m = MetricsCollector::new(Duration::ZERO);
        let g = Gauges { kv_usage: 0.5, prefix_queries: 10, prefix_hits: 4, ..Gauges::default() };
        m.step_done(100, 0, &g);
        m.step_done(0, 8, &Gauges { kv_usage: 0.75, ..g });
        m.record_finished(Some(Duration::from_millis(20)), Duration::from_millis(110), 10);
        m.record_finished(Some(Duration::from_millis(40)), Duration::from_millis(40), 1);
        m.record_aborted();
        m.record_rejected();
        let s = m.snapshot(Gauges { kv_usage: 0.25, ..g });
        assert_eq!((s.steps, s.prompt_tokens, s.generation_tokens), (2, 100, 8));
        assert_eq!((s.requests_finished, s.requests_aborted, s.requests_rejected), (2, 1, 1));
        assert_eq!(s.peak_kv_usage, 0.75);
        assert!((s.prefix_cache_hit_rate - 0.4).abs() < 1e-12);
        assert_eq!(s.ttft.count, 2);
        assert_eq!(s.tpot.count, 1);
        assert!(close(s.tpot.p50_ms, 10.0), "{:?}", s.tpot);
        assert_eq!(s.e2e_latency.count, 2);
        let steps = m.live(g).step_tokens;
        assert_eq!((steps.count(), steps.sum, steps.counts[5], steps.counts[1]), (2, 108, 1, 1));
        m.reset();
        assert_eq!(m.snapshot(Gauges::default()).steps, 0);
    }
}
