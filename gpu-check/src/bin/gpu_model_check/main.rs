//! `gpu_model_check`: the model half of the GPU run (the kernel half is `gpu_check`), one section
//! per process (`gpu_model_check --only SECTION`, as `gpu_run` starts it):
//! - `model_bf16`, `model_f16`: writes two tiny random Llamas (`gpu_check::model_cases`: GQA
//!   group 2 with heads of 64; group 4 with heads of 128, tied embeddings and llama3 RoPE) as
//!   ordinary HF folders, loads them through the normal loader (the first a second time with
//!   every architecture feature switched on), and runs the CPU forward (f32)
//!   and the CUDA forward (bf16 or f16) through the same chunked-prefill and decode steps over
//!   contexts past one v2 partition (up to 1 100 tokens), holding every CUDA logit to its
//!   `model::cuda::LogitTolerance` (5 standard deviations of the error the CUDA forward's
//!   bf16/f16 roundings predict for that logit; the derivation and its calibration are in
//!   `model/src/cuda/tolerance.rs`) and requiring the CUDA greedy token to be the CPU's on
//!   every row that is not a near tie (two tokens whose CPU logits lie within their
//!   tolerances' sum); each shape is a case;
//! - `model_families`: the same check (bf16) on the tiny checkpoint of every family (Llama,
//!   Mistral, Qwen2, Qwen3, Gemma 3, Phi-3: biases, q/k norms, sandwich norms, YaRN, LongRoPE,
//!   local and global rotary tables, fused projections) over contexts inside its windows;
//! - `e2e_greedy` (`greedy.rs`): the engine on CUDA (bf16 weights and cache) generates greedy
//!   tokens for a batch of prompts; the CPU forward, fed the GPU's own tokens, checks each one
//!   is its argmax or a near tie;
//! - `e2e`: writes a random-weight Llama-3.2-1B-shaped folder (bf16, generated here, never
//!   carried) and measures `cuda.e2e_output_tok_s`: 256 requests of 512 random prompt tokens
//!   and 128 output tokens each, submitted at once, through the engine on CUDA; and its
//!   decode-only steps' bytes (the weights once, every sequence's KV) over a 1 GiB device copy's
//!   bandwidth, `cuda.e2e_decode_step_bw_fraction`.
//!
//! Estimated time on the H200 machine (the table in `gpu_check::sections`): each forward check
//! is 13 steps over 1 868 prompt tokens and 32 decodes, a CPU forward of ~9 or ~18 GFLOP (a
//! second or two on 16 cores with loading), the CUDA side milliseconds; `e2e` writes 2.5 GB of
//! random bf16 (~5 s), loads and uploads it (~5 s), then runs 131 072 prefill and 32 768 decode
//! tokens (~255 TFLOP of prefill GEMMs; the greedy tokens are picked on the device, so a decode
//! step brings 256 ids to the host, not 131 MB of logits): ~10–20 s.

mod greedy;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use attn_kernels::cuda::{CudaDevice, CudaKernels};
use engine::{DType, Device, Engine, EngineConfig, KvCacheSize, Prompt, SamplingParams};
use gpu_check::device_timing::copy_bytes_per_sec;
use gpu_check::figures::{Recorder, Res, run_section};
use gpu_check::model_cases::{LLAMA_32_1B, TINY, TINY_G4_H128, write_folder};
use gpu_check::sections::{self, Program};
use kv_cache::cuda::CudaKvCache;
use kv_cache::{CacheConfig, KvCache};
use model::cuda::{BatchLimits, CudaModel, Greedy, LogitTolerance, StepDriver, argmax};
use model::{Model, Workspace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::Dtype;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned() else {
        let names: Vec<&str> = sections::of(Program::Model).map(|s| s.name).collect();
        eprintln!("usage: gpu_model_check --only SECTION ({})", names.join(", "));
        return ExitCode::from(2);
    };
    if sections::by_name(&name).is_none_or(|s| s.program != Program::Model) {
        eprintln!("gpu_model_check: no section {name}");
        return ExitCode::from(2);
    }
    let work = std::env::temp_dir().join(format!("gpu-model-check-{}", std::process::id()));
    let code = run_section(&name, |rec| run(&name, &work, rec));
    let _ = std::fs::remove_dir_all(&work);
    code
}

fn run(name: &str, work: &Path, rec: &mut Recorder) -> Res<()> {
    let device = CudaDevice::open(0)?;
    rec.figure("device", device.name()?);
    let kernels = Arc::new(CudaKernels::new(device.clone())?);
    match name {
        "model_bf16" => forward_checks(work, &kernels, DType::BF16, rec),
        "model_f16" => forward_checks(work, &kernels, DType::F16, rec),
        "model_families" => family_checks(&kernels, DType::BF16, rec),
        "e2e_greedy" => greedy::check(work, rec),
        "e2e" => {
            let start = Instant::now();
            let big = work.join("llama-3.2-1b-random");
            write_folder(&big, &LLAMA_32_1B, Dtype::BF16, 12)?;
            rec.figure("cuda.e2e_write_model_s", start.elapsed().as_secs_f64());
            let copy_bps = copy_bytes_per_sec(&device)?;
            rec.figure("cuda.e2e_copy_tb_s", copy_bps / 1e12);
            e2e(&big, copy_bps, rec)
        }
        other => Err(format!("gpu_model_check has no section {other}").into()),
    }
}

