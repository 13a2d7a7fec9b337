//! Hostile requests: sizes at `usize`/`u32` extremes, ids reused right after an abort, and
//! requests that could never fit the KV cache. Each is refused with a typed error or served
//! in full, the other requests of the batch are untouched, and no block leaks. Ends with a
//! proptest over the whole admission path (random parameters, ids, aborts, resubmits).

use std::collections::HashMap;

use engine::{Engine, FinishReason, Prompt, RequestError, RequestKey, RequestOutput, SamplingParams};
use proptest::prelude::*;

use crate::support::{Fixture, VOCAB, forced, prompt_tokens, small_config};

/// Steps until idle; every output, in order.
fn drain(engine: &mut Engine) -> Vec<RequestOutput> {
    let mut all = Vec::new();
    for _ in 0..20_000 {
        if !engine.has_unfinished() {
            return all;
        }
        all.extend(engine.step().unwrap_or_else(|e| panic!("step failed: {e}")));
    }
    panic!("engine does not make progress");
}

/// Tokens generated per request key, and the finish reason of its final output.
fn summarize(outputs: &[RequestOutput]) -> HashMap<RequestKey, (usize, Option<FinishReason>, usize)> {
    let mut by_key: HashMap<RequestKey, (usize, Option<FinishReason>, usize)> = HashMap::new();
    for out in outputs {
        let e = by_key.entry(out.request_key).or_default();
        e.0 += out.outputs.iter().map(|d| d.token_ids.len()).sum::<usize>();
        if out.finished {
            e.1 = out.outputs.first().and_then(|d| d.finish_reason.clone());
            e.2 += 1;
        }
    }
    by_key
}

#[test]
fn max_tokens_at_usize_extremes_is_refused_and_the_batch_finishes() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    let a = engine.add_request("a", prompt_tokens(1, 20), forced(30)).unwrap_or_else(|e| panic!("{e}"));
    let b = engine.add_request("b", prompt_tokens(2, 7), forced(25)).unwrap_or_else(|e| panic!("{e}"));
    let mut outputs = Vec::new();
    for _ in 0..3 {
        outputs.extend(engine.step().unwrap_or_else(|e| panic!("{e}")));
    }
    let prompt = prompt_tokens(3, 10);
    // usize::MAX - 9 + 10 wraps to exactly 0 without overflow checks.
    for max in [usize::MAX, usize::MAX - 9, usize::MAX / 2 + 1, u32::MAX as usize, 513] {
        let e = engine.add_request("evil", prompt.clone(), SamplingParams::greedy(max));
        assert!(
            matches!(e, Err(RequestError::TooLong { max_tokens, .. }) if max_tokens == max),
            "{max}: {e:?}"
        );
    }
    let e = engine.add_request(
        "evil",
        prompt,
        SamplingParams { min_tokens: usize::MAX, ..SamplingParams::greedy(4) },
    );
    assert!(matches!(e, Err(RequestError::InvalidParams { .. })), "{e:?}");
    outputs.extend(drain(&mut engine));
    let done = summarize(&outputs);
    assert_eq!(done[&a], (30, Some(FinishReason::Length), 1));
    assert_eq!(done[&b], (25, Some(FinishReason::Length), 1));
    assert_eq!(done.len(), 2);
    assert!(engine.kv_is_idle());
}

