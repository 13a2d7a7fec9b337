//! Speculative decoding's share of the scheduler (vLLM's `spec_token_ids`): a draft set on a
//! decoding sequence between steps is scheduled after its last token as one chunk, so the target
//! scores every drafted position in one forward; the update keeps the accepted prefix, gives the
//! rejected tokens' slots back (whole blocks return to the pool) and caches only full blocks of
//! accepted tokens. Only a group of one live sequence speculates.

use block_alloc::BlockPool;

use crate::error::SchedulerError;
use crate::group::{Group, Seq};
use crate::output::{SampledToken, StepResult};
use crate::request::{SeqId, TokenId};
use crate::scheduler::{InFlight, Scheduler};

impl Scheduler {
    /// Proposes `tokens` to follow sequence `seq`'s last token in the next step that decodes it
    /// (replacing an earlier draft; empty clears it). The next `update` then takes from 1 to
    /// `1 + drafted` tokens for it: the accepted draft tokens, then the target's own.
    ///
    /// Errors: [`SchedulerError::UnknownSequence`] for a sequence that is not live.
    pub fn set_draft(&mut self, seq: SeqId, tokens: &[TokenId]) -> Result<(), SchedulerError> {
        let slot = *self.index.get(&seq.request).ok_or(SchedulerError::UnknownSequence(seq))?;
        let s = self
            .groups
            .get_mut(slot)
            .and_then(Option::as_mut)
            .and_then(|g| g.seqs.get_mut(seq.index as usize))
            .filter(|s| s.finished.is_none())
            .ok_or(SchedulerError::UnknownSequence(seq))?;
        s.draft.clear();
        s.draft.extend_from_slice(tokens);
        Ok(())
    }
}

/// Moves as much of the one live sequence's draft into its tokens as the next decode can take:
/// within `budget_tokens` (its last token included), below the group's length cap (every draft
/// token may be accepted and one more token sampled) and the blocks `device` has free. Returns
/// how many; the draft is consumed either way.
pub(crate) fn take_draft(
    group: &mut Group,
    budget_tokens: usize,
    max_model_len: usize,
    device: &BlockPool,
) -> usize {
    let cap = group.prompt_len.saturating_add(group.max_new_tokens).min(max_model_len);
    let Some(seq) = group.seqs.first_mut().filter(|s| !s.draft.is_empty()) else { return 0 };
    let len = seq.tokens.len();
    let mut d = seq.draft.len().min(budget_tokens.saturating_sub(1)).min(cap.saturating_sub(len + 1));
    while d > 0 && seq.table().num_blocks_to_allocate(device, 1 + d) > device.num_free() {
        d -= 1;
    }
    let draft = std::mem::take(&mut seq.draft);
    seq.tokens.extend_from_slice(&draft[..d]);
    seq.draft = draft;
    seq.draft.clear();
    d
}

/// Of a drafted sequence's `samples` (1 to `1 + f.num_draft`, checked by the caller), the
/// accepted draft tokens must equal the draft; they stay, the rest of the draft goes, its slots
/// given back. Returns the sequence's computed tokens after the step.
pub(crate) fn keep_accepted(
    seq: &mut Seq,
    f: &InFlight,
    samples: &[SampledToken],
    device: &mut BlockPool,
) -> Result<usize, SchedulerError> {
    let accepted = samples.len() - 1;
    let first_draft = f.end - f.num_draft;
    let drafted =
        seq.tokens.get(first_draft..f.end).ok_or(SchedulerError::Internal("draft tokens missing"))?;
    if samples[..accepted].iter().zip(drafted).any(|(s, &t)| s.token != t || s.stop) {
        return Err(SchedulerError::DraftMismatch(f.seq_id));
    }
    let end = first_draft + accepted;
    seq.tokens.truncate(end);
    seq.truncate(device, end)?;
    Ok(end)
}

/// How many samples a sequence in flight takes: exactly its `num_samples`, or for a drafted one
/// from 1 to `1 + num_draft` (the accepted prefix), as many consecutive entries as name it.
pub(crate) fn samples_of(f: &InFlight, samples: &[SampledToken]) -> usize {
    if f.num_draft == 0 {
        return f.num_samples;
    }
    samples.iter().take(f.num_draft + 1).take_while(|s| s.seq_id == f.seq_id).count().max(1)
}

/// The draft-related part of a step's result: drafted positions and accepted ones.
pub(crate) fn count(result: &mut StepResult, f: &InFlight, taken: usize) {
    if f.num_draft > 0 {
        result.num_draft_tokens += f.num_draft;
        result.num_accepted_tokens += taken - 1;
    }
}
