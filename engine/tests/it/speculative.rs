//! Speculative decoding (n-gram and suffix drafts) is lossless: every request gets exactly the tokens and
//! finish reasons it gets without speculation — greedy or seeded sampling with penalties and
//! `min_tokens`, alone, in a batch, under preemption, beside `n > 1` requests — and logprobs
//! that differ only by the f32 rounding of scoring several positions in one pass, while drafts
//! are actually scored and accepted and steps are saved; constrained requests draft only what
//! their grammar takes and decode as without drafts; suffix decoding's cache of recent
//! outputs drafts a repeated answer whole.

use std::collections::BTreeMap;

use engine::spec::SpeculativeConfig;
use engine::{Engine, EngineConfig, FinishReason, PreemptionMode, SamplingParams};

use crate::support::{Fixture, prompt_tokens, small_config};

/// Each sample's outputs (by request and sample index): its tokens, their logprobs, its finish.
pub(crate) type Outputs = BTreeMap<(String, usize), (Vec<u32>, Vec<f32>, Option<FinishReason>)>;

/// n-gram drafts of `k` tokens, every step (a verification pinned at the cost of a plain step,
/// so that the cost rule never holds a draft back: these tests are about what drafts change).
fn ngram(k: usize) -> Option<SpeculativeConfig> {
    let json = format!(
        r#"{{"method": "ngram", "num_speculative_tokens": {k}, "prompt_lookup_min": 1, "prompt_lookup_max": 4}}"#
    );
    let config = SpeculativeConfig::from_json(&json).unwrap_or_else(|e| panic!("{e}"));
    Some(SpeculativeConfig { verify_cost: Some(1.0), ..config })
}

/// Suffix drafts of up to `k` tokens (vLLM's other defaults; every step, as [`ngram`]),
/// keeping `cached` recent outputs.
fn suffix(k: usize, cached: usize) -> Option<SpeculativeConfig> {
    let json = format!(
        r#"{{"method": "suffix", "num_speculative_tokens": {k}, "suffix_decoding_max_cached_requests": {cached}}}"#
    );
    let config = SpeculativeConfig::from_json(&json).unwrap_or_else(|e| panic!("{e}"));
    Some(SpeculativeConfig { verify_cost: Some(1.0), ..config })
}

/// Prompts that repeat themselves (so that lookup finds drafts) under varied parameters.
pub(crate) fn workload() -> Vec<(String, Vec<u32>, SamplingParams)> {
    (0..12u64)
        .map(|i| {
            let piece = prompt_tokens(i, 5 + i as usize % 7);
            let prompt = [piece.clone(), piece.clone(), piece].concat();
            let max_tokens = 20 + (i as usize * 7) % 30;
            let params = match i % 4 {
                0 => SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) },
                1 => SamplingParams {
                    temperature: 0.8,
                    top_p: 0.9,
                    seed: Some(i),
                    logprobs: Some(2),
                    max_tokens: Some(max_tokens),
                    ..SamplingParams::default()
                },
                2 => SamplingParams {
                    temperature: 0.7,
                    seed: Some(100 + i),
                    frequency_penalty: 0.3,
                    repetition_penalty: 1.1,
                    min_tokens: 5,
                    max_tokens: Some(max_tokens),
                    ..SamplingParams::default()
                },
                _ => SamplingParams {
                    n: 2,
                    seed: Some(i),
                    temperature: 0.5,
                    ..SamplingParams::greedy(max_tokens)
                },
            };
            (format!("r{i}"), prompt, params)
        })
        .collect()
}

