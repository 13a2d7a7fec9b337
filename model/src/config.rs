//! `config.json` of a Hugging Face folder ([`ModelConfig`], with its [`Architecture`]), parsed
//! and validated once so the forward pass can trust every dimension it reads.

use std::path::Path;

use kv_cache::{BlockShape, DType};
use serde::{Deserialize, Serialize};

use crate::arch::Architecture;
use crate::error::{ModelError, Result};

/// One token id or several (`eos_token_id` is a list in Llama 3 configs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            Self::One(id) => vec![*id],
            Self::Many(ids) => ids.clone(),
        }
    }
}

/// The RoPE frequency scalings this engine implements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (all frequencies divided by `factor`).
    Linear { factor: f64 },
    /// Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
}

/// The raw `rope_scaling` object (`type` in old configs, `rope_type` in new ones).
#[derive(Debug, Clone, Deserialize)]
struct RawRopeScaling {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
struct RawConfig {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_rms_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    rope_scaling: Option<RawRopeScaling>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    bos_token_id: Option<TokenIds>,
    eos_token_id: Option<TokenIds>,
    hidden_act: Option<String>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
}

fn default_rms_eps() -> f64 {
    1e-6
}
fn default_rope_theta() -> f64 {
    10000.0
}
fn default_max_pos() -> usize {
    2048
}

/// A validated model configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// What the forward does differently for this family.
    pub arch: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        Self::from_json(&text, path)
    }

    /// Parses `config.json` text; `path` is only used in error messages.
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ModelError::config(path, e.to_string()))?;
        check_architecture(&value, path)?;
        let raw: RawConfig =
            serde_json::from_value(value).map_err(|e| ModelError::config(path, e.to_string()))?;
        Self::validate(raw, path)
    }

    fn validate(raw: RawConfig, path: &Path) -> Result<Self> {
        let bad = |reason: String| Err(ModelError::config(path, reason));
        if let Some(act) = &raw.hidden_act
            && act != "silu"
        {
            return bad(format!("hidden_act {act:?} is not supported (only silu)"));
        }
        if raw.mlp_bias {
            return bad("mlp_bias is not supported".into());
        }
        for (name, v) in [
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", raw.num_attention_heads),
            ("vocab_size", raw.vocab_size),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        let kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if kv_heads == 0 || !raw.num_attention_heads.is_multiple_of(kv_heads) {
            return bad(format!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({kv_heads})",
                raw.num_attention_heads
            ));
        }
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None if raw.hidden_size.is_multiple_of(raw.num_attention_heads) => {
                raw.hidden_size / raw.num_attention_heads
            }
            None => {
                return bad(format!(
                    "hidden_size ({}) is not divisible by num_attention_heads ({})",
                    raw.hidden_size, raw.num_attention_heads
                ));
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return bad(format!("head_dim ({head_dim}) must be even and positive"));
        }
        if raw.rms_norm_eps.is_nan()
            || raw.rms_norm_eps <= 0.0
            || raw.rope_theta.is_nan()
            || raw.rope_theta <= 0.0
        {
            return bad("rms_norm_eps and rope_theta must be positive".into());
        }
        let rope_scaling = match raw.rope_scaling {
            None => None,
            Some(rs) => parse_rope_scaling(rs, raw.max_position_embeddings, path)?,
        };
        if raw.max_position_embeddings == 0 {
            return bad("max_position_embeddings must be positive".into());
        }
        let config = Self {
            arch: Architecture::llama(head_dim, raw.attention_bias),
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads: kv_heads,
            head_dim,
            vocab_size: raw.vocab_size,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta: raw.rope_theta,
            rope_scaling,
            tie_word_embeddings: raw.tie_word_embeddings,
            max_position_embeddings: raw.max_position_embeddings,
            bos_token_id: raw.bos_token_id.and_then(|ids| ids.to_vec().first().copied()),
            eos_token_ids: raw.eos_token_id.map(|ids| ids.to_vec()).unwrap_or_default(),
        };
        if config.checked_num_parameters().is_none() {
            return bad(format!(
                "sizes overflow: hidden_size {}, intermediate_size {}, heads {}/{}, head_dim {head_dim}, \
                 vocab_size {}, num_hidden_layers {} give more parameters than a usize holds",
                config.hidden_size,
                config.intermediate_size,
                config.num_attention_heads,
                config.num_key_value_heads,
                config.vocab_size,
                config.num_hidden_layers
            ));
        }
        Ok(config)
    }

    /// The parameter count, with every product the loader and the forward pass derive from
    /// the config checked: `None` when one overflows, or when their f32 bytes would (such a
    /// config is refused by `validate`, so the unchecked accessors are exact for every
    /// validated config).
    fn checked_num_parameters(&self) -> Option<usize> {
        let h = self.hidden_size;
        let q = self.num_attention_heads.checked_mul(self.head_dim)?;
        let qkv = self.num_key_value_heads.checked_mul(2)?.checked_add(self.num_attention_heads)?;
        let qkv = qkv.checked_mul(self.head_dim)?;
        let per_layer = h
            .checked_mul(qkv)?
            .checked_add(q.checked_mul(h)?)?
            .checked_add(h.checked_mul(self.intermediate_size)?.checked_mul(3)?)?
            .checked_add(h.checked_mul(2)?)?;
        let embed = self.vocab_size.checked_mul(h)?;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        let total = self
            .num_hidden_layers
            .checked_mul(per_layer)?
            .checked_add(embed)?
            .checked_add(h)?
            .checked_add(head)?;
        // Their f32 bytes must be addressable too.
        total.checked_mul(4).map(|_| total)
    }

    /// The KV cache block of this model: `block_size` tokens of every layer's K and V in `dtype`.
    pub fn block_shape(&self, block_size: usize, dtype: DType) -> BlockShape {
        BlockShape {
            block_size,
            num_layers: self.num_hidden_layers,
            num_kv_heads: self.num_key_value_heads,
            head_size: self.head_dim,
            dtype,
        }
    }

    /// Width of the fused Q, K, V projection output.
    pub fn qkv_size(&self) -> usize {
        (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
    }

    /// Number of parameters (embedding counted once when tied).
    pub fn num_parameters(&self) -> usize {
        // `validate` refused every config for which this overflows.
        self.checked_num_parameters().unwrap_or(usize::MAX)
    }
}

