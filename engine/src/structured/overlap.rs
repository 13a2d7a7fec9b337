//! The token masks of a step computed while its forward pass runs (as vLLM overlaps its
//! grammar bitmask): the guides of the sequences the plan samples are handed to a scoped worker
//! thread, which prepares each one's mask; sampling then only applies them.

use std::collections::{HashMap, HashSet};

use scheduler::{RequestKey, SchedulerOutput};

use super::Guide;
use crate::request::RequestRecord;

/// The guides of every sample `plan` samples (a prompt end of a group of `n` samples all `n`).
pub(crate) fn sampled_guides<'a>(
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

/// Runs `forward` on this thread while another prepares the masks of `guides`; a mask the
/// worker did not prepare (it failed) is computed when its row is sampled.
pub(crate) fn while_running<T>(guides: Vec<&mut Guide>, forward: impl FnOnce() -> T) -> T {
    if guides.is_empty() {
        return forward();
    }
    std::thread::scope(|scope| {
        let worker = scope.spawn(move || {
            for guide in guides {
                guide.prepare();
            }
        });
        let out = forward();
        if worker.join().is_err() {
            tracing::warn!(target: "engine", "the mask worker failed; masks are computed at sampling");
        }
        out
    })
}
