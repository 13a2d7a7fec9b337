//! The int8 cache's rounding rule: symmetric bf16 scales, `scale = amax / 127` rounded up to
//! bf16, codes `round(v / scale)` in `-127 ..= 127`; a value is `code · scale`. A token's key
//! has a scale per group of [`key_group`] dims, its value one per kv head.
//!
//! Scales per token rather than per block: a block fills one token per decode step, and a
//! block-wide scale would have to re-round every code already written whenever a larger value
//! arrives (and a prefill and a decode of the same tokens would round differently). Keys in
//! groups: an error in a key is multiplied by the query into the logits, and a few large dims of
//! a key would otherwise set the step of all the others. bf16 scales rather than f16: f16's range would make the scales of small rows
//! subnormal (coarse) and overflow past 65504 · 127; rounding the scale up keeps every code
//! within ±127, so the error is at most half a step. Codes are rounded against the stored scale,
//! so `code · scale` is the value the kernels and the reference both read.

use half::bf16;

use crate::CacheGeometry;

/// The largest code magnitude (symmetric: -128 is never written).
pub const MAX_CODE: f32 = 127.0;

/// Dims of one key scale's group: 32, or 16 for head sizes that are not a multiple of 32 (80,
/// 112). A multiple of the key layout's 8-dim chunk, so a group is whole rows of a key tile.
pub const fn key_group(head_size: usize) -> usize {
    if head_size.is_multiple_of(32) { 32 } else { 16 }
}

/// The stored scale of `row`: the smallest bf16 at or above `max |v| / 127`; +0 for a row of
/// zeros; NaN when the row holds a NaN or an infinity.
pub fn scale_of(row: &[f32]) -> bf16 {
    let mut amax = 0.0f32;
    for &v in row {
        if !v.is_finite() {
            return bf16::NAN;
        }
        amax = amax.max(v.abs());
    }
    let want = amax / MAX_CODE;
    let near = bf16::from_f32(want);
    // Positive and finite: the next bf16 up is the next bit pattern.
    if near.to_f32() < want { bf16::from_bits(near.to_bits() + 1) } else { near }
}

/// The code of `v` against `inv_scale` (`1 / scale`, 0 for a zero scale): nearest, ties away
/// from zero, saturated to ±127.
#[inline(always)]
pub fn code(v: f32, inv_scale: f32) -> i8 {
    (v * inv_scale).round().clamp(-MAX_CODE, MAX_CODE) as i8
}

/// Writes one token's key and value for one kv head into an int8 cache's codes and scales:
/// the key per group of [`key_group`] dims, the value per head. `key` and `value` hold
/// `g.head_size` values; `slot` and `kv_head` are in range (the callers check).
#[allow(clippy::too_many_arguments)]
pub fn quantize_token(
    g: &CacheGeometry,
    slot: usize,
    kv_head: usize,
    key: &[f32],
    value: &[f32],
    key_codes: &mut [i8],
    value_codes: &mut [i8],
    key_scales: &mut [bf16],
    value_scales: &mut [bf16],
) {
    let group = key_group(g.head_size);
    for (j, part) in key.chunks_exact(group).enumerate() {
        key_scales[g.key_scale_index(slot, kv_head, j)] =
            quantize_row(part, |d, c| key_codes[g.key_index(slot, kv_head, j * group + d)] = c);
    }
    value_scales[g.value_scale_index(slot, kv_head)] =
        quantize_row(value, |d, c| value_codes[g.value_index(slot, kv_head, d)] = c);
}

/// Quantizes `row`: returns its scale and hands each element's code to `put(index, code)`.
pub fn quantize_row(row: &[f32], mut put: impl FnMut(usize, i8)) -> bf16 {
    let scale = scale_of(row);
    let s = scale.to_f32();
    let inv = if s > 0.0 && s.is_finite() { 1.0 / s } else { 0.0 };
    for (i, &v) in row.iter().enumerate() {
        put(i, code(v, inv));
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element comes back within half a step of its scale, and the scale is within bf16's
    /// rounding of `amax / 127`, over magnitudes from tiny to huge.
    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let mut seed = 1u64;
        for len in [1, 7, 64, 256] {
            for magnitude in [1e-30f32, 1e-4, 0.03, 1.0, 17.0, 3000.0, 1e30] {
                let row: Vec<f32> = (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        ((seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * magnitude
                    })
                    .collect();
                let mut codes = vec![0i8; len];
                let scale = quantize_row(&row, |i, c| codes[i] = c).to_f32();
                let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert!(scale >= amax / 127.0 && scale <= amax / 127.0 * (1.0 + 1.0 / 128.0));
                for (v, &c) in row.iter().zip(&codes) {
                    assert!(c != -128);
                    let err = (v - c as f32 * scale).abs();
                    assert!(err <= 0.5 * scale * (1.0 + 1e-6), "{v}: code {c} scale {scale} err {err}");
                }
            }
        }
    }

    #[test]
    fn zeros_non_finite_and_huge_rows() {
        let mut codes = [1i8; 3];
        assert_eq!(quantize_row(&[0.0; 3], |i, c| codes[i] = c).to_f32(), 0.0);
        assert_eq!(codes, [0; 3]);
        assert!(scale_of(&[1.0, f32::NAN]).is_nan());
        assert!(scale_of(&[f32::INFINITY]).is_nan());
        let s = quantize_row(&[1e9, -1e9], |i, c| codes[i] = c);
        assert!(s.is_finite());
        assert_eq!(&codes[..2], &[127, -127]);
    }
}
