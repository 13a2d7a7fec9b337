//! The inner loops of attention over one (block, kv head) tile, per instruction set.
//!
//! Decode: two micro-kernels carry the work, `qk_rows` (scores of a few query rows against the
//! `block_size` keys of a tile, in the key layout `[head_size/x, block_size, x]`) and
//! `pv_blocks` (`acc += p · V` over value tiles `[head_size, block_size]`), plus a vectorized
//! `exp`. Prefill: the tiled step of `flash` (query rows in vector lanes), written once over
//! `lanes::Lanes`. The AVX2/FMA/F16C versions are chosen at run time, with AVX-512 versions on
//! CPUs that have it (the crate's one [`Isa`]); the portable ones are plain loops.

/// `match $v` over the values `$n` (and `$last` for any other), evaluating `$body` with `$C` a
/// `const` of the value matched, so that the kernel it calls is monomorphized per value.
#[cfg(target_arch = "x86_64")]
macro_rules! match_const {
    ($v:expr, [$($n:literal),*], $last:literal, |$C:ident| $body:expr) => {
        match $v {
            $($n => {
                const $C: usize = $n;
                $body
            })*
            _ => {
                const $C: usize = $last;
                $body
            }
        }
    };
}

/// [`match_const`] over the block sizes 8, 16 and 32.
#[cfg(target_arch = "x86_64")]
macro_rules! with_block_size {
    ($bs:expr, |$BS:ident| $body:expr) => {
        match_const!($bs, [8, 16], 32, |$BS| $body)
    };
}

/// Runs `$body` for each group of up to four of the `$nh` query heads, after `let $p = $e`,
/// with `$h0` the group's first head and `$H` a `const` of its size (1 to 4), so that each
/// kernel's accumulators stay in registers. `$ahead` is rebound to the prefetches for the first
/// group and to none for the others: they ride along the first pass over the tiles.
#[cfg(target_arch = "x86_64")]
macro_rules! for_head_groups {
    ($nh:expr, $ahead:ident, |$h0:ident, $H:ident| { let $p:pat = $e:expr; $body:expr }) => {{
        let mut $h0 = 0;
        while $h0 < $nh {
            let $p = $e;
            let $ahead = if $h0 == 0 { $ahead } else { $crate::simd::Ahead::none() };
            match_const!($nh - $h0, [1, 2, 3], 4, |$H| $body);
            $h0 += 4;
        }
    }};
}

/// Calls the micro-kernel `$f` of `$isa`'s module with `$args` and the prefetches `$ahead`, or,
/// without AVX2, the portable `$f` with `$args` alone, after issuing the prefetches at once.
macro_rules! by_isa {
    ($isa:expr, $ahead:ident, $f:ident($($arg:ident),*)) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only used after `is_available` said yes; the caller checked
            // the lengths.
            Isa::Avx2 => unsafe { x86::$f($($arg,)* $ahead) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for `Isa::Avx512`.
            Isa::Avx512 => unsafe { avx512::$f($($arg,)* $ahead) },
            _ => {
                $ahead.all();
                portable::$f($($arg),*)
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx512;
mod flash;
mod int8;
mod lanes;
mod portable;
mod widen;
#[cfg(target_arch = "x86_64")]
mod x86;

use half::{bf16, f16};
use kv_cache::CacheElem;

use crate::Isa;

pub(crate) use flash::{FlashTile, KvRun, ROW_ALIGN, STEP_KEYS, flash_step};
pub(crate) use int8::{QkInt8, qk_int8};
pub(crate) use widen::widen_masked;

/// Cache element types the micro-kernels can load as 8 (AVX2) or 16 (AVX-512) `f32` lanes.
pub(crate) trait KernelElem: CacheElem {
    /// Loads 8 consecutive elements widened to `f32`.
    ///
    /// # Safety
    /// `p .. p + 8` must be readable and the CPU must support AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;

    /// Loads 16 consecutive elements widened to `f32`.
    ///
    /// # Safety
    /// `p .. p + 16` must be readable and the CPU must support AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;

    /// The tile as int8 codes, for the int8 cache's own kernels (`None` for the float types).
    fn as_codes(tile: &[Self]) -> Option<&[i8]> {
        let _ = tile;
        None
    }
}

impl KernelElem for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees 8 readable elements and AVX support.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller guarantees 16 readable elements and AVX-512F.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

impl KernelElem for f16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: 8 readable f16 = 16 bytes; F16C is guaranteed by the caller.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: 16 readable f16 = 32 bytes; AVX-512F is guaranteed by the caller.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
}

impl KernelElem for bf16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: 8 readable bf16 = 16 bytes; AVX2 is guaranteed by the caller.
        // bf16 is the top half of an f32: widen to 32 bits and shift into place.
        unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()))))
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: 16 readable bf16 = 32 bytes; AVX-512F is guaranteed by the caller.
        unsafe {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()))))
        }
    }
}

