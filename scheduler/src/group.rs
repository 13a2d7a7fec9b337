//! The scheduler's internal state of one request: its sequences (one before the fork, `n`
//! after), their tokens, computed counts and block tables.

use block_alloc::BlockTable;

use crate::queue::QueueKey;
use crate::request::{FinishReason, RequestId, SeqId, TokenId};

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
    pub table: BlockTable,
    pub finished: Option<FinishReason>,
    /// Recomputing after a preemption, this sample waits (holding nothing) until the group's
    /// first live sample has recomputed the shared prompt, then forks it instead of
    /// recomputing the prompt again.
    pub parked: bool,
}

impl Seq {
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
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
