//! The GPU check (run on a lent GPU by the `gpu_check` binary): every CUDA kernel against the
//! CPU reference on random data, then the bandwidth figures. The host side — random cases with
//! NaN-poisoned caches and shuffled block tables, the tolerance check, the cache byte images, the
//! figure arithmetic — lives here so it is unit-tested on machines without a GPU. The placement
//! of a small case at the far end of a huge pool is `far_cases.rs`'s.

use half::{bf16, f16};
use kv_cache::{CacheGeometry, DType, LayerCache};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use attn_kernels::testing::{OwnedMetadata, query_start_loc};
use attn_kernels::{AttnError, AttnScores, PagedAttnMetadata};

/// One attention batch on one layer: a NaN-poisoned cache whose used slots hold random K/V,
/// shuffled physical blocks, and random queries.
#[derive(Debug)]
pub struct AttnCase {
    pub cache: LayerCache,
    pub query: Vec<f32>,
    /// A persistent table as the engine keeps it: sequence `s` reads row `seq_rows[s]` (rows in
    /// reverse order, behind two rows of out-of-range ids nobody reads).
    pub metadata: OwnedMetadata,
    pub num_heads: usize,
    /// `1/√head_size`, and the sliding window of the windowed cases.
    pub scores: AttnScores,
}

/// What a case's cache was written from: f32 keys and values `[tokens, kv_heads, head_size]`
/// and each token's slot (what a device `reshape_and_cache` is fed to write the same cache).
#[derive(Debug, Clone, Default)]
pub struct CacheInputs {
    pub key: Vec<f32>,
    pub value: Vec<f32>,
    pub slots: Vec<i64>,
}

impl AttnCase {
    /// `chunks[s] = (query_len, seq_len)`; every context token is written through the CPU
    /// `reshape_and_cache`, every other slot stays NaN.
    pub fn random(
        geometry: CacheGeometry,
        num_heads: usize,
        chunks: &[(usize, usize)],
        seed: u64,
    ) -> Result<Self, AttnError> {
        Self::with_inputs(geometry, num_heads, chunks, seed).map(|(case, _)| case)
    }

    /// [`AttnCase::random`], also returning the keys, values and slots its cache was written from.
    pub fn with_inputs(
        geometry: CacheGeometry,
        num_heads: usize,
        chunks: &[(usize, usize)],
        seed: u64,
    ) -> Result<(Self, CacheInputs), AttnError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bs = geometry.block_size;
        let max_blocks_per_seq = chunks.iter().map(|&(_, l)| l.div_ceil(bs)).max().unwrap_or(0).max(1);
        let needed: usize = chunks.iter().map(|&(_, l)| l.div_ceil(bs)).sum();
        let mut physical: Vec<u32> = (0..geometry.num_blocks as u32).collect();
        physical.shuffle(&mut rng);
        if needed > physical.len() {
            return Err(AttnError::BlockOutOfRange { block: needed as u64, num_blocks: physical.len() });
        }
        let mut cache = LayerCache::new(geometry)?;
        cache.fill(f32::NAN);
        let n = chunks.len();
        let seq_rows: Vec<u32> = (0..n).map(|s| (n + 1 - s) as u32).collect();
        let mut block_tables = vec![u32::MAX; (n + 2) * max_blocks_per_seq];
        let mut next = physical.into_iter();
        for (&(_, len), &r) in chunks.iter().zip(&seq_rows) {
            let row = &mut block_tables[r as usize * max_blocks_per_seq..][..max_blocks_per_seq];
            for b in row.iter_mut().take(len.div_ceil(bs)) {
                *b = next.next().unwrap_or(0);
            }
        }
        let metadata = OwnedMetadata {
            query_start_loc: query_start_loc(chunks.iter().map(|&(q, _)| q)),
            seq_lens: chunks.iter().map(|&(_, l)| l).collect(),
            block_tables,
            max_blocks_per_seq,
            seq_rows: Some(seq_rows),
        };
        let slots: Vec<i64> = (0..n)
            .flat_map(|s| (0..chunks[s].1).map(move |i| (s, i)))
            .map(|(s, i)| metadata.slot(s, i, bs) as i64)
            .collect();
        let row = geometry.num_kv_heads * geometry.head_size;
        let kv: Vec<f32> = (0..slots.len() * row).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let vv: Vec<f32> = (0..slots.len() * row).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        attn_kernels::reshape_and_cache(&kv, &vv, &slots, &mut cache)?;
        let num_tokens = metadata.as_meta().num_tokens();
        // Queries of U(-1, 1) give logits of std 1/3 after the 1/sqrt(d) scale: a nearly flat
        // softmax that forgives a missing max-logit rescale. QUERY_GAIN makes the logits' std
        // ~8, so a few keys dominate and every partition of v2 has its own maximum.
        let query = (0..num_tokens * num_heads * geometry.head_size)
            .map(|_| QUERY_GAIN * rng.random_range(-1.0f32..1.0))
            .collect();
        let scores = AttnScores { scale: 1.0 / (geometry.head_size as f32).sqrt(), sliding_window: None };
        let case = AttnCase { cache, query, metadata, num_heads, scores };
        Ok((case, CacheInputs { key: kv, value: vv, slots }))
    }

    pub fn meta(&self) -> PagedAttnMetadata<'_> {
        self.metadata.as_meta()
    }

    /// The CPU kernels' output with `scores` (f32 accumulation, like the CUDA kernels).
    pub fn cpu_output(&self, scores: AttnScores) -> Result<Vec<f32>, AttnError> {
        let mut out = vec![0.0; self.query.len()];
        attn_kernels::paged_attention(
            &attn_kernels::AttnOptions::default(),
            &mut out,
            &self.query,
            &self.cache,
            &self.meta(),
            self.num_heads,
            scores,
        )?;
        Ok(out)
    }

    /// The f64-softmax reference output.
    pub fn reference(&self) -> Result<Vec<f32>, AttnError> {
        let mut out = vec![0.0; self.query.len()];
        attn_kernels::reference::paged_attention(
            &mut out,
            &self.query,
            &self.cache,
            &self.meta(),
            self.num_heads,
            self.scores,
        )?;
        Ok(out)
    }
}

