//! Paged attention on the GPU: the decode kernel (v1 single pass or v2 partitioned, chosen as
//! vLLM does, v2 in launches of at most the workspace's tokens) and the tiled prefill kernel for
//! a varlen batch's sequences of more than one query token.

use cudarc::driver::{CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};
use kv_cache::cuda::DeviceLayerCache;

use super::tiling::{DecodeSplit, PrefillPlan};
use super::workspace::AttnWorkspace;
use super::{MAX_GRID_X, MAX_GRID_YZ, MAX_SHARED_BYTES, kernel_config, launch_dim};
use crate::AttnScores;
use crate::cuda::error::CudaError;
use crate::cuda::kernels::{
    ATTENTION_THREADS, ATTENTION_WARPS, AttentionConfig, AttentionVariant, PARTITION_SIZE, PREFILL_THREADS,
    REDUCE_ENTRY,
};
use crate::cuda::metadata::DeviceAttnMetadata;
use crate::cuda::runtime::CudaKernels;

/// The choice between the single-pass (v1) and the partitioned (v2) decode kernel. v1 keeps a
/// whole context's logits in one thread block's shared memory and walks the context serially,
/// so it wins only where the context is short (at most two partitions) and its grid of
/// `v1_blocks` thread blocks (query tokens × head groups) fills every multiprocessor several
/// times over; else v2's partitions win. One partition always runs v1 (v2 would add a reduce).
/// The constants (two partitions, `V1_BLOCKS_PER_MULTIPROCESSOR`) are fit to the fitted part of
/// the decode sweep of gpu-check's bandwidth section (`gpu_check::variant_sweep`: 4 head layouts
/// × batches of 1 to 256 × contexts of 1 024 to 8 192 tokens, on 132 multiprocessors); every GPU
/// run re-times that sweep and judges the rule apart on held-out shapes off its grid
/// (`cuda.sweep.heldout_*`). vLLM's rule (count (token, head) pairs, v1 up to 8 192 tokens) does
/// not fit kernels that run several query heads per thread block.
pub fn choose_variant(max_context: usize, v1_blocks: usize, multiprocessors: usize) -> AttentionVariant {
    let partitions = max_context.div_ceil(PARTITION_SIZE);
    let fills = v1_blocks >= V1_BLOCKS_PER_MULTIPROCESSOR * multiprocessors;
    if partitions <= 1 || (partitions <= 2 && fills) { AttentionVariant::V1 } else { AttentionVariant::V2 }
}

/// Thread blocks per multiprocessor from which v1's grid fills the device.
const V1_BLOCKS_PER_MULTIPROCESSOR: usize = 3;

/// Dynamic shared memory of an attention launch: reduction scratch, the queries, and the logits
/// of `tokens` context tokens (rounded up to whole blocks) for `qpk` heads. Mirrors
/// `paged_attention_body` in `attention.cu`.
pub fn shared_bytes(cfg: &AttentionConfig, qpk: usize, tokens: usize) -> usize {
    let len = tokens.div_ceil(cfg.block_size) * cfg.block_size;
    4 * (2 * ATTENTION_WARPS * qpk + qpk * cfg.head_size + qpk * len)
}

