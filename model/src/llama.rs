//! The Llama weights (fused per layer for fewer, larger GEMMs; each kept in its storage format,
//! see `attn_kernels::cpu::quant`) from an HF folder or natively from a GGUF, and the CPU
//! forward pass over the paged KV cache.

use std::path::Path;

use attn_kernels::Isa;
use attn_kernels::backend::{Cpu, KernelBackend};
use attn_kernels::cpu::act::silu_mul;
use attn_kernels::cpu::norm::rms_norm;
use attn_kernels::cpu::quant::{ActivationPrecision, GgmlType, Part, QuantizeError, Storage, Weight};
use attn_kernels::cpu::rope::{rope_interleaved, rope_rotate_half};
use kv_cache::KvCache;
use rayon::prelude::*;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, GgufTensorInfo};
use crate::input::ModelInput;
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
    pub fn ggml_type(self) -> GgmlType {
        match self {
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q4_0 => GgmlType::Q4_0,
        }
    }
}

/// One decoder layer's weights, all `[out, in]` row-major: [`Weight`]s on the host (norms as
/// one f32 row), and in the same layout wherever a device keeps them (`W` is its buffer type).
#[derive(Debug)]
pub struct LayerWeights<W = Weight> {
    pub input_norm: W,
    /// Rows: Q (`heads·d`), then K, then V (`kv_heads·d` each).
    pub qkv: W,
    pub o_proj: W,
    pub post_attn_norm: W,
    /// Rows: gate (`intermediate`), then up (`intermediate`).
    pub gate_up: W,
    pub down: W,
}

impl<W> LayerWeights<W> {
    /// Every weight, in field order.
    pub fn all(&self) -> [&W; 6] {
        [&self.input_norm, &self.qkv, &self.o_proj, &self.post_attn_norm, &self.gate_up, &self.down]
    }

    /// The same weights converted one by one (e.g. uploaded to a device).
    pub fn try_map<V, E>(&self, mut f: impl FnMut(&W) -> Result<V, E>) -> Result<LayerWeights<V>, E> {
        Ok(LayerWeights {
            input_norm: f(&self.input_norm)?,
            qkv: f(&self.qkv)?,
            o_proj: f(&self.o_proj)?,
            post_attn_norm: f(&self.post_attn_norm)?,
            gate_up: f(&self.gate_up)?,
            down: f(&self.down)?,
        })
    }
}

/// How the rows of each Q/K head are ordered, which decides the rotary pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// HF order: dimension `i` pairs with `i + d/2` ("rotate half").
    RotateHalf,
    /// llama.cpp's GGUF order (rows permuted at conversion): `2i` pairs with `2i + 1`. Q and K
    /// are permuted alike, so `q·k` and the attention are those of the HF model; keeping the
    /// GGUF order spares a re-ordered copy of the quantized rows.
    Interleaved,
}

/// A loaded Llama model.
#[derive(Debug)]
pub struct Llama {
    pub config: LlamaConfig,
    pub embed: Weight,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Weight,
    /// `None` when tied to `embed`.
    pub lm_head: Option<Weight>,
    pub rope_style: RopeStyle,
    /// How decode-shaped matmuls over Q4_0/Q4_1/Q8_0 weights take their activations
    /// (f32 by default; int16 when a user opts in).
    pub activations: ActivationPrecision,
    rope: Rope,
}

/// Reusable activation buffers: they grow to the largest batch seen and are then reused,
/// so a step allocates nothing once warmed up.
#[derive(Debug, Default)]
pub struct Workspace {
    hidden: Vec<f32>,
    normed: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    sampled: Vec<f32>,
    sampled_normed: Vec<f32>,
    logits: Vec<f32>,
}