/// Largest `|got - want| / max(1, |want|)`; NaN anywhere counts as infinitely wrong.
pub fn max_rel_error(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let e = (g as f64 - w as f64).abs() / (w as f64).abs().max(1.0);
            if e.is_nan() { f64::INFINITY } else { e }
        })
        .fold(0.0, f64::max)
}

/// How much larger than U(-1, 1) the queries are (logit std ≈ QUERY_GAIN / 3): a peaked softmax.
pub const QUERY_GAIN: f32 = 24.0;

/// Tolerance of an f32-accumulated kernel against the f64 reference. The cache values are the
/// same on both sides (the reference reads the same f16/bf16 bytes), so only summation order and
/// the exponential differ: the CPU kernels (f32 accumulation) are within 0.6–2.1e-6 on these
/// cases for every cache dtype; the bounds leave 10–40x for CUDA's `__expf` and summation order. A dropped max-logit rescale or a wrong
/// partition merge is off by far more (peaked logits, see [`QUERY_GAIN`]).
pub fn attention_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        _ => 8e-5,
    }
}

/// Raw bytes of a host layer's key and value tensors (to compare with a device copy exactly).
pub fn layer_bytes(layer: &LayerCache) -> (Vec<u8>, Vec<u8>) {
    use kv_cache::CacheSlices;
    fn le<T: Copy, const N: usize>(values: &[T], to_le_bytes: fn(T) -> [u8; N]) -> Vec<u8> {
        values.iter().flat_map(|&v| to_le_bytes(v)).collect()
    }
    match layer.slices() {
        CacheSlices::F32 { key, value } => (le(key, f32::to_le_bytes), le(value, f32::to_le_bytes)),
        CacheSlices::F16 { key, value } => (le(key, f16::to_le_bytes), le(value, f16::to_le_bytes)),
        CacheSlices::BF16 { key, value } => (le(key, bf16::to_le_bytes), le(value, bf16::to_le_bytes)),
        _ => (Vec::new(), Vec::new()),
    }
}

