//! `x·Wᵀ` for batches of tokens (prefill and batched decode) over the integer-code formats
//! with int16 activations: on AVX-512 VNNI `vpdpwssd` (32 multiply-adds per instruction where
//! an f32 FMA does 16, [`avx512`]), on AVX2 `vpmaddwd` + `vpaddd` (16 per two, where an f32
//! FMA does 8, [`avx2`]). The compute-bound twin of `int16` (which serves decode):
//!
//! - Activations: each token's groups of 32 rounded once per call to int16 with one scale per
//!   group ([`quantize_group`], the same rule as `int16`), laid out as `linear::token_lanes`
//!   lays out f32 panels: `[k/2][32 tokens]` pairs of words, so one zmm load holds one pair of
//!   codes of 16 tokens (a ymm load, of 8).
//! - Weights: each block of [`TN`] rows decoded per call into int16 codes with one scale (and,
//!   for the offset formats, one offset) per group ([`RowCodes`]); a pair of a row's codes is
//!   broadcast from there into every token lane. Centred formats (Q4_0, Q5_0, Q8_0, Q6_K) store
//!   `q − centre`, so their value is `d·code`; offset formats (Q4_1, Q5_1, Q4_K, Q5_K) `d·q + m`,
//!   the offset multiplied into the exact f32 group sums of the activations. The codes come
//!   straight from the bytes (no f32 round trip).
//! - Each group's integer sums are exact (|code·x| < 2¹⁵·2⁷, 32 to a group) and scaled once by
//!   `d·dx` into f32 accumulators: per group of 32 (Q6_K: of 16, its sub-block) the only
//!   rounding besides f32 sums is the activations' (2⁻¹⁶ of each group's largest).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
pub(super) mod tests;

use std::cell::RefCell;

use rayon::prelude::*;

use super::{GgmlType, Out, PartRef};
use crate::Isa;

/// Tokens per activation panel (two zmm registers of lanes).
const TM: usize = 32;
/// Weight rows decoded at a time: two AVX-512 micro-tiles, three AVX2 ones.
const TN: usize = 12;

/// Whether this path takes format `ty`: the formats `int16` takes, so that decode and
/// batches round a weight's activations alike.
pub(super) use super::int16::supports;

/// Whether this path has kernels for `isa` (one this CPU runs): every x86 one, `vpdpwssd`'s
/// where the CPU has AVX-512 VNNI ([`vnni`]), `vpmaddwd` + `vpaddd` otherwise.
pub(super) fn runs_on(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa != Isa::Portable
}

/// Whether `isa` takes the AVX-512 VNNI kernels.
pub(super) fn vnni(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa == Isa::Avx512 && crate::isa::avx512_vnni();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Values per scale of format `ty`: Q6_K scales each 16, the others each 32.
fn group_len(ty: GgmlType) -> usize {
    if ty == GgmlType::Q6_K { 16 } else { 32 }
}

/// Whether format `ty` has an offset per group (`value = d·q + m`).
fn has_offset(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_1 | Q5_1 | Q4_K | Q5_K)
}

/// The rounding rule, one group of 32 activations as int16 codes `x ≈ dx·code` with
/// `dx = max|x| / 32767` (to nearest, ties to even), its scale and its f32 sum: the tests'
/// statement of what [`avx512::quantize_tokens`] computes. A group holding a NaN or an infinity
/// gets a NaN scale, so its products come out NaN as the f32 path's would; an all-tiny group
/// (every |x| < 1e-30, whose products vanish in any f32 output) gets no codes.
#[cfg(test)]
pub(super) fn quantize_group(x: &[f32]) -> ([i16; 32], f32, f32) {
    let x = &x[..32];
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let sum: f32 = x.iter().sum();
    if !sum.is_finite() || amax < 1e-30 {
        return ([0; 32], if sum.is_finite() { 0.0 } else { f32::NAN }, sum);
    }
    let inv = 32767.0 / amax;
    // |x·inv| ≤ 32767 up to a rounding, which the saturating cast absorbs.
    (std::array::from_fn(|i| (x[i] * inv).round_ties_even() as i16), amax / 32767.0, sum)
}

/// The activations of one call in this path's layout (module doc), for `blocks` panels of
/// [`TM`] tokens: words `[block][k/2][TM][2]`, and per group `[block][k/32][TM]` the scales
/// `dx` and the f32 sums. The lanes of tokens past the last hold stale values, whose products
/// nobody reads.
pub(super) struct Acts16 {
    words: Vec<i16>,
    dx: Vec<f32>,
    sums: Vec<f32>,
    k: usize,
}

