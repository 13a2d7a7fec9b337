//! Request traces for the simulator: seeded synthetic length distributions shaped like ShareGPT
//! and Alpaca (the PagedAttention paper's two workloads), or a JSONL file of measured lengths.
//!
//! Synthetic lengths are log-normal (both datasets are long-tailed) with a scale calibrated so
//! the sample means match the datasets' means after clamping to the model's max length.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

/// One request of a trace: when it arrives (seconds) and how long its prompt and output are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceRequest {
    pub arrival_s: f64,
    pub input_len: usize,
    pub output_len: usize,
}

/// A named length distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceShape {
    pub name: &'static str,
    pub mean_input: f64,
    pub mean_output: f64,
    /// Log-space standard deviations (spread of the long tail).
    pub sigma_input: f64,
    pub sigma_output: f64,
}

impl TraceShape {
    /// ShareGPT conversations: mean input 161, mean output 338 tokens, long inputs and outputs.
    pub const SHAREGPT: TraceShape = TraceShape {
        name: "sharegpt",
        mean_input: 161.0,
        mean_output: 338.0,
        sigma_input: 1.0,
        sigma_output: 1.0,
    };
    /// Alpaca instructions: mean input 19, mean output 58 tokens, short and narrower.
    pub const ALPACA: TraceShape = TraceShape {
        name: "alpaca",
        mean_input: 19.0,
        mean_output: 58.0,
        sigma_input: 0.6,
        sigma_output: 0.8,
    };

    /// Every named trace shape.
    pub const PRESETS: [TraceShape; 2] = [Self::SHAREGPT, Self::ALPACA];

    pub fn by_name(name: &str) -> Option<TraceShape> {
        Self::PRESETS.into_iter().find(|t| t.name == name)
    }
}

/// Errors reading a JSONL trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading trace {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("trace line {line}: {source}")]
    Parse { line: usize, source: serde_json::Error },
    #[error("trace line {line}: input and output lengths must be at least 1")]
    ZeroLength { line: usize },
    #[error("trace line {line}: input {input} + output {output} exceeds max_model_len {max_model_len}")]
    TooLong { line: usize, input: usize, output: usize, max_model_len: usize },
    #[error("trace is empty")]
    Empty,
}

/// A request trace, ordered by arrival.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Trace {
    pub requests: Vec<TraceRequest>,
}

impl Trace {
    /// `num` requests of `shape`, arriving as a Poisson process of `rate` requests per second
    /// (`f64::INFINITY`: all at time 0). Input + output never exceeds `max_model_len`.
    pub fn synthetic(shape: TraceShape, num: usize, rate: f64, max_model_len: usize, seed: u64) -> Trace {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let max_len = max_model_len.max(2);
        let z_in: Vec<f64> = (0..num).map(|_| standard_normal(&mut rng)).collect();
        let z_out: Vec<f64> = (0..num).map(|_| standard_normal(&mut rng)).collect();
        let inputs = calibrated_lengths(&z_in, shape.sigma_input, shape.mean_input, max_len - 1);
        let outputs = calibrated_lengths(&z_out, shape.sigma_output, shape.mean_output, max_len - 1);
        let arrivals = poisson_arrivals(&mut rng, num, rate);
        let requests = inputs
            .into_iter()
            .zip(outputs)
            .zip(arrivals)
            .map(|((input_len, output_len), arrival_s)| TraceRequest {
                arrival_s,
                input_len,
                // Keep the input as drawn and cut the output so the whole fits the model.
                output_len: output_len.min(max_len - input_len).max(1),
            })
            .collect();
        Trace { requests }
    }

    /// Reads a JSONL file: one object per line, `{"input": n, "output": m}` (also `input_len` /
    /// `output_len`), optional `"arrival"` in seconds; lines without arrival get Poisson arrivals
    /// of `rate` (seeded). Blank lines are skipped.
    pub fn from_jsonl_file(
        path: &Path,
        rate: f64,
        max_model_len: usize,
        seed: u64,
    ) -> Result<Trace, TraceError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| TraceError::Io { path: path.display().to_string(), source })?;
        Self::from_jsonl(&text, rate, max_model_len, seed)
    }

    /// See `from_jsonl_file`.
    pub fn from_jsonl(text: &str, rate: f64, max_model_len: usize, seed: u64) -> Result<Trace, TraceError> {
        #[derive(Deserialize)]
        struct Line {
            #[serde(alias = "input_len", alias = "prompt_len")]
            input: usize,
            #[serde(alias = "output_len")]
            output: usize,
            arrival: Option<f64>,
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut clock = 0.0;
        let mut requests = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            if raw.trim().is_empty() {
                continue;
            }
            let parsed: Line =
                serde_json::from_str(raw).map_err(|source| TraceError::Parse { line, source })?;
            if parsed.input == 0 || parsed.output == 0 {
                return Err(TraceError::ZeroLength { line });
            }
            if parsed.input + parsed.output > max_model_len {
                return Err(TraceError::TooLong {
                    line,
                    input: parsed.input,
                    output: parsed.output,
                    max_model_len,
                });
            }
            let arrival_s = match parsed.arrival {
                Some(a) if a.is_finite() && a >= 0.0 => a,
                _ => {
                    clock += exponential(&mut rng, rate);
                    clock
                }
            };
            requests.push(TraceRequest { arrival_s, input_len: parsed.input, output_len: parsed.output });
        }
        if requests.is_empty() {
            return Err(TraceError::Empty);
        }
        requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        Ok(Trace { requests })
    }

    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    pub fn mean_input(&self) -> f64 {
        mean(self.requests.iter().map(|r| r.input_len))
    }

    pub fn mean_output(&self) -> f64 {
        mean(self.requests.iter().map(|r| r.output_len))
    }

    /// The same requests (lengths, order) arriving as a Poisson process of `rate` instead: a
    /// workload replayed at another load, arrivals drawn from `seed`.
    pub fn at_rate(&self, rate: f64, seed: u64) -> Trace {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let arrivals = poisson_arrivals(&mut rng, self.requests.len(), rate);
        let requests = self
            .requests
            .iter()
            .zip(arrivals)
            .map(|(r, arrival_s)| TraceRequest { arrival_s, ..*r })
            .collect();
        Trace { requests }
    }
}

