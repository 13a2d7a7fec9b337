//! The CPU's LoRA delta of one projection over one step: for each adapter of the step and each
//! part of the matrix it adapts, the adapter's rows gathered, shrunk by `A` (`[n, r]`), expanded
//! by `B` (`[n, out]`) — those (adapter, part) products side by side on the thread pool — then
//! added into the part's output columns (punica's SGMV: one adapter's rows at a time, each
//! adapter's matrices read once per step).

use quant_kernels::linear::linear;
use rayon::prelude::*;

use super::{LoraBatch, LoraPair};
use crate::arch::LayerMatrix;

/// Where the delta of one part of a matrix goes: which of the output buffers (rows of `width`
/// floats) and the part's first column in it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub buf: usize,
    pub width: usize,
    pub column: usize,
}

/// One (adapter, part) product's reused buffers: its gathered rows, shrunk rows, expanded rows.
#[derive(Debug, Default)]
struct Product {
    x: Vec<f32>,
    t: Vec<f32>,
    y: Vec<f32>,
}

/// Reused buffers of a step's products (they grow to the most products a matrix has had), and
/// the products of the matrix at hand: (group index, part index) pairs.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    products: Vec<Product>,
    jobs: Vec<(usize, usize)>,
}

fn ensure(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// Adds every adapter's delta of each part of layer `layer`'s `matrix` at `places[part]` in
/// `outs`; `x` is the projection's input (rows of `in_dim` floats). A part an adapter does not
/// adapt adds nothing.
pub(crate) fn add_deltas(
    batch: &LoraBatch,
    (layer, matrix): (usize, LayerMatrix),
    x: &[f32],
    in_dim: usize,
    (outs, places): (&mut [&mut [f32]], &[Place]),
    scratch: &mut Scratch,
) {
    let parts = places.len();
    let pair_of = |(g, part): (usize, usize)| {
        let group = &batch.groups()[g];
        let pair = group.adapter.pairs(layer, matrix).get(part).and_then(Option::as_ref);
        pair.map(|pair| (group, pair))
    };
    // Every (group, part) with rows to compute, in a fixed order.
    scratch.jobs.clear();
    for (g, group) in batch.groups().iter().enumerate().filter(|(_, g)| !g.tokens.is_empty()) {
        let adapted = group
            .adapter
            .pairs(layer, matrix)
            .iter()
            .take(parts)
            .enumerate()
            .filter(|(_, pair)| pair.is_some());
        scratch.jobs.extend(adapted.map(|(part, _)| (g, part)));
    }
    let count = scratch.jobs.len();
    if count == 0 {
        return;
    }
    if scratch.products.len() < count {
        scratch.products.resize_with(count, Product::default);
    }
    let (work, jobs) = (&mut scratch.products[..count], &scratch.jobs);
    work.par_iter_mut().zip(jobs.par_iter()).for_each(|(buf, &job)| {
        if let Some((group, pair)) = pair_of(job) {
            product(buf, x, in_dim, &group.tokens, pair);
        }
    });
    for (buf, &job) in work.iter().zip(jobs) {
        let Some((group, pair)) = pair_of(job) else { continue };
        let place = places[job.1];
        let out = &mut *outs[place.buf];
        let deltas = buf.y[..group.tokens.len() * pair.out_dim].chunks_exact(pair.out_dim);
        for (delta, &tok) in deltas.zip(&group.tokens) {
            let start = tok * place.width + place.column;
            out[start..start + pair.out_dim].iter_mut().zip(delta).for_each(|(o, d)| *o += d);
        }
    }
}

/// `buf.y = (x[tokens] · Aᵀ) · Bᵀ`.
fn product(buf: &mut Product, x: &[f32], in_dim: usize, tokens: &[usize], pair: &LoraPair) {
    let n = tokens.len();
    let xs = ensure(&mut buf.x, n * in_dim);
    for (row, &t) in xs.chunks_exact_mut(in_dim).zip(tokens) {
        row.copy_from_slice(&x[t * in_dim..(t + 1) * in_dim]);
    }
    let t = ensure(&mut buf.t, n * pair.rank);
    linear(t, &buf.x[..n * in_dim], &pair.a, n, pair.rank, in_dim, false);
    let y = ensure(&mut buf.y, n * pair.out_dim);
    linear(y, &buf.t[..n * pair.rank], &pair.b, n, pair.out_dim, pair.rank, false);
}
