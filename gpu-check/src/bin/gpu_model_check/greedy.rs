//! The `e2e_greedy` section: the engine on CUDA (bf16 weights, bf16 cache, chunked prefill)
//! generates greedy tokens for prompts of 1 to 700 tokens; the CPU forward (f32), fed the
//! GPU's own tokens step by step, checks every one: the CPU's argmax, or a near tie (the CPU
//! logits of the two tokens within the sum of their `LogitTolerance`s). Feeding the GPU's tokens
//! keeps every position meaningful after a first (tie) divergence.
//!
//! The model: the HF folder named by `$GPU_CHECK_GREEDY_MODEL` (the real SmolLM2 where it can
//! be carried to the device), else random weights of SmolLM2-135M's shape written here, whose
//! tied embeddings spread the logits so that greedy choices are decisive.

use std::path::{Path, PathBuf};

use engine::{DType, Engine, EngineConfig, KvCacheSize, Prompt, SamplingParams};
use gpu_check::figures::{Recorder, Res};
use gpu_check::model_cases::{SMOLLM2_135M, write_folder};
use kv_cache::{CacheConfig, KvCache};
use model::cuda::{LogitTolerance, StepDriver, argmax};
use model::{Model, Workspace};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::Dtype;

/// The folder of the model to check instead of the random one.
pub const GREEDY_MODEL_ENV: &str = "GPU_CHECK_GREEDY_MODEL";

/// Prompt lengths: a single token, short ones, and prompts that the 256-token step budget
/// splits into chunks.
const PROMPT_LENS: [usize; 8] = [1, 7, 33, 61, 130, 300, 511, 700];
/// Greedy tokens generated per prompt.
const OUT_TOKENS: usize = 48;
/// Tokens a CPU step takes from each sequence (the prompts prefill in chunks there too).
const CPU_CHUNK: usize = 256;

/// One sequence's token ids.
type Tokens = Vec<u32>;

/// How the GPU's tokens compare with the CPU forward's.
#[derive(Debug, Default)]
struct Tally {
    tokens: usize,
    agree: usize,
    ties: usize,
    wrong: usize,
}

pub fn check(work: &Path, rec: &mut Recorder) -> Res<()> {
    let (dir, which) = match std::env::var_os(GREEDY_MODEL_ENV) {
        Some(d) => (PathBuf::from(d), "the folder in $GPU_CHECK_GREEDY_MODEL"),
        None => {
            let d = work.join("smollm2-shaped");
            write_folder(&d, &SMOLLM2_135M, Dtype::BF16, 21)?;
            (d, "random weights of SmolLM2-135M's shape")
        }
    };
    rec.figure("cuda.e2e_greedy_model", which);
    let (prompts, gpu) = generate_on_gpu(&dir)?;
    let model = Model::load(&dir)?;
    let tolerance = LogitTolerance::new(&model, DType::BF16)?;
    let blocks: usize = prompts.iter().map(|p| (p.len() + OUT_TOKENS + 1).div_ceil(16)).sum();
    let shape = model.config.block_shape(16, DType::F32);
    let mut cache = KvCache::new(CacheConfig::new(shape, blocks + 8, 0))?;
    let mut ws = Workspace::default();
    let mut driver = StepDriver::new(prompts.clone(), 16);
    let mut fed = vec![0usize; prompts.len()];
    let mut bad = vec![0usize; prompts.len()];
    let mut ties = vec![0usize; prompts.len()];
    let mut tally = Tally::default();
    let vocab = model.config.vocab_size;
    loop {
        let batch = driver.step(&vec![CPU_CHUNK; prompts.len()]);
        if batch.token_ids.is_empty() {
            break;
        }
        let logits = model.forward(&batch.input(), &mut cache, &mut ws)?.to_vec();
        for (r, &s) in batch.sampled_seqs.iter().enumerate() {
            let Some(&g) = gpu[s].get(fed[s]) else { continue };
            let w = &logits[r * vocab..][..vocab];
            let (a, gi) = (argmax(w) as usize, g as usize);
            tally.tokens += 1;
            if a == gi {
                tally.agree += 1;
            } else if gi < vocab && w[a] - w[gi] <= tolerance.of(a) + tolerance.of(gi) {
                tally.ties += 1;
                ties[s] += 1;
            } else {
                tally.wrong += 1;
                bad[s] += 1;
                let gap = w.get(gi).map_or(f32::INFINITY, |&v| w[a] - v);
                rec.fail(format!(
                    "e2e_greedy bf16 prompt {s} ({} tokens) output {}: GPU chose {g}, CPU argmax {a}, logit gap {gap:.3} > tolerance {:.3}",
                    prompts[s].len(),
                    fed[s],
                    tolerance.of(a) + tolerance.of(gi)
                ));
            }
            driver.append(s, g);
            fed[s] += 1;
        }
    }
    for (s, (&n, &b)) in fed.iter().zip(&bad).enumerate() {
        if n != OUT_TOKENS {
            rec.fail(format!("e2e_greedy prompt {s}: {n} GPU tokens checked, {OUT_TOKENS} expected"));
        } else if b == 0 {
            rec.pass(1);
        }
    }
    // Sequences the GPU generated exactly as the CPU's greedy decoding would have.
    let identical = (0..prompts.len()).filter(|&s| bad[s] == 0 && ties[s] == 0).count();
    rec.figure("cuda.e2e_greedy_sequences_identical", identical);
    rec.figure("cuda.e2e_greedy_tokens", tally.tokens);
    rec.figure("cuda.e2e_greedy_argmax_agreement", tally.agree as f64 / tally.tokens.max(1) as f64);
    rec.figure("cuda.e2e_greedy_near_ties", tally.ties);
    rec.figure("cuda.e2e_greedy_disagreements_not_ties", tally.wrong);
    rec.figure("cuda.e2e_greedy_prompts", prompts.len());
    eprintln!(
        "e2e_greedy: {} tokens of {} prompts: {} the CPU's argmax, {} near ties, {} real disagreements ({identical} of the sequences identical to the CPU's greedy ones)",
        tally.tokens,
        prompts.len(),
        tally.agree,
        tally.ties,
        tally.wrong
    );
    Ok(())
}

/// The prompts and the engine's greedy tokens for them on CUDA (the engine is dropped after,
/// freeing the device for nothing else: the CPU check runs on the host).
fn generate_on_gpu(dir: &Path) -> Res<(Vec<Tokens>, Vec<Tokens>)> {
    let config = EngineConfig {
        max_num_seqs: 16,
        // Smaller than the longer prompts: they prefill in chunks beside other sequences' decodes.
        max_num_batched_tokens: 256,
        kv_cache: KvCacheSize::Blocks(1024),
        ..crate::cuda_bf16_config()
    };
    let mut engine = Engine::new(dir, config)?;
    let vocab = engine.model_config().vocab_size;
    let eos = engine.eos_token_ids().to_vec();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let prompts: Vec<Vec<u32>> =
        PROMPT_LENS.iter().map(|&n| engine::workload::random_prompt(&mut rng, n, vocab, &eos)).collect();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(OUT_TOKENS) };
    let results = engine.generate(prompts.iter().cloned().map(Prompt::Tokens).collect(), &params)?;
    let mut tokens = Vec::with_capacity(results.len());
    for (i, r) in results.into_iter().enumerate() {
        let out = r.map_err(|e| format!("prompt {i}: {e}"))?;
        tokens.push(out.completions.into_iter().next().map(|c| c.token_ids).unwrap_or_default());
    }
    Ok((prompts, tokens))
}
