//! The portable int8 kernel, the statement of the path's arithmetic (the module doc of
//! [`super`]) that the SIMD kernels reproduce to the bit: each format's groups read as
//! integer codes and scales from their bytes, exact integer sums, and the f32 accumulators in
//! their order.

use half::f16;

use super::{STEP, X8, has_offset};
use crate::ggml::scale_min_k4;
use crate::quant::{GgmlType, RowTask};

/// The f16 at `b[at..at + 2]` as f32 (exact).
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Group `g` of a row of format `ty`: its 32 codes in value order into `codes`, as the
/// integers that multiply the scales (`value = d·code + m`: Q4_0's, Q5_0's and Q6_K's less
/// their centre), and the scales of its first and second 16 (equal but for Q6_K) and its
/// offset `m`, each computed in f32 as the SIMD readers compute it.
#[inline]
pub(super) fn read_group(ty: GgmlType, row: &[u8], g: usize, codes: &mut [i8; 32]) -> ([f32; 2], f32) {
    // Q4_0 / Q4_1: sixteen bytes of nibbles, values 0..16 low and 16..32 high.
    let nibbles = |qs: &[u8], codes: &mut [i8; 32], centre: i8| {
        for (j, &b) in qs[..16].iter().enumerate() {
            codes[j] = (b & 0x0f) as i8 - centre;
            codes[j + 16] = (b >> 4) as i8 - centre;
        }
    };
    // Q5_0 / Q5_1: the nibbles, and bit `j` of the little-endian u32 at `qh` worth 16.
    let five_bit = |qh: &[u8], qs: &[u8], codes: &mut [i8; 32], centre: i8| {
        let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        for j in 0..32 {
            let nibble = if j < 16 { qs[j] & 0x0f } else { qs[j - 16] >> 4 };
            codes[j] = (nibble | (((high >> j) & 1) as u8) << 4) as i8 - centre;
        }
    };
    match ty {
        GgmlType::Q8_0 => {
            let b = &row[34 * g..][..34];
            for (c, &q) in codes.iter_mut().zip(&b[2..]) {
                *c = q as i8;
            }
            ([f16_at(b, 0); 2], 0.0)
        }
        GgmlType::Q4_0 => {
            let b = &row[18 * g..][..18];
            nibbles(&b[2..], codes, 8);
            ([f16_at(b, 0); 2], 0.0)
        }
        GgmlType::Q4_1 => {
            let b = &row[20 * g..][..20];
            nibbles(&b[4..], codes, 0);
            ([f16_at(b, 0); 2], f16_at(b, 2))
        }
        GgmlType::Q5_0 => {
            let b = &row[22 * g..][..22];
            five_bit(&b[2..6], &b[6..], codes, 16);
            ([f16_at(b, 0); 2], 0.0)
        }
        GgmlType::Q5_1 => {
            let b = &row[24 * g..][..24];
            five_bit(&b[4..8], &b[8..], codes, 0);
            ([f16_at(b, 0); 2], f16_at(b, 2))
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            // Sub-block s of a super-block: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins,
            // (Q5_K) 32 bytes of fifth bits, 128 of nibbles (sub-blocks 2i and 2i + 1 the low
            // and high nibbles of bytes 32i..32i + 32).
            let five = ty == GgmlType::Q5_K;
            let b = &row[if five { 176 } else { 144 } * (g / 8)..];
            let s = g % 8;
            let qs = &b[if five { 48 } else { 16 } + 32 * (s / 2)..][..32];
            for (l, c) in codes.iter_mut().enumerate() {
                let nibble = if s.is_multiple_of(2) { qs[l] & 0x0f } else { qs[l] >> 4 };
                let fifth = if five { ((b[16 + l] >> s) & 1) << 4 } else { 0 };
                *c = (nibble | fifth) as i8;
            }
            let (sc, min) = scale_min_k4(s, &b[4..16]);
            ([f16_at(b, 0) * f32::from(sc); 2], -f16_at(b, 2) * f32::from(min))
        }
        GgmlType::Q6_K => {
            // Super-block: 128 bytes of low nibbles, 64 of high bit pairs, 16 i8 scales, f16 d;
            // group s is quarter s % 4 of half s / 4 (see `avx2::Q6K`).
            let b = &row[210 * (g / 8)..][..210];
            let (half, quarter) = (g % 8 / 4, g % 4);
            let ql = &b[64 * half + 32 * (quarter % 2)..][..32];
            let qh = &b[128 + 32 * half..][..32];
            for (l, c) in codes.iter_mut().enumerate() {
                let nibble = if quarter < 2 { ql[l] & 0x0f } else { ql[l] >> 4 };
                let high = (qh[l] >> (2 * quarter)) & 3;
                *c = (nibble | high << 4) as i8 - 32;
            }
            let d = f16_at(b, 208);
            let sc = |i: usize| d * f32::from(b[192 + 8 * half + 2 * quarter + i] as i8);
            ([sc(0), sc(1)], 0.0)
        }
        other => unreachable!("int8 takes no {other:?}"),
    }
}

