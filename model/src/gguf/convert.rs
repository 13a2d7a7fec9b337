//! GGUF (llama architecture) → Hugging Face folder: dequantized weights under HF names with
//! Q/K rows un-permuted back to rotate-half RoPE order, `config.json` from the metadata,
//! `tokenizer.json` / `tokenizer_config.json` rebuilt from the vocabulary, and
//! `generation_config.json`.

use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use quant_kernels::ggml::dequantize;
use safetensors::{Dtype, View};
use serde_json::json;

use super::meta::Hparams;
use super::reader::{GgufFile, GgufTensorInfo};
use super::vocab::GgufVocab;
use crate::error::{ModelError, Result};

/// Storage dtype of the written `model.safetensors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputDtype {
    /// Exact: every dequantized value is representable.
    #[default]
    F32,
    /// Half the size; rounds the dequantized values.
    Bf16,
}

/// What a conversion wrote.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub n_tensors: usize,
    pub n_parameters: usize,
}

/// HF name of a GGUF tensor, or `None` for tensors HF does not store.
fn hf_name(gguf: &str) -> Option<String> {
    let simple = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(s) = simple {
        return Some(s.to_owned());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf_leaf = match leaf {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf_leaf}"))
}

/// Undoes llama.cpp's Q/K row permutation for `n_head` heads: GGUF row `h·d + 2i + s`
/// holds HF row `h·d + s·d/2 + i` (`d` = rows per head).
pub fn unpermute_qk(w: &[f32], n_head: usize, in_dim: usize) -> Vec<f32> {
    let rows = w.len() / in_dim;
    let d = rows / n_head;
    let mut out = vec![0.0f32; w.len()];
    for h in 0..n_head {
        for i in 0..d / 2 {
            for s in 0..2 {
                let src = (h * d + 2 * i + s) * in_dim;
                let dst = (h * d + s * d / 2 + i) * in_dim;
                out[dst..dst + in_dim].copy_from_slice(&w[src..src + in_dim]);
            }
        }
    }
    out
}

/// A tensor dequantized only when the safetensors writer asks for its bytes, so the whole
/// model is never held in memory twice.
struct LazyTensor<'a> {
    gguf: &'a GgufFile,
    info: &'a GgufTensorInfo,
    shape: Vec<usize>,
    /// Heads to un-permute for (Q/K projections).
    unpermute_heads: Option<usize>,
    dtype: OutputDtype,
    done: &'a AtomicUsize,
    progress: &'a (dyn Fn(usize, usize) + Sync),
    total: usize,
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        match self.dtype {
            OutputDtype::F32 => Dtype::F32,
            OutputDtype::Bf16 => Dtype::BF16,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut values = vec![0.0f32; self.info.n_elements()];
        dequantize(self.info.ggml_type, self.gguf.tensor_bytes(self.info), &mut values);
        if let Some(h) = self.unpermute_heads {
            values = unpermute_qk(&values, h, self.shape[1]);
        }
        let bytes = match self.dtype {
            OutputDtype::F32 => bytemuck::cast_slice::<f32, u8>(&values).to_vec(),
            OutputDtype::Bf16 => values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
        };
        let n = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        (self.progress)(n, self.total);
        Cow::Owned(bytes)
    }

    fn data_len(&self) -> usize {
        let elem = match self.dtype {
            OutputDtype::F32 => 4,
            OutputDtype::Bf16 => 2,
        };
        self.info.n_elements() * elem
    }
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| ModelError::config(path, e.to_string()))?;
    std::fs::write(path, text + "\n").map_err(|e| ModelError::io(path, e))
}

