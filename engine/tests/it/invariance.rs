//! The engine's main correctness oracle: a greedy request yields the same tokens alone,
//! inside a batch of 64, with prefix caching on or off, and when a tiny KV pool forces
//! preemption (recompute and swap). Also: seeded sampling reproduces whatever the batch,
//! and `n = 4` shares its prompt's blocks.

use std::collections::BTreeMap;

use engine::{Engine, EngineConfig, PreemptionMode, SamplingParams};

use crate::support::{Fixture, prompt_tokens, small_config};

/// 64 greedy requests of mixed prompt and output lengths; half share a 40-token prefix so
/// the prefix cache has something to find.
fn workload() -> Vec<(String, Vec<u32>, SamplingParams)> {
    let shared = prompt_tokens(999, 40);
    (0..64u64)
        .map(|i| {
            let own = prompt_tokens(i, 3 + (i as usize * 7) % 70);
            let prompt = if i % 2 == 0 { [shared.clone(), own].concat() } else { own };
            let max_tokens = 4 + (i as usize * 13) % 45;
            (
                format!("r{i}"),
                prompt,
                SamplingParams { ignore_eos: i % 3 != 0, ..SamplingParams::greedy(max_tokens) },
            )
        })
        .collect()
}

/// Runs requests to completion; returns each request's tokens and the preemptions seen.
fn run(
    engine: &mut Engine,
    reqs: &[(String, Vec<u32>, SamplingParams)],
) -> (BTreeMap<String, Vec<u32>>, u64) {
    for (id, prompt, params) in reqs {
        engine
            .add_request(id.clone(), prompt.clone(), params.clone())
            .unwrap_or_else(|e| panic!("{id}: {e}"));
    }
    let mut tokens: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut finished = 0;
    while engine.has_unfinished() {
        for out in engine.step().unwrap_or_else(|e| panic!("step: {e}")) {
            let entry = tokens.entry(out.request_id.clone()).or_default();
            for c in &out.outputs {
                entry.extend_from_slice(&c.token_ids);
            }
            if out.finished {
                finished += 1;
            }
        }
    }
    assert_eq!(finished, reqs.len(), "every request finishes exactly once");
    assert!(engine.kv_is_idle(), "blocks leaked");
    (tokens, engine.metrics().gauges.num_preemptions)
}

fn alone(fx: &Fixture, reqs: &[(String, Vec<u32>, SamplingParams)]) -> BTreeMap<String, Vec<u32>> {
    let mut engine = fx.engine(EngineConfig { enable_prefix_caching: false, ..small_config(256) });
    let mut all = BTreeMap::new();
    for r in reqs {
        all.extend(run(&mut engine, std::slice::from_ref(r)).0);
    }
    all
}

fn assert_same(expected: &BTreeMap<String, Vec<u32>>, got: &BTreeMap<String, Vec<u32>>, what: &str) {
    assert_eq!(expected.len(), got.len(), "{what}");
    for (id, tokens) in expected {
        assert_eq!(Some(tokens), got.get(id), "{what}: request {id} differs");
    }
}

#[test]
fn greedy_is_batch_invariant() {
    let fx = Fixture::new();
    let reqs = workload();
    let reference = alone(&fx, &reqs);
    assert!(reference.values().all(|t| !t.is_empty()));
    // The oracle is only meaningful if greedy output depends on the context.
    let varied =
        reference.values().filter(|t| t.iter().collect::<std::collections::BTreeSet<_>>().len() >= 3).count();
    assert!(varied >= 40, "only {varied} of 64 greedy outputs have 3+ distinct tokens");
    let distinct: std::collections::BTreeSet<&Vec<u32>> = reference.values().collect();
    assert!(distinct.len() >= 60, "greedy outputs barely depend on the prompt");

    for caching in [true, false] {
        let mut engine = fx.engine(EngineConfig { enable_prefix_caching: caching, ..small_config(512) });
        let (got, preemptions) = run(&mut engine, &reqs);
        assert_same(&reference, &got, &format!("batch of 64, prefix caching {caching}"));
        assert_eq!(preemptions, 0);
        if caching {
            assert!(engine.metrics().prefix_cache_hit_rate > 0.0);
        }
    }
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        for caching in [false, true] {
            let cfg =
                EngineConfig { preemption_mode: mode, enable_prefix_caching: caching, ..small_config(24) };
            let mut engine = fx.engine(cfg);
            let (got, preemptions) = run(&mut engine, &reqs);
            assert_same(&reference, &got, &format!("tiny pool, {mode:?}, prefix caching {caching}"));
            assert!(preemptions > 0, "{mode:?}: the tiny pool should force preemption");
        }
    }
}

/// The int8 KV cache rounds each token's key and value on its own, so the same oracle holds
/// over it: a request's greedy tokens alone, in a batch with prefix caching, and through a tiny
/// pool's preemptions (swap moves codes and scales; recompute rounds the same values again).
#[test]
fn greedy_over_an_int8_cache_is_batch_invariant() {
    let fx = Fixture::new();
    let reqs: Vec<_> = workload().into_iter().take(24).collect();
    let int8 = |c: EngineConfig| EngineConfig { kv_dtype: engine::DType::Int8, ..c };
    let mut engine = fx.engine(int8(EngineConfig { enable_prefix_caching: false, ..small_config(256) }));
    let mut reference = BTreeMap::new();
    for r in &reqs {
        reference.extend(run(&mut engine, std::slice::from_ref(r)).0);
    }
    let mut engine = fx.engine(int8(small_config(256)));
    assert_same(&reference, &run(&mut engine, &reqs).0, "int8, batch of 24 with prefix caching");
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        let mut engine = fx.engine(int8(EngineConfig { preemption_mode: mode, ..small_config(16) }));
        let (got, preemptions) = run(&mut engine, &reqs);
        assert_same(&reference, &got, &format!("int8, tiny pool, {mode:?}"));
        assert!(preemptions > 0, "{mode:?}: the tiny pool should force preemption");
    }
}