fn mean(it: impl ExactSizeIterator<Item = usize>) -> f64 {
    let n = it.len().max(1) as f64;
    it.map(|v| v as f64).sum::<f64>() / n
}

/// Box–Muller: one standard normal variate from two uniforms.
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: ln stays finite
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn exponential(rng: &mut impl Rng, rate: f64) -> f64 {
    if !rate.is_finite() || rate <= 0.0 {
        return 0.0;
    }
    let u: f64 = 1.0 - rng.random::<f64>();
    -u.ln() / rate
}

fn poisson_arrivals(rng: &mut impl Rng, num: usize, rate: f64) -> Vec<f64> {
    let mut clock = 0.0;
    (0..num)
        .map(|_| {
            clock += exponential(rng, rate);
            clock
        })
        .collect()
}

/// Lengths `clamp(round(scale * exp(sigma * z)), 1, max)` with `scale` chosen (by bisection on
/// the monotone sample mean) so the sample mean equals `target_mean`.
fn calibrated_lengths(z: &[f64], sigma: f64, target_mean: f64, max: usize) -> Vec<usize> {
    let lengths = |scale: f64| -> Vec<usize> {
        z.iter().map(|&z| ((scale * (sigma * z).exp()).round() as usize).clamp(1, max)).collect()
    };
    let sample_mean = |scale: f64| mean(lengths(scale).into_iter());
    let (mut lo, mut hi) = (1e-3, target_mean.max(1.0) * 64.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if sample_mean(mid) < target_mean {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lengths(0.5 * (lo + hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_replayed_at_another_rate_keeps_its_requests() {
        let t = Trace::synthetic(TraceShape::ALPACA, 2000, f64::INFINITY, 2048, 3);
        let slow = t.at_rate(4.0, 9);
        let lengths = |t: &Trace| t.requests.iter().map(|r| (r.input_len, r.output_len)).collect::<Vec<_>>();
        assert_eq!(lengths(&t), lengths(&slow));
        assert!(slow.requests.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
        let span = slow.requests.last().map_or(0.0, |r| r.arrival_s);
        assert!((span / 2000.0 - 0.25).abs() < 0.02, "mean gap {}", span / 2000.0);
    }

    #[test]
    fn sharegpt_means_match_the_dataset() {
        let t = Trace::synthetic(TraceShape::SHAREGPT, 4000, 10.0, 2048, 7);
        assert_eq!(t.len(), 4000);
        assert!((t.mean_input() - 161.0).abs() < 161.0 * 0.02, "{}", t.mean_input());
        // Outputs are cut so input + output fits the model, which lowers the mean a little.
        assert!((t.mean_output() - 338.0).abs() < 338.0 * 0.05, "{}", t.mean_output());
        assert!(t.requests.iter().all(|r| r.input_len >= 1 && r.output_len >= 1));
        assert!(t.requests.iter().all(|r| r.input_len + r.output_len <= 2048));
        assert!(t.requests.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
    }

    #[test]
    fn alpaca_means_match_the_dataset() {
        let t = Trace::synthetic(TraceShape::ALPACA, 4000, f64::INFINITY, 2048, 1);
        assert!((t.mean_input() - 19.0).abs() < 0.5, "{}", t.mean_input());
        assert!((t.mean_output() - 58.0).abs() < 1.0, "{}", t.mean_output());
        assert!(t.requests.iter().all(|r| r.arrival_s == 0.0));
    }

    #[test]
    fn same_seed_same_trace_other_seed_other_trace() {
        let a = Trace::synthetic(TraceShape::SHAREGPT, 100, 5.0, 2048, 3);
        let b = Trace::synthetic(TraceShape::SHAREGPT, 100, 5.0, 2048, 3);
        let c = Trace::synthetic(TraceShape::SHAREGPT, 100, 5.0, 2048, 4);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn jsonl_reads_lengths_and_rejects_bad_lines() {
        let t = Trace::from_jsonl(
            "{\"input\": 5, \"output\": 7}\n\n{\"input_len\": 3, \"output_len\": 2, \"arrival\": 0.0}\n",
            1.0,
            64,
            0,
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.requests[0].input_len, 3);
        assert_eq!((t.requests[1].input_len, t.requests[1].output_len), (5, 7));
        assert!(matches!(
            Trace::from_jsonl("{\"input\": 0, \"output\": 7}", 1.0, 64, 0),
            Err(TraceError::ZeroLength { line: 1 })
        ));
        assert!(matches!(
            Trace::from_jsonl("{\"input\": 60, \"output\": 7}", 1.0, 64, 0),
            Err(TraceError::TooLong { .. })
        ));
        assert!(matches!(Trace::from_jsonl("oops", 1.0, 64, 0), Err(TraceError::Parse { line: 1, .. })));
        assert!(matches!(Trace::from_jsonl("\n", 1.0, 64, 0), Err(TraceError::Empty)));
    }
}
