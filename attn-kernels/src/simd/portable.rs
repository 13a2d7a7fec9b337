//! Portable micro-kernels: plain loops over `f32`, for CPUs without AVX2/FMA/F16C.

use super::KernelElem;

pub(super) fn qk_tile<T: KernelElem>(tile: &[T], qrep: &[f32], d: usize, bs: usize, scores: &mut [f32]) {
    let x = T::DTYPE.x();
    let scores = &mut scores[..bs];
    scores.fill(0.0);
    for c in 0..d / x {
        let q = &qrep[c * 8..c * 8 + x];
        let row = &tile[c * bs * x..(c + 1) * bs * x];
        for (s, k) in scores.iter_mut().zip(row.chunks_exact(x)) {
            *s += k.iter().zip(q).map(|(a, b)| a.to_f32() * b).sum::<f32>();
        }
    }
}

pub(super) fn pv_tile<T: KernelElem>(tile: &[T], p: &[f32], d: usize, bs: usize, acc: &mut [f32]) {
    let p = &p[..bs];
    for (a, row) in acc[..d].iter_mut().zip(tile.chunks_exact(bs)) {
        *a += row.iter().zip(p).map(|(v, w)| v.to_f32() * w).sum::<f32>();
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
