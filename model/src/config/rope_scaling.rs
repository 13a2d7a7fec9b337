//! `rope_scaling` of a config.json: the RoPE frequency scalings this engine implements
//! ([`RopeScaling`]), parsed and checked the way `transformers` reads them.

use std::path::Path;

use serde::Deserialize;

use crate::error::{ModelError, Result};

/// The RoPE frequency scalings this engine implements.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (all frequencies divided by `factor`).
    Linear { factor: f64 },
    /// Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
    /// YaRN (Qwen2.5): interpolated low frequencies, extrapolated high ones, a linear ramp
    /// between the correction dimensions of `beta_fast` and `beta_slow` rotations, and cos/sin
    /// multiplied by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        /// Whether the correction range is rounded outwards to whole dimensions.
        truncate: bool,
    },
    /// Phi-3's LongRoPE: every frequency divided by its own factor, from the short list while the
    /// context served fits `original_max_position_embeddings`, else from the long list; cos/sin
    /// multiplied by `attention_factor`.
    LongRope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        original_max_position_embeddings: usize,
        attention_factor: f64,
    },
}

/// The raw `rope_scaling` object (`type` in old configs, `rope_type` in new ones).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct RawRopeScaling {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
    attention_factor: Option<f64>,
    truncate: Option<bool>,
    short_factor: Option<Vec<f64>>,
    long_factor: Option<Vec<f64>>,
}

/// What `rope_scaling` is read against.
pub(super) struct RopeContext {
    pub max_position_embeddings: usize,
    /// Phi-3 keeps it beside `max_position_embeddings` rather than in `rope_scaling`.
    pub original_max_position_embeddings: Option<usize>,
    pub head_dim: usize,
}

/// YaRN's and LongRoPE's default attention factor for a context `factor` times the original.
fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 { 1.0 } else { 0.1 * mscale * factor.ln() + 1.0 }
}

fn positive(v: Option<f64>) -> Option<f64> {
    v.filter(|f| f.is_finite() && *f > 0.0)
}

pub(super) fn parse(rs: RawRopeScaling, ctx: &RopeContext, path: &Path) -> Result<Option<RopeScaling>> {
    let kind = rs.rope_type.clone().or(rs.legacy_type.clone()).unwrap_or_default();
    let bad = |what: &str| ModelError::config(path, format!("rope_scaling {kind:?}: {what}"));
    let factor = || positive(rs.factor).ok_or_else(|| bad("needs a positive `factor`"));
    let max_pos = ctx.max_position_embeddings as f64;
    match kind.as_str() {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear { factor: factor()? })),
        "llama3" => {
            let low = rs.low_freq_factor.unwrap_or(1.0);
            let high = rs.high_freq_factor.unwrap_or(4.0);
            if high.is_nan() || low.is_nan() || high <= low {
                return Err(bad("needs high_freq_factor > low_freq_factor"));
            }
            Ok(Some(RopeScaling::Llama3 {
                factor: factor()?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: rs.original_max_position_embeddings.unwrap_or(max_pos),
            }))
        }
        "yarn" => {
            let factor = factor()?;
            let original = match rs.original_max_position_embeddings {
                None => max_pos,
                Some(o) => positive(Some(o)).ok_or_else(|| bad("original_max_position_embeddings"))?,
            };
            let attention_factor =
                match (rs.attention_factor, positive(rs.mscale), positive(rs.mscale_all_dim)) {
                    (Some(a), ..) => {
                        positive(Some(a)).ok_or_else(|| bad("attention_factor must be positive"))?
                    }
                    (None, Some(m), Some(all)) => yarn_mscale(factor, m) / yarn_mscale(factor, all),
                    _ => yarn_mscale(factor, 1.0),
                };
            let beta_fast = positive(rs.beta_fast).unwrap_or(32.0);
            let beta_slow = positive(rs.beta_slow).unwrap_or(1.0);
            Ok(Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate: rs.truncate.unwrap_or(true),
            }))
        }
        "longrope" | "su" => {
            let half = ctx.head_dim / 2;
            let list = |v: Option<Vec<f64>>, name: &str| match v {
                Some(v) if v.len() == half && v.iter().all(|f| f.is_finite() && *f > 0.0) => Ok(v),
                _ => Err(bad(&format!("`{name}` must list {half} positive factors (head_dim / 2)"))),
            };
            let original = ctx
                .original_max_position_embeddings
                .or(rs.original_max_position_embeddings.map(|o| o as usize))
                .filter(|o| *o > 0)
                .ok_or_else(|| bad("needs original_max_position_embeddings"))?;
            // transformers: the context's growth over the original decides the default.
            let growth = max_pos / original as f64;
            let attention_factor = match rs.attention_factor {
                Some(a) => positive(Some(a)).ok_or_else(|| bad("attention_factor must be positive"))?,
                None if growth <= 1.0 => 1.0,
                None => (1.0 + growth.ln() / (original as f64).ln()).sqrt(),
            };
            Ok(Some(RopeScaling::LongRope {
                short_factor: list(rs.short_factor, "short_factor")?,
                long_factor: list(rs.long_factor, "long_factor")?,
                original_max_position_embeddings: original,
                attention_factor,
            }))
        }
        other => Err(ModelError::config(path, format!("rope_scaling type {other:?} is not supported"))),
    }
}
