//! Decode: one query token per sequence. Two passes over the item's context — all scores into
//! per-thread scratch, one safe softmax, then `p · V` — so each K and V byte is read once.
//! On the split path each partition keeps `(max, sum, output)` for the log-sum-exp merge.

use super::scratch::{at_least, with_scratch};
use super::{Problem, SharedOut, SplitSeq};
use crate::simd::{
    Ahead, Heads, KernelElem, PvBlocks, QkInt8, QkRows, exp_sub_sum, finish_rows, max_of, prefetch,
    pv_blocks, qk_int8, qk_rows, qrep_len, scale_by, widen_masked,
};

/// Value tiles per `pv_blocks` call: accumulators go back to memory once per run of this many.
const PV_RUN: usize = 8;
/// How many tiles ahead of the one it computes on a `q·k` call prefetches. Blocks sit anywhere in
/// the pool, so nothing but this tells the CPU where the next one is. With the prefetches spread
/// over the kernel loop, one tile ahead already keeps bf16 decode streaming; two were no faster
/// there and left block size 8 further behind its contiguous twin (paged ÷ contiguous ~1.19 vs
/// ~1.13, measured side by side on a loaded 2-core box).
const KEY_PREFETCH_TILES: usize = 1;

/// Where a decode item's results go.
#[derive(Clone, Copy)]
pub(super) enum Sink {
    /// The final output rows.
    Out(SharedOut),
    /// Split partials: `[max, sum, output...]` per query head, `stride` apart, from `base`.
    Partial { buf: SharedOut, base: usize, stride: usize },
}

