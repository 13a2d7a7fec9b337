//! [`Model`]'s loader, written once over a [`Checkpoint`]: safetensors files (HF tensor names) or a
//! GGUF (llama.cpp's names, every matrix left in its GGUF type and memory-mapped), named side by
//! side in [`Names`]. Every shape is checked against the config before anything is allocated or used.

use attn_kernels::cpu::quant::{GgmlType, Part, Storage, Weight};

use super::{LayerWeights, Model};
use crate::arch::{LayerMatrix, LayerNorm, RopeStyle};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, GgufTensorInfo};
use crate::weights::SafetensorsFiles;

/// The input width of each matrix of a layer, in [`LayerMatrix`] order.
fn matrix_inputs(c: &ModelConfig) -> [usize; 4] {
    let h = c.hidden_size;
    [h, c.num_attention_heads * c.head_dim, h, c.intermediate_size]
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

/// The tensor names of a checkpoint format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Names {
    /// Hugging Face's, in safetensors files.
    Hf,
    /// llama.cpp's, in a GGUF.
    Gguf,
}

impl Names {
    /// Embedding, final norm and LM head.
    fn outer(self) -> [&'static str; 3] {
        match self {
            Names::Hf => ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"],
            Names::Gguf => ["token_embd.weight", "output_norm.weight", "output.weight"],
        }
    }

    fn layer_prefix(self, l: usize) -> String {
        match self {
            Names::Hf => format!("model.layers.{l}"),
            Names::Gguf => format!("blk.{l}"),
        }
    }

    /// The tensors (under the layer's prefix, without `.weight`) a fused matrix is made of.
    fn matrix_parts(self, m: LayerMatrix) -> &'static [&'static str] {
        use LayerMatrix::*;
        match (self, m) {
            (Names::Hf, Qkv) => &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            (Names::Hf, O) => &["self_attn.o_proj"],
            (Names::Hf, GateUp) => &["mlp.gate_proj", "mlp.up_proj"],
            (Names::Hf, Down) => &["mlp.down_proj"],
            (Names::Gguf, Qkv) => &["attn_q", "attn_k", "attn_v"],
            (Names::Gguf, O) => &["attn_output"],
            (Names::Gguf, GateUp) => &["ffn_gate", "ffn_up"],
            (Names::Gguf, Down) => &["ffn_down"],
        }
    }

    fn norm(self, n: LayerNorm, sandwich: bool) -> &'static str {
        use LayerNorm::*;
        match (self, n) {
            (Names::Hf, Attn) => "input_layernorm",
            (Names::Hf, Q) => "self_attn.q_norm",
            (Names::Hf, K) => "self_attn.k_norm",
            (Names::Hf, AttnOut) => "post_attention_layernorm",
            // Llama's pre-MLP norm is HF's `post_attention_layernorm`; with sandwich norms that
            // name is the attention output's norm instead.
            (Names::Hf, Ffn) if !sandwich => "post_attention_layernorm",
            (Names::Hf, Ffn) => "pre_feedforward_layernorm",
            (Names::Hf, FfnOut) => "post_feedforward_layernorm",
            (Names::Gguf, Attn) => "attn_norm",
            (Names::Gguf, Q) => "attn_q_norm",
            (Names::Gguf, K) => "attn_k_norm",
            (Names::Gguf, AttnOut) => "post_attention_norm",
            (Names::Gguf, Ffn) => "ffn_norm",
            (Names::Gguf, FfnOut) => "post_ffw_norm",
        }
    }
}

/// A checkpoint: how it reads a (fused) matrix and a 1-D row, and its tensor names.
trait Checkpoint {
    const NAMES: Names;
    /// `[Σ rows, cols]` from the named `[rows, cols]` tensors, in their storage formats.
    fn matrix(&self, parts: &[(String, usize)], cols: usize) -> Result<Weight>;
    /// A 1-D tensor of `width` values, as f32.
    fn row(&self, name: &str, width: usize) -> Result<Vec<f32>>;
}

impl Checkpoint for SafetensorsFiles {
    const NAMES: Names = Names::Hf;

    fn matrix(&self, parts: &[(String, usize)], cols: usize) -> Result<Weight> {
        let parts: Vec<(&str, usize)> = parts.iter().map(|(n, r)| (n.as_str(), *r)).collect();
        self.load_weight(&parts, cols)
    }

    fn row(&self, name: &str, width: usize) -> Result<Vec<f32>> {
        self.load_f32(name, &[width])
    }
}

