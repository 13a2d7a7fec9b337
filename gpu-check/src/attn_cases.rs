//! The GPU check (run on a lent GPU by the `gpu_check` binary): every CUDA kernel against the
//! CPU reference on random data, then the bandwidth figures. The host side — random cases with
//! NaN-poisoned caches and shuffled block tables, the tolerance check, the placement of a small
//! case's blocks at the far end of a pool past 2³² elements ([`FarPlacement`]), the figure
//! arithmetic — lives here so it is unit-tested on machines without a GPU.

use half::{bf16, f16};
use kv_cache::{CacheGeometry, DType, LayerCache};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use attn_kernels::{AttnError, PagedAttnMetadata};

/// One attention batch on one layer: a NaN-poisoned cache whose used slots hold random K/V,
/// shuffled physical blocks, and random queries.
#[derive(Debug)]
pub struct AttnCase {
    pub cache: LayerCache,
    pub query: Vec<f32>,
    pub query_start_loc: Vec<usize>,
    pub seq_lens: Vec<usize>,
    /// A persistent table as the engine keeps it: sequence `s` reads row `seq_rows[s]` (rows in
    /// reverse order, behind two rows of out-of-range ids nobody reads).
    pub block_tables: Vec<u32>,
    pub max_blocks_per_seq: usize,
    pub seq_rows: Vec<u32>,
    pub num_heads: usize,
    pub scale: f32,
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
        let mut slots = Vec::new();
        for (&(_, len), &r) in chunks.iter().zip(&seq_rows) {
            let row = &mut block_tables[r as usize * max_blocks_per_seq..][..max_blocks_per_seq];
            for b in row.iter_mut().take(len.div_ceil(bs)) {
                *b = next.next().unwrap_or(0);
            }
            slots.extend((0..len).map(|i| (row[i / bs] as usize * bs + i % bs) as i64));
        }
        let row = geometry.num_kv_heads * geometry.head_size;
        let kv: Vec<f32> = (0..slots.len() * row).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let vv: Vec<f32> = (0..slots.len() * row).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        attn_kernels::reshape_and_cache(&kv, &vv, &slots, &mut cache)?;
        let mut query_start_loc = vec![0];
        for &(q, _) in chunks {
            query_start_loc.push(query_start_loc.last().copied().unwrap_or(0) + q);
        }
        let num_tokens = query_start_loc.last().copied().unwrap_or(0);
        // Queries of U(-1, 1) give logits of std 1/3 after the 1/sqrt(d) scale: a nearly flat
        // softmax that forgives a missing max-logit rescale. QUERY_GAIN makes the logits' std
        // ~8, so a few keys dominate and every partition of v2 has its own maximum.
        let query = (0..num_tokens * num_heads * geometry.head_size)
            .map(|_| QUERY_GAIN * rng.random_range(-1.0f32..1.0))
            .collect();
        let case = AttnCase {
            cache,
            query,
            query_start_loc,
            seq_lens: chunks.iter().map(|&(_, l)| l).collect(),
            block_tables,
            max_blocks_per_seq,
            seq_rows,
            num_heads,
            scale: 1.0 / (geometry.head_size as f32).sqrt(),
        };
        Ok((case, CacheInputs { key: kv, value: vv, slots }))
    }

    pub fn meta(&self) -> PagedAttnMetadata<'_> {
        PagedAttnMetadata {
            query_start_loc: &self.query_start_loc,
            seq_lens: &self.seq_lens,
            block_tables: &self.block_tables,
            max_blocks_per_seq: self.max_blocks_per_seq,
            seq_rows: Some(&self.seq_rows),
        }
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
            self.scale,
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

/// Query heads per KV head of the far-offset case.
pub const FAR_GROUP: usize = 4;

/// Blocks of the far-offset case's pool: with [`far_geometry`]'s 16 384 elements (32 KiB of
/// bf16) per block and tensor, block 2¹⁸ starts at element 2³², and the pool is 4.31·10⁹
/// elements (8.6 GB) per tensor, 17.2 GB for keys and values together.
pub const FAR_POOL_BLOCKS: usize = (1 << 18) + 1024;

