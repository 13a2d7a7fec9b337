//! Rotary-embedding frequencies (`inv_freq`), with Llama 3 and linear scaling, exactly as
//! `transformers` computes them; cos/sin are produced per position on demand so a
//! 128K-context model needs no giant table.

use crate::config::{ModelConfig, RopeScaling};

/// Inverse frequencies of one head (`head_dim / 2` of them).
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f64>,
}

impl Rope {
    pub fn new(cfg: &ModelConfig) -> Self {
        let d = cfg.head_dim;
        let mut inv_freq: Vec<f64> =
            (0..d / 2).map(|i| 1.0 / cfg.rope_theta.powf((2 * i) as f64 / d as f64)).collect();
        match cfg.rope_scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => inv_freq.iter_mut().for_each(|f| *f /= factor),
            Some(RopeScaling::Llama3 {
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
        }
        Self { inv_freq }
    }

    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    pub fn half_dim(&self) -> usize {
        self.inv_freq.len()
    }

    /// Fills `cos`, `sin` (each `head_dim / 2` long) for `position`.
    pub fn fill(&self, position: u32, cos: &mut [f32], sin: &mut [f32]) {
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
            let angle = f64::from(position) * f;
            *c = angle.cos() as f32;
            *s = angle.sin() as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
        let plain = Rope::new(&cfg("null"));
        let scaled = Rope::new(&cfg(
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
        let plain = Rope::new(&cfg("null"));
        let scaled = Rope::new(&cfg(r#"{"type":"linear","factor":4.0}"#));
        for (p, s) in plain.inv_freq.iter().zip(&scaled.inv_freq) {
            assert!((p / 4.0 - s).abs() < 1e-18);
        }
    }
}
