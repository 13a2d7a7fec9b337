//! The decoder on an NVIDIA GPU (behind the `cuda` feature): weights uploaded once in bf16 or
//! f16, and the one forward's ops (`ops.rs`) as cuBLAS GEMMs with f32 accumulation, the small
//! kernels of `attn-kernels`' model program (embedding, RMSNorm, rotary, gated activations,
//! bias adds, casts), `reshape_and_cache` and paged attention through the
//! `attn_kernels::cuda::ops` wrappers; f32 logits copied back for the sampler.
//!
//! The residual stream stays in f32 on the device (the GEMMs that add into it write f32 with
//! `beta = 1`), so the only half roundings are the weights, the GEMM inputs, the KV cache and the
//! gate/up output: the CUDA logits then follow the f32 CPU forward within a per-logit bound
//! derived from those roundings ([`LogitTolerance`], `tolerance.rs`), which the GPU model check
//! holds them to.

mod activations;
mod batch;
mod driver;
mod error;
mod forward;
mod ops;
mod profile;
mod rope_table;
mod tolerance;
mod weights;

/// Whether libcuda loads on this machine (a CUDA runner fails with one clear error without it).
pub use attn_kernels::cuda::driver_present;
pub use batch::BatchLimits;
pub use driver::{StepBatch, StepDriver, argmax};
pub use error::CudaModelError;
pub use forward::CudaModel;
pub use tolerance::{
    Greedy, HALF_ROUNDINGS_OUTSIDE, HALF_ROUNDINGS_PER_LAYER, LogitTolerance, RowCheck, TOLERANCE_SIGMAS,
    half_roundings_per_layer, unit_roundoff,
};

/// The two-head toy config of the host-side tests.
#[cfg(test)]
fn test_config() -> crate::config::ModelConfig {
    let text = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":8,
        "num_hidden_layers":1,"num_attention_heads":2,"vocab_size":10,"rope_theta":10000.0}"#;
    crate::config::ModelConfig::from_json(text, std::path::Path::new("config.json"))
        .unwrap_or_else(|e| panic!("config: {e}"))
}
