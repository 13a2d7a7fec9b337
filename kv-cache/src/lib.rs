//! `kv-cache`: device memory for the KV cache — dtypes, devices, the per-layer K/V tensors in vLLM layout, sizing, swap space.
//!
//! Layout (vLLM's, so kernels and readers can be compared):
//! - key cache of a layer: `[num_blocks, num_kv_heads, head_size / x, block_size, x]`, `x = 16 / sizeof(dtype)`
//!   (int8: 8);
//! - value cache of a layer: `[num_blocks, num_kv_heads, head_size, block_size]`;
//! - int8 only: bf16 scales, keys' `[num_blocks, num_kv_heads, head_size / key_group, block_size]`,
//!   values' `[num_blocks, num_kv_heads, block_size]` (`int8`);
//! - slot of token `i` of a sequence = `block_table[i / block_size] * block_size + i % block_size`.
//!
//! Every block is one contiguous run of `num_kv_heads * head_size * block_size` elements in both
//! tensors (and one contiguous run in each scale tensor), which is what makes block copies
//! (copy-on-write) and swaps plain `memcpy`s.
//! All memory is allocated once by [`KvCache::new`]; nothing here grows afterwards.
//!
//! With the `cuda` feature, `cuda` holds the same memory on a GPU (`CudaKvCache`,
//! `DeviceLayerCache`, the pinned `SwapLayer`s, `blocks_for_memory`) and nothing else: it takes
//! the cudarc stream to allocate and copy on, while the device itself (`CudaDevice`, opening,
//! `driver_present`) and every kernel over the memory live in `attn_kernels::cuda`.

mod blocks;
mod cache;
mod config;
mod device;
mod dtype;
mod error;
mod huge_pages;
pub mod int8;
mod layer;
mod layout;

pub use cache::KvCache;
pub use config::{BlockShape, CacheConfig};
pub use device::Device;
pub use dtype::{CacheElem, DType};
pub use error::CacheError;
pub use layer::{CacheGeometry, CacheSlices, CacheSlicesMut, LayerCache};
pub use layout::{KvLayout, LayerPlace};

#[cfg(feature = "cuda")]
pub mod cuda;
