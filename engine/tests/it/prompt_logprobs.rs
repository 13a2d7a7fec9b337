//! `SamplingParams::prompt_logprobs`: every prompt token's logprob given the tokens before it
//! (the first has none) equals the log-softmax of a separate forward pass's logits over the
//! prompt, on the real SmolLM2, when the prompt is prefilled in several chunks, batched with
//! other requests, and again after the prefix cache holds it; and on the tiny model the entries
//! stay the same under preemption by recompute, parallel samples and a runner that computes a
//! step's logits in several passes.

use std::collections::HashMap;
use std::path::Path;

use engine::{
    DType, Engine, EngineConfig, FinalOutput, KvCacheSize, PreemptionMode, Prompt, PromptLogprobs,
    SamplingParams,
};
use model::{ModelFolder, Runner, RunnerConfig};

use crate::support::{Fixture, forced, prompt_tokens, small_config};

/// Largest |engine logprob − reference logprob| (f32 KV cache; only the chunking and the
/// matmul kernel chosen for a step's token count differ).
const TOL: f32 = 1e-4;

/// Runs every request to its end through `step`; their final outputs by id.
fn run(engine: &mut Engine, requests: Vec<(&str, Prompt, SamplingParams)>) -> HashMap<String, FinalOutput> {
    let mut finals = HashMap::new();
    for (id, prompt, params) in requests {
        engine.add_request(id, prompt, params).unwrap_or_else(|e| panic!("{id}: {e}"));
        finals.insert(id.to_owned(), FinalOutput::new(id.to_owned(), 0));
    }
    while engine.has_unfinished() {
        for out in engine.step().unwrap_or_else(|e| panic!("step: {e}")) {
            if let Some(f) = finals.get_mut(&out.request_id) {
                f.absorb(&out);
            }
        }
    }
    assert!(engine.kv_is_idle());
    finals
}

fn prompt_logprobs<'a>(finals: &'a HashMap<String, FinalOutput>, id: &str) -> &'a PromptLogprobs {
    finals[id].prompt_logprobs.as_ref().unwrap_or_else(|| panic!("{id} has no prompt logprobs"))
}

/// Each row of `prompt`'s logits (one forward over the whole prompt, every row asked for, on a
/// cache of its own) as log-softmax in f64.
fn reference_log_softmax(model_path: &Path, prompt: &[u32]) -> Vec<Vec<f64>> {
    let (_, model) = ModelFolder::open_with_weights(model_path).unwrap_or_else(|e| panic!("{e}"));
    let vocab = model.config.vocab_size;
    let block_size = 16;
    let blocks = prompt.len().div_ceil(block_size);
    let mut runner = Runner::new(
        model,
        &RunnerConfig {
            device: engine::Device::Cpu,
            kv_cache: KvCacheSize::Blocks(blocks),
            kv_dtype: DType::F32,
            block_size,
            max_model_len: blocks * block_size,
            swap_bytes: 0,
            max_num_batched_tokens: prompt.len(),
            max_num_seqs: 1,
            gpu_memory_utilization: 0.9,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<u32> = (0..blocks as u32).collect();
    runner.write_table_row(0, 0, &ids).unwrap_or_else(|e| panic!("{e}"));
    let slots: Vec<i64> = (0..prompt.len() as i64).collect();
    let rows: Vec<usize> = (0..prompt.len()).collect();
    let logits = model::testing::forward_one_sequence(&mut runner, prompt, &slots, &rows)
        .unwrap_or_else(|e| panic!("{e}"));
    logits
        .chunks_exact(vocab)
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
            row.iter().map(|&v| v as f64 - lse).collect()
        })
        .collect()
}

/// Position 0 has no entry; position `i` holds token `i`'s logprob under row `i - 1`, its rank,
/// and the `top` most likely tokens of that row, all within [`TOL`] of the reference.
fn assert_matches_reference(got: &PromptLogprobs, prompt: &[u32], reference: &[Vec<f64>], top: usize) {
    assert_eq!(got.token_ids, prompt);
    assert_eq!(got.positions.len(), prompt.len());
    assert!(got.positions[0].is_none());
    for (i, entry) in got.positions.iter().enumerate().skip(1) {
        let entry = entry.as_ref().unwrap_or_else(|| panic!("position {i} has no entry"));
        let row = &reference[i - 1];
        let want = row[prompt[i] as usize];
        assert_eq!(entry.sampled.token, prompt[i]);
        let err = (f64::from(entry.sampled.logprob) - want).abs();
        assert!(err < f64::from(TOL), "position {i}: {} vs {want}", entry.sampled.logprob);
        let rank = 1 + row.iter().filter(|&&v| v > want + f64::from(TOL)).count();
        let ties = row.iter().filter(|&&v| (v - want).abs() <= f64::from(TOL)).count();
        assert!((rank..rank + ties).contains(&entry.rank), "position {i}: rank {} vs {rank}", entry.rank);
        assert_eq!(entry.top.len(), top);
        for (k, t) in entry.top.iter().enumerate() {
            let v = row[t.token as usize];
            assert!((f64::from(t.logprob) - v).abs() < f64::from(TOL), "position {i}, top {k}");
            // The k-th best of the reference row, up to ties within the tolerance.
            let better = row.iter().filter(|&&w| w > v + f64::from(TOL)).count();
            assert!(better <= k, "position {i}: top {k} is token {} but {better} are better", t.token);
        }
    }
}

