//! `dst[m, n] (+)= x[m, k] · w[n, k]ᵀ` for batches of tokens with the tokens in the vector
//! lanes (AVX-512 and AVX2; callers fall back to `gemm` on the portable path). The activations
//! are transposed per call into panels `[k][32 tokens]` — cheap, since a batch of activations
//! is small next to the weights — and each weight element is broadcast straight from the
//! row-major weights. So the constant weights are neither repacked every call (what `gemm`
//! does with its right-hand side) nor stored twice. Micro-tiles: on AVX-512 32 tokens × 12
//! weight rows (24 zmm accumulators, one weight broadcast feeding two FMAs); on AVX2 16 tokens
//! × 6 rows (12 of the 16 ymm registers). The weight rows come from a [`WeightRows`]: f32 rows
//! in place, or (for `quant`) each block of 12 rows dequantized into a small per-thread buffer
//! just before the tiles that use them.

use std::cell::RefCell;

use rayon::prelude::*;

use super::OutPtr;
use crate::Isa;

/// Tokens per micro-tile (two zmm registers of lanes).
const TM: usize = 32;
/// Weight rows per micro-tile.
const TN: usize = 12;
/// Tokens per cache block: their transposed panels stay in L2 while every weight row block
/// of a rayon task runs over them.
const MC: usize = 128;

/// Whether `isa` has a tokens-in-lanes kernel (AVX2 and AVX-512) and this CPU runs it.
#[inline]
pub(crate) fn runs_on(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa != Isa::Portable && isa.is_available()
}

thread_local! {
    /// Transposed activation panels, reused across calls (grows to the largest block once).
    static PANELS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The current row block's weight rows when a [`WeightRows`] makes them (dequantization).
    static ROWS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where the weight rows of a micro-tile come from.
pub(crate) trait WeightRows: Sync {
    /// Rows `j0..j1` as `(j1 − j0)·k` contiguous floats: borrowed in place, or written into
    /// `scratch` (grown as needed) and borrowed from it. Asked for one row block (up to `TN`
    /// rows) at a time, so rows that are made are still in L1/L2 when the tiles read them:
    /// dequantizing a whole task's rows (up to 1 MiB) first and reading them back was ~5 %
    /// slower for batch-64 decode.
    fn rows<'a>(&'a self, j0: usize, j1: usize, scratch: &'a mut Vec<f32>) -> &'a [f32];

    /// Starts fetching what [`Self::rows`] will read for rows `j0..j1` (clamped to the
    /// weight), while the tiles of the rows before them compute.
    fn prefetch(&self, _j0: usize, _j1: usize) {}
}

/// Row-major f32 weights `[n, k]`.
struct F32Rows<'w> {
    w: &'w [f32],
    k: usize,
}

impl WeightRows for F32Rows<'_> {
    fn rows<'a>(&'a self, j0: usize, j1: usize, _: &'a mut Vec<f32>) -> &'a [f32] {
        &self.w[j0 * self.k..j1 * self.k]
    }
}

/// See the module doc. Returns `false` (and does nothing) when the CPU lacks AVX2.
pub fn token_lanes_linear(
    dst: &mut [f32],
    x: &[f32],
    w: &[f32],
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
) -> bool {
    assert!(dst.len() >= m * n && x.len() >= m * k && w.len() >= n * k, "token_lanes_linear: short buffer");
    // SAFETY: dst holds m rows of n floats (asserted).
    unsafe {
        token_lanes_rows(
            Isa::detected(),
            OutPtr(dst.as_mut_ptr()),
            n,
            x,
            &F32Rows { w, k },
            m,
            n,
            k,
            accumulate,
        )
    }
}