/// `paged_attention` on the GPU. `None` (or `Some(Tiled)`): a varlen batch's sequences of more
/// than one query token go through the tiled prefill kernel and its decode tokens (if any)
/// through the decode kernel, v1 or v2 chosen by [`choose_variant`] for them alone; a decode
/// batch through the decode kernel as chosen. `Some(V1 | V2)` forces the decode kernel over every
/// token (benchmarks and the GPU check compare them). v2 also runs when v1's logits would not fit
/// in shared memory, the decode kernel when the tiled one's tiles would not. Returns the variant
/// that ran (`Tiled` when the tiled kernel did).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_with(
    kernels: &CudaKernels,
    out: &mut CudaSlice<f32>,
    query: &CudaSlice<f32>,
    cache: &DeviceLayerCache,
    meta: &DeviceAttnMetadata,
    num_heads: usize,
    scores: AttnScores,
    workspace: &mut AttnWorkspace,
    variant: Option<AttentionVariant>,
) -> Result<AttentionVariant, CudaError> {
    let scale = scores.scale;
    // 0: no window (the kernels' convention).
    let window = match scores.sliding_window {
        None => 0i32,
        Some(w) => i32::try_from(w.max(1)).unwrap_or(i32::MAX),
    };
    let g = *cache.geometry();
    let cfg = kernel_config(g.dtype, g.head_size, g.block_size)?;
    crate::meta::check_heads_and_scale(num_heads, g.num_kv_heads, scale)
        .map_err(|e| CudaError::InvalidArgument(e.to_string()))?;
    let rows = meta.host.num_tokens * num_heads * g.head_size;
    if query.len() < rows || out.len() < rows {
        return Err(CudaError::InvalidArgument(format!(
            "query/out hold {}/{} values, the batch needs {rows}",
            query.len(),
            out.len()
        )));
    }
    if meta.host.num_tokens == 0 {
        return Ok(AttentionVariant::V1);
    }
    let group = num_heads / g.num_kv_heads;
    let plan = PrefillPlan::new(g.head_size, group);
    let split = DecodeSplit::of(&meta.host);
    let tiled = split.prefill_seqs > 0
        && matches!(variant, None | Some(AttentionVariant::Tiled))
        && plan.shared_bytes() <= kernels.max_shared_bytes();
    if !tiled {
        let requested = variant.filter(|v| *v != AttentionVariant::Tiled);
        let max_context = meta.host.max_context;
        return launch_decode(
            kernels,
            out,
            query,
            cache,
            meta,
            (&cfg, num_heads, scale, window),
            workspace,
            (requested, max_context, meta.host.num_tokens, false),
        );
    }
    if split.decode_tokens > 0 {
        let choice = (None, split.decode_max_context, split.decode_tokens, true);
        launch_decode(kernels, out, query, cache, meta, (&cfg, num_heads, scale, window), workspace, choice)?;
    }
    workspace.upload_tiles(kernels.device().stream(), &plan, &meta.host)?;
    let func = kernels.function_lazy(&cfg.program_name(), &cfg.prefill_entry(), || cfg.program())?;
    let stream = kernels.device().stream().clone();
    let (grid_x, grid_y) = plan.grid(workspace.num_tiles, g.num_kv_heads)?;
    let max_blocks = meta.max_blocks_per_seq as i32;
    let (nh, nkv) = (num_heads as i32, g.num_kv_heads as i32);
    let (tile_heads, tile_tokens) = (plan.tile_heads as i32, plan.tile_tokens as i32);
    let mut b = stream.launch_builder(&func);
    b.arg(&mut *out)
        .arg(query)
        .arg(cache.key())
        .arg(cache.value())
        .arg(&meta.block_tables)
        .arg(&max_blocks)
        .arg(&meta.seq_rows)
        .arg(&meta.seq_lens)
        .arg(&meta.query_start_loc)
        .arg(&workspace.tiles)
        .arg(&nh)
        .arg(&nkv)
        .arg(&scale)
        .arg(&tile_heads)
        .arg(&tile_tokens)
        .arg(&window);
    let launch = LaunchConfig {
        grid_dim: (grid_x, grid_y, 1),
        block_dim: (PREFILL_THREADS, 1, 1),
        shared_mem_bytes: launch_dim(plan.shared_bytes(), MAX_SHARED_BYTES, "shared bytes")?,
    };
    // SAFETY: argument list matches PF_PARAMS in attention.cu; query/out were size-checked
    // above, the tiles were built from this batch's checked metadata (every tile inside its
    // sequence's query tokens), and every block index the kernel reads (keys below seq_len) was
    // range-checked by DeviceAttnMetadata.
    unsafe { b.launch(launch) }?;
    Ok(AttentionVariant::Tiled)
}

