//! Building one step: running decodes first, then running partial prefills, then swapped
//! groups (swap mode), then waiting groups, all under the token budget and the sequence cap,
//! with chunked prefill and preemption of the worst-keyed running group on memory pressure.

use block_alloc::{AllocStatus, BlockPool, BlockTable};

use crate::config::Policy;
use crate::emit::emit;
use crate::error::SchedulerError;
use crate::group::{Group, Where};
use crate::output::SchedulerOutput;
use crate::queue::{QueueKey, insert_sorted};
use crate::request::SeqFinish;
use crate::scheduler::Scheduler;
use crate::tables::SeqTables;

/// What is left of this step's limits.
#[derive(Debug, Clone, Copy)]
struct Budget {
    tokens: usize,
    seqs: usize,
}

/// Outcome of trying to give a group tokens in this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    Scheduled,
    /// The token budget or the sequence cap is spent (for this group).
    NoBudget,
    NoMemory,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Decodes,
    Prefills,
}

impl Scheduler {
    /// Builds the next step. See `schedule_into`.
    pub fn schedule(&mut self) -> Result<SchedulerOutput, SchedulerError> {
        let mut out = SchedulerOutput::default();
        self.schedule_into(&mut out)?;
        Ok(out)
    }

    /// Builds the next step into `out` (its buffers are reused). Errors with `StepInFlight` when
    /// the previous non-empty step has not been `update`d.
    pub fn schedule_into(&mut self, out: &mut SchedulerOutput) -> Result<(), SchedulerError> {
        if self.step_pending {
            return Err(SchedulerError::StepInFlight);
        }
        out.clear();
        out.group_slot_mapping.resize_with(self.cfg.kv_groups.len() - 1, Vec::new);
        out.finished.append(&mut self.finished_since);
        out.aborted.append(&mut self.aborted_since);
        self.stats.steps += 1;
        self.in_flight.clear();
        let mut budget = Budget { tokens: self.cfg.max_num_batched_tokens, seqs: self.cfg.max_num_seqs };
        let mut preempted = false;
        if self.cfg.policy == Policy::Priority {
            self.make_room_for_urgent(out)?;
        }
        self.schedule_running(Pass::Decodes, out, &mut budget, &mut preempted)?;
        self.schedule_running(Pass::Prefills, out, &mut budget, &mut preempted)?;
        // After a preemption memory is tight: admitting more would only preempt again.
        if !preempted {
            self.schedule_admissions(out, &mut budget)?;
        }
        out.fill_batch_metadata();
        self.step_pending = !self.in_flight.is_empty();
        Ok(())
    }

    fn schedule_running(
        &mut self,
        pass: Pass,
        out: &mut SchedulerOutput,
        budget: &mut Budget,
        preempted: &mut bool,
    ) -> Result<(), SchedulerError> {
        let step = self.stats.steps;
        let mut i = 0;
        while i < self.running.len() {
            if budget.tokens == 0 || budget.seqs == 0 {
                break;
            }
            let (key, slot) = self.running[i];
            if self.scheduled_at.get(slot) == Some(&step) {
                i += 1;
                continue;
            }
            if (pass == Pass::Decodes) != self.group(slot)?.is_decode() {
                i += 1;
                continue;
            }
            let fit = match pass {
                Pass::Decodes => self.try_decode(slot, out, budget)?,
                Pass::Prefills => self.try_prefill(slot, out, budget, None)?,
            };
            if fit != Fit::NoMemory {
                i += 1;
                continue;
            }
            if let Some(victim) = self.pick_victim(key, slot) {
                // The victim sorts after `i`, so `i` still points at this group: retry it.
                self.preempt(victim, out)?;
                *preempted = true;
            } else if self.running.len() == 1 {
                // Alone and still out of blocks: it has outgrown the whole pool.
                self.finish_for_capacity(i, out)?;
            } else if pass == Pass::Decodes {
                // The worst running group itself: give its blocks to the better ones.
                self.preempt(i, out)?;
                *preempted = true;
            } else {
                // A prefill behind decodes that already took this step's memory: wait.
                i += 1;
            }
        }
        Ok(())
    }

