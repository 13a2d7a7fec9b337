//! `paged_attention`: the one entry point for decode, prefill, chunked prefill and mixed batches.
//!
//! The batch is cut into independent work items run on every rayon thread:
//! - a sequence with one query token (decode) becomes one item per kv head — or, on the split
//!   ("v2", flash-decoding) path, one per kv head and context partition of [`PARTITION_TOKENS`],
//!   whose partial results are merged by log-sum-exp afterwards;
//! - a longer chunk becomes one item per kv head and tile of query tokens (`chunk::query_tile`),
//!   run as tiled ("flash") attention with an online softmax over the blocks it may see (causal
//!   within the chunk); items are ordered longest first so that the causal skew balances. A
//!   chunk of one tile (a speculative verification's few tokens) in a batch of too few items
//!   for the threads splits its context into partitions as a starved decode does, merged alike.
//!
//! Every item writes its own rows of `out` (or of the split-path partials), so items never race.

mod chunk;
mod decode;
mod scratch;

use kv_cache::{CacheGeometry, CacheSlices, LayerCache};
use rayon::prelude::*;

use crate::meta::validate;
use crate::simd::{KernelElem, Scales, prepare_query, qrep_len};
use crate::{AttnError, AttnScores, Isa, PagedAttnMetadata};

/// Context tokens per partition on the split-context decode path.
pub const PARTITION_TOKENS: usize = 512;
/// Decode contexts longer than this always take the split path (bounded scratch, more items).
pub const LONG_CONTEXT: usize = 8192;

/// Fewest context tokens a starved decode splits off into one partition: below this an item's
/// work is too small for the merge and the task it adds.
pub(crate) const MIN_PARTITION_TOKENS: usize = 128;

/// [`SplitPolicy::Auto`]'s partition size for `items` (sequence, kv head) decode items whose
/// longest context is `max_ctx`, on `threads` threads: [`PARTITION_TOKENS`] past
/// [`LONG_CONTEXT`]; when there are fewer than two items per thread (batch-1 decode has one
/// per kv head: three on SmolLM2 for two threads, one idle a third of the time), partitions
/// small enough to make two per thread, in whole rounds for the threads, of at least
/// [`MIN_PARTITION_TOKENS`], in whole blocks; otherwise no split. Not more: every item costs
/// its own query preparation, softmax pass and merge row — batch-1 SmolLM2 at 512 tokens on
/// two threads measured 0.80–0.87 ms of attention per step with six items of 256 tokens,
/// 0.89–0.99 with twelve of 128, 1.04–1.09 with 18–24.
pub(crate) fn auto_partition(
    items: usize,
    max_ctx: usize,
    block_size: usize,
    threads: usize,
) -> Option<usize> {
    if max_ctx > LONG_CONTEXT {
        return Some(PARTITION_TOKENS);
    }
    let threads = threads.max(1);
    let wanted = 2 * threads;
    if items == 0 || items >= wanted || max_ctx < 2 * MIN_PARTITION_TOKENS {
        return None;
    }
    // Whole rounds of items for the threads: 3 kv heads × 3 parts would leave one thread a
    // fifth item while the other waits.
    let mut parts = wanted.div_ceil(items);
    while !(items * parts).is_multiple_of(threads) && parts < wanted.div_ceil(items) + threads {
        parts += 1;
    }
    let tokens = max_ctx.div_ceil(parts).clamp(MIN_PARTITION_TOKENS, PARTITION_TOKENS);
    Some(tokens.div_ceil(block_size.max(1)) * block_size.max(1))
}

/// When decode takes the split-context ("v2") path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SplitPolicy {
    /// Split when contexts are long ([`LONG_CONTEXT`]) or when there are too few
    /// (sequence, kv head) items to keep every thread busy ([`auto_partition`]).
    #[default]
    Auto,
    /// Never split: one pass per (sequence, kv head).
    Never,
    /// Always split into partitions of this many tokens (a positive multiple of the block size).
    Always { partition_tokens: usize },
}

/// Knobs of [`paged_attention`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnOptions {
    /// Instruction set; one the CPU lacks falls back to [`Isa::Portable`].
    pub isa: Isa,
    pub split: SplitPolicy,
}

impl Default for AttnOptions {
    fn default() -> Self {
        AttnOptions { isa: Isa::detected(), split: SplitPolicy::Auto }
    }
}

