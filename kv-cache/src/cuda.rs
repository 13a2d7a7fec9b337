//! The KV cache's memory on an NVIDIA GPU (behind the `cuda` feature): per-layer device tensors
//! in vLLM's layout, a pinned host swap cache, and sizing from free device memory.
//! The cache owns the memory; the device (context and stream, `attn_kernels::cuda::CudaDevice`) and
//! every kernel over the memory, the swap copies included, are `attn-kernels`'. Everything here takes
//! the cudarc stream it allocates and copies on, so this crate never opens a device itself.
//!
//! Device tensors are raw bytes described by a [`CacheGeometry`] (the same index math as the CPU
//! cache), so upload/download are plain byte copies and one type serves every dtype.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DriverError, PinnedHostSlice};

use crate::{BlockShape, CacheConfig, CacheError, CacheGeometry, CacheSlices, CacheSlicesMut, LayerCache};

/// Errors of the CUDA cache.
#[derive(Debug, thiserror::Error)]
pub enum CudaCacheError {
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// vLLM's sizing: the cache gets `total * utilization` minus what the process already holds
/// (`total - free`) minus the activation peak measured by a profiling forward pass, cut into
/// whole blocks. Returns 0 when nothing is left.
pub fn blocks_for_memory(
    total_bytes: usize,
    free_bytes: usize,
    utilization: f64,
    peak_activation_bytes: usize,
    shape: &BlockShape,
) -> Result<usize, CudaCacheError> {
    if !(utilization > 0.0 && utilization <= 1.0) {
        return Err(CudaCacheError::InvalidArgument(format!("utilization {utilization} not in (0, 1]")));
    }
    shape.validate()?;
    let budget = (total_bytes as f64 * utilization) as usize;
    let in_use = total_bytes.saturating_sub(free_bytes);
    let left = budget.saturating_sub(in_use).saturating_sub(peak_activation_bytes);
    Ok(left / shape.bytes_per_block())
}

/// One layer's key and value tensors in device memory, same layout and geometry as
/// [`LayerCache`]; elements are `geometry.dtype`, stored as bytes.
#[derive(Debug)]
pub struct DeviceLayerCache {
    geometry: CacheGeometry,
    key: CudaSlice<u8>,
    value: CudaSlice<u8>,
}

impl DeviceLayerCache {
    /// Allocates a zeroed layer on `stream`'s device.
    pub fn new(stream: &Arc<CudaStream>, geometry: CacheGeometry) -> Result<Self, CudaCacheError> {
        let bytes = tensor_bytes(&geometry)?;
        let key = stream.alloc_zeros::<u8>(bytes)?;
        let value = stream.alloc_zeros::<u8>(bytes)?;
        Ok(DeviceLayerCache { geometry, key, value })
    }

    pub fn geometry(&self) -> &CacheGeometry {
        &self.geometry
    }
    pub fn key(&self) -> &CudaSlice<u8> {
        &self.key
    }
    pub fn value(&self) -> &CudaSlice<u8> {
        &self.value
    }
    /// Both tensors mutably (kernels that write the cache take them together).
    pub fn key_value_mut(&mut self) -> (&mut CudaSlice<u8>, &mut CudaSlice<u8>) {
        (&mut self.key, &mut self.value)
    }
    /// Bytes of one block in one tensor (all kv heads).
    pub fn block_bytes(&self) -> usize {
        self.geometry.block_elems() * self.geometry.dtype.size_in_bytes()
    }

    /// Copies a host layer of the same geometry into this one, queued on `stream`.
    pub fn upload(&mut self, stream: &Arc<CudaStream>, host: &LayerCache) -> Result<(), CudaCacheError> {
        self.check_same(host.geometry())?;
        let (k, v) = host_bytes(host)?;
        stream.memcpy_htod(k, &mut self.key)?;
        stream.memcpy_htod(v, &mut self.value)?;
        Ok(())
    }

