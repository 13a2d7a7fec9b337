//! GGUF support: read a llama.cpp model file (its weights load natively, see `decoder/load.rs`) and
//! convert it to an ordinary Hugging Face folder. The ggml block formats themselves (types,
//! dequantization, quantizers) are `quant_kernels::ggml`'s.

pub mod convert;
mod meta;
pub use meta::GgufModelMeta;
pub mod reader;
mod spm;
pub mod vocab;

pub use convert::{ConvertSummary, OutputDtype, convert_gguf_to_hf, unpermute_qk};
pub use reader::{GgufFile, GgufTensorInfo, GgufValue};
pub use vocab::{GgufVocab, VocabModel};
