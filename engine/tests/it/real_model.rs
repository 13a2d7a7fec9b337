//! The engine on the real default model as users run it: the SmolLM2 Q4_1 GGUF loaded natively
//! (weights kept quantized) reproduces the goldens' greedy tokens; the f32 folder quantized at
//! load (`quantization`) stays close to them.

use engine::{Engine, EngineConfig, KvCacheSize, Prompt, Quantization};
use serde_json::Value;

use crate::support::forced;

/// Golden prompts and greedy continuations (kept in the model crate's test data).
fn goldens() -> Vec<(Vec<u32>, Vec<u32>)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/data/smollm2-135m-instruct.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let g: Value = serde_json::from_str(&text).expect("goldens");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
    };
    g["generations"]
        .as_array()
        .expect("generations")
        .iter()
        .map(|x| (ids(&x["prompt_ids"]), ids(&x["output_ids"])))
        .collect()
}

fn config(quantization: Option<Quantization>) -> EngineConfig {
    EngineConfig {
        kv_cache: KvCacheSize::Blocks(64),
        log_interval: std::time::Duration::ZERO,
        quantization,
        ..EngineConfig::default()
    }
}

/// Greedy outputs of every golden prompt, batched.
fn generate(engine: &mut Engine, cases: &[(Vec<u32>, Vec<u32>)]) -> Vec<Vec<u32>> {
    let params = forced(cases[0].1.len());
    let prompts = cases.iter().map(|(p, _)| Prompt::Tokens(p.clone())).collect();
    let outs = engine.generate(prompts, &params).unwrap_or_else(|e| panic!("{e}"));
    outs.into_iter().map(|o| o.unwrap_or_else(|e| panic!("{e}")).completions[0].token_ids.clone()).collect()
}

