//! `x·Wᵀ` for a few tokens over one quantized part: decode is bound by reading the weights,
//! so each row is dequantized group by group in registers and multiplied into every token
//! (four at a time) before the next group is read; nothing is written back but the dot
//! products.

use rayon::prelude::*;

use super::int16::{self, X16};
use super::{Activations, Isa, Out, PartRef};
use crate::ops::dot;

/// Rows per rayon task: about eight tasks per thread for work stealing to balance, and at
/// least ~16 KB of weights each so task overhead stays small.
fn rows_per_task(rows: usize, row_bytes: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let by_balance = rows.div_ceil(threads * 8);
    let by_size = (16 * 1024 / row_bytes.max(1)).max(1);
    by_balance.max(by_size).max(1)
}

/// Tokens one pass over a row serves.
const TOKENS_PER_PASS: usize = 4;

/// See the module doc: `out[t, r] (+)= x[t] · row r` for `t < m`, every row of `part`.
/// `xq`: the activations in int16 when the caller chose the integer kernels ([`int16`]),
/// which formats it [`int16::supports`] take.
pub(super) fn matmul(
    isa: Isa,
    xq: Option<&X16>,
    out: Out,
    x: &[f32],
    m: usize,
    part: &PartRef<'_>,
    accumulate: bool,
) {
    assert!(x.len() >= m * part.cols, "decode::matmul: short activations");
    let simd = isa != Isa::Portable && part.cols.is_multiple_of(32);
    #[cfg(target_arch = "x86_64")]
    if let Some(xq) = xq
        && simd
        && int16::supports(part.ty)
    {
        return matmul_int16(isa, out, xq, m, part, accumulate);
    }
    let group_sums: Vec<f32> =
        if simd { x[..m * part.cols].chunks_exact(32).map(|c| c.iter().sum()).collect() } else { Vec::new() };
    let acts = Activations { x, group_sums: &group_sums };
    for_each_pass(part, m, |rows, t, mr| match isa {
        // SAFETY: AVX2/FMA/F16C were detected for this variant; the rows are this task's,
        // tokens t..t+mr lie in x (asserted), whole groups of 32 per row.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if simd => unsafe { super::avx2::dot_rows_dyn(part, rows, acts, t, mr, out, accumulate) },
        // SAFETY: as above, for AVX-512F.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if simd => unsafe {
            super::avx512::dot_rows_dyn(part, rows, acts, t, mr, out, accumulate)
        },
        _ => portable_rows(part, rows, x, t, mr, out, accumulate),
    });
}

/// Calls `pass(rows, t, mr)` for every task's rows (tasks in parallel) and, within a task, for
/// each run of up to [`TOKENS_PER_PASS`] tokens `t..t+mr` of the `m`.
fn for_each_pass(part: &PartRef<'_>, m: usize, pass: impl Fn(std::ops::Range<usize>, usize, usize) + Sync) {
    let per_task = rows_per_task(part.rows, part.row_bytes());
    (0..part.rows.div_ceil(per_task)).into_par_iter().for_each(|task| {
        let rows = task * per_task..((task + 1) * per_task).min(part.rows);
        for t in (0..m).step_by(TOKENS_PER_PASS) {
            pass(rows.clone(), t, (m - t).min(TOKENS_PER_PASS));
        }
    });
}

/// [`matmul`] on activations rounded to int16 ([`int16`]).
#[cfg(target_arch = "x86_64")]
fn matmul_int16(isa: Isa, out: Out, xq: &X16, m: usize, part: &PartRef<'_>, accumulate: bool) {
    let wide = isa == Isa::Avx512 && int16::avx512_vnni();
    for_each_pass(part, m, |rows, t, mr| {
        // SAFETY: AVX2/FMA/F16C were detected for any SIMD Isa, AVX-512BW/VNNI for `wide`; the
        // rows are this task's, tokens t..t+mr lie in xq (quantized from m tokens), whole
        // groups of 32 per row, a format `int16::supports`.
        unsafe {
            if wide {
                int16::dot_rows_avx512(part, rows, xq, t, mr, out, accumulate)
            } else {
                int16::dot_rows_avx2(part, rows, xq, t, mr, out, accumulate)
            }
        }
    });
}

/// The portable path: each row dequantized by the scalar reference, then f32 dot products.
fn portable_rows(
    part: &PartRef<'_>,
    rows: std::ops::Range<usize>,
    x: &[f32],
    t0: usize,
    mr: usize,
    out: Out,
    accumulate: bool,
) {
    let k = part.cols;
    let mut row = vec![0.0f32; k];
    for r in rows {
        Isa::Portable.dequantize_row(part.ty, part.row(r), &mut row);
        for t in t0..t0 + mr {
            // SAFETY: (t, r) is this task's entry (t < m, r in its rows).
            unsafe { out.put(t, r, dot(&row, &x[t * k..(t + 1) * k]), accumulate) };
        }
    }
}
