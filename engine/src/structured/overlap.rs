//! The guides' work placed around a step's forward pass. Each guide's mask for the step is
//! computed while the forward runs (as vLLM overlaps its grammar bitmask), as jobs of the rayon
//! pool the forward's own loops run on ([`while_running`]); sampling then only applies it.
//! [`MaskTimes`] counts the masks' time and how long the steps spent on guides outside their
//! forward pass (the part of the guides' time left on the critical path), the pass that feeds
//! the guides their sampled tokens included. Which guides a step samples, and that pass, are
//! the engine's (`engine/guides.rs`): they walk its live requests.

use std::time::{Duration, Instant};

use serde::Serialize;

use rayon::prelude::*;

use super::Guide;

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

    /// Time a step spent on its guides outside its forward pass, after sampling.
    pub(crate) fn add_wait(&mut self, wait: Duration) {
        self.add(0, Duration::ZERO, wait);
    }
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
