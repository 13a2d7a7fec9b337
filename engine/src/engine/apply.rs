//! A step's sampled tokens applied: each recorded in its sample, its finish decided
//! ([`finish_at`]: every finish the engine decides, in one place), detokenized and fed to its
//! grammar, then handed to the scheduler, which finishes exactly the samples flagged here.

use std::time::Instant;

use rayon::prelude::*;

use super::Engine;
use super::live::SampleMut;
use crate::detok::TokenDecoder;
use crate::error::EngineError;
use crate::output::FinishReason;
use crate::request::SeqState;
use crate::sampling::{SamplingParams, TokenChoice};

/// What ends a sample at its newest `token` before its grammar sees it: EOS or a stop token id
/// (once `min_tokens` are out; the token's text is kept only with `include_stop_str_in_output`),
/// else a stop string its text completes. Detokenizes the token.
fn finish_at(
    seq: &mut SeqState,
    token: u32,
    params: &SamplingParams,
    eos_ids: &[u32],
    tokenizer: &impl TokenDecoder,
) -> Result<Option<FinishReason>, EngineError> {
    let check_stop = seq.num_generated() >= params.min_tokens;
    let finish = if check_stop && !params.ignore_eos && eos_ids.contains(&token) {
        Some(FinishReason::Eos(token))
    } else if check_stop && params.stop_token_ids.contains(&token) {
        Some(FinishReason::StopToken(token))
    } else {
        None
    };
    if (finish.is_none() || params.include_stop_str_in_output)
        && let Some(m) = seq.detok.push(token, tokenizer, check_stop)?
        && finish.is_none()
    {
        return Ok(params.stop.get(m.index).cloned().map(FinishReason::StopString));
    }
    Ok(finish)
}

impl Engine {
    /// Records each row's token in its sample and decides who finishes (stop ids, EOS, stop
    /// strings, the grammar's end, then `max_tokens`); returns what the scheduler must append.
    pub(super) fn apply_samples(
        &mut self,
        sampled: Vec<TokenChoice>,
    ) -> Result<Vec<scheduler::SampledToken>, EngineError> {
        let now = Instant::now();
        let rows = &self.bufs.view.rows;
        for r in rows {
            self.live
                .at_mut(r.slot)
                .ok_or(EngineError::Internal("sampled unknown request"))?
                .first_token
                .get_or_insert(now);
        }
        let max_tokens: Vec<usize> =
            rows.iter().map(|r| self.live.at(r.slot).map_or(0, |rec| rec.max_tokens)).collect();
        let mut samples = self.live.samples_mut(rows)?;
        let mut updates = Vec::with_capacity(sampled.len());
        for (SampleMut { params, seq }, (tok, r)) in samples.iter_mut().zip(sampled.into_iter().zip(rows)) {
            seq.new_tokens.push(tok.token);
            if let Some(lp) = tok.logprobs {
                seq.cumulative_logprob += f64::from(lp.sampled.logprob);
                seq.new_logprobs.push(lp);
            }
            seq.finish = finish_at(seq, tok.token, params, &self.intake.eos_ids, &self.intake.tokenizer)?;
            updates.push(scheduler::SampledToken { seq_id: r.seq_id, token: tok.token, stop: false });
        }
        advance_guides(&mut samples, &updates, self.metrics.mask_times());
        for ((sample, update), max) in samples.iter_mut().zip(&mut updates).zip(max_tokens) {
            if sample.seq.finish.is_none() && sample.seq.num_generated() >= max {
                sample.seq.finish = Some(FinishReason::Length);
            }
            update.stop = sample.seq.finish.is_some();
        }
        Ok(updates)
    }

    /// Hands the tokens to the scheduler, which finishes the flagged samples and frees their
    /// blocks; one it finished unflagged means the two disagree on a sample's length.
    pub(super) fn update_scheduler(
        &mut self,
        updates: &[scheduler::SampledToken],
    ) -> Result<(), EngineError> {
        self.scheduler.update_into(updates, &mut self.bufs.result)?;
        for fs in &self.bufs.result.finished_seqs {
            let decided = self
                .live
                .get(&fs.seq_id.request)
                .and_then(|r| r.seqs.get(fs.seq_id.index as usize))
                .is_some_and(|s| s.finish.is_some());
            if !decided {
                return Err(EngineError::Internal("the scheduler finished a sample the engine did not"));
            }
        }
        Ok(())
    }
}

/// Feeds each unfinished guided sample its token, the guides in parallel; a grammar that ended
/// finishes its sample. Counted in `times`' wait: this is the guides' work on the critical path.
fn advance_guides(
    samples: &mut [SampleMut<'_>],
    updates: &[scheduler::SampledToken],
    times: &mut crate::structured::MaskTimes,
) {
    let start = Instant::now();
    let work: Vec<(&mut SeqState, u32)> = samples
        .iter_mut()
        .zip(updates)
        .filter(|(s, _)| s.seq.finish.is_none() && s.seq.guide.is_some())
        .map(|(s, u)| (&mut *s.seq, u.token))
        .collect();
    if work.is_empty() {
        return;
    }
    work.into_par_iter().for_each(|(seq, token)| {
        if let Some(finish) = crate::structured::advance(seq.guide.as_mut(), token) {
            seq.finish = Some(finish);
        }
    });
    times.add_wait(start.elapsed());
}
