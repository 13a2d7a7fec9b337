//! The `Scheduler`: request intake, abort, queues and accessors. The per-step logic lives in
//! `schedule.rs` (building a step), `update.rs` (applying sampled tokens) and `preempt.rs`.

use std::collections::HashMap;

use block_alloc::{BlockPool, PoolConfig};

use crate::config::{Policy, SchedulerConfig};
use crate::error::SchedulerError;
use crate::fit::{ExceedsPool, GroupFit, RequestFit};
use crate::group::{Group, Seq, Where};
use crate::queue::{Queue, QueueKey, insert_sorted, remove_slot};
use crate::request::{Request, RequestKey, SeqId};
use crate::rows::Rows;
use crate::tables::SeqTables;

/// Counters over the scheduler's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Steps built (`schedule()` calls that succeeded).
    pub steps: u64,
    pub preemptions_recompute: u64,
    pub preemptions_swap: u64,
    pub capacity_exceeded: u64,
    pub aborted: u64,
    pub finished: u64,
}

impl SchedulerStats {
    pub fn preemptions(&self) -> u64 {
        self.preemptions_recompute + self.preemptions_swap
    }
}

/// One scheduled sequence awaiting `update`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InFlight {
    pub slot: usize,
    /// The group's arrival number: tells a slab slot reused after an abort from the original.
    pub arrival: u64,
    pub seq: u32,
    pub seq_id: SeqId,
    /// `num_computed_tokens` once this step has run.
    pub end: usize,
    pub num_samples: usize,
    /// Draft tokens at the end of the chunk (each of its last `num_draft + 1` positions samples).
    pub num_draft: usize,
}

/// Continuous-batching scheduler over a device block pool (and an optional host swap pool).
///
/// Protocol: `add_request` / `abort` at any time; `schedule()` builds a step; when it scheduled
/// anything, the engine runs it and calls `update()` with the sampled tokens before the next
/// `schedule()`.
#[derive(Debug)]
pub struct Scheduler {
    pub(crate) cfg: SchedulerConfig,
    pub(crate) device: BlockPool,
    pub(crate) host: Option<BlockPool>,
    /// Slab of groups; queues and in-flight entries refer to slots.
    pub(crate) groups: Vec<Option<Group>>,
    /// Per slab slot: the step that last gave the group tokens (dense, so the per-step scans
    /// of the running queue need not touch the groups themselves).
    pub(crate) scheduled_at: Vec<u64>,
    pub(crate) free_slots: Vec<usize>,
    pub(crate) index: HashMap<RequestKey, usize>,
    pub(crate) waiting: Queue,
    pub(crate) running: Queue,
    pub(crate) swapped: Queue,
    pub(crate) next_arrival: u64,
    pub(crate) in_flight: Vec<InFlight>,
    pub(crate) step_pending: bool,
    pub(crate) finished_since: Vec<RequestKey>,
    pub(crate) aborted_since: Vec<RequestKey>,
    pub(crate) stats: SchedulerStats,
    /// The rows of the worker's block table held by running sequences (`rows.rs`).
    pub(crate) rows: Rows,
    /// Some KV cache group has a sliding window: sequences release blocks before they grow.
    pub(crate) sliding: bool,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Result<Self, SchedulerError> {
        cfg.validate()?;
        let device = BlockPool::new(PoolConfig {
            num_blocks: cfg.num_device_blocks,
            block_size: cfg.block_size,
            watermark: cfg.watermark,
            enable_prefix_caching: cfg.enable_prefix_caching,
        })?;
        let host = match cfg.num_host_blocks {
            0 => None,
            n => Some(BlockPool::new(PoolConfig::host(n, cfg.block_size))?),
        };
        let sliding = cfg.kv_groups.iter().any(Option::is_some);
        Ok(Self {
            cfg,
            device,
            host,
            groups: Vec::new(),
            scheduled_at: Vec::new(),
            free_slots: Vec::new(),
            index: HashMap::new(),
            waiting: Queue::new(),
            running: Queue::new(),
            swapped: Queue::new(),
            next_arrival: 0,
            in_flight: Vec::new(),
            step_pending: false,
            finished_since: Vec::new(),
            aborted_since: Vec::new(),
            stats: SchedulerStats::default(),
            rows: Rows::default(),
            sliding,
        })
    }

