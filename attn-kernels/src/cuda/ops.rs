//! Launch wrappers: the CUDA twins of `reshape_and_cache`, `paged_attention` (decode v1/v2; a
//! varlen batch's prefill sequences through the tiled prefill kernel, tiled by [`PrefillPlan`])
//! and `copy_blocks`, over `kv_cache::cuda` device caches.
//!
//! Everything a kernel could trip over (slot and block ranges, shapes, lengths) is checked on the
//! host before the launch, from the same host metadata the CPU kernels take, so a bad batch is a
//! typed error and never an out-of-bounds access on the device.
//!
//! One concern per file: `attention.rs` launches paged attention (the decode kernel's v1/v2
//! choice, the tiled prefill kernel), `tiling.rs` is the host arithmetic of how a varlen batch
//! is split and tiled (no device), `workspace.rs` sizes and holds the v2 scratch within its byte
//! budget, and `cache.rs` launches the cache writes and block copies. This file keeps what they
//! all check a launch against: the kernel configuration and CUDA's launch limits.

mod attention;
mod cache;
mod tiling;
mod workspace;

use kv_cache::DType;

use super::error::CudaError;
use super::kernels::AttentionConfig;

pub use attention::{choose_variant, paged_attention_with, shared_bytes};
pub use cache::{DeviceSlotMapping, copy_blocks, reshape_and_cache};
pub use tiling::{DecodeSplit, PrefillPlan};
pub use workspace::{AttnWorkspace, DEFAULT_WORKSPACE_BUDGET, WorkspaceShape};

/// The kernels of a cache of `dtype` blocks of `block_size` tokens of `head_size`, if they exist.
pub(super) fn kernel_config(
    dtype: DType,
    head_size: usize,
    block_size: usize,
) -> Result<AttentionConfig, CudaError> {
    let cfg = AttentionConfig { dtype, head_size, block_size };
    if cfg.is_supported() { Ok(cfg) } else { Err(CudaError::Unsupported(format!("{cfg:?}"))) }
}

/// Most blocks a grid may have along y or z (CUDA's limit; x allows 2³¹ − 1).
pub(super) const MAX_GRID_YZ: usize = 65_535;
/// Most blocks along x (the axis that grows with the batch: tokens, copy pairs).
pub(super) const MAX_GRID_X: usize = (1 << 31) - 1;
/// Most dynamic shared memory a launch can ask for (a `u32` launch parameter).
pub(super) const MAX_SHARED_BYTES: usize = u32::MAX as usize;

/// `n` `what` as a launch dimension (a grid extent or shared memory bytes) of at most `max`,
/// checked here instead of failing at launch.
pub(super) fn launch_dim(n: usize, max: usize, what: &str) -> Result<u32, CudaError> {
    match u32::try_from(n) {
        Ok(v) if n <= max => Ok(v),
        _ => Err(CudaError::InvalidArgument(format!("{n} {what} exceed the launch limit of {max}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::kernels::AttentionVariant;
    use crate::cuda::metadata::HostAttnMetadata;
    use crate::meta::check_slots;

    #[test]
    fn batch_sized_dimensions_go_on_x_and_the_others_are_checked() {
        assert_eq!(launch_dim(100_000, MAX_GRID_X, "tokens").ok(), Some(100_000));
        assert!(launch_dim(MAX_GRID_X + 1, MAX_GRID_X, "tokens").is_err());
        assert_eq!(launch_dim(65_535, MAX_GRID_YZ, "heads").ok(), Some(65_535));
        let e = launch_dim(65_536, MAX_GRID_YZ, "layers").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("65536 layers"), "{e}");
    }

    /// Choices on an H200 (132 multiprocessors) where the sweep of gpu-check's bandwidth
    /// section measured one variant clearly faster.
    #[test]
    fn variant_choice_follows_the_measured_sweep() {
        let sms = 132;
        // One partition: always v1.
        assert_eq!(choose_variant(512, 1, sms), AttentionVariant::V1);
        // Two partitions and a grid of 64 tokens x 8 head groups: v1.
        assert_eq!(choose_variant(1024, 64 * 8, sms), AttentionVariant::V1);
        // The same context with half the grid: v2.
        assert_eq!(choose_variant(1024, 32 * 8, sms), AttentionVariant::V2);
        // Four partitions or more: v2, however full the grid (v1's shared logits cost occupancy).
        assert_eq!(choose_variant(4096, 64 * 8, sms), AttentionVariant::V2);
        assert_eq!(choose_variant(8192, 256 * 32, sms), AttentionVariant::V2);
        assert_eq!(choose_variant(8193, 256 * 32, sms), AttentionVariant::V2);
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
