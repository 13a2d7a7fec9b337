//! [`Model`]'s loaders: an HF safetensors folder (HF tensor names) or a GGUF (llama.cpp's
//! names, every matrix left in its GGUF type and memory-mapped). Each checks every shape
//! against the config before anything is allocated or used.

use attn_kernels::cpu::quant::{GgmlType, Part, Storage, Weight};

use super::{LayerWeights, Model};
use crate::arch::{LayerMatrix, LayerNorm, RopeStyle};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, GgufTensorInfo};
use crate::weights::SafetensorsFiles;

/// Rows of each matrix of a layer, and its input width: `(rows, cols)` in [`LayerMatrix`] order.
fn matrix_shapes(c: &ModelConfig) -> [(usize, usize); 4] {
    let (h, inter) = (c.hidden_size, c.intermediate_size);
    let q_rows = c.num_attention_heads * c.head_dim;
    [(c.qkv_size(), h), (h, q_rows), (2 * inter, h), (h, inter)]
}

/// Width of a norm's row.
fn norm_width(c: &ModelConfig, n: LayerNorm) -> usize {
    match n {
        LayerNorm::Q | LayerNorm::K => c.head_dim,
        _ => c.hidden_size,
    }
}

/// The matrices whose biases this architecture has.
fn biased(c: &ModelConfig) -> impl Iterator<Item = LayerMatrix> + '_ {
    [(LayerMatrix::Qkv, c.arch.qkv_bias), (LayerMatrix::O, c.arch.o_bias)]
        .into_iter()
        .filter_map(|(m, has)| has.then_some(m))
}

/// HF names of a layer's tensors (under `model.layers.{l}.`).
fn hf_norm_name(n: LayerNorm) -> &'static str {
    match n {
        LayerNorm::Attn => "input_layernorm",
        LayerNorm::Q => "self_attn.q_norm",
        LayerNorm::K => "self_attn.k_norm",
        LayerNorm::AttnOut => "post_attention_layernorm",
        LayerNorm::Ffn => "pre_feedforward_layernorm",
        LayerNorm::FfnOut => "post_feedforward_layernorm",
    }
}

