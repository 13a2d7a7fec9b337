//! The AVX-512 VNNI batch kernel of the int8 path (calls of more than `DECODE_MAX_M` tokens):
//! tokens across the lanes, so that a group's integer sum stays in one lane through its
//! eight `vpdpbusd` (each a broadcast dword of four codes of a row times four activations of
//! sixteen tokens), with no sums across lanes; the f32 order is the decode kernels' (the module
//! doc of [`super`]), each of a token's eight accumulators a vector of sixteen tokens kept in
//! L1 (the step's group picks one at run time), added up by the same tree at the end.
//!
//! - Activations: [`Panels`] of [`TM`] tokens from the call's [`X8`], each token's codes as
//!   dwords transposed to `[k/4][TM]`, and per group (Q6_K: per 16) their scales and sums as
//!   `[group][TM]`; tokens past the last are zeros, computed and never written out.
//! - Weights: each task's block of [`RB`] rows decoded once into bytes (the signed formats'
//!   offset by 128, as for the decode kernel) and scales ([`Rows`]), then multiplied into
//!   every panel [`R`] rows at a time; a panel of sixteen tokens or fewer (a batched decode step
//!   of up to sixteen sequences) runs its one lane vector `2R` rows at a time.

use std::arch::x86_64::*;
use std::cell::RefCell;

use rayon::prelude::*;

use super::avx2::{group_bytes, step_scales};
use super::{STEP, X8};
use crate::quant::int16::{Codes, Layout};
use crate::quant::{Out, PartRef};

/// Tokens per lane vector.
const LANES: usize = 16;
/// Lane vectors per panel.
const TV: usize = 2;
/// Tokens per panel.
const TM: usize = LANES * TV;
/// Rows per micro-tile: `R × TV` integer accumulators in registers.
const R: usize = 4;
/// Rows each task decodes and multiplies into every panel.
const RB: usize = 16;

/// The activations of a call as the batch kernel reads them (module doc), `panels` of them.
pub(super) struct Panels {
    codes: Vec<i32>,
    dx: Vec<f32>,
    sx: Vec<f32>,
    sums: Vec<i32>,
    sums16: Vec<i32>,
    groups: usize,
    panels: usize,
}

/// One panel's slices of [`Panels`].
#[derive(Clone, Copy)]
struct Panel<'a> {
    codes: &'a [i32],
    dx: &'a [f32],
    sx: &'a [f32],
    sums: &'a [i32],
    sums16: &'a [i32],
}

impl Panels {
    /// The first `m` tokens of `xq` in panels.
    pub(super) fn new(xq: &X8, m: usize) -> Panels {
        let (groups, panels) = (xq.groups, m.div_ceil(TM));
        let mut p = Panels {
            codes: vec![0; panels * groups * 8 * TM],
            dx: vec![0.0; panels * groups * TM],
            sx: vec![0.0; panels * groups * TM],
            sums: vec![0; panels * groups * TM],
            sums16: vec![0; panels * 2 * groups * TM],
            groups,
            panels,
        };
        for t in 0..m {
            let (b, i) = (t / TM, t % TM);
            let q = &xq.q[t * xq.steps * 256..][..groups * 32];
            for (d, c) in q.chunks_exact(4).enumerate() {
                p.codes[(b * groups * 8 + d) * TM + i] =
                    i32::from_le_bytes([c[0], c[1], c[2], c[3]].map(|v| v as u8));
            }
            for g in 0..groups {
                let at = xq.at(t, g / STEP) + g % STEP;
                let i_g = (b * groups + g) * TM + i;
                (p.dx[i_g], p.sx[i_g], p.sums[i_g]) = (xq.dx[at], xq.sx[at], xq.sums[at]);
                let first: i32 = q[32 * g..][..16].iter().map(|&c| i32::from(c)).sum();
                p.sums16[(b * 2 * groups + 2 * g) * TM + i] = first;
                p.sums16[(b * 2 * groups + 2 * g + 1) * TM + i] = xq.sums[at] - first;
            }
        }
        p
    }

    fn panel(&self, b: usize) -> Panel<'_> {
        let g = self.groups;
        Panel {
            codes: &self.codes[b * g * 8 * TM..][..g * 8 * TM],
            dx: &self.dx[b * g * TM..][..g * TM],
            sx: &self.sx[b * g * TM..][..g * TM],
            sums: &self.sums[b * g * TM..][..g * TM],
            sums16: &self.sums16[b * 2 * g * TM..][..2 * g * TM],
        }
    }
}

