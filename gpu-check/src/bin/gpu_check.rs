//! `gpu_check`: the kernel half of the GPU run (the model half is `gpu_model_check`). Checks
//! every CUDA kernel against the CPU reference on random data (every cache dtype, head size and
//! block size; NaN-poisoned padding; shuffled blocks; decode, varlen and prefill batches through
//! the v1 and the v2 decode kernel and the tiled prefill path), checks copy/swap, measures device-to-device copy bandwidth and paged
//! decode attention, then checks every cache kernel at offsets past 2³² elements, and writes
//! everything as flat JSON to `$OUT/gpu_check.json`.
//!
//! The sections run in this order; each reports its failures and its wall time
//! (`time.<section>_s`, also printed), and one that errors counts as one failure while the others
//! still run. Estimated time on the H200 machine, from the sizes (host work measured on a 2-core
//! development VM; the device work is bytes over bandwidth, small beside it):
//!
//! | section | sizes | estimate |
//! |---|---|---|
//! | `attention` | 36 configurations (f16/bf16 × 6 head sizes × blocks 8/16/32) × 3 batches of ≤ 1 100 context tokens (2 or 8 KV heads, GQA 1–8; the `prefill` batch: chunks starting inside a block, prompts longer than a tile, a decode token beside them), each through v1, v2, split v2 and `Tiled` (tiled prefill + decode tokens) | ~6 s (host: case and f64 reference) |
//! | `attention`, long | 4 cases of 32 768 + 8 192 + 2 × 9 000 context tokens, 8 KV heads (up to 205 MB a tensor uploaded) | ~11 s host, < 0.5 s device |
//! | `attention`, long prompts | a 2 500-token prompt (bf16, h128, b16, GQA 4) and a 1 500-token chunk over 1 503 cached tokens (f16, h64, b32, GQA 8), each through the four paths | ~8 s host (f64 reference), < 0.5 s device |
//! | `reshape_and_cache` | 36 configurations × 37 slots of a 13-block cache | < 1 s |
//! | `copy_and_swap` | bf16, 2 layers × 32 blocks, 3 copies, 2 swaps each way | < 1 s |
//! | `bench` | 1 GiB device copy × 23; decode over 64 × 4 096 tokens (1 GiB of K/V) × 6 variants × 23 calls | ~2 s |
//! | `far_offsets` | bf16 pool of 17.2 GB (2 × 4.31·10⁹ elements), 14 MB tail written and read back twice | < 1 s |
//!
//! About 30 s in all plus CUDA start-up, far inside the 270 s `run.sh` gives this binary. The
//! far-offset section runs last: a 32-bit offset there could fault, and a fault ends the CUDA
//! context for everything after it.
//!
//! `gpu_check --precompile DIR [--arch sm_90]` runs without a GPU: it compiles every program
//! into the cubin cache folder DIR, so the GPU run needs no NVRTC at all.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use attn_kernels::cuda::DeviceAttnMetadata;
use attn_kernels::cuda::kernels::{AttentionConfig, AttentionVariant, all_programs, attention_configs};
use attn_kernels::cuda::ops::{self, AttnWorkspace, DeviceSlotMapping, WorkspaceShape};
use attn_kernels::cuda::{CudaDevice, CudaError, CudaKernels, cubin_cache::CubinCache, nvrtc};
use gpu_check::attn_cases::{
    AttnCase, FAR_GROUP, FAR_POOL_BLOCKS, FarPlacement, attention_tolerance, batches, cache_images_equal,
    decode_figures, far_batch, far_geometry, layer_bytes, long_prompt_cases, max_rel_error, nan_bytes,
};
use gpu_check::figures::{Figures, Res, finish, section};
use kv_cache::cuda::{CudaKvCache, DeviceLayerCache};
use kv_cache::{BlockShape, CacheConfig, CacheGeometry, DType, KvCache, LayerCache};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde_json::{Value, json};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    if let Some(dir) = flag("--precompile") {
        let arch = flag("--arch").unwrap_or_else(|| "sm_90".into());
        return match precompile(PathBuf::from(dir), &arch) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpu_check --precompile: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let cubin_dir = flag("--cubins")
        .map(PathBuf::from)
        .or_else(|| std::env::current_exe().ok().and_then(|e| e.parent().map(|p| p.join("cubins"))));
    let mut figures = Figures::new();
    let result = run(cubin_dir, &mut figures);
    finish("gpu_check", "check.passed", figures, result)
}