#[test]
fn the_handle_survives_usize_max_tokens() {
    let fx = Fixture::new();
    let handle = fx.spawn(small_config(64));
    let streams: Vec<_> = (0..3)
        .map(|i| handle.add_request(prompt_tokens(i, 12), forced(40)).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let e = handle.add_request(prompt_tokens(9, 12), SamplingParams::greedy(usize::MAX));
    assert!(matches!(e, Err(RequestError::TooLong { .. })), "{e:?}");
    for s in streams {
        let fin = s.collect_final().unwrap_or_else(|e| panic!("a batch-mate of the bad request failed: {e}"));
        assert_eq!(fin.completions[0].token_ids.len(), 40);
        assert_eq!(fin.completions[0].finish_reason, Some(FinishReason::Length));
    }
    assert!(handle.kv_is_idle().unwrap_or(false));
}

#[test]
fn an_id_reused_after_dropping_its_stream_gets_its_own_output() {
    let fx = Fixture::new();
    let handle = fx.spawn(small_config(64));
    for round in 0..5 {
        let mut old = handle
            .add_request_with_id("x", prompt_tokens(round, 16), forced(400))
            .unwrap_or_else(|e| panic!("{e}"));
        // Make sure the first request is running before its stream goes away.
        assert!(old.recv().is_some_and(|o| o.is_ok()));
        let old_key = old.key();
        drop(old);
        let new = handle
            .add_request_with_id("x", prompt_tokens(100 + round, 16), forced(12))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_ne!(new.key(), old_key);
        let fin = new.collect_final().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fin.completions[0].finish_reason, Some(FinishReason::Length), "round {round}");
        assert_eq!(fin.completions[0].token_ids.len(), 12, "round {round}");
    }
    assert!(handle.kv_is_idle().unwrap_or(false));
}

#[test]
fn an_engine_abort_output_carries_the_old_key() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    let old = engine.add_request("x", prompt_tokens(1, 16), forced(50)).unwrap_or_else(|e| panic!("{e}"));
    let mut outputs = engine.step().unwrap_or_else(|e| panic!("{e}"));
    assert!(engine.abort("x").is_ok());
    let new = engine.add_request("x", prompt_tokens(2, 16), forced(5)).unwrap_or_else(|e| panic!("{e}"));
    // Aborting the old key again is a no-op that leaves the new request alone.
    assert!(matches!(engine.abort_key(old), Err(RequestError::UnknownRequest(_))));
    outputs.extend(drain(&mut engine));
    let done = summarize(&outputs);
    assert_eq!(done[&old].1, Some(FinishReason::Abort));
    assert_eq!(done[&new], (5, Some(FinishReason::Length), 1));
    assert!(engine.kv_is_idle());
}

#[test]
fn requests_that_could_never_fit_are_refused_at_admission() {
    let (fx, mut engine) = Fixture::with_engine(small_config(64));
    let many = SamplingParams { n: 256, temperature: 0.8, ..forced(4) };
    let e = engine.add_request("n256", prompt_tokens(1, 10), many);
    assert!(matches!(e, Err(RequestError::ExceedsKvCache { pool_blocks: 64, .. })), "{e:?}");
    // 8 blocks of 16 tokens: a 120-token prompt has room for 8 more stored tokens (9 generated).
    let mut engine = fx.engine(small_config(8));
    let e = engine.add_request("big", prompt_tokens(2, 120), forced(16));
    assert!(matches!(e, Err(RequestError::ExceedsKvCache { blocks_needed: 9, pool_blocks: 8, .. })), "{e:?}");
    let fits = engine.add_request("fits", prompt_tokens(2, 120), forced(9)).unwrap_or_else(|e| panic!("{e}"));
    let outputs = drain(&mut engine);
    assert_eq!(summarize(&outputs)[&fits], (9, Some(FinishReason::Length), 1));
    // Unset max_tokens: as far as the cache could ever hold it alone.
    let unset = SamplingParams { max_tokens: None, ..forced(1) };
    let key = engine.add_request("unset", prompt_tokens(3, 120), unset).unwrap_or_else(|e| panic!("{e}"));
    let outputs = drain(&mut engine);
    assert_eq!(summarize(&outputs)[&key], (9, Some(FinishReason::Length), 1));
    assert_eq!(engine.metrics().requests_rejected, 1);
    assert!(engine.kv_is_idle());
}

/// One client action on the engine.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // a proptest's ops: a few hundred, built once each
enum Op {
    Add { id: u8, prompt_len: usize, bad_token: bool, params: SamplingParams },
    Abort { id: u8 },
    AbortLatestKey,
    Step { steps: u8 },
}

/// Mostly ordinary sizes, sometimes `usize`/`u32` extremes.
fn size(ordinary: std::ops::Range<usize>) -> impl Strategy<Value = usize> {
    prop_oneof![
        12 => ordinary,
        1 => Just(usize::MAX),
        1 => Just(usize::MAX - 1),
        1 => Just(usize::MAX / 2 + 1),
        1 => Just(u32::MAX as usize),
        1 => 500usize..530,
    ]
}

