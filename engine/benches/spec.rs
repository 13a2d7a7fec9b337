//! Benchmark group `spec`: what speculative decoding costs and buys on the CPU.
//!
//! - `spec.verify_k4_over_k0` (SmolLM2, the Q4_1 GGUF) and `spec.l1b.verify_k4_over_k0` (random
//!   weights at Llama-3.2-1B's shapes, Q4_0): the runner's forward of one sequence at context 512
//!   scoring 5 positions (its last token and a 4-token draft, logits for all 5) over the same
//!   step scoring 1; alternating pairs, the median ratio (mean and p90 in the fragment).
//! - `spec.ngram_b1_speedup_grounded` / `spec.ngram_b1_speedup_open`: one request at a time,
//!   greedy, 128 tokens at most, on an engine with n-gram drafts (`{"method": "ngram",
//!   "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}`) and on one
//!   without, in turns: output tokens per second with over without, the median over the prompts
//!   and rounds of the committed prompt set (`spec_data/prompts.json`: answers that copy from
//!   their prompt — a code edit, an extraction, quotes, a copy — and open-ended chat prompts).
//!   `spec.ngram_identical_outputs`: the fraction of those requests whose greedy tokens came out
//!   the same with and without drafts (scoring several positions in one pass rounds the logits
//!   differently, as a batch does, so a near-tie can fall the other way).
//! - `spec.suffix_b1_speedup_grounded` / `spec.suffix_b1_speedup_open` (and `…_acceptance_…`):
//!   the same with suffix decoding (`{"method": "suffix", "num_speculative_tokens": 4}`), its
//!   cache of recent outputs holding one output fewer than the set has prompts, so that a prompt
//!   drafts from the set's other answers but never from its own answer of the round before.
//! - `spec.gemma3.ngram_b1_speedup_grounded` (and `…_acceptance_grounded`): the grounded
//!   speedup on Gemma 3 270M's Q4_K_M GGUF; `spec.gemma3.verify_k4_over_k0` its verification
//!   ratio (its 262 144-token LM head scores every position).
//! - `spec.b64_ratio`: 64 requests (the prompt set, repeated) end to end, drafts over none.
//! - `spec.draft_b1_speedup` (and `…_grounded`, `spec.draft_acceptance_open` / `…_grounded`):
//!   SmolLM2's f32 folder drafted by its own Q4_1 GGUF (`{"method": "draft_model", "model": …,
//!   "num_speculative_tokens": 4}`) over the f32 folder alone, one open-ended (grounded) prompt at
//!   a time, as the n-gram figures.
//!
//! Writes `$BENCH_FIGURES_DIR/spec.json` and the fragment `spec.md`. `SPEC_ONLY=verify` measures
//! the verification ratios alone, printed (with `SPEC_ACTIVATIONS` another activation precision);
//! `SPEC_ONLY=draft` the draft model's figures alone, printed.

use std::error::Error;
use std::path::Path;
use std::time::Instant;

use engine::spec::SpeculativeConfig;
use engine::{Engine, EngineConfig, KvCacheSize, Prompt, SamplingParams};
use model::runner::{DType, Device};
use model::{KvCacheSize as RunnerCache, Model, Runner, RunnerConfig, StepInput};

mod support;

use support::{Stats, stats};

/// Alternating pairs of the verification steps (odd, for the median).
const VERIFY_PAIRS: usize = 31;
/// Rounds over the prompt set (odd).
const ROUNDS: usize = 3;
const MAX_TOKENS: usize = 128;
const CONTEXT: usize = 512;
const BLOCK: usize = 16;

const PROMPTS: &str = include_str!("spec_data/prompts.json");
const NGRAM: &str =
    r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}"#;

type Res<T> = Result<T, Box<dyn Error>>;

