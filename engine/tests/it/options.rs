//! Per-request options: priority scheduling (a later, more urgent request overtakes and
//! preempts) and the prefix-cache salt (blocks are shared only within one salt).

use engine::{EngineConfig, FinalOutput, Policy, RequestOptions, SamplingParams};

use crate::support::{Fixture, forced, prompt_tokens, small_config};

/// Steps to the end; returns request ids in the order they finished, and their final outputs
/// (`earlier`: outputs of steps the caller already took).
fn finish_order(
    engine: &mut engine::Engine,
    earlier: Vec<engine::RequestOutput>,
) -> (Vec<String>, Vec<FinalOutput>) {
    let mut order = Vec::new();
    let mut finals: Vec<FinalOutput> = Vec::new();
    let mut pending = earlier;
    for _ in 0..10_000 {
        if pending.is_empty() && !engine.has_unfinished() {
            break;
        }
        if pending.is_empty() {
            pending = engine.step().unwrap_or_else(|e| panic!("step: {e}"));
        }
        for out in pending.drain(..) {
            let pos = match finals.iter().position(|f| f.request_id == out.request_id) {
                Some(p) => p,
                None => {
                    finals.push(FinalOutput::new(out.request_id.clone(), out.prompt_tokens));
                    finals.len() - 1
                }
            };
            finals[pos].absorb(&out);
            if out.finished {
                order.push(out.request_id.clone());
            }
        }
    }
    assert!(!engine.has_unfinished(), "engine does not make progress");
    (order, finals)
}

fn tokens_of(finals: &[FinalOutput], id: &str) -> Vec<u32> {
    let f = finals.iter().find(|f| f.request_id == id).unwrap_or_else(|| panic!("no output for {id}"));
    f.completions[0].token_ids.clone()
}

/// A pool of 5 blocks of 16 tokens: one 40-token prompt (3 blocks, growing to 4 with its 12
/// new tokens) leaves too little room for a second one, so who runs is the policy's choice.
/// (Like vLLM, priority preempts for memory, not for the sequence cap.)
fn tight_pool(policy: Policy) -> EngineConfig {
    EngineConfig { policy, ..small_config(5) }
}

#[test]
fn urgent_request_preempts_under_priority_and_waits_under_fcfs() {
    let fx = Fixture::new();
    let params = forced(12);
    let alone = |id: &str, seed: u64| {
        let mut e = fx.engine(small_config(64));
        e.add_request(id, prompt_tokens(seed, 40), params.clone()).unwrap_or_else(|e| panic!("{e}"));
        tokens_of(&finish_order(&mut e, Vec::new()).1, id)
    };
    let (slow_alone, urgent_alone) = (alone("slow", 1), alone("urgent", 2));

    for (policy, expected) in [(Policy::Priority, ["urgent", "slow"]), (Policy::Fcfs, ["slow", "urgent"])] {
        let mut engine = fx.engine(tight_pool(policy));
        let low = RequestOptions::default().with_priority(5);
        engine
            .add_request_with_options("slow", prompt_tokens(1, 40), params.clone(), low)
            .unwrap_or_else(|e| panic!("{e}"));
        // "slow" is running (prefilled, a few tokens out) when "urgent" arrives.
        let mut earlier = Vec::new();
        for _ in 0..3 {
            earlier.extend(engine.step().unwrap_or_else(|e| panic!("{e}")));
        }
        let high = RequestOptions::default().with_priority(0);
        engine
            .add_request_with_options("urgent", prompt_tokens(2, 40), params.clone(), high)
            .unwrap_or_else(|e| panic!("{e}"));
        let (order, finals) = finish_order(&mut engine, earlier);
        assert_eq!(order, expected, "{policy:?}");
        if policy == Policy::Priority {
            assert!(engine.metrics().gauges.num_preemptions >= 1, "urgent must preempt slow");
        }
        // Preempted and resumed, or kept waiting: the greedy tokens are those of a lone run.
        assert_eq!(tokens_of(&finals, "slow"), slow_alone, "{policy:?}");
        assert_eq!(tokens_of(&finals, "urgent"), urgent_alone, "{policy:?}");
        assert!(engine.kv_is_idle());
    }
}

#[test]
fn cache_salt_isolates_prefix_cache_entries() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    let params = forced(4);
    let prompt = prompt_tokens(7, 80);
    let mut hits_after = |id: &str, options: RequestOptions| {
        engine
            .add_request_with_options(id, prompt.clone(), params.clone(), options)
            .unwrap_or_else(|e| panic!("{e}"));
        let (_, finals) = finish_order(&mut engine, Vec::new());
        let hits = engine.metrics().gauges.prefix_hits;
        (hits, tokens_of(&finals, id))
    };
    let (h0, first) = hits_after("plain-1", RequestOptions::default());
    let (h1, salted) = hits_after("salt-x-1", RequestOptions::default().with_cache_salt("x"));
    assert_eq!(h1, h0, "a salted request must not hit unsalted blocks");
    let (h2, _) = hits_after("salt-y-1", RequestOptions::default().with_cache_salt("y"));
    assert_eq!(h2, h1, "salts x and y must not share blocks");
    let (h3, _) = hits_after("salt-x-2", RequestOptions::default().with_cache_salt("x"));
    assert!(h3 >= h2 + 64, "the same salt shares its full blocks: {h2} -> {h3}");
    let (h4, plain) = hits_after("plain-2", RequestOptions::default());
    assert!(h4 >= h3 + 64, "unsalted requests share theirs: {h3} -> {h4}");
    // The salt changes what is shared, never what is computed.
    assert_eq!(salted, first);
    assert_eq!(plain, first);
    assert!(engine.kv_is_idle());
}

#[test]
fn generation_config_sampling_fields_are_the_defaults() {
    let fx = crate::support::Fixture::new();
    let path = fx.dir.path().join("generation_config.json");
    let generation = serde_json::json!({
        "eos_token_id": [crate::support::IM_END], "temperature": 0.0, "top_k": 20, "max_new_tokens": 7
    });
    std::fs::write(&path, generation.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let mut engine = fx.engine(crate::support::small_config(64));
    let defaults = engine.default_sampling_params().clone();
    assert_eq!((defaults.temperature, defaults.top_k, defaults.max_tokens), (0.0, 20, Some(7)));
    assert_eq!(defaults.top_p, SamplingParams::default().top_p);
    // A request that sets only `ignore_eos` gets the model's 7 greedy tokens.
    let params = SamplingParams { ignore_eos: true, ..defaults };
    let out = engine.generate(vec![prompt_tokens(5, 9).into()], &params).unwrap_or_else(|e| panic!("{e}"));
    let fin = out[0].as_ref().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fin.completions[0].token_ids.len(), 7);
}
