//! Which rows of a step the forward pools and where each goes: the prompt positions of the
//! pooling requests' chunks that their pools take ([`crate::pooling::PoolState::wanted`]). The
//! forward returns those rows' final-norm hidden states beside the logits; only pooling
//! requests pay for them, and no logits are computed for them.

use scheduler::SchedulerOutput;

use super::live::{Live, StepView};
use super::rows::Span;
use crate::error::EngineError;

/// A step's pooled rows (reused from step to step).
#[derive(Debug, Default)]
pub(super) struct PoolRows {
    indices: Vec<usize>,
    spans: Vec<Span>,
}

impl PoolRows {
    /// Plans the pooled rows of `plan`.
    pub fn plan(&mut self, plan: &SchedulerOutput, view: &StepView, live: &Live) {
        self.spans.clear();
        self.indices.clear();
        for (s, &slot) in plan.seqs.iter().zip(&view.seq_slots) {
            let Some(pool) = live.at(slot).and_then(|r| r.pooling.as_ref()) else { continue };
            // A pooling request has one sequence: a second span of it would be a recompute.
            if self.spans.iter().any(|p| p.slot == slot) {
                continue;
            }
            let wanted = pool.wanted(s.tokens.clone());
            if wanted.is_empty() {
                continue;
            }
            self.spans.push(Span { slot, first: wanted.start, rows: wanted.len() });
            let flat = s.flat.start + (wanted.start - s.tokens.start);
            self.indices.extend(flat..flat + wanted.len());
        }
    }

    /// The flat token indices whose hidden states the forward returns.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// Whether the last planned step has pooled rows.
    pub fn any(&self) -> bool {
        !self.spans.is_empty()
    }

    /// Adds the pooled rows (`[indices.len(), hidden]`) to each request's pool.
    pub fn record(&self, pooled: &[f32], hidden: usize, live: &mut Live) -> Result<(), EngineError> {
        if pooled.len() != self.indices.len() * hidden {
            return Err(EngineError::Internal("fewer pooled rows than planned"));
        }
        let mut rows = pooled.chunks_exact(hidden.max(1));
        for span in &self.spans {
            let pool = live
                .at_mut(span.slot)
                .and_then(|r| r.pooling.as_mut())
                .ok_or(EngineError::Internal("pooled rows of an unknown request"))?;
            pool.add(span.first, rows.by_ref().take(span.rows)).map_err(EngineError::Internal)?;
        }
        Ok(())
    }
}
