//! `x·Wᵀ` for many tokens over one part: rows are dequantized into a per-thread f32 buffer
//! that stays in cache and multiplied into all tokens, so the dequantization is paid once per
//! weight per step, not once per token. On AVX-512 up to `TOKEN_LANES_MAX_M` tokens, each
//! task's rows feed `ops::token_lanes` (activations transposed once per call); otherwise
//! panels of rows feed `gemm`.

use std::cell::RefCell;

use rayon::prelude::*;

use super::{Isa, Out, PartRef};
use crate::ops::{TOKEN_LANES_MAX_M, WeightRows, gemm_into, token_lanes_available, token_lanes_rows};

/// Rows per panel for rows of `k` values: as many as fit in ~1 MiB (a panel stays in a core's
/// L2 while `gemm` reads it), at most 256 and at least 16. Wide panels matter: `gemm` packs
/// the activations again for every panel (at 64 rows, batch-64 decode spent as long packing
/// as dequantizing; 128 to 256 rows measured ~15% faster end to end).
fn panel_rows(k: usize) -> usize {
    ((1 << 20) / (4 * k.max(1))).clamp(16, 256) / 16 * 16
}

thread_local! {
    /// Each worker thread's panel buffer, grown to the largest panel seen and then reused.
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A part's rows dequantized on demand, for `token_lanes`.
struct Dequantized<'p> {
    isa: Isa,
    part: &'p PartRef<'p>,
}

impl WeightRows for Dequantized<'_> {
    fn rows<'a>(&'a self, j0: usize, j1: usize, scratch: &'a mut Vec<f32>) -> &'a [f32] {
        let k = self.part.cols;
        if scratch.len() < (j1 - j0) * k {
            scratch.resize((j1 - j0) * k, 0.0);
        }
        let rows = &mut scratch[..(j1 - j0) * k];
        for (r, dst) in (j0..j1).zip(rows.chunks_exact_mut(k)) {
            self.isa.dequantize_row(self.part.ty, self.part.row(r), dst);
        }
        rows
    }

    fn makes_rows(&self) -> bool {
        true
    }
}

/// See the module doc: `out[t, r] (+)= x[t] · row r` for `t < m`, every row of `part`. Up to
/// `TOKEN_LANES_MAX_M` tokens on AVX-512 the dequantized rows feed `token_lanes` instead of
/// `gemm` (the activations transposed once per call, not packed again per panel).
pub(super) fn matmul(isa: Isa, out: Out, x: &[f32], m: usize, part: &PartRef<'_>, accumulate: bool) {
    let k = part.cols;
    assert!(x.len() >= m * k, "panel::matmul: short activations");
    if !(m <= TOKEN_LANES_MAX_M && via_token_lanes(isa, out, x, m, part, accumulate)) {
        via_gemm(isa, out, x, m, part, accumulate);
    }
}

/// The rows dequantized per task into `token_lanes`; `false` (nothing done) without AVX-512.
pub(super) fn via_token_lanes(
    isa: Isa,
    out: Out,
    x: &[f32],
    m: usize,
    part: &PartRef<'_>,
    accumulate: bool,
) -> bool {
    assert!(x.len() >= m * part.cols, "panel::via_token_lanes: short activations");
    if !token_lanes_available() {
        return false;
    }
    let rows = Dequantized { isa, part };
    // SAFETY: `Weight::matmul` checked that the output holds m rows of ldd floats, of which
    // this part owns its columns; x holds m·k floats (asserted).
    unsafe { token_lanes_rows(out.ptr, out.ldd, x, &rows, m, part.rows, part.cols, accumulate) }
}

/// Panels of rows dequantized into `gemm`.
pub(super) fn via_gemm(isa: Isa, out: Out, x: &[f32], m: usize, part: &PartRef<'_>, accumulate: bool) {
    let k = part.cols;
    assert!(x.len() >= m * k, "panel::via_gemm: short activations");
    let per_panel = panel_rows(k);
    (0..part.rows.div_ceil(per_panel)).into_par_iter().for_each(|p| {
        let (r0, r1) = (p * per_panel, ((p + 1) * per_panel).min(part.rows));
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
            unsafe {
                gemm_into(out.ptr, out.ldd, x, m, k, panel, r1 - r0, accumulate, gemm::Parallelism::None)
            };
        });
    });
}

/// An f32 part of a multi-part weight: `gemm` straight into its columns of the wider output.
pub(super) fn f32_strided(out: Out, x: &[f32], m: usize, k: usize, w: &[f32], rows: usize, accumulate: bool) {
    assert!(x.len() >= m * k && w.len() >= rows * k, "f32_strided: short buffer");
    // SAFETY: as asserted; `Weight::matmul` checked the output region.
    unsafe { gemm_into(out.ptr, out.ldd, x, m, k, w, rows, accumulate, gemm::Parallelism::Rayon(0)) };
}
