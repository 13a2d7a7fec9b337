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
    swap(kernels, cache, mapping, true)
}

/// Queues host → device copies of `(swap_block, device_block)` pairs, every layer.
pub fn swap_in(
    kernels: &CudaKernels,
    cache: &mut CudaKvCache,
    mapping: &[(u32, u32)],
) -> Result<(), CudaError> {
    swap(kernels, cache, mapping, false)
}

/// The copies of [`swap_out`] (`to_host`) or [`swap_in`], after checking every pair.
fn swap(
    kernels: &CudaKernels,
    cache: &mut CudaKvCache,
    mapping: &[(u32, u32)],
    to_host: bool,
) -> Result<(), CudaError> {
    if cache.layers_and_swap_mut().1.is_empty() && !mapping.is_empty() {
        return Err(CudaError::InvalidArgument("the cache has no swap space".into()));
    }
    let c = *cache.config();
    let (src_blocks, dst_blocks) =
        if to_host { (c.num_blocks, c.num_swap_blocks) } else { (c.num_swap_blocks, c.num_blocks) };
    check_pairs("swap", mapping, src_blocks, dst_blocks)?;
    // Raw driver copies: the calling thread needs the device's context current.
    kernels.device().context().bind_to_thread()?;
    let bb = cache.block_bytes();
    let stream = kernels.device().stream().clone();
    let (layers, swap) = cache.layers_and_swap_mut();
    for (layer, swap) in layers.iter_mut().zip(swap.iter_mut()) {
        let (key, value) = layer.key_value_mut();
        for (dev, host) in [(key, &mut swap.key), (value, &mut swap.value)] {
            // The device side is only read when swapping out.
            let (base, _sync) = if to_host { dev.device_ptr(&stream) } else { dev.device_ptr_mut(&stream) };
            let host_ptr = host.as_mut_ptr()?;
            for &(src, dst) in mapping {
                let (dev_block, host_block) = if to_host { (src, dst) } else { (dst, src) };
                let dev_addr = base + (dev_block as usize * bb) as u64;
                // SAFETY: both ranges were bounds-checked by `check_pairs`; the pinned buffer
                // lives as long as the cache, which outlives the queued copy's use by the stream
                // (the cache holds the stream the copy is queued on, and every step ends with that
                // stream synchronized when the logits are copied back).
                unsafe {
                    let host_block =
                        std::slice::from_raw_parts_mut(host_ptr.add(host_block as usize * bb), bb);
                    if to_host {
                        drv::memcpy_dtoh_async(host_block, dev_addr, stream.cu_stream())?;
                    } else {
                        drv::memcpy_htod_async(dev_addr, host_block, stream.cu_stream())?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Every `(src, dst)` pair of a `what` (copy or swap) names a block of its side.
pub(crate) fn check_pairs(
    what: &str,
    pairs: &[(u32, u32)],
    src_blocks: usize,
    dst_blocks: usize,
) -> Result<(), CudaError> {
    match pairs.iter().find(|&&(s, d)| s as usize >= src_blocks || d as usize >= dst_blocks) {
        Some(&(s, d)) => Err(CudaError::InvalidArgument(format!(
            "{what} pair ({s}, {d}) out of range ({src_blocks} source, {dst_blocks} destination blocks)"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::check_pairs;

    #[test]
    fn pairs_are_checked_against_both_sides() {
        assert!(check_pairs("swap", &[(0, 1), (3, 0)], 4, 2).is_ok());
        assert!(check_pairs("swap", &[(4, 0)], 4, 2).is_err());
        assert!(check_pairs("swap", &[(0, 2)], 4, 2).is_err());
        assert!(check_pairs("swap", &[], 0, 0).is_ok());
    }
}