/// The far-offset case's cache shape (`num_blocks` blocks): bf16, 8 KV heads of 128, blocks of
/// 16 tokens.
pub fn far_geometry(num_blocks: usize) -> CacheGeometry {
    CacheGeometry { num_blocks, num_kv_heads: 8, head_size: 128, block_size: 16, dtype: DType::BF16 }
}

/// The far-offset case's batch: a decode over three v2 partitions, a 17-token chunk over two,
/// and a short decode (106 blocks in all).
pub fn far_batch() -> Vec<(usize, usize)> {
    vec![(1, 1_100), (17, 530), (1, 37)]
}

/// Element offset of the `(block, kv_head)` tile in either tensor of `g`, in 64 bits (the
/// arithmetic the kernels must do in 64 bits too).
pub fn tile_offset(g: &CacheGeometry, block: usize, kv_head: usize) -> u64 {
    (block as u64 * g.num_kv_heads as u64 + kv_head as u64) * g.block_head_elems() as u64
}

/// Bytes of one block (every KV head) in one tensor of `g`.
pub fn block_bytes(g: &CacheGeometry) -> usize {
    g.block_elems() * g.dtype.size_in_bytes()
}

/// `bytes` bytes of NaN elements of `dtype` (the poison of unused cache memory).
pub fn nan_bytes(bytes: usize, dtype: DType) -> Vec<u8> {
    let one: Vec<u8> = match dtype {
        DType::F32 => f32::NAN.to_le_bytes().to_vec(),
        DType::F16 => f16::NAN.to_le_bytes().to_vec(),
        DType::BF16 => bf16::NAN.to_le_bytes().to_vec(),
    };
    one.iter().copied().cycle().take(bytes).collect()
}

/// Spare pool blocks below a [`FarPlacement`] (two, consecutive: a swap-in run).
const SPARE_BLOCKS: usize = 2;

/// A small case's blocks placed at the far end of a pool too large to mirror on the host: small
/// block `b` is pool block `pool − 1 − 2b`, so a gap block (NaN on the device) sits between any
/// two placed blocks and a read one block off shows, and two consecutive spare blocks lie below
/// them. The device check writes, reads, copies and swaps only this tail; the CPU reference runs
/// on the small case.
#[derive(Debug, Clone, Copy)]
pub struct FarPlacement {
    small: CacheGeometry,
    pool: CacheGeometry,
}

impl FarPlacement {
    /// The placement of `small`'s blocks in a pool of `pool_blocks` blocks of the same layout,
    /// if they fit (pool block ids are the kernels' `i32`s).
    pub fn at_end(small: CacheGeometry, pool_blocks: usize) -> Result<Self, AttnError> {
        let span = small.num_blocks.checked_mul(2).and_then(|n| n.checked_add(SPARE_BLOCKS));
        match span {
            Some(span) if span <= pool_blocks && i32::try_from(pool_blocks).is_ok() => {
                Ok(FarPlacement { small, pool: CacheGeometry { num_blocks: pool_blocks, ..small } })
            }
            _ => Err(AttnError::BlockOutOfRange {
                block: span.unwrap_or(usize::MAX) as u64,
                num_blocks: pool_blocks,
            }),
        }
    }

    pub fn small(&self) -> CacheGeometry {
        self.small
    }
    pub fn pool(&self) -> CacheGeometry {
        self.pool
    }

    /// The pool block holding small block `b`.
    pub fn block(&self, b: usize) -> usize {
        self.pool.num_blocks - 1 - 2 * b
    }

    /// The gap block just below small block `b`'s place (the placement never writes it).
    pub fn gap(&self, b: usize) -> usize {
        self.block(b) - 1
    }

    /// Two consecutive free pool blocks below the placement.
    pub fn spares(&self) -> [usize; SPARE_BLOCKS] {
        let s = self.tail().start;
        [s, s + 1]
    }

