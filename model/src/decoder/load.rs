//! [`Model`]'s loader, written once over a [`Checkpoint`]: safetensors files (HF tensor names) or a
//! GGUF (llama.cpp's names, every matrix left in its GGUF type and memory-mapped), named side by
//! side in [`Names`]. Every shape is checked against the config before anything is allocated or used.

use quant_kernels::quant::{GgmlType, Part, Storage, Weight};

use super::{LayerWeights, Model};
use crate::arch::{Family, LayerMatrix, LayerNorm};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, GgufTensorInfo};
use crate::load_progress::{LoadProgress, OnLoad, unwatched};
use crate::weights::SafetensorsFiles;

/// The input width of each matrix of a layer, in [`LayerMatrix`] order.
fn matrix_inputs(c: &ModelConfig) -> [usize; 4] {
    let h = c.hidden_size;
    [h, c.num_attention_heads * c.head_dim, h, c.intermediate_size]
}

/// Width of a norm's row.
fn norm_width(c: &ModelConfig, n: LayerNorm) -> usize {
    match n {
        LayerNorm::QNorm | LayerNorm::KNorm => c.head_dim,
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

    /// The tensors (under the layer's prefix, without `.weight`) a fused matrix is made of, each
    /// with its rows: separate in most checkpoints, already fused in Phi-3's.
    fn matrix_parts(self, c: &ModelConfig, m: LayerMatrix) -> Vec<(&'static str, usize)> {
        use LayerMatrix::*;
        let (q, kv, inter) =
            (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size);
        let fused = c.arch.family == Family::Phi3;
        match (self, m) {
            (Names::Hf, Qkv) if fused => vec![("self_attn.qkv_proj", q + 2 * kv)],
            (Names::Hf, GateUp) if fused => vec![("mlp.gate_up_proj", 2 * inter)],
            (Names::Gguf, Qkv) if fused => vec![("attn_qkv", q + 2 * kv)],
            // llama.cpp keeps Phi-3's fused gate and up as `ffn_up`, gate rows first.
            (Names::Gguf, GateUp) if fused => vec![("ffn_up", 2 * inter)],
            (Names::Hf, Qkv) => {
                vec![("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)]
            }
            (Names::Hf, O) => vec![("self_attn.o_proj", c.hidden_size)],
            (Names::Hf, GateUp) => vec![("mlp.gate_proj", inter), ("mlp.up_proj", inter)],
            (Names::Hf, Down) => vec![("mlp.down_proj", c.hidden_size)],
            (Names::Gguf, Qkv) => vec![("attn_q", q), ("attn_k", kv), ("attn_v", kv)],
            (Names::Gguf, O) => vec![("attn_output", c.hidden_size)],
            (Names::Gguf, GateUp) => vec![("ffn_gate", inter), ("ffn_up", inter)],
            (Names::Gguf, Down) => vec![("ffn_down", c.hidden_size)],
        }
    }

    fn norm(self, n: LayerNorm, sandwich: bool) -> &'static str {
        use LayerNorm::*;
        match (self, n) {
            (Names::Hf, InputLayernorm) => "input_layernorm",
            (Names::Hf, QNorm) => "self_attn.q_norm",
            (Names::Hf, KNorm) => "self_attn.k_norm",
            (Names::Hf, PostAttentionLayernorm) => "post_attention_layernorm",
            // Llama's pre-MLP norm is HF's `post_attention_layernorm`; with sandwich norms that
            // name is the attention output's norm instead.
            (Names::Hf, PreFeedforwardLayernorm) if !sandwich => "post_attention_layernorm",
            (Names::Hf, PreFeedforwardLayernorm) => "pre_feedforward_layernorm",
            (Names::Hf, PostFeedforwardLayernorm) => "post_feedforward_layernorm",
            (Names::Gguf, InputLayernorm) => "attn_norm",
            (Names::Gguf, QNorm) => "attn_q_norm",
            (Names::Gguf, KNorm) => "attn_k_norm",
            (Names::Gguf, PostAttentionLayernorm) => "post_attention_norm",
            (Names::Gguf, PreFeedforwardLayernorm) => "ffn_norm",
            (Names::Gguf, PostFeedforwardLayernorm) => "post_ffw_norm",
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

/// A checkpoint's reads, counted as [`LoadProgress::Tensors`] steps for `on`.
struct Counted<'a, C> {
    src: &'a C,
    done: usize,
    total: usize,
    on: OnLoad<'a>,
}

impl<C: Checkpoint> Counted<'_, C> {
    fn matrix(&mut self, parts: &[(String, usize)], cols: usize) -> Result<Weight> {
        let weight = self.src.matrix(parts, cols)?;
        self.advance(parts.len());
        Ok(weight)
    }

    fn row(&mut self, name: &str, width: usize) -> Result<Vec<f32>> {
        let row = self.src.row(name, width)?;
        self.advance(1);
        Ok(row)
    }

    fn advance(&mut self, tensors: usize) {
        self.done += tensors;
        (self.on)(LoadProgress::Tensors { done: self.done, total: self.total });
    }
}

/// How many tensors [`load`] reads for `c`: the embedding, the final norm, the untied head,
/// and each layer's matrix parts, norms and bias parts.
fn tensor_count(names: Names, c: &ModelConfig) -> usize {
    let parts = |m: LayerMatrix| names.matrix_parts(c, m).len();
    let per_layer = LayerMatrix::ALL.into_iter().map(parts).sum::<usize>()
        + c.arch.layer_norms().count()
        + biased(c).map(parts).sum::<usize>();
    c.num_hidden_layers.saturating_mul(per_layer).saturating_add(2 + usize::from(!c.tie_word_embeddings))
}

/// Every weight of `config`'s model from `src`, each shape checked against the config before it
/// is used; each buffer is allocated only after the shapes of the tensors it holds matched the
/// file's headers, and layers are pushed as they load. Each tensor read is reported to `on`.
fn load<C: Checkpoint>(config: ModelConfig, src: &C, on: OnLoad<'_>) -> Result<Model> {
    let c = &config;
    let h = c.hidden_size;
    let mut src = Counted { src, done: 0, total: tensor_count(C::NAMES, c), on };
    // `(tensor name, rows)` of each part of matrix `m` in layer `prefix`, with `suffix`.
    let parts = |prefix: &str, m: LayerMatrix, suffix: &str| -> Vec<(String, usize)> {
        C::NAMES
            .matrix_parts(c, m)
            .into_iter()
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
            let width = norm_width(c, n);
            layer = layer
                .with_norm(n, Weight::from_f32(1, width, src.row(&format!("{p}.{name}.weight"), width)?));
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
    let final_norm = Weight::from_f32(1, h, src.row(final_norm_name, h)?);
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
    pub fn from_safetensors(config: ModelConfig, files: &SafetensorsFiles, on: OnLoad<'_>) -> Result<Self> {
        load(config, files, on)
    }

    /// Builds the model from a GGUF with every matrix left in its GGUF type and memory-mapped,
    /// and Llama's Q/K in the file's row order ([`crate::arch::RopeStyle::Interleaved`]). Shapes are checked
    /// against the metadata before anything is used.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let vocab = crate::gguf::GgufVocab::from_gguf(g)?;
        let meta = crate::gguf::GgufModelMeta::read(g, &vocab)?;
        Self::from_gguf_with_config(g, meta.model_config(&g.path)?, &mut unwatched)
    }

    /// [`Self::from_gguf`] with the config already read from `g`'s metadata (by
    /// [`crate::ModelFolder::from_gguf`]), so the vocabulary is not parsed twice.
    pub(crate) fn from_gguf_with_config(g: &GgufFile, config: ModelConfig, on: OnLoad<'_>) -> Result<Self> {
        load(config, g, on)
    }
}
