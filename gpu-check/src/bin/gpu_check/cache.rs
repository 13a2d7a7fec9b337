//! The cache sections: `reshape_and_cache` on every configuration (padding slots, shuffled
//! slots, a NaN-poisoned cache) and copy-on-write copies with swap out / swap in, each against
//! the CPU kernels' bytes.

use attn_kernels::backend::KernelBackend;
use attn_kernels::cuda::kernels::{AttentionConfig, attention_configs};
use attn_kernels::cuda::ops::{self, DeviceSlotMapping};
use gpu_check::attn_cases::{cache_images_equal, layer_bytes};
use gpu_check::figures::{Recorder, Res};
use kv_cache::cuda::{CudaKvCache, DeviceLayerCache};
use kv_cache::{BlockShape, CacheConfig, CacheGeometry, DType, KvCache, LayerCache};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::Ctx;

pub fn check_reshape_and_cache(ctx: &Ctx, rec: &mut Recorder) -> Res<()> {
    let kernels = &ctx.kernels;
    let stream = kernels.device().stream().clone();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    // The smallest run: the first configuration only.
    let configs = attention_configs().take(if ctx.smallest { 1 } else { usize::MAX });
    for AttentionConfig { dtype, head_size, block_size } in configs {
        let geometry = CacheGeometry { num_blocks: 13, num_kv_heads: 3, head_size, block_size, dtype };
        let mut host = LayerCache::new(geometry)?;
        host.fill(f32::NAN);
        let mut dev = DeviceLayerCache::new(&stream, geometry)?;
        dev.upload(&stream, &host)?;
        let mut slots: Vec<i64> = (0..geometry.num_slots() as i64).collect();
        slots.shuffle(&mut rng);
        slots.truncate(37);
        for s in slots.iter_mut().step_by(5) {
            *s = -1; // padding
        }
        let n = slots.len() * 3 * head_size;
        let k: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect();
        attn_kernels::reshape_and_cache(&k, &v, &slots, &mut host)?;
        let mapping = DeviceSlotMapping::upload(&stream, &slots, geometry.num_slots())?;
        let (key, value) = (stream.clone_htod(&k)?, stream.clone_htod(&v)?);
        ops::reshape_and_cache(kernels, &key, &value, &mapping, &mut dev)?;
        let mut back = LayerCache::new(geometry)?;
        dev.download(&stream, &mut back)?;
        let (hk, hv) = layer_bytes(&host);
        let (dk, dv) = layer_bytes(&back);
        if cache_images_equal(&hk, &dk, dtype) && cache_images_equal(&hv, &dv, dtype) {
            rec.pass(1);
        } else {
            rec.fail(format!("reshape_and_cache {dtype} h{head_size} b{block_size} kv3: cache bytes differ"));
        }
    }
    Ok(())
}

pub fn check_copy_and_swap(ctx: &Ctx, rec: &mut Recorder) -> Res<()> {
    let (kernels, device) = (&ctx.kernels, &ctx.device);
    let shape =
        BlockShape { block_size: 16, num_layers: 2, num_kv_heads: 2, head_size: 128, dtype: DType::BF16 };
    let config = CacheConfig::new(shape, 32, 8);
    let mut host = KvCache::new(config)?;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for layer in host.layers_mut() {
        let g = *layer.geometry();
        for slot in 0..g.num_slots() {
            for h in 0..g.num_kv_heads {
                let k: Vec<f32> = (0..g.head_size).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                layer.write_token(slot, h, &k, &k)?;
            }
        }
    }
    let mut dev = CudaKvCache::new(config, device.stream().clone())?;
    for l in 0..config.num_layers {
        dev.layer_mut(l)?.upload(device.stream(), host.layer(l))?;
    }
    let pairs = [(3u32, 7u32), (0, 31), (12, 1)];
    attn_kernels::copy_blocks(&mut host, &pairs)?;
    ops::copy_blocks(kernels, &mut dev, &pairs)?;
    // Swap blocks 7 and 31 out to swap slots 0 and 5, then back in to device blocks 20 and 21.
    kernels.swap_out(&mut dev, &[(7, 0), (31, 5)])?;
    kernels.swap_in(&mut dev, &[(0, 20), (5, 21)])?;
    device.synchronize()?;
    attn_kernels::copy_blocks(&mut host, &[(7, 20), (31, 21)])?;
    for l in 0..config.num_layers {
        let mut back = LayerCache::new(*host.layer(l).geometry())?;
        dev.layer(l)?.download(device.stream(), &mut back)?;
        if layer_bytes(&back) == layer_bytes(host.layer(l)) {
            rec.pass(1);
        } else {
            rec.fail(format!("copy_blocks / swap bf16 h128 b16 kv2 layer {l}: cache bytes differ"));
        }
    }
    Ok(())
}