/// A task's decoded rows: `codes[row][k]` as `vpdpbusd` takes them, `d[row][units]` (Q6_K's in
/// the order of `X8`'s units, sixteen per step) and `m[row][groups]`.
#[derive(Default)]
struct Rows {
    codes: Vec<u8>,
    d: Vec<f32>,
    m: Vec<f32>,
}

thread_local! {
    /// Each worker thread's decoded rows, reused across tasks and calls.
    static ROWS: RefCell<Rows> = RefCell::new(Rows::default());
}

/// Where the scale of group `g`'s 16 `h` (Q6_K) lies among a row's `d`, and the accumulator it
/// goes into (module doc of [`super`]).
#[inline(always)]
fn unit(g: usize, h: usize) -> (usize, usize) {
    let j = g % STEP;
    (2 * STEP * (g / STEP) + STEP * (j / 4) + 4 * h + j % 4, 4 * h + j % 4)
}

/// `((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`, lane by lane.
///
/// # Safety
/// AVX-512F (the callers' features).
#[inline(always)]
unsafe fn tree(a: &[__m512; STEP]) -> __m512 {
    // SAFETY: register operands only.
    unsafe {
        let s: [__m512; 4] = [
            _mm512_add_ps(a[0], a[4]),
            _mm512_add_ps(a[1], a[5]),
            _mm512_add_ps(a[2], a[6]),
            _mm512_add_ps(a[3], a[7]),
        ];
        _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]))
    }
}

/// Rows `j0..j0 + nb` of `part` (format `F`) into `rows`.
///
/// # Safety
/// AVX-512F/BW, AVX2, FMA, F16C; the rows lie in the part.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn decode<F: Codes>(part: &PartRef<'_>, j0: usize, nb: usize, rows: &mut Rows) {
    let (k, groups) = (part.cols, part.cols / 32);
    let units = if F::SPLIT { 2 * groups } else { groups };
    rows.codes.resize(nb * k, 0);
    rows.d.resize(nb * units, 0.0);
    rows.m.resize(nb * groups, 0.0);
    let flip = _mm256_set1_epi8(if F::LAYOUT == Layout::Signed { -128 } else { 0 });
    for i in 0..nb {
        let row = part.row(j0 + i).as_ptr();
        for s in 0..groups.div_ceil(STEP) {
            let n = (groups - STEP * s).min(STEP);
            let (mut d, mut m) = ([0.0f32; 2 * STEP], [0.0f32; STEP]);
            // SAFETY: groups 8s..8s + n lie in the row; their codes' 32 bytes each lie in
            // `codes`, the step's scales in the stack arrays.
            unsafe {
                for g in STEP * s..STEP * s + n {
                    let bytes = _mm256_xor_si256(group_bytes::<F>(row, g), flip);
                    _mm256_storeu_si256(rows.codes.as_mut_ptr().add(i * k + 32 * g).cast(), bytes);
                }
                let scales = step_scales::<F>(row, s, n);
                _mm256_storeu_ps(d.as_mut_ptr(), scales.d[0]);
                _mm256_storeu_ps(d.as_mut_ptr().add(STEP), scales.d[1]);
                _mm256_storeu_ps(m.as_mut_ptr(), scales.m);
            }
            if F::SPLIT {
                // K-quant rows are whole super-blocks: every step has its eight groups.
                rows.d[i * units + 2 * STEP * s..][..2 * STEP].copy_from_slice(&d);
            } else {
                rows.d[i * units + STEP * s..][..n].copy_from_slice(&d[..n]);
            }
            rows.m[i * groups + STEP * s..][..n].copy_from_slice(&m[..n]);
        }
    }
}

/// Where a tile's products go.
#[derive(Clone, Copy)]
struct Dest {
    out: Out,
    /// The tile's first row's column, and its panel's first token.
    col: usize,
    t0: usize,
    /// Tokens of the call: lanes from here on are padding.
    m: usize,
    accumulate: bool,
}

/// Dwords `p0..p0 + 4` of group `g` (16 values) of decoded rows `r0..r0 + NR` times the same
/// dwords of the panel's codes at `x`, added into `sums` (per row and token vector).
///
/// # Safety
/// AVX-512F/VNNI (the callers' features); the rows and the panel's group `g` lie in their
/// buffers.
#[inline(always)]
unsafe fn dots<const NR: usize, const V: usize>(
    x: *const i32,
    rows: &Rows,
    r0: usize,
    k: usize,
    g: usize,
    p0: usize,
    sums: &mut [[__m512i; V]; NR],
) {
    // SAFETY: per the contract.
    unsafe {
        for p in p0..p0 + 4 {
            let mut xv = [_mm512_setzero_si512(); V];
            for (v, xv) in xv.iter_mut().enumerate() {
                *xv = _mm512_loadu_si512(x.add((8 * g + p) * TM + LANES * v).cast());
            }
            for (r, sums) in sums.iter_mut().enumerate() {
                let w = rows.codes.as_ptr().add((r0 + r) * k + 32 * g + 4 * p);
                let wb = _mm512_set1_epi32((w as *const i32).read_unaligned());
                for (s, &xv) in sums.iter_mut().zip(&xv) {
                    *s = _mm512_dpbusd_epi32(*s, wb, xv);
                }
            }
        }
    }
}

