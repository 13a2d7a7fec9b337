//! The int8-activation path ([`super::ActivationPrecision::Int8`], opt-in), llama.cpp's CPU
//! matmul arithmetic for the integer-code formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
//! Q6_K), at every token count and on every instruction set, with one result to the bit.
//!
//! - Activations: each token's groups of 32 rounded once per call to int8, `dx = max|x|/127`,
//!   `a = round(x·127/max|x|)` (to nearest, ties to even; [`round_group`] is the rule), with
//!   each group's integer sum `A` (and its two 16s' sums, for Q6_K), so the offsets multiply
//!   `dx·A`, the sum of the rounded activations, as llama.cpp's Q8_1 and Q8_K sums do.
//! - Products: per unit (a group of 32; Q6_K's 16s, each under its own scale) the exact
//!   integer sum `I = Σ (code − centre)·a` (`vpdpbusd` on AVX-512 VNNI, `vpmaddubsw` +
//!   `vpmaddwd` on AVX2, a loop on the portable path), then in f32 `fma(I, d·dx, acc)`; the
//!   offset formats add `fma(m, dx·A, off)` into accumulators of their own.
//! - The f32 order, the same on every path and at every token count (so a token's outputs
//!   do not depend on which kernel or how many other tokens ran): eight accumulators per
//!   output, a row's groups in steps of eight ([`STEP`]), group `j` of a step into
//!   accumulator `j` (Q6_K: its first 16 into `j % 4`, its second into `4 + j % 4`, the
//!   step's groups 0..4 before 4..8), then the sum `((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`,
//!   the offsets' likewise, and `acc + off`. Each SIMD lane runs one accumulator's chain;
//!   [`scalar`] states it plainly and the tests hold every kernel to its bits.
//! - Kernels: a few rows at a time times up to four tokens per pass, the eight groups of a
//!   step across the lanes ([`avx512`], [`avx2`], [`scalar`]); batches (more than
//!   [`DECODE_MAX_M`] tokens) on AVX-512 VNNI with tokens across the lanes instead
//!   ([`batch`]), which leaves no sums across lanes to do. Which one ran changes no bit.
//!
//! Weights of another format in the same call run the f32 kernels, as with int16 activations:
//! part by part in decode, and the whole weight once the call is a batch
//! ([`matmul_weight`]).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod batch;
mod scalar;
#[cfg(test)]
mod tests;

use rayon::prelude::*;

use super::{DECODE_MAX_M, GgmlType, Out, PartRef, RowTask, Storage, Weight, decode, panel};
use crate::Isa;

/// Groups per step: the eight accumulators of each output (module doc).
pub(super) const STEP: usize = 8;

/// Tokens one pass over a block of rows serves (each kernel is compiled for 1 to 4).
const TOKENS_PER_PASS: usize = 4;

/// Below this largest magnitude a group gets no codes: `127 / max|x|` would overflow, and the
/// products of such values vanish in any f32 output.
const TINY: f32 = 1e-30;

/// Whether this path runs format `ty`.
pub(super) fn supports(ty: GgmlType) -> bool {
    super::INTEGER_CODE_FORMATS.contains(&ty)
}

/// Whether format `ty` has an offset per group (`value = d·code + m`).
fn has_offset(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K)
}