/// The HF tensors a fused matrix is made of: `(name, rows)`.
fn hf_matrix_parts(c: &ModelConfig, m: LayerMatrix) -> Vec<(&'static str, usize)> {
    let (q, kv, inter) =
        (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size);
    match m {
        LayerMatrix::Qkv => vec![("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)],
        LayerMatrix::O => vec![("self_attn.o_proj", c.hidden_size)],
        LayerMatrix::GateUp => vec![("mlp.gate_proj", inter), ("mlp.up_proj", inter)],
        LayerMatrix::Down => vec![("mlp.down_proj", c.hidden_size)],
    }
}

/// The GGUF tensors a fused matrix is made of: `(name, rows)`.
fn gguf_matrix_parts(c: &ModelConfig, m: LayerMatrix) -> Vec<(&'static str, usize)> {
    let (q, kv, inter) =
        (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size);
    match m {
        LayerMatrix::Qkv => vec![("attn_q", q), ("attn_k", kv), ("attn_v", kv)],
        LayerMatrix::O => vec![("attn_output", c.hidden_size)],
        LayerMatrix::GateUp => vec![("ffn_gate", inter), ("ffn_up", inter)],
        LayerMatrix::Down => vec![("ffn_down", c.hidden_size)],
    }
}

fn gguf_norm_name(n: LayerNorm) -> &'static str {
    match n {
        LayerNorm::Attn => "attn_norm",
        LayerNorm::Q => "attn_q_norm",
        LayerNorm::K => "attn_k_norm",
        LayerNorm::AttnOut => "post_attention_norm",
        LayerNorm::Ffn => "ffn_norm",
        LayerNorm::FfnOut => "post_ffw_norm",
    }
}

impl Model {
    /// Builds the model from already-opened checkpoint files, checking every shape. Each
    /// buffer is allocated only after the shapes of the tensors it holds matched the file's
    /// headers (a config claiming 10¹² layers or a 2⁶² vocabulary fails with the tensor that
    /// does not match, not in the allocator), and layers are pushed as they load.
    pub fn from_safetensors(config: ModelConfig, files: &SafetensorsFiles) -> Result<Self> {
        let c = &config;
        let h = c.hidden_size;
        let row = |name: &str, width: usize| -> Result<Weight> {
            Ok(Weight::from_f32(1, width, files.load_f32(name, &[width])?))
        };
        let embed = files.load_weight(&[("model.embed_tokens.weight", c.vocab_size)], h)?;
        let shapes = matrix_shapes(c);
        let mut layers = Vec::new();
        for l in 0..c.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let mut matrices = Vec::with_capacity(4);
            for (m, (_, cols)) in LayerMatrix::ALL.into_iter().zip(shapes) {
                let names: Vec<(String, usize)> = hf_matrix_parts(c, m)
                    .into_iter()
                    .map(|(n, rows)| (format!("{p}.{n}.weight"), rows))
                    .collect();
                let parts: Vec<(&str, usize)> = names.iter().map(|(n, r)| (n.as_str(), *r)).collect();
                matrices.push(files.load_weight(&parts, cols)?);
            }
            let matrices: [Weight; 4] = matrices.try_into().unwrap_or_else(|_| unreachable!("four matrices"));
            let mut layer = LayerWeights::new(matrices);
            for n in c.arch.layer_norms() {
                // Llama's pre-MLP norm is HF's `post_attention_layernorm`; with sandwich norms
                // that name is the attention output's norm instead.
                let name = match n {
                    LayerNorm::Ffn if !c.arch.sandwich_norms => "post_attention_layernorm",
                    n => hf_norm_name(n),
                };
                layer = layer.with_norm(n, row(&format!("{p}.{name}.weight"), norm_width(c, n))?);
            }
            for m in biased(c) {
                let parts = hf_matrix_parts(c, m);
                let width: usize = parts.iter().map(|(_, rows)| rows).sum();
                let mut values = Vec::with_capacity(width);
                for (n, rows) in parts {
                    values.extend(files.load_f32(&format!("{p}.{n}.bias"), &[rows])?);
                }
                layer = layer.with_bias(m, Weight::from_f32(1, width, values));
            }
            layers.push(layer);
        }
        let final_norm = row("model.norm.weight", h)?;
        // Some tied checkpoints still ship `lm_head.weight`; the flag decides.
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(files.load_weight(&[("lm_head.weight", c.vocab_size)], h)?)
        };
        Ok(Self::assemble(config, embed, layers, final_norm, lm_head))
    }

    /// Builds the model from a GGUF with every matrix left in its GGUF type and memory-mapped,
    /// and Llama's Q/K in the file's row order ([`RopeStyle::Interleaved`]). Shapes are checked
    /// against the metadata before anything is used.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let vocab = crate::gguf::GgufVocab::from_gguf(g)?;
        let meta = crate::gguf::GgufModelMeta::read(g, &vocab)?;
        Self::from_gguf_with_config(g, ModelConfig::from_json(&meta.config.to_string(), &g.path)?)
    }

    /// [`Self::from_gguf`] with the config already read from `g`'s metadata (by
    /// [`crate::ModelFolder::from_gguf`]), so the vocabulary is not parsed twice.
    pub(crate) fn from_gguf_with_config(g: &GgufFile, mut config: ModelConfig) -> Result<Self> {
        // llama.cpp's converter permutes Llama's Q/K rows into adjacent rotary pairs.
        config.arch.rope_style = RopeStyle::Interleaved;
        let c = &config;
        let h = c.hidden_size;
        let tensor = |name: &str, shape: &[usize]| -> Result<&GgufTensorInfo> {
            let info = g
                .tensor(name)
                .ok_or_else(|| ModelError::MissingTensor { path: g.path.clone(), tensor: name.to_owned() })?;
            if info.shape() != shape {
                return Err(ModelError::WrongShape {
                    path: g.path.clone(),
                    tensor: name.to_owned(),
                    expected: shape.to_vec(),
                    found: info.shape(),
                });
            }
            Ok(info)
        };
        let part = |name: &str, rows: usize, cols: usize| -> Result<Part> {
            let info = tensor(name, &[rows, cols])?;
            let storage = if info.ggml_type == GgmlType::F32 {
                Storage::F32(g.tensor_f32(info))
            } else {
                g.tensor_storage(info)
            };
            Part::new(info.ggml_type, rows, cols, storage)
                .map_err(|reason| ModelError::gguf(&g.path, format!("tensor `{name}`: {reason}")))
        };
        let matrix = |parts: &[(String, usize)], cols: usize| -> Result<Weight> {
            Ok(Weight::from_parts(
                cols.max(1),
                parts.iter().map(|(n, rows)| part(n, *rows, cols)).collect::<Result<_>>()?,
            ))
        };
        let row = |name: &str, width: usize| -> Result<Weight> {
            Ok(Weight::from_f32(1, width, g.tensor_f32(tensor(name, &[width])?)))
        };
        let embed = matrix(&[("token_embd.weight".to_owned(), c.vocab_size)], h)?;
        let shapes = matrix_shapes(c);
        let mut layers = Vec::new();
        for l in 0..c.num_hidden_layers {
            let p = format!("blk.{l}");
            let mut matrices = Vec::with_capacity(4);
            for (m, (_, cols)) in LayerMatrix::ALL.into_iter().zip(shapes) {
                let parts: Vec<(String, usize)> = gguf_matrix_parts(c, m)
                    .into_iter()
                    .map(|(n, rows)| (format!("{p}.{n}.weight"), rows))
                    .collect();
                matrices.push(matrix(&parts, cols)?);
            }
            let matrices: [Weight; 4] = matrices.try_into().unwrap_or_else(|_| unreachable!("four matrices"));
            let mut layer = LayerWeights::new(matrices);
            for n in c.arch.layer_norms() {
                layer =
                    layer.with_norm(n, row(&format!("{p}.{}.weight", gguf_norm_name(n)), norm_width(c, n))?);
            }
            for m in biased(c) {
                let parts = gguf_matrix_parts(c, m);
                let width: usize = parts.iter().map(|(_, rows)| rows).sum();
                let mut values = Vec::with_capacity(width);
                for (n, rows) in parts {
                    values.extend(g.tensor_f32(tensor(&format!("{p}.{n}.bias"), &[rows])?));
                }
                layer = layer.with_bias(m, Weight::from_f32(1, width, values));
            }
            layers.push(layer);
        }
        let final_norm = row("output_norm.weight", h)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(matrix(&[("output.weight".to_owned(), c.vocab_size)], h)?)
        };
        Ok(Self::assemble(config, embed, layers, final_norm, lm_head))
    }
}