    /// Priority policy: preempts running groups of worse priority than the waiting head until
    /// the head's first chunk fits (before any running group takes this step's memory).
    fn make_room_for_urgent(&mut self, out: &mut SchedulerOutput) -> Result<(), SchedulerError> {
        while let (Some(&(head_key, head)), Some(&(worst_key, _))) =
            (self.waiting.front(), self.running.back())
        {
            if worst_key.priority <= head_key.priority {
                break;
            }
            let group = self.group(head)?;
            let Some(seq) = group.seqs.iter().find(|s| s.finished.is_none()) else { break };
            let chunk = seq.remaining().min(self.cfg.max_num_batched_tokens);
            if self.device.can_allocate(seq.table().num_blocks_to_allocate(&self.device, chunk))
                != AllocStatus::Later
            {
                break;
            }
            self.preempt(self.running.len() - 1, out)?;
        }
        Ok(())
    }

    /// The running group to preempt for a group of key `key`: the worst-keyed one not scheduled
    /// in this step, if it sorts after the requester (`None` when that is the requester itself).
    fn pick_victim(&self, key: QueueKey, requester: usize) -> Option<usize> {
        let step = self.stats.steps;
        for (pos, &(k, slot)) in self.running.iter().enumerate().rev() {
            if slot == requester || k < key {
                return None;
            }
            if self.scheduled_at.get(slot) != Some(&step) {
                return Some(pos);
            }
        }
        None
    }

    /// One token for every live sequence of a decoding group, all or nothing.
    #[inline(always)]
    fn try_decode(
        &mut self,
        slot: usize,
        out: &mut SchedulerOutput,
        budget: &mut Budget,
    ) -> Result<Fit, SchedulerError> {
        let step = self.stats.steps;
        let (sliding, max_model_len) = (self.sliding, self.cfg.max_model_len);
        let Self { groups, device, in_flight, scheduled_at, rows, .. } = self;
        let group = group_to_plan(groups, slot, sliding, device)?;
        if group.seqs.len() == 1 {
            // One (live) sequence, the common case: the append itself is the all-or-nothing
            // memory check. A draft rides along where it fits.
            if budget.seqs == 0 || budget.tokens == 0 {
                return Ok(Fit::NoBudget);
            }
            let drafted = crate::draft::take_draft(group, budget.tokens, max_model_len, device);
            match emit(group, slot, 0, 1 + drafted, drafted, device, rows, out, in_flight) {
                Ok(()) => {}
                Err(e) => {
                    let seq = &mut group.seqs[0];
                    seq.tokens.truncate(seq.tokens.len() - drafted);
                    return match e {
                        block_alloc::AllocError::OutOfBlocks { .. } => Ok(Fit::NoMemory),
                        e => Err(e.into()),
                    };
                }
            }
            scheduled_at[slot] = step;
            budget.tokens -= 1 + drafted;
            budget.seqs -= 1;
            return Ok(Fit::Scheduled);
        }
        let live = group.live_seqs();
        if live > budget.seqs || live > budget.tokens {
            return Ok(Fit::NoBudget);
        }
        let need: usize = group
            .seqs
            .iter()
            .filter(|s| s.finished.is_none())
            .map(|s| s.table().num_blocks_to_allocate(device, 1))
            .sum();
        if need > device.num_free() {
            return Ok(Fit::NoMemory);
        }
        for si in 0..group.seqs.len() {
            if group.seqs[si].finished.is_none() {
                group.seqs[si].draft.clear();
                emit(group, slot, si, 1, 0, device, rows, out, in_flight)?;
            }
        }
        scheduled_at[slot] = step;
        budget.tokens -= live;
        budget.seqs -= live;
        Ok(Fit::Scheduled)
    }

