//! Launch wrappers: the CUDA twins of `reshape_and_cache`, `paged_attention` (decode v1/v2; a
//! varlen batch's prefill sequences through the tiled prefill kernel, tiled by [`PrefillPlan`])
//! and `copy_blocks`, over `kv_cache::cuda` device caches.
//!
//! Everything a kernel could trip over (slot and block ranges, shapes, lengths) is checked on the
//! host before the launch, from the same host metadata the CPU kernels take, so a bad batch is a
//! typed error and never an out-of-bounds access on the device.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use kv_cache::DType;
use kv_cache::cuda::{CudaKvCache, DeviceLayerCache};

use super::error::CudaError;
use super::kernels::{
    ATTENTION_THREADS, ATTENTION_WARPS, AttentionConfig, AttentionVariant, COPY_BLOCKS_ENTRY, PARTITION_SIZE,
    PREFILL_KEYS, PREFILL_THREADS, REDUCE_ENTRY,
};
use super::metadata::{DeviceAttnMetadata, HostAttnMetadata, upload_into};
use super::runtime::CudaKernels;
use super::swap::check_pairs;
use crate::meta::check_slots;

/// vLLM's choice between the single-pass (v1) and the partitioned (v2) decode kernel: v1 when the
/// longest context is at most 8192 tokens and either it fits one partition or there are enough
/// (query token, head) pairs (> 512) to fill the GPU without splitting the context.
pub fn choose_variant(max_context: usize, num_tokens: usize, num_heads: usize) -> AttentionVariant {
    let partitions = max_context.div_ceil(PARTITION_SIZE);
    if max_context <= 8192 && (partitions <= 1 || num_tokens * num_heads > 512) {
        AttentionVariant::V1
    } else {
        AttentionVariant::V2
    }
}

/// Dynamic shared memory of an attention launch: reduction scratch, the queries, and the logits
/// of `tokens` context tokens (rounded up to whole blocks) for `qpk` heads. Mirrors
/// `paged_attention_body` in `attention.cu`.
pub fn shared_bytes(cfg: &AttentionConfig, qpk: usize, tokens: usize) -> usize {
    let len = tokens.div_ceil(cfg.block_size) * cfg.block_size;
    4 * (2 * ATTENTION_WARPS * qpk + qpk * cfg.head_size + qpk * len)
}

/// The largest v2 launch a workspace holds: its `tmp_out` is `[max_tokens, num_heads,
/// max_parts, head_size]`, so every one of the four bounds a launch (a larger head would write
/// past the end). A batch of more tokens is split into launches of at most `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceShape {
    pub max_tokens: usize,
    pub num_heads: usize,
    pub head_size: usize,
    pub max_parts: usize,
}

/// Device bytes the v2 scratch may take by default: with Llama-3-8B's 32 heads of 128 and
/// 256 partitions (a 131 072-token context) that is 63 query tokens per launch, so a decode
/// batch of 256 sequences takes 5 launches, and the scratch never grows with the batch.
pub const DEFAULT_WORKSPACE_BUDGET: usize = 256 << 20;

impl WorkspaceShape {
    /// The shape for batches of up to `max_tokens` query tokens of `num_heads` heads of
    /// `head_size` over contexts up to `max_context`, holding as many tokens per launch as
    /// `budget` bytes allow (at least one).
    pub fn for_budget(
        max_tokens: usize,
        num_heads: usize,
        head_size: usize,
        max_context: usize,
        budget: usize,
    ) -> Self {
        let max_parts = max_context.div_ceil(PARTITION_SIZE).max(1);
        let mut shape = WorkspaceShape {
            max_tokens: 1,
            num_heads: num_heads.max(1),
            head_size: head_size.max(1),
            max_parts,
        };
        let per_token = shape.bytes();
        shape.max_tokens = (budget / per_token.max(1)).clamp(1, max_tokens.max(1));
        shape
    }

    /// Device bytes of `tmp_out`, `exp_sums` and `max_logits` for this shape.
    pub fn bytes(&self) -> usize {
        let n = self.max_tokens * self.num_heads * self.max_parts;
        4 * (n * self.head_size + 2 * n)
    }

