//! ggml tensor types and their dequantization to f32, exactly as ggml defines them
//! (`d·q` for Q8_0 / Q4_0 / Q5_0 with an offset of 8 / 16, `d·q + m` for Q4_1 / Q5_1; `d`, `m`
//! stored as f16; the K-quants Q4_K / Q5_K / Q6_K in 256-weight super-blocks with per-sub-block
//! integer scales).

use half::f16;
use rayon::prelude::*;

/// The ggml types read from a GGUF and multiplied by the kernels.
// Variant names are ggml's own (`GGML_TYPE_Q4_K`), so they read the same as llama.cpp's sources.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// Weights per block of the legacy quantizations (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
pub const QK: usize = 32;

/// Weights per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// Bytes of ggml's `block_q4_K`: `d`, `dmin` (f16), 12 bytes of packed 6-bit scales and mins,
/// 128 bytes of nibbles.
const Q4_K_BYTES: usize = 2 + 2 + 12 + QK_K / 2;

/// Bytes of ggml's `block_q5_K`: Q4_K's header and nibbles with 32 bytes of fifth bits `qh`
/// between the scales and the nibbles (bit `s` of byte `l` is value `l` of sub-block `s`).
const Q5_K_BYTES: usize = Q4_K_BYTES + QK_K / 8;

/// Bytes of ggml's `block_q6_K`: 128 bytes of low nibbles, 64 of 2-bit highs, 16 i8 scales, `d`.
const Q6_K_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// `(elements per block, bytes per block)`.
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (QK, 2 + QK / 2),
            Self::Q4_1 => (QK, 4 + QK / 2),
            // The f16 header, 4 bytes of fifth bits, then the nibbles.
            Self::Q5_0 => (QK, 2 + 4 + QK / 2),
            Self::Q5_1 => (QK, 4 + 4 + QK / 2),
            Self::Q8_0 => (QK, 2 + QK),
            Self::Q4_K => (QK_K, Q4_K_BYTES),
            Self::Q5_K => (QK_K, Q5_K_BYTES),
            Self::Q6_K => (QK_K, Q6_K_BYTES),
        }
    }

    /// Bytes of `n` elements whose rows have length `row_len`; `None` if rows do not split
    /// into whole blocks or the size overflows.
    pub fn n_bytes(self, n: usize, row_len: Option<u64>) -> Option<usize> {
        let (per_block, bytes) = self.block();
        let row_ok = row_len.is_none_or(|r| (r as usize).is_multiple_of(per_block));
        (row_ok && n.is_multiple_of(per_block)).then(|| (n / per_block).checked_mul(bytes)).flatten()
    }
}

/// Dequantizes `data` (whole blocks of `ty`) into `out` (same number of elements).
/// Callers guarantee `data.len() == ty.n_bytes(out.len())`.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    let (per_block, block_bytes) = ty.block();
    // Parallel over chunks of whole blocks; ~64K weights per task.
    let blocks_per_task = (1 << 16) / per_block;
    out.par_chunks_mut(blocks_per_task * per_block)
        .zip(data.par_chunks(blocks_per_task * block_bytes))
        .for_each(|(o, d)| {
            for (ob, db) in o.chunks_exact_mut(per_block).zip(d.chunks_exact(block_bytes)) {
                dequantize_block(ty, db, ob);
            }
        });
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes one whole block of `ty` (`ty.block().1` bytes) into `ty.block().0` values —
/// the portable path that the parallel [`dequantize`] and the kernels' fallbacks share.
///
/// Panics if `block` or `out` is shorter than one block.
pub fn dequantize_block(ty: GgmlType, block: &[u8], out: &mut [f32]) {
    let (per_block, block_bytes) = ty.block();
    // Re-slicing to the exact sizes checks the lengths once, up front, and lets the loops below
    // index without further bounds checks.
    let (b, out) = (&block[..block_bytes], &mut out[..per_block]);
    match ty {
        GgmlType::F32 => out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => out[0] = f16_at(b, 0),
        GgmlType::BF16 => out[0] = half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::Q8_0 => {
            let d = f16_at(b, 0);
            for (o, &q) in out.iter_mut().zip(&b[2..2 + QK]) {
                *o = d * f32::from(q as i8);
            }
        }
        GgmlType::Q4_0 => {
            let d = f16_at(b, 0);
            let qs = &b[2..2 + QK / 2];
            for (j, &byte) in qs.iter().enumerate() {
                out[j] = d * (f32::from(byte & 0x0f) - 8.0);
                out[j + QK / 2] = d * (f32::from(byte >> 4) - 8.0);
            }
        }
        GgmlType::Q4_1 => {
            let d = f16_at(b, 0);
            let m = f16_at(b, 2);
            let qs = &b[4..4 + QK / 2];
            for (j, &byte) in qs.iter().enumerate() {
                out[j] = d * f32::from(byte & 0x0f) + m;
                out[j + QK / 2] = d * f32::from(byte >> 4) + m;
            }
        }
        GgmlType::Q5_0 => {
            let d = f16_at(b, 0);
            for (o, q) in out.iter_mut().zip(five_bit_codes(&b[2..6], &b[6..6 + QK / 2])) {
                *o = d * (f32::from(q) - 16.0);
            }
        }
        GgmlType::Q5_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for (o, q) in out.iter_mut().zip(five_bit_codes(&b[4..8], &b[8..8 + QK / 2])) {
                *o = d * f32::from(q) + m;
            }
        }
        GgmlType::Q4_K => dequantize_q4_k(b, out),
        GgmlType::Q5_K => dequantize_q5_k(b, out),
        GgmlType::Q6_K => dequantize_q6_k(b, out),
    }
}