    /// The pool blocks the placement spans: spares, placed blocks and gaps.
    pub fn tail(&self) -> std::ops::Range<usize> {
        self.pool.num_blocks - 2 * self.small.num_blocks - SPARE_BLOCKS..self.pool.num_blocks
    }

    /// [`FarPlacement::tail`] in bytes of either tensor.
    pub fn tail_bytes(&self) -> std::ops::Range<usize> {
        let (tail, bb) = (self.tail(), block_bytes(&self.pool));
        tail.start * bb..tail.end * bb
    }

    /// Lowest element offset of a `(block, kv head)` tile of a placed block.
    pub fn min_tile_offset(&self) -> u64 {
        tile_offset(&self.pool, self.block(self.small.num_blocks.saturating_sub(1)), 0)
    }

    /// A block table of the small cache, pointing at the pool (entries that are not small
    /// blocks, the `u32::MAX` padding nobody reads, stay as they are).
    pub fn table(&self, table: &[u32]) -> Vec<u32> {
        let n = self.small.num_blocks;
        table.iter().map(|&b| if (b as usize) < n { self.block(b as usize) as u32 } else { b }).collect()
    }

    /// A slot mapping of the small cache, pointing at the pool (negative slots stay padding).
    pub fn slots(&self, slots: &[i64]) -> Vec<i64> {
        let bs = self.small.block_size as i64;
        slots
            .iter()
            .map(|&s| if s < 0 { s } else { self.block((s / bs) as usize) as i64 * bs + s % bs })
            .collect()
    }

    /// What the tail of one pool tensor holds once it was poisoned with NaN and the small
    /// cache's tensor `small_tensor` (its raw bytes) was written at the placement.
    pub fn tail_image(&self, small_tensor: &[u8]) -> Vec<u8> {
        let (tail, bb) = (self.tail(), block_bytes(&self.pool));
        let mut image = nan_bytes(tail.len() * bb, self.pool.dtype);
        for (b, block) in small_tensor.chunks_exact(bb).enumerate().take(self.small.num_blocks) {
            let at = (self.block(b) - tail.start) * bb;
            image[at..at + bb].copy_from_slice(block);
        }
        image
    }

    /// The block moves the far case checks, between tail blocks of `table` (the small case's
    /// table): two copy-on-write copies of placed blocks into gaps, and two placed blocks
    /// swapped out to swap slots 0 and 1 and back in to the two (consecutive) spare blocks.
    pub fn moves(&self, table: &[u32]) -> FarMoves {
        let mut used: Vec<usize> = Vec::new();
        for &b in table {
            if (b as usize) < self.small.num_blocks && !used.contains(&(b as usize)) && used.len() < 4 {
                used.push(b as usize);
            }
        }
        let id = |b: usize| b as u32;
        let placed: Vec<u32> = used.iter().map(|&b| id(self.block(b))).collect();
        let spares = self.spares();
        let (copies, swapped) = placed.split_at(placed.len().min(2));
        FarMoves {
            copies: copies.iter().enumerate().map(|(i, &src)| (src, id(self.gap(i)))).collect(),
            swap_out: swapped.iter().enumerate().map(|(i, &src)| (src, i as u32)).collect(),
            swap_in: (0..swapped.len()).map(|i| (i as u32, id(spares[i]))).collect(),
        }
    }

    /// A tail image after `moves` ran on the pool (copies first, then the swap round trip).
    pub fn apply_moves(&self, image: &mut [u8], moves: &FarMoves) {
        for &(src, dst) in &moves.copies {
            self.copy_in_image(image, src as usize, dst as usize);
        }
        for &(slot, dst) in &moves.swap_in {
            if let Some(&(src, _)) = moves.swap_out.iter().find(|&&(_, s)| s == slot) {
                self.copy_in_image(image, src as usize, dst as usize);
            }
        }
    }

    /// Copies pool block `src` to pool block `dst` in a tail image (what a block copy or a
    /// swap-out and swap-in do to the device tensors).
    pub fn copy_in_image(&self, image: &mut [u8], src: usize, dst: usize) {
        let (start, bb) = (self.tail().start, block_bytes(&self.pool));
        image.copy_within((src - start) * bb..(src - start + 1) * bb, (dst - start) * bb);
    }
}