/// Decode of `seq` for `kv_head` over context tokens `t0 .. t1` (`t0` block-aligned); keys
/// before the query's window score `-inf`.
pub(super) fn run_item<T: KernelElem>(
    pb: &Problem<'_, T>,
    seq: usize,
    kv_head: usize,
    t0: usize,
    t1: usize,
    sink: Sink,
) {
    let g = &pb.g;
    let (d, bs, x, group) = (g.head_size, g.block_size, g.x(), pb.group);
    let n = t1 - t0;
    let num_blocks = n.div_ceil(bs);
    let padded = num_blocks * bs;
    let token = pb.meta.query_start_loc[seq];
    let table = &pb.meta.block_table(seq)[t0 / bs..t0 / bs + num_blocks];
    let ql = qrep_len(d, x);
    let heads = Heads { nh: group, d, bs, stride: padded };
    let kd = KEY_PREFETCH_TILES;
    // The item reads its key tiles, then its value tiles; `tile_at(i)` is the i-th of that walk.
    let tile_at = |i: usize| match table.get(i) {
        Some(&block) => Some(pb.key_tile(block, kv_head)),
        None => table.get(i - num_blocks).map(|&block| pb.value_tile(block, kv_head)),
    };
    with_scratch(|s| {
        let qrep = at_least(&mut s.qrep, group * ql);
        let logits = at_least(&mut s.logits, group * padded);
        let acc8 = at_least(&mut s.acc, group * d * 8);
        let vtile = at_least(&mut s.vtile, d * bs);
        pb.prepare_queries((0..group).map(|i| (token, kv_head * group + i)), qrep);

        // Pass 1: scores, all query heads of the kv head per key load. Slots past the context
        // (NaN-poisoned, say) only reach their own lanes and are never read back. Each call
        // prefetches the tile `kd` steps further along the walk (the first value tiles, at the end).
        for tile in (0..kd).filter_map(tile_at) {
            prefetch(tile);
        }
        for (b, &block) in table.iter().enumerate() {
            let next = tile_at(b + kd);
            let ahead = Ahead::new(next.as_slice());
            let tile = pb.key_tile(block, kv_head);
            let Some(sc) = pb.scales else {
                let op = QkRows { heads, tile, qrep, q_stride: ql, scores: &mut logits[b * bs..] };
                qk_rows(pb.isa, op, ahead);
                continue;
            };
            // int8: the codes scaled per token and group of dims as the kernel widens them.
            let (ks, _) = sc.tile(g.num_kv_heads, bs, block, kv_head);
            let codes = T::as_codes(tile).expect("int8 scales come with an int8 cache");
            let op = QkInt8 {
                heads,
                tile: codes,
                scales: ks,
                group: sc.group,
                q: qrep,
                q_stride: ql,
                scores: &mut logits[b * bs..],
            };
            qk_int8(pb.isa, op, ahead);
        }
        // Keys of the first block that precede the window: probability 0.
        let hidden = pb.first_visible(pb.meta.seq_lens[seq] - 1).saturating_sub(t0).min(n);
        if hidden > 0 {
            for i in 0..group {
                logits[i * padded..i * padded + hidden].fill(f32::NEG_INFINITY);
            }
        }
        let maxes = at_least(&mut s.max, group);
        let sums = at_least(&mut s.sum, group);
        for i in 0..group {
            let row = &mut logits[i * padded..(i + 1) * padded];
            maxes[i] = max_of(&row[..n]);
            sums[i] = exp_sub_sum(pb.isa, &mut row[..n], maxes[i]);
            row[n..].fill(0.0);
        }
        if let Some(sc) = pb.scales {
            // int8: each token's value scale folded into its probability (after the sums, which
            // normalize the probabilities themselves), so `p · V` runs over the codes. Only the
            // visible tokens: a slot past the context may hold any scale (NaN).
            for (b, &block) in table.iter().enumerate() {
                let (_, vs) = sc.tile(g.num_kv_heads, bs, block, kv_head);
                let (lo, hi) = (hidden.max(b * bs), n.min((b + 1) * bs));
                for i in (0..group).filter(|_| lo < hi) {
                    scale_by(&mut logits[i * padded + lo..i * padded + hi], &vs[lo - b * bs..hi - b * bs]);
                }
            }
        }

        // Pass 2: p · V into lane-wise accumulators, all query heads per value load; each run
        // prefetches the next run's tiles as it goes.
        acc8.fill(0.0);
        let full = n / bs;
        let value_tiles = |r: usize| {
            let mut tiles: [&[T]; PV_RUN] = [&[]; PV_RUN];
            let start = (r * PV_RUN).min(full);
            let run = &table[start..(start + PV_RUN).min(full)];
            for (t, &block) in tiles.iter_mut().zip(run) {
                *t = pb.value_tile(block, kv_head);
            }
            (tiles, run.len())
        };
        let (mut tiles, mut len) = value_tiles(0);
        for r in 0..full.div_ceil(PV_RUN) {
            let (next, next_len) = value_tiles(r + 1);
            let probs = &logits[r * PV_RUN * bs..];
            pv_blocks(
                pb.isa,
                PvBlocks { heads, tiles: &tiles[..len], probs, acc8 },
                Ahead::new(&next[..next_len]),
            );
            (tiles, len) = (next, next_len);
        }
        if full < num_blocks {
            // Zero the slots past the context: p = 0 there, but 0 · NaN would still be NaN.
            widen_masked(pb.isa, pb.value_tile(table[full], kv_head), d, bs, n - full * bs, vtile);
            let probs = &logits[full * bs..];
            pv_blocks::<f32>(pb.isa, PvBlocks { heads, tiles: &[&vtile[..]], probs, acc8 }, Ahead::none());
        }

        for i in 0..group {
            let (max, sum) = (maxes[i], sums[i]);
            let head = kv_head * group + i;
            let src = &acc8[i * d * 8..(i + 1) * d * 8];
            let dst = match sink {
                // SAFETY: (token, head) rows belong to this item alone.
                Sink::Out(out) => unsafe { out.range(pb.out_offset(token, head), d) },
                Sink::Partial { buf, base, stride } => {
                    // SAFETY: partition `part`'s partials belong to this item alone.
                    let row = unsafe { buf.range(base + head * stride, stride) };
                    row[0] = max;
                    row[1] = sum;
                    &mut row[2..]
                }
            };
            finish_rows(pb.isa, src, 1.0 / sum, dst);
        }
    });
}

/// Merges one split sequence's partitions, token by token: weights `sum_k · exp(max_k - max)`
/// (log-sum-exp).
pub(super) fn merge<T>(pb: &Problem<'_, T>, s: &SplitSeq, partials: &[f32], stride: usize, out: SharedOut) {
    let d = pb.g.head_size;
    for i in 0..s.tokens {
        for head in 0..pb.num_heads {
            let row = |k: usize| {
                let start = ((s.first_part + k * s.tokens + i) * pb.num_heads + head) * stride;
                &partials[start..start + stride]
            };
            let global_max = (0..s.num_parts).map(|k| row(k)[0]).fold(f32::NEG_INFINITY, f32::max);
            // SAFETY: (token, head) rows of a split sequence are written by this merge alone.
            let dst = unsafe { out.range(pb.out_offset(s.first_token + i, head), d) };
            dst.fill(0.0);
            let mut total = 0.0f32;
            for k in 0..s.num_parts {
                let r = row(k);
                let w = r[1] * (r[0] - global_max).exp();
                total += w;
                for (o, &v) in dst.iter_mut().zip(&r[2..]) {
                    *o += w * v;
                }
            }
            let inv = 1.0 / total;
            for o in dst.iter_mut() {
                *o *= inv;
            }
        }
    }
}