    /// Refuses launches of `heads` heads of `head_size` over `parts` partitions that do not
    /// fit (tokens are split into launches of at most `max_tokens`).
    pub fn check(&self, heads: usize, head_size: usize, parts: usize) -> Result<(), CudaError> {
        if heads > self.num_heads || head_size > self.head_size || parts > self.max_parts {
            return Err(CudaError::InvalidArgument(format!(
                "workspace sized for {} heads of {} x {} partitions, batch needs {heads} of {head_size} x {parts}",
                self.num_heads, self.head_size, self.max_parts
            )));
        }
        Ok(())
    }
}

/// Scratch of the partitioned kernel (per-partition outputs, max logits, exp sums), allocated
/// once, within a byte budget, so a step never allocates device memory.
#[derive(Debug)]
pub struct AttnWorkspace {
    tmp_out: CudaSlice<f32>,
    exp_sums: CudaSlice<f32>,
    max_logits: CudaSlice<f32>,
    shape: WorkspaceShape,
    /// The tiled prefill kernel's tile list ([`PrefillPlan::tiles`]) and how many tiles it holds.
    tiles: CudaSlice<i32>,
    num_tiles: usize,
    /// What `tiles` was built from (query_start_loc, seq_lens, tile tokens): the layers of one
    /// step share it, so it is uploaded once a step.
    tiles_for: Option<(Vec<i32>, Vec<i32>, usize)>,
}

impl AttnWorkspace {
    /// A workspace within [`DEFAULT_WORKSPACE_BUDGET`].
    pub fn new(
        stream: &Arc<CudaStream>,
        max_tokens: usize,
        num_heads: usize,
        head_size: usize,
        max_context: usize,
    ) -> Result<Self, CudaError> {
        Self::with_budget(stream, max_tokens, num_heads, head_size, max_context, DEFAULT_WORKSPACE_BUDGET)
    }

    /// A workspace of at most `budget` bytes (at least one token's worth).
    pub fn with_budget(
        stream: &Arc<CudaStream>,
        max_tokens: usize,
        num_heads: usize,
        head_size: usize,
        max_context: usize,
        budget: usize,
    ) -> Result<Self, CudaError> {
        let shape = WorkspaceShape::for_budget(max_tokens, num_heads, head_size, max_context, budget);
        let n = shape.max_tokens * shape.num_heads * shape.max_parts;
        Ok(AttnWorkspace {
            tmp_out: stream.alloc_zeros(n * shape.head_size)?,
            exp_sums: stream.alloc_zeros(n)?,
            max_logits: stream.alloc_zeros(n)?,
            shape,
            tiles: stream.alloc_zeros(2)?,
            num_tiles: 0,
            tiles_for: None,
        })
    }

    /// Uploads `plan`'s tiles of the batch `host` unless they are the ones uploaded last.
    fn upload_tiles(
        &mut self,
        stream: &Arc<CudaStream>,
        plan: &PrefillPlan,
        host: &HostAttnMetadata,
    ) -> Result<(), CudaError> {
        let same = self.tiles_for.as_ref().is_some_and(|(qsl, lens, tt)| {
            *tt == plan.tile_tokens && *qsl == host.query_start_loc && *lens == host.seq_lens
        });
        if same {
            return Ok(());
        }
        let tiles = plan.tiles(&host.query_start_loc, &host.seq_lens);
        self.tiles_for = None;
        upload_into(stream, &tiles, &mut self.tiles)?;
        self.num_tiles = tiles.len() / 2;
        self.tiles_for = Some((host.query_start_loc.clone(), host.seq_lens.clone(), plan.tile_tokens));
        Ok(())
    }

    pub fn shape(&self) -> WorkspaceShape {
        self.shape
    }
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
    scale: f32,
    workspace: &mut AttnWorkspace,
    variant: Option<AttentionVariant>,
) -> Result<AttentionVariant, CudaError> {
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
            (&cfg, num_heads, scale),
            workspace,
            (requested, max_context, meta.host.num_tokens, false),
        );
    }
    if split.decode_tokens > 0 {
        let choice = (None, split.decode_max_context, split.decode_tokens, true);
        launch_decode(kernels, out, query, cache, meta, (&cfg, num_heads, scale), workspace, choice)?;
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
        .arg(&tile_tokens);
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

/// A varlen batch's split between the tiled prefill kernel and the decode kernel: sequences of
/// more than one query token, and the decode tokens (sequences of one) with their longest context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecodeSplit {
    pub prefill_seqs: usize,
    pub decode_tokens: usize,
    pub decode_max_context: usize,
}

