//! `model`: decoder models from Hugging Face folders and GGUF files — config and its
//! architecture description, safetensors weights, tokenizer, chat template, GGUF reading and
//! conversion, the one forward pass over the paged KV cache (CPU and, with `cuda`, GPU ops
//! behind it), and the `runner` that puts model, cache and block table on a device for the
//! engine; `quality`, the perplexity and KL-divergence measurement of a forward pass against a
//! reference run. The compute kernels it calls (matmul over every weight
//! format, norms, activations, RoPE, attention) are `attn-kernels`'.

pub mod arch;
pub mod chat;
pub mod config;
pub mod decoder;
pub mod error;
pub mod folder;
pub mod forward;
pub mod generation;
pub mod gguf;
pub mod input;
pub mod load_progress;
pub mod lora;
pub mod quality;
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

pub use arch::{Activation, Architecture, RopeStyle};
pub use chat::{ChatMessage, ChatTemplate, Conversation, FunctionCall, TemplateValue, ToolCall};
pub use config::{ModelConfig, RopeScaling};
pub use decoder::{LayerWeight, LayerWeights, Model, Quantization};
pub use error::ModelError;
pub use folder::ModelFolder;
pub use forward::cpu::Workspace;
pub use generation::GenerationConfig;
pub use input::{GroupInput, ModelInput};
pub use kv_cache::{KvLayout, LayerPlace};
pub use load_progress::LoadProgress;
pub use lora::{LoraAdapter, LoraBatch};
pub use runner::{KvCacheSize, Runner, RunnerConfig, StepInput};
pub use tokenizer::Tokenizer;
pub use weights::SafetensorsFiles;

/// How decode-shaped matmuls take their activations: [`Model::activations`].
pub use quant_kernels::quant::ActivationPrecision;