/// One group of 32 activations rounded to int8 into `q`: returns its scale `dx`, with
/// `x ≈ dx·q`. A group holding a NaN or an infinity gets no codes and a NaN scale (its
/// products come out NaN, as the f32 path's would); one whose values are all under [`TINY`]
/// gets no codes and a zero scale.
#[inline(always)]
fn round_group(x: &[f32], q: &mut [i8]) -> f32 {
    let (x, q) = (&x[..32], &mut q[..32]);
    let mut amax = 0.0f32;
    let mut finite = true;
    for &v in x {
        let a = v.abs();
        finite &= a <= f32::MAX;
        amax = if a > amax { a } else { amax };
    }
    if !finite || amax < TINY {
        q.fill(0);
        return if finite { 0.0 } else { f32::NAN };
    }
    let inv = 127.0 / amax;
    // Adding 1.5·2²³ leaves the integer part of |y| ≤ 2²² in the low mantissa bits, rounded
    // to nearest, ties to even (the FPU's mode): the bits less the constant's are the code.
    // |x·inv| ≤ 127 up to a rounding, so every code fits an i8.
    const MAGIC: f32 = 12_582_912.0;
    for (c, &v) in q.iter_mut().zip(x) {
        *c = ((v * inv + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32) as i8;
    }
    amax / 127.0
}

/// The activations of one call in int8 (module doc), per token `t` and step `s` of eight
/// groups (a row's last step padded with zero groups): 256 codes in value order
/// (`q[t][s·256..]`); per group its scale `dx`, integer sum `A` and `dx·A` (`[t][s·8..]`);
/// per 16 its sum and scale in the order of Q6_K's units (`[t][s·16..]`: the first 16s of
/// the step's groups 0..4, their second 16s, then the same for groups 4..8).
pub(super) struct X8 {
    q: Vec<i8>,
    dx: Vec<f32>,
    sums: Vec<i32>,
    sx: Vec<f32>,
    sums16: Vec<i32>,
    dx16: Vec<f32>,
    groups: usize,
    steps: usize,
}

impl X8 {
    /// `m` tokens of `k` activations (`k` a multiple of 32), by the rule of [`round_group`]
    /// whatever `isa` (which only chooses the instructions the compiler may use for it).
    pub(super) fn quantize(isa: Isa, x: &[f32], m: usize, k: usize) -> X8 {
        assert!(k.is_multiple_of(32) && x.len() >= m * k, "X8::quantize: {m} tokens of {k}");
        let groups = k / 32;
        let steps = groups.div_ceil(STEP);
        let mut xq = X8 {
            q: vec![0; m * steps * 256],
            dx: vec![0.0; m * steps * STEP],
            sums: vec![0; m * steps * STEP],
            sx: vec![0.0; m * steps * STEP],
            sums16: vec![0; m * steps * 2 * STEP],
            dx16: vec![0.0; m * steps * 2 * STEP],
            groups,
            steps,
        };
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Portable && isa.is_available() {
            // SAFETY: AVX2, FMA and F16C are part of every x86 `Isa` but the portable one,
            // and this one runs here (checked).
            unsafe { quantize_avx2(&mut xq, x, m, k) };
            return xq;
        }
        let _ = isa;
        quantize_into(&mut xq, x, m, k);
        xq
    }

    /// Token `t`'s codes of step `s` (256 bytes).
    #[inline(always)]
    fn codes(&self, t: usize, s: usize) -> &[i8] {
        &self.q[(t * self.steps + s) * 256..][..256]
    }

    /// Index of token `t`'s first group of step `s` in `dx`, `sums` and `sx`.
    #[inline(always)]
    fn at(&self, t: usize, s: usize) -> usize {
        (t * self.steps + s) * STEP
    }
}

/// [`quantize_into`] compiled for AVX2 (the same arithmetic, vectorized by the compiler).
///
/// # Safety
/// AVX2, FMA and F16C are available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_avx2(xq: &mut X8, x: &[f32], m: usize, k: usize) {
    quantize_into(xq, x, m, k);
}

/// Fills `xq` (sized for `m` tokens of `k`) from `x`.
#[inline(always)]
fn quantize_into(xq: &mut X8, x: &[f32], m: usize, k: usize) {
    let (groups, steps) = (xq.groups, xq.steps);
    for t in 0..m {
        for g in 0..groups {
            let (s, j) = (g / STEP, g % STEP);
            let codes = &mut xq.q[(t * steps * STEP + g) * 32..][..32];
            let dx = round_group(&x[t * k + 32 * g..][..32], codes);
            let mut halves = [0i32; 2];
            for (i, &c) in codes.iter().enumerate() {
                halves[i / 16] += i32::from(c);
            }
            let sum = halves[0] + halves[1];
            let at = (t * steps + s) * STEP + j;
            xq.dx[at] = dx;
            xq.sums[at] = sum;
            xq.sx[at] = dx * sum as f32;
            // Q6_K's unit order: group j's first 16 at j % 4 of its half of the step, its
            // second at 4 + j % 4.
            let unit = (t * steps + s) * 2 * STEP + (j / 4) * STEP + j % 4;
            for (h, &a) in halves.iter().enumerate() {
                xq.sums16[unit + 4 * h] = a;
                xq.dx16[unit + 4 * h] = dx;
            }
        }
    }
}

