//! Cache configuration and sizing from a memory budget.

use crate::{CacheError, CacheGeometry, DType, Device};

/// What one block looks like across all layers; everything except how many blocks there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockShape {
    pub block_size: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_size: usize,
    pub dtype: DType,
}

impl BlockShape {
    /// Bytes of one block in one layer, key + value (with int8's scales).
    pub fn bytes_per_block_per_layer(&self) -> usize {
        self.num_kv_heads * self.block_size * self.dtype.kv_bytes_per_head(self.head_size)
    }

    /// Bytes of one block across all layers, key + value: the unit the budget is cut into.
    pub fn bytes_per_block(&self) -> usize {
        self.num_layers * self.bytes_per_block_per_layer()
    }

    /// Checks what the layout needs: non-zero dims and `head_size % x == 0`.
    ///
    /// Which block and head sizes the kernels implement is the kernels' business
    /// (`attn-kernels` rejects the others with a typed error); the layout itself is generic.
    pub fn validate(&self) -> Result<(), CacheError> {
        if self.num_layers == 0 || self.num_kv_heads == 0 || self.head_size == 0 || self.block_size == 0 {
            return Err(CacheError::InvalidShape(format!(
                "num_layers {}, num_kv_heads {}, head_size {}, block_size {} must all be > 0",
                self.num_layers, self.num_kv_heads, self.head_size, self.block_size
            )));
        }
        let x = self.dtype.x();
        if !self.head_size.is_multiple_of(x) {
            return Err(CacheError::HeadSizeNotMultipleOfX {
                head_size: self.head_size,
                x,
                dtype: self.dtype,
            });
        }
        Ok(())
    }
}

/// Full cache configuration: block shape plus how many device and host (swap) blocks exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    pub block_size: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_size: usize,
    pub dtype: DType,
    /// Blocks on `device` (per layer; every layer has the same number).
    pub num_blocks: usize,
    /// Blocks of the host-side swap cache (same per-block layout); 0 disables swapping.
    pub num_swap_blocks: usize,
    pub device: Device,
}

impl CacheConfig {
    pub fn new(shape: BlockShape, num_blocks: usize, num_swap_blocks: usize) -> Self {
        CacheConfig {
            block_size: shape.block_size,
            num_layers: shape.num_layers,
            num_kv_heads: shape.num_kv_heads,
            head_size: shape.head_size,
            dtype: shape.dtype,
            num_blocks,
            num_swap_blocks,
            device: Device::Cpu,
        }
    }

    pub fn shape(&self) -> BlockShape {
        BlockShape {
            block_size: self.block_size,
            num_layers: self.num_layers,
            num_kv_heads: self.num_kv_heads,
            head_size: self.head_size,
            dtype: self.dtype,
        }
    }

    /// One layer's geometry with `num_blocks` blocks: the device layers and the swap layers
    /// differ only in that count.
    pub fn layer_geometry(&self, num_blocks: usize) -> CacheGeometry {
        CacheGeometry {
            num_blocks,
            num_kv_heads: self.num_kv_heads,
            head_size: self.head_size,
            block_size: self.block_size,
            dtype: self.dtype,
        }
    }

    /// Bytes of one block across all layers, key + value.
    pub fn bytes_per_block(&self) -> usize {
        self.shape().bytes_per_block()
    }

    /// Total bytes of the device cache (all layers, K + V).
    pub fn device_bytes(&self) -> usize {
        self.num_blocks.saturating_mul(self.bytes_per_block())
    }

    /// Total bytes of the host swap cache.
    pub fn swap_bytes(&self) -> usize {
        self.num_swap_blocks.saturating_mul(self.bytes_per_block())
    }

    /// Tokens the device cache holds.
    pub fn num_slots(&self) -> usize {
        self.num_blocks.saturating_mul(self.block_size)
    }

    /// Sizes the cache from byte budgets: `num_blocks = device_budget / bytes_per_block`.
    ///
    /// Fails with [`CacheError::ModelLenDoesNotFit`] (naming the largest `max_model_len` that
    /// would fit) when one sequence of `max_model_len` tokens cannot be held.
    pub fn from_memory_budget(
        shape: BlockShape,
        device_budget_bytes: usize,
        swap_budget_bytes: usize,
        max_model_len: usize,
    ) -> Result<Self, CacheError> {
        shape.validate()?;
        let per_block = shape.bytes_per_block();
        let num_blocks = device_budget_bytes / per_block;
        let needed_blocks = max_model_len.div_ceil(shape.block_size);
        if num_blocks < needed_blocks.max(1) {
            return Err(CacheError::ModelLenDoesNotFit {
                budget_bytes: device_budget_bytes,
                max_model_len,
                block_size: shape.block_size,
                num_blocks,
                needed_blocks,
                largest_fitting_len: num_blocks * shape.block_size,
            });
        }
        Ok(CacheConfig::new(shape, num_blocks, swap_budget_bytes / per_block))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> BlockShape {
        BlockShape { block_size: 16, num_layers: 30, num_kv_heads: 3, head_size: 64, dtype: DType::F16 }
    }

    #[test]
    fn bytes_per_block_counts_all_layers_and_both_tensors() {
        // 2 (K,V) * 3 heads * 64 * 16 tokens * 2 bytes * 30 layers
        assert_eq!(shape().bytes_per_block(), 2 * 3 * 64 * 16 * 2 * 30);
    }

    #[test]
    fn budget_is_cut_into_whole_blocks() {
        let per = shape().bytes_per_block();
        let cfg = CacheConfig::from_memory_budget(shape(), per * 100 + per / 2, per * 7, 1600).unwrap();
        assert_eq!(cfg.num_blocks, 100);
        assert_eq!(cfg.num_swap_blocks, 7);
        assert_eq!(cfg.num_slots(), 1600);
    }

    #[test]
    fn too_small_a_budget_names_the_largest_fitting_len() {
        let per = shape().bytes_per_block();
        let err = CacheConfig::from_memory_budget(shape(), per * 100, 0, 1601).unwrap_err();
        match err {
            CacheError::ModelLenDoesNotFit { largest_fitting_len, needed_blocks, num_blocks, .. } => {
                assert_eq!(largest_fitting_len, 1600);
                assert_eq!(needed_blocks, 101);
                assert_eq!(num_blocks, 100);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("1600"));
    }

    #[test]
    fn zero_budget_is_an_error_even_for_tiny_models() {
        assert!(CacheConfig::from_memory_budget(shape(), 0, 0, 0).is_err());
    }

    #[test]
    fn shapes_the_layout_cannot_hold_are_rejected() {
        let mut s = shape();
        s.block_size = 0;
        assert!(matches!(s.validate(), Err(CacheError::InvalidShape(_))));
        let mut s = shape();
        s.head_size = 68; // not a multiple of x = 8 for f16
        assert!(matches!(s.validate(), Err(CacheError::HeadSizeNotMultipleOfX { .. })));
        let mut s = shape();
        s.num_kv_heads = 0;
        assert!(matches!(s.validate(), Err(CacheError::InvalidShape(_))));
    }
}