/// A forward of one sequence whose first `cached` positions are in the cache, scoring the next
/// `n` tokens (logits for all of them).
fn step_input<'a>(buf: &'a StepBuf, n: usize) -> StepInput<'a> {
    StepInput {
        token_ids: &buf.tokens[..n],
        positions: &buf.positions[..n],
        slot_mapping: &buf.slots[..n],
        group_slot_mapping: &buf.others[n],
        query_start_loc: &buf.starts[n],
        seq_lens: &buf.lens[n],
        seq_rows: &[0],
        sample_indices: &buf.samples[..n],
        pool_indices: &[],
        lora: None,
    }
}

/// The owned arrays behind [`step_input`] at `cached` positions.
struct StepBuf {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<i64>,
    starts: Vec<[usize; 2]>,
    lens: Vec<[usize; 1]>,
    samples: Vec<usize>,
    /// The slots of KV cache groups 1.. (a hybrid cache's), the first `n` for each `n`.
    others: Vec<Vec<Vec<i64>>>,
}

impl StepBuf {
    fn new(cached: usize, max_n: usize, groups: usize) -> Self {
        let slots: Vec<i64> = (cached as i64..(cached + max_n) as i64).collect();
        Self {
            others: (0..=max_n).map(|n| vec![slots[..n].to_vec(); groups - 1]).collect(),
            tokens: (0..max_n as u32).map(|i| 100 + i).collect(),
            positions: (cached as u32..(cached + max_n) as u32).collect(),
            slots: (cached as i64..(cached + max_n) as i64).collect(),
            starts: (0..=max_n).map(|n| [0, n]).collect(),
            lens: (0..=max_n).map(|n| [cached + n]).collect(),
            samples: (0..max_n).collect(),
        }
    }
}

/// The verification step over the plain one on `model`: (median, mean, p90) of paired ratios.
fn verify_ratio(mut model: Model) -> Res<Stats> {
    // `SPEC_ACTIVATIONS=int8|int16|f32` measures another activation precision than the default.
    if let Ok(name) = std::env::var("SPEC_ACTIVATIONS") {
        model.activations =
            engine::config::DECODE_ACTIVATIONS.parse(&name).ok_or("SPEC_ACTIVATIONS: f32, int16 or int8")?;
    }
    let blocks = (CONTEXT + 8).div_ceil(BLOCK);
    let config = RunnerConfig {
        device: Device::Cpu,
        kv_cache: RunnerCache::Blocks(blocks),
        kv_dtype: DType::BF16,
        block_size: BLOCK,
        max_model_len: CONTEXT + 8,
        swap_bytes: 0,
        max_num_batched_tokens: CONTEXT,
        max_num_seqs: 1,
        gpu_memory_utilization: 0.9,
    };
    let mut runner = Runner::new(model, &config)?;
    // Every KV cache group (a hybrid cache's sliding windows too) takes the same blocks.
    let groups = runner.kv_group_windows().len().max(1);
    runner.write_table_row(0, 0, &(0..groups).flat_map(|_| 0..blocks as u32).collect::<Vec<_>>())?;
    // The context: one prompt of CONTEXT tokens in the cache.
    let prompt = StepBuf::new(0, CONTEXT, groups);
    let last = [CONTEXT - 1];
    runner.forward(&StepInput { sample_indices: &last, ..step_input(&prompt, CONTEXT) })?;
    let step = StepBuf::new(CONTEXT, 5, groups);
    let mut time = |n: usize| -> Result<f64, Box<dyn Error>> {
        let t = Instant::now();
        runner.forward(&step_input(&step, n))?;
        Ok(t.elapsed().as_secs_f64())
    };
    time(1)?;
    time(5)?;
    let mut ratios = Vec::with_capacity(VERIFY_PAIRS);
    for i in 0..VERIFY_PAIRS {
        // The one that goes first alternates, so drift falls on both alike.
        let (plain, verify) = if i % 2 == 0 {
            let plain = time(1)?;
            (plain, time(5)?)
        } else {
            let verify = time(5)?;
            (time(1)?, verify)
        };
        ratios.push(verify / plain);
    }
    Ok(stats(ratios))
}

