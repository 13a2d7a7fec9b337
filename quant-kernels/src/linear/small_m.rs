//! `dst[m, n] (+)= x[m, k] · w[n, k]ᵀ` for a handful of tokens, straight from the row-major
//! weights: every weight row is streamed from memory once for all tokens, since decode is bound
//! by weight bandwidth and packing would only add traffic. The work is cut into tiles of up to
//! 4 tokens × 4 weight rows, each tile keeping one accumulator per (token, row) pair, so the
//! loads of four independent weight streams are in flight at once. AVX-512 when the CPU has it
//! (the crate's [`Isa`], detected at run time), otherwise a portable loop.

use rayon::prelude::*;

use super::OutPtr;
use crate::Isa;

/// Tokens per tile.
const MR: usize = 4;
/// Weight rows per tile.
const NR: usize = 4;

/// Weight rows per rayon task: enough tasks for work stealing to balance two to a few cores,
/// few enough that a task streams at least ~64 KB of weights (task overhead stays small).
fn rows_per_task(n: usize, k: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let by_balance = n.div_ceil(threads * 8);
    let by_size = (16 * 1024 / k.max(1)).max(1);
    by_balance.max(by_size).next_multiple_of(NR)
}

/// See the module doc. `dst`, `x`, `w` hold at least `m·n`, `m·k`, `n·k` floats.
pub fn small_m_linear(dst: &mut [f32], x: &[f32], w: &[f32], m: usize, n: usize, k: usize, accumulate: bool) {
    assert!(dst.len() >= m * n && x.len() >= m * k && w.len() >= n * k, "small_m_linear: short buffer");
    if m == 0 || n == 0 {
        return;
    }
    let isa = Isa::detected();
    let out = OutPtr(dst.as_mut_ptr());
    let per_task = rows_per_task(n, k);
    // (A one-token tile loads a weight vector per multiply-add.)
    let per_tile = super::tokens_per_even_pass(m, MR);
    (0..n.div_ceil(per_task)).into_par_iter().for_each(|task| {
        let j0 = task * per_task;
        let j1 = (j0 + per_task).min(n);
        let mut j = j0;
        while j < j1 {
            let nr = (j1 - j).min(NR);
            let mut t = 0;
            while t < m {
                let mr = (m - t).min(per_tile);
                let mut acc = [[0.0f32; NR]; MR];
                tile(isa, &x[t * k..], &w[j * k..], k, mr, nr, &mut acc);
                for (i, row) in acc.iter().enumerate().take(mr) {
                    for (c, &v) in row.iter().enumerate().take(nr) {
                        // SAFETY: (t+i, j+c) < (m, n) and only this task writes column j+c.
                        unsafe {
                            let d = out.get().add((t + i) * n + j + c);
                            *d = if accumulate { *d + v } else { v };
                        }
                    }
                }
                t += mr;
            }
            j += nr;
        }
    });
}