/// A roomy cache, and a small one under recompute and under swap preemption.
pub(crate) fn pressures() -> [(&'static str, EngineConfig); 3] {
    [
        ("roomy", small_config(256)),
        ("recompute", EngineConfig { preemption_mode: PreemptionMode::Recompute, ..small_config(10) }),
        ("swap", EngineConfig { preemption_mode: PreemptionMode::Swap, ..small_config(10) }),
    ]
}

/// Runs the requests to the end; returns their outputs and the steps it took.
pub(crate) fn run(engine: &mut Engine, reqs: &[(String, Vec<u32>, SamplingParams)]) -> (Outputs, usize) {
    for (id, prompt, params) in reqs {
        engine
            .add_request(id.clone(), prompt.clone(), params.clone())
            .unwrap_or_else(|e| panic!("{id}: {e}"));
    }
    let mut outputs = Outputs::new();
    let mut steps = 0;
    while engine.has_unfinished() {
        steps += 1;
        for out in engine.step().unwrap_or_else(|e| panic!("step: {e}")) {
            for c in &out.outputs {
                let entry = outputs.entry((out.request_id.clone(), c.index)).or_default();
                entry.0.extend_from_slice(&c.token_ids);
                entry.1.extend(c.logprobs.iter().flatten().map(|p| p.sampled.logprob));
                if c.finish_reason.is_some() {
                    entry.2 = c.finish_reason.clone();
                }
            }
        }
    }
    assert!(engine.kv_is_idle(), "blocks leaked");
    (outputs, steps)
}

/// The same tokens and finishes, and logprobs within f32 rounding of a multi-row pass.
pub(crate) fn assert_same(drafted: &Outputs, plain: &Outputs, case: &str) {
    assert_eq!(drafted.keys().collect::<Vec<_>>(), plain.keys().collect::<Vec<_>>(), "{case}");
    for (id, (tokens, logprobs, finishes)) in plain {
        let (d_tokens, d_logprobs, d_finishes) = &drafted[id];
        assert_eq!((d_tokens, d_finishes), (tokens, finishes), "{case}: {id:?}");
        assert_eq!(d_logprobs.len(), logprobs.len(), "{case}: {id:?}");
        for (a, b) in d_logprobs.iter().zip(logprobs) {
            assert!((a - b).abs() <= 1e-4, "{case}: {id:?} logprob {a} vs {b}");
        }
    }
}

#[test]
fn ngram_drafts_change_no_token_and_save_steps() {
    let fx = Fixture::new();
    let reqs = workload();
    for (name, config) in pressures() {
        let (plain, plain_steps) = run(&mut fx.engine(config.clone()), &reqs);
        let mut spec = fx.engine(EngineConfig { speculative_config: ngram(4), ..config });
        let (drafted, spec_steps) = run(&mut spec, &reqs);
        assert_same(&drafted, &plain, name);
        let m = spec.metrics();
        assert!(m.spec_decode.num_accepted_tokens > 0, "{name}: drafts were accepted");
        assert!(m.spec_decode.num_draft_tokens > m.spec_decode.num_accepted_tokens, "{name}: some rejected");
        // Under memory pressure a draft often finds no room; it never costs a step.
        let saved = if name == "roomy" { spec_steps < plain_steps } else { spec_steps <= plain_steps };
        assert!(saved, "{name}: {spec_steps} steps with drafts, {plain_steps} without");
    }
}

#[test]
fn suffix_drafts_change_no_token() {
    let fx = Fixture::new();
    let reqs = workload();
    for (name, config) in [
        ("roomy", small_config(256)),
        ("swap", EngineConfig { preemption_mode: PreemptionMode::Swap, ..small_config(10) }),
    ] {
        let (plain, _) = run(&mut fx.engine(config.clone()), &reqs);
        let mut spec = fx.engine(EngineConfig { speculative_config: suffix(4, 16), ..config });
        let (drafted, _) = run(&mut spec, &reqs);
        assert_same(&drafted, &plain, name);
        assert!(spec.metrics().spec_decode.num_accepted_tokens > 0, "{name}: drafts were accepted");
    }
}

/// An answer given before is drafted from the cache of recent outputs, most of it at once;
/// without the cache the same request drafts only from itself.
#[test]
fn suffix_decoding_drafts_a_repeated_answer_from_recent_outputs() {
    let fx = Fixture::new();
    let req = [(
        "a".to_owned(),
        prompt_tokens(3, 12),
        SamplingParams { ignore_eos: true, ..SamplingParams::greedy(40) },
    )];
    let again = [("b".to_owned(), req[0].1.clone(), req[0].2.clone())];
    let accepted = |cached: usize| {
        let mut engine =
            fx.engine(EngineConfig { speculative_config: suffix(8, cached), ..small_config(64) });
        let (first, _) = run(&mut engine, &req);
        let before = engine.metrics().spec_decode.num_accepted_tokens;
        let (second, steps) = run(&mut engine, &again);
        assert_eq!(first[&("a".to_owned(), 0)].0, second[&("b".to_owned(), 0)].0);
        (engine.metrics().spec_decode.num_accepted_tokens - before, steps)
    };
    let (with_cache, steps) = accepted(4);
    let (alone, plain_steps) = accepted(0);
    assert!(with_cache >= 30, "{with_cache} of the 40 tokens came from drafts");
    assert!(
        with_cache > alone && steps < plain_steps,
        "{with_cache} vs {alone} accepted, {steps} vs {plain_steps} steps"
    );
}

#[test]
fn one_greedy_request_alone_decodes_as_without_drafts() {
    let fx = Fixture::new();
    let prompt = [prompt_tokens(7, 9), prompt_tokens(7, 9)].concat();
    let req =
        [("solo".to_owned(), prompt, SamplingParams { ignore_eos: true, ..SamplingParams::greedy(60) })];
    let (plain, _) = run(&mut fx.engine(small_config(64)), &req);
    for k in [1, 3, 16] {
        let (drafted, _) =
            run(&mut fx.engine(EngineConfig { speculative_config: ngram(k), ..small_config(64) }), &req);
        assert_same(&drafted, &plain, &format!("k = {k}"));
    }
}

/// SmolLM2 as users run it, asked to copy a passage: n-gram drafts from the prompt are accepted
/// and the greedy tokens are the plain ones, alone and beside the golden prompts in one batch.
#[test]
fn smollm2_copies_with_drafts_and_decodes_the_same_tokens() {
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let passage = "The paged attention kernel reads each sequence's keys and values through its block \
        table, so a sequence's cache need not be contiguous in memory.";
    let messages =
        vec![model::ChatMessage::new("user", format!("Repeat this sentence word for word: {passage}"))];
    let config = EngineConfig {
        kv_cache: engine::KvCacheSize::Blocks(256),
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    };
    let mut plain = Engine::new(&gguf, config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let chat = plain.render_chat("copy", &messages).unwrap_or_else(|e| panic!("{e}"));
    let mut reqs = vec![(
        "copy".to_owned(),
        plain.tokenize("copy", engine::Prompt::Text(chat)).unwrap_or_else(|e| panic!("{e}")),
        SamplingParams::greedy(48),
    )];
    reqs.extend((0..3).map(|i| (format!("other{i}"), prompt_tokens(50 + i, 30), SamplingParams::greedy(24))));
    let (want, _) = run(&mut plain, &reqs);
    let mut spec = Engine::new(&gguf, EngineConfig { speculative_config: ngram(4), ..config })
        .unwrap_or_else(|e| panic!("{e}"));
    let (got, _) = run(&mut spec, &reqs);
    assert_same(&got, &want, "smollm2");
    assert!(spec.metrics().spec_decode.num_accepted_tokens > 0, "the copy drafted from its prompt");
}

/// Drafts of constrained requests are cut to what their grammar takes, and the grammar follows
/// only the accepted tokens: each constrained answer is the plain one, while drafts of the
/// repetitive one are accepted.
#[test]
fn constrained_requests_draft_within_their_grammar_and_decode_the_same_tokens() {
    use engine::Constraint;
    let gguf = model::testing::smollm2_gguf();
    assert!(gguf.exists(), "{} missing: run `cargo xtask fetch-model`", gguf.display());
    let config = EngineConfig {
        kv_cache: engine::KvCacheSize::Blocks(256),
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    };
    let mut plain = Engine::new(&gguf, config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}}, "required": ["name", "tags"]});
    let constraints = [
        Constraint::Regex("(hello world, ){6}done".into()),
        Constraint::JsonSchema(schema),
        Constraint::Choice(vec!["positive".into(), "negative".into()]),
    ];
    let reqs: Vec<(String, Vec<u32>, SamplingParams)> = constraints
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let chat = plain
                .render_chat("c", &[model::ChatMessage::new("user", "Describe yourself, then repeat it.")])
                .unwrap_or_else(|e| panic!("{e}"));
            let prompt = plain.tokenize("c", engine::Prompt::Text(chat)).unwrap_or_else(|e| panic!("{e}"));
            (format!("c{i}"), prompt, SamplingParams { constraint: Some(c), ..SamplingParams::greedy(64) })
        })
        .collect();
    let (want, _) = run(&mut plain, &reqs);
    let mut spec = Engine::new(&gguf, EngineConfig { speculative_config: ngram(4), ..config })
        .unwrap_or_else(|e| panic!("{e}"));
    let (got, _) = run(&mut spec, &reqs);
    assert_same(&got, &want, "constrained");
    let (tokens, _, finish) = &want[&("c0".to_owned(), 0)];
    assert_eq!(finish.as_ref().map(FinishReason::as_str), Some("stop"), "{} tokens", tokens.len());
    assert!(spec.metrics().spec_decode.num_accepted_tokens > 0, "the repetitive answer drafted");
}

