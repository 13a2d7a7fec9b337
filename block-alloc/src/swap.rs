//! Swap plans: moving a group of tables (e.g. the forked sequences of one request, which share
//! blocks) from one pool to another, such as device → host and back.
//!
//! A block shared by several tables of the group maps to a single destination block whose ref
//! count is the number of group entries holding it. Source blocks lose exactly those
//! references; a block also held outside the group (say, a cached prefix shared with another
//! request) stays held in the source pool. Freed device blocks keep their cached hash, so their
//! content stays findable until evicted.

use std::collections::HashMap;

use crate::{AllocError, AllocStatus, BlockId, BlockPool, BlockTable};

/// Moves `tables` from `device` to `host`: returns the `(device_block, host_block)` copies
/// the caller must perform; afterwards the tables hold host blocks.
///
/// Errors (nothing changed): [`AllocError::OutOfBlocks`] (host pool too small),
/// [`AllocError::WrongPool`], [`AllocError::BlockSizeMismatch`], [`AllocError::UnknownBlock`],
/// [`AllocError::NotAllocated`], [`AllocError::RefCountMismatch`].
pub fn swap_out(
    device: &mut BlockPool,
    host: &mut BlockPool,
    tables: &mut [&mut BlockTable],
) -> Result<Vec<(BlockId, BlockId)>, AllocError> {
    transfer(device, host, tables)
}

/// Moves `tables` from `host` back to `device`: returns the `(host_block, device_block)`
/// copies. The device blocks are not registered in the prefix cache until the next
/// [`BlockPool::cache_full_blocks`] for each table. Errors as [`swap_out`].
pub fn swap_in(
    host: &mut BlockPool,
    device: &mut BlockPool,
    tables: &mut [&mut BlockTable],
) -> Result<Vec<(BlockId, BlockId)>, AllocError> {
    transfer(host, device, tables)
}

/// Number of distinct blocks the tables hold: what a swap of the group moves.
pub fn num_distinct_blocks(tables: &[&BlockTable]) -> usize {
    let mut seen = HashMap::new();
    for t in tables {
        for &b in t.live_blocks() {
            seen.insert(b, ());
        }
    }
    seen.len()
}

/// Whether `device` can take the group back now, leaving its watermark free (as
/// [`BlockPool::can_allocate`] for the group's distinct blocks).
pub fn can_swap_in(device: &BlockPool, tables: &[&BlockTable]) -> AllocStatus {
    device.can_allocate(num_distinct_blocks(tables))
}

/// Whether `host` has room for the group now (no watermark on swap space).
pub fn can_swap_out(host: &BlockPool, tables: &[&BlockTable]) -> AllocStatus {
    let n = num_distinct_blocks(tables);
    if n > host.num_blocks() {
        AllocStatus::Never
    } else if n <= host.num_free() {
        AllocStatus::Now
    } else {
        AllocStatus::Later
    }
}

fn transfer(
    src: &mut BlockPool,
    dst: &mut BlockPool,
    tables: &mut [&mut BlockTable],
) -> Result<Vec<(BlockId, BlockId)>, AllocError> {
    if src.block_size != dst.block_size {
        return Err(AllocError::BlockSizeMismatch { table: src.block_size, pool: dst.block_size });
    }
    // Validate everything before touching anything.
    let mut holders: HashMap<BlockId, u32> = HashMap::new();
    let mut order: Vec<BlockId> = Vec::new();
    for t in tables.iter() {
        t.check_pool(src)?;
        for &b in t.live_blocks() {
            let count = holders.entry(b).or_insert_with(|| {
                order.push(b);
                0
            });
            *count += 1;
        }
    }
    for &b in &order {
        match src.ref_counts.get(b as usize) {
            None => return Err(AllocError::UnknownBlock(b)),
            Some(0) => return Err(AllocError::NotAllocated(b)),
            Some(&rc) if rc < holders[&b] => return Err(AllocError::RefCountMismatch(b)),
            Some(_) => {}
        }
    }
    if order.len() > dst.num_free() {
        return Err(AllocError::OutOfBlocks { needed: order.len(), free: dst.num_free() });
    }

    let mut mapping: HashMap<BlockId, BlockId> = HashMap::with_capacity(order.len());
    let mut plan = Vec::with_capacity(order.len());
    for &b in &order {
        let d = dst.take_free();
        dst.ref_counts[d as usize] = holders[&b];
        mapping.insert(b, d);
        plan.push((b, d));
    }
    for t in tables.iter_mut() {
        record_resident(src, dst, t, &mapping);
        // Release tail-first, as a free would, so chain ends are evicted first.
        let first_live = t.first_live();
        for &b in t.blocks[first_live..].iter().rev() {
            src.release(b);
        }
        for b in &mut t.blocks[first_live..] {
            *b = mapping[b];
        }
        t.pool_id = if t.blocks.is_empty() { 0 } else { dst.id };
        // The destination's prefix cache has not seen these blocks: offer them again.
        t.num_registered = 0;
    }
    Ok(plan)
}

/// With events on in `dst` (a pool without a prefix cache), the table's registered blocks it is
/// about to receive, by hash (with their tokens from `src`'s cache).
fn record_resident(
    src: &BlockPool,
    dst: &mut BlockPool,
    t: &BlockTable,
    mapping: &HashMap<BlockId, BlockId>,
) {
    let (Some(resident), Some(cache)) = (&mut dst.resident, &src.cache) else { return };
    for i in t.first_live()..t.num_registered.min(t.blocks.len()) {
        let (b, hash) = (t.blocks[i], t.hashes[i]);
        if let Some(tokens) = cache.tokens_under(b, hash) {
            let parent = i.checked_sub(1).map(|p| t.hashes[p]);
            resident.hold(mapping[&b], hash, parent, tokens);
        }
    }
}
