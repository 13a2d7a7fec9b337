//! Sampling: request parameters (`params`), the per-row arithmetic (`filter`) and the
//! batched, per-sequence-seeded sampler (`sampler`).

pub(crate) mod filter;
mod params;
mod sampler;

pub use params::{GREEDY_EPS, MAX_LOGPROBS, MAX_N, SamplingParams, SamplingParamsError};
pub use sampler::{
    Logprob, PositionLogprobs, SampleRow, SamplerError, SequenceSampler, TokenChoice, sample_batch,
    seeded_rng,
};