fn check_architecture(value: &serde_json::Value, path: &Path) -> Result<()> {
    let archs: Vec<String> = value
        .get("architectures")
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let model_type = value.get("model_type").and_then(|m| m.as_str()).map(str::to_owned);
    let arch_ok = archs.is_empty() || archs.iter().any(|a| a == "LlamaForCausalLM");
    let type_ok = model_type.as_deref().is_none_or(|t| t == "llama");
    if archs.is_empty() && model_type.is_none() {
        return Err(ModelError::config(path, "neither `architectures` nor `model_type` is set"));
    }
    if !arch_ok || !type_ok {
        let found = archs.first().cloned().or(model_type).unwrap_or_default();
        return Err(ModelError::UnsupportedArchitecture { path: path.to_path_buf(), found });
    }
    Ok(())
}

fn parse_rope_scaling(rs: RawRopeScaling, max_pos: usize, path: &Path) -> Result<Option<RopeScaling>> {
    let kind = rs.rope_type.or(rs.legacy_type).unwrap_or_default();
    let factor = |rs_factor: Option<f64>| match rs_factor {
        Some(f) if f > 0.0 => Ok(f),
        _ => Err(ModelError::config(path, format!("rope_scaling {kind:?} needs a positive `factor`"))),
    };
    match kind.as_str() {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear { factor: factor(rs.factor)? })),
        "llama3" => {
            let low = rs.low_freq_factor.unwrap_or(1.0);
            let high = rs.high_freq_factor.unwrap_or(4.0);
            if high.is_nan() || low.is_nan() || high <= low {
                return Err(ModelError::config(
                    path,
                    "rope_scaling llama3 needs high_freq_factor > low_freq_factor",
                ));
            }
            Ok(Some(RopeScaling::Llama3 {
                factor: factor(rs.factor)?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: rs
                    .original_max_position_embeddings
                    .unwrap_or(max_pos as f64),
            }))
        }
        other => Err(ModelError::config(path, format!("rope_scaling type {other:?} is not supported"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> serde_json::Value {
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "eos_token_id": [2, 3], "bos_token_id": 1
        })
    }

    fn parse(v: serde_json::Value) -> Result<ModelConfig> {
        ModelConfig::from_json(&v.to_string(), Path::new("cfg/config.json"))
    }

    #[test]
    fn parses_defaults_and_lists() {
        let c = parse(base()).unwrap();
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.eos_token_ids, vec![2, 3]);
        assert_eq!(c.bos_token_id, Some(1));
        assert_eq!(c.qkv_size(), (4 + 4) * 16);
        assert!(c.rope_scaling.is_none());
    }

    #[test]
    fn parses_rope_scalings() {
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        assert!(matches!(parse(v).unwrap().rope_scaling, Some(RopeScaling::Llama3 { factor: 8.0, .. })));
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0});
        assert_eq!(parse(v).unwrap().rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 2.0});
        let err = parse(v).unwrap_err().to_string();
        assert!(err.contains("cfg/config.json") && err.contains("yarn"), "{err}");
    }

    #[test]
    fn absurd_sizes_are_config_errors_not_overflows() {
        for (field, value) in [
            ("head_dim", serde_json::json!(1u64 << 60)),
            ("vocab_size", serde_json::json!(1u64 << 62)),
            ("hidden_size", serde_json::json!(u64::MAX)),
            ("intermediate_size", serde_json::json!(1u64 << 62)),
            ("num_hidden_layers", serde_json::json!(1u64 << 62)),
        ] {
            let mut v = base();
            v[field] = value;
            if field == "hidden_size" {
                v["head_dim"] = serde_json::json!(16);
            }
            let err = parse(v).unwrap_err().to_string();
            assert!(err.contains("cfg/config.json") && err.contains("overflow"), "{field}: {err}");
        }
        let mut v = base();
        v["max_position_embeddings"] = serde_json::json!(0);
        assert!(parse(v).is_err());
    }

    #[test]
    fn rejects_bad_head_counts() {
        let mut v = base();
        v["num_key_value_heads"] = serde_json::json!(3);
        let err = parse(v).unwrap_err().to_string();
        assert!(err.contains("multiple of num_key_value_heads"), "{err}");
    }
}
