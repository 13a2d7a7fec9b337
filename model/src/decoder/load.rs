//! [`Model`]'s loader, written once over a [`Checkpoint`] format: an HF safetensors folder (HF
//! tensor names) or a GGUF (llama.cpp's names, every matrix left in its GGUF type and
//! memory-mapped). Every shape is checked against the config before anything is allocated or used.

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

/// A checkpoint format: its tensor names, and how it reads a (fused) matrix and a 1-D row.
trait Checkpoint {
    const EMBED: &'static str;
    const FINAL_NORM: &'static str;
    const LM_HEAD: &'static str;
    fn layer_prefix(l: usize) -> String;
    /// The tensors (under the layer's prefix, without `.weight`) a fused matrix is made of.
    fn matrix_parts(m: LayerMatrix) -> [&'static str; 3];
    fn norm_name(c: &ModelConfig, n: LayerNorm) -> &'static str;
    /// `[Σ rows, cols]` from the named `[rows, cols]` tensors, in their storage formats.
    fn matrix(&self, parts: &[(String, usize)], cols: usize) -> Result<Weight>;
    /// A 1-D tensor of `width` values, as f32.
    fn row(&self, name: &str, width: usize) -> Result<Vec<f32>>;
}

/// Hugging Face names in safetensors files.
struct Hf<'a>(&'a SafetensorsFiles);

impl Checkpoint for Hf<'_> {
    const EMBED: &'static str = "model.embed_tokens.weight";
    const FINAL_NORM: &'static str = "model.norm.weight";
    const LM_HEAD: &'static str = "lm_head.weight";

    fn layer_prefix(l: usize) -> String {
        format!("model.layers.{l}")
    }

    fn matrix_parts(m: LayerMatrix) -> [&'static str; 3] {
        match m {
            LayerMatrix::Qkv => ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            LayerMatrix::O => ["self_attn.o_proj", "", ""],
            LayerMatrix::GateUp => ["mlp.gate_proj", "mlp.up_proj", ""],
            LayerMatrix::Down => ["mlp.down_proj", "", ""],
        }
    }

    fn norm_name(c: &ModelConfig, n: LayerNorm) -> &'static str {
        match n {
            LayerNorm::Attn => "input_layernorm",
            LayerNorm::Q => "self_attn.q_norm",
            LayerNorm::K => "self_attn.k_norm",
            LayerNorm::AttnOut => "post_attention_layernorm",
            // Llama's pre-MLP norm is HF's `post_attention_layernorm`; with sandwich norms that
            // name is the attention output's norm instead.
            LayerNorm::Ffn if !c.arch.sandwich_norms => "post_attention_layernorm",
            LayerNorm::Ffn => "pre_feedforward_layernorm",
            LayerNorm::FfnOut => "post_feedforward_layernorm",
        }
    }

    fn matrix(&self, parts: &[(String, usize)], cols: usize) -> Result<Weight> {
        let parts: Vec<(&str, usize)> = parts.iter().map(|(n, r)| (n.as_str(), *r)).collect();
        self.0.load_weight(&parts, cols)
    }

    fn row(&self, name: &str, width: usize) -> Result<Vec<f32>> {
        self.0.load_f32(name, &[width])
    }
}

/// llama.cpp's names in a GGUF.
struct Gguf<'a>(&'a GgufFile);

impl Gguf<'_> {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<&GgufTensorInfo> {
        let g = self.0;
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

    fn part(&self, name: &str, rows: usize, cols: usize) -> Result<Part> {
        let (g, info) = (self.0, self.tensor(name, &[rows, cols])?);
        let storage = if info.ggml_type == GgmlType::F32 {
            Storage::F32(g.tensor_f32(info))
        } else {
            g.tensor_storage(info)
        };
        Part::new(info.ggml_type, rows, cols, storage)
            .map_err(|reason| ModelError::gguf(&g.path, format!("tensor `{name}`: {reason}")))
    }
}

impl Checkpoint for Gguf<'_> {
    const EMBED: &'static str = "token_embd.weight";
    const FINAL_NORM: &'static str = "output_norm.weight";
    const LM_HEAD: &'static str = "output.weight";

    fn layer_prefix(l: usize) -> String {
        format!("blk.{l}")
    }

    fn matrix_parts(m: LayerMatrix) -> [&'static str; 3] {
        match m {
            LayerMatrix::Qkv => ["attn_q", "attn_k", "attn_v"],
            LayerMatrix::O => ["attn_output", "", ""],
            LayerMatrix::GateUp => ["ffn_gate", "ffn_up", ""],
            LayerMatrix::Down => ["ffn_down", "", ""],
        }
    }

    fn norm_name(_: &ModelConfig, n: LayerNorm) -> &'static str {
        match n {
            LayerNorm::Attn => "attn_norm",
            LayerNorm::Q => "attn_q_norm",
            LayerNorm::K => "attn_k_norm",
            LayerNorm::AttnOut => "post_attention_norm",
            LayerNorm::Ffn => "ffn_norm",
            LayerNorm::FfnOut => "post_ffw_norm",
        }
    }

    fn matrix(&self, parts: &[(String, usize)], cols: usize) -> Result<Weight> {
        let parts = parts.iter().map(|(n, rows)| self.part(n, *rows, cols)).collect::<Result<_>>()?;
        Ok(Weight::from_parts(cols.max(1), parts))
    }

    fn row(&self, name: &str, width: usize) -> Result<Vec<f32>> {
        Ok(self.0.tensor_f32(self.tensor(name, &[width])?))
    }
}

/// The rows of each part of a fused matrix (`0` where it has fewer than three).
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
        C::matrix_parts(m)
            .into_iter()
            .zip(part_rows(c, m))
            .filter(|(name, _)| !name.is_empty())
            .map(|(name, rows)| (format!("{prefix}.{name}.{suffix}"), rows))
            .collect()
    };
    let embed = src.matrix(&[(C::EMBED.to_owned(), c.vocab_size)], h)?;
    let mut layers = Vec::new();
    for l in 0..c.num_hidden_layers {
        let p = C::layer_prefix(l);
        let mut matrices = Vec::with_capacity(4);
        for (m, cols) in LayerMatrix::ALL.into_iter().zip(matrix_inputs(c)) {
            matrices.push(src.matrix(&parts(&p, m, "weight"), cols)?);
        }
        let matrices: [Weight; 4] = matrices.try_into().unwrap_or_else(|_| unreachable!("four matrices"));
        let mut layer = LayerWeights::new(matrices);
        for n in c.arch.layer_norms() {
            layer = layer.with_norm(n, row(&format!("{p}.{}.weight", C::norm_name(c, n)), norm_width(c, n))?);
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
    let final_norm = row(C::FINAL_NORM, h)?;
    // Some tied checkpoints still ship an LM head; the flag decides.
    let lm_head = if c.tie_word_embeddings {
        None
    } else {
        Some(src.matrix(&[(C::LM_HEAD.to_owned(), c.vocab_size)], h)?)
    };
    Ok(Model::assemble(config, embed, layers, final_norm, lm_head))
}

impl Model {
    /// Builds the model from already-opened checkpoint files, checking every shape (a config
    /// claiming 10¹² layers or a 2⁶² vocabulary fails with the tensor that does not match, not
    /// in the allocator).
    pub fn from_safetensors(config: ModelConfig, files: &SafetensorsFiles) -> Result<Self> {
        load(config, &Hf(files))
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
        load(config, &Gguf(g))
    }
}
