//! `gpu_model_check`: the model half of the GPU run (the kernel half is `gpu_check`). On a lent GPU it
//! 1. writes two tiny random Llamas (GQA group 2 with heads of 64; group 4 with heads of 128,
//!    tied embeddings and llama3 RoPE) as ordinary HF folders, loads them through the normal
//!    loader, and runs the CPU forward (f32) and the CUDA forward (bf16, then f16) through the
//!    same chunked-prefill and decode steps over contexts past one v2 partition (up to 1 100
//!    tokens), comparing every row of logits (`model::cuda::LOGIT_TOLERANCE`) and requiring the
//!    CUDA greedy token to be the CPU's on every row that is not a near tie;
//! 2. writes a random-weight Llama-3.2-1B-shaped folder (bf16, generated here, never carried)
//!    and measures `cuda.e2e_output_tok_s`: 256 requests of 512 random prompt tokens and 128
//!    output tokens each, submitted at once, through the engine on CUDA.
//!
//! Writes flat JSON to `$OUT/gpu_model_check.json`; exits non-zero when a check fails.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use engine::{DType, Device, Engine, EngineConfig, KvCacheSize, Prompt, SamplingParams};
use gpu_check::figures::{Figures, Res, finish};
use kernels::cuda::{CudaDevice, CudaKernels};
use kv_cache::cuda::CudaKvCache;
use kv_cache::{CacheConfig, KvCache};
use model::cuda::{BatchLimits, CudaLlama, LOGIT_TOLERANCE, StepDriver, argmax, max_rel_error};
use model::{Llama, Workspace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Map, Value, json};

fn main() -> ExitCode {
    let work = std::env::temp_dir().join(format!("gpu-model-check-{}", std::process::id()));
    let mut figures = Figures::new();
    let result = run(&work, &mut figures);
    let _ = std::fs::remove_dir_all(&work);
    finish("gpu_model_check", "model_check.passed", figures, result)
}

fn run(work: &Path, figures: &mut Figures) -> Res<usize> {
    let device = CudaDevice::open(0)?;
    figures.insert("device".into(), Value::String(device.name()?));
    let kernels = Arc::new(CudaKernels::new(device.clone())?);
    let mut failures = 0;
    for (name, shape, seed) in [("tiny", &TINY, 11), ("tiny_g4_h128", &TINY_G4_H128, 13)] {
        let dir = work.join(name);
        write_folder(&dir, shape, Dtype::F32, seed)?;
        for dtype in [DType::BF16, DType::F16] {
            failures += forward_check(&dir, name, &kernels, dtype, figures)?;
        }
    }
    let start = Instant::now();
    let big = work.join("llama-3.2-1b-random");
    write_folder(&big, &LLAMA_32_1B, Dtype::BF16, 12)?;
    figures.insert("cuda.e2e_write_model_s".into(), json!(start.elapsed().as_secs_f64()));
    e2e(&big, figures)?;
    Ok(failures)
}

/// The shape of a random Llama.
#[derive(Debug)]
struct Shape {
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    max_pos: usize,
    tied: bool,
    llama3_rope: bool,
}

