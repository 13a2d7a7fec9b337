//! Typed errors of cache construction, sizing and access.

use crate::{DType, Device};

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheError {
    #[error("invalid cache shape: {0}")]
    InvalidShape(String),
    #[error(
        "head_size {head_size} is not a multiple of x = {x} (16 bytes of {dtype}), which the key layout needs"
    )]
    HeadSizeNotMultipleOfX { head_size: usize, x: usize, dtype: DType },
    #[error(
        "memory budget of {budget_bytes} bytes holds {num_blocks} blocks of {block_size} tokens, \
         fewer than one sequence of max_model_len {max_model_len} needs ({needed_blocks} blocks); \
         the largest max_model_len that fits is {largest_fitting_len}"
    )]
    ModelLenDoesNotFit {
        budget_bytes: usize,
        max_model_len: usize,
        block_size: usize,
        num_blocks: usize,
        needed_blocks: usize,
        largest_fitting_len: usize,
    },
    #[error("cache of {bytes} bytes overflows the address space")]
    TooLarge { bytes: u128 },
    #[error("the host cache has no {0} storage (the CPU's 8-bit KV cache is int8)")]
    UnsupportedDtype(DType),
    #[error("device {0} is not available in this build")]
    UnsupportedDevice(Device),
    #[error("slot {slot} out of range: the cache has {num_slots} slots")]
    SlotOutOfRange { slot: usize, num_slots: usize },
    #[error("kv head {kv_head} out of range: the cache has {num_kv_heads} kv heads")]
    KvHeadOutOfRange { kv_head: usize, num_kv_heads: usize },
    #[error("block {block} out of range: the cache has {num_blocks} blocks")]
    BlockOutOfRange { block: u32, num_blocks: usize },
    #[error("source and destination caches differ in block layout: {src} vs {dst}")]
    LayoutMismatch { src: String, dst: String },
    #[error("layer {layer} out of range: the cache has {num_layers} layers")]
    LayerOutOfRange { layer: usize, num_layers: usize },
}
