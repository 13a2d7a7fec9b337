//! One step's plan (`SchedulerOutput`) and what the engine reports back (`SampledToken`, `StepResult`).
//!
//! Per-sequence data lives in flat arrays (token ids, positions, slot mapping, block tables) with
//! ranges into them, because that is what a forward pass consumes and because it lets the
//! scheduler reuse the same buffers every step without allocating.

use std::ops::Range;

use block_alloc::BlockId;

use crate::request::{FinishReason, RequestId, SeqId, TokenId};

/// One sequence scheduled in this step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub seq_id: SeqId,
    /// Positions (token indices of the sequence) whose KV this step computes.
    pub tokens: Range<usize>,
    /// Indices into `token_ids`, `positions` and `slot_mapping` of the output.
    pub flat: Range<usize>,
    /// Indices into `block_tables` of the output (this sequence's whole table).
    pub block_table: Range<usize>,
    /// Tokens the sampler must draw from the logits of the last position: 0 for a prefill chunk
    /// that does not reach the end, `n` for the end of an un-forked prompt of a group of `n`,
    /// otherwise 1.
    pub num_samples: usize,
}

impl ScheduledSeq {
    /// Whether this chunk includes prompt (or recomputed) tokens rather than a single decode.
    pub fn is_prefill(&self) -> bool {
        self.tokens.len() > 1 || self.tokens.start == 0
    }
}

/// The plan of one step. Block operations must run before the forward pass: swap out, swap in,
/// then copies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    pub seqs: Vec<ScheduledSeq>,
    pub token_ids: Vec<TokenId>,
    pub positions: Vec<u32>,
    pub slot_mapping: Vec<i64>,
    pub block_tables: Vec<BlockId>,
    /// Copy-on-write: `(src, dst)` device blocks.
    pub blocks_to_copy: Vec<(BlockId, BlockId)>,
    /// `(device, host)` block pairs.
    pub blocks_to_swap_out: Vec<(BlockId, BlockId)>,
    /// `(host, device)` block pairs.
    pub blocks_to_swap_in: Vec<(BlockId, BlockId)>,
    /// Requests preempted in this step (recompute or swap).
    pub preempted: Vec<RequestId>,
    /// Requests that finished since the previous step (their sequences hold no block any more).
    pub finished: Vec<RequestId>,
    /// Requests aborted since the previous step.
    pub aborted: Vec<RequestId>,
    /// Requests the scheduler finished in this step with `FinishReason::CapacityExceeded` (also
    /// listed in `finished`): a sequence outgrew the whole device pool.
    pub capacity_exceeded: Vec<RequestId>,
}

impl SchedulerOutput {
    /// Tokens computed in this step (the token budget used).
    pub fn num_batched_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// The block table of a scheduled sequence.
    pub fn block_table(&self, seq: &ScheduledSeq) -> &[BlockId] {
        self.block_tables.get(seq.block_table.clone()).unwrap_or(&[])
    }

    /// The slot of every token of a scheduled sequence's chunk.
    pub fn slots(&self, seq: &ScheduledSeq) -> &[i64] {
        self.slot_mapping.get(seq.flat.clone()).unwrap_or(&[])
    }

    /// Total samples the sampler must draw, in `seqs` order.
    pub fn num_samples(&self) -> usize {
        self.seqs.iter().map(|s| s.num_samples).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.seqs.clear();
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.block_tables.clear();
        self.blocks_to_copy.clear();
        self.blocks_to_swap_out.clear();
        self.blocks_to_swap_in.clear();
        self.preempted.clear();
        self.finished.clear();
        self.aborted.clear();
        self.capacity_exceeded.clear();
    }
}

/// One token drawn by the sampler. For a scheduled sequence with `num_samples = k`, the engine
/// passes `k` consecutive entries with that sequence's id; at a fork, entry `i` goes to sample `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampledToken {
    pub seq_id: SeqId,
    pub token: TokenId,
    /// The engine saw a stop condition (stop token or string): the sequence finishes after it.
    pub stop: bool,
}

/// A sequence that finished in `update` (or was cut by capacity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishedSeq {
    pub seq_id: SeqId,
    pub reason: FinishReason,
}

/// What `update` reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepResult {
    pub finished_seqs: Vec<FinishedSeq>,
    /// Requests all of whose sequences have now finished.
    pub finished_requests: Vec<RequestId>,
}

impl StepResult {
    pub fn clear(&mut self) {
        self.finished_seqs.clear();
        self.finished_requests.clear();
    }
}
