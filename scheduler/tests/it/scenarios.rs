//! Hand-built scenarios: chunked prefill, decode-first ordering, prefix hits, forks with
//! copy-on-write, preemption in both modes, aborts in every state, bad input, FCFS fairness,
//! priorities.

use scheduler::{
    Policy, PreemptionMode, Request, RequestKey, SampledToken, Scheduler, SchedulerConfig, SchedulerError,
    SeqFinish, SeqId,
};

use crate::fake::{FakeEngine, expected_outputs};

pub(crate) fn cfg(blocks: usize, block_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 16,
        max_model_len: 512,
        block_size,
        num_device_blocks: blocks,
        watermark: 0.0,
        ..SchedulerConfig::default()
    }
}

/// [`cfg`] with a token budget of `tokens` per step.
fn budgeted(blocks: usize, block_size: usize, tokens: usize) -> SchedulerConfig {
    SchedulerConfig { max_num_batched_tokens: tokens, ..cfg(blocks, block_size) }
}

/// The last step's (request, token range) entries, in order.
fn last_ranges(e: &FakeEngine) -> Vec<(u64, std::ops::Range<usize>)> {
    e.last.seqs.iter().map(|s| (s.seq_id.request.0, s.tokens.clone())).collect()
}

pub(crate) fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| seed * 1000 + i).collect()
}

fn assert_all_expected(engine: &FakeEngine, reqs: &[Request]) {
    for r in reqs {
        assert_eq!(engine.finished.get(&r.key), Some(&1), "request {} finished exactly once", r.key);
        let want = expected_outputs(r, engine.cfg.max_model_len, engine.stop_mod);
        assert_eq!(engine.outputs_of(r.key, r.n), want, "request {} tokens", r.key);
    }
}

#[test]
fn single_request_generates_exactly_its_length() {
    let mut e = FakeEngine::new(cfg(64, 4));
    let r = Request::new(1, prompt(1, 10), 5);
    e.add(r.clone()).unwrap();
    e.run_to_end(100);
    assert_eq!(e.step, 5, "one prefill step and four decodes");
    assert_eq!(e.reasons[&SeqId { request: RequestKey(1), index: 0 }], SeqFinish::Length);
    assert_all_expected(&e, &[r]);
}

#[test]
fn long_prompts_are_chunked_to_the_budget() {
    let mut e = FakeEngine::new(budgeted(64, 4, 32));
    let r = Request::new(1, prompt(1, 100), 3);
    e.add(r.clone()).unwrap();
    let mut chunks = Vec::new();
    for _ in 0..4 {
        e.step();
        let s = &e.last.seqs[0];
        chunks.push((s.tokens.clone(), s.num_samples));
    }
    assert_eq!(chunks, vec![(0..32, 0), (32..64, 0), (64..96, 0), (96..100, 1)]);
    e.run_to_end(100);
    assert_all_expected(&e, &[r]);
}

#[test]
fn a_waiting_prompt_is_admitted_only_when_all_of_it_fits() {
    // 16 blocks of 4. Request 1 holds 10 blocks; request 2's prompt needs 8 with 6 free: a
    // chunk of 24 of its tokens would fit, the whole prompt does not.
    let mut e = FakeEngine::new(budgeted(16, 4, 40));
    let first = Request::new(1, prompt(1, 39), 2);
    let second = Request::new(2, prompt(2, 32), 2);
    e.add(first.clone()).unwrap();
    e.step();
    e.add(second.clone()).unwrap();
    e.step();
    assert!(
        e.last.seqs.iter().all(|s| s.seq_id.request == RequestKey(1)),
        "the second prompt waits instead of taking a first chunk it could not complete"
    );
    assert_eq!(e.sched.num_waiting(), 1);
    e.run_to_end(20);
    assert_eq!(e.preempted, 0);
    assert_all_expected(&e, &[first, second]);
}

#[test]
fn decodes_go_first_then_partial_prefills_then_new_requests() {
    let mut e = FakeEngine::new(budgeted(256, 4, 20));
    let a = Request::new(1, prompt(1, 4), 50);
    e.add(a).unwrap();
    e.step(); // a prefilled
    let b = Request::new(2, prompt(2, 40), 5);
    e.add(b).unwrap();
    e.step(); // a decodes (1 token), b gets 19
    assert_eq!(last_ranges(&e), vec![(1, 4..5), (2, 0..19)]);
    let c3 = Request::new(3, prompt(3, 8), 5);
    e.add(c3).unwrap();
    e.step(); // a decode, b's partial prefill takes the rest: c waits
    assert_eq!(last_ranges(&e), vec![(1, 5..6), (2, 19..38)]);
    e.step(); // b finishes its prompt (2 tokens), c is admitted with the remainder
    assert_eq!(last_ranges(&e), vec![(1, 6..7), (2, 38..40), (3, 0..8)]);
    e.run_to_end(200);
}

