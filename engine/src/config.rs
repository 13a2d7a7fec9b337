//! `EngineConfig`: vLLM's engine knobs (block size, max model len, max num seqs, max batched
//! tokens, prefix caching, preemption mode, swap space, KV memory, seed) and their checks.

use std::time::Duration;

use model::ModelConfig;

use crate::EngineError;

pub use model::runner::{DType, Device, KvCacheSize};
pub use model::{ActivationPrecision, Quantization};
pub use scheduler::{Policy, PreemptionMode};

/// An engine argument that takes one name of a fixed set: the argument's name (Python's keyword,
/// the flag with `-` for `_`) and what each of its names means. Every front end (the command
/// line, the Python package) parses through the same table, so a name means one thing everywhere.
#[derive(Debug)]
pub struct Choices<T: 'static> {
    pub arg: &'static str,
    pub values: &'static [(&'static str, T)],
}

impl<T: Copy> Choices<T> {
    /// The value `name` stands for, if it is one of the names.
    pub fn parse(&self, name: &str) -> Option<T> {
        self.values.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }

    /// The names, in the table's order (how help and errors list them).
    pub fn names(&self) -> impl Iterator<Item = &'static str> + Clone + 'static {
        self.values.iter().map(|&(n, _)| n)
    }
}

pub static PREEMPTION_MODE: Choices<PreemptionMode> = Choices {
    arg: "preemption_mode",
    values: &[("recompute", PreemptionMode::Recompute), ("swap", PreemptionMode::Swap)],
};

pub static SCHEDULING_POLICY: Choices<Policy> =
    Choices { arg: "scheduling_policy", values: &[("fcfs", Policy::Fcfs), ("priority", Policy::Priority)] };

/// vLLM's `--kv-cache-dtype` names: `auto` is bf16 (on every device), `fp8` is e4m3. fp8 is
/// accepted here and refused at start-up with the device it needs; int8 is the CPU's.
pub static KV_DTYPE: Choices<DType> = Choices {
    arg: "kv_cache_dtype",
    values: &[
        ("auto", DType::BF16),
        ("bf16", DType::BF16),
        ("f16", DType::F16),
        ("f32", DType::F32),
        ("int8", DType::Int8),
        ("fp8", DType::Fp8E4M3),
        ("fp8_e4m3", DType::Fp8E4M3),
        ("fp8_e5m2", DType::Fp8E5M2),
    ],
};

pub static QUANTIZATION: Choices<Quantization> = Choices { arg: "quantization", values: Quantization::NAMES };

pub static DECODE_ACTIVATIONS: Choices<ActivationPrecision> = Choices {
    arg: "decode_activations",
    values: &[
        ("auto", ActivationPrecision::Auto),
        ("f32", ActivationPrecision::F32),
        ("int16", ActivationPrecision::Int16),
        ("int8", ActivationPrecision::Int8),
    ],
};

