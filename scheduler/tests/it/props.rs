//! Property tests: random arrivals, lengths, sample counts, priorities and aborts over tiny
//! pools that force preemption, in both preemption modes, with prefix caching on and off.
//! Every step checks budgets, slot mappings, KV contents read back and block accounting.

use proptest::prelude::*;
use scheduler::{
    Policy, PreemptionMode, Request, RequestKey, SampledToken, Scheduler, SchedulerConfig, SchedulerOutput,
    StepResult,
};

use crate::fake::{FakeEngine, expected_outputs};

#[derive(Debug, Clone)]
struct Arrival {
    step: u64,
    prompt_len: usize,
    /// Prompts drawn from a few shared prefixes so prefix caching has something to hit.
    family: u32,
    max_new: usize,
    n: usize,
    priority: i64,
    /// Abort this many steps after arrival, if set.
    abort_after: Option<u64>,
}

prop_compose! {
    fn arrival()(
        step in 0u64..30,
        prompt_len in 1usize..40,
        family in 0u32..3,
        max_new in 1usize..30,
        n in 1usize..4,
        priority in -2i64..3,
        abort_after in prop::option::weighted(0.25, 0u64..40),
    ) -> Arrival {
        Arrival { step, prompt_len, family, max_new, n, priority, abort_after }
    }
}

#[derive(Debug, Clone)]
struct Setup {
    block_size: usize,
    blocks: usize,
    host_blocks: usize,
    budget: usize,
    max_seqs: usize,
    swap: bool,
    priority: bool,
    caching: bool,
    watermark: f64,
    stop_mod: Option<u32>,
    /// Per KV cache group, its sliding window.
    kv_groups: Vec<Option<usize>>,
    /// Draft tokens proposed to every decoding sequence before each step (0: none).
    draft_k: usize,
}

prop_compose! {
    fn setup()(
        block_size in prop::sample::select(vec![1usize, 2, 4, 8]),
        blocks in 10usize..40,
        host_blocks in 0usize..40,
        budget in 8usize..64,
        max_seqs in 4usize..12,
        swap in any::<bool>(),
        priority in any::<bool>(),
        caching in any::<bool>(),
        watermark in prop::sample::select(vec![0.0, 0.05]),
        stop_mod in prop::option::of(5u32..40),
        kv_groups in kv_groups(),
        draft_k in prop::sample::select(vec![0usize, 0, 1, 4]),
    ) -> Setup {
        // Room for at least one 40-token prompt, not much more.
        let blocks = blocks.max(48usize.div_ceil(block_size) + 2);
        // Hybrid layouts hold a table per group: room for a prompt in each.
        let blocks = blocks * kv_groups.len();
        Setup { block_size, blocks, host_blocks, budget, max_seqs, swap, priority, caching, watermark, stop_mod, kv_groups, draft_k }
    }
}

/// One full group (most models), one sliding group (Mistral), or a hybrid of both (Gemma).
fn kv_groups() -> impl Strategy<Value = Vec<Option<usize>>> {
    prop_oneof![
        2 => Just(vec![None]),
        1 => (1usize..24).prop_map(|w| vec![Some(w)]),
        2 => (1usize..24, 1usize..3).prop_map(|(w, sliding)| {
            std::iter::once(None).chain(std::iter::repeat_n(Some(w), sliding)).collect()
        }),
    ]
}

impl Setup {
    fn config(&self) -> SchedulerConfig {
        SchedulerConfig {
            max_num_batched_tokens: self.budget,
            max_num_seqs: self.max_seqs,
            max_model_len: 96,
            policy: if self.priority { Policy::Priority } else { Policy::Fcfs },
            preemption: if self.swap { PreemptionMode::Swap } else { PreemptionMode::Recompute },
            block_size: self.block_size,
            num_device_blocks: self.blocks,
            num_host_blocks: self.host_blocks,
            watermark: self.watermark,
            enable_prefix_caching: self.caching,
            kv_groups: self.kv_groups.clone(),
            max_loras: None,
        }
    }
}

impl Arrival {
    /// The request this arrival submits as `id`; a family's prompts share their prefix.
    fn request(&self, id: RequestKey) -> Request {
        let prompt: Vec<u32> = (0..self.prompt_len as u32).map(|t| self.family * 100_000 + t).collect();
        Request::new(id, prompt, self.max_new).with_n(self.n).with_priority(self.priority)
    }
}

