//! `x·Wᵀ` over f32 weights: through `gemm`, a bandwidth-bound tiled kernel for a handful of
//! tokens (`small_m`), or with AVX2/AVX-512 the tokens-in-lanes kernel for batched decode
//! (`token_lanes`); and the pieces the quantized kernels share with it (the output pointer,
//! `gemm_into`, `dot`). All work on caller-provided buffers.

mod small_m;
mod token_lanes;

pub use small_m::small_m_linear;
pub use token_lanes::token_lanes_linear;
pub(crate) use token_lanes::{TileOut, WeightRows, runs_on as token_lanes_runs_on, token_lanes_rows};

/// Raw output pointer shared by the column-range tasks of the `x·Wᵀ` kernels; each task
/// writes only its own columns.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: tasks write disjoint `(token, column)` entries (their own column range).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// A method, so closures capture the whole (Send) wrapper, not its raw field.
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }

    /// The pointer `n` floats on (for a sub-range of columns); no access happens here.
    pub(crate) fn offset(self, n: usize) -> Self {
        Self(self.0.wrapping_add(n))
    }
}

/// Above this many tokens a projection goes through `gemm`'s packed kernels; at or below it
/// through [`small_m_linear`], which streams each weight row once for all tokens (decode is
/// bound by weight bandwidth, and packing would only add traffic).
pub const SMALL_M: usize = 8;

/// Up to this many tokens (on AVX2 and AVX-512 CPUs) a projection goes through [`token_lanes_linear`],
/// which never repacks the weights; above it `gemm`'s cache blocking wins.
pub const TOKEN_LANES_MAX_M: usize = 128;

/// `dst[m, n] (+)= x[m, k] · w[n, k]ᵀ`. `w` is row-major `[n, k]` (PyTorch `Linear` layout).
/// With `accumulate` the product is added to `dst` (used for the residual stream).
pub fn linear(dst: &mut [f32], x: &[f32], w: &[f32], m: usize, n: usize, k: usize, accumulate: bool) {
    assert!(dst.len() >= m * n && x.len() >= m * k && w.len() >= n * k, "linear: short buffer");
    if m == 0 {
        return;
    }
    if m <= SMALL_M {
        small_m_linear(dst, x, w, m, n, k, accumulate);
        return;
    }
    if m <= TOKEN_LANES_MAX_M && token_lanes_linear(dst, x, w, m, n, k, accumulate) {
        return;
    }
    // SAFETY: the slices hold at least m·n, m·k and n·k elements (asserted above).
    unsafe {
        gemm_into(
            OutPtr(dst.as_mut_ptr()),
            n,
            (x, k),
            m,
            k,
            w,
            n,
            accumulate,
            gemm_common::Parallelism::Rayon(0),
        )
    };
}

/// `dst[m, n] (+)= x[m, k] · w[n, k]ᵀ` with `dst`'s rows `ldd` and `x`'s rows `ldx` floats apart
/// (columns of wider matrices), through `gemm`'s packed kernels whatever the shape (for short
/// rows, `k` of a LoRA rank, where [`small_m_linear`]'s dot products would be mostly their
/// horizontal sums); `accumulate` adds to `dst`; on the pool with `parallel`, else on the calling
/// thread alone (products that already run side by side on the pool).
pub fn linear_strided(
    (dst, ldd): (&mut [f32], usize),
    (x, ldx): (&[f32], usize),
    w: &[f32],
    (m, n, k): (usize, usize, usize),
    (accumulate, parallel): (bool, bool),
) {
    let span = |ld: usize, cols: usize| if m == 0 { 0 } else { (m - 1) * ld + cols };
    assert!(
        ldd >= n && ldx >= k && dst.len() >= span(ldd, n) && x.len() >= span(ldx, k) && w.len() >= n * k,
        "linear_strided: short buffer"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst.chunks_mut(ldd).take(m).for_each(|row| row[..n].fill(0.0));
        }
        return;
    }
    let parallelism =
        if parallel { gemm_common::Parallelism::Rayon(0) } else { gemm_common::Parallelism::None };
    // SAFETY: `dst` holds m rows of n floats `ldd` apart, `x` m rows of k floats `ldx` apart and
    // `w` n·k (asserted), and `dst` is borrowed mutably for the call.
    unsafe { gemm_into(OutPtr(dst.as_mut_ptr()), ldd, (x, ldx), m, k, w, n, accumulate, parallelism) };
}