/// Engine settings; `Default` gives vLLM-like values for a small CPU deployment.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Tokens per KV block (8, 16 or 32).
    pub block_size: usize,
    /// Longest prompt + output; `None` takes the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Token budget of one step (prefill chunks are cut to fit).
    pub max_num_batched_tokens: usize,
    pub enable_prefix_caching: bool,
    pub preemption_mode: PreemptionMode,
    pub policy: Policy,
    /// Host swap space in bytes (0: preempted requests are always recomputed).
    pub swap_space_bytes: usize,
    pub kv_cache: KvCacheSize,
    /// Element type of the KV cache (vLLM's `kv_cache_dtype`). bf16 by default on every device:
    /// half the bytes each decode step reads; f32 for results bit-comparable with an f32
    /// reference; int8 (CPU) for about twice the tokens of bf16 in the same memory, with each
    /// token's key and value rounded to 8 bits (its quality figures are in the README).
    pub kv_dtype: DType,
    /// Fraction of blocks kept free when admitting new requests.
    pub watermark: f64,
    /// Seeds the RNG of requests that bring no seed of their own.
    pub seed: u64,
    /// Interval of the `tracing` metrics line (zero: never).
    pub log_interval: Duration,
    /// Where the model and the KV cache run. CUDA needs a build with the `cuda` feature, a
    /// bf16 or f16 `kv_dtype` (the weights and activations take the same type) and a GPU.
    pub device: Device,
    /// Fraction of the GPU's memory the engine may fill (weights, activations, KV cache);
    /// CUDA only, with [`KvCacheSize::Bytes`].
    pub gpu_memory_utilization: f64,
    /// Most requests admitted but not yet scheduled; past it a submission fails at once with
    /// `RequestError::QueueFull` (a server's 429) instead of queueing without bound.
    pub max_waiting: usize,
    /// The model's name for clients; `None` takes the model folder's name.
    pub served_model_name: Option<String>,
    /// Quantize float weights at load (vLLM's `--quantization`); `None` keeps every weight in
    /// the format its file stores (a GGUF's own quantization, bf16 of a bf16 checkpoint).
    pub quantization: Option<Quantization>,
    /// How the CPU's matmuls over quantized weights take their activations: `F32` (what the f32
    /// dequantization computes), `Int16` on integer kernels — decode over every integer-code format
    /// (Q4_0 to Q6_K) and batches (prefill, batched decode) (logits within the goldens'
    /// tolerance, measured by the model crate's tests) — or `Auto` (the default): `Int16` on
    /// AVX2 and AVX-512 CPUs, `F32` on others and for f16/bf16 weights.
    pub decode_activations: ActivationPrecision,
    /// A Jinja chat template file that replaces the model's own (vLLM's `--chat-template`).
    pub chat_template: Option<std::path::PathBuf>,
    /// Speculative decoding (vLLM's `--speculative-config`); `None` decodes a token a step.
    pub speculative_config: Option<crate::spec::SpeculativeConfig>,
    /// LoRA adapters (vLLM's `--enable-lora` and its limits); `None` serves the base model only.
    pub lora: Option<crate::LoraConfig>,
    /// KV cache events (vLLM's `--kv-events-config`): the prefix cache's changes published
    /// over ZMQ for prefix-aware routers; `None` publishes nothing.
    pub kv_events: Option<kv_events::KvEventsConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            max_model_len: None,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            enable_prefix_caching: true,
            preemption_mode: PreemptionMode::Recompute,
            policy: Policy::Fcfs,
            swap_space_bytes: 1 << 30,
            kv_cache: KvCacheSize::Bytes(2 << 30),
            kv_dtype: DType::BF16,
            watermark: 0.01,
            seed: 0,
            log_interval: Duration::from_secs(10),
            device: Device::Cpu,
            gpu_memory_utilization: 0.9,
            max_waiting: 4096,
            served_model_name: None,
            quantization: None,
            decode_activations: ActivationPrecision::default(),
            chat_template: None,
            speculative_config: None,
            lora: None,
            kv_events: None,
        }
    }
}

impl EngineConfig {
    /// The longest sequence served: `max_model_len`, by default the most `model` computes
    /// exactly on the device (the CPU serves any context; on CUDA the smallest sliding window
    /// bounds it: the GPU run checks the CUDA kernels' windows, but its whole-model check has not
    /// run a context past one yet); more is a configuration error.
    pub fn served_context(&self, model: &ModelConfig) -> Result<usize, EngineError> {
        let limit = match self.device {
            Device::Cpu => model.max_position_embeddings,
            _ => model.max_full_attention_context(),
        };
        let max_model_len = self.max_model_len.unwrap_or(limit);
        if max_model_len == 0 || max_model_len > limit {
            let why = if limit < model.max_position_embeddings {
                "the model's smallest sliding window: the GPU run's whole-model check has not run a \
                 CUDA context past a window yet"
            } else {
                "the model's max_position_embeddings"
            };
            return Err(EngineError::Config(format!(
                "max_model_len {max_model_len} must be in 1..={limit} ({why})"
            )));
        }
        Ok(max_model_len)
    }
}
