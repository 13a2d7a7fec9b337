//! Typed errors of the scheduler: bad configuration, bad requests, misuse of the step protocol.

use crate::request::{RequestKey, SeqId};

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("invalid scheduler config: {0}")]
    InvalidConfig(&'static str),
    #[error("request {0} is already known")]
    DuplicateRequest(RequestKey),
    #[error("unknown request {0}")]
    UnknownRequest(RequestKey),
    #[error("request {0}: n must be at least 1")]
    ZeroSamples(RequestKey),
    #[error("request {id}: n = {n} exceeds max_num_seqs = {max_num_seqs}")]
    TooManySamples { id: RequestKey, n: usize, max_num_seqs: usize },
    #[error("request {0}: empty prompt")]
    EmptyPrompt(RequestKey),
    #[error("request {0}: max_new_tokens must be at least 1")]
    ZeroMaxTokens(RequestKey),
    #[error("request {id}: prompt of {len} tokens exceeds max_model_len = {max_model_len}")]
    PromptTooLong { id: RequestKey, len: usize, max_model_len: usize },
    #[error("request {id}: prompt needs {blocks_needed} blocks but the device pool has {pool_blocks}")]
    ExceedsPool { id: RequestKey, blocks_needed: usize, pool_blocks: usize },
    #[error("schedule() called while the previous step awaits update()")]
    StepInFlight,
    #[error("update() called with no scheduled step")]
    NoStepInFlight,
    #[error("sample {position}: expected a token for {expected:?}, got {got:?}")]
    SampleMismatch { position: usize, expected: Option<SeqId>, got: Option<SeqId> },
    #[error("unknown or finished sequence {0:?}")]
    UnknownSequence(SeqId),
    #[error("sequence {0:?}: an accepted token differs from its draft, or stops before the last")]
    DraftMismatch(SeqId),
    /// A broken invariant of the scheduler itself (a bug, reported instead of a panic).
    #[error("scheduler invariant broken: {0}")]
    Internal(&'static str),
    #[error("block allocator: {0}")]
    Alloc(#[from] block_alloc::AllocError),
}
