//! The device seam: the model, its KV cache and its scratch on one device, behind the three
//! things a step needs (block moves, forward, the model's config), so the step loop never
//! branches on where it runs.
//!
//! - CPU: the f32 [`Llama`], a host [`KvCache`], a [`Workspace`].
//! - CUDA (`cuda` feature): [`model::cuda::CudaLlama`] and a [`kv_cache::cuda::CudaKvCache`],
//!   sized like vLLM: after the weights are uploaded, one profiling forward of
//!   `max_num_batched_tokens` dummy tokens, then
//!   `num_blocks = (total × gpu_memory_utilization − used) / bytes_per_block`
//!   ([`kv_cache::cuda::blocks_for_memory`]).

use kernels::backend::{Cpu, KernelBackend};
use kv_cache::{BlockShape, CacheConfig, Device, KvCache};
use model::{Llama, LlamaConfig, ModelInput, Workspace};
use scheduler::SchedulerOutput;

use crate::config::{EngineConfig, KvCacheSize, PreemptionMode};
use crate::error::EngineError;

/// The model and its cache on the CPU.
#[derive(Debug)]
pub(crate) struct CpuExecutor {
    model: Llama,
    cache: KvCache,
    workspace: Workspace,
}

/// The model and its cache on one device. One per engine, built once and never moved in the
/// step loop, so the CPU variant stays inline (no pointer chase on the hot path).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Executor {
    Cpu(CpuExecutor),
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaExecutor>),
}

/// Host swap blocks the configuration asks for (only when preemption swaps).
fn swap_bytes(config: &EngineConfig) -> usize {
    match config.preemption_mode {
        PreemptionMode::Swap => config.swap_space_bytes,
        PreemptionMode::Recompute => 0,
    }
}