fn engine(gguf: &Path, spec: Option<&str>) -> Result<Engine, Box<dyn Error>> {
    let config = EngineConfig {
        kv_cache: KvCacheSize::Blocks(1024),
        log_interval: std::time::Duration::ZERO,
        speculative_config: spec.map(SpeculativeConfig::from_json).transpose()?,
        ..EngineConfig::default()
    };
    Ok(Engine::new(gguf, config)?)
}

/// [`engine`] over Gemma 3's GGUF, which carries no chat template: Gemma 3's own (the copy the
/// template tests hold).
fn gemma3_engine(gguf: &Path, spec: Option<&str>) -> Result<Engine, Box<dyn Error>> {
    let template = support::root().join("model/tests/data/chat_templates/gemma-3-it.jinja");
    let config = EngineConfig {
        kv_cache: KvCacheSize::Blocks(1024),
        log_interval: std::time::Duration::ZERO,
        speculative_config: spec.map(SpeculativeConfig::from_json).transpose()?,
        chat_template: Some(template),
        ..EngineConfig::default()
    };
    Ok(Engine::new(gguf, config)?)
}

/// SmolLM2's f32 folder with its Q4_1 GGUF `q4_1` as the draft over the folder alone, on the
/// grounded then the open prompts: each set's speedup and acceptance.
fn draft_model(q4_1: &Path) -> Res<Vec<(Stats, f64)>> {
    let folder = model::testing::smollm2_dir_fetched()?;
    let json = serde_json::json!({"method": "draft_model", "model": q4_1, "num_speculative_tokens": 4});
    let (mut plain, mut drafted) = (engine(&folder, None)?, engine(&folder, Some(&json.to_string()))?);
    let mut out = Vec::new();
    for set in ["grounded", "open"] {
        let (speedup, acceptance, same) = speedup_b1(&mut plain, &mut drafted, set)?;
        eprintln!(
            "f32 with a Q4_1 draft, b1 speedup, {set}: {:.3} (acceptance {acceptance:.2}, identical {same:.2})",
            speedup.0
        );
        out.push((speedup, acceptance));
    }
    Ok(out)
}

/// Suffix decoding's settings for prompt set `set`: a cache one output short of the set.
fn suffix_json(set: &str) -> Res<String> {
    let cached = prompts(set)?.len().saturating_sub(1);
    Ok(format!(
        r#"{{"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_cached_requests": {cached}}}"#
    ))
}

/// The chat prompts of a set of `prompts.json`.
fn prompts(set: &str) -> Result<Vec<Prompt>, Box<dyn Error>> {
    let all: serde_json::Value = serde_json::from_str(PROMPTS)?;
    let list = all[set].as_array().ok_or("prompt set missing")?;
    Ok(list
        .iter()
        .filter_map(|p| p["prompt"].as_str())
        .map(|text| Prompt::Chat(vec![model::ChatMessage::new("user", text)]))
        .collect())
}

/// Generates `prompts` at once; returns the tokens and the seconds it took.
fn generate(engine: &mut Engine, prompts: &[Prompt]) -> Res<(Vec<Vec<u32>>, f64)> {
    let params = SamplingParams::greedy(MAX_TOKENS);
    let t = Instant::now();
    let outs = engine.generate(prompts.to_vec(), &params)?;
    let secs = t.elapsed().as_secs_f64();
    let tokens =
        outs.into_iter().map(|o| o.map(|o| o.completions[0].token_ids.clone())).collect::<Result<_, _>>()?;
    Ok((tokens, secs))
}