#[test]
fn prefix_hits_count_as_computed_but_the_last_prompt_token_is_always_computed() {
    let mut c = cfg(64, 16);
    c.enable_prefix_caching = true;
    let mut e = FakeEngine::new(c);
    let shared = prompt(7, 40);
    let first = Request::new(1, shared.clone(), 3);
    e.add(first.clone()).unwrap();
    e.run_to_end(50);
    // Same 40-token prompt: two full blocks (32 tokens) hit; tokens 32..40 are computed.
    let second = Request::new(2, shared[..40].to_vec(), 3);
    e.add(second.clone()).unwrap();
    e.step();
    assert_eq!(e.last.seqs[0].tokens, 32..40);
    e.run_to_end(50);
    // A prompt of exactly two blocks: only the first block may hit (the last token is computed).
    let third = Request::new(3, shared[..32].to_vec(), 2);
    e.add(third.clone()).unwrap();
    e.step();
    assert_eq!(e.last.seqs[0].tokens, 16..32);
    e.run_to_end(50);
    // A different salt shares nothing.
    let salted = Request::new(4, shared.clone(), 2).with_salt(9);
    e.add(salted.clone()).unwrap();
    e.step();
    assert_eq!(e.last.seqs[0].tokens, 0..40);
    e.run_to_end(50);
    // A request that wants every prompt position's logits reads no hit, though the cache has them.
    let unhit = Request::new(5, shared.clone(), 2).with_skip_prefix_hits(true);
    e.add(unhit.clone()).unwrap();
    e.step();
    assert_eq!(e.last.seqs[0].tokens, 0..40);
    e.run_to_end(50);
    assert_all_expected(&e, &[first, second, third, salted, unhit]);
    let stats = e.sched.device_pool().prefix_stats();
    assert_eq!(stats.hit_blocks, 3);
}

#[test]
fn parallel_samples_share_the_prompt_and_copy_on_write() {
    let mut e = FakeEngine::new(cfg(64, 4));
    // 10 tokens: the third block is partly filled and shared by the 3 samples after the fork.
    let r = Request::new(1, prompt(1, 10), 6).with_n(3);
    e.add(r.clone()).unwrap();
    e.step();
    assert_eq!(e.last.seqs.len(), 1);
    assert_eq!(e.last.seqs[0].num_samples, 3);
    assert_eq!(e.sched.device_pool().num_used(), 3, "prompt blocks held once");
    e.step();
    assert_eq!(e.last.seqs.len(), 3);
    // Two of the three samples copy the shared last block; the last one keeps it.
    assert_eq!(e.last.blocks_to_copy.len(), 2);
    let tables: Vec<_> = e.last.seqs.iter().map(|s| e.table(0, s).to_vec()).collect();
    assert_eq!(tables[0][..2], tables[1][..2], "full prompt blocks stay shared");
    assert_ne!(tables[0][2], tables[1][2]);
    e.run_to_end(100);
    assert_all_expected(&e, &[r]);
    assert_eq!(e.reasons.len(), 3);
}

#[test]
fn parallel_samples_finish_independently() {
    let mut e = FakeEngine::new(cfg(64, 4));
    e.stop_mod = Some(7);
    let reqs: Vec<Request> =
        (0..6).map(|i| Request::new(i, prompt(i as u32, 5 + i as usize), 20).with_n(4)).collect();
    for r in &reqs {
        e.add(r.clone()).unwrap();
    }
    e.run_to_end(500);
    assert_all_expected(&e, &reqs);
    assert!(e.reasons.values().any(|r| *r == SeqFinish::Stopped));
    assert!(e.reasons.values().any(|r| *r == SeqFinish::Length));
}

fn pressure_requests() -> Vec<Request> {
    (0..12u64)
        .map(|i| {
            Request::new(i, prompt(i as u32, 6 + (i as usize * 7) % 13), 12 + (i as usize * 5) % 17)
                .with_n(1 + (i as usize % 3))
        })
        .collect()
}

/// [`pressure_requests`] run to the end on 24 blocks of 4 (a pool small enough to preempt),
/// preempting by `mode` with `host` host blocks: the preemption tests differ only in those.
fn run_pressure(mode: PreemptionMode, host: usize) -> (FakeEngine, Vec<Request>) {
    let mut e = FakeEngine::new(SchedulerConfig { preemption: mode, num_host_blocks: host, ..cfg(24, 4) });
    let reqs = pressure_requests();
    for r in &reqs {
        e.add(r.clone()).unwrap();
    }
    e.run_to_end(5_000);
    (e, reqs)
}