    /// Chunks for the live sequences of a group with prompt (or recomputed) tokens left, each as
    /// large as the budget and free memory allow. `reserve` blocks stay free (the watermark, at
    /// admission).
    fn try_prefill(
        &mut self,
        slot: usize,
        out: &mut SchedulerOutput,
        budget: &mut Budget,
        reserve: Option<usize>,
    ) -> Result<Fit, SchedulerError> {
        let step = self.stats.steps;
        let sliding = self.sliding;
        let Self { groups, device, in_flight, scheduled_at, rows, .. } = self;
        let group = group_to_plan(groups, slot, sliding, device)?;
        let reserve = reserve.unwrap_or(0);
        let (mut any, mut short) = (false, false);
        // While samples are parked, the leader recomputes the prompt first and stops there.
        let prompt_cap = group.seqs.iter().any(|s| s.parked).then_some(group.prompt_len);
        for si in 0..group.seqs.len() {
            let seq = &group.seqs[si];
            if seq.finished.is_some() || seq.parked {
                continue;
            }
            if budget.tokens == 0 || budget.seqs == 0 {
                break;
            }
            let mut want = seq.remaining().min(budget.tokens);
            if let Some(cap) = prompt_cap.filter(|&cap| seq.num_computed_tokens < cap) {
                want = want.min(cap - seq.num_computed_tokens);
            }
            let free = device.num_free().saturating_sub(reserve);
            let n = largest_fitting_append(group.seqs[si].table(), device, want, free);
            if n == 0 {
                short = true;
                break;
            }
            emit(group, slot, si, n, 0, device, rows, out, in_flight)?;
            budget.tokens -= n;
            budget.seqs -= 1;
            any = true;
        }
        if any {
            scheduled_at[slot] = step;
            Ok(Fit::Scheduled)
        } else if short {
            Ok(Fit::NoMemory)
        } else {
            Ok(Fit::NoBudget)
        }
    }

    /// Serves swapped and waiting groups in one key order (a swapped group keeps its early key,
    /// so it cannot starve behind new arrivals); the first that cannot be served stops both.
    fn schedule_admissions(
        &mut self,
        out: &mut SchedulerOutput,
        budget: &mut Budget,
    ) -> Result<(), SchedulerError> {
        loop {
            let swapped_first = match (self.swapped.front(), self.waiting.front()) {
                (Some(s), Some(w)) => s.0 < w.0,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return Ok(()),
            };
            let served = if swapped_first {
                self.swap_in_head(out, budget)?
            } else {
                self.admit_waiting_head(out, budget)?
            };
            if !served {
                return Ok(());
            }
        }
    }

    /// Swap mode: brings the swapped head back when the device has room for its blocks plus
    /// its next chunk above the watermark, and schedules it. Returns whether the head was served.
    fn swap_in_head(
        &mut self,
        out: &mut SchedulerOutput,
        budget: &mut Budget,
    ) -> Result<bool, SchedulerError> {
        {
            let Some(&(key, slot)) = self.swapped.front() else { return Ok(false) };
            let group = self.group(slot)?;
            if !self.lora_fits(group.lora) {
                return Ok(false);
            }
            let live = group.live_seqs();
            if live > budget.seqs || live > budget.tokens {
                return Ok(false);
            }
            let host =
                self.host.as_ref().ok_or(SchedulerError::Internal("swapped group without a host pool"))?;
            let distinct = distinct_blocks(group);
            let growth: usize = group
                .seqs
                .iter()
                .filter(|s| s.finished.is_none() && !s.parked)
                .map(|s| s.table().num_blocks_to_allocate(host, s.remaining().min(budget.tokens)))
                .sum();
            match self.device.can_allocate(distinct + growth) {
                AllocStatus::Now => {}
                AllocStatus::Later => return Ok(false),
                // It can never come back with room to grow; alone on the device it may still
                // run until it outgrows the pool (then it finishes for capacity).
                AllocStatus::Never if self.running.is_empty() && distinct <= self.device.num_free() => {}
                AllocStatus::Never if self.running.is_empty() => {
                    self.swapped.pop_front();
                    self.finish_swapped_for_capacity(slot, out)?;
                    return Ok(true);
                }
                AllocStatus::Never => return Ok(false),
            }
            let Self { groups, device, host, .. } = self;
            let (Some(host), Some(group)) = (host.as_mut(), groups.get_mut(slot).and_then(Option::as_mut))
            else {
                return Err(SchedulerError::Internal("swapped group without a host pool"));
            };
            let mut tables = group.tables_to_move();
            let pairs = block_alloc::swap_in(host, device, &mut tables)?;
            out.blocks_to_swap_in.extend(pairs);
            group.place = Where::Running;
            let decode = group.is_decode();
            self.swapped.pop_front();
            insert_sorted(&mut self.running, (key, slot));
            if decode {
                self.try_decode(slot, out, budget)?;
            } else {
                self.try_prefill(slot, out, budget, None)?;
            }
            Ok(true)
        }
    }