/// [`token_lanes_linear`] with the output's rows `ldo` floats apart and the weight rows from
/// `w`, on `isa`'s kernel. Returns `false` (and does nothing) unless [`runs_on`]`(isa)`.
///
/// # Safety
/// `out` addresses `m` rows (`ldo` apart) of `n` writable floats that nothing else touches
/// during the call; `x` holds `m·k` floats.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn token_lanes_rows(
    isa: Isa,
    out: OutPtr,
    ldo: usize,
    x: &[f32],
    w: &impl WeightRows,
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
) -> bool {
    assert!(x.len() >= m * k, "token_lanes_rows: short activations");
    if !runs_on(isa) {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    // Taken out of the thread-local rather than borrowed: while this thread waits for the
    // row-block tasks it may run another job that calls back in here (a second forward pass
    // on the same pool), which then simply allocates its own panels.
    let mut panels = PANELS.take();
    {
        let panels = &mut panels;
        for t0 in (0..m).step_by(MC) {
            let mc = (m - t0).min(MC);
            let blocks = mc.div_ceil(TM);
            if panels.len() < blocks * k * TM {
                panels.resize(blocks * k * TM, 0.0);
            }
            let panels = &mut panels[..blocks * k * TM];
            pack(isa, panels, &x[t0 * k..(t0 + mc) * k], mc, k);
            let panels = &*panels;
            let row_blocks = n.div_ceil(TN);
            let per_task = row_blocks.div_ceil(rayon::current_num_threads().max(1) * 8).max(1);
            (0..row_blocks.div_ceil(per_task)).into_par_iter().for_each(|task| {
                let (rb0, rb1) = (task * per_task, ((task + 1) * per_task).min(row_blocks));
                // Taken, not borrowed, for the same reason as the panels.
                let mut scratch = ROWS.take();
                for rb in rb0..rb1 {
                    let j = rb * TN;
                    let nb = (n - j).min(TN);
                    let rows = w.rows(j, j + nb, &mut scratch);
                    w.prefetch(j + TN, j + 2 * TN);
                    for b in 0..blocks {
                        let tb = (mc - b * TM).min(TM);
                        let panel = &panels[b * k * TM..(b + 1) * k * TM];
                        let tile_out = TileOut {
                            ptr: out.get().wrapping_add((t0 + b * TM) * ldo + j),
                            ldo,
                            tokens: tb,
                            accumulate,
                        };
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: `isa` runs here (checked above); rows j..j+nb, the panel and
                        // the output tile (t0+b·TM+tb ≤ m, j+nb ≤ n) are in bounds, and only
                        // this task writes columns j..j+nb.
                        unsafe {
                            if isa == Isa::Avx512 {
                                avx512::tile(panel, rows.as_ptr(), k, nb, tile_out);
                            } else {
                                avx2::tile(panel, rows.as_ptr(), k, nb, tile_out);
                            }
                        }
                    }
                }
                ROWS.set(scratch);
            });
        }
    }
    PANELS.set(panels);
    true
}

/// `panels[b][kk][i] = x[b·TM + i][kk]`, zero past the last token.
fn pack(isa: Isa, panels: &mut [f32], x: &[f32], mc: usize, k: usize) {
    panels.par_chunks_mut(k * TM).enumerate().for_each(|(b, panel)| {
        let rows = (mc - b * TM).min(TM);
        if rows < TM {
            panel.fill(0.0);
        }
        let x = &x[b * TM * k..(b * TM + rows) * k];
        // Whole 16 × 16 squares through registers (a scalar copy per value was ~1.6 % of a
        // batch-64 decode step), the last k % 16 columns one value at a time.
        #[cfg(target_arch = "x86_64")]
        let squares = if isa == Isa::Avx512 { k / 16 * 16 } else { 0 };
        #[cfg(not(target_arch = "x86_64"))]
        let squares = 0;
        #[cfg(target_arch = "x86_64")]
        for g in (0..rows).step_by(16) {
            for kk in (0..squares).step_by(16) {
                // SAFETY: `isa` is AVX-512, which runs here (else there are no squares); rows
                // g..g+n of x have columns kk..kk+16 (kk + 16 ≤ k); the panel has TM floats per
                // column, so lanes g..g+16 of columns kk..kk+16 lie inside it (g + 16 ≤ TM).
                unsafe {
                    avx512::transpose16(
                        x.as_ptr().add(g * k + kk),
                        k,
                        (rows - g).min(16),
                        panel.as_mut_ptr().add(kk * TM + g),
                        TM,
                    )
                };
            }
        }
        for (kk, lanes) in panel.chunks_exact_mut(TM).enumerate().skip(squares) {
            for (i, lane) in lanes.iter_mut().take(rows).enumerate() {
                *lane = x[i * k + kk];
            }
        }
    });
}

/// Where a micro-tile's sums go: `tokens` rows of the output from `ptr`, `ldo` floats apart,
/// written or (with `accumulate`) added to.
#[derive(Clone, Copy)]
pub(crate) struct TileOut {
    pub(crate) ptr: *mut f32,
    pub(crate) ldo: usize,
    pub(crate) tokens: usize,
    pub(crate) accumulate: bool,
}

impl TileOut {
    /// The same rows from column `c` on (no access happens here).
    pub(crate) fn column(self, c: usize) -> Self {
        Self { ptr: self.ptr.wrapping_add(c), ..self }
    }

    /// Rows `t..` of the tile, at most `n` of them (`t < tokens`; no access happens here).
    pub(crate) fn rows_from(self, t: usize, n: usize) -> Self {
        Self { ptr: self.ptr.wrapping_add(t * self.ldo), tokens: (self.tokens - t).min(n), ..self }
    }

    /// Writes `lanes[c][t]` (weight row `c`, token `t`) into row `t`, column `c`, for
    /// `t < min(tokens, L)`.
    ///
    /// # Safety
    /// `ptr` addresses `tokens` rows, `ldo` floats apart, of `R` writable floats.
    #[inline(always)]
    pub(crate) unsafe fn write<const R: usize, const L: usize>(self, lanes: &[[f32; L]; R]) {
        for t in 0..self.tokens.min(L) {
            // SAFETY: row t < tokens and column c < R lie in the tile (the contract).
            let row = unsafe { self.ptr.add(t * self.ldo) };
            for (c, l) in lanes.iter().enumerate() {
                // SAFETY: as above.
                let d = unsafe { &mut *row.add(c) };
                *d = if self.accumulate { *d + l[t] } else { l[t] };
            }
        }
    }
}

/// Floats ahead of the current step that each weight row prefetches.
#[cfg(target_arch = "x86_64")]
const PREFETCH_AHEAD: usize = 128;

/// The `kk` loop of both micro-kernels: `$step(&mut $acc, kk)` for every `kk < $k`, and every
/// 16 steps a prefetch of each of the `$rows` weight rows from `$w` (rows `$k` floats apart)
/// [`PREFETCH_AHEAD`] floats on: each row is read one float per step, and a dozen slow streams
/// are more than the hardware prefetcher tracks well. Four steps a turn amortize the address
/// arithmetic of the strided broadcasts (a few integer µops per row per step, which compete
/// with the FMAs for ports): ~5 % faster batch-64 decode than one. Written out as four calls:
/// as a `for` loop over the four, LLVM hoisted the broadcasts out of it and spilled 24 of the
/// 32 zmm registers (35 % slower than not unrolling at all). Expands inside the caller's
/// `unsafe` block and target features.
#[cfg(target_arch = "x86_64")]
macro_rules! k_loop {
    ($acc:ident, $step:ident, $w:expr, $k:expr, $rows:expr) => {{
        let mut kk = 0;
        while kk + 4 <= $k {
            if kk % 16 == 0 {
                for c in 0..$rows {
                    _mm_prefetch::<_MM_HINT_T0>(
                        $w.wrapping_add(c * $k + kk + super::PREFETCH_AHEAD) as *const i8
                    );
                }
            }
            $step(&mut $acc, kk);
            $step(&mut $acc, kk + 1);
            $step(&mut $acc, kk + 2);
            $step(&mut $acc, kk + 3);
            kk += 4;
        }
        for kk in kk..$k {
            $step(&mut $acc, kk);
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{TM, TN, TileOut};

    /// Rows `0..n` (`n ≤ 16`) of 16 floats, `ld` apart from `src`, transposed: column `j`
    /// goes to the 16 floats at `dst + j·dld`, rows past `n` as zeros. Two rounds of
    /// unpacks interleave 2×2 and then 4×4 blocks inside each 128-bit lane; two rounds of
    /// 128-bit shuffles transpose the 4×4 grid of those lanes.
    ///
    /// # Safety
    /// AVX-512F; `src + i·ld .. + 16` readable for `i < n`, `dst + j·dld .. + 16` writable.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose16(src: *const f32, ld: usize, n: usize, dst: *mut f32, dld: usize) {
        // SAFETY: per the contract.
        unsafe {
            let r: [__m512; 16] = std::array::from_fn(|i| {
                if i < n { _mm512_loadu_ps(src.add(i * ld)) } else { _mm512_setzero_ps() }
            });
            // t[2p], t[2p+1]: rows 2p, 2p+1 interleaved (columns 4L, 4L+1 / 4L+2, 4L+3 of lane L).
            let t: [__m512; 16] = std::array::from_fn(|i| {
                let (a, b) = (r[i & !1], r[i | 1]);
                if i % 2 == 0 { _mm512_unpacklo_ps(a, b) } else { _mm512_unpackhi_ps(a, b) }
            });
            // u[4g + c], lane L: rows 4g..4g+4 of column 4L + c.
            let u: [__m512; 16] = std::array::from_fn(|i| {
                let (g, c) = (i / 4, i % 4);
                let (a, b) = (_mm512_castps_pd(t[4 * g + c / 2]), _mm512_castps_pd(t[4 * g + 2 + c / 2]));
                _mm512_castpd_ps(if c % 2 == 0 { _mm512_unpacklo_pd(a, b) } else { _mm512_unpackhi_pd(a, b) })
            });
            for c in 0..4 {
                let [u0, u1, u2, u3] = [u[c], u[4 + c], u[8 + c], u[12 + c]];
                // Lanes (0, 2) and (1, 3) of each pair, then of those: out lane g = u_g's lane L.
                let v0 = _mm512_shuffle_f32x4::<0x88>(u0, u1);
                let v1 = _mm512_shuffle_f32x4::<0xDD>(u0, u1);
                let v2 = _mm512_shuffle_f32x4::<0x88>(u2, u3);
                let v3 = _mm512_shuffle_f32x4::<0xDD>(u2, u3);
                let w = [
                    _mm512_shuffle_f32x4::<0x88>(v0, v2),
                    _mm512_shuffle_f32x4::<0x88>(v1, v3),
                    _mm512_shuffle_f32x4::<0xDD>(v0, v2),
                    _mm512_shuffle_f32x4::<0xDD>(v1, v3),
                ];
                for (l, &col) in w.iter().enumerate() {
                    _mm512_storeu_ps(dst.add((4 * l + c) * dld), col);
                }
            }
        }
    }

    /// One `tokens × nb` output tile from a transposed panel; `nb` of 12 takes the wide
    /// kernel, an edge tile goes one weight row at a time.
    ///
    /// # Safety
    /// CPU has AVX-512F; `panel` holds `k·TM` floats; `w` points at `nb` rows of `k`; `out`
    /// addresses its tokens' rows of `nb` columns.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile(panel: &[f32], w: *const f32, k: usize, nb: usize, out: TileOut) {
        // SAFETY: forwarded contract.
        unsafe {
            if nb == TN {
                if out.tokens > 16 {
                    micro::<TN, 2>(panel, w, k, out);
                } else {
                    micro::<TN, 1>(panel, w, k, out);
                }
            } else {
                for c in 0..nb {
                    micro::<1, 2>(panel, w.add(c * k), k, out.column(c));
                }
            }
        }
    }

    /// `NB` weight rows × `V·16` tokens: per `kk`, `V` panel loads and `NB` broadcasts
    /// feeding `NB·V` FMAs.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn micro<const NB: usize, const V: usize>(panel: &[f32], w: *const f32, k: usize, out: TileOut) {
        let mut acc = [[_mm512_setzero_ps(); V]; NB];
        let p = panel.as_ptr();
        // SAFETY (whole body): kk < k keeps panel reads below k·TM and weight reads inside
        // the NB rows; output writes stay inside the tile.
        unsafe {
            let step = |acc: &mut [[__m512; V]; NB], kk: usize| {
                let mut xv = [_mm512_setzero_ps(); V];
                for (v, x) in xv.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(p.add(kk * TM + v * 16));
                }
                for (c, a) in acc.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*w.add(c * k + kk));
                    for (s, &x) in a.iter_mut().zip(&xv) {
                        *s = _mm512_fmadd_ps(x, b, *s);
                    }
                }
            };
            k_loop!(acc, step, w, k, NB);
            let mut lanes = [[0.0f32; TM]; NB];
            for (l, a) in lanes.iter_mut().zip(&acc) {
                for (v, &s) in a.iter().enumerate() {
                    _mm512_storeu_ps(l.as_mut_ptr().add(v * 16), s);
                }
            }
            out.write(&lanes);
        }
    }
}

