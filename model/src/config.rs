//! `config.json` of a Hugging Face folder ([`ModelConfig`], with its [`Architecture`] and
//! per-layer attention), parsed and validated once so the forward pass can trust every
//! dimension it reads.

mod family;
mod rope_scaling;

use std::path::Path;

use kv_cache::{BlockShape, DType, KvLayout};
use serde::{Deserialize, Serialize};

use crate::arch::{Architecture, LayerAttention};
use crate::error::{ModelError, Result};
pub use rope_scaling::RopeScaling;
use rope_scaling::{RawRopeScaling, RopeContext};

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
    /// Absent when it equals the family's default: `save_pretrained` leaves out values equal to
    /// `PretrainedConfig`'s own default (true), so a Gemma 3 config.json has none.
    tie_word_embeddings: Option<bool>,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    bos_token_id: Option<TokenIds>,
    eos_token_id: Option<TokenIds>,
    hidden_act: Option<String>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    /// Gemma's name for `hidden_act`.
    hidden_activation: Option<String>,
    query_pre_attn_scalar: Option<f64>,
    sliding_window: Option<usize>,
    #[serde(default)]
    use_sliding_window: bool,
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    rope_local_base_freq: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    /// Phi-3 keeps LongRoPE's original context here rather than in `rope_scaling`.
    original_max_position_embeddings: Option<usize>,
    partial_rotary_factor: Option<f64>,
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
    /// The base of [`crate::arch::RopeKind::Global`] layers' rotations (scaled by `rope_scaling`).
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    /// The base of [`crate::arch::RopeKind::Local`] layers' rotations (Gemma 3), never scaled.
    pub local_rope_theta: f64,
    /// How each layer attends (one entry a layer).
    pub layer_attention: Vec<LayerAttention>,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// The most layers a config may declare.
const MAX_LAYERS: usize = 1 << 16;

impl ModelConfig {
    /// The hybrid KV layout of the layers' attention kinds (one group without windows).
    pub fn hybrid_kv_layout(&self) -> KvLayout {
        let windows: Vec<Option<usize>> = self.layer_attention.iter().map(|l| l.sliding_window).collect();
        KvLayout::hybrid(&windows)
    }

    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        Self::from_json(&text, path)
    }

    /// Parses `config.json` text; `path` is only used in error messages.
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ModelError::config(path, e.to_string()))?;
        let family = family::detect(&value, path)?;
        let raw: RawConfig =
            serde_json::from_value(value).map_err(|e| ModelError::config(path, e.to_string()))?;
        Self::validate(family, raw, path)
    }

    fn validate(family: crate::arch::Family, raw: RawConfig, path: &Path) -> Result<Self> {
        let bad = |reason: String| Err(ModelError::config(path, reason));
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
        // Layers are listed one by one (their attention kinds), so their count is bounded by
        // more than overflow; the deepest open models have a few hundred.
        if raw.num_hidden_layers > MAX_LAYERS {
            return bad(format!("num_hidden_layers ({}) is more than {MAX_LAYERS}", raw.num_hidden_layers));
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
        let local_rope_theta = raw.rope_local_base_freq.unwrap_or(10_000.0);
        if [raw.rms_norm_eps, raw.rope_theta, local_rope_theta].iter().any(|v| v.is_nan() || *v <= 0.0) {
            return bad("rms_norm_eps, rope_theta and rope_local_base_freq must be positive".into());
        }
        if raw.max_position_embeddings == 0 {
            return bad("max_position_embeddings must be positive".into());
        }
        let rope_context = RopeContext {
            max_position_embeddings: raw.max_position_embeddings,
            original_max_position_embeddings: raw.original_max_position_embeddings,
            head_dim,
        };
        let rope_scaling = match raw.rope_scaling.clone() {
            None => None,
            Some(rs) => rope_scaling::parse(rs, &rope_context, path)?,
        };
        let arch: Architecture = family::architecture(family, &raw, head_dim, path)?;
        let mut config = Self {
            arch,
            local_rope_theta,
            // Filled once the sizes are known not to overflow (it holds one entry per layer).
            layer_attention: Vec::new(),
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
            // transformers' defaults: tied for Gemma 3, untied for the other families.
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(family == crate::arch::Family::Gemma3),
            max_position_embeddings: raw.max_position_embeddings,
            bos_token_id: raw.bos_token_id.as_ref().and_then(|ids| ids.to_vec().first().copied()),
            eos_token_ids: raw.eos_token_id.as_ref().map(|ids| ids.to_vec()).unwrap_or_default(),
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
        config.layer_attention = family::layer_attention(family, &raw, path)?;
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

    /// The longest sequence full (causal) attention computes exactly: `max_position_embeddings`,
    /// or the smallest sliding window when a layer has one (within its window, windowed
    /// attention is full attention). What a device without windowed attention serves.
    pub fn max_full_attention_context(&self) -> usize {
        self.layer_attention
            .iter()
            .filter_map(|l| l.sliding_window)
            .fold(self.max_position_embeddings, usize::min)
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
        v["rope_scaling"] = serde_json::json!({"type": "dynamic", "factor": 2.0});
        let err = parse(v).unwrap_err().to_string();
        assert!(err.contains("cfg/config.json") && err.contains("dynamic"), "{err}");
    }

    #[test]
    fn absurd_sizes_are_config_errors_not_overflows() {
        for (field, value) in [
            ("head_dim", serde_json::json!(1u64 << 60)),
            ("vocab_size", serde_json::json!(1u64 << 62)),
            ("hidden_size", serde_json::json!(u64::MAX)),
            ("intermediate_size", serde_json::json!(1u64 << 62)),
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
        v["num_hidden_layers"] = serde_json::json!(1u64 << 62);
        let err = parse(v).unwrap_err().to_string();
        assert!(err.contains("num_hidden_layers") && err.contains("more than"), "{err}");
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