impl DecodeSplit {
    pub fn of(host: &HostAttnMetadata) -> Self {
        let mut split = DecodeSplit::default();
        if host.is_decode {
            return DecodeSplit {
                prefill_seqs: 0,
                decode_tokens: host.num_tokens,
                decode_max_context: host.max_context,
            };
        }
        for (s, w) in host.query_start_loc.windows(2).enumerate() {
            match w[1] - w[0] {
                0 => {}
                1 => {
                    split.decode_tokens += 1;
                    let ctx = host.seq_lens.get(s).copied().unwrap_or(0).max(0) as usize;
                    split.decode_max_context = split.decode_max_context.max(ctx);
                }
                _ => split.prefill_seqs += 1,
            }
        }
        split
    }
}

/// How the tiled prefill kernel covers a batch (mirrors `paged_prefill_body` in `attention.cu`):
/// a tile is `rows` query rows, `tile_tokens` consecutive query tokens of one sequence times
/// `tile_heads` query heads of one KV head's group; a group larger than `rows` is cut into
/// `head_chunks` chunks. Grid: x = tiles, y = KV heads × head chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillPlan {
    pub head_size: usize,
    pub rows: usize,
    pub tile_heads: usize,
    pub tile_tokens: usize,
    pub head_chunks: usize,
}

impl PrefillPlan {
    /// The tiling for heads of `head_size` and GQA groups of `group` query heads.
    pub fn new(head_size: usize, group: usize) -> Self {
        // PF_ROWS: 16 rows for heads above 128 keep the per-thread accumulators at 32 floats.
        let rows = if head_size > 128 { 16 } else { 32 };
        let group = group.max(1);
        let head_chunks = group.div_ceil(rows);
        let tile_heads = group.div_ceil(head_chunks);
        PrefillPlan { head_size, rows, tile_heads, tile_tokens: rows / tile_heads, head_chunks }
    }

    /// Dynamic shared memory of a launch: padded queries and keys, values, probabilities.
    pub fn shared_bytes(&self) -> usize {
        let (h, k) = (self.head_size, PREFILL_KEYS);
        4 * (self.rows * (h + 1) + k * (h + 1) + k * h + self.rows * (k + 1))
    }

    /// The tiles of a varlen batch as `(sequence, first query token of the sequence)` pairs,
    /// flattened: every sequence of more than one query token cut into runs of `tile_tokens`,
    /// the tiles with the most keys to walk (the causal work) first.
    pub fn tiles(&self, query_start_loc: &[i32], seq_lens: &[i32]) -> Vec<i32> {
        let mut tiles: Vec<(i64, i32, i32)> = Vec::new();
        for (s, w) in query_start_loc.windows(2).enumerate() {
            let qlen = w[1] - w[0];
            if qlen <= 1 {
                continue;
            }
            let first_pos = i64::from(seq_lens.get(s).copied().unwrap_or(0) - qlen);
            for t0 in (0..qlen).step_by(self.tile_tokens.max(1)) {
                let last = (t0 + self.tile_tokens as i32).min(qlen);
                tiles.push((first_pos + i64::from(last), s as i32, t0));
            }
        }
        tiles.sort_by_key(|&(work, s, t0)| (std::cmp::Reverse(work), s, t0));
        tiles.into_iter().flat_map(|(_, s, t0)| [s, t0]).collect()
    }