fn ensure(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

impl Llama {
    /// The model from its loaded parts (the rotary tables built, decode activations f32).
    fn assemble(
        config: LlamaConfig,
        embed: Weight,
        layers: Vec<LayerWeights>,
        final_norm: Weight,
        lm_head: Option<Weight>,
        rope_style: RopeStyle,
    ) -> Self {
        let rope = Rope::new(&config);
        Self {
            config,
            embed,
            layers,
            final_norm,
            lm_head,
            rope_style,
            activations: ActivationPrecision::default(),
            rope,
        }
    }

    /// Loads config and weights from an HF folder, or from a GGUF file ([`Self::from_gguf`]).
    pub fn load(dir: &Path) -> Result<Self> {
        if dir.is_file() {
            return Self::from_gguf(&GgufFile::open_for_weights(dir)?);
        }
        let config = LlamaConfig::from_file(&dir.join("config.json"))?;
        let files = SafetensorsFiles::open_dir(dir)?;
        Self::from_safetensors(config, &files)
    }

    /// Builds the model from already-opened checkpoint files, checking every shape. Each
    /// buffer is allocated only after the shapes of the tensors it holds matched the file's
    /// headers (a config claiming 10¹² layers or a 2⁶² vocabulary fails with the tensor that
    /// does not match, not in the allocator), and layers are pushed as they load.
    pub fn from_safetensors(config: LlamaConfig, files: &SafetensorsFiles) -> Result<Self> {
        let c = &config;
        let (h, d) = (c.hidden_size, c.head_dim);
        let (q_rows, kv_rows) = (c.num_attention_heads * d, c.num_key_value_heads * d);
        let inter = c.intermediate_size;
        let matrix = |name: &str, rows: usize, cols: usize| files.load_weight(&[(name, rows)], cols);
        let norm = |name: &str| -> Result<Weight> { Ok(Weight::from_f32(1, h, files.load_f32(name, &[h])?)) };
        let embed = matrix("model.embed_tokens.weight", c.vocab_size, h)?;
        let mut layers = Vec::new();
        for l in 0..c.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let qkv = files.load_weight(
                &[
                    (&format!("{p}.self_attn.q_proj.weight"), q_rows),
                    (&format!("{p}.self_attn.k_proj.weight"), kv_rows),
                    (&format!("{p}.self_attn.v_proj.weight"), kv_rows),
                ],
                h,
            )?;
            let gate_up = files.load_weight(
                &[(&format!("{p}.mlp.gate_proj.weight"), inter), (&format!("{p}.mlp.up_proj.weight"), inter)],
                h,
            )?;
            layers.push(LayerWeights {
                input_norm: norm(&format!("{p}.input_layernorm.weight"))?,
                qkv,
                o_proj: matrix(&format!("{p}.self_attn.o_proj.weight"), h, q_rows)?,
                post_attn_norm: norm(&format!("{p}.post_attention_layernorm.weight"))?,
                gate_up,
                down: matrix(&format!("{p}.mlp.down_proj.weight"), h, inter)?,
            });
        }
        let final_norm = norm("model.norm.weight")?;
        // Some tied checkpoints still ship `lm_head.weight`; the flag decides.
        let lm_head =
            if c.tie_word_embeddings { None } else { Some(matrix("lm_head.weight", c.vocab_size, h)?) };
        Ok(Self::assemble(config, embed, layers, final_norm, lm_head, RopeStyle::RotateHalf))
    }

    /// Builds the model from a GGUF (llama architecture) with every matrix left in its GGUF
    /// type and memory-mapped, and Q/K in the file's row order ([`RopeStyle::Interleaved`]).
    /// Shapes are checked against the metadata before anything is used.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let vocab = crate::gguf::GgufVocab::from_gguf(g)?;
        let meta = crate::gguf::GgufModelMeta::read(g, &vocab)?;
        Self::from_gguf_with_config(g, LlamaConfig::from_json(&meta.config.to_string(), &g.path)?)
    }

    /// [`Self::from_gguf`] with the config already read from `g`'s metadata (by
    /// [`crate::ModelFolder::from_gguf`]), so the vocabulary is not parsed twice.
    pub(crate) fn from_gguf_with_config(g: &GgufFile, config: LlamaConfig) -> Result<Self> {
        let c = &config;
        let (h, d) = (c.hidden_size, c.head_dim);
        let (q_rows, kv_rows, inter) =
            (c.num_attention_heads * d, c.num_key_value_heads * d, c.intermediate_size);
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
        let matrix = |parts: &[(&str, usize)]| -> Result<Weight> {
            Ok(Weight::from_parts(
                h.max(1),
                parts.iter().map(|&(n, rows)| part(n, rows, h)).collect::<Result<_>>()?,
            ))
        };
        let norm =
            |name: &str| -> Result<Weight> { Ok(Weight::from_f32(1, h, g.tensor_f32(tensor(name, &[h])?))) };
        let embed = matrix(&[("token_embd.weight", c.vocab_size)])?;
        let mut layers = Vec::new();
        for l in 0..c.num_hidden_layers {
            let p = format!("blk.{l}");
            layers.push(LayerWeights {
                input_norm: norm(&format!("{p}.attn_norm.weight"))?,
                qkv: matrix(&[
                    (&format!("{p}.attn_q.weight"), q_rows),
                    (&format!("{p}.attn_k.weight"), kv_rows),
                    (&format!("{p}.attn_v.weight"), kv_rows),
                ])?,
                o_proj: Weight::from_parts(
                    q_rows,
                    vec![part(&format!("{p}.attn_output.weight"), h, q_rows)?],
                ),
                post_attn_norm: norm(&format!("{p}.ffn_norm.weight"))?,
                gate_up: matrix(&[
                    (&format!("{p}.ffn_gate.weight"), inter),
                    (&format!("{p}.ffn_up.weight"), inter),
                ])?,
                down: Weight::from_parts(inter, vec![part(&format!("{p}.ffn_down.weight"), h, inter)?]),
            });
        }
        let final_norm = norm("output_norm.weight")?;
        let lm_head =
            if c.tie_word_embeddings { None } else { Some(matrix(&[("output.weight", c.vocab_size)])?) };
        Ok(Self::assemble(config, embed, layers, final_norm, lm_head, RopeStyle::Interleaved))
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
            for w in [&mut l.qkv, &mut l.o_proj, &mut l.gate_up, &mut l.down] {
                *w = w.quantized(ty).map_err(bad)?;
            }
        }
        Ok(())
    }

    /// RoPE inverse frequencies (for the reference implementation and tests).
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        self.rope.inv_freq().to_vec()
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
            self.layers.first().map_or(0, |l| l.qkv.len() + l.o_proj.len() + l.gate_up.len() + l.down.len());
        2.0 * (per_layer * self.layers.len()) as f64 * tokens as f64
            + 2.0 * self.lm_head().len() as f64 * samples as f64
    }

    fn check_input(&self, input: &ModelInput<'_>, cache: &KvCache) -> Result<()> {
        let bad = |msg: String| Err(ModelError::InvalidInput(msg));
        input.check(self.config.vocab_size).map_err(ModelError::InvalidInput)?;
        if cache.num_layers() != self.layers.len() {
            return bad(format!("cache has {} layers, model {}", cache.num_layers(), self.layers.len()));
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

    /// One step: writes this step's K/V into `cache`, and returns the logits
    /// `[sample_indices.len(), vocab]` (borrowed from `ws`).
    pub fn forward<'w>(
        &self,
        input: &ModelInput<'_>,
        cache: &mut KvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32]> {
        self.check_input(input, cache)?;
        // Every op below fans out through rayon, ~10 times per layer. Issued from a thread
        // outside the pool, each fan-out is a cross-thread injection, a wake-up and a blocking
        // wait (tens of µs, a tenth of a batch-1 decode step); issued from a pool thread it is
        // a push onto the local deque. So the whole pass runs on the pool, entered once.
        if rayon::current_thread_index().is_some() {
            self.forward_on_pool(input, cache, ws)
        } else {
            rayon::scope(|_| self.forward_on_pool(input, cache, ws))
        }
    }

    fn forward_on_pool<'w>(
        &self,
        input: &ModelInput<'_>,
        cache: &mut KvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32]> {
        let c = &self.config;
        let t = input.num_tokens();
        let (h, d) = (c.hidden_size, c.head_dim);
        let (nh, nkv, inter) = (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size);
        let (q_w, kv_w, qkv_w) = (nh * d, nkv * d, c.qkv_size());
        let half = d / 2;

        // Embedding lookup (ids were checked against the vocabulary).
        let hidden = ensure(&mut ws.hidden, t * h);
        hidden.par_chunks_mut(h).zip(input.token_ids.par_iter()).for_each(|(row, &tok)| {
            self.embed.row_to_f32(tok as usize, row);
        });
        let rope_pairs = match self.rope_style {
            RopeStyle::RotateHalf => rope_rotate_half,
            RopeStyle::Interleaved => rope_interleaved,
        };
        // cos/sin per token, shared by all layers.
        let cos = ensure(&mut ws.cos, t * half);
        let sin = ensure(&mut ws.sin, t * half);
        cos.par_chunks_mut(half)
            .zip(sin.par_chunks_mut(half))
            .zip(input.positions.par_iter())
            .for_each(|((cr, sr), &p)| self.rope.fill(p, cr, sr));
        let meta = input.attn;
        let scale = 1.0 / (d as f32).sqrt();
        let (isa, precision) = (Isa::detected(), self.activations);
        for (l, lw) in self.layers.iter().enumerate() {
            let normed = ensure(&mut ws.normed, t * h);
            rms_norm(normed, &ws.hidden[..t * h], norm_of(&lw.input_norm), c.rms_norm_eps);
            let qkv = ensure(&mut ws.qkv, t * qkv_w);
            lw.qkv.matmul_as(isa, precision, qkv, normed, t, false);
            // Split Q/K/V into the kernels' contiguous layouts, rotating Q and K on the way.
            let q = ensure(&mut ws.q, t * q_w);
            let k = ensure(&mut ws.k, t * kv_w);
            let v = ensure(&mut ws.v, t * kv_w);
            let (cos, sin) = (&ws.cos[..t * half], &ws.sin[..t * half]);
            q.par_chunks_mut(q_w)
                .zip(k.par_chunks_mut(kv_w))
                .zip(v.par_chunks_mut(kv_w))
                .zip(qkv.par_chunks(qkv_w))
                .enumerate()
                .with_min_len(8)
                .for_each(|(i, (((qr, kr), vr), src))| {
                    qr.copy_from_slice(&src[..q_w]);
                    kr.copy_from_slice(&src[q_w..q_w + kv_w]);
                    vr.copy_from_slice(&src[q_w + kv_w..]);
                    let (cr, sr) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
                    rope_pairs(qr, d, cr, sr);
                    rope_pairs(kr, d, cr, sr);
                });
            let layer_cache = cache.layer_mut(l);
            Cpu.reshape_and_cache(k, v, input.slot_mapping, layer_cache)?;
            let attn = ensure(&mut ws.attn, t * q_w);
            Cpu.paged_attention(attn, q, layer_cache, &meta, nh, scale, &mut ())?;
            // Residual adds fused into the GEMMs (accumulate into `hidden`).
            lw.o_proj.matmul_as(isa, precision, &mut ws.hidden[..t * h], attn, t, true);
            let normed = &mut ws.normed[..t * h];
            rms_norm(normed, &ws.hidden[..t * h], norm_of(&lw.post_attn_norm), c.rms_norm_eps);
            let gate_up = ensure(&mut ws.gate_up, t * 2 * inter);
            lw.gate_up.matmul_as(isa, precision, gate_up, normed, t, false);
            let act = ensure(&mut ws.act, t * inter);
            silu_mul(act, gate_up, inter);
            lw.down.matmul_as(isa, precision, &mut ws.hidden[..t * h], act, t, true);
        }
        // Final norm and LM head only for the rows that sample.
        let s = input.sample_indices.len();
        let sampled = ensure(&mut ws.sampled, s * h);
        for (row, &i) in sampled.chunks_exact_mut(h).zip(input.sample_indices) {
            row.copy_from_slice(&ws.hidden[i * h..(i + 1) * h]);
        }
        let sampled_normed = ensure(&mut ws.sampled_normed, s * h);
        rms_norm(sampled_normed, sampled, norm_of(&self.final_norm), c.rms_norm_eps);
        let logits = ensure(&mut ws.logits, s * c.vocab_size);
        self.lm_head().matmul_as(isa, precision, logits, sampled_normed, s, false);
        Ok(&ws.logits[..s * c.vocab_size])
    }
}

/// A norm's weights: every loader stores norms as one f32 row.
fn norm_of(w: &Weight) -> &[f32] {
    w.as_f32().expect("norm weights are loaded as f32")
}