/// Element-wise equality of two cache byte images of `dtype`, treating any two NaNs as equal
/// (a padding slot must stay NaN, a written slot must match bit for bit).
pub fn cache_images_equal(a: &[u8], b: &[u8], dtype: DType) -> bool {
    let is_nan = |x: &[u8]| match dtype {
        DType::F32 => f32::from_le_bytes([x[0], x[1], x[2], x[3]]).is_nan(),
        DType::F16 => f16::from_le_bytes([x[0], x[1]]).is_nan(),
        DType::BF16 => bf16::from_le_bytes([x[0], x[1]]).is_nan(),
        // The GPU run's caches are f32/f16/bf16; 8-bit codes have no NaN to compare.
        DType::Int8 | DType::Fp8E4M3 | DType::Fp8E5M2 => false,
    };
    let n = dtype.size_in_bytes();
    a.len() == b.len()
        && a.chunks_exact(n).zip(b.chunks_exact(n)).all(|(x, y)| x == y || (is_nan(x) && is_nan(y)))
}

/// The batches every configuration is checked on: `(name, [(query_len, seq_len)])`. Contexts
/// past 512 tokens give v2 several partitions; partial last blocks exercise the masking.
/// `prefill` is the tiled prefill kernel's: whole prompts shorter and longer than a tile, chunks
/// over a cached prefix that starts inside a block for every block size (271 and 13 tokens
/// cached), a two-token chunk, and a decode token in the same batch.
pub fn batches() -> Vec<(&'static str, Vec<(usize, usize)>)> {
    vec![
        ("decode", vec![(1, 1), (1, 17), (1, 600), (1, 1100), (1, 513)]),
        ("varlen", vec![(5, 45), (1, 700), (40, 40), (0, 12), (17, 530)]),
        ("prefill", vec![(37, 37), (29, 300), (1, 50), (64, 77), (2, 2), (3, 9)]),
    ]
}

/// `(name, config, batch)` of the long-prompt cases of the tiled prefill kernel, config as
/// `(dtype, head_size, block_size, num_kv_heads, group)`: a 2 500-token prompt beside a decode
/// token, and a 1 500-token chunk over 1 503 cached tokens (the chunk starts inside a block).
/// Two KV heads keep the f64 reference at a few seconds.
#[allow(clippy::type_complexity)]
pub fn long_prompt_cases() -> Vec<(&'static str, (DType, usize, usize, usize, usize), Vec<(usize, usize)>)> {
    vec![
        ("long_prompt", (DType::BF16, 128, 16, 2, 4), vec![(2_500, 2_500), (1, 900)]),
        ("long_chunk", (DType::F16, 64, 32, 1, 8), vec![(1_500, 3_003)]),
    ]
}

/// Sliding-window cases `(name, config, chunks, window)`: decodes whose context puts whole
/// 512-token partitions (v2) and whole blocks before the window, prefill chunks that straddle
/// the window's edge inside a block and past the first tile, and a window of one token.
#[allow(clippy::type_complexity)]
pub fn window_cases() -> Vec<(&'static str, (DType, usize, usize, usize, usize), Vec<(usize, usize)>, usize)>
{
    vec![
        ("window_decode", (DType::BF16, 128, 16, 2, 4), vec![(1, 3_000), (1, 700), (1, 40)], 512),
        ("window_decode", (DType::F16, 256, 16, 1, 4), vec![(1, 1_900), (1, 513)], 512),
        ("window_prefill", (DType::F16, 64, 32, 2, 3), vec![(300, 900), (1, 333), (45, 45)], 37),
        ("window_prefill", (DType::BF16, 256, 16, 1, 4), vec![(700, 1_500)], 512),
        ("window_one", (DType::F16, 64, 8, 2, 2), vec![(20, 120), (1, 50)], 1),
    ]
}

/// `bytes` bytes of NaN elements of `dtype` (the poison of unused cache memory).
pub fn nan_bytes(bytes: usize, dtype: DType) -> Vec<u8> {
    let one: Vec<u8> = match dtype {
        DType::F32 => f32::NAN.to_le_bytes().to_vec(),
        DType::F16 => f16::NAN.to_le_bytes().to_vec(),
        DType::BF16 => bf16::NAN.to_le_bytes().to_vec(),
        // fp8's all-ones pattern is NaN (e4m3 has no infinity); int8 has none and takes -128,
        // a code the cache never writes.
        DType::Int8 => vec![0x80],
        DType::Fp8E4M3 | DType::Fp8E5M2 => vec![0xff],
    };
    one.iter().copied().cycle().take(bytes).collect()
}

/// Decode figures from measured times: K+V bytes per second over the copy bandwidth, and the
/// paged / contiguous time ratio.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeFigures {
    pub kv_bytes_per_s: f64,
    pub bw_fraction: f64,
    pub paged_over_contiguous: f64,
}