/// Runs the traffic; returns (preemptions, swapped-out blocks).
fn run(setup: &Setup, arrivals: &[Arrival]) -> (usize, usize) {
    let cfg = setup.config();
    let mut e = FakeEngine::new(cfg.clone());
    e.stop_mod = setup.stop_mod;
    e.draft_k = setup.draft_k;
    let mut requests = Vec::new();
    let mut aborts: Vec<(u64, RequestKey)> = Vec::new();
    let last_arrival = arrivals.iter().map(|a| a.step).max().unwrap_or(0);
    let mut step = 0;
    loop {
        for (i, a) in arrivals.iter().enumerate().filter(|(_, a)| a.step == step) {
            let id = RequestKey(i as u64);
            let req = a.request(id);
            e.add(req.clone()).expect("valid request");
            requests.push(req);
            if let Some(after) = a.abort_after {
                aborts.push((step + after, id));
            }
        }
        for &(at, id) in &aborts {
            if at == step && e.sched.contains(id) {
                e.abort(id).expect("abort a live request");
            }
        }
        e.step();
        step += 1;
        if step > last_arrival && !e.sched.has_unfinished() {
            break;
        }
        assert!(step < 20_000, "livelock");
    }
    assert_eq!(e.sched.device_pool().num_used(), 0, "device blocks leaked");
    assert_eq!(e.sched.host_pool().map_or(0, |h| h.num_used()), 0, "host blocks leaked");
    for r in &requests {
        let aborted = e.aborted.contains(&r.key);
        let finished = e.finished.get(&r.key).copied().unwrap_or(0);
        assert_eq!(finished + usize::from(aborted), 1, "request {} ends exactly once", r.key);
        if e.capacity_exceeded.contains(&r.key) {
            continue;
        }
        let want = expected_outputs(r, cfg.max_model_len, setup.stop_mod);
        let got = e.outputs_of(r.key, r.n);
        if aborted {
            // A prefix of the right tokens.
            for (g, w) in got.iter().zip(&want) {
                assert!(w.starts_with(g), "aborted request {} diverged", r.key);
            }
        } else {
            assert_eq!(got, want, "request {} tokens", r.key);
        }
    }
    (e.preempted, e.swaps_out)
}

/// Steps two identical schedulers through the same traffic, one writing into the same output
/// every step, the other into a fresh output; the plans (block-table deltas included) must agree
/// every step: the deltas depend on the scheduler's state only, never on the buffer reused.
fn reused_and_fresh_outputs_agree(setup: &Setup, arrivals: &[Arrival]) {
    let cfg = setup.config();
    let mut reusing = Scheduler::new(cfg.clone()).expect("config");
    let mut fresh = Scheduler::new(cfg).expect("config");
    let (mut out, mut result, mut samples) = (SchedulerOutput::default(), StepResult::default(), Vec::new());
    let last_arrival = arrivals.iter().map(|a| a.step).max().unwrap_or(0);
    for step in 0..5_000u64 {
        for (i, a) in arrivals.iter().enumerate().filter(|(_, a)| a.step == step) {
            let req = a.request(RequestKey(i as u64));
            reusing.add_request(req.clone()).expect("valid request");
            fresh.add_request(req).expect("valid request");
        }
        reusing.schedule_into(&mut out).expect("schedule");
        let plan = fresh.schedule().expect("schedule");
        assert_eq!(out, plan, "step {step}");
        samples.clear();
        for s in &out.seqs {
            for k in 0..s.num_samples {
                let token = (s.seq_id.request.0 as u32) * 31 + s.tokens.end as u32 * 7 + k as u32;
                samples.push(SampledToken { seq_id: s.seq_id, token, stop: token.is_multiple_of(23) });
            }
        }
        if !out.is_empty() {
            reusing.update_into(&samples, &mut result).expect("update");
            fresh.update(&samples).expect("update");
        }
        if step > last_arrival && !reusing.has_unfinished() {
            assert!(!fresh.has_unfinished());
            return;
        }
    }
    panic!("livelock");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 768, ..ProptestConfig::default() })]

    #[test]
    fn random_traffic_on_tiny_pools(setup in setup(), arrivals in prop::collection::vec(arrival(), 1..24)) {
        run(&setup, &arrivals);
    }

    #[test]
    fn reused_and_fresh_outputs_plan_alike(
        setup in setup(),
        arrivals in prop::collection::vec(arrival(), 1..24),
    ) {
        reused_and_fresh_outputs_agree(&setup, &arrivals);
    }
}

#[test]
fn tiny_pools_do_force_preemption_in_both_modes() {
    for swap in [false, true] {
        let setup = Setup {
            block_size: 4,
            blocks: 14,
            host_blocks: 40,
            budget: 32,
            max_seqs: 8,
            swap,
            priority: false,
            caching: false,
            watermark: 0.0,
            stop_mod: None,
            kv_groups: vec![None],
            draft_k: 0,
        };
        let arrivals: Vec<Arrival> = (0..10)
            .map(|i| Arrival {
                step: i % 3,
                prompt_len: 5 + (i as usize * 3) % 11,
                family: i as u32 % 3,
                max_new: 20,
                n: 1 + i as usize % 2,
                priority: 0,
                abort_after: None,
            })
            .collect();
        let (preempted, swapped_out) = run(&setup, &arrivals);
        assert!(preempted > 0);
        assert_eq!(swapped_out > 0, swap);
    }
}