/// The 32 codes (0..32) of a Q5_0 / Q5_1 block in value order: value `i` takes its low four bits
/// from the low nibble of `qs[i]` (the first 16) or the high nibble of `qs[i − 16]` (the last
/// 16), and its fifth bit from bit `i` of the little-endian `u32` `qh`.
fn five_bit_codes(qh: &[u8], qs: &[u8]) -> impl Iterator<Item = u8> {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let low = qs.iter().map(|b| b & 0x0f).chain(qs.iter().map(|b| b >> 4));
    low.enumerate().map(move |(i, q)| q | ((((qh >> i) & 1) as u8) << 4))
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from the 12 packed
/// bytes. Sub-blocks 0..4 sit in the low 6 bits of bytes `j` / `j + 4`; 4..8 put their low 4 bits
/// in the nibbles of bytes 8..12 and their top 2 bits in the spare high bits of bytes 0..8.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// ggml's `dequantize_row_q4_K` for one super-block: 4 groups of 64 weights; each group's 32 bytes
/// hold sub-block `2j` in the low nibbles and `2j + 1` in the high nibbles.
fn dequantize_q4_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..16 + QK_K / 2];
    for (j, (q, y)) in qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        // The same products, in the same order, as ggml (and gguf-py): d·sc and dmin·m first
        // (both exact in f32: 11-bit mantissa × 6-bit integer), then `d1·q − m1`. Rust never
        // contracts this into an FMA, so the single rounding is the subtraction's, as in C.
        let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let (lo, hi) = y.split_at_mut(32);
        for ((&byte, l), h) in q.iter().zip(lo).zip(hi) {
            *l = d1 * f32::from(byte & 0x0f) - m1;
            *h = d2 * f32::from(byte >> 4) - m2;
        }
    }
}

/// ggml's `dequantize_row_q5_K` for one super-block: Q4_K's sub-blocks and scales, each code
/// given a fifth bit (worth 16) from bit `s` of `qh[l]` for value `l` of sub-block `s`.
fn dequantize_q5_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..16 + QK_K / 8];
    let qs = &b[16 + QK_K / 8..Q5_K_BYTES];
    for (s, y) in out.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(s, scales);
        // As Q4_K (and ggml): the exact products d·sc and dmin·m, then one rounding per value.
        let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
        let q = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        for ((o, &byte), &high) in y.iter_mut().zip(q).zip(qh) {
            let low = if s % 2 == 0 { byte & 0x0f } else { byte >> 4 };
            *o = d1 * f32::from(low | (((high >> s) & 1) << 4)) - m1;
        }
    }
}