    /// Copies this layer into a host layer of the same geometry on `stream` (waits for
    /// everything queued on it).
    pub fn download(&self, stream: &Arc<CudaStream>, host: &mut LayerCache) -> Result<(), CudaCacheError> {
        self.check_same(host.geometry())?;
        let (k, v) = host_bytes_mut(host)?;
        stream.memcpy_dtoh(&self.key, k)?;
        stream.memcpy_dtoh(&self.value, v)?;
        Ok(stream.synchronize()?)
    }

    fn check_same(&self, other: &CacheGeometry) -> Result<(), CudaCacheError> {
        if *other == self.geometry {
            Ok(())
        } else {
            Err(CudaCacheError::InvalidArgument(format!(
                "host layer {other:?} differs from device layer {:?}",
                self.geometry
            )))
        }
    }
}

fn tensor_bytes(g: &CacheGeometry) -> Result<usize, CudaCacheError> {
    g.num_blocks.checked_mul(g.block_elems()).and_then(|n| n.checked_mul(g.dtype.size_in_bytes())).ok_or_else(
        || CacheError::TooLarge { bytes: g.tensor_elems() as u128 * g.dtype.size_in_bytes() as u128 }.into(),
    )
}

fn host_bytes(host: &LayerCache) -> Result<(&[u8], &[u8]), CudaCacheError> {
    Ok(match host.slices() {
        CacheSlices::F32 { key, value } => (bytemuck::cast_slice(key), bytemuck::cast_slice(value)),
        CacheSlices::F16 { key, value } => (bytemuck::cast_slice(key), bytemuck::cast_slice(value)),
        CacheSlices::BF16 { key, value } => (bytemuck::cast_slice(key), bytemuck::cast_slice(value)),
        #[allow(unreachable_patterns)]
        _ => return Err(CudaCacheError::InvalidArgument("host layer storage is not a host slice".into())),
    })
}

fn host_bytes_mut(host: &mut LayerCache) -> Result<(&mut [u8], &mut [u8]), CudaCacheError> {
    Ok(match host.slices_mut() {
        CacheSlicesMut::F32 { key, value } => {
            (bytemuck::cast_slice_mut(key), bytemuck::cast_slice_mut(value))
        }
        CacheSlicesMut::F16 { key, value } => {
            (bytemuck::cast_slice_mut(key), bytemuck::cast_slice_mut(value))
        }
        CacheSlicesMut::BF16 { key, value } => {
            (bytemuck::cast_slice_mut(key), bytemuck::cast_slice_mut(value))
        }
        #[allow(unreachable_patterns)]
        _ => return Err(CudaCacheError::InvalidArgument("host layer storage is not a host slice".into())),
    })
}

/// Pinned host memory of one layer's swap space (key and value, same block layout as the
/// device tensors). The copies between the two are `attn-kernels`' (`attn_kernels::cuda::swap`).
#[derive(Debug)]
pub struct SwapLayer {
    pub key: PinnedHostSlice<u8>,
    pub value: PinnedHostSlice<u8>,
}

/// The whole KV cache on one GPU plus its pinned host swap cache, all allocated at creation.
#[derive(Debug)]
pub struct CudaKvCache {
    config: CacheConfig,
    /// The stream of the device the memory lives on (its context allocates the pinned swap).
    stream: Arc<CudaStream>,
    layers: Vec<DeviceLayerCache>,
    swap: Vec<SwapLayer>,
    /// Device addresses of every layer's key / value tensor (what `copy_blocks` walks).
    key_ptrs: CudaSlice<u64>,
    value_ptrs: CudaSlice<u64>,
    /// Room for one step's copy-on-write `(src, dst)` pairs (at most one per block), so
    /// `copy_blocks` uploads them without allocating.
    pair_map: CudaSlice<i64>,
}

impl CudaKvCache {
    /// Allocates `config.num_blocks` device blocks and `config.num_swap_blocks` pinned host
    /// blocks per layer on `stream`'s device (`config.device` is ignored).
    pub fn new(config: CacheConfig, stream: Arc<CudaStream>) -> Result<Self, CudaCacheError> {
        config.shape().validate()?;
        let layers = (0..config.num_layers)
            .map(|_| DeviceLayerCache::new(&stream, config.layer_geometry(config.num_blocks)))
            .collect::<Result<Vec<_>, _>>()?;
        let swap_bytes = tensor_bytes(&config.layer_geometry(config.num_swap_blocks))?;
        let mut swap = Vec::new();
        if swap_bytes > 0 {
            for _ in 0..config.num_layers {
                // SAFETY: pinned allocations of plain bytes; every byte is written by a swap-out
                // before a swap-in reads it back (the block manager only swaps in what it swapped out).
                let key = unsafe { stream.context().alloc_pinned::<u8>(swap_bytes) }?;
                let value = unsafe { stream.context().alloc_pinned::<u8>(swap_bytes) }?;
                swap.push(SwapLayer { key, value });
            }
        }
        let addr = |s: &CudaSlice<u8>| s.device_ptr(&stream).0;
        let key_addrs: Vec<u64> = layers.iter().map(|l| addr(&l.key)).collect();
        let value_addrs: Vec<u64> = layers.iter().map(|l| addr(&l.value)).collect();
        let key_ptrs = stream.clone_htod(&key_addrs)?;
        let value_ptrs = stream.clone_htod(&value_addrs)?;
        let pair_map = stream.alloc_zeros::<i64>(2 * config.num_blocks.max(1))?;
        Ok(CudaKvCache { config, stream, layers, swap, key_ptrs, value_ptrs, pair_map })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }
    /// The stream the cache was allocated on (that of its device).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
    pub fn layer(&self, l: usize) -> Result<&DeviceLayerCache, CudaCacheError> {
        let n = self.layers.len();
        self.layers.get(l).ok_or(CacheError::LayerOutOfRange { layer: l, num_layers: n }.into())
    }
    pub fn layer_mut(&mut self, l: usize) -> Result<&mut DeviceLayerCache, CudaCacheError> {
        let n = self.layers.len();
        self.layers.get_mut(l).ok_or(CacheError::LayerOutOfRange { layer: l, num_layers: n }.into())
    }
    /// Device arrays of every layer's key and value tensor address, for block-copy kernels.
    pub fn layer_pointer_tables(&self) -> (&CudaSlice<u64>, &CudaSlice<u64>) {
        (&self.key_ptrs, &self.value_ptrs)
    }
    /// [`CudaKvCache::layer_pointer_tables`] beside the preallocated room for `2 × num_blocks`
    /// flattened copy pairs (what `copy_blocks` uploads its pairs into).
    pub fn copy_tables_mut(&mut self) -> (&CudaSlice<u64>, &CudaSlice<u64>, &mut CudaSlice<i64>) {
        (&self.key_ptrs, &self.value_ptrs, &mut self.pair_map)
    }
    /// Bytes of one block of one tensor of one layer.
    pub fn block_bytes(&self) -> usize {
        self.config.shape().bytes_per_block_per_layer() / 2
    }

