//! The decoder's weights ([`Model`]: fused per layer for fewer, larger GEMMs, each kept in its
//! storage format, see `quant_kernels::quant`), loaded from an HF folder or natively from a
//! GGUF (`load.rs`). `Model::forward`, the CPU step over these weights, is in `forward/cpu.rs`;
//! the CUDA backend uploads them (`crate::cuda`).

mod load;

use std::path::Path;

use kv_cache::{KvCache, KvLayout};
use quant_kernels::quant::{ActivationPrecision, GgmlType, QuantizeError, Weight};

use crate::arch::{LayerMatrix, LayerNorm, RopeKind};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::input::ModelInput;
use crate::load_progress::unwatched;
use crate::rope::Rope;
use crate::weights::SafetensorsFiles;

/// Formats float weights can be quantized to at load (`--quantization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// 8-bit, one f16 scale per 32 values (8.5 bits per weight).
    Q8_0,
    /// 4-bit, one f16 scale per 32 values (4.5 bits per weight).
    Q4_0,
}

impl Quantization {
    /// Every format under the name `--quantization` takes.
    pub const NAMES: &'static [(&'static str, Quantization)] = &[("q8_0", Self::Q8_0), ("q4_0", Self::Q4_0)];

    pub fn ggml_type(self) -> GgmlType {
        match self {
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q4_0 => GgmlType::Q4_0,
        }
    }
}

/// One decoder layer's weights: the four matrices (`[out, in]` row-major, see [`LayerMatrix`]),
/// the norms its architecture has and the biases it has, each norm and bias one f32 row. `W` is
/// [`Weight`] on the host and a device's buffer type wherever a device keeps them.
#[derive(Debug)]
pub struct LayerWeights<W = Weight> {
    matrices: [W; 4],
    norms: [Option<W>; 6],
    biases: [Option<W>; 4],
}

impl<W> LayerWeights<W> {
    /// A layer of these matrices, in [`LayerMatrix::ALL`] order, with no norms or biases yet.
    pub fn new(matrices: [W; 4]) -> Self {
        Self { matrices, norms: Default::default(), biases: Default::default() }
    }

    pub fn with_norm(mut self, norm: LayerNorm, weight: W) -> Self {
        self.norms[norm as usize] = Some(weight);
        self
    }

    pub fn with_bias(mut self, matrix: LayerMatrix, bias: W) -> Self {
        self.biases[matrix as usize] = Some(bias);
        self
    }

    pub fn matrix(&self, m: LayerMatrix) -> &W {
        &self.matrices[m as usize]
    }

    /// A norm's weight; `None` when the layer has no such norm.
    pub fn norm(&self, n: LayerNorm) -> Option<&W> {
        self.norms[n as usize].as_ref()
    }

    pub fn bias(&self, m: LayerMatrix) -> Option<&W> {
        self.biases[m as usize].as_ref()
    }

    /// Every weight the layer holds: matrices, norms, biases.
    pub fn all(&self) -> impl Iterator<Item = &W> {
        self.matrices.iter().chain(self.norms.iter().flatten()).chain(self.biases.iter().flatten())
    }

    /// The same weights converted one by one (e.g. uploaded to a device); `f` also learns
    /// which weight it converts.
    pub fn try_map<V, E>(
        &self,
        mut f: impl FnMut(&W, LayerWeight) -> Result<V, E>,
    ) -> Result<LayerWeights<V>, E> {
        let mut out = LayerWeights::new(self.convert_matrices(&mut f)?);
        for n in LayerNorm::ALL {
            if let Some(w) = self.norm(n) {
                out = out.with_norm(n, f(w, LayerWeight::Norm(n))?);
            }
        }
        for m in LayerMatrix::ALL {
            if let Some(w) = self.bias(m) {
                out = out.with_bias(m, f(w, LayerWeight::Bias(m))?);
            }
        }
        Ok(out)
    }

    fn convert_matrices<V, E>(
        &self,
        f: &mut impl FnMut(&W, LayerWeight) -> Result<V, E>,
    ) -> Result<[V; 4], E> {
        let [qkv, o, gate_up, down] = LayerMatrix::ALL;
        Ok([
            f(self.matrix(qkv), LayerWeight::Matrix(qkv))?,
            f(self.matrix(o), LayerWeight::Matrix(o))?,
            f(self.matrix(gate_up), LayerWeight::Matrix(gate_up))?,
            f(self.matrix(down), LayerWeight::Matrix(down))?,
        ])
    }

    fn matrices_mut(&mut self) -> &mut [W; 4] {
        &mut self.matrices
    }
}

/// Which weight of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerWeight {
    Matrix(LayerMatrix),
    Norm(LayerNorm),
    Bias(LayerMatrix),
}

/// A loaded decoder: its config (with the architecture description) and weights.
#[derive(Debug)]
pub struct Model {
    pub config: ModelConfig,
    pub embed: Weight,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Weight,
    /// `None` when tied to `embed`.
    pub lm_head: Option<Weight>,
    /// How the matmuls over quantized weights take their activations (`Auto` by default:
    /// int16 for the integer-code formats on AVX2 and AVX-512 CPUs).
    pub activations: ActivationPrecision,
    /// One rotation per [`RopeKind`], for the context the model is served at.
    ropes: [Rope; RopeKind::COUNT],
    /// Which KV cache group and slot each layer uses (one group of every layer by default).
    kv_layout: KvLayout,
}