/// Which kernels a call runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl Path {
    /// The kernels of `isa` on this CPU: AVX-512 where it has BW and VNNI too, else AVX2 for
    /// either x86 ISA, else the portable loop.
    fn of(isa: Isa) -> Path {
        #[cfg(target_arch = "x86_64")]
        match isa {
            _ if !isa.is_available() => {}
            Isa::Avx512 if crate::isa::avx512_vnni() => return Path::Avx512Vnni,
            Isa::Avx2 | Isa::Avx512 => return Path::Avx2,
            Isa::Portable => {}
        }
        let _ = isa;
        Path::Portable
    }
}

/// `Weight::matmul_as` for int8 activations, the parts stacked from column 0 of `out`:
/// the integer-code parts on this path, f32 parts through `gemm`, and other formats on the
/// f32 decode kernels. A batch (more than [`DECODE_MAX_M`] tokens) with any part of another
/// format runs none of it here (`false`: the caller's f32 paths take it all), as batches with
/// int16 activations do.
pub(super) fn matmul_weight(isa: Isa, w: &Weight, out: Out, x: &[f32], m: usize, accumulate: bool) -> bool {
    let k = w.cols;
    let mut formats = w.parts.iter().map(|p| supports(p.ty));
    let takes = if m <= DECODE_MAX_M { formats.any(|s| s) } else { formats.all(|s| s) };
    if !takes || !k.is_multiple_of(32) || m == 0 {
        return false;
    }
    let xq = X8::quantize(isa, x, m, k);
    let (mut integer, mut other) = (Vec::new(), Vec::new());
    let mut col = 0;
    for (p, part) in w.parts.iter().zip(w.part_refs()) {
        let out = Out { ptr: out.ptr.offset(col), ..out };
        match &p.data {
            Storage::F32(values) => panel::f32_strided(out, x, m, k, values, p.rows, accumulate),
            _ if supports(p.ty) => integer.push((part, out)),
            _ => other.push((part, out)),
        }
        col += p.rows;
    }
    matmul_parts(isa, &xq, m, &integer, accumulate);
    decode::matmul_parts(isa, None, x, m, &other, accumulate);
    true
}

/// Rows whose bytes stay in L1 while every pass of [`TOKENS_PER_PASS`] tokens reads them.
fn rows_per_block(row_bytes: usize) -> usize {
    (24 * 1024 / row_bytes.max(1)).max(1)
}

/// `out[t, r] (+)= x[t] · row r` for the `m` tokens of `xq` and every row of each part (all
/// of formats this path [`supports`], `k` columns each), in one parallel region.
pub(super) fn matmul_parts(isa: Isa, xq: &X8, m: usize, parts: &[(PartRef<'_>, Out)], accumulate: bool) {
    let path = Path::of(isa);
    for (p, _) in parts {
        assert!(supports(p.ty) && p.cols == 32 * xq.groups, "int8: a {:?} part of {} columns", p.ty, p.cols);
    }
    assert!(xq.dx.len() >= m * xq.steps * STEP, "int8: {m} tokens, fewer rounded");
    #[cfg(target_arch = "x86_64")]
    if path == Path::Avx512Vnni && m > DECODE_MAX_M {
        // SAFETY: `Path::of` found AVX-512 VNNI (with F, BW, AVX2, FMA, F16C) here; the parts'
        // columns are xq's (asserted), which holds m tokens; `Weight::matmul` checked `out`.
        unsafe { batch::matmul_parts(xq, m, parts, accumulate) };
        return;
    }
    // The decode kernels' split of the rows into tasks.
    decode::row_tasks(parts, |_| 1).into_par_iter().for_each(|(i, rows)| {
        let (part, out) = (&parts[i].0, parts[i].1);
        let block = rows_per_block(part.row_bytes());
        for r0 in rows.clone().step_by(block) {
            for t0 in (0..m).step_by(TOKENS_PER_PASS) {
                let mr = (m - t0).min(TOKENS_PER_PASS);
                let task = RowTask { part, rows: r0..(r0 + block).min(rows.end), t0, mr, out, accumulate };
                run(path, task, xq);
            }
        }
    });
}

/// One task on `path`'s kernel.
fn run(path: Path, task: RowTask<'_>, xq: &X8) {
    match path {
        // SAFETY (both arms): `Path::of` chose the kernel for features this CPU has; the
        // task's rows lie in its part, whose columns are `xq`'s (asserted), its tokens in
        // `xq`, and only this task writes its entries of `out`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Vnni => unsafe { avx512::dot_rows(task, xq) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { avx2::dot_rows(task, xq) },
        Path::Portable => scalar::dot_rows(task, xq),
    }
}
