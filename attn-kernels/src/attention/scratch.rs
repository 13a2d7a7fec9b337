//! Per-thread scratch buffers: grown to the largest need seen, then reused, so the hot loop
//! never allocates.

use std::cell::RefCell;

#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// Decode: prepared query rows (`qrep_len` each). Chunks: scaled queries `[head][stride]`.
    pub qrep: Vec<f32>,
    /// Decode: logits then probabilities per query head. Chunks: one step's scores.
    pub logits: Vec<f32>,
    /// Output accumulators: decode `head_size · 8` per query head, chunks `[head][stride]`.
    pub acc: Vec<f32>,
    /// Decode: one value tile widened to f32 with the slots past the context zeroed.
    pub vtile: Vec<f32>,
    /// Running max and running sum per query row.
    pub max: Vec<f32>,
    pub sum: Vec<f32>,
    /// Chunks: each row's position.
    pub row_pos: Vec<f32>,
    /// Chunks: one step's keys and values widened to f32.
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

/// Borrows `v` with at least `n` elements, growing it (only) when it is too short.
pub(super) fn at_least(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// [`at_least`], starting on a 64-byte boundary: a 16-lane load from it never straddles two
/// cache lines (a split load costs two).
pub(super) fn at_least_aligned(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    const LINE_FLOATS: usize = 16;
    let buf = at_least(v, n + LINE_FLOATS);
    let skip = buf.as_ptr().align_offset(64).min(LINE_FLOATS);
    &mut buf[skip..skip + n]
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch.
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}
