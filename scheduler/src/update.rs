//! Applying a step's results: advance computed counts, register newly full blocks in the prefix
//! cache, fork groups at their first sample, append sampled tokens, finish sequences (stop flag,
//! `max_new_tokens`, `max_model_len`) and free their blocks.

use block_alloc::BlockPool;

use crate::error::SchedulerError;
use crate::group::{Seq, Where};
use crate::output::{FinishedSeq, SampledToken, StepResult};
use crate::queue::remove_slot;
use crate::request::{RequestKey, SeqFinish, SeqId};
use crate::scheduler::{InFlight, Scheduler};

impl Scheduler {
    /// Applies the sampled tokens of the last step. See `update_into`.
    pub fn update(&mut self, samples: &[SampledToken]) -> Result<StepResult, SchedulerError> {
        let mut result = StepResult::default();
        self.update_into(samples, &mut result)?;
        Ok(result)
    }

    /// Applies the sampled tokens of the last step: `samples` holds, in the order of the step's
    /// `seqs`, `num_samples` entries for each scheduled sequence (entries for sequences aborted
    /// since are ignored). Checked before anything changes: on a mismatch nothing is applied.
    pub fn update_into(
        &mut self,
        samples: &[SampledToken],
        result: &mut StepResult,
    ) -> Result<(), SchedulerError> {
        if !self.step_pending {
            return Err(SchedulerError::NoStepInFlight);
        }
        check_samples(&self.in_flight, samples)?;
        result.clear();
        self.step_pending = false;
        let in_flight = std::mem::take(&mut self.in_flight);
        let mut pos = 0;
        let mut outcome = Ok(());
        for f in &in_flight {
            let taken = crate::draft::samples_of(f, &samples[pos..]);
            let mine = &samples[pos..pos + taken];
            pos += taken;
            crate::draft::count(result, f, taken);
            if let Err(e) = self.apply(f, mine, result) {
                outcome = Err(e);
                break;
            }
        }
        self.in_flight = in_flight;
        self.in_flight.clear();
        outcome
    }

    fn apply(
        &mut self,
        f: &InFlight,
        samples: &[SampledToken],
        result: &mut StepResult,
    ) -> Result<(), SchedulerError> {
        let max_model_len = self.cfg.max_model_len;
        let caching = self.cfg.enable_prefix_caching;
        let block_size = self.cfg.block_size;
        let Self { groups, device, .. } = self;
        let Some(group) = groups.get_mut(f.slot).and_then(Option::as_mut) else { return Ok(()) };
        if group.key.arrival != f.arrival || group.place != Where::Running {
            return Ok(()); // aborted after scheduling
        }
        let si = f.seq as usize;
        let (salt, lora) = (group.salt, group.lora);
        let seq = group.seqs.get_mut(si).ok_or(SchedulerError::Internal("in-flight sequence missing"))?;
        let before = seq.num_computed_tokens;
        // A draft keeps its accepted prefix; that and the last sample are what it appends.
        let (end, samples) = if f.num_draft > 0 {
            let end = crate::draft::keep_accepted(seq, f, samples, device)?;
            (end, &samples[samples.len() - 1..])
        } else {
            (f.end, samples)
        };
        seq.num_computed_tokens = end;
        if caching && end / block_size > before / block_size {
            let mark = device.num_pending_cache_events();
            seq.cache_full_blocks(device, end, salt)?;
            if let Some(lora) = lora {
                device.label_cache_events(mark, lora);
            }
        }
        if f.end == group.prompt_len && group.seqs.iter().any(|s| s.parked) {
            // The recomputed prompt is back: the parked samples share it again.
            let (leader, rest) = group.seqs.split_at_mut(si + 1);
            let leader = &leader[si];
            for parked in rest.iter_mut().filter(|s| s.parked) {
                parked.set_table(leader.table().fork(device)?);
                parked.num_computed_tokens = leader.num_computed_tokens;
                parked.parked = false;
            }
        }
        if samples.len() > 1 {
            // The group's first sample: split the prompt's sequence into `n`, sharing its blocks.
            let parent = &group.seqs[si];
            let mut children = Vec::with_capacity(samples.len() - 1);
            for k in 1..samples.len() {
                let table = parent.table().fork(device)?;
                children.push(Seq::new(k as u32, parent.tokens.clone(), parent.num_computed_tokens, table));
            }
            group.seqs.extend(children);
        }
        let id = group.id;
        // Generated tokens reach `max_new_tokens` (or the sequence `max_model_len`) at this length.
        let length_cap = group.prompt_len.saturating_add(group.max_new_tokens).min(max_model_len);
        let any_finished = match samples {
            [] => false,
            // The common case (a decode): the sample goes to the scheduled sequence itself.
            [sample] => {
                let seq = group.seqs.get_mut(si).ok_or(SchedulerError::Internal("sample target missing"))?;
                push_sample(seq, sample, length_cap, id, device, result)?
            }
            // At the fork, sample `k` goes to sample `k`.
            _ => {
                if group.seqs.len() < samples.len() {
                    return Err(SchedulerError::Internal("sample target missing"));
                }
                let mut any = false;
                for (seq, sample) in group.seqs.iter_mut().zip(samples) {
                    any |= push_sample(seq, sample, length_cap, id, device, result)?;
                }
                any
            }
        };
        if any_finished && group.all_finished() {
            remove_slot(&mut self.running, f.slot);
            self.release(f.slot);
            result.finished_requests.push(id);
            self.finished_since.push(id);
            self.stats.finished += 1;
        }
        Ok(())
    }
}

/// Appends a sampled token to `seq`; finishes it (freeing its blocks) on a stop flag or at
/// `length_cap` tokens. Returns whether it finished.
#[inline(always)]
fn push_sample(
    seq: &mut Seq,
    sample: &SampledToken,
    length_cap: usize,
    id: RequestKey,
    device: &mut BlockPool,
    result: &mut StepResult,
) -> Result<bool, SchedulerError> {
    seq.tokens.push(sample.token);
    let reason = if sample.stop {
        SeqFinish::Stopped
    } else if seq.tokens.len() >= length_cap {
        SeqFinish::Length
    } else {
        return Ok(false);
    };
    seq.table_mut().free(device)?;
    seq.finished = Some(reason);
    result.finished_seqs.push(FinishedSeq { seq_id: SeqId { request: id, index: seq.index }, reason });
    Ok(true)
}

/// Every scheduled sequence gets exactly its `num_samples` entries, in order.
fn check_samples(in_flight: &[InFlight], samples: &[SampledToken]) -> Result<(), SchedulerError> {
    let mut pos = 0;
    for f in in_flight {
        for _ in 0..crate::draft::samples_of(f, &samples[pos.min(samples.len())..]) {
            match samples.get(pos) {
                Some(s) if s.seq_id == f.seq_id => pos += 1,
                other => {
                    return Err(SchedulerError::SampleMismatch {
                        position: pos,
                        expected: Some(f.seq_id),
                        got: other.map(|s| s.seq_id),
                    });
                }
            }
        }
    }
    match samples.get(pos) {
        None => Ok(()),
        Some(extra) => {
            Err(SchedulerError::SampleMismatch { position: pos, expected: None, got: Some(extra.seq_id) })
        }
    }
}