/// Attention of every query token over its sequence's paged context, with the instruction set
/// and split policy of `opts` (`AttnOptions::default()`: the detected one, split as needed).
///
/// `query` and `out` are `[num_tokens, num_heads, head_size]` (f32); query head `h` reads kv head
/// `h / (num_heads / num_kv_heads)` (GQA/MQA). Scores are `scale · q·k` over the keys a query
/// sees ([`AttnScores`]: causal, or a sliding window), softmax is the numerically safe one (max
/// subtracted), accumulation is f32. Errors come before any write.
pub fn paged_attention(
    opts: &AttnOptions,
    out: &mut [f32],
    query: &[f32],
    cache: &LayerCache,
    meta: &PagedAttnMetadata<'_>,
    num_heads: usize,
    scores: impl Into<AttnScores>,
) -> Result<(), AttnError> {
    let scores = scores.into();
    validate(out.len(), query.len(), cache, meta, num_heads, scores)?;
    let g = *cache.geometry();
    if let SplitPolicy::Always { partition_tokens: p } = opts.split
        && (p == 0 || !p.is_multiple_of(g.block_size))
    {
        return Err(AttnError::InvalidPartition(p, g.block_size));
    }
    let isa = if opts.isa.is_available() { opts.isa } else { Isa::Portable };
    let (split, h) = (opts.split, num_heads);
    if let CacheSlices::Int8 { key, value, key_scale, value_scale } = cache.slices() {
        let (group, groups) = (kv_cache::int8::key_group(g.head_size), g.key_scales());
        let scales = Some(Scales { key: key_scale, value: value_scale, group, groups });
        run(isa, split, out, query, Kv { key, value, scales }, &g, meta, h, scores);
        return Ok(());
    }
    by_dtype!(CacheSlices, cache.slices(), |key, value| {
        run(isa, split, out, query, Kv { key, value, scales: None }, &g, meta, h, scores)
    });
    Ok(())
}

/// A layer's key and value tensors, with int8's scales.
#[derive(Clone, Copy)]
struct Kv<'a, T> {
    key: &'a [T],
    value: &'a [T],
    scales: Option<Scales<'a>>,
}

/// Everything an item reads, for one call.
struct Problem<'a, T> {
    isa: Isa,
    key: &'a [T],
    value: &'a [T],
    scales: Option<Scales<'a>>,
    g: CacheGeometry,
    meta: &'a PagedAttnMetadata<'a>,
    query: &'a [f32],
    num_heads: usize,
    /// Query heads per kv head.
    group: usize,
    scores: AttnScores,
}

impl<'a, T> Problem<'a, T> {
    /// Tile of (physical block, kv head) in `cache` (`key` or `value`).
    fn tile(&self, cache: &'a [T], block: u32, kv_head: usize) -> &'a [T] {
        let n = self.g.block_head_elems();
        let start = (block as usize * self.g.num_kv_heads + kv_head) * n;
        &cache[start..start + n]
    }
    /// Key tile of (physical block, kv head): `[head_size/x, block_size, x]`.
    fn key_tile(&self, block: u32, kv_head: usize) -> &'a [T] {
        self.tile(self.key, block, kv_head)
    }
    /// Value tile of (physical block, kv head): `[head_size, block_size]`.
    fn value_tile(&self, block: u32, kv_head: usize) -> &'a [T] {
        self.tile(self.value, block, kv_head)
    }
    /// Query row of (token, query head).
    fn query_row(&self, token: usize, head: usize) -> &[f32] {
        let start = self.out_offset(token, head);
        &self.query[start..start + self.g.head_size]
    }
    /// Prepares the query rows of `rows` (token, query head) for `qk_rows`, one after another.
    fn prepare_queries(&self, rows: impl Iterator<Item = (usize, usize)>, qrep: &mut [f32]) {
        let x = self.g.x();
        for ((token, head), dst) in rows.zip(qrep.chunks_exact_mut(qrep_len(self.g.head_size, x))) {
            prepare_query(self.query_row(token, head), self.scores.scale, x, dst);
        }
    }
    /// The first key a query at `pos` sees.
    fn first_visible(&self, pos: usize) -> usize {
        self.scores.first_visible(pos)
    }
    /// Offset of (token, query head) in `out` (and in `query`: same layout).
    fn out_offset(&self, token: usize, head: usize) -> usize {
        (token * self.num_heads + head) * self.g.head_size
    }
}