#[test]
fn recompute_preemption_resumes_with_the_same_tokens() {
    let (e, reqs) = run_pressure(PreemptionMode::Recompute, cfg(0, 4).num_host_blocks);
    assert!(e.preempted > 0, "the pool is small enough to force preemption");
    assert_eq!(e.sched.stats().preemptions_swap, 0);
    assert_all_expected(&e, &reqs);
}

#[test]
fn swap_preemption_resumes_with_the_same_tokens() {
    let (e, reqs) = run_pressure(PreemptionMode::Swap, 64);
    assert!(e.sched.stats().preemptions_swap > 0);
    assert!(e.swaps_out > 0 && e.swaps_in == e.swaps_out);
    assert_all_expected(&e, &reqs);
}

#[test]
fn swapped_out_blocks_carry_their_adapters_id_on_the_host_events() {
    use block_alloc::CacheEvent;
    use std::collections::HashMap;
    let mut e = FakeEngine::new(SchedulerConfig {
        preemption: PreemptionMode::Swap,
        num_host_blocks: 64,
        enable_prefix_caching: true,
        ..cfg(24, 4)
    });
    e.sched.enable_cache_events();
    for (i, r) in pressure_requests().into_iter().enumerate() {
        e.add(if i % 2 == 0 { r.with_lora(7) } else { r }).unwrap();
    }
    let (mut device, mut host) = (Vec::new(), Vec::new());
    let mut label_of: HashMap<u64, Option<u32>> = HashMap::new();
    let mut host_stored = 0;
    for _ in 0..5_000 {
        if !e.sched.has_unfinished() {
            break;
        }
        e.step();
        e.sched.take_cache_events(&mut device, &mut host);
        for ev in device.drain(..) {
            if let CacheEvent::Stored { block_hashes, lora_id, .. } = ev {
                label_of.extend(block_hashes.into_iter().map(|h| (h, lora_id)));
            }
        }
        for ev in host.drain(..) {
            if let CacheEvent::Stored { block_hashes, lora_id, .. } = ev {
                for h in block_hashes {
                    assert_eq!(label_of.get(&h), Some(&lora_id), "host block {h:#x}: its device label");
                    host_stored += 1;
                }
            }
        }
    }
    assert!(e.sched.stats().preemptions_swap > 0 && host_stored > 0);
    assert!(label_of.values().any(Option::is_some) && label_of.values().any(Option::is_none));
}

#[test]
fn swap_falls_back_to_recompute_when_the_host_is_full() {
    let (e, reqs) = run_pressure(PreemptionMode::Swap, 4);
    let stats = e.sched.stats();
    assert!(stats.preemptions_recompute > 0);
    assert_all_expected(&e, &reqs);
}

#[test]
fn abort_in_every_state_frees_everything() {
    let mut c = cfg(12, 4);
    c.preemption = PreemptionMode::Swap;
    c.num_host_blocks = 32;
    let mut e = FakeEngine::new(c);
    for i in 0..6 {
        e.add(Request::new(i, prompt(i as u32, 9), 30)).unwrap();
    }
    let mut aborted_states = std::collections::HashSet::new();
    for _ in 0..40 {
        e.step();
        if e.sched.num_swapped() > 0 && !aborted_states.contains("swapped") {
            let victim = *e.last.preempted.last().unwrap_or(&RequestKey(u64::MAX));
            if e.sched.contains(victim) {
                e.abort(victim).unwrap();
                aborted_states.insert("swapped");
            }
        }
    }
    assert!(aborted_states.contains("swapped"), "a swapped request was aborted");
    // Waiting.
    e.add(Request::new(100, prompt(100, 9), 5)).unwrap();
    e.abort(RequestKey(100)).unwrap();
    // In flight: after schedule, before update.
    let out = e.sched.schedule().unwrap();
    let running = out.seqs[0].seq_id.request;
    e.sched.abort(running).unwrap();
    let samples: Vec<SampledToken> = out
        .seqs
        .iter()
        .flat_map(|s| {
            (0..s.num_samples).map(move |_| SampledToken { seq_id: s.seq_id, token: 1, stop: false })
        })
        .collect();
    e.sched.update(&samples).unwrap();
    assert!(!e.sched.contains(running));
    e.check_blocks();
    assert!(matches!(e.sched.abort(running), Err(SchedulerError::UnknownRequest(_))));
    assert!(matches!(
        e.sched.abort(RequestKey(12345)),
        Err(SchedulerError::UnknownRequest(RequestKey(12345)))
    ));
    let left: Vec<RequestKey> = (0..6).map(RequestKey).filter(|&i| e.sched.contains(i)).collect();
    for i in left {
        e.abort(i).unwrap();
    }
    assert!(!e.sched.has_unfinished());
    assert_eq!(e.sched.device_pool().num_used(), 0);
    assert_eq!(e.sched.host_pool().map(|h| h.num_used()), Some(0));
    let next = e.sched.schedule().unwrap();
    assert!(next.aborted.contains(&running));
}

