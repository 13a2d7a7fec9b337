//! The crate's error type: every failure names the file (and tensor) it concerns, so a user
//! with a broken model folder knows what to fix.

use std::path::{Path, PathBuf};

/// Everything that can go wrong while loading, converting or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: malformed config: {reason}", path.display())]
    MalformedConfig { path: PathBuf, reason: String },
    #[error("{}: unsupported architecture {found:?} (supported: Llama, Mistral, Qwen2, Qwen3, Gemma 3 and Phi-3 decoders)", path.display())]
    UnsupportedArchitecture { path: PathBuf, found: String },
    #[error("{}: missing tensor `{tensor}`", path.display())]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{}: tensor `{tensor}` has shape {found:?}, expected {expected:?}", path.display())]
    WrongShape { path: PathBuf, tensor: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("{}: tensor `{tensor}` has unsupported dtype {dtype}", path.display())]
    UnsupportedDtype { path: PathBuf, tensor: String, dtype: String },
    #[error("{}: truncated or corrupt safetensors file: {reason}", path.display())]
    BadSafetensors { path: PathBuf, reason: String },
    #[error("{}: invalid GGUF file: {reason}", path.display())]
    Gguf { path: PathBuf, reason: String },
    #[error("{}: tokenizer error: {reason}", path.display())]
    Tokenizer { path: PathBuf, reason: String },
    #[error("tokenizer error: {0}")]
    Tokenize(String),
    #[error("chat template error: {0}")]
    ChatTemplate(String),
    /// The template's own `raise_exception(msg)`: it refuses this conversation (roles that do
    /// not alternate, a second tool call where one is allowed, …).
    #[error("chat template refused the conversation: {0}")]
    ChatTemplateRaised(String),
    /// A LoRA adapter that does not fit the base model, or that uses what we do not serve.
    #[error("{}: LoRA adapter: {reason}", path.display())]
    Lora { path: PathBuf, reason: String },
    #[error("invalid model input: {0}")]
    InvalidInput(String),
    #[error("attention kernel failed: {0}")]
    Attention(#[from] attn_kernels::AttnError),
    #[error(transparent)]
    Cache(#[from] kv_cache::CacheError),
    /// The device asked for is not available in this build or on this machine.
    #[error("{0}")]
    Device(String),
    /// The CUDA device could not be opened or a step on it failed.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaModelError),
}

impl ModelError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io { path: path.to_path_buf(), source }
    }

    pub(crate) fn config(path: &Path, reason: impl Into<String>) -> Self {
        Self::MalformedConfig { path: path.to_path_buf(), reason: reason.into() }
    }

    pub(crate) fn gguf(path: &Path, reason: impl Into<String>) -> Self {
        Self::Gguf { path: path.to_path_buf(), reason: reason.into() }
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