/// Drafts over none, one prompt at a time, in turns: (median, mean, p90) of the time ratios
/// (plain ÷ drafted, so above 1 is a speedup) and the drafts' acceptance.
fn speedup_b1(plain: &mut Engine, spec: &mut Engine, set: &str) -> Res<(Stats, f64, f64)> {
    let (mut ratios, mut same, mut total) = (Vec::new(), 0, 0);
    let before = spec.metrics().spec_decode;
    for round in 0..ROUNDS {
        for p in prompts(set)? {
            let one = [p];
            let ((a, ta), (b, tb)) = if round % 2 == 0 {
                let a = generate(plain, &one)?;
                (a, generate(spec, &one)?)
            } else {
                let b = generate(spec, &one)?;
                (generate(plain, &one)?, b)
            };
            // Scoring several positions in one pass rounds the logits differently from one at a
            // time (as a batch does): a near-tie can fall the other way. Counted, not hidden.
            same += usize::from(a == b);
            total += 1;
            ratios.push(ta / tb);
        }
    }
    let after = spec.metrics().spec_decode;
    let drafted = (after.num_draft_tokens - before.num_draft_tokens).max(1);
    let acceptance = (after.num_accepted_tokens - before.num_accepted_tokens) as f64 / drafted as f64;
    Ok((stats(ratios), acceptance, same as f64 / total.max(1) as f64))
}

