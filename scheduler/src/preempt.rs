//! Preemption of a running group: swap its blocks to the host pool (swap mode, when the host
//! has room) or free them and queue it for recomputation.

use crate::config::PreemptionMode;
use crate::error::SchedulerError;
use crate::group::Where;
use crate::output::SchedulerOutput;
use crate::queue::insert_sorted;
use crate::scheduler::Scheduler;

impl Scheduler {
    /// Preempts the running group at queue position `pos`.
    pub(crate) fn preempt(&mut self, pos: usize, out: &mut SchedulerOutput) -> Result<(), SchedulerError> {
        let Some((key, slot)) = self.running.remove(pos) else {
            return Err(SchedulerError::Internal("preemption victim not running"));
        };
        let Self { groups, device, host, cfg, rows, .. } = self;
        let group =
            groups.get_mut(slot).and_then(Option::as_mut).ok_or(SchedulerError::Internal("missing group"))?;
        out.preempted.push(group.id);
        group.give_back_rows(rows);
        if cfg.preemption == PreemptionMode::Swap
            && let Some(host) = host.as_mut()
        {
            let lora = group.lora;
            let mut tables = group.tables_to_move();
            let mark = host.num_pending_cache_events();
            // All or nothing: on a full host pool the tables are untouched and we recompute.
            if let Ok(pairs) = block_alloc::swap_out(device, host, &mut tables) {
                if let Some(lora) = lora {
                    host.label_cache_events(mark, lora);
                }
                out.blocks_to_swap_out.extend(pairs);
                group.place = Where::Swapped;
                insert_sorted(&mut self.swapped, (key, slot));
                self.stats.preemptions_swap += 1;
                return Ok(());
            }
        }
        // Samples of a forked group share their prompt: without a prefix cache to find it
        // again, only the first recomputes it and the others fork it (see `Seq::parked`).
        let share = !cfg.enable_prefix_caching;
        let mut first = true;
        for seq in group.seqs.iter_mut().filter(|s| s.finished.is_none()) {
            seq.table_mut().free(device)?;
            seq.num_computed_tokens = 0;
            seq.draft.clear();
            seq.parked = share && !first;
            first = false;
        }
        group.place = Where::Waiting;
        insert_sorted(&mut self.waiting, (key, slot));
        self.stats.preemptions_recompute += 1;
        Ok(())
    }
}
