//! The scheduler's internal state of one request: its sequences (one before the fork, `n`
//! after), their tokens, computed counts and block tables.

use block_alloc::{BlockId, BlockPool, BlockTable, CopyOnWrite};

use crate::queue::QueueKey;
use crate::request::{RequestId, SeqFinish, SeqId, TokenId};
use crate::rows::{Row, RowBook};

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
    /// Private so that every change other than an append goes through `table_mut`, which drops
    /// the step output's copy of it (`row`).
    table: BlockTable,
    /// This table's row in the step output's block-table arena.
    row: Row,
    pub finished: Option<SeqFinish>,
    /// Recomputing after a preemption, this sample waits (holding nothing) until the group's
    /// first live sample has recomputed the shared prompt, then forks it instead of
    /// recomputing the prompt again.
    pub parked: bool,
}

impl Seq {
    pub fn new(index: u32, tokens: Vec<TokenId>, num_computed: usize, table: BlockTable) -> Self {
        Self { index, tokens, num_computed, table, row: Row::default(), finished: None, parked: false }
    }

    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    pub fn table(&self) -> &BlockTable {
        &self.table
    }

    /// The table, for a change other than an append: its row must be written afresh.
    pub fn table_mut(&mut self) -> &mut BlockTable {
        self.row = Row::default();
        &mut self.table
    }

    pub fn set_table(&mut self, table: BlockTable) {
        self.row = Row::default();
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
        self.row = Row::default();
        let query = &self.tokens[..self.tokens.len().saturating_sub(1)];
        device.lookup_prefix(query, salt, &mut self.table)
    }

    /// Appends `n` slots and brings the table's row in `arena` up to date. Returns the
    /// copy-on-write the append needed, if any, and the row's range.
    #[inline(always)]
    pub fn append(
        &mut self,
        device: &mut BlockPool,
        n: usize,
        book: &mut RowBook,
        arena: &mut Vec<BlockId>,
    ) -> Result<(Option<CopyOnWrite>, std::ops::Range<usize>), block_alloc::AllocError> {
        let cow = self.table.append_tokens(device, n)?;
        let range = book.sync(&mut self.row, self.table.blocks(), cow.is_some(), arena);
        Ok((cow, range))
    }
}

#[derive(Debug)]
pub(crate) struct Group {
    pub id: RequestId,
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
}