    /// Admits the waiting head (strictly in order: the head blocks the rest, so nobody starves)
    /// after counting its prefix-cache hits as computed. Returns whether the head was served.
    fn admit_waiting_head(
        &mut self,
        out: &mut SchedulerOutput,
        budget: &mut Budget,
    ) -> Result<bool, SchedulerError> {
        loop {
            let Some(&(key, slot)) = self.waiting.front() else { return Ok(false) };
            if budget.tokens == 0 || budget.seqs == 0 {
                return Ok(false);
            }
            let group = self.group(slot)?;
            if group.live_seqs() > budget.seqs || !self.lora_fits(group.lora) {
                return Ok(false);
            }
            self.lookup_prefixes(slot)?;
            let group = self.group(slot)?;
            // Blocks the whole remaining prefill of the first sequence would take beyond its
            // prefix hits: if hits and new blocks together exceed what the pool can ever give,
            // the group can never run.
            let seq = group.seqs.iter().find(|s| s.finished.is_none());
            let chunk = self.cfg.max_num_batched_tokens;
            let (hits, full_need) = seq.map_or((0, 0), |s| {
                (s.table().num_live_blocks(), s.table().blocks_to_finish(&self.device, s.remaining(), chunk))
            });
            if self.device.can_allocate(hits + full_need) == AllocStatus::Never {
                self.waiting.pop_front();
                self.finish_group(slot, SeqFinish::CapacityExceeded, out)?;
                return Ok(true);
            }
            // As vLLM's block manager: admit only when the whole remaining prompt fits above the
            // watermark, even if its prefill is then chunked by the token budget. A prompt that
            // cannot complete would only hold blocks the running decodes are about to need, and
            // be preempted (and recomputed) by the first of them that grows. With nothing
            // running no memory will come back, so the head takes what there is (and finishes
            // for capacity if it outgrows the pool).
            let whole_prompt_fits = self.device.can_allocate(full_need) == AllocStatus::Now;
            let fit = if whole_prompt_fits || self.running.is_empty() {
                let watermark = self.device.watermark_blocks();
                let mut trial = *budget;
                let fit = self.try_prefill(slot, out, &mut trial, Some(watermark))?;
                if fit == Fit::Scheduled {
                    *budget = trial;
                }
                fit
            } else {
                Fit::NoMemory
            };
            match fit {
                Fit::Scheduled => {
                    self.waiting.pop_front();
                    if let Some(group) = self.groups.get_mut(slot).and_then(Option::as_mut) {
                        group.place = Where::Running;
                    }
                    insert_sorted(&mut self.running, (key, slot));
                    return Ok(true);
                }
                Fit::NoBudget | Fit::NoMemory => {
                    self.unlookup_prefixes(slot)?;
                    // Priority: a waiting group may take the blocks of a worse-keyed running one.
                    if self.cfg.policy == Policy::Priority
                        && let Some(victim) = self.pick_victim(key, usize::MAX)
                    {
                        self.preempt(victim, out)?;
                        continue;
                    }
                    return Ok(false);
                }
            }
        }
    }

    /// Whether a group of adapter `lora` may join the running ones under `max_loras` (the
    /// running groups' adapters plus its own).
    fn lora_fits(&self, lora: Option<u32>) -> bool {
        let (Some(lora), Some(max)) = (lora, self.cfg.max_loras) else { return true };
        let mut running: Vec<u32> = self
            .running
            .iter()
            .filter_map(|&(_, slot)| self.groups.get(slot).and_then(Option::as_ref).and_then(|g| g.lora))
            .collect();
        running.sort_unstable();
        running.dedup();
        running.contains(&lora) || running.len() < max
    }

