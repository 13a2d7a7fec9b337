//! Prefill and chunked prefill: a tile of query tokens of one chunk, for one kv head, walks the
//! blocks its rows may see [`STEP_KEYS`] keys at a time with an online softmax
//! ([`flash_step`]). Row `r` of the tile is query token `q0 + r / group` and query head
//! `kv_head · group + r % group`; its token sits at position `seq_len - query_len + q0 + r / group`
//! and sees positions `0 ..= it` (the cached prefix plus the chunk causally), or the last
//! `sliding_window` of them. Blocks past the last row's position, and blocks wholly before the
//! first row's window, are never read, so a chunk costs what its own rows need.

use super::scratch::{at_least, at_least_aligned, with_scratch};
use super::{KeyPart, Problem, SharedOut};
use crate::simd::{FlashTile, KernelElem, KvRun, ROW_ALIGN, STEP_KEYS, flash_step};

/// Query tokens of one work item for `group` query heads per kv head: 16, or more for small
/// groups so that a tile has at least 48 rows (three 16-lane vectors) to share each key load.
pub(super) fn query_tile(group: usize) -> usize {
    16 * 3usize.div_ceil(group)
}

/// Where a chunk item's rows go.
pub(super) enum Sink {
    /// Normalized, into the output.
    Out(SharedOut),
    /// A context partition's `(max, sum, normalized output)` per row, into the split path's
    /// partials (`stride` floats per query head).
    Partial { buf: SharedOut, part: KeyPart, stride: usize },
}

/// Query tokens `q0 .. q1` of `seq`'s chunk, all query heads of `kv_head`, over the keys it
/// sees (those of the sink's partition only).
pub(super) fn run_item<T: KernelElem>(
    pb: &Problem<'_, T>,
    seq: usize,
    kv_head: usize,
    q0: usize,
    q1: usize,
    sink: Sink,
) {
    let g = &pb.g;
    let (d, bs, group) = (g.head_size, g.block_size, pb.group);
    let seq_len = pb.meta.seq_lens[seq];
    let first_pos = seq_len - pb.meta.query_len(seq);
    let first_token = pb.meta.query_start_loc[seq];
    let real_rows = (q1 - q0) * group;
    let rows = real_rows.next_multiple_of(ROW_ALIGN);
    let stride = rows + ROW_ALIGN;
    let token_head = |r: usize| (first_token + q0 + r / group, kv_head * group + r % group);
    // Padding rows take the last real row's position (they must see some key, like it).
    let pos_of = |r: usize| first_pos + q0 + r.min(real_rows - 1) / group;
    let (mut first_block, mut visible) = (pb.first_visible(pos_of(0)) / bs, pos_of(real_rows - 1) + 1);
    if let Sink::Partial { part, .. } = &sink {
        // A partition's keys start on a block boundary.
        (first_block, visible) = (first_block.max(part.k0 / bs), visible.min(part.k1));
    }
    let table = &pb.meta.block_table(seq)[first_block..visible.div_ceil(bs)];
    let (key, value) = (pb.key, pb.value);
    with_scratch(|s| {
        let queries = at_least_aligned(&mut s.qrep, d * stride);
        for r in 0..rows {
            if r < real_rows {
                let (token, head) = token_head(r);
                for (dim, &q) in pb.query_row(token, head).iter().enumerate() {
                    queries[dim * stride + r] = q * pb.scores.scale;
                }
            } else {
                (0..d).for_each(|dim| queries[dim * stride + r] = 0.0);
            }
        }
        let row_pos = at_least(&mut s.row_pos, rows);
        row_pos.iter_mut().enumerate().for_each(|(r, p)| *p = pos_of(r) as f32);
        let max = at_least(&mut s.max, rows);
        // Finite, so that a step in which a row sees no key (the window has not reached it yet)
        // rescales by e^0 rather than e^(−inf + inf); the first key it sees replaces it.
        max.fill(f32::MIN);
        let sum = at_least(&mut s.sum, rows);
        sum.fill(0.0);
        let acc = at_least_aligned(&mut s.acc, d * stride);
        acc.fill(0.0);
        let mut tile = FlashTile {
            head_size: d,
            rows,
            stride,
            queries,
            row_pos,
            min_pos: pos_of(0),
            max_pos: pos_of(real_rows - 1),
            sliding_window: pb.scores.sliding_window,
            max,
            sum,
            acc,
            scores: at_least_aligned(&mut s.logits, STEP_KEYS * stride),
            keys: at_least_aligned(&mut s.keys, STEP_KEYS * d),
            values: at_least_aligned(&mut s.values, STEP_KEYS * d),
        };
        for (step, blocks) in table.chunks(STEP_KEYS / bs).enumerate() {
            let first_key = first_block * bs + step * STEP_KEYS;
            let run = KvRun {
                key,
                value,
                blocks,
                kv_head,
                num_kv_heads: g.num_kv_heads,
                block_size: bs,
                first_key,
                live: (visible - first_key).min(blocks.len() * bs),
                scales: pb.scales,
            };
            flash_step(pb.isa, &mut tile, &run);
        }

        for r in 0..real_rows {
            let (token, head) = token_head(r);
            let (max, sum) = (tile.max[r], tile.sum[r]);
            let dst = match &sink {
                // SAFETY: (token, head) rows of this tile and kv head belong to this item alone.
                Sink::Out(out) => unsafe { out.range(pb.out_offset(token, head), d) },
                Sink::Partial { buf, part, stride } => {
                    let row = (part.row + q0 + r / group) * pb.num_heads + head;
                    // SAFETY: this partition's rows of this kv head's heads belong to this item.
                    let row = unsafe { buf.range(row * stride, *stride) };
                    row[0] = max;
                    row[1] = sum;
                    &mut row[2..]
                }
            };
            // A row that saw no key of its partition weighs nothing in the merge (its sum is 0).
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            for (dim, o) in dst.iter_mut().enumerate() {
                *o = tile.acc[dim * stride + r] * inv;
            }
        }
    });
}