fn smollm2_config(budget: usize) -> EngineConfig {
    EngineConfig {
        kv_cache: KvCacheSize::Blocks(64),
        kv_dtype: DType::F32,
        max_model_len: Some(512),
        max_num_batched_tokens: budget,
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

#[test]
fn smollm2_prompt_logprobs_equal_a_forward_over_the_prompt() {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    // A 16-token budget: the prompt spans several chunks, shared with the other requests.
    let mut engine = Engine::new(&gguf, smollm2_config(16)).unwrap_or_else(|e| panic!("{e}"));
    let text = "The capital of France is Paris. The capital of Italy is Rome. The capital of \
                Germany is Berlin, and the capital of Portugal is Lisbon. The capital of Spain";
    let prompt = engine.tokenize("t", Prompt::Text(text.into())).unwrap_or_else(|e| panic!("{e}"));
    assert!(prompt.len() > 2 * 16, "{} tokens", prompt.len());
    let reference = reference_log_softmax(&gguf, &prompt);
    let with = |top| SamplingParams { prompt_logprobs: Some(top), ..forced(2) };
    let other = prompt_tokens(3, 40);
    let finals = run(
        &mut engine,
        vec![
            ("plain", Prompt::Tokens(other.clone()), forced(3)),
            ("top3", Prompt::Text(text.into()), with(3)),
            ("other", Prompt::Tokens(other), with(0)),
        ],
    );
    assert_matches_reference(prompt_logprobs(&finals, "top3"), &prompt, &reference, 3);
    assert!(finals["plain"].prompt_logprobs.is_none());
    assert_eq!(prompt_logprobs(&finals, "other").positions.len(), 40);

    // The prompt is now in the prefix cache: a plain request reads it, one that wants prompt
    // logprobs computes every position all the same.
    let hits = engine.metrics().gauges.prefix_hits;
    let finals = run(&mut engine, vec![("warm", Prompt::Tokens(prompt.clone()), forced(1))]);
    assert!(engine.metrics().gauges.prefix_hits > hits, "the second request hit the prefix cache");
    assert!(finals["warm"].prompt_logprobs.is_none());
    let finals = run(&mut engine, vec![("again", Prompt::Tokens(prompt.clone()), with(1))]);
    assert_matches_reference(prompt_logprobs(&finals, "again"), &prompt, &reference, 1);
}

/// The tiny model's prompt logprobs of a batch run alone with room to spare: the entries every
/// other way of running the same requests must reproduce.
fn tiny_runs(fx: &Fixture, config: EngineConfig) -> (HashMap<String, FinalOutput>, usize) {
    let mut engine = fx.engine(config);
    let requests = (0..6)
        .map(|i| {
            let params = SamplingParams { prompt_logprobs: Some(2), n: 1 + i % 3, ..forced(40) };
            (["a", "b", "c", "d", "e", "f"][i], Prompt::Tokens(prompt_tokens(i as u64, 30 + 7 * i)), params)
        })
        .collect();
    let finals = run(&mut engine, requests);
    (finals, engine.metrics().gauges.num_preemptions as usize)
}

#[test]
fn prompt_logprobs_survive_preemption_by_recompute_and_parallel_samples() {
    let fx = Fixture::new();
    let (roomy, none) = tiny_runs(&fx, small_config(256));
    assert_eq!(none, 0);
    // Few blocks and a small budget: chunked prompts, preemption by recompute of groups whose
    // prompts are computed again (each sample's) without any position entered twice.
    let tight = EngineConfig {
        max_num_batched_tokens: 24,
        preemption_mode: PreemptionMode::Recompute,
        ..small_config(24)
    };
    let (tight_finals, preemptions) = tiny_runs(&fx, tight);
    assert!(preemptions > 0, "the tight run preempted nothing");
    for (id, fin) in &roomy {
        let want = prompt_logprobs(&roomy, id);
        let got = prompt_logprobs(&tight_finals, id);
        assert_eq!(got.positions.len(), want.positions.len(), "{id}");
        for (i, (g, w)) in got.positions.iter().zip(&want.positions).enumerate() {
            match (g, w) {
                (None, None) => assert_eq!(i, 0),
                (Some(g), Some(w)) => {
                    assert_eq!((g.sampled.token, g.rank), (w.sampled.token, w.rank), "{id} position {i}");
                    assert!((g.sampled.logprob - w.sampled.logprob).abs() < TOL, "{id} position {i}");
                }
                _ => panic!("{id} position {i}: {g:?} vs {w:?}"),
            }
        }
        assert_eq!(fin.completions.len(), tight_finals[id].completions.len());
    }
}