    /// Queues a request. Rejects (typed error, nothing stored) a duplicate id, `n = 0` or more
    /// samples than `max_num_seqs`, an empty prompt, `max_new_tokens = 0`, a prompt longer than
    /// `max_model_len`, and a prompt that needs more blocks than the device pool could ever give.
    pub fn add_request(&mut self, req: Request) -> Result<(), SchedulerError> {
        let id = req.key;
        if self.index.contains_key(&id) {
            return Err(SchedulerError::DuplicateRequest(id));
        }
        if req.n == 0 {
            return Err(SchedulerError::ZeroSamples(id));
        }
        if req.n > self.cfg.max_num_seqs {
            return Err(SchedulerError::TooManySamples { id, n: req.n, max_num_seqs: self.cfg.max_num_seqs });
        }
        if req.prompt.is_empty() {
            return Err(SchedulerError::EmptyPrompt(id));
        }
        if req.max_new_tokens == 0 {
            return Err(SchedulerError::ZeroMaxTokens(id));
        }
        if req.prompt.len() > self.cfg.max_model_len {
            return Err(SchedulerError::PromptTooLong {
                id,
                len: req.prompt.len(),
                max_model_len: self.cfg.max_model_len,
            });
        }
        if let Err(ExceedsPool { blocks_needed, pool_blocks }) =
            self.request_fit().check_prompt(req.prompt.len())
        {
            return Err(SchedulerError::ExceedsPool { id, blocks_needed, pool_blocks });
        }
        let priority = match self.cfg.policy {
            Policy::Fcfs => 0,
            Policy::Priority => req.priority,
        };
        let key = QueueKey { priority, arrival: self.next_arrival };
        self.next_arrival += 1;
        let group = Group {
            id,
            key,
            prompt_len: req.prompt.len(),
            max_new_tokens: req.max_new_tokens,
            salt: req.salt.unwrap_or(0),
            skip_prefix_hits: req.skip_prefix_hits,
            lora: req.lora,
            n: req.n,
            seqs: vec![Seq::new(0, req.prompt, 0, SeqTables::new(&self.device, &self.cfg.kv_groups))],
            place: Where::Waiting,
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.groups[slot] = Some(group);
                self.scheduled_at[slot] = 0;
                slot
            }
            None => {
                self.groups.push(Some(group));
                self.scheduled_at.push(0);
                self.groups.len() - 1
            }
        };
        self.index.insert(id, slot);
        insert_sorted(&mut self.waiting, (key, slot));
        Ok(())
    }

    /// Aborts a request in any state (waiting, running, swapped, in the step being run): every
    /// block it holds is freed now; samples for it in the pending `update` are ignored. It is
    /// listed in the next step's `aborted`.
    pub fn abort(&mut self, id: RequestKey) -> Result<(), SchedulerError> {
        let slot = *self.index.get(&id).ok_or(SchedulerError::UnknownRequest(id))?;
        let place = self.group(slot)?.place;
        let queue = match place {
            Where::Waiting => &mut self.waiting,
            Where::Running => &mut self.running,
            Where::Swapped => &mut self.swapped,
        };
        remove_slot(queue, slot);
        self.free_tables(slot, place)?;
        self.release(slot);
        self.aborted_since.push(id);
        self.stats.aborted += 1;
        Ok(())
    }

    /// Frees every table of the group in `slot` into the pool its blocks are in: the host pool
    /// when the group is swapped out, else the device pool.
    pub(crate) fn free_tables(&mut self, slot: usize, place: Where) -> Result<&mut Group, SchedulerError> {
        let Self { groups, device, host, .. } = self;
        let pool = match place {
            Where::Swapped => {
                host.as_mut().ok_or(SchedulerError::Internal("swapped group without a host pool"))?
            }
            Where::Waiting | Where::Running => device,
        };
        let group =
            groups.get_mut(slot).and_then(Option::as_mut).ok_or(SchedulerError::Internal("missing group"))?;
        for seq in &mut group.seqs {
            seq.table_mut().free(pool)?;
        }
        Ok(group)
    }

    /// Drops a group from the slab (its tables must already be freed and it must be off every queue).
    pub(crate) fn release(&mut self, slot: usize) {
        if let Some(mut group) = self.groups.get_mut(slot).and_then(Option::take) {
            group.give_back_rows(&mut self.rows);
            self.index.remove(&group.id);
            self.free_slots.push(slot);
        }
    }

    pub(crate) fn group(&self, slot: usize) -> Result<&Group, SchedulerError> {
        self.groups
            .get(slot)
            .and_then(Option::as_ref)
            .ok_or(SchedulerError::Internal("queue entry without a group"))
    }

    /// What one request may ask of this scheduler's device pool, alone (see [`RequestFit`]).
    pub fn request_fit(&self) -> RequestFit {
        RequestFit {
            block_size: self.cfg.block_size,
            pool_blocks: self.device.num_blocks(),
            watermark_blocks: self.device.watermark_blocks(),
            groups: GroupFit::of(&self.cfg.kv_groups, self.cfg.max_num_batched_tokens),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn stats(&self) -> SchedulerStats {
        self.stats
    }

    /// The device pool (for usage figures and invariant checks).
    pub fn device_pool(&self) -> &BlockPool {
        &self.device
    }

    pub fn host_pool(&self) -> Option<&BlockPool> {
        self.host.as_ref()
    }

    /// Starts recording the device prefix cache's changes and the registered blocks swapped
    /// out to the host pool (see `block_alloc::CacheEvent`); `Stored` events of an adapter's
    /// sequence carry its `lora` id.
    pub fn enable_cache_events(&mut self) {
        self.device.enable_cache_events();
        if let Some(host) = &mut self.host {
            host.enable_cache_events();
        }
    }

    /// Moves the recorded changes, oldest first, to the end of `device` and `host`.
    pub fn take_cache_events(
        &mut self,
        device: &mut Vec<block_alloc::CacheEvent>,
        host: &mut Vec<block_alloc::CacheEvent>,
    ) {
        self.device.take_cache_events(device);
        if let Some(pool) = &mut self.host {
            pool.take_cache_events(host);
        }
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_swapped(&self) -> usize {
        self.swapped.len()
    }

    /// Requests not yet finished or aborted.
    pub fn num_unfinished(&self) -> usize {
        self.index.len()
    }

    pub fn has_unfinished(&self) -> bool {
        !self.index.is_empty()
    }

    pub fn contains(&self, id: RequestKey) -> bool {
        self.index.contains_key(&id)
    }

    /// Token states the running sequences hold in device memory (shared blocks counted once per
    /// sequence that uses them).
    pub fn kv_tokens_held(&self) -> usize {
        self.running
            .iter()
            .filter_map(|&(_, slot)| self.groups.get(slot).and_then(Option::as_ref))
            .flat_map(|g| g.seqs.iter())
            .map(|s| s.table().num_tokens())
            .sum()
    }

    /// Tokens (prompt + generated) of a live sequence, if it exists.
    pub fn seq_tokens(&self, seq: SeqId) -> Option<&[u32]> {
        let slot = *self.index.get(&seq.request)?;
        let group = self.groups.get(slot)?.as_ref()?;
        group.seqs.get(seq.index as usize).map(|s| s.tokens.as_slice())
    }

    /// The block table of a live sequence, if it exists (what the worker's row of it must
    /// begin with once the plans are applied).
    pub fn seq_block_table(&self, seq: SeqId) -> Option<&[block_alloc::BlockId]> {
        let slot = *self.index.get(&seq.request)?;
        let group = self.groups.get(slot)?.as_ref()?;
        group.seqs.get(seq.index as usize).map(|s| s.table().blocks())
    }

    /// Every KV cache group's block table of a live sequence, if it exists.
    pub fn seq_tables(&self, seq: SeqId) -> Option<&crate::tables::SeqTables> {
        let slot = *self.index.get(&seq.request)?;
        let group = self.groups.get(slot)?.as_ref()?;
        group.seqs.get(seq.index as usize).map(|s| s.table())
    }

    /// Rows of the worker's block table held by sequences (0 whenever nothing runs).
    pub fn num_table_rows_held(&self) -> usize {
        self.rows.live()
    }

    /// Distinct device blocks held by running sequences' tables (equals the pool's `num_used()`
    /// when nothing leaks).
    pub fn num_device_blocks_held(&self) -> usize {
        self.distinct_blocks_of(&self.running)
    }

    /// Distinct host blocks held by swapped sequences' tables.
    pub fn num_host_blocks_held(&self) -> usize {
        self.distinct_blocks_of(&self.swapped)
    }

    fn distinct_blocks_of(&self, queue: &Queue) -> usize {
        let tables: Vec<&block_alloc::BlockTable> = queue
            .iter()
            .filter_map(|&(_, slot)| self.groups.get(slot).and_then(Option::as_ref))
            .flat_map(|g| g.seqs.iter())
            .flat_map(|s| s.table().iter())
            .collect();
        block_alloc::num_distinct_blocks(&tables)
    }
}
