//! `engine`: the step loop, sampling, request streams, metrics and the embedding API.

pub mod detok;
pub mod metrics;
pub mod output;
pub mod sampling;

pub use metrics::{Gauges, LatencyStats, MetricsSnapshot};
pub use output::{Completion, CompletionDelta, FinalOutput, FinishReason, RequestOutput, RequestTiming};
pub use sampling::{SamplingParams, SamplingParamsError};