/// Decoded rows `r0..r0 + NR` of `rows` times the sixteen-token vectors of `panel`: per group,
/// eight `vpdpbusd` per row and vector into integer lanes, the centre taken out, then one FMA
/// into the group's accumulator (two for Q6_K, one per 16) and, for the offset formats, one
/// into its offset accumulator.
///
/// # Safety
/// AVX-512F/BW/VNNI, AVX2, FMA, F16C; `r0 + NR` rows are decoded in `rows` for `F` and `k`;
/// `dest` addresses the tile's rows and the panel's tokens below `m`, which nothing else writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<F: Codes, const NR: usize, const V: usize>(
    panel: Panel<'_>,
    rows: &Rows,
    r0: usize,
    k: usize,
    dest: Dest,
) {
    let groups = k / 32;
    let units = if F::SPLIT { 2 * groups } else { groups };
    let centre_shift = if F::LAYOUT == Layout::Signed {
        7
    } else if F::CENTRE == 0 {
        0
    } else {
        F::CENTRE.trailing_zeros()
    };
    let mut acc = [[[_mm512_setzero_ps(); V]; STEP]; NR];
    let mut off = [[[_mm512_setzero_ps(); V]; STEP]; NR];
    let x = panel.codes.as_ptr();
    // SAFETY (whole loop): dwords 8g..8g + 8 of the panel's `[k/4][TM]` codes, group g's (and
    // its 16s') `[groups][TM]` scales and sums, rows r0..r0 + NR's codes, scales and offsets
    // all lie in their buffers.
    unsafe {
        for g in 0..groups {
            // First (and, for Q6_K, second) 16s' integer sums, per row and token vector; the
            // choice made here, at compile time, keeps both sets in registers.
            let mut first = [[_mm512_setzero_si512(); V]; NR];
            let mut second = [[_mm512_setzero_si512(); V]; NR];
            // The centre times the activations' sums taken out first: the sums start there.
            for v in 0..V {
                let lanes = g * TM + LANES * v;
                if F::SPLIT {
                    let at = panel.sums16.as_ptr().add(2 * g * TM + LANES * v);
                    let (a0, a1) = (_mm512_loadu_si512(at.cast()), _mm512_loadu_si512(at.add(TM).cast()));
                    let zero = _mm512_setzero_si512();
                    let start0 = _mm512_sub_epi32(zero, _mm512_slli_epi32::<7>(a0));
                    let start1 = _mm512_sub_epi32(zero, _mm512_slli_epi32::<7>(a1));
                    for (f, s) in first.iter_mut().zip(&mut second) {
                        (f[v], s[v]) = (start0, start1);
                    }
                } else if centre_shift != 0 {
                    let sums = _mm512_loadu_si512(panel.sums.as_ptr().add(lanes).cast());
                    let shift = _mm_cvtsi32_si128(centre_shift as i32);
                    let start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_sll_epi32(sums, shift));
                    for f in first.iter_mut() {
                        f[v] = start;
                    }
                }
            }
            dots::<NR, V>(x, rows, r0, k, g, 0, &mut first);
            dots::<NR, V>(x, rows, r0, k, g, 4, if F::SPLIT { &mut second } else { &mut first });
            let j = g % STEP;
            for v in 0..V {
                let lanes = g * TM + LANES * v;
                let dx = _mm512_loadu_ps(panel.dx.as_ptr().add(lanes));
                if F::SPLIT {
                    for (h, sums) in [&first, &second].into_iter().enumerate() {
                        let (u, lane) = unit(g, h);
                        for r in 0..NR {
                            let sc = _mm512_mul_ps(
                                _mm512_set1_ps(*rows.d.get_unchecked((r0 + r) * units + u)),
                                dx,
                            );
                            acc[r][lane][v] =
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][v]), sc, acc[r][lane][v]);
                        }
                    }
                } else {
                    for r in 0..NR {
                        let sc =
                            _mm512_mul_ps(_mm512_set1_ps(*rows.d.get_unchecked((r0 + r) * units + g)), dx);
                        acc[r][j][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first[r][v]), sc, acc[r][j][v]);
                    }
                }
                if F::OFFSET {
                    let sx = _mm512_loadu_ps(panel.sx.as_ptr().add(lanes));
                    for (r, off) in off.iter_mut().enumerate() {
                        let m = _mm512_set1_ps(*rows.m.get_unchecked((r0 + r) * groups + g));
                        off[j][v] = _mm512_fmadd_ps(m, sx, off[j][v]);
                    }
                }
            }
        }
    }
    for r in 0..NR {
        for v in 0..V {
            let (mut a, mut o) = ([_mm512_setzero_ps(); STEP], [_mm512_setzero_ps(); STEP]);
            for j in 0..STEP {
                (a[j], o[j]) = (acc[r][j][v], off[r][j][v]);
            }
            let mut lanes = [0.0f32; LANES];
            // SAFETY: register operands, and a store of sixteen floats into `lanes`.
            unsafe {
                let sum = if F::OFFSET { _mm512_add_ps(tree(&a), tree(&o)) } else { tree(&a) };
                _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
            }
            let t0 = dest.t0 + LANES * v;
            for (i, &value) in lanes.iter().enumerate().take(dest.m.saturating_sub(t0)) {
                // SAFETY: (t0 + i, col + r) is this tile's entry: a token of the call, a row of
                // the tile.
                unsafe { dest.out.put(t0 + i, dest.col + r0 + r, value, dest.accumulate) };
            }
        }
    }
}

