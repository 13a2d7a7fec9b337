//! Portable micro-kernels: plain loops over `f32`, for CPUs without AVX2/FMA/F16C.

use super::{Heads, KernelElem, PvBlocks, QkRows};

pub(super) fn qk_rows<T: KernelElem>(op: QkRows<'_, T>) {
    let QkRows { heads: Heads { nh, d, bs, stride }, tile, qrep, q_stride: ql, scores } = op;
    let x = T::DTYPE.x();
    for i in 0..nh {
        let (q, out) = (&qrep[i * ql..][..super::qrep_len(d, x)], &mut scores[i * stride..i * stride + bs]);
        out.fill(0.0);
        for c in 0..d / x {
            let qc = &q[c * 8..c * 8 + x];
            let row = &tile[c * bs * x..(c + 1) * bs * x];
            for (s, k) in out.iter_mut().zip(row.chunks_exact(x)) {
                *s += k.iter().zip(qc).map(|(a, b)| a.to_f32() * b).sum::<f32>();
            }
        }
    }
}

pub(super) fn pv_blocks<T: KernelElem>(op: PvBlocks<'_, T>) {
    let PvBlocks { heads: Heads { nh, d, bs, stride }, tiles, probs, acc8 } = op;
    for i in 0..nh {
        let acc = &mut acc8[i * d * 8..(i + 1) * d * 8];
        for (j, tile) in tiles.iter().enumerate() {
            let p = &probs[i * stride + j * bs..i * stride + (j + 1) * bs];
            for (lanes, row) in acc.chunks_exact_mut(8).zip(tile.chunks_exact(bs)) {
                for (t, (&v, &w)) in row.iter().zip(p).enumerate() {
                    lanes[t % 8] += v.to_f32() * w;
                }
            }
        }
    }
}

pub(super) fn finish_rows(acc8: &[f32], scale: f32, out: &mut [f32]) {
    for (o, lanes) in out.iter_mut().zip(acc8.chunks_exact(8)) {
        *o = scale * lanes.iter().sum::<f32>();
    }
}

pub(super) fn exp_sub_sum(v: &mut [f32], max: f32) -> f32 {
    let mut sum = 0.0;
    for e in v.iter_mut() {
        *e = (*e - max).exp();
        sum += *e;
    }
    sum
}
