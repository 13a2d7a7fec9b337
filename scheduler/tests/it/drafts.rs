//! Speculative decoding in the scheduler: drafts scheduled after a sequence's last token, the
//! accepted prefix kept and the rest rolled back (slots, blocks, cached hashes), outputs exactly
//! those of plain decoding, and bad drafts refused.

use scheduler::{
    PreemptionMode, Request, RequestKey, SampledToken, Scheduler, SchedulerConfig, SchedulerError, SeqId,
};

use crate::fake::{FakeEngine, expected_outputs, next_token};
use crate::scenarios::{cfg, prompt};

/// Runs `reqs` to the end with `draft_k` draft tokens a step; checks every output is plain
/// decoding's and returns the engine.
fn run(cfg: SchedulerConfig, reqs: &[Request], draft_k: usize, stop_mod: Option<u32>) -> FakeEngine {
    let mut e = FakeEngine::new(cfg);
    e.draft_k = draft_k;
    e.stop_mod = stop_mod;
    for r in reqs {
        e.add(r.clone()).unwrap_or_else(|err| panic!("{err}"));
    }
    e.run_to_end(5_000);
    for r in reqs {
        assert_eq!(e.finished.get(&r.key), Some(&1), "request {} finished exactly once", r.key);
        let want = expected_outputs(r, e.cfg.max_model_len, e.stop_mod);
        assert_eq!(e.outputs_of(r.key, r.n), want, "request {} tokens", r.key);
    }
    e
}

#[test]
fn accepted_drafts_save_steps_and_change_no_token() {
    let reqs = [Request::new(1, prompt(1, 10), 40)];
    let plain = run(cfg(64, 4), &reqs, 0, None);
    let drafted = run(cfg(64, 4), &reqs, 4, None);
    assert!(drafted.drafted > 0 && drafted.accepted > 0 && drafted.accepted < drafted.drafted);
    assert!(drafted.step < plain.step, "{} steps drafted vs {} plain", drafted.step, plain.step);
}

#[test]
fn drafts_survive_preemption_prefix_caching_forks_and_stops() {
    let reqs: Vec<Request> = (0..12u64)
        .map(|i| {
            Request::new(i, prompt(i as u32 % 4, 6 + (i as usize * 7) % 13), 12 + (i as usize * 5) % 17)
                .with_n(1 + (i as usize % 3))
        })
        .collect();
    for (mode, host, caching) in [
        (PreemptionMode::Recompute, 0, false),
        (PreemptionMode::Swap, 64, true),
        (PreemptionMode::Recompute, 0, true),
    ] {
        let c = SchedulerConfig {
            preemption: mode,
            num_host_blocks: host,
            enable_prefix_caching: caching,
            ..cfg(24, 4)
        };
        let e = run(c.clone(), &reqs, 3, None);
        assert!(
            e.preempted > 0 && e.accepted > 0,
            "{mode:?}: preempted {} accepted {}",
            e.preempted,
            e.accepted
        );
        run(c, &reqs, 3, Some(7));
    }
}

#[test]
fn sliding_window_groups_take_drafts_too() {
    let c = SchedulerConfig { kv_groups: vec![None, Some(6)], ..cfg(96, 4) };
    let reqs: Vec<Request> =
        (0..4u64).map(|i| Request::new(i, prompt(i as u32, 9 + i as usize), 30)).collect();
    let e = run(c, &reqs, 4, None);
    assert!(e.accepted > 0);
}

/// One request through its prompt, then a draft of `draft` scheduled with its last token.
fn drafted_step(draft: &[u32]) -> (Scheduler, SeqId, Vec<u32>) {
    let mut s = Scheduler::new(cfg(16, 4)).unwrap_or_else(|e| panic!("{e}"));
    let id = SeqId { request: RequestKey(7), index: 0 };
    s.add_request(Request::new(7, prompt(7, 5), 20)).unwrap_or_else(|e| panic!("{e}"));
    let out = s.schedule().unwrap_or_else(|e| panic!("{e}"));
    let first = next_token(&prompt(7, 5), 0);
    assert_eq!(out.seqs.len(), 1);
    s.update(&[SampledToken { seq_id: id, token: first, stop: false }]).unwrap_or_else(|e| panic!("{e}"));
    s.set_draft(id, draft).unwrap_or_else(|e| panic!("{e}"));
    let out = s.schedule().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((out.seqs[0].num_draft, out.sample_indices.len()), (draft.len(), draft.len() + 1));
    let tokens = s.seq_tokens(id).map(<[u32]>::to_vec).unwrap_or_default();
    (s, id, tokens)
}

#[test]
fn an_accepted_token_that_differs_from_the_draft_is_refused() {
    let (mut s, id, tokens) = drafted_step(&[11, 12, 13]);
    assert_eq!(&tokens[tokens.len() - 3..], [11, 12, 13], "the draft is scheduled after the last token");
    let used = s.device_pool().num_used();
    let bad = [
        SampledToken { seq_id: id, token: 11, stop: false },
        SampledToken { seq_id: id, token: 99, stop: false },
        SampledToken { seq_id: id, token: 5, stop: false },
    ];
    assert!(matches!(s.update(&bad), Err(SchedulerError::DraftMismatch(got)) if got == id));
    assert_eq!(s.device_pool().num_used(), used, "nothing freed by a refused update");
    let unknown = SeqId { request: RequestKey(8), index: 0 };
    assert!(
        matches!(s.set_draft(unknown, &[1]), Err(SchedulerError::UnknownSequence(got)) if got == unknown)
    );
}

#[test]
fn a_rejected_draft_gives_its_blocks_back() {
    // Five prompt tokens and one sampled fill two blocks of four; a draft of 6 takes two more.
    let (mut s, id, tokens) = drafted_step(&[1, 2, 3, 4, 5, 6]);
    assert_eq!(s.device_pool().num_used(), 3);
    let target = next_token(&tokens[..6], 0);
    s.update(&[SampledToken { seq_id: id, token: target, stop: false }]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.seq_tokens(id).map(<[u32]>::len), Some(7), "prompt, first token, the target's token");
    assert_eq!(s.device_pool().num_used(), 2, "the draft's extra blocks are free again");
    assert_eq!(s.seq_block_table(id).map(<[u32]>::len), Some(2));
}