/// `out[m, n] (+)= x[m, k] · w[n, k]ᵀ` through `gemm`, with `out`'s rows `ldo` and `x`'s rows
/// `ldx` floats apart.
///
/// # Safety
/// `x` holds `m` rows of `k` floats `ldx` apart and `w` `n·k` floats; `out` addresses `m` rows
/// of `n` writable floats, `ldo` apart, that nothing else touches during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_into(
    out: OutPtr,
    ldo: usize,
    (x, ldx): (&[f32], usize),
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    accumulate: bool,
    parallelism: gemm_common::Parallelism,
) {
    // SAFETY: per the contract. gemm's micro-kernels want a column-major destination, so the
    // product is asked for transposed (as the `gemm` crate's front end does for a row-major
    // one): `outᵀ[n, m] = w[n, k] · xᵀ[k, m]`, `outᵀ` column-major with columns `ldo` apart,
    // `w` with rows `k` apart, `xᵀ` with columns `ldx` apart.
    unsafe {
        gemm_f32::gemm::f32::get_gemm_fn()(
            n,
            m,
            k,
            out.get(),
            ldo as isize,
            1,
            accumulate,
            w.as_ptr(),
            1,
            k as isize,
            x.as_ptr(),
            ldx as isize,
            1,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Tokens per pass when `m` tokens go through a kernel that takes at most `most` a pass: as few
/// passes as that allows, of as even a size as they can be (5 at 4 a pass: 3 + 2, not 4 + 1,
/// whose one-token pass does a whole pass's loads for one token).
pub(crate) fn tokens_per_even_pass(m: usize, most: usize) -> usize {
    m.div_ceil(m.div_ceil(most.max(1))).max(1)
}

/// Dot product with 16 independent accumulators so the compiler vectorises it.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0.0f32; L];
    let (ac, ar) = a.split_at(a.len() / L * L);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(L).zip(bc.chunks_exact(L)) {
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// The test oracle of every `x·Wᵀ` kernel here: a plain triple loop accumulating in `f64`.
#[cfg(test)]
pub(crate) fn naive_linear(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] =
                (0..k).map(|kk| f64::from(x[i * k + kk]) * f64::from(w[j * k + kk])).sum::<f64>() as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_matches_naive_for_small_and_large_m() {
        let (n, k) = (70, 37);
        for m in [1, 3, 5, 7, SMALL_M + 1, 40, TOKEN_LANES_MAX_M + 1] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 7.0).collect();
            let want = naive_linear(&x, &w, m, n, k);
            let mut dst = vec![1.0; m * n];
            linear(&mut dst, &x, &w, m, n, k, true);
            for (d, e) in dst.iter().zip(&want) {
                assert!((d - 1.0 - e).abs() < 1e-4, "m={m}: {d} vs {e}");
            }
            linear(&mut dst, &x, &w, m, n, k, false);
            for (d, e) in dst.iter().zip(&want) {
                assert!((d - e).abs() < 1e-4, "m={m}: {d} vs {e}");
            }
        }
    }

    #[test]
    fn linear_strided_reads_columns_of_a_wider_matrix() {
        let (n, k, ldx) = (70, 16, 40);
        for m in [1, 8, 33] {
            let wide: Vec<f32> = (0..m * ldx).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 7.0).collect();
            // Columns 10..26 of each row of `wide`.
            let x: Vec<f32> = wide.chunks_exact(ldx).flat_map(|r| r[10..10 + k].to_vec()).collect();
            let want = naive_linear(&x, &w, m, n, k);
            for parallel in [false, true] {
                let mut dst = vec![f32::NAN; m * n];
                linear_strided((&mut dst, n), (&wide[10..], ldx), &w, (m, n, k), (false, parallel));
                for (d, e) in dst.iter().zip(&want) {
                    assert!((d - e).abs() < 1e-4, "m={m}: {d} vs {e}");
                }
                // Added into columns 3.. of rows 80 wide.
                let mut wide_dst = vec![1.0; m * 80];
                linear_strided((&mut wide_dst[3..], 80), (&wide[10..], ldx), &w, (m, n, k), (true, parallel));
                for (i, row) in wide_dst.chunks(80).enumerate() {
                    assert!(
                        row[..3].iter().chain(&row[3 + n..]).all(|&v| v == 1.0),
                        "m={m}: outside columns"
                    );
                    for (d, e) in row[3..3 + n].iter().zip(&want[i * n..]) {
                        assert!((d - 1.0 - e).abs() < 1e-4, "m={m}: {d} vs 1 + {e}");
                    }
                }
            }
        }
    }
}