/// Each field valid most of the time, so that most requests get in and some are refused.
fn params() -> impl Strategy<Value = SamplingParams> {
    (
        prop_oneof![12 => 1usize..4, 1 => Just(0usize), 1 => Just(257usize), 1 => Just(usize::MAX), 1 => 60usize..80],
        prop_oneof![12 => prop_oneof![Just(0.0f32), Just(0.7)], 1 => Just(-1.0f32), 1 => Just(f32::NAN)],
        prop_oneof![12 => Just(1.0f32), 1 => Just(0.9f32), 1 => Just(0.0f32)],
        prop_oneof![12 => Just(-1i32), 1 => Just(5), 1 => Just(i32::MIN), 1 => Just(i32::MAX)],
        prop::option::of(size(1..40)),
        prop_oneof![12 => Just(0usize), 1 => size(1..40)],
        prop::option::of(prop_oneof![6 => 0usize..3, 1 => Just(usize::MAX), 1 => Just(21usize)]),
        any::<bool>(),
        prop::option::of(any::<u64>()),
        prop::collection::vec(prop_oneof![Just(u32::MAX), 0u32..300], 0..3),
    )
        .prop_map(
            |(n, temperature, top_p, top_k, max_tokens, min_tokens, logprobs, ignore_eos, seed, stop_token_ids)| {
                SamplingParams {
                    n,
                    temperature,
                    top_p,
                    top_k,
                    max_tokens,
                    min_tokens,
                    logprobs,
                    ignore_eos,
                    seed,
                    stop_token_ids,
                    ..SamplingParams::default()
                }
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, prop_oneof![0usize..40, 100usize..140, Just(511usize), Just(600usize)], prop::bool::weighted(0.1), params())
            .prop_map(|(id, prompt_len, bad_token, params)| Op::Add { id, prompt_len, bad_token, params }),
        1 => (0u8..5).prop_map(|id| Op::Abort { id }),
        1 => Just(Op::AbortLatestKey),
        3 => (1u8..6).prop_map(|steps| Op::Step { steps }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// No panic; every admitted request gets exactly one final output, routed by its key;
    /// every rejected one stores nothing; the pool is all free at the end.
    #[test]
    fn admission_path_under_hostile_traffic(ops in prop::collection::vec(op(), 1..24), blocks in 10usize..40) {
        let fx = fixture();
        let mut engine = fx.engine(small_config(blocks));
        let mut admitted: Vec<RequestKey> = Vec::new();
        let mut outputs = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Add { id, prompt_len, bad_token, params } => {
                    let mut prompt = prompt_tokens(i as u64, prompt_len);
                    if bad_token && let Some(t) = prompt.first_mut() {
                        *t = if i % 2 == 0 { u32::MAX } else { VOCAB as u32 };
                    }
                    match engine.add_request(format!("r{id}"), Prompt::Tokens(prompt), params) {
                        Ok(key) => admitted.push(key),
                        Err(RequestError::EngineStopped) => prop_assert!(false, "engine stopped"),
                        Err(_) => {}
                    }
                }
                Op::Abort { id } => { let _ = engine.abort(&format!("r{id}")); }
                Op::AbortLatestKey => {
                    if let Some(&key) = admitted.last() {
                        let _ = engine.abort_key(key);
                    }
                }
                Op::Step { steps } => {
                    for _ in 0..steps {
                        outputs.extend(engine.step().map_err(|e| TestCaseError::fail(e.to_string()))?);
                    }
                }
            }
        }
        outputs.extend(drain(&mut engine));
        let done = summarize(&outputs);
        for key in &admitted {
            prop_assert_eq!(done.get(key).map(|d| d.2), Some(1), "request {:?}: final outputs", key);
        }
        prop_assert_eq!(done.len(), admitted.len(), "outputs for keys never admitted");
        prop_assert!(engine.kv_is_idle());
    }
}

/// One tiny model folder shared by every proptest case (writing it is most of a case's cost).
fn fixture() -> &'static Fixture {
    static FX: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    FX.get_or_init(Fixture::new)
}
