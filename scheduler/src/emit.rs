//! Writing one scheduled chunk into the step's plan: its slots allocated, its block-table delta,
//! its tokens, positions and slot mapping, its entry of the plan and its in-flight record.

use block_alloc::BlockPool;

use crate::group::Group;
use crate::output::SchedulerOutput;
use crate::rows::Rows;
use crate::scheduler::InFlight;

/// Appends `n` slots to sequence `si` of `group` and writes its entry of the step, the last
/// `num_draft` of its tokens a draft. Decodes (`n == 1`, the per-step hot path) take a branch
/// without token ranges or division; inlined, so a call with a literal 1 keeps only that branch.
#[allow(clippy::too_many_arguments)] // the split borrows of `Scheduler` it works on
#[inline(always)]
pub(crate) fn emit(
    group: &mut Group,
    slot: usize,
    si: usize,
    n: usize,
    num_draft: usize,
    device: &mut BlockPool,
    rows: &mut Rows,
    out: &mut SchedulerOutput,
    in_flight: &mut Vec<InFlight>,
) -> Result<(), block_alloc::AllocError> {
    let samples_at_end = if group.awaiting_fork() { group.n } else { 1 };
    let arrival = group.key.arrival;
    let seq_id = group.seq_id(group.seqs[si].index);
    let seq = &mut group.seqs[si];
    let start = seq.num_computed_tokens;
    let end = start + n;
    let crate::group::Allocated { row, table_from } =
        seq.allocate_slots(device, n, rows, &mut out.blocks_to_copy)?;
    let new_start = out.new_block_ids.len();
    let tables = seq.table();
    if table_from < tables.blocks().len() {
        // Most decodes stay in their last block and send nothing.
        tables.push_blocks_from(table_from, &mut out.new_block_ids);
    }
    let new_blocks = new_start..out.new_block_ids.len();
    let flat_start = out.token_ids.len();
    if n == 1 && tables.num_groups() == 1 {
        // The decode case of one group: the token sits in the table's last block (just read by
        // the append: no division needed).
        let table = tables.first();
        let blocks = table.blocks();
        let last = blocks.len() - 1;
        let bs = table.block_size();
        let slot_of_start = i64::from(blocks[last]) * bs as i64 + (start - last * bs) as i64;
        debug_assert_eq!(Some(slot_of_start), table.slot(start));
        out.token_ids.push(seq.tokens[start]);
        out.positions.push(start as u32);
        out.slot_mapping.push(slot_of_start);
    } else {
        out.token_ids.extend_from_slice(&seq.tokens[start..end]);
        out.positions.extend(start as u32..end as u32);
        tables.slot_mapping(start..end, &mut out.slot_mapping, &mut out.group_slot_mapping);
    }
    let num_samples = if end == seq.tokens.len() { samples_at_end } else { 0 };
    out.seqs.push(crate::output::ScheduledSeq {
        seq_id,
        tokens: start..end,
        flat: flat_start..flat_start + n,
        row,
        table_from,
        new_blocks,
        num_samples,
        num_draft,
    });
    in_flight.push(InFlight { slot, arrival, seq: si as u32, seq_id, end, num_samples, num_draft });
    Ok(())
}