fn main() -> Result<(), Box<dyn Error>> {
    let smol = model::testing::default_model_fetched()?;
    let (v_smol, v_smol_mean, v_smol_p90) = verify_ratio(Model::load(&smol)?)?;
    eprintln!("verify k=4 over k=0, SmolLM2: {v_smol:.3}");
    let gemma = model::testing::gemma3_gguf_fetched()?;
    let (v_gemma, _, _) = verify_ratio(Model::load(&gemma)?)?;
    eprintln!("verify k=4 over k=0, Gemma 3: {v_gemma:.3}");
    let l1b = model::testing::made_model_fetched("llama-3.2-1b", "q4_0")?;
    let (v_l1b, v_l1b_mean, v_l1b_p90) = verify_ratio(Model::load(&l1b)?)?;
    eprintln!("verify k=4 over k=0, 1B shape: {v_l1b:.3}");
    if std::env::var("SPEC_ONLY").is_ok_and(|v| v == "verify") {
        return Ok(());
    }
    let draft = draft_model(&smol)?;
    if std::env::var("SPEC_ONLY").is_ok_and(|v| v == "draft") {
        return Ok(());
    }

    let (mut plain, mut spec) = (engine(&smol, None)?, engine(&smol, Some(NGRAM))?);
    let (grounded, grounded_accept, grounded_same) = speedup_b1(&mut plain, &mut spec, "grounded")?;
    eprintln!(
        "n-gram b1 speedup, grounded: {:.3} (acceptance {grounded_accept:.2}, identical outputs {grounded_same:.2})",
        grounded.0
    );
    let (open, open_accept, open_same) = speedup_b1(&mut plain, &mut spec, "open")?;
    eprintln!(
        "n-gram b1 speedup, open: {:.3} (acceptance {open_accept:.2}, identical outputs {open_same:.2})",
        open.0
    );

    let (mut gemma_plain, mut gemma_spec) =
        (gemma3_engine(&gemma, None)?, gemma3_engine(&gemma, Some(NGRAM))?);
    let (gemma3, gemma3_accept, gemma3_same) = speedup_b1(&mut gemma_plain, &mut gemma_spec, "grounded")?;
    eprintln!(
        "Gemma 3 n-gram b1 speedup, grounded: {:.3} (acceptance {gemma3_accept:.2}, identical {gemma3_same:.2})",
        gemma3.0
    );
    drop((gemma_plain, gemma_spec));

    let mut suffix = Vec::new();
    for set in ["grounded", "open"] {
        let mut drafted = engine(&smol, Some(&suffix_json(set)?))?;
        let (speedup, acceptance, same) = speedup_b1(&mut plain, &mut drafted, set)?;
        eprintln!(
            "suffix b1 speedup, {set}: {:.3} (acceptance {acceptance:.2}, identical {same:.2})",
            speedup.0
        );
        suffix.push((speedup, acceptance));
    }

    let all: Vec<Prompt> = [prompts("grounded")?, prompts("open")?].concat();
    let batch: Vec<Prompt> = all.iter().cycle().take(64).cloned().collect();
    let mut b64 = Vec::new();
    for round in 0..ROUNDS {
        let (ta, tb) = if round % 2 == 0 {
            let a = generate(&mut plain, &batch)?;
            (a.1, generate(&mut spec, &batch)?.1)
        } else {
            let b = generate(&mut spec, &batch)?.1;
            (generate(&mut plain, &batch)?.1, b)
        };
        b64.push(ta / tb);
    }
    let b64 = stats(b64);
    eprintln!("b64 ratio: {:.3}", b64.0);

    let figures = serde_json::json!({
        "spec.verify_k4_over_k0": v_smol,
        "spec.l1b.verify_k4_over_k0": v_l1b,
        "spec.gemma3.verify_k4_over_k0": v_gemma,
        "spec.ngram_b1_speedup_grounded": grounded.0,
        "spec.ngram_b1_speedup_open": open.0,
        "spec.ngram_acceptance_grounded": grounded_accept,
        "spec.ngram_acceptance_open": open_accept,
        "spec.ngram_identical_outputs": (grounded_same + open_same) / 2.0,
        "spec.gemma3.ngram_b1_speedup_grounded": gemma3.0,
        "spec.gemma3.ngram_acceptance_grounded": gemma3_accept,
        "spec.suffix_b1_speedup_grounded": suffix[0].0.0,
        "spec.suffix_b1_speedup_open": suffix[1].0.0,
        "spec.suffix_acceptance_grounded": suffix[0].1,
        "spec.suffix_acceptance_open": suffix[1].1,
        "spec.b64_ratio": b64.0,
        "spec.draft_b1_speedup": draft[1].0.0,
        "spec.draft_b1_speedup_grounded": draft[0].0.0,
        "spec.draft_acceptance_open": draft[1].1,
        "spec.draft_acceptance_grounded": draft[0].1,
    });
    let mut md =
        format!("## spec (speculative decoding, n-gram k = 4, {} threads)\n\n", rayon::current_num_threads());
    support::figures_table(&mut md, &figures);
    md.push_str(&format!(
        "\nMedian, mean, p90 — verify k=4/k=0: SmolLM2 {v_smol:.3} / {v_smol_mean:.3} / {v_smol_p90:.3}, \
         1B shape {v_l1b:.3} / {v_l1b_mean:.3} / {v_l1b_p90:.3} ({VERIFY_PAIRS} alternating pairs); \
         b1 speedup grounded {:.3} / {:.3} / {:.3}, open {:.3} / {:.3} / {:.3}; b64 {:.3} / {:.3} / {:.3} \
         ({ROUNDS} rounds, greedy, at most {MAX_TOKENS} tokens); suffix b1 speedup grounded \
         {:.3} / {:.3} / {:.3}, open {:.3} / {:.3} / {:.3}; Gemma 3 grounded {:.3} / {:.3} / {:.3}; \
         f32 SmolLM2 with its Q4_1 draft, open {:.3} / {:.3} / {:.3}, grounded {:.3} / {:.3} / {:.3}.\n",
        grounded.0,
        grounded.1,
        grounded.2,
        open.0,
        open.1,
        open.2,
        b64.0,
        b64.1,
        b64.2,
        suffix[0].0.0,
        suffix[0].0.1,
        suffix[0].0.2,
        suffix[1].0.0,
        suffix[1].0.1,
        suffix[1].0.2,
        gemma3.0,
        gemma3.1,
        gemma3.2,
        draft[1].0.0,
        draft[1].0.1,
        draft[1].0.2,
        draft[0].0.0,
        draft[0].0.1,
        draft[0].0.2,
    ));
    let dir = support::figures_dir()?;
    std::fs::write(dir.join("spec.json"), serde_json::to_string_pretty(&figures)?)?;
    std::fs::write(dir.join("spec.md"), md)?;
    Ok(())
}
