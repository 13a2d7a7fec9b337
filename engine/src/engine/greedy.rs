//! Steps whose every sampled row is plain greedy (`SamplingParams::is_plain_greedy`, one sample
//! per sequence): the runner picks the tokens where the logits are (`Runner::forward_greedy`;
//! on a GPU one id per row crosses the bus instead of a row of logits), and the samplers only
//! record them, exactly as the full sampler would have (its greedy rule is the one applied).

use std::collections::HashMap;

use scheduler::{RequestKey, SchedulerOutput};

use super::RowTarget;
use crate::error::EngineError;
use crate::request::RequestRecord;
use crate::sampling::{SamplerError, TokenChoice};

/// Whether every sequence sampled in `plan` takes one plain greedy token.
pub(super) fn plain_greedy_step(plan: &SchedulerOutput, live: &HashMap<RequestKey, RequestRecord>) -> bool {
    plan.seqs.iter().filter(|s| s.num_samples > 0).all(|s| {
        s.num_samples == 1 && live.get(&s.seq_id.request).is_some_and(|r| r.params.is_plain_greedy())
    })
}

/// The row targets of `plan`'s sampled sequences, in row order (one sample each).
pub(super) fn targets(plan: &SchedulerOutput, targets: &mut Vec<RowTarget>) {
    targets.clear();
    for s in plan.seqs.iter().filter(|s| s.num_samples > 0) {
        targets.push(RowTarget {
            request: s.seq_id.request,
            index: s.seq_id.index as usize,
            seq_id: s.seq_id,
        });
    }
}

/// Records each target's token in its sequence's sampler; a row without a token (no logit above
/// -inf) is the sampler's `NoCandidate` error.
pub(super) fn record(
    tokens: &[u32],
    targets: &[RowTarget],
    live: &mut HashMap<RequestKey, RequestRecord>,
) -> Result<Vec<TokenChoice>, EngineError> {
    if tokens.len() != targets.len() {
        return Err(EngineError::Internal("greedy tokens and sampled rows differ in number"));
    }
    let mut choices = Vec::with_capacity(tokens.len());
    for (row, (t, &token)) in targets.iter().zip(tokens).enumerate() {
        if token == u32::MAX {
            return Err(SamplerError::NoCandidate { row }.into());
        }
        let seq = live
            .get_mut(&t.request)
            .and_then(|r| r.seqs.get_mut(t.index))
            .ok_or(EngineError::Internal("sampled unknown request"))?;
        seq.sampler.as_mut().ok_or(EngineError::Internal("sampler taken"))?.record(token);
        choices.push(TokenChoice { token, logprobs: None });
    }
    Ok(choices)
}
