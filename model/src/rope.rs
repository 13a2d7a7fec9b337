//! Rotary-embedding frequencies (`inv_freq`), with linear, Llama 3, YaRN and LongRoPE scaling,
//! exactly as `transformers` computes them; cos/sin are produced per position on demand so a
//! 128K-context model needs no giant table.

use crate::arch::RopeKind;
use crate::config::{ModelConfig, RopeScaling};

/// Inverse frequencies of one head (`head_dim / 2` of them) and the factor cos/sin are scaled by.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f64>,
    /// YaRN's and LongRoPE's attention factor (1 for the others).
    attention_factor: f64,
}

impl Rope {
    /// The rotation of `kind` layers of `cfg` when sequences are served up to `context` tokens
    /// (LongRoPE takes its long factors only past its original context, as llama.cpp does).
    pub fn new(cfg: &ModelConfig, kind: RopeKind, context: usize) -> Self {
        let d = cfg.head_dim;
        let (theta, scaling) = match kind {
            RopeKind::Global => (cfg.rope_theta, cfg.rope_scaling.as_ref()),
            RopeKind::Local => (cfg.local_rope_theta, None),
        };
        let base: Vec<f64> = (0..d / 2).map(|i| theta.powf((2 * i) as f64 / d as f64)).collect();
        let mut inv_freq: Vec<f64> = base.iter().map(|b| 1.0 / b).collect();
        let mut attention_factor = 1.0;
        match scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => inv_freq.iter_mut().for_each(|f| *f /= factor),
            Some(&RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let low_wavelen = original_max_position_embeddings / low_freq_factor;
                let high_wavelen = original_max_position_embeddings / high_freq_factor;
                for f in &mut inv_freq {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (original_max_position_embeddings / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            Some(&RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor: af,
                truncate,
            }) => {
                // The dimension whose wavelength makes `rotations` turns over the original context.
                let correction_dim = |rotations: f64| {
                    d as f64
                        * (original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(d as f64 - 1.0));
                if low == high {
                    high += 0.001;
                }
                for (i, f) in inv_freq.iter_mut().enumerate() {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    // Below the ramp: extrapolated (kept); above it: interpolated (divided).
                    *f = *f / factor * ramp + *f * (1.0 - ramp);
                }
                attention_factor = af;
            }
            Some(RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor: af,
            }) => {
                let factors =
                    if context > *original_max_position_embeddings { long_factor } else { short_factor };
                for ((f, b), ext) in inv_freq.iter_mut().zip(&base).zip(factors) {
                    *f = 1.0 / (ext * b);
                }
                attention_factor = *af;
            }
        }
        Self { inv_freq, attention_factor }
    }

    /// One rotation per [`RopeKind`], in its order.
    pub fn every_kind(cfg: &ModelConfig, context: usize) -> [Rope; RopeKind::COUNT] {
        [RopeKind::Global, RopeKind::Local].map(|k| Rope::new(cfg, k, context))
    }

    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    pub fn attention_factor(&self) -> f64 {
        self.attention_factor
    }

    pub fn half_dim(&self) -> usize {
        self.inv_freq.len()
    }

    /// Fills `cos`, `sin` (each `head_dim / 2` long) for `position`.
    pub fn fill(&self, position: u32, cos: &mut [f32], sin: &mut [f32]) {
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
            let (sn, cs) = (f64::from(position) * f).sin_cos();
            *c = (cs * self.attention_factor) as f32;
            *s = (sn * self.attention_factor) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn global(cfg: &ModelConfig) -> Rope {
        Rope::new(cfg, RopeKind::Global, cfg.max_position_embeddings)
    }

    fn cfg(scaling: &str) -> ModelConfig {
        let text = format!(
            r#"{{"architectures":["LlamaForCausalLM"],"hidden_size":512,"intermediate_size":8,"num_hidden_layers":1,
            "num_attention_heads":4,"vocab_size":8,"rope_theta":500000.0,"max_position_embeddings":131072,
            "rope_scaling":{scaling}}}"#
        );
        ModelConfig::from_json(&text, Path::new("config.json")).unwrap()
    }

    #[test]
    fn llama3_keeps_high_and_scales_low_frequencies() {
        let plain = global(&cfg("null"));
        let scaled = global(&cfg(
            r#"{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}"#,
        ));
        assert_eq!(plain.inv_freq[0], scaled.inv_freq[0]);
        let last = plain.inv_freq.len() - 1;
        assert!((plain.inv_freq[last] / 8.0 - scaled.inv_freq[last]).abs() < 1e-15);
        // In between: strictly between f/8 and f.
        let mid = plain.inv_freq.iter().zip(&scaled.inv_freq).any(|(p, s)| *s < *p && *s > *p / 8.0);
        assert!(mid);
    }

    #[test]
    fn linear_divides_every_frequency() {
        let plain = global(&cfg("null"));
        let scaled = global(&cfg(r#"{"type":"linear","factor":4.0}"#));
        for (p, s) in plain.inv_freq.iter().zip(&scaled.inv_freq) {
            assert!((p / 4.0 - s).abs() < 1e-18);
        }
    }
}
