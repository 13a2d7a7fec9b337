//! The guided samples among the engine's live requests: the guides whose next masks a step
//! computes beside its forward pass ([`sampled_guides`], for `structured::while_running`), and
//! the parallel pass that feeds each guide its sampled token after sampling
//! ([`advance_sampled`]).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use rayon::prelude::*;
use scheduler::{RequestKey, SchedulerOutput};

use crate::output::FinishReason;
use crate::request::RequestRecord;
use crate::structured::{Guide, MaskTimes};

/// The guides of every sample `plan` samples (a prompt end of a group of `n` samples all `n`).
pub(super) fn sampled_guides<'a>(
    plan: &SchedulerOutput,
    live: &'a mut HashMap<RequestKey, RequestRecord>,
) -> Vec<&'a mut Guide> {
    let mut sampled: HashSet<(RequestKey, usize)> = HashSet::new();
    for s in plan.seqs.iter().filter(|s| s.num_samples > 0) {
        let request = s.seq_id.request;
        if live.get(&request).is_none_or(|r| r.params.constraint.is_none()) {
            continue;
        }
        if s.num_samples > 1 {
            sampled.extend((0..s.num_samples).map(|j| (request, j)));
        } else {
            sampled.insert((request, s.seq_id.index as usize));
        }
    }
    if sampled.is_empty() {
        return Vec::new();
    }
    let mut guides = Vec::with_capacity(sampled.len());
    for (key, record) in live.iter_mut() {
        for (index, seq) in record.seqs.iter_mut().enumerate() {
            if let Some(guide) = seq.guide.as_mut()
                && sampled.contains(&(*key, index))
            {
                guides.push(guide);
            }
        }
    }
    guides
}

/// Feeds each sample in `sampled` (by request and sample index: its token, and where its step
/// output is) its token, the guides in parallel; returns the samples whose grammar ended, with
/// their output's position and finish. The pass is counted in `times`' wait: it is the part of
/// the guides' work on the step's critical path.
pub(super) fn advance_sampled(
    live: &mut HashMap<RequestKey, RequestRecord>,
    sampled: &HashMap<(RequestKey, usize), (u32, usize)>,
    times: &mut MaskTimes,
) -> Vec<(usize, (RequestKey, usize), FinishReason)> {
    let start = Instant::now();
    let mut work = Vec::with_capacity(sampled.len());
    for (key, record) in live.iter_mut() {
        for (index, seq) in record.seqs.iter_mut().enumerate() {
            if let Some(guide) = seq.guide.as_mut()
                && let Some(&(token, output)) = sampled.get(&(*key, index))
            {
                work.push(((*key, index), token, output, guide));
            }
        }
    }
    let ended = work
        .into_par_iter()
        .filter_map(|(at, token, output, guide)| {
            crate::structured::advance(Some(guide), token).map(|f| (output, at, f))
        })
        .collect();
    times.add_wait(start.elapsed());
    ended
}