impl Model {
    /// The model from its loaded parts (the rotary frequencies computed, decode activations f32).
    pub(crate) fn assemble(
        config: ModelConfig,
        embed: Weight,
        layers: Vec<LayerWeights>,
        final_norm: Weight,
        lm_head: Option<Weight>,
    ) -> Self {
        let ropes = Rope::every_kind(&config, config.max_position_embeddings);
        let kv_layout = KvLayout::one_group(layers.len());
        Self {
            kv_layout,
            config,
            embed,
            layers,
            final_norm,
            lm_head,
            activations: ActivationPrecision::default(),
            ropes,
        }
    }

    /// Loads config and weights from an HF folder, or from a GGUF file ([`Self::from_gguf`]).
    pub fn load(dir: &Path) -> Result<Self> {
        if dir.is_file() {
            return Self::from_gguf(&GgufFile::open_for_weights(dir, &mut unwatched)?);
        }
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let files = SafetensorsFiles::open_dir(dir)?;
        Self::from_safetensors(config, &files, &mut unwatched)
    }

    /// Quantizes every float matrix (embedding, projections, LM head) to `ty` at load
    /// (`--quantization`); matrices a GGUF already holds quantized stay as they are.
    pub fn quantize_weights(&mut self, ty: GgmlType) -> Result<()> {
        let bad = |e: QuantizeError| ModelError::InvalidInput(format!("quantizing to {ty:?}: {e}"));
        self.embed = self.embed.quantized(ty).map_err(bad)?;
        if let Some(head) = &self.lm_head {
            self.lm_head = Some(head.quantized(ty).map_err(bad)?);
        }
        for l in &mut self.layers {
            for w in l.matrices_mut() {
                *w = w.quantized(ty).map_err(bad)?;
            }
        }
        Ok(())
    }

    /// The rotation of `kind` layers.
    pub fn rope(&self, kind: RopeKind) -> &Rope {
        &self.ropes[kind as usize]
    }

    /// Serves sequences of up to `context` tokens: rotations that depend on the context served
    /// (LongRoPE's short or long factors) are chosen for it.
    pub fn set_context(&mut self, context: usize) {
        self.ropes = Rope::every_kind(&self.config, context);
    }

    /// Which KV cache group and slot each layer uses.
    pub fn kv_layout(&self) -> &KvLayout {
        &self.kv_layout
    }

    /// Serves with the hybrid layout of its attention kinds (`KvLayout::hybrid`): the cache
    /// then holds `kv_layout().num_slots()` layer tensors and a step carries one block table
    /// per group.
    pub fn use_hybrid_kv_layout(&mut self) {
        self.kv_layout = self.config.hybrid_kv_layout();
    }

    /// The LM head matrix `[vocab, hidden]`.
    pub fn lm_head(&self) -> &Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of weights one decode step streams, in their stored formats (every matrix once,
    /// embedding rows aside).
    pub fn weight_bytes_per_step(&self) -> usize {
        let layers: usize = self.layers.iter().flat_map(|l| l.all()).map(|w| w.storage_bytes()).sum();
        layers + self.lm_head().storage_bytes() + self.final_norm.storage_bytes()
    }

    /// FLOPs of the matrix multiplies for `tokens` tokens of which `samples` reach the LM head.
    pub fn matmul_flops(&self, tokens: usize, samples: usize) -> f64 {
        let per_layer: usize =
            self.layers.first().map_or(0, |l| LayerMatrix::ALL.into_iter().map(|m| l.matrix(m).len()).sum());
        2.0 * (per_layer * self.layers.len()) as f64 * tokens as f64
            + 2.0 * self.lm_head().len() as f64 * samples as f64
    }

    /// Whether a step's input and cache fit this model: ids inside the vocabulary, and the
    /// cache's layer tensors, groups and geometry those of the KV layout.
    pub(crate) fn check_input(&self, input: &ModelInput<'_>, cache: &KvCache) -> Result<()> {
        let bad = |msg: String| Err(ModelError::InvalidInput(msg));
        input.check(self.config.vocab_size).map_err(ModelError::InvalidInput)?;
        if cache.num_layers() != self.kv_layout.num_slots() {
            return bad(format!(
                "cache has {} layer tensors, the model's KV layout {}",
                cache.num_layers(),
                self.kv_layout.num_slots()
            ));
        }
        if input.other_groups.len() + 1 != self.kv_layout.num_groups() {
            return bad(format!(
                "the step has {} KV cache groups, the model's KV layout {}",
                input.other_groups.len() + 1,
                self.kv_layout.num_groups()
            ));
        }
        let lora = input.lora.into_iter().flat_map(|b| b.groups());
        if let Some(g) = lora.into_iter().find(|g| !g.adapter.fits(&self.config)) {
            return bad(format!("LoRA adapter {:?} does not fit this model's shapes", g.adapter.name));
        }
        let g = cache.layer(0).geometry();
        if g.num_kv_heads != self.config.num_key_value_heads || g.head_size != self.config.head_dim {
            return bad(format!(
                "cache has {} kv heads of size {}, model {} of size {}",
                g.num_kv_heads, g.head_size, self.config.num_key_value_heads, self.config.head_dim
            ));
        }
        Ok(())
    }
}
