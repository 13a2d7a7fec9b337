//! The CPU's LoRA delta of one projection over one step: for each adapter of the step, its rows
//! shrunk once by the stacked `A` of every part it adapts (`[n, Σr]`), then each part's columns
//! expanded by its `B` (`[n, out]`) into that part's output columns (punica's SGMV: one
//! adapter's rows at a time, each adapter's matrices read once per step). An adapter whose rows
//! come in long runs (prefill chunks) is multiplied straight from the input into the outputs, run
//! by run, each product on the whole pool; one whose rows are scattered (decodes) has them
//! gathered, and such adapters' products run side by side on the pool before their deltas are
//! added.

use quant_kernels::linear::{linear, linear_strided};
use rayon::prelude::*;

use super::{LoraBatch, LoraMatrix};
use crate::arch::LayerMatrix;

/// Where the delta of one part of a matrix goes: which of the output buffers (rows of `width`
/// floats) and the part's first column in it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub buf: usize,
    pub width: usize,
    pub column: usize,
}

/// One adapter's product's reused buffers: its gathered rows, shrunk rows, and each part's
/// expanded rows one after the other.
#[derive(Debug, Default)]
struct Product {
    x: Vec<f32>,
    t: Vec<f32>,
    y: Vec<f32>,
}

/// Reused buffers of a step's products (they grow to the most adapters a step has had), and
/// the groups of the matrix at hand whose rows are gathered.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    products: Vec<Product>,
    jobs: Vec<usize>,
}

/// Rows per run, on average, from which an adapter's runs are multiplied in place rather than
/// gathered (a run of a few rows makes a product too small to pay for a `gemm` call of its own).
const RUN_ROWS_IN_PLACE: usize = 16;

fn ensure(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// Adds every adapter's delta of each part of layer `layer`'s `matrix` at `places[part]` in
/// `outs`; `x` is the projection's input (rows of `in_dim` floats). The caller checked each
/// adapter's shapes against `in_dim` and the places.
pub(crate) fn add_deltas(
    batch: &LoraBatch,
    (layer, matrix): (usize, LayerMatrix),
    x: &[f32],
    in_dim: usize,
    (outs, places): (&mut [&mut [f32]], &[Place]),
    scratch: &mut Scratch,
) {
    let adapted = |g: usize| {
        let group = &batch.groups()[g];
        group.adapter.matrix(layer, matrix).map(|m| (&group.tokens, m))
    };
    scratch.jobs.clear();
    if scratch.products.is_empty() {
        scratch.products.push(Product::default());
    }
    for (g, group) in batch.groups().iter().enumerate() {
        let Some(m) = group.adapter.matrix(layer, matrix) else { continue };
        if group.tokens.len() < RUN_ROWS_IN_PLACE * group.runs.len() {
            scratch.jobs.push(g);
            continue;
        }
        for run in &group.runs {
            in_place(&mut scratch.products[0], (x, in_dim), run.clone(), m, (&mut *outs, places));
        }
    }
    let count = scratch.jobs.len();
    if count == 0 {
        return;
    }
    if scratch.products.len() < count {
        scratch.products.resize_with(count, Product::default);
    }
    let (work, jobs) = (&mut scratch.products[..count], &scratch.jobs);
    // One adapter alone takes the pool inside its product; several share it between them.
    let alone = count == 1;
    work.par_iter_mut().zip(jobs.par_iter()).for_each(|(buf, &g)| {
        if let Some((tokens, m)) = adapted(g) {
            product(buf, x, in_dim, tokens, m, alone);
        }
    });
    for (buf, &g) in work.iter().zip(jobs) {
        let Some((tokens, m)) = adapted(g) else { continue };
        let mut at = 0;
        for (part, place) in m.parts.iter().zip(places) {
            let Some(part) = part else { continue };
            let out = &mut *outs[place.buf];
            let deltas = buf.y[at..at + tokens.len() * part.out_dim].chunks_exact(part.out_dim);
            for (delta, &tok) in deltas.zip(tokens) {
                let start = tok * place.width + place.column;
                out[start..start + part.out_dim].iter_mut().zip(delta).for_each(|(o, d)| *o += d);
            }
            at += tokens.len() * part.out_dim;
        }
    }
}

/// The deltas of rows `run` straight from `x` into the outputs, each product on the pool.
fn in_place(
    buf: &mut Product,
    (x, in_dim): (&[f32], usize),
    run: std::ops::Range<usize>,
    m: &LoraMatrix,
    (outs, places): (&mut [&mut [f32]], &[Place]),
) {
    let n = run.len();
    let t = ensure(&mut buf.t, n * m.rank);
    linear_strided((t, m.rank), (&x[run.start * in_dim..], in_dim), &m.a, (n, m.rank, in_dim), (false, true));
    for (part, place) in m.parts.iter().zip(places) {
        let Some(part) = part else { continue };
        let out = &mut outs[place.buf][run.start * place.width + place.column..];
        let t = (&buf.t[part.first..], m.rank);
        linear_strided((out, place.width), t, &part.b, (n, part.out_dim, part.rank), (true, true));
    }
}

/// `buf.t = x[tokens] · Aᵀ` (every part's rank at once), then each part's `t · Bᵀ` into `buf.y`
/// (on the pool with `parallel`).
fn product(buf: &mut Product, x: &[f32], in_dim: usize, tokens: &[usize], m: &LoraMatrix, parallel: bool) {
    let n = tokens.len();
    let xs = ensure(&mut buf.x, n * in_dim);
    for (row, &t) in xs.chunks_exact_mut(in_dim).zip(tokens) {
        row.copy_from_slice(&x[t * in_dim..(t + 1) * in_dim]);
    }
    let t = ensure(&mut buf.t, n * m.rank);
    linear(t, &buf.x[..n * in_dim], &m.a, n, m.rank, in_dim, false);
    let outs: usize = m.parts.iter().flatten().map(|p| p.out_dim).sum();
    let y = ensure(&mut buf.y, n * outs);
    let mut at = 0;
    for part in m.parts.iter().flatten() {
        let ys = &mut y[at..at + n * part.out_dim];
        let t = (&buf.t[part.first..], m.rank);
        linear_strided((ys, part.out_dim), t, &part.b, (n, part.out_dim, part.rank), (false, parallel));
        at += n * part.out_dim;
    }
}