/// With the cost measured at start, drafts still change no token; a batch past
/// `disable_by_batch_size` drafts nothing.
#[test]
fn the_measured_cost_rule_and_the_batch_limit_keep_outputs() {
    let fx = Fixture::new();
    let reqs = workload();
    let (plain, _) = run(&mut fx.engine(small_config(256)), &reqs);
    let measured = ngram(4).map(|c| SpeculativeConfig { verify_cost: None, ..c });
    let (got, _) =
        run(&mut fx.engine(EngineConfig { speculative_config: measured, ..small_config(256) }), &reqs);
    assert_same(&got, &plain, "measured cost");
    let limited = ngram(4).map(|c| SpeculativeConfig { disable_by_batch_size: Some(1), ..c });
    let mut engine = fx.engine(EngineConfig { speculative_config: limited, ..small_config(256) });
    let many: Vec<_> = reqs.iter().filter(|(_, _, p)| p.n == 1).cloned().collect();
    let (got, _) = run(&mut engine, &many);
    assert_same(
        &got,
        &plain
            .iter()
            .filter(|(k, _)| many.iter().any(|(id, _, _)| *id == k.0))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        "batch limit",
    );
    // Only the last request left alone may draft: far fewer drafts than sequences' steps.
    assert!(engine.metrics().spec_decode.num_drafts < engine.metrics().steps);
}

