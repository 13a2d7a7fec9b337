//! The far-offset section: every kernel that indexes the cache, on a pool whose used blocks all
//! start past element 2³².

use std::sync::Arc;

use attn_kernels::backend::KernelBackend;
use attn_kernels::cuda::DeviceAttnMetadata;
use attn_kernels::cuda::kernels::AttentionVariant::{Tiled, V1, V2};
use attn_kernels::cuda::ops::{self, DeviceSlotMapping};
use gpu_check::attn_cases::{AttnCase, attention_tolerance, cache_images_equal, layer_bytes, nan_bytes};
use gpu_check::far_cases::{FAR_GROUP, FAR_POOL_BLOCKS, FarPlacement, far_batch, far_geometry};
use gpu_check::figures::{Recorder, Res};
use kv_cache::cuda::CudaKvCache;
use kv_cache::{BlockShape, CacheConfig};

use crate::Ctx;
use crate::attention::run_path;

/// #17: every kernel that indexes the cache, on a bf16 pool of [`FAR_POOL_BLOCKS`] blocks (8.6 GB
/// a tensor, 17.2 GB in all) whose used blocks all start past element 2³² (byte 2³³): a small
/// random case ([`far_batch`], 106 blocks of 8 KV heads of 128, GQA 4) placed at the pool's end
/// by [`FarPlacement`], gaps and spares poisoned with NaN. `reshape_and_cache` writes the case's
/// keys and values at the placed slots and the tail is read back against the small cache's
/// bytes; v1, v2 and split v2 attention read through the remapped table against the CPU
/// reference of the small case; `copy_blocks` and a swap out / swap in round trip move placed
/// blocks into gaps and spares, and the tail is read back again. Only the 14 MB tail crosses
/// the bus, so the case costs well under a second on an H200: allocating and zeroing 17 GB
/// (~10 ms at ~3 TB/s), 14 MB up and down twice (~10 ms), three attention launches over 1 700
/// context tokens, and ~0.2 s of host work (the small case and its f64 reference).
pub fn check_far_offsets(ctx: &Ctx, rec: &mut Recorder) -> Res<()> {
    let (kernels, device) = (&ctx.kernels, &ctx.device);
    let stream = device.stream().clone();
    let chunks = far_batch();
    let needed: usize = chunks.iter().map(|&(_, l)| l.div_ceil(16)).sum();
    let place = FarPlacement::at_end(far_geometry(2 * needed + 3), FAR_POOL_BLOCKS)?;
    let (small, pool) = (place.small(), place.pool());
    rec.figure("check.far_offsets.min_tile_offset", place.min_tile_offset());
    rec.figure("check.far_offsets.pool_bytes", 2 * pool.tensor_elems() * pool.dtype.size_in_bytes());
    let (case, inputs) = AttnCase::with_inputs(small, small.num_kv_heads * FAR_GROUP, &chunks, 17)?;
    let want = case.reference()?;
    let shape = BlockShape {
        block_size: pool.block_size,
        num_layers: 1,
        num_kv_heads: pool.num_kv_heads,
        head_size: pool.head_size,
        dtype: pool.dtype,
    };
    let mut dev = CudaKvCache::new(CacheConfig::new(shape, pool.num_blocks, 2), stream.clone())?;
    let tail = place.tail_bytes();
    let poison = nan_bytes(tail.len(), pool.dtype);
    {
        let (key, value) = dev.layer_mut(0)?.key_value_mut();
        stream.memcpy_htod(&poison, &mut key.slice_mut(tail.clone()))?;
        stream.memcpy_htod(&poison, &mut value.slice_mut(tail.clone()))?;
    }
    let check = |rec: &mut Recorder, ok: bool, what: &str| {
        if ok {
            rec.pass(1)
        } else {
            rec.fail(format!("far offsets bf16 h128 b16 kv8 group {FAR_GROUP}: {what}"))
        }
    };

    // Write: the case's keys and values at the placed slots.
    let slots = place.slots(&inputs.slots);
    let mapping = DeviceSlotMapping::upload(&stream, &slots, pool.num_slots())?;
    let (key, value) = (stream.clone_htod(&inputs.key)?, stream.clone_htod(&inputs.value)?);
    ops::reshape_and_cache(kernels, &key, &value, &mapping, dev.layer_mut(0)?)?;
    let (small_k, small_v) = layer_bytes(&case.cache);
    let (mut want_k, mut want_v) = (place.tail_image(&small_k), place.tail_image(&small_v));
    check(rec, tail_matches(&stream, &dev, &place, &want_k, &want_v)?, "reshape_and_cache");

    // Read: every variant through the remapped table.
    let table = place.table(&case.metadata.block_tables);
    let meta = attn_kernels::PagedAttnMetadata { block_tables: &table, ..case.meta() };
    let dmeta = DeviceAttnMetadata::upload(&stream, &meta, pool.block_size, pool.num_blocks)?;
    for path in [("V1", V1, false), ("V2", V2, false), ("V2_split", V2, true), ("Tiled", Tiled, true)] {
        let err = run_path(kernels, &stream, &case, dev.layer(0)?, &dmeta, &want, path)?;
        rec.figure_max(&format!("check.far_offsets.{}.max_rel_err", path.0).to_lowercase(), err);
        let ok = err <= attention_tolerance(pool.dtype);
        check(rec, ok, &format!("attention {} ctx 1100: max rel err {err:.3e}", path.0));
    }

    // Move: copy-on-write copies into gaps, a swap round trip into the spares.
    let moves = place.moves(&case.metadata.block_tables);
    ops::copy_blocks(kernels, &mut dev, &moves.copies)?;
    kernels.swap_out(&mut dev, &moves.swap_out)?;
    kernels.swap_in(&mut dev, &moves.swap_in)?;
    device.synchronize()?;
    place.apply_moves(&mut want_k, &moves);
    place.apply_moves(&mut want_v, &moves);
    check(rec, tail_matches(&stream, &dev, &place, &want_k, &want_v)?, "copy_blocks / swap");
    Ok(())
}

/// Whether the tail of layer 0's key and value tensors reads as `want_k` / `want_v`.
fn tail_matches(
    stream: &Arc<cudarc::driver::CudaStream>,
    dev: &CudaKvCache,
    place: &FarPlacement,
    want_k: &[u8],
    want_v: &[u8],
) -> Res<bool> {
    let layer = dev.layer(0)?;
    let tail = place.tail_bytes();
    let key = stream.clone_dtoh(&layer.key().slice(tail.clone()))?;
    let value = stream.clone_dtoh(&layer.value().slice(tail))?;
    stream.synchronize()?;
    let dtype = place.pool().dtype;
    Ok(cache_images_equal(&key, want_k, dtype) && cache_images_equal(&value, want_v, dtype))
}