#[test]
fn bad_requests_get_typed_errors_and_store_nothing() {
    let mut s = Scheduler::new(SchedulerConfig {
        num_device_blocks: 8,
        block_size: 4,
        max_model_len: 64,
        max_num_seqs: 4,
        watermark: 0.0,
        ..SchedulerConfig::default()
    })
    .unwrap();
    assert!(matches!(
        s.add_request(Request::new(1, vec![1], 5).with_n(0)),
        Err(SchedulerError::ZeroSamples(RequestKey(1)))
    ));
    assert!(matches!(
        s.add_request(Request::new(1, vec![1], 5).with_n(5)),
        Err(SchedulerError::TooManySamples { .. })
    ));
    assert!(matches!(
        s.add_request(Request::new(1, vec![], 5)),
        Err(SchedulerError::EmptyPrompt(RequestKey(1)))
    ));
    assert!(matches!(
        s.add_request(Request::new(1, vec![1], 0)),
        Err(SchedulerError::ZeroMaxTokens(RequestKey(1)))
    ));
    assert!(matches!(
        s.add_request(Request::new(1, vec![1; 65], 5)),
        Err(SchedulerError::PromptTooLong { len: 65, .. })
    ));
    assert!(matches!(
        s.add_request(Request::new(1, vec![1; 33], 5)),
        Err(SchedulerError::ExceedsPool { blocks_needed: 9, .. })
    ));
    assert!(!s.has_unfinished());
    s.add_request(Request::new(1, vec![1, 2], 5)).unwrap();
    assert!(matches!(
        s.add_request(Request::new(1, vec![1], 5)),
        Err(SchedulerError::DuplicateRequest(RequestKey(1)))
    ));
    assert!(matches!(s.update(&[]), Err(SchedulerError::NoStepInFlight)));
    let out = s.schedule().unwrap();
    assert!(matches!(s.schedule(), Err(SchedulerError::StepInFlight)));
    let id = out.seqs[0].seq_id;
    let wrong = SeqId { request: RequestKey(9), index: 0 };
    let bad = [SampledToken { seq_id: wrong, token: 3, stop: false }];
    assert!(matches!(s.update(&bad), Err(SchedulerError::SampleMismatch { position: 0, .. })));
    assert!(matches!(s.update(&[]), Err(SchedulerError::SampleMismatch { got: None, .. })));
    let extra = [
        SampledToken { seq_id: id, token: 3, stop: false },
        SampledToken { seq_id: id, token: 4, stop: false },
    ];
    assert!(matches!(
        s.update(&extra),
        Err(SchedulerError::SampleMismatch { position: 1, expected: None, .. })
    ));
    // Nothing was applied by the failed updates: the right one still works.
    s.update(&extra[..1]).unwrap();
    assert_eq!(s.seq_tokens(id), Some(&[1, 2, 3][..]));
    assert!(matches!(
        Scheduler::new(SchedulerConfig { max_num_seqs: 0, ..SchedulerConfig::default() }),
        Err(SchedulerError::InvalidConfig(_))
    ));
    assert!(matches!(
        Scheduler::new(SchedulerConfig { watermark: 1.5, ..SchedulerConfig::default() }),
        Err(SchedulerError::InvalidConfig(_))
    ));
}

#[test]
fn a_sequence_outgrowing_the_pool_finishes_with_a_reason() {
    let mut c = cfg(4, 4);
    c.max_model_len = 1000;
    let mut e = FakeEngine::new(c);
    e.add(Request::new(1, prompt(1, 8), 100)).unwrap();
    e.add(Request::new(2, prompt(2, 3), 2)).unwrap();
    e.run_to_end(200);
    assert_eq!(e.capacity_exceeded, vec![RequestKey(1)]);
    assert_eq!(e.reasons.get(&SeqId { request: RequestKey(2), index: 0 }), Some(&SeqFinish::Length));
    assert_eq!(e.finished[&RequestKey(1)], 1);
    // It generated until the pool (16 slots) was full: 8 prompt + 8 generated tokens computed.
    assert_eq!(e.outputs_of(RequestKey(1), 1)[0].len(), 9);
}