/// Both tiny Llama shapes, and the first with every difference an architecture can describe
/// switched on (biases, per-head and sandwich norms, GeGLU, `1 + w` norms, embedding scale,
/// soft-cap), in `dtype`: each a case that passes or fails (an error of one case is recorded,
/// and the others still run).
fn forward_checks(work: &Path, kernels: &Arc<CudaKernels>, dtype: DType, rec: &mut Recorder) -> Res<()> {
    let cases = [
        ("tiny", &TINY, 11, false),
        ("tiny_g4_h128", &TINY_G4_H128, 13, false),
        ("tiny_every_feature", &TINY, 17, true),
    ];
    for (name, shape, seed, every_feature) in cases {
        let dir = work.join(name);
        let outcome = write_folder(&dir, shape, Dtype::F32, seed).and_then(|()| {
            let model = Model::load(&dir)?;
            let model =
                if every_feature { model::testing::with_every_architecture_feature(model, 6) } else { model };
            forward_check(model, name, &LONG_CONTEXTS, kernels, dtype, rec)
        });
        if let Err(e) = outcome {
            rec.error(format!("forward {name} {}: {e}", dtype.name()));
        }
    }
    Ok(())
}

/// The tiny checkpoint of every family (`model/tests/data/families`, carried in the bundle's
/// `families/`) in `dtype`, each a case, over contexts that stay inside its smallest sliding
/// window (the CUDA kernels attend causally).
fn family_checks(kernels: &Arc<CudaKernels>, dtype: DType, rec: &mut Recorder) -> Res<()> {
    let bundled = std::env::current_exe()?.with_file_name("families");
    let dir = if bundled.is_dir() {
        bundled
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/data/families")
    };
    let mut names: Vec<_> = std::fs::read_dir(&dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    names.retain(|p| p.join("config.json").exists());
    names.sort();
    for path in names {
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().replace('-', "_"));
        let outcome = Model::load(&path).map_err(Into::into).and_then(|model| {
            let limit = model.config.max_full_attention_context();
            let workload = Workload {
                prompts: [limit - 8, limit / 2, 5, limit - 9],
                chunks: [16, 8, 7, 16],
                decodes: 8,
                max_model_len: limit,
            };
            forward_check(model, &format!("family_{name}"), &workload, kernels, dtype, rec)
        });
        if let Err(e) = outcome {
            rec.error(format!("forward family {name} {}: {e}", dtype.name()));
        }
    }
    Ok(())
}

/// What [`forward_check`] runs: four prompts, prefilled `chunks` tokens a step, then `decodes`
/// decode steps, contexts up to `max_model_len`.
struct Workload {
    prompts: [usize; 4],
    chunks: [usize; 4],
    decodes: usize,
    max_model_len: usize,
}

/// Prompts up to 1 100 tokens, so decode attention runs v2 over several partitions.
const LONG_CONTEXTS: Workload =
    Workload { prompts: [700, 61, 7, 1100], chunks: [256, 48, 7, 256], decodes: 8, max_model_len: 2048 };

