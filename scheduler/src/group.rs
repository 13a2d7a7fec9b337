//! The scheduler's internal state of one request: its sequences (one before the fork, `n`
//! after), their tokens, computed counts and block tables.

use block_alloc::{BlockId, BlockPool, BlockTable, CopyOnWrite};

use crate::queue::QueueKey;
use crate::request::{RequestKey, SeqFinish, SeqId, TokenId};
use crate::rows::{NO_ROW, RowState, Rows};

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
    pub num_computed: usize,
    /// Private so that every change other than an append goes through `table_mut`, which makes
    /// the worker's copy of it stale (`row.sent = 0`).
    table: BlockTable,
    /// This table's row in the worker's block table, and how much of it the row holds.
    pub row: RowState,
    pub finished: Option<SeqFinish>,
    /// Recomputing after a preemption, this sample waits (holding nothing) until the group's
    /// first live sample has recomputed the shared prompt, then forks it instead of
    /// recomputing the prompt again.
    pub parked: bool,
}

impl Seq {
    pub fn new(index: u32, tokens: Vec<TokenId>, num_computed: usize, table: BlockTable) -> Self {
        Self { index, tokens, num_computed, table, row: RowState::default(), finished: None, parked: false }
    }

    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    pub fn table(&self) -> &BlockTable {
        &self.table
    }

    /// The table, for a change other than an append: its row must be written afresh.
    pub fn table_mut(&mut self) -> &mut BlockTable {
        self.row.sent = 0;
        &mut self.table
    }

    pub fn set_table(&mut self, table: BlockTable) {
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
        device.cache_full_blocks(&mut self.table, &self.tokens[..end], salt)
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
        device.lookup_prefix(query, salt, &mut self.table)
    }

    /// Appends `n` slots: the copy-on-write it needed, the sequence's row (taken from `rows` if
    /// it had none) and the block-table delta of that row.
    #[inline(always)]
    pub fn append(
        &mut self,
        device: &mut BlockPool,
        n: usize,
        rows: &mut Rows,
    ) -> Result<Appended<'_>, block_alloc::AllocError> {
        let cow = self.table.append_tokens(device, n)?;
        if cow.is_some() {
            self.row.sent = 0; // the last block was replaced
        }
        if self.row.row == NO_ROW {
            self.row = RowState { row: rows.take(), sent: 0 };
        }
        let from = self.row.sent;
        let blocks = self.table.blocks();
        self.row.sent = blocks.len();
        Ok(Appended { cow, row: self.row.row, table_from: from, new_blocks: &blocks[from..] })
    }
}

/// What one append did, for the step's plan.
pub(crate) struct Appended<'a> {
    pub cow: Option<CopyOnWrite>,
    pub row: u32,
    /// The row's entries from this index on are `new_blocks` (0: the whole table).
    pub table_from: usize,
    pub new_blocks: &'a [BlockId],
}

#[derive(Debug)]
pub(crate) struct Group {
    pub id: RequestKey,
    pub key: QueueKey,
    pub prompt_len: usize,
    pub max_new_tokens: usize,
    pub salt: u64,
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

    /// Gives the rows of the worker's table back: the group stops running (preempted or gone).
    pub fn give_back_rows(&mut self, rows: &mut Rows) {
        for seq in &mut self.seqs {
            rows.give_back(&mut seq.row);
        }
    }
}