/// `kv_bytes` read per call, seconds per call (paged and contiguous tables), copy bandwidth in
/// bytes/s (read + written, as measured by a device-to-device copy).
pub fn decode_figures(
    kv_bytes: f64,
    paged_s: f64,
    contiguous_s: f64,
    copy_bytes_per_s: f64,
) -> DecodeFigures {
    let kv_bytes_per_s = kv_bytes / paged_s;
    DecodeFigures {
        kv_bytes_per_s,
        bw_fraction: kv_bytes_per_s / copy_bytes_per_s,
        paged_over_contiguous: paged_s / contiguous_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(dtype: DType, block_size: usize) -> CacheGeometry {
        CacheGeometry { num_blocks: 256, num_kv_heads: 2, head_size: 64, block_size, dtype }
    }

    #[test]
    fn cases_poison_only_unused_slots_and_reference_stays_finite() -> Result<(), AttnError> {
        for (name, chunks) in batches() {
            let case = AttnCase::random(geometry(DType::BF16, 16), 8, &chunks, 7)?;
            let out = case.reference()?;
            assert!(out.iter().all(|v| v.is_finite()), "{name}: NaN padding leaked into the reference");
            // The cache still holds NaN in unused slots (the poison is really there).
            let (k, _) = layer_bytes(&case.cache);
            assert!(!cache_images_equal(&k, &vec![0u8; k.len()], DType::BF16));
            assert_eq!(case.query.len(), case.meta().num_tokens() * 8 * 64);
        }
        Ok(())
    }

    /// The CPU kernels (f32 accumulation, like the CUDA ones) meet the tolerance on these
    /// peaked cases, and a merge that forgets the max-logit rescale would not: the check is
    /// both achievable and sharp.
    #[test]
    fn tolerance_is_met_by_the_cpu_kernels_and_misses_a_flat_softmax() -> Result<(), AttnError> {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (name, chunks) in batches() {
                let case = AttnCase::random(geometry(dtype, 16), 4, &chunks, 11)?;
                let want = case.reference()?;
                let cpu = |scale: f32| case.cpu_output(AttnScores { scale, ..case.scores });
                let err = max_rel_error(&cpu(case.scores.scale)?, &want);
                assert!(err <= attention_tolerance(dtype), "{dtype:?} {name}: CPU kernel off by {err:.2e}");
                // The same case with the softmax flattened (logits scaled down 8x) is far off.
                let off = max_rel_error(&cpu(case.scores.scale / 8.0)?, &want);
                assert!(
                    off > 100.0 * attention_tolerance(dtype),
                    "{dtype:?} {name}: a flat softmax is only {off:.2e} off"
                );
            }
        }
        Ok(())
    }

    /// The CPU kernels meet the tolerance on the windowed cases, and every case is one the
    /// window changes: the output without it is far off.
    #[test]
    fn window_cases_are_met_by_the_cpu_kernels_and_need_the_window() -> Result<(), AttnError> {
        for (name, (dtype, head_size, block_size, kv_heads, group), chunks, window) in window_cases() {
            let needed: usize = chunks.iter().map(|&(_, l)| l.div_ceil(block_size)).sum();
            let geometry = CacheGeometry {
                num_blocks: 2 * needed + 3,
                num_kv_heads: kv_heads,
                head_size,
                block_size,
                dtype,
            };
            let mut case = AttnCase::random(geometry, kv_heads * group, &chunks, 5)?;
            let full = case.reference()?;
            case.scores.sliding_window = Some(window);
            let want = case.reference()?;
            let out = case.cpu_output(case.scores)?;
            let err = max_rel_error(&out, &want);
            assert!(err <= attention_tolerance(dtype), "{name} {dtype:?}: CPU kernel off by {err:.2e}");
            let off = max_rel_error(&full, &want);
            assert!(off > 100.0 * attention_tolerance(dtype), "{name}: the window changes only {off:.2e}");
        }
        Ok(())
    }

    /// The prefill batch has what the tiled kernel must get right: chunks whose cached prefix
    /// ends inside a block for blocks of 8, 16 and 32, prompts longer than one tile of 32 rows,
    /// and a decode token in the same batch; the long-prompt cases are long and stay cheap.
    #[test]
    fn the_prefill_batches_cover_chunks_inside_blocks_and_long_prompts() {
        let prefill =
            batches().into_iter().find(|(n, _)| *n == "prefill").map(|(_, b)| b).unwrap_or_default();
        for bs in [8, 16, 32] {
            assert!(prefill.iter().any(|&(q, l)| q > 1 && l > q && (l - q) % bs != 0), "block size {bs}");
        }
        assert!(prefill.iter().any(|&(q, _)| q > 32) && prefill.iter().any(|&(q, _)| q == 1));
        let long = long_prompt_cases();
        assert!(long.iter().any(|(_, _, b)| b.iter().any(|&(q, _)| q >= 2_000)));
        assert!(
            long.iter().any(|(_, (_, _, bs, _, _), b)| b.iter().any(|&(q, l)| l > q && (l - q) % bs != 0))
        );
        for (_, (_, head, _, kv, group), b) in &long {
            // Query-key pairs times heads times dims: the f64 reference's work, < 1.5e10 each.
            let pairs: usize = b.iter().map(|&(q, l)| (0..q).map(|t| l - q + t + 1).sum::<usize>()).sum();
            assert!(pairs * kv * group * head * 2 < 15_000_000_000, "{pairs}");
        }
    }

    /// Every named case asks for a configuration the CUDA kernels are instantiated for (else the
    /// GPU run reports an error instead of a comparison).
    #[test]
    fn every_case_is_a_configuration_the_cuda_kernels_have() {
        use attn_kernels::{CUDA_CACHE_DTYPES, SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES};
        let long = long_prompt_cases().into_iter().map(|(name, config, _)| (name, config));
        let window = window_cases().into_iter().map(|(name, config, _, _)| (name, config));
        for (name, (dtype, head_size, block_size, _, _)) in long.chain(window) {
            assert!(CUDA_CACHE_DTYPES.contains(&dtype), "{name}: {dtype:?}");
            assert!(SUPPORTED_HEAD_SIZES.contains(&head_size), "{name}: head size {head_size}");
            assert!(SUPPORTED_BLOCK_SIZES.contains(&block_size), "{name}: block size {block_size}");
        }
    }

    #[test]
    fn block_tables_are_shuffled_and_distinct() -> Result<(), AttnError> {
        let case = AttnCase::random(geometry(DType::F16, 8), 2, &[(1, 100), (1, 64)], 3)?;
        let used: Vec<u32> = case.metadata.block_tables.iter().copied().filter(|&b| b != u32::MAX).collect();
        let mut sorted = used.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), used.len());
        assert_ne!(used, (0..used.len() as u32).collect::<Vec<_>>());
        Ok(())
    }

    #[test]
    fn errors_and_images() {
        assert_eq!(max_rel_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(max_rel_error(&[f32::NAN], &[1.0]).is_infinite());
        assert!((max_rel_error(&[10.1], &[10.0]) - 0.01).abs() < 1e-6);
        let nan = bf16::NAN.to_bits().to_le_bytes();
        let other_nan = (bf16::NAN.to_bits() | 1).to_le_bytes();
        assert!(cache_images_equal(&nan, &other_nan, DType::BF16));
        assert!(!cache_images_equal(&nan, &bf16::ONE.to_bits().to_le_bytes(), DType::BF16));
    }

    #[test]
    fn figures() {
        let f = decode_figures(1e9, 1e-3, 0.5e-3, 4e12);
        assert!((f.kv_bytes_per_s - 1e12).abs() < 1.0);
        assert!((f.bw_fraction - 0.25).abs() < 1e-12);
        assert!((f.paged_over_contiguous - 2.0).abs() < 1e-12);
    }
}