/// `Σ codes·a`, exactly.
#[inline(always)]
fn dot(codes: &[i8], a: &[i8]) -> i32 {
    codes.iter().zip(a).map(|(&c, &a)| i32::from(c) * i32::from(a)).sum()
}

/// The accumulators' sum, `((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))` (the SIMD kernels' `hsum`).
#[inline(always)]
pub(super) fn hsum(a: &[f32; STEP]) -> f32 {
    let s: [f32; 4] = std::array::from_fn(|j| a[j] + a[j + 4]);
    (s[0] + s[2]) + (s[1] + s[3])
}

/// Rows `task.rows` of the part times tokens `t0..t0 + mr` of `xq` (see the module doc).
pub(super) fn dot_rows(task: RowTask<'_>, xq: &X8) {
    let RowTask { part, rows, t0, mr, out, accumulate } = task;
    let (ty, groups) = (part.ty, xq.groups);
    let (split, offset) = (ty == GgmlType::Q6_K, has_offset(ty));
    let mut codes = [0i8; 32];
    for r in rows {
        let row = part.row(r);
        let mut acc = [[0.0f32; STEP]; super::TOKENS_PER_PASS];
        let mut off = [[0.0f32; STEP]; super::TOKENS_PER_PASS];
        for g in 0..groups {
            let (s, j) = (g / STEP, g % STEP);
            let (d, m) = read_group(ty, row, g, &mut codes);
            for (t, (acc, off)) in acc.iter_mut().zip(&mut off).enumerate().take(mr) {
                let a = &xq.codes(t0 + t, s)[32 * j..][..32];
                let at = xq.at(t0 + t, s) + j;
                let dx = xq.dx[at];
                if split {
                    // Group j's 16s into accumulators j % 4 and 4 + j % 4.
                    let (first, second) = (dot(&codes[..16], &a[..16]), dot(&codes[16..], &a[16..]));
                    let lane = j % 4;
                    acc[lane] = (first as f32).mul_add(d[0] * dx, acc[lane]);
                    acc[lane + 4] = (second as f32).mul_add(d[1] * dx, acc[lane + 4]);
                } else {
                    acc[j] = (dot(&codes, a) as f32).mul_add(d[0] * dx, acc[j]);
                }
                if offset {
                    off[j] = m.mul_add(xq.sx[at], off[j]);
                }
            }
        }
        for (t, (acc, off)) in acc.iter().zip(&off).enumerate().take(mr) {
            let v = if offset { hsum(acc) + hsum(off) } else { hsum(acc) };
            // SAFETY: (t0 + t, r) is this task's entry.
            unsafe { out.put(t0 + t, r, v, accumulate) };
        }
    }
}
