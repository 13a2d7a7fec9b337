//! GGUF support: read a llama.cpp model file and convert it to an ordinary Hugging Face
//! folder (the engine itself only loads HF folders).

pub mod convert;
pub mod dequant;
mod meta;
pub use meta::GgufModelMeta;
pub mod quantize;
pub mod reader;
pub mod vocab;

pub use convert::{ConvertSummary, OutputDtype, convert_gguf_to_hf, unpermute_qk};
pub use dequant::{GgmlType, dequantize, dequantize_block};
pub use quantize::{QuantizeError, quantize};
pub use reader::{GgufFile, GgufTensorInfo, GgufValue};
pub use vocab::GgufVocab;