/// Compiles every program for `arch` into the cubin cache folder (no GPU needed).
fn precompile(dir: PathBuf, arch: &str) -> Res<()> {
    let cache = CubinCache::new(Some(dir.clone()));
    let headers = std::env::temp_dir().join("attn-kernels-nvrtc-headers");
    let programs = all_programs();
    programs.par_iter().try_for_each(|p| {
        nvrtc::compile(p, arch, &headers, false).and_then(|c| cache.store(p, arch, &c.cubin)).map(drop)
    })?;
    println!("precompiled {} programs for {arch} into {}", programs.len(), dir.display());
    Ok(())
}

/// Runs the checks and benchmarks; returns the number of failed checks.
fn run(cubin_dir: Option<PathBuf>, figures: &mut Figures) -> Res<usize> {
    let device = CudaDevice::open(0)?;
    figures.insert("device".into(), Value::String(device.name()?));
    let kernels = CudaKernels::with_cache_dir(device.clone(), cubin_dir)?;
    let start = Instant::now();
    // A section that errors counts as one failure and the run goes on: one bad case must not
    // cost the device run everything after it.
    let mut failures = 0;
    failures += section("attention", figures, |f| check_attention(&kernels, f));
    failures += section("reshape_and_cache", figures, |f| check_reshape_and_cache(&kernels, f));
    failures += section("copy_and_swap", figures, |f| check_copy_and_swap(&kernels, &device, f));
    let bench_failures = section("bench", figures, |f| bench(&kernels, &device, f).map(|()| 0));
    // Last: a 32-bit offset there could fault, and a fault ends the context for all that follows.
    failures += section("far_offsets", figures, |f| check_far_offsets(&kernels, &device, f));
    figures.insert("check.seconds".into(), json!(start.elapsed().as_secs_f64()));
    figures.insert("check.failures".into(), json!(failures));
    Ok(failures + bench_failures)
}

fn record_max(figures: &mut Figures, key: &str, v: f64) {
    let old = figures.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    figures.insert(key.into(), json!(old.max(if v.is_finite() { v } else { 1e30 })));
}

fn check_attention(kernels: &CudaKernels, figures: &mut Figures) -> Res<usize> {
    let stream = kernels.device().stream().clone();
    let mut tally = Tally::default();
    for (i, AttentionConfig { dtype, head_size, block_size }) in attention_configs().enumerate() {
        // Every GQA group with 2 KV heads and, every other round of four configs, with 8.
        let group = [1, 3, 4, 8][i % 4];
        let num_kv_heads = if (i / 4) % 2 == 0 { 2 } else { 8 };
        for (name, chunks) in batches() {
            let seed = i as u64 * 31 + name.len() as u64;
            let config = (dtype, head_size, block_size, num_kv_heads, group);
            tally.run(kernels, &stream, figures, name, config, &chunks, seed);
        }
    }
    // Long contexts on a few configurations: 8 192 tokens make v1 need more than 48 KB of
    // dynamic shared memory (the opt-in path) at 4 or 8 query heads per KV head; 32 768 go past
    // any opt-in size, so v1 falls back to v2 there.
    for (i, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
        for (j, head_size) in [64, 128].into_iter().enumerate() {
            let config = (dtype, head_size, 16, 8, [4, 8][(i + j) % 2]);
            tally.run(kernels, &stream, figures, "long", config, &long_batch(), 7 + i as u64 * 2 + j as u64);
        }
    }
    // Long prompts through the tiled prefill kernel (and the decode kernel, forced, as before).
    for (i, (name, config, chunks)) in long_prompt_cases().into_iter().enumerate() {
        tally.run(kernels, &stream, figures, name, config, &chunks, 41 + i as u64);
    }
    if !tally.case_errors.is_empty() {
        figures.insert("check.attention.errors".into(), json!(tally.case_errors));
    }
    figures.insert("check.attention.cases".into(), json!(tally.cases));
    figures.insert("check.attention.failures".into(), json!(tally.failures));
    Ok(tally.failures)
}

/// `(query_len, seq_len)` of the long-context batch.
fn long_batch() -> Vec<(usize, usize)> {
    vec![(1, 32_768), (1, 8_192), (2, 9_000)]
}

/// Cases run, failures, and the cases that could not run (upload or launch errors).
#[derive(Default)]
struct Tally {
    cases: usize,
    failures: usize,
    case_errors: Vec<String>,
}

