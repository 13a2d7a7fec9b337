//! A decoder's hyper-parameters from GGUF metadata, and the `config.json` they amount to (what
//! both the HF conversion and the native GGUF loader build their [`crate::ModelConfig`] from).

use std::path::Path;

use serde_json::{Value, json};

use super::reader::GgufFile;
use super::vocab::GgufVocab;
use crate::arch::{Family, RopeStyle};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// A decoder's hyper-parameters read from GGUF metadata (keys under `{general.architecture}.`).
#[derive(Debug, Clone)]
pub(crate) struct Hparams {
    pub(crate) family: Family,
    pub(crate) n_embd: usize,
    pub(crate) n_ff: usize,
    pub(crate) n_layer: usize,
    pub(crate) n_head: usize,
    pub(crate) n_head_kv: usize,
    pub(crate) head_dim: usize,
    pub(crate) n_ctx: u64,
    pub(crate) rms_eps: f64,
    pub(crate) rope_theta: f64,
    /// The config.json `rope_scaling` object these keys and tensors amount to.
    pub(crate) rope_scaling: Value,
    pub(crate) vocab_size: usize,
    /// The family's own config.json fields (window, Gemma's scalars, …).
    pub(crate) extra: serde_json::Map<String, Value>,
}

/// Shortest decimal that round-trips through f32 (GGUF stores f32: 1e-5, not 9.99999974e-6).
fn f32_clean(v: f64) -> f64 {
    (v as f32).to_string().parse().unwrap_or(v)
}

/// A 1-D f32 tensor of per-frequency divisors (`rope_freqs`, `rope_factors_*`), if present.
fn rope_factors(g: &GgufFile, name: &str, half: usize) -> Result<Option<Vec<f64>>> {
    let Some(info) = g.tensor(name) else { return Ok(None) };
    if info.shape() != [half] {
        return Err(ModelError::WrongShape {
            path: g.path.clone(),
            tensor: name.to_owned(),
            expected: vec![half],
            found: info.shape(),
        });
    }
    Ok(Some(g.tensor_f32(info).into_iter().map(f64::from).collect()))
}