#[test]
fn the_default_gguf_generates_the_golden_tokens() {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let mut engine = Engine::new(&gguf, config(None)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(engine.model_name(), "SmolLM2-135M-Instruct.Q4_1");
    let cases = goldens();
    for (got, (_, want)) in generate(&mut engine, &cases).iter().zip(&cases) {
        assert_eq!(got, want);
    }
    assert!(engine.kv_is_idle());
}

/// Quantizing at load re-rounds the folder's weights (themselves Q4_1 values): Q8_0 keeps the
/// greedy tokens for most of each continuation, Q4_0 (a second 4-bit rounding) diverges early but
/// runs end to end. Each keeps its measured agreement less a margin for the other CPUs' kernels,
/// whose sums run in other orders (a near-tie can fall the other way), with either activation
/// path.
#[test]
fn the_folder_quantized_at_load_stays_close_to_the_goldens() {
    let dir = model::testing::smollm2_dir_for_tests();
    let cases = goldens();
    let total: usize = cases.iter().map(|c| c.1.len()).sum();
    // Greedy tokens before the first divergence over all prompts: (measured, least accepted).
    for (q, (measured, floor)) in [(Quantization::Q8_0, (104, 96)), (Quantization::Q4_0, (8, 4))] {
        for activations in [engine::ActivationPrecision::Auto, engine::ActivationPrecision::F32] {
            let cfg = EngineConfig { decode_activations: activations, ..config(Some(q)) };
            let mut engine = Engine::new(&dir, cfg).unwrap_or_else(|e| panic!("{e}"));
            let outs = generate(&mut engine, &cases);
            assert!(outs.iter().zip(&cases).all(|(got, (_, want))| got.len() == want.len()));
            let agree: usize = outs
                .iter()
                .zip(&cases)
                .map(|(got, (_, want))| got.iter().zip(want).take_while(|(a, b)| a == b).count())
                .sum();
            eprintln!(
                "{q:?}, {activations:?}: {agree}/{total} greedy tokens before the first divergence (measured {measured})"
            );
            assert!(
                agree >= floor,
                "{q:?}, {activations:?}: {agree}/{total} tokens agree, fewer than {floor}"
            );
        }
    }
}

/// A long prompt prefilled in chunks of the token budget (here 5 chunks of ≤ 256 tokens, each
/// attending over the cached prefix through the tiled prefill kernel) gives the greedy tokens
/// the same prompt gives in one chunk.
#[test]
fn a_long_prompt_in_chunks_generates_what_one_chunk_generates() {
    let gguf = model::testing::smollm2_gguf();
    // 1 100 tokens: the golden prompts and continuations, one after another, over and over.
    let text: Vec<u32> = goldens().into_iter().flat_map(|(p, o)| p.into_iter().chain(o)).collect();
    let prompt: Vec<u32> = text.iter().copied().cycle().take(1100).collect();
    assert!(prompt.len() > 4 * 256, "prompt of {} tokens", prompt.len());
    let params = forced(24);
    let run = |budget: usize| {
        let cfg = EngineConfig {
            max_num_batched_tokens: budget,
            kv_cache: KvCacheSize::Blocks(128),
            ..config(None)
        };
        let mut engine = Engine::new(&gguf, cfg).unwrap_or_else(|e| panic!("{e}"));
        let out =
            engine.generate(vec![Prompt::Tokens(prompt.clone())], &params).unwrap_or_else(|e| panic!("{e}"));
        let ids = out.into_iter().next().expect("one output").unwrap_or_else(|e| panic!("{e}")).completions
            [0]
        .token_ids
        .clone();
        assert!(engine.kv_is_idle());
        ids
    };
    let whole = run(2048);
    assert_eq!(whole.len(), 24);
    assert_eq!(run(256), whole);
}

/// A sequence's greedy tokens and its top-20 logprobs at every step, alone and as the first of
/// a batch of 32 (prefilled together, decoded together: the batched matmul kernels instead of
/// the decode ones), on the real GGUF with each activation path: the default one (int16 on AVX2
/// and AVX-512 CPUs) and f32. The tokens are the same; the logprobs differ by at most
/// the bound of their path (the f32 sums of the two kernels run in different orders, and int16's
/// decode and batch kernels convert their integer sums to f32 at different points).
#[test]
fn a_sequence_decodes_alike_alone_and_in_a_batch_of_32() {
    let gguf = model::testing::smollm2_gguf();
    let cases = goldens();
    let prompts: Vec<Prompt> = (0..32)
        .map(|i| {
            let (p, o) = &cases[i % cases.len()];
            // Different lengths: the golden prompt, then a growing share of its continuation.
            Prompt::Tokens(p.iter().chain(&o[..(i * 3) % o.len()]).copied().collect())
        })
        .collect();
    let params = engine::SamplingParams { logprobs: Some(20), ..forced(24) };
    let mut worst = Vec::new();
    // Largest top-20 logprob difference allowed alone vs in 32 (measured on SmolLM2 Q4_1 with
    // AVX-512 VNNI: 4.1e-2 with the default int16 activations, 2.7e-2 with f32).
    for (activations, bound) in
        [(engine::ActivationPrecision::Auto, 0.1), (engine::ActivationPrecision::F32, 0.075)]
    {
        let cfg = EngineConfig {
            decode_activations: activations,
            kv_cache: KvCacheSize::Blocks(512),
            ..config(None)
        };
        let mut engine = Engine::new(&gguf, cfg).unwrap_or_else(|e| panic!("{e}"));
        let mut run = |prompts: Vec<Prompt>| {
            let out = engine.generate(prompts, &params).unwrap_or_else(|e| panic!("{e}"));
            out.into_iter().next().expect("an output").unwrap_or_else(|e| panic!("{e}")).completions.remove(0)
        };
        let alone = run(vec![prompts[0].clone()]);
        let batched = run(prompts.clone());
        assert_eq!(alone.token_ids, batched.token_ids, "{activations:?}: greedy tokens");
        let mut diff = 0.0f64;
        for (a, b) in alone.logprobs.iter().flatten().zip(batched.logprobs.iter().flatten()) {
            for x in &a.top {
                if let Some(y) = b.top.iter().find(|y| y.token == x.token) {
                    diff = diff.max((f64::from(x.logprob) - f64::from(y.logprob)).abs());
                }
            }
        }
        eprintln!("{activations:?}: largest top-20 logprob difference alone vs in 32: {diff:.3e}");
        worst.push((activations, diff, bound));
    }
    for (activations, diff, bound) in worst {
        assert!(diff <= bound, "{activations:?}: logprobs differ by {diff:.3e} alone and in a batch");
    }
}
