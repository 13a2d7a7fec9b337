//! One step's plan (`SchedulerOutput`) and what the engine reports back (`SampledToken`, `StepResult`).
//!
//! Per-sequence data lives in flat arrays (token ids, positions, slot mapping, block tables) with
//! ranges into them, because that is what a forward pass consumes and because it lets the
//! scheduler reuse the same buffers every step without allocating. Block tables live in a
//! persistent arena (see `rows.rs`): when the same output is handed back to `schedule_into`
//! every step, a running sequence's row is only appended to, not copied again.

use std::ops::Range;

use block_alloc::BlockId;

use crate::request::{RequestId, SeqFinish, SeqId, TokenId};
use crate::rows::ArenaTag;

/// One sequence scheduled in this step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub seq_id: SeqId,
    /// Positions (token indices of the sequence) whose KV this step computes.
    pub tokens: Range<usize>,
    /// Indices into `token_ids`, `positions` and `slot_mapping` of the output.
    pub flat: Range<usize>,
    /// Indices into the output's block-table arena (`SchedulerOutput::block_tables`) of this
    /// sequence's whole table; read it with `SchedulerOutput::block_table`.
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
///
/// Hand the same output back to `Scheduler::schedule_into` every step: its block-table arena is
/// then updated incrementally. Any other output (a fresh one, a clone, one written by another
/// scheduler or changed through `set_block_tables`) is detected and rebuilt, never trusted.
#[derive(Debug, Clone, Default)]
pub struct SchedulerOutput {
    pub seqs: Vec<ScheduledSeq>,
    pub token_ids: Vec<TokenId>,
    pub positions: Vec<u32>,
    pub slot_mapping: Vec<i64>,
    /// Block-table arena: the rows `ScheduledSeq::block_table` points at, persisting between
    /// steps (entries outside this step's ranges are stale or slack).
    block_tables: Vec<BlockId>,
    /// Which scheduler wrote `block_tables`, and when (`rows.rs`).
    tables_tag: Option<ArenaTag>,
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
    /// Requests the scheduler finished in this step with `SeqFinish::CapacityExceeded` (also
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

    /// The whole block-table arena that `ScheduledSeq::block_table` ranges index.
    pub fn block_tables(&self) -> &[BlockId] {
        &self.block_tables
    }

    /// Replaces the block-table arena (for plans built by hand, e.g. in tests). The scheduler
    /// will not trust it and rebuilds it on the next `schedule_into`.
    pub fn set_block_tables(&mut self, arena: Vec<BlockId>) {
        self.block_tables = arena;
        self.tables_tag = None;
    }

    /// The arena and its tag, for the scheduler's incremental writes.
    pub(crate) fn arena_mut(&mut self) -> (&mut Vec<BlockId>, &mut Option<ArenaTag>) {
        (&mut self.block_tables, &mut self.tables_tag)
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
        // `block_tables` persists: the scheduler updates its rows in place.
        self.blocks_to_copy.clear();
        self.blocks_to_swap_out.clear();
        self.blocks_to_swap_in.clear();
        self.preempted.clear();
        self.finished.clear();
        self.aborted.clear();
        self.capacity_exceeded.clear();
    }
}

/// Equal when the plans are: the same sequences with the same block tables (wherever their
/// rows sit in the arenas) and the same everything else.
impl PartialEq for SchedulerOutput {
    fn eq(&self, other: &Self) -> bool {
        let same_tables = self.seqs.len() == other.seqs.len()
            && self.seqs.iter().zip(&other.seqs).all(|(a, b)| self.block_table(a) == other.block_table(b));
        let strip = |s: &ScheduledSeq| (s.seq_id, s.tokens.clone(), s.flat.clone(), s.num_samples);
        same_tables
            && self.seqs.iter().map(strip).eq(other.seqs.iter().map(strip))
            && self.token_ids == other.token_ids
            && self.positions == other.positions
            && self.slot_mapping == other.slot_mapping
            && self.blocks_to_copy == other.blocks_to_copy
            && self.blocks_to_swap_out == other.blocks_to_swap_out
            && self.blocks_to_swap_in == other.blocks_to_swap_in
            && self.preempted == other.preempted
            && self.finished == other.finished
            && self.aborted == other.aborted
            && self.capacity_exceeded == other.capacity_exceeded
    }
}

impl Eq for SchedulerOutput {}

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
    pub reason: SeqFinish,
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