impl Acts16 {
    /// `m` tokens of `k` activations (`k` a multiple of 32), into buffers reused across calls
    /// (fresh ones per call were fresh pages, each zeroed by the kernel on first touch).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn quantize(isa: Isa, x: &[f32], m: usize, k: usize) -> Acts16 {
        assert!(k.is_multiple_of(32) && x.len() >= m * k, "Acts16::quantize: {m} tokens of {k}");
        assert!(runs_on(isa) && isa.is_available(), "Acts16::quantize: no kernels for {isa:?} here");
        let (blocks, groups) = (m.div_ceil(TM), k / 32);
        let mut acts = SPARE.take().unwrap_or_else(|| Acts16 { words: vec![], dx: vec![], sums: vec![], k });
        acts.k = k;
        // Resized, not cleared: the lanes of tokens past the last keep what an earlier call left
        // there (the tiles compute them and never write them out); clearing would be a memset
        // of every word on every call.
        acts.dx.resize(blocks * groups * TM, 0.0);
        acts.sums.resize(blocks * groups * TM, 0.0);
        acts.words.resize(blocks * k * TM, 0);
        let Acts16 { words, dx, sums, .. } = &mut acts;
        let per_block = words
            .par_chunks_mut(k * TM)
            .zip(dx.par_chunks_mut(groups * TM))
            .zip(sums.par_chunks_mut(groups * TM));
        per_block.enumerate().for_each(|(b, ((words, dx), sums))| {
            let tokens = TM.min(m - b * TM);
            for t0 in (0..tokens).step_by(16) {
                let n = (tokens - t0).min(16);
                let x = &x[(b * TM + t0) * k..][..n * k];
                // SAFETY: AVX-512F/BW (vnni) or AVX2/FMA/F16C run here (asserted); tokens
                // b·TM + t0 .. + n have k values each in x; the panel's buffers have this
                // block's sizes; t0 + 16 ≤ TM.
                unsafe {
                    if vnni(isa) {
                        avx512::quantize_tokens(x, n, k, t0, words, dx, sums)
                    } else {
                        avx2::quantize_tokens(x, n, k, t0, words, dx, sums)
                    }
                };
            }
        });
        acts
    }

    /// Hands the buffers back for the next call on this thread.
    pub(super) fn recycle(self) {
        SPARE.set(Some(self));
    }

    /// Panel `b`'s words, scales and sums.
    fn panel(&self, b: usize) -> (&[i16], &[f32], &[f32]) {
        let (k, groups) = (self.k, self.k / 32);
        (
            &self.words[b * k * TM..][..k * TM],
            &self.dx[b * groups * TM..][..groups * TM],
            &self.sums[b * groups * TM..][..groups * TM],
        )
    }

    /// Token panels.
    fn blocks(&self) -> usize {
        self.dx.len() / (self.k / 32 * TM).max(1)
    }
}

/// Up to [`TN`] rows of a part decoded for the kernels: `codes[r][k]`, `d[r][k/G]` (`G` the
/// format's [`group_len`]) and, for offset formats, `m[r][k/32]`.
#[derive(Default)]
pub(super) struct RowCodes {
    codes: Vec<i16>,
    d: Vec<f32>,
    m: Vec<f32>,
}

thread_local! {
    /// The last call's activation buffers, reused by the next on the same thread.
    static SPARE: RefCell<Option<Acts16>> = const { RefCell::new(None) };
    /// Each worker thread's decoded rows, reused across calls.
    static ROWS: RefCell<RowCodes> = RefCell::new(RowCodes::default());
}

impl RowCodes {
    /// Rows `j0..j1` of `part` into `self`.
    #[cfg(target_arch = "x86_64")]
    fn decode(&mut self, part: &PartRef<'_>, j0: usize, j1: usize) {
        let k = part.cols;
        let (gl, rows) = (group_len(part.ty), j1 - j0);
        self.codes.resize(rows * k, 0);
        self.d.resize(rows * k / gl, 0.0);
        self.m.resize(rows * k / 32, 0.0);
        for (i, r) in (j0..j1).enumerate() {
            let row = part.row(r);
            let (d, m, codes) = (
                &mut self.d[i * k / gl..][..k / gl],
                &mut self.m[i * k / 32..][..k / 32],
                &mut self.codes[i * k..][..k],
            );
            macro_rules! direct {
                ($F:ty) => {
                    // SAFETY: `runs_on(isa)` holds for every caller (AVX2, FMA, F16C); the row is
                    // k / 32 groups of the format; the slices have k codes, k / 32 offsets and
                    // k / gl scales.
                    unsafe { avx2::direct_codes::<$F>(row.as_ptr(), d, m, codes) }
                };
            }
            with_codes!(part.ty, direct, "lanes16")
        }
    }
}

