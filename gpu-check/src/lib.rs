//! `gpu-check`: what a lent GPU runs, kept out of the library crates. The binaries:
//! `cuda_check` (compile every kernel with NVRTC; CI, no GPU), `gpu_check` (every kernel against
//! the CPU reference, bandwidth figures), `gpu_model_check` (the CUDA forward against the CPU
//! forward, the engine's greedy tokens, the e2e figure) — each run one [`sections`] section at a
//! time (`--only NAME`) — and `gpu_run`, which starts every section in its own process
//! ([`runner`]), keeps the logs and `figures.json` as they come ([`figures`]) and prints the
//! [`summary`].
//!
//! The host side of the kernel check lives in [`attn_cases`] (and [`far_cases`], its cases
//! past 2³² elements), that of the model check in [`model_cases`] (its random models), so both
//! are unit-tested without a GPU;
//! [`device_timing`] times calls with CUDA events and measures the copy bandwidth for both;
//! `cuda_emulation` (tests only) emulates the CUDA forward's bf16/f16 roundings on the CPU to
//! calibrate and test the model check's per-logit tolerance on those models, and
//! `prefill_emulation` (tests only) runs the tiled prefill kernel's tiling and online softmax on
//! the CPU against the f64 reference. [`variant_sweep`] holds the shapes of the bandwidth
//! section's v1/v2 sweep, split into the part the automatic variant choice was fitted to and a
//! held-out part, and scores the choice on each. The runner, the records, the summary and the
//! sweep's split need no CUDA and are tested in every build; the rest is behind the `cuda`
//! feature.

#[cfg(feature = "cuda")]
pub mod attn_cases;
#[cfg(all(test, feature = "cuda"))]
mod cuda_emulation;
#[cfg(feature = "cuda")]
pub mod device_timing;
#[cfg(feature = "cuda")]
pub mod far_cases;
pub mod figures;
#[cfg(feature = "cuda")]
pub mod model_cases;
#[cfg(all(test, feature = "cuda"))]
mod prefill_emulation;
pub mod runner;
pub mod sections;
pub mod summary;
pub mod variant_sweep;