/// A GGUF's tensor `name`, checked to have `shape`.
fn gguf_tensor<'g>(g: &'g GgufFile, name: &str, shape: &[usize]) -> Result<&'g GgufTensorInfo> {
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
}

impl Checkpoint for GgufFile {
    const NAMES: Names = Names::Gguf;

    fn matrix(&self, parts: &[(String, usize)], cols: usize) -> Result<Weight> {
        let part = |name: &str, rows: usize| -> Result<Part> {
            let info = gguf_tensor(self, name, &[rows, cols])?;
            let storage = if info.ggml_type == GgmlType::F32 {
                Storage::F32(self.tensor_f32(info))
            } else {
                self.tensor_storage(info)
            };
            Part::new(info.ggml_type, rows, cols, storage)
                .map_err(|reason| ModelError::gguf(&self.path, format!("tensor `{name}`: {reason}")))
        };
        let parts = parts.iter().map(|(n, rows)| part(n, *rows)).collect::<Result<_>>()?;
        Ok(Weight::from_parts(cols.max(1), parts))
    }

    fn row(&self, name: &str, width: usize) -> Result<Vec<f32>> {
        Ok(self.tensor_f32(gguf_tensor(self, name, &[width])?))
    }
}

/// The rows of each part of a fused matrix (`0` past its last part).
fn part_rows(c: &ModelConfig, m: LayerMatrix) -> [usize; 3] {
    let (q, kv, inter) =
        (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size);
    match m {
        LayerMatrix::Qkv => [q, kv, kv],
        LayerMatrix::O | LayerMatrix::Down => [c.hidden_size, 0, 0],
        LayerMatrix::GateUp => [inter, inter, 0],
    }
}

/// Every weight of `config`'s model from `src`, each shape checked against the config before it
/// is used; each buffer is allocated only after the shapes of the tensors it holds matched the
/// file's headers, and layers are pushed as they load.
fn load<C: Checkpoint>(config: ModelConfig, src: &C) -> Result<Model> {
    let c = &config;
    let h = c.hidden_size;
    let row =
        |name: &str, width: usize| Ok::<_, ModelError>(Weight::from_f32(1, width, src.row(name, width)?));
    // `(tensor name, rows)` of each part of matrix `m` in layer `prefix`, with `suffix`.
    let parts = |prefix: &str, m: LayerMatrix, suffix: &str| -> Vec<(String, usize)> {
        C::NAMES
            .matrix_parts(m)
            .iter()
            .zip(part_rows(c, m))
            .map(|(name, rows)| (format!("{prefix}.{name}.{suffix}"), rows))
            .collect()
    };
    let [embed_name, final_norm_name, lm_head_name] = C::NAMES.outer();
    let embed = src.matrix(&[(embed_name.to_owned(), c.vocab_size)], h)?;
    let mut layers = Vec::new();
    for l in 0..c.num_hidden_layers {
        let p = C::NAMES.layer_prefix(l);
        let mut matrices = Vec::with_capacity(4);
        for (m, cols) in LayerMatrix::ALL.into_iter().zip(matrix_inputs(c)) {
            matrices.push(src.matrix(&parts(&p, m, "weight"), cols)?);
        }
        let matrices: [Weight; 4] = matrices.try_into().unwrap_or_else(|_| unreachable!("four matrices"));
        let mut layer = LayerWeights::new(matrices);
        for n in c.arch.layer_norms() {
            let name = C::NAMES.norm(n, c.arch.sandwich_norms);
            layer = layer.with_norm(n, row(&format!("{p}.{name}.weight"), norm_width(c, n))?);
        }
        for m in biased(c) {
            let mut values = Vec::new();
            for (name, rows) in parts(&p, m, "bias") {
                values.extend(src.row(&name, rows)?);
            }
            layer = layer.with_bias(m, Weight::from_f32(1, values.len(), values));
        }
        layers.push(layer);
    }
    let final_norm = row(final_norm_name, h)?;
    // Some tied checkpoints still ship an LM head; the flag decides.
    let lm_head = if c.tie_word_embeddings {
        None
    } else {
        Some(src.matrix(&[(lm_head_name.to_owned(), c.vocab_size)], h)?)
    };
    Ok(Model::assemble(config, embed, layers, final_norm, lm_head))
}

impl Model {
    /// Builds the model from already-opened checkpoint files, checking every shape (a config
    /// claiming 10¹² layers or a 2⁶² vocabulary fails with the tensor that does not match, not
    /// in the allocator).
    pub fn from_safetensors(config: ModelConfig, files: &SafetensorsFiles) -> Result<Self> {
        load(config, files)
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
        load(config, g)
    }
}