/// One output tile: a token panel of the activations times decoded rows (each ISA's module
/// runs it).
struct Tile<'a> {
    /// The panel's words `[k/2][TM][2]`, scales and sums `[k/32][TM]`.
    acts: (&'a [i16], &'a [f32], &'a [f32]),
    rows: &'a RowCodes,
    k: usize,
    ty: GgmlType,
    /// The tile's tokens' output rows from the first decoded row's column.
    out: crate::linear::TileOut,
}

/// Tokens per cache block for rows of `k`: their panels (`k·2` bytes a token) stay within
/// ~512 KiB of L2 while every row block runs over them; a multiple of [`TM`], 64 to 256.
fn cache_tokens(k: usize) -> usize {
    ((512 << 10) / (2 * k.max(1))).clamp(2 * TM, 8 * TM) / TM * TM
}

/// `out[t, r] (+)= x[t] · row r` for every token of `acts` and row of `part`; `false` (nothing
/// done) where this path does not run (the portable `isa`, another format, `k % 32 ≠ 0`).
pub(super) fn matmul(
    isa: Isa,
    out: Out,
    acts: &Acts16,
    m: usize,
    part: &PartRef<'_>,
    accumulate: bool,
) -> bool {
    let k = part.cols;
    if !runs_on(isa) || !supports(part.ty) || k != acts.k || acts.blocks() < m.div_ceil(TM) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let n = part.rows;
        let wide = vnni(isa);
        let per_cache = cache_tokens(k) / TM;
        let row_blocks = n.div_ceil(TN);
        let per_task = row_blocks.div_ceil(rayon::current_num_threads().max(1) * 8).max(1);
        for b0 in (0..m.div_ceil(TM)).step_by(per_cache) {
            let b1 = (b0 + per_cache).min(m.div_ceil(TM));
            (0..row_blocks.div_ceil(per_task)).into_par_iter().for_each(|task| {
                // Taken, not borrowed: a rayon wait inside may run another call on this thread.
                let mut rows = ROWS.take();
                for rb in task * per_task..((task + 1) * per_task).min(row_blocks) {
                    let (j, nb) = (rb * TN, (n - rb * TN).min(TN));
                    rows.decode(part, j, j + nb);
                    // The next block's bytes on their way while this one's tiles run: the
                    // decoding above is a burst of loads with nothing to overlap them.
                    part.prefetch_rows(j + nb, j + nb + TN);
                    for b in b0..b1 {
                        let tile = Tile {
                            acts: acts.panel(b),
                            rows: &rows,
                            k,
                            ty: part.ty,
                            out: crate::linear::TileOut {
                                ptr: out.ptr.get().wrapping_add(b * TM * out.ldd + j),
                                ldo: out.ldd,
                                tokens: (m - b * TM).min(TM),
                                accumulate,
                            },
                        };
                        // SAFETY: `runs_on(isa)` (and VNNI for the zmm kernels); the tile's rows
                        // (nb of the decoded ones) and its tokens' output rows lie inside the
                        // part's region, which only this task writes in columns j..j+nb.
                        unsafe { if wide { tile.run512(nb) } else { tile.run256(nb) } };
                    }
                }
                ROWS.set(rows);
            });
        }
    }
    true
}

/// `matmul` for a whole weight's quantized parts when all of them take this path: the
/// activations rounded once. `false` (nothing done) otherwise.
pub(super) fn matmul_parts(
    isa: Isa,
    x: &[f32],
    m: usize,
    parts: &[(PartRef<'_>, Out)],
    accumulate: bool,
) -> bool {
    let Some(k) = parts.first().map(|(p, _)| p.cols) else { return false };
    if !runs_on(isa) || !k.is_multiple_of(32) || !parts.iter().all(|(p, _)| supports(p.ty)) {
        return false;
    }
    #[cfg(not(target_arch = "x86_64"))]
    return (x, m, accumulate).0.is_empty(); // unreachable: no kernels off x86
    #[cfg(target_arch = "x86_64")]
    let acts = Acts16::quantize(isa, x, m, k);
    for (part, out) in parts {
        let done = matmul(isa, *out, &acts, m, part, accumulate);
        debug_assert!(done, "lanes16: a checked part was refused");
    }
    acts.recycle();
    true
}
