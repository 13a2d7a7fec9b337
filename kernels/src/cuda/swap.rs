//! Swapping KV blocks between the GPU and the cache's pinned host swap space (the CUDA twin of
//! `block_ops`' `swap_out` / `swap_in`): asynchronous driver copies on the device's stream,
//! every index checked before the first copy is queued.

use cudarc::driver::{DevicePtr, DevicePtrMut, result as drv};
use kv_cache::cuda::CudaKvCache;

use super::error::CudaError;
use super::runtime::CudaKernels;

/// Queues device → host copies of `(device_block, swap_block)` pairs, every layer, key and value.
pub fn swap_out(
    kernels: &CudaKernels,
    cache: &mut CudaKvCache,
    mapping: &[(u32, u32)],
) -> Result<(), CudaError> {
    let c = *cache.config();
    check_mapping(cache, mapping, c.num_blocks, c.num_swap_blocks)?;
    // Raw driver copies: the calling thread needs the device's context current.
    kernels.device().context().bind_to_thread()?;
    let bb = cache.block_bytes();
    let stream = kernels.device().stream().clone();
    let (layers, swap) = cache.layers_and_swap_mut();
    for (layer, swap) in layers.iter().zip(swap.iter_mut()) {
        for (dev, host) in [(layer.key(), &mut swap.key), (layer.value(), &mut swap.value)] {
            let (base, _sync) = dev.device_ptr(&stream);
            let host_ptr = host.as_mut_ptr()?;
            for &(src, dst) in mapping {
                // SAFETY: both ranges were bounds-checked by `check_mapping`; the pinned buffer
                // lives as long as the cache, which outlives the queued copy's use by the stream
                // (the cache holds the stream the copy is queued on, and every step ends with that
                // stream synchronized when the logits are copied back).
                unsafe {
                    let dst_slice = std::slice::from_raw_parts_mut(host_ptr.add(dst as usize * bb), bb);
                    drv::memcpy_dtoh_async(dst_slice, base + (src as usize * bb) as u64, stream.cu_stream())?;
                }
            }
        }
    }
    Ok(())
}

/// Queues host → device copies of `(swap_block, device_block)` pairs, every layer.
pub fn swap_in(
    kernels: &CudaKernels,
    cache: &mut CudaKvCache,
    mapping: &[(u32, u32)],
) -> Result<(), CudaError> {
    let c = *cache.config();
    check_mapping(cache, mapping, c.num_swap_blocks, c.num_blocks)?;
    kernels.device().context().bind_to_thread()?;
    let bb = cache.block_bytes();
    let stream = kernels.device().stream().clone();
    let (layers, swap) = cache.layers_and_swap_mut();
    for (layer, swap) in layers.iter_mut().zip(swap.iter()) {
        let (key, value) = layer.key_value_mut();
        for (dev, host) in [(key, &swap.key), (value, &swap.value)] {
            let (base, _sync) = dev.device_ptr_mut(&stream);
            let host_ptr = host.as_ptr()?;
            for &(src, dst) in mapping {
                // SAFETY: bounds-checked by `check_mapping`; the pinned source lives in the cache.
                unsafe {
                    let src_slice = std::slice::from_raw_parts(host_ptr.add(src as usize * bb), bb);
                    drv::memcpy_htod_async(base + (dst as usize * bb) as u64, src_slice, stream.cu_stream())?;
                }
            }
        }
    }
    Ok(())
}

/// Every pair in range, and a swap space to copy to at all.
fn check_mapping(
    cache: &mut CudaKvCache,
    mapping: &[(u32, u32)],
    src_blocks: usize,
    dst_blocks: usize,
) -> Result<(), CudaError> {
    if cache.layers_and_swap_mut().1.is_empty() && !mapping.is_empty() {
        return Err(CudaError::InvalidArgument("the cache has no swap space".into()));
    }
    check_pairs(mapping, src_blocks, dst_blocks)
}

fn check_pairs(mapping: &[(u32, u32)], src_blocks: usize, dst_blocks: usize) -> Result<(), CudaError> {
    match mapping.iter().find(|&&(s, d)| s as usize >= src_blocks || d as usize >= dst_blocks) {
        Some(&(s, d)) => Err(CudaError::InvalidArgument(format!(
            "swap pair ({s}, {d}) out of range ({src_blocks} source, {dst_blocks} destination blocks)"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::check_pairs;

    #[test]
    fn pairs_are_checked_against_both_sides() {
        assert!(check_pairs(&[(0, 1), (3, 0)], 4, 2).is_ok());
        assert!(check_pairs(&[(4, 0)], 4, 2).is_err());
        assert!(check_pairs(&[(0, 2)], 4, 2).is_err());
        assert!(check_pairs(&[], 0, 0).is_ok());
    }
}
