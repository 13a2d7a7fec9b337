//! Whether one request could ever finish alone on the device: [`RequestFit`], the pool's size
//! as admission sees it, with the one block count of a request at its longest. The scheduler
//! checks a prompt against it on `add_request`; a front end that must not cut a request short
//! for capacity (the engine) checks prompt and output once, before queueing it.

/// What one request may ask of a device pool alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFit {
    pub block_size: usize,
    /// Blocks in the device pool.
    pub pool_blocks: usize,
    /// Blocks admission keeps free (`BlockPool::watermark_blocks`): a prompt needing more than
    /// the pool less these is never admitted, not even on an idle device.
    pub watermark_blocks: usize,
    /// How many tables a sequence holds and how big a sliding one can get.
    pub groups: GroupFit,
}

/// The KV cache groups as the fit sees them: full-attention groups hold every block of a
/// sequence; a sliding group at most its window and a chunk (the largest window of the
/// model's, if they differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupFit {
    pub full: usize,
    pub sliding: usize,
    pub window: usize,
    /// The largest prefill chunk (the step's token budget).
    pub chunk: usize,
}

impl GroupFit {
    /// One full-attention group: a model without windows.
    pub const ONE_FULL: GroupFit = GroupFit { full: 1, sliding: 0, window: 0, chunk: 0 };

    /// The fit of `kv_groups` (per group, its window) with prefill chunks of up to `chunk`.
    pub fn of(kv_groups: &[Option<usize>], chunk: usize) -> Self {
        let sliding = kv_groups.iter().flatten().count();
        let window = kv_groups.iter().flatten().copied().max().unwrap_or(0);
        GroupFit { full: kv_groups.len() - sliding, sliding, window, chunk }
    }

    /// Blocks all groups hold when one group would hold `per_group` (`samples` sequences).
    fn total(&self, block_size: usize, per_group: usize, samples: usize) -> Option<usize> {
        let bound = crate::tables::sliding_group_bound(self.window, self.chunk, block_size);
        let sliding = per_group.min(bound.saturating_mul(samples));
        self.full.checked_mul(per_group)?.checked_add(self.sliding.checked_mul(sliding)?)
    }
}

/// A request that needs more blocks than the pool could ever give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExceedsPool {
    /// `usize::MAX` when the count overflows.
    pub blocks_needed: usize,
    pub pool_blocks: usize,
}

impl RequestFit {
    /// The prompt alone: its blocks within the pool less the watermark (what the scheduler's
    /// admission can ever grant).
    pub fn check_prompt(&self, prompt_len: usize) -> Result<(), ExceedsPool> {
        let blocks_needed = self
            .groups
            .total(self.block_size, prompt_len.div_ceil(self.block_size.max(1)), 1)
            .unwrap_or(usize::MAX);
        if blocks_needed > self.pool_blocks.saturating_sub(self.watermark_blocks) {
            return Err(ExceedsPool { blocks_needed, pool_blocks: self.pool_blocks });
        }
        Ok(())
    }

    /// The prompt's admission and the request at its longest ([`blocks_for_request`]) within
    /// the pool: `Ok` means the request finishes alone without running out of blocks.
    pub fn check(&self, prompt_len: usize, max_new_tokens: usize, n: usize) -> Result<(), ExceedsPool> {
        self.check_prompt(prompt_len)?;
        let need = blocks_for_request(self.block_size, prompt_len, max_new_tokens, n)
            .and_then(|per_group| self.groups.total(self.block_size, per_group, n));
        match need {
            Some(blocks_needed) if blocks_needed <= self.pool_blocks => Ok(()),
            need => {
                Err(ExceedsPool { blocks_needed: need.unwrap_or(usize::MAX), pool_blocks: self.pool_blocks })
            }
        }
    }

    /// The largest `max_new_tokens` that [`RequestFit::check`]'s output part allows (0 when not
    /// even the prompt fits): [`max_new_tokens_within`] this pool.
    pub fn max_new_tokens(&self, prompt_len: usize, n: usize) -> usize {
        if self.groups == GroupFit::ONE_FULL {
            return max_new_tokens_within(self.block_size, prompt_len, n, self.pool_blocks);
        }
        // The check is monotone in `max_new_tokens`: bisect for the largest that passes.
        let fits = |m: usize| self.check(prompt_len, m, n).is_ok();
        if !fits(1) {
            return 0;
        }
        let (mut lo, mut hi) = (1usize, usize::MAX / 4);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) { lo = mid } else { hi = mid - 1 }
        }
        lo
    }
}

/// How `n` samples of a prompt share its blocks: the prompt's full blocks are shared by all of
/// them, and with `n > 1` and a partial last prompt block, the first decode after the fork asks
/// room for every sample's copy while the original is still held (one block more than the
/// samples end up holding). Returns (shared blocks, that fork copy).
fn shared_prompt_blocks(block_size: usize, prompt_len: usize, n: usize) -> (usize, usize) {
    let shared = prompt_len / block_size;
    let fork_copy = usize::from(n > 1 && !prompt_len.is_multiple_of(block_size));
    (shared, fork_copy)
}

/// Device blocks one request needs at its longest, alone on the device (a front end refuses
/// requests above the pool size with this; the scheduler itself admits them and finishes them
/// for capacity when they outgrow the pool): the shared prompt blocks
/// ([`shared_prompt_blocks`]), and each sample owns the rest of its table (its copy of a partial
/// prompt block and the blocks of its generated tokens). The last generated token is never
/// written to the cache. `None` when the count overflows.
pub fn blocks_for_request(
    block_size: usize,
    prompt_len: usize,
    max_new_tokens: usize,
    n: usize,
) -> Option<usize> {
    if block_size == 0 || max_new_tokens == 0 {
        return None;
    }
    let prompt_blocks = prompt_len.div_ceil(block_size);
    if max_new_tokens == 1 {
        return Some(prompt_blocks); // no sample writes past the prompt: nothing is copied
    }
    let stored = prompt_len.checked_add(max_new_tokens - 1)?;
    let (shared, fork_copy) = shared_prompt_blocks(block_size, prompt_len, n);
    let own = stored.div_ceil(block_size) - shared;
    shared.checked_add(fork_copy)?.checked_add(own.checked_mul(n)?)
}

/// The largest `max_new_tokens` for which [`blocks_for_request`] stays within `pool_blocks`
/// (0 when not even the prompt fits).
pub fn max_new_tokens_within(block_size: usize, prompt_len: usize, n: usize, pool_blocks: usize) -> usize {
    if block_size == 0 || n == 0 || prompt_len.div_ceil(block_size) > pool_blocks {
        return 0;
    }
    let (shared, fork_copy) = shared_prompt_blocks(block_size, prompt_len, n);
    let own = pool_blocks.saturating_sub(shared + fork_copy) / n;
    // Stored tokens may reach (shared + own) blocks' worth: prompt + max_new - 1 ≤ that.
    let stored_max = shared.saturating_add(own).saturating_mul(block_size);
    match stored_max.checked_sub(prompt_len) {
        // Fewer than one slot past the prompt: only the single token that is never stored.
        Some(extra) => extra.saturating_add(1),
        None => 1,
    }
}
