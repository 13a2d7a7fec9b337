//! [`Live`]: the admitted, unfinished requests, each in a slot; and [`StepView`], a step's
//! sequences and sampled rows resolved to those slots once, right after scheduling, so every
//! later phase reaches a request by index and a row's sample by `&mut` ([`Live::samples_mut`])
//! instead of looking its key up again or taking its sampler out and putting it back.

use std::collections::HashMap;

use scheduler::{RequestKey, SchedulerOutput, SeqId};

use crate::error::EngineError;
use crate::request::{RequestRecord, SeqState};
use crate::sampling::SamplingParams;

/// The live requests: a slab of records and the key → slot map the API edge uses.
#[derive(Debug, Default)]
pub(crate) struct Live {
    records: Vec<Option<RequestRecord>>,
    slots: HashMap<RequestKey, usize>,
    free: Vec<usize>,
}

/// One sampled row of a step: the request's slot, the sample it samples for, and the scheduler's
/// sequence id (a prompt end of a group of `n` has `n` rows, samples `0..n`); its first row of
/// the forward's logits and, for a drafted sequence, where its draft is among the plan's tokens
/// (row `logit + j` then scores the draft's token `j`'s successor).
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub slot: usize,
    pub index: usize,
    pub seq_id: SeqId,
    pub logit: usize,
    pub draft: std::ops::Range<usize>,
}

/// A row's sample, borrowed for the step, with its request's parameters.
#[derive(Debug)]
pub(crate) struct SampleMut<'a> {
    pub params: &'a SamplingParams,
    /// Tokens the request's samples may generate (its `max_tokens`, filled in).
    pub max_tokens: usize,
    pub seq: &'a mut SeqState,
}

const UNKNOWN: EngineError = EngineError::Internal("scheduled unknown request");

impl Live {
    pub fn insert(&mut self, record: RequestRecord) {
        let key = record.key;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.records[slot] = Some(record);
                slot
            }
            None => {
                self.records.push(Some(record));
                self.records.len() - 1
            }
        };
        self.slots.insert(key, slot);
    }

    pub fn get(&self, key: &RequestKey) -> Option<&RequestRecord> {
        self.at(*self.slots.get(key)?)
    }

    pub fn get_mut(&mut self, key: &RequestKey) -> Option<&mut RequestRecord> {
        self.at_mut(*self.slots.get(key)?)
    }

    pub fn remove(&mut self, key: &RequestKey) -> Option<RequestRecord> {
        let slot = self.slots.remove(key)?;
        self.free.push(slot);
        self.records.get_mut(slot)?.take()
    }

    /// The record in `slot` (a slot of this step's view).
    pub fn at(&self, slot: usize) -> Option<&RequestRecord> {
        self.records.get(slot)?.as_ref()
    }

    pub fn at_mut(&mut self, slot: usize) -> Option<&mut RequestRecord> {
        self.records.get_mut(slot)?.as_mut()
    }

    pub fn keys(&self) -> impl Iterator<Item = RequestKey> + '_ {
        self.slots.keys().copied()
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut RequestRecord> {
        self.records.iter_mut().flatten()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Every row's sample, in row order, each borrowed once: rows of one request borrow distinct
    /// samples of its record (a row naming a sample twice is an internal error).
    pub fn samples_mut(&mut self, rows: &[Row]) -> Result<Vec<SampleMut<'_>>, EngineError> {
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_unstable_by_key(|&r| (rows[r].slot, rows[r].index));
        let mut out: Vec<Option<SampleMut<'_>>> = (0..rows.len()).map(|_| None).collect();
        let mut records: &mut [Option<RequestRecord>] = &mut self.records;
        let mut first_slot = 0;
        let mut i = 0;
        while let Some(&r) = order.get(i) {
            let slot = rows[r].slot;
            let (record, rest) = std::mem::take(&mut records)
                .get_mut(slot.checked_sub(first_slot).ok_or(UNKNOWN)?..)
                .and_then(<[_]>::split_first_mut)
                .ok_or(UNKNOWN)?;
            (records, first_slot) = (rest, slot + 1);
            let RequestRecord { params, seqs, max_tokens, .. } = record.as_mut().ok_or(UNKNOWN)?;
            let max_tokens = *max_tokens;
            let params: &SamplingParams = params;
            let mut seqs: &mut [SeqState] = seqs;
            let mut first_index = 0;
            while let Some(&r) = order.get(i).filter(|&&r| rows[r].slot == slot) {
                let index = rows[r].index;
                let (seq, rest) = std::mem::take(&mut seqs)
                    .get_mut(index.checked_sub(first_index).ok_or(SAMPLE_TWICE)?..)
                    .and_then(<[_]>::split_first_mut)
                    .ok_or(EngineError::Internal("sample index out of range"))?;
                (seqs, first_index) = (rest, index + 1);
                out[r] = Some(SampleMut { params, max_tokens, seq });
                i += 1;
            }
        }
        out.into_iter().map(|s| s.ok_or(UNKNOWN)).collect()
    }
}

const SAMPLE_TWICE: EngineError = EngineError::Internal("a step samples one sample twice");

/// A step's plan resolved once against [`Live`]: each planned sequence's slot, and the rows that
/// sample, in the order of their logits (reused from step to step).
#[derive(Debug, Default)]
pub(crate) struct StepView {
    /// The slot of each of the plan's sequences, in plan order.
    pub seq_slots: Vec<usize>,
    pub rows: Vec<Row>,
}

impl StepView {
    /// Puts each planned sequence's tokens under its request's LoRA adapter, if it has one.
    pub fn lora_rows(&self, plan: &SchedulerOutput, live: &Live, out: &mut model::LoraBatch) {
        out.clear();
        for (i, &slot) in self.seq_slots.iter().enumerate() {
            if let Some(adapter) = live.at(slot).and_then(|r| r.lora.as_ref()).map(|l| &l.adapter)
                && let (Some(&start), Some(&end)) =
                    (plan.query_start_loc.get(i), plan.query_start_loc.get(i + 1))
            {
                out.add(adapter, start..end);
            }
        }
    }

    /// Resolves `plan`'s requests; a planned request that is not live is an internal error.
    pub fn build(&mut self, plan: &SchedulerOutput, live: &Live) -> Result<(), EngineError> {
        self.seq_slots.clear();
        self.rows.clear();
        let mut logit = 0;
        for s in &plan.seqs {
            let slot = *live.slots.get(&s.seq_id.request).ok_or(UNKNOWN)?;
            self.seq_slots.push(slot);
            let draft = s.flat.end - s.num_draft..s.flat.end;
            for j in 0..s.num_samples {
                // At a group's prompt end its one sequence samples for every sample `0..n`.
                let index = if s.num_samples > 1 { j } else { s.seq_id.index as usize };
                self.rows.push(Row { slot, index, seq_id: s.seq_id, logit, draft: draft.clone() });
            }
            logit += s.num_logit_rows();
        }
        Ok(())
    }
}
