//! Sampling: request parameters (`params`), the per-row arithmetic (`filter`) and the
//! batched, per-sequence-seeded sampler (`sampler`).

pub(crate) mod filter;
mod params;
mod sampler;

pub use params::{
    GREEDY_EPS, IntoValidParams, MAX_LOGPROBS, MAX_N, SamplingParams, SamplingParamsError,
    ValidSamplingParams,
};
pub use sampler::{SampleRow, SamplerError, SequenceSampler, TokenChoice, sample_batch, seeded_rng};
