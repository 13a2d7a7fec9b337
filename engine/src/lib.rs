//! `engine`: the step loop, sampling, request streams, metrics and the embedding API.
//!
//! - [`Engine`]: one model, one paged KV cache, a continuous-batching scheduler; `add_request`,
//!   `abort`, `step`, `generate`, `embed` (pooling requests: [`pooling`]).
//! - [`EngineHandle`]: the engine on its own thread behind a command channel; submitting never
//!   waits for a step, and each request's [`RequestOutput`]s come back through a blocking
//!   [`RequestStream`] or an async [`OutputStream`] (what a web service embeds).
//! - [`kv_map`]: [`KvSnapshot`], the live map of the KV blocks, taken between steps only when a
//!   handle asked for one ([`EngineHandle::kv_map`]).
//! - [`sampling`]: vLLM `SamplingParams` semantics, vectorized over the batch.
//! - [`structured`]: structured outputs: a request's [`Constraint`] compiled by llguidance into
//!   a token mask per sample.
//! - [`detok`]: incremental detokenization and stop strings.
//! - [`PromptTokenizer`]: a prompt's token ids as admission makes them, from the model's text
//!   side alone (what a prefix-aware router compares with a replica's cached blocks).
//! - [`workload`]: synthetic benchmark prompts.

pub mod config;
pub mod detok;
mod engine;
pub mod error;
mod handle;
pub mod kv_map;
pub mod lora;
pub mod metrics;
pub mod output;
pub mod pooling;
mod prompt_tokens;
mod request;
pub mod sampling;
pub mod spec;
pub mod structured;
pub mod workload;

pub use config::{
    ActivationPrecision, Choices, DType, Device, EngineConfig, KvCacheSize, Policy, PreemptionMode,
    Quantization,
};
pub use engine::Engine;
pub use error::{EngineError, RequestError};
pub use handle::{AbortHandle, EngineHandle, OutputStream, RequestStream, ShutdownMode};
pub use kv_events::KvEventsConfig;
pub use kv_map::{BlockState, KvCounters, KvMap, KvSnapshot, KvTable};
pub use lora::{LoraConfig, LoraError, LoraInfo, LoraRegistry, LoraRequest};
pub use metrics::{
    Gauges, LatencyStats, LiveMetrics, MetricsSnapshot, STEP_TOKEN_BUCKETS, StepPhases, StepTokens,
};
pub use model::{ChatMessage, Conversation, FunctionCall, TemplateValue, ToolCall};
pub use output::{
    Completion, CompletionDelta, FinalOutput, FinishReason, Logprob, PositionLogprobs, PromptLogprobs,
    RequestKey, RequestOutput, RequestTiming, StreamError,
};
pub use pooling::{PoolingParams, PoolingType};
pub use prompt_tokens::PromptTokenizer;
pub use request::{Prompt, RequestOptions};
pub use sampling::{IntoValidParams, SamplingParams, SamplingParamsError, ValidSamplingParams};
pub use structured::{Constraint, ConstraintError, ReasoningSpan};
