//! Per-thread scratch buffers: grown to the largest need seen, then reused, so the hot loop
//! never allocates.

use std::cell::RefCell;

#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// Prepared query rows (`qrep_len` each).
    pub qrep: Vec<f32>,
    /// Decode: logits then probabilities per query head. Chunks: one block's scores.
    pub logits: Vec<f32>,
    /// Output accumulators, `head_size` per query row.
    pub acc: Vec<f32>,
    /// One value tile widened to f32 with the slots past the context zeroed.
    pub vtile: Vec<f32>,
    /// Chunks: one block's probabilities.
    pub probs: Vec<f32>,
    /// Chunks: running max and running sum per query row.
    pub max: Vec<f32>,
    pub sum: Vec<f32>,
}

/// Borrows `v` with at least `n` elements, growing it (only) when it is too short.
pub(super) fn at_least(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch.
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}
