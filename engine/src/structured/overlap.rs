//! When a step's token masks are computed. On a CPU the forward pass already keeps every core
//! busy, so a guide's next mask is computed right after it takes its sampled token, all guides
//! in parallel on the forward's own thread pool ([`advance_sampled`]): a thread of its own
//! beside the forward would only take cores from it, and stall its parallel loops. On a GPU
//! (and for a guide's first mask) the mask is computed while the forward pass runs, as vLLM
//! overlaps its grammar bitmask: the guides the plan samples that have no mask yet are handed
//! to a scoped worker thread ([`while_running`]). Sampling then only applies the masks.
//! [`MaskTimes`] counts what the worker did and how long a step waited for it after its forward
//! pass (the part of the masks' time left on the critical path).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use scheduler::{RequestKey, SchedulerOutput};
use serde::Serialize;

use rayon::prelude::*;

use super::Guide;
use crate::output::FinishReason;
use crate::request::RequestRecord;

/// The masks computed ahead of sampling, summed over steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct MaskTimes {
    /// Steps that computed masks.
    pub steps: u64,
    /// Masks computed ahead of sampling (each guided sample's next token's).
    pub masks: u64,
    /// Time spent computing them, summed over the threads that did, seconds.
    pub compute_s: f64,
    /// Time the steps spent on guides outside their forward pass, seconds: the wait for the
    /// worker once the forward was done, and the parallel pass that feeds the guides their
    /// tokens and computes their next masks.
    pub wait_s: f64,
}

impl MaskTimes {
    fn add(&mut self, masks: usize, compute: Duration, wait: Duration) {
        self.masks += masks as u64;
        self.compute_s += compute.as_secs_f64();
        self.wait_s += wait.as_secs_f64();
    }

    /// Counts a step that computed masks, given the mask count before it.
    pub(crate) fn count_step(&mut self, masks_before: u64) {
        if self.masks > masks_before {
            self.steps += 1;
        }
    }
}

/// The guides of every sample `plan` samples (a prompt end of a group of `n` samples all `n`)
/// whose next mask is not computed yet.
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
                && !guide.is_prepared()
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

/// A constrained sample's token for [`advance_sampled`]: where its step output is, and whether
/// its next mask is worth computing now (it may sample again).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GuidedToken {
    pub token: u32,
    pub output: usize,
    pub prepare_next: bool,
}

/// Feeds each sample in `sampled` (by request and sample index) its token, the guides in
/// parallel, each computing its next mask in the same task where asked; returns the samples
/// whose grammar ended, with their output's position and finish.
pub(crate) fn advance_sampled(
    live: &mut HashMap<RequestKey, RequestRecord>,
    sampled: &HashMap<(RequestKey, usize), GuidedToken>,
    times: &mut MaskTimes,
) -> Vec<(usize, (RequestKey, usize), FinishReason)> {
    let start = Instant::now();
    let mut work = Vec::with_capacity(sampled.len());
    for (key, record) in live.iter_mut() {
        for (index, seq) in record.seqs.iter_mut().enumerate() {
            if let Some(guide) = seq.guide.as_mut()
                && let Some(&token) = sampled.get(&(*key, index))
            {
                work.push(((*key, index), token, guide));
            }
        }
    }
    let fed: Vec<_> = work
        .into_par_iter()
        .map(|(at, t, guide)| {
            let finish = super::advance(Some(&mut *guide), t.token);
            let prepared = (finish.is_none() && t.prepare_next).then(|| {
                let t0 = Instant::now();
                guide.prepare();
                t0.elapsed()
            });
            (t.output, at, finish, prepared)
        })
        .collect();
    let prepared: Vec<Duration> = fed.iter().filter_map(|f| f.3).collect();
    times.add(prepared.len(), prepared.iter().sum(), start.elapsed());
    fed.into_iter().filter_map(|(output, at, finish, _)| finish.map(|f| (output, at, f))).collect()
}