/// int8 codes, widened as they are: the caller applies each token's scale (to its scores, and
/// folded into its probabilities for the values).
impl KernelElem for i8 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: 8 readable bytes; AVX2 is guaranteed by the caller.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: 16 readable bytes; AVX-512F is guaranteed by the caller.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))) }
    }

    fn as_codes(tile: &[Self]) -> Option<&[i8]> {
        Some(tile)
    }
}

/// int8's scales of one layer: keys `[num_blocks, kv_heads, groups, block_size]` (a scale per
/// token and group of `group` dims), values `[num_blocks, kv_heads, block_size]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scales<'a> {
    pub key: &'a [bf16],
    pub value: &'a [bf16],
    /// Dims per key scale.
    pub group: usize,
    /// Key scales per token and kv head.
    pub groups: usize,
}

impl<'a> Scales<'a> {
    /// The key scales (`[groups, block_size]`) and value scales (`[block_size]`) of (physical
    /// block, kv head).
    pub fn tile(
        &self,
        num_kv_heads: usize,
        block_size: usize,
        block: u32,
        kv_head: usize,
    ) -> (&'a [bf16], &'a [bf16]) {
        let v = (block as usize * num_kv_heads + kv_head) * block_size;
        let k = v * self.groups;
        (&self.key[k..k + self.groups * block_size], &self.value[v..v + block_size])
    }
}

/// `row[t] *= scales[t]`: a token's scale applied to its score or folded into its probability.
#[inline]
pub(crate) fn scale_by(row: &mut [f32], scales: &[bf16]) {
    for (v, s) in row.iter_mut().zip(scales) {
        *v *= s.to_f32();
    }
}

/// Length of the prepared query row for `qk_tile`: `head_size / x` chunks of 8 lanes.
pub(crate) fn qrep_len(head_size: usize, x: usize) -> usize {
    head_size / x * 8
}

/// Prepares one query row for `qk_tile`: scaled, each `x`-chunk repeated to fill 8 lanes
/// (for `x = 4` one 8-lane key load holds two tokens' chunks; for `x = 8`, one token's).
pub(crate) fn prepare_query(q: &[f32], scale: f32, x: usize, qrep: &mut [f32]) {
    for (c, chunk) in q.chunks_exact(x).enumerate() {
        for (lane, dst) in qrep[c * 8..c * 8 + 8].iter_mut().enumerate() {
            *dst = chunk[lane % x] * scale;
        }
    }
}

/// The query heads of one kv head that the decode micro-kernels run together: `nh` heads of
/// `d` dimensions over tiles of `bs` tokens, each head's row of scores (or probabilities)
/// `stride` floats after the previous head's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub nh: usize,
    pub d: usize,
    pub bs: usize,
    pub stride: usize,
}

/// What [`qk_rows`] scores: the heads' prepared query rows (`q_stride` apart in `qrep`: their
/// [`qrep_len`], or more where the call scores a slice of the dims) against the `bs` keys of one
/// key tile `[d/x, bs, x]`; head `i`'s scores go to `scores[i * stride .. i * stride + bs]`.
pub(crate) struct QkRows<'a, T> {
    pub heads: Heads,
    pub tile: &'a [T],
    pub qrep: &'a [f32],
    pub q_stride: usize,
    pub scores: &'a mut [f32],
}

