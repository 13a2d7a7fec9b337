//! Steps whose every sampled row is plain greedy (`SamplingParams::is_plain_greedy`, one sample
//! per sequence): the runner picks the tokens where the logits are (`Runner::forward_greedy`;
//! on a GPU one id per row crosses the bus instead of a row of logits), and the samplers only
//! record them, exactly as the full sampler would have (its greedy rule is the one applied).

use scheduler::SchedulerOutput;

use super::live::{Live, SampleMut, StepView};
use crate::error::EngineError;
use crate::sampling::{SamplerError, TokenChoice};

/// Whether every sequence sampled in `plan` takes one plain greedy token.
pub(super) fn plain_greedy_step(plan: &SchedulerOutput, view: &StepView, live: &Live) -> bool {
    plan.seqs.iter().all(|s| s.num_samples <= 1)
        && view.rows.iter().all(|r| live.at(r.slot).is_some_and(|rec| rec.params.is_plain_greedy()))
}

/// Records each row's token in its sample's sampler; a row without a token (no logit above
/// -inf) is the sampler's `NoCandidate` error.
pub(super) fn record(tokens: &[u32], samples: &mut [SampleMut<'_>]) -> Result<Vec<TokenChoice>, EngineError> {
    if tokens.len() != samples.len() {
        return Err(EngineError::Internal("greedy tokens and sampled rows differ in number"));
    }
    let mut choices = Vec::with_capacity(tokens.len());
    for (row, (sample, &token)) in samples.iter_mut().zip(tokens).enumerate() {
        if token == u32::MAX {
            return Err(SamplerError::NoCandidate { row }.into());
        }
        sample.seq.sampler.record(token);
        choices.push(TokenChoice { token, logprobs: None });
    }
    Ok(choices)
}