/// Rows `j0..j0 + nb` of `part` (format `F`) decoded into `rows`, then times every panel.
///
/// # Safety
/// AVX-512F/BW/VNNI, AVX2, FMA, F16C; the rows lie in the part, whose columns are the
/// panels'; only this task writes those rows' columns of `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn block<F: Codes>(
    part: &PartRef<'_>,
    j0: usize,
    nb: usize,
    panels: &Panels,
    dest: Dest,
    rows: &mut Rows,
) {
    // SAFETY: forwarded contract (the tiles cover rows 0..nb of the decoded block, each
    // panel's tokens from b·TM).
    unsafe {
        decode::<F>(part, j0, nb, rows);
        for b in 0..panels.panels {
            let dest = Dest { col: j0, t0: b * TM, ..dest };
            // A panel of sixteen tokens or fewer (a 9- to 16-sequence decode step) runs its
            // first lane vector alone: the second would be all padding.
            // Its rows go twice as many to a tile: as many integer accumulators, and as many
            // chains of `vpdpbusd` to cover the instruction's latency.
            let one = dest.m - dest.t0 <= LANES;
            let mut r = 0;
            while one && r + 2 * R <= nb {
                tile::<F, { 2 * R }, 1>(panels.panel(b), rows, r, part.cols, dest);
                r += 2 * R;
            }
            while r + R <= nb {
                if one {
                    tile::<F, R, 1>(panels.panel(b), rows, r, part.cols, dest);
                } else {
                    tile::<F, R, TV>(panels.panel(b), rows, r, part.cols, dest);
                }
                r += R;
            }
            for r in r..nb {
                if one {
                    tile::<F, 1, 1>(panels.panel(b), rows, r, part.cols, dest);
                } else {
                    tile::<F, 1, TV>(panels.panel(b), rows, r, part.cols, dest);
                }
            }
        }
    }
}

/// `out[t, r] (+)= x[t] · row r` for the `m` tokens of `xq` and every row of each part (of
/// formats the int8 path takes, as many columns as `xq`), on AVX-512 VNNI.
///
/// # Safety
/// AVX-512F/BW/VNNI, AVX2, FMA, F16C are available; `xq` holds `m` tokens of each part's
/// columns; each part's `out` addresses `m` rows of its columns, which nothing else writes.
pub(super) unsafe fn matmul_parts(xq: &X8, m: usize, parts: &[(PartRef<'_>, Out)], accumulate: bool) {
    let panels = Panels::new(xq, m);
    let tasks: Vec<(usize, usize)> = parts
        .iter()
        .enumerate()
        .flat_map(|(i, (p, _))| (0..p.rows).step_by(RB).map(move |j0| (i, j0)))
        .collect();
    tasks.into_par_iter().for_each(|(i, j0)| {
        let (part, out) = (&parts[i].0, parts[i].1);
        let nb = RB.min(part.rows - j0);
        let dest = Dest { out, col: 0, t0: 0, m, accumulate };
        // Taken, not borrowed: a rayon wait inside may run another task on this thread.
        let mut rows = ROWS.take();
        macro_rules! run {
            ($F:ty) => {
                // SAFETY: per this function's contract; rows j0..j0 + nb are this task's.
                unsafe { block::<$F>(part, j0, nb, &panels, dest, &mut rows) }
            };
        }
        with_codes!(part.ty, run, "int8 batches");
        ROWS.set(rows);
    });
}
