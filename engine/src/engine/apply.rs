//! A step's sampled tokens applied: each recorded in its sequence, checked against EOS, stop ids
//! and stop strings, detokenized and fed to its grammar, then handed to the scheduler (whose
//! finishes, length and abort, get their client-facing reason).

use std::collections::HashMap;
use std::time::Instant;

use super::Engine;
use crate::error::EngineError;
use crate::output::FinishReason;
use crate::sampling::TokenChoice;

impl Engine {
    /// Records each sampled token in its sequence, detects EOS / stop ids / stop strings and
    /// detokenizes; returns what the scheduler must append.
    pub(super) fn apply_samples(
        &mut self,
        sampled: Vec<TokenChoice>,
    ) -> Result<Vec<scheduler::SampledToken>, EngineError> {
        let now = Instant::now();
        let mut updates = Vec::with_capacity(sampled.len());
        let mut guided = HashMap::new();
        for (t, tok) in self.bufs.targets.iter().zip(sampled) {
            let state =
                self.live.get_mut(&t.request).ok_or(EngineError::Internal("sampled unknown request"))?;
            state.first_token.get_or_insert(now);
            let params = state.params.clone();
            let seq =
                state.seqs.get_mut(t.index).ok_or(EngineError::Internal("sample index out of range"))?;
            seq.num_generated += 1;
            seq.new_tokens.push(tok.token);
            if let Some(lp) = tok.logprobs {
                seq.cumulative_logprob += f64::from(lp.sampled.logprob);
                seq.new_logprobs.push(lp);
            }
            let check_stop = seq.num_generated >= params.min_tokens;
            let is_eos = !params.ignore_eos && self.intake.eos_ids.contains(&tok.token);
            let is_stop_id = params.stop_token_ids.contains(&tok.token);
            let finish = if check_stop && is_eos {
                Some(FinishReason::Eos(tok.token))
            } else if check_stop && is_stop_id {
                Some(FinishReason::StopToken(tok.token))
            } else {
                None
            };
            // A stop token's text is left out unless stop strings are to be kept.
            if (finish.is_none() || params.include_stop_str_in_output)
                && let Some(m) = seq.detok.push(tok.token, &self.intake.tokenizer, check_stop)?
                && finish.is_none()
            {
                seq.finish = params.stop.get(m.index).cloned().map(FinishReason::StopString);
            }
            if finish.is_some() {
                seq.finish = finish;
            }
            if seq.finish.is_none() && seq.guide.is_some() {
                guided.insert((t.request, t.index), (tok.token, updates.len()));
            }
            updates.push(scheduler::SampledToken {
                seq_id: t.seq_id,
                token: tok.token,
                stop: seq.finish.is_some(),
            });
        }
        if !guided.is_empty() {
            let times = self.metrics.mask_times();
            for (output, (request, index), finish) in
                super::guides::advance_sampled(&mut self.live, &guided, times)
            {
                if let Some(seq) = self.live.get_mut(&request).and_then(|r| r.seqs.get_mut(index)) {
                    seq.finish = Some(finish);
                }
                if let Some(u) = updates.get_mut(output) {
                    u.stop = true;
                }
            }
        }
        Ok(updates)
    }

    /// Hands the tokens to the scheduler; sequences it finished (length, abort) get their
    /// client-facing reason.
    pub(super) fn update_scheduler(
        &mut self,
        updates: &[scheduler::SampledToken],
    ) -> Result<(), EngineError> {
        self.scheduler.update_into(updates, &mut self.bufs.result)?;
        for fs in &self.bufs.result.finished_seqs {
            if let Some(seq) =
                self.live.get_mut(&fs.seq_id.request).and_then(|s| s.seqs.get_mut(fs.seq_id.index as usize))
                && seq.finish.is_none()
            {
                seq.finish = Some(match fs.reason {
                    scheduler::SeqFinish::Aborted => FinishReason::Abort,
                    _ => FinishReason::Length,
                });
            }
        }
        Ok(())
    }
}
