//! `attn-kernels`: the device code over the paged KV layout, CPU and CUDA (behind `cuda`) —
//! write-to-cache, paged attention, copy/swap — the CPU kernels of the rest of a decoder layer
//! beside the matmuls ([`cpu`]: RMSNorm, gated activations, RoPE), and the backend op API.
//! The weight formats and the matmuls over them are `quant-kernels`'; [`Isa`], the one
//! instruction-set choice of every CPU kernel, is re-exported from there.
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
//! - [`cpu`]: the f32 `norm`, `act` and `rope` kernels, and [`cpu::ops::CpuOps`].
//! - [`layer_ops`]: [`layer_ops::LayerOps`], every other op of a decoder step as one method per
//!   op, the CPU's and (with `cuda`) the GPU's of one shape.
//!
//! [`file::write_atomically`] writes a file whole (the cubin cache, the GPU run's records).
//!
//! The CPU code uses every rayon thread, AVX-512 or AVX2/FMA/F16C inner loops chosen once at
//! run time ([`Isa`]; portable fallback otherwise), and per-thread scratch so the hot loop
//! never allocates.

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
pub mod layer_ops;
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
pub use meta::{
    AttnScores, CUDA_CACHE_DTYPES, PagedAttnMetadata, SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES,
};
pub use quant_kernels::Isa;

#[cfg(feature = "cuda")]
pub mod cuda;
