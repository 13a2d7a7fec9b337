//! Which rows of logits a step asks the forward for and where each goes: the sampled rows (one
//! per sequence that samples, repeated for each of its samples), then the prompt-logprob rows of
//! the requests that want `prompt_logprobs` (every position of their prompt chunks whose next
//! token is a prompt token not yet given an entry). Only those requests pay for the extra rows.

use rayon::prelude::*;
use scheduler::SchedulerOutput;

use super::live::{Live, Row, StepView};
use crate::error::EngineError;
use crate::output::PositionLogprobs;
use crate::sampling::filter::log_sum_exp;

/// One sequence's run of extra rows in a step (prompt logprobs here, pooled rows in
/// `pool_rows.rs`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    /// The request's slot in [`Live`].
    pub slot: usize,
    /// The prompt position of the span's first entry (for prompt logprobs, the position its
    /// row predicts: the row is the position before).
    pub first: usize,
    pub rows: usize,
}

/// A step's rows beyond the sampled ones (reused from step to step).
#[derive(Debug, Default)]
pub(super) struct PromptRows {
    /// The forward's rows: the plan's sampled rows, then every span's.
    indices: Vec<usize>,
    spans: Vec<Span>,
}

impl PromptRows {
    /// Plans the prompt-logprob rows of `plan`.
    pub fn plan(&mut self, plan: &SchedulerOutput, view: &StepView, live: &Live) {
        self.spans.clear();
        self.indices.clear();
        // A decode (one token that samples) predicts no prompt token; any other chunk may.
        for (s, &slot) in
            plan.seqs.iter().zip(&view.seq_slots).filter(|(s, _)| s.num_samples == 0 || s.tokens.len() > 1)
        {
            let Some(state) = live.at(slot).and_then(|r| r.prompt_logprobs.as_ref()) else {
                continue;
            };
            // Two sequences of one request recomputing their prompt in one step: the first claims it.
            let claimed = self.spans.iter().rev().find(|p| p.slot == slot);
            let next = claimed.map_or(state.next(), |p| p.first + p.rows);
            // Row `p` predicts token `p + 1`: rows from the one before the next missing position,
            // up to the one before the prompt's last token.
            let from = s.tokens.start.max(next - 1);
            let to = s.tokens.end.min(state.prompt.len().saturating_sub(1));
            if from >= to || s.tokens.start > next - 1 {
                continue;
            }
            self.spans.push(Span { slot, first: from + 1, rows: to - from });
            let flat = s.flat.start + (from - s.tokens.start);
            self.indices.extend(flat..flat + (to - from));
        }
        if !self.spans.is_empty() {
            self.indices.splice(0..0, plan.sample_indices.iter().copied());
        }
    }

    /// The flat token indices whose logits the forward computes: the plan's own sample rows
    /// when no request wants prompt logprobs in this step.
    pub fn indices<'a>(&'a self, plan: &'a SchedulerOutput) -> &'a [usize] {
        if self.spans.is_empty() { &plan.sample_indices } else { &self.indices }
    }

    /// Whether the last planned step has prompt-logprob rows.
    pub fn any(&self) -> bool {
        !self.spans.is_empty()
    }

    /// Turns the prompt-logprob rows' logits (what follows the sampled rows) into each
    /// request's entries, rows in parallel.
    pub fn record(&self, logits: &[f32], vocab: usize, live: &mut Live) -> Result<(), EngineError> {
        let mut rows = logits.chunks_exact(vocab.max(1));
        for span in &self.spans {
            let state = live
                .at_mut(span.slot)
                .and_then(|r| r.prompt_logprobs.as_mut())
                .ok_or(EngineError::Internal("prompt logprobs of an unknown request"))?;
            let rows: Vec<&[f32]> = rows.by_ref().take(span.rows).collect();
            if rows.len() != span.rows || state.next() != span.first {
                return Err(EngineError::Internal("prompt logprob rows out of step"));
            }
            let (top, prompt) = (state.top, &state.prompt[span.first..span.first + span.rows]);
            let entries: Vec<Option<PositionLogprobs>> = rows
                .par_iter()
                .zip(prompt.par_iter())
                .map(|(row, &token)| Some(PositionLogprobs::of_row(row, log_sum_exp(row), token, top)))
                .collect();
            state.extend(entries);
        }
        Ok(())
    }
}

/// Row `j` past each of `rows`' first logits, one after another into `out` (a prompt end of a
/// group of `n` gives `n` rows of the same logits).
pub(super) fn gather_logit_rows<'r>(
    rows: impl Iterator<Item = &'r Row>,
    j: usize,
    logits: &[f32],
    vocab: usize,
    out: &mut Vec<f32>,
) -> Result<(), EngineError> {
    out.clear();
    for r in rows {
        let at = (r.logit + j) * vocab;
        out.extend_from_slice(logits.get(at..at + vocab).ok_or(EngineError::Internal("missing logits row"))?);
    }
    Ok(())
}