/// The AVX2 kernels: each 32-token panel as two halves of 16 tokens (two ymm registers).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{TM, TileOut};

    /// Weight rows per micro-tile: 6 rows × 16 tokens are 12 ymm accumulators, which with the
    /// two panel loads and one broadcast use 15 of the 16 registers.
    const NB: usize = 6;

    /// One `tokens × nb` output tile (`tokens ≤ TM`) from a transposed panel: per half of 16
    /// tokens, the rows six at a time and the last `nb % 6` one at a time.
    ///
    /// # Safety
    /// CPU has AVX2 and FMA; `panel` holds `k·TM` floats; `w` points at `nb` rows of `k`; `out`
    /// addresses its tokens' rows (at most `TM`) of `nb` columns.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile(panel: &[f32], w: *const f32, k: usize, nb: usize, out: TileOut) {
        debug_assert!(panel.len() >= k * TM && out.tokens <= TM);
        // SAFETY: forwarded contract; half·16 < tokens keeps the lanes and output rows inside.
        unsafe {
            for half in 0..out.tokens.div_ceil(16) {
                let (p, out) = (panel.as_ptr().add(half * 16), out.rows_from(half * 16, 16));
                let mut c = 0;
                while c + NB <= nb {
                    micro::<NB>(p, w.add(c * k), k, out.column(c));
                    c += NB;
                }
                for c in c..nb {
                    micro::<1>(p, w.add(c * k), k, out.column(c));
                }
            }
        }
    }

    /// `R` weight rows × 16 tokens (lanes `p[kk·TM .. kk·TM + 16]`): per `kk`, two panel loads
    /// and `R` broadcasts feeding `2R` FMAs; unrolled by four as the AVX-512 kernel is.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn micro<const R: usize>(p: *const f32, w: *const f32, k: usize, out: TileOut) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        // SAFETY (whole body): kk < k keeps panel reads below k·TM and weight reads inside
        // the R rows; output writes stay inside the tile (tokens ≤ 16 rows, R columns).
        unsafe {
            let step = |acc: &mut [[__m256; 2]; R], kk: usize| {
                let x0 = _mm256_loadu_ps(p.add(kk * TM));
                let x1 = _mm256_loadu_ps(p.add(kk * TM + 8));
                for (c, a) in acc.iter_mut().enumerate() {
                    let b = _mm256_broadcast_ss(&*w.add(c * k + kk));
                    a[0] = _mm256_fmadd_ps(x0, b, a[0]);
                    a[1] = _mm256_fmadd_ps(x1, b, a[1]);
                }
            };
            k_loop!(acc, step, w, k, R);
            let mut lanes = [[0.0f32; 16]; R];
            for (l, a) in lanes.iter_mut().zip(&acc) {
                _mm256_storeu_ps(l.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(l.as_mut_ptr().add(8), a[1]);
            }
            out.write(&lanes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `token_lanes_rows` on `isa` over f32 rows.
    fn run(
        isa: Isa,
        dst: &mut [f32],
        x: &[f32],
        w: &[f32],
        (m, n, k): (usize, usize, usize),
        acc: bool,
    ) -> bool {
        // SAFETY: dst holds m rows of n floats, x m·k floats.
        unsafe { token_lanes_rows(isa, OutPtr(dst.as_mut_ptr()), n, x, &F32Rows { w, k }, m, n, k, acc) }
    }

    /// On every ISA this CPU runs: token edges (1, 16, 17, 32, 33 and past a cache block), row
    /// edges (not a multiple of 12 or 6), odd k, accumulate or not; the portable path declines
    /// and leaves dst alone.
    #[test]
    fn matches_naive_on_every_edge_and_isa() {
        let shapes =
            [(1, 12, 3), (16, 13, 17), (17, 24, 64), (33, 25, 40), (300, 36, 9), (5, 7, 576), (64, 30, 640)];
        for isa in Isa::available() {
            for &(m, n, k) in &shapes {
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
                let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 7.0).collect();
                let want = crate::linear::naive_linear(&x, &w, m, n, k);
                let mut dst = vec![1.0; m * n];
                if !runs_on(isa) {
                    assert_eq!(isa, Isa::Portable);
                    assert!(!run(isa, &mut dst, &x, &w, (m, n, k), true));
                    assert!(dst.iter().all(|&d| d == 1.0));
                    continue;
                }
                let tol = 1e-3 * (k as f32).sqrt();
                assert!(run(isa, &mut dst, &x, &w, (m, n, k), true));
                for (d, e) in dst.iter().zip(&want) {
                    assert!((d - 1.0 - e).abs() < tol, "{isa:?} m={m} n={n} k={k}: {d} vs {e}");
                }
                assert!(run(isa, &mut dst, &x, &w, (m, n, k), false));
                for (d, e) in dst.iter().zip(&want) {
                    assert!((d - e).abs() < tol, "{isa:?} m={m} n={n} k={k}: {d} vs {e}");
                }
            }
        }
        // The public entry takes the detected ISA.
        let (m, n, k) = (20, 14, 33);
        let x = vec![0.5f32; m * k];
        let w = vec![0.25f32; n * k];
        let mut dst = vec![0.0; m * n];
        let detected = runs_on(Isa::detected());
        assert_eq!(token_lanes_linear(&mut dst, &x, &w, m, n, k, false), detected);
        if detected {
            assert!(dst.iter().all(|&d| (d - 0.125 * k as f32).abs() < 1e-4));
        }
    }
}
