//! Whole-block moves of one layer's cache: inside it (copy-on-write) and from another layer of
//! the same block layout (swap out and in). A block is one contiguous run in every tensor —
//! keys, values and, for int8, their scales — so a move is one `memcpy` per tensor.

use crate::{CacheError, LayerCache};

impl LayerCache {
    /// Copies block `src` to block `dst` for every `(src, dst)` pair, in order. Every id is
    /// checked before the first copy.
    pub fn copy_blocks_within(&mut self, pairs: &[(u32, u32)]) -> Result<(), CacheError> {
        let g = self.geometry;
        check_ids(pairs, g.num_blocks, g.num_blocks)?;
        for (bytes, per_block) in self.storage.byte_tensors_mut(&g) {
            for &(s, d) in pairs {
                let (s, d) = (s as usize * per_block, d as usize * per_block);
                bytes.copy_within(s..s + per_block, d);
            }
        }
        Ok(())
    }

    /// Copies block `src` of `from` to block `dst` of `self` for every `(src, dst)` pair. Both
    /// layers must have the same block layout (kv heads, head size, block size, dtype); the
    /// layout and every id are checked before the first copy.
    pub fn copy_blocks_from(&mut self, from: &LayerCache, pairs: &[(u32, u32)]) -> Result<(), CacheError> {
        let (sg, dg) = (from.geometry, self.geometry);
        if !sg.same_block_layout(&dg) {
            return Err(CacheError::LayoutMismatch { src: format!("{sg:?}"), dst: format!("{dg:?}") });
        }
        check_ids(pairs, sg.num_blocks, dg.num_blocks)?;
        let src = from.storage.byte_tensors(&sg);
        for ((dst, per_block), (src, _)) in self.storage.byte_tensors_mut(&dg).into_iter().zip(src) {
            for &(s, d) in pairs {
                let (s, d) = (s as usize * per_block, d as usize * per_block);
                dst[d..d + per_block].copy_from_slice(&src[s..s + per_block]);
            }
        }
        Ok(())
    }
}

fn check_ids(pairs: &[(u32, u32)], num_src: usize, num_dst: usize) -> Result<(), CacheError> {
    for &(s, d) in pairs {
        for (block, num_blocks) in [(s, num_src), (d, num_dst)] {
            if block as usize >= num_blocks {
                return Err(CacheError::BlockOutOfRange { block, num_blocks });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{CacheError, CacheGeometry, DType, LayerCache};

    fn layer(dtype: DType, num_blocks: usize) -> LayerCache {
        LayerCache::new(CacheGeometry { num_blocks, num_kv_heads: 2, head_size: 16, block_size: 8, dtype })
            .unwrap()
    }

    fn row(seed: usize) -> Vec<f32> {
        (0..16).map(|i| ((i * 7 + seed * 13) % 23) as f32 - 11.0 + seed as f32 * 0.1).collect()
    }

    /// Writes a distinct key and value into every slot of block `b`.
    fn fill_block(c: &mut LayerCache, b: usize, seed: usize) {
        for t in 0..8 {
            for h in 0..2 {
                let slot = b * 8 + t;
                c.write_token(slot, h, &row(seed + slot * 2 + h), &row(seed + slot * 3 + h + 1)).unwrap();
            }
        }
    }

    fn block(c: &LayerCache, b: usize) -> Vec<Vec<f32>> {
        (0..8)
            .flat_map(|t| (0..2).flat_map(move |h| [(b * 8 + t, h, true), (b * 8 + t, h, false)]))
            .map(|(slot, h, k)| if k { c.read_key(slot, h).unwrap() } else { c.read_value(slot, h).unwrap() })
            .collect()
    }

    /// Codes and scales move together: the copy reads back exactly as its source.
    #[test]
    fn copies_carry_scales_for_every_dtype() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::Int8] {
            let mut c = layer(dtype, 4);
            fill_block(&mut c, 1, 0);
            fill_block(&mut c, 2, 50);
            let (b1, b2) = (block(&c, 1), block(&c, 2));
            c.copy_blocks_within(&[(1, 3), (2, 0)]).unwrap();
            assert_eq!(block(&c, 3), b1, "{dtype}");
            assert_eq!(block(&c, 0), b2, "{dtype}");
            let mut host = layer(dtype, 2);
            host.copy_blocks_from(&c, &[(1, 0), (2, 1)]).unwrap();
            assert_eq!((block(&host, 0), block(&host, 1)), (b1.clone(), b2), "{dtype}");
            let mut back = layer(dtype, 4);
            back.copy_blocks_from(&host, &[(0, 2)]).unwrap();
            assert_eq!(block(&back, 2), b1, "{dtype}");
        }
    }

    #[test]
    fn bad_ids_and_layouts_are_errors_before_any_copy() {
        let mut c = layer(DType::Int8, 4);
        fill_block(&mut c, 0, 3);
        let before = block(&c, 1);
        assert_eq!(
            c.copy_blocks_within(&[(0, 1), (0, 4)]),
            Err(CacheError::BlockOutOfRange { block: 4, num_blocks: 4 })
        );
        assert_eq!(block(&c, 1), before);
        let mut other = layer(DType::BF16, 4);
        assert!(matches!(other.copy_blocks_from(&c, &[(0, 0)]), Err(CacheError::LayoutMismatch { .. })));
    }
}
