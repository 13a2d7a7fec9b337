//! Whole-block moves: `copy_blocks` (copy-on-write inside the device cache) and
//! `swap_blocks` / `swap_out` / `swap_in` (device ↔ host swap cache), over every layer: the ids
//! checked here, the bytes moved by `kv_cache::LayerCache`'s block copies (codes and scales).

use kv_cache::{KvCache, LayerCache};
use rayon::prelude::*;

use crate::AttnError;

fn check_ids(pairs: &[(u32, u32)], num_src: usize, num_dst: usize) -> Result<(), AttnError> {
    for &(s, d) in pairs {
        if s as usize >= num_src {
            return Err(AttnError::BlockOutOfRange { block: s as u64, num_blocks: num_src });
        }
        if d as usize >= num_dst {
            return Err(AttnError::BlockOutOfRange { block: d as u64, num_blocks: num_dst });
        }
    }
    Ok(())
}

/// Copies block `src` to block `dst` for every `(src, dst)` pair, in every layer, in order.
pub fn copy_blocks(cache: &mut KvCache, pairs: &[(u32, u32)]) -> Result<(), AttnError> {
    let num_blocks = cache.config().num_blocks;
    check_ids(pairs, num_blocks, num_blocks)?;
    if pairs.is_empty() {
        return Ok(());
    }
    cache.layers_mut().par_iter_mut().try_for_each(|layer| Ok(layer.copy_blocks_within(pairs)?))
}

/// Copies block `src` of `src_cache` to block `dst` of `dst_cache` for every `(src, dst)` pair.
/// Both caches must have the same per-block layout (kv heads, head size, block size, dtype).
pub fn swap_blocks(
    src_cache: &LayerCache,
    dst_cache: &mut LayerCache,
    mapping: &[(u32, u32)],
) -> Result<(), AttnError> {
    let (sg, dg) = (*src_cache.geometry(), *dst_cache.geometry());
    if !sg.same_block_layout(&dg) {
        return Err(AttnError::LayoutMismatch { src: format!("{sg:?}"), dst: format!("{dg:?}") });
    }
    check_ids(mapping, sg.num_blocks, dg.num_blocks)?;
    Ok(dst_cache.copy_blocks_from(src_cache, mapping)?)
}

/// Moves device blocks to the host swap cache, every layer: `(device_block, host_block)` pairs.
pub fn swap_out(cache: &mut KvCache, mapping: &[(u32, u32)]) -> Result<(), AttnError> {
    let cfg = *cache.config();
    check_ids(mapping, cfg.num_blocks, cfg.num_swap_blocks)?;
    let (device, host) = cache.device_and_swap_mut();
    device.par_iter().zip(host.par_iter_mut()).try_for_each(|(d, h)| swap_blocks(d, h, mapping))
}

/// Moves host swap-cache blocks back to the device, every layer: `(host_block, device_block)` pairs.
pub fn swap_in(cache: &mut KvCache, mapping: &[(u32, u32)]) -> Result<(), AttnError> {
    let cfg = *cache.config();
    check_ids(mapping, cfg.num_swap_blocks, cfg.num_blocks)?;
    let (device, host) = cache.device_and_swap_mut();
    host.par_iter().zip(device.par_iter_mut()).try_for_each(|(h, d)| swap_blocks(h, d, mapping))
}
