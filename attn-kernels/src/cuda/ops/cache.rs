//! The cache-side launches: `reshape_and_cache` (new keys and values into their slots, the
//! slot mapping range-checked on upload by `DeviceSlotMapping`) and `copy_blocks`
//! (copy-on-write copies in every layer).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use kv_cache::cuda::{CudaKvCache, DeviceLayerCache};

use super::{MAX_GRID_X, MAX_GRID_YZ, kernel_config, launch_dim};
use crate::cuda::error::CudaError;
use crate::cuda::kernels::COPY_BLOCKS_ENTRY;
use crate::cuda::metadata::upload_into;
use crate::cuda::runtime::CudaKernels;
use crate::cuda::swap::check_pairs;
use crate::meta::check_slots;

/// Slot mapping on the device, range-checked against the cache on upload.
#[derive(Debug)]
pub struct DeviceSlotMapping {
    slots: CudaSlice<i64>,
    num_tokens: usize,
}

impl DeviceSlotMapping {
    /// Checks every non-negative slot is below `num_slots` and uploads the mapping into a new
    /// buffer (of one element when `slots` is empty: cudarc cannot allocate zero-length buffers).
    pub fn upload(stream: &Arc<CudaStream>, slots: &[i64], num_slots: usize) -> Result<Self, CudaError> {
        let mut mapping = DeviceSlotMapping { slots: stream.alloc_zeros(1)?, num_tokens: 0 };
        mapping.reupload(stream, slots, num_slots)?;
        Ok(mapping)
    }

    /// Like [`DeviceSlotMapping::upload`], into this buffer (grown only when too small).
    pub fn reupload(
        &mut self,
        stream: &Arc<CudaStream>,
        slots: &[i64],
        num_slots: usize,
    ) -> Result<(), CudaError> {
        check_slots(slots, num_slots).map_err(|e| CudaError::InvalidArgument(e.to_string()))?;
        upload_into(stream, slots, &mut self.slots)?;
        self.num_tokens = slots.len();
        Ok(())
    }
}

/// Writes `key`/`value` (f32 `[num_tokens, num_kv_heads, head_size]`) into `cache` at the mapped
/// slots (negative = padding, skipped), converting to the cache dtype.
pub fn reshape_and_cache(
    kernels: &CudaKernels,
    key: &CudaSlice<f32>,
    value: &CudaSlice<f32>,
    slots: &DeviceSlotMapping,
    cache: &mut DeviceLayerCache,
) -> Result<(), CudaError> {
    let g = *cache.geometry();
    let cfg = kernel_config(g.dtype, g.head_size, g.block_size)?;
    let row = g.num_kv_heads * g.head_size;
    if key.len() < slots.num_tokens * row || value.len() < slots.num_tokens * row {
        return Err(CudaError::InvalidArgument(format!(
            "key/value shorter than {} tokens x {row}",
            slots.num_tokens
        )));
    }
    if slots.num_tokens == 0 {
        return Ok(());
    }
    let func =
        kernels.function_lazy(&cfg.program_name(), &cfg.reshape_and_cache_entry(), || cfg.program())?;
    let stream = kernels.device().stream().clone();
    let (kc, vc) = cache.key_value_mut();
    let (nkv, hs, bs) = (g.num_kv_heads as i32, g.head_size as i32, g.block_size as i32);
    let stride = row as i64;
    let grid = launch_dim(slots.num_tokens, MAX_GRID_X, "tokens")?;
    let mut b = stream.launch_builder(&func);
    b.arg(key)
        .arg(value)
        .arg(kc)
        .arg(vc)
        .arg(&slots.slots)
        .arg(&nkv)
        .arg(&hs)
        .arg(&bs)
        .arg(&stride)
        .arg(&stride);
    // SAFETY: matches RESHAPE_AND_CACHE's parameters; slots range-checked on upload, inputs sized.
    unsafe {
        b.launch(LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 })
    }?;
    Ok(())
}

/// Copy-on-write block copies `(src, dst)` in every layer's key and value cache.
pub fn copy_blocks(
    kernels: &CudaKernels,
    cache: &mut CudaKvCache,
    pairs: &[(u32, u32)],
) -> Result<(), CudaError> {
    if pairs.is_empty() {
        return Ok(());
    }
    let c = *cache.config();
    check_pairs("copy", pairs, c.num_blocks, c.num_blocks)?;
    let cfg = kernel_config(c.dtype, c.head_size, c.block_size)?;
    let func = kernels.function_lazy(&cfg.program_name(), COPY_BLOCKS_ENTRY, || cfg.program())?;
    if pairs.len() > c.num_blocks {
        return Err(CudaError::InvalidArgument(format!(
            "copy: {} pairs for a pool of {} blocks (each destination is a distinct block)",
            pairs.len(),
            c.num_blocks
        )));
    }
    let stream = kernels.device().stream().clone();
    let flat: Vec<i64> = pairs.iter().flat_map(|&(s, d)| [i64::from(s), i64::from(d)]).collect();
    let block_bytes = cache.block_bytes() as i64;
    let layers = launch_dim(cache.num_layers(), MAX_GRID_YZ, "layers")?;
    let n = launch_dim(pairs.len(), MAX_GRID_X, "copy pairs")?;
    // Into the cache's preallocated pair room: no device allocation per call.
    let (kp, vp, room) = cache.copy_tables_mut();
    stream.memcpy_htod(&flat, &mut room.slice_mut(..flat.len()))?;
    // The kernel reads the first `n` pairs of the room.
    let mapping: &CudaSlice<i64> = room;
    let mut b = stream.launch_builder(&func);
    b.arg(kp).arg(vp).arg(mapping).arg(&block_bytes);
    // SAFETY: matches copy_blocks' parameters; pairs range-checked, pointer tables cover every layer.
    unsafe {
        b.launch(LaunchConfig { grid_dim: (n, layers, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 })
    }?;
    Ok(())
}