/// `acc[i][c] = Σ_kk x[i·k + kk] · w[c·k + kk]` for `i < mr`, `c < nr` (each in `1..=4`): the
/// AVX-512 kernel on [`Isa::Avx512`], a portable loop otherwise (AVX2 has no tile kernel of its
/// own; an `isa` this CPU lacks takes the loop too).
fn tile(isa: Isa, x: &[f32], w: &[f32], k: usize, mr: usize, nr: usize, acc: &mut [[f32; NR]; MR]) {
    assert!((1..=MR).contains(&mr) && (1..=NR).contains(&nr), "small_m tile: {mr} × {nr}");
    assert!(x.len() >= mr * k && w.len() >= nr * k, "small_m tile: short rows");
    match isa {
        // SAFETY: AVX-512F is available (checked); x and w hold mr and nr rows of k (asserted).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if isa.is_available() => unsafe { avx512::tile(x.as_ptr(), w.as_ptr(), k, mr, nr, acc) },
        _ => {
            for (i, row) in acc.iter_mut().enumerate().take(mr) {
                let xs = &x[i * k..(i + 1) * k];
                for (c, v) in row.iter_mut().enumerate().take(nr) {
                    *v = super::dot(xs, &w[c * k..(c + 1) * k]);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// Floats ahead of the current position that each weight stream prefetches.
    const PREFETCH_AHEAD: usize = 256;

    /// `acc[i][c] = Σ_kk x[i·k + kk] · w[c·k + kk]` for `i < mr`, `c < nr`, dispatched to the
    /// tile shape.
    ///
    /// # Safety
    /// `x` points at `mr·k` readable floats and `w` at `nr·k`; `mr, nr` in `1..=4`; the CPU
    /// supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile(
        x: *const f32,
        w: *const f32,
        k: usize,
        mr: usize,
        nr: usize,
        acc: &mut [[f32; NR]; MR],
    ) {
        // SAFETY: forwarded contract; each arm matches its const shape.
        unsafe {
            match (mr, nr) {
                (1, 4) => tile_n::<1, 4>(x, w, k, acc),
                (2, 4) => tile_n::<2, 4>(x, w, k, acc),
                (3, 4) => tile_n::<3, 4>(x, w, k, acc),
                (4, 4) => tile_n::<4, 4>(x, w, k, acc),
                // A short edge tile (the last rows of w): one row at a time.
                _ => {
                    for c in 0..nr {
                        let mut one = [[0.0f32; NR]; MR];
                        let wc = w.add(c * k);
                        match mr {
                            1 => tile_n::<1, 1>(x, wc, k, &mut one),
                            2 => tile_n::<2, 1>(x, wc, k, &mut one),
                            3 => tile_n::<3, 1>(x, wc, k, &mut one),
                            _ => tile_n::<4, 1>(x, wc, k, &mut one),
                        }
                        for (a, o) in acc.iter_mut().zip(&one) {
                            a[c] = o[0];
                        }
                    }
                }
            }
        }
    }

    /// The `M × N` tile: one zmm accumulator per (token, row), 16 floats of `k` per step,
    /// the tail of `k` through a masked load.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile_n<const M: usize, const N: usize>(
        x: *const f32,
        w: *const f32,
        k: usize,
        acc: &mut [[f32; NR]; MR],
    ) {
        let mut sums = [[_mm512_setzero_ps(); N]; M];
        let full = k / 16 * 16;
        let mut kk = 0;
        // SAFETY (whole body): every pointer stays below x + M·k and w + N·k; prefetches
        // are hints and may point anywhere.
        unsafe {
            while kk < full {
                let mut wv = [_mm512_setzero_ps(); N];
                for (c, v) in wv.iter_mut().enumerate() {
                    let p = w.add(c * k + kk);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD) as *const i8);
                    *v = _mm512_loadu_ps(p);
                }
                for (i, row) in sums.iter_mut().enumerate() {
                    let xv = _mm512_loadu_ps(x.add(i * k + kk));
                    for (s, &wc) in row.iter_mut().zip(&wv) {
                        *s = _mm512_fmadd_ps(xv, wc, *s);
                    }
                }
                kk += 16;
            }
            if kk < k {
                let mask: __mmask16 = (1u32 << (k - kk)) as u16 - 1;
                let mut wv = [_mm512_setzero_ps(); N];
                for (c, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_maskz_loadu_ps(mask, w.add(c * k + kk));
                }
                for (i, row) in sums.iter_mut().enumerate() {
                    let xv = _mm512_maskz_loadu_ps(mask, x.add(i * k + kk));
                    for (s, &wc) in row.iter_mut().zip(&wv) {
                        *s = _mm512_fmadd_ps(xv, wc, *s);
                    }
                }
            }
        }
        for (a, s) in acc.iter_mut().zip(&sums) {
            for (v, &sv) in a.iter_mut().zip(s) {
                *v = _mm512_reduce_add_ps(sv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tile shape and edge (k tails, partial token and row tiles), every ISA.
    #[test]
    fn matches_naive_on_every_edge() {
        for &(m, n, k) in
            &[(1, 1, 1), (1, 7, 15), (2, 9, 16), (3, 13, 33), (4, 16, 64), (5, 70, 37), (8, 35, 576)]
        {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 7.0).collect();
            let want = crate::linear::naive_linear(&x, &w, m, n, k);
            let mut dst = vec![1.0; m * n];
            small_m_linear(&mut dst, &x, &w, m, n, k, true);
            for (d, e) in dst.iter().zip(&want) {
                assert!((d - 1.0 - e).abs() < 1e-3, "m={m} n={n} k={k}: {d} vs {e}");
            }
            for isa in Isa::available() {
                for t in 0..m.div_ceil(MR) {
                    for j in 0..n.div_ceil(NR) {
                        let (mr, nr) = ((m - t * MR).min(MR), (n - j * NR).min(NR));
                        let mut acc = [[f32::NAN; NR]; MR];
                        tile(isa, &x[t * MR * k..], &w[j * NR * k..], k, mr, nr, &mut acc);
                        for (i, row) in acc.iter().enumerate().take(mr) {
                            for (c, v) in row.iter().enumerate().take(nr) {
                                let e = want[(t * MR + i) * n + j * NR + c];
                                assert!((v - e).abs() < 1e-3, "{isa:?} m={m} n={n} k={k}: {v} vs {e}");
                            }
                        }
                    }
                }
            }
        }
    }
}
