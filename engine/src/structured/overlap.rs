//! The token masks of a step computed while its forward pass runs (as vLLM overlaps its
//! grammar bitmask): the guides of the sequences the plan samples are handed to a scoped worker
//! thread, which prepares each one's mask; sampling then only applies them. [`MaskTimes`] counts
//! what the worker did and how long a step waited for it after its forward pass (the part of
//! the masks' time left on the critical path).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use scheduler::{RequestKey, SchedulerOutput};
use serde::Serialize;

use super::Guide;
use crate::request::RequestRecord;

/// What the mask worker did, summed over steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct MaskTimes {
    /// Steps whose masks were prepared beside the forward pass.
    pub steps: u64,
    /// Masks prepared (one per guided sample of those steps).
    pub masks: u64,
    /// Time the worker spent preparing them, seconds.
    pub compute_s: f64,
    /// Time those steps waited for the worker once their forward pass was done, seconds.
    pub wait_s: f64,
}

impl MaskTimes {
    fn add(&mut self, masks: usize, compute: Duration, wait: Duration) {
        self.steps += 1;
        self.masks += masks as u64;
        self.compute_s += compute.as_secs_f64();
        self.wait_s += wait.as_secs_f64();
    }
}

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

/// Runs `forward` on this thread while another prepares the masks of `guides`, adding to
/// `times`; a mask the worker did not prepare (it failed) is computed when its row is sampled.
pub(crate) fn while_running<T>(
    guides: Vec<&mut Guide>,
    times: &mut MaskTimes,
    forward: impl FnOnce() -> T,
) -> T {
    if guides.is_empty() {
        return forward();
    }
    let masks = guides.len();
    std::thread::scope(|scope| {
        let worker = scope.spawn(move || {
            let start = Instant::now();
            for guide in guides {
                guide.prepare();
            }
            start.elapsed()
        });
        let out = forward();
        let forward_done = Instant::now();
        match worker.join() {
            Ok(compute) => times.add(masks, compute, forward_done.elapsed()),
            Err(_) => {
                tracing::warn!(target: "engine", "the mask worker failed; masks are computed at sampling")
            }
        }
        out
    })
}