/// Block moves of the far case, in pool blocks (see [`FarPlacement::moves`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FarMoves {
    /// Copy-on-write `(src, dst)` pairs.
    pub copies: Vec<(u32, u32)>,
    /// `(pool block, swap slot)` pairs.
    pub swap_out: Vec<(u32, u32)>,
    /// `(swap slot, pool block)` pairs.
    pub swap_in: Vec<(u32, u32)>,
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
            assert_eq!(case.query.len(), case.query_start_loc.last().copied().unwrap_or(0) * 8 * 64);
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
                let cpu = |scale: f32| -> Result<Vec<f32>, AttnError> {
                    let mut out = vec![0.0f32; case.query.len()];
                    attn_kernels::paged_attention(
                        &mut out,
                        &case.query,
                        &case.cache,
                        &case.meta(),
                        4,
                        scale,
                    )?;
                    Ok(out)
                };
                let err = max_rel_error(&cpu(case.scale)?, &want);
                assert!(err <= attention_tolerance(dtype), "{dtype:?} {name}: CPU kernel off by {err:.2e}");
                // The same case with the softmax flattened (logits scaled down 8x) is far off.
                let off = max_rel_error(&cpu(case.scale / 8.0)?, &want);
                assert!(
                    off > 100.0 * attention_tolerance(dtype),
                    "{dtype:?} {name}: a flat softmax is only {off:.2e} off"
                );
            }
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

    #[test]
    fn block_tables_are_shuffled_and_distinct() -> Result<(), AttnError> {
        let case = AttnCase::random(geometry(DType::F16, 8), 2, &[(1, 100), (1, 64)], 3)?;
        let used: Vec<u32> = case.block_tables.iter().copied().filter(|&b| b != u32::MAX).collect();
        let mut sorted = used.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), used.len());
        assert_ne!(used, (0..used.len() as u32).collect::<Vec<_>>());
        Ok(())
    }

    /// #17: every tile the far case touches starts past 2³² elements (2³³ bytes), so an offset
    /// computed in 32 bits, signed or unsigned, lands somewhere else; what the device run
    /// poisons, writes and reads back stays a few MiB.
    #[test]
    fn the_far_case_lies_past_2_pow_32_elements_and_stays_cheap() -> Result<(), AttnError> {
        let needed: usize = far_batch().iter().map(|&(_, l)| l.div_ceil(16)).sum();
        assert_eq!(needed, 106);
        let place = FarPlacement::at_end(far_geometry(2 * needed + 3), FAR_POOL_BLOCKS)?;
        let pool = place.pool();
        let past = 1u64 << 32;
        assert!(place.min_tile_offset() >= past, "{}", place.min_tile_offset());
        assert!(tile_offset(&pool, place.tail().start, 0) >= past);
        assert!(place.tail_bytes().start as u64 >= 2 * past, "bf16: byte offsets past 2^33");
        // The pool's last tile ends exactly at the tensor's end: the same index math.
        let last = tile_offset(&pool, pool.num_blocks - 1, pool.num_kv_heads - 1);
        assert_eq!(last + pool.block_head_elems() as u64, pool.tensor_elems() as u64);
        // 8.6 GB a tensor on the device, 14 MB of it poisoned, written and read back.
        let tensor = pool.tensor_elems() * 2;
        assert!((8_500_000_000..8_700_000_000).contains(&tensor), "{tensor} B");
        assert_eq!(place.tail_bytes().len(), (2 * (2 * needed + 3) + 2) * 32 * 1024);
        assert!(place.tail_bytes().len() < 16 << 20);

        let (case, inputs) = AttnCase::with_inputs(place.small(), 8 * FAR_GROUP, &far_batch(), 1)?;
        let table = place.table(&case.block_tables);
        let used: Vec<u32> = table.iter().copied().filter(|&b| b != u32::MAX).collect();
        assert_eq!(used.len(), needed);
        for &b in &used {
            assert!(place.tail().contains(&(b as usize)) && tile_offset(&pool, b as usize, 0) >= past);
        }
        for s in place.slots(&inputs.slots) {
            assert!(s >= 0 && (s as usize) < pool.num_slots());
            assert!(pool.key_index(s as usize, 0, 0) as u64 >= past);
        }
        let moves = place.moves(&case.block_tables);
        assert_eq!((moves.copies.len(), moves.swap_out.len(), moves.swap_in.len()), (2, 2, 2));
        let pool_blocks = moves.copies.iter().flat_map(|&(a, b)| [a, b]);
        let swapped = moves.swap_out.iter().map(|p| p.0).chain(moves.swap_in.iter().map(|p| p.1));
        for block in pool_blocks.chain(swapped) {
            assert!(
                place.tail().contains(&(block as usize)) && tile_offset(&pool, block as usize, 0) >= past
            );
        }
        Ok(())
    }

    /// The placement where the host can mirror the whole pool: the CPU kernels, fed the placed
    /// slots, table and moves, produce exactly the tail images and the attention the device
    /// check expects from the small case.
    #[test]
    fn a_placed_case_writes_reads_and_moves_like_the_small_one() -> Result<(), AttnError> {
        let small = CacheGeometry {
            num_blocks: 20,
            num_kv_heads: 2,
            head_size: 64,
            block_size: 8,
            dtype: DType::F16,
        };
        let (case, inputs) = AttnCase::with_inputs(small, 4, &[(1, 40), (3, 50), (1, 9)], 9)?;
        assert!(FarPlacement::at_end(small, 41).is_err());
        let place = FarPlacement::at_end(small, 2 * 20 + 2 + 5)?;
        let shape = kv_cache::BlockShape {
            block_size: 8,
            num_layers: 1,
            num_kv_heads: 2,
            head_size: 64,
            dtype: DType::F16,
        };
        let mut pool = kv_cache::KvCache::new(kv_cache::CacheConfig::new(shape, place.pool().num_blocks, 2))?;
        let layer = &mut pool.layers_mut()[0];
        layer.fill(f32::NAN);
        attn_kernels::reshape_and_cache(&inputs.key, &inputs.value, &place.slots(&inputs.slots), layer)?;

        let tail = place.tail_bytes();
        let (sk, sv) = layer_bytes(&case.cache);
        let (mut want_k, mut want_v) = (place.tail_image(&sk), place.tail_image(&sv));
        let (pk, pv) = layer_bytes(pool.layer(0));
        assert!(cache_images_equal(&pk[tail.clone()], &want_k, DType::F16));
        assert!(cache_images_equal(&pv[tail.clone()], &want_v, DType::F16));
        assert!(cache_images_equal(&pk[..tail.start], &nan_bytes(tail.start, DType::F16), DType::F16));
        // The image is not trivially NaN: the placed blocks hold the small cache's values.
        assert!(!cache_images_equal(&want_k, &nan_bytes(want_k.len(), DType::F16), DType::F16));

        let table = place.table(&case.block_tables);
        let meta = PagedAttnMetadata { block_tables: &table, ..case.meta() };
        let mut out = vec![0.0; case.query.len()];
        attn_kernels::reference::paged_attention(&mut out, &case.query, pool.layer(0), &meta, 4, case.scale)?;
        assert_eq!(out, case.reference()?);

        let moves = place.moves(&case.block_tables);
        attn_kernels::copy_blocks(&mut pool, &moves.copies)?;
        attn_kernels::swap_out(&mut pool, &moves.swap_out)?;
        attn_kernels::swap_in(&mut pool, &moves.swap_in)?;
        place.apply_moves(&mut want_k, &moves);
        place.apply_moves(&mut want_v, &moves);
        let (pk, pv) = layer_bytes(pool.layer(0));
        assert!(cache_images_equal(&pk[tail.clone()], &want_k, DType::F16));
        assert!(cache_images_equal(&pv[tail.clone()], &want_v, DType::F16));
        // The moves changed the image (a spare now holds a placed block's values).
        assert!(!cache_images_equal(&want_k, &place.tail_image(&sk), DType::F16));
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
