//! The scheduler's internal state of one request: its sequences (one before the fork, `n`
//! after), their tokens, computed counts and block tables.

use block_alloc::{BlockId, BlockPool};

use crate::queue::QueueKey;
use crate::request::{RequestKey, SeqFinish, SeqId, TokenId};
use crate::rows::{NO_ROW, RowState, Rows};
use crate::tables::SeqTables;

/// Where a group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Where {
    Waiting,
    Running,
    /// Its tables hold host-pool blocks.
    Swapped,
}

#[derive(Debug)]
pub(crate) struct Seq {
    pub index: u32,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<TokenId>,
    /// Tokens whose KV is in the cache; between steps equals `table.num_tokens()`.
    pub num_computed_tokens: usize,
    /// One table per KV cache group. Private so that every change other than an append (or a
    /// release out of a window, which the worker need not see) goes through `table_mut`, which
    /// makes the worker's copy of it stale (`row.sent = 0`).
    table: SeqTables,
    /// This table's row in the worker's block table, and how much of it the row holds.
    pub row: RowState,
    pub finished: Option<SeqFinish>,
    /// Recomputing after a preemption, this sample waits (holding nothing) until the group's
    /// first live sample has recomputed the shared prompt, then forks it instead of
    /// recomputing the prompt again.
    pub parked: bool,
    /// Tokens proposed to follow the last one in its next decode (`Scheduler::set_draft`).
    pub draft: Vec<TokenId>,
}

impl Seq {
    pub fn new(index: u32, tokens: Vec<TokenId>, num_computed_tokens: usize, table: SeqTables) -> Self {
        Self {
            index,
            tokens,
            num_computed_tokens,
            table,
            row: RowState::default(),
            finished: None,
            parked: false,
            draft: Vec::new(),
        }
    }

    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed_tokens
    }

    pub fn table(&self) -> &SeqTables {
        &self.table
    }

    /// The tables, for a change other than an append: the row must be written afresh.
    pub fn table_mut(&mut self) -> &mut SeqTables {
        self.row.sent = 0;
        &mut self.table
    }

    /// Gives back the slots past `num_tokens` (a draft's rejected tokens): the worker's row stays
    /// valid up to the blocks kept (entries past a table's blocks are never read).
    pub fn truncate(
        &mut self,
        device: &mut BlockPool,
        num_tokens: usize,
    ) -> Result<(), block_alloc::AllocError> {
        self.table.truncate(device, num_tokens)?;
        self.row.sent = self.row.sent.min(self.table.blocks().len());
        Ok(())
    }

    /// Releases the blocks of sliding-window groups that no query still to come can see.
    #[inline(always)]
    pub fn release_outside_window(
        &mut self,
        device: &mut BlockPool,
    ) -> Result<usize, block_alloc::AllocError> {
        self.table.release_outside_window(device)
    }

    pub fn set_table(&mut self, table: SeqTables) {
        self.row.sent = 0;
        self.table = table;
    }

    /// Offers the newly full blocks of the first `end` tokens to the prefix cache. Registering
    /// hashes leaves the blocks as they are, so the row stays valid.
    pub fn cache_full_blocks(
        &mut self,
        device: &mut BlockPool,
        end: usize,
        salt: u64,
    ) -> Result<(), block_alloc::AllocError> {
        self.table.cache_full_blocks(device, &self.tokens[..end], salt)
    }

    /// Fills the empty table with the longest cached prefix of all but the last token; returns
    /// the tokens found.
    pub fn lookup_prefix(
        &mut self,
        device: &mut BlockPool,
        salt: u64,
    ) -> Result<usize, block_alloc::AllocError> {
        self.row.sent = 0;
        let query = &self.tokens[..self.tokens.len().saturating_sub(1)];
        self.table.lookup_prefix(device, query, salt)
    }

    /// Appends `n` slots to every group's table: the copies-on-write it needed go to `copies`;
    /// returns the sequence's row (taken from `rows` if it had none) and the first entry of
    /// that row the worker lacks.
    #[inline(always)]
    pub fn allocate_slots(
        &mut self,
        device: &mut BlockPool,
        n: usize,
        rows: &mut Rows,
        copies: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<Allocated, block_alloc::AllocError> {
        let before = copies.len();
        self.table.allocate_slots(device, n, &mut |cow| copies.push((cow.src, cow.dst)))?;
        if copies.len() != before {
            self.row.sent = 0; // a last block was replaced
        }
        if self.row.row == NO_ROW {
            self.row = RowState { row: rows.take(), sent: 0 };
        }
        let from = self.row.sent;
        self.row.sent = self.table.blocks().len();
        Ok(Allocated { row: self.row.row, table_from: from })
    }
}

/// What one slot allocation did, for the step's plan.
pub(crate) struct Allocated {
    pub row: u32,
    /// The row's entries from this index on are new (0: the whole table), in every group.
    pub table_from: usize,
}

#[derive(Debug)]
pub(crate) struct Group {
    pub id: RequestKey,
    pub key: QueueKey,
    pub prompt_len: usize,
    pub max_new_tokens: usize,
    pub salt: u64,
    /// Never reads the prefix cache (`Request::skip_prefix_hits`).
    pub skip_prefix_hits: bool,
    /// Its LoRA adapter (`Request::lora`).
    pub lora: Option<u32>,
    pub n: usize,
    pub seqs: Vec<Seq>,
    pub place: Where,
}

impl Group {
    pub fn seq_id(&self, index: u32) -> SeqId {
        SeqId { request: self.id, index }
    }

    /// Not yet split into its `n` samples.
    pub fn awaiting_fork(&self) -> bool {
        self.seqs.len() < self.n
    }

    /// Releases, in every live sequence, the sliding groups' blocks no query still to come
    /// can see (before a step plans its appends, so the freed blocks serve this step).
    pub fn release_outside_windows(&mut self, device: &mut BlockPool) -> Result<(), block_alloc::AllocError> {
        for seq in self.seqs.iter_mut().filter(|s| s.finished.is_none()) {
            seq.release_outside_window(device)?;
        }
        Ok(())
    }

    pub fn live_seqs(&self) -> usize {
        self.seqs.iter().filter(|s| s.finished.is_none()).count()
    }

    /// Every live sequence has exactly one token to compute (a decode step).
    pub fn is_decode(&self) -> bool {
        self.seqs.iter().all(|s| s.finished.is_some() || s.remaining() == 1)
    }

    pub fn all_finished(&self) -> bool {
        self.seqs.iter().all(|s| s.finished.is_some())
    }

    /// Every group's table of every sequence holding blocks, for a swap of the whole group
    /// (the worker's rows must be written afresh).
    pub fn tables_to_move(&mut self) -> Vec<&mut block_alloc::BlockTable> {
        self.seqs
            .iter_mut()
            .filter(|s| !s.table().is_empty())
            .flat_map(|s| s.table_mut().iter_mut())
            .collect()
    }

    /// Gives the rows of the worker's table back: the group stops running (preempted or gone).
    pub fn give_back_rows(&mut self, rows: &mut Rows) {
        for seq in &mut self.seqs {
            rows.give_back(&mut seq.row);
        }
    }
}
