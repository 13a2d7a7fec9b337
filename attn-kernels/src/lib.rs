//! `attn-kernels`: every compute kernel of the engine, CPU and CUDA (behind `cuda`): the device
//! code over the paged KV layout — write-to-cache, paged attention, copy/swap — and the CPU
//! kernels of the rest of a decoder layer ([`cpu`]: quantized and f32 matmul, RMSNorm, SwiGLU,
//! RoPE, ggml's block formats).
//!
//! The attention kernels: one public function per kernel; each validates all of its input first and returns a typed
//! [`AttnError`] before writing anything. Activations (`query`, `key`, `value`, `out`) are `f32`;
//! the cache is in its own dtype (f32/f16/bf16) and every dot product accumulates in `f32`.
//!
//! - [`reshape_and_cache`]: scatter new K/V rows into their slots (negative slot = padding).
//! - [`paged_attention`]: one entry point for decode, prefill, chunked prefill and mixed batches.
//!   A pure-decode batch goes down the decode path (two-pass softmax per sequence, or the
//!   split-context "v2"/flash-decoding path with a log-sum-exp merge when there are too few
//!   sequences to fill the cores); chunks longer than one token go down a causal tiled path with
//!   an online softmax.
//! - [`copy_blocks`] (copy-on-write), [`swap_blocks`], [`swap_out`], [`swap_in`].
//! - [`backend`]: the same kernels generic over the device ([`backend::Cpu`], and with `cuda` the
//!   CUDA twins): what a forward pass calls so that it never branches on the device.
//! - `reference` (feature `testing`): naive gather-through-the-block-table versions with an
//!   `f64` softmax, the oracles of tests, benches and the GPU check; `testing` (the same
//!   feature): the owned batch metadata they build their batches into; `yardstick` (the same
//!   feature): the read-only sum that bandwidth-bound kernels are measured against.
//! - [`cpu`]: `Weight` (a matrix in its storage format) and `x·Wᵀ` over it, the f32 `linear`,
//!   `norm`, `act`, `rope`, and `ggml`'s formats.
//!
//! [`file::write_atomically`] writes a file whole (the cubin cache, the GPU run's records).
//!
//! The CPU code uses every rayon thread, AVX-512 or AVX2/FMA/F16C inner loops chosen once at
//! run time ([`Isa`], the one detection for every CPU kernel; portable fallback otherwise), and
//! per-thread scratch so the hot loop never allocates.

/// Evaluates `$body` with `$key` and `$value` bound to the tensors of `$slices` (a
/// `kv_cache::$kind`: `CacheSlices` or `CacheSlicesMut`) in their own element type; a storage the
/// CPU kernels lack makes the calling function return [`AttnError::UnsupportedStorage`].
macro_rules! by_dtype {
    ($kind:ident, $slices:expr, |$key:ident, $value:ident| $body:expr) => {
        match $slices {
            kv_cache::$kind::F32 { key: $key, value: $value } => $body,
            kv_cache::$kind::F16 { key: $key, value: $value } => $body,
            kv_cache::$kind::BF16 { key: $key, value: $value } => $body,
            _ => return Err($crate::AttnError::UnsupportedStorage),
        }
    };
}

mod attention;
pub mod backend;
mod block_ops;
mod cache_write;
pub mod cpu;
mod error;
pub mod file;
mod isa;
mod meta;
#[cfg(feature = "testing")]
pub mod reference;
mod simd;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "testing")]
pub mod yardstick;

pub use attention::{AttnOptions, SplitPolicy, paged_attention};
pub use block_ops::{copy_blocks, swap_blocks, swap_in, swap_out};
pub use cache_write::reshape_and_cache;
pub use error::AttnError;
pub use isa::Isa;
pub use meta::{
    AttnScores, CUDA_CACHE_DTYPES, PagedAttnMetadata, SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES,
};

#[cfg(feature = "cuda")]
pub mod cuda;