    /// Grid x and y of a launch over `num_tiles` tiles and `num_kv_heads` KV heads, checked.
    pub fn grid(&self, num_tiles: usize, num_kv_heads: usize) -> Result<(u32, u32), CudaError> {
        Ok((
            launch_dim(num_tiles, MAX_GRID_X, "prefill tiles")?,
            launch_dim(num_kv_heads * self.head_chunks, MAX_GRID_YZ, "KV heads x head chunks")?,
        ))
    }
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
    (cfg, num_heads, scale): (&AttentionConfig, usize, f32),
    workspace: &mut AttnWorkspace,
    (requested, max_context, tokens, skip_prefill): (Option<AttentionVariant>, usize, usize, bool),
) -> Result<AttentionVariant, CudaError> {
    let g = *cache.geometry();
    let group = num_heads / g.num_kv_heads;
    let qpk = cfg.qpk_for_group(group);
    let v1_shared = shared_bytes(cfg, qpk, max_context);
    let mut chosen = requested.unwrap_or_else(|| choose_variant(max_context, tokens, num_heads));
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
    let num_seqs = meta.host.seq_lens.len() as i32;
    let (nh, nkv) = (num_heads as i32, g.num_kv_heads as i32);
    let max_parts = workspace.shape.max_parts as i32;
    let skip = i32::from(skip_prefill);
    for t0 in (0..meta.host.num_tokens).step_by(per_launch.max(1)) {
        let tokens = launch_dim((meta.host.num_tokens - t0).min(per_launch), MAX_GRID_X, "tokens")?;
        let token_offset = launch_dim(t0, i32::MAX as usize, "token offset")? as i32;
        let mut b = stream.launch_builder(&func);
        // v1 writes `out` directly; v2 writes per-partition results for the reduce kernel.
        let (grid_z, shared, partition_size) = match chosen {
            AttentionVariant::V2 => {
                b.arg(&mut workspace.tmp_out).arg(&mut workspace.exp_sums).arg(&mut workspace.max_logits);
                let grid_z = launch_dim(parts, MAX_GRID_YZ, "context partitions")?;
                (grid_z, shared_bytes(cfg, qpk, PARTITION_SIZE), PARTITION_SIZE as i32)
            }
            _ => {
                b.arg(&mut *out).arg(&null).arg(&null);
                (1, v1_shared, 0i32)
            }
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
            .arg(&meta.seq_rows)
            .arg(&meta.seq_lens);
        if meta.host.is_decode {
            b.arg(&null);
        } else {
            b.arg(&meta.query_start_loc);
        }
        b.arg(&num_seqs)
            .arg(&nh)
            .arg(&nkv)
            .arg(&scale)
            .arg(&max_parts)
            .arg(&partition_size)
            .arg(&token_offset)
            .arg(&skip);
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
            r.arg(&mut *out)
                .arg(&workspace.exp_sums)
                .arg(&workspace.max_logits)
                .arg(&workspace.tmp_out)
                .arg(&meta.seq_lens);
            if meta.host.is_decode {
                r.arg(&null);
            } else {
                r.arg(&meta.query_start_loc);
            }
            r.arg(&num_seqs)
                .arg(&nh)
                .arg(&head_size)
                .arg(&max_parts)
                .arg(&partition_size)
                .arg(&token_offset)
                .arg(&skip);
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

/// The kernels of a cache of `dtype` blocks of `block_size` tokens of `head_size`, if they exist.
fn kernel_config(dtype: DType, head_size: usize, block_size: usize) -> Result<AttentionConfig, CudaError> {
    let cfg = AttentionConfig { dtype, head_size, block_size };
    if cfg.is_supported() { Ok(cfg) } else { Err(CudaError::Unsupported(format!("{cfg:?}"))) }
}

/// Most blocks a grid may have along y or z (CUDA's limit; x allows 2³¹ − 1).
const MAX_GRID_YZ: usize = 65_535;
/// Most blocks along x (the axis that grows with the batch: tokens, copy pairs).
const MAX_GRID_X: usize = (1 << 31) - 1;
/// Most dynamic shared memory a launch can ask for (a `u32` launch parameter).
const MAX_SHARED_BYTES: usize = u32::MAX as usize;

/// `n` `what` as a launch dimension (a grid extent or shared memory bytes) of at most `max`,
/// checked here instead of failing at launch.
fn launch_dim(n: usize, max: usize, what: &str) -> Result<u32, CudaError> {
    match u32::try_from(n) {
        Ok(v) if n <= max => Ok(v),
        _ => Err(CudaError::InvalidArgument(format!("{n} {what} exceed the launch limit of {max}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sized_dimensions_go_on_x_and_the_others_are_checked() {
        assert_eq!(launch_dim(100_000, MAX_GRID_X, "tokens").ok(), Some(100_000));
        assert!(launch_dim(MAX_GRID_X + 1, MAX_GRID_X, "tokens").is_err());
        assert_eq!(launch_dim(65_535, MAX_GRID_YZ, "heads").ok(), Some(65_535));
        let e = launch_dim(65_536, MAX_GRID_YZ, "layers").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("65536 layers"), "{e}");
    }

    #[test]
    fn variant_choice_follows_vllm() {
        // One partition: always v1.
        assert_eq!(choose_variant(512, 1, 32), AttentionVariant::V1);
        // Long context, few sequences: split.
        assert_eq!(choose_variant(4096, 4, 32), AttentionVariant::V2);
        // Long context, many (token, head) pairs: v1 fills the GPU already.
        assert_eq!(choose_variant(4096, 64, 32), AttentionVariant::V1);
        // Beyond 8192 tokens: always split.
        assert_eq!(choose_variant(8193, 256, 32), AttentionVariant::V2);
    }

    #[test]
    fn a_workspace_refuses_what_it_was_not_sized_for() {
        let shape = WorkspaceShape { max_tokens: 256, num_heads: 32, head_size: 128, max_parts: 16 };
        assert!(shape.check(32, 128, 16).is_ok());
        assert!(shape.check(8, 64, 2).is_ok());
        // A larger head (the case that used to write out of bounds), more heads or partitions:
        // refused (more tokens are split into launches).
        assert!(shape.check(1, 256, 1).is_err());
        assert!(shape.check(33, 128, 1).is_err());
        assert!(shape.check(1, 128, 17).is_err());
    }

    /// #17 item 2: Llama-3-8B (32 heads of 128) at max_model_len 131 072 with 8 192 batched
    /// tokens used to need `8192 × 32 × 256 × 128 × 4` B ≈ 34 GB of v2 scratch; within the
    /// budget it stays under 1 GiB, with a useful number of tokens per launch.
    #[test]
    fn the_v2_scratch_of_a_long_context_model_stays_within_its_budget() {
        let shape = WorkspaceShape::for_budget(8192, 32, 128, 131_072, DEFAULT_WORKSPACE_BUDGET);
        assert_eq!(shape.max_parts, 256);
        assert!(shape.bytes() <= DEFAULT_WORKSPACE_BUDGET && shape.bytes() < 1 << 30, "{} B", shape.bytes());
        assert!(shape.max_tokens >= 32, "{} tokens per launch", shape.max_tokens);
        // 8 192 tokens then take ceil(8192 / max_tokens) launches, each within the grid limits.
        let launches = 8192usize.div_ceil(shape.max_tokens);
        assert!(launch_dim(shape.max_tokens, MAX_GRID_X, "tokens").is_ok());
        assert!(launch_dim(shape.max_parts, MAX_GRID_YZ, "context partitions").is_ok());
        assert!(launches <= 8192);
        // A small model's short context needs far less than the budget: sized to the batch.
        let small = WorkspaceShape::for_budget(64, 9, 64, 2048, DEFAULT_WORKSPACE_BUDGET);
        assert_eq!((small.max_tokens, small.max_parts), (64, 4));
        // A budget below one token's scratch still holds one token.
        assert_eq!(WorkspaceShape::for_budget(10, 32, 128, 131_072, 1).max_tokens, 1);
    }

    #[test]
    fn slot_mappings_are_checked() {
        assert!(check_slots(&[0, -1, 63], 64).is_ok());
        assert!(check_slots(&[64], 64).is_err());
    }

    /// Every query token of every sequence of more than one token is in exactly one tile, and
    /// the tile's rows (tokens × heads) fit the kernel's rows; decode sequences get no tile.
    #[test]
    fn prefill_tiles_cover_every_prefill_token_once() {
        let qsl = [0, 1, 38, 38, 39, 3039, 3046];
        let seq_lens = [50, 37, 12, 700, 3000, 301];
        for head in [64, 80, 128, 256] {
            for group in 1..=20 {
                let plan = PrefillPlan::new(head, group);
                assert_eq!(plan.rows, if head > 128 { 16 } else { 32 });
                assert!(plan.tile_heads * plan.tile_tokens <= plan.rows && plan.tile_tokens >= 1);
                // The head chunks cover the group.
                assert!(plan.tile_heads * plan.head_chunks >= group);
                assert!(plan.tile_heads * (plan.head_chunks - 1) < group);
                let tiles = plan.tiles(&qsl, &seq_lens);
                let mut seen = vec![0u32; qsl[qsl.len() - 1] as usize];
                let mut last_work = i64::MAX;
                for t in tiles.chunks_exact(2) {
                    let (s, t0) = (t[0] as usize, t[1]);
                    let qlen = qsl[s + 1] - qsl[s];
                    assert!(qlen > 1 && (0..qlen).contains(&t0), "tile {t:?}");
                    let end = (t0 + plan.tile_tokens as i32).min(qlen);
                    for tok in t0..end {
                        seen[(qsl[s] + tok) as usize] += 1;
                    }
                    // Longest causal work (keys up to the tile's last position) first.
                    let work = i64::from(seq_lens[s] - qlen + end);
                    assert!(work <= last_work);
                    last_work = work;
                }
                for (s, w) in qsl.windows(2).enumerate() {
                    let want = u32::from(w[1] - w[0] > 1);
                    for tok in w[0]..w[1] {
                        assert_eq!(seen[tok as usize], want, "head {head} group {group} seq {s} token {tok}");
                    }
                }
                let (x, y) = plan.grid(tiles.len() / 2, 8).unwrap_or((0, 0));
                assert_eq!((x as usize, y as usize), (tiles.len() / 2, 8 * plan.head_chunks));
            }
        }
        // Grid y stops at 65 535.
        assert!(PrefillPlan::new(128, 1).grid(10, 65_536).is_err());
        assert!(PrefillPlan::new(128, 40).grid(10, 32_768).is_err());
        assert_eq!(PrefillPlan::new(128, 4).tile_tokens, 8);
        assert_eq!((PrefillPlan::new(64, 3).tile_heads, PrefillPlan::new(64, 3).tile_tokens), (3, 10));
        assert_eq!(PrefillPlan::new(256, 40).head_chunks, 3);
    }

    #[test]
    fn prefill_shared_memory_matches_the_kernel_layout() {
        // 32 rows x 129 queries + 32 x 129 keys + 32 x 128 values + 32 x 33 probabilities.
        assert_eq!(PrefillPlan::new(128, 4).shared_bytes(), 4 * (32 * 129 * 2 + 32 * 128 + 32 * 33));
        assert!(PrefillPlan::new(64, 8).shared_bytes() <= 48 * 1024);
        // Above the default 48 KB (the opt-in path) but far inside an A100/H100's 163+ KB.
        for head in [128, 256] {
            let b = PrefillPlan::new(head, 1).shared_bytes();
            assert!(b > 48 * 1024 && b < 100 * 1024, "{head}: {b}");
        }
    }

    #[test]
    fn a_mixed_batch_splits_into_prefill_sequences_and_decode_tokens() {
        let host = HostAttnMetadata {
            query_start_loc: vec![0, 1, 38, 38, 39],
            seq_lens: vec![50, 37, 12, 700],
            seq_rows: vec![0, 1, 2, 3],
            num_tokens: 39,
            max_context: 700,
            is_decode: false,
        };
        let split = DecodeSplit::of(&host);
        assert_eq!(split, DecodeSplit { prefill_seqs: 1, decode_tokens: 2, decode_max_context: 700 });
        let decode = HostAttnMetadata {
            query_start_loc: vec![0, 1],
            seq_lens: vec![9],
            num_tokens: 1,
            max_context: 9,
            is_decode: true,
            ..host
        };
        assert_eq!(
            DecodeSplit::of(&decode),
            DecodeSplit { prefill_seqs: 0, decode_tokens: 1, decode_max_context: 9 }
        );
    }

    #[test]
    fn shared_memory_matches_the_kernel_layout() {
        let cfg = AttentionConfig { dtype: DType::BF16, head_size: 128, block_size: 16 };
        // 2*4*4 scratch + 4*128 query + 4*4096 logits floats.
        assert_eq!(shared_bytes(&cfg, 4, 4096), 4 * (32 + 512 + 16384));
        // Rounded up to whole blocks.
        assert_eq!(shared_bytes(&cfg, 1, 17), shared_bytes(&cfg, 1, 32));
    }
}
