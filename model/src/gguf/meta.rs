//! Llama-arch hyper-parameters from GGUF metadata, and the `config.json` they amount to (what
//! both the HF conversion and the native GGUF loader build their [`crate::ModelConfig`] from).

use serde_json::{Value, json};

use super::reader::GgufFile;
use super::vocab::GgufVocab;
use crate::error::{ModelError, Result};

/// Llama-arch hyper-parameters read from GGUF metadata.
#[derive(Debug, Clone)]
pub(crate) struct Hparams {
    pub(crate) n_embd: usize,
    pub(crate) n_ff: usize,
    pub(crate) n_layer: usize,
    pub(crate) n_head: usize,
    pub(crate) n_head_kv: usize,
    pub(crate) head_dim: usize,
    pub(crate) n_ctx: u64,
    pub(crate) rms_eps: f64,
    pub(crate) rope_theta: f64,
    pub(crate) rope_scaling: Option<(String, f64)>,
    pub(crate) vocab_size: usize,
}

/// Shortest decimal that round-trips through f32 (GGUF stores f32: 1e-5, not 9.99999974e-6).
fn f32_clean(v: f64) -> f64 {
    (v as f32).to_string().parse().unwrap_or(v)
}

impl Hparams {
    pub(crate) fn read(g: &GgufFile, vocab_len: usize) -> Result<Self> {
        let arch = g.require_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::UnsupportedArchitecture { path: g.path.clone(), found: arch.to_owned() });
        }
        let u = |k: &str| g.require_u64(&format!("llama.{k}")).map(|v| v as usize);
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
        let rope_scaling = match g.get("llama.rope.scaling.type").and_then(|v| v.as_str()) {
            None | Some("none") => None,
            Some(kind) => Some((kind.to_owned(), g.require_f64("llama.rope.scaling.factor")?)),
        };
        if g.tensor("rope_freqs.weight").is_some() {
            return Err(ModelError::gguf(
                &g.path,
                "llama3 rope scaling (rope_freqs) is not supported in conversion",
            ));
        }
        Ok(Self {
            n_embd,
            n_ff: u("feed_forward_length")?,
            n_layer: u("block_count")?,
            n_head,
            n_head_kv,
            head_dim,
            n_ctx: g.require_u64("llama.context_length")?,
            rms_eps: f32_clean(g.require_f64("llama.attention.layer_norm_rms_epsilon")?),
            rope_theta: f32_clean(g.require_f64("llama.rope.freq_base").unwrap_or(10000.0)),
            rope_scaling,
            vocab_size: u("vocab_size").unwrap_or(vocab_len),
        })
    }

    /// The `config.json` document HF would ship for this model (`tied`: no separate LM head).
    pub(crate) fn config_json(&self, vocab: &GgufVocab, tied: bool, torch_dtype: &str) -> Value {
        let rope_scaling = self
            .rope_scaling
            .as_ref()
            .map(|(kind, factor)| json!({"rope_type": kind, "type": kind, "factor": factor}));
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
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
            "rope_scaling": rope_scaling,
            "tie_word_embeddings": tied,
            "attention_bias": false,
            "mlp_bias": false,
            "bos_token_id": vocab.bos_token_id,
            "eos_token_id": vocab.eos_token_id,
            "pad_token_id": vocab.pad_token_id,
            "torch_dtype": torch_dtype,
        })
    }
}

/// What a native load needs from a GGUF's metadata.
#[derive(Debug, Clone)]
pub struct GgufModelMeta {
    /// The equivalent `config.json`.
    pub config: Value,
    /// `llama.context_length`.
    pub n_ctx: u64,
}

impl GgufModelMeta {
    pub fn read(g: &GgufFile, vocab: &GgufVocab) -> Result<Self> {
        let hp = Hparams::read(g, vocab.tokens.len())?;
        let tied = g.tensor("output.weight").is_none();
        // The weights keep their GGUF types; the name only matters to tools that read it.
        Ok(Self { config: hp.config_json(vocab, tied, "float32"), n_ctx: hp.n_ctx })
    }
}