/// ggml's `dequantize_row_q6_K` for one super-block: two halves of 128 weights, each from 64 bytes
/// of `ql` (low nibbles of `l` and `l + 32`, then their high nibbles), 32 bytes of `qh` (2 bits per
/// weight, shifts 0/2/4/6 for the four runs of 32) and 8 of the 16 signed scales (one per 16).
fn dequantize_q6_k(b: &[u8], out: &mut [f32]) {
    let ql = &b[..QK_K / 2];
    let qh = &b[QK_K / 2..QK_K / 2 + QK_K / 4];
    let sc = &b[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
    let d = f16_at(b, Q6_K_BYTES - 2);
    for half in 0..2 {
        let (ql, qh) = (&ql[64 * half..64 * half + 64], &qh[32 * half..32 * half + 32]);
        let (sc, y) = (&sc[8 * half..8 * half + 8], &mut out[128 * half..128 * half + 128]);
        for l in 0..32 {
            let is = l / 16;
            // 6-bit quants centred on 32.
            let q = |low: u8, shift: u32| f32::from((low | (((qh[l] >> shift) & 3) << 4)) as i8 - 32);
            let qs = [q(ql[l] & 0x0f, 0), q(ql[l + 32] & 0x0f, 2), q(ql[l] >> 4, 4), q(ql[l + 32] >> 4, 6)];
            for (k, qk) in qs.into_iter().enumerate() {
                // ggml evaluates `d * sc[is] * q` left to right: (d·sc)·q.
                y[l + 32 * k] = d * f32::from(sc[is + 2 * k] as i8) * qk;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fixture from `tests/data/kquants/` (made by its `generate.py` with gguf-py).
    macro_rules! fixture {
        ($name:literal) => {
            include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kquants/", $name)).as_slice()
        };
    }
    pub(crate) use fixture;

    /// Little-endian f32s of a fixture.
    pub(crate) fn f32s(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    /// Dequantizes `blocks` and requires every value to equal gguf-py's bit for bit.
    fn assert_matches_reference(ty: GgmlType, blocks: &[u8], expected: &[u8]) {
        let expected = f32s(expected);
        let (per_block, block_bytes) = ty.block();
        assert_eq!(blocks.len() / block_bytes * per_block, expected.len());
        let mut out = vec![f32::NAN; expected.len()];
        dequantize(ty, blocks, &mut out);
        for (i, (got, want)) in out.iter().zip(&expected).enumerate() {
            assert_eq!(got.to_bits(), want.to_bits(), "{ty:?} element {i}: {got:e} vs gguf-py {want:e}");
        }
        // The one-block entry point the kernels fall back on gives the same values.
        let mut one = vec![0.0; per_block];
        dequantize_block(ty, &blocks[..block_bytes], &mut one);
        assert_eq!(one, out[..per_block]);
    }

    #[test]
    fn q4_k_matches_gguf_py() {
        assert_matches_reference(GgmlType::Q4_K, fixture!("q4_k.bin"), fixture!("q4_k.f32"));
    }

    #[test]
    fn q6_k_matches_gguf_py() {
        assert_matches_reference(GgmlType::Q6_K, fixture!("q6_k.bin"), fixture!("q6_k.f32"));
    }

    #[test]
    fn five_bit_quants_match_gguf_py() {
        assert_matches_reference(GgmlType::Q5_0, fixture!("q5_0.bin"), fixture!("q5_0.f32"));
        assert_matches_reference(GgmlType::Q5_1, fixture!("q5_1.bin"), fixture!("q5_1.f32"));
        assert_matches_reference(GgmlType::Q5_K, fixture!("q5_k.bin"), fixture!("q5_k.f32"));
    }

    #[test]
    fn legacy_quants_match_gguf_py() {
        assert_matches_reference(GgmlType::Q4_0, fixture!("q4_0.bin"), fixture!("q4_0.f32"));
        assert_matches_reference(GgmlType::Q4_1, fixture!("q4_1.bin"), fixture!("q4_1.f32"));
        assert_matches_reference(GgmlType::Q8_0, fixture!("q8_0.bin"), fixture!("q8_0.f32"));
    }

    #[test]
    fn k_quant_ids_and_sizes() {
        assert_eq!(GgmlType::from_id(12), Some(GgmlType::Q4_K));
        assert_eq!(GgmlType::from_id(14), Some(GgmlType::Q6_K));
        assert_eq!(GgmlType::Q4_K.block(), (256, 144));
        assert_eq!(GgmlType::Q6_K.block(), (256, 210));
        assert_eq!(GgmlType::Q6_K.n_bytes(512, Some(256)), Some(420));
        assert_eq!(GgmlType::Q4_K.n_bytes(512, Some(128)), None);
        assert_eq!(GgmlType::from_id(6), Some(GgmlType::Q5_0));
        assert_eq!(GgmlType::from_id(7), Some(GgmlType::Q5_1));
        assert_eq!(GgmlType::from_id(13), Some(GgmlType::Q5_K));
        assert_eq!(GgmlType::Q5_0.block(), (32, 22));
        assert_eq!(GgmlType::Q5_1.block(), (32, 24));
        assert_eq!(GgmlType::Q5_K.block(), (256, 176));
        assert_eq!(GgmlType::Q5_K.n_bytes(512, Some(256)), Some(352));
        assert_eq!(GgmlType::Q5_0.n_bytes(64, Some(48)), None);
    }

    /// A Q5_0 / Q5_1 block whose value `i` has low bits `i % 16` and, for the odd `i` only,
    /// the fifth bit: codes `i % 16 + 16·(i odd)`, so a fifth bit taken from the wrong value,
    /// or nibbles in the wrong half, change the values.
    fn five_bit_block(header: &[f32]) -> Vec<u8> {
        let mut block: Vec<u8> = header.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
        block.extend_from_slice(&0xaaaa_aaaau32.to_le_bytes());
        block.extend((0..16u8).map(|j| j | (j << 4)));
        block
    }

    #[test]
    fn q5_0_takes_bit_i_of_qh_as_value_i_s_fifth_bit() {
        let mut out = [f32::NAN; QK];
        dequantize(GgmlType::Q5_0, &five_bit_block(&[0.5]), &mut out);
        for (i, v) in out.iter().enumerate() {
            let code = (i % 16 + 16 * (i % 2)) as f32;
            assert_eq!(*v, 0.5 * (code - 16.0), "value {i}");
        }
    }

    #[test]
    fn q5_1_adds_its_min() {
        let mut out = [f32::NAN; QK];
        dequantize(GgmlType::Q5_1, &five_bit_block(&[0.25, -3.0]), &mut out);
        for (i, v) in out.iter().enumerate() {
            let code = (i % 16 + 16 * (i % 2)) as f32;
            assert_eq!(*v, 0.25 * code - 3.0, "value {i}");
        }
    }

    #[test]
    fn q5_k_sub_block_s_takes_bit_s_of_qh() {
        // Sub-block s: scale s+1, min 2s (all below 16, so the bytes 0..8 hold them whole and
        // bytes 8..12 are zero); qh[l] = l (bit s of it is value l's fifth bit in sub-block s);
        // the nibbles of byte l of each pair: low = l % 16 (even sub-block), high = 15 − l % 16.
        let mut block = Vec::new();
        block.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block.extend_from_slice(&f16::from_f32(0.25).to_le_bytes());
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = j as u8 + 1;
            scales[j + 4] = 2 * j as u8;
        }
        // Sub-blocks 4..8: low four bits in bytes 8..12 (scale | min << 4), top bits zero.
        for j in 4..8 {
            scales[j + 4] = (j as u8 + 1) | ((2 * j as u8) << 4);
        }
        block.extend_from_slice(&scales);
        block.extend(0..32u8);
        for _ in 0..4 {
            block.extend((0..32u8).map(|l| (l % 16) | ((15 - l % 16) << 4)));
        }
        let mut out = [f32::NAN; QK_K];
        dequantize(GgmlType::Q5_K, &block, &mut out);
        for (i, v) in out.iter().enumerate() {
            let (s, l) = (i / 32, i % 32);
            let low = if s % 2 == 0 { l % 16 } else { 15 - l % 16 };
            let code = low + 16 * ((l >> s) & 1);
            let want = 0.5 * (s + 1) as f32 * code as f32 - 0.25 * (2 * s) as f32;
            assert_eq!(*v, want, "sub-block {s} value {l}");
        }
    }

    #[test]
    fn q4_k_scale_packing() {
        // Sub-block j gets scale j+1 and min 40+j; 4..8 need the split 4+2-bit packing.
        let (sc, m): (Vec<u8>, Vec<u8>) = (0..8u8).map(|j| (j + 1, 40 + j)).unzip();
        let mut packed = [0u8; 12];
        for j in 0..4 {
            packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            packed[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            packed[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
        }
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &packed), (sc[j], m[j]), "sub-block {j}");
        }
    }

    #[test]
    fn q4_1_low_nibbles_first_then_high() {
        let mut block = Vec::new();
        block.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block.extend_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0.0f32; QK];
        dequantize(GgmlType::Q4_1, &block, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * j as f32 - 1.0);
            assert_eq!(out[j + 16], 0.5 * (15 - j) as f32 - 1.0);
        }
    }

    #[test]
    fn q8_0_is_signed() {
        let mut block = Vec::new();
        block.extend_from_slice(&f16::from_f32(0.25).to_le_bytes());
        block.extend((0..32i32).map(|j| ((j - 16) as i8) as u8));
        let mut out = [0.0f32; QK];
        dequantize(GgmlType::Q8_0, &block, &mut out);
        for (j, v) in out.iter().enumerate() {
            assert_eq!(*v, 0.25 * (j as f32 - 16.0));
        }
    }

    #[test]
    fn sizes_need_whole_blocks_per_row() {
        assert_eq!(GgmlType::Q4_1.n_bytes(64, Some(32)), Some(40));
        assert_eq!(GgmlType::Q4_1.n_bytes(64, Some(16)), None);
        assert_eq!(GgmlType::F32.n_bytes(3, Some(3)), Some(12));
    }
}