/// The decode kernel over the batch (`skip_prefill`: only its decode tokens; the tiled kernel
/// writes the other rows), `requested` forced or chosen for `tokens` query tokens of contexts up
/// to `max_context`.
#[allow(clippy::too_many_arguments)]
fn launch_decode(
    kernels: &CudaKernels,
    out: &mut CudaSlice<f32>,
    query: &CudaSlice<f32>,
    cache: &DeviceLayerCache,
    meta: &DeviceAttnMetadata,
    (cfg, num_heads, scale, window): (&AttentionConfig, usize, f32, i32),
    workspace: &mut AttnWorkspace,
    (requested, max_context, tokens, skip_prefill): (Option<AttentionVariant>, usize, usize, bool),
) -> Result<AttentionVariant, CudaError> {
    let g = *cache.geometry();
    let group = num_heads / g.num_kv_heads;
    let qpk = cfg.qpk_for_group(group);
    let v1_shared = shared_bytes(cfg, qpk, max_context);
    let v1_blocks = tokens.saturating_mul(num_heads / qpk);
    let mut chosen =
        requested.unwrap_or_else(|| choose_variant(max_context, v1_blocks, kernels.multiprocessors()));
    if chosen != AttentionVariant::V2 && v1_shared > kernels.max_shared_bytes() {
        chosen = AttentionVariant::V2;
    }
    let chosen = if chosen == AttentionVariant::V2 { AttentionVariant::V2 } else { AttentionVariant::V1 };
    let parts = max_context.div_ceil(PARTITION_SIZE).max(1);
    if chosen == AttentionVariant::V2 {
        workspace.shape.check(num_heads, g.head_size, parts)?;
    }
    let entry = cfg.attention_entry(qpk);
    let func = kernels.function_lazy(&cfg.program_name(), &entry, || cfg.program())?;
    let stream = kernels.device().stream().clone();
    // Tokens go on x (up to 2³¹ − 1 blocks); head groups and partitions on y and z (≤ 65 535).
    // v1 runs every token in one launch (the kernel relies on it: a v1 launch starts at token
    // 0); v2 in launches of at most the workspace's tokens.
    let per_launch = match chosen {
        AttentionVariant::V2 => workspace.shape.max_tokens,
        _ => meta.host.num_tokens,
    };
    let head_groups = launch_dim(g.num_kv_heads * group / qpk, MAX_GRID_YZ, "head groups")?;
    let null: u64 = 0;
    let max_blocks = meta.max_blocks_per_seq as i32;
    let nkv = g.num_kv_heads as i32;
    // v1 writes `out` directly; v2 writes per-partition results for the reduce kernel.
    let (grid_z, shared, partition_size) = match chosen {
        AttentionVariant::V2 => (
            launch_dim(parts, MAX_GRID_YZ, "context partitions")?,
            shared_bytes(cfg, qpk, PARTITION_SIZE),
            PARTITION_SIZE as i32,
        ),
        _ => (1, v1_shared, 0i32),
    };
    for t0 in (0..meta.host.num_tokens).step_by(per_launch.max(1)) {
        let tokens = launch_dim((meta.host.num_tokens - t0).min(per_launch), MAX_GRID_X, "tokens")?;
        let args = DecodeArgs {
            meta,
            null,
            num_seqs: meta.host.seq_lens.len() as i32,
            num_heads: num_heads as i32,
            max_parts: workspace.shape.max_parts as i32,
            partition_size,
            token_offset: launch_dim(t0, i32::MAX as usize, "token offset")? as i32,
            skip_prefill: i32::from(skip_prefill),
        };
        let mut b = stream.launch_builder(&func);
        match chosen {
            AttentionVariant::V2 => {
                b.arg(&mut workspace.tmp_out).arg(&mut workspace.exp_sums).arg(&mut workspace.max_logits)
            }
            _ => b.arg(&mut *out).arg(&args.null).arg(&args.null),
        };
        let cfg_launch = LaunchConfig {
            grid_dim: (tokens, head_groups, grid_z),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: launch_dim(shared, MAX_SHARED_BYTES, "shared bytes")?,
        };
        b.arg(query)
            .arg(cache.key())
            .arg(cache.value())
            .arg(&meta.block_tables)
            .arg(&max_blocks)
            .arg(&meta.seq_rows);
        args.push_seqs(&mut b);
        b.arg(&nkv).arg(&scale);
        args.push_partitions(&mut b);
        b.arg(&window);
        // SAFETY: argument list matches PA_PARAMS in attention.cu; every buffer was size-checked
        // above (a v2 launch holds at most the workspace's tokens) and every block index the
        // kernel reads was range-checked by DeviceAttnMetadata. With `skip_prefill` the blocks of
        // prefill tokens return at once, so shared memory and partitions sized for the decode
        // tokens' contexts suffice.
        unsafe { b.launch(cfg_launch) }?;
        if chosen == AttentionVariant::V2 {
            let reduce = kernels.function_lazy(&cfg.program_name(), REDUCE_ENTRY, || cfg.program())?;
            let head_size = g.head_size as i32;
            let mut r = stream.launch_builder(&reduce);
            r.arg(&mut *out).arg(&workspace.exp_sums).arg(&workspace.max_logits).arg(&workspace.tmp_out);
            args.push_seqs(&mut r);
            r.arg(&head_size);
            args.push_partitions(&mut r);
            let rc = LaunchConfig {
                grid_dim: (tokens, launch_dim(num_heads, MAX_GRID_YZ, "heads")?, 1),
                block_dim: (ATTENTION_THREADS, 1, 1),
                shared_mem_bytes: launch_dim(
                    4 * workspace.shape.max_parts,
                    MAX_SHARED_BYTES,
                    "shared bytes",
                )?,
            };
            // SAFETY: matches paged_attention_v2_reduce's parameters; sizes checked above.
            unsafe { r.launch(rc) }?;
        }
    }
    Ok(chosen)
}

/// The arguments a decode launch shares with its v2 reduce: both kernels take `seq_lens,
/// query_start_loc, num_seqs, num_heads`, then one or two of their own, then `max_parts,
/// partition_size, token_offset, skip_prefill` (the decode kernel then its `window`).
struct DecodeArgs<'m> {
    meta: &'m DeviceAttnMetadata,
    /// A null pointer: the `query_start_loc` of a decode batch, v1's missing v2 scratch.
    null: u64,
    num_seqs: i32,
    num_heads: i32,
    max_parts: i32,
    partition_size: i32,
    token_offset: i32,
    skip_prefill: i32,
}

impl DecodeArgs<'_> {
    /// `seq_lens, query_start_loc (null for a decode batch), num_seqs, num_heads`.
    fn push_seqs<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.meta.seq_lens);
        if self.meta.host.is_decode {
            b.arg(&self.null);
        } else {
            b.arg(&self.meta.query_start_loc);
        }
        b.arg(&self.num_seqs).arg(&self.num_heads);
    }

    /// `max_parts, partition_size, token_offset, skip_prefill`.
    fn push_partitions<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.max_parts).arg(&self.partition_size).arg(&self.token_offset).arg(&self.skip_prefill);
    }
}
