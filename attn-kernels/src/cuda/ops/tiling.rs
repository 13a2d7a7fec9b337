//! How a varlen batch meets the attention kernels, computed on the host: which of its
//! sequences go through the tiled prefill kernel and which tokens through the decode kernel
//! (`DecodeSplit`), and the prefill kernel's tiles and grid (`PrefillPlan`). No device here, so
//! the tiling is unit-tested (and emulated by `gpu-check`) without a GPU.

use super::{MAX_GRID_X, MAX_GRID_YZ, launch_dim};
use crate::cuda::error::CudaError;
use crate::cuda::kernels::PREFILL_KEYS;
use crate::cuda::metadata::HostAttnMetadata;

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
