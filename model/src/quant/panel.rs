//! `x·Wᵀ` for many tokens over one part: the rows are dequantized a panel at a time into a
//! per-thread f32 buffer that stays in cache, and `gemm` multiplies the panel into all
//! tokens, so the dequantization is paid once per weight per step, not once per token.

use std::cell::RefCell;

use rayon::prelude::*;

use super::{Isa, Out, PartRef};

/// Rows per panel: 64 rows of the widest SmolLM2 / Llama inputs (≤ 16 K values) keep a panel
/// within a core's L2, and give `gemm` a wide enough right-hand side.
const PANEL_ROWS: usize = 64;

thread_local! {
    /// Each worker thread's panel buffer, grown to the largest panel seen and then reused.
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// See the module doc: `out[t, r] (+)= x[t] · row r` for `t < m`, every row of `part`.
pub(super) fn matmul(isa: Isa, out: Out, x: &[f32], m: usize, part: &PartRef<'_>, accumulate: bool) {
    let k = part.cols;
    assert!(x.len() >= m * k, "panel::matmul: short activations");
    (0..part.rows.div_ceil(PANEL_ROWS)).into_par_iter().for_each(|p| {
        let (r0, r1) = (p * PANEL_ROWS, ((p + 1) * PANEL_ROWS).min(part.rows));
        PANEL.with_borrow_mut(|buf| {
            if buf.len() < (r1 - r0) * k {
                buf.resize((r1 - r0) * k, 0.0);
            }
            let panel = &mut buf[..(r1 - r0) * k];
            for (r, dst) in (r0..r1).zip(panel.chunks_exact_mut(k)) {
                isa.dequantize_row(part.ty, part.row(r), dst);
            }
            let out = Out { ptr: out.ptr.offset(r0), ..out };
            // SAFETY: x holds m·k floats (asserted), the panel (r1−r0)·k; this task owns
            // columns r0..r1 of the part's region of m rows × ldd.
            unsafe { gemm_into(out, x, m, k, panel, r1 - r0, accumulate, gemm::Parallelism::None) };
        });
    });
}

/// An f32 part of a multi-part weight: `gemm` straight into its columns of the wider output.
pub(super) fn f32_strided(out: Out, x: &[f32], m: usize, k: usize, w: &[f32], rows: usize, accumulate: bool) {
    assert!(x.len() >= m * k && w.len() >= rows * k, "f32_strided: short buffer");
    // SAFETY: as asserted; `Weight::matmul` checked the output region.
    unsafe { gemm_into(out, x, m, k, w, rows, accumulate, gemm::Parallelism::Rayon(0)) };
}

/// `out[m, n] (+)= x[m, k] · w[n, k]ᵀ` with `out` rows `out.ldd` apart.
///
/// # Safety
/// `x` and `w` hold `m·k` and `n·k` floats; `out` addresses `m` rows of `n` writable floats.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_into(
    out: Out,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    // SAFETY: per the contract; strides describe row-major `out[m, ldd]`, `x[m, k]` and
    // `wᵀ[k, n]` (element (kk, j) at j·k + kk).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.ptr.get(),
            1,
            out.ldd as isize,
            accumulate,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
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