impl Executor {
    /// Puts `model` on `config.device` with a KV cache of blocks of `shape`; returns the
    /// executor and the cache's final configuration (its block counts feed the scheduler).
    pub fn build(
        model: Llama,
        shape: BlockShape,
        config: &EngineConfig,
        max_model_len: usize,
    ) -> Result<(Self, CacheConfig), EngineError> {
        match config.device {
            Device::Cpu => {
                let cache_cfg = match config.kv_cache {
                    KvCacheSize::Bytes(b) => {
                        CacheConfig::from_memory_budget(shape, b, swap_bytes(config), max_model_len)?
                    }
                    KvCacheSize::Blocks(n) => {
                        CacheConfig::new(shape, n, swap_bytes(config) / shape.bytes_per_block())
                    }
                };
                let cache = KvCache::new(cache_cfg)?;
                Ok((Executor::Cpu(CpuExecutor { model, cache, workspace: Workspace::default() }), cache_cfg))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda { ordinal } => {
                let (exec, cfg) = cuda::CudaExecutor::build(model, shape, config, max_model_len, ordinal)?;
                Ok((Executor::Cuda(Box::new(exec)), cfg))
            }
            #[allow(unreachable_patterns)]
            other => Err(EngineError::Config(format!(
                "device {other} needs a build with the `cuda` feature (cargo build --features engine/cuda)"
            ))),
        }
    }

    pub fn model_config(&self) -> &LlamaConfig {
        match self {
            Executor::Cpu(c) => &c.model.config,
            #[cfg(feature = "cuda")]
            Executor::Cuda(c) => c.model.config(),
        }
    }

    /// The plan's swap-outs, swap-ins and copy-on-write copies, in that order.
    pub fn move_blocks(&mut self, plan: &SchedulerOutput) -> Result<(), EngineError> {
        match self {
            Executor::Cpu(c) => Ok(Cpu.move_blocks(
                &mut c.cache,
                &plan.blocks_to_swap_out,
                &plan.blocks_to_swap_in,
                &plan.blocks_to_copy,
            )?),
            #[cfg(feature = "cuda")]
            Executor::Cuda(c) => c.move_blocks(plan),
        }
    }

    /// One forward step; logits `[sample_indices.len(), vocab]` (f32, host memory).
    pub fn forward(&mut self, input: &ModelInput<'_>) -> Result<&[f32], EngineError> {
        match self {
            Executor::Cpu(c) => Ok(c.model.forward(input, &mut c.cache, &mut c.workspace)?),
            #[cfg(feature = "cuda")]
            Executor::Cuda(c) => c.forward(input),
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    //! The CUDA executor (see the module above).

    use std::sync::Arc;

    use kernels::backend::KernelBackend;
    use kernels::cuda::CudaKernels;
    use kv_cache::cuda::{CudaDevice, CudaKvCache, blocks_for_memory};
    use kv_cache::{BlockShape, CacheConfig, DType};
    use model::cuda::{BatchLimits, CudaLlama, CudaModelError};
    use model::{Llama, ModelInput};
    use scheduler::SchedulerOutput;

    use super::swap_bytes;
    use crate::config::{EngineConfig, KvCacheSize};
    use crate::error::EngineError;

    #[derive(Debug)]
    pub(crate) struct CudaExecutor {
        pub model: CudaLlama,
        cache: CudaKvCache,
    }

    impl CudaExecutor {
        pub fn build(
            host_model: Llama,
            shape: BlockShape,
            config: &EngineConfig,
            max_model_len: usize,
            ordinal: usize,
        ) -> Result<(Self, CacheConfig), EngineError> {
            if !matches!(config.kv_dtype, DType::BF16 | DType::F16) {
                return Err(EngineError::Config(format!(
                    "the CUDA device needs a bf16 or f16 KV cache (kv_dtype is {:?})",
                    config.kv_dtype
                )));
            }
            let device = CudaDevice::open(ordinal).map_err(cuda_err)?;
            let kernels = Arc::new(CudaKernels::new(device.clone()).map_err(cuda_err)?);
            let limits = BatchLimits {
                max_tokens: config.max_num_batched_tokens,
                max_samples: config.max_num_seqs,
                max_model_len,
            };
            let mut model =
                CudaLlama::new(&host_model, kernels, config.kv_dtype, limits).map_err(cuda_err)?;
            drop(host_model);
            let num_blocks = match config.kv_cache {
                KvCacheSize::Blocks(n) => n,
                KvCacheSize::Bytes(_) => {
                    model.profile(shape.block_size, shape.dtype).map_err(cuda_err)?;
                    let (free, total) = device.memory_info().map_err(cuda_err)?;
                    blocks_for_memory(total, free, config.gpu_memory_utilization, 0, &shape)
                        .map_err(cuda_err)?
                }
            };
            let cache_cfg = CacheConfig::new(shape, num_blocks, swap_bytes(config) / shape.bytes_per_block());
            tracing::info!(
                target: "engine",
                "CUDA: {} MiB of weights, {num_blocks} KV blocks ({:.1} GiB)",
                model.weight_bytes() >> 20,
                cache_cfg.device_bytes() as f64 / (1u64 << 30) as f64
            );
            let cache = CudaKvCache::new(cache_cfg, device).map_err(cuda_err)?;
            Ok((CudaExecutor { model, cache }, cache_cfg))
        }

        pub fn move_blocks(&mut self, plan: &SchedulerOutput) -> Result<(), EngineError> {
            let kernels = &**self.model.kernels();
            kernels
                .move_blocks(
                    &mut self.cache,
                    &plan.blocks_to_swap_out,
                    &plan.blocks_to_swap_in,
                    &plan.blocks_to_copy,
                )
                .map_err(cuda_err)
        }

        pub fn forward(&mut self, input: &ModelInput<'_>) -> Result<&[f32], EngineError> {
            self.model.forward(input, &mut self.cache).map_err(cuda_err)
        }
    }

    fn cuda_err(e: impl Into<CudaModelError>) -> EngineError {
        EngineError::Cuda(e.into())
    }
}
