//! `model`: Llama from Hugging Face folders and GGUF files — config, safetensors weights,
//! tokenizer, chat template, GGUF reading and conversion, the CPU (and, with `cuda`, GPU)
//! forward pass over the paged KV cache, and the `runner` that puts model, cache and block
//! table on a device for the engine. The compute kernels it calls (matmul over every weight
//! format, norms, activations, RoPE, attention) are `attn-kernels`'.

pub mod chat;
pub mod config;
pub mod error;
pub mod folder;
pub mod generation;
pub mod gguf;
pub mod input;
pub mod llama;
#[cfg(feature = "testing")]
pub mod reference;
pub mod rope;
pub mod runner;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokenizer;
pub mod weights;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::{LlamaConfig, RopeScaling};
pub use error::ModelError;
pub use folder::ModelFolder;
pub use generation::GenerationConfig;
pub use input::ModelInput;
pub use llama::{Llama, Quantization, Workspace};
pub use runner::{KvCacheSize, Runner, RunnerConfig, StepInput};
pub use tokenizer::Tokenizer;
pub use weights::SafetensorsFiles;

/// How decode-shaped matmuls take their activations: [`Llama::activations`].
pub use attn_kernels::cpu::quant::ActivationPrecision;
