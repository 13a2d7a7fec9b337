//! The guides' work placed around a step's forward pass. Each guide's mask for the step is
//! computed while the forward runs (as vLLM overlaps its grammar bitmask), as jobs of the rayon
//! pool the forward's own loops run on ([`while_running`]); sampling then only applies it. After
//! sampling, the guides take their tokens in one parallel pass ([`advance_sampled`]).
//! [`MaskTimes`] counts the masks' time and how long the steps spent on guides outside their
//! forward pass (the part of the guides' time left on the critical path).

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
    /// Steps that computed masks beside their forward pass.
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

/// Runs `forward` on this thread while the rayon pool prepares the masks of `guides`, adding to
/// `times`. The masks are pool jobs, not a thread of their own: on a CPU the forward's parallel
/// loops run on the same pool, so the two share its threads instead of the system preempting
/// a loop's worker for the mask thread (which stalls the whole loop); on a GPU the pool is idle
/// while the device computes. A mask whose computation failed (panicked) is left unprepared and
/// computed when its row is sampled.
pub(crate) fn while_running<T>(
    guides: Vec<&mut Guide>,
    times: &mut MaskTimes,
    forward: impl FnOnce() -> T,
) -> T {
    if guides.is_empty() {
        return forward();
    }
    let masks = guides.len();
    let mut compute = Duration::ZERO;
    let compute_total = &mut compute;
    let (out, forward_done) = rayon::in_place_scope(|scope| {
        scope.spawn(move |_| {
            *compute_total = guides
                .into_par_iter()
                .map(|guide| {
                    let start = Instant::now();
                    let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| guide.prepare()));
                    if prepared.is_err() {
                        tracing::warn!(target: "engine", "a mask failed; it is computed at sampling");
                    }
                    start.elapsed()
                })
                .sum();
        });
        let out = forward();
        (out, Instant::now())
    });
    times.steps += 1;
    times.add(masks, compute, forward_done.elapsed());
    out
}

/// Feeds each sample in `sampled` (by request and sample index: its token, and where its step
/// output is) its token, the guides in parallel; returns the samples whose grammar ended, with
/// their output's position and finish. The pass is counted in `times`' wait: it is the part of
/// the guides' work on the step's critical path.
pub(crate) fn advance_sampled(
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
        .filter_map(|(at, token, output, guide)| super::advance(Some(guide), token).map(|f| (output, at, f)))
        .collect();
    times.add(0, Duration::ZERO, start.elapsed());
    ended
}
