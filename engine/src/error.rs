//! Typed errors: `RequestError` rejects one request (the engine keeps serving the others);
//! `EngineError` is a failure of the engine itself (loading, a step that could not run).

use crate::detok::DetokenizeError;
use crate::sampling::{SamplerError, SamplingParamsError};
use crate::structured::ConstraintError;

/// Why one request was refused (or could not be aborted).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    #[error("request {0:?}: empty prompt")]
    EmptyPrompt(String),
    #[error(
        "request {id:?}: prompt of {prompt_len} tokens + max_tokens {max_tokens} exceeds max_model_len {max_model_len}"
    )]
    TooLong { id: String, prompt_len: usize, max_tokens: usize, max_model_len: usize },
    #[error("request {id:?}: token id {token} is outside the vocabulary of {vocab_size}")]
    TokenOutOfVocab { id: String, token: u32, vocab_size: usize },
    #[error(
        "request {id:?}: needs {blocks_needed} KV blocks at its longest (prompt + max_tokens, all n samples) but the KV cache has {pool_blocks}; lower max_tokens or n"
    )]
    ExceedsKvCache { id: String, blocks_needed: usize, pool_blocks: usize },
    #[error("request {id:?}: the waiting queue is full ({waiting} requests); retry later")]
    QueueFull { id: String, waiting: usize },
    #[error("request id {0:?} is already in use")]
    DuplicateId(String),
    #[error("no unfinished request {0:?} (nothing aborted)")]
    UnknownRequest(String),
    #[error("request {id:?}: {source}")]
    InvalidParams { id: String, source: SamplingParamsError },
    #[error("request {id:?}: logit_bias names token {token}, outside the vocabulary of {vocab_size}")]
    LogitBiasOutOfVocab { id: String, token: u32, vocab_size: usize },
    #[error("request {id:?}: {source}")]
    Constraint { id: String, source: ConstraintError },
    #[error("request {0:?}: the model has no chat template")]
    NoChatTemplate(String),
    #[error("request {id:?}: {reason}")]
    Prompt { id: String, reason: String },
    #[error("request {id:?}: {reason}")]
    Rejected { id: String, reason: String },
    /// A pooling (embedding) request this engine cannot compute as asked.
    #[error("request {id:?}: {reason}")]
    Pooling { id: String, reason: String },
    /// The request's LoRA adapter could not be found or read.
    #[error("request {id:?}: {source}")]
    Lora { id: String, source: crate::lora::LoraError },
    #[error("the engine has shut down")]
    EngineStopped,
}

/// A failure of the engine (not of one request).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Scheduler(#[from] scheduler::SchedulerError),
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error(transparent)]
    Detokenize(#[from] DetokenizeError),
    #[error("engine invariant broken: {0}")]
    Internal(&'static str),
    #[error("the engine thread has stopped")]
    Stopped,
}
