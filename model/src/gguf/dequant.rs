//! ggml tensor types and their dequantization to f32, exactly as ggml defines them
//! (`d·q` for Q8_0 / Q4_0 with an offset of 8, `d·q + m` for Q4_1; `d`, `m` stored as f16).

use half::f16;
use rayon::prelude::*;

/// The ggml types this converter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q8_0,
}

/// Weights per quantization block (all supported block types use 32).
pub const QK: usize = 32;

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
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
            Self::Q8_0 => (QK, 2 + QK),
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

fn dequantize_block(ty: GgmlType, b: &[u8], out: &mut [f32]) {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
