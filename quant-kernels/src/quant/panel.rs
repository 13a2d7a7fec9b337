//! `x·Wᵀ` for many tokens over a weight's parts: rows are dequantized into f32 and multiplied
//! into all tokens, so the dequantization is paid once per weight per step, not once per
//! token. With AVX2 or AVX-512 each block of 12 rows is dequantized into a per-thread buffer
//! just before `linear::token_lanes` multiplies it (activations transposed once per call), for
//! batched decode and prefill chunks alike (it beat dequantized slabs into `gemm` most where a
//! weight has few rows, as a down projection does). Past [`slabs_min_m`] tokens every part's
//! rows go into one slab of a few MB for one parallel `gemm` call ([`slabs`]); on the portable
//! path, below that, cache-sized panels of rows feed `gemm` one by one.

use std::cell::RefCell;

use rayon::prelude::*;

use super::{Out, PartRef};
use crate::Isa;
use crate::linear::{TOKEN_LANES_MAX_M, WeightRows, gemm_into, token_lanes_rows};

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

    fn prefetch(&self, j0: usize, j1: usize) {
        self.part.prefetch_rows(j0, j1);
    }
}

/// See the module doc: `out[t, r] (+)= x[t] · row r` for `t < m`, every row of `part`. On AVX2
/// or AVX-512 the dequantized rows feed `token_lanes` instead of `gemm` (the activations
/// transposed once per call, not packed again per panel).
pub(super) fn matmul(isa: Isa, out: Out, x: &[f32], m: usize, part: &PartRef<'_>, accumulate: bool) {
    let k = part.cols;
    assert!(x.len() >= m * k, "panel::matmul: short activations");
    if !via_token_lanes(isa, out, x, m, part, accumulate) {
        via_gemm(isa, out, x, m, part, accumulate);
    }
}

/// The rows dequantized per task into `token_lanes`; `false` (nothing done) on the portable path.
pub(super) fn via_token_lanes(
    isa: Isa,
    out: Out,
    x: &[f32],
    m: usize,
    part: &PartRef<'_>,
    accumulate: bool,
) -> bool {
    assert!(x.len() >= m * part.cols, "panel::via_token_lanes: short activations");
    let rows = Dequantized { isa, part };
    // SAFETY: `Weight::matmul` checked that the output holds m rows of ldd floats, of which
    // this part owns its columns; x holds m·k floats (asserted).
    unsafe { token_lanes_rows(isa, out.ptr, out.ldd, x, &rows, m, part.rows, part.cols, accumulate) }
}

/// Tokens above which a call takes [`slabs`], where the activations are large enough that
/// `gemm` runs near its best: on the portable path past `token_lanes`' range, with
/// `token_lanes` (which dequantizes each row again per cache block of tokens) past a 2 048-token
/// prefill chunk's half (measured: at 2 048 tokens the two are even, at 512 `token_lanes` wins
/// where a weight has few rows).
pub(super) fn slabs_min_m(isa: Isa) -> usize {
    if crate::linear::token_lanes_runs_on(isa) { 8 * TOKEN_LANES_MAX_M } else { TOKEN_LANES_MAX_M }
}

/// Most bytes of f32 rows one [`slabs`] pass dequantizes before multiplying them: SmolLM2's
/// largest weight but the embedding (gate + up, 7 MB) takes one pass.
const SLAB_BYTES: usize = 16 << 20;

thread_local! {
    /// The calling thread's slab, grown to the largest used and then reused (a fresh 7 MB
    /// allocation per call is fresh pages, each zeroed by the kernel on first touch).
    static SLAB: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[t, c] (+)= x[t] · row c` over the rows of every part in turn (their output columns
/// follow one another), for many tokens (prefill): the rows dequantized in parallel into an
/// f32 slab of up to [`SLAB_BYTES`], then one `gemm` call over the whole slab with rayon
/// inside it. `gemm` repacks the activations per call, and per 256-row panel ([`via_gemm`])
/// that and the short calls cost ~8 % of a 2 040-token prefill.
pub(super) fn slabs(isa: Isa, out: Out, x: &[f32], m: usize, parts: &[PartRef<'_>], accumulate: bool) {
    slabs_of(SLAB_BYTES, isa, out, x, m, parts, accumulate);
}

/// [`slabs`] with slabs of at most `slab_bytes` (at least one row): tests split small weights.
pub(super) fn slabs_of(
    slab_bytes: usize,
    isa: Isa,
    out: Out,
    x: &[f32],
    m: usize,
    parts: &[PartRef<'_>],
    accumulate: bool,
) {
    let Some(k) = parts.first().map(|p| p.cols) else { return };
    assert!(parts.iter().all(|p| p.cols == k) && x.len() >= m * k, "panel::slabs: short activations");
    // (part, row) of every output column.
    let columns: Vec<(usize, usize)> =
        parts.iter().enumerate().flat_map(|(i, p)| (0..p.rows).map(move |r| (i, r))).collect();
    let per_slab = (slab_bytes / (4 * k.max(1))).max(1);
    // Taken, not borrowed: `gemm`'s rayon tasks may run another forward pass's call on this
    // thread, which then allocates its own.
    let mut slab = SLAB.take();
    for (s, chunk) in columns.chunks(per_slab).enumerate() {
        if slab.len() < chunk.len() * k {
            slab.resize(chunk.len() * k, 0.0);
        }
        let w = &mut slab[..chunk.len() * k];
        w.par_chunks_mut(16 * k).zip(chunk.par_chunks(16)).for_each(|(dst, rows)| {
            for (&(i, r), d) in rows.iter().zip(dst.chunks_exact_mut(k)) {
                isa.dequantize_row(parts[i].ty, parts[i].row(r), d);
            }
        });
        let out = Out { ptr: out.ptr.offset(s * per_slab), ..out };
        // SAFETY: x holds m·k floats (asserted), the slab chunk.len()·k; `Weight::matmul`
        // checked that the output holds m rows of ldd floats, of which these columns are
        // the parts'.
        unsafe {
            gemm_into(
                out.ptr,
                out.ldd,
                (x, k),
                m,
                k,
                w,
                chunk.len(),
                accumulate,
                gemm_common::Parallelism::Rayon(0),
            )
        };
    }
    SLAB.set(slab);
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
                gemm_into(
                    out.ptr,
                    out.ldd,
                    (x, k),
                    m,
                    k,
                    panel,
                    r1 - r0,
                    accumulate,
                    gemm_common::Parallelism::None,
                )
            };
        });
    });
}

/// An f32 part of a multi-part weight: `gemm` straight into its columns of the wider output.
pub(super) fn f32_strided(out: Out, x: &[f32], m: usize, k: usize, w: &[f32], rows: usize, accumulate: bool) {
    assert!(x.len() >= m * k && w.len() >= rows * k, "f32_strided: short buffer");
    // SAFETY: as asserted; `Weight::matmul` checked the output region.
    unsafe {
        gemm_into(out.ptr, out.ldd, (x, k), m, k, w, rows, accumulate, gemm_common::Parallelism::Rayon(0))
    };
}