/// Converts `gguf_path` into an HF folder at `out_dir` (created if needed).
/// `progress(done, total)` is called after each tensor is written.
pub fn convert_gguf_to_hf(
    gguf_path: &Path,
    out_dir: &Path,
    dtype: OutputDtype,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<ConvertSummary> {
    let g = GgufFile::open(gguf_path)?;
    let vocab = GgufVocab::from_gguf(&g)?;
    let hp = Hparams::read(&g, vocab.tokens.len())?;
    // Only Llama's tensors are rewritten (Q/K rows un-permuted); other families load natively.
    if hp.family != crate::arch::Family::Llama {
        return Err(ModelError::gguf(
            gguf_path,
            format!(
                "converting {} to an HF folder is not supported; load the GGUF directly",
                hp.family.hf_class()
            ),
        ));
    }
    std::fs::create_dir_all(out_dir).map_err(|e| ModelError::io(out_dir, e))?;

    let tied = g.tensor("output.weight").is_none();
    let tensors: Vec<(String, &GgufTensorInfo)> =
        g.tensors.iter().filter_map(|t| hf_name(&t.name).map(|n| (n, t))).collect();
    for (name, info) in &tensors {
        let shape = info.shape();
        let bad_qk = (name.ends_with("q_proj.weight") && shape.first() != Some(&(hp.n_head * hp.head_dim)))
            || (name.ends_with("k_proj.weight") && shape.first() != Some(&(hp.n_head_kv * hp.head_dim)));
        if bad_qk || (name.contains("_proj") && shape.len() != 2) {
            return Err(ModelError::WrongShape {
                path: gguf_path.to_path_buf(),
                tensor: info.name.clone(),
                expected: vec![],
                found: shape,
            });
        }
    }
    let done = AtomicUsize::new(0);
    let total = tensors.len();
    let views: Vec<(String, LazyTensor<'_>)> = tensors
        .iter()
        .map(|(name, info)| {
            let unpermute_heads = if name.ends_with("q_proj.weight") {
                Some(hp.n_head)
            } else if name.ends_with("k_proj.weight") {
                Some(hp.n_head_kv)
            } else {
                None
            };
            let view = LazyTensor {
                gguf: &g,
                info,
                shape: info.shape(),
                unpermute_heads,
                dtype,
                done: &done,
                progress,
                total,
            };
            (name.clone(), view)
        })
        .collect();
    let n_parameters = tensors.iter().map(|(_, i)| i.n_elements()).sum();
    let st_path = out_dir.join("model.safetensors");
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_owned(), "pt".to_owned());
    safetensors::serialize_to_file(views, Some(meta), &st_path)
        .map_err(|e| ModelError::BadSafetensors { path: st_path.clone(), reason: e.to_string() })?;

    let torch_dtype = match dtype {
        OutputDtype::F32 => "float32",
        OutputDtype::Bf16 => "bfloat16",
    };
    let config = hp.config_json(&vocab, tied, torch_dtype);
    write_json(&out_dir.join("config.json"), &config)?;
    write_json(
        &out_dir.join("generation_config.json"),
        &json!({"bos_token_id": vocab.bos_token_id, "eos_token_id": vocab.eos_token_id, "pad_token_id": vocab.pad_token_id}),
    )?;
    let tok_path = out_dir.join("tokenizer.json");
    write_json(
        &tok_path,
        &vocab
            .tokenizer_json()
            .map_err(|e| ModelError::Tokenizer { path: tok_path.clone(), reason: e.to_string() })?,
    )?;
    write_json(&out_dir.join("tokenizer_config.json"), &vocab.tokenizer_config_json(hp.n_ctx))?;
    Ok(ConvertSummary { n_tensors: total, n_parameters })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's forward permutation, as in `convert_hf_to_gguf.py`:
    /// `w.reshape(h, 2, d/2, in).swapaxes(1, 2).reshape(out, in)`.
    fn permute(w: &[f32], n_head: usize, in_dim: usize) -> Vec<f32> {
        let d = w.len() / in_dim / n_head;
        let mut out = vec![0.0; w.len()];
        for h in 0..n_head {
            for s in 0..2 {
                for i in 0..d / 2 {
                    let src = (h * d + s * d / 2 + i) * in_dim;
                    let dst = (h * d + 2 * i + s) * in_dim;
                    out[dst..dst + in_dim].copy_from_slice(&w[src..src + in_dim]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (heads, d, in_dim) = (3, 8, 5);
        let w: Vec<f32> = (0..heads * d * in_dim).map(|i| i as f32).collect();
        assert_eq!(unpermute_qk(&permute(&w, heads, in_dim), heads, in_dim), w);
        assert_ne!(permute(&w, heads, in_dim), w);
    }

    #[test]
    fn names_map_to_hf() {
        assert_eq!(
            hf_name("blk.12.ffn_gate.weight").as_deref(),
            Some("model.layers.12.mlp.gate_proj.weight")
        );
        assert_eq!(hf_name("token_embd.weight").as_deref(), Some("model.embed_tokens.weight"));
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }
}