impl Tally {
    /// One batch on one configuration `(dtype, head_size, block_size, num_kv_heads, group)`;
    /// a case that errors is a failure of that case, and the others still run.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        kernels: &CudaKernels,
        stream: &Arc<cudarc::driver::CudaStream>,
        figures: &mut Figures,
        name: &str,
        (dtype, head_size, block_size, num_kv_heads, group): (DType, usize, usize, usize, usize),
        chunks: &[(usize, usize)],
        seed: u64,
    ) {
        let needed: usize = chunks.iter().map(|&(_, l)| l.div_ceil(block_size)).sum();
        let geometry =
            CacheGeometry { num_blocks: 2 * needed + 3, num_kv_heads, head_size, block_size, dtype };
        let what =
            format!("attention {name} {dtype} h{head_size} b{block_size} kv{num_kv_heads} group {group}");
        let errors = match attention_case(kernels, stream, geometry, num_kv_heads * group, chunks, seed) {
            Ok(errors) => errors,
            Err(e) => {
                self.failures += 1;
                eprintln!("FAIL {what}: {e}");
                self.case_errors.push(format!("{what}: {e}"));
                return;
            }
        };
        for (variant, err) in errors {
            self.cases += 1;
            let key = format!("check.attention.{name}_{variant}.{}.max_rel_err", dtype.name()).to_lowercase();
            record_max(figures, &key, err);
            if err > attention_tolerance(dtype) {
                self.failures += 1;
                eprintln!("FAIL {what} {variant}: max rel err {err:.3e}");
            }
        }
    }
}

/// One attention case through both decode kernel variants, v2 once more with a workspace of two
/// tokens (so a batch runs as several launches, each at its token offset), and the tiled prefill
/// path: the largest relative error of each against the CPU reference.
fn attention_case(
    kernels: &CudaKernels,
    stream: &Arc<cudarc::driver::CudaStream>,
    geometry: CacheGeometry,
    num_heads: usize,
    chunks: &[(usize, usize)],
    seed: u64,
) -> Res<Vec<(&'static str, f64)>> {
    let case = AttnCase::random(geometry, num_heads, chunks, seed)?;
    let want = case.reference()?;
    let mut dev_cache = DeviceLayerCache::new(stream, geometry)?;
    dev_cache.upload(stream, &case.cache)?;
    let meta = DeviceAttnMetadata::upload(stream, &case.meta(), geometry.block_size, geometry.num_blocks)?;
    run_variants(kernels, stream, &case, &dev_cache, &meta, &want)
}

/// `case`'s queries through both decode kernel variants over `dev_cache` and `meta` (the case's
/// batch, its blocks wherever `meta`'s table says), v2 once more with a workspace of two tokens,
/// and the tiled prefill path: the largest relative error of each against `want`.
fn run_variants(
    kernels: &CudaKernels,
    stream: &Arc<cudarc::driver::CudaStream>,
    case: &AttnCase,
    dev_cache: &DeviceLayerCache,
    meta: &DeviceAttnMetadata,
    want: &[f32],
) -> Res<Vec<(&'static str, f64)>> {
    let (num_heads, geometry) = (case.num_heads, *dev_cache.geometry());
    let query = stream.clone_htod(&case.query)?;
    let (tokens, head, context) = (meta.num_tokens(), geometry.head_size, meta.max_context());
    let mut ws = AttnWorkspace::new(stream, tokens, num_heads, head, context)?;
    let two_tokens = WorkspaceShape::for_budget(2, num_heads, head, context, usize::MAX).bytes();
    let mut small = AttnWorkspace::with_budget(stream, tokens, num_heads, head, context, two_tokens)?;
    let mut errors = Vec::with_capacity(4);
    // `Tiled` (what the engine runs): the tiled prefill kernel over the sequences of more than
    // one query token, the decode kernel over the batch's decode tokens only, here with the
    // two-token workspace so a v2 decode part runs as several launches beside it.
    for (label, variant, split) in [
        ("V1", AttentionVariant::V1, false),
        ("V2", AttentionVariant::V2, false),
        ("V2_split", AttentionVariant::V2, true),
        ("Tiled", AttentionVariant::Tiled, true),
    ] {
        let ws = if split { &mut small } else { &mut ws };
        let mut out = stream.alloc_zeros::<f32>(case.query.len().max(1))?;
        ops::paged_attention_with(
            kernels,
            &mut out,
            &query,
            dev_cache,
            meta,
            num_heads,
            case.scale,
            ws,
            Some(variant),
        )?;
        let got = stream.clone_dtoh(&out)?;
        errors.push((label, max_rel_error(&got[..want.len()], want)));
    }
    Ok(errors)
}

fn check_reshape_and_cache(kernels: &CudaKernels, figures: &mut Figures) -> Res<usize> {
    let stream = kernels.device().stream().clone();
    let mut failures = 0;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for AttentionConfig { dtype, head_size, block_size } in attention_configs() {
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
        if !(cache_images_equal(&hk, &dk, dtype) && cache_images_equal(&hv, &dv, dtype)) {
            failures += 1;
            eprintln!("FAIL reshape_and_cache {dtype} h{head_size} b{block_size}");
        }
    }
    figures.insert("check.reshape_and_cache.failures".into(), json!(failures));
    Ok(failures)
}

