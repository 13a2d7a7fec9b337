//! ggml's block formats, as the GGUF reader, the converter and the quantized kernels share
//! them: [`GgmlType`] (block sizes, byte counts), dequantization to f32 bit-exact with gguf-py
//! (`dequant.rs`, fixtures in `tests/data/kquants/`), and ggml's reference quantizers
//! (`quantize.rs`).

mod dequant;
mod quantize;

pub(crate) use dequant::scale_min_k4;
pub use dequant::{GgmlType, QK, QK_K, dequantize, dequantize_block};
pub use quantize::{QuantizeError, quantize};
