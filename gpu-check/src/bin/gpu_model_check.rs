//! `gpu_model_check`: the model half of the GPU run (the kernel half is `gpu_check`). On a lent GPU it
//! 1. writes two tiny random Llamas (`gpu_check::model_cases`: GQA group 2 with heads of 64;
//!    group 4 with heads of 128, tied embeddings and llama3 RoPE) as ordinary HF folders, loads
//!    them through the normal loader, and runs the CPU forward (f32) and the CUDA forward (bf16,
//!    then f16) through the same chunked-prefill and decode steps over contexts past one v2
//!    partition (up to 1 100 tokens), holding every CUDA logit to its
//!    `model::cuda::LogitTolerance` (5 standard deviations of the error the CUDA forward's
//!    bf16/f16 roundings predict for that logit; the derivation and its calibration are in
//!    `model/src/cuda/tolerance.rs`) and requiring the CUDA greedy token to be the CPU's on
//!    every row that is not a near tie (two tokens whose CPU logits lie within their
//!    tolerances' sum);
//! 2. writes a random-weight Llama-3.2-1B-shaped folder (bf16, generated here, never carried)
//!    and measures `cuda.e2e_output_tok_s`: 256 requests of 512 random prompt tokens and 128
//!    output tokens each, submitted at once, through the engine on CUDA.
//!
//! Each check reports on its own (`time.<check>_s`; an error is `error.<check>` and one
//! failure) and none stops the others. Estimated time on the H200 machine, from the sizes:
//! - each of the four forward checks (2 shapes × bf16/f16): 13 steps over 1 868 prompt tokens
//!   and 32 decodes; the CPU forward is ~9 GFLOP (`tiny`) or ~18 GFLOP (`tiny_g4_h128`), a
//!   second or two on 16 cores with loading and the first launches, the CUDA side milliseconds:
//!   ~10 s for the four;
//! - e2e: 2.5 GB of random bf16 written (~5 s), loaded and uploaded (~5 s), then 131 072
//!   prefill and 32 768 decode tokens (~255 TFLOP of prefill GEMMs; 128 decode steps each bringing
//!   256 rows of 128 256 f32 logits, 131 MB, to the host): ~10–20 s.
//!
//! Under a minute in all, far inside the 200 s `run.sh` gives this binary. Writes flat JSON to
//! `$OUT/gpu_model_check.json`; exits non-zero when a check fails.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use attn_kernels::cuda::{CudaDevice, CudaKernels};
use engine::{DType, Device, Engine, EngineConfig, KvCacheSize, Prompt, SamplingParams};
use gpu_check::figures::{Figures, Res, finish, section};
use gpu_check::model_cases::{LLAMA_32_1B, TINY, TINY_G4_H128, write_folder};
use kv_cache::cuda::CudaKvCache;
use kv_cache::{CacheConfig, KvCache};
use model::cuda::{BatchLimits, CudaLlama, Greedy, LogitTolerance, StepDriver, argmax};
use model::{Llama, Workspace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::Dtype;
use serde_json::{Value, json};

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
        if let Err(e) = write_folder(&dir, shape, Dtype::F32, seed) {
            failures += section(&format!("forward_{name}"), figures, |_| Err(e));
            continue;
        }
        for dtype in [DType::BF16, DType::F16] {
            let label = format!("forward_{name}_{}", dtype.name());
            failures += section(&label, figures, |f| forward_check(&dir, name, &kernels, dtype, f));
        }
    }
    failures += section("e2e", figures, |f| {
        let start = Instant::now();
        let big = work.join("llama-3.2-1b-random");
        write_folder(&big, &LLAMA_32_1B, Dtype::BF16, 12)?;
        f.insert("cuda.e2e_write_model_s".into(), json!(start.elapsed().as_secs_f64()));
        e2e(&big, f).map(|()| 0)
    });
    Ok(failures)
}

/// CPU (f32 cache) against CUDA (`dtype` weights and cache) on the same steps: four prompts (up
/// to 1 100 tokens, so decode attention runs v2 over several partitions) prefilled in chunks
/// of different sizes, mixed with decodes, then decode-only steps; the next token of every
/// sampled sequence is the CPU's greedy choice, so both stay in step. A row fails when one of
/// its logits is further from the CPU's than that token's [`LogitTolerance`] (derived from the
/// CUDA forward's bf16/f16 roundings and the logit's magnitude), or when the CUDA argmax differs
/// from the CPU's outside a near tie (the CPU's logits of the two tokens further apart than
/// their tolerances together).
fn forward_check(
    dir: &Path,
    shape: &str,
    kernels: &Arc<CudaKernels>,
    dtype: DType,
    figures: &mut Figures,
) -> Res<usize> {
    let model = Llama::load(dir)?;
    let c = model.config.clone();
    let tolerance = LogitTolerance::new(&model, dtype)?;
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
    let (mut worst, mut rows, mut failed_rows) = (0.0f32, 0usize, 0usize);
    let (mut agree, mut ties, mut wrong) = (0usize, 0usize, 0usize);
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
            let check = tolerance.check_row(g, w);
            worst = worst.max(check.worst);
            rows += 1;
            failed_rows += usize::from(!check.passed());
            match check.greedy {
                Greedy::Agree => agree += 1,
                Greedy::NearTie => ties += 1,
                Greedy::Disagree => wrong += 1,
            }
            driver.append(s, argmax(w));
        }
    }
    let name = format!("{shape}_{}", dtype.name());
    figures.insert(format!("cuda.forward_{name}_max_logit_error_over_tolerance"), json!(finite(worst)));
    figures.insert(format!("cuda.forward_{name}_rows"), json!(rows));
    figures.insert(format!("cuda.forward_{name}_failed_rows"), json!(failed_rows));
    figures.insert(format!("cuda.forward_{name}_greedy_agreement"), json!(agree as f64 / rows.max(1) as f64));
    figures.insert(format!("cuda.forward_{name}_greedy_near_ties"), json!(ties));
    figures.insert(format!("cuda.forward_{name}_greedy_disagreements_not_ties"), json!(wrong));
    let failed = failed_rows > 0 || rows == 0;
    eprintln!(
        "forward {name}: {rows} rows, largest logit error {worst:.3} of its tolerance ({failed_rows} rows failed), greedy agreement {agree}/{rows} ({ties} near ties, {wrong} real disagreements){}",
        if failed { "  FAIL" } else { "" }
    );
    Ok(usize::from(failed))
}

/// `v`, or 1e30 for a NaN or an infinity (JSON has neither).
fn finite(v: f32) -> f64 {
    if v.is_finite() { f64::from(v) } else { 1e30 }
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