fn check_copy_and_swap(kernels: &CudaKernels, device: &Arc<CudaDevice>, figures: &mut Figures) -> Res<usize> {
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
    attn_kernels::cuda::swap::swap_out(kernels, &mut dev, &[(7, 0), (31, 5)])?;
    attn_kernels::cuda::swap::swap_in(kernels, &mut dev, &[(0, 20), (5, 21)])?;
    device.synchronize()?;
    attn_kernels::copy_blocks(&mut host, &[(7, 20), (31, 21)])?;
    let mut failures = 0;
    for l in 0..config.num_layers {
        let mut back = LayerCache::new(*host.layer(l).geometry())?;
        dev.layer(l)?.download(device.stream(), &mut back)?;
        if layer_bytes(&back) != layer_bytes(host.layer(l)) {
            failures += 1;
            eprintln!("FAIL copy_blocks/swap layer {l}");
        }
    }
    figures.insert("check.copy_swap.failures".into(), json!(failures));
    Ok(failures)
}

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
fn check_far_offsets(kernels: &CudaKernels, device: &Arc<CudaDevice>, figures: &mut Figures) -> Res<usize> {
    let stream = device.stream().clone();
    let chunks = far_batch();
    let needed: usize = chunks.iter().map(|&(_, l)| l.div_ceil(16)).sum();
    let place = FarPlacement::at_end(far_geometry(2 * needed + 3), FAR_POOL_BLOCKS)?;
    let (small, pool) = (place.small(), place.pool());
    figures.insert("check.far_offsets.min_tile_offset".into(), json!(place.min_tile_offset()));
    figures.insert(
        "check.far_offsets.pool_bytes".into(),
        json!(2 * pool.tensor_elems() * pool.dtype.size_in_bytes()),
    );
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
    let mut failures = 0;
    let mut fail = |what: &str| {
        failures += 1;
        eprintln!("FAIL far offsets: {what}");
    };

    // Write: the case's keys and values at the placed slots.
    let slots = place.slots(&inputs.slots);
    let mapping = DeviceSlotMapping::upload(&stream, &slots, pool.num_slots())?;
    let (key, value) = (stream.clone_htod(&inputs.key)?, stream.clone_htod(&inputs.value)?);
    ops::reshape_and_cache(kernels, &key, &value, &mapping, dev.layer_mut(0)?)?;
    let (small_k, small_v) = layer_bytes(&case.cache);
    let (mut want_k, mut want_v) = (place.tail_image(&small_k), place.tail_image(&small_v));
    if !tail_matches(&stream, &dev, &place, &want_k, &want_v)? {
        fail("reshape_and_cache");
    }

    // Read: every variant through the remapped table.
    let table = place.table(&case.block_tables);
    let meta = attn_kernels::PagedAttnMetadata { block_tables: &table, ..case.meta() };
    let dmeta = DeviceAttnMetadata::upload(&stream, &meta, pool.block_size, pool.num_blocks)?;
    for (variant, err) in run_variants(kernels, &stream, &case, dev.layer(0)?, &dmeta, &want)? {
        record_max(figures, &format!("check.far_offsets.{variant}.max_rel_err").to_lowercase(), err);
        if err > attention_tolerance(pool.dtype) {
            fail(&format!("attention {variant}: max rel err {err:.3e}"));
        }
    }

    // Move: copy-on-write copies into gaps, a swap round trip into the spares.
    let moves = place.moves(&case.block_tables);
    ops::copy_blocks(kernels, &mut dev, &moves.copies)?;
    attn_kernels::cuda::swap::swap_out(kernels, &mut dev, &moves.swap_out)?;
    attn_kernels::cuda::swap::swap_in(kernels, &mut dev, &moves.swap_in)?;
    device.synchronize()?;
    place.apply_moves(&mut want_k, &moves);
    place.apply_moves(&mut want_v, &moves);
    if !tail_matches(&stream, &dev, &place, &want_k, &want_v)? {
        fail("copy_blocks / swap");
    }
    figures.insert("check.far_offsets.failures".into(), json!(failures));
    Ok(failures)
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

/// Mean seconds per call of `f` over `iters` calls, timed with CUDA events after 3 warm-ups.
fn time_it(device: &CudaDevice, iters: usize, mut f: impl FnMut() -> Result<(), CudaError>) -> Res<f64> {
    for _ in 0..3 {
        f()?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (a, b) = (device.context().new_event(flags)?, device.context().new_event(flags)?);
    a.record(device.stream())?;
    for _ in 0..iters {
        f()?;
    }
    b.record(device.stream())?;
    b.synchronize()?;
    Ok(f64::from(a.elapsed_ms(&b)?) / 1e3 / iters as f64)
}

fn bench(kernels: &CudaKernels, device: &Arc<CudaDevice>, figures: &mut Figures) -> Res<()> {
    let stream = device.stream().clone();
    // Device-to-device copy of 1 GiB: the bandwidth ceiling (bytes read + written).
    let n = 1usize << 30;
    let src = stream.alloc_zeros::<u8>(n)?;
    let mut dst = stream.alloc_zeros::<u8>(n)?;
    let copy_s = time_it(device, 20, || Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    let copy_bps = 2.0 * n as f64 / copy_s;
    figures.insert("cuda.copy_tb_s".into(), json!(copy_bps / 1e12));
    drop((src, dst));

    // Paged decode: 64 sequences x 4096 tokens, 32 query / 8 KV heads, head 128, bf16, block 16.
    let (seqs, ctx, heads, kv_heads, head_size, bs) =
        (64usize, 4096usize, 32usize, 8usize, 128usize, 16usize);
    let blocks_per_seq = ctx / bs;
    let geometry = CacheGeometry {
        num_blocks: seqs * blocks_per_seq,
        num_kv_heads: kv_heads,
        head_size,
        block_size: bs,
        dtype: DType::BF16,
    };
    let cache = DeviceLayerCache::new(&stream, geometry)?;
    let mut shuffled: Vec<u32> = (0..geometry.num_blocks as u32).collect();
    shuffled.shuffle(&mut ChaCha8Rng::seed_from_u64(1));
    let contiguous: Vec<u32> = (0..geometry.num_blocks as u32).collect();
    let qsl: Vec<usize> = (0..=seqs).collect();
    let lens = vec![ctx; seqs];
    let query = stream.alloc_zeros::<f32>(seqs * heads * head_size)?;
    let mut out = stream.alloc_zeros::<f32>(seqs * heads * head_size)?;
    let mut ws = AttnWorkspace::new(&stream, seqs, heads, head_size, ctx)?;
    let kv_bytes = (seqs * ctx * kv_heads * head_size * 2 * 2) as f64;
    let scale = 1.0 / (head_size as f32).sqrt();
    let mut times = Vec::new();
    for (table_name, table) in [("paged", &shuffled), ("contiguous", &contiguous)] {
        let meta = attn_kernels::PagedAttnMetadata {
            query_start_loc: &qsl,
            seq_lens: &lens,
            block_tables: table,
            max_blocks_per_seq: blocks_per_seq,
            seq_rows: None,
        };
        let dmeta = DeviceAttnMetadata::upload(&stream, &meta, bs, geometry.num_blocks)?;
        for variant in [None, Some(AttentionVariant::V1), Some(AttentionVariant::V2)] {
            let mut ran = AttentionVariant::V1;
            let t = time_it(device, 20, || {
                ran = ops::paged_attention_with(
                    kernels, &mut out, &query, &cache, &dmeta, heads, scale, &mut ws, variant,
                )?;
                Ok(())
            })?;
            let label = variant.map_or("auto".to_owned(), |v| format!("{v:?}").to_lowercase());
            figures.insert(format!("cuda.decode_{table_name}_{label}_us"), json!(t * 1e6));
            if variant.is_none() {
                figures.insert(
                    format!("cuda.decode_{table_name}_auto_is_v2"),
                    json!(u8::from(ran == AttentionVariant::V2)),
                );
            }
            times.push(((table_name, label), t));
        }
    }
    let get = |t: &str, l: &str| times.iter().find(|((a, b), _)| *a == t && b == l).map_or(f64::NAN, |x| x.1);
    let auto = decode_figures(kv_bytes, get("paged", "auto"), get("contiguous", "auto"), copy_bps);
    figures.insert("cuda.decode_bw_fraction".into(), json!(auto.bw_fraction));
    figures.insert("cuda.decode_kv_tb_s".into(), json!(auto.kv_bytes_per_s / 1e12));
    figures.insert("cuda.paged_over_contiguous".into(), json!(auto.paged_over_contiguous));
    for l in ["v1", "v2"] {
        let f = decode_figures(kv_bytes, get("paged", l), get("contiguous", l), copy_bps);
        figures.insert(format!("cuda.decode_{l}_bw_fraction"), json!(f.bw_fraction));
    }
    Ok(())
}
