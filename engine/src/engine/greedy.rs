//! Steps whose every sampled row is plain greedy (`SamplingParams::is_plain_greedy`, one sample
//! per sequence): the runner picks the tokens where the logits are (`Runner::forward_greedy`;
//! on a GPU one id per row crosses the bus instead of a row of logits), and the samplers only
//! record them, exactly as the full sampler would have (its greedy rule is the one applied).

use scheduler::SchedulerOutput;

use super::live::{Live, SampleMut, StepView};
use crate::error::EngineError;
use crate::sampling::TokenChoice;

/// Whether every sequence sampled in `plan` takes one plain greedy token.
pub(super) fn plain_greedy_step(plan: &SchedulerOutput, view: &StepView, live: &Live) -> bool {
    plan.seqs.iter().all(|s| s.num_samples <= 1)
        && view.rows.iter().all(|r| live.at(r.slot).is_some_and(|rec| rec.params.is_plain_greedy()))
}

/// Records each row's tokens (its `first`, then a drafted row's further draws `more`) in its
/// sample's sampler, in order; returns them as the sampler's choices.
pub(super) fn record(
    (first, more): (Vec<u32>, Vec<Vec<u32>>),
    samples: &mut [SampleMut<'_>],
) -> Result<(Vec<TokenChoice>, Vec<Vec<TokenChoice>>), EngineError> {
    if first.len() != samples.len() || more.len() != samples.len() {
        return Err(EngineError::Internal("greedy tokens and sampled rows differ in number"));
    }
    let choice = |token| TokenChoice { token, logprobs: None };
    for ((sample, &t), further) in samples.iter_mut().zip(&first).zip(&more) {
        sample.seq.sampler.record(t);
        further.iter().for_each(|&t| sample.seq.sampler.record(t));
    }
    let more = more.into_iter().map(|m| m.into_iter().map(choice).collect()).collect();
    Ok((first.into_iter().map(choice).collect(), more))
}