#[test]
fn seeded_sampling_reproduces_whatever_the_batch() {
    let fx = Fixture::new();
    let target = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        top_k: 50,
        seed: Some(1234),
        ignore_eos: true,
        max_tokens: Some(30),
        ..SamplingParams::default()
    };
    let prompt = prompt_tokens(77, 25);
    let mut engine = fx.engine(small_config(256));
    let solo = run(&mut engine, &[("t".into(), prompt.clone(), target.clone())]).0;

    // Same request amid unseeded random neighbours, submitted at a different moment.
    let mut reqs: Vec<(String, Vec<u32>, SamplingParams)> = (0..12u64)
        .map(|i| {
            let p = SamplingParams {
                temperature: 1.2,
                ignore_eos: true,
                ..SamplingParams::greedy(10 + i as usize)
            };
            (format!("n{i}"), prompt_tokens(i + 5, 10 + i as usize), SamplingParams { temperature: 1.2, ..p })
        })
        .collect();
    reqs.insert(7, ("t".into(), prompt.clone(), target.clone()));
    let mut engine = fx.engine(EngineConfig { seed: 99, ..small_config(256) });
    let batched = run(&mut engine, &reqs).0;
    assert_eq!(solo["t"], batched["t"]);
    assert_eq!(solo["t"].len(), 30);

    // A different seed gives a different sequence.
    let other = SamplingParams { seed: Some(4321), ..target };
    let mut engine = fx.engine(small_config(256));
    let different = run(&mut engine, &[("t".into(), prompt, other)]).0;
    assert_ne!(solo["t"], different["t"]);
}

/// Highest KV block usage seen while running `reqs`, and the outputs per request and sample.
fn peak_blocks(engine: &mut Engine, reqs: &[(String, Vec<u32>, SamplingParams)]) -> (usize, Vec<Vec<u32>>) {
    for (id, prompt, params) in reqs {
        engine.add_request(id.clone(), prompt.clone(), params.clone()).unwrap_or_else(|e| panic!("{e}"));
    }
    let mut peak = 0;
    let mut samples: BTreeMap<(String, usize), Vec<u32>> = BTreeMap::new();
    while engine.has_unfinished() {
        for out in engine.step().unwrap_or_else(|e| panic!("step: {e}")) {
            for c in out.outputs {
                samples.entry((out.request_id.clone(), c.index)).or_default().extend(c.token_ids);
            }
        }
        peak = peak.max(engine.num_kv_blocks_used());
    }
    assert!(engine.kv_is_idle());
    (peak, samples.into_values().collect())
}

#[test]
fn parallel_samples_share_the_prompt_blocks() {
    let fx = Fixture::new();
    let prompt = prompt_tokens(3, 200);
    let params = SamplingParams {
        temperature: 1.0,
        seed: Some(5),
        ignore_eos: true,
        max_tokens: Some(8),
        ..SamplingParams::default()
    };
    let cfg = EngineConfig { enable_prefix_caching: false, ..small_config(256) };

    let mut engine = fx.engine(cfg.clone());
    let (shared_peak, samples) =
        peak_blocks(&mut engine, &[("n4".into(), prompt.clone(), SamplingParams { n: 4, ..params.clone() })]);
    assert_eq!(samples.len(), 4);
    assert!(samples.iter().all(|s| s.len() == 8));
    // Four samples of one seed still differ (one RNG stream each).
    assert!(samples.iter().any(|s| s != &samples[0]), "{samples:?}");

    let mut engine = fx.engine(cfg);
    let separate: Vec<(String, Vec<u32>, SamplingParams)> =
        (0..4).map(|i| (format!("s{i}"), prompt.clone(), params.clone())).collect();
    let (separate_peak, _) = peak_blocks(&mut engine, &separate);
    // 200 prompt tokens = 13 blocks: shared once, versus once per request.
    assert!(shared_peak < separate_peak, "n=4 peak {shared_peak} blocks, 4 requests {separate_peak}");
    assert!(shared_peak <= 13 + 4, "{shared_peak}");
}

#[test]
fn greedy_picked_by_the_runner_equals_the_full_sampler() {
    // Plain greedy steps take the runner's argmax (`Runner::forward_greedy`, on a GPU the
    // device's); asking for logprobs sends the same requests through the full sampler.
    let fx = Fixture::new();
    let reqs = workload();
    let with_logprobs = |every: usize| -> Vec<(String, Vec<u32>, SamplingParams)> {
        reqs.iter()
            .enumerate()
            .map(|(i, (id, p, params))| {
                let logprobs = (i % every == 0).then_some(1);
                (id.clone(), p.clone(), SamplingParams { logprobs, ..params.clone() })
            })
            .collect()
    };
    let mut engine = fx.engine(small_config(512));
    let (plain, _) = run(&mut engine, &reqs);
    let (full, _) = run(&mut engine, &with_logprobs(1));
    assert_same(&full, &plain, "every request with logprobs (full sampler) against none (runner's argmax)");
    // Mixed batches: a step with one full-sampler row samples every row on the host.
    let (mixed, _) = run(&mut engine, &with_logprobs(5));
    assert_same(&full, &mixed, "one request in five with logprobs");
}
