//! The attention sections: every configuration's batches, the long contexts and the long
//! prompts through one attention path, each output against the f64 CPU reference.

use std::sync::Arc;

use attn_kernels::cuda::DeviceAttnMetadata;
use attn_kernels::cuda::kernels::{AttentionConfig, AttentionVariant, attention_configs};
use attn_kernels::cuda::ops::{self, AttnWorkspace, WorkspaceShape};
use attn_kernels::cuda::{CudaError, CudaKernels};
use cudarc::driver::CudaStream;
use gpu_check::attn_cases::{
    AttnCase, attention_tolerance, batches, long_prompt_cases, max_rel_error, window_cases,
};
use gpu_check::figures::{Recorder, Res};
use kv_cache::cuda::DeviceLayerCache;
use kv_cache::{CacheGeometry, DType};

use crate::Ctx;

/// One attention path: its label, the variant, and whether it runs with a two-token workspace
/// (so a batch runs as several launches, each at its token offset).
pub type Path = (&'static str, AttentionVariant, bool);

/// `(dtype, head_size, block_size, num_kv_heads, group)`.
pub type Config = (DType, usize, usize, usize, usize);

/// Every configuration's batches, then the long contexts and the long prompts, through `path`.
pub fn check(ctx: &Ctx, rec: &mut Recorder, path: Path) -> Res<()> {
    let stream = ctx.kernels.device().stream().clone();
    let is_tiled = path.1 == AttentionVariant::Tiled;
    for (i, AttentionConfig { dtype, head_size, block_size }) in attention_configs().enumerate() {
        // Every GQA group with 2 KV heads and, every other round of four configs, with 8.
        let group = [1, 3, 4, 8][i % 4];
        let num_kv_heads = if (i / 4) % 2 == 0 { 2 } else { 8 };
        for (name, chunks) in batches() {
            // The smallest run: one configuration, the batch its path is about.
            if ctx.smallest && (i > 0 || name != if is_tiled { "prefill" } else { "decode" }) {
                continue;
            }
            let seed = i as u64 * 31 + name.len() as u64;
            let config = (dtype, head_size, block_size, num_kv_heads, group);
            run_case(&ctx.kernels, &stream, rec, path, name, config, &chunks, seed, None);
        }
    }
    if ctx.smallest {
        return Ok(());
    }
    // Long contexts on a few configurations: 8 192 tokens make v1 need more than 48 KB of
    // dynamic shared memory (the opt-in path) at 4 or 8 query heads per KV head; 32 768 go past
    // any opt-in size, so v1 falls back to v2 there.
    for (i, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
        for (j, head_size) in [64, 128].into_iter().enumerate() {
            let config = (dtype, head_size, 16, 8, [4, 8][(i + j) % 2]);
            let seed = 7 + i as u64 * 2 + j as u64;
            run_case(&ctx.kernels, &stream, rec, path, "long", config, &long_batch(), seed, None);
        }
    }
    // Long prompts through the tiled prefill kernel (and the decode kernels, forced).
    for (i, (name, config, chunks)) in long_prompt_cases().into_iter().enumerate() {
        run_case(&ctx.kernels, &stream, rec, path, name, config, &chunks, 41 + i as u64, None);
    }
    // Sliding windows: blocks and partitions before the window unread, edges inside blocks.
    for (i, (name, config, chunks, window)) in window_cases().into_iter().enumerate() {
        run_case(&ctx.kernels, &stream, rec, path, name, config, &chunks, 61 + i as u64, Some(window));
    }
    Ok(())
}

/// `(query_len, seq_len)` of the long-context batch.
fn long_batch() -> Vec<(usize, usize)> {
    vec![(1, 32_768), (1, 8_192), (2, 9_000)]
}

/// The parameters of a case, as its failure lines print them.
pub fn describe(
    name: &str,
    (dtype, head_size, block_size, num_kv_heads, group): Config,
    context: usize,
) -> String {
    format!("{name} {dtype} h{head_size} b{block_size} kv{num_kv_heads} group {group} ctx {context}")
}

/// One batch on one configuration through `path`: passes or fails on the largest relative
/// error; a case that cannot run (upload, launch) is an error of that case, and the others run.
#[allow(clippy::too_many_arguments)]
fn run_case(
    kernels: &CudaKernels,
    stream: &Arc<CudaStream>,
    rec: &mut Recorder,
    path: Path,
    name: &str,
    config: Config,
    chunks: &[(usize, usize)],
    seed: u64,
    window: Option<usize>,
) {
    let (dtype, head_size, block_size, num_kv_heads, group) = config;
    let context = chunks.iter().map(|&(_, l)| l).max().unwrap_or(0);
    let mut what = describe(name, config, context);
    if let Some(w) = window {
        what += &format!(" window {w}");
    }
    let needed: usize = chunks.iter().map(|&(_, l)| l.div_ceil(block_size)).sum();
    let geometry = CacheGeometry { num_blocks: 2 * needed + 3, num_kv_heads, head_size, block_size, dtype };
    let outcome = (|| -> Res<f64> {
        let mut case = AttnCase::random(geometry, num_kv_heads * group, chunks, seed)?;
        case.scores.sliding_window = window;
        let want = case.reference()?;
        let mut dev_cache = DeviceLayerCache::new(stream, geometry)?;
        dev_cache.upload(stream, &case.cache)?;
        let meta =
            DeviceAttnMetadata::upload(stream, &case.meta(), geometry.block_size, geometry.num_blocks)?;
        Ok(run_path(kernels, stream, &case, &dev_cache, &meta, &want, path)?)
    })();
    match outcome {
        Err(e) => rec.error(format!("{what} {}: {e}", path.0)),
        Ok(err) => {
            let key =
                format!("check.attention.{name}_{}.{}.max_rel_err", path.0, dtype.name()).to_lowercase();
            rec.figure_max(&key, err);
            if err > attention_tolerance(dtype) {
                rec.fail(format!("{what} {}: max rel err {err:.3e}", path.0));
            } else {
                rec.pass(1);
            }
        }
    }
}

/// `case`'s queries through `path` over `dev_cache` and `meta` (the case's batch, its blocks
/// wherever `meta`'s table says): the largest relative error against `want`. `Tiled` is what
/// the engine runs: the tiled prefill kernel over the sequences of more than one query token,
/// the decode kernel over the batch's decode tokens only.
pub fn run_path(
    kernels: &CudaKernels,
    stream: &Arc<CudaStream>,
    case: &AttnCase,
    dev_cache: &DeviceLayerCache,
    meta: &DeviceAttnMetadata,
    want: &[f32],
    (_, variant, split): Path,
) -> Result<f64, CudaError> {
    let (num_heads, geometry) = (case.num_heads, *dev_cache.geometry());
    let query = stream.clone_htod(&case.query)?;
    let (tokens, head, context) = (meta.num_tokens(), geometry.head_size, meta.max_context());
    let mut ws = if split {
        let two_tokens = WorkspaceShape::for_budget(2, num_heads, head, context, usize::MAX).bytes();
        AttnWorkspace::with_budget(stream, tokens, num_heads, head, context, two_tokens)?
    } else {
        AttnWorkspace::new(stream, tokens, num_heads, head, context)?
    };
    let mut out = stream.alloc_zeros::<f32>(case.query.len().max(1))?;
    ops::paged_attention_with(
        kernels,
        &mut out,
        &query,
        dev_cache,
        meta,
        num_heads,
        case.scores,
        &mut ws,
        Some(variant),
    )?;
    let got = stream.clone_dtoh(&out)?;
    Ok(max_rel_error(&got[..want.len()], want))
}