/// What [`pv_blocks`] accumulates: head `i`'s probabilities for tile `j` are
/// `probs[i * stride + j * bs ..][..bs]` and its accumulator is `acc8[i * d * 8 ..][..d * 8]`.
pub(crate) struct PvBlocks<'a, T> {
    pub heads: Heads,
    pub tiles: &'a [&'a [T]],
    pub probs: &'a [f32],
    pub acc8: &'a mut [f32],
}

/// The scores of [`QkRows`]. Query heads of one kv head share every key load.
#[inline]
pub(crate) fn qk_rows<T: KernelElem>(isa: Isa, op: QkRows<'_, T>, ahead: Ahead<'_, T>) {
    let Heads { nh, d, bs, stride } = op.heads;
    let ql = qrep_len(d, T::DTYPE.x());
    assert!(nh > 0 && op.tile.len() >= d * bs && op.q_stride >= ql);
    assert!(op.qrep.len() >= (nh - 1) * op.q_stride + ql);
    assert!(stride >= bs && op.scores.len() >= (nh - 1) * stride + bs);
    by_isa!(isa, ahead, qk_rows(op))
}

/// Lane-wise `p · V` over several value tiles for all heads of [`PvBlocks`] at once:
/// `acc8[i][d][lane] += Σ_j Σ_k p_i[j][8k + lane] · tile_j[d][8k + lane]`. The 8 lanes are
/// summed once, by [`finish_rows`], so no horizontal reduction runs per block; every value load
/// serves all heads.
#[inline]
pub(crate) fn pv_blocks<T: KernelElem>(isa: Isa, op: PvBlocks<'_, T>, ahead: Ahead<'_, T>) {
    let Heads { nh, d, bs, stride } = op.heads;
    assert!(nh > 0 && stride >= op.tiles.len() * bs && op.acc8.len() >= nh * d * 8);
    assert!(op.probs.len() >= (nh - 1) * stride + op.tiles.len() * bs);
    assert!(op.tiles.iter().all(|t| t.len() >= d * bs));
    by_isa!(isa, ahead, pv_blocks(op))
}

/// `out[d] = scale · Σ_lane acc8[d][lane]`: the final reduction of [`pv_blocks`] accumulators.
#[inline]
pub(crate) fn finish_rows(isa: Isa, acc8: &[f32], scale: f32, out: &mut [f32]) {
    assert!(acc8.len() >= out.len() * 8);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2`/`Avx512` are only used after `is_available` said yes (the AVX-512
        // tier includes AVX2); lengths checked above.
        Isa::Avx2 | Isa::Avx512 if out.len().is_multiple_of(8) => unsafe {
            x86::finish_rows(acc8, scale, out)
        },
        _ => portable::finish_rows(acc8, scale, out),
    }
}

/// `v[i] = exp(v[i] - max)` in place; returns the sum.
#[inline]
pub(crate) fn exp_sub_sum(isa: Isa, v: &mut [f32], max: f32) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2`/`Avx512` are only used after `is_available` said yes (and AVX-512
        // implies AVX2 there).
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::exp_sub_sum(v, max) },
        _ => portable::exp_sub_sum(v, max),
    }
}

/// Asks the CPU to start loading `tile` into cache (the next block of a sequence sits anywhere
/// in the pool, so the hardware prefetcher cannot guess it). A hint only; no-op elsewhere.
#[inline]
pub(crate) fn prefetch<T>(tile: &[T]) {
    for byte in (0..std::mem::size_of_val(tile)).step_by(64) {
        prefetch_byte(tile, byte);
    }
}

/// Tiles a kernel should ask the CPU to start loading while it computes: the ones the caller
/// reaches next. Kernels that can spread the prefetches over their loop take a few lines per
/// iteration with [`Ahead::next`] (a burst of prefetches for a whole tile holds up the kernel's
/// own loads until the memory system has taken them); the others prefetch everything up front
/// with [`Ahead::all`].
#[derive(Clone, Copy)]
pub(crate) struct Ahead<'a, T> {
    tiles: &'a [&'a [T]],
    /// Cache lines per tile (all tiles are as long as the first).
    lines_per_tile: usize,
    /// Cursor: the next line to prefetch is line `line` of tile `tile`.
    tile: usize,
    line: usize,
}

