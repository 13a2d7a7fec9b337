//! The runner on a CUDA device (see the parent module): the model's weights uploaded once, the
//! KV cache sized from the device's free memory after a profiling forward.

use std::sync::Arc;

use attn_kernels::cuda::{CudaDevice, CudaKernels};
use kv_cache::cuda::{CudaKvCache, blocks_for_memory};
use kv_cache::{BlockShape, CacheConfig, DType};

use super::{KvCacheSize, RunnerConfig};
use crate::cuda::{BatchLimits, CudaModel, CudaModelError};
use crate::decoder::Model;
use crate::error::{ModelError, Result};
use crate::input::ModelInput;

#[derive(Debug)]
pub(super) struct CudaRunner {
    pub model: CudaModel,
    pub cache: CudaKvCache,
}

impl CudaRunner {
    pub fn new(
        host_model: Model,
        shape: BlockShape,
        config: &RunnerConfig,
        ordinal: usize,
    ) -> Result<(Self, CacheConfig)> {
        if !matches!(config.kv_dtype, DType::BF16 | DType::F16) {
            return Err(ModelError::Device(format!(
                "kv_cache_dtype {} on cuda: the CUDA KV cache is bf16 or f16 (int8 is the CPU's; \
                 fp8 has no CUDA kernels in this build)",
                config.kv_dtype
            )));
        }
        let device = CudaDevice::open(ordinal).map_err(cuda_err)?;
        let kernels = Arc::new(CudaKernels::new(device.clone()).map_err(cuda_err)?);
        let limits = BatchLimits {
            max_tokens: config.max_num_batched_tokens,
            max_samples: config.max_num_seqs,
            max_model_len: config.max_model_len,
        };
        let mut model = CudaModel::new(&host_model, kernels, config.kv_dtype, limits).map_err(cuda_err)?;
        drop(host_model);
        let num_blocks = match config.kv_cache {
            KvCacheSize::Blocks(n) => n,
            KvCacheSize::Bytes(_) => {
                model.profile(shape.block_size, shape.dtype).map_err(cuda_err)?;
                let (free, total) = device.memory_info().map_err(cuda_err)?;
                blocks_for_memory(total, free, config.gpu_memory_utilization, 0, &shape).map_err(cuda_err)?
            }
        };
        let cache_cfg = CacheConfig::new(shape, num_blocks, config.swap_bytes / shape.bytes_per_block());
        tracing::info!(
            target: "engine",
            "CUDA: {} MiB of weights, {num_blocks} KV blocks ({:.1} GiB)",
            model.weight_bytes() >> 20,
            cache_cfg.device_bytes() as f64 / (1u64 << 30) as f64
        );
        let cache = CudaKvCache::new(cache_cfg, device.stream().clone()).map_err(cuda_err)?;
        Ok((CudaRunner { model, cache }, cache_cfg))
    }

    pub fn forward(&mut self, input: &ModelInput<'_>) -> Result<&[f32]> {
        self.model.forward(input, &mut self.cache).map_err(cuda_err)
    }

    pub fn forward_greedy(&mut self, input: &ModelInput<'_>) -> Result<&[u32]> {
        self.model.forward_greedy(input, &mut self.cache).map_err(cuda_err)
    }
}

pub(super) fn cuda_err(e: impl Into<CudaModelError>) -> ModelError {
    ModelError::Cuda(e.into())
}
