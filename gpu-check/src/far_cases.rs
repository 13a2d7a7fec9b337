//! The far-offset case of the kernel check: a small attention case whose blocks, slots and
//! block moves are placed at the end of a pool past 2³² elements ([`FarPlacement`]), so that a
//! kernel computing an offset in 32 bits reads or writes the wrong place, while the host mirrors
//! only the pool's tail and the CPU reference runs on the small case. Apart from `attn_cases.rs`
//! because it is a placement (pool arithmetic and byte images), not a case generator.

use kv_cache::{CacheGeometry, DType};

use attn_kernels::AttnError;

use crate::attn_cases::nan_bytes;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn_cases::{AttnCase, cache_images_equal, layer_bytes};
    use attn_kernels::PagedAttnMetadata;

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
        let table = place.table(&case.metadata.block_tables);
        let used: Vec<u32> = table.iter().copied().filter(|&b| b != u32::MAX).collect();
        assert_eq!(used.len(), needed);
        for &b in &used {
            assert!(place.tail().contains(&(b as usize)) && tile_offset(&pool, b as usize, 0) >= past);
        }
        for s in place.slots(&inputs.slots) {
            assert!(s >= 0 && (s as usize) < pool.num_slots());
            assert!(pool.key_index(s as usize, 0, 0) as u64 >= past);
        }
        let moves = place.moves(&case.metadata.block_tables);
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

        let table = place.table(&case.metadata.block_tables);
        let meta = PagedAttnMetadata { block_tables: &table, ..case.meta() };
        let mut out = vec![0.0; case.query.len()];
        attn_kernels::reference::paged_attention(
            &mut out,
            &case.query,
            pool.layer(0),
            &meta,
            4,
            case.scores,
        )?;
        assert_eq!(out, case.reference()?);

        let moves = place.moves(&case.metadata.block_tables);
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
}