impl<'a, T> Ahead<'a, T> {
    /// Nothing to prefetch.
    pub fn none() -> Self {
        Ahead { tiles: &[], lines_per_tile: 0, tile: 0, line: 0 }
    }

    pub fn new(tiles: &'a [&'a [T]]) -> Self {
        let lines_per_tile = tiles.first().map_or(0, |t| std::mem::size_of_val(*t).div_ceil(64));
        Ahead { tiles, lines_per_tile, tile: 0, line: 0 }
    }

    /// Cache lines in all tiles.
    #[inline(always)]
    pub fn lines(&self) -> usize {
        self.tiles.len() * self.lines_per_tile
    }

    /// Prefetches the next `n` lines (fewer once every tile is done), tile after tile; returns
    /// how many it prefetched.
    #[inline(always)]
    pub fn next(&mut self, n: usize) -> usize {
        for done in 0..n {
            let Some(tile) = self.tiles.get(self.tile) else { return done };
            prefetch_byte(tile, self.line * 64);
            self.line += 1;
            if self.line == self.lines_per_tile {
                self.line = 0;
                self.tile += 1;
            }
        }
        n
    }

    /// Prefetches every line now.
    #[inline(always)]
    pub fn all(mut self) {
        self.next(self.lines());
    }

    /// Where the cursor stands: (tile, line).
    #[cfg(test)]
    fn cursor(&self) -> (usize, usize) {
        (self.tile, self.line)
    }
}

