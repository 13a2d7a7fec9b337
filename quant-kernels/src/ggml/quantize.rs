//! Reference quantizers f32 → ggml blocks, bit-exact with ggml's `quantize_row_*_ref`
//! (Q8_0, Q4_0, Q4_1) and its f32 → f16 / bf16 conversions: the yardstick that faster
//! quantizers and the quantized kernels' tests compare against.

use half::{bf16, f16};

use super::dequant::{GgmlType, QK};

/// Why [`quantize`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantizeError {
    /// No reference quantizer here for this type (the K-quants' search-based quantizers and
    /// Q5_0 / Q5_1's are not ported: those formats are only read from GGUF files).
    #[error("no reference quantizer for ggml type {0:?}")]
    Unsupported(GgmlType),
    /// The input does not split into whole blocks.
    #[error("{len} values do not split into whole {ty:?} blocks of {per_block}")]
    PartialBlock { ty: GgmlType, len: usize, per_block: usize },
}

/// Quantizes `src` to `ty` as ggml's reference quantizer does, appending `ty.n_bytes(src.len())`
/// bytes to `out`. `src.len()` must be a multiple of `ty.block().0` (32 for the block types);
/// on error `out` is left as it was.
pub fn quantize(ty: GgmlType, src: &[f32], out: &mut Vec<u8>) -> Result<(), QuantizeError> {
    let (per_block, block_bytes) = ty.block();
    if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) {
        return Err(QuantizeError::Unsupported(ty));
    }
    if !src.len().is_multiple_of(per_block) {
        return Err(QuantizeError::PartialBlock { ty, len: src.len(), per_block });
    }
    out.reserve(src.len() / per_block * block_bytes);
    for x in src.chunks_exact(per_block) {
        match ty {
            GgmlType::F32 => out.extend_from_slice(&x[0].to_le_bytes()),
            // Both round to nearest even; half's bf16 also quiets NaNs exactly as
            // ggml_compute_fp32_to_bf16 does (keep the top bits, set bit 6).
            GgmlType::F16 => out.extend_from_slice(&f16::from_f32(x[0]).to_le_bytes()),
            GgmlType::BF16 => out.extend_from_slice(&bf16::from_f32(x[0]).to_le_bytes()),
            GgmlType::Q8_0 => quantize_q8_0(x, out),
            GgmlType::Q4_0 => quantize_q4_0(x, out),
            GgmlType::Q4_1 => quantize_q4_1(x, out),
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                unreachable!("refused above")
            }
        }
    }
    Ok(())
}

/// `1/d`, or 0 for an all-zero block so that every quant comes out 0 rather than NaN.
fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// `quantize_row_q8_0_ref`: `d = amax/127`, `q = roundf(x/d)`. The quants use the f32 `d`, not
/// its f16 rounding, exactly as ggml does; `f32::round` is `roundf` (ties away from zero).
fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
}

/// `quantize_row_q4_0_ref`: `d = max/-8` where `max` is the signed value of largest magnitude
/// (the first one on ties), so that value maps to quant 0 and the other end gets the extra level;
/// `q = min(15, trunc(x/d + 8.5))`. Element `j` goes in the low nibble of byte `j`, element
/// `j + 16` in its high nibble.
fn quantize_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            (amax, max) = (v.abs(), v);
        }
    }
    let d = max / -8.0;
    let id = inverse(d);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    // Truncation toward zero, as C's float → int8 cast; x/d + 8.5 is in [0.5, 16.5].
    let q = |v: f32| ((v * id + 8.5) as u8).min(15);
    let (lo, hi) = x.split_at(QK / 2);
    out.extend(lo.iter().zip(hi).map(|(&a, &b)| q(a) | (q(b) << 4)));
}

