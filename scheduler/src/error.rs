//! Typed errors of the scheduler: bad configuration, bad requests, misuse of the step protocol.

use crate::request::{RequestId, SeqId};

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("invalid scheduler config: {0}")]
    InvalidConfig(&'static str),
    #[error("request {0} is already known")]
    DuplicateRequest(RequestId),
    #[error("unknown request {0}")]
    UnknownRequest(RequestId),
    #[error("request {0}: n must be at least 1")]
    ZeroSamples(RequestId),
    #[error("request {id}: n = {n} exceeds max_num_seqs = {max_num_seqs}")]
    TooManySamples { id: RequestId, n: usize, max_num_seqs: usize },
    #[error("request {0}: empty prompt")]
    EmptyPrompt(RequestId),
    #[error("request {0}: max_new_tokens must be at least 1")]
    ZeroMaxTokens(RequestId),
    #[error("request {id}: prompt of {len} tokens exceeds max_model_len = {max_model_len}")]
    PromptTooLong { id: RequestId, len: usize, max_model_len: usize },
    #[error("request {id}: prompt needs {blocks_needed} blocks but the device pool has {pool_blocks}")]
    ExceedsPool { id: RequestId, blocks_needed: usize, pool_blocks: usize },
    #[error("schedule() called while the previous step awaits update()")]
    StepInFlight,
    #[error("update() called with no scheduled step")]
    NoStepInFlight,
    #[error("sample {position}: expected a token for {expected:?}, got {got:?}")]
    SampleMismatch { position: usize, expected: Option<SeqId>, got: Option<SeqId> },
    /// A broken invariant of the scheduler itself (a bug, reported instead of a panic).
    #[error("scheduler invariant broken: {0}")]
    Internal(&'static str),
    #[error("block allocator: {0}")]
    Alloc(#[from] block_alloc::AllocError),
}