const TINY: Shape = Shape {
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
const TINY_G4_H128: Shape = Shape {
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
const LLAMA_32_1B: Shape = Shape {
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

/// A tensor to generate: name, shape, and `(fan_in, gain)` (`None`: a norm weight of ones).
type TensorSpec = (String, Vec<usize>, Option<(usize, f32)>);

/// An HF folder: config, generation config, a byte-level tokenizer covering the vocabulary,
/// and random weights (uniform, std `gain/sqrt(fan_in)`, norms 1).
fn write_folder(dir: &Path, s: &Shape, dtype: Dtype, seed: u64) -> Res<()> {
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
fn random_bytes(n: usize, init: Option<(usize, f32)>, dtype: Dtype, seed: u64) -> Vec<u8> {
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
fn tokenizer_json(vocab: usize) -> String {
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

/// CPU (f32 cache) against CUDA (`dtype` weights and cache) on the same steps: four prompts (up
/// to 1 100 tokens, so decode attention runs v2 over several partitions) prefilled in chunks
/// of different sizes, mixed with decodes, then decode-only steps; the next token of every
/// sampled sequence is the CPU's greedy choice, so both stay in step. A row fails when its
/// logits are off by more than `LOGIT_TOLERANCE`, or when the CUDA argmax differs from the
/// CPU's although the CPU's top two are further apart than twice that tolerance (not a tie).
fn forward_check(
    dir: &Path,
    shape: &str,
    kernels: &Arc<CudaKernels>,
    dtype: DType,
    figures: &mut Figures,
) -> Res<usize> {
    let model = Llama::load(dir)?;
    let c = model.config.clone();
    let limits = BatchLimits { max_tokens: 1024, max_samples: 8, max_model_len: 2048 };
    let mut gpu = CudaLlama::new(&model, kernels.clone(), dtype, limits)?;
    let block_size = 16;
    let num_blocks = 256;
    let cache = |dtype| CacheConfig::new(c.block_shape(block_size, dtype), num_blocks, 0);
    let mut cpu_cache = KvCache::new(cache(DType::F32))?;
    let mut gpu_cache = CudaKvCache::new(cache(dtype), kernels.device().stream().clone())?;
    let mut ws = Workspace::default();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let prompts: Vec<Vec<u32>> = [700usize, 61, 7, 1100]
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..c.vocab_size as u32)).collect())
        .collect();
    let mut driver = StepDriver::new(prompts, block_size);
    // Prefill chunks (256/48/7/256 tokens a step) until every prompt is in, then 8 decode steps.
    let mut schedule: Vec<[usize; 4]> = vec![[256, 48, 7, 256]; 5];
    schedule.extend(std::iter::repeat_n([1usize; 4], 8));
    let (mut worst, mut rows, mut agree, mut ties, mut wrong) = (0.0f32, 0usize, 0usize, 0usize, 0usize);
    for chunks in &schedule {
        let batch = driver.step(chunks);
        if batch.token_ids.is_empty() {
            continue;
        }
        let input = batch.input();
        let want = model.forward(&input, &mut cpu_cache, &mut ws)?.to_vec();
        let got = gpu.forward(&input, &mut gpu_cache)?;
        for (r, &s) in batch.sampled_seqs.iter().enumerate() {
            let (w, g) =
                (&want[r * c.vocab_size..][..c.vocab_size], &got[r * c.vocab_size..][..c.vocab_size]);
            worst = worst.max(max_rel_error(g, w));
            rows += 1;
            let token = argmax(w);
            if argmax(g) == token {
                agree += 1;
            } else if top2_gap(w) <= 2.0 * LOGIT_TOLERANCE * w.iter().fold(1.0f32, |m, v| m.max(v.abs())) {
                ties += 1;
            } else {
                wrong += 1;
            }
            driver.append(s, token);
        }
    }
    let name = format!("{shape}_{}", dtype.name());
    figures.insert(format!("cuda.forward_{name}_max_rel_logit_error"), json!(worst));
    figures.insert(format!("cuda.forward_{name}_rows"), json!(rows));
    figures.insert(format!("cuda.forward_{name}_greedy_agreement"), json!(agree as f64 / rows.max(1) as f64));
    figures.insert(format!("cuda.forward_{name}_greedy_disagreements_not_ties"), json!(wrong));
    let failed = worst.is_nan() || worst > LOGIT_TOLERANCE || rows == 0 || wrong > 0;
    eprintln!(
        "forward {name}: {rows} rows, max relative logit error {worst:.4} (tolerance {LOGIT_TOLERANCE}), greedy agreement {agree}/{rows} ({ties} near ties, {wrong} real disagreements){}",
        if failed { "  FAIL" } else { "" }
    );
    Ok(usize::from(failed))
}

/// The gap between the largest and the second-largest value of a row.
fn top2_gap(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            (a, b) = (v, a);
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// `cuda.e2e_output_tok_s`: 256 requests × (512 in, 128 out), all submitted at once.
fn e2e(dir: &Path, figures: &mut Figures) -> Res<()> {
    let config = EngineConfig {
        device: Device::Cuda { ordinal: 0 },
        kv_dtype: DType::BF16,
        max_model_len: Some(1024),
        max_num_seqs: 256,
        max_num_batched_tokens: 8192,
        kv_cache: KvCacheSize::Bytes(0),
        gpu_memory_utilization: 0.9,
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    };
    let start = Instant::now();
    let mut engine = Engine::new(dir, config)?;
    figures.insert("cuda.e2e_load_s".into(), json!(start.elapsed().as_secs_f64()));
    figures.insert("cuda.e2e_kv_blocks".into(), json!(engine.num_kv_blocks()));
    let vocab = engine.model_config().vocab_size;
    let eos = engine.eos_token_ids().to_vec();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(128) };
    let mut random_prompts = |n: usize| -> Vec<Prompt> {
        (0..n).map(|_| Prompt::Tokens(engine::workload::random_prompt(&mut rng, 512, vocab, &eos))).collect()
    };
    // Warm-up (cuBLAS heuristics, first launches), not timed.
    engine.generate(random_prompts(8), &SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) })?;
    engine.reset_metrics();
    let prompts = random_prompts(256);
    let start = Instant::now();
    let results = engine.generate(prompts, &params)?;
    let wall = start.elapsed().as_secs_f64();
    let failed = results.iter().filter(|r| r.is_err()).count();
    let m = engine.metrics();
    figures.insert("cuda.e2e_output_tok_s".into(), json!(m.generation_tokens as f64 / wall));
    figures
        .insert("cuda.e2e_total_tok_s".into(), json!((m.generation_tokens + m.prompt_tokens) as f64 / wall));
    figures.insert("cuda.e2e_seconds".into(), json!(wall));
    figures.insert("cuda.e2e_failed_requests".into(), json!(failed));
    eprintln!(
        "e2e: 256 x (512 in, 128 out) in {wall:.2} s: {:.0} output tok/s, {} generated, {failed} failed",
        m.generation_tokens as f64 / wall,
        m.generation_tokens
    );
    if failed > 0 || m.generation_tokens != 256 * 128 {
        return Err(format!("e2e: {failed} requests failed, {} tokens generated", m.generation_tokens).into());
    }
    Ok(())
}