    /// Fills the empty tables of a group about to be admitted with its cached prefix. The last
    /// token is never taken from the cache: its logits are needed to sample.
    fn lookup_prefixes(&mut self, slot: usize) -> Result<(), SchedulerError> {
        if !self.cfg.enable_prefix_caching {
            return Ok(());
        }
        let Self { groups, device, .. } = self;
        let group =
            groups.get_mut(slot).and_then(Option::as_mut).ok_or(SchedulerError::Internal("missing group"))?;
        if group.skip_prefix_hits {
            return Ok(());
        }
        let salt = group.salt;
        for seq in group.seqs.iter_mut().filter(|s| s.finished.is_none() && s.num_computed_tokens == 0) {
            if seq.table().num_tokens() == 0 && seq.tokens.len() > 1 {
                seq.num_computed_tokens = seq.lookup_prefix(device, salt)?;
            }
        }
        Ok(())
    }

    /// Undoes `lookup_prefixes` for a group that could not be admitted after all.
    fn unlookup_prefixes(&mut self, slot: usize) -> Result<(), SchedulerError> {
        let Self { groups, device, .. } = self;
        let group =
            groups.get_mut(slot).and_then(Option::as_mut).ok_or(SchedulerError::Internal("missing group"))?;
        for seq in group.seqs.iter_mut().filter(|s| s.finished.is_none()) {
            seq.table_mut().free(device)?;
            seq.num_computed_tokens = 0;
        }
        Ok(())
    }

    /// Finishes running group at queue position `pos` because it outgrew the pool.
    fn finish_for_capacity(&mut self, pos: usize, out: &mut SchedulerOutput) -> Result<(), SchedulerError> {
        let Some((_, slot)) = self.running.remove(pos) else {
            return Err(SchedulerError::Internal("capacity victim not running"));
        };
        self.finish_group(slot, SeqFinish::CapacityExceeded, out)
    }

    /// Finishes a swapped group (taken off its queue) that can never fit the device.
    fn finish_swapped_for_capacity(
        &mut self,
        slot: usize,
        out: &mut SchedulerOutput,
    ) -> Result<(), SchedulerError> {
        self.free_tables(slot, Where::Swapped)?;
        self.finish_group(slot, SeqFinish::CapacityExceeded, out)
    }

    /// Frees and drops a group that is on no queue, finishing its live sequences with `reason`.
    fn finish_group(
        &mut self,
        slot: usize,
        reason: SeqFinish,
        out: &mut SchedulerOutput,
    ) -> Result<(), SchedulerError> {
        let group = self.free_tables(slot, Where::Running)?;
        for seq in group.seqs.iter_mut() {
            seq.finished.get_or_insert(reason);
        }
        let id = group.id;
        out.finished.push(id);
        out.capacity_exceeded.push(id);
        self.stats.capacity_exceeded += 1;
        self.release(slot);
        Ok(())
    }
}

/// The group in `slot`, about to have its step planned: with sliding-window groups in the
/// layout, the blocks its live sequences no longer need are released first.
#[inline(always)]
fn group_to_plan<'a>(
    groups: &'a mut [Option<Group>],
    slot: usize,
    sliding: bool,
    device: &mut BlockPool,
) -> Result<&'a mut Group, SchedulerError> {
    let group =
        groups.get_mut(slot).and_then(Option::as_mut).ok_or(SchedulerError::Internal("missing group"))?;
    if sliding {
        group.release_outside_windows(device)?;
    }
    Ok(group)
}

/// The most tokens (≤ `want`) that can be appended to `table` with `free` blocks of `pool`.
fn largest_fitting_append(table: &SeqTables, pool: &BlockPool, want: usize, free: usize) -> usize {
    if table.num_blocks_to_allocate(pool, want) <= free {
        return want;
    }
    // Monotone in n: bisect for the largest n whose append fits.
    let (mut lo, mut hi) = (0, want);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if table.num_blocks_to_allocate(pool, mid) <= free {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Distinct blocks held by a group's live tables (forked samples share blocks).
fn distinct_blocks(group: &Group) -> usize {
    let tables: Vec<&BlockTable> =
        group.seqs.iter().filter(|s| !s.table().is_empty()).flat_map(|s| s.table().iter()).collect();
    block_alloc::num_distinct_blocks(&tables)
}
