//! One step's plan (`SchedulerOutput`) and what the engine reports back (`SampledToken`, `StepResult`).
//!
//! Per-sequence data lives in flat arrays (token ids, positions, slot mapping, the attention
//! metadata) with ranges into them, because that is what a forward pass consumes and because it
//! lets the scheduler reuse the same buffers every step without allocating. Block tables are not
//! copied into the plan: each sequence names its row of the worker's persistent table and
//! carries only the block ids that row lacks (see `rows.rs`).

use std::ops::Range;

use block_alloc::BlockId;

use crate::request::{RequestKey, SeqFinish, SeqId, TokenId};

/// One sequence scheduled in this step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub seq_id: SeqId,
    /// Positions (token indices of the sequence) whose KV this step computes.
    pub tokens: Range<usize>,
    /// Indices into `token_ids`, `positions` and `slot_mapping` of the output.
    pub flat: Range<usize>,
    /// Its row of the worker's block table (`seq_rows` holds the same, in kernel form).
    pub row: u32,
    /// The block-table update of the row: entries `table_from ..` of the row become
    /// `SchedulerOutput::new_block_ids[new_blocks]` (read with `SchedulerOutput::new_blocks`);
    /// 0 rewrites the whole row. Entries past the sequence's blocks are never read. With
    /// several KV cache groups the range holds each group's entries in turn (equal lengths),
    /// and each group has its own table with the same row.
    pub table_from: usize,
    pub new_blocks: Range<usize>,
    /// Tokens the sampler must draw from the logits of the last position: 0 for a prefill chunk
    /// that does not reach the end, `n` for the end of an un-forked prompt of a group of `n`,
    /// otherwise 1.
    pub num_samples: usize,
    /// Draft tokens at the end of the chunk (`Scheduler::set_draft`): its last `num_draft + 1`
    /// positions each give one row of logits, and its update takes 1 to `num_draft + 1` tokens.
    pub num_draft: usize,
}

impl ScheduledSeq {
    /// Rows of logits the step computes for this sequence.
    pub fn num_logit_rows(&self) -> usize {
        if self.num_samples == 0 { 0 } else { self.num_draft + 1 }
    }

    /// Whether this chunk includes prompt (or recomputed) tokens rather than a single decode.
    pub fn is_prefill(&self) -> bool {
        self.tokens.len() > 1 || self.tokens.start == 0
    }
}

/// The plan of one step. Block operations must run before the forward pass: swap out, swap in,
/// then copies.
///
/// Every plan's block-table updates must reach the worker's table, in order: a plan that is
/// scheduled but never applied leaves the worker's rows behind the scheduler's tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    pub seqs: Vec<ScheduledSeq>,
    pub token_ids: Vec<TokenId>,
    pub positions: Vec<u32>,
    /// Each token's slot in the KV cache group 0's layers write.
    pub slot_mapping: Vec<i64>,
    /// With several KV cache groups (`SchedulerConfig::kv_groups`): the slots of group `g` in
    /// entry `g - 1`, token for token as `slot_mapping`.
    pub group_slot_mapping: Vec<Vec<i64>>,
    /// The attention metadata of the batch, in the kernels' form
    /// (`attn_kernels::PagedAttnMetadata`): `[num_seqs + 1]` prefix sums of the query tokens,
    /// `[num_seqs]` context lengths (this step's tokens included) and block-table rows.
    pub query_start_loc: Vec<usize>,
    pub seq_lens: Vec<usize>,
    pub seq_rows: Vec<u32>,
    /// Flat token indices whose logits are sampled (the last token of each sequence with
    /// `num_samples > 0`), in `seqs` order.
    pub sample_indices: Vec<usize>,
    /// The block ids the `ScheduledSeq::new_blocks` ranges index.
    pub new_block_ids: Vec<BlockId>,
    /// Copy-on-write: `(src, dst)` device blocks.
    pub blocks_to_copy: Vec<(BlockId, BlockId)>,
    /// `(device, host)` block pairs.
    pub blocks_to_swap_out: Vec<(BlockId, BlockId)>,
    /// `(host, device)` block pairs.
    pub blocks_to_swap_in: Vec<(BlockId, BlockId)>,
    /// Requests preempted in this step (recompute or swap).
    pub preempted: Vec<RequestKey>,
    /// Requests that finished since the previous step (their sequences hold no block any more).
    pub finished: Vec<RequestKey>,
    /// Requests aborted since the previous step.
    pub aborted: Vec<RequestKey>,
    /// Requests the scheduler finished in this step with `SeqFinish::CapacityExceeded` (also
    /// listed in `finished`): a sequence outgrew the whole device pool.
    pub capacity_exceeded: Vec<RequestKey>,
}

impl SchedulerOutput {
    /// Tokens computed in this step (the token budget used).
    pub fn num_batched_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// The block ids a scheduled sequence's row lacks (see `ScheduledSeq::table_from`).
    pub fn new_blocks(&self, seq: &ScheduledSeq) -> &[BlockId] {
        self.new_block_ids.get(seq.new_blocks.clone()).unwrap_or(&[])
    }

    /// The slot of every token of a scheduled sequence's chunk.
    pub fn slots(&self, seq: &ScheduledSeq) -> &[i64] {
        self.slot_mapping.get(seq.flat.clone()).unwrap_or(&[])
    }

    /// Total samples the sampler must draw, in `seqs` order.
    pub fn num_samples(&self) -> usize {
        self.seqs.iter().map(|s| s.num_samples).sum()
    }

    /// Tokens of this step that are prompt (or recomputed) tokens.
    pub fn num_prefill_tokens(&self) -> usize {
        self.seqs.iter().filter(|s| s.is_prefill()).map(|s| s.tokens.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Derives the attention metadata and the sample rows from `seqs` once the step is planned
    /// (pushed while emitting each sequence, four more stores in the hottest loop, they made a
    /// 1 024-decode step ~20 % slower; these streaming extends cost about half of that).
    pub(crate) fn fill_batch_metadata(&mut self) {
        self.query_start_loc.extend(self.seqs.iter().map(|s| s.flat.end));
        self.seq_lens.extend(self.seqs.iter().map(|s| s.tokens.end));
        self.seq_rows.extend(self.seqs.iter().map(|s| s.row));
        for s in self.seqs.iter().filter(|s| s.num_samples > 0) {
            self.sample_indices.extend(s.flat.end - s.num_logit_rows()..s.flat.end);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.seqs.clear();
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.group_slot_mapping.iter_mut().for_each(Vec::clear);
        self.query_start_loc.clear();
        self.query_start_loc.push(0);
        self.seq_lens.clear();
        self.seq_rows.clear();
        self.sample_indices.clear();
        self.new_block_ids.clear();
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
    pub reason: SeqFinish,
}

/// What `update` reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepResult {
    pub finished_seqs: Vec<FinishedSeq>,
    /// Requests all of whose sequences have now finished.
    pub finished_requests: Vec<RequestKey>,
    /// Draft tokens the step scored, and how many of them were accepted.
    pub num_draft_tokens: usize,
    pub num_accepted_tokens: usize,
}

impl StepResult {
    pub fn clear(&mut self) {
        self.finished_seqs.clear();
        self.finished_requests.clear();
        self.num_draft_tokens = 0;
        self.num_accepted_tokens = 0;
    }
}
