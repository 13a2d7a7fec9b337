//! Prefill and chunked prefill: a tile of query tokens of one chunk, for one kv head, walks the
//! blocks its rows may see with an online softmax (running max, rescaled sum and accumulator).
//! Row `i` of the chunk sits at position `seq_len - query_len + i` and sees positions `0 ..= it`,
//! i.e. the cached prefix plus the chunk causally. K/V tiles are reused from L1 across rows.

use super::decode::widen_masked;
use super::scratch::{at_least, with_scratch};
use super::{Problem, SharedOut};
use crate::simd::{Ahead, KernelElem, exp_sub_sum, max_of, pv_tile, qk_rows, qrep_len};

/// Query tokens `q0 .. q1` of `seq`'s chunk, all query heads of `kv_head`.
pub(super) fn run_item<T: KernelElem>(
    pb: &Problem<'_, T>,
    seq: usize,
    kv_head: usize,
    q0: usize,
    q1: usize,
    out: SharedOut,
) {
    let g = &pb.g;
    let (d, bs, x, group) = (g.head_size, g.block_size, g.x(), pb.group);
    let seq_len = pb.meta.seq_lens[seq];
    let first_pos = seq_len - pb.meta.query_len(seq);
    let first_token = pb.meta.query_start_loc[seq];
    let rows = (q1 - q0) * group;
    // Row r is query token q0 + r / group, query head kv_head * group + r % group.
    let token_head = |r: usize| (first_token + q0 + r / group, kv_head * group + r % group);
    let pos_of = |r: usize| first_pos + q0 + r / group;
    let visible = pos_of(rows - 1) + 1;
    let table = &pb.meta.block_table(seq)[..visible.div_ceil(bs)];
    let ql = qrep_len(d, x);
    with_scratch(|s| {
        let qrep = at_least(&mut s.qrep, rows * ql);
        let acc = at_least(&mut s.acc, rows * d);
        let maxes = at_least(&mut s.max, rows);
        let sums = at_least(&mut s.sum, rows);
        let scores = at_least(&mut s.logits, rows * bs);
        let probs = at_least(&mut s.probs, bs);
        let vtile = at_least(&mut s.vtile, d * bs);
        pb.prepare_queries((0..rows).map(token_head), qrep);
        acc.fill(0.0);
        maxes.fill(f32::NEG_INFINITY);
        sums.fill(0.0);

        for (b, &block) in table.iter().enumerate() {
            let start = b * bs;
            let k = pb.key_tile(block, kv_head);
            let v = pb.value_tile(block, kv_head);
            // Slots past the sequence may hold anything (NaN); a zeroed widened copy keeps them out.
            let past_end = start + bs > seq_len;
            if past_end {
                widen_masked(v, d, bs, seq_len - start, vtile);
            }
            // Rows are ordered by position: those whose causal window reaches this block are a suffix.
            let first = (0..rows).find(|&r| pos_of(r) >= start).unwrap_or(rows);
            if first == rows {
                continue;
            }
            qk_rows(
                pb.isa,
                k,
                &qrep[first * ql..],
                rows - first,
                d,
                bs,
                &mut scores[first * bs..],
                bs,
                Ahead::none(),
            );
            for r in first..rows {
                let pos = pos_of(r);
                let valid = (pos + 1 - start).min(bs);
                let scores = &scores[r * bs..(r + 1) * bs];
                let row_acc = &mut acc[r * d..(r + 1) * d];
                let block_max = max_of(&scores[..valid]);
                if block_max > maxes[r] {
                    // New running max: rescale what was accumulated under the old one.
                    let c = (maxes[r] - block_max).exp();
                    sums[r] *= c;
                    row_acc.iter_mut().for_each(|a| *a *= c);
                    maxes[r] = block_max;
                }
                probs[..valid].copy_from_slice(&scores[..valid]);
                sums[r] += exp_sub_sum(pb.isa, &mut probs[..valid], maxes[r]);
                probs[valid..].fill(0.0);
                if past_end {
                    pv_tile::<f32>(pb.isa, vtile, probs, d, bs, row_acc);
                } else {
                    pv_tile(pb.isa, v, probs, d, bs, row_acc);
                }
            }
        }

        for r in 0..rows {
            let (token, head) = token_head(r);
            // SAFETY: (token, head) rows of this tile and kv head belong to this item alone.
            let dst = unsafe { out.range(pb.out_offset(token, head), d) };
            let inv = 1.0 / sums[r];
            for (o, a) in dst.iter_mut().zip(&acc[r * d..(r + 1) * d]) {
                *o = a * inv;
            }
        }
    });
}
