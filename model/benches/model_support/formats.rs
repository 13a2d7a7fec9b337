//! Batch-1 decode over one weight per integer-code format, with the default activations: a
//! weight of random blocks (every f16 scale a sane value) large enough to stream from memory,
//! its bytes per second over a read-only sum's, the yardstick of a step bound by reading its
//! weights. Which formats keep up with memory, and which are bound by decoding their codes.
//! Every round times each format and the sum once, and each figure is the median of its
//! rounds' ratios: the machine's drift (other tenants, clocks) moves both sides of a ratio.

use std::time::Instant;

use attn_kernels::yardstick::par_read_only_sum;
use half::f16;
use quant_kernels::Isa;
use quant_kernels::quant::{ActivationPrecision, GgmlType, INTEGER_CODE_FORMATS, Part, Storage, Weight};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::median;

/// Bytes of each weight: four times a large L3, so every call streams from memory.
pub const WEIGHT_BYTES: usize = 128 << 20;
/// Row length: a common hidden size, whole K-quant super-blocks.
pub const COLS: usize = 2048;

/// Where a block of `ty` keeps its f16 scales (and minima).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        other => unreachable!("{other:?} is not measured"),
    }
}

/// A `rows × COLS` weight of `ty`: random code bytes, every f16 scale 0.01.
fn random_weight(ty: GgmlType, rows: usize, rng: &mut ChaCha8Rng) -> Weight {
    let (per_block, block_bytes) = ty.block();
    let mut bytes = vec![0u8; rows * COLS / per_block * block_bytes];
    rng.fill(&mut bytes[..]);
    let scale = f16::from_f32(0.01).to_le_bytes();
    for block in bytes.chunks_exact_mut(block_bytes) {
        for &at in scale_offsets(ty) {
            block[at..at + 2].copy_from_slice(&scale);
        }
    }
    let part = Part::new(ty, rows, COLS, Storage::Owned(bytes)).expect("whole blocks");
    Weight::from_parts(COLS, vec![part])
}

/// Each format's batch-1 decode over `rounds` rounds: `(format, median of bytes read per
/// second / the read-only sum's of the same round)`.
pub fn read_fractions(rounds: usize) -> Vec<(GgmlType, f64)> {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let x: Vec<f32> = (0..COLS).map(|_| rng.random_range(-1.0..1.0)).collect();
    let weights: Vec<(Weight, f64)> = INTEGER_CODE_FORMATS
        .iter()
        .map(|&ty| {
            let (per_block, block_bytes) = ty.block();
            let rows = WEIGHT_BYTES / (COLS / per_block * block_bytes);
            (random_weight(ty, rows, &mut rng), (rows * COLS / per_block * block_bytes) as f64)
        })
        .collect();
    let words: Vec<u32> = (0..(WEIGHT_BYTES / 4) as u32).collect();
    let mut out = vec![0.0f32; weights.iter().map(|(w, _)| w.rows()).max().unwrap_or(0)];
    let mut ratios = vec![Vec::new(); INTEGER_CODE_FORMATS.len()];
    // Round 0 warms every weight up.
    for round in 0..=rounds {
        let t = Instant::now();
        let sum = par_read_only_sum(&words);
        std::hint::black_box(sum);
        let read = WEIGHT_BYTES as f64 / t.elapsed().as_secs_f64();
        for ((weight, bytes), r) in weights.iter().zip(&mut ratios) {
            let t = Instant::now();
            weight.matmul_as(Isa::detected(), ActivationPrecision::default(), &mut out, &x, 1, false);
            let secs = t.elapsed().as_secs_f64();
            if round > 0 {
                r.push(bytes / secs / read);
            }
        }
    }
    std::hint::black_box(&out);
    INTEGER_CODE_FORMATS.iter().zip(&mut ratios).map(|(&ty, r)| (ty, median(r))).collect()
}