/// Prefetches the cache line holding byte `byte` of `tile` (nothing past its end) into L2
/// (`_MM_HINT_T1`): a prefetch into L1 holds one of L1's few miss buffers until its line
/// arrives, so a stream of them held up the kernel's own loads of the tile it was on, while L2
/// tracks many more misses and the kernel's loads find the lines there.
#[inline(always)]
fn prefetch_byte<T>(tile: &[T], byte: usize) {
    #[cfg(target_arch = "x86_64")]
    if byte < std::mem::size_of_val(tile) {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        // SAFETY: prefetch never faults, and the address is inside the slice anyway; SSE is
        // baseline on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(tile.as_ptr().cast::<i8>().add(byte)) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (tile, byte);
}

/// Largest element (`-inf` for an empty slice); NaN-free input assumed.
#[inline]
pub(crate) fn max_of(v: &[f32]) -> f32 {
    // Eight running maxima so the compiler can keep them in one vector register.
    let mut m = [f32::NEG_INFINITY; 8];
    let chunks = v.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &b) in m.iter_mut().zip(c) {
            *a = a.max(b);
        }
    }
    tail.iter().chain(m.iter()).copied().fold(f32::NEG_INFINITY, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn naive_qk(tile: &[f32], q: &[f32], d: usize, bs: usize, x: usize) -> Vec<f32> {
        (0..bs).map(|t| (0..d).map(|i| tile[(i / x) * bs * x + t * x + i % x] * q[i]).sum()).collect()
    }

    fn check_isa<T: KernelElem>(isa: Isa) {
        let x = T::DTYPE.x();
        // int8 codes span -127 ..= 127; the others hold values in -1 .. 1.
        let amp = if T::DTYPE == kv_cache::DType::Int8 { 120.0 } else { 1.0 };
        let mut seed = 7;
        for d in [64, 80, 96, 112, 128, 256] {
            for bs in [8, 16, 32] {
                let tile: Vec<T> = (0..d * bs).map(|_| T::from_f32(lcg(&mut seed) * amp)).collect();
                let wide: Vec<f32> = tile.iter().map(|v| v.to_f32()).collect();
                // Up to 7 query rows at once (chunks of 4 plus a remainder), scores `bs + 3` apart.
                for nh in 1..=7 {
                    let qs: Vec<Vec<f32>> =
                        (0..nh).map(|_| (0..d).map(|_| lcg(&mut seed)).collect()).collect();
                    let ql = qrep_len(d, x);
                    let mut qrep = vec![0.0; nh * ql];
                    for (i, q) in qs.iter().enumerate() {
                        prepare_query(q, 1.0, x, &mut qrep[i * ql..(i + 1) * ql]);
                    }
                    let stride = bs + 3;
                    let mut scores = vec![f32::NAN; nh * stride];
                    let heads = Heads { nh, d, bs, stride };
                    let op = QkRows { heads, tile: &tile, qrep: &qrep, q_stride: ql, scores: &mut scores };
                    qk_rows(isa, op, Ahead::new(&[&tile[..]]));
                    for (i, q) in qs.iter().enumerate() {
                        for (a, b) in
                            scores[i * stride..i * stride + bs].iter().zip(naive_qk(&wide, q, d, bs, x))
                        {
                            assert!(
                                (a - b).abs() < 1e-4 * amp,
                                "{isa:?} {} d{d} bs{bs} nh{nh}: {a} vs {b}",
                                T::DTYPE
                            );
                        }
                    }
                    // p · V over two tiles (the same tile twice) for every head.
                    let probs: Vec<f32> = (0..nh * 2 * bs).map(|_| lcg(&mut seed).abs()).collect();
                    let mut acc8 = vec![0.0; nh * d * 8];
                    let heads = Heads { nh, d, bs, stride: 2 * bs };
                    let op =
                        PvBlocks { heads, tiles: &[&tile[..], &tile[..]], probs: &probs, acc8: &mut acc8 };
                    pv_blocks(isa, op, Ahead::new(&[&tile[..]]));
                    for i in 0..nh {
                        let mut out = vec![0.0; d];
                        finish_rows(isa, &acc8[i * d * 8..(i + 1) * d * 8], 0.5, &mut out);
                        for (r, o) in out.iter().enumerate() {
                            let p = &probs[i * 2 * bs..(i + 1) * 2 * bs];
                            let want = 0.5 * (0..2 * bs).map(|t| p[t] * wide[r * bs + t % bs]).sum::<f32>();
                            assert!(
                                (o - want).abs() < 1e-4 * amp,
                                "{isa:?} pv_blocks d{d} bs{bs} nh{nh}: {o} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn micro_kernels_match_naive_loops_on_every_isa_and_dtype() {
        for isa in Isa::available() {
            check_isa::<f32>(isa);
            check_isa::<f16>(isa);
            check_isa::<bf16>(isa);
            check_isa::<i8>(isa);
        }
    }

    #[test]
    fn exp_matches_std_and_sums() {
        for isa in Isa::available() {
            let src: Vec<f32> = (0..203).map(|i| (i as f32 - 150.0) * 0.7).collect();
            let mut v = src.clone();
            let max = max_of(&v);
            let sum = exp_sub_sum(isa, &mut v, max);
            let mut want_sum = 0.0;
            for (a, s) in v.iter().zip(&src) {
                let want = (s - max).exp();
                want_sum += want;
                assert!(
                    (a - want).abs() <= 2e-7 * want.max(1e-30) + 1e-37,
                    "{isa:?}: exp({}) = {a} vs {want}",
                    s - max
                );
            }
            assert!((sum - want_sum).abs() < 1e-5 * want_sum);
        }
    }

    #[test]
    fn ahead_walks_every_line_once_then_stops() {
        // 3 tiles of 200 f32 = 800 bytes = 13 lines each (the last one partial).
        let buf = vec![0.0f32; 600];
        let tiles: Vec<&[f32]> = buf.chunks(200).collect();
        let mut ahead = Ahead::new(&tiles);
        assert_eq!(ahead.lines(), 39);
        let mut total = 0;
        for step in 0.. {
            let got = ahead.next(5);
            total += got;
            if got < 5 {
                assert_eq!(step, 7);
                break;
            }
        }
        assert_eq!(total, 39);
        assert_eq!(ahead.cursor(), (3, 0));
        assert_eq!(ahead.next(1), 0);
        assert_eq!(Ahead::<f32>::none().next(4), 0);
    }

    #[test]
    fn max_of_handles_tails_and_empty() {
        assert_eq!(max_of(&[]), f32::NEG_INFINITY);
        assert_eq!(max_of(&[1.0, 5.0, -2.0]), 5.0);
        let v: Vec<f32> = (0..37).map(|i| (i * 7 % 37) as f32).collect();
        assert_eq!(max_of(&v), 36.0);
    }
}