/// CPU (f32 cache) against CUDA (`dtype` weights and cache) on the same steps: the workload's
/// four prompts prefilled in chunks of different sizes, mixed with decodes, then decode-only
/// steps; the next token of every
/// sampled sequence is the CPU's greedy choice, so both stay in step. A row fails when one of
/// its logits is further from the CPU's than that token's [`LogitTolerance`] (derived from the
/// CUDA forward's bf16/f16 roundings and the logit's magnitude), or when the CUDA argmax differs
/// from the CPU's outside a near tie (the CPU's logits of the two tokens further apart than
/// their tolerances together).
fn forward_check(
    model: Model,
    shape: &str,
    work: &Workload,
    kernels: &Arc<CudaKernels>,
    dtype: DType,
    rec: &mut Recorder,
) -> Res<()> {
    let c = model.config.clone();
    let tolerance = LogitTolerance::new(&model, dtype)?;
    let limits = BatchLimits { max_tokens: 1024, max_samples: 8, max_model_len: work.max_model_len };
    let mut gpu = CudaModel::new(&model, kernels.clone(), dtype, limits)?;
    let block_size = 16;
    let num_blocks = 256;
    let cache = |dtype| CacheConfig::new(c.block_shape(block_size, dtype), num_blocks, 0);
    let mut cpu_cache = KvCache::new(cache(DType::F32))?;
    let mut gpu_cache = CudaKvCache::new(cache(dtype), kernels.device().stream().clone())?;
    let mut ws = Workspace::default();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let prompts: Vec<Vec<u32>> = work
        .prompts
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..c.vocab_size as u32)).collect())
        .collect();
    let mut driver = StepDriver::new(prompts, block_size);
    // Prefill chunks until every prompt is in, then the decode steps.
    let longest = work.prompts.iter().zip(work.chunks).map(|(p, c)| p.div_ceil(c)).max().unwrap_or(0);
    let mut schedule: Vec<[usize; 4]> = vec![work.chunks; longest];
    schedule.extend(std::iter::repeat_n([1usize; 4], work.decodes));
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
    rec.figure(format!("cuda.forward_{name}_max_logit_error_over_tolerance"), finite(worst));
    rec.figure(format!("cuda.forward_{name}_rows"), rows);
    rec.figure(format!("cuda.forward_{name}_failed_rows"), failed_rows);
    rec.figure(format!("cuda.forward_{name}_greedy_agreement"), agree as f64 / rows.max(1) as f64);
    rec.figure(format!("cuda.forward_{name}_greedy_near_ties"), ties);
    rec.figure(format!("cuda.forward_{name}_greedy_disagreements_not_ties"), wrong);
    let summary = format!(
        "forward {name} (heads {}/{} of {}): {rows} rows, largest logit error {worst:.3} of its tolerance ({failed_rows} rows failed), greedy agreement {agree}/{rows} ({ties} near ties, {wrong} real disagreements)",
        c.num_attention_heads, c.num_key_value_heads, c.head_dim
    );
    if failed_rows > 0 || wrong > 0 || rows == 0 {
        rec.fail(summary);
    } else {
        eprintln!("{summary}");
        rec.pass(1);
    }
    Ok(())
}

/// `v`, or 1e30 for a NaN or an infinity (JSON has neither).
fn finite(v: f32) -> f64 {
    if v.is_finite() { f64::from(v) } else { 1e30 }
}

/// The engine on GPU 0 with bf16 weights and cache, contexts up to 1 024 tokens, no periodic log.
fn cuda_bf16_config() -> EngineConfig {
    EngineConfig {
        device: Device::Cuda { ordinal: 0 },
        kv_dtype: DType::BF16,
        max_model_len: Some(1024),
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// `cuda.e2e_output_tok_s`: 256 requests × (512 in, 128 out), all submitted at once; and the
/// decode-only steps' bytes (weights once, every sequence's KV) over `copy_bps`.
fn e2e(dir: &Path, copy_bps: f64, rec: &mut Recorder) -> Res<()> {
    let config = EngineConfig {
        max_num_seqs: 256,
        max_num_batched_tokens: 8192,
        kv_cache: KvCacheSize::Bytes(0),
        gpu_memory_utilization: 0.9,
        ..cuda_bf16_config()
    };
    let start = Instant::now();
    let mut engine = Engine::new(dir, config)?;
    rec.figure("cuda.e2e_load_s", start.elapsed().as_secs_f64());
    rec.figure("cuda.e2e_kv_blocks", engine.num_kv_blocks());
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
    rec.figure("cuda.e2e_output_tok_s", m.generation_tokens as f64 / wall);
    rec.figure("cuda.e2e_total_tok_s", (m.generation_tokens + m.prompt_tokens) as f64 / wall);
    rec.figure("cuda.e2e_seconds", wall);
    rec.figure("cuda.e2e_failed_requests", failed);
    let d = m.decode_steps;
    if d.steps > 0 {
        let c = engine.model_config();
        // bf16 K and V of every layer per token of context.
        let kv_per_token = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 2;
        let bytes = engine.weight_bytes_per_step() as f64
            + d.context_tokens as f64 / d.steps as f64 * kv_per_token as f64;
        let step_s = d.total_s() / d.steps as f64;
        rec.figure("cuda.e2e_decode_steps", d.steps);
        rec.figure("cuda.e2e_decode_step_ms", step_s * 1e3);
        rec.figure("cuda.e2e_decode_step_forward_ms", d.forward_s / d.steps as f64 * 1e3);
        rec.figure("cuda.e2e_decode_step_mb", bytes / 1e6);
        rec.figure("cuda.e2e_decode_step_bw_fraction", bytes / step_s / copy_bps);
        eprintln!(
            "e2e: {} decode-only steps of {:.2} ms reading {:.0} MB: {:.2} of the copy bandwidth",
            d.steps,
            step_s * 1e3,
            bytes / 1e6,
            bytes / step_s / copy_bps
        );
    }
    eprintln!(
        "e2e: 256 x (512 in, 128 out) in {wall:.2} s: {:.0} output tok/s, {} generated, {failed} failed",
        m.generation_tokens as f64 / wall,
        m.generation_tokens
    );
    if failed > 0 || m.generation_tokens != 256 * 128 {
        rec.fail(format!(
            "e2e 256 x (512 in, 128 out): {failed} requests failed, {} tokens generated",
            m.generation_tokens
        ));
    } else {
        rec.pass(1);
    }
    Ok(())
}
