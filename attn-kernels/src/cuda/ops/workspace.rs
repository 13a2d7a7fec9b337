//! The v2 decode kernel's scratch and the prefill kernel's tile list: `WorkspaceShape` sizes
//! the scratch within a byte budget (a larger batch runs as several launches instead of a
//! larger allocation), `AttnWorkspace` holds it, allocated once so a step never allocates
//! device memory.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::tiling::PrefillPlan;
use crate::cuda::error::CudaError;
use crate::cuda::kernels::PARTITION_SIZE;
use crate::cuda::metadata::{HostAttnMetadata, upload_into};

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
    pub(super) tmp_out: CudaSlice<f32>,
    pub(super) exp_sums: CudaSlice<f32>,
    pub(super) max_logits: CudaSlice<f32>,
    pub(super) shape: WorkspaceShape,
    /// The tiled prefill kernel's tile list ([`PrefillPlan::tiles`]) and how many tiles it holds.
    pub(super) tiles: CudaSlice<i32>,
    pub(super) num_tiles: usize,
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
    pub(super) fn upload_tiles(
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