    /// Every layer's device tensors beside its pinned swap tensors (empty when the cache has
    /// no swap space): what `attn-kernels`' swap copies walk.
    pub fn layers_and_swap_mut(&mut self) -> (&mut [DeviceLayerCache], &mut [SwapLayer]) {
        (&mut self.layers, &mut self.swap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn shape() -> BlockShape {
        BlockShape { block_size: 16, num_layers: 2, num_kv_heads: 8, head_size: 128, dtype: DType::BF16 }
    }

    #[test]
    fn sizing_follows_utilization_minus_usage_and_peak() {
        let gib = 1usize << 30;
        let per_block = shape().bytes_per_block(); // 2 layers * 2 * 8 * 128 * 16 * 2 = 131072
        assert_eq!(per_block, 131_072);
        // 80 GiB total, 2 GiB already used, 90 %, 4 GiB activation peak → 72 - 2 - 4 = 66 GiB.
        let n = blocks_for_memory(80 * gib, 78 * gib, 0.9, 4 * gib, &shape()).unwrap_or(0);
        assert_eq!(n, ((80.0 * 0.9) as usize * gib - 6 * gib) / per_block);
        assert_eq!(blocks_for_memory(gib, 0, 0.5, 0, &shape()).unwrap_or(1), 0);
        assert!(blocks_for_memory(gib, gib, 1.5, 0, &shape()).is_err());
    }
}
