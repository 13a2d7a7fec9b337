//! The CPU's LoRA delta of one projection over one step: for each adapter of the step, its rows
//! gathered, shrunk by `A` (`[n, r]`), expanded by `B` (`[n, out]`) and added into the output
//! columns of each adapted part (punica's SGMV, one adapter's rows at a time).

use quant_kernels::linear::linear;

use super::{LoraBatch, LoraPair};
use crate::arch::LayerMatrix;

/// Where the delta of each part of a matrix goes: the buffer (rows of `width` floats) and the
/// first column of the part in it.
pub(crate) struct Target<'a> {
    pub buf: &'a mut [f32],
    pub width: usize,
    pub column: usize,
}

/// Reused buffers of the gathered rows, the shrunk rows and the expanded rows.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    t: Vec<f32>,
    y: Vec<f32>,
}

fn ensure(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// Adds every adapter's delta of parts `first_part ..` of layer `layer`'s `matrix`:
/// `targets[i]` is where part `first_part + i`'s delta goes, `x` the projection's input (rows of
/// `in_dim` floats). A part an adapter does not adapt adds nothing.
pub(crate) fn add_deltas(
    batch: &LoraBatch,
    (layer, matrix, first_part): (usize, LayerMatrix, usize),
    x: &[f32],
    in_dim: usize,
    targets: &mut [Target<'_>],
    scratch: &mut Scratch,
) {
    for group in batch.groups() {
        let n = group.tokens.len();
        let all = group.adapter.pairs(layer, matrix);
        let pairs: &[Option<LoraPair>] = all.get(first_part..).unwrap_or_default();
        if n == 0 || pairs.iter().all(Option::is_none) {
            continue;
        }
        let xs = ensure(&mut scratch.x, n * in_dim);
        for (row, &t) in xs.chunks_exact_mut(in_dim).zip(&group.tokens) {
            row.copy_from_slice(&x[t * in_dim..(t + 1) * in_dim]);
        }
        for (pair, target) in pairs.iter().zip(targets.iter_mut()) {
            let Some(pair) = pair else { continue };
            let t = ensure(&mut scratch.t, n * pair.rank);
            linear(t, &scratch.x[..n * in_dim], &pair.a, n, pair.rank, in_dim, false);
            let y = ensure(&mut scratch.y, n * pair.out_dim);
            linear(y, &scratch.t[..n * pair.rank], &pair.b, n, pair.out_dim, pair.rank, false);
            for (delta, &tok) in scratch.y[..n * pair.out_dim].chunks_exact(pair.out_dim).zip(&group.tokens) {
                let start = tok * target.width + target.column;
                let out = &mut target.buf[start..start + pair.out_dim];
                out.iter_mut().zip(delta).for_each(|(o, d)| *o += d);
            }
        }
    }
}
