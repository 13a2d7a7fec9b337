//! Swapping KV blocks between the GPU and the cache's pinned host swap space (the CUDA
//! backend's `swap_out` / `swap_in`, twins of `block_ops`'): asynchronous driver copies on the device's stream, one
//! per run of blocks consecutive on both sides, every index checked before the first copy is
//! queued.

use cudarc::driver::{DevicePtr, DevicePtrMut, result as drv};
use kv_cache::cuda::CudaKvCache;

use super::error::CudaError;
use super::runtime::CudaKernels;

/// Queues the copies of the CUDA `KernelBackend::swap_out` (`to_host`: device → host,
/// `(device_block, swap_block)` pairs) or `swap_in` (host → device, `(swap_block,
/// device_block)` pairs), every layer, key and value, after checking every pair.
pub(crate) fn swap(
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
    // One copy per run of blocks consecutive on both sides, not one per block.
    let runs = contiguous_runs(mapping);
    let (layers, swap) = cache.layers_and_swap_mut();
    for (layer, swap) in layers.iter_mut().zip(swap.iter_mut()) {
        let (key, value) = layer.key_value_mut();
        for (dev, host) in [(key, &mut swap.key), (value, &mut swap.value)] {
            // The device side is only read when swapping out.
            let (base, _sync) = if to_host { dev.device_ptr(&stream) } else { dev.device_ptr_mut(&stream) };
            let host_ptr = host.as_mut_ptr()?;
            for &(src, dst, len) in &runs {
                let (dev_block, host_block) = if to_host { (src, dst) } else { (dst, src) };
                let dev_addr = base + (dev_block as usize * bb) as u64;
                // SAFETY: every block of a run was bounds-checked by `check_pairs` (a run covers
                // exactly its pairs); the pinned buffer lives as long as the cache, which
                // outlives the queued copy's use by the stream (the cache holds the stream the
                // copy is queued on, and every step ends with that stream synchronized when the
                // logits are copied back).
                unsafe {
                    let host_run = std::slice::from_raw_parts_mut(
                        host_ptr.add(host_block as usize * bb),
                        len as usize * bb,
                    );
                    if to_host {
                        drv::memcpy_dtoh_async(host_run, dev_addr, stream.cu_stream())?;
                    } else {
                        drv::memcpy_htod_async(dev_addr, host_run, stream.cu_stream())?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// `(src, dst)` pairs as `(src, dst, len)` runs whose blocks are consecutive on both sides,
/// sorted by source (the pairs of one swap are independent: distinct destinations, and the
/// sources live in the other memory).
fn contiguous_runs(pairs: &[(u32, u32)]) -> Vec<(u32, u32, u32)> {
    let mut sorted = pairs.to_vec();
    sorted.sort_unstable();
    let mut runs: Vec<(u32, u32, u32)> = Vec::new();
    for (s, d) in sorted {
        match runs.last_mut() {
            Some((rs, rd, len)) if rs.checked_add(*len) == Some(s) && rd.checked_add(*len) == Some(d) => {
                *len += 1
            }
            _ => runs.push((s, d, 1)),
        }
    }
    runs
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
    use super::{check_pairs, contiguous_runs};

    #[test]
    fn runs_cover_exactly_the_pairs_consecutive_on_both_sides() {
        assert_eq!(contiguous_runs(&[]), vec![]);
        // 4,5,6 -> 10,11,12 is one run; 7 -> 20 breaks the destination; 2 -> 13 the source.
        let pairs = [(5, 11), (2, 13), (4, 10), (7, 20), (6, 12)];
        assert_eq!(contiguous_runs(&pairs), vec![(2, 13, 1), (4, 10, 3), (7, 20, 1)]);
        let covered: usize = contiguous_runs(&pairs).iter().map(|r| r.2 as usize).sum();
        assert_eq!(covered, pairs.len());
        assert_eq!(
            contiguous_runs(&[(u32::MAX, 0), (0, u32::MAX)]),
            vec![(0, u32::MAX, 1), (u32::MAX, 0, 1)]
        );
    }

    #[test]
    fn pairs_are_checked_against_both_sides() {
        assert!(check_pairs("swap", &[(0, 1), (3, 0)], 4, 2).is_ok());
        assert!(check_pairs("swap", &[(4, 0)], 4, 2).is_err());
        assert!(check_pairs("swap", &[(0, 2)], 4, 2).is_err());
        assert!(check_pairs("swap", &[], 0, 0).is_ok());
    }
}
