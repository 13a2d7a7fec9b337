//! [`KvMap`]: a snapshot of the KV block pools between two steps — one state byte per device
//! and host block, every running / swapped sequence's block table, and the counters beside them.

use block_alloc::{BlockId, BlockPool, BlockState};

use crate::group::Where;
use crate::queue::Queue;
use crate::request::RequestKey;
use crate::scheduler::Scheduler;

/// One sequence's block table of one KV cache group in a [`KvMap`]: its blocks are
/// `KvMap::blocks[start..start + len]` (logical block `first_block + i` → physical block
/// `blocks[start + i]`), in the device pool when running, in the host pool when swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvTable {
    pub request: RequestKey,
    /// Sample index in `0..n` (0 before the fork).
    pub seq: u32,
    /// Its KV cache group (`KvMap::group_windows`).
    pub group: u32,
    /// Logical blocks before this one left the group's sliding window and were released.
    pub first_block: usize,
    /// The table holds host (swap) blocks.
    pub swapped: bool,
    /// Token slots in use.
    pub num_tokens: usize,
    pub start: usize,
    pub len: usize,
}

/// Counters shown beside the block map.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KvCounters {
    /// Device blocks held (ref count > 0) ÷ device blocks.
    pub kv_usage: f64,
    pub device_blocks_used: usize,
    /// Device blocks free but still in the prefix cache.
    pub device_blocks_cached: usize,
    pub host_blocks_used: usize,
    /// Prefix-cache hit tokens ÷ queried tokens since start (0 before any query).
    pub prefix_hit_rate: f64,
    pub prefix_queried_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Requests in each queue.
    pub num_running: usize,
    pub num_waiting: usize,
    pub num_swapped: usize,
    /// Preemptions since start (recompute + swap).
    pub num_preemptions: u64,
    /// Steps built since start.
    pub steps: u64,
}

/// The block pools as of one step boundary; see [`Scheduler::kv_map_into`]. Every buffer is
/// reused by the next `kv_map_into` on the same value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvMap {
    pub block_size: usize,
    /// One [`BlockState`] byte per device block, id order.
    pub device: Vec<u8>,
    /// One [`BlockState`] byte per host (swap) block, id order; empty without a swap pool.
    pub host: Vec<u8>,
    /// Running sequences' tables first (running-queue order), then the swapped ones; empty
    /// tables (parked or finished samples) are left out.
    pub tables: Vec<KvTable>,
    /// Every table's blocks, concatenated.
    pub blocks: Vec<BlockId>,
    /// Per KV cache group, its sliding window (`None`: full attention).
    pub group_windows: Vec<Option<usize>>,
    pub counters: KvCounters,
}

impl KvMap {
    /// The physical blocks of `table` (which must come from this map), logical order.
    pub fn table_blocks(&self, table: &KvTable) -> &[BlockId] {
        &self.blocks[table.start..table.start + table.len]
    }

    /// Device blocks in `state`.
    pub fn count_device(&self, state: BlockState) -> usize {
        let code = state.code();
        // A fold of 0/1 in 8-bit lanes (summed per 255-byte chunk so they cannot overflow)
        // vectorizes; `filter().count()` does not.
        self.device
            .chunks(255)
            .map(|chunk| usize::from(chunk.iter().fold(0u8, |n, &c| n + u8::from(c == code))))
            .sum()
    }
}

impl Scheduler {
    /// Fills `out` with the pools' block states, the running and swapped tables and the
    /// counters. O(blocks + table entries); allocates only when `out`'s buffers must grow.
    /// Meant for between steps (a step in flight shows its blocks already taken).
    pub fn kv_map_into(&self, out: &mut KvMap) {
        out.block_size = self.cfg.block_size;
        self.device.block_states_into(&mut out.device);
        match &self.host {
            Some(host) => host.block_states_into(&mut out.host),
            None => out.host.clear(),
        }
        out.tables.clear();
        out.blocks.clear();
        out.group_windows.clone_from(&self.cfg.kv_groups);
        self.push_tables(&self.running, Where::Running, out);
        self.push_tables(&self.swapped, Where::Swapped, out);
        let prefix = self.device.prefix_stats();
        out.counters = KvCounters {
            kv_usage: self.device.usage(),
            device_blocks_used: self.device.num_used(),
            device_blocks_cached: out.count_device(BlockState::Cached),
            host_blocks_used: self.host.as_ref().map_or(0, BlockPool::num_used),
            prefix_hit_rate: prefix.hit_rate(),
            prefix_queried_tokens: prefix.queried_tokens,
            prefix_hit_tokens: prefix.hit_tokens,
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_swapped: self.swapped.len(),
            num_preemptions: self.stats.preemptions(),
            steps: self.stats.steps,
        };
    }

    /// A fresh [`KvMap`] (see [`Scheduler::kv_map_into`]).
    pub fn kv_map(&self) -> KvMap {
        let mut out = KvMap::default();
        self.kv_map_into(&mut out);
        out
    }

    fn push_tables(&self, queue: &Queue, place: Where, out: &mut KvMap) {
        for &(_, slot) in queue {
            let Some(group) = self.groups.get(slot).and_then(Option::as_ref) else { continue };
            for seq in &group.seqs {
                for (g, table) in seq.table().iter().enumerate() {
                    if table.is_empty() {
                        continue;
                    }
                    let blocks = table.live_blocks();
                    out.tables.push(KvTable {
                        request: group.id,
                        seq: seq.index,
                        group: g as u32,
                        first_block: table.first_live(),
                        swapped: place == Where::Swapped,
                        num_tokens: table.num_tokens(),
                        start: out.blocks.len(),
                        len: blocks.len(),
                    });
                    out.blocks.extend_from_slice(blocks);
                }
            }
        }
    }
}