impl Hparams {
    pub(crate) fn read(g: &GgufFile, vocab_len: usize) -> Result<Self> {
        let arch = g.require_str("general.architecture")?;
        let family = Family::from_gguf_arch(arch).ok_or_else(|| ModelError::UnsupportedArchitecture {
            path: g.path.clone(),
            found: arch.to_owned(),
        })?;
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| g.require_u64(&key(k)).map(|v| v as usize);
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let n_head_kv = u("attention.head_count_kv").unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::gguf(&g.path, format!("bad head counts {n_head}/{n_head_kv}")));
        }
        let head_dim = u("attention.key_length").unwrap_or(n_embd / n_head);
        if let Ok(rot) = u("rope.dimension_count")
            && rot != head_dim
        {
            return Err(ModelError::gguf(
                &g.path,
                format!("partial rotary ({rot} of {head_dim}) is not supported"),
            ));
        }
        let n_ctx = g.require_u64(&key("context_length"))?;
        let rope_scaling = Self::rope_scaling(g, arch, head_dim / 2, n_ctx)?;
        let mut extra = serde_json::Map::new();
        // 0 is the converter's "no window" (Phi-3 with `sliding_window: null`).
        if let Ok(w) = u("attention.sliding_window")
            && w > 0
        {
            extra.insert("sliding_window".into(), json!(w));
        }
        match family {
            Family::Gemma3 => {
                // Not in the file: llama.cpp's constants for Gemma 3 (its 27B aside).
                extra.insert("query_pre_attn_scalar".into(), json!(head_dim));
                extra.insert("rope_local_base_freq".into(), json!(10_000.0));
                extra.insert("sliding_window_pattern".into(), json!(6));
                extra.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
            }
            Family::Phi3 => {
                if let Ok(orig) = u("rope.scaling.original_context_length") {
                    extra.insert("original_max_position_embeddings".into(), json!(orig));
                }
            }
            _ => {}
        }
        Ok(Self {
            family,
            n_embd,
            n_ff: u("feed_forward_length")?,
            n_layer: u("block_count")?,
            n_head,
            n_head_kv,
            head_dim,
            n_ctx,
            rms_eps: f32_clean(g.require_f64(&key("attention.layer_norm_rms_epsilon"))?),
            rope_theta: f32_clean(g.require_f64(&key("rope.freq_base")).unwrap_or(10000.0)),
            rope_scaling,
            vocab_size: u("vocab_size").unwrap_or(vocab_len),
            extra,
        })
    }

    /// `rope.scaling.*` keys, or per-frequency factor tensors (Llama 3's `rope_freqs`, Phi-3's
    /// `rope_factors_short/long`), as a config.json `rope_scaling`.
    fn rope_scaling(g: &GgufFile, arch: &str, half: usize, n_ctx: u64) -> Result<Value> {
        let key = |k: &str| format!("{arch}.rope.scaling.{k}");
        let short = rope_factors(g, "rope_factors_short.weight", half)?;
        let long = rope_factors(g, "rope_factors_long.weight", half)?;
        let freqs = rope_factors(g, "rope_freqs.weight", half)?;
        if let Some(short) = short.clone().or(freqs.clone()) {
            // One divisor per frequency: LongRoPE's form (with one list when there is one).
            let original = g.get(&key("original_context_length")).and_then(|v| v.as_u64()).unwrap_or(n_ctx);
            let attn_factor = g.get(&key("attn_factor")).and_then(|v| v.as_f64()).map(f32_clean);
            let long = long.or(freqs).unwrap_or_else(|| short.clone());
            return Ok(json!({"rope_type": "longrope", "short_factor": short, "long_factor": long,
                "original_max_position_embeddings": original, "attention_factor": attn_factor.unwrap_or(1.0)}));
        }
        Ok(match g.get(&key("type")).and_then(|v| v.as_str()) {
            None | Some("none") => Value::Null,
            Some("yarn") => json!({"rope_type": "yarn", "factor": g.require_f64(&key("factor"))?,
                "original_max_position_embeddings": g.require_u64(&key("original_context_length"))?}),
            Some(kind) => json!({"rope_type": kind, "type": kind, "factor": g.require_f64(&key("factor"))?}),
        })
    }

    /// The `config.json` document HF would ship for this model (`tied`: no separate LM head).
    pub(crate) fn config_json(&self, vocab: &GgufVocab, tied: bool, torch_dtype: &str) -> Value {
        let mut config = json!({
            "architectures": [self.family.hf_class()],
            "model_type": self.family.model_types()[0],
            "hidden_act": "silu",
            "hidden_size": self.n_embd,
            "intermediate_size": self.n_ff,
            "num_hidden_layers": self.n_layer,
            "num_attention_heads": self.n_head,
            "num_key_value_heads": self.n_head_kv,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.n_ctx,
            "rms_norm_eps": self.rms_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": tied,
            "attention_bias": false,
            "mlp_bias": false,
            "bos_token_id": vocab.bos_token_id,
            "eos_token_id": vocab.eos_token_id,
            "pad_token_id": vocab.pad_token_id,
            "torch_dtype": torch_dtype,
        });
        if let Some(obj) = config.as_object_mut() {
            obj.extend(self.extra.clone());
        }
        config
    }
}

/// What a native load needs from a GGUF's metadata.
#[derive(Debug, Clone)]
pub struct GgufModelMeta {
    /// The equivalent `config.json`.
    pub config: Value,
    /// `{arch}.context_length`.
    pub n_ctx: u64,
}

impl GgufModelMeta {
    pub fn read(g: &GgufFile, vocab: &GgufVocab) -> Result<Self> {
        let hp = Hparams::read(g, vocab.tokens.len())?;
        let tied = g.tensor("output.weight").is_none();
        // The weights keep their GGUF types; the name only matters to tools that read it.
        Ok(Self { config: hp.config_json(vocab, tied, "float32"), n_ctx: hp.n_ctx })
    }

    /// The model config of the file's tensors as llama.cpp's converter wrote them: Llama's Q/K
    /// rows permuted into adjacent rotary pairs, Gemma's norm weights stored as `1 + w`.
    pub fn model_config(&self, path: &Path) -> Result<ModelConfig> {
        let mut config = ModelConfig::from_json(&self.config.to_string(), path)?;
        match config.arch.family {
            Family::Llama | Family::Mistral => config.arch.rope_style = RopeStyle::Interleaved,
            Family::Gemma3 => config.arch.norm_weight_offset = 0.0,
            Family::Qwen2 | Family::Qwen3 | Family::Phi3 => {}
        }
        Ok(config)
    }
}
