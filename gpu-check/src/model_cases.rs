//! The host side of the model check (`gpu_model_check`): the shapes of the random Llamas it runs
//! and the HF folders it writes for them (config, byte-level tokenizer, random safetensors), so
//! that the check's tolerance can be calibrated against them here, without a GPU.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Map, json};

use crate::figures::Res;

/// The shape of a random Llama.
#[derive(Debug)]
pub struct Shape {
    pub hidden: usize,
    pub inter: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub max_pos: usize,
    pub tied: bool,
    pub llama3_rope: bool,
}

pub const TINY: Shape = Shape {
    hidden: 256,
    inter: 512,
    layers: 3,
    heads: 4,
    kv_heads: 2,
    head_dim: 64,
    vocab: 1000,
    max_pos: 2048,
    tied: false,
    llama3_rope: false,
};

/// The second shape: 4 query heads per KV head, heads of 128, tied embeddings, llama3 RoPE.
pub const TINY_G4_H128: Shape = Shape {
    hidden: 512,
    inter: 768,
    layers: 2,
    heads: 4,
    kv_heads: 1,
    head_dim: 128,
    vocab: 1500,
    max_pos: 4096,
    tied: true,
    llama3_rope: true,
};

/// Llama-3.2-1B: 16 layers, hidden 2048, 32/8 heads of 64, tied 128 256-token vocabulary.
pub const LLAMA_32_1B: Shape = Shape {
    hidden: 2048,
    inter: 8192,
    layers: 16,
    heads: 32,
    kv_heads: 8,
    head_dim: 64,
    vocab: 128_256,
    max_pos: 131_072,
    tied: true,
    llama3_rope: true,
};

/// SmolLM2-135M's shape (the project's default model): 30 layers, hidden 576, 9/3 heads of 64,
/// tied 49 152-token vocabulary. With tied random embeddings the logits spread by about
/// √hidden, so greedy choices are decisive, not near ties.
pub const SMOLLM2_135M: Shape = Shape {
    hidden: 576,
    inter: 1536,
    layers: 30,
    heads: 9,
    kv_heads: 3,
    head_dim: 64,
    vocab: 49_152,
    max_pos: 8192,
    tied: true,
    llama3_rope: false,
};

/// A tensor to generate: name, shape, and `(fan_in, gain)` (`None`: a norm weight of ones).
pub type TensorSpec = (String, Vec<usize>, Option<(usize, f32)>);

/// An HF folder: config, generation config, a byte-level tokenizer covering the vocabulary,
/// and random weights (uniform, std `gain/sqrt(fan_in)`, norms 1).
pub fn write_folder(dir: &Path, s: &Shape, dtype: Dtype, seed: u64) -> Res<()> {
    std::fs::create_dir_all(dir)?;
    let eos = s.vocab as u32 - 1;
    let rope_theta = if s.llama3_rope { 500_000.0 } else { 10_000.0 };
    let mut config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": s.hidden, "intermediate_size": s.inter, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "vocab_size": s.vocab, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "tie_word_embeddings": s.tied, "max_position_embeddings": s.max_pos,
        "rope_theta": rope_theta,
        "bos_token_id": eos - 1, "eos_token_id": eos,
    });
    if s.llama3_rope {
        config["rope_scaling"] = json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    }
    std::fs::write(dir.join("config.json"), config.to_string())?;
    std::fs::write(dir.join("generation_config.json"), json!({"eos_token_id": [eos]}).to_string())?;
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json(s.vocab))?;

    let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut specs: Vec<TensorSpec> =
        vec![("model.embed_tokens.weight".into(), vec![s.vocab, h], Some((1, 1.0)))];
    if !s.tied {
        specs.push(("lm_head.weight".into(), vec![s.vocab, h], Some((h, 3.0))));
    }
    for l in 0..s.layers {
        let p = format!("model.layers.{l}");
        specs.push((format!("{p}.input_layernorm.weight"), vec![h], None));
        specs.push((format!("{p}.post_attention_layernorm.weight"), vec![h], None));
        specs.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h], Some((h, 1.0))));
        specs.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h], Some((h, 1.0))));
        specs.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h], Some((h, 1.0))));
        specs.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q], Some((q, 1.0))));
        specs.push((format!("{p}.mlp.gate_proj.weight"), vec![s.inter, h], Some((h, 1.0))));
        specs.push((format!("{p}.mlp.up_proj.weight"), vec![s.inter, h], Some((h, 1.0))));
        specs.push((format!("{p}.mlp.down_proj.weight"), vec![h, s.inter], Some((s.inter, 1.0))));
    }
    specs.push(("model.norm.weight".into(), vec![h], None));
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = specs
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape, init))| {
            let bytes = random_bytes(shape.iter().product(), init, dtype, seed * 1_000 + i as u64);
            (name, shape, bytes)
        })
        .collect();
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| Ok((name.clone(), TensorView::new(dtype, shape.clone(), bytes)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors"))?;
    Ok(())
}

/// `n` values (f32 or bf16 little-endian bytes), generated in parallel chunks.
pub fn random_bytes(n: usize, init: Option<(usize, f32)>, dtype: Dtype, seed: u64) -> Vec<u8> {
    const CHUNK: usize = 1 << 20;
    let width = if dtype == Dtype::BF16 { 2 } else { 4 };
    let a = init.map_or(0.0, |(fan_in, gain)| gain * (3.0 / fan_in as f32).sqrt());
    let mut out = vec![0u8; n * width];
    out.par_chunks_mut(CHUNK * width).enumerate().for_each(|(c, bytes)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9).wrapping_add(c as u64));
        for v in bytes.chunks_exact_mut(width) {
            let x = if init.is_some() { rng.random_range(-a..a) } else { 1.0 };
            if width == 2 {
                v.copy_from_slice(&half::bf16::from_f32(x).to_le_bytes());
            } else {
                v.copy_from_slice(&x.to_le_bytes());
            }
        }
    });
    out
}

/// Byte-level BPE over the 256 bytes plus plain tokens `t256…` up to `vocab` (no merges: the
/// engine only decodes these ids; prompts are token ids).
pub fn tokenizer_json(vocab: usize) -> String {
    let mut map = Map::new();
    for (i, c) in model::tokenizer::gpt2_byte_alphabet().iter().enumerate() {
        map.insert(c.to_string(), json!(i));
    }
    for i in 256..vocab {
        map.insert(format!("t{i}"), json!(i));
    }
    json!({
        "version": "1.0", "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": map, "merges": []}
    })
    .to_string()
}