/// A shared view of an output buffer whose disjoint ranges are written by different items.
#[derive(Clone, Copy)]
struct SharedOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: items only write ranges no other item touches (see `range`), and the buffer outlives
// the parallel section that uses it.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    fn new(buf: &mut [f32]) -> Self {
        SharedOut { ptr: buf.as_mut_ptr(), len: buf.len() }
    }

    /// # Safety
    /// No other live reference may overlap `start .. start + len`, and the buffer must outlive `'a`.
    unsafe fn range<'a>(self, start: usize, len: usize) -> &'a mut [f32] {
        assert!(start + len <= self.len, "output range out of bounds");
        // SAFETY: in bounds (checked) and exclusive (caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

#[derive(Debug, Clone, Copy)]
enum Item {
    /// Decode of `seq` for `kv_head` over context tokens `t0 .. t1` (the first block-aligned,
    /// keys before the window masked in it); `part` indexes its partial
    /// results on the split path (`None`: writes `out` directly).
    Decode { seq: usize, kv_head: usize, t0: usize, t1: usize, part: Option<usize> },
    /// Query tokens `q0 .. q1` of `seq`'s chunk for `kv_head`; `keys`: on the split path, the
    /// context partition it walks and where its partials go (`None`: all it sees, into `out`).
    Chunk { seq: usize, kv_head: usize, q0: usize, q1: usize, keys: Option<KeyPart> },
}

/// One context partition of a split chunk: keys at positions `k0 .. k1` (block-aligned), its
/// partials from row `row` of the partials on (one per query token, each `num_heads` wide).
#[derive(Debug, Clone, Copy)]
struct KeyPart {
    k0: usize,
    k1: usize,
    row: usize,
}

/// A split sequence's query tokens (a decode's one, or a one-tile chunk's `tokens` from query
/// token `first_token` on): where its partials start (partial row `first_part`, in rows of
/// `num_heads` heads: partition `k` of token `i` at `first_part + k·tokens + i`) and how many
/// partitions it has.
#[derive(Debug, Clone, Copy)]
struct SplitSeq {
    first_token: usize,
    tokens: usize,
    first_part: usize,
    num_parts: usize,
}

#[allow(clippy::too_many_arguments)]
fn run<T: KernelElem>(
    isa: Isa,
    split: SplitPolicy,
    out: &mut [f32],
    query: &[f32],
    kv: Kv<'_, T>,
    g: &CacheGeometry,
    meta: &PagedAttnMetadata<'_>,
    num_heads: usize,
    scores: AttnScores,
) {
    let group = num_heads / g.num_kv_heads;
    let Kv { key, value, scales } = kv;
    let pb = Problem { isa, key, value, scales, g: *g, meta, query, num_heads, group, scores };
    let decode_seqs: Vec<usize> = (0..meta.num_seqs()).filter(|&s| meta.query_len(s) == 1).collect();
    // A decode reads its context from the block holding its first visible key.
    let decode_start = |s: usize| pb.first_visible(meta.seq_lens[s] - 1) / g.block_size * g.block_size;
    let partition = match split {
        SplitPolicy::Never => None,
        SplitPolicy::Always { partition_tokens } => Some(partition_tokens),
        SplitPolicy::Auto => {
            let max_ctx = decode_seqs.iter().map(|&s| meta.seq_lens[s] - decode_start(s)).max().unwrap_or(0);
            auto_partition(
                decode_seqs.len() * g.num_kv_heads,
                max_ctx,
                g.block_size,
                rayon::current_num_threads(),
            )
        }
    };

    let mut items = Vec::new();
    let mut splits = Vec::new();
    let mut num_parts_total = 0;
    for &seq in &decode_seqs {
        let (start, end) = (decode_start(seq), meta.seq_lens[seq]);
        let ctx = end - start;
        // Only a context longer than one partition is split; the others are one whole item.
        let split = partition.filter(|&p| ctx > p);
        let (p, parts) = split.map_or((ctx, 1), |p| (p, ctx.div_ceil(p)));
        let first_part = split.map(|_| num_parts_total);
        for kv_head in 0..g.num_kv_heads {
            for k in 0..parts {
                let (t0, t1) = (start + k * p, start + ((k + 1) * p).min(ctx));
                items.push(Item::Decode { seq, kv_head, t0, t1, part: first_part.map(|f| f + k) });
            }
        }
        if let Some(first_part) = first_part {
            let first_token = meta.query_start_loc[seq];
            splits.push(SplitSeq { first_token, tokens: 1, first_part, num_parts: parts });
            num_parts_total += parts;
        }
    }
    let tile = chunk::query_tile(group);
    let chunk_seqs: Vec<usize> = (0..meta.num_seqs()).filter(|&s| meta.query_len(s) > 1).collect();
    let chunk_items: usize =
        chunk_seqs.iter().map(|&s| meta.query_len(s).div_ceil(tile) * g.num_kv_heads).sum();
    let mut chunks = Vec::new();
    for &seq in &chunk_seqs {
        let q_len = meta.query_len(seq);
        let first_pos = meta.seq_lens[seq] - q_len;
        let start = pb.first_visible(first_pos) / g.block_size * g.block_size;
        let ctx = meta.seq_lens[seq] - start;
        // A one-tile chunk among too few items splits its context as a starved decode does.
        let partition = match split {
            SplitPolicy::Auto if q_len <= tile => {
                auto_partition(items.len() + chunk_items, ctx, g.block_size, rayon::current_num_threads())
            }
            _ => None,
        };
        if let Some(p) = partition.filter(|&p| ctx > p) {
            let parts = ctx.div_ceil(p);
            let first_token = meta.query_start_loc[seq];
            splits.push(SplitSeq {
                first_token,
                tokens: q_len,
                first_part: num_parts_total,
                num_parts: parts,
            });
            for k in 0..parts {
                let (k0, k1) = (start + k * p, (start + (k + 1) * p).min(meta.seq_lens[seq]));
                let keys = Some(KeyPart { k0, k1, row: num_parts_total + k * q_len });
                let cost = q_len * (k1 - k0);
                chunks.extend(
                    (0..g.num_kv_heads)
                        .map(|kv_head| (cost, Item::Chunk { seq, kv_head, q0: 0, q1: q_len, keys })),
                );
            }
            num_parts_total += parts * q_len;
            continue;
        }
        for q0 in (0..q_len).step_by(tile) {
            let q1 = (q0 + tile).min(q_len);
            // Work ∝ rows × keys walked for the last row.
            let cost = (q1 - q0) * (first_pos + q1 - pb.first_visible(first_pos + q0));
            chunks.extend(
                (0..g.num_kv_heads).map(|kv_head| (cost, Item::Chunk { seq, kv_head, q0, q1, keys: None })),
            );
        }
    }
    // Longest first: the short tiles at the start of a causal prompt fill in at the end.
    chunks.sort_by_key(|&(cost, _)| std::cmp::Reverse(cost));
    items.extend(chunks.into_iter().map(|(_, item)| item));

    // Split partials: per partition and query head, [max, sum, normalized output (head_size)].
    let stride = g.head_size + 2;
    let mut partials = vec![0.0f32; num_parts_total * num_heads * stride];
    let out_view = SharedOut::new(out);
    let partial_view = SharedOut::new(&mut partials);
    items.par_iter().for_each(|item| match *item {
        Item::Decode { seq, kv_head, t0, t1, part } => {
            let sink = match part {
                None => decode::Sink::Out(out_view),
                Some(p) => decode::Sink::Partial { buf: partial_view, base: p * num_heads * stride, stride },
            };
            decode::run_item(&pb, seq, kv_head, t0, t1, sink);
        }
        Item::Chunk { seq, kv_head, q0, q1, keys } => {
            let sink = match keys {
                None => chunk::Sink::Out(out_view),
                Some(part) => chunk::Sink::Partial { buf: partial_view, part, stride },
            };
            chunk::run_item(&pb, seq, kv_head, q0, q1, sink)
        }
    });
    if !splits.is_empty() {
        splits.par_iter().for_each(|s| decode::merge(&pb, s, &partials, stride, out_view));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starved_decodes_split_into_whole_blocks_and_busy_ones_do_not() {
        // Batch 1 of SmolLM2 (3 kv heads) at 512 tokens on 2 threads: 2 parts of 256 tokens,
        // three items per thread.
        assert_eq!(auto_partition(3, 512, 16, 2), Some(256));
        assert_eq!(auto_partition(3, 1024, 16, 2), Some(512));
        // 3 heads on 4 threads: 3 parts would make 9 items, 4 make two whole rounds.
        assert_eq!(auto_partition(3, 1024, 16, 4), Some(256));
        // Parts never shrink below the minimum, never grow past the long-context size.
        assert_eq!(auto_partition(1, 300, 16, 8), Some(MIN_PARTITION_TOKENS));
        assert_eq!(auto_partition(1, 8000, 16, 8), Some(512));
        assert_eq!(auto_partition(1, 4000, 16, 8), Some(256));
        assert_eq!(auto_partition(3, 500, 32, 2), Some(256));
        // Short contexts, enough items, or nothing to do: one pass per item.
        assert_eq!(auto_partition(3, 200, 16, 2), None);
        assert_eq!(auto_partition(4, 4000, 16, 2), None);
        assert_eq!(auto_partition(0, 4000, 16, 2), None);
        // Past LONG_CONTEXT always split, however many items.
        assert_eq!(auto_partition(100, LONG_CONTEXT + 1, 16, 2), Some(PARTITION_TOKENS));
    }
}
