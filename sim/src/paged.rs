//! The paged system: the real `Scheduler` and `block-alloc` pool on a trace, with the cost
//! model standing in for the forward pass and a constant token standing in for sampling
//! (requests run to their trace output length).

use scheduler::{
    PreemptionMode, Request, SampledToken, Scheduler, SchedulerConfig, SchedulerError, SchedulerOutput,
    StepResult,
};

use crate::contiguous::{ContiguousConfig, Placement, Reservation};
use crate::cost::CostModel;
use crate::groups::KvGroups;
use crate::metrics::{Recorder, SimReport, StepSample};
use crate::trace::Trace;

/// Settings shared by the paged run and the baselines of one comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimSetup {
    /// KV memory in token slots (the paged pool gets `capacity_tokens / block_size` blocks).
    pub capacity_tokens: usize,
    pub block_size: usize,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub watermark: f64,
    pub preemption: PreemptionMode,
    /// Host swap space in token slots (swap mode).
    pub swap_tokens: usize,
    /// How the contiguous baselines place their reservations (the paper: buddy allocation).
    pub baseline_placement: Placement,
    /// The model's KV cache groups (`KvGroups::of` its shape; `ONE_FULL` for a plain cache).
    pub kv_groups: KvGroups,
}

impl SimSetup {
    /// The PagedAttention paper's ShareGPT setting: OPT-13B on one A100-40GB leaves KV memory
    /// for about 15.7K tokens; max length 2048; block size 16.
    pub fn paper_sharegpt() -> Self {
        Self {
            capacity_tokens: 15_700,
            block_size: 16,
            max_model_len: 2048,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            watermark: 0.01,
            preemption: PreemptionMode::Recompute,
            swap_tokens: 0,
            baseline_placement: Placement::Buddy,
            kv_groups: KvGroups::ONE_FULL,
        }
    }

    /// Blocks of the paged pool: the memory of `capacity_tokens` tokens of every layer, in the
    /// blocks of the KV groups' layout.
    pub fn num_blocks(&self) -> usize {
        self.kv_groups.blocks_in(self.capacity_tokens, self.block_size)
    }

    /// Token slots (of every layer) the paged pool really has (whole blocks); the baselines get
    /// the same.
    pub fn usable_tokens(&self) -> usize {
        self.kv_groups.tokens_in(self.num_blocks(), self.block_size)
    }

    /// A contiguous baseline on the same memory and limits: `reservation` per request, placed
    /// by `placement` (comparisons use `baseline_placement`; others may try another).
    pub fn contiguous_config(&self, reservation: Reservation, placement: Placement) -> ContiguousConfig {
        ContiguousConfig {
            capacity_tokens: self.usable_tokens(),
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            reservation,
            placement,
        }
    }

    pub fn scheduler_config(&self) -> SchedulerConfig {
        SchedulerConfig {
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            max_model_len: self.max_model_len,
            policy: scheduler::Policy::Fcfs,
            preemption: self.preemption,
            block_size: self.block_size,
            num_device_blocks: self.num_blocks(),
            num_host_blocks: self.kv_groups.blocks_in(self.swap_tokens, self.block_size),
            watermark: self.watermark,
            enable_prefix_caching: false,
            kv_groups: self.kv_groups.windows(),
            max_loras: None,
        }
    }
}

/// Runs `trace` through the scheduler. Requests the pool can never hold are skipped (they show
/// as `finished < num_requests`).
pub fn simulate_paged(
    trace: &Trace,
    setup: &SimSetup,
    cost: &CostModel,
) -> Result<SimReport, SchedulerError> {
    let mut sched = Scheduler::new(setup.scheduler_config())?;
    let mut recorder = Recorder::default();
    let mut out = SchedulerOutput::default();
    let mut result = StepResult::default();
    let mut samples: Vec<SampledToken> = Vec::new();
    let (mut next, mut t, mut finished) = (0, 0.0, 0);
    loop {
        while next < trace.requests.len() && trace.requests[next].arrival_s <= t {
            let r = trace.requests[next];
            // Distinct token ids per request: no accidental prefix sharing.
            let prompt: Vec<u32> =
                (0..r.input_len as u32).map(|i| (next as u32).wrapping_mul(7919).wrapping_add(i)).collect();
            match sched.add_request(Request::new(next as u64, prompt, r.output_len)) {
                Ok(()) | Err(SchedulerError::ExceedsPool { .. } | SchedulerError::PromptTooLong { .. }) => {}
                Err(e) => return Err(e),
            }
            next += 1;
        }
        if !sched.has_unfinished() {
            match trace.requests.get(next) {
                Some(r) => {
                    t = r.arrival_s;
                    continue;
                }
                None => break,
            }
        }
        sched.schedule_into(&mut out)?;
        finished += out.capacity_exceeded.len();
        if out.is_empty() {
            // Nothing can run until something arrives (cannot happen with a non-empty pool,
            // but never spin).
            match trace.requests.get(next) {
                Some(r) => {
                    t = t.max(r.arrival_s);
                    continue;
                }
                None => break,
            }
        }
        let context: usize = out.seqs.iter().map(|s| s.tokens.end).sum();
        let dt = cost.step_time_s(out.num_batched_tokens(), context);
        let waiting = sched.num_waiting() + sched.num_swapped();
        recorder.record(StepSample {
            t_s: t,
            dt_s: dt,
            running: sched.num_running(),
            waiting,
            held_tokens: sched.kv_tokens_held(),
            reserved_tokens: setup.kv_groups.tokens_in(sched.device_pool().num_used(), setup.block_size),
            saturated: waiting > 0,
        });
        samples.clear();
        for s in &out.seqs {
            samples.extend((0..s.num_samples).map(|_| SampledToken {
                seq_id: s.seq_id,
                token: 1,
                stop: false,
            }));
        }
        recorder.add_output_tokens(samples.len());
        sched.update_into(&samples, &mut result)?;
        finished += result.finished_requests.len();
        t += dt;
        for key in &result.finished_requests {
            // Keys are trace indices (see `add_request` above).
            let r = &trace.requests[key.0 as usize];
            recorder.request_finished(r.arrival_s, t, r.output_len);
        }
    }
    let preemptions = sched.stats().preemptions() as usize;
    Ok(recorder.finish("paged", setup.usable_tokens(), trace.len(), finished, preemptions))
}