#[test]
fn max_model_len_caps_generation() {
    let mut c = cfg(64, 4);
    c.max_model_len = 20;
    let mut e = FakeEngine::new(c);
    let r = Request::new(1, prompt(1, 15), 100);
    e.add(r.clone()).unwrap();
    e.run_to_end(100);
    assert_eq!(e.outputs_of(RequestKey(1), 1)[0].len(), 5);
    assert_all_expected(&e, &[r]);
}

#[test]
fn fcfs_admits_in_arrival_order_and_bounds_waiting() {
    let mut c = cfg(1024, 4);
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 16;
    let mut e = FakeEngine::new(c);
    let reqs: Vec<Request> = (0..30u64)
        .map(|i| Request::new(i, prompt(i as u32, 1 + (i as usize * 13) % 40), 1 + (i as usize * 7) % 25))
        .collect();
    for r in &reqs {
        e.add(r.clone()).unwrap();
    }
    e.run_to_end(10_000);
    assert_eq!(e.admission_order, (0..30).map(RequestKey).collect::<Vec<_>>());
    // Without preemption each earlier request needs at most ceil(prompt / budget) + max_new steps.
    for (i, r) in reqs.iter().enumerate() {
        let bound: u64 =
            reqs[..i].iter().map(|p| (p.prompt.len().div_ceil(16) + p.max_new_tokens) as u64).sum();
        let waited = e.first_scheduled[&r.key] - e.added_at[&r.key];
        assert!(waited <= bound + 1, "request {i} waited {waited} > {bound}");
    }
    assert_all_expected(&e, &reqs);
    assert_eq!(e.max_seqs, 4);
}

#[test]
fn priority_serves_urgent_requests_first_and_preempts_for_them() {
    let mut c = cfg(12, 4);
    c.policy = Policy::Priority;
    let mut e = FakeEngine::new(c);
    let low: Vec<Request> =
        (0..3u64).map(|i| Request::new(i, prompt(i as u32, 12), 20).with_priority(5)).collect();
    for r in &low {
        e.add(r.clone()).unwrap();
    }
    e.step();
    e.step();
    let urgent = Request::new(9, prompt(9, 12), 4).with_priority(-1);
    e.add(urgent.clone()).unwrap();
    e.step();
    assert!(e.last.seqs.iter().any(|s| s.seq_id.request == RequestKey(9)), "the urgent request runs at once");
    assert!(!e.last.preempted.is_empty(), "by preempting a low-priority one");
    e.run_to_end(1_000);
    assert_all_expected(&e, &low);
    assert_all_expected(&e, &[urgent]);
    assert!(e.reasons[&SeqId { request: RequestKey(9), index: 0 }] == SeqFinish::Length);
}

#[test]
fn fit_alone_helpers_agree_and_a_fitting_request_never_exceeds_capacity() {
    use scheduler::{blocks_for_request, max_new_tokens_within};
    for bs in [4, 8, 16] {
        for prompt_len in [1, 3, 4, 5, 15, 16, 17, 40] {
            for n in [1, 2, 3] {
                for pool in [1, 2, 5, 9, 20] {
                    let m = max_new_tokens_within(bs, prompt_len, n, pool);
                    let need = |m| blocks_for_request(bs, prompt_len, m, n).unwrap();
                    if prompt_len.div_ceil(bs) > pool {
                        assert_eq!(m, 0);
                        continue;
                    }
                    assert!(m >= 1 && need(m) <= pool, "bs {bs} p {prompt_len} n {n} pool {pool}: {m}");
                    assert!(
                        need(m + 1) > pool,
                        "bs {bs} p {prompt_len} n {n} pool {pool}: {m} not the largest"
                    );
                    // Run it alone on a pool of exactly that size: it finishes by length.
                    let mut c = cfg(pool, bs);
                    c.max_model_len = 10_000;
                    c.watermark = 0.0;
                    let mut e = FakeEngine::new(c);
                    e.add(Request::new(1, prompt(1, prompt_len), m).with_n(n)).unwrap();
                    e.run_to_end(10_000);
                    assert!(e.capacity_exceeded.is_empty(), "bs {bs} p {prompt_len} n {n} pool {pool} m {m}");
                    for k in 0..n as u32 {
                        assert_eq!(e.outputs_of(RequestKey(1), n)[k as usize].len(), m);
                    }
                }
            }
        }
    }
    assert_eq!(blocks_for_request(16, 10, usize::MAX, 1), None);
    assert_eq!(blocks_for_request(16, 10, usize::MAX / 2, 64), None);
}
