//! Scheduler configuration: budgets, policy, preemption mode and the block pools it manages.

use crate::error::SchedulerError;

/// Which waiting request is served first (and which running one is preempted last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// First come, first served: arrival order only; `Request::priority` is ignored.
    #[default]
    Fcfs,
    /// Lower `Request::priority` first, then arrival order (vLLM's convention). A waiting request
    /// may preempt running requests of strictly lower priority (higher number).
    Priority,
}

/// What happens to a preempted request's KV blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptionMode {
    /// Free its blocks and put it back in the waiting queue; prompt and generated tokens are
    /// prefilled again when it resumes.
    #[default]
    Recompute,
    /// Move its blocks to the host pool and swap them back in when room returns. Falls back to
    /// recompute when the host pool is full (or absent).
    Swap,
}

/// Most KV cache groups a scheduler keeps tables for.
pub const MAX_KV_GROUPS: usize = 64;

/// Everything `Scheduler::new` needs.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Token budget of one step (decodes count one token each, prefill chunks their length).
    pub max_num_batched_tokens: usize,
    /// Most sequences in one step (a group with `n` forked samples counts `n`).
    pub max_num_seqs: usize,
    /// Longest sequence (prompt + generated) the model accepts.
    pub max_model_len: usize,
    pub policy: Policy,
    pub preemption: PreemptionMode,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Device KV blocks.
    pub num_device_blocks: usize,
    /// Host (swap space) KV blocks; 0 means no swap space.
    pub num_host_blocks: usize,
    /// Fraction of device blocks kept free at admission so running sequences can grow.
    pub watermark: f64,
    pub enable_prefix_caching: bool,
    /// The KV cache groups (vLLM's hybrid KV cache): per group of layers, its sliding window
    /// (`None`: full attention). Every sequence holds one block table per group, all from the
    /// device pool; a sliding group frees the blocks that fall out of its window. One full
    /// group (the default) is a model without windows.
    pub kv_groups: Vec<Option<usize>>,
    /// Most distinct LoRA adapters among the running sequences (vLLM's `max_loras`): a waiting
    /// request of another adapter waits while that many run. `None`: no limit.
    pub max_loras: Option<usize>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
            max_model_len: 2048,
            policy: Policy::Fcfs,
            preemption: PreemptionMode::Recompute,
            block_size: 16,
            num_device_blocks: 1024,
            num_host_blocks: 0,
            watermark: 0.01,
            enable_prefix_caching: false,
            kv_groups: vec![None],
            max_loras: None,
        }
    }
}

impl SchedulerConfig {
    /// Rejects settings under which no step could ever be built.
    pub fn validate(&self) -> Result<(), SchedulerError> {
        let bad = |what: &'static str| Err(SchedulerError::InvalidConfig(what));
        if self.max_num_batched_tokens == 0 {
            return bad("max_num_batched_tokens must be at least 1");
        }
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs must be at least 1");
        }
        if self.max_model_len == 0 {
            return bad("max_model_len must be at least 1");
        }
        if self.block_size == 0 {
            return bad("block_size must be at least 1");
        }
        if self.num_device_blocks == 0 {
            return bad("num_device_blocks must be at least 1");
        }
        if !(0.0..1.0).contains(&self.watermark) {
            return bad("watermark must lie in [0, 1)");
        }
        if self.kv_groups.is_empty() || self.kv_groups.len() > MAX_KV_GROUPS {
            return bad("kv_groups must list 1 to 64 groups");
        }
        if self.kv_groups.contains(&Some(0)) {
            return bad("a sliding window must be at least 1 token");
        }
        Ok(())
    }
}