/// `quantize_row_q4_1_ref`: `d = (max - min)/15`, `m = min`, `q = min(15, trunc((x - min)/d + 0.5))`,
/// same nibble layout as Q4_0.
fn quantize_q4_1(x: &[f32], out: &mut Vec<u8>) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / 15.0;
    let id = inverse(d);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
    let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
    let (lo, hi) = x.split_at(QK / 2);
    out.extend(lo.iter().zip(hi).map(|(&a, &b)| q(a) | (q(b) << 4)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::dequant::tests::{f32s, fixture};
    use crate::ggml::dequantize;

    /// The f32 rows (64 × 32) that `generate.py` quantized with gguf-py.
    fn src() -> Vec<f32> {
        f32s(fixture!("src.f32"))
    }

    fn quantized(ty: GgmlType, src: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        quantize(ty, src, &mut out).unwrap();
        assert_eq!(Some(out.len()), ty.n_bytes(src.len(), None));
        out
    }

    /// Block by block, so a mismatch names the block (the first rows are the crafted edge cases).
    fn assert_bytes_match(ty: GgmlType, got: &[u8], want: &[u8]) {
        assert_eq!(got.len(), want.len(), "{ty:?}");
        let block_bytes = ty.block().1;
        for (i, (g, w)) in got.chunks(block_bytes).zip(want.chunks(block_bytes)).enumerate() {
            assert_eq!(g, w, "{ty:?} block {i}");
        }
    }

    #[test]
    fn every_format_matches_gguf_py() {
        for (ty, want) in [
            (GgmlType::Q8_0, fixture!("q8_0.bin")),
            (GgmlType::Q4_0, fixture!("q4_0.bin")),
            (GgmlType::Q4_1, fixture!("q4_1.bin")),
            (GgmlType::F16, fixture!("f16.bin")),
            (GgmlType::BF16, fixture!("bf16.bin")),
        ] {
            assert_bytes_match(ty, &quantized(ty, &src()), want);
        }
        assert_eq!(quantized(GgmlType::F32, &src()), fixture!("src.f32"));
    }

    #[test]
    fn q8_0_ties_round_away_from_zero() {
        // amax 127 → d = 1 exactly, so ±k.5 are true ties: roundf gives ±(k+1), not the even one.
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = -0.5;
        x[3] = 2.5;
        x[4] = -2.5;
        let q = quantized(GgmlType::Q8_0, &x);
        assert_eq!(q[2..7].iter().map(|&b| b as i8).collect::<Vec<_>>(), [127, 1, -1, 3, -3]);
    }

    /// Quantizing then dequantizing moves no element by more than half a step, `|d|/2` with `d`
    /// as stored in f16. On top of that: the quants were picked with the f32 `d` (and `m`), so
    /// their f16 rounding adds `|Δd|·|q| + |Δm|` (large where `d` is f16-subnormal), plus a few
    /// ulps of f32 arithmetic. The one exception is Q4_0's end opposite its max, where `x/d`
    /// reaches +8 and the quant clamps from 16 to 15: a whole step there.
    #[test]
    fn round_trip_stays_within_half_a_step() {
        let src = src();
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
            let q = quantized(ty, &src);
            let mut back = vec![0.0; src.len()];
            dequantize(ty, &q, &mut back);
            let block_bytes = ty.block().1;
            for (i, ((x, y), b)) in src.chunks(QK).zip(back.chunks(QK)).zip(q.chunks(block_bytes)).enumerate()
            {
                let f16_at = |k: usize| f16::from_le_bytes([b[k], b[k + 1]]).to_f32();
                let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let (lo, hi) = x.iter().fold((f32::MAX, -f32::MAX), |(l, h), &v| (l.min(v), h.max(v)));
                let max = *x.iter().find(|v| v.abs() == amax).unwrap();
                // (the f32 d the quants were picked with, its largest |quant|, the f16 rounding of m)
                let (d32, q_max, dm) = match ty {
                    GgmlType::Q8_0 => (amax / 127.0, 127.0, 0.0),
                    GgmlType::Q4_0 => (max / -8.0, 8.0, 0.0),
                    _ => ((hi - lo) / 15.0, 15.0, (f16_at(2) - lo).abs()),
                };
                let d16 = f16_at(0);
                let slack = (d32 - d16).abs() * q_max + dm + 4.0 * f32::EPSILON * amax;
                for (j, (a, b)) in x.iter().zip(y).enumerate() {
                    let clamped = ty == GgmlType::Q4_0 && a * inverse(d32) + 8.5 >= 16.0;
                    let step = if clamped { d16.abs() } else { d16.abs() / 2.0 };
                    assert!(
                        (a - b).abs() <= step + slack,
                        "{ty:?} row {i} element {j}: {a} → {b} (d = {d16}, slack {slack})"
                    );
                }
            }
        }
    }

    #[test]
    fn refuses_partial_blocks_and_k_quants() {
        let mut out = vec![7u8];
        assert_eq!(
            quantize(GgmlType::Q8_0, &[0.0; 33], &mut out),
            Err(QuantizeError::PartialBlock { ty: GgmlType::Q8_0, len: 33, per_block: 32 })
        );
        assert_eq!(
            quantize(GgmlType::Q4_K, &[0.0; 256], &mut out),
            Err(QuantizeError::Unsupported(GgmlType::Q4_K))
        );
        assert_eq!(out, [7], "a refused call leaves the output alone");
    }
}
