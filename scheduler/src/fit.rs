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
        let blocks_needed = prompt_len.div_ceil(self.block_size.max(1));
        if blocks_needed > self.pool_blocks.saturating_sub(self.watermark_blocks) {
            return Err(ExceedsPool { blocks_needed, pool_blocks: self.pool_blocks });
        }
        Ok(())
    }

    /// The prompt's admission and the request at its longest ([`blocks_for_request`]) within
    /// the pool: `Ok` means the request finishes alone without running out of blocks.
    pub fn check(&self, prompt_len: usize, max_new_tokens: usize, n: usize) -> Result<(), ExceedsPool> {
        self.check_prompt(prompt_len)?;
        match blocks_for_request(self.block_size, prompt_len, max_new_tokens, n) {
            Some(blocks_needed) if blocks_needed <= self.pool_blocks => Ok(()),
            need => {
                Err(ExceedsPool { blocks_needed: need.unwrap_or(usize::MAX), pool_blocks: self.pool_blocks })
            }
        }
    }

    /// The largest `max_new_tokens` that [`RequestFit::check`]'s output part allows (0 when not
    /// even the prompt fits): [`max_new_tokens_within`] this pool.
    pub fn max_new_tokens(&self, prompt_len: usize, n: usize) -> usize {
        max_new_tokens_within(self.block_size, prompt_len, n, self.pool_blocks)
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
