//! What a simulation measures: a per-step time series and its time averages over the saturated
//! busy period (the steps during which requests were waiting for memory or a batch slot).
//!
//! KV utilization is `∫ held dt / ∫ reserved dt`: token states actually in memory over the memory
//! taken from the pool (paged: allocated blocks × block size; contiguous: reserved spans plus
//! external fragmentation — free memory that the waiting head request would fit in by size but
//! that no single hole can hold).

use serde::Serialize;

/// The state of the system during one step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepSample {
    /// Simulated time at the start of the step, seconds.
    pub t_s: f64,
    pub dt_s: f64,
    pub running: usize,
    pub waiting: usize,
    /// Token states in KV memory (including those this step writes).
    pub held_tokens: usize,
    /// Token slots taken from the pool (see the module doc).
    pub reserved_tokens: usize,
    /// Requests were waiting after admission: memory or the batch cap, not arrivals, was the limit.
    pub saturated: bool,
}

/// Result of one simulation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    /// `paged`, `orca-max`, `orca-pow2`, `orca-oracle`.
    pub system: String,
    pub capacity_tokens: usize,
    pub num_requests: usize,
    pub finished: usize,
    pub preemptions: usize,
    pub steps: usize,
    pub sim_time_s: f64,
    /// Seconds of the window the averages cover.
    pub measured_time_s: f64,
    pub kv_util: f64,
    /// Time-averaged share of KV memory reserved (taken from the pool or lost to fragmentation).
    pub kv_usage: f64,
    pub mean_running: f64,
    pub max_running: usize,
    /// Generated tokens per simulated second over the whole run.
    pub output_tokens_per_s: f64,
    /// Mean over finished requests of (finish − arrival) ÷ output tokens: the paper's
    /// normalized latency, seconds per output token (0 when none finished).
    pub mean_normalized_latency_s: f64,
    #[serde(skip)]
    pub series: Vec<StepSample>,
}

impl SimReport {
    /// At most `max_points` samples, evenly spaced over the run (for charts and CLI output).
    pub fn downsampled(&self, max_points: usize) -> Vec<StepSample> {
        let stride = self.series.len().div_ceil(max_points.max(1)).max(1);
        self.series.iter().step_by(stride).copied().collect()
    }
}

/// Accumulates step samples into a `SimReport`.
#[derive(Debug, Default)]
pub struct Recorder {
    series: Vec<StepSample>,
    output_tokens: usize,
    /// Sum of the finished requests' normalized latencies, and their count.
    normalized_latency_sum: f64,
    latencies: usize,
}

impl Recorder {
    pub fn record(&mut self, sample: StepSample) {
        self.series.push(sample);
    }

    pub fn add_output_tokens(&mut self, n: usize) {
        self.output_tokens += n;
    }

    /// A request that arrived at `arrival_s` finished at `finish_s` after `output_len` tokens.
    pub fn request_finished(&mut self, arrival_s: f64, finish_s: f64, output_len: usize) {
        self.normalized_latency_sum += (finish_s - arrival_s) / output_len.max(1) as f64;
        self.latencies += 1;
    }

    pub fn finish(
        self,
        system: &str,
        capacity_tokens: usize,
        num_requests: usize,
        finished: usize,
        preemptions: usize,
    ) -> SimReport {
        let saturated: Vec<&StepSample> = self.series.iter().filter(|s| s.saturated).collect();
        // A run that never saturates is measured over the steps where anything ran.
        let window: Vec<&StepSample> = if saturated.is_empty() {
            self.series.iter().filter(|s| s.running > 0).collect()
        } else {
            saturated
        };
        let time: f64 = window.iter().map(|s| s.dt_s).sum();
        let held: f64 = window.iter().map(|s| s.held_tokens as f64 * s.dt_s).sum();
        let reserved: f64 = window.iter().map(|s| s.reserved_tokens as f64 * s.dt_s).sum();
        let running: f64 = window.iter().map(|s| s.running as f64 * s.dt_s).sum();
        let sim_time_s = self.series.last().map(|s| s.t_s + s.dt_s).unwrap_or(0.0);
        SimReport {
            system: system.to_owned(),
            capacity_tokens,
            num_requests,
            finished,
            preemptions,
            steps: self.series.len(),
            sim_time_s,
            measured_time_s: time,
            kv_util: if reserved > 0.0 { held / reserved } else { 0.0 },
            kv_usage: if time > 0.0 && capacity_tokens > 0 {
                reserved / time / capacity_tokens as f64
            } else {
                0.0
            },
            mean_running: if time > 0.0 { running / time } else { 0.0 },
            max_running: self.series.iter().map(|s| s.running).max().unwrap_or(0),
            output_tokens_per_s: if sim_time_s > 0.0 { self.output_tokens as f64 / sim_time_s } else { 0.0 },
            mean_normalized_latency_s: if self.latencies > 0 {
                self.normalized_latency_sum / self.latencies as f64
            } else {
                0.0
            },
            series: self.series,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dt: f64, running: usize, held: usize, reserved: usize, saturated: bool) -> StepSample {
        StepSample {
            t_s: 0.0,
            dt_s: dt,
            running,
            waiting: 0,
            held_tokens: held,
            reserved_tokens: reserved,
            saturated,
        }
    }

    #[test]
    fn averages_are_time_weighted_over_the_saturated_window() {
        let mut r = Recorder::default();
        r.record(sample(1.0, 2, 50, 100, true));
        r.record(sample(3.0, 4, 100, 100, true));
        r.record(sample(10.0, 1, 1, 100, false));
        let rep = r.finish("x", 100, 3, 3, 0);
        assert!((rep.kv_util - 350.0 / 400.0).abs() < 1e-12);
        assert!((rep.mean_running - 14.0 / 4.0).abs() < 1e-12);
        assert_eq!(rep.max_running, 4);
        assert_eq!(rep.measured_time_s, 4.0);
    }

    #[test]
    fn unsaturated_runs_fall_back_to_busy_steps() {
        let mut r = Recorder::default();
        r.record(sample(1.0, 1, 10, 20, false));
        r.record(sample(5.0, 0, 0, 0, false));
        let rep = r.finish("x", 100, 1, 1, 0);
        assert!((rep.kv_util - 0.5).abs() < 1e-12);
        assert_eq!(rep.mean_running, 1.0);
        assert_eq!(rep.downsampled(1).len(), 1);
    }
}