/// Gemma 3 (SentencePiece vocabulary, sliding-window layers in a hybrid cache): greedy tokens
/// with drafts are the plain ones, and the cost rule, measured at start on the hybrid cache,
/// lets a new sample draft (a calibration that could not run there pinned the cost at k + 1
/// steps, where no draft ever pays).
#[test]
fn gemma3_decodes_the_same_tokens_with_drafts() {
    let gguf = model::testing::gemma3_gguf_for_tests();
    let text = "Copy this list exactly: apples, pears, plums, cherries, apples, pears, plums, cherries.";
    let config = EngineConfig {
        kv_cache: engine::KvCacheSize::Blocks(128),
        log_interval: std::time::Duration::ZERO,
        ..EngineConfig::default()
    };
    let mut plain = Engine::new(&gguf, config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let tokens =
        plain.tokenize("copy", engine::Prompt::Text(text.to_owned())).unwrap_or_else(|e| panic!("{e}"));
    let reqs =
        [("copy".to_owned(), tokens, SamplingParams { ignore_eos: true, ..SamplingParams::greedy(40) })];
    let (want, _) = run(&mut plain, &reqs);
    let measured = ngram(4).map(|c| SpeculativeConfig { verify_cost: None, ..c });
    let mut spec = Engine::new(&gguf, EngineConfig { speculative_config: measured, ..config })
        .unwrap_or_else(|e| panic!("{e}"));
    let (got, _) = run(&mut spec, &reqs);
    assert_same(&got, &want, "gemma3");
    assert!(spec.metrics().spec_decode.num_drafts > 0);
}
